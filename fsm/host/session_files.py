"""A session with what is opened for it: its log and its transition trace, opened together.

The front ends (``python -m fsm rpc``, ``chat``, ``demo``) build their session here::

    from fsm import RetrySettings
    from fsm.host.session_files import open_session
    from fsm.testing import ScriptedProvider, error, ok

    provider = ScriptedProvider([error("529 overloaded_error"), ok("hello")])
    parts = open_session(provider, settings=RetrySettings(base_delay_ms=10),
                         log_path=".fsm/sessions/{id}.jsonl",
                         trace_file="trace.jsonl")                      # OSError when unwritable
    outcome = await parts.session.prompt("hi")                          # one retry, then "hello"
    await parts.aclose()                                                # session, log, trace
    assert parts.log_path.exists() and outcome is not None

A start that fails leaves nothing behind: the files and folders it created are removed again.
"""

from __future__ import annotations

import os
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SessionParts", "open_session", "check_output", "file_kind"]

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str:
    """What a file of ``mode`` (``os.stat``'s ``st_mode``) is, in words ("a FIFO (named pipe)", "a folder", ...)."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")



@dataclass
class SessionParts:
    """A session with what was opened for it: ``log_path`` (None: no log) and ``trace`` (a
    :class:`~fsm.review.audit.TraceWriter` or None). :meth:`aclose` closes all three."""

    session: Any
    log_path: Path | None
    trace: Any

    async def aclose(self) -> None:
        try:
            await self.session.close()
        finally:
            if self.trace is not None:
                self.trace.close()


def check_output(path: Path, what: str) -> None:
    """``OSError`` naming ``path`` when it exists and is not a regular file (a FIFO would
    block the start, ``/dev/zero`` swallows a log, a folder cannot be one)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise OSError(f"{what} {path} is {file_kind(mode)}, not a file")


def remove_made(made: list[Path]) -> None:
    """Remove what a start that failed created: the file, then its new folders (when empty)."""
    for p in reversed(made):
        try:
            p.rmdir() if p.is_dir() else p.unlink()
        except OSError:
            pass


def open_session(provider: Any, *, settings: Any = None, context_window: int = 0,
                 session_id: str | None = None, log_path: str | Path | None = None,
                 trace_file: str | Path | None = None, credentials: Any = None,
                 **session_kwargs: Any) -> SessionParts:
    """Build an :class:`~fsm.host.session.AgentSession` with its log and its trace.

    ``log_path`` may contain ``{id}`` (replaced by the session id, a new UUID hex when
    ``session_id`` is None); None writes no log. ``trace_file`` None writes no trace. The other
    keyword arguments go to the session. Raises ``OSError`` when the log or the trace cannot be
    opened, or one of them exists and is not a regular file (nothing is left open then, and
    the files and folders this call created are removed again).
    """
    from fsm.host.session import AgentSession
    from fsm.host.session_log import SessionLog

    session_id = session_id or uuid.uuid4().hex
    path = None
    session_log = None
    made: list[Path] = []  # what this call created, removed again when it cannot start
    if log_path is not None:
        path = Path(str(log_path).replace("{id}", session_id))
        check_output(path, "session log")
        made = [p for p in reversed(path.parents) if not p.exists()]
        if not path.exists():
            made.append(path)
        secrets = [k for k in (getattr(provider, "api_key", None), getattr(provider, "_api_key", None))
                   if isinstance(k, str) and k]
        try:
            session_log = SessionLog(path, session_id, secrets=secrets)
        except OSError:
            remove_made(made)
            raise
    trace = None
    try:
        if trace_file is not None:
            check_output(Path(trace_file), "trace file")
        session = AgentSession(provider, settings=settings, context_window=context_window,
                               session_log=session_log, session_id=session_id,
                               credentials=credentials, **session_kwargs)
        if trace_file is not None:
            from fsm.review.audit import TraceWriter
            trace = TraceWriter(trace_file, model=session.brain, clock=session.clock)
    except BaseException:
        if session_log is not None:
            session_log.close()
        remove_made(made)
        raise
    return SessionParts(session, path, trace)
