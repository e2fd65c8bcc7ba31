"""The fault-injecting server: script validation, answers, request records, the command."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fsm.__main__ import main
from fsm.providers import FaultServer, validate_script
from fsm.testing.fault_server import ENTRY_KEYS

ROOT = Path(__file__).resolve().parents[2]
CHAT = "/v1/chat/completions"


def post(srv: FaultServer, body: object = None, *, path: str = CHAT, raw: bytes | None = None,
         headers: dict | None = None) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        data = raw if raw is not None else json.dumps(body if body is not None else {}).encode()
        conn.request("POST", path, body=data, headers={"content-type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def get(srv: FaultServer, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def events(data: bytes) -> list:
    out = []
    for block in data.decode().split("\n\n"):
        if block.startswith("data: "):
            payload = block[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def deltas(evs: list) -> list[str]:
    return [e["choices"][0]["delta"].get("content") for e in evs
            if isinstance(e, dict) and e.get("choices") and e["choices"][0]["delta"].get("content")]


STREAM_REQ = {"model": "my-model", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


# -- validation ---------------------------------------------------------------------------------

OK = {"stream": ["ok"]}


@pytest.mark.parametrize("bad, message", [
    ("not an object", "must be an object, got string 'not an object'"),
    ({"stauts": 500}, "unknown key 'stauts' (known keys: " + ", ".join(ENTRY_KEYS) + ")"),
    ({"status": "500"}, "status must be an integer, got string '500'"),
    ({"status": True}, "status must be an integer, got boolean True"),
    ({"status": 99}, "status must be between 100 and 599, got 99"),
    ({"status": 600}, "status must be between 100 and 599, got 600"),
    ({"delay_ms": -1}, "delay_ms must be a finite number ≥ 0, got -1"),
    ({"hang_ms": float("inf")}, "hang_ms must be a finite number ≥ 0, got inf"),
    ({"delay_ms": "10"}, "delay_ms must be a number of milliseconds, got string '10'"),
    ({"delay_ms": None}, "delay_ms must be a number of milliseconds, got null None"),
    ({"body": {"a": 1}}, "body must be a string, got object"),
    ({"json": {}, "body": "x"}, "json and body are mutually exclusive"),
    ({"headers": ["retry-after"]}, "headers must be an object, got list"),
    ({"headers": {"bad name": "1"}}, "header name 'bad name' is not a valid HTTP header name"),
    ({"headers": {"": "1"}}, "header name '' is not a valid HTTP header name"),
    ({"headers": {"Content-Length": "1"}}, "header 'Content-Length' is set by the server, leave it out"),
    ({"headers": {"x": [1]}}, "header 'x' must be a string or a number, got list"),
    ({"headers": {"x": "a\r\nb: c"}}, "header 'x' must not contain a line break"),
    ({"drop": True}, "drop needs a stream (add \"stream\": [...])"),
    ({"no_done": True}, "no_done needs a stream"),
    ({"usage": {}}, "usage needs a stream"),
    ({"stream": "Hello"}, "stream must be a list of strings or objects, got string"),
    ({"stream": ["a", 3]}, "stream[1] must be a string (a text delta) or an object (a raw event), got integer"),
    ({"stream": [], "json": {}}, "json and stream are mutually exclusive"),
    ({"stream": [], "body": ""}, "body and stream are mutually exclusive"),
    ({"stream": [], "drop": 1}, "drop must be true or false, got integer"),
    ({"stream": [], "drop": True, "no_done": True}, "drop and no_done are mutually exclusive"),
    ({"stream": [], "drop": True, "drop_mode": "rest"}, "drop_mode must be \"rst\" or \"fin\", got 'rest'"),
    ({"stream": [], "drop_mode": "fin"}, "drop_mode needs \"drop\": true"),
    ({"stream": [], "finish_reason": None}, "finish_reason must be a string, got null"),
    ({"stream": [], "usage": 3}, "usage must be an object or null, got integer"),
    ({"stream": [], "chunk_delay_ms": 1.5j}, "chunk_delay_ms must be a number of milliseconds, got complex"),
])
def test_validation_names_the_entry_and_the_problem(bad, message):
    """Validation names the entry and the problem."""
    with pytest.raises(ValueError) as info:
        validate_script([OK, {"status": 503}, bad])
    assert str(info.value).startswith("script entry 2: ")
    assert message in str(info.value)


@pytest.mark.parametrize("bad, kind", [({"status": 500}, "object"), ("x", "string"), (None, "null")])
def test_script_must_be_a_list(bad, kind):
    """Script must be a list."""
    with pytest.raises(ValueError, match=f"script must be a JSON list of entries, got {kind}"):
        validate_script(bad)


def test_validation_normalises_headers_and_copies():
    """Validation normalises headers and copies."""
    script = [{"status": 429, "headers": {"Retry-After": 60, "X-Ratio": 1.5}}, {}]
    out = validate_script(script)
    assert out == [{"status": 429, "headers": {"retry-after": "60", "x-ratio": "1.5"}}, {}]
    assert script[0]["headers"] == {"Retry-After": 60, "X-Ratio": 1.5}


def test_every_documented_key_is_accepted():
    """Every documented key is accepted."""
    validate_script([
        {"status": 500, "json": {"error": {}}, "headers": {"a": "b"}, "delay_ms": 1, "hang_ms": 0},
        {"status": 400, "body": "no"},
        {"stream": ["a", {"error": {}}], "chunk_delay_ms": 0, "finish_reason": "length",
         "usage": None, "drop": True, "drop_mode": "fin"},
        {"stream": [], "no_done": True, "usage": {"prompt_tokens": 1}},
    ])


def test_server_refuses_a_bad_script():
    """Server refuses a bad script."""
    with pytest.raises(ValueError, match="script entry 0: status must be between"):
        FaultServer([{"status": 1000}])


# -- answers ------------------------------------------------------------------------------------

def test_stream_answer_shape():
    """Stream answer shape."""
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    with FaultServer([{"stream": ["Hel", "lo"], "usage": usage, "finish_reason": "length"}]) as srv:
        status, headers, data = post(srv, STREAM_REQ)
    assert status == 200 and headers["content-type"] == "text/event-stream"
    evs = events(data)
    assert deltas(evs) == ["Hel", "lo"]
    assert evs[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(e["object"] == "chat.completion.chunk" and e["model"] == "my-model" for e in evs[:-1])
    assert evs[-3]["choices"] == [{"index": 0, "delta": {}, "finish_reason": "length"}]
    assert evs[-2]["choices"] == [] and evs[-2]["usage"] == usage
    assert evs[-1] == "[DONE]"


def test_stream_with_headers_and_status():
    """Stream with headers and status."""
    entry = {"stream": ["a"], "status": 201, "headers": {"x-extra": "1", "content-type": "text/plain"}}
    with FaultServer([entry]) as srv:
        status, headers, data = post(srv, STREAM_REQ)
    assert status == 201 and headers["x-extra"] == "1" and headers["content-type"] == "text/plain"
    assert deltas(events(data)) == ["a"]


def test_raw_objects_in_the_stream_are_sent_verbatim_and_usage_null_skips_the_usage_chunk():
    """Raw objects in the stream are sent verbatim and usage null skips the usage chunk."""
    with FaultServer([{"stream": ["a", {"error": {"message": "boom"}}], "usage": None}]) as srv:
        evs = events(post(srv, STREAM_REQ)[2])
    assert {"error": {"message": "boom"}} in evs
    assert not any(isinstance(e, dict) and "usage" in e for e in evs)
    assert evs[-1] == "[DONE]"


def test_error_answers():
    """Error answers."""
    script = [
        {"status": 529, "json": {"type": "error"}, "headers": {"retry-after": 60}},
        {"status": 502, "body": "<html>bad gateway</html>", "headers": {"content-type": "text/html"}},
        {"status": 503},
        {"status": 500, "stream": ["x"]},
    ]
    with FaultServer(script) as srv:
        s1, h1, b1 = post(srv, STREAM_REQ)
        s2, h2, b2 = post(srv, STREAM_REQ)
        s3, h3, b3 = post(srv, STREAM_REQ)
        s4, h4, b4 = post(srv, STREAM_REQ)
        outcomes = [(r["status"], r["outcome"]) for r in srv.chat_requests]
    assert (s1, h1["content-type"], h1["retry-after"], json.loads(b1)) == (
        529, "application/json", "60", {"type": "error"})
    assert (s2, h2["content-type"], b2) == (502, "text/html", b"<html>bad gateway</html>")
    assert (s3, b3) == (503, b"")
    assert s4 == 500 and deltas(events(b4)) == ["x"]
    assert outcomes == [(529, "json"), (502, "body"), (503, "empty"), (500, "stream")]


def test_plain_success_after_the_script_is_used_up():
    """Plain success after the script is used up."""
    with FaultServer([{"status": 500, "json": {}}]) as srv:
        assert post(srv, STREAM_REQ)[0] == 500
        status, _, data = post(srv, STREAM_REQ)
        assert status == 200 and deltas(events(data)) == ["ok"] and events(data)[-1] == "[DONE]"
        status, headers, data = post(srv, {"model": "m", "messages": []})
        assert headers["content-type"] == "application/json"
        completion = json.loads(data)
        assert completion["object"] == "chat.completion"
        assert completion["choices"][0]["message"] == {"role": "assistant", "content": "ok"}
        records = srv.chat_requests
    assert [r["scripted"] for r in records] == [True, False, False]
    assert [r["outcome"] for r in records] == ["json", "stream", "completion"]


def test_status_200_alone_and_delay_alone_are_plain_successes():
    """Status 200 alone and delay alone are plain successes."""
    with FaultServer([{"status": 200}, {"delay_ms": 1}]) as srv:
        assert deltas(events(post(srv, STREAM_REQ)[2])) == ["ok"]
        assert deltas(events(post(srv, STREAM_REQ)[2])) == ["ok"]


def test_delay_is_honoured():
    """Delay is honoured."""
    with FaultServer([{"delay_ms": 150, "status": 503}]) as srv:
        started = time.monotonic()
        assert post(srv, STREAM_REQ)[0] == 503
        assert time.monotonic() - started >= 0.15


def test_chunk_delay_spaces_the_items():
    """Chunk delay spaces the items."""
    with FaultServer([{"stream": ["a", "b", "c"], "chunk_delay_ms": 60}]) as srv:
        started = time.monotonic()
        assert deltas(events(post(srv, STREAM_REQ)[2])) == ["a", "b", "c"]
        assert time.monotonic() - started >= 0.12


def _raw_exchange(srv: FaultServer, body: bytes = b"{}") -> tuple[bytes, BaseException | None]:
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-length: %d\r\n\r\n%s"
                 % (len(body), body))
    data, error = b"", None
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except OSError as exc:
        error = exc
    finally:
        sock.close()
    return data, error


def test_drop_rst_resets_after_the_deltas():
    """Drop rst resets after the deltas."""
    with FaultServer([{"stream": ["partial"], "drop": True, "chunk_delay_ms": 10}]) as srv:
        data, error = _raw_exchange(srv)
        assert srv.chat_requests[0]["outcome"] == "dropped_rst"
    assert b'"content": "partial"' in data and b"[DONE]" not in data
    assert isinstance(error, ConnectionResetError)


def test_drop_fin_closes_mid_body():
    """Drop fin closes mid body."""
    with FaultServer([{"stream": ["partial"], "drop": True, "drop_mode": "fin"}]) as srv:
        data, error = _raw_exchange(srv)
        assert srv.chat_requests[0]["outcome"] == "dropped_fin"
    assert error is None and b'"content": "partial"' in data
    assert not data.endswith(b"0\r\n\r\n")


def test_no_done_ends_the_body_cleanly_without_the_final_chunks():
    """No done ends the body cleanly without the final chunks."""
    with FaultServer([{"stream": ["partial"], "no_done": True}]) as srv:
        status, _, data = post(srv, STREAM_REQ)
        assert srv.chat_requests[0]["outcome"] == "truncated"
    evs = events(data)
    assert status == 200 and deltas(evs) == ["partial"]
    assert "[DONE]" not in evs and not any(e["choices"] and e["choices"][0]["finish_reason"] for e in evs)


# -- routes and records -------------------------------------------------------------------------

def test_models_and_unknown_paths():
    """Models and unknown paths."""
    with FaultServer(model="the-model") as srv:
        status, data = get(srv, "/v1/models")
        assert status == 200
        assert [m["id"] for m in json.loads(data)["data"]] == ["the-model"]
        assert get(srv, "/v1/nothing")[0] == 404
        assert post(srv, STREAM_REQ, path="/v1/embeddings")[0] == 404
        assert post(srv, STREAM_REQ, path="/openai/deployments/x/chat/completions?api-version=1")[0] == 200
        records = srv.requests
    assert [(r["method"], r["index"], r["status"], r["outcome"]) for r in records] == [
        ("GET", None, 200, "models"), ("GET", None, 404, "404"), ("POST", None, 404, "404"),
        ("POST", 0, 200, "stream")]
    assert records[2]["body"] == STREAM_REQ


def test_request_records():
    """Request records."""
    with FaultServer([{"status": 503}]) as srv:
        before = time.monotonic() * 1000
        post(srv, STREAM_REQ, headers={"Authorization": "Bearer k"})
        post(srv, raw=b"{not json")
        [first, second] = srv.requests
    assert first["index"] == 0 and first["path"] == CHAT and first["method"] == "POST"
    assert first["body"] == STREAM_REQ and first["headers"]["authorization"] == "Bearer k"
    assert before <= first["t_ms"] <= first["end_ms"]
    assert (first["status"], first["outcome"], first["scripted"]) == (503, "empty", True)
    assert second["index"] == 1 and second["body"] is None and second["outcome"] == "completion"


def test_chunked_request_body_is_read():
    """Chunked request body is read."""
    with FaultServer() as srv:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        conn.request("POST", CHAT, body=iter([b'{"stream": ', b'true, "model": "c"}']),
                     encode_chunked=True)
        assert deltas(events(conn.getresponse().read())) == ["ok"]
        conn.close()
        assert srv.chat_requests[0]["body"] == {"stream": True, "model": "c"}


def test_client_gone_during_delay_is_recorded_and_stop_ends_hangs():
    """Client gone during delay is recorded and stop ends hangs."""
    with FaultServer([{"delay_ms": 60_000}, {"hang_ms": 60_000}]) as srv:
        sock = socket.create_connection(("127.0.0.1", srv.port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-length: 2\r\n\r\n{}")
        while not srv.chat_requests:
            time.sleep(0.005)
        sock.close()
        deadline = time.monotonic() + 5
        while srv.chat_requests[0]["outcome"] is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv.chat_requests[0]["outcome"] == "client_gone_during_delay"
        hanging = socket.create_connection(("127.0.0.1", srv.port))
        hanging.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-length: 2\r\n\r\n{}")
        while len(srv.chat_requests) < 2:
            time.sleep(0.005)
    started = time.monotonic()
    srv.stop()  # idempotent
    assert time.monotonic() - started < 1
    hanging.settimeout(5)
    assert hanging.recv(100) == b""  # the hanging connection was closed by stop()
    hanging.close()


def test_pipelined_bytes_do_not_end_a_delay():
    """Pipelined bytes do not end a delay."""
    with FaultServer([{"delay_ms": 150, "status": 503}]) as srv:
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        req = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-length: 2\r\n\r\n{}"
        sock.sendall(req)
        while not srv.chat_requests:
            time.sleep(0.005)
        sock.sendall(req)  # arrives while the first answer is delayed
        data = b""
        while data.count(b"HTTP/1.1 ") < 2 or not data.endswith(b"}"):
            data += sock.recv(65536)
        sock.close()
        assert [r["outcome"] for r in srv.chat_requests] == ["empty", "completion"]


def test_client_gone_mid_stream_is_recorded():
    """Client gone mid stream is recorded."""
    with FaultServer([{"stream": ["a", "b"], "chunk_delay_ms": 60_000},
                      {"stream": ["a"], "drop": True, "chunk_delay_ms": 60_000}]) as srv:
        for index in range(2):
            sock = socket.create_connection(("127.0.0.1", srv.port))
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-length: 2\r\n\r\n{}")
            data = b""
            while b'"content": "a"' not in data:
                data += sock.recv(1000)
            sock.close()
            deadline = time.monotonic() + 5
            while srv.chat_requests[index]["outcome"] is None and time.monotonic() < deadline:
                time.sleep(0.01)
        assert [r["outcome"] for r in srv.chat_requests] == ["client_gone_mid_stream"] * 2


def test_writing_to_a_vanished_client_is_recorded():
    """Writing to a vanished client is recorded."""
    big = "x" * 65536
    with FaultServer([{"stream": [big] * 200}]) as srv:
        sock = socket.create_connection(("127.0.0.1", srv.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-length: 2\r\n\r\n{}")
        sock.recv(1000)
        sock.close()  # a reset while the server is still writing
        deadline = time.monotonic() + 5
        while srv.chat_requests[0]["outcome"] is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv.chat_requests[0]["outcome"].startswith("client_gone:")


def test_hundreds_of_concurrent_connections():
    """Hundreds of concurrent connections."""
    n = 300

    async def one_request(port: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-length: 16\r\n\r\n"
                     b'{"stream": true}')
        await writer.drain()
        data = b""
        while b"[DONE]" not in data:
            chunk = await reader.read(65536)
            if not chunk:
                break
            data += chunk
        writer.close()
        await writer.wait_closed()
        return data

    async def go(port: int) -> list[bytes]:
        return await asyncio.gather(*(one_request(port) for _ in range(n)))

    with FaultServer([{"delay_ms": 300}] * n) as srv:
        started = time.monotonic()
        answers = asyncio.run(go(srv.port))
        elapsed = time.monotonic() - started
        assert len(srv.chat_requests) == n
    assert all(b"[DONE]" in a for a in answers)
    assert elapsed < 10  # served in parallel: one after the other would take 90 s


def test_base_url_and_ipv6():
    """Base URL and ipv6."""
    with FaultServer() as srv:
        assert srv.base_url == f"http://127.0.0.1:{srv.port}/v1"
    try:
        srv6 = FaultServer(host="::1")
    except OSError:
        pytest.skip("no IPv6 loopback")
    with srv6:
        assert srv6.base_url == f"http://[::1]:{srv6.port}/v1"
        conn = http.client.HTTPConnection("::1", srv6.port, timeout=10)
        conn.request("GET", "/v1/models")
        assert conn.getresponse().status == 200
        conn.close()


def test_package_exports_are_lazy():
    """Package exports are lazy."""
    import fsm.providers as providers
    assert {"FaultServer", "OpenAIChatProvider", "validate_script"} <= set(dir(providers))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        providers.Nope  # noqa: B018


def test_binds_only_the_given_host():
    """Binds only the given host."""
    with FaultServer() as srv:
        assert srv._httpd.socket.getsockname()[0] == "127.0.0.1"


def test_verbose_logs_one_json_line_per_answer(capsys):
    """Verbose logs one JSON line per answer."""
    with FaultServer([{"status": 503}], verbose=True) as srv:
        post(srv, STREAM_REQ)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fault-server: ")
    line = json.loads(err[0][len("fault-server: "):])
    assert line["status"] == 503 and line["index"] == 0 and "body" not in line


def test_malformed_chunked_body_gets_400():
    """Malformed chunked body gets 400."""
    with FaultServer() as srv:
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"transfer-encoding: chunked\r\n\r\nzz\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        sock.close()
        assert data.startswith(b"HTTP/1.1 400 ") and srv.requests == []


def test_handler_bugs_are_reported_not_swallowed(monkeypatch, capsys):
    """Handler bugs are reported not swallowed."""
    def broken(*args, **kwargs):
        raise RuntimeError("bug in the handler")

    with FaultServer() as srv:
        monkeypatch.setattr(srv, "_record", broken)
        with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
            post(srv, STREAM_REQ)
    assert "RuntimeError: bug in the handler" in capsys.readouterr().err


def test_wait_sent_gives_up_without_hanging(monkeypatch):
    """Wait sent gives up without hanging."""
    import termios
    from fsm.testing.fault_server import wait_sent
    stopping = threading.Event()
    left, right = socket.socketpair()
    try:
        left.sendall(b"x" * 1000)  # never read: the queue never drains
        started = time.monotonic()
        wait_sent(left, stopping, timeout_s=0.05)
        assert 0.05 <= time.monotonic() - started < 1
        closed = socket.socket()
        closed.close()
        wait_sent(closed, stopping)  # ioctl fails: return at once
        monkeypatch.delattr(termios, "TIOCOUTQ")
        started = time.monotonic()
        wait_sent(left, stopping)  # elsewhere than Linux: a short fixed wait
        assert time.monotonic() - started < 1
    finally:
        left.close()
        right.close()


def test_stop_without_start_and_start_twice():
    """Stop without start and start twice."""
    FaultServer().stop()
    with FaultServer() as srv:
        assert srv.start() is srv
        assert post(srv, raw=b"")[0] == 200  # no body at all: still a chat request
        assert srv.chat_requests[0]["body"] is None


# -- command line -------------------------------------------------------------------------------

def _spawn(*args: str, stdin: bool = False) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "fsm", "fault-server", *args], cwd=ROOT, env=env,
                            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.subprocess
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_command_prints_the_base_url_first_and_serves(tmp_path, sig):
    """Command prints the base URL first and serves."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"status": 529, "json": {"type": "error"}}]))
    proc = _spawn("--script", str(script))
    try:
        line = proc.stdout.readline().decode().strip()
        assert line.startswith("http://127.0.0.1:") and line.endswith("/v1")
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("POST", CHAT, body=b"{}")
        resp = conn.getresponse()
        assert resp.status == 529 and json.loads(resp.read()) == {"type": "error"}
        conn.request("POST", CHAT, body=json.dumps(STREAM_REQ))
        assert deltas(events(conn.getresponse().read())) == ["ok"]
        conn.close()
        proc.send_signal(sig)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.subprocess
