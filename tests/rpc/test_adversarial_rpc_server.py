"""Adversarial tests of ``python -m fsm rpc`` and the other commands, over real pipes.

Races at the moment a backoff elapses, odd framing, input that is valid JSON but no text, EOF
while commands still wait, absurd settings files; and the commands ``classify``, ``audit`` and
``fault-server`` fed garbage. Every process test also checks that stdout carried JSON lines
only and that the process went on serving (or exited 0 when it should).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from fsm.testing.fault_server import FaultServer, validate_script
from fsm.rpc.protocol import CommandError, parse_command
from support import OVERLOADED, env, stop_process

HANG_GUARD_S = 60.0
"""How long a test waits for what must happen (a hang guard, never a margin: SPEC §15.13)."""

pytestmark = pytest.mark.subprocess


class Proc:
    """``python -m fsm rpc`` with every stdout line collected (with its arrival time)."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "fsm", "rpc", *args], cwd=cwd, env=env(),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.objs: list[dict] = []
        self.noise: list[bytes] = []
        self.stderr = bytearray()
        self.closed = threading.Event()
        self._n = 0
        threading.Thread(target=self._out, daemon=True).start()
        threading.Thread(target=self._err, daemon=True).start()

    def _out(self) -> None:
        for line in self.proc.stdout:
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
            if not isinstance(obj, dict) or not line.endswith(b"\n"):
                self.noise.append(line)
                continue
            obj["_t"] = time.monotonic()
            self.objs.append(obj)
        self.closed.set()

    def _err(self) -> None:
        while chunk := self.proc.stderr.read1(65536):
            self.stderr += chunk

    def send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def find(self, pred, timeout: float = 10.0, after: int = 0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for obj in self.objs[after:]:
                if pred(obj):
                    return obj
            if time.monotonic() > deadline or self.closed.is_set() and not any(map(pred, self.objs[after:])):
                raise AssertionError(f"not found; last lines {self.objs[-5:]}; stderr {bytes(self.stderr[-1500:])!r}")
            time.sleep(0.002)

    def response(self, id_, timeout: float = HANG_GUARD_S) -> dict:
        return self.find(lambda o: o.get("type") == "response" and o.get("id") == id_, timeout)

    def request(self, obj: dict, timeout: float = HANG_GUARD_S) -> dict:
        self._n += 1
        rid = f"r{self._n}"
        self.send(json.dumps({**obj, "id": rid}).encode() + b"\n")
        return self.response(rid, timeout)

    def idle(self, timeout: float = HANG_GUARD_S) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            state = self.request({"type": "get_state"})["data"]
            if not (state["isStreaming"] or state["isRetrying"]):
                return state
            assert time.monotonic() < deadline, state
            time.sleep(0.01)

    def close(self, timeout: float = 5.0) -> int:
        try:
            return stop_process(self.proc, timeout)
        finally:
            self.closed.wait(2)


def settings_file(tmp_path: Path, **retry) -> str:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"retry": {"maxRetries": 3, "baseDelayMs": 30, **retry}}))
    return str(path)


def check_chains(objs: list[dict]) -> None:
    """docs/policy.md §3: per chain, starts 1, 2, … then exactly one end with the last attempt."""
    chains: dict = {}
    for o in objs:
        if o.get("type") == "auto_retry_start":
            chains.setdefault(o["chainId"], []).append(("S", o["attempt"]))
        elif o.get("type") == "auto_retry_end":
            assert o["attempt"] > 0, o
            chains.setdefault(o["chainId"], []).append(("E", o["attempt"]))
    for cid, seq in chains.items():
        starts = [a for k, a in seq if k == "S"]
        assert starts == list(range(1, len(starts) + 1)), (cid, seq)
        assert seq[-1] == ("E", starts[-1]) and [k for k, _ in seq].count("E") == 1, (cid, seq)


def check_turns(objs: list[dict]) -> None:
    """Every agent_start is closed by an agent_end before the next one."""
    depth = 0
    for o in objs:
        if o.get("type") == "agent_start":
            assert depth == 0, "agent_start inside a turn"
            depth = 1
        elif o.get("type") == "agent_end":
            assert depth == 1, "agent_end without agent_start"
            depth = 0
    assert depth == 0, "a turn never ended"


