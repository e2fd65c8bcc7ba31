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
                            StartBackoff, SwitchModel, TurnFacts)
from fsm.core.classify import Classification
from fsm.core.messages import AssistantMessage
from fsm.core.settings import BudgetSettings, RetrySettings

STATES = ["idle", "backing_off", "continuing", "succeeded", "exhausted", "cancelled"]
REST = {"idle", "succeeded", "exhausted", "cancelled"}
TURNS = {"turn_failed_retryable": ("error", "retryable"), "turn_failed_fatal": ("error", "fatal"),
         "turn_overflowed": ("error", "context_overflow"), "turn_succeeded": ("stop", "none"),
         "turn_aborted": ("aborted", "none")}
OTHERS = ["backoff_elapsed", "stale_timer", "budget_recheck", "retry_cancelled", "continue_failed",
          "retry_requested", "prompt_cancelled", "deadline_passed", "request_refused"]
# For a retryable failure: which guard fails first (None: they all pass); "fallback_due" and
# "budget_waits" are the guards that pass into their own row.
FAILS = [None, "retry_enabled", "has_retries_left", "replay_safe", "fallback_due",
         "hint_within_wait", "within_deadline", "budget_allows", "budget_waits"]
REASON = {"has_retries_left": "exhausted", "replay_safe": "output_streamed",
          "hint_within_wait": "hint_too_long", "within_deadline": "deadline",
          "budget_allows": "budget"}
NOW = 1_800_000_000_000
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


def setup(state, fails):
    """A brain in ``state`` and the facts/classification that make ``fails`` the first failing guard."""
    kw = dict(base_delay_ms=100, retry_hints="honor", max_hint_wait_ms=10_000,
              after_output="stop", max_elapsed_ms=60_000, budget=BudgetSettings())
    hint, facts = None, dict(now_ms=NOW)
    chain_start = NOW - 1000
    if fails == "retry_enabled":
        kw["enabled"] = False
    if fails == "has_retries_left":
        kw["max_retries"] = 0 if state in REST else 3
    if fails == "replay_safe":
        facts["output_streamed"] = True
    if fails == "hint_within_wait":
        hint = 20_000
    if fails == "within_deadline":
        chain_start = NOW - 59_950  # the 100 ms backoff would go out 50 ms after the deadline
        if state in REST:
            kw["max_elapsed_ms"] = 50
    if fails == "budget_allows":
        facts["budget_allows"] = False
    if fails == "budget_waits":
        facts["budget_allows"] = False
        facts["budget_slot_ms"] = 500
    if fails == "fallback_due":
        kw["fallback_models"] = ("backup",)
        kw["fallback_after"] = 1
        hint = 20_000  # a fallback skips the hint check, as a credential switch does
    settings = RetrySettings(**kw)
    attempt = 3 if fails == "has_retries_left" else 1
    brain = RetryBrain.in_state(state, settings=settings, attempt=attempt, max_attempts=3,
                                chain_id=4, timer_id=7, chain_start_ms=chain_start, random=lambda: 0.5)
    return brain, hint, TurnFacts(**facts)


def fire(brain, trigger, hint, facts):
    if trigger in TURNS:
        stop, kind = TURNS[trigger]
        msg = AssistantMessage(stop, error_message="boom" if stop != "stop" else None)
        family = "overloaded" if kind == "retryable" else ""
        return brain.turn_ended(msg, classification=Classification(kind, "test.rule", retry_hint_ms=hint,
                                                                   family=family),
                                facts=facts)
    if trigger == "backoff_elapsed":
        return brain.backoff_elapsed(brain.timer_id)
    if trigger == "budget_recheck":
        return brain.backoff_elapsed(brain.timer_id, TurnFacts(budget_allows=False, budget_slot_ms=300))
    if trigger == "deadline_passed":
        return brain.deadline_passed()
    if trigger == "request_refused":
        return brain.request_refused(120_000, now_ms=NOW)
    if trigger == "stale_timer":
        return brain.backoff_elapsed(brain.timer_id - 1)
    if trigger == "retry_cancelled":
        return brain.abort_retry()
    if trigger == "retry_requested":
        return brain.retry_now()
    if trigger == "prompt_cancelled":
        return brain.prompt_cancelled()
    return brain.continue_failed("continue rejected")


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


CASES = ([(s, "turn_failed_retryable", f) for s in STATES for f in FAILS]
         + [(s, t, None) for s in STATES for t in list(TURNS)[1:] + OTHERS])


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
