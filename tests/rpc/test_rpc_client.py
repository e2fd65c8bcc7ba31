"""RpcClient against the real server subprocess and the in-process FaultServer.

Pins docs/policy.md §8 item 10 (pi's client dropped the retry events and ignored ``success:false``)
and the client's promise not to hang: timeouts, and a dead server raising in pending requests,
new requests and the event iterator.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest

from fsm.testing.fault_server import FaultServer
from fsm.rpc import RpcClient, RpcError, RpcTimeout, ServerDied
from support import OVERLOADED, env

pytestmark = pytest.mark.subprocess


def client_for(fs: FaultServer, tmp_path: Path, retry: dict | None = None, *args: str,
               **kwargs) -> RpcClient:
    """A client of ``python -m fsm rpc`` against ``fs`` with 20-ms backoffs (``retry``
    overrides settings keys, ``args`` are more command-line arguments)."""
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"retry": {"maxRetries": 3, "baseDelayMs": 20, **(retry or {})}}))
    return RpcClient(["--base-url", fs.base_url, "--model", "m", "--settings", str(settings),
                      "--no-session", *args], env=env(), cwd=tmp_path, **kwargs)


async def test_commands_events_and_idle(tmp_path):
    """Commands events and idle."""
    with FaultServer([OVERLOADED, {"stream": ["Hel", "lo"]}]) as fs:
        async with client_for(fs, tmp_path, record=True) as client:
            assert client.ready_ms is not None and client.ready_ms > 0
            state = await client.get_state()
            assert state["autoRetryEnabled"] is True and state["isRetrying"] is False
            await client.prompt("hi")
            state = await client.wait_for_idle(timeout_s=120)
            assert state["isStreaming"] is False and state["isRetrying"] is False
            await client.set_auto_retry(False)
            assert (await client.get_state())["autoRetryEnabled"] is False
            await client.abort_retry()
            await client.abort()
        assert client.returncode == 0
    types = [e["type"] for e in client.received]
    # docs/policy.md §8 item 10: retry events reach the client, in order, with the deltas of the turn.
    assert types.count("auto_retry_start") == 1 and types.count("auto_retry_end") == 1
    assert types.index("auto_retry_start") < types.index("message_update") < types.index("auto_retry_end")
    start = next(e for e in client.received if e["type"] == "auto_retry_start")
    assert {"attempt": 1, "maxAttempts": 3, "delayMs": 20}.items() <= start.items()
    assert "529" in start["errorMessage"]
    assert len(fs.chat_requests) == 2


async def test_event_iterator_sees_every_event_then_ends_on_close(tmp_path):
    """Event iterator sees every event then ends on close."""
    with FaultServer([OVERLOADED, OVERLOADED, {}]) as fs:
        client = await client_for(fs, tmp_path).start()
        await client.prompt("hi")
        await client.wait_for_idle(timeout_s=120)
        await client.close()
        seen = [e async for e in client.events()]  # buffered from the start, never dropped
    retry = [(e["type"], e["attempt"]) for e in seen if e["type"].startswith("auto_retry")]
    assert retry == [("auto_retry_start", 1), ("auto_retry_start", 2), ("auto_retry_end", 2)]
    assert await client.next_event() is None  # it stays ended


async def test_wait_for_idle_does_not_return_during_a_backoff(tmp_path):
    """Wait for idle does not return during a backoff."""
    with FaultServer([OVERLOADED, {}]) as fs:
        async with client_for(fs, tmp_path, {"baseDelayMs": 400}, record=True) as client:
            await client.prompt("hi")
            t0 = time.monotonic()
            await client.wait_for_idle(timeout_s=120)
            assert time.monotonic() - t0 >= 0.35
            ends = [e for e in client.received if e["type"] == "auto_retry_end"]
            assert ends and ends[0]["success"] is True
            assert len(fs.chat_requests) == 2


async def test_success_false_raises_rpc_error_with_the_servers_message(tmp_path):
    """Success false raises RPC error with the servers message."""
    with FaultServer([{"stream": ["x"], "delay_ms": 3000}]) as fs:
        async with client_for(fs, tmp_path) as client:
            await client.prompt("first")
            with pytest.raises(RpcError, match="turn is running") as info:
                await client.prompt("second")
            assert info.value.command == "prompt"
            assert info.value.response["success"] is False
            with pytest.raises(RpcError, match='"enabled" must be true or false, got string'):
                await client.set_auto_retry("yes")  # type: ignore[arg-type]
            with pytest.raises(RpcError, match='unknown command "dance"'):
                await client.request({"type": "dance"})
            await client.abort()


async def test_request_timeout_raises_rpc_timeout(tmp_path):
    """Request timeout raises RPC timeout."""
    with FaultServer([]) as fs:
        async with client_for(fs, tmp_path) as client:
            os.kill(client.pid, signal.SIGSTOP)
            try:
                with pytest.raises(RpcTimeout, match="no response to get_state within 0.3 s"):
                    await client.get_state(timeout_s=0.3)
                # A line larger than the pipe cannot even be sent: that is bounded too.
                with pytest.raises(RpcTimeout, match="could not send prompt within 0.3 s"):
                    await client.prompt("x" * (1 << 20), timeout_s=0.3)
            finally:
                os.kill(client.pid, signal.SIGCONT)
            # The late prompt still arrives once the server runs again; its answer is dropped.
            await client.wait_for_idle(timeout_s=120)
            assert (await client.get_state())["messageCount"] == 2


async def test_killed_server_raises_instead_of_hanging(tmp_path):
    """Killed server raises instead of hanging."""
    with FaultServer([OVERLOADED]) as fs:
        client = await client_for(fs, tmp_path, {"baseDelayMs": 5000}).start()
        try:
            await client.prompt("hi")
            await client.wait_for_event("auto_retry_start", timeout_s=120)
            os.kill(client.pid, signal.SIGSTOP)
            pending = asyncio.ensure_future(client.get_state(timeout_s=120))
            await asyncio.sleep(0.1)
            os.kill(client.pid, signal.SIGKILL)
            with pytest.raises(ServerDied) as info:
                await asyncio.wait_for(pending, 5)
            assert info.value.returncode == -signal.SIGKILL
            assert "exited with status -9" in str(info.value)
            with pytest.raises(ServerDied):  # the event iterator too
                async for _ in client.events():
                    pass
            with pytest.raises(ServerDied):  # and any later request, at once
                await asyncio.wait_for(client.abort_retry(), 1)
        finally:
            await client.close()


async def test_server_failing_at_start_reports_status_and_stderr(tmp_path):
    """Server failing at start reports status and stderr."""
    client = RpcClient(["--model", "m", "--context-window", "-5"], env=env(), cwd=tmp_path)
    with pytest.raises(ServerDied) as info:
        await client.start()
    assert info.value.returncode == 2
    assert "--context-window" in info.value.stderr_tail and "-5" in str(info.value)


async def test_close_is_idempotent_and_later_requests_fail(tmp_path):
    """Close is idempotent and later requests fail."""
    with FaultServer([]) as fs:
        # A generous grace: on a loaded machine the exit waits for the SDK's import thread.
        client = await client_for(fs, tmp_path, close_grace_s=15.0).start()
        assert await client.close() == 0
        assert await client.close() == 0
        with pytest.raises(RpcError, match="closed"):
            await client.get_state()


async def test_unstarted_client_refuses_requests():
    """Unstarted client refuses requests."""
    client = RpcClient(["--model", "m"])
    with pytest.raises(RpcError, match="not started"):
        await client.get_state()
    with pytest.raises(TypeError):
        RpcClient("--model m")  # type: ignore[arg-type]


async def test_get_messages_steer_and_follow_up(tmp_path):
    """steer and follow_up queue while a turn streams (pendingMessageCount), then go out with
    the next turn; get_messages is the runtime context in pi's message shape."""
    script = [{"stream": ["Hel", "lo"], "chunk_delay_ms": 300}, {"stream": ["both"]}]
    with FaultServer(script) as fs:
        async with client_for(fs, tmp_path) as client:
            await client.prompt("hi")
            await client.wait_for_event("message_update", timeout_s=10)
            await client.steer("steered")
            await client.follow_up("followed")
            state = await client.get_state()
            assert state["pendingMessageCount"] == 2 and state["isStreaming"] is True
            await client.wait_for_idle(timeout_s=120)
            messages = await client.get_messages()
        assert [m["role"] for m in messages] == ["user", "assistant", "user", "user", "assistant"]
        assert [m["content"][0]["text"] for m in messages] == ["hi", "Hello", "steered", "followed", "both"]
        answer = messages[1]
        assert answer["stopReason"] == "stop" and answer["provider"] == "127.0.0.1"
        assert answer["api"] == "openai-completions" and answer["usage"]["totalTokens"] >= 0
        user_texts = [[m["content"] for m in r["body"]["messages"] if m["role"] == "user"]
                      for r in fs.chat_requests]
        assert user_texts == [["hi"], ["hi", "steered", "followed"]]


