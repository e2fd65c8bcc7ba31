"""A coordinator that never raises and never stalls: timeouts, a local fallback, two events.

Strictly private: import these names from :mod:`fsm.fleet`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Awaitable, Callable

from ._local import InProcessCoordinator
from ._types import BudgetSettings, Coordinator, CoordinatorError, CoordKey

log = logging.getLogger("fsm.fleet")

DEFAULT_TIMEOUT_S = 0.05
DEFAULT_PROBE_INTERVAL_S = 0.5

EventListener = Callable[[dict], None]


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

    - No call raises (except ``CancelledError``, which is the caller's) and none waits longer
      than ``timeout_s`` (default 50 ms). A call the remote does not answer in time, or
      answers with an error, is answered by ``fallback``.
    - While the remote is down the calls answer from ``fallback`` at once; one call every
      ``probe_interval_s`` tries the remote again. Reconnection is redis-py's, on that call.
    - Writes (``learn_cooldown``, ``mark_credential_limited``) go to both, and reads take the
      later of both, so what this process learned during an outage still holds after it.
      The budget is the remote's while it answers, ``fallback``'s while it does not.
    - ``on_event`` (and :meth:`subscribe`) hears ``coordinator_unavailable {reason}`` once
      when the remote stops answering and ``coordinator_restored`` once when it answers
      again (``docs/fleet.md``).
    """

    def __init__(self, inner: Coordinator, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 fallback: InProcessCoordinator | None = None,
                 on_event: EventListener | None = None,
                 probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 0 < timeout_s <= 60:
            raise ValueError(f"timeout_s must be a number above 0 and at most 60, got {timeout_s!r}")
        self.inner = inner
        self.timeout_s = float(timeout_s)
        self.fallback = fallback if fallback is not None else InProcessCoordinator()
        self.breaker = Breaker(probe_interval_s=probe_interval_s, on_event=on_event,
                               monotonic=monotonic)

    def __repr__(self) -> str:
        return f"GuardedCoordinator({self.inner!r}, timeout_s={self.timeout_s})"

    @property
    def available(self) -> bool:
        """False while the remote is not answering (between the two events)."""
        return self.breaker.available

    def subscribe(self, listener: EventListener) -> Callable[[], None]:
        """Add a listener for the two events; returns a function that removes it."""
        return self.breaker.subscribe(listener)

    async def _remote(self, call: Callable[[], Awaitable[Any]]) -> tuple[bool, Any]:
        """``(True, answer)`` from the remote, or ``(False, None)`` when it is down, slow or
        failing (the breaker hears of it)."""
        if not self.breaker.may_try():
            return False, None
        try:
            async with asyncio.timeout(self.timeout_s):
                answer = await call()
        except TimeoutError:
            self.breaker.failed(f"no answer within {self.timeout_s * 1000:g} ms")
            return False, None
        except CoordinatorError as exc:
            self.breaker.failed(str(exc))
            return False, None
        except Exception as exc:  # whatever else the remote raises, the session decides locally
            self.breaker.failed(type(exc).__name__)
            return False, None
        self.breaker.succeeded()
        return True, answer

    async def ping(self) -> bool:
        """Try the remote now (even while down); True when it answered in time."""
        ping = getattr(self.inner, "ping", None)
        if ping is None:
            return self.available
        self.breaker._next_probe = 0.0
        ok, _ = await self._remote(ping)
        return ok

    async def cooldown_left_ms(self, key: CoordKey, now_ms: int) -> int:
        local = self.fallback.cooldown_left_sync(key, now_ms)
        ok, remote = await self._remote(lambda: self.inner.cooldown_left_ms(key, now_ms))
        return max(local, remote) if ok else local

    async def learn_cooldown(self, key: CoordKey, until_ms: int, now_ms: int) -> None:
        self.fallback.learn_cooldown_sync(key, until_ms, now_ms)
        await self._remote(lambda: self.inner.learn_cooldown(key, until_ms, now_ms))

    async def take_retry_token(self, key: CoordKey, budget: BudgetSettings) -> bool:
        ok, allowed = await self._remote(lambda: self.inner.take_retry_token(key, budget))
        return bool(allowed) if ok else self.fallback.take_retry_token_sync(key, budget)

    async def before_decision(self, key: CoordKey, now_ms: int,
                              budget: BudgetSettings | None) -> tuple[int, bool | None]:
        ok, answer = await self._remote(lambda: self.inner.before_decision(key, now_ms, budget))
        if not ok:
            return self.fallback.before_decision_sync(key, now_ms, budget)
        left, allowed = answer
        return max(left, self.fallback.cooldown_left_sync(key, now_ms)), allowed

    async def return_retry_token(self, key: CoordKey, budget: BudgetSettings) -> None:
        ok, _ = await self._remote(lambda: self.inner.return_retry_token(key, budget))
        if not ok:
            await self.fallback.return_retry_token(key, budget)

    async def credit_success(self, key: CoordKey, budget: BudgetSettings) -> None:
        ok, _ = await self._remote(lambda: self.inner.credit_success(key, budget))
        if not ok:
            await self.fallback.credit_success(key, budget)

    async def mark_credential_limited(self, provider: str, credential: str, until_ms: int,
                                      now_ms: int) -> None:
        self.fallback.mark_credential_limited_sync(provider, credential, until_ms, now_ms)
        await self._remote(lambda: self.inner.mark_credential_limited(provider, credential,
                                                                      until_ms, now_ms))

    async def limited_credentials(self, provider: str, now_ms: int) -> dict[str, int]:
        merged = self.fallback.limited_credentials_sync(provider, now_ms)
        ok, remote = await self._remote(lambda: self.inner.limited_credentials(provider, now_ms))
        if ok:
            for cred, until in remote.items():
                merged[cred] = max(until, merged.get(cred, 0))
        return merged

    async def aclose(self) -> None:
        try:
            await self.inner.aclose()
        except Exception:  # shutting down: nothing the caller could do with the error
            log.debug("coordinator close failed", exc_info=True)
