"""The JSON-lines RPC server: one :class:`~fsm.session.AgentSession` behind stdin/stdout.

Framing is the original's (pi's ``--mode rpc``): one JSON object per line, lines split on
``\\n`` only, a trailing ``\\r`` stripped, U+2028/U+2029 never treated as line breaks (so no
``str.splitlines``). Output is compact JSON, one object per line; U+2028/U+2029 inside strings
are written as ``\\u2028``/``\\u2029`` escapes so that no reader can split a line on them.

Commands (an optional ``id`` of any JSON string or number is echoed in the response)::

    {"type": "prompt", "message": "...", "streamingBehavior": "steer" | "followUp"}
    {"type": "abort"}            {"type": "abort_retry"}
    {"type": "set_auto_retry", "enabled": true}
    {"type": "get_state"}

Responses: ``{"id"?, "type": "response", "command", "success": true, "data"?}`` or
``{"id"?, "type": "response", "command", "success": false, "error": "<what was wrong>"}``.
Bad input of any kind (invalid UTF-8, invalid JSON, a non-object, an unknown command, a missing
or wrongly typed field, a message with a lone surrogate escape such as ``"\\ud800"``, an id
too large to echo, a line longer than :data:`MAX_LINE_BYTES`) gets an error response and the
server keeps serving. Once it stops (EOF, SIGTERM), prompts still waiting behind an abort are
refused and no new model request leaves (:class:`ProviderGate`). Every session event is
written as it happens (SPEC §4).

The pure parts (:class:`LineFramer`, :func:`parse_command`, :func:`encode_line`) do no I/O;
:class:`RpcServer` dispatches parsed commands to a session; :func:`serve` is the process shell
(stdin reader, stdout writer, signals, shutdown).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import select
import threading
import time
from typing import Any, Callable, NamedTuple

log = logging.getLogger("fsm.rpc")

MAX_LINE_BYTES = 16 * 1024 * 1024
"""Longest accepted command line (bytes, without the newline); longer lines are discarded
while they stream in, so memory stays bounded, and answered with an error."""

READ_CHUNK = 1 << 16
PIPE_CHUNK = 4096  # a pipe that polls writable takes this much without blocking (one page)
STALL_S = 1.0      # how long a stopping server waits for a client that does not read stdout

COMMAND_FIELDS: dict[str, dict[str, tuple[str, bool]]] = {
    # command: {field: (expected, required)}; expected names a checker in _CHECKS.
    "prompt": {"message": ("string", True), "streamingBehavior": ("streaming_behavior", False)},
    "abort": {},
    "abort_retry": {},
    "set_auto_retry": {"enabled": ("boolean", True)},
    "get_state": {},
}
"""The protocol's commands and their fields; other fields are ignored (the original sends
some, such as ``images``, that this project does not use)."""

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
    """A response object in the original's shape (``id`` first when there is one)."""
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


def parse_command(line: bytes | LineTooLong) -> Command | CommandError | None:
    """Turn one input line into a :class:`Command` or a :class:`CommandError` (pure).

    Returns None for a blank line (ignored, as the original does). Errors name what was wrong
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
        obj = json.loads(text, parse_constant=_reject_constant)
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
    spec = COMMAND_FIELDS.get(kind)
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
    all-ASCII encoding. NaN and infinities are written as null, so the line stays JSON.
    """
    try:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=_json_default,
                          allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(obj), ensure_ascii=False, separators=(",", ":"),
                          default=_json_default)
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


