"""The RPC server (``python -m fsm rpc``) over its real pipes, byte for byte.

These tests drive the subprocess with raw bytes (no :class:`fsm.rpc.RpcClient`), so framing,
bad input and stdout hygiene are checked as a client in another language would see them. One
server is shared by the tests that leave it idle; tests that need a scripted provider or end
the process start their own. The pure parts (framer, parser, encoder) are tested in-process.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fsm.testing.fault_server import FaultServer
from fsm.rpc.protocol import (MAX_LINE_BYTES, Command, CommandError, LineFramer, LineTooLong,
                              encode_line, parse_command)
from support import OVERLOADED, ROOT, stop_process

HANG_GUARD_S = 60.0
"""How long a test waits for what must happen (a hang guard, never a margin: SPEC §15.13)."""

pytestmark = pytest.mark.subprocess


def rpc_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


class RawServer:
    """``python -m fsm rpc ARGS`` with a thread collecting its stdout lines (split on ``\\n``)."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "fsm", "rpc", *args], cwd=cwd,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env or rpc_env())
        self.lines: queue.Queue = queue.Queue()
        self.raw: list[bytes] = []       # every stdout line, as bytes
        self.noise: list[bytes] = []     # stdout lines that are not a JSON object
        self.stderr = bytearray()
        self._ids = 0
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stdout(self) -> None:
        for line in self.proc.stdout:  # BufferedReader splits on b"\n" only
            self.raw.append(line)
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
            if not isinstance(obj, dict) or not line.endswith(b"\n"):
                self.noise.append(line)
                continue
            self.lines.put((time.monotonic(), obj))
        self.lines.put((time.monotonic(), None))

    def _read_stderr(self) -> None:
        while chunk := self.proc.stderr.read1(65536):
            self.stderr += chunk

    def send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send_json(self, obj: dict) -> float:
        sent = time.monotonic()
        self.send(json.dumps(obj).encode() + b"\n")
        return sent

    def until(self, match, timeout: float = HANG_GUARD_S) -> tuple[float, dict, list[dict]]:
        """Read lines until ``match(obj)``; returns (receive time, the object, skipped objects)."""
        skipped = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                t, obj = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"timed out; skipped {skipped}; stderr: {self.stderr[-2000:]!r}")
            if obj is None:
                raise AssertionError(f"stdout closed (exit {self.proc.poll()}); stderr: {self.stderr[-2000:]!r}")
            if match(obj):
                return t, obj, skipped
            skipped.append(obj)

    def response(self, id_=None, timeout: float = HANG_GUARD_S) -> dict:
        def is_it(o):
            return o.get("type") == "response" and (id_ is None or o.get("id") == id_)
        return self.until(is_it, timeout)[1]

    def event(self, type_: str, timeout: float = HANG_GUARD_S) -> dict:
        return self.until(lambda o: o.get("type") == type_, timeout)[1]

    def request(self, obj: dict, timeout: float = HANG_GUARD_S) -> dict:
        self._ids += 1
        rid = f"t{self._ids}"
        self.send_json({**obj, "id": rid})
        return self.response(rid, timeout)

    def get_state(self) -> dict:
        reply = self.request({"type": "get_state"})
        assert reply["success"] is True, reply
        return reply["data"]

    def close(self, timeout: float = 30.0) -> int:
        return stop_process(self.proc, timeout)


@pytest.fixture(scope="module")
def shared(provider, tmp_path_factory):
    """One idle server for the tests that leave it idle; stdout must stay protocol-only."""
    cwd = tmp_path_factory.mktemp("rpc")
    server = RawServer(["--base-url", provider.base_url, "--model", "m", "--no-session"], cwd)
    server.get_state()
    yield server
    assert server.close() == 0
    assert server.noise == [], server.noise


def assert_serving(server: RawServer) -> None:
    state = server.get_state()
    assert state["isStreaming"] is False and state["isRetrying"] is False


