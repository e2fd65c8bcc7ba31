"""The RPC line protocol, sans-IO: framing, command parsing, responses and encoding.

Framing is pi's (the coding agent of the npm package ``@mariozechner/pi-coding-agent``, its
``--mode rpc``): one JSON object per line, lines split on
``\\n`` only, a trailing ``\\r`` stripped, U+2028/U+2029 never treated as line breaks (so no
``str.splitlines``). Output is compact JSON, one object per line; U+2028/U+2029 inside strings
are written as ``\\u2028``/``\\u2029`` escapes so that no reader can split a line on them.

Commands (an optional ``id`` of any JSON string or number is echoed in the response):

.. code-block:: text

    {"type": "prompt", "message": "...", "streamingBehavior": "steer" | "followUp"}
    {"type": "steer", "message": "..."}      {"type": "follow_up", "message": "..."}
    {"type": "abort"}            {"type": "abort_retry"}       {"type": "retry_now"}
    {"type": "set_auto_retry", "enabled": true}
    {"type": "get_state"}        {"type": "get_messages"}

The other commands of pi's protocol (:data:`NOT_IMPLEMENTED`) parse, and are answered
``success: false`` saying that this server does not implement them.

Responses: ``{"id"?, "type": "response", "command", "success": true, "data"?}`` or
``{"id"?, "type": "response", "command", "success": false, "error": "<what was wrong>"}``.
Bad input of any kind (invalid UTF-8, invalid JSON, a non-object, an unknown command, a missing
or wrongly typed field, a message with a lone surrogate escape such as ``"\\ud800"``, an id
too large to echo, a line longer than :data:`MAX_LINE_BYTES`) becomes a :class:`CommandError`.

Used by both ends: the server (:mod:`fsm.rpc.dispatch`, :mod:`fsm.rpc.transport`) and
:class:`fsm.rpc.client.RpcClient`. Nothing here does I/O.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Callable, NamedTuple

from fsm.core.redact import contains_secret, scrub_value

__all__ = [
    "COMMAND_FIELDS", "Command", "CommandError", "LineFramer", "LineTooLong", "MAX_LINE_BYTES",
    "IGNORED_TYPES", "NOT_IMPLEMENTED", "STREAMING_BEHAVIORS", "encode_line", "parse_command", "response",
]

MAX_LINE_BYTES = 16 * 1024 * 1024
"""Longest accepted command line (bytes, without the newline); longer lines are discarded
while they stream in, so memory stays bounded, and answered with an error."""

COMMAND_FIELDS: dict[str, dict[str, tuple[str, bool]]] = {
    # command: {field: (expected, required)}; expected names a checker in _CHECKS.
    "prompt": {"message": ("string", True), "streamingBehavior": ("streaming_behavior", False)},
    "abort": {},
    "abort_retry": {},
    "set_auto_retry": {"enabled": ("boolean", True)},
    "get_state": {},
    "steer": {"message": ("string", True)},
    "follow_up": {"message": ("string", True)},
    "get_messages": {},
    "get_last_assistant_text": {},
    "retry_now": {},
}
"""The protocol's commands and their fields; other fields are ignored (pi's
client sends some, such as ``images``, that this project does not use)."""

NOT_IMPLEMENTED: frozenset[str] = frozenset({
    "new_session", "set_model", "cycle_model", "get_available_models", "set_thinking_level",
    "cycle_thinking_level", "set_steering_mode", "set_follow_up_mode", "compact",
    "set_auto_compaction", "bash", "abort_bash", "get_session_stats", "export_html",
    "switch_session", "fork", "clone", "get_fork_messages", "set_session_name", "get_commands",
})
"""Commands of pi's protocol that this server does not implement: each is
answered ``success: false`` with an error saying so (and the id echoed, so a client that
waits for the answer gets it at once)."""

IGNORED_TYPES: frozenset[str] = frozenset({"extension_ui_response"})
"""Input lines that are answers to the server, not commands: no extension here asks for user
input, so they are dropped without a response (as pi drops an answer
nobody waits for)."""

STREAMING_BEHAVIORS = ("steer", "followUp")


def _is_text(value: Any) -> bool:
    """A string that can be sent on: no lone surrogate (a ``"\\ud800"`` escape is valid JSON
    but no UTF-8 text, so no provider or session log could ever carry it)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "string": (_is_text, "a string"),
    "boolean": (lambda v: isinstance(v, bool), "true or false"),
    "streaming_behavior": (lambda v: v in STREAMING_BEHAVIORS, '"steer" or "followUp"'),
}