class Output:
    """Writes protocol lines to a file descriptor, whole lines only, in call order.

    Writes happen on the event loop's thread, so events and responses keep their emission
    order. Each piece is written only once ``poll`` says the descriptor has room, in pieces of
    at most :data:`PIPE_CHUNK` bytes, so a client that stops reading cannot wedge the process
    for good: once ``should_stop()`` is true (EOF on stdin, SIGTERM) and nothing could be
    written for :data:`STALL_S` seconds, the output is abandoned. When the reader has gone
    (``EPIPE``) or the output is abandoned, ``on_closed`` is called once and later lines are
    dropped.
    """

    def __init__(self, fd: int, on_closed: Callable[[], None] | None = None,
                 should_stop: Callable[[], bool] = lambda: False) -> None:
        self.fd = fd
        self.closed = False
        self.lines = 0
        self._on_closed = on_closed
        self._should_stop = should_stop
        self._poll = None
        if hasattr(select, "poll"):
            self._poll = select.poll()
            self._poll.register(fd, select.POLLOUT)

    def send(self, obj: Any) -> None:
        self.write(encode_line(obj))

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        view = memoryview(data)
        last_progress = time.monotonic()
        try:
            while view:
                if self._poll is not None and not self._poll.poll(200):
                    if self._should_stop() and time.monotonic() - last_progress > STALL_S:
                        raise TimeoutError(f"stdout not read for {STALL_S:.0f} s while stopping")
                    continue
                try:
                    n = os.write(self.fd, view[:PIPE_CHUNK] if self._poll is not None else view)
                except BlockingIOError:  # O_NONBLOCK set by the parent, and the pipe is full
                    continue
                view = view[n:]
                last_progress = time.monotonic()
        except OSError as exc:  # EPIPE, EBADF, or the TimeoutError above
            self.closed = True
            log.warning("stdout closed (%s); events and responses are dropped from now on", exc)
            if self._on_closed is not None:
                self._on_closed()
            return
        self.lines += 1


