"""A coordinator that never raises and never stalls: timeouts, a local fallback, two events.

Strictly private: import these names from :mod:`fsm.fleet`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import replace
from typing import Any, Awaitable, Callable

from fsm.core.settings import PacingSettings
from fsm.fleet._local import InProcessCoordinator
from fsm.fleet._types import (MAX_LEFT_MS, Admission, BudgetSettings, Coordinator, CoordinatorError, CoordinatorKeyError,
                              CoordKey)

log = logging.getLogger("fsm.fleet")

DEFAULT_TIMEOUT_S = 0.05
DEFAULT_PROBE_INTERVAL_S = 0.1
DEFAULT_WRITE_TIMEOUT_S = 1.0

# A deadline the event loop reaches later than this was missed because the loop was busy:
# the deadline moves on by as long as it was late (at most the timeout), at most this often.
LOOP_LAG_TOLERANCE_S = 0.005
MAX_EXTENSIONS = 3

EventListener = Callable[[dict], None]


def _forget(task: "asyncio.Task[Any]") -> None:
    """Retrieve the outcome of a call that was given up on (so asyncio does not log it)."""
    if not task.cancelled():
        task.exception()


class Breaker:
    """Whether the remote coordinator is answering, and the two events that say it changed.

    Up: every call goes to the remote. After one failure it is down: calls answer locally at
    once, and one call per ``probe_interval_s`` tries the remote again; the first success
    brings it back up. Emits ``{"type": "coordinator_unavailable", "reason": str}`` when it
    goes down and ``{"type": "coordinator_restored"}`` when it comes back: once per outage.
    Thread-safe. ``monotonic`` gives seconds (inject it in tests).
    """

    def __init__(self, *, probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
                 on_event: EventListener | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(probe_interval_s, int | float) or not probe_interval_s >= 0:
            raise ValueError(f"probe_interval_s must be a number >= 0, got {probe_interval_s!r}")
        self.probe_interval_s = float(probe_interval_s)
        self._monotonic = monotonic
        self._listeners: list[EventListener] = [on_event] if on_event is not None else []
        self._lock = threading.Lock()
        self.available = True          # invariant: False exactly between the two events
        self.reason: str | None = None  # why it went down (None while available)
        self._next_probe = 0.0
        self.events: list[dict] = []    # every event emitted, in order (for diagnostics)

    def subscribe(self, listener: EventListener) -> Callable[[], None]:
        """Add ``listener`` for the two events; returns a function that removes it."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)
        return unsubscribe

    def may_try(self) -> bool:
        """True when the next call should go to the remote (up, or a probe is due)."""
        if self.available:
            return True
        with self._lock:
            now = self._monotonic()
            if now >= self._next_probe:
                self._next_probe = now + self.probe_interval_s
                return True
            return False

    def succeeded(self) -> None:
        if self.available:
            return
        with self._lock:
            if self.available:
                return
            self.available, self.reason = True, None
        self._emit({"type": "coordinator_restored"})

    def failed(self, reason: str) -> None:
        with self._lock:
            self._next_probe = self._monotonic() + self.probe_interval_s
            if not self.available:
                return
            self.available, self.reason = False, reason
        log.warning("fleet coordinator unavailable (%s): deciding on local state", reason)
        self._emit({"type": "coordinator_unavailable", "reason": reason})

    def _emit(self, event: dict) -> None:
        self.events.append(event)
        for listener in list(self._listeners):
            try:
                listener(dict(event))
            except Exception:  # a listener's bug must not reach the session's decision
                log.exception("coordinator event listener failed")


