"""The embedded coordinator: one per process, shared by every session in it.

Strictly private: import these names from :mod:`fsm.fleet`.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import replace
from typing import Callable

from fsm.core import pacing as pacer
from fsm.core.settings import PacingSettings
from fsm.fleet._types import (MAX_LEFT_MS, MILLI, Admission, BudgetSettings, CoordKey, check_duration, check_ms,
                              max_milli, ratio_milli)

#: A bucket nobody touched for this long is full again.
DEFAULT_BUCKET_IDLE_MS = 600_000

#: Budget in wait mode: a retry the floor books no slot for (no floor, or its next slot starts
#: beyond :data:`FLOOR_HORIZON_MS`) asks again after this many ms, which the host jitters
#: itself (×U(0.5, 1.5)), with ``floor_slot_due=False`` (docs/fleet.md "Budget in wait mode").
WAIT_RECHECK_MS = 3000

#: Budget in wait mode: the floor's next slot is reserved for a retry only when it starts
#: within this many ms of now. A slot minutes ahead would keep the retry waiting for it even
#: after the provider is back and successes have refilled the bucket (docs/fleet.md "Budget in
#: wait mode"; the pacer has the same kind of horizon, ``retry.pacing.horizonMs``).
FLOOR_HORIZON_MS = 3000

# Expired entries are swept when a table grows past this many keys (keys are per
# provider/model/credential, so this is a safety net, not a hot path).
_SWEEP_AT = 1024


def _monotonic_ms() -> float:
    return time.monotonic() * 1000


def floor_interval_ms(budget: BudgetSettings) -> float:
    """The floor's spacing in ms (``1000 / minRetriesPerSecond``); ``inf`` with no floor."""
    rate = budget.min_retries_per_second
    return 1000.0 / rate if rate > 0 else math.inf