def spawn(tmp_path: Path, script: list[dict], retry: dict, extra: list[str] = ()):
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"retry": {"maxRetries": 3, "baseDelayMs": 20, **retry}}))
    fs = FaultServer(script).start()
    where = [] if "--session-file" in extra else ["--no-session"]
    server = RawServer(["--base-url", fs.base_url, "--model", "m", "--settings", str(settings),
                        *where, *extra], tmp_path)
    return fs, server


# ------------------------------------------------------------------ pure parts
def test_framer_splits_on_newline_only_and_strips_one_cr():
    """Framer splits on newline only and strips one cr."""
    framer = LineFramer(100)
    assert framer.feed("a\u2028b\u2029c\r\n".encode() + b"d\r\r\n" + b"par") == [
        "a\u2028b\u2029c".encode(), b"d\r"]
    assert framer.feed(b"tial\n") == [b"partial"]
    assert framer.feed(b"last") == [] and framer.close() == [b"last"]
    assert framer.close() == []


def test_framer_discards_an_overlong_line_without_holding_it():
    """Framer discards an overlong line without holding it."""
    framer = LineFramer(10)
    out = []
    for _ in range(100):
        out += framer.feed(b'{"id":"x",' + b"y" * 90)
        assert len(framer._buf) <= 10
    out += framer.feed(b"\nok\n")
    assert out == [LineTooLong(10000, 10, out[0].head), b"ok"]
    assert out[0].head.startswith(b'{"id":"x"')


@pytest.mark.parametrize("line, expected", [
    (b"", None),
    (b"  \t", None),
    (b'{"type":"get_state"}', Command("get_state", {"type": "get_state"})),
    (b'{"id":7,"type":"abort"}', Command("abort", {"id": 7, "type": "abort"}, 7, True)),
    (b'{"type":"prompt","message":"hi","streamingBehavior":null}',
     Command("prompt", {"type": "prompt", "message": "hi", "streamingBehavior": None})),
])
def test_parse_valid(line, expected):
    """Parse valid."""
    assert parse_command(line) == expected


@pytest.mark.parametrize("line, command, words, id_", [
    (b'{"id":"a","type":', "parse", "invalid JSON", "a"),
    (b"[1,2]", "parse", "must be a JSON object, got array", None),
    (b'"get_state"', "parse", "got string", None),
    (b"null", "parse", "got null", None),
    (b'{"id":"b"}', "parse", 'missing field "type"', "b"),
    (b'{"id":"c","type":5}', "parse", 'field "type" must be a string', "c"),
    (b'{"id":"d","type":"dance"}', "dance", 'unknown command "dance"', "d"),
    (b'{"id":"e","type":"prompt"}', "prompt", 'missing field "message"', "e"),
    (b'{"id":"f","type":"prompt","message":42}', "prompt", 'field "message" must be a string, got number', "f"),
    (b'{"id":"g","type":"set_auto_retry","enabled":"yes"}', "set_auto_retry",
     'field "enabled" must be true or false, got string "yes"', "g"),
    (b'{"id":"h","type":"set_auto_retry"}', "set_auto_retry", 'missing field "enabled"', "h"),
    (b'{"id":"i","type":"prompt","message":"x","streamingBehavior":"now"}', "prompt",
     '"steer" or "followUp"', "i"),
    (b'{"id":[1],"type":"get_state"}', "get_state", 'field "id" must be a string or a number', None),
    (b'{"id":"j","type":"get_state","x":NaN}', "parse", "NaN is not valid JSON", "j"),
    (b"[" * 100000, "parse", "nested too deeply", None),
    (b'{"id":"k","type":"get_state"}\xff\xfe', "parse", "invalid UTF-8 at byte 29 (0xff)", "k"),
])
def test_parse_errors_name_the_problem(line, command, words, id_):
    """Parse errors name the problem."""
    err = parse_command(line)
    assert isinstance(err, CommandError)
    assert err.command == command and words in err.error, err.error
    assert err.id == id_ and err.has_id == (id_ is not None)
    resp = err.response()
    assert resp["success"] is False and resp["type"] == "response"


