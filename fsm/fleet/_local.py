"""The embedded coordinator: one per process, shared by every session in it.

Strictly private: import these names from :mod:`fsm.fleet`.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from fsm.fleet._types import MILLI, BudgetSettings, CoordKey, check_ms, max_milli, ratio_milli

#: A bucket nobody touched for this long is dropped, which is the same as full again.
DEFAULT_BUCKET_IDLE_MS = 600_000

# Expired entries are swept when a table grows past this many keys (keys are per
# provider/model/credential, so this is a safety net, not a hot path).
_SWEEP_AT = 1024


class InProcessCoordinator:
    """Cooldowns, retry budgets and credential marks in this process's memory.

    The semantics are those of the :class:`~fsm.fleet.Coordinator` protocol and of the Redis
    scripts (``docs/fleet.md``): the later cooldown wins, a bucket starts full and counts in
    thousandths of a token, a bucket idle for ``bucket_idle_ms`` is full again. Thread-safe
    (several event loops in threads may share one). ``monotonic_ms`` measures idleness
    (inject it in tests).
    """

    self_bounded = True
    """Every call answers at once (no I/O) and never raises for valid input."""

    def __init__(self, *, bucket_idle_ms: int = DEFAULT_BUCKET_IDLE_MS,
                 monotonic_ms: Callable[[], float] = lambda: time.monotonic() * 1000) -> None:
        if isinstance(bucket_idle_ms, bool) or not isinstance(bucket_idle_ms, int) or bucket_idle_ms < 1:
            raise ValueError(f"bucket_idle_ms must be a positive integer, got {bucket_idle_ms!r}")
        self.bucket_idle_ms = bucket_idle_ms
        self._monotonic_ms = monotonic_ms
        self._lock = threading.Lock()
        # key -> until (epoch ms); an entry at or before now is dead and may be swept.
        self._cooldowns: dict[CoordKey, int] = {}
        # key -> [milli-tokens, last touched (monotonic ms)]; 0 <= milli-tokens <= max; a
        # missing or idle bucket is full.
        self._buckets: dict[CoordKey, list[float]] = {}
        # provider -> credential id -> until (epoch ms).
        self._limited: dict[str, dict[str, int]] = {}

    # -- cooldowns ------------------------------------------------------------------------
    def cooldown_left_sync(self, key: CoordKey, now_ms: int) -> int:
        until = self._cooldowns.get(key, 0)
        return until - now_ms if until > now_ms else 0

    def learn_cooldown_sync(self, key: CoordKey, until_ms: int, now_ms: int) -> None:
        until_ms = check_ms("until_ms", until_ms)
        with self._lock:
            if until_ms > self._cooldowns.get(key, 0) and until_ms > now_ms:
                self._cooldowns[key] = until_ms
            if len(self._cooldowns) > _SWEEP_AT:
                self._cooldowns = {k: u for k, u in self._cooldowns.items() if u > now_ms}

    async def cooldown_left_ms(self, key: CoordKey, now_ms: int) -> int:
        return self.cooldown_left_sync(key, now_ms)

    async def learn_cooldown(self, key: CoordKey, until_ms: int, now_ms: int) -> None:
        self.learn_cooldown_sync(key, until_ms, now_ms)

    # -- the retry budget -----------------------------------------------------------------
    def _bucket(self, key: CoordKey, budget: BudgetSettings, now: float) -> list[float]:
        bucket = self._buckets.get(key)
        if bucket is None or now - bucket[1] >= self.bucket_idle_ms:
            bucket = self._buckets[key] = [max_milli(budget), now]
            if len(self._buckets) > _SWEEP_AT:
                self._buckets = {k: b for k, b in self._buckets.items()
                                 if now - b[1] < self.bucket_idle_ms}
                self._buckets[key] = bucket
        bucket[0] = min(bucket[0], max_milli(budget))
        bucket[1] = now
        return bucket

    def tokens(self, key: CoordKey, budget: BudgetSettings) -> float:
        """The bucket's count now, in tokens (for tests and diagnostics)."""
        with self._lock:
            return self._bucket(key, budget, self._monotonic_ms())[0] / MILLI

    def set_tokens_milli(self, key: CoordKey, budget: BudgetSettings, milli: int) -> None:
        """Set the bucket's count (thousandths of a token, clipped to 0..max): a guard copies
        the fleet's count here so that its fallback continues from it."""
        with self._lock:
            bucket = self._bucket(key, budget, self._monotonic_ms())
            bucket[0] = max(0, min(max_milli(budget), int(milli)))

    def take_retry_token_sync(self, key: CoordKey, budget: BudgetSettings) -> bool:
        with self._lock:
            bucket = self._bucket(key, budget, self._monotonic_ms())
            bucket[0] = max(0, bucket[0] - MILLI)
            return bucket[0] * 2 > max_milli(budget)

    def add_tokens_sync(self, key: CoordKey, budget: BudgetSettings, milli: int) -> None:
        with self._lock:
            bucket = self._bucket(key, budget, self._monotonic_ms())
            bucket[0] = min(max_milli(budget), bucket[0] + milli)

    async def take_retry_token(self, key: CoordKey, budget: BudgetSettings) -> bool:
        return self.take_retry_token_sync(key, budget)

    def before_decision_sync(self, key: CoordKey, now_ms: int,
                             budget: BudgetSettings | None) -> tuple[int, bool | None]:
        left = self.cooldown_left_sync(key, now_ms)
        return left, (None if budget is None else self.take_retry_token_sync(key, budget))

    async def before_decision(self, key: CoordKey, now_ms: int,
                              budget: BudgetSettings | None) -> tuple[int, bool | None]:
        return self.before_decision_sync(key, now_ms, budget)

    async def return_retry_token(self, key: CoordKey, budget: BudgetSettings) -> None:
        self.add_tokens_sync(key, budget, MILLI)

    async def credit_success(self, key: CoordKey, budget: BudgetSettings) -> None:
        self.add_tokens_sync(key, budget, ratio_milli(budget))

    # -- credential marks -----------------------------------------------------------------
    def mark_credential_limited_sync(self, provider: str, credential: str, until_ms: int,
                                     now_ms: int) -> None:
        until_ms = check_ms("until_ms", until_ms)
        with self._lock:
            marks = self._limited.setdefault(provider, {})
            for cred in [c for c, u in marks.items() if u <= now_ms]:
                del marks[cred]
            if until_ms > marks.get(credential, 0) and until_ms > now_ms:
                marks[credential] = until_ms

    def limited_credentials_sync(self, provider: str, now_ms: int) -> dict[str, int]:
        with self._lock:
            return {c: u for c, u in self._limited.get(provider, {}).items() if u > now_ms}

    async def mark_credential_limited(self, provider: str, credential: str, until_ms: int,
                                      now_ms: int) -> None:
        self.mark_credential_limited_sync(provider, credential, until_ms, now_ms)

    async def limited_credentials(self, provider: str, now_ms: int) -> dict[str, int]:
        return self.limited_credentials_sync(provider, now_ms)

    async def aclose(self) -> None:
        """Nothing to release (kept for the protocol)."""


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
