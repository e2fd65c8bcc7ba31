"""The resilient profile's host side, as the simulation runs it: admission and the pacing gate.

The brain decides every failure with the resilient profile's settings (``retry.profile:
"resilient"``: hints honoured with upward jitter, chains bounded by time, the retry budget in
wait mode, pacing on); one in-process coordinator (:class:`fsm.fleet.InProcessCoordinator`)
shared by every session of the fleet keeps the cooldowns and the retry budget (as the Redis
coordinator would for a fleet of processes), and its pacer (:mod:`fsm.core.pacing`) paces every
request. What is here is the host loop that
``fsm.host`` runs on an event loop, on the virtual clock instead (docs/fleet.md):

- **first-request admission**: a call's first request asks the coordinator first; a known
  cooldown delays it (upward jitter, as a hinted wait), a cooldown longer than
  ``maxHintWaitMs`` fails the call at once with no request sent (a refusal at rest);
- **the retry's decision**: the coordinator's cooldown and the budget's answer (a token, or in
  wait mode the floor's next slot) are the brain's facts; a retry the budget cannot afford
  waits in ``backing_off`` and asks again at its slot (the brain's re-check row);
- **the pacing gate**: right before any request goes (first or retry) it takes the pacer's next
  slot; with no slot within the pacer's horizon, nothing is reserved and the request asks
  again after ``recheck_ms`` × U(0.5, 1.5).
"""

from __future__ import annotations

import random
from typing import Any, Callable

from fsm.sim.engine import DONE_FAIL, SEND, WAIT, session_rng
from fsm.core.brain import ContinueTurn, ReturnRetryToken, TurnFacts
from fsm.sim.policies import EPOCH_MS, BrainPolicy, BrainRetrier
from fsm.sim.world import Answer, Provider

__all__ = ["ResilientRetrier", "make_resilient_factory"]

_ADMIT = -1  # the timer token of a first request that waits for its admission
_PACE = -2   # the timer token of a request that asks the pacer again

class ResilientRetrier(BrainRetrier):
    """A session under the resilient profile: the brain, the fleet's coordinator, and the
    pacing gate before every request (see the module docstring)."""

    __slots__ = ("pacing", "floor_booked")

    def __init__(self, policy: BrainPolicy, session: int, rng: random.Random) -> None:
        super().__init__(policy, session, rng)
        pacing = policy.settings.pacing
        self.pacing = pacing if pacing is not None and pacing.enabled and self.coord is not None else None
        self.floor_booked = False  # the budget's last answer reserved a floor slot

    def start(self, t: int) -> tuple[int, int, int]:
        if self.coord is not None and self.policy.settings.admits_first_requests:
            return self._admit(t)
        return self._paced(t)

    def _admit(self, t: int) -> tuple[int, int, int]:
        settings = self.policy.settings
        left = self.coord.cooldown_left_sync(self.policy.key, EPOCH_MS + t)
        if left > settings.max_hint_wait_ms:
            return DONE_FAIL, t, 0                 # refused at rest: nothing is sent
        if left > 0:
            return WAIT, t + settings.hinted_delay_ms(left, self.rng.random), _ADMIT
        return self._paced(t)

    def _paced(self, t: int) -> tuple[int, int, int]:
        """The pacing gate: the coordinator's pacer gives the slot, or none within its horizon
        (ask again after ``recheck_ms`` × U(0.5, 1.5))."""
        pacing = self.pacing
        if pacing is None:
            return SEND, t, 0
        a = self.coord.admit_at(self.policy.key, EPOCH_MS + t, retry=False, budget=None, pacing=pacing)
        if not a.pacing_booked:
            return WAIT, t + int(pacing.recheck_ms * (0.5 + self.rng.random())), _PACE
        return SEND, t + a.pacing_ms, 0

    def facts(self, t: int, answer: Answer) -> TurnFacts:
        """The coordinator's answer for a retry (one admission: the cooldown, the budget's
        token or floor slot), as the host kernel gathers it."""
        return self._admission(t, answer.ok, floor_slot_due=False)

    def _admission(self, t: int, ok: bool, *, floor_slot_due: bool) -> TurnFacts:
        now = EPOCH_MS + t
        if ok or self.coord is None:
            return TurnFacts(now_ms=now)
        budget = self.policy.settings.budget
        a = self.coord.admit_at(self.policy.key, now, retry=True, budget=budget, pacing=None,
                                floor_slot_due=floor_slot_due and self.floor_booked)
        waits = a.budget is False and budget is not None and budget.waits
        booked = getattr(a, "budget_slot_booked", True)
        self.floor_booked = waits and booked
        slot = None
        if waits:  # a floor slot reserved is waited exactly; a re-check is jittered
            slot = a.budget_wait_ms if booked else int(a.budget_wait_ms * (0.5 + self.rng.random()))
        return TurnFacts(now_ms=now, cooldown_ms=a.cooldown_ms, budget_allows=a.budget is not False,
                         budget_taken=a.token_taken, budget_slot_ms=slot)

    def answered(self, t: int, answer: Answer) -> tuple[int, int, int]:
        if self.pacing is not None:  # the pacer's signal (the budget's credit is the brain's)
            # what a real host sees: the classification of the message it received, not the
            # world's own label (docs/classification.md "Capacity signal")
            throttled = not answer.ok and self.policy.messages.classification(answer).capacity_signal
            self.coord.record_outcome_at(self.policy.key, EPOCH_MS + t, success=answer.ok,
                                         throttled=throttled, budget=None, pacing=self.pacing)
        return super().answered(t, answer)

    def timer(self, t: int, token: int) -> tuple[int, int, int]:
        if token == _ADMIT:
            return self._admit(t)
        if token == _PACE:
            return self._paced(t)
        brain = self.brain
        if brain.waits_for_budget:          # the budget's slot is due: ask it again
            facts = self._admission(t, False, floor_slot_due=True)
            actions = brain.backoff_elapsed(token, facts)
            if facts.budget_taken and not any(type(a) is ContinueTurn for a in actions):
                actions = [*actions, ReturnRetryToken()]
            return self.carry_out(t, actions)
        return self.carry_out(t, brain.backoff_elapsed(token))

    def carry_out(self, t: int, actions: list) -> tuple[int, int, int]:
        what, at, token = super().carry_out(t, actions)
        if what == SEND:          # a retry: through the pacing gate
            return self._paced(at)
        return what, at, token


def make_resilient_factory(policy: BrainPolicy, seed: int) -> Callable[[int, Provider, Any], ResilientRetrier]:
    """``make_retrier`` for the brain with a coordinator as the hosts run it: first requests
    admitted under the resilient profile, the budget's answers as facts, and, with
    ``retry.pacing`` on, the pacing gate through the coordinator's pacer (``policy``'s
    ``"fleet"``: one coordinator for the whole fleet; ``"process"``: one per process, as
    ``python -m fsm rpc`` without ``--redis``)."""
    def make(session: int, provider: Provider, context: Any) -> ResilientRetrier:
        return ResilientRetrier(policy, session, session_rng(seed, session, 1))
    return make