def test_command_reads_stdin_and_scenario_files():
    """Command reads stdin and scenario files."""
    scenario = {"name": "x", "server": {"script": [{"status": 418, "body": "teapot"}]}}
    proc = _spawn("--script", "-", "--port", "0", stdin=True)
    try:
        proc.stdin.write(json.dumps(scenario).encode())
        proc.stdin.close()
        port = int(proc.stdout.readline().decode().strip().rsplit(":", 1)[1].split("/")[0])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("POST", CHAT, body=b"{}")
        assert conn.getresponse().status == 418
        conn.close()
        proc.terminate()
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.subprocess
def test_command_refuses_a_bad_script_with_status_2(tmp_path):
    """Command refuses a bad script with status 2."""
    script = tmp_path / "bad.json"
    script.write_text(json.dumps([{"stream": ["a"]}, {"stream": ["b"], "drop": "yes"}]))
    proc = _spawn("--script", str(script))
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 2 and out == b""
    assert f"fault-server: bad script {script}: script entry 1: drop must be true or false, got string" in err.decode()


@pytest.mark.parametrize("content, problem", [
    ("{not json", "Expecting property name"),
    ('{"status": 500}', "script must be a JSON list of entries, got object"),
    (None, "No such file or directory"),
])
def test_command_errors_in_process(tmp_path, capsys, content, problem):
    """Command errors in process."""
    path = tmp_path / "script.json"
    if content is not None:
        path.write_text(content)
    assert main(["fault-server", "--script", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fault-server: bad script {path}: ") and problem in err


def test_command_bad_port_and_busy_port(tmp_path, capsys):
    """Command bad port and busy port."""
    path = tmp_path / "script.json"
    path.write_text("[]")
    assert main(["fault-server", "--script", str(path), "--port", "70000"]) == 2
    assert "--port must be in 0–65535, got 70000" in capsys.readouterr().err
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["fault-server", "--script", str(path), "--port", str(port)]) == 2
    assert f"fault-server: cannot listen on 127.0.0.1:{port}: " in capsys.readouterr().err


# -- A user-facing tool faces hostile input ----------------------------------

def raw_exchange(srv: FaultServer, data: bytes, timeout: float = 10) -> bytes:
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=timeout)
    try:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out
    finally:
        sock.close()