# ---------------------------------------------------------------------------------- dispatch
class RpcServer:
    """Serves the protocol's commands on ``session``, writing through ``output``.

    Events of the session are forwarded as they are emitted (synchronously, so they keep
    their order relative to responses). Call :meth:`handle` for each input line; it never
    raises for bad input and never waits for a turn, so ``get_state`` is answered at any time.
    """

    def __init__(self, session: Any, output: Output) -> None:
        self.session = session
        self.output = output
        self._tasks: set[Any] = set()
        self._control: Any = None  # the last abort (and prompts queued behind it)
        self._held: list[dict[str, Any]] = []  # events held back while a prompt is answered
        self._holding = 0
        self._answered: set[Any] = set()
        self._stopping = False  # set by shutdown(): prompts not started yet are refused
        self._unsubscribe = session.subscribe(self._on_event)

    def _on_event(self, event: dict[str, Any]) -> None:
        if self._holding:
            self._held.append(event)
        else:
            self.output.send(event)

    def _respond(self, cmd: Command, success: bool = True, *, data: Any = None,
                 error: str | None = None) -> None:
        self.output.send(response(cmd.type, success, data=data, error=error, id=cmd.id,
                                  has_id=cmd.has_id))

    def _spawn(self, coro: Any) -> Any:
        import asyncio
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: Any) -> None:
        self._tasks.discard(task)
        if task in self._answered:  # its failure went back to the client as the response
            self._answered.discard(task)
            return
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("background task failed: %s", exc, exc_info=exc)

    async def handle(self, line: bytes | LineTooLong) -> None:
        """Parse and serve one input line (bad input gets an error response)."""
        parsed = parse_command(line)
        if parsed is None:
            return
        if isinstance(parsed, CommandError):
            self.output.send(parsed.response())
            return
        try:
            await getattr(self, "_cmd_" + parsed.type)(parsed)
        except Exception as exc:  # a command must never take the server down
            log.exception("command %s failed", parsed.type)
            self._respond(parsed, False, error=f"{parsed.type} failed: {type(exc).__name__}: {exc}")

    async def _cmd_get_state(self, cmd: Command) -> None:
        self._respond(cmd, data=self.session.state())

    async def _cmd_set_auto_retry(self, cmd: Command) -> None:
        self.session.set_auto_retry_enabled(cmd.fields["enabled"])
        self._respond(cmd)

    async def _cmd_abort_retry(self, cmd: Command) -> None:
        self.session.abort_retry()
        self._respond(cmd)

    async def _cmd_abort(self, cmd: Command) -> None:
        # The response comes when the turn has stopped; other commands are served meanwhile,
        # and a prompt sent after the abort waits for it (see _cmd_prompt).
        previous = self._control

        async def run() -> None:
            await _settle(previous)
            try:
                await self.session.abort()
            except Exception as exc:
                log.exception("abort failed")
                self._respond(cmd, False, error=f"abort failed: {type(exc).__name__}: {exc}")
            else:
                self._respond(cmd)
        self._control = self._spawn(run())

    async def _cmd_prompt(self, cmd: Command) -> None:
        previous = self._control
        if previous is not None and not previous.done():
            async def run() -> None:
                await _settle(previous)
                if self._stopping:
                    # The input ended (or SIGTERM) while this prompt waited for an abort: the
                    # client is gone, so no new turn (and no request to the model) is started.
                    self._respond(cmd, False, error="prompt not sent: the server is shutting down")
                    return
                await self._start_prompt(cmd)
            self._control = self._spawn(run())
            return
        await self._start_prompt(cmd)

    async def _start_prompt(self, cmd: Command) -> None:
        import asyncio
        # One loop tick runs prompt() up to its first real wait: by then it has either refused
        # (busy, bad input), queued the message, or started the turn. The turn goes on in the
        # background; the response does not wait for it. As in the original, the response
        # comes before the turn's first events (agent_start, the user's message_end): they are
        # held back for that tick, in order, and written right after it.
        self._holding += 1
        try:
            task = self._spawn(self.session.prompt(
                cmd.fields["message"], streaming_behavior=cmd.fields.get("streamingBehavior")))
            await asyncio.sleep(0)
            if task.done() and not task.cancelled() and task.exception() is not None:
                exc = task.exception()
                self._answered.add(task)
                error = str(exc) or type(exc).__name__
                from ..session import SessionBusyError
                if isinstance(exc, SessionBusyError):
                    error += ' (over RPC: add "streamingBehavior": "steer" or "followUp")'
                self._respond(cmd, False, error=error)
            else:
                self._respond(cmd)
        finally:
            self._holding -= 1
            if not self._holding:
                held, self._held = self._held, []
                for event in held:
                    self.output.send(event)

    async def shutdown(self, grace_s: float = 0.8) -> None:
        """Cancel any backoff, stop a running turn, wait (bounded) for the prompt tasks, close
        the session. Events emitted meanwhile (the ``auto_retry_end`` of a cancelled chain) are
        still written if stdout is open."""
        import asyncio
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        self._stopping = True
        session = self.session
        try:
            if session.is_retrying:
                session.abort_retry()
            await asyncio.wait_for(session.abort(), max(0.05, deadline - loop.time()))
        except (asyncio.TimeoutError, Exception) as exc:
            log.warning("shutdown: abort did not finish cleanly: %r", exc)
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            _, still = await asyncio.wait(pending, timeout=max(0.05, deadline - loop.time()))
            for task in still:
                task.cancel()
            if still:
                await asyncio.wait(still, timeout=0.2)
        try:
            await asyncio.wait_for(session.close(), 0.5)
        except (asyncio.TimeoutError, Exception) as exc:
            log.warning("shutdown: session.close() did not finish cleanly: %r", exc)
        self._unsubscribe()


async def _settle(task: Any) -> None:
    """Wait for ``task`` (if any), whatever its outcome."""
    import asyncio
    if task is None or task.done():
        return
    try:
        await asyncio.shield(task)
    except BaseException:  # its own handler reports its failure; we only wait for it
        if asyncio.current_task().cancelling():  # type: ignore[union-attr]
            raise