def test_encode_line_is_one_line_whatever_the_strings():
    """Encode line is one line whatever the strings."""
    line = encode_line({"t": "a\u2028b\u2029c\nd", "lone": "\ud800", "nan": float("nan"), "é": "ü"})
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert "\u2028".encode() not in line and "\u2029".encode() not in line
    assert json.loads(line) == {"t": "a\u2028b\u2029c\nd", "lone": "\ud800", "nan": None, "é": "ü"}


# ------------------------------------------------------------------ the process
def test_get_state_reports_the_retry_fields_and_echoes_ids(shared):
    """Get state reports the retry fields and echoes ids."""
    shared.send(b'{"id": 12, "type": "get_state"}\n')
    reply = shared.response(12)
    assert list(reply)[:4] == ["id", "type", "command", "success"]
    assert reply["command"] == "get_state" and reply["success"] is True
    data = reply["data"]
    for key in ("isStreaming", "isRetrying", "retryAttempt", "autoRetryEnabled",
                "autoCompactionEnabled", "messageCount", "sessionId", "model"):
        assert key in data, key
    assert data["model"]["id"] == "m" and data["model"]["provider"] == "127.0.0.1"
    assert data["autoRetryEnabled"] is True and data["retryAttempt"] == 0
    shared.send(b'{"type":"get_state"}\n')
    assert "id" not in shared.response()


BAD_INPUT = [
    pytest.param(b'{"id":"bad1","type":"get_state"\n', "invalid JSON", "bad1", id="invalid-json"),
    pytest.param(b'[1,2,3]\n', "must be a JSON object", None, id="array"),
    pytest.param(b'42\n', "must be a JSON object, got number", None, id="number"),
    pytest.param(b'{"id":"bad2","type":"fly"}\n', 'unknown command "fly"', "bad2", id="unknown-command"),
    pytest.param(b'{"id":"bad3"}\n', 'missing field "type"', "bad3", id="no-type"),
    pytest.param(b'{"id":"bad4","type":"prompt"}\n', 'missing field "message"', "bad4", id="no-message"),
    pytest.param(b'{"id":"bad5","type":"prompt","message":["hi"]}\n', 'must be a string, got array', "bad5",
                 id="message-type"),
    pytest.param(b'{"id":"bad6","type":"set_auto_retry","enabled":1}\n', "must be true or false, got number",
                 "bad6", id="enabled-type"),
    pytest.param(b'{"id":"bad7","type":"prompt","message":"x","streamingBehavior":7}\n', "streamingBehavior",
                 "bad7", id="behavior-type"),
    pytest.param(b'\x00\x01\xff\xfe\x80garbage\x9c\n', "invalid UTF-8 at byte 2 (0xff)", None, id="binary"),
    pytest.param(b'{"id":"bad8","type":"get_state","x":"\xc3\x28"}\n', "invalid UTF-8", "bad8",
                 id="invalid-utf8-in-string"),
    pytest.param(b"[" * 200000 + b"\n", "nested too deeply", None, id="deep-nesting"),
    pytest.param(b'{"id":"bad9","junk":"' + b"x" * (10 * 1024 * 1024) + b'\n', "invalid JSON", "bad9",
                 id="10MB-line"),
]


@pytest.mark.parametrize("data, words, id_", BAD_INPUT)
def test_bad_input_gets_an_error_and_the_server_keeps_serving(shared, data, words, id_):
    """Bad input gets an error and the server keeps serving."""
    shared.send(data)
    reply = shared.response(timeout=20)
    assert reply["success"] is False and reply["type"] == "response" and words in reply["error"], reply
    assert reply.get("id") == id_
    assert len(json.dumps(reply)) < 2000  # the error names the problem; it does not echo the line
    assert_serving(shared)


def test_blank_lines_are_ignored(shared):
    """Blank lines are ignored."""
    shared.send(b"\n\r\n   \n")
    shared.send(b'{"id":"after-blank","type":"get_state"}\n')
    reply = shared.response()
    assert reply["id"] == "after-blank" and reply["success"] is True  # no error response came first


