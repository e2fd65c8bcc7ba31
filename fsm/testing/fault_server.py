"""A scripted, fault-injecting OpenAI-compatible server for testing model clients.

The server answers each ``POST …/chat/completions`` request with the next entry of a script
(a JSON list, one entry per chat request) and, once the script is used up, with a plain
successful stream (``"ok"``). It runs in a background thread, so a client under test can run in
an asyncio loop of the same process. Standard library only; it binds only the host it is given
(``127.0.0.1`` by default; another interface only with ``allow_remote``). Request bodies, the
request log and idle connections are bounded (see :class:`FaultServer`).

Script entry keys (all optional; an empty entry is a plain success; unknown keys are refused):

==================  ==========================================================================
``status``          HTTP status, an integer in 200–599 (default 200); 1xx is refused (not an
                    answer), and 204/304 take no ``json``, ``body`` or ``stream``.
``json``            JSON body of a non-streaming answer (typically an error body).
``body``            raw text body of a non-streaming answer (``content-type: text/plain``
                    unless ``headers`` says otherwise).
``headers``         extra response headers, e.g. ``{"retry-after": "60"}`` (names are
                    lower-cased; ``content-length`` and ``transfer-encoding`` are the server's).
``delay_ms``        wait this long (ms) before answering; combinable with everything else.
``hang_ms``         the same as ``delay_ms`` (an alias, for scripts that name a hang).
``stream``          list of SSE items: a string is a text delta (one ``chat.completion.chunk``),
                    an object is sent verbatim as one ``data:`` event (e.g. an
                    ``{"error": {...}}`` event). The stream ends with a finish_reason chunk, a
                    usage chunk and ``data: [DONE]``.
``chunk_delay_ms``  wait between two stream items (ms).
``finish_reason``   finish_reason of the final chunk (default ``"stop"``).
``usage``           usage object of the usage chunk (``null``: no usage chunk).
``drop``            ``true``: after the stream items (and one more ``chunk_delay_ms``), kill the
                    connection mid-body.
``drop_mode``       ``"rst"`` (default: TCP reset, ``SO_LINGER`` 0) or ``"fin"`` (plain close).
``no_done``         ``true``: end the chunked body cleanly after the stream items, without the
                    finish_reason chunk, the usage chunk and ``[DONE]`` (a truncated stream).
==================  ==========================================================================

An entry without ``json``, ``body`` or ``stream`` answers a plain success when its status is
200 (an SSE stream, or a ``chat.completion`` object when the request did not ask to stream)
and an empty body otherwise.

``POST …/v1/messages`` (the Anthropic Messages API, :mod:`fsm.testing.fault_anthropic`),
``POST …/v1/responses`` (the OpenAI Responses API, :mod:`fsm.testing.fault_responses`) and
``POST …/v1/files`` (a multipart upload, answered a ``file`` object on success) and Gemini's
``POST …/v1beta/models/{model}:generateContent`` / ``:streamGenerateContent?alt=sse`` (the
Google Gen AI SDK given :attr:`FaultServer.root_url`, :mod:`fsm.testing.fault_gemini`) take the
same script and count as chat requests.

``GET …/models`` answers a list with one model; ``GET …/fault/stats`` what the server saw
(:meth:`FaultServer.stats`: the chat requests, and in capacity mode the requests accepted and
refused per second); every other path gets a 404 JSON error and is recorded with ``index``
``None``. A path with ``/v1`` twice (``/v1/v1/messages``: the Anthropic
SDK given :attr:`FaultServer.base_url` instead of :attr:`FaultServer.root_url`) is such a path;
its error message names the base URL to use.

Python use::

    import openai
    from fsm.testing.fault_server import FaultServer

    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    with FaultServer([{"status": 529, "json": overloaded}, {"stream": ["Hel", "lo"]}]) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
        try:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        except openai.APIStatusError as exc:
            assert exc.status_code == 529
        stream = client.chat.completions.create(model="m", stream=True,
                                                messages=[{"role": "user", "content": "hi"}])
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "Hello"
        srv.requests   # [{"index": 0, "t_ms": ..., "path": "/v1/chat/completions", ...}, ...]

Command line: ``python -m fsm fault-server --script FILE`` (see :mod:`fsm.commands.fault_server`).
"""

from __future__ import annotations

import collections
import io
import ipaddress
import json
import math
import selectors
import socket
import socketserver
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["DEFAULT_ENTRY", "ENTRY_KEYS", "FaultServer", "is_loopback", "redact_headers",
           "redact_path", "validate_script", "wait_sent"]

DEFAULT_ENTRY: dict[str, Any] = {}
"""What every chat request gets once the script is used up: a plain success (a stream of
``"ok"``, or a ``chat.completion`` object when the request did not ask to stream)."""

_PLAIN_STREAM: dict[str, Any] = {"stream": ["ok"]}

ENTRY_KEYS: tuple[str, ...] = (
    "status", "json", "body", "headers", "delay_ms", "hang_ms", "stream", "chunk_delay_ms",
    "finish_reason", "usage", "drop", "drop_mode", "no_done",
)
_STREAM_ONLY = ("chunk_delay_ms", "finish_reason", "usage", "drop", "drop_mode", "no_done")
_DELAYS = ("delay_ms", "hang_ms", "chunk_delay_ms")
_POLL_S = 0.05
_PAUSE_POLL_S = 0.5  # stop() shuts every connection down, which wakes a pause at once: this
# only bounds a missed wake-up (a 2-s service time polled every 50 ms cost the server 40
# wake-ups per request: most of its CPU in the capacity mode's live runs)
_NO_BODY_STATUSES = (204, 304)

