"""The coordinator's vocabulary: its key, the protocol, its errors, the budget in milli-tokens.

The budget's settings are :class:`fsm.core.settings.BudgetSettings` (``retry.budget``).

Strictly private: import these names from :mod:`fsm.fleet`.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from fsm.core.settings import BudgetSettings

#: The credential id of a session that uses its provider's default credential (no store).
DEFAULT_CREDENTIAL = "default"

# gRPC's retry throttling keeps its token count in thousandths of a token
# (``tokenRatio`` has at most three decimal places): integer arithmetic, exact in Lua too.
MILLI = 1000


def credential_id(api_key: str | None) -> str:
    """A short, stable id for ``api_key``: the first 16 hex digits of its SHA-256.

    The coordinator and the Redis store key everything by this id; a key itself is never
    stored, sent or logged. ``None`` or ``""`` (the provider's default credential) gives
    :data:`DEFAULT_CREDENTIAL`. Raises ``TypeError`` for a non-string.
    """
    if api_key is None or api_key == "":
        return DEFAULT_CREDENTIAL
    if not isinstance(api_key, str):
        raise TypeError(f"api_key must be a string or None, got {type(api_key).__name__}")
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()[:16]


def wall_ms() -> int:
    """Wall-clock time in epoch milliseconds: what every ``now_ms``/``until_ms`` is counted in
    (processes on several machines must agree on it, so it is not a monotonic clock)."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class CoordKey:
    """What sessions share limits on: one provider account's model.

    ``credential`` is a :func:`credential_id`, never a key in clear. All three are non-empty
    strings (``ValueError`` naming the field otherwise).
    """

    provider: str
    model: str
    credential: str = DEFAULT_CREDENTIAL

    def __post_init__(self) -> None:
        for name in ("provider", "model", "credential"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"CoordKey.{name} must be a non-empty string, got {value!r}")


def max_milli(budget: BudgetSettings) -> int:
    """The bucket's size in thousandths of a token."""
    return budget.max_tokens * MILLI


def ratio_milli(budget: BudgetSettings) -> int:
    """What one success gives back, in thousandths of a token: ``token_ratio`` kept to three
    decimal places as gRPC does, and at least 0.001."""
    return max(1, round(budget.token_ratio * MILLI))


class CoordinatorError(Exception):
    """The coordinator did not answer (connection refused, reset, timed out, script error).

    The message is safe to show: it names the server's address, never a password.
    """


@runtime_checkable
class Coordinator(Protocol):
    """What sessions of a fleet agree on (``docs/fleet.md``), keyed by :class:`CoordKey`.

    Every time is wall-clock epoch ms (:func:`wall_ms`). The shell calls the reads before
    handing a turn's end to the brain and the writes after the decision; no call happens
    inside a transition.
    """

    async def cooldown_left_ms(self, key: CoordKey, now_ms: int) -> int:
        """Milliseconds left of the cooldown learned for ``key`` (0 when none)."""

    async def learn_cooldown(self, key: CoordKey, until_ms: int, now_ms: int) -> None:
        """Record that ``key`` is cooling down until ``until_ms``; the later of the old and the
        new time is kept, and the record expires at it."""

    async def take_retry_token(self, key: CoordKey, budget: BudgetSettings) -> bool:
        """One atomic step: take a token (a new bucket starts full, at ``max_tokens``);
        True when the count left is above ``max_tokens / 2`` (the retry is allowed)."""

    async def before_decision(self, key: CoordKey, now_ms: int,
                              budget: BudgetSettings | None) -> tuple[int, bool | None]:
        """What the shell reads before handing a retryable failure to the brain, in one step
        (one round trip on Redis): ``(cooldown_left_ms(key, now_ms), take_retry_token(key,
        budget))``, the second ``None`` (and no token taken) when ``budget`` is ``None``."""

    async def return_retry_token(self, key: CoordKey, budget: BudgetSettings) -> None:
        """Give back the token of a retry the brain refused for another reason (capped)."""

    async def credit_success(self, key: CoordKey, budget: BudgetSettings) -> None:
        """A success: add ``token_ratio`` tokens, capped at ``max_tokens``."""

    async def mark_credential_limited(self, provider: str, credential: str, until_ms: int,
                                      now_ms: int) -> None:
        """Record that ``credential`` (an id) of ``provider`` hit its usage limit until
        ``until_ms`` (the later of old and new is kept)."""

    async def limited_credentials(self, provider: str, now_ms: int) -> dict[str, int]:
        """The credential ids of ``provider`` still limited at ``now_ms`` -> until (epoch ms)."""

    async def aclose(self) -> None:
        """Release connections; the coordinator is not used after this."""


def check_ms(name: str, value: Any) -> int:
    """``value`` as an epoch-ms int; ``TypeError`` naming ``name`` for anything else."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and math.isfinite(value):
            return int(value)
        raise TypeError(f"{name} must be an integer number of ms, got {value!r}")
    return value
