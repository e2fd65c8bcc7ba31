"""Adversarial tests of RpcClient against a scripted fake server (and a few against the real one).

The fake is a tiny Python program started in place of ``python -m fsm rpc`` (through the
client's ``python`` argument). It answers every request, and the requests' types steer it: emit
a flood of events, write noise or an over-long line on stdout, chatter on stderr, close its
stdin, exit, never answer. So every path of the client is driven by a real process and real
pipes, in milliseconds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

import pytest

from fsm.testing.fault_server import FaultServer
from fsm.rpc import RpcClient, RpcError, RpcTimeout, ServerDied
from support import OVERLOADED, ROOT

pytestmark = pytest.mark.subprocess


FAKE = r'''
import json, os, signal, sys, time
args = sys.argv[4:]  # after "-m fsm rpc"
if "--ignore-term" in args:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if "--die-at-once" in args:
    sys.stderr.write("fake: bad arguments\n")
    sys.exit(3)
out = sys.stdout.buffer
state = {"polls": 0}

def send(obj):
    out.write(json.dumps(obj).encode() + b"\n")
    out.flush()

def answer(cmd, success=True, **extra):
    send({"id": cmd.get("id"), "type": "response", "command": cmd["type"], "success": success, **extra})

for raw in sys.stdin.buffer:
    cmd = json.loads(raw)
    kind = cmd["type"]
    if kind == "get_state":
        state["polls"] += 1
        busy = state["polls"] <= state.get("busy_polls", 0)
        if busy and not state.get("quiet"):
            send({"type": "tick", "poll": state["polls"]})
        answer(cmd, data={"isStreaming": busy, "isRetrying": False, "queuedMessageCount": 0,
                          "retryState": "idle", "polls": state["polls"]})
    elif kind == "set_busy":
        state["busy_polls"] = state["polls"] + cmd["polls"]
        state["quiet"] = cmd.get("quiet", False)
        answer(cmd)
    elif kind == "parked":
        state["parked"] = True
        answer(cmd)
    elif kind == "flood":
        for i in range(cmd["n"]):
            send({"type": "event", "i": i})
        answer(cmd)
    elif kind == "noise":
        out.write(b"not json at all\n\n[1, 2]\n")
        send({"id": "nobody", "type": "response", "command": "x", "success": True})
        send({"id": 42, "type": "response", "command": "x", "success": True})
        out.write(b'{"type": "huge", "pad": "' + b"x" * 5000 + b'"}\n')
        send({"type": "after-noise"})
        answer(cmd)
    elif kind == "stderr":
        sys.stderr.buffer.write(b"e" * cmd["n"] + "\u00e9 end\n".encode())
        sys.stderr.flush()
        answer(cmd)
    elif kind == "fail":
        answer(cmd, False, error="the fake refuses")
    elif kind == "fail_silently":
        answer(cmd, False)
    elif kind == "close_stdin":
        os.close(0)
        answer(cmd)
        time.sleep(30)
    elif kind == "exit_soon":
        os.close(0)
        answer(cmd)
        time.sleep(0.3)
        os._exit(5)
    elif kind == "close_stdout":
        os.close(1)
        time.sleep(30)
    elif kind == "exit":
        sys.stderr.write("fake: exiting\n")
        sys.stderr.flush()
        os._exit(cmd["code"])
    elif kind == "silent":
        pass
    else:
        answer(cmd)
if "--ignore-eof" in args:
    time.sleep(30)
'''


@pytest.fixture(scope="module")
def fake_python(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("fake") / "fake-python"
    path.write_text(f"#!{sys.executable}\n{FAKE}")
    path.chmod(0o755)
    return str(path)


def fake(fake_python: str, *args: str, **kwargs) -> RpcClient:
    kwargs.setdefault("timeout_s", 5)
    return RpcClient(list(args), python=fake_python, **kwargs)


# ---------------------------------------------------------------------------------- fake server
async def test_events_are_never_dropped_under_a_flood_and_arrive_in_order(fake_python):
    """Events are never dropped under a flood and arrive in order."""
    async with fake(fake_python, record=True) as client:
        await client.request({"type": "flood", "n": 20000})
        events = client.drain_events()
        assert [e["i"] for e in events] == list(range(20000))
        assert len(client.received) == 20000
        assert client.drain_events() == []


async def test_concurrent_requests_from_many_tasks_get_their_own_answers(fake_python):
    """Concurrent requests from many tasks get their own answers."""
    async with fake(fake_python) as client:
        kinds = ["get_state", "flood", "fail", "noop"] * 25

        async def one(kind):
            command = {"type": kind, "n": 3} if kind == "flood" else {"type": kind}
            try:
                return (await client.request(command))["command"]
            except RpcError as exc:
                return f"error:{exc.command}:{exc}"
        results = await asyncio.gather(*(one(k) for k in kinds))
        expected = ["error:fail:the fake refuses" if k == "fail" else k for k in kinds]
        assert results == expected
        assert len(client.drain_events()) == 25 * 3


async def test_success_false_raises_with_the_servers_words_or_a_default(fake_python):
    """Success false raises with the servers words or a default."""
    async with fake(fake_python) as client:
        with pytest.raises(RpcError, match="^the fake refuses$") as info:
            await client.request({"type": "fail"})
        assert info.value.response == {"id": info.value.response["id"], "type": "response",
                                       "command": "fail", "success": False, "error": "the fake refuses"}
        with pytest.raises(RpcError, match="^fail_silently failed$"):
            await client.request({"type": "fail_silently"})


async def test_noise_on_stdout_is_kept_aside_and_protocol_lines_still_flow(fake_python, caplog):
    """Noise on stdout is kept aside and protocol lines still flow."""
    client = fake(fake_python, record=True)
    client.max_line_bytes = 1000
    async with client:
        with caplog.at_level(logging.WARNING, logger="fsm.rpc.client"):
            await client.request({"type": "noise"})
        assert client.noise == [b"not json at all", b"[1, 2]"]
        assert [e["type"] for e in client.received] == ["after-noise"]  # the long line was dropped
    text = caplog.text
    assert "response to no pending request" in text and "dropped a 5" in text


async def test_stderr_tail_is_bounded_and_a_failing_callback_does_not_stop_draining(fake_python, caplog):
    """Stderr tail is bounded and a failing callback does not stop draining."""
    seen: list[str] = []

    def callback(chunk: str) -> None:
        seen.append(chunk)
        raise ValueError("callback bug")
    async with fake(fake_python, stderr=callback, stderr_tail_bytes=100) as client:
        with caplog.at_level(logging.WARNING, logger="fsm.rpc.client"):
            # 1 MB of stderr: far more than a pipe holds. A reader that stopped at the failing
            # callback would leave the fake blocked in its write and this request unanswered.
            await client.request({"type": "stderr", "n": 1 << 20})
            await client.request({"type": "noop"})
        for _ in range(100):
            if client.stderr_tail.endswith("\u00e9 end\n"):
                break
            await asyncio.sleep(0.01)
        assert client.stderr_tail.endswith("e\u00e9 end\n") and len(client.stderr_tail.encode()) <= 100
    assert len(seen) == 1 and "stderr callback failed" in caplog.text


async def test_server_that_never_answers_times_out_and_late_answers_are_ignored(fake_python):
    """Server that never answers times out and late answers are ignored."""
    async with fake(fake_python) as client:
        with pytest.raises(RpcTimeout, match="no response to silent within 0.1 s") as info:
            await client.request({"type": "silent"}, timeout_s=0.1)
        assert info.value.command == "silent" and isinstance(info.value, TimeoutError)
        assert (await client.get_state())["isStreaming"] is False  # still usable


async def test_server_exiting_mid_request_raises_server_died_everywhere(fake_python):
    """Server exiting mid request raises server died everywhere."""
    client = await fake(fake_python).start()
    try:
        waiting = asyncio.ensure_future(client.request({"type": "silent"}, timeout_s=120))
        await asyncio.sleep(0.05)
        with pytest.raises(ServerDied) as info:
            await client.request({"type": "exit", "code": 7})
        assert info.value.returncode == 7 and "fake: exiting" in info.value.stderr_tail
        assert "exited with status 7 while waiting for the response to exit" in str(info.value)
        with pytest.raises(ServerDied, match="while waiting for the response to silent"):
            await asyncio.wait_for(waiting, 5)
        with pytest.raises(ServerDied):
            await client.next_event()
        with pytest.raises(ServerDied):
            await client.wait_for_event("anything", timeout_s=1)
        with pytest.raises(ServerDied, match="waiting for the response to get_state"):
            await client.get_state()  # at once: the death is known
    finally:
        assert await client.close() == 7


async def test_writing_to_a_server_that_closed_its_stdin(fake_python):
    """Writing to a server that closed its stdin."""
    async with fake(fake_python, close_grace_s=0.05) as client:
        client.DEATH_WAIT_S = 0.2  # how long it waits to tell "closed its stdin" from "died"
        await client.request({"type": "close_stdin"})
        with pytest.raises(RpcError, match="closed its stdin") as info:
            for _ in range(50):  # the first lines may still fit in the pipe's buffer
                await client.get_state(timeout_s=2)
        assert not isinstance(info.value, ServerDied) and info.value.command == "get_state"


async def test_a_write_that_fails_while_the_server_exits_reports_its_death(fake_python):
    """A write that fails while the server exits reports its death."""
    async with fake(fake_python) as client:
        await client.request({"type": "exit_soon"})  # stdin closed at once, exit 5 after 0.3 s
        with pytest.raises(ServerDied) as info:
            await client.get_state(timeout_s=5)
        assert info.value.returncode == 5 and info.value.command == "get_state"


async def test_close_while_a_write_is_failing_says_the_client_is_closed(fake_python):
    """Close while a write is failing says the client is closed."""
    client = await fake(fake_python, close_grace_s=0.05).start()
    client.DEATH_WAIT_S = 0.5
    await client.request({"type": "close_stdin"})
    failing = asyncio.ensure_future(client.get_state(timeout_s=5))
    await asyncio.sleep(0.05)
    await client.close()
    with pytest.raises(RpcError, match="cannot send get_state: the client is closed"):
        await failing


async def test_server_that_closes_stdout_and_lives_on_is_reported_without_status(fake_python):
    """Server that closes stdout and lives on is reported without status."""
    client = await fake(fake_python, close_grace_s=0.05).start()
    client.DEATH_WAIT_S = 0.1
    try:
        with pytest.raises(ServerDied, match="closed its stdout while waiting for the response "
                                             "to close_stdout") as info:
            await client.request({"type": "close_stdout"})
        assert info.value.returncode is None
    finally:
        assert await client.close() == -signal.SIGTERM


async def test_close_during_the_death_report_wins(fake_python):
    """Close during the death report wins."""
    client = await fake(fake_python, close_grace_s=0.05).start()
    client.DEATH_WAIT_S = 0.5
    pending = asyncio.ensure_future(client.request({"type": "close_stdout"}))
    await asyncio.sleep(0.1)  # its stdout is closed: the reader waits for the exit status
    await client.close()
    with pytest.raises(RpcError, match="the RPC client was closed"):
        await pending
    assert client._death is None and await client.next_event() is None


@pytest.mark.parametrize("pipe", ["stdout", "stderr"])
async def test_a_read_error_on_a_pipe_is_logged_not_fatal_to_the_client(fake_python, caplog, pipe):
    """A read error on a pipe is logged not fatal to the client."""
    client = await fake(fake_python, close_grace_s=0.05).start()
    client.DEATH_WAIT_S = 0.2
    try:
        with caplog.at_level(logging.DEBUG, logger="fsm.rpc.client"):
            getattr(client._proc, pipe).set_exception(OSError(5, "Input/output error"))
            if pipe == "stdout":
                with pytest.raises(ServerDied):
                    await client.next_event(timeout_s=5)  # reported as a death, not a hang
            else:
                await asyncio.sleep(0.05)
                assert (await client.get_state())["isStreaming"] is False
        assert f"reading the RPC server's {pipe} failed" in caplog.text
    finally:
        await client.close()


async def test_writing_after_the_server_was_killed_reports_its_death(fake_python):
    """Writing after the server was killed reports its death."""
    client = await fake(fake_python).start()
    try:
        os.kill(client.pid, signal.SIGKILL)
        await asyncio.sleep(0.1)
        with pytest.raises(ServerDied) as info:
            for _ in range(50):
                await client.request({"type": "noop", "pad": "x" * 65536}, timeout_s=2)
        assert info.value.returncode == -signal.SIGKILL
    finally:
        await client.close()


async def test_close_escalates_to_sigkill_for_a_server_that_ignores_eof_and_sigterm(fake_python):
    """Close escalates to sigkill for a server that ignores EOF and sigterm."""
    client = await fake(fake_python, "--ignore-term", "--ignore-eof", close_grace_s=0.05).start()
    pending = asyncio.ensure_future(client.request({"type": "silent"}, timeout_s=120))
    await asyncio.sleep(0.05)
    assert await client.close() == -signal.SIGKILL
    with pytest.raises(RpcError, match="the RPC client was closed"):
        await pending
    assert await client.next_event() is None
    with pytest.raises(RpcError, match="closed while waiting for a tick event"):
        await client.wait_for_event("tick", timeout_s=1)
    with pytest.raises(RpcError, match="cannot send get_state: the client is closed"):
        await client.get_state()


async def test_start_failures(fake_python, tmp_path):
    """Start failures."""
    with pytest.raises(ServerDied) as info:
        await fake(fake_python, "--die-at-once").start()
    assert info.value.returncode == 3 and "fake: bad arguments" in str(info.value)
    missing = RpcClient([], python=str(tmp_path / "no-such-python"))
    with pytest.raises(RpcError, match="cannot start the RPC server"):
        await missing.start()
    assert await missing.close() is None  # never started: nothing to close
    async with fake(fake_python) as client:
        with pytest.raises(RpcError, match="already started"):
            await client.start()


async def test_wait_for_idle_waits_through_busy_states_and_honours_its_timeout(fake_python):
    """Wait for idle waits through busy states and honours its timeout."""
    async with fake(fake_python) as client:
        await client.request({"type": "set_busy", "polls": 3})
        state = await client.wait_for_idle(timeout_s=5)
        assert state["isStreaming"] is False
        assert [e["poll"] for e in client.drain_events()] == [2, 3, 4]
        await client.request({"type": "set_busy", "polls": 2})
        assert (await asyncio.wait_for(client.wait_for_idle(), 5))["isStreaming"] is False  # no limit
        assert len(client.drain_events()) == 2
        await client.request({"type": "set_busy", "polls": 10 ** 6})
        with pytest.raises(RpcTimeout, match="still busy after 0.3 s"):
            await client.wait_for_idle(timeout_s=0.3)
        # Each busy answer comes with an event; the client must not answer every event with
        # another get_state (it used to poll ~1000 times in 0.3 s): at most one per 20 ms.
        polls = len(client.drain_events())
        assert 3 <= polls <= 0.3 / RpcClient.IDLE_POLL_S + 2, polls
        # With no event at all (a long backoff), it checks about every 0.25 s; it used to count
        # the answer to its own get_state as activity and poll in a tight loop.
        await client.request({"type": "set_busy", "polls": 10 ** 6, "quiet": True})
        before = (await client.get_state())["polls"]
        with pytest.raises(RpcTimeout):
            await client.wait_for_idle(timeout_s=0.6)
        polls = (await client.get_state())["polls"] - before - 1
        assert 2 <= polls <= 4, polls


async def test_event_helpers(fake_python):
    """Event helpers."""
    async with fake(fake_python) as client:
        with pytest.raises(RpcTimeout, match="no event within 0.05 s"):
            await client.next_event(timeout_s=0.05)
        with pytest.raises(RpcTimeout, match="no tick event matching {'poll': 9} within 0.1 s"):
            await client.wait_for_event("tick", timeout_s=0.1, poll=9)
        with pytest.raises(RpcTimeout, match="no tick event matching {} within 0 s"):
            await client.wait_for_event("tick", timeout_s=0)
        await client.request({"type": "flood", "n": 3})
        event = await client.wait_for_event("event", timeout_s=1, i=2)  # skips i=0 and i=1
        assert event == {"type": "event", "i": 2}
        await client.request({"type": "flood", "n": 2})
        assert [e["i"] async for e in _take(client, 2)] == [0, 1]
    # after close, the buffered-and-ended stream is drained without waiting
    assert client.drain_events() == [] and await client.next_event() is None


async def _take(client, n):
    count = 0
    async for event in client:
        yield event
        count += 1
        if count == n:
            return


def test_server_died_message_when_only_stdout_closed():
    """Server died message when only stdout closed."""
    died = ServerDied(None, "", "prompt")
    assert str(died) == ("the RPC server closed its stdout while waiting for the response to prompt "
                         "(nothing on stderr)")
    assert died.returncode is None and died.command == "prompt"


# ---------------------------------------------------------------------------------- real server


def real_client(fs: FaultServer, tmp_path: Path, **retry) -> RpcClient:
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"retry": {"maxRetries": 3, "baseDelayMs": 30, **retry}}))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return RpcClient(["--base-url", fs.base_url, "--model", "m", "--settings", str(settings),
                      "--no-session"], env=env, cwd=tmp_path, record=True, timeout_s=10)


async def test_wait_for_idle_returns_when_queued_messages_are_parked_after_a_cancel(tmp_path):
    # A steer message queued during a backoff stays queued when the chain is cancelled (it
    # waits for the next prompt); wait_for_idle used to poll until its timeout (or forever).
    """Wait for idle returns when queued messages are parked after a cancel."""
    with FaultServer([OVERLOADED]) as fs:
        async with real_client(fs, tmp_path, baseDelayMs=5000) as client:
            await client.prompt("hi")
            await client.wait_for_event("auto_retry_start", timeout_s=10)
            await client.prompt("later", "steer")
            await client.abort_retry()
            state = await asyncio.wait_for(client.wait_for_idle(timeout_s=5), 6)
            assert state["queuedMessageCount"] == 1 and state["retryState"] == "cancelled"
            assert len(fs.chat_requests) == 1
            # the parked message goes out with the next prompt
            await client.prompt("next")
            await client.wait_for_idle(timeout_s=10)
            assert [m["content"] for m in fs.chat_requests[1]["body"]["messages"]][-2:] == ["later", "next"]