# ---------------------------------------------------------------------------------- parsing
@pytest.mark.parametrize("line, words", [
    (b'{"id":"s","type":"prompt","message":"ok\\ud800"}',
     'field "message" must be Unicode text, got a lone surrogate \\ud800 at character 2'),
    (b'{"id":"s","type":"prompt","message":"\\udfff"}', "lone surrogate \\udfff at character 0"),
    (b'{"id":"s","type":"prompt","message":"x","streamingBehavior":"\\ud800"}', '"steer" or "followUp"'),
])
def test_text_fields_must_be_unicode(line, words):
    """Text fields must be unicode."""
    err = parse_command(line)
    assert isinstance(err, CommandError) and words in err.error and err.id == "s", err


def test_a_surrogate_pair_is_fine_and_an_id_too_large_for_a_double_is_refused():
    """A surrogate pair is fine and an id too large for a double is refused."""
    ok = parse_command(b'{"type":"prompt","message":"\\ud83d\\ude00"}')
    assert ok.fields["message"] == "\U0001F600"
    err = parse_command(b'{"id":1e400,"type":"get_state"}')
    assert isinstance(err, CommandError) and "finite number" in err.error and err.command == "get_state"
    assert parse_command(b'{"id":-0.0,"type":"get_state"}').id == 0.0


# ---------------------------------------------------------------------------------- the process
@pytest.fixture(scope="module")
def shared(provider, tmp_path_factory):
    server = Proc(["--base-url", provider.base_url, "--model", "m", "--no-session"],
                  tmp_path_factory.mktemp("adv-rpc"))
    server.request({"type": "get_state"}, timeout=20)
    yield server
    assert server.close() == 0
    assert server.noise == []


def test_lone_surrogate_prompt_is_refused_and_does_not_poison_the_session(shared, provider):
    # '"\ud800"' is valid JSON but no text: accepted, it sat in the runtime context and every
    # later turn failed with UnicodeEncodeError before reaching the model.
    """Lone surrogate prompt is refused and does not poison the session."""
    before = len(provider.chat_requests)
    reply = shared.request({"type": "prompt", "message": "a\ud800b"})
    assert reply["success"] is False and "lone surrogate" in reply["error"], reply
    mark = len(shared.objs)
    assert shared.request({"type": "prompt", "message": "hello"})["success"] is True
    end = shared.find(lambda o: o.get("type") == "agent_end", after=mark)
    assert end["messages"][-1]["stopReason"] == "stop"
    assert end["messages"][0]["content"][0]["text"] == "hello"
    assert len(provider.chat_requests) == before + 1
    assert shared.idle()["messageCount"] % 2 == 0  # user/assistant pairs only


def test_odd_ids_and_framing(shared):
    """Odd ids and framing."""
    shared.send(b'{"id":1e400,"type":"get_state"}\n')
    reply = shared.find(lambda o: o.get("command") == "get_state" and o.get("success") is False)
    assert "finite number" in reply["error"] and "id" not in reply
    # One command split byte by byte, then many commands in one write.
    for byte in b'{"id":"split","type":"get_state"}\r\n':
        shared.send(bytes([byte]))
    assert shared.response("split")["success"] is True
    shared.send(b"".join(b'{"id":"m%d","type":"get_state"}\n' % i for i in range(200)) + b"\x00" * 64 + b"\n")
    shared.response("m199")
    order = [o["id"] for o in shared.objs if str(o.get("id", "")).startswith("m")]
    assert order == [f"m{i}" for i in range(200)]
    nul = shared.find(lambda o: o.get("command") == "parse" and "invalid JSON" in o.get("error", ""))
    assert nul["success"] is False
    assert shared.idle()["isRetrying"] is False


BURSTS = [
    [{"type": "abort_retry"}],
    [{"type": "abort"}],
    [{"type": "set_auto_retry", "enabled": False}, {"type": "set_auto_retry", "enabled": True}],
    [{"type": "prompt", "message": "steer", "streamingBehavior": "steer"}],
    [{"type": "prompt", "message": "follow", "streamingBehavior": "followUp"}, {"type": "abort_retry"}],
    [{"type": "abort_retry"}, {"type": "prompt", "message": "fresh"}],
    [{"type": "abort"}, {"type": "prompt", "message": "fresh"}, {"type": "get_state"}],
    [{"type": "set_auto_retry", "enabled": False}, {"type": "prompt", "message": "x"},
     {"type": "prompt", "message": "y", "streamingBehavior": "steer"}],
]