MAX_BODY_BYTES = 16 << 20
"""Default ``max_body_bytes``: a bigger request body is answered 413 without being read."""

MAX_LOG_BYTES = 64 << 20
"""Default ``max_log_bytes``: request bodies kept in :attr:`FaultServer.requests`, in all
(counted in request bytes); the oldest bodies are dropped first."""

MAX_RECORDS = 10_000
"""Default ``max_records``: request records kept; the oldest are dropped first."""

TIMEOUT_S = 30.0
"""Default ``timeout_s``: a connection that sends nothing (or takes no bytes) this long is closed."""

MAX_HEADER_BYTES = 64 << 10
"""Default ``max_header_bytes``: a request line and headers bigger than this are answered 431."""

MAX_HEADERS = 100
"""Default ``max_headers``: a request with more header lines is answered 431."""

MAX_PENDING = 4096
"""Connections whose request head is still arriving, at most; past it the oldest is closed
(so that a flood of slow clients cannot lock new ones out)."""

_CHUNK_LINE_LIMIT = 1024
_TRAILER_LINES_LIMIT = 100
_SENSITIVE_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key",
                                "x-goog-api-key", "cookie", "set-cookie"})
_SENSITIVE_PARAM_WORDS = ("key", "token", "secret", "auth", "sig", "password", "credential")
_REDACTED = "[redacted]"


