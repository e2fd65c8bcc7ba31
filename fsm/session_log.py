"""The persisted session log: JSON lines, one entry per message.

The runtime context drops a failed assistant message before a retry; this log never does
(SPEC §3 invariant "persisted history keeps every failed message"). The first line is a header
``{"type": "session", "version": 1, "id", "timestamp"}``; each message is
``{"type": "message", "message": {...}}`` in the wire shape of :mod:`fsm.messages`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterator

from .messages import AssistantMessage, UserMessage


class SessionLog:
    """Append-only JSON-lines log at ``path`` (parent folders created). Each line is flushed."""

    def __init__(self, path: str | Path, session_id: str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        self._fh = open(self.path, "a", encoding="utf-8")
        if fresh:
            self._write({"type": "session", "version": 1, "id": session_id,
                         "timestamp": int(time.time() * 1000)})

    def _write(self, entry: dict[str, Any]) -> None:
        self._fh.write(json.dumps(entry, ensure_ascii=False) + "\n")
        self._fh.flush()

    def append(self, message: UserMessage | AssistantMessage) -> None:
        self._write({"type": "message", "message": message.to_json()})

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()

    @staticmethod
    def read(path: str | Path) -> Iterator[dict[str, Any]]:
        """Yield the entries of a log file (raises ``ValueError`` naming a malformed line)."""
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except ValueError as exc:
                        raise ValueError(f"{path}:{number}: not a JSON line ({exc})") from None
