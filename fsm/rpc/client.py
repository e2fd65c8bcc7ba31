"""An asyncio client for ``python -m fsm rpc``: starts the server, sends commands, streams events.

.. skip: next "a shape of a client session: it starts a server subprocess and reads an endless event stream"

::

    async with RpcClient(["--base-url", url, "--model", "m", "--no-session"]) as client:
        await client.prompt("hi")
        await client.wait_for_idle()          # never returns during a backoff
        async for event in client.events():   # every event, retry events included (docs/policy.md §8 item 10)
            ...

Every request has a timeout (:class:`RpcTimeout`); a ``success: false`` response raises
:class:`RpcError` with the server's message; a server that exits or is killed raises
:class:`ServerDied` (with its exit status and the tail of its stderr) in every pending request,
in the next request and in the event iterator, instead of hanging. Events are buffered from the
start and never dropped: consume them, or they accumulate.
"""

from __future__ import annotations

import asyncio
import codecs
import itertools
import json
import logging
import os
import sys
import time
from typing import Any, AsyncIterator, Callable, Mapping, Sequence

from fsm.rpc.protocol import LineFramer, LineTooLong, encode_line

__all__ = ["RpcClient", "RpcError", "RpcTimeout", "ServerDied"]

log = logging.getLogger("fsm.rpc.client")

_END = object()
_MAX_EVENT_LINE = 1 << 28  # a 10 MB prompt comes back in message_end and agent_end


