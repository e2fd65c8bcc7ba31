"""The RPC process's byte transport: a stdin reader and a blocking stdout writer.

:class:`StdinReader` hands the lines of stdin (framed by :class:`~fsm.rpc.protocol.LineFramer`)
to the event loop; :class:`Output` writes protocol lines to stdout, whole lines only, in call
order, and gives up on a client that stops reading once the server is stopping.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from typing import Any, Callable

from fsm.rpc.protocol import MAX_LINE_BYTES, LineFramer, LineTooLong, encode_line

__all__ = ["Output", "PIPE_CHUNK", "READ_CHUNK", "STALL_S", "StdinReader"]

log = logging.getLogger("fsm.rpc")

READ_CHUNK = 1 << 16
PIPE_CHUNK = 4096  # a pipe that polls writable takes this much without blocking (one page)
STALL_S = 1.0      # how long a stopping server waits for a client that does not read stdout


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
