"""The whole state × trigger × guard-outcome matrix, against a table written from the policy.

The expected outcomes below are written by hand from docs/policy.md §3 and §8b.1,
independently of ``fsm.core.lifecycle``: for a retryable failure the first failing guard decides
(``has_retries_left`` → exhausted, ``replay_safe`` → output_streamed, ``hint_within_wait`` →
hint_too_long, ``within_deadline`` → deadline, ``budget_allows`` → budget), except two guards
that pass into a row of their own: ``fallback_due`` (after ``replay_safe``: a switch to the next
fallback model at once, docs/policy.md §13.3) and ``budget_waits`` (a refused budget waits in
``backing_off``, §13.7). ``deadline_passed`` ends a chain ``deadline`` (aborting the attempt in
flight); ``request_refused`` ends at rest with attempt 0 (§13.7). Each case builds a
brain in a state with the public :meth:`RetryBrain.in_state`, makes one guard fail through
real settings and facts, fires one fact and checks the next state and the actions.
"""

import pytest

from fsm.core import lifecycle as L
from fsm.core.brain import (AbortAttempt, ArmDeadline, CancelBackoff, CheckCompaction, ContinueTurn,
                            DropFailedMessage, Emit, EmitTurnEnd, PromptMayReturn, RetryBrain,
                            StartBackoff, SwitchModel)
from brain_matrix_support import CASES, REST, STATES, TURNS, fire, setup

REASON = {"has_retries_left": "exhausted", "replay_safe": "output_streamed",
          "hint_within_wait": "hint_too_long", "within_deadline": "deadline",
          "budget_allows": "budget"}
TURN_END = [("turn_end", "message"), ("turn_end", "agent")]


def expected(state, trigger, fails):
    """(next state, action kinds) per the policy; ("end", reason, attempt) stands for the end event."""
    if state in REST:
        if trigger == "turn_failed_retryable":
            if fails == "retry_enabled":
                return "idle", TURN_END + [CheckCompaction, PromptMayReturn]
            if fails in (None, "budget_waits"):
                return "backing_off", TURN_END + [("start", 1), DropFailedMessage, StartBackoff,
                                                  ArmDeadline]
            if fails == "fallback_due":
                return "backing_off", TURN_END + [("fallback",), SwitchModel, ("start", 1),
                                                  DropFailedMessage, StartBackoff, ArmDeadline]
            return "exhausted", TURN_END + [("end", REASON[fails], 0), CheckCompaction, PromptMayReturn]
        if trigger in TURNS:
            return "idle", TURN_END + [CheckCompaction, PromptMayReturn]
        if trigger == "request_refused":
            return "exhausted", [("end", "hint_too_long", 0), PromptMayReturn]
        return state, []
    if state == "backing_off":
        if trigger == "backoff_elapsed":
            return "continuing", [ContinueTurn]
        if trigger == "budget_recheck":
            return "backing_off", [StartBackoff]
        if trigger == "deadline_passed":
            return "exhausted", [CancelBackoff, ("end", "deadline", 1), PromptMayReturn]
        if trigger == "retry_requested":
            return "continuing", [CancelBackoff, ContinueTurn]
        if trigger in ("retry_cancelled", "prompt_cancelled"):
            return "cancelled", [CancelBackoff, ("end", "cancelled", 1), PromptMayReturn]
        return "backing_off", []
    assert state == "continuing"
    if trigger == "turn_succeeded":
        return "succeeded", [("turn_end", "message"), ("end", "succeeded", 1), ("turn_end", "agent"),
                             CheckCompaction, PromptMayReturn]
    if trigger == "turn_failed_retryable":
        if fails in (None, "budget_waits"):
            return "backing_off", TURN_END + [("start", 2), DropFailedMessage, StartBackoff]
        if fails == "fallback_due":
            return "backing_off", TURN_END + [("fallback",), SwitchModel, ("start", 2),
                                              DropFailedMessage, StartBackoff]
        reason = "disabled" if fails == "retry_enabled" else REASON[fails]
        attempt = 3 if fails == "has_retries_left" else 1  # the chain is at its last attempt
        return "exhausted", TURN_END + [("end", reason, attempt), CheckCompaction, PromptMayReturn]
    if trigger == "turn_failed_fatal":
        return "exhausted", TURN_END + [("end", "fatal", 1), CheckCompaction, PromptMayReturn]
    if trigger == "turn_overflowed":
        return "exhausted", TURN_END + [("end", "overflow", 1), CheckCompaction, PromptMayReturn]
    if trigger == "turn_aborted":
        return "cancelled", TURN_END + [("end", "cancelled", 1), PromptMayReturn]
    if trigger == "continue_failed":
        return "exhausted", [("end", "continue_failed", 1), PromptMayReturn]
    if trigger == "prompt_cancelled":
        return "cancelled", [("end", "cancelled", 1), PromptMayReturn]
    if trigger == "deadline_passed":
        return "exhausted", [AbortAttempt, ("end", "deadline", 1), PromptMayReturn]
    return "continuing", []


def kinds(actions):
    out = []
    for a in actions:
        if isinstance(a, Emit):
            e = a.event
            if e["type"] == "auto_retry_start":
                out.append(("start", e["attempt"]))
            elif e["type"] == "retry_fallback":
                out.append(("fallback",))
            else:
                out.append(("end", e["endReason"], e["attempt"]))
        elif isinstance(a, EmitTurnEnd):
            out.append(("turn_end", a.part))
        elif type(a).__name__ in ("RecordCooldown", "ReturnRetryToken", "CreditRetryBudget"):
            continue  # the coordinator's writes: checked in test_brain_regressions
        else:
            out.append(type(a))
    return out


@pytest.mark.parametrize("state,trigger,fails", CASES, ids=[f"{s}-{t}-{f}" for s, t, f in CASES])
def test_matrix_cell(state, trigger, fails):
    """Matrix cell."""
    brain, hint, facts = setup(state, fails)
    actions = fire(brain, trigger, hint, facts)
    want_state, want = expected(state, trigger, fails)
    assert brain.state == want_state
    assert kinds(actions) == want
    if brain.state in REST:
        assert brain.attempt == 0
    assert brain.is_retrying == (brain.state in ("backing_off", "continuing"))


def test_the_matrix_walks_every_declared_cell_and_guard():
    """The matrix walks every declared cell and guard."""
    assert set(STATES) == set(L.STATES)
    triggers = {t for _, t, _ in CASES} - {"stale_timer", "budget_recheck"}
    assert triggers == set(L.TRIGGERS)
    guards = {f for _, _, f in CASES if f} | {"timer_is_current"}
    assert guards == set(L.GUARDS)


def test_in_state_rejects_impossible_numbers():
    """In state rejects impossible numbers."""
    with pytest.raises(ValueError, match="unknown state"):
        RetryBrain.in_state("sleeping")
    with pytest.raises(ValueError, match="attempt must be within 1..3"):
        RetryBrain.in_state("backing_off", attempt=4, max_attempts=3)


def test_the_brain_has_no_public_guard_or_effect_names():
    """The brain has no public guard or effect names."""
    public = {n for n in dir(RetryBrain) if not n.startswith("_")}
    assert not public & set(L.GUARDS)
    assert not public & set(L.EFFECTS)
    brain = RetryBrain()
    with pytest.raises(AttributeError):
        brain.start_chain()  # type: ignore[attr-defined]
    assert (brain.state, brain.attempt, brain.chain_id) == ("idle", 0, 0)