def test_bursts_of_controls_at_the_moment_the_backoff_elapses(tmp_path):
    """Each round: a chain starts; right around the end of its 40 ms backoff a burst of
    commands arrives in one write. The chains stay well formed, no request leaves before a
    backoff has elapsed, and every command is answered."""
    fs = FaultServer([OVERLOADED] * 200).start()
    server = Proc(["--base-url", fs.base_url, "--model", "m", "--no-session", "--settings",
                   settings_file(tmp_path, baseDelayMs=40, maxRetries=2)], tmp_path)
    try:
        server.request({"type": "get_state"}, timeout=20)
        for round_, burst in enumerate(BURSTS * 2):
            state = server.idle()
            if not state["autoRetryEnabled"]:
                server.request({"type": "set_auto_retry", "enabled": True})
            if state["queuedMessageCount"]:
                server.request({"type": "abort"})
            mark = len(server.objs)
            assert server.request({"type": "prompt", "message": f"round {round_}"})["success"] is True
            start = server.find(lambda o: o.get("type") == "auto_retry_start", after=mark)
            offset = 0.030 + 0.004 * (round_ % 5)  # 30..46 ms after the 40 ms backoff began
            time.sleep(max(0.0, start["_t"] + offset - time.monotonic()))
            ids = [f"b{round_}.{i}" for i in range(len(burst))]
            server.send(b"".join(json.dumps({**c, "id": i}).encode() + b"\n" for c, i in zip(burst, ids)))
            for i in ids:
                server.response(i)
        server.idle()
        assert server.close() == 0
    finally:
        server.close()
        fs.stop()
    assert server.noise == []
    check_chains(server.objs)
    check_turns(server.objs)
    # No request before the backoff of an open chain elapsed (same monotonic clock).
    requests = [r["t_ms"] / 1000 for r in fs.chat_requests]
    for s in (o for o in server.objs if o.get("type") == "auto_retry_start"):
        end = next(o["_t"] for o in server.objs
                   if o.get("type") == "auto_retry_end" and o["chainId"] == s["chainId"])
        early = [t for t in requests if s["_t"] < t < s["_t"] + s["delayMs"] / 1000 - 0.005 and t < end]
        assert not early, (s, early)


NEVER_MS = 600_000
"""An answer the model never gives while the test runs (the fault server's stop ends it)."""


def start_slow_turn(tmp_path: Path) -> tuple[FaultServer, "Proc"]:
    """A server whose first turn is waiting for the model's answer once this returns (the
    fault server recorded its request on arrival); the answer never comes."""
    fs = FaultServer([{"stream": ["slow"], "delay_ms": NEVER_MS}] * 2).start()
    server = Proc(["--base-url", fs.base_url, "--model", "m", "--no-session"], tmp_path)
    server.request({"type": "prompt", "message": "hi"}, timeout=HANG_GUARD_S)
    deadline = time.monotonic() + HANG_GUARD_S
    while not fs.chat_requests:
        assert time.monotonic() < deadline, "the first turn's request never reached the model"
        time.sleep(0.01)
    return fs, server


def turns_started(objs: list[dict]) -> int:
    return sum(o.get("type") == "agent_start" for o in objs)


def test_eof_with_a_prompt_waiting_behind_an_abort_starts_no_new_turn(tmp_path):
    """EOF with a prompt waiting behind an abort starts no new turn: the prompt is refused
    ("shutting down"), no second turn starts (it used to run until the shutdown's grace), no
    second request reaches the model, and the server exits 0 without waiting for the answer
    that never comes."""
    fs, server = start_slow_turn(tmp_path)
    try:
        # The lines and the EOF go out back to back (close flushes), as a client that exits does.
        server.proc.stdin.write(b'{"id":"ab","type":"abort"}\n{"id":"late","type":"prompt","message":"after"}\n'
                                b'{"id":"half","type":"get_st')  # EOF in the middle of a line
        server.proc.stdin.close()
        assert server.proc.wait(HANG_GUARD_S) == 0
        assert server.closed.wait(HANG_GUARD_S)
    finally:
        server.close()
        fs.stop()
    assert server.response("ab")["success"] is True
    late = server.response("late")
    assert late["success"] is False and "shutting down" in late["error"]
    half = server.response("half")
    assert half["success"] is False and "invalid JSON" in half["error"]
    assert len(fs.chat_requests) == 1 and turns_started(server.objs) == 1
    check_turns(server.objs)


