"""Text that comes from outside (a provider, a user's settings, a key) made safe to keep.

Four small, pure helpers used wherever such text is written to an event, the runtime context,
the session log, a store or stderr:

- :func:`clean_text` makes any ``str`` encodable as UTF-8: a UTF-16 surrogate pair that arrived
  split (``"\\ud83d"`` then ``"\\ude00"``, as two JSON ``\\u`` escapes in two stream deltas) is
  joined into its character, and a surrogate that has no partner becomes U+FFFD.
- :class:`StreamJoiner` does the same for a stream of deltas, holding back half a pair
  until the next delta brings the other half.
- :func:`clip_text` keeps a bounded excerpt of a long text (an error body of 10 MB): its head,
  a marker naming how much was left out, and its tail, at most ``limit_bytes`` UTF-8 bytes in
  all, never cutting a character in two (``docs/policy.md §8b.10``: error text kept in events,
  the runtime context and the log is clipped to 8 KB).
- :func:`scrub_secrets` replaces credentials in a text with :data:`REDACTED` (it lives in
  :mod:`fsm.core.redact`, the one scrubbing layer, and is re-exported here).
- :func:`safe_error_text` is the three in one for an error text (clean, scrub, clip), at a
  cost that does not grow with the text.
- :func:`check_api_key` refuses an API key that cannot go into an HTTP header (a trailing CR
  from a file with Windows line endings, a space, a line feed, a non-ASCII character) with an
  error that names where the key came from and what is wrong with it, never the key.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

from fsm.core.redact import MIN_SECRET_LENGTH, REDACTED, scrub_secrets  # the one scrubbing layer

__all__ = ["ApiKeyError", "CLIP_LIMIT_BYTES", "REDACTED", "StreamJoiner", "check_api_key",
           "clean_text", "clip_text", "safe_error_text",
           "safe_message", "scrub_secrets"]

CLIP_LIMIT_BYTES = 8192
"""The default bound of :func:`clip_text`, in UTF-8 bytes (``docs/policy.md §8b.10``)."""

_MIN_CLIP_BYTES = 64


def clean_text(s: str) -> str:
    """``s`` with split surrogate pairs joined and lone surrogates replaced by U+FFFD.

    Python strings may hold surrogate code points (U+D800–U+DFFF) that UTF-8 cannot encode;
    ``json.loads`` produces them from ``\\u`` escapes. A high surrogate directly followed by a
    low one is the UTF-16 encoding of one character and becomes that character; any other
    surrogate becomes U+FFFD. Every other character is kept, so ``clean_text(s) == s`` for
    text that already encodes. Linear time; a fast path returns ``s`` itself when it has no
    surrogate. Raises ``TypeError`` when ``s`` is not a ``str``.
    """
    if not isinstance(s, str):
        raise TypeError(f"clean_text expects a str, got {type(s).__name__}")
    if s.isascii():  # the common case, at memory speed
        return s
    try:
        s.encode("utf-8")  # C speed; fails exactly when a surrogate is present
        return s
    except UnicodeEncodeError:
        pass
    # UTF-16 with surrogatepass writes each surrogate as its own code unit; decoding pairs
    # them up again and turns what stays unpaired into U+FFFD.
    return s.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


class StreamJoiner:
    """Cleans a stream of text deltas without breaking a character split across two of them.

    ``feed(delta)`` returns the clean text that can be shown now: a high surrogate at the end
    of a delta is held back until the next delta says whether its partner follows. ``flush()``
    returns what is held back (U+FFFD for a lone half) at the end of the stream. The
    concatenation of every answer equals ``clean_text`` of the concatenated deltas.
    """

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = ""

    def feed(self, delta: str) -> str:
        """The clean text of ``pending + delta``, minus a trailing high surrogate (kept)."""
        text = self._pending + delta
        if text and "\ud800" <= text[-1] <= "\udbff":
            self._pending, text = text[-1], text[:-1]
        else:
            self._pending = ""
        return clean_text(text)

    def flush(self) -> str:
        """What was held back, cleaned; the joiner is empty afterwards."""
        text, self._pending = self._pending, ""
        return clean_text(text)


def _head(s: str, budget: int) -> str:
    """The longest prefix of ``s`` whose UTF-8 encoding fits in ``budget`` bytes."""
    piece = s[:budget]  # a character takes at least one byte
    if piece and "\ud800" <= piece[-1] <= "\udbff":
        piece = piece[:-1]  # half of a pair at the cut: leave it out
    return clean_text(piece).encode("utf-8")[:budget].decode("utf-8", "ignore")


def _tail(s: str, budget: int) -> str:
    """The longest suffix of ``s`` whose UTF-8 encoding fits in ``budget`` bytes."""
    piece = s[-budget:] if budget else ""
    if piece and "\udc00" <= piece[0] <= "\udfff":
        piece = piece[1:]
    data = clean_text(piece).encode("utf-8")
    data = data[len(data) - budget:] if len(data) > budget else data
    return data.decode("utf-8", "ignore")


def clip_text(s: str, limit_bytes: int = CLIP_LIMIT_BYTES) -> str:
    """A bounded excerpt of ``s``: at most ``limit_bytes`` bytes once encoded as UTF-8.

    A text that fits is returned whole (cleaned by :func:`clean_text`). A longer one becomes
    its head (about two thirds of the room), the marker ``"\\n[… N characters clipped …]\\n"``
    and its tail (the rest of the room): an error body usually says what went wrong at its
    start and sometimes at its end. Cuts fall between characters, never inside one (nor
    inside a surrogate pair). The result always encodes as UTF-8. Reads only the first and
    last ``limit_bytes`` characters of a longer text, so a 40 MB body costs microseconds.
    Raises ``ValueError`` for ``limit_bytes`` below 64 (no room for the marker) and
    ``TypeError`` when ``s`` is not a ``str``.
    """
    if not isinstance(s, str):
        raise TypeError(f"clip_text expects a str, got {type(s).__name__}")
    if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes < _MIN_CLIP_BYTES:
        raise ValueError(f"limit_bytes must be an integer of at least {_MIN_CLIP_BYTES}, got {limit_bytes!r}")
    if len(s) * 4 <= limit_bytes:  # at most 4 bytes per character: fits whatever it holds
        return clean_text(s)
    if len(s) <= limit_bytes:
        cleaned = clean_text(s)
        if len(cleaned.encode("utf-8")) <= limit_bytes:
            return cleaned
    return _excerpt(s, s, len(s), limit_bytes)


def _excerpt(head_src: str, tail_src: str, total: int, limit_bytes: int) -> str:
    """Head of ``head_src``, marker, tail of ``tail_src`` (each at least ``limit_bytes`` long
    or the whole text), ``total`` characters in the text they came from."""
    # The marker's number is at most total; reserve room for it before choosing the cuts.
    room = limit_bytes - len(f"\n[… {total} characters clipped …]\n".encode("utf-8"))
    head = _head(head_src, room * 2 // 3)
    tail = _tail(tail_src, room - len(head.encode("utf-8")))
    left_out = max(0, total - len(head) - len(tail))
    return f"{head}\n[… {left_out} characters clipped …]\n{tail}"


def safe_error_text(s: str, secrets: Iterable[str | None] = (),
                    limit_bytes: int = CLIP_LIMIT_BYTES) -> str:
    """An error text as it may be kept in an event, the runtime context or a log.

    The same as ``clip_text(scrub_secrets(s, secrets), limit_bytes)`` — cleaned, credentials
    replaced, at most ``limit_bytes`` UTF-8 bytes (``docs/policy.md §8b.10``) — but its cost
    does not grow with the text: only the first and last ``2 × limit_bytes`` characters of a
    long text are scrubbed, which is all the excerpt can show (a secret cut at such a window's
    edge lies beyond what is kept). The marker's count is then approximate by the length
    difference of the secrets replaced. Errors as :func:`clip_text`.
    """
    if not isinstance(s, str):
        raise TypeError(f"safe_error_text expects a str, got {type(s).__name__}")
    window = 2 * limit_bytes if isinstance(limit_bytes, int) else 0
    if len(s) <= 4 * window:
        return clip_text(scrub_secrets(s, secrets), limit_bytes)
    secrets = tuple(secrets)
    head_src = scrub_secrets(s[:window], secrets)
    tail_src = scrub_secrets(s[-window:], secrets)
    clip_text("", limit_bytes)  # the same checks of limit_bytes
    return _excerpt(head_src, tail_src, len(s), limit_bytes)


class ApiKeyError(ValueError):
    """An API key that cannot be sent; ``source`` names where it came from (never the key)."""

    def __init__(self, source: str, problem: str) -> None:
        super().__init__(f"{source}: the API key {problem}")
        self.source = source
        self.problem = problem


_NAMES = {"\r": "a carriage return (CR)", "\n": "a line feed (LF)", "\t": "a tab",
          " ": "a space"}


def _describe(ch: str) -> str:
    return _NAMES.get(ch) or (f"the control character U+{ord(ch):04X}" if ch.isascii()
                              else f"a non-ASCII character (U+{ord(ch):04X})")


def check_api_key(key: str | None, source_name: str) -> str | None:
    """Return ``key`` unchanged when it can be sent in an HTTP header; ``None`` passes through.

    ``source_name`` says where the key came from (``"--api-key"``, ``"OPENAI_API_KEY"``, a
    file) and starts the message. Raises :class:`ApiKeyError` (a ``ValueError``) for an empty
    key, one with leading or trailing whitespace (a line break copied from a file), a space,
    tab or line break inside, another control character, or a non-ASCII character (HTTP
    header values are ASCII; ``httpx`` refuses the rest and its error shows the whole header,
    key included). The message names the problem and its position, never the key, e.g.
    ``OPENAI_API_KEY: the API key ends with a carriage return (CR); remove it (was the key
    read from a file with Windows line endings?)``.
    """
    if key is None:
        return None
    if not isinstance(key, str):
        raise ApiKeyError(source_name, f"must be text, got {type(key).__name__}")
    if not key:
        raise ApiKeyError(source_name, "is empty")
    if key != key.strip():
        where = "ends" if key[-1].isspace() else "starts"
        ch = key[-1] if where == "ends" else key[0]
        hint = " (was the key read from a file with Windows line endings?)" if ch == "\r" else ""
        raise ApiKeyError(source_name, f"{where} with {_describe(ch)}; remove it{hint}")
    for position, ch in enumerate(key, 1):
        if not ch.isascii() or not ch.isprintable() or ch == " ":
            raise ApiKeyError(source_name, f"contains {_describe(ch)} at character {position} "
                                           f"of {len(key)}; an API key is printable ASCII without spaces")
    return key



def safe_message(message: Any, secrets: Iterable[str | None] = ()) -> Any:
    """An assistant message as it may be kept in an event, the context or a log: its text
    cleaned (:func:`clean_text`), its ``error_message`` made safe (:func:`safe_error_text`:
    credentials scrubbed, clipped to 8 KB), its ``error_type`` / ``error_code`` and each
    header value scrubbed and clipped to 256 bytes (``docs/policy.md §8b.10``). Returns the
    message itself when nothing changed, else a copy (``dataclasses.replace``). Works on any
    dataclass with those fields (:class:`fsm.core.messages.AssistantMessage`)."""
    secrets = tuple(secrets)
    changes: dict[str, Any] = {}
    text = getattr(message, "text", None)
    if isinstance(text, str) and text:
        kept = clean_text(text)
        if kept is not text:
            changes["text"] = kept
    for name, limit in (("error_message", CLIP_LIMIT_BYTES), ("error_type", 256), ("error_code", 256)):
        value = getattr(message, name, None)
        if isinstance(value, str):
            kept = safe_error_text(value, secrets, limit_bytes=limit)
            if kept != value:
                changes[name] = kept
    headers = getattr(message, "headers", None)
    if headers:
        kept_headers = {k: safe_error_text(str(v), secrets, limit_bytes=256) for k, v in headers.items()}
        if kept_headers != dict(headers):
            changes["headers"] = kept_headers
    return dataclasses.replace(message, **changes) if changes else message