class _BadRequest(Exception):
    """A request the server answers with ``status`` and closes (bad framing, too big)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` reaches this machine only (``127.0.0.0/8``, ``::1``,
    ``localhost``). ``""``, ``0.0.0.0`` and ``::`` bind every interface: not loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def redact_path(path: str) -> str:
    """``path`` with the values of credential-like query parameters (``key``, ``api_key``,
    ``token``, ``sig``, ...) replaced by ``[redacted]``; other parameters are kept."""
    base, sep, query = path.partition("?")
    if not sep:
        return path
    parts = []
    for part in query.split("&"):
        name, eq, _ = part.partition("=")
        if eq and any(word in name.lower() for word in _SENSITIVE_PARAM_WORDS):
            part = f"{name}={_REDACTED}"
        parts.append(part)
    return base + "?" + "&".join(parts)


def redact_headers(headers: dict[str, str]) -> dict[str, str]:
    """Request headers with credential values replaced (an ``Authorization`` keeps its
    scheme: ``"Bearer [redacted]"``)."""
    out = {}
    for name, value in headers.items():
        if name.lower() in _SENSITIVE_HEADERS:
            scheme = value.split(" ", 1)[0] if " " in value.strip() else ""
            value = f"{scheme} {_REDACTED}" if scheme and name.lower().endswith("authorization") else _REDACTED
        out[name] = value
    return out


def _now_ms() -> float:
    return time.monotonic() * 1000.0


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "list",
            dict: "object"}.get(type(value), type(value).__name__)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _entry_problem(entry: Any) -> str | None:
    """The first problem of one script entry, or ``None`` when it is valid."""
    if not isinstance(entry, dict):
        return f"must be an object, got {_type_name(entry)} {entry!r:.60}"
    for key in entry:
        if key not in ENTRY_KEYS:
            return f"unknown key {key!r} (known keys: {', '.join(ENTRY_KEYS)})"
    status = entry.get("status", 200)
    if not isinstance(status, int) or isinstance(status, bool):
        return f"status must be an integer, got {_type_name(status)} {status!r:.60}"
    if not 100 <= status <= 599:
        return f"status must be between 100 and 599, got {status}"
    if status < 200:
        return (f"status {status} is informational (1xx), not an answer: a client would wait "
                "for the real one; use 200–599")
    if status in _NO_BODY_STATUSES:
        for key in ("json", "body", "stream"):
            if key in entry:
                return f"status {status} has no body (RFC 9110), leave out {key}"
    for key in _DELAYS:
        if key in entry:
            value = entry[key]
            if not _is_number(value):
                return f"{key} must be a number of milliseconds, got {_type_name(value)} {value!r:.60}"
            if not math.isfinite(value) or value < 0:
                return f"{key} must be a finite number ≥ 0, got {value!r}"
    if "body" in entry and not isinstance(entry["body"], str):
        return f"body must be a string, got {_type_name(entry['body'])}"
    if "json" in entry and "body" in entry:
        return "json and body are mutually exclusive"
    headers = entry.get("headers", {})
    if not isinstance(headers, dict):
        return f"headers must be an object, got {_type_name(headers)}"
    for name, value in headers.items():
        if not name or any(c in name for c in " \t\r\n:") or not name.isascii():
            return f"header name {name!r} is not a valid HTTP header name"
        if name.lower() in ("content-length", "transfer-encoding"):
            return f"header {name!r} is set by the server, leave it out"
        if not (isinstance(value, str) or _is_number(value)):
            return f"header {name!r} must be a string or a number, got {_type_name(value)}"
        if isinstance(value, str) and any(c in value for c in "\r\n"):
            return f"header {name!r} must not contain a line break"
        if isinstance(value, str) and not value.isascii():
            return f"header {name!r} must be ASCII text (HTTP headers), got {value!r:.80}"
    if "stream" not in entry:
        for key in _STREAM_ONLY:
            if key in entry:
                return f"{key} needs a stream (add \"stream\": [...])"
        return None
    stream = entry["stream"]
    if not isinstance(stream, list):
        return f"stream must be a list of strings or objects, got {_type_name(stream)}"
    for i, item in enumerate(stream):
        if not isinstance(item, (str, dict)):
            return f"stream[{i}] must be a string (a text delta) or an object (a raw event), got {_type_name(item)}"
    for key in ("json", "body"):
        if key in entry:
            return f"{key} and stream are mutually exclusive"
    for key in ("drop", "no_done"):
        if key in entry and not isinstance(entry[key], bool):
            return f"{key} must be true or false, got {_type_name(entry[key])}"
    if entry.get("drop") and entry.get("no_done"):
        return "drop and no_done are mutually exclusive"
    if "drop_mode" in entry:
        if entry["drop_mode"] not in ("rst", "fin"):
            return f"drop_mode must be \"rst\" or \"fin\", got {entry['drop_mode']!r:.60}"
        if not entry.get("drop"):
            return "drop_mode needs \"drop\": true"
    if "finish_reason" in entry and not isinstance(entry["finish_reason"], str):
        return f"finish_reason must be a string, got {_type_name(entry['finish_reason'])}"
    if "usage" in entry and not (entry["usage"] is None or isinstance(entry["usage"], dict)):
        return f"usage must be an object or null, got {_type_name(entry['usage'])}"
    return None


def validate_script(obj: Any) -> list[dict]:
    """Check a script and return it as a list of entries (header values turned into strings).

    Raises ``ValueError`` naming the entry's index and the problem, e.g.
    ``script entry 2: status must be between 100 and 599, got 700``.
    """
    if not isinstance(obj, list):
        raise ValueError(f"script must be a JSON list of entries, got {_type_name(obj)}")
    out: list[dict] = []
    for index, entry in enumerate(obj):
        problem = _entry_problem(entry)
        if problem is not None:
            raise ValueError(f"script entry {index}: {problem}")
        entry = dict(entry)
        if "headers" in entry:
            entry["headers"] = {k.lower(): str(v) for k, v in entry["headers"].items()}
        out.append(entry)
    return out


def wait_sent(conn: socket.socket, stopping: threading.Event, timeout_s: float = 2.0) -> None:
    """Wait until the peer has acknowledged every byte written to ``conn`` (Linux), at most
    ``timeout_s``; elsewhere, wait a short fixed time."""
    try:
        import fcntl
        import termios
        outq = termios.TIOCOUTQ
    except (ImportError, AttributeError):  # not Linux
        stopping.wait(0.05)
        return
    deadline = time.monotonic() + timeout_s
    buf = struct.pack("i", 0)
    while time.monotonic() < deadline and not stopping.is_set():
        try:
            if struct.unpack("i", fcntl.ioctl(conn.fileno(), outq, buf))[0] == 0:
                return
        except (OSError, ValueError):  # the socket is already closed
            return
        stopping.wait(0.001)


class _HeadTooLarge(Exception):
    """A request line and headers past ``max_header_bytes`` or ``max_headers`` (answered 431)."""


def _head_end(buf: bytes | bytearray, start: int = 0) -> int | None:
    """The length of the request head at the start of ``buf`` (request line, headers and the
    blank line), or None while it is incomplete; ``start`` skips what was searched before."""
    if buf[:2] == b"\r\n":
        return 2
    if buf[:1] == b"\n":
        return 1
    start = max(0, start - 3)
    ends = [i + 3 for i in (buf.find(b"\n\r\n", start),) if i >= 0]
    ends += [i + 2 for i in (buf.find(b"\n\n", start),) if i >= 0]
    return min(ends) if ends else None


_TOO_LARGE_BODY = b'{"error": {"message": "request headers are too large", "type": "invalid_request_error"}}'
_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
              b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_TOO_LARGE_BODY), _TOO_LARGE_BODY))


class _Prefixed(io.RawIOBase):
    """A raw stream that yields ``prefix`` (bytes already read from a socket) then ``inner``."""

    def __init__(self, prefix: bytes, inner: Any) -> None:
        self._prefix = memoryview(prefix)
        self._inner = inner

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self._prefix:
            n = min(len(b), len(self._prefix))
            b[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        data = self._inner.read1(len(b))
        b[:len(data)] = data
        return len(data)

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            super().close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fsm-fault-server/1"
    sys_version = ""
    disable_nagle_algorithm = True  # each SSE event leaves at once, as from a real provider
    server: "_HTTPServer"

    def setup(self) -> None:
        self.timeout = self.server.owner.timeout_s  # StreamRequestHandler applies it to the socket
        super().setup()
        self.server.track(self.connection, True)
        # The serving thread read the first request head (and maybe more) before handing the
        # connection over: it is read from here first.
        self._first_head = self.server.prefixes.pop(self.connection, b"")

    def _read_head(self) -> bytes:
        """The next request head from the connection: at most ``max_header_bytes`` and
        ``max_headers`` lines (else :class:`_HeadTooLarge`), all of it within ``timeout_s``
        (else ``TimeoutError``: a client dripping a byte now and then is closed all the
        same). ``b""`` when the client closed the connection."""
        owner = self.server.owner
        limit, max_lines = owner.max_header_bytes, owner.max_headers + 1
        deadline = time.monotonic() + owner.timeout_s
        buf = bytearray()
        lines = 0
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the request head did not arrive in time")
                self.connection.settimeout(left)
                data = self.rfile.peek(1)  # at most one read from the socket
                if not data:
                    return bytes(buf)
                cut = data.find(b"\n")
                piece = self.rfile.read(min(cut + 1 if cut >= 0 else len(data), limit + 1 - len(buf)))
                buf += piece
                if len(buf) > limit:
                    raise _HeadTooLarge()
                if piece.endswith(b"\n"):
                    lines += 1
                    if lines > max_lines:
                        raise _HeadTooLarge()
                    if _head_end(buf, len(buf) - len(piece)) is not None:
                        return bytes(buf)
        finally:
            self.connection.settimeout(owner.timeout_s)

    def handle_one_request(self) -> None:
        """One request, as the standard library's, with a bounded request head (431 past
        ``max_header_bytes`` / ``max_headers``) that must arrive within ``timeout_s``."""
        try:
            if self._first_head:
                head, self._first_head = self._first_head, b""
                end = _head_end(head) or len(head)
                if end < len(head):  # a body or a next request came with the head
                    self.rfile = io.BufferedReader(_Prefixed(head[end:], self.rfile))
                head = head[:end]
            else:
                head = self._read_head()
        except _HeadTooLarge:
            self.requestline, self.request_version, self.command = "", "", ""
            self.close_connection = True
            self.send_error(431, "Request header fields too large",
                            f"at most {self.server.owner.max_headers} headers and "
                            f"{self.server.owner.max_header_bytes} bytes")
            return
        except (TimeoutError, OSError):
            self.close_connection = True
            return
        if not head:
            self.close_connection = True
            return
        cut = head.find(b"\n") + 1
        self.raw_requestline = head[:cut]
        real, self.rfile = self.rfile, io.BytesIO(head[cut:])
        try:
            parsed = self.parse_request()
        finally:
            self.rfile = real
        if not parsed:
            return
        method = getattr(self, "do_" + self.command, None)
        if method is None:
            self.send_error(501, f"Unsupported method ({self.command!r})")
            return
        try:
            method()
            self.wfile.flush()
        except TimeoutError:
            self.close_connection = True

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        pass  # FaultServer(verbose=True) logs one JSON line per answered request instead

    # -- reading --------------------------------------------------------------------------
    def _header_dict(self) -> dict[str, str]:
        return {name.lower(): value for name, value in self.headers.items()}

    def _read_body(self) -> bytes:
        """The request body, at most ``max_body_bytes``; raises :class:`_BadRequest` for bad
        framing (400) or a body too big (413), ``OSError`` when the client stalls or leaves."""
        limit = self.server.owner.max_body_bytes
        length = self.headers.get("content-length")
        coding = (self.headers.get("transfer-encoding") or "").strip().lower()
        if coding and coding != "chunked":
            raise _BadRequest(400, f"unsupported transfer-encoding {coding[:40]!r}")
        if coding and length is not None:
            raise _BadRequest(400, "both content-length and transfer-encoding given")
        if length is not None:
            length = length.strip()
            if not (length.isascii() and length.isdigit()):
                raise _BadRequest(400, f"content-length must be a whole number of bytes, got {length[:40]!r}")
            if len(length) > 20 or int(length) > limit:
                raise _BadRequest(413, f"request body of {length[:40]} bytes is over the limit of {limit}")
            size = int(length)
            return self._read_exactly(size)
        if not coding:
            return b""
        out, total = [], 0
        while True:
            line = self.rfile.readline(_CHUNK_LINE_LIMIT)
            if not line.endswith(b"\n"):
                if not line:
                    raise ConnectionAbortedError("client left inside the chunked body")
                raise _BadRequest(400, "chunk size line too long")
            size_text = line.split(b";")[0].strip()
            if not size_text or len(size_text) > 16 or not all(c in b"0123456789abcdefABCDEF" for c in size_text):
                raise _BadRequest(400, "malformed chunked request body")
            size = int(size_text, 16)
            if size == 0:
                for _ in range(_TRAILER_LINES_LIMIT):
                    if self.rfile.readline(_CHUNK_LINE_LIMIT) in (b"\r\n", b"\n", b""):
                        return b"".join(out)
                raise _BadRequest(400, "too many trailer lines")
            total += size
            if total > limit:
                raise _BadRequest(413, f"request body over the limit of {limit} bytes")
            out.append(self._read_exactly(size))
            self.rfile.readline(_CHUNK_LINE_LIMIT)

    def _read_exactly(self, size: int) -> bytes:
        data = self.rfile.read(size) if size else b""
        if len(data) < size:
            raise ConnectionAbortedError("client left inside the request body")
        return data

    def _refuse(self, exc: _BadRequest) -> None:
        self.close_connection = True
        data = json.dumps({"error": {"message": str(exc), "type": "invalid_request_error"}}).encode()
        self.send_response(exc.status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def pause(self, ms: float) -> bool:
        """Wait ``ms``; ``False`` early when the client went away or the server stops."""
        deadline = time.monotonic() + ms / 1000.0
        stopping = self.server.owner.stopping
        with selectors.DefaultSelector() as sel:  # not select(): hundreds of fds may be open
            sel.register(self.connection, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0:
                if stopping.is_set():
                    return False
                if sel.select(min(left, _PAUSE_POLL_S)):
                    try:
                        if not self.connection.recv(1, socket.MSG_PEEK):
                            return False
                    except OSError:
                        return False
                    # Pipelined bytes of a next request: nothing to watch, just wait.
                    stopping.wait(min(left, _POLL_S))
        return True

    # -- writing --------------------------------------------------------------------------
    # Each answer records its outcome just before its last bytes leave, so a client that has
    # read a whole answer always finds it recorded.
    def done(self, status: int | None, outcome: str) -> None:
        self.server.owner._update(self._rec, status=status, outcome=outcome)

    def send(self, status: int, data: bytes, ctype: str, headers: dict[str, str], outcome: str) -> None:
        self.send_response(status)
        headers = dict(headers)
        if status in _NO_BODY_STATUSES:  # no body and no framing headers (RFC 9110 §15.3.5)
            data = b""
            headers.pop("content-type", None)
        else:
            self.send_header("content-type", headers.pop("content-type", ctype))
            self.send_header("content-length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.done(status, outcome)
        self.end_headers()
        if data:
            self.wfile.write(data)

    def send_json(self, status: int, obj: Any, outcome: str, headers: dict[str, str] | None = None) -> None:
        self.send(status, json.dumps(obj).encode(), "application/json", headers or {}, outcome)

    def chunk(self, payload: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))

    # -- what every route's answer shares (chat here; fault_anthropic, fault_responses and
    # fault_gemini for the other protocols) ------------------------------------------------
    def begin(self, entry: dict) -> tuple[int, dict[str, str]] | None:
        """The start of an answer to ``entry``: its ``delay_ms`` + ``hang_ms`` waited, then a
        ``body`` or ``json`` entry sent as it is. None when that answered (or the client left
        during the delay); else ``(status, headers)`` for the route to answer with."""
        delay = entry.get("delay_ms", 0) + entry.get("hang_ms", 0)
        if delay and not self.pause(delay):
            self.client_gone(None, "client_gone_during_delay")
            return None
        status = entry.get("status", 200)
        headers = entry.get("headers", {})
        if "body" in entry:
            self.send(status, entry["body"].encode(), "text/plain; charset=utf-8", headers, "body")
            return None
        if "json" in entry:
            self.send_json(status, entry["json"], "json", headers)
            return None
        return status, headers

    def open_stream(self, status: int, headers: dict[str, str], *, no_cache: bool = True) -> None:
        """The head of a chunked SSE answer: ``content-type`` (``text/event-stream`` unless
        ``headers`` name one), ``cache-control: no-cache`` when ``no_cache``, the entry's
        ``headers``."""
        self.send_response(status)
        headers = dict(headers)
        self.send_header("content-type", headers.pop("content-type", "text/event-stream"))
        if no_cache:
            self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def drop(self, entry: dict, status: int, chunk_delay: float) -> None:
        """Cut a stream after its items (``drop``): a last ``chunk_delay`` when it sent any,
        then a TCP reset (``drop_mode: "rst"``, the default: once the client's kernel has
        acknowledged what was sent, so the client sees it first) or a shutdown."""
        if chunk_delay and entry["stream"] and not self.pause(chunk_delay):
            return self.client_gone(status, "client_gone_mid_stream")
        mode = entry.get("drop_mode", "rst")
        self.done(status, f"dropped_{mode}")
        conn = self.connection
        if mode == "rst":
            wait_sent(conn, self.server.owner.stopping)
            # SO_LINGER 0: close() sends a TCP RST instead of a FIN.
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            conn.shutdown(socket.SHUT_RDWR)
        conn.close()
        self.close_connection = True
        return None

    def truncate(self, status: int) -> None:
        """End a stream without its final event (``no_done``)."""
        self.done(status, "truncated")
        return self.chunk(b"")

    def _event(self, obj: Any) -> None:
        self.chunk(b"data: " + (obj if isinstance(obj, str) else json.dumps(obj)).encode() + b"\n\n")

    # -- routes ---------------------------------------------------------------------------
    def _is(self, suffix: str) -> bool:
        return self.path.split("?")[0].rstrip("/").endswith(suffix) and not self._doubled()

    def _gemini(self) -> bool:
        from fsm.testing.fault_gemini import is_gemini
        return is_gemini(self.path)

    def _doubled(self) -> bool:
        """The path has ``/v1`` twice (``/v1/v1/messages``): a client given the OpenAI base URL
        where the host's root belongs (the Anthropic SDK adds ``/v1`` itself)."""
        return "/v1/v1/" in self.path.split("?")[0] + "/"

    def do_GET(self) -> None:  # noqa: N802 (stdlib naming)
        self._rec, _ = self.server.owner._record(self.command, self.path, None, chat=False,
                                                 headers=self._header_dict())
        if self._is("/models"):
            self.send_json(200, {"object": "list", "data": [
                {"id": self.server.owner.model, "object": "model", "created": 0,
                 "owned_by": "fault-server"}]}, "models")
        elif self._is("/fault/stats"):
            self.send_json(200, self.server.owner.stats(), "stats")
        else:
            self._not_found()

    def do_POST(self) -> None:  # noqa: N802 (stdlib naming)
        arrival = _now_ms()
        try:
            raw = self._read_body()
        except _BadRequest as exc:
            return self._refuse(exc)
        except OSError:  # the client stalled past timeout_s or left: nobody to answer
            self.close_connection = True
            return None
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            body = None
        # /messages: fault_anthropic; /responses: fault_responses (the OpenAI Responses API)
        # /files: a multipart upload (the SDKs' files.create), scripted like a chat request
        # /v1beta/models/M:generateContent, :streamGenerateContent: fault_gemini (Gemini's API)
        chat = (self._is("/chat/completions") or self._is("/messages") or self._is("/responses")
                or self._is("/files") or self._gemini())
        self._rec, entry = self.server.owner._record(self.command, self.path, body, chat=chat,
                                                     t_ms=arrival, headers=self._header_dict(),
                                                     body_bytes=len(raw))
        if not chat:
            self._not_found()
            return
        try:
            self._answer(entry, body if isinstance(body, dict) else {}, self._rec["index"])
        except OSError as exc:  # BrokenPipe, ConnectionReset: the client left mid-answer
            self.close_connection = True
            self.done(None, f"client_gone:{type(exc).__name__}")

    def _not_found(self) -> None:
        message = f"no route for {self.command} {self.path}"
        if self._doubled():
            owner = self.server.owner
            message += (f": the path has /v1 twice; give the Anthropic SDK the server's root, "
                        f"base_url={owner.root_url} (it adds /v1 itself); OpenAI clients take "
                        f"base_url={owner.base_url}")
        self.send_json(404, {"error": {"message": message, "type": "not_found_error"}}, "404")

    def client_gone(self, status: int | None, outcome: str) -> None:
        self.close_connection = True
        self.done(status, outcome)

    def _answer(self, entry: dict, req: dict, index: int) -> None:
        if self._is("/messages"):  # the Anthropic Messages API, same script
            from fsm.testing.fault_anthropic import answer
            return answer(self, entry, req, index)
        if self._is("/responses"):  # the OpenAI Responses API, same script
            from fsm.testing.fault_responses import answer as answer_responses
            return answer_responses(self, entry, req, index)
        if self._gemini():  # Gemini's generateContent / streamGenerateContent, same script
            from fsm.testing.fault_gemini import answer as answer_gemini
            return answer_gemini(self, entry, req, index)
        begun = self.begin(entry)
        if begun is None:
            return None
        status, headers = begun
        if self._is("/files") and status == 200:
            return self.send_json(200, {"id": f"file-fault-{index}", "object": "file", "bytes": 0,
                                        "created_at": int(time.time()), "filename": "upload",
                                        "purpose": "batch", "status": "processed"}, "file", headers)
        if "stream" not in entry:
            if status != 200:
                return self.send(status, b"", "text/plain; charset=utf-8", headers, "empty")
            if not req.get("stream"):
                return self.send_json(200, self._completion(req, index), "completion", headers)
            entry = {**_PLAIN_STREAM, **entry}
        elif (req.get("stream") is False or ("stream" not in req and "messages" in req)) \
                and status == 200 and not entry.get("drop") and not entry.get("no_done"):
            # A chat request that did not ask to stream gets the same answer as one JSON object
            # (a bare probe body without "messages" still gets the stream).
            text = "".join(item for item in entry["stream"] if isinstance(item, str))
            errors = [item for item in entry["stream"] if isinstance(item, dict) and "error" in item]
            if errors:
                return self.send_json(200, errors[0], "json", headers)
            return self.send_json(200, self._completion(req, index, text, entry.get("finish_reason", "stop")),
                                   "completion", headers)
        return self._stream(entry, req, index, status, headers)

    def _stream(self, entry: dict, req: dict, index: int, status: int, headers: dict[str, str]) -> None:
        self.open_stream(status, headers)
        base = {"id": f"chatcmpl-fault-{index}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": req.get("model") or self.server.owner.model}
        self._event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                          "finish_reason": None}]})
        chunk_delay = entry.get("chunk_delay_ms", 0)
        text = ""
        for i, item in enumerate(entry["stream"]):
            if chunk_delay and i and not self.pause(chunk_delay):
                return self.client_gone(status, "client_gone_mid_stream")
            if isinstance(item, str):
                text += item
                item = {**base, "choices": [{"index": 0, "delta": {"content": item},
                                             "finish_reason": None}]}
            self._event(item)
        if entry.get("drop"):
            return self.drop(entry, status, chunk_delay)
        if entry.get("no_done"):
            return self.truncate(status)
        self._event({**base, "choices": [{"index": 0, "delta": {},
                                          "finish_reason": entry.get("finish_reason", "stop")}]})
        usage = entry.get("usage", self._usage(text))
        if usage is not None:
            self._event({**base, "choices": [], "usage": usage})
        self.done(status, "stream")
        self._event("[DONE]")
        return self.chunk(b"")

    @staticmethod
    def _usage(text: str) -> dict[str, int]:
        completion = max(1, len(text) // 4)
        return {"prompt_tokens": 10, "completion_tokens": completion, "total_tokens": 10 + completion}

    def _completion(self, req: dict, index: int, text: str = "ok", finish_reason: str = "stop") -> dict:
        return {"id": f"chatcmpl-fault-{index}", "object": "chat.completion", "created": int(time.time()),
                "model": req.get("model") or self.server.owner.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": finish_reason}],
                "usage": self._usage(text)}


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() must not wait for a handler that is hanging on purpose
    request_queue_size = 1024  # hundreds of clients may connect at once

    def __init__(self, owner: "FaultServer", address: tuple[str, int]) -> None:
        self.owner = owner
        self.prefixes: dict[socket.socket, bytes] = {}  # the head read before a handler started
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), a DNS lookup that can take seconds.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client resetting an idle keep-alive connection is normal here, not worth a traceback.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)

    def track(self, conn: socket.socket, opened: bool) -> None:
        with self._open_lock:
            (self._open.add if opened else self._open.discard)(conn)

    def close_connections(self) -> None:
        with self._open_lock:
            conns, self._open = list(self._open), set()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class FaultServer:
    """A scripted OpenAI-compatible server running in a background thread.

    ``script`` is validated with :func:`validate_script` (``ValueError`` naming the entry's
    index). ``port`` 0 picks a free port. ``requests`` lists every request received, in arrival
    order, as dicts: ``index`` (position among chat requests, ``None`` for other paths),
    ``t_ms`` (arrival, ``time.monotonic()`` in ms), ``end_ms`` (answer finished, or ``None``),
    ``method``, ``path``, ``headers`` (request headers, lower-case names), ``body`` (the parsed
    JSON request body or ``None``), ``body_bytes`` (its size on the wire), ``body_kept``
    (``False`` once the body was dropped to respect ``max_log_bytes``), ``scripted``
    (``False`` once the script is used up), ``status`` and ``outcome`` (``json``, ``body``,
    ``empty``, ``completion``, ``stream``, ``truncated``, ``dropped_rst``, ``dropped_fin``,
    ``models``, ``404``, ``client_gone…``; ``None`` while the answer is in progress).

    Bounds, for a server that runs for days or faces a hostile client: a request body over
    ``max_body_bytes`` is answered 413 without being read, bad framing (``Content-Length: -1``,
    a chunk size that is not hexadecimal or too long) 400, both with ``connection: close``
    and without a record; at most ``max_records`` records are kept and their bodies hold at
    most ``max_log_bytes`` request bytes (the oldest go first; :attr:`chat_count` still counts
    every chat request); a connection that sends or takes nothing for ``timeout_s`` seconds is
    closed, and so is one whose request head (request line and headers) has not arrived whole
    within ``timeout_s`` (a slowloris client dripping a byte now and then); a head over
    ``max_header_bytes`` (64 KiB) or ``max_headers`` (100 lines) is answered 431 and closed. A
    new connection holds no thread until its first head has arrived (the serving thread reads
    heads with a selector, at most :data:`MAX_PENDING` at once, the oldest closed first), so
    slow or silent clients never keep others from being served. ``host`` must be a loopback address unless ``allow_remote`` is true (``""``,
    ``0.0.0.0``, ``::`` or a LAN address let anyone on the network use the server):
    ``ValueError`` otherwise. With ``verbose``, each answered request is logged to stderr as
    one JSON line, credential-like query parameters and headers redacted
    (:func:`redact_path`, :func:`redact_headers`).
    """

    def __init__(self, script: list[dict] | None = None, host: str = "127.0.0.1", port: int = 0,
                 *, model: str = "fault-model", verbose: bool = False, allow_remote: bool = False,
                 max_body_bytes: int = MAX_BODY_BYTES, max_log_bytes: int = MAX_LOG_BYTES,
                 max_records: int = MAX_RECORDS, timeout_s: float = TIMEOUT_S,
                 max_header_bytes: int = MAX_HEADER_BYTES, max_headers: int = MAX_HEADERS,
                 capacity: Any = None) -> None:
        self.script = validate_script(list(script or []))
        self.capacity = capacity  # capacity mode (fsm.testing.capacity.Capacity): refuses first
        if not is_loopback(host) and not allow_remote:
            shown = repr(host) if host else "'' (every interface)"
            raise ValueError(f"host {shown} can be reached from other machines, and the fault "
                             "server answers anyone; pass allow_remote=True (--allow-remote) if "
                             "that is meant, or use 127.0.0.1")
        for name, value in (("max_body_bytes", max_body_bytes), ("max_log_bytes", max_log_bytes),
                            ("max_records", max_records), ("max_header_bytes", max_header_bytes),
                            ("max_headers", max_headers)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a whole number ≥ 0, got {value!r}")
        if not (_is_number(timeout_s) and 0 < timeout_s < math.inf):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.host = host
        self.model = model
        self.verbose = verbose
        self.max_body_bytes = max_body_bytes
        self.max_log_bytes = max_log_bytes
        self.max_records = max_records
        self.timeout_s = timeout_s
        self.max_header_bytes = max_header_bytes
        self.max_headers = max_headers
        self._lock = threading.Lock()
        self._requests: collections.deque[dict] = collections.deque()
        self._kept: collections.deque[dict] = collections.deque()  # records still holding a body
        self._kept_bytes = 0
        self._chat_count = 0
        self.stopping = threading.Event()  # set by stop(): pauses, hangs and streams end at once
        self._httpd = _HTTPServer(self, (host, port))
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1``, the base URL an OpenAI client takes (a wildcard host is
        reached through its loopback address)."""
        return f"{self.root_url}/v1"

    @property
    def root_url(self) -> str:
        """``http://HOST:PORT``, the base URL the Anthropic SDK takes (it adds ``/v1/messages``;
        given :attr:`base_url`, its ``/v1/v1/messages`` is answered 404 naming this URL), and
        the Google Gen AI SDK (``HttpOptions(base_url=...)``: it adds ``/v1beta/models/...``)."""
        host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    @property
    def requests(self) -> list[dict]:
        """A snapshot of the request records (see the class docstring)."""
        with self._lock:
            return [dict(rec) for rec in self._requests]

    @property
    def chat_requests(self) -> list[dict]:
        """The records of chat requests only."""
        return [rec for rec in self.requests if rec["index"] is not None]

    @property
    def chat_count(self) -> int:
        """How many chat requests arrived in all (records dropped past ``max_records`` count)."""
        with self._lock:
            return self._chat_count

    def stats(self) -> dict[str, Any]:
        """What the server saw, as served by ``GET /fault/stats`` (or ``/v1/fault/stats``):
        ``{"chat_requests": n, "capacity": null}``, or in capacity mode the bucket's
        :meth:`fsm.testing.capacity.Capacity.stats` under ``capacity`` (requests accepted and
        refused per second)."""
        capacity = self.capacity.stats() if self.capacity is not None else None
        return {"chat_requests": self.chat_count, "capacity": capacity}

    @property
    def kept_body_bytes(self) -> int:
        """Request bytes whose parsed bodies the records still hold (≤ ``max_log_bytes``)."""
        with self._lock:
            return self._kept_bytes

    def _record(self, method: str, path: str, body: Any, *, chat: bool, headers: dict[str, str],
                t_ms: float | None = None, body_bytes: int = 0) -> tuple[dict, dict]:
        """Append a live record; for a chat request, also pick its script entry."""
        rec: dict[str, Any] = {"index": None, "t_ms": t_ms if t_ms is not None else _now_ms(),
                               "end_ms": None, "method": method, "path": path, "headers": headers,
                               "body": body, "body_bytes": body_bytes, "body_kept": True,
                               "scripted": False, "status": None, "outcome": None}
        entry = DEFAULT_ENTRY
        with self._lock:
            if chat:
                rec["index"] = index = self._chat_count
                self._chat_count += 1
                if index < len(self.script):
                    rec["scripted"], entry = True, self.script[index]
                refusal = self.capacity.admit() if self.capacity is not None else None
                if refusal is not None:
                    entry = refusal
                elif self.capacity is not None and getattr(self.capacity, "service_ms", 0):
                    # the capacity mode's service time, on top of the entry's own delay
                    entry = {**entry, "delay_ms": entry.get("delay_ms", 0) + self.capacity.service_ms}
            self._requests.append(rec)
            if body is not None:
                self._kept.append(rec)
                self._kept_bytes += body_bytes
            self._trim()
        return rec, entry

    def _trim(self) -> None:
        """Drop the oldest records past max_records, the oldest bodies past max_log_bytes."""
        while len(self._requests) > self.max_records:
            self._forget_body(self._requests.popleft())
        while self._kept and self._kept_bytes > self.max_log_bytes:
            self._forget_body(self._kept[0])

    def _forget_body(self, rec: dict) -> None:
        if rec["body"] is not None:
            # The oldest kept body is the usual one to go; remove() is for the rare other case.
            self._kept.popleft() if self._kept[0] is rec else self._kept.remove(rec)
            self._kept_bytes -= rec["body_bytes"]
            rec["body"], rec["body_kept"] = None, False

    def _update(self, rec: dict, *, status: int | None, outcome: str) -> None:
        with self._lock:
            rec.update(status=status, outcome=outcome, end_ms=_now_ms())
            line = {k: v for k, v in rec.items() if k not in ("body", "headers")}
            line["path"] = redact_path(line["path"])
            line["headers"] = redact_headers(rec["headers"])
        if self.verbose:
            sys.stderr.write("fault-server: " + json.dumps(line) + "\n")

    def start(self) -> "FaultServer":
        """Serve in a daemon thread; returns ``self``."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=f"fault-server:{self.port}",
                                            daemon=True)
            self._thread.start()
        return self

    def _serve(self) -> None:
        # Our own loop instead of serve_forever(): stop() wakes it through a socket pair at
        # once. A new connection waits here, in the selector, until its first request head
        # has arrived whole (bounded in bytes, lines and time); only then does it get a
        # thread. A client that connects and sends nothing, or drips a byte now and then
        # (slowloris), never holds a thread, and every other client is served meanwhile.
        listener = self._httpd.socket
        listener.setblocking(False)
        pending: dict[socket.socket, list[Any]] = {}  # conn -> [address, head so far, deadline]
        next_sweep = time.monotonic() + _POLL_S
        with selectors.DefaultSelector() as sel:
            sel.register(listener, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            try:
                while not self.stopping.is_set():
                    for key, _ in sel.select(_POLL_S):
                        if self.stopping.is_set():
                            break
                        if key.fileobj is listener:
                            self._accept(listener, sel, pending)
                        elif key.fileobj is not self._wake_r:
                            self._head_bytes(key.fileobj, sel, pending)
                    now = time.monotonic()
                    if now >= next_sweep:
                        next_sweep = now + _POLL_S
                        for conn in [c for c, (_, _, deadline) in pending.items() if deadline <= now]:
                            self._drop(conn, sel, pending)
            finally:
                for conn in list(pending):
                    self._drop(conn, sel, pending)

    def _accept(self, listener: socket.socket, sel: Any, pending: dict) -> None:
        for _ in range(64):  # a burst of connections, without starving the others
            try:
                conn, address = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # EMFILE and the like: try again on the next round
                return
            conn.setblocking(False)
            while len(pending) >= MAX_PENDING:
                self._drop(next(iter(pending)), sel, pending)  # the oldest slow client
            pending[conn] = [address, b"", time.monotonic() + self.timeout_s]
            sel.register(conn, selectors.EVENT_READ)

    def _head_bytes(self, conn: Any, sel: Any, pending: dict) -> None:
        state = pending[conn]
        try:
            data = conn.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            return self._drop(conn, sel, pending)
        searched = len(state[1])
        state[1] += data
        head = state[1]
        end = _head_end(head, searched)
        if (end is None and len(head) > self.max_header_bytes) or (end or 0) > self.max_header_bytes \
                or head[:end or len(head)].count(b"\n") > self.max_headers + 1:
            try:
                conn.send(_TOO_LARGE)
            except OSError:
                pass
            return self._drop(conn, sel, pending)
        if end is None:
            return
        sel.unregister(conn)
        address = pending.pop(conn)[0]
        conn.setblocking(True)
        self._httpd.prefixes[conn] = bytes(head)
        try:
            self._httpd.process_request(conn, address)  # a handler thread of its own
        except Exception:  # no thread could be started: this client is not served
            self._httpd.prefixes.pop(conn, None)
            self._httpd.shutdown_request(conn)

    @staticmethod
    def _drop(conn: Any, sel: Any, pending: dict) -> None:
        pending.pop(conn, None)
        try:
            sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        try:
            conn.close()
        except OSError:
            pass

    def stop(self) -> None:
        """Stop serving, end pending delays and close open connections. Idempotent."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        self._wake_w.send(b"x")
        if self._thread is not None:
            self._thread.join()
        self._httpd.server_close()
        self._httpd.close_connections()
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> "FaultServer":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