def test_eof_with_a_queued_follow_up_sends_nothing_more(tmp_path):
    """SIGTERM with a queued follow-up sends nothing more: the running turn ends aborted, the
    follow-up starts no turn and reaches no model, and the server exits 0 without waiting for
    the answer that never comes."""
    fs, server = start_slow_turn(tmp_path)
    try:
        assert server.request({"type": "prompt", "message": "next", "streamingBehavior": "followUp"},
                              timeout=HANG_GUARD_S)["success"]
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(HANG_GUARD_S) == 0
        assert server.closed.wait(HANG_GUARD_S)
    finally:
        server.close()
        fs.stop()
    # The aborted turn parks the follow-up (the user asked to stop): it never reaches the model.
    assert len(fs.chat_requests) == 1 and turns_started(server.objs) == 1
    check_turns(server.objs)
    stops = [o["message"]["stopReason"] for o in server.objs
             if o.get("type") == "message_end" and o["message"]["role"] == "assistant"]
    assert stops == ["aborted"]
    assert server.noise == []


# ---------------------------------------------------------------------------------- settings
def run_cli(*args: str, stdin: bytes | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fsm", *args], cwd=cwd, env=env(), input=stdin,
                          stdin=None if stdin is not None else subprocess.DEVNULL,
                          capture_output=True, timeout=60)


@pytest.mark.parametrize("content, words", [
    ('{"retry":' + "[" * 100000, "nested"),
    ('{"retry":{"maxRetries":1e9}}', "retry.maxRetries"),
    ('{"retry":{"baseDelayMs":-1}}', "retry.baseDelayMs"),
    ('{"retry":{"enabled":"false"}}', "retry.enabled"),
    ('{"retry":[]}', 'object under "retry"'),
    ('{"retry":{"jitter":["full"]}}', "retry.jitter"),
])
def test_absurd_settings_files_exit_2_naming_the_problem(tmp_path, content, words):
    """Absurd settings files exit 2 naming the problem."""
    path = tmp_path / "settings.json"
    path.write_text(content)
    proc = run_cli("rpc", "--model", "m", "--no-session", "--settings", str(path), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == b"", proc.stderr[-500:]
    assert words.encode() in proc.stderr and b"Traceback" not in proc.stderr, proc.stderr[-500:]


def test_settings_with_huge_unknown_keys_are_named_briefly(tmp_path):
    """Settings with huge unknown keys are named briefly."""
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"retry": {"maxRetries": 2}, "k" * 1_000_000: 1}))  # under the 1 MiB cap
    proc = run_cli("rpc", "--model", "m", "--no-session", "--settings", str(path), cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout == b""
    assert b"ignoring keys this project does not use: kkk" in proc.stderr
    assert len(proc.stderr) < 2000, len(proc.stderr)


# ---------------------------------------------------------------------------------- other commands
def test_classify_garbage_inputs(tmp_path, capsysbinary, monkeypatch):
    """Classify garbage inputs: a line that is not UTF-8, an empty file, a folder, a 20 MB
    message, NUL bytes, deep nesting. The command runs in this process (its exit status is
    ``main``'s return, an uncaught exception fails the test as a traceback would); the process
    boundary of ``classify --jsonl`` is tested in tests/commands/test_classify_cli.py."""
    from fsm.__main__ import main

    def classify(*args: str, stdin: bytes | None = None) -> tuple[int, bytes, bytes]:
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        status = main(["classify", *args])
        out, err = capsysbinary.readouterr()
        return status, out, err

    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(bytes(b for b in range(256) if b != 10) * 4 + b"\n" + json.dumps({"message": "503 Service Unavailable"}).encode())
    status, out, err = classify("--jsonl", str(binary))
    assert status == 1 and b"line 1: not valid UTF-8" in err
    assert json.loads(out)["kind"] == "retryable"  # the good line is still classified
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert classify("--jsonl", str(empty)) == (0, b"", b"")
    status, out, err = classify("--jsonl", str(tmp_path))
    assert status == 1 and b"is a folder, not a file" in err
    big = json.dumps({"message": "x" * 20_000_000 + " 529 overloaded"}).encode() + b"\n"
    status, out, err = classify("--jsonl", "-", stdin=big + b"\x00" * 10 + b"\n" + b"[" * 100000 + b"\n")
    assert status == 1
    assert json.loads(out.splitlines()[0])["rule"] == "retryable.status_529"
    assert b"line 2: invalid JSON" in err and b"line 3: invalid JSON: nested too deeply" in err


def test_audit_and_fault_server_refuse_deeply_nested_json_cleanly(tmp_path):
    """Audit and fault server refuse deeply nested JSON cleanly."""
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000)
    for args in (("audit", str(deep)), ("fault-server", "--script", str(deep))):
        proc = run_cli(*args)
        assert proc.returncode == 2 and b"nested too deeply" in proc.stderr, proc.stderr[-300:]
        assert b"Traceback" not in proc.stderr


