"""The resilient profile's fleet side, as the simulation runs it: admission and pacing.

The brain decides every failure (with the resilient profile's settings, a shared cooldown
and its own jitter); what is here is the part of the host and of the fleet's coordinator that
``docs/fleet.md`` describes and the simulation needs before the shared pacer lands in
``fsm.core.pacing``:

- **first-request admission**: a call's first request asks the fleet's coordinator first; a
  known cooldown delays it (upward jitter, as a hinted wait), a cooldown longer than
  ``maxHintWaitMs`` fails the call at once with no request sent (a refusal at rest);
- **pacing** (:class:`Pacer`): every request — first or retry — takes the next slot of one
  pacer shared by the fleet. The pacer learns the provider's capacity from its throttling
  answers as AWS SDK's adaptive retry mode does (a throttle cuts the rate to β × the rate
  measured; successes grow it again), keeps a floor rate whose probes detect recovery (as
  Linkerd's ``minRetriesPerSecond``), and after a fault jumps back to half the throughput it
  saw before (fast recovery). No throttle for :attr:`Pacer.idle_ms`: the pacer steps aside.

Sources: https://docs.aws.amazon.com/sdkref/latest/guide/feature-retry-behavior.html (adaptive
mode: client-side rate limiting with a token bucket and CUBIC), https://linkerd.io/2/reference/retries/
(retry budget with a minimum retries per second).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Callable

from fsm.sim.engine import DONE_FAIL, SEND, WAIT, session_rng
from fsm.sim.policies import EPOCH_MS, BrainPolicy, BrainRetrier
from fsm.sim.world import Answer, Provider

__all__ = ["PacerSettings", "Pacer", "CorePacer", "WaitBudgetSettings", "WaitBudget",
           "ResilientRetrier", "make_resilient_factory"]

_CAPACITY_SIGNALS = frozenset(("overloaded", "rate_limited", "window", "unavailable"))
"""Answers that say "no capacity now" (429, 503, 529): a random 500 and a usage limit do not."""

_ADMIT = -1  # the timer token of a first request that waits for its admission
_PACE = -2   # the timer token of a request that asks the pacer again
_BUDGET = -3  # the timer token of a retry that waits for the retry budget


@dataclass(frozen=True, slots=True)
class PacerSettings:
    """The pacer's knobs.

    - ``floor_rps``: the rate never goes below this (requests/s, shared by the fleet): the
      probes that detect recovery;
    - ``beta``: a throttle cuts the rate to ``beta`` × the send rate measured over the last
      second (AWS adaptive mode's β = 0.7); one cut per round: only a throttle of a request
      sent after the last cut cuts again;
    - ``growth_per_s``: each second with successes grows the rate by this share;
      ``fast_growth_per_s`` while the rate is below 0.9 × the rate last throttled (CUBIC's
      W_max) or below the best throughput seen lately: capacity known to exist;
    - ``cut_interval_ms``: at most one cut per this many ms (the answers of one round);
    - ``horizon_ms``: a slot is booked at most this far ahead; a request that finds none asks
      again later (``poll_ms``, jittered), so a rate that recovers is used at once;
    - ``idle_ms``: no throttle for this long and the pacer stops pacing;
    - ``memory_s``: the best throughput seen is forgotten with this half-life (fast recovery
      jumps back to half of it).
    """

    floor_rps: float = 1.0
    beta: float = 0.7
    growth_per_s: float = 0.03
    fast_growth_per_s: float = 0.5
    cut_interval_ms: int = 1_000
    horizon_ms: int = 2_000
    poll_ms: int = 3_000
    idle_ms: int = 30_000
    memory_s: float = 600.0


class Pacer:
    """One fleet's pacer (shared by all its sessions). Times in virtual ms."""

    __slots__ = ("s", "rate", "next_ms", "sent", "ok", "last_cut", "last_grow", "good",
                 "good_t", "ok_s", "ok_n", "w_max", "_ln_growth", "_ln_fast")

    def __init__(self, settings: PacerSettings) -> None:
        self.s = settings
        self.rate: float | None = None   # requests/s; None: not pacing
        self.next_ms = 0.0               # the next free slot
        self.sent: dict[int, int] = {}   # 100-ms bin -> requests sent in it
        self.ok: dict[int, int] = {}     # 1-s bin -> successes answered in it
        self.last_cut = -math.inf
        self.last_grow = 0
        self.good = 0.0                  # the best successes/s seen lately (decaying)
        self.good_t = 0
        self.ok_s, self.ok_n = 0, 0      # successes answered in the current second
        self.w_max = 0.0                 # the rate measured at the last cut (CUBIC's W_max)
        self._ln_growth = math.log1p(settings.growth_per_s)
        self._ln_fast = math.log1p(settings.fast_growth_per_s)

    def slot(self, t: int) -> int | None:
        """The send time of a request that wants to go at ``t`` (booked now), or None when
        no slot is free within the horizon (ask again later)."""
        rate = self.rate
        if rate is not None and t - self.last_cut > self.s.idle_ms:
            rate = self.rate = None
        if rate is None:
            at = float(t)
        else:
            at = max(float(t), self.next_ms)
            if at - t > self.s.horizon_ms:
                return None
            self.next_ms = at + 1000.0 / rate
        booked = math.ceil(at)
        b = booked // 100
        self.sent[b] = self.sent.get(b, 0) + 1
        return booked

    def _send_rate(self, t: int) -> float:
        b = t // 100
        get = self.sent.get
        return float(sum(get(k, 0) for k in range(b - 9, b + 1)))

    def _best(self, t: int) -> float:
        return self.good * 0.5 ** ((t - self.good_t) / 1000 / self.s.memory_s)

    def answered(self, t: int, sent_at: int, answer: Answer) -> None:
        """Learn from the answer heard at ``t`` to a request sent at ``sent_at``."""
        if answer.ok:
            s = t // 1000
            if s != self.ok_s:                    # the last second is complete: measure it
                if self.ok_n > self._best(t):
                    self.good, self.good_t = float(self.ok_n), t
                self.ok_s, self.ok_n = s, 0
            self.ok_n += 1
            rate = self.rate
            if rate is not None:
                best = self._best(t)
                if rate < best / 2:
                    if rate <= 2 * self.s.floor_rps:   # back from an outage: the capacity is
                        self.w_max = max(self.w_max, best)  # known to reach the best seen lately
                    rate = best / 2                # fast recovery: capacity is back
                dt = t - self.last_grow
                if dt > 0:
                    ln = self._ln_fast if rate < 0.9 * self.w_max else self._ln_growth
                    rate *= math.exp(ln * min(dt, 1000) / 1000)
                self.rate = rate
                self.last_grow = t
            return
        if (answer.kind not in _CAPACITY_SIGNALS or sent_at < self.last_cut
                or t - self.last_cut < self.s.cut_interval_ms):
            return
        measured = self._send_rate(t)
        base = measured if self.rate is None else min(self.rate, measured or self.rate)
        self.w_max = base
        self.rate = max(self.s.floor_rps, self.s.beta * base)
        self.last_cut = self.last_grow = t
        self.next_ms = max(self.next_ms, float(t))


class CorePacer:
    """The fleet's own pure pacer (``fsm.core.pacing``: AWS adaptive mode's CUBIC token bucket
    with a floor) behind the simulation's pacer interface, with ``retry.pacing`` settings
    (``PacingSettings``). The booking horizon and the polls are the host's, as in
    :class:`Pacer`."""

    __slots__ = ("s", "pacing", "core", "state")

    def __init__(self, settings: PacerSettings, pacing: Any) -> None:
        from fsm.core import pacing as core

        self.s = settings
        self.pacing = pacing
        self.core = core
        self.state = core.fresh()

    def slot(self, t: int) -> int | None:
        self.state, delay = self.core.reserve(self.state, t, self.pacing)
        return None if delay is None else t + delay

    def answered(self, t: int, sent_at: int, answer: Answer) -> None:
        self.state = self.core.observe(self.state, t, answer.kind in _CAPACITY_SIGNALS, self.pacing,
                                       success=answer.ok)


@dataclass(frozen=True, slots=True)
class WaitBudgetSettings:
    """The retry budget in wait mode (gRPC retry throttling plus Linkerd's floor).

    - ``max_tokens``, ``token_ratio``: gRPC's bucket (it starts full; a retry takes a token and
      is allowed while more than half are left; a success gives back ``token_ratio``);
    - ``min_retries_per_second``: retries the fleet may send per second whatever the bucket
      says (Linkerd's ``minRetriesPerSecond``).

    A retry the budget cannot afford waits (holding no token) and asks again after a poll.
    """

    max_tokens: int = 100
    token_ratio: float = 0.1
    min_retries_per_second: float = 10.0


class WaitBudget:
    """One fleet's retry budget in wait mode (see :class:`WaitBudgetSettings`)."""

    __slots__ = ("s", "tokens", "floor_next")

    def __init__(self, settings: WaitBudgetSettings) -> None:
        self.s = settings
        self.tokens = float(settings.max_tokens)
        self.floor_next = 0.0

    def allow(self, t: int) -> bool:
        """May a retry go at ``t``? (It takes a token, or a slot of the floor.)"""
        if self.tokens - 1 > self.s.max_tokens / 2:
            self.tokens -= 1
            return True
        floor = self.s.min_retries_per_second
        if floor > 0 and t >= self.floor_next:
            self.floor_next = max(self.floor_next, float(t)) + 1000.0 / floor
            return True
        return False

    def credit(self) -> None:
        """A success: ``token_ratio`` back, up to ``max_tokens``."""
        self.tokens = min(float(self.s.max_tokens), self.tokens + self.s.token_ratio)


class ResilientRetrier(BrainRetrier):
    """A session under the resilient profile: the brain, plus first-request admission and
    the fleet's pacer (see the module docstring)."""

    __slots__ = ("pacer", "budget", "sent_at")

    def __init__(self, policy: BrainPolicy, session: int, rng: random.Random, pacer: Any,
                 budget: WaitBudget | None = None) -> None:
        super().__init__(policy, session, rng)
        self.pacer = pacer
        self.budget = budget
        self.sent_at = 0

    def start(self, t: int) -> tuple[int, int, int]:
        return self._admit(t)

    def _admit(self, t: int) -> tuple[int, int, int]:
        settings = self.policy.settings
        left = self.coord.cooldown_left_sync(self.policy.key, EPOCH_MS + t)
        if left > settings.max_hint_wait_ms:
            return DONE_FAIL, t, 0                 # refused at rest: nothing is sent
        if left > 0:
            return WAIT, t + settings.hinted_delay_ms(left, self.rng.random), _ADMIT
        return self._paced(t)

    def _paced(self, t: int) -> tuple[int, int, int]:
        at = self.pacer.slot(t)
        if at is None:
            return self._poll(t, _PACE)
        self.sent_at = at
        return SEND, at, 0

    def _poll(self, t: int, token: int) -> tuple[int, int, int]:
        return WAIT, t + int(self.pacer.s.poll_ms * (0.5 + self.rng.random())), token

    def _retry(self, t: int) -> tuple[int, int, int]:
        if self.budget is not None and not self.budget.allow(t):
            return self._poll(t, _BUDGET)
        return self._paced(t)

    def answered(self, t: int, answer: Answer) -> tuple[int, int, int]:
        self.pacer.answered(t, self.sent_at, answer)
        if answer.ok and self.budget is not None:
            self.budget.credit()
        return super().answered(t, answer)

    def timer(self, t: int, token: int) -> tuple[int, int, int]:
        if token == _ADMIT:
            return self._admit(t)
        if token == _PACE:
            return self._paced(t)
        if token == _BUDGET:
            return self._retry(t)
        return self.carry_out(t, self.brain.backoff_elapsed(token))

    def carry_out(self, t: int, actions: list) -> tuple[int, int, int]:
        what, at, token = super().carry_out(t, actions)
        if what == SEND:          # a retry: the budget, then the pacer's next slot
            return self._retry(at)
        return what, at, token


def make_resilient_factory(policy: BrainPolicy, seed: int, settings: PacerSettings,
                           budget: WaitBudgetSettings | None = None,
                           ) -> Callable[[int, Provider, Any], ResilientRetrier]:
    """``make_retrier`` for the resilient profile: one pacer, one coordinator and (with
    ``budget``) one retry budget in wait mode for the fleet.
    The pacer is the fleet's own (:class:`CorePacer`) when the settings carry ``retry.pacing``,
    else the simulation's (:class:`Pacer`)."""
    pacing = getattr(policy.settings, "pacing", None)
    pacer: Any = CorePacer(settings, pacing) if pacing is not None else Pacer(settings)

    shared_budget = WaitBudget(budget) if budget is not None else None

    def make(session: int, provider: Provider, context: Any) -> ResilientRetrier:
        return ResilientRetrier(policy, session, session_rng(seed, session, 1), pacer, shared_budget)
    return make