# ---------------------------------------------------------------------------------- provider
class DeferredProvider:
    """Stands in for a provider whose module is slow to import (the ``openai`` SDK: ~0.7 s).

    ``factory()`` runs in a background thread once :meth:`start` is called; :meth:`complete` waits
    for it, then delegates. ``name`` and ``model`` are known up front, so the session (and
    ``get_state``) works before the import is done. If the factory fails, each turn ends with
    an error message naming the failure (a provider never raises).
    """

    def __init__(self, factory: Callable[[], Any], *, name: str, model: str) -> None:
        import concurrent.futures
        self.name = name
        self.model = model
        self._factory = factory
        self._future: concurrent.futures.Future = concurrent.futures.Future()
        self._lock = threading.Lock()
        self._started = False

    def start(self) -> None:
        """Begin loading in the background (idempotent)."""
        with self._lock:
            if self._started:
                return
            self._started = True
        # Not a daemon: a daemon thread still importing when the interpreter shuts down
        # crashes it (SIGSEGV on the freed import lock). Shutdown waits for the import
        # instead, which costs at most its remaining ~0.7 s, and only in the first second.
        threading.Thread(target=self._load, name="fsm-rpc-provider-load", daemon=False).start()

    def _load(self) -> None:
        try:
            provider = self._factory()
        except BaseException as exc:  # reported by complete(), and logged here
            log.error("cannot load the provider: %s: %s", type(exc).__name__, exc)
            self._future.set_exception(exc)
        else:
            self._future.set_result(provider)

    @property
    def loaded(self) -> Any:
        """The real provider, or None while it loads (or when it failed)."""
        if self._future.done() and self._future.exception() is None:
            return self._future.result()
        return None

    async def provider(self) -> Any:
        """The real provider, once loaded (raises what the factory raised)."""
        import asyncio
        self.start()
        if not self._future.done():
            # shield: a cancelled turn must not cancel the shared load.
            await asyncio.shield(asyncio.wrap_future(self._future))
        return self._future.result()

    async def complete(self, messages: list[dict], *, on_text: Callable[[str], None] | None = None,
                       api_key: str | None = None) -> Any:
        try:
            provider = await self.provider()
        except Exception as exc:
            from ..messages import AssistantMessage
            return AssistantMessage("error", error_message=f"cannot load the model client: "
                                    f"{type(exc).__name__}: {exc}", model=self.model)
        return await provider.complete(messages, on_text=on_text, api_key=api_key)

    async def aclose(self) -> None:
        provider = self.loaded
        if provider is not None and hasattr(provider, "aclose"):
            await provider.aclose()


class ProviderGate:
    """The session's provider inside :func:`serve`: forwards to ``provider`` until :meth:`close`.

    Once the server stops (EOF on stdin, SIGTERM, stdout gone) no new request may leave: a turn
    that starts then (a follow-up the session still had queued when the running turn was
    aborted) ends at once as aborted, with its events, instead of calling the model for a
    client that is gone.
    """

    def __init__(self, provider: Any) -> None:
        self.provider = provider
        self.closed = False

    @property
    def name(self) -> str:
        return self.provider.name

    @property
    def model(self) -> str:
        return self.provider.model

    def close(self) -> None:
        self.closed = True

    async def complete(self, messages: list[dict], *, on_text: Callable[[str], None] | None = None,
                       api_key: str | None = None) -> Any:
        if self.closed:
            from ..messages import AssistantMessage
            return AssistantMessage("aborted", error_message="Request was aborted: the RPC server "
                                    "is shutting down", model=self.model)
        return await self.provider.complete(messages, on_text=on_text, api_key=api_key)