# Best effort only: lets an error about an unparseable line still carry the id the client sent.
_ID_RE = re.compile(rb'"id"\s*:\s*("(?:[^"\\\r\n]|\\.){0,200}"|-?\d{1,20}(?:\.\d+)?)')


# ---------------------------------------------------------------------------------- framing
class LineTooLong(NamedTuple):
    """A line longer than the limit; ``size`` bytes were discarded, ``head`` is its start."""

    size: int
    limit: int
    head: bytes


class LineFramer:
    """Split a byte stream into lines on ``\\n`` only, with a bounded buffer (sans-IO).

    :meth:`feed` returns the complete lines (``bytes`` without the ``\\n`` and without one
    trailing ``\\r``) and :class:`LineTooLong` markers, in order. A line over ``limit`` bytes is
    dropped as it arrives: at most ``limit`` bytes (plus one read chunk) are ever held.
    :meth:`close` returns the final line when the stream ended without a newline.
    """

    HEAD = 4096

    def __init__(self, limit: int = MAX_LINE_BYTES) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1 byte, got {limit}")
        self.limit = limit
        self._buf = bytearray()
        self._discarded = 0  # > 0 while skipping the rest of a too-long line
        self._head = b""

    def feed(self, data: bytes) -> list[bytes | LineTooLong]:
        out: list[bytes | LineTooLong] = []
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                self._absorb(data[start:])
                return out
            self._absorb(data[start:nl])
            out.append(self._take())
            start = nl + 1

    def close(self) -> list[bytes | LineTooLong]:
        if self._buf or self._discarded:
            return [self._take()]
        return []

    def _absorb(self, piece: bytes) -> None:
        if not piece:
            return
        if self._discarded:
            self._discarded += len(piece)
            return
        self._buf += piece
        if len(self._buf) > self.limit:
            self._head = bytes(self._buf[:self.HEAD])
            self._discarded = len(self._buf)
            self._buf = bytearray()

    def _take(self) -> bytes | LineTooLong:
        if self._discarded:
            marker = LineTooLong(self._discarded, self.limit, self._head)
            self._discarded, self._head = 0, b""
            return marker
        line = bytes(self._buf)
        self._buf.clear()
        return line[:-1] if line.endswith(b"\r") else line


# ---------------------------------------------------------------------------------- parsing
class Command(NamedTuple):
    """A valid command: ``type``, its ``fields`` (the whole object) and the id, if one came."""

    type: str
    fields: dict[str, Any]
    id: Any = None
    has_id: bool = False


class CommandError(NamedTuple):
    """A line that is not a valid command; :meth:`response` is what the client gets."""

    command: str
    error: str
    id: Any = None
    has_id: bool = False

    def response(self) -> dict[str, Any]:
        return response(self.command, False, error=self.error, id=self.id, has_id=self.has_id)