def test_crlf_lines_are_accepted(shared):
    """Crlf lines are accepted."""
    shared.send(b'{"id":"crlf","type":"set_auto_retry","enabled":false}\r\n')
    assert shared.response("crlf")["success"] is True
    assert shared.get_state()["autoRetryEnabled"] is False
    shared.send(b'{"id":"crlf2","type":"set_auto_retry","enabled":true}\r\n')
    assert shared.response("crlf2")["success"] is True
    assert shared.get_state()["autoRetryEnabled"] is True


def test_each_command_answers(shared):
    """Each command answers."""
    for command in ({"type": "abort_retry"}, {"type": "abort"},
                    {"type": "set_auto_retry", "enabled": True}, {"type": "get_state"}):
        reply = shared.request(command)
        assert reply["success"] is True and reply["command"] == command["type"], reply


def test_prompt_runs_a_turn_with_u2028_inside_the_message(shared):
    """Prompt runs a turn with u2028 inside the message."""
    text = "line one\u2028line two\u2029end"
    shared.send(b'{"id":"u","type":"prompt","message":"' + text.encode() + b'"}\n')
    _, reply, before = shared.until(lambda o: o.get("id") == "u")
    assert reply["success"] is True and reply["command"] == "prompt"
    _, end, skipped = shared.until(lambda o: o.get("type") == "agent_end")
    events = before + skipped + [end]
    users = [e for e in events if e["type"] == "message_end" and e["message"]["role"] == "user"]
    assert users[0]["message"]["content"][0]["text"] == text
    assert any(e["type"] == "message_update" for e in events)
    stops = [e["message"]["stopReason"] for e in events
             if e["type"] == "message_end" and e["message"]["role"] == "assistant"]
    assert stops == ["stop"]
    assert not any("\u2028".encode() in line for line in shared.raw)
    assert_serving(shared)