# ---------------------------------------------------------------------------------- process
class StdinReader:
    """Reads ``fd`` and hands its frames to the event loop, with a bounded backlog.

    Pipes, sockets and terminals are watched by the loop itself (``add_reader``: no thread
    hand-off between a line's arrival and its answer). Anything the loop cannot watch (a
    regular file, ``/dev/null``) is read by a daemon thread instead. Either way at most
    ``max_pending`` frames wait (plus what one read chunk holds); reading pauses beyond that.
    :meth:`get` returns the next frame (``bytes`` or :class:`LineTooLong`), or None at EOF.
    """

    _EOF = object()

    def __init__(self, fd: int, loop: Any, *, limit: int = MAX_LINE_BYTES, max_pending: int = 64) -> None:
        import asyncio
        import queue
        self.fd = fd
        self._loop = loop
        self._framer = LineFramer(limit)
        self._max_pending = max_pending
        self._frames: queue.Queue = queue.Queue()
        self._wakeup = asyncio.Event()
        self._closed = threading.Event()
        self.eof = threading.Event()
        """Set once stdin has ended."""
        self._watching = False  # the loop watches fd (else the thread reads it)
        self._paused = False

    def start(self) -> "StdinReader":
        try:
            self._loop.add_reader(self.fd, self._on_readable)
            self._watching = True
        except (OSError, ValueError, NotImplementedError):  # EPERM: a regular file
            threading.Thread(target=self._run, name="fsm-rpc-stdin", daemon=True).start()
        return self

    def close(self) -> None:
        """Stop delivering frames (a reader thread may stay blocked in ``read`` until exit)."""
        self._closed.set()
        if self._watching and not self._paused:
            self._loop.remove_reader(self.fd)
        self._watching = False

    # -- the loop watches fd
    def _on_readable(self) -> None:
        try:
            data = os.read(self.fd, READ_CHUNK)  # readable: returns at once, even if blocking
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.warning("cannot read stdin (%s): treating it as closed", exc)
            data = b""
        if data:
            frames = self._framer.feed(data)
        else:
            frames = self._framer.close()
            self._loop.remove_reader(self.fd)
            self._watching = False
            self.eof.set()
            frames.append(self._EOF)
        for frame in frames:
            self._frames.put_nowait(frame)
        if self._watching and self._frames.qsize() >= self._max_pending:
            self._loop.remove_reader(self.fd)
            self._paused = True
        self._wakeup.set()

    # -- a thread reads fd
    def _run(self) -> None:
        try:
            while not self._closed.is_set():
                try:
                    data = os.read(self.fd, READ_CHUNK)
                except BlockingIOError:
                    select.select([self.fd], [], [], 1.0)
                    continue
                except InterruptedError:
                    continue
                except OSError as exc:
                    log.warning("cannot read stdin (%s): treating it as closed", exc)
                    data = b""
                if not data:
                    for frame in self._framer.close():
                        self._put(frame)
                    break
                for frame in self._framer.feed(data):
                    self._put(frame)
        finally:
            self.eof.set()
            self._put(self._EOF)

    def _put(self, frame: Any) -> None:
        while self._frames.qsize() >= self._max_pending and not self._closed.is_set():
            time.sleep(0.005)  # the loop drains the backlog; this only bounds it
        self._frames.put(frame)
        try:
            self._loop.call_soon_threadsafe(self._wakeup.set)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._closed.set()

    # -- both
    def hung_up(self) -> bool:
        """Stdin has ended, or its writer has closed it with lines still unread (``POLLHUP``)."""
        if self.eof.is_set():
            return True
        if not hasattr(select, "poll"):
            return False
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        return any(flags & select.POLLHUP for _, flags in poller.poll(0))

    @property
    def idle(self) -> bool:
        """No frame is waiting to be served."""
        return self._frames.empty()

    async def get(self) -> bytes | LineTooLong | None:
        import queue
        while True:
            try:
                frame = self._frames.get_nowait()
            except queue.Empty:
                self._wakeup.clear()
                try:
                    frame = self._frames.get_nowait()
                except queue.Empty:
                    await self._wakeup.wait()
                    continue
            if self._paused and self._frames.qsize() < self._max_pending // 2 and not self._closed.is_set():
                self._paused = False
                self._loop.add_reader(self.fd, self._on_readable)
            return None if frame is self._EOF else frame