# ---------------------------------------------------------------------------------- other modules' bugs
def test_read_trace_reports_deep_nesting_as_a_trace_error(tmp_path):
    """Read trace reports deep nesting as a trace error."""
    from fsm.review.audit import TraceError, read_trace
    path = tmp_path / "deep.jsonl"
    path.write_text("[" * 100000 + "\n")
    with pytest.raises(TraceError):
        read_trace(path)


def test_settings_load_reports_deep_nesting_as_a_settings_error(tmp_path):
    """A settings file nested too deeply is refused with a SettingsError (docs/policy.md §8b.10)."""
    from fsm.core.settings import SettingsError
    from fsm.host.settings_file import load_settings
    path = tmp_path / "settings.json"
    path.write_text('{"retry":' + "[" * 100000)
    with pytest.raises(SettingsError):
        load_settings(path)


def test_unknown_settings_key_error_is_bounded():
    """A huge unknown key is named briefly in the SettingsError."""
    from fsm.core.settings import RetrySettings, SettingsError
    with pytest.raises(SettingsError) as info:
        RetrySettings.from_json({"retry": {"k" * 5_000_000: 1}})
    assert len(str(info.value)) < 1000 and "unknown key" in str(info.value)


def test_fault_server_refuses_header_values_it_cannot_send():
    """Fault server refuses header values it cannot send."""
    script = [{"status": 503, "json": {"error": "x"}, "headers": {"x-note": "\u20ac"}}]
    try:
        validate_script(script)
    except ValueError:
        return  # refused up front: fine
    with FaultServer(script) as fs:
        request = urllib.request.Request(fs.base_url + "/chat/completions", data=b"{}",
                                         headers={"content-type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=5)
        assert info.value.code == 503


# ---------------------------------------------------------------------------------- in-process
class Sink:
    """Stands in for Output: keeps each protocol line as the client would parse it."""

    def __init__(self) -> None:
        self.lines: list[dict] = []

    def send(self, obj) -> None:
        from fsm.rpc.protocol import encode_line
        self.lines.append(json.loads(encode_line(obj)))


class BrokenSession:
    """Every operation fails (or hangs): the server must answer, log, and still shut down."""

    is_retrying = True

    def __init__(self, hang: bool = False) -> None:
        self.hang = hang
        self.listener = None
        self.retry_aborts = 0

    def subscribe(self, listener):
        self.listener = listener
        return lambda: None

    def set_auto_retry_enabled(self, enabled):
        raise RuntimeError("settings locked")

    def abort_retry(self):
        self.retry_aborts += 1

    async def abort(self):
        if self.hang:
            await asyncio.sleep(30)
        raise OSError("abort broke")

    async def prompt(self, text, streaming_behavior=None):
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # fails after the first tick: the response already said success
        if self.hang:
            await asyncio.sleep(30)
        raise ValueError("late failure")

    def state(self):
        return {}

    async def close(self):
        if self.hang:
            await asyncio.sleep(30)
        raise OSError("log disk full")


async def test_failing_session_operations_are_answered_and_logged(caplog):
    """Failing session operations are answered and logged."""
    from fsm.rpc.dispatch import RpcServer

    class Jsonable:
        def to_json(self):
            return {"as": "json"}
    sink = Sink()
    session = BrokenSession()
    server = RpcServer(session, sink)
    await server.handle(b'{"id":1,"type":"set_auto_retry","enabled":true}')
    await server.handle(b'{"id":2,"type":"abort"}')
    await server.handle(b'{"id":3,"type":"prompt","message":"hi"}')
    for _ in range(10):
        await asyncio.sleep(0)
    session.listener({"type": "odd", "value": Jsonable(), "other": {1, 2}.__class__})
    answers = {line["id"]: line for line in sink.lines if "id" in line}
    assert answers[1]["error"] == "set_auto_retry failed: RuntimeError: settings locked"
    assert answers[2]["error"] == "abort failed: OSError: abort broke"
    assert answers[3]["success"] is True
    assert "background task failed: late failure" in caplog.text
    assert sink.lines[-1] == {"type": "odd", "value": {"as": "json"}, "other": "<class 'set'>"}
    await server.shutdown(grace_s=0.05)
    assert "session.close() did not finish cleanly" in caplog.text


async def test_shutdown_is_bounded_when_the_session_hangs(caplog):
    """Shutdown is bounded when the session hangs."""
    from fsm.rpc.dispatch import RpcServer
    sink = Sink()
    session = BrokenSession(hang=True)
    server = RpcServer(session, sink)
    await server.handle(b'{"id":"p","type":"prompt","message":"hi"}')
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await server.shutdown(grace_s=0.1)
    assert loop.time() - t0 < 1.5
    assert session.retry_aborts == 1 and not server._tasks
    assert "abort did not finish cleanly" in caplog.text and "close() did not finish" in caplog.text


def test_an_id_that_is_not_json_is_not_guessed():
    """An id that is not JSON is not guessed."""
    err = parse_command(b'{"id":"a\\qb","type":')
    assert isinstance(err, CommandError) and err.has_id is False and "invalid JSON" in err.error


async def test_deferred_provider_whose_import_fails_ends_each_turn_with_an_error(caplog):
    """Deferred provider whose import fails ends each turn with an error."""
    from fsm.providers.deferred import DeferredProvider

    def factory():
        raise ImportError("no module named openai")
    provider = DeferredProvider(factory, name="p", model="m")
    message = await provider.complete([{"role": "user", "content": "hi"}])
    assert message.stop_reason == "error"
    assert message.error_message == "cannot load the model client: ImportError: no module named openai"
    assert provider.loaded is None
    await provider.aclose()  # nothing was loaded: nothing to close
    assert "cannot load the provider" in caplog.text


def test_serve_off_the_main_thread_with_a_provider_whose_close_fails():
    """serve() in a worker thread (no signal handlers there), over plain pipes."""
    from fsm.rpc.server import ServeConfig, serve
    from fsm.testing import ScriptedProvider

    class Provider(ScriptedProvider):
        async def aclose(self):
            raise OSError("already closed")
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    result: list = []
    config = ServeConfig(provider=Provider([]), stdin_fd=in_r, stdout_fd=out_w)
    thread = threading.Thread(target=lambda: result.append(asyncio.run(serve(config))))
    thread.start()
    try:
        os.write(in_w, b'{"id":1,"type":"prompt","message":"hi"}\n')
        os.write(in_w, b'{"id":2,"type":"get_state"}\n')
        data = b""
        deadline = time.monotonic() + 10
        # The get_state answer may come before or after the turn's end: wait for both.
        while not (b'"agent_end"' in data and b'"id":2' in data) and time.monotonic() < deadline:
            data += os.read(out_r, 65536)
    finally:
        os.close(in_w)
        thread.join(10)
        os.close(in_r)
        os.close(out_w)
        os.close(out_r)
    assert result == [0]
    lines = [json.loads(line) for line in data.splitlines()]
    assert lines[0] == {"id": 1, "type": "response", "command": "prompt", "success": True}
    ends = [line for line in lines if line["type"] == "agent_end"]
    assert len(ends) == 1 and ends[0]["messages"][-1]["stopReason"] == "stop"
    assert any(line.get("id") == 2 and line["success"] for line in lines)
