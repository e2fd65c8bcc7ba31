"""The coordinator's vocabulary: its key, protocol v3, its answer, its errors, the budget in
milli-tokens, and the limits every value read is clamped to.

The budget's settings are :class:`fsm.core.settings.BudgetSettings` (``retry.budget``), the
pacing's :class:`fsm.core.settings.PacingSettings` (``retry.pacing``).

Strictly private: import these names from :mod:`fsm.fleet`.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from fsm.core.settings import BudgetSettings, PacingSettings

#: No duration a coordinator tells (cooldown, pacing slot, budget wait, credential mark,
#: fallback mark) is longer than this: 400 days in ms. A value read beyond it is not a
#: duration anyone meant (a peer writing microseconds, a corrupted key): that key is
#: ignored, never passed on, so no caller formats an absurd clock text (docs/fleet.md).
MAX_LEFT_MS = 400 * 86_400_000

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


class CoordinatorSlowError(CoordinatorError):
    """The coordinator did not answer within a socket's timeout: slow, not known to be down
    (a guard answers locally, "unknown", and a probe decides whether it is down)."""


class CoordinatorKeyError(CoordinatorError):
    """The server answered, but not with what one key's step should give (a reply of the
    wrong shape, a script error on one key's data): that key is answered locally; the
    coordinator is not down (no ``coordinator_unavailable`` event)."""


@dataclass(frozen=True, slots=True)
class Admission:
    """The answer of one atomic coordinator step before a request goes out (:meth:`Coordinator.admit`).

    - ``cooldown_ms``: time left of the key's cooldown (0 = none), 0..:data:`MAX_LEFT_MS`;
    - ``budget``: ``True`` the retry budget allows the retry, ``False`` it does not, ``None``
      no budget configured or a first request (``retry=False``);
    - ``token_taken``: a budget token was taken: give it back
      (:meth:`Coordinator.return_retry_token`) if the retry is not sent after all;
    - ``pacing_ms``: delay until the pacing slot reserved for this request (0 = now or no
      pacing); the slot is reserved at or after the cooldown's end and ``earliest_ms``;
    - ``pacing_booked``: ``True`` unless pacing is on and the pacer had no slot within its
      horizon (``retry.pacing.horizonMs`` after the time the request wants to go,
      :func:`fsm.core.pacing.reserve`). ``False``: nothing was taken or reserved (no
      pacing slot, no send counted, no budget token, no floor slot: ``budget`` is None,
      ``pacing_ms`` and ``budget_wait_ms`` are 0; ``cooldown_ms`` is told) and the request
      does not go: the host asks again (a new ``admit``) after ``retry.pacing.recheckMs``,
      which it jitters itself (×U(0.5, 1.5)), so that a rate that recovers meanwhile is used
      at once (docs/fleet.md "Pacing");
    - ``budget_wait_ms``: with a budget in wait mode that refused (``budget`` False), how
      long the retry waits before it asks again; 0 otherwise. No token is held meanwhile.
      With :attr:`budget_slot_booked` True it is the time until the floor slot reserved for
      this retry, when the caller re-checks with ``floor_slot_due=True``;
    - ``budget_slot_booked``: ``False`` only when a budget in wait mode refused and reserved
      no floor slot (no floor, ``minRetriesPerSecond: 0``, or its next slot starts beyond
      :data:`fsm.fleet.FLOOR_HORIZON_MS` from now): ``budget_wait_ms`` is then
      :data:`fsm.fleet.WAIT_RECHECK_MS`, which the host jitters (×U(0.5, 1.5)) before it
      asks again with ``floor_slot_due=False`` (the bucket is asked afresh: a token if it
      has one, else a floor slot or another wait). ``True`` in every other answer
      (docs/fleet.md "Budget in wait mode").
    - ``token``: with ``token_taken``, an id of that token a coordinator that tracks tokens
      gives (the guard: :class:`~fsm.fleet.GuardedCoordinator`), to pass back as
      ``return_retry_token(key, budget, token=...)``: that token is given back once, to
      where it was taken, however often it is passed. None otherwise (not compared).

    :attr:`delay_ms` is the largest of the three waits.
    """

    cooldown_ms: int = 0
    budget: bool | None = None
    token_taken: bool = False
    pacing_ms: int = 0
    budget_wait_ms: int = 0
    pacing_booked: bool = True
    budget_slot_booked: bool = True
    token: int | None = field(default=None, compare=False)

    @property
    def delay_ms(self) -> int:
        """``max(cooldown_ms, pacing_ms, budget_wait_ms)``: how long before the request goes,
        when :attr:`pacing_booked` is True. With it False the request does not go after this:
        it is only the wait the other terms impose, and the request asks again after
        ``recheckMs`` (jittered) or this, whichever is later."""
        return max(self.cooldown_ms, self.pacing_ms, self.budget_wait_ms)


@runtime_checkable
class Coordinator(Protocol):
    """Coordinator protocol v3: what sessions of a fleet agree on (``docs/fleet.md``), keyed by
    :class:`CoordKey`.

    Durations in, time left out: no call takes or returns one machine's wall time. The
    in-process coordinator reads the host clock it was given; Redis keeps cooldowns as keys
    with a ``PX`` expiry (time left = ``PTTL``) and the rest on the server's ``TIME``. Every
    duration returned is an int in 0..:data:`MAX_LEFT_MS`. The shell calls ``admit`` before
    a request goes out and the writes after the decision; no call happens inside a
    transition.
    """

    async def admit(self, key: CoordKey, *, retry: bool, budget: BudgetSettings | None,
                    pacing: PacingSettings | None, earliest_ms: int = 0,
                    floor_slot_due: bool = False, max_wait_ms: int | None = None) -> Admission:
        """One atomic step before a request goes out: read the cooldown; for a retry
        (``retry=True``) with a budget, take a token (gRPC retry throttling; in wait mode a
        retry the bucket cannot afford takes none and gets a floor slot); with pacing on,
        reserve the request's pacing slot, not before the cooldown's end nor
        ``earliest_ms`` from now (with pacing on, every request admitted is counted as sent,
        paced or not: the send rate a first throttle cuts from). When the pacer has no slot
        within ``pacing.horizon_ms`` of that time, nothing is taken, reserved or counted
        (the pacer is asked before the budget) and the answer is the cooldown with
        ``pacing_booked=False``: the request does not go, the host asks again after
        ``pacing.recheck_ms`` (jittered by the host). A first request (``retry=False``) gets
        the cooldown and the pacing slot, no budget token. In wait mode the floor's slot is
        reserved only when it starts within :data:`fsm.fleet.FLOOR_HORIZON_MS` of now;
        otherwise (or with no floor) nothing is reserved and the answer is ``budget=False,
        budget_wait_ms=WAIT_RECHECK_MS, budget_slot_booked=False``: the host waits
        ``budget_wait_ms`` jittered (×U(0.5, 1.5)), then asks again with
        ``floor_slot_due=False``. ``floor_slot_due``: this retry waited for the floor slot an
        earlier ``admit`` reserved for it (``budget_wait_ms`` of an answer with
        ``budget_slot_booked`` True), which is now due: it is admitted (the bucket is still
        tried first). Only a booked slot is re-checked with ``floor_slot_due=True``.
        ``max_wait_ms``: the longest cooldown the caller would wait out (``maxHintWaitMs``);
        beyond it the answer is the cooldown alone, with no token taken and no slot
        reserved (the request will be refused)."""

    async def learn_cooldown(self, key: CoordKey, duration_ms: int) -> None:
        """``key`` cools down for ``duration_ms`` from now; the later end wins."""

    async def return_retry_token(self, key: CoordKey, budget: BudgetSettings) -> None:
        """Give back the token of a retry that was not sent (capped at the bucket's size)."""

    async def record_outcome(self, key: CoordKey, *, success: bool, throttled: bool,
                             budget: BudgetSettings | None,
                             pacing: PacingSettings | None) -> None:
        """An answer came back: a success credits the budget ``token_ratio``; with pacing
        on, ``throttled`` (a capacity signal: 429, 503, 529, a connection error, a stall)
        cuts the pacing rate (at most once per ``pacing.cut_interval_ms``; while not pacing,
        only when the key hears more than one throttle a second: a lone throttle is counted,
        SPEC §15.7), a ``success``
        lets it grow (and counts towards the best throughput remembered), and any other
        answer (a fatal error, a usage limit) teaches the pacer nothing
        (:func:`fsm.core.pacing.observe`)."""

    async def mark_credential_limited(self, provider: str, credential: str,
                                      duration_ms: int) -> None:
        """``credential`` (an id) of ``provider`` hit its usage limit for ``duration_ms``
        from now; the later end wins."""

    async def limited_credentials(self, provider: str) -> dict[str, int]:
        """The credential ids of ``provider`` still limited -> ms left (> 0)."""

    async def mark_fallback(self, key: CoordKey, duration_ms: int) -> None:
        """The primary model of ``key`` is cooling down for ``duration_ms``: prompts start
        on a fallback model until then (the *fallback mark*); the later end wins."""

    async def fallback_left_ms(self, key: CoordKey) -> int:
        """Time left of ``key``'s fallback mark (0 = none: start on the primary)."""

    async def aclose(self) -> None:
        """Release connections; the coordinator is not used after this."""


@runtime_checkable
class FleetCoordinator(Coordinator, Protocol):
    """A coordinator a host starts and stops: what :func:`fsm.fleet.coordinator_from_url`
    returns (an :class:`~fsm.fleet.InProcessCoordinator`, a
    :class:`~fsm.fleet.GuardedCoordinator` or a :class:`~fsm.fleet.RedisCoordinator`).

    ``await coordinator.warm_up()`` when the host starts (docs/fleet.md "When Redis is down"),
    ``await coordinator.aclose()`` when it stops, and the protocol v3 calls between.
    """

    async def warm_up(self) -> bool | None:
        """Connect now, so that the first burst of failures does not pay for connecting. The
        guarded and in-process coordinators answer whether the remote answered (never
        raising); a bare :class:`~fsm.fleet.RedisCoordinator` returns None and raises
        :class:`~fsm.fleet.CoordinatorError` when its server does not answer."""


def check_duration(name: str, value: Any) -> int:
    """A duration given by the caller, as an int in 0..:data:`MAX_LEFT_MS` (negative -> 0,
    beyond the maximum -> the maximum); ``TypeError`` naming ``name`` for a non-number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise TypeError(f"{name} must be a number of ms, got {value!r}")
    return max(0, min(MAX_LEFT_MS, math.ceil(value)))


def clamp_left(value: Any) -> int:
    """A time left *read* from a store, as an int in 0..:data:`MAX_LEFT_MS`: anything that is
    not a finite number, or is beyond the maximum, is 0 (the value is ignored, never raised
    and never passed on); negative is 0."""
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return 0
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    if isinstance(value, float) and not math.isfinite(value):
        return 0
    if value <= 0 or value > MAX_LEFT_MS:
        return 0
    return int(math.ceil(value))


def check_ms(name: str, value: Any) -> int:
    """``value`` as an epoch-ms int; ``TypeError`` naming ``name`` for anything else."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and math.isfinite(value):
            return int(value)
        raise TypeError(f"{name} must be an integer number of ms, got {value!r}")
    return value