def response(command: str, success: bool, *, data: Any = None, error: str | None = None,
             id: Any = None, has_id: bool = False) -> dict[str, Any]:
    """A response object in pi's shape (``id`` first when there is one)."""
    out: dict[str, Any] = {"id": id} if has_id else {}
    out.update(type="response", command=command, success=success)
    if data is not None:
        out["data"] = data
    if error is not None:
        out["error"] = error
    return out


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(value), type(value).__name__)


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _guess_id(raw: bytes) -> tuple[Any, bool]:
    match = _ID_RE.search(raw[:LineFramer.HEAD])
    if match is None:
        return None, False
    try:
        return json.loads(match.group(1)), True
    except ValueError:
        return None, False


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list) -> dict:
    """``json.loads`` hook: a key given twice is refused (the last would silently win)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key[:80])
        out[key] = value
    return out


def parse_command(line: bytes | LineTooLong) -> Command | CommandError | None:
    """Turn one input line into a :class:`Command` or a :class:`CommandError` (pure).

    Returns None for a blank line (ignored, as pi does) and for the
    :data:`IGNORED_TYPES`. Errors name what was wrong
    and, where one can be read, carry the line's ``id``.
    """
    if isinstance(line, LineTooLong):
        id_, has_id = _guess_id(line.head)
        return CommandError("parse", f"line too long: {line.size} bytes, the limit is {line.limit} "
                            "bytes; the line was discarded", id_, has_id)
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        id_, has_id = _guess_id(line)
        return CommandError("parse", f"invalid UTF-8 at byte {exc.start} (0x{line[exc.start]:02x}); "
                            "each command must be one line of UTF-8 JSON", id_, has_id)
    if not text.strip():
        return None
    try:
        obj = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        return CommandError("parse", f"duplicate key {exc.key!r} in the command: each field once",
                            *_guess_id(line))
    except RecursionError:
        return CommandError("parse", "invalid JSON: nested too deeply", *_guess_id(line))
    except ValueError as exc:
        return CommandError("parse", f"invalid JSON: {exc}", *_guess_id(line))
    if not isinstance(obj, dict):
        return CommandError("parse", f"a command must be a JSON object, got {_type_name(obj)}")
    has_id = "id" in obj
    id_ = obj.get("id")
    if has_id and (isinstance(id_, (bool, dict, list))):
        return CommandError(obj["type"] if isinstance(obj.get("type"), str) else "parse",
                            f"field \"id\" must be a string or a number, got {_type_name(id_)}")
    if has_id and isinstance(id_, float) and not math.isfinite(id_):
        # 1e400 parses as infinity, which cannot be echoed as JSON.
        return CommandError(obj["type"] if isinstance(obj.get("type"), str) else "parse",
                            "field \"id\" must be a finite number, got one too large for a double")
    known = ", ".join(sorted(COMMAND_FIELDS))
    if "type" not in obj:
        return CommandError("parse", f"missing field \"type\" (one of: {known})", id_, has_id)
    kind = obj["type"]
    if not isinstance(kind, str):
        return CommandError("parse", f"field \"type\" must be a string (one of: {known}), "
                            f"got {_type_name(kind)} {_shown(kind)}", id_, has_id)
    if kind in IGNORED_TYPES:
        return None
    spec = COMMAND_FIELDS.get(kind)
    if kind in NOT_IMPLEMENTED:
        return CommandError(kind, f"command {kind!r} is not implemented by this server "
                            f"(it implements: {known})", id_, has_id)
    if spec is None:
        return CommandError(kind, f"unknown command {_shown(kind)} (known: {known})", id_, has_id)
    for name, (expected, required) in spec.items():
        check, wanted = _CHECKS[expected]
        if name not in obj:
            if required:
                return CommandError(kind, f"{kind}: missing field \"{name}\" ({wanted})", id_, has_id)
            continue
        if not (obj[name] is None and not required) and not check(obj[name]):
            value = obj[name]
            if isinstance(value, str) and expected == "string":
                where = next(i for i, c in enumerate(value) if 0xD800 <= ord(c) <= 0xDFFF)
                return CommandError(kind, f"{kind}: field \"{name}\" must be Unicode text, got a lone "
                                    f"surrogate \\u{ord(value[where]):04x} at character {where}",
                                    id_, has_id)
            return CommandError(kind, f"{kind}: field \"{name}\" must be {wanted}, got "
                                f"{_type_name(value)} {_shown(value)}", id_, has_id)
    return Command(kind, obj, id_, has_id)


# ---------------------------------------------------------------------------------- output
def _json_default(value: Any) -> Any:
    to_json = getattr(value, "to_json", None)
    if callable(to_json):
        return to_json()
    return str(value)


def encode_line(obj: Any) -> bytes:
    """One protocol line: compact UTF-8 JSON, U+2028/U+2029 escaped, ``\\n`` at the end.

    Strings that cannot be UTF-8 (lone surrogates from a ``"\\ud800"`` escape) fall back to an
    all-ASCII encoding. NaN and infinities are written as null, so the line stays JSON. Every
    string of the line goes through the scrubbing layer (:func:`fsm.core.redact.scrub_secrets`:
    the registered secrets and key shapes become ``[redacted]``); a line without any costs
    one scan.
    """
    try:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=_json_default,
                          allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(obj), ensure_ascii=False, separators=(",", ":"),
                          default=_json_default)
    if contains_secret(text):  # rare: scrub the strings only, never a number
        text = json.dumps(scrub_value(json.loads(text)), ensure_ascii=False, separators=(",", ":"))
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        data = json.dumps(json.loads(text), ensure_ascii=True, separators=(",", ":")).encode("ascii")
    return data + b"\n"


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj

