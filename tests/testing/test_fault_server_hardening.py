"""The fault server against hostile clients (docs/reliability.md, item 9): bounded request
heads (431), slowloris connections closed and never in the way of other clients, and
thousands of connections opened and closed."""

from __future__ import annotations

import http.client
import json
import socket

import pytest

from fsm.testing import fault_server as _fs
from fsm.testing.fault_server import FaultServer

HI = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


def get_models(server: FaultServer, timeout_s: float = 20.0) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout_s)
    try:
        conn.request("GET", "/v1/models")
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def raw_exchange(server: FaultServer, data: bytes, timeout_s: float = 20.0) -> bytes:
    """Send ``data`` on a fresh connection, end the sending side, read until the server closes."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout_s) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # the server answered and closed before taking it all
            pass
        out = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            out += chunk
    return out


def test_request_headers_over_the_byte_bound_are_answered_431():
    """90 headers of 60 KB each (5.4 MB) were read and kept whole; now 431 and closed."""
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n" + b"".join(
        b"x-pad-%d: %s\r\n" % (i, b"a" * 60_000) for i in range(90)) + b"content-length: 2\r\n\r\n{}"
    with FaultServer([]) as server:
        answer = raw_exchange(server, head)
        assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
        assert server.requests == []  # nothing recorded
        assert get_models(server) == 200  # and the server still serves


def test_request_headers_over_the_count_bound_are_answered_431():
    """More than max_headers header lines: 431, also on a kept-alive connection's second request."""
    many = b"".join(b"x-h%d: 1\r\n" % i for i in range(150))
    with FaultServer([], max_headers=100) as server:
        assert raw_exchange(server, b"GET /v1/models HTTP/1.1\r\nhost: x\r\n" + many + b"\r\n").startswith(
            b"HTTP/1.1 431")
        second = (b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n"
                  b"GET /v1/models HTTP/1.1\r\nhost: x\r\n" + many + b"\r\n")
        answer = raw_exchange(server, second)
        assert answer.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 431" in answer


def test_a_head_just_under_the_bound_is_served():
    """The bound is on the head, not on the answer: a 60 KB header passes."""
    with FaultServer([]) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=20)
        conn.request("POST", "/v1/chat/completions", body=HI,
                     headers={"content-type": "application/json", "x-pad": "a" * 60_000})
        response = conn.getresponse()
        assert response.status == 200 and b"chat.completion" in response.read()
        conn.close()
    assert _fs.MAX_HEADER_BYTES == 64 << 10


def test_a_slowloris_connection_is_closed_when_its_head_is_late():
    """A client dripping one byte every 50 ms reset the idle timeout forever; now its whole
    head must arrive within timeout_s, and the server closes it."""
    with FaultServer([], timeout_s=0.3) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            closed = False
            for byte in b"GET /v1/models HTTP/1.1\r\n" + b"x-slow: " + b"a" * 200:
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    closed = True
                    break
                sock.settimeout(0.05)
                try:
                    if sock.recv(1) == b"":
                        closed = True
                        break
                except socket.timeout:
                    pass
                except OSError:
                    closed = True
                    break
            assert closed, "the server kept a dripping connection open"


def test_many_slowloris_connections_do_not_keep_others_from_being_served():
    """300 connections each holding half a head: a normal client is answered meanwhile, and
    they hold no thread (the server reads heads with a selector)."""
    import threading
    with FaultServer([], timeout_s=30) as server:
        before = threading.active_count()
        slow = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(300)]
        try:
            for sock in slow:
                sock.sendall(b"GET /v1/models HTTP/1.1\r\nx-slow: ")
            assert get_models(server) == 200
            assert threading.active_count() - before < 50
        finally:
            for sock in slow:
                sock.close()


def test_thousands_of_connections_opened_and_closed_leave_the_server_serving():
    """2,000 connections (silent, half a head, a whole request) opened and closed: the next
    request is answered."""
    with FaultServer([]) as server:
        for i in range(2000):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            kind = i % 3
            if kind == 1:
                sock.sendall(b"GET /v1/models HTTP/1.1\r\n")
            elif kind == 2:
                sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
            sock.close()
        assert get_models(server) == 200


@pytest.mark.parametrize("tail", [b"", b"\r\n", b"\n\n", b"GET", b"\x00" * 100, b"G" * 70_000])
def test_odd_heads_never_break_the_server(tail):
    """Fuzz family: empty, bare line breaks, NULs, an overlong request line; then a normal request."""
    with FaultServer([]) as server:
        raw_exchange(server, tail, timeout_s=5) if tail else None
        assert get_models(server) == 200


def test_pipelined_body_after_the_head_is_read_once():
    """A body that arrives in the same packet as the head (read by the selector) is not lost."""
    body = HI.encode()
    data = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
    with FaultServer([]) as server:
        answer = raw_exchange(server, data)
        assert answer.startswith(b"HTTP/1.1 200") and b"chat.completion" in answer
        assert server.chat_requests[0]["body"]["model"] == "m"