class GuardedCoordinator:
    """``inner`` (say a :class:`~fsm.fleet.RedisCoordinator`) with a deadline on every call
    and ``fallback`` (an :class:`~fsm.fleet.InProcessCoordinator`) for when it misses it.

    - No call raises (except ``CancelledError``, which is the caller's). A read waits at most
      ``timeout_s`` (default 50 ms); a write (``learn_cooldown``, ``mark_credential_limited``,
      ``return_retry_token``, ``credit_success``: the shell makes them after the decision,
      off its path) at most ``write_timeout_s`` (default 1 s), so that a busy moment does not
      lose what the fleet should learn. A call the remote does not answer in time, or
      answers with an error, is answered by ``fallback``.
    - While the remote is down the calls answer from ``fallback`` at once; one call every
      ``probe_interval_s`` tries the remote again. Reconnection is redis-py's, on that call.
    - Writes (``learn_cooldown``, ``mark_credential_limited``) go to both, and reads take the
      later of both, so what this process learned during an outage still holds after it.
      What the remote answers (cooldowns, marks) is kept in ``fallback`` as well.
      The budget is the remote's while it answers, ``fallback``'s while it does not; the
      fallback's bucket continues from the last count the remote gave, so an outage of Redis
      during a provider's outage does not give every process a full bucket of retries.
    - An :meth:`admit` whose answer comes after nobody waits for it (its deadline passed, or
      the caller was cancelled: an abort or a cancel while Redis answers) gives back the
      budget token it took, so an aborted retry never leaks a token.
    - A key whose data in the remote is bad (the remote raises
      :class:`~fsm.fleet.CoordinatorKeyError`) is answered from ``fallback`` for that call
      only; the remote stays "available" (no event). Nothing the remote answers is copied
      into ``fallback`` unless it passed the remote's validation (every time left is within
      :data:`~fsm.fleet.MAX_LEFT_MS`).
    - Protocol v3 (:meth:`admit`, :meth:`record_outcome`, the fallback mark) works the same
      way; ``fallback`` counts on ``clock`` (default: the monotonic clock). The pacer of
      ``fallback`` hears every outcome and counts every send the remote admitted, so that
      while the remote is down this process paces on what it saw itself (local pacing).
      ``pacing_booked`` and ``budget_slot_booked`` pass through as answered (the remote's,
      or the fallback's when it answers: its floor books only within
      :data:`~fsm.fleet.FLOOR_HORIZON_MS` too).
    - ``on_event`` (and :meth:`subscribe`) hears ``coordinator_unavailable {reason}`` once
      when the remote stops answering and ``coordinator_restored`` once when it answers
      again (``docs/fleet.md``).
    """

    self_bounded = True
    """Every call answers within about ``timeout_s`` and never raises: a caller needs no
    timeout of its own around it (one would only replace its local answer by a default)."""

    def __init__(self, inner: Coordinator, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 fallback: InProcessCoordinator | None = None,
                 on_event: EventListener | None = None,
                 probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
                 write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S,
                 monotonic: Callable[[], float] = time.monotonic,
                 clock: Callable[[], float] | None = None) -> None:
        if (isinstance(write_timeout_s, bool) or not isinstance(write_timeout_s, int | float)
                or not 0 < write_timeout_s <= 60):
            raise ValueError(f"write_timeout_s must be a number above 0 and at most 60, "
                             f"got {write_timeout_s!r}")
        self.write_timeout_s = float(write_timeout_s)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 0 < timeout_s <= 60:
            raise ValueError(f"timeout_s must be a number above 0 and at most 60, got {timeout_s!r}")
        self.inner = inner
        self.timeout_s = float(timeout_s)
        self.fallback = fallback if fallback is not None else InProcessCoordinator(clock=clock)
        self.breaker = Breaker(probe_interval_s=probe_interval_s, on_event=on_event,
                               monotonic=monotonic)
        self._background: set[asyncio.Task] = set()  # late give-backs still running

    def __repr__(self) -> str:
        return f"GuardedCoordinator({self.inner!r}, timeout_s={self.timeout_s})"

    @property
    def available(self) -> bool:
        """False while the remote is not answering (between the two events)."""
        return self.breaker.available

    def subscribe(self, listener: EventListener) -> Callable[[], None]:
        """Add a listener for the two events; returns a function that removes it."""
        return self.breaker.subscribe(listener)

    async def _remote(self, call: Callable[[], Awaitable[Any]],
                      timeout_s: float | None = None,
                      on_late: Callable[[Any], None] | None = None) -> tuple[bool, Any]:
        """``(True, answer)`` from the remote, or ``(False, None)`` when it is down, slow or
        failing (the breaker hears of it).

        ``on_late(answer)`` is called with the answer of a call that completes after nobody
        waits for it any more (its deadline passed, or the caller was cancelled: an abort):
        :meth:`admit` gives back the token such an answer took.

        The call runs as its own task. At the deadline a call that is mid-command (in the
        inner's ``in_flight``) is left to finish in the background rather than cancelled:
        cancelling redis-py mid-reply closes the connection (the next call would have to
        connect again) and may itself wait; a call still waiting for its turn is cancelled, and
        answered locally without declaring the remote down (this process is busy, not Redis). And a deadline the
        loop reaches late (it was busy, so an answer may be sitting unread) is extended once
        by as long as it was late, at most ``timeout_s``: the timeout measures the remote,
        not this process's load.
        """
        if not self.breaker.may_try():
            return False, None
        loop = asyncio.get_running_loop()
        task = loop.create_task(call())
        waiter = loop.create_future()

        def wake(_: object = None) -> None:
            if not waiter.done():
                waiter.set_result(None)

        timeout = self.timeout_s if timeout_s is None else timeout_s
        deadline = loop.time() + timeout
        extensions = 0

        def on_deadline() -> None:
            nonlocal deadline, extensions, handle
            now = loop.time()
            late = now - deadline
            if extensions < MAX_EXTENSIONS and late > LOOP_LAG_TOLERANCE_S:
                extensions += 1
                deadline = now + min(late, timeout)
                handle = loop.call_at(deadline, on_deadline)
            else:
                wake()

        task.add_done_callback(wake)
        handle = loop.call_at(deadline, on_deadline)
        sent = True
        try:
            await waiter
        finally:
            handle.cancel()
            task.add_done_callback(_forget)  # whoever stops waiting, its outcome is retrieved
            in_flight = getattr(self.inner, "in_flight", None)
            if not task.done() and in_flight is not None and task not in in_flight:
                sent = False
                task.cancel()  # still waiting for its turn: it sent nothing
            elif not task.done() and on_late is not None:
                task.add_done_callback(lambda t: self._late(t, on_late))
        if not task.done():
            if sent:  # a call that never got its turn says this process is busy, not Redis down
                self.breaker.failed(f"no answer within {timeout * 1000:g} ms")
            return False, None
        exc = None if task.cancelled() else task.exception()
        if isinstance(exc, CoordinatorKeyError):
            # The server answered: one key's data is bad. That key is answered locally; the
            # coordinator is up (no event, no flapping).
            log.debug("coordinator key degraded: %s", exc)
            self.breaker.succeeded()
            return False, None
        if task.cancelled() or exc is not None:
            if isinstance(exc, CoordinatorError):
                self.breaker.failed(str(exc))
            else:  # whatever else the remote raises, the session decides locally
                self.breaker.failed(type(exc).__name__ if exc is not None else "cancelled")
            return False, None
        self.breaker.succeeded()
        return True, task.result()

    def _late(self, task: "asyncio.Task[Any]", on_late: Callable[[Any], None]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        try:
            on_late(task.result())
        except Exception:  # a late answer's clean-up must never reach anyone
            log.debug("late coordinator answer not handled", exc_info=True)

    def _give_back_late(self, key: CoordKey, budget: BudgetSettings | None) -> Callable[[Any], None]:
        """For :meth:`admit`: a late answer that took a token (nobody will send its retry)
        gives the token back, in the background."""
        def give_back(answer: Any) -> None:
            taken = (answer.token_taken if isinstance(answer, Admission)
                     else answer[1] is True if isinstance(answer, tuple) and len(answer) == 2
                     else answer is True)  # before v3: (left, allowed) or allowed
            if budget is None or not taken:
                return
            task = asyncio.get_running_loop().create_task(self.inner.return_retry_token(key, budget))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            task.add_done_callback(_forget)
        return give_back

    async def ping(self) -> bool:
        """Try the remote now (even while down); True when it answered in time."""
        ping = getattr(self.inner, "ping", None)
        if ping is None:
            return self.available
        self.breaker._next_probe = 0.0
        ok, _ = await self._remote(ping)
        return ok

    async def warm_up(self, timeout_s: float = 2.0) -> bool:
        """Connect and load the remote's scripts now (``RedisCoordinator.warm_up``), allowing
        ``timeout_s``: call it when the host starts. True when the remote answered; otherwise
        the outage is reported as by any call. Never raises."""
        warm = getattr(self.inner, "warm_up", None)
        if warm is None:
            return await self.ping()
        try:
            async with asyncio.timeout(timeout_s):
                await warm()
        except (TimeoutError, Exception) as exc:
            reason = str(exc) if isinstance(exc, CoordinatorError) else (
                f"no answer within {timeout_s * 1000:g} ms" if isinstance(exc, TimeoutError)
                else type(exc).__name__)
            self.breaker.failed(reason)
            return False
        self.breaker.succeeded()
        return True


    # -- protocol v3 ----------------------------------------------------------------------
    async def admit(self, key: CoordKey, *, retry: bool, budget: BudgetSettings | None,
                    pacing: PacingSettings | None, earliest_ms: int = 0,
                    floor_slot_due: bool = False, max_wait_ms: int | None = None) -> Admission:
        ok, answer = await self._remote(lambda: self.inner.admit(
            key, retry=retry, budget=budget, pacing=pacing, earliest_ms=earliest_ms,
            floor_slot_due=floor_slot_due, max_wait_ms=max_wait_ms),
            on_late=self._give_back_late(key, budget if retry else None))
        if not ok or not isinstance(answer, Admission):
            return await self.fallback.admit(key, retry=retry, budget=budget, pacing=pacing,
                                             earliest_ms=earliest_ms, floor_slot_due=floor_slot_due,
                                             max_wait_ms=max_wait_ms)
        now = self.fallback.now_ms()
        if 0 < answer.cooldown_ms <= MAX_LEFT_MS:
            self.fallback.learn_cooldown_at(key, answer.cooldown_ms, now)
        if retry and budget is not None:
            self._mirror(key, budget)
        refused = max_wait_ms is not None and answer.cooldown_ms > max_wait_ms
        if answer.pacing_booked and answer.budget is not False and not refused:
            # the local pacer counts this process's sends (the rate a local throttle cuts
            # from while the remote is down); its own slots are left alone
            self.fallback.count_send_at(key, now, answer.pacing_ms, pacing)
        local = self.fallback.cooldown_left_at(key, now)
        if local > answer.cooldown_ms:
            answer = replace(answer, cooldown_ms=local)
        return answer

    async def record_outcome(self, key: CoordKey, *, success: bool, throttled: bool,
                             budget: BudgetSettings | None,
                             pacing: PacingSettings | None) -> None:
        # The local pacer hears every outcome (local pacing while the remote is down); the
        # budget's credit is the remote's while it answers (budget=None here).
        self.fallback.record_outcome_at(key, self.fallback.now_ms(), success=success,
                                        throttled=throttled, budget=None, pacing=pacing)
        ok, _ = await self._remote(lambda: self.inner.record_outcome(
            key, success=success, throttled=throttled, budget=budget, pacing=pacing),
            self.write_timeout_s)
        if budget is None or not success:
            return
        if ok:
            self._mirror(key, budget)
        else:
            await self.fallback.credit_success(key, budget)

    async def mark_fallback(self, key: CoordKey, duration_ms: int) -> None:
        self.fallback.mark_fallback_at(key, duration_ms, self.fallback.now_ms())
        await self._remote(lambda: self.inner.mark_fallback(key, duration_ms), self.write_timeout_s)

    async def fallback_left_ms(self, key: CoordKey) -> int:
        ok, remote = await self._remote(lambda: self.inner.fallback_left_ms(key))
        now = self.fallback.now_ms()
        if ok and isinstance(remote, int) and 0 < remote <= MAX_LEFT_MS:
            self.fallback.mark_fallback_at(key, remote, now)
        return self.fallback.fallback_left_at(key, now)

    # -- before v3 (thin wrappers while the session and runner call them) ------------------
    async def cooldown_left_ms(self, key: CoordKey, now_ms: int) -> int:
        local = self.fallback.cooldown_left_sync(key, now_ms)
        ok, remote = await self._remote(lambda: self.inner.cooldown_left_ms(key, now_ms))
        if not ok:
            return local
        self._mirror_cooldown(key, remote, now_ms)
        return max(local, remote)

    async def learn_cooldown(self, key: CoordKey, duration_ms: int,
                             now_ms: int | None = None) -> None:
        """v3: ``(key, duration_ms)``; before v3: ``(key, until_ms, now_ms)``."""
        if now_ms is None:
            self.fallback.learn_cooldown_at(key, duration_ms, self.fallback.now_ms())
            await self._remote(lambda: self.inner.learn_cooldown(key, duration_ms),
                               self.write_timeout_s)
            return
        until_ms = duration_ms
        self.fallback.learn_cooldown_sync(key, until_ms, now_ms)
        await self._remote(lambda: self.inner.learn_cooldown(key, until_ms, now_ms),
                           self.write_timeout_s)

    def _mirror_cooldown(self, key: CoordKey, left_ms: int, now_ms: int) -> None:
        """Keep a cooldown the remote told of in the fallback too, so that a local answer
        (Redis slow or down) still knows the fleet's cooldowns this process has seen."""
        if left_ms > 0:
            self.fallback.learn_cooldown_sync(key, now_ms + left_ms, now_ms)

    def _mirror(self, key: CoordKey, budget: BudgetSettings) -> None:
        """Copy the remote bucket's last count into the fallback, so that an outage of the
        coordinator does not hand every process a full bucket of retries."""
        milli = getattr(self.inner, "observed_milli", {}).get(key)
        if milli is not None:
            self.fallback.set_tokens_milli(key, budget, milli)

    async def take_retry_token(self, key: CoordKey, budget: BudgetSettings) -> bool:
        ok, allowed = await self._remote(lambda: self.inner.take_retry_token(key, budget),
                                         on_late=self._give_back_late(key, budget))
        if not ok:
            return self.fallback.take_retry_token_sync(key, budget)
        self._mirror(key, budget)
        return bool(allowed)

    async def before_decision(self, key: CoordKey, now_ms: int,
                              budget: BudgetSettings | None) -> tuple[int, bool | None]:
        ok, answer = await self._remote(lambda: self.inner.before_decision(key, now_ms, budget),
                                        on_late=self._give_back_late(key, budget))
        if not ok:
            return self.fallback.before_decision_sync(key, now_ms, budget)
        if budget is not None:
            self._mirror(key, budget)
        left, allowed = answer
        self._mirror_cooldown(key, left, now_ms)
        return max(left, self.fallback.cooldown_left_sync(key, now_ms)), allowed

    async def return_retry_token(self, key: CoordKey, budget: BudgetSettings) -> None:
        ok, _ = await self._remote(lambda: self.inner.return_retry_token(key, budget),
                                   self.write_timeout_s)
        if not ok:
            await self.fallback.return_retry_token(key, budget)
        else:
            self._mirror(key, budget)

    async def credit_success(self, key: CoordKey, budget: BudgetSettings) -> None:
        ok, _ = await self._remote(lambda: self.inner.credit_success(key, budget),
                                   self.write_timeout_s)
        if not ok:
            await self.fallback.credit_success(key, budget)
        else:
            self._mirror(key, budget)

    async def mark_credential_limited(self, provider: str, credential: str, until_ms: int,
                                      now_ms: int | None = None) -> None:
        """v3: ``(provider, credential, duration_ms)``; before v3: ``(..., until_ms, now_ms)``."""
        if now_ms is None:
            duration_ms = until_ms
            self.fallback.mark_credential_limited_at(provider, credential, duration_ms,
                                                     self.fallback.now_ms())
            await self._remote(lambda: self.inner.mark_credential_limited(provider, credential,
                                                                          duration_ms),
                               self.write_timeout_s)
            return
        self.fallback.mark_credential_limited_sync(provider, credential, until_ms, now_ms)
        await self._remote(lambda: self.inner.mark_credential_limited(provider, credential,
                                                                      until_ms, now_ms),
                           self.write_timeout_s)

    async def limited_credentials(self, provider: str, now_ms: int | None = None) -> dict[str, int]:
        """v3: id -> ms left; before v3 (``now_ms`` given): id -> end in the caller's clock."""
        if now_ms is None:
            now = self.fallback.now_ms()
            ok, remote = await self._remote(lambda: self.inner.limited_credentials(provider))
            if ok and isinstance(remote, dict):
                for cred, left in remote.items():
                    if isinstance(left, int) and 0 < left <= MAX_LEFT_MS:
                        self.fallback.mark_credential_limited_at(provider, cred, left, now)
            return self.fallback.limited_credentials_at(provider, now)
        merged = self.fallback.limited_credentials_sync(provider, now_ms)
        ok, remote = await self._remote(lambda: self.inner.limited_credentials(provider, now_ms))
        if ok:
            for cred, until in remote.items():
                if until > merged.get(cred, 0):
                    merged[cred] = until
                    self.fallback.mark_credential_limited_sync(provider, cred, until, now_ms)
        return merged

    async def aclose(self) -> None:
        try:
            await self.inner.aclose()
        except Exception:  # shutting down: nothing the caller could do with the error
            log.debug("coordinator close failed", exc_info=True)