class InProcessCoordinator:
    """Coordinator protocol v3 (:class:`~fsm.fleet.Coordinator`) in this process's memory.

    The semantics are the protocol's and the Redis scripts' (``docs/fleet.md``): the later
    cooldown wins, a bucket starts full and counts in thousandths of a token, a bucket idle
    for ``bucket_idle_ms`` is full again, the pacer is :mod:`fsm.core.pacing`. Every time is
    read from ``clock`` (ms as an int or float, any origin; default the monotonic clock):
    the host gives its own clock (a simulation its virtual one, a test a
    :class:`fsm.testing.FakeClock`'s ``now_ms``). Thread-safe (several event loops in threads
    may share one). ``monotonic_ms`` is the former name of ``clock``.

    The methods ending in ``_at`` take the clock reading ``now`` explicitly; the coroutine
    methods read ``clock``. The coordinator protocol of before v3 (``cooldown_left_ms``,
    ``before_decision``, ``take_retry_token``, ``credit_success`` and the ``until_ms, now_ms``
    forms) is kept as thin wrappers while the session and runner still call it; those count
    in the caller's ``now_ms``.
    """

    self_bounded = True
    """Every call answers at once (no I/O) and never raises for valid input."""

    answers_at_once = True
    """A capability the hosts read (docs/fleet.md): every call does no I/O and its coroutine
    never suspends, so a host without an event loop (a sync caller, the simulation on virtual
    time) may run it to its end at once."""

    def __init__(self, *, bucket_idle_ms: int = DEFAULT_BUCKET_IDLE_MS,
                 clock: Callable[[], float] | None = None,
                 monotonic_ms: Callable[[], float] | None = None) -> None:
        if isinstance(bucket_idle_ms, bool) or not isinstance(bucket_idle_ms, int) or bucket_idle_ms < 1:
            raise ValueError(f"bucket_idle_ms must be a positive integer, got {bucket_idle_ms!r}")
        if clock is not None and not callable(clock):
            raise ValueError(f"clock must be a callable giving ms, got {clock!r}")
        self.bucket_idle_ms = bucket_idle_ms
        self._clock = clock or monotonic_ms or _monotonic_ms
        self._lock = threading.RLock()
        # key -> end (clock ms); an entry at or before now is dead and may be swept.
        self._cooldowns: dict[CoordKey, float] = {}
        self._fallback: dict[CoordKey, float] = {}
        # key -> [milli-tokens, last touched (clock ms)]; 0 <= milli-tokens <= max; a
        # missing or idle bucket is full.
        self._buckets: dict[CoordKey, list[float]] = {}
        # key -> the floor's theoretical arrival time (clock ms).
        self._floor: dict[CoordKey, float] = {}
        self._pacers: dict[CoordKey, pacer.PacerState] = {}
        # provider -> credential id -> end (clock ms).
        self._limited: dict[str, dict[str, float]] = {}
        self.budget_share = 1  # the bucket is maxTokens ÷ this (set_budget_share)

    def now_ms(self) -> float:
        """The clock this coordinator counts in (ms)."""
        return float(self._clock())

    # -- cooldowns and the fallback mark --------------------------------------------------
    @staticmethod
    def _left(table: dict[CoordKey, float], key: CoordKey, now: float) -> int:
        end = table.get(key, 0.0)
        return max(0, min(MAX_LEFT_MS, math.ceil(end - now))) if end > now else 0

    @staticmethod
    def _extend(table: dict, key, end: float, now: float) -> None:
        if end > now and end > table.get(key, -math.inf):
            table[key] = end
        if len(table) > _SWEEP_AT:
            for k in [k for k, e in table.items() if e <= now]:
                del table[k]

    def cooldown_left_at(self, key: CoordKey, now: float) -> int:
        """Time left of ``key``'s cooldown at clock reading ``now`` (ms, 0 = none)."""
        with self._lock:
            return self._left(self._cooldowns, key, now)

    def learn_cooldown_at(self, key: CoordKey, duration_ms: int, now: float) -> None:
        """``key`` cools down for ``duration_ms`` (clamped to 0..MAX_LEFT_MS) from ``now``."""
        duration = check_duration("duration_ms", duration_ms)
        with self._lock:
            self._extend(self._cooldowns, key, now + duration, now)

    def fallback_left_at(self, key: CoordKey, now: float) -> int:
        with self._lock:
            return self._left(self._fallback, key, now)

    def mark_fallback_at(self, key: CoordKey, duration_ms: int, now: float) -> None:
        duration = check_duration("duration_ms", duration_ms)
        with self._lock:
            self._extend(self._fallback, key, now + duration, now)

    # -- the retry budget -----------------------------------------------------------------
    def set_budget_share(self, processes: int) -> None:
        """Hold a share of the fleet's budget: every bucket is ``maxTokens ÷ processes`` (in
        thousandths of a token, with the same rule: a retry only while the count after the
        take is above half of it) and the floor ``minRetriesPerSecond ÷ processes``. A guard
        sets it to the processes of the fleet it heard of (docs/fleet.md "When Redis is slow
        or down"); 1 (the default) is the whole bucket. ``ValueError`` below 1."""
        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
            raise ValueError(f"processes must be an integer >= 1, got {processes!r}")
        self.budget_share = processes

    def _cap(self, budget: BudgetSettings) -> int:
        """The bucket's size in milli-tokens: the whole, or this process's share of it."""
        return max_milli(budget) // self.budget_share

    def lower_share_milli(self, key: CoordKey, budget: BudgetSettings, fleet_milli: int) -> None:
        """The fleet's bucket holds ``fleet_milli`` (thousandths of a token): lower this
        bucket to its share of that (``fleet_milli ÷ processes``) when it holds more; never
        raise it."""
        with self._lock:
            bucket = self._bucket(key, budget, self.now_ms())
            bucket[0] = max(0, min(bucket[0], int(fleet_milli) // self.budget_share))

    def _bucket(self, key: CoordKey, budget: BudgetSettings, now: float) -> list[float]:
        bucket = self._buckets.get(key)
        if bucket is None or now - bucket[1] >= self.bucket_idle_ms:
            bucket = self._buckets[key] = [self._cap(budget), now]
            if len(self._buckets) > _SWEEP_AT:
                self._buckets = {k: b for k, b in self._buckets.items()
                                 if now - b[1] < self.bucket_idle_ms}
                self._buckets[key] = bucket
        bucket[0] = min(bucket[0], self._cap(budget))
        bucket[1] = now
        return bucket

    def tokens(self, key: CoordKey, budget: BudgetSettings) -> float:
        """The bucket's count now, in tokens (for tests and diagnostics)."""
        with self._lock:
            return self._bucket(key, budget, self.now_ms())[0] / MILLI

    def set_tokens_milli(self, key: CoordKey, budget: BudgetSettings, milli: int) -> None:
        """Set the bucket's count (thousandths of a token, clipped to 0..max): a guard copies
        the fleet's count here so that its fallback continues from it."""
        with self._lock:
            bucket = self._bucket(key, budget, self.now_ms())
            bucket[0] = max(0, min(self._cap(budget), int(milli)))

    def add_tokens_sync(self, key: CoordKey, budget: BudgetSettings, milli: int) -> None:
        with self._lock:
            bucket = self._bucket(key, budget, self.now_ms())
            bucket[0] = min(self._cap(budget), bucket[0] + milli)

    def _floor_slot(self, key: CoordKey, budget: BudgetSettings, now: float,
                    horizon_ms: float) -> float | None:
        """Reserve the floor's next slot when it starts within ``horizon_ms`` of ``now``: its
        delay in ms from ``now`` (0 = now); None, with nothing reserved, when there is no floor
        or the slot starts later (refuse mode passes 0: only a slot free now)."""
        interval = floor_interval_ms(budget) * self.budget_share
        if math.isinf(interval):
            return None
        start = max(now, self._floor.get(key, -math.inf))
        if start - now > horizon_ms:
            return None
        self._floor[key] = start + interval
        return start - now

    def _budget_step(self, key: CoordKey, budget: BudgetSettings, now: float,
                     floor_slot_due: bool) -> tuple[bool, bool, int, bool]:
        """``(allowed, token_taken, budget_wait_ms, budget_slot_booked)`` for one retry (lock
        held); the last is False only in wait mode when no floor slot was reserved."""
        bucket = self._bucket(key, budget, now)
        after = max(0.0, bucket[0] - MILLI)
        if after * 2 > self._cap(budget):
            bucket[0] = after
            return True, True, 0, True
        if floor_slot_due:
            return True, False, 0, True
        if not budget.waits:
            bucket[0] = after  # the failure is counted (gRPC retry throttling)
            wait = self._floor_slot(key, budget, now, 0)
            return (wait is not None), False, 0, True
        wait = self._floor_slot(key, budget, now, FLOOR_HORIZON_MS)
        if wait is None:  # no floor, or its slot is beyond the horizon: ask again later
            return False, False, WAIT_RECHECK_MS, False
        if wait <= 0:
            return True, False, 0, True
        return False, False, min(MAX_LEFT_MS, math.ceil(wait)), True

    # -- admission ------------------------------------------------------------------------
    def admit_at(self, key: CoordKey, now: float, *, retry: bool,
                 budget: BudgetSettings | None, pacing: PacingSettings | None,
                 earliest_ms: int = 0, floor_slot_due: bool = False,
                 max_wait_ms: int | None = None) -> Admission:
        """:meth:`admit` at clock reading ``now`` (one step under the lock)."""
        earliest = check_duration("earliest_ms", earliest_ms)
        with self._lock:
            cooldown = self._left(self._cooldowns, key, now)
            if max_wait_ms is not None and cooldown > max_wait_ms:
                return Admission(cooldown_ms=cooldown)  # to be refused: nothing taken or reserved
            # The pacer's slot is computed first (pure: nothing stored yet), so that a request
            # the pacer has no slot for within its horizon takes and reserves nothing at all.
            reserved: pacer.PacerState | None = None
            pacing_ms = 0
            if pacing is not None and pacing.enabled:
                state = self._pacers.get(key) or pacer.fresh()  # counted even while not pacing
                reserved, delay = pacer.reserve(state, now, pacing, max(earliest, cooldown))
                if delay is None:
                    return Admission(cooldown_ms=cooldown, pacing_booked=False)
                pacing_ms = min(MAX_LEFT_MS, delay)
            allowed: bool | None = None
            taken, budget_wait, booked = False, 0, True
            if retry and budget is not None:
                allowed, taken, budget_wait, booked = self._budget_step(key, budget, now,
                                                                        floor_slot_due)
            if allowed is False:
                pacing_ms = 0  # a refused retry reserves no slot and is not counted as sent
            elif reserved is not None:
                self._pacers[key] = reserved
            return Admission(cooldown_ms=cooldown, budget=allowed, token_taken=taken,
                             pacing_ms=pacing_ms, budget_wait_ms=budget_wait,
                             budget_slot_booked=booked)

    def record_outcome_at(self, key: CoordKey, now: float, *, success: bool, throttled: bool,
                          budget: BudgetSettings | None, pacing: PacingSettings | None) -> None:
        """:meth:`record_outcome` at clock reading ``now``."""
        with self._lock:
            if success and budget is not None:
                bucket = self._bucket(key, budget, now)
                bucket[0] = min(self._cap(budget), bucket[0] + ratio_milli(budget))
            if pacing is not None and pacing.enabled:
                state = self._pacers.get(key, pacer.fresh())
                self._pacers[key] = pacer.observe(state, now, bool(throttled), pacing,
                                                  success=bool(success))

    def count_send_at(self, key: CoordKey, now: float, delay_ms: int,
                      pacing: PacingSettings | None) -> None:
        """Count one request sent ``delay_ms`` after ``now`` in ``key``'s pacer without
        reserving a slot (its rate and slots are left alone): a guard counts here the requests
        another coordinator admitted, so that the send rate a local throttle cuts from (while
        that coordinator is down) is this process's own."""
        if pacing is None or not pacing.enabled:
            return
        with self._lock:
            state = self._pacers.get(key) or pacer.fresh()
            # reserve() of a state that is not pacing counts the send and reserves nothing
            counted, _ = pacer.reserve(replace(state, on=False), now, pacing, max(0, delay_ms))
            self._pacers[key] = replace(counted, on=state.on, rate=state.rate)

    def pacer_state(self, key: CoordKey) -> pacer.PacerState:
        """``key``'s pacer (for tests and diagnostics)."""
        with self._lock:
            return self._pacers.get(key, pacer.fresh())

    # -- credential marks -----------------------------------------------------------------
    def mark_credential_limited_at(self, provider: str, credential: str, duration_ms: int,
                                   now: float) -> None:
        duration = check_duration("duration_ms", duration_ms)
        with self._lock:
            marks = self._limited.setdefault(provider, {})
            for cred in [c for c, u in marks.items() if u <= now]:
                del marks[cred]
            self._extend(marks, credential, now + duration, now)

    def limited_credentials_at(self, provider: str, now: float) -> dict[str, int]:
        with self._lock:
            marks = self._limited.get(provider, {})
            return {c: min(MAX_LEFT_MS, math.ceil(u - now)) for c, u in marks.items() if u > now}

    # -- protocol v3 ----------------------------------------------------------------------
    async def admit(self, key: CoordKey, *, retry: bool, budget: BudgetSettings | None,
                    pacing: PacingSettings | None, earliest_ms: int = 0,
                    floor_slot_due: bool = False, max_wait_ms: int | None = None) -> Admission:
        return self.admit_at(key, self.now_ms(), retry=retry, budget=budget, pacing=pacing,
                             earliest_ms=earliest_ms, floor_slot_due=floor_slot_due,
                             max_wait_ms=max_wait_ms)

    async def learn_cooldown(self, key: CoordKey, duration_ms: int,
                             now_ms: int | None = None) -> None:
        if now_ms is not None:  # before v3: (key, until_ms, now_ms): its duration
            self.learn_cooldown_sync(key, duration_ms, now_ms)
            return
        self.learn_cooldown_at(key, duration_ms, self.now_ms())

    async def return_retry_token(self, key: CoordKey, budget: BudgetSettings) -> None:
        self.add_tokens_sync(key, budget, MILLI)

    async def record_outcome(self, key: CoordKey, *, success: bool, throttled: bool,
                             budget: BudgetSettings | None,
                             pacing: PacingSettings | None) -> None:
        self.record_outcome_at(key, self.now_ms(), success=success, throttled=throttled,
                               budget=budget, pacing=pacing)

    async def mark_credential_limited(self, provider: str, credential: str, duration_ms: int,
                                      now_ms: int | None = None) -> None:
        if now_ms is not None:  # before v3: (provider, credential, until_ms, now_ms)
            self.mark_credential_limited_sync(provider, credential, duration_ms, now_ms)
            return
        self.mark_credential_limited_at(provider, credential, duration_ms, self.now_ms())

    async def limited_credentials(self, provider: str, now_ms: int | None = None) -> dict[str, int]:
        if now_ms is not None:  # before v3: id -> end in the caller's clock
            return self.limited_credentials_sync(provider, now_ms)
        return self.limited_credentials_at(provider, self.now_ms())

    async def mark_fallback(self, key: CoordKey, duration_ms: int) -> None:
        self.mark_fallback_at(key, duration_ms, self.now_ms())

    async def fallback_left_ms(self, key: CoordKey) -> int:
        return self.fallback_left_at(key, self.now_ms())

    async def aclose(self) -> None:
        """Nothing to release (kept for the protocol)."""

    # -- before v3 (thin wrappers while the session and runner call them) ------------------
    # Before v3 a caller passed its own ``now_ms`` (epoch, or a test's fake time). Only the
    # differences ``until_ms - now_ms`` are used: everything is stored and read on this
    # coordinator's own clock, so callers of both protocols (or on clocks that disagree)
    # share one table without mixing two clocks.
    def cooldown_left_sync(self, key: CoordKey, now_ms: int) -> int:
        check_ms("now_ms", now_ms)
        return self.cooldown_left_at(key, self.now_ms())

    def learn_cooldown_sync(self, key: CoordKey, until_ms: int, now_ms: int) -> None:
        until_ms = check_ms("until_ms", until_ms)
        self.learn_cooldown_at(key, until_ms - check_ms("now_ms", now_ms), self.now_ms())

    async def cooldown_left_ms(self, key: CoordKey, now_ms: int) -> int:
        return self.cooldown_left_sync(key, now_ms)

    def take_retry_token_sync(self, key: CoordKey, budget: BudgetSettings) -> bool:
        with self._lock:
            return self._budget_step(key, budget, self.now_ms(), False)[0]

    async def take_retry_token(self, key: CoordKey, budget: BudgetSettings) -> bool:
        return self.take_retry_token_sync(key, budget)

    def before_decision_sync(self, key: CoordKey, now_ms: int,
                             budget: BudgetSettings | None) -> tuple[int, bool | None]:
        left = self.cooldown_left_sync(key, now_ms)
        return left, (None if budget is None else self.take_retry_token_sync(key, budget))

    async def before_decision(self, key: CoordKey, now_ms: int,
                              budget: BudgetSettings | None) -> tuple[int, bool | None]:
        return self.before_decision_sync(key, now_ms, budget)

    async def credit_success(self, key: CoordKey, budget: BudgetSettings) -> None:
        self.add_tokens_sync(key, budget, ratio_milli(budget))

    def mark_credential_limited_sync(self, provider: str, credential: str, until_ms: int,
                                     now_ms: int) -> None:
        until_ms = check_ms("until_ms", until_ms)
        self.mark_credential_limited_at(provider, credential, until_ms - check_ms("now_ms", now_ms),
                                        self.now_ms())

    def limited_credentials_sync(self, provider: str, now_ms: int) -> dict[str, int]:
        check_ms("now_ms", now_ms)
        return {c: now_ms + left for c, left in self.limited_credentials_at(provider, self.now_ms()).items()}


_default: InProcessCoordinator | None = None
_default_lock = threading.Lock()


def default_coordinator() -> InProcessCoordinator:
    """The process's embedded coordinator, created on first use and shared by every session
    that is given no other one."""
    global _default
    with _default_lock:
        if _default is None:
            _default = InProcessCoordinator()
        return _default
