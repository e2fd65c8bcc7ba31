"""Check any implementation's event log against the machine's invariants (docs/policy.md §3, §4).

``python -m fsm audit --events FILE`` reads an event stream, reconstructs the retry chains and
reports every violation of the invariants of docs/policy.md §3 ("Invariants") that a log can
show, each with the line where it happened:

- ``unended``: every ``auto_retry_start`` is followed by exactly one ``auto_retry_end`` of its
  chain — a chain that never ends (at the end of the log, or when the next chain starts);
- ``end_without_start``: an end without a start is only a refusal at rest, ``attempt: 0``
  (``maxRetries = 0``, a guard that refused the first failure, a first request refused
  without sending, ``request_refused``);
- ``attempt``: inside a chain ``1 ≤ attempt ≤ maxAttempts``, counting up by one from 1 (a
  retry now keeps the attempt and emits no start), and the end names the last attempt;
- ``request_in_backoff``: no request goes out during a backoff (before ``delayMs`` has passed
  since the ``auto_retry_start`` that scheduled it). Only a log with times can show this.

Formats, detected from the content (see :func:`read_events`):

- JSON lines of events: the RPC server's stdout (``python -m fsm rpc``, pi's ``--mode rpc``;
  responses and other events are read and skipped), a host's event listener written as JSON
  lines, a session log;
- one JSON document: a conformance trace with a ``timeline`` (the oracle's recorded traces,
  with ``t_ms`` times and ``HTTP_REQUEST`` entries) or ``{"pi": {"events": [...]}}``
  (tests/conformance/expected/), or a list of events;
- OpenTelemetry spans as :mod:`fsm.integrations.otel` records them (``retry_chain`` spans
  with ``retry_attempt`` events): an OTLP JSON export (``resourceSpans`` → ``scopeSpans`` →
  ``spans``) or the console exporter's span objects.

Requests are ``HTTP_REQUEST`` / ``request`` entries, ``turn_start`` (each turn sends one
request) or, in a session log (``{"type": "message", "message": {...}}``), an assistant
message. A session log holds no retry events, so its chains cannot be checked: the report
says so. Times come from ``t_ms``, ``t``, ``ts``, ``time_ms`` or ``timestamp`` (ms), OTLP
``timeUnixNano`` (ns) or an ISO 8601 ``timestamp``. Chains are keyed by ``chainId`` when the
events carry it (and by ``sessionId`` / ``session``, for a fleet's merged log); without
``chainId``, an ``auto_retry_start`` with ``attempt: 1`` starts the next chain.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import stat
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator, Mapping

__all__ = ["Event", "Violation", "EventsReport", "EventLogError", "KINDS", "read_events",
           "check", "check_file", "format_violations"]

KINDS: dict[str, str] = {
    "unended": "a chain that started never ended (exactly one auto_retry_end per chain)",
    "end_without_start": "an auto_retry_end without a start that is not a refusal at rest "
                         "(attempt 0), or a second end of one chain",
    "attempt": "an attempt out of order: inside a chain attempts count 1, 2, ... up to "
               "maxAttempts, and the end names the last one",
    "request_in_backoff": "a request went out before the backoff's delayMs had passed",
}
"""Violation kind → the invariant it breaks (docs/policy.md §3 "Invariants")."""

START, END, REQUEST = "auto_retry_start", "auto_retry_end", "request"
_REQUEST_TYPES = ("HTTP_REQUEST", "http_request", "request")
_TIME_KEYS = ("t_ms", "t", "ts", "time_ms", "timestamp")
_MAX_BYTES = 256 << 20


class EventLogError(ValueError):
    """The event log cannot be read: ``path`` and ``line`` say where (line 0: the whole file)."""

    def __init__(self, path: str | Path, line: int, message: str) -> None:
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {message}")
        self.path, self.line = str(path), line


@dataclass(frozen=True, slots=True)
class Event:
    """One event the checker reads: ``kind`` is ``auto_retry_start``, ``auto_retry_end`` or
    ``request``; ``line`` the line of the log it starts on; ``t_ms`` its time (ms) or None;
    ``chain`` the chain key (None when the log has no ``chainId``); ``attempt``,
    ``max_attempts``, ``delay_ms``, ``success`` and ``end_reason`` as the event says."""

    kind: str
    line: int
    t_ms: float | None = None
    chain: Any = None
    attempt: int | None = None
    max_attempts: int | None = None
    delay_ms: int | None = None
    success: bool | None = None
    end_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant: its ``kind`` (a key of :data:`KINDS`), the ``line`` of the log where
    it happened and what happened, in words."""

    kind: str
    line: int
    message: str

    def to_json(self) -> dict:
        return {"kind": self.kind, "line": self.line, "message": self.message}


