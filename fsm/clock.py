"""Clocks for the session's backoff timer: the event loop's, or a fake one for tests.

A clock has one method, ``call_later(delay_s, callback, *args) -> handle`` where the handle
has ``cancel()``. :class:`LoopClock` is asyncio's own; :class:`FakeClock` only moves when a
test calls :meth:`FakeClock.advance`, so tests of multi-second backoffs take no real time.
"""

from __future__ import annotations

import asyncio
import heapq
from typing import Any, Callable, Protocol


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def call_later(self, delay_s: float, callback: Callable[..., Any], *args: Any) -> TimerHandle: ...


class LoopClock:
    """Timers on the running asyncio loop (``loop.call_later``)."""

    def call_later(self, delay_s: float, callback: Callable[..., Any], *args: Any) -> TimerHandle:
        return asyncio.get_running_loop().call_later(delay_s, callback, *args)


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

    def __init__(self, settle: int = 20) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, _FakeTimer]] = []
        self._seq = 0
        self._settle = settle

    def call_later(self, delay_s: float, callback: Callable[..., Any], *args: Any) -> _FakeTimer:
        timer = _FakeTimer(self.now + max(0.0, delay_s), callback, args)
        self._seq += 1
        heapq.heappush(self._heap, (timer.when, self._seq, timer))
        return timer

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