class ServeConfig(NamedTuple):
    """What :func:`serve` needs: the session's parts, and where the protocol lines go.

    ``session_file`` may contain ``{id}`` (replaced by the session id); None: no session log.
    ``session_kwargs`` go to :class:`~fsm.session.AgentSession` (e.g. a compaction hook).
    """

    provider: Any
    settings: Any = None
    context_window: int = 0
    session_file: str | None = None
    trace_file: str | None = None
    stdin_fd: int = 0
    stdout_fd: int = 1
    session_kwargs: dict[str, Any] | None = None


async def serve(config: ServeConfig) -> int:
    """Run the RPC server until EOF on stdin, SIGTERM/SIGINT, or stdout closing. Returns 0.

    Shutdown cancels any backoff (its ``auto_retry_end`` is still written), stops a running
    turn, closes the session log and the trace within about a second.
    """
    import asyncio
    import signal
    import uuid

    from ..session import AgentSession
    from ..session_log import SessionLog

    loop = asyncio.get_running_loop()
    session_id = uuid.uuid4().hex
    session_log = None
    if config.session_file is not None:
        path = config.session_file.replace("{id}", session_id)
        session_log = SessionLog(path, session_id)
    gate = ProviderGate(config.provider)
    session = AgentSession(gate, settings=config.settings,
                           context_window=config.context_window, session_log=session_log,
                           session_id=session_id, **(config.session_kwargs or {}))
    trace = None
    if config.trace_file is not None:
        from ..audit import TraceWriter
        trace = TraceWriter(config.trace_file, model=session.brain)

    stopping = asyncio.Event()
    signalled = threading.Event()

    def stop(reason: str) -> None:
        if not stopping.is_set():
            log.info("stopping: %s", reason)
            stopping.set()

    def on_signal(signum: int, frame: Any) -> None:
        # A plain handler rather than loop.add_signal_handler: it also runs while the loop's
        # thread waits in Output.write for a client that does not read, and lets it give up.
        signalled.set()
        loop.call_soon_threadsafe(stop, signal.Signals(signum).name)

    reader = StdinReader(config.stdin_fd, loop)
    output = Output(config.stdout_fd, on_closed=lambda: stop("stdout closed"),
                    should_stop=lambda: signalled.is_set() or reader.hung_up())
    server = RpcServer(session, output)
    reader.start()
    previous_handlers = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            previous_handlers[sig] = signal.signal(sig, on_signal)
        except ValueError:  # not the main thread: the caller handles signals
            pass

    start_provider = getattr(config.provider, "start", None)
    # The SDK import competes for the GIL with the first commands: start it once the input
    # that is already waiting (typically the client's readiness get_state) has been served.
    preload = loop.call_later(0.05, start_provider) if start_provider else None

    async def dispatch() -> None:
        while True:
            frame = await reader.get()
            if frame is None:
                stop("end of input")
                return
            await server.handle(frame)
            if preload is not None and reader.idle:
                start_provider()

    dispatcher = loop.create_task(dispatch())
    stop_wait = loop.create_task(stopping.wait())
    try:
        await asyncio.wait({dispatcher, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (dispatcher, stop_wait):
            task.cancel()
        await asyncio.wait({dispatcher, stop_wait}, timeout=0.2)
        reader.close()
        if preload is not None:
            preload.cancel()
        gate.close()
        await server.shutdown()
        provider_close = getattr(config.provider, "aclose", None)
        if provider_close is not None:
            try:
                await asyncio.wait_for(provider_close(), 0.3)
            except (asyncio.TimeoutError, Exception) as exc:
                log.debug("provider close: %r", exc)
        if trace is not None:
            trace.close()
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
    return 0