def test_line_over_the_limit_is_rejected_with_bounded_memory(shared):
    """Line over the limit is rejected with bounded memory."""
    shared.request({"type": "prompt", "message": "load the SDK first"})
    shared.event("agent_end")

    def peak_kb() -> int:
        status = Path(f"/proc/{shared.proc.pid}/status").read_text()
        return int(next(x for x in status.splitlines() if x.startswith("VmHWM:")).split()[1])

    before = peak_kb()
    chunk = b'{"id":"huge","type":"prompt","message":"' + b"z" * (1 << 20)
    shared.send(chunk)
    filler = b"z" * (1 << 20)
    for _ in range(MAX_LINE_BYTES // len(filler) * 3):  # 48 MB in all
        shared.send(filler)
    shared.send(b'"}\n')
    reply = shared.response(timeout=30)
    assert reply["success"] is False and "line too long" in reply["error"], reply
    assert reply.get("id") == "huge"
    assert_serving(shared)
    grown_mb = (peak_kb() - before) / 1024
    assert grown_mb < 40, f"peak memory grew by {grown_mb:.0f} MB for a 49 MB line"


def test_prompt_is_answered_at_once_and_get_state_during_the_turn(tmp_path):
    """A prompt is answered at once, before its turn starts (as in pi), and get_state answers
    during the turn; a second prompt is refused while a follow-up is queued."""
    fs, server = spawn(tmp_path, [{"stream": ["slow"], "delay_ms": 1500}], {})
    try:
        server.get_state()
        server.send_json({"id": "p", "type": "prompt", "message": "hi"})
        _, reply, before = server.until(lambda o: o.get("id") == "p")
        assert reply["success"] is True
        assert before == []  # the response precedes agent_start: it does not wait for the turn
        assert server.until(lambda o: True)[1]["type"] == "agent_start"
        state = server.get_state()
        assert state["isStreaming"] is True and state["isRetrying"] is False
        busy = server.request({"type": "prompt", "message": "again"})
        assert busy["success"] is False and "turn is running" in busy["error"]
        queued = server.request({"type": "prompt", "message": "later", "streamingBehavior": "followUp"})
        assert queued["success"] is True
        server.event("agent_end")
        server.event("agent_end")  # the follow-up's turn
        assert len(fs.chat_requests) == 2
        assert fs.chat_requests[1]["body"]["messages"][-1] == {"role": "user", "content": "later"}
        assert server.close() == 0
    finally:
        server.close()
        fs.stop()


NEVER_MS = 600_000
"""An answer the model never gives while the test runs (the fault server's stop ends it)."""


def test_abort_stops_a_running_turn(tmp_path):
    """Abort stops a running turn whose answer never comes: the abort is answered, the
    request's connection is closed (the fault server sees the client go), the turn ends
    ``aborted``."""
    fs, server = spawn(tmp_path, [{"stream": ["never"], "delay_ms": NEVER_MS}], {})
    try:
        server.request({"type": "prompt", "message": "hi"})
        deadline = time.monotonic() + HANG_GUARD_S
        while not fs.chat_requests:
            assert time.monotonic() < deadline, "the turn's request never reached the model"
            time.sleep(0.01)
        reply = server.request({"type": "abort"}, timeout=HANG_GUARD_S)
        assert reply["success"] is True
        while fs.chat_requests[0]["outcome"] is None:
            assert time.monotonic() < deadline + HANG_GUARD_S, "the request was never closed"
            time.sleep(0.01)
        assert fs.chat_requests[0]["outcome"] == "client_gone_during_delay"
        state = server.get_state()
        assert state["isStreaming"] is False and state["isRetrying"] is False
        assert server.close() == 0
    finally:
        server.close()
        fs.stop()
    ends = [json.loads(x) for x in server.raw]
    stops = [e["message"]["stopReason"] for e in ends
             if e.get("type") == "message_end" and e["message"]["role"] == "assistant"]
    assert stops == ["aborted"]


@pytest.mark.parametrize("how", ["eof", "sigterm"])
def test_exit_during_a_backoff_does_not_wait_it_out(tmp_path, how):
    """EOF or SIGTERM during an hour's backoff: the server exits 0 at once (within the hang
    guard, a minute: waiting the backoff out would take the hour), the chain ends cancelled,
    nothing more is sent."""
    fs, server = spawn(tmp_path, [OVERLOADED], {"baseDelayMs": 3_600_000})
    try:
        server.request({"type": "prompt", "message": "hi"})
        start = server.event("auto_retry_start")
        assert start["delayMs"] >= 1_800_000, start
        if how == "eof":
            server.proc.stdin.close()
        else:
            server.proc.send_signal(signal.SIGTERM)
        rc = server.proc.wait(HANG_GUARD_S)
        assert rc == 0, (rc, bytes(server.stderr))
        end = server.event("auto_retry_end")  # the chain still gets its end (docs/policy.md §3 invariant)
        assert end == {**end, "success": False, "attempt": 1, "finalError": "Retry cancelled"}
        assert len(fs.chat_requests) == 1
    finally:
        server.close()
        fs.stop()


def test_stdout_carries_protocol_lines_only(tmp_path, provider):
    # Something in the process prints and writes to descriptor 1 once the server runs, the
    # openai SDK logs at debug level and every warning is shown: all of it must reach stderr.
    """Stdout carries protocol lines only."""
    (tmp_path / "sitecustomize.py").write_text(
        "import os, sys, threading, time\n"
        "def noisy():\n"
        "    while 'fsm.rpc.server' not in sys.modules:\n"
        "        time.sleep(0.005)\n"
        "    time.sleep(0.05)\n"
        "    print('NOISE print', flush=True)\n"
        "    os.write(1, b'NOISE fd1\\n')\n"
        "threading.Thread(target=noisy, daemon=True).start()\n")
    env = rpc_env(OPENAI_LOG="debug", PYTHONWARNINGS="always")
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"retry": {"provider": {"maxRetries": 0}}, "theme": "dark"}))
    server = RawServer(["--base-url", provider.base_url, "--model", "m", "--no-session",
                        "--settings", str(settings)], tmp_path, env)
    try:
        server.request({"type": "prompt", "message": "hi"})
        server.event("agent_end")
        deadline = time.monotonic() + 5
        while b"NOISE fd1" not in server.stderr and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.close() == 0
    finally:
        server.close()
    assert server.noise == []
    err = bytes(server.stderr)
    assert b"NOISE print" in err and b"NOISE fd1" in err
    assert b"ignoring the original's own keys retry.provider" in err and b"theme" in err