@dataclass(slots=True)
class EventsReport:
    """What :func:`check` found in one log: its ``path``, the ``format`` read, the number of
    ``events`` (``retry_events`` of them starts and ends), ``chains`` (started) and ``refusals`` (ends at rest, attempt 0) seen, whether
    it had ``times`` (needed for ``request_in_backoff``) and the ``violations``."""

    path: str
    format: str
    events: int = 0
    retry_events: int = 0
    chains: int = 0
    refusals: int = 0
    times: bool = False
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_json(self) -> dict:
        return {"path": self.path, "format": self.format, "events": self.events,
                "retry_events": self.retry_events,
                "chains": self.chains, "refusals": self.refusals, "times": self.times,
                "violations": [v.to_json() for v in self.violations]}


# ----------------------------------------------------------------------------- reading

class _BadValue(ValueError):
    """A field the checker cannot read (``"attempt": 1e400``, ``"chainId": {...}``); ``line``
    is set by the reader of the event it belongs to (0 until then)."""

    def __init__(self, message: str, line: int = 0) -> None:
        super().__init__(message)
        self.line = line


_INT_BOUND = 1 << 63
"""Counts and delays beyond a signed 64-bit integer are no counts: reported, not computed with."""


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, int) or abs(value) < 10 ** 50 else "a huge integer"
    return text if len(text) <= 60 else text[:59] + "…"


def _int(value: Any, key: str = "value") -> int | None:
    """``value`` as an int; None when absent or not a number (the field is then unknown);
    :class:`_BadValue` when it is a number but no integer this checker can count with (an
    infinity, NaN, or beyond ±2**63)."""
    if type(value) is int and -_INT_BOUND < value < _INT_BOUND:  # the common case, fast
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        raise _BadValue(f"{key} is not an integer: {_short(value)}")
    if not -_INT_BOUND < value < _INT_BOUND:
        raise _BadValue(f"{key} is not an integer in range (beyond ±2**63)")
    return int(value)


