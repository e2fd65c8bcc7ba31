"""The persisted session log: JSON lines, one entry per message.

The runtime context drops a failed assistant message before a retry; this log never does
(``docs/policy.md §3``, invariant "persisted history keeps every failed message"). The first
line is a header ``{"type": "session", "version": 1, "id", "timestamp"}``; each message is
``{"type": "message", "message": {...}}`` in the wire shape of :mod:`fsm.core.messages`.

What a provider sends can never make a write fail: every string of an entry goes through
:func:`fsm.core.text.clean_text` (a split surrogate pair joined, a lone one replaced), and an
error text (``errorMessage``) is scrubbed of credentials and clipped to 8 KB
(``docs/policy.md §8b.10``) before it is written. A log is created with mode 0600 (it holds a
conversation). A file left with a torn last line (a process killed during a write) is repaired
on open by starting on a fresh line, and :meth:`SessionLog.scan` skips torn lines and reports
them, keeping every entry after them.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from fsm.core.messages import AssistantMessage, UserMessage
from fsm.core.text import CLIP_LIMIT_BYTES, clean_text, safe_error_text

__all__ = ["LogContents", "SessionLog", "TornLineWarning", "clean_entry"]

_ERROR_FIELDS = frozenset({"errorMessage", "finalError"})
_ENTRY_START = '{"type": '
_RECOVERY_TRIES = 64


class TornLineWarning(UserWarning):
    """A session-log line that is not a JSON entry (a write cut short) was skipped."""


def clean_entry(value: Any, secrets: Iterable[str] = (), *, _key: str | None = None) -> Any:
    """A copy of a JSON value that always encodes as UTF-8, with error texts bounded.

    Every string (keys too) goes through :func:`fsm.core.text.clean_text`; the value of an
    ``errorMessage`` or ``finalError`` field is also scrubbed of ``secrets`` and key-shaped
    tokens and clipped to 8 KB (:func:`fsm.core.text.safe_error_text`). Other types are kept.
    """
    if isinstance(value, str):
        if _key in _ERROR_FIELDS:
            return safe_error_text(value, secrets, CLIP_LIMIT_BYTES)
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(str(k)): clean_entry(v, secrets, _key=str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_entry(v, secrets) for v in value]
    return value


@dataclass
class LogContents:
    """What :meth:`SessionLog.scan` read: the ``entries`` (dicts, in file order) and the
    1-based numbers of the ``torn_lines`` it skipped."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    torn_lines: list[int] = field(default_factory=list)


def _decode(line: bytes) -> tuple[list[Any], bool]:
    """The entries of one line and whether a torn fragment was found in it.

    A log written before fresh-line repair may hold a fragment with a whole entry glued to its
    end (``{"type": "mess{"type": "message", ...}``): the entry is recovered.
    """
    text = line.decode("utf-8", "replace").strip()
    if not text:
        return [], False
    decoder = json.JSONDecoder()
    try:
        obj = json.loads(text)
    except ValueError:
        pass
    else:
        return ([obj], False) if isinstance(obj, dict) else ([], True)
    # Entries start with '{"type": '; a few tries bound the work on a long garbage line.
    start = text.find(_ENTRY_START, 1)
    for _ in range(_RECOVERY_TRIES):
        if start == -1:
            break
        try:
            obj, end = decoder.raw_decode(text, start)
        except ValueError:
            pass
        else:
            if end == len(text) and isinstance(obj, dict):
                return [obj], True
        start = text.find(_ENTRY_START, start + 1)
    return [], True


class SessionLog:
    """Append-only JSON-lines log at ``path`` (parent folders created). Each line is flushed.

    ``secrets`` (optional) are scrubbed from error texts besides the key-shaped tokens that
    :func:`fsm.core.text.scrub_secrets` always finds. A new file is created with mode 0600; an
    existing file keeps its mode. Raises ``OSError`` when the file cannot be opened or written;
    never because of the text of a message.
    """

    def __init__(self, path: str | Path, session_id: str, *, secrets: Iterable[str] = ()) -> None:
        self.path = Path(path)
        self.secrets = tuple(s for s in secrets if s)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        self._fh = os.fdopen(fd, "ab+")
        size = os.fstat(fd).st_size
        if size:
            self._fh.seek(size - 1)
            if self._fh.read(1) != b"\n":
                # A writer was killed mid-line: the next entry must not be glued onto it.
                self._fh.write(b"\n")
                self._fh.flush()
        else:
            self._write({"type": "session", "version": 1, "id": session_id,
                         "timestamp": int(time.time() * 1000)})

    def _write(self, entry: dict[str, Any]) -> None:
        line = json.dumps(clean_entry(entry, self.secrets), ensure_ascii=False) + "\n"
        self._fh.write(line.encode("utf-8"))
        self._fh.flush()

    def append(self, message: UserMessage | AssistantMessage) -> None:
        """Write ``message`` as one entry (cleaned, error text scrubbed and clipped)."""
        self._write({"type": "message", "message": message.to_json()})

    def close(self) -> None:
        """Flush, fsync and close; closing twice is harmless."""
        if not self._fh.closed:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()

    @staticmethod
    def scan(path: str | Path) -> LogContents:
        """Read a whole log: its entries and the numbers of the torn lines it skipped.

        A line that is not a JSON entry (a write cut short by a kill) is skipped and its number
        listed in ``torn_lines``; a whole entry glued after such a fragment is still recovered.
        Raises ``OSError`` when the file cannot be read.
        """
        out = LogContents()
        with open(path, "rb") as fh:
            for number, line in enumerate(fh, 1):
                entries, torn = _decode(line)
                out.entries.extend(entries)
                if torn:
                    out.torn_lines.append(number)
        return out

    @staticmethod
    def read(path: str | Path) -> Iterator[dict[str, Any]]:
        """Yield the entries of a log file, skipping torn lines.

        Each skipped line is reported with a :class:`TornLineWarning` naming ``path:line``
        (use :meth:`scan` to get the numbers as data).
        """
        contents = SessionLog.scan(path)
        for number in contents.torn_lines:
            warnings.warn(f"{path}:{number}: skipped a torn line (not a JSON entry)",
                          TornLineWarning, stacklevel=2)
        yield from contents.entries