async def test_pi_commands_this_server_lacks_are_refused_saying_so(tmp_path):
    """Pi commands this server lacks are refused saying so."""
    with FaultServer([]) as fs:
        async with client_for(fs, tmp_path) as client:
            for kind in ("compact", "get_session_stats", "set_model", "bash"):
                with pytest.raises(RpcError, match=f"command '{kind}' is not implemented"):
                    await client.request({"type": kind})
            await client.retry_now()  # no backoff: ignored, with success
            assert (await client.get_state())["isRetrying"] is False


async def test_session_dir_chooses_where_the_log_goes_and_get_state_names_it(tmp_path):
    """Session dir chooses where the log goes and get state names it."""
    logs = tmp_path / "logs"
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"retry": {"baseDelayMs": 20}}))
    with FaultServer([{"stream": ["ok"]}]) as fs:
        async with RpcClient(["--base-url", fs.base_url, "--model", "m", "--settings", str(settings),
                              "--session-dir", str(logs)], env=env(), cwd=tmp_path) as client:
            state = await client.get_state()
            await client.prompt("hi")
            await client.wait_for_idle(timeout_s=120)
    path = Path(state["sessionFile"])
    assert path.parent == logs and path.name == f"{state['sessionId']}.jsonl"
    assert '"stopReason": "stop"' in path.read_text() or '"stopReason":"stop"' in path.read_text()
    assert not (tmp_path / ".fsm").exists()


