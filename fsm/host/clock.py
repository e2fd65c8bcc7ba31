"""Clocks for the session's backoff timer: the event loop's, or a fake one for tests.

A clock has ``call_later(delay_s, callback, *args) -> handle`` where the handle has
``cancel()``, and ``time_ms() -> int``, the wall-clock time in epoch ms (for ``retryAt`` and a
chain's deadline). :class:`LoopClock` is asyncio's own; :class:`FakeClock` only moves when a
test calls :meth:`FakeClock.advance`, so tests of multi-second backoffs take no real time.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from typing import Any, Callable, Protocol


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def call_later(self, delay_s: float, callback: Callable[..., Any], *args: Any) -> TimerHandle: ...

    def time_ms(self) -> int: ...


class LoopClock:
    """Timers on the running asyncio loop (``loop.call_later``)."""

    def call_later(self, delay_s: float, callback: Callable[..., Any], *args: Any) -> TimerHandle:
        return asyncio.get_running_loop().call_later(delay_s, callback, *args)

    def time_ms(self) -> int:
        """Wall-clock epoch ms (``time.time()``)."""
        return int(time.time() * 1000)


class _FakeTimer:
    __slots__ = ("when", "callback", "args", "cancelled")

    def __init__(self, when: float, callback: Callable[..., Any], args: tuple) -> None:
        self.when = when
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """A manual clock: timers fire only inside :meth:`advance`, in time order.

    ``now`` is in seconds. Between timers, ``advance`` lets the event loop run pending tasks
    (``settle`` rounds of ``asyncio.sleep(0)``) so the work a timer starts can progress.
    """

    EPOCH_MS = 1_767_225_600_000
    """What ``time_ms()`` reads at ``now == 0``: 2026-01-01 00:00 UTC."""

    def __init__(self, settle: int = 20, *, epoch_ms: int = EPOCH_MS) -> None:
        self.now = 0.0
        self.epoch_ms = epoch_ms
        self._heap: list[tuple[float, int, _FakeTimer]] = []
        self._seq = 0
        self._settle = settle

    def call_later(self, delay_s: float, callback: Callable[..., Any], *args: Any) -> _FakeTimer:
        timer = _FakeTimer(self.now + max(0.0, delay_s), callback, args)
        self._seq += 1
        heapq.heappush(self._heap, (timer.when, self._seq, timer))
        return timer

    def time_ms(self) -> int:
        """``epoch_ms`` plus the fake time elapsed, in ms."""
        return self.epoch_ms + int(round(self.now * 1000))

    @property
    def pending(self) -> list[float]:
        """Delays (s from now) of the timers not yet fired nor cancelled, soonest first."""
        return sorted(t.when - self.now for _, _, t in self._heap if not t.cancelled)

    async def settle(self) -> None:
        """Let the loop run whatever is ready."""
        for _ in range(self._settle):
            await asyncio.sleep(0)

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, firing due timers in order."""
        end = self.now + seconds
        await self.settle()
        while self._heap and self._heap[0][0] <= end:
            when, _, timer = heapq.heappop(self._heap)
            if timer.cancelled:
                continue
            self.now = max(self.now, when)
            timer.callback(*timer.args)
            await self.settle()
        self.now = end
        await self.settle()


async def wait_ms(clock: Any, delay_ms: float) -> None:
    """Wait ``delay_ms`` milliseconds on the host's ``clock``: its ``call_later`` when it has one
    (a :class:`FakeClock` moves only when a test advances it), else the running event loop's.
    A cancellation while waiting propagates, with the clock's timer cancelled."""
    if clock is None or not hasattr(clock, "call_later"):
        await asyncio.sleep(delay_ms / 1000)
        return
    future = asyncio.get_running_loop().create_future()
    handle = clock.call_later(delay_ms / 1000, _resolve, future)
    try:
        await future
    finally:
        handle.cancel()


def _resolve(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)