class RpcError(Exception):
    """A command failed: the server answered ``success: false`` (``response`` holds the whole
    response, ``command`` its command), or the client cannot reach the server."""

    def __init__(self, message: str, *, command: str | None = None,
                 response: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.command = command
        self.response = dict(response) if response is not None else None


class RpcTimeout(RpcError, TimeoutError):
    """No response to a command within its timeout (the server may be stuck or overloaded)."""


class ServerDied(RpcError):
    """The server process exited (or closed its stdout) before the client closed it.

    ``returncode`` is its exit status (negative: killed by that signal; None: still running with
    stdout closed); ``stderr_tail`` the last few KB of its stderr.
    """

    def __init__(self, returncode: int | None, stderr_tail: str, waiting_for: str | None = None) -> None:
        what = f" while waiting for the response to {waiting_for}" if waiting_for else ""
        status = "closed its stdout" if returncode is None else f"exited with status {returncode}"
        tail = stderr_tail.strip()
        message = f"the RPC server {status}{what}"
        message += f"; its stderr ends with:\n{tail}" if tail else " (nothing on stderr)"
        super().__init__(message, command=waiting_for)
        self.returncode = returncode
        self.stderr_tail = stderr_tail


class RpcClient:
    """Runs ``[python, "-m", "fsm", "rpc", *args]`` and speaks its protocol.

    Args:
        args: the server's arguments after ``rpc`` (``--base-url``, ``--model``, ...).
        timeout_s: default time limit of one request, in seconds.
        start_timeout_s: time limit of :meth:`start` (process start to the first ``get_state``).
        python: the interpreter (default: this one).
        env, cwd: for the subprocess (``env`` None: inherit).
        stderr: a callable given each chunk of the server's stderr (decoded), e.g.
            ``sys.stderr.write``; None keeps only the tail for :class:`ServerDied`.
        stderr_tail_bytes: how much of stderr is kept for error messages.
        record: keep every event in :attr:`received` as well (handy in tests).
        close_grace_s: how long :meth:`close` waits after EOF before SIGTERM (then SIGKILL).

    Use ``async with RpcClient(...)`` or :meth:`start` / :meth:`close`.
    """

    DEATH_WAIT_S = 2.0
    """How long a server that closed its stdout gets to exit before it is reported dead."""

    IDLE_POLL_S = 0.02
    """Shortest interval between two ``get_state`` checks of :meth:`wait_for_idle`."""

    max_line_bytes = _MAX_EVENT_LINE
    """Longest stdout line read; a longer one is dropped with a warning (set before start())."""

    def __init__(self, args: Sequence[str] = (), *, timeout_s: float = 10.0,
                 start_timeout_s: float = 30.0, python: str | None = None,
                 env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
                 stderr: Callable[[str], Any] | None = None, stderr_tail_bytes: int = 8192,
                 record: bool = False, close_grace_s: float = 2.0) -> None:
        if isinstance(args, str):
            raise TypeError("args must be a sequence of strings, e.g. ['--model', 'm'], not one string")
        self.args = [str(a) for a in args]
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.python = python or sys.executable
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.record = record
        self.close_grace_s = close_grace_s
        self.received: list[dict[str, Any]] = []
        """Every event, in order (only with ``record=True``)."""
        self.noise: list[bytes] = []
        """stdout lines that were not protocol JSON (there should be none)."""
        self.ready_ms: float | None = None
        """Process start to the first ``get_state`` answer, in ms (set by :meth:`start`)."""
        self._stderr_cb = stderr
        self._tail_limit = stderr_tail_bytes
        self._tail = bytearray()
        self._proc: asyncio.subprocess.Process | None = None
        self._ids = itertools.count(1)
        self._pending: dict[str, tuple[asyncio.Future, str]] = {}
        self._events: asyncio.Queue = asyncio.Queue()
        self._activity = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._closing = False
        self._death: ServerDied | None = None
        self._write_lock = asyncio.Lock()

    # ------------------------------------------------------------------ lifecycle
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode if self._proc is not None else None

    @property
    def stderr_tail(self) -> str:
        return self._tail.decode("utf-8", "replace")

    async def start(self) -> "RpcClient":
        """Start the server and wait for its first ``get_state`` answer (sets :attr:`ready_ms`).

        Raises :class:`ServerDied` when it exits first (bad arguments: the message carries its
        stderr), :class:`RpcTimeout` after ``start_timeout_s``, :class:`RpcError` when it cannot
        be spawned.
        """
        if self._proc is not None:
            raise RpcError("this client was already started")
        t0 = time.perf_counter()
        try:
            self._proc = await asyncio.create_subprocess_exec(
                self.python, "-m", "fsm", "rpc", *self.args, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=self.env,
                cwd=self.cwd)
        except OSError as exc:
            raise RpcError(f"cannot start the RPC server ({self.python} -m fsm rpc): {exc}") from exc
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._read_stdout()), loop.create_task(self._read_stderr())]
        try:
            await self.get_state(timeout_s=self.start_timeout_s)
        except BaseException:
            await self.close()
            raise
        self.ready_ms = (time.perf_counter() - t0) * 1000
        return self

    async def __aenter__(self) -> "RpcClient":
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> int | None:
        """End the server: EOF on its stdin, wait ``close_grace_s``, then SIGTERM, then SIGKILL.

        Pending requests fail with :class:`RpcError`; the event iterator ends. Idempotent.
        Returns the exit status.
        """
        proc = self._proc
        if proc is None:
            return None
        self._closing = True
        if proc.returncode is None and proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.close()
        for signal_it, wait_s in ((None, self.close_grace_s), (proc.terminate, 1.0), (proc.kill, 5.0)):
            if proc.returncode is not None:
                break
            if signal_it is not None:
                signal_it()  # returncode is None: the child is not reaped, so its pid is valid
            await asyncio.wait({asyncio.ensure_future(proc.wait())}, timeout=wait_s)
        # The readers end at EOF (unless another process holds the pipes open).
        await asyncio.wait(self._tasks, timeout=1.0)
        for task in self._tasks:
            task.cancel()
        self._fail_pending(RpcError("the RPC client was closed"))
        self._end_events()
        return proc.returncode

    # ------------------------------------------------------------------ reading
    async def _read_stdout(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        framer = LineFramer(self.max_line_bytes)
        stream = self._proc.stdout
        try:
            while True:
                data = await stream.read(1 << 16)
                frames = framer.feed(data) if data else framer.close()
                for frame in frames:
                    self._on_line(frame)
                if not data:
                    break
        except Exception as exc:  # a reader must not die silently: the death path reports it
            log.warning("reading the RPC server's stdout failed: %r", exc)
        finally:
            if not self._closing:
                await self._on_death()

    async def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        stream = self._proc.stderr
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        try:
            while data := await stream.read(1 << 14):
                self._tail += data
                if len(self._tail) > self._tail_limit:
                    del self._tail[:len(self._tail) - self._tail_limit]
                if self._stderr_cb is not None:
                    try:
                        self._stderr_cb(decoder.decode(data))
                    except Exception as exc:
                        # stderr must still be drained, or a chatty server blocks on a full pipe.
                        log.warning("the stderr callback failed (%r); it is no longer called", exc)
                        self._stderr_cb = None
        except Exception as exc:  # a read error (the pipe's transport failed)
            log.debug("reading the RPC server's stderr failed: %r", exc)

    def _on_line(self, frame: bytes | LineTooLong) -> None:
        if isinstance(frame, LineTooLong):
            log.warning("dropped a %d-byte line from the RPC server", frame.size)
            return
        if not frame.strip():
            return
        try:
            obj = json.loads(frame)
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            log.warning("not a protocol line on the RPC server's stdout: %r", frame[:200])
            self.noise.append(frame)
            return
        if obj.get("type") == "response":
            entry = self._pending.pop(obj.get("id"), None) if isinstance(obj.get("id"), str) else None
            if entry is None:
                log.warning("response to no pending request: %r", frame[:200])
                return
            future, _ = entry
            if not future.done():
                future.set_result(obj)
            return
        if self.record:
            self.received.append(obj)
        self._events.put_nowait(obj)
        self._activity.set()  # events only: the answer to wait_for_idle's own get_state is none

    async def _on_death(self) -> None:
        proc = self._proc
        assert proc is not None
        # Its exit status and the end of its stderr make the report; a server that closed its
        # stdout and lives on is reported after DEATH_WAIT_S with no status.
        await asyncio.wait({asyncio.ensure_future(proc.wait()), self._tasks[1]}, timeout=self.DEATH_WAIT_S)
        if self._closing:
            return
        self._death = ServerDied(proc.returncode, self.stderr_tail)
        for future, command in self._pending.values():
            if not future.done():
                future.set_exception(ServerDied(proc.returncode, self.stderr_tail, command))
        self._pending.clear()
        self._end_events()

    def _fail_pending(self, exc: RpcError) -> None:
        for future, _ in self._pending.values():
            if not future.done():
                future.set_exception(exc)
        self._pending.clear()

    def _end_events(self) -> None:
        self._activity.set()
        self._events.put_nowait(_END)

    # ------------------------------------------------------------------ events
    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """Every event the server emits, in order, from the start (one consumer at a time).

        Ends after :meth:`close`; raises :class:`ServerDied` when the server died.
        """
        while True:
            event = await self.next_event()
            if event is None:
                return
            yield event

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self.events()

    async def next_event(self, timeout_s: float | None = None) -> dict[str, Any] | None:
        """The next event; None once the client was closed. Raises :class:`ServerDied` when
        the server died, :class:`RpcTimeout` after ``timeout_s`` seconds (None: no limit)."""
        try:
            item = await asyncio.wait_for(self._events.get(), timeout_s)
        except asyncio.TimeoutError:
            raise RpcTimeout(f"no event within {timeout_s} s") from None
        if item is _END:
            self._events.put_nowait(_END)  # every later call ends the same way
            if self._death is not None:
                raise self._death
            return None
        return item

    def drain_events(self) -> list[dict[str, Any]]:
        """The events received and not consumed yet, without waiting (the buffer is emptied)."""
        out = []
        while True:
            try:
                item = self._events.get_nowait()
            except asyncio.QueueEmpty:
                return out
            if item is _END:
                self._events.put_nowait(_END)
                return out
            out.append(item)

    async def wait_for_event(self, type: str, timeout_s: float | None = None,
                             **fields: Any) -> dict[str, Any]:
        """Consume events until one of ``type`` whose ``fields`` match; return it.

        Raises :class:`RpcTimeout` after ``timeout_s`` (default: the request timeout),
        :class:`ServerDied`, or :class:`RpcError` when the client is closed first.
        """
        limit = self.timeout_s if timeout_s is None else timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise RpcTimeout(f"no {type} event matching {fields} within {limit} s")
            try:
                event = await self.next_event(left)
            except RpcTimeout:
                raise RpcTimeout(f"no {type} event matching {fields} within {limit} s") from None
            if event is None:
                raise RpcError(f"the client was closed while waiting for a {type} event")
            if event.get("type") == type and all(event.get(k) == v for k, v in fields.items()):
                return event

    # ------------------------------------------------------------------ commands
    async def request(self, command: Mapping[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
        """Send ``command`` (an id is added) and return its response.

        Raises :class:`RpcError` on ``success: false``, :class:`RpcTimeout` after ``timeout_s``
        (default :attr:`timeout_s`), :class:`ServerDied` when the server is gone.
        """
        proc = self._proc
        kind = str(command.get("type"))
        if proc is None:
            raise RpcError(f"cannot send {kind}: the client is not started (use start() or async with)")
        if self._death is not None:
            raise ServerDied(self._death.returncode, self._death.stderr_tail, kind)
        if self._closing:
            raise RpcError(f"cannot send {kind}: the client is closed")
        request_id = f"c{next(self._ids)}"
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        line = encode_line({**command, "id": request_id})
        limit = self.timeout_s if timeout_s is None else timeout_s
        deadline = loop.time() + limit
        self._pending[request_id] = (future, kind)
        try:  # whatever happens (timeout, cancellation, a broken pipe), the entry goes
            try:
                # write() buffers the whole line at once; only drain() waits, so a timeout can
                # never leave half a line behind.
                await asyncio.wait_for(self._write(line), limit)
            except asyncio.TimeoutError:
                raise RpcTimeout(f"could not send {kind} within {limit} s: the server (pid "
                                 f"{proc.pid}) is not reading its stdin", command=kind) from None
            except (ConnectionError, OSError) as exc:
                # The pipe broke: the server is gone (its stdout reader reports the death once
                # it has read the last lines and the exit status), or it closed its stdin.
                await asyncio.wait({self._tasks[0]}, timeout=self.DEATH_WAIT_S + 1.0)
                if self._death is not None:
                    raise ServerDied(self._death.returncode, self._death.stderr_tail, kind) from None
                if self._closing:
                    raise RpcError(f"cannot send {kind}: the client is closed", command=kind) from None
                raise RpcError(f"cannot send {kind}: the server (pid {proc.pid}) closed its stdin "
                               f"({exc})", command=kind) from None
            try:
                reply = await asyncio.wait_for(future, max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise RpcTimeout(f"no response to {kind} within {limit} s (server pid {proc.pid})",
                                 command=kind) from None
        finally:
            self._pending.pop(request_id, None)
        if reply.get("success") is not True:
            raise RpcError(str(reply.get("error") or f"{kind} failed"), command=kind, response=reply)
        return reply

    async def _write(self, line: bytes) -> None:
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        async with self._write_lock:
            proc.stdin.write(line)
            await proc.stdin.drain()

    async def prompt(self, message: str, streaming_behavior: str | None = None, *,
                     timeout_s: float | None = None) -> None:
        """Send a user message. Returns when the server accepted it (the turn runs on; use
        :meth:`wait_for_idle`). ``streaming_behavior`` ``"steer"`` / ``"followUp"`` queues it
        while the session is busy; without it a busy session raises :class:`RpcError`."""
        command: dict[str, Any] = {"type": "prompt", "message": message}
        if streaming_behavior is not None:
            command["streamingBehavior"] = streaming_behavior
        await self.request(command, timeout_s=timeout_s)

    async def abort(self, *, timeout_s: float | None = None) -> None:
        """Cancel a backoff and stop the running turn; returns once the turn has stopped."""
        await self.request({"type": "abort"}, timeout_s=timeout_s)

    async def abort_retry(self, *, timeout_s: float | None = None) -> None:
        """Cancel a pending backoff (``auto_retry_end`` ``"Retry cancelled"`` follows)."""
        await self.request({"type": "abort_retry"}, timeout_s=timeout_s)

    async def set_auto_retry(self, enabled: bool, *, timeout_s: float | None = None) -> None:
        """Switch auto-retry on or off (a pending backoff still runs)."""
        await self.request({"type": "set_auto_retry", "enabled": enabled}, timeout_s=timeout_s)

    async def steer(self, message: str, *, timeout_s: float | None = None) -> None:
        """Queue a message for the next turn while the session is busy (a turn or a backoff:
        the backoff is not shortened); on an idle session it starts a turn."""
        await self.request({"type": "steer", "message": message}, timeout_s=timeout_s)

    async def follow_up(self, message: str, *, timeout_s: float | None = None) -> None:
        """Like :meth:`steer` (queued messages all go with the next turn)."""
        await self.request({"type": "follow_up", "message": message}, timeout_s=timeout_s)

    async def retry_now(self, *, timeout_s: float | None = None) -> None:
        """End a pending backoff at once (the retry goes out now); ignored outside one."""
        await self.request({"type": "retry_now"}, timeout_s=timeout_s)

    async def get_messages(self, *, timeout_s: float | None = None) -> list[dict[str, Any]]:
        """The runtime context: the messages the next request carries (a failed attempt
        that was retried is not among them), oldest first."""
        response = await self.request({"type": "get_messages"}, timeout_s=timeout_s)
        return response["data"]["messages"]

    async def get_state(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        """The session state (``isStreaming``, ``isRetrying``, ``retryAttempt``, ...)."""
        reply = await self.request({"type": "get_state"}, timeout_s=timeout_s)
        return dict(reply.get("data") or {})

    async def wait_for_idle(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait until no turn runs, no retry chain is active and no queued message is about to
        be sent; return that state. Never returns during a backoff. Raises :class:`RpcTimeout`
        after ``timeout_s`` seconds (None: no limit) and :class:`ServerDied`.

        Messages queued (``steer`` / ``followUp``) during a chain that was then cancelled stay
        queued until the next prompt (``retryState`` is ``"cancelled"``): nothing will happen
        until then, so they do not count as busy.

        Each check is a ``get_state``: the server answers it in stream order, after every
        event emitted before it, so an idle answer means the last prompt's chain has ended.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            self._activity.clear()
            state = await self.get_state()
            waiting = state.get("queuedMessageCount") and state.get("retryState") != "cancelled"
            if not (state.get("isStreaming") or state.get("isRetrying")
                    or state.get("isCompacting") or waiting):
                return state
            wait = 0.25
            if deadline is not None:
                left = deadline - loop.time()
                if left <= 0:
                    raise RpcTimeout(f"the session was still busy after {timeout_s} s: {state}")
                wait = min(wait, left)
            try:
                await asyncio.wait_for(self._activity.wait(), wait)
            except asyncio.TimeoutError:
                pass
            else:
                # Something arrived: look again soon, but not once per event of a stream (a
                # thousand deltas must not cost a thousand get_state round trips).
                await asyncio.sleep(min(self.IDLE_POLL_S, max(0.0, wait)))