@pytest.mark.parametrize("host", ["", "0.0.0.0", "::", "192.168.1.20", "example.com"])
def test_a_host_reachable_from_other_machines_needs_allow_remote(host):
    """A host reachable from other machines needs allow remote."""
    with pytest.raises(ValueError, match="pass allow_remote=True"):
        FaultServer(host=host)


def test_allow_remote_binds_every_interface_and_the_base_url_stays_usable():
    """Allow remote binds every interface and the base URL stays usable."""
    with FaultServer(host="0.0.0.0", allow_remote=True) as srv:
        assert srv.base_url == f"http://127.0.0.1:{srv.port}/v1"
        assert get(srv, "/v1/models")[0] == 200


@pytest.mark.parametrize("host", ["", "0.0.0.0", "::"])
def test_command_refuses_a_wildcard_host_without_allow_remote(tmp_path, capsys, host):
    """Command refuses a wildcard host without allow remote."""
    path = tmp_path / "script.json"
    path.write_text("[]")
    assert main(["fault-server", "--script", str(path), "--host", host]) == 2
    err = capsys.readouterr().err
    assert "can be reached from other machines" in err and "--allow-remote" in err


def test_command_warns_loudly_with_allow_remote(tmp_path):
    """Command warns loudly with allow remote."""
    path = tmp_path / "script.json"
    path.write_text("[]")
    proc = subprocess.Popen([sys.executable, "-m", "fsm", "fault-server", "--script", str(path),
                             "--host", "0.0.0.0", "--allow-remote"], cwd=ROOT, env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline().startswith(b"http://127.0.0.1:")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert b"WARNING: listening on 0.0.0.0: anyone who can reach this machine" in err


def test_command_refuses_a_bad_timeout(tmp_path, capsys):
    """Command refuses a bad timeout."""
    path = tmp_path / "script.json"
    path.write_text("[]")
    assert main(["fault-server", "--script", str(path), "--timeout", "0"]) == 2
    assert "--timeout must be a positive number of seconds, got 0.0" in capsys.readouterr().err


def child_env():
    from support import env
    return env()


@pytest.mark.parametrize("header, status", [
    (b"content-length: -1", 400), (b"content-length: abc", 400),
    (b"content-length: 99999999999999999999999", 413), (b"content-length: 2000", 413),
    (b"transfer-encoding: gzip", 400), (b"transfer-encoding: chunked\r\ncontent-length: 3", 400),
])
def test_bad_or_huge_content_length_is_answered_not_a_traceback(capsys, header, status):
    """Bad or huge content length is answered not a traceback."""
    with FaultServer(max_body_bytes=1000) as srv:
        out = raw_exchange(srv, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + header + b"\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 %d " % status), out[:200]
        assert b"connection: close" in out.lower() and srv.requests == []
        assert get(srv, "/v1/models")[0] == 200  # still serving
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("chunks, status", [
    (b"ffffffffffffffffffffffff\r\n", 400),  # a chunk size too long to be real
    (b"fffffffff\r\n", 413), (b"200\r\n" + b"x" * 512 + b"\r\n" + b"300\r\n", 413),
    (b"1" * 5000 + b"\r\n", 400), (b"-5\r\n", 400),
])
def test_huge_or_malformed_chunk_sizes_are_answered(capsys, chunks, status):
    """Huge or malformed chunk sizes are answered."""
    with FaultServer(max_body_bytes=1000) as srv:
        out = raw_exchange(srv, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                b"transfer-encoding: chunked\r\n\r\n" + chunks)
        assert out.startswith(b"HTTP/1.1 %d " % status), out[:200]
    assert "Traceback" not in capsys.readouterr().err


def test_a_chunked_body_with_trailers_is_read():
    """A chunked body with trailers is read."""
    with FaultServer([{"status": 503}]) as srv:
        body = json.dumps(STREAM_REQ).encode()
        out = raw_exchange(srv, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nconnection: close\r\n"
                                b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\nx-t: 1\r\n\r\n" % (len(body), body))
        assert out.startswith(b"HTTP/1.1 503 ")
        assert srv.requests[0]["body"] == STREAM_REQ and srv.requests[0]["body_bytes"] == len(body)


def test_a_slow_client_is_dropped_after_the_timeout():
    """A slow client is dropped after the timeout."""
    with FaultServer(timeout_s=0.2) as srv:
        started = time.monotonic()
        out = raw_exchange(srv, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-length: 100\r\n\r\n{")
        assert out == b"" and time.monotonic() - started < 5
        idle = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        assert idle.recv(10) == b""  # an idle connection is closed too
        idle.close()
        assert srv.requests == []


def test_request_bodies_are_not_kept_forever():
    """3 x 200 MB bodies were kept (622 MB); now the log is bounded."""
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 300_000}]}
    size = len(json.dumps(big))
    with FaultServer(max_log_bytes=2 * size, max_records=4) as srv:
        for _ in range(3):
            assert post(srv, big)[0] == 200
        kept = [r["body_kept"] for r in srv.requests]
        assert kept == [False, True, True] and srv.requests[0]["body"] is None
        assert srv.kept_body_bytes == 2 * size
        for _ in range(3):
            post(srv, {"stream": False})
        assert len(srv.requests) == 4 and srv.chat_count == 6
        assert [r["index"] for r in srv.chat_requests] == [2, 3, 4, 5]
        assert srv.kept_body_bytes <= 2 * size
    with pytest.raises(ValueError, match="max_records must be a whole number"):
        FaultServer(max_records=-1)
    with pytest.raises(ValueError, match="timeout_s must be a positive number"):
        FaultServer(timeout_s=0)


def test_verbose_redacts_keys_in_query_strings_and_headers(capsys):
    """Verbose redacts keys in query strings and headers."""
    with FaultServer([{"status": 503}], verbose=True) as srv:
        post(srv, STREAM_REQ, path=CHAT + "?key=AIzaSecret123&api-version=2024&token=t0k",
             headers={"authorization": "Bearer sk-secret-123456789", "x-api-key": "anthropic-secret"})
    err = capsys.readouterr().err
    assert "AIzaSecret123" not in err and "sk-secret" not in err and "t0k" not in err
    assert "anthropic-secret" not in err
    line = json.loads(err.strip().splitlines()[0][len("fault-server: "):])
    assert line["path"] == CHAT + "?key=[redacted]&api-version=2024&token=[redacted]"
    assert line["headers"]["authorization"] == "Bearer [redacted]"
    assert line["headers"]["x-api-key"] == "[redacted]"
    assert srv.requests[0]["headers"]["authorization"] == "Bearer sk-secret-123456789"  # in memory: as sent


@pytest.mark.parametrize("entry, message", [
    ({"status": 101}, "status 101 is informational (1xx), not an answer"),
    ({"status": 100}, "status 100 is informational"),
    ({"status": 204, "body": "x"}, "status 204 has no body (RFC 9110), leave out body"),
    ({"status": 204, "json": {}}, "status 204 has no body (RFC 9110), leave out json"),
    ({"status": 304, "stream": []}, "status 304 has no body (RFC 9110), leave out stream"),
])
def test_scripts_with_1xx_or_a_204_with_a_body_are_refused_at_load(entry, message):
    """Scripts with 1xx or a 204 with a body are refused at load."""
    with pytest.raises(ValueError, match=f"script entry 0: {re.escape(message)}"):
        validate_script([entry])


def test_a_scripted_204_is_sent_without_body_or_length():
    """A scripted 204 is sent without body or length."""
    with FaultServer([{"status": 204, "headers": {"x-a": "1"}}, {}]) as srv:
        out = raw_exchange(srv, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nconnection: close\r\n"
                                b"content-length: 2\r\n\r\n{}")
        head, _, rest = out.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 204 ") and b"content-length" not in head.lower()
        assert b"x-a: 1" in head and rest == b""
        assert post(srv, {"stream": False})[0] == 200


@pytest.mark.parametrize("tail", [
    b"content-length: 50\r\n\r\n{\"a\":",           # leaves inside a sized body
    b"transfer-encoding: chunked\r\n\r\n",        # leaves before a chunk size line
    b"transfer-encoding: chunked\r\n\r\n10\r\nabc",  # leaves inside a chunk
])
def test_a_client_leaving_inside_the_body_is_not_answered_or_recorded(capsys, tail):
    """A client leaving inside the body is not answered or recorded."""
    with FaultServer() as srv:
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + tail)
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(100) == b""
        sock.close()
        assert get(srv, "/v1/models")[0] == 200
        assert [r["outcome"] for r in srv.requests] == ["models"]
    assert "Traceback" not in capsys.readouterr().err


def test_too_many_trailer_lines_are_refused():
    """Too many trailer lines are refused."""
    with FaultServer() as srv:
        out = raw_exchange(srv, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                b"transfer-encoding: chunked\r\n\r\n0\r\n" + b"x-t: 1\r\n" * 101 + b"\r\n")
        assert out.startswith(b"HTTP/1.1 400 ") and b"too many trailer lines" in out


def test_a_stream_entry_answers_a_non_streaming_request_with_one_completion_object():
    """A scripted ``stream`` entry used to answer a non-streaming request with raw SSE."""
    import json as _json
    import urllib.request
    with FaultServer([{"stream": ["Hel", "lo"]}]) as server:
        req = urllib.request.Request(server.base_url + "/chat/completions", method="POST",
                                     data=_json.dumps({"model": "m", "messages": []}).encode(),
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.headers["content-type"].startswith("application/json")
            body = _json.loads(resp.read())
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == "Hello"