def _scalar(value: Any, key: str) -> Any:
    """``value`` when it can key a chain (a string, a number, null); :class:`_BadValue`
    otherwise (an object or a list: ``"chainId": {"a": 1}``)."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    raise _BadValue(f"{key} is not a string or a number: {_short(value)}")


def _time(obj: Mapping[str, Any]) -> float | None:
    for key in _TIME_KEYS:
        value = obj.get(key)
        if value is None:
            continue
        if type(value) is int and -_INT_BOUND < value < _INT_BOUND:  # the common case, fast
            return float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                t = float(value)
            except OverflowError:
                t = math.inf
            if not math.isfinite(t):
                raise _BadValue(f"{key} is not a finite time: {_short(value)}")
            return t
        if isinstance(value, str) and key == "timestamp":
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000
            except (ValueError, OverflowError, OSError):
                continue
    nano = obj.get("timeUnixNano")
    if isinstance(nano, (int, str)) and not isinstance(nano, bool) and str(nano).isdigit():
        if len(str(nano)) > 30:
            raise _BadValue(f"timeUnixNano is not a time in range: {_short(nano)}")
        return int(nano) / 1e6
    return None


def _chain_key(obj: Mapping[str, Any]) -> Any:
    chain = _scalar(obj.get("chainId"), "chainId")
    if chain is None:
        return None
    session = _scalar(obj.get("sessionId", obj.get("session")), "sessionId")
    return (session, chain) if session is not None else chain


def _event(obj: Mapping[str, Any], line: int) -> Event | None:
    """The event ``obj`` (at ``line``) as the checker reads it, or None when it is none of
    those it knows; :class:`_BadValue` with ``line`` when one of its fields is unreadable."""
    try:
        return _event_at(obj, line)
    except _BadValue as exc:
        exc.line = exc.line or line
        raise


def _event_at(obj: Mapping[str, Any], line: int) -> Event | None:
    kind = obj.get("type")
    if kind == START:
        return Event(START, line, _time(obj), _chain_key(obj),
                     _int(obj.get("attempt"), "attempt"),
                     _int(obj.get("maxAttempts"), "maxAttempts"),
                     _int(obj.get("delayMs"), "delayMs"))
    if kind == END:
        success = obj.get("success")
        return Event(END, line, _time(obj), _chain_key(obj), _int(obj.get("attempt"), "attempt"),
                     success=success if isinstance(success, bool) else None,
                     end_reason=obj.get("endReason") if isinstance(obj.get("endReason"), str)
                     else None)
    if kind in _REQUEST_TYPES or kind == "turn_start":
        return Event(REQUEST, line, _time(obj))
    message = obj.get("message")
    if kind == "message" and isinstance(message, Mapping) and message.get("role") == "assistant":
        # a session log's answer: one request went out (its timestamp is when it ended)
        return Event(REQUEST, line, _time(message))
    return None


def _attrs(raw: Any) -> dict[str, Any]:
    """OTLP attributes (``[{"key", "value": {"intValue": ...}}]``) or a plain mapping."""
    if isinstance(raw, Mapping):
        return dict(raw)
    out: dict[str, Any] = {}
    for a in raw or ():
        if not isinstance(a, Mapping) or "key" not in a:
            continue
        value = a.get("value") or {}
        for k in ("intValue", "doubleValue", "boolValue", "stringValue"):
            if k in value:
                v = value[k]
                if k == "intValue":
                    try:
                        v = int(v)
                    except (TypeError, ValueError):
                        raise _BadValue(f"{a['key']} is not an integer: {_short(v)}") from None
                out[a["key"]] = v
    return out


def _span_events(span: Mapping[str, Any], line: int, n: int) -> list[Event]:
    """The chain one ``retry_chain`` span records, as start and end events;
    :class:`_BadValue` with ``line`` when one of its fields is unreadable."""
    try:
        return _span_events_at(span, line, n)
    except _BadValue as exc:
        exc.line = exc.line or line
        raise


def _span_events_at(span: Mapping[str, Any], line: int, n: int) -> list[Event]:
    attrs = _attrs(span.get("attributes"))
    chain = ("span", _scalar(attrs.get("retry.chain_id"), "retry.chain_id"), n)
    out = []
    for ev in span.get("events") or ():
        if not isinstance(ev, Mapping) or ev.get("name") != "retry_attempt":
            continue
        a = _attrs(ev.get("attributes"))
        out.append(Event(START, line, _time(ev), chain, _int(a.get("attempt"), "attempt"),
                         _int(attrs.get("retry.max_attempts"), "retry.max_attempts"),
                         _int(a.get("delayMs"), "delayMs")))
    end_time = span.get("endTimeUnixNano") or span.get("end_time")
    t_end = _time({"timeUnixNano": end_time} if not isinstance(end_time, str) or
                  end_time.isdigit() else {"timestamp": end_time})
    success = attrs.get("retry.success")
    out.append(Event(END, line, t_end, chain, _int(attrs.get("retry.attempts"), "retry.attempts"),
                     success=success if isinstance(success, bool) else None,
                     end_reason=attrs.get("retry.end_reason")))
    return out


class _LineIndex:
    """``line_of(offset)``: the 1-based line of ``text[offset]``, counted on from the previous
    offset asked, so a reader that asks in order (it does: values come in file order) scans
    each character once — linear in the log, where counting from the start for every event
    was quadratic. An earlier offset (rare) is counted again from the start. ``scanned``
    is the number of characters examined so far (the tests count the work with it)."""

    __slots__ = ("text", "offset", "line", "scanned")

    def __init__(self, text: str) -> None:
        self.text, self.offset, self.line, self.scanned = text, 0, 1, 0

    def __call__(self, offset: int) -> int:
        if offset < self.offset:
            self.offset, self.line = 0, 1
        self.line += self.text.count("\n", self.offset, offset)
        self.scanned += offset - self.offset
        self.offset = offset
        return self.line


def _objects(text: str) -> Iterator[tuple[int, int, Any]]:
    """Top-level JSON values of ``text`` (JSON lines or concatenated documents), each with
    the offsets it starts and ends at, one at a time."""
    decoder = json.JSONDecoder()
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n:
            return
        value, end = _decode(decoder, text, i)
        yield i, end, value
        i = end


def _decode(decoder: json.JSONDecoder, text: str, i: int) -> tuple[Any, int]:
    """``decoder.raw_decode(text, i)``; a number JSON allows but Python will not convert (an
    integer of more than 4300 digits) becomes :class:`_BadValue` at its line."""
    try:
        return decoder.raw_decode(text, i)
    except json.JSONDecodeError:
        raise
    except ValueError as exc:
        raise _BadValue(f"a number that is not an integer this checker can read ({exc})",
                        text.count("\n", 0, i) + 1) from None


def _array_items(text: str, start: int) -> Iterator[tuple[int, Any]]:
    """The items of the JSON array whose ``[`` is at ``start``, each with its offset."""
    decoder = json.JSONDecoder()
    i = start + 1
    while True:
        while text[i] in " \t\r\n,":
            i += 1
        if text[i] == "]":
            return
        value, end = _decode(decoder, text, i)
        yield i, value
        i = end


def _read_bounded(path: str | Path) -> bytes:
    """At most ``_MAX_BYTES + 1`` bytes of the regular file ``path``. A FIFO, a device
    (``/dev/zero``, ``/dev/urandom``), a folder or a socket is refused before a byte is read,
    and the open never blocks (``O_NONBLOCK``: a FIFO without a writer would wait forever).
    Raises :class:`EventLogError` (line 0) naming the file."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise EventLogError(path, 0, f"cannot read the event log: {exc.strerror or exc}") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS_OF_FILE if test(mode)), "a special file")
            raise EventLogError(path, 0, f"{kind}, not a file: an event log must be a regular file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            return fh.read(_MAX_BYTES + 1)
    except OSError as exc:
        raise EventLogError(path, 0, f"cannot read the event log: {exc.strerror or exc}") from exc
    finally:
        if fd >= 0:
            os.close(fd)


_KINDS_OF_FILE = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                  (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"),
                  (stat.S_ISSOCK, "a socket"))


def read_events(path: str | Path) -> tuple[str, list[Event]]:
    """``(format, events)`` of the log at ``path``, in log order.

    Raises :class:`EventLogError` naming the file (and the line) when it cannot be read (a
    FIFO, a device or a folder is refused before a byte is read; at most 256 MiB + 1 byte
    is read), is not JSON, holds a value the checker cannot read (``"attempt": 1e400``,
    ``"chainId": {...}``, an integer of thousands of digits: "not an integer"), or holds no
    event this checker knows.
    """
    try:
        return _read_events(path)
    except _BadValue as exc:
        raise EventLogError(path, exc.line, str(exc)) from None
    except (TypeError, ValueError, OverflowError, AttributeError, KeyError,
            IndexError) as exc:
        if isinstance(exc, EventLogError):
            raise
        raise EventLogError(path, 0, f"a value the checker cannot read "
                                     f"({type(exc).__name__}: {str(exc)[:200]})") from None


def _read_events(path: str | Path) -> tuple[str, list[Event]]:
    raw = _read_bounded(path)
    if len(raw) > _MAX_BYTES:
        raise EventLogError(path, 0, f"larger than {_MAX_BYTES >> 20} MiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise EventLogError(path, line, f"not UTF-8 text: {exc.reason}") from None

    line_of = _LineIndex(text)
    try:
        return _events_of(path, text, line_of)
    except json.JSONDecodeError as exc:
        raise EventLogError(path, exc.lineno, f"not JSON ({exc.msg})") from None
    except RecursionError:
        raise EventLogError(path, 0, "JSON nested too deeply") from None


def _events_of(path: str | Path, text: str, line_of: _LineIndex) -> tuple[str, list[Event]]:
    """The events of ``text``, its values decoded one at a time (never all held at once)."""
    values = _objects(text)
    head = [v for v in (next(values, None), next(values, None)) if v is not None]
    if len(head) == 1 and isinstance(head[0][2], (dict, list)):
        found = _document(text, head[0][2], line_of)
        if found is not None:
            return found
    events: list[Event] = []
    spans = 0
    for offset, end, obj in itertools.chain(head, values):
        if not isinstance(obj, Mapping):
            continue
        if obj.get("name") == "retry_chain":
            events += _span_events(obj, line_of(offset), spans)
            spans += 1
            continue
        if "resourceSpans" in obj:
            fmt, more = _otlp(text, offset, end, obj, line_of, spans)
            events += more
            spans += len({e.chain for e in more})
            continue
        ev = _event(obj, line_of(offset))
        if ev is not None:
            events.append(ev)
    if not events:
        raise EventLogError(path, 0, "no retry events, requests or retry_chain spans found "
                                     "(expected JSON lines of events, a conformance trace or "
                                     "an OpenTelemetry export)")
    first = head[0][2] if head else None
    if isinstance(first, Mapping) and first.get("type") == "session":
        return "session log", events
    return ("opentelemetry spans" if spans else "JSON lines of events"), events


def _document(text: str, doc: Any, line_of) -> tuple[str, list[Event]] | None:
    """A single JSON document: a conformance trace, ``{"pi": {"events"}}``, OTLP, a list."""
    def items(key: str) -> list[tuple[int, Any]] | None:
        m = re.search(r'"%s"\s*:\s*\[' % re.escape(key), text)
        return list(_array_items(text, m.end() - 1)) if m else None

    if isinstance(doc, dict) and isinstance(doc.get("timeline"), list):
        found = items("timeline") or []
        return "conformance trace (timeline)", [e for off, obj in found if isinstance(obj, dict)
                                                for e in [_event(obj, line_of(off))] if e]
    if isinstance(doc, dict) and "resourceSpans" in doc:
        return _otlp(text, 0, len(text), doc, line_of, 0)
    if isinstance(doc, dict) and any(isinstance(v, dict) and isinstance(v.get("events"), list)
                                     for v in doc.values()):
        found = items("events") or []
        return "conformance events", [e for off, obj in found if isinstance(obj, dict)
                                      for e in [_event(obj, line_of(off))] if e]
    if isinstance(doc, dict) and isinstance(doc.get("events"), list):
        found = items("events") or []
        return "events document", [e for off, obj in found if isinstance(obj, dict)
                                   for e in [_event(obj, line_of(off))] if e]
    if isinstance(doc, list):
        out: list[Event] = []
        spans = 0
        for off, obj in _array_items(text, text.index("[")):
            if isinstance(obj, dict) and obj.get("name") == "retry_chain":
                out += _span_events(obj, line_of(off), spans)
                spans += 1
            elif isinstance(obj, dict):
                ev = _event(obj, line_of(off))
                if ev:
                    out.append(ev)
        return ("opentelemetry spans" if spans else "list of events"), out
    return None


_SPAN_NAME = re.compile(r'"name"\s*:\s*"retry_chain"')


def _otlp(text: str, base: int, end: int, doc: Mapping, line_of,
          first: int) -> tuple[str, list[Event]]:
    """An OTLP JSON export (``text[base:end]``): each ``retry_chain`` span, with the line of
    its ``"name"``."""
    events: list[Event] = []
    n = first
    positions = [m.start() - base for m in _SPAN_NAME.finditer(text, base, end)]
    k = 0
    for rs in doc.get("resourceSpans") or ():
        for ss in (rs or {}).get("scopeSpans") or ():
            for span in (ss or {}).get("spans") or ():
                if not isinstance(span, Mapping) or span.get("name") != "retry_chain":
                    continue
                line = line_of(base + positions[k]) if k < len(positions) else line_of(base)
                k += 1
                events += _span_events(span, line, n)
                n += 1
    return "opentelemetry (OTLP JSON)", events


# ----------------------------------------------------------------------------- checking

def _session(key: Any) -> Any:
    return key[0] if isinstance(key, tuple) and key[:1] != ("span",) else None


@dataclass(slots=True)
class _Chain:
    key: Any
    line: int
    attempt: int
    max_attempts: int | None
    started: int = 1
    backoff_until: float | None = None
    backoff_line: int = 0


def check(events: list[Event], path: str = "", fmt: str = "") -> EventsReport:
    """Reconstruct the chains of ``events`` and report every violation (see the module doc)."""
    report = EventsReport(path, fmt, events=len(events),
                          retry_events=sum(e.kind != REQUEST for e in events),
                          times=any(e.t_ms is not None for e in events))
    bad = report.violations
    open_chains: dict[Any, _Chain] = {}
    backing: dict[Any, _Chain] = {}  # the open chains with a backoff scheduled
    by_session: dict[Any, set[Any]] = {}  # session -> its open chains' keys
    ended: set[Any] = set()
    current: Any = None  # the key of the chain without chainId, when events carry none
    sequence = 0

    def close(chain: _Chain, why: str) -> None:
        bad.append(Violation("unended", chain.line, f"the chain started here (attempt "
                                                    f"{chain.attempt}) never ended: {why}"))

    def drop(key: Any) -> _Chain | None:
        """Remove the open chain ``key`` (and its indexes); each event costs O(1) so a log
        of any number of sessions is checked in linear time."""
        chain = open_chains.pop(key, None)
        if chain is not None:
            backing.pop(key, None)
            by_session.get(_session(key), set()).discard(key)
        return chain

    for e in events:
        if e.kind == REQUEST:
            for chain in sorted(backing.values(), key=lambda c: c.line):  # in start order
                if (chain.backoff_until is not None and e.t_ms is not None
                        and e.t_ms < chain.backoff_until - 0.5):
                    left = chain.backoff_until - e.t_ms
                    bad.append(Violation("request_in_backoff", e.line,
                                         f"a request {left:.1f} ms before the end of the backoff "
                                         f"scheduled at line {chain.backoff_line}"))
                chain.backoff_until = None
            backing.clear()
            continue
        key = e.chain
        if e.kind == START:
            if key is None:
                if e.attempt == 1 or current is None or current not in open_chains:
                    sequence += 1
                    key = ("seq", sequence)
                else:
                    key = current
            chain = open_chains.get(key)
            if chain is None:
                # one session runs one chain at a time: a new chain leaves the last one unended
                if e.chain is None and current in open_chains:
                    close(drop(current), f"a new chain starts at line {e.line}")
                elif e.chain is not None:
                    for other in sorted(by_session.get(_session(key), ()), key=lambda k: open_chains[k].line):
                        close(drop(other), f"a new chain starts at line {e.line}")
                if key in ended:
                    bad.append(Violation("attempt", e.line, f"chain {key!r} starts again after "
                                                           "it ended"))
                if e.attempt != 1:
                    bad.append(Violation("attempt", e.line, f"a chain's first attempt is "
                                                           f"{e.attempt}, not 1"))
                chain = open_chains[key] = _Chain(key, e.line, e.attempt or 0, e.max_attempts)
                by_session.setdefault(_session(key), set()).add(key)
                report.chains += 1
            else:
                if e.attempt != chain.attempt + 1:
                    bad.append(Violation("attempt", e.line, f"attempt {e.attempt} after attempt "
                                                           f"{chain.attempt} (they count up by one)"))
                if e.max_attempts is not None and chain.max_attempts is not None \
                        and e.max_attempts != chain.max_attempts:
                    bad.append(Violation("attempt", e.line, f"maxAttempts changed from "
                                                           f"{chain.max_attempts} to "
                                                           f"{e.max_attempts} inside a chain"))
                chain.attempt = e.attempt or 0
                chain.started += 1
            limit = e.max_attempts if e.max_attempts is not None else chain.max_attempts
            if e.attempt is not None and limit is not None and not 1 <= e.attempt <= limit:
                bad.append(Violation("attempt", e.line, f"attempt {e.attempt} is outside 1.."
                                                       f"{limit} (maxAttempts)"))
            if e.t_ms is not None and e.delay_ms is not None:
                chain.backoff_until, chain.backoff_line = e.t_ms + e.delay_ms, e.line
                backing[key] = chain
            current = key
            continue
        # an end
        if key is None:
            key = current if current in open_chains else None
        chain = drop(key) if key is not None else None
        if chain is None:
            if e.attempt == 0:
                report.refusals += 1  # a refusal at rest: no chain started
            elif key is not None and key in ended:
                bad.append(Violation("end_without_start", e.line,
                                     f"a second auto_retry_end of chain {key!r}"))
            else:
                bad.append(Violation("end_without_start", e.line,
                                     f"auto_retry_end (attempt {e.attempt}) without a start; only "
                                     "a refusal at rest (attempt 0) ends what never started"))
            continue
        ended.add(key)
        if e.attempt is not None and e.attempt != chain.attempt:
            bad.append(Violation("attempt", e.line, f"the end names attempt {e.attempt}, the last "
                                                   f"start was attempt {chain.attempt}"))
    for chain in open_chains.values():
        close(chain, "the log ends without its auto_retry_end")
    bad.sort(key=lambda v: v.line)
    return report


def check_file(path: str | Path) -> EventsReport:
    """:func:`read_events` then :func:`check`; raises :class:`EventLogError` as it does."""
    fmt, events = read_events(path)
    return check(events, str(path), fmt)


def format_violations(reports: list[EventsReport]) -> str:
    """Text: one line per violation (``FILE:LINE: kind: what happened``), then a summary per
    log with what the checker could and could not see."""
    out = []
    for r in reports:
        for v in r.violations:
            out.append(f"{r.path}:{v.line}: {v.kind}: {v.message}")
    for r in reports:
        timed = "" if r.times else "; no times, so requests during a backoff cannot be checked"
        if not r.retry_events:
            timed += "; no retry events (auto_retry_start / auto_retry_end), so no chain to check"
        verdict = "no violation" if r.ok else f"{len(r.violations)} violation" + \
            ("s" if len(r.violations) > 1 else "")
        out.append(f"{r.path} ({r.format}): {r.events} events, {r.chains} chains, "
                   f"{r.refusals} refusals at rest: {verdict}{timed}")
    return "\n".join(out) + "\n"