async def test_credentials_file_is_the_session_credential_store(tmp_path):
    """--credentials FILE: each request carries the store's key for the --provider name."""
    store = tmp_path / "credentials.json"
    store.write_text(json.dumps({"providers": {"acme": {"keys": ["sk-first", "sk-second"]}}}))
    with FaultServer([{"stream": ["ok"]}]) as fs:
        async with RpcClient(["--base-url", fs.base_url, "--model", "m", "--provider", "acme",
                              "--credentials", str(store), "--no-session"],
                             env=env(), cwd=tmp_path) as client:
            assert (await client.get_state())["model"]["provider"] == "acme"
            await client.prompt("hi")
            await client.wait_for_idle(timeout_s=120)
        auth = [r["headers"].get("authorization") for r in fs.chat_requests]
    assert auth == ["Bearer sk-first"]


@pytest.mark.parametrize("content", ["{not json", None], ids=["not-json", "a-folder"])
def test_a_bad_credentials_file_is_refused_with_status_2(tmp_path, content):
    """A bad credentials file is refused with status 2."""
    import subprocess
    import sys
    store = tmp_path / "credentials.json"
    if content is None:
        store.mkdir()
    else:
        store.write_text(content)
    proc = subprocess.run([sys.executable, "-m", "fsm", "rpc", "--model", "m", "--no-session",
                           "--credentials", str(store)], input="", capture_output=True, text=True,
                          env=env(), cwd=tmp_path, timeout=30)
    assert proc.returncode == 2
    assert "bad credentials file" in proc.stderr and str(store) in proc.stderr


def test_a_bad_redis_url_is_refused_with_status_2(tmp_path):
    """A bad Redis URL is refused with status 2."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "fsm", "rpc", "--model", "m", "--no-session",
                           "--redis", "ftp://nowhere"], input="", capture_output=True, text=True,
                          env=env(), cwd=tmp_path, timeout=30)
    assert proc.returncode == 2 and "bad --redis" in proc.stderr and "ftp://nowhere" in proc.stderr


async def test_redis_memory_gives_the_session_a_coordinator(tmp_path):
    """Redis memory gives the session a coordinator (20-ms backoffs, not the default 2 s)."""
    with FaultServer([OVERLOADED, {"stream": ["ok"]}]) as fs:
        async with client_for(fs, tmp_path, None, "--redis", "memory:", record=True) as client:
            await client.set_auto_retry(True)
            await client.prompt("hi")
            await client.wait_for_idle(timeout_s=120)
    ends = [e for e in client.received if e["type"] == "auto_retry_end"]
    assert ends and ends[-1]["success"] is True


async def test_the_default_session_folder_is_announced_on_stderr(tmp_path):
    """The default session folder is announced on stderr."""
    lines: list[str] = []
    with FaultServer([]) as fs:
        async with RpcClient(["--base-url", fs.base_url, "--model", "m"], env=env(), cwd=tmp_path,
                             stderr=lines.append) as client:
            state = await client.get_state()
    assert (tmp_path / state["sessionFile"]).parent == tmp_path / ".fsm" / "sessions"
    assert "writing the session log to .fsm/sessions/<session id>.jsonl" in "".join(lines)