def test_bad_settings_file_exits_2_naming_the_key(tmp_path):
    """Bad settings file exits 2 naming the key."""
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"retry": {"maxRetries": -1}}))
    proc = subprocess.run([sys.executable, "-m", "fsm", "rpc", "--model", "m", "--no-session",
                           "--settings", str(settings)], cwd=tmp_path, env=rpc_env(),
                          capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and proc.stdout == b""
    assert b"retry.maxRetries" in proc.stderr and b"-1" in proc.stderr


@pytest.fixture(scope="module")
def retried_with_files(tmp_path_factory):
    """One server with a session file (``{id}`` in its path) and a trace file, through one
    retried prompt (a 529, then success) and EOF: ``(session id, folder)`` once it exited 0.
    The session-log and trace tests read its files (one process instead of one each)."""
    tmp_path = tmp_path_factory.mktemp("files")
    fs, server = spawn(tmp_path, [OVERLOADED], {}, ["--session-file", str(tmp_path / "s" / "{id}.jsonl"),
                                                    "--trace", str(tmp_path / "trace.jsonl")])
    try:
        sid = server.get_state()["sessionId"]
        server.request({"type": "prompt", "message": "hi"})
        server.event("auto_retry_end")
        assert server.close() == 0
    finally:
        server.close()
        fs.stop()
    return sid, tmp_path


def test_session_log_keeps_every_message(retried_with_files):
    """Session log keeps every message."""
    sid, tmp_path = retried_with_files
    lines = [json.loads(x) for x in (tmp_path / "s" / f"{sid}.jsonl").read_text().splitlines()]
    assert lines[0]["type"] == "session" and lines[0]["id"] == sid
    assert [m["message"].get("stopReason", "user") for m in lines[1:]] == ["user", "error", "stop"]


def test_default_session_file_is_under_dot_fsm(tmp_path, provider):
    """Default session file is under dot fsm."""
    server = RawServer(["--base-url", provider.base_url, "--model", "m"], tmp_path)
    try:
        sid = server.get_state()["sessionId"]
        assert server.close() == 0
    finally:
        server.close()
    assert (tmp_path / ".fsm" / "sessions" / f"{sid}.jsonl").exists()


def test_trace_file_records_transitions(retried_with_files):
    """Trace file records transitions."""
    _, tmp_path = retried_with_files
    records = [json.loads(x) for x in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert records[0]["type"] == "trace" and len(records) > 1


@pytest.mark.parametrize("how", ["eof", "sigterm"])
def test_exit_even_when_the_client_stops_reading_stdout(tmp_path, provider, how):
    """Exit even when the client stops reading stdout."""
    proc = subprocess.Popen([sys.executable, "-m", "fsm", "rpc", "--base-url", provider.base_url,
                             "--model", "m", "--no-session"], cwd=tmp_path, env=rpc_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # ~1 MB of answers: far more than a pipe holds, and nobody reads them.
        proc.stdin.write(b'{"type":"get_state"}\n' * 2500)
        proc.stdin.flush()
        assert proc.stdout.readline()  # the server runs (its signal handlers are in place)
        time.sleep(0.3)
        if how == "eof":
            proc.stdin.close()
        else:
            proc.send_signal(signal.SIGTERM)
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        rc = proc.wait(30)  # a server that hangs on its full stdout raises TimeoutExpired here
        assert rc == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    data = proc.stdout.read()
    assert data and all(json.loads(line)["success"] for line in data.splitlines(keepends=True)
                        if line.endswith(b"\n"))


def test_server_exits_when_its_stdout_reader_goes_away(tmp_path, provider):
    """Server exits when its stdout reader goes away."""
    proc = subprocess.Popen([sys.executable, "-m", "fsm", "rpc", "--base-url", provider.base_url,
                             "--model", "m", "--no-session"], cwd=tmp_path, env=rpc_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdin.write(b'{"type":"get_state"}\n')
        proc.stdin.flush()
        assert proc.stdout.readline()
        proc.stdout.close()
        proc.stdin.write(b'{"type":"get_state"}\n')
        proc.stdin.flush()
        assert proc.wait(10) == 0
        assert b"stdout closed" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_commands_from_a_regular_file_then_exit(tmp_path):
    # A regular file cannot be watched by the event loop: the reader thread serves it.
    """Commands from a regular file then exit."""
    commands = tmp_path / "commands.jsonl"
    commands.write_bytes(b'{"id":1,"type":"get_state"}\n{"id":2,"type":"nope"}\r\n'
                         b'{"id":3,"type":"set_auto_retry","enabled":false}\n{"id":4,"type":"get_state"}')
    with open(commands, "rb") as stdin:
        proc = subprocess.run([sys.executable, "-m", "fsm", "rpc", "--model", "m", "--no-session"],
                              cwd=tmp_path, env=rpc_env(), stdin=stdin, capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    replies = [json.loads(line) for line in proc.stdout.split(b"\n") if line]
    assert [(r["id"], r["success"]) for r in replies] == [(1, True), (2, False), (3, True), (4, True)]
    assert replies[3]["data"]["autoRetryEnabled"] is False  # the last line had no newline


def test_empty_stdin_exits_at_once(tmp_path):
    """Empty stdin exits at once."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "fsm", "rpc", "--model", "m", "--no-session"],
                          cwd=tmp_path, env=rpc_env(), stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=30)
    # a server that waits for input it will never get is stopped by the timeout above
    assert proc.returncode == 0 and proc.stdout == b"" and time.monotonic() - t0 < 30


@pytest.mark.parametrize("kind", ["compact", "new_session", "get_commands", "set_model"])
def test_pi_commands_this_server_lacks_parse_to_a_not_implemented_error(kind):
    """Pi commands this server lacks parse to a not implemented error."""
    err = parse_command(json.dumps({"id": "x", "type": kind}).encode())
    assert isinstance(err, CommandError) and err.id == "x" and err.command == kind
    assert f"command '{kind}' is not implemented by this server" in err.error
    assert "get_messages" in err.error and "retry_now" in err.error  # says what it does serve


def test_an_extension_ui_response_gets_no_answer():
    """An extension ui response gets no answer."""
    assert parse_command(b'{"type":"extension_ui_response","id":"ui1","value":"yes"}') is None


@pytest.mark.parametrize("line", [b'{"type":"steer"}', b'{"type":"follow_up","message":3}'])
def test_steer_and_follow_up_need_a_message(line):
    """Steer and follow up need a message."""
    err = parse_command(line)
    assert isinstance(err, CommandError) and 'field "message"' in err.error


def test_a_command_with_a_duplicate_key_is_refused_not_last_wins():
    """Attack report: {"type":"get_state","type":"prompt",...} started a prompt."""
    from fsm.rpc.protocol import CommandError, parse_command
    result = parse_command(b'{"type":"get_state","type":"prompt","message":"dup"}')
    assert isinstance(result, CommandError) and "duplicate key 'type'" in result.error


def test_get_state_never_echoes_credentials_in_the_base_url():
    """Attack report: model.baseUrl was returned verbatim, password and ?api-key included."""
    from fsm.rpc.dispatch import _public_url
    shown = _public_url("http://user:PASSWORD@example.test:8080/v1?api-key=sk-secret")
    assert "PASSWORD" not in shown and "sk-secret" not in shown
    assert shown.startswith("http://user:***@example.test:8080/v1")
    assert _public_url("http://127.0.0.1:5/v1") == "http://127.0.0.1:5/v1"


@pytest.mark.subprocess
def test_sighup_stops_the_server_cleanly_like_sigterm():
    """Attack report: SIGHUP (a closed terminal) killed the process without its shutdown."""
    from support import ROOT, env
    proc = subprocess.Popen([sys.executable, "-m", "fsm", "rpc", "--base-url", "http://127.0.0.1:9/v1",
                             "--model", "m", "--api-key", "k", "--no-session"], cwd=ROOT, env=env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdin.write(b'{"type":"get_state"}\n')
        proc.stdin.flush()
        assert proc.stdout.readline()  # serving, so its handlers are in place
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
