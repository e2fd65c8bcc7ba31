"""docs/policy.md §8: known failures that the brain alone can show, one test each.

Items 1 and 7 are about the host's awaits and queue; they are pinned in test_session.py.
Item 10 (the RPC client) is pinned in the RPC tests.
"""

import pytest

from fsm.core.brain import (CancelBackoff, CheckCompaction, ContinueTurn, CreditRetryBudget, Emit,
                       PromptMayReturn, RecordCooldown, ReturnRetryToken, RetryBrain, StartBackoff,
                       TurnFacts)
from fsm.core.classify import classify
from fsm.core.messages import AssistantMessage
from fsm.core.settings import BudgetSettings, RetrySettings

OVERLOADED = "529 Overloaded"


def err(text):
    return AssistantMessage("error", error_message=text)


def events(actions):
    return [a.event for a in actions if isinstance(a, Emit)]


def timer(actions):
    return next(a.timer_id for a in actions if isinstance(a, StartBackoff))


def into_continuing(brain):
    t = timer(brain.turn_ended(err(OVERLOADED)))
    assert brain.backoff_elapsed(t) == [ContinueTurn(1)]


def test_8_2_retried_turn_ending_fatal_ends_the_chain():
    """8 2 retried turn ending fatal ends the chain."""
    brain = RetryBrain()
    into_continuing(brain)
    actions = brain.turn_ended(err("401 Incorrect API key provided"))
    assert events(actions) == [{"type": "auto_retry_end", "success": False, "attempt": 1,
                                "finalError": "401 Incorrect API key provided", "endReason": "fatal",
                                "chainId": 1}]
    assert PromptMayReturn("fatal") in actions and brain.state == "exhausted"


def test_8_3_disabled_mid_chain_ends_the_chain():
    """8 3 disabled mid chain ends the chain."""
    brain = RetryBrain()
    into_continuing(brain)
    brain.set_enabled(False)
    actions = brain.turn_ended(err(OVERLOADED))
    assert events(actions)[0]["success"] is False and PromptMayReturn("disabled") in actions
    assert not brain.is_retrying


def test_8_4_abort_resets_the_attempt_counter_for_the_next_chain():
    """8 4 abort resets the attempt counter for the next chain."""
    brain = RetryBrain()
    into_continuing(brain)
    brain.turn_ended(err(OVERLOADED))                 # attempt 2, backing off
    assert brain.attempt == 2
    brain.abort_retry()
    assert brain.attempt == 0
    start = events(brain.turn_ended(err(OVERLOADED)))[0]
    assert start["attempt"] == 1 and start["chainId"] == 2


def test_8_5_rejected_continue_ends_the_chain():
    """8 5 rejected continue ends the chain."""
    brain = RetryBrain()
    into_continuing(brain)
    actions = brain.continue_failed("continue rejected: agent is busy")
    assert events(actions)[0]["finalError"] == "continue rejected: agent is busy"
    assert PromptMayReturn("continue_failed") in actions
    assert brain.state == "exhausted" and brain.attempt == 0


def test_8_6_stale_timer_of_an_aborted_chain_cannot_touch_a_newer_chain():
    """8 6 stale timer of an aborted chain cannot touch a newer chain."""
    brain = RetryBrain()
    old = timer(brain.turn_ended(err(OVERLOADED)))
    assert CancelBackoff(old) in brain.abort_retry()
    new = timer(brain.turn_ended(err(OVERLOADED)))
    assert new != old
    assert brain.backoff_elapsed(old) == []           # the late timer is rejected by its guard
    assert brain.state == "backing_off" and brain.attempt == 1
    assert brain.backoff_elapsed(new) == [ContinueTurn(1)]


def test_8_8_aborted_message_is_not_a_successful_retry():
    """8 8 aborted message is not a successful retry."""
    brain = RetryBrain()
    into_continuing(brain)
    actions = brain.turn_ended(AssistantMessage("aborted", error_message="Request was aborted"))
    assert events(actions) == [{"type": "auto_retry_end", "success": False, "attempt": 1,
                                "finalError": "Retry cancelled", "endReason": "cancelled",
                                "chainId": 1}]


def test_8_9_server_error_underscore_is_retried_and_1500_tokens_is_not_a_500():
    """8 9 server error underscore is retried and 1500 tokens is not a 500."""
    assert classify("error", '{"error": {"type": "server_error"}}').kind == "retryable"
    assert classify("error", "internal_error: upstream failed").kind == "retryable"
    assert classify("error", "max_tokens must be at most 1500 tokens").kind == "fatal"


def test_usage_limit_switch_makes_the_backoff_zero():
    """Usage limit switch makes the backoff zero."""
    brain = RetryBrain()
    start = events(brain.turn_ended(err("You have reached your usage limit. Please retry in 37.5s"),
                                    facts=TurnFacts(credential_switched=True)))[0]
    assert start["delayMs"] == 0 and start["delaySource"] == "switch"


def test_usage_limit_hint_never_lengthens_the_backoff_with_the_seed_defaults():
    """Usage limit hint never lengthens the backoff with the seed defaults."""
    brain = RetryBrain(RetrySettings(base_delay_ms=50))
    actions = brain.turn_ended(err("usage limit reached, retry-after: 3600"))
    start = events(actions)[0]
    assert start["delayMs"] == 50 and start["delaySource"] == "backoff"
    assert not any(isinstance(a, RecordCooldown) for a in actions), "no cooldown with ignore"


def test_max_attempts_is_fixed_for_a_chain():
    """Max attempts is fixed for a chain."""
    brain = RetryBrain(RetrySettings(max_retries=3))
    brain.turn_ended(err(OVERLOADED))
    brain.update_settings(RetrySettings(max_retries=1))
    assert brain.max_attempts == 3
    brain.backoff_elapsed(brain.timer_id)
    start = events(brain.turn_ended(err(OVERLOADED)))[0]
    assert (start["attempt"], start["maxAttempts"]) == (2, 3)


def test_update_settings_rejects_other_types():
    """Update settings rejects other types."""
    import pytest
    with pytest.raises(TypeError):
        RetryBrain().update_settings({"enabled": True})  # type: ignore[arg-type]


def test_events_have_exactly_the_spec_fields_plus_extras():
    """Events have exactly the spec fields plus extras."""
    brain = RetryBrain(RetrySettings(base_delay_ms=2000))
    start = events(brain.turn_ended(err(OVERLOADED)))[0]
    assert {"type", "attempt", "maxAttempts", "delayMs", "errorMessage"} <= set(start)
    assert start["type"] == "auto_retry_start" and start["delayMs"] == 2000
    assert start["errorMessage"] == OVERLOADED and start["rule"]
    brain.backoff_elapsed(brain.timer_id)
    end = events(brain.turn_ended(AssistantMessage("stop", text="hi")))[0]
    assert end == {"type": "auto_retry_end", "success": True, "attempt": 1, "endReason": "succeeded",
                   "chainId": 1}
    assert repr(brain).startswith("<RetryBrain state=succeeded")


# ------------------------------------------------------------------ host contract

def test_a_fatal_first_turn_says_the_prompt_may_return():
    """A fatal first turn says the prompt may return."""
    actions = RetryBrain().turn_ended(err("401 Incorrect API key provided"))
    assert actions[-1] == PromptMayReturn(None)
    assert not events(actions)


def test_every_fact_that_leaves_the_brain_at_rest_says_the_prompt_may_return():
    """Every fact that leaves the brain at rest says the prompt may return."""
    for message in (err(OVERLOADED), AssistantMessage("stop", text="ok"),
                    AssistantMessage("aborted", error_message="x"), err("prompt is too long")):
        brain = RetryBrain(RetrySettings(max_retries=0))
        assert isinstance(brain.turn_ended(message)[-1], PromptMayReturn)
    brain = RetryBrain()
    brain.turn_ended(err(OVERLOADED))
    assert brain.abort_retry()[-1] == PromptMayReturn("cancelled")
    assert brain.abort_retry() == [], "an ignored fact asks for nothing"


def test_a_cancelled_prompt_is_its_own_fact_not_a_failed_continue():
    """A cancelled prompt is its own fact not a failed continue."""
    brain = RetryBrain()
    into_continuing(brain)
    actions = brain.prompt_cancelled()
    assert events(actions)[0]["endReason"] == "cancelled" and brain.state == "cancelled"
    assert events(actions)[0]["finalError"] == "Retry cancelled"


# ------------------------------------------------------------------ policy v2

HONOR = RetrySettings(retry_hints="honor")


def test_8_11_a_hint_of_6_4_s_is_waited_out_with_honor():
    """8 11 a hint of 6 4's is waited out with honor."""
    brain = RetryBrain(HONOR)
    text = "429 Rate limit reached for gpt-4o. Please try again in 6.379s."
    start = events(brain.turn_ended(err(text), facts=TurnFacts(now_ms=1_000_000)))[0]
    assert start["delayMs"] == 6379 and start["delaySource"] == "hint"
    assert start["retryAt"] == 1_006_379


def test_8_11_a_58_hour_quota_reset_ends_the_chain_at_once_in_words():
    """8 11 a 58 hour quota reset ends the chain at once in words."""
    brain = RetryBrain(HONOR)
    actions = brain.turn_ended(err("429 Quota exceeded. Please try again in 58 hours."),
                               facts=TurnFacts(now_ms=1_767_225_600_000))
    assert not any(isinstance(a, StartBackoff) for a in actions)
    end = events(actions)[0]
    assert (end["endReason"], end["attempt"], end["success"]) == ("hint_too_long", 0, False)
    assert "wait 2 d 10 h (until 2026-01-03 10:00 UTC)" in end["finalError"]
    assert "retry.maxHintWaitMs = 1 min" in end["finalError"]
    assert any(isinstance(a, RecordCooldown) for a in actions), "the learned hint is shared"


def test_hint_jitter_is_positive_only():
    """Hint jitter is positive only."""
    brain = RetryBrain(RetrySettings(retry_hints="honor", jitter="full"), random=lambda: 0.999)
    start = events(brain.turn_ended(err("429 rate limit; retry-after-ms: 10000")))[0]
    assert 10_000 <= start["delayMs"] <= 12_000


def test_8_13_a_chain_deadline_ends_a_900_s_queue_expiry_chain():
    """8 13 a chain deadline ends a 900's queue expiry chain."""
    brain = RetryBrain(RetrySettings(max_elapsed_ms=60_000, base_delay_ms=2000))
    t0 = 1_000_000
    brain.turn_ended(err("503 queue expired after 900 s"), facts=TurnFacts(now_ms=t0))
    brain.backoff_elapsed(brain.timer_id)
    actions = brain.turn_ended(err("503 queue expired after 900 s"), facts=TurnFacts(now_ms=t0 + 902_000))
    end = events(actions)[0]
    assert end["endReason"] == "deadline" and end["attempt"] == 1
    assert "retry.maxElapsedMs = 1 min" in end["finalError"]


def test_8_12_rotation_gives_every_credential_a_try():
    """8 12 rotation gives every credential a try."""
    brain = RetryBrain()
    usage = err("You have hit your usage limit")
    facts = TurnFacts(credential_switched=True, credential_count=5)
    starts = []
    actions = brain.turn_ended(usage, facts=facts)
    for _ in range(10):
        starts += events(actions)
        if brain.state != "backing_off":
            break
        brain.backoff_elapsed(brain.timer_id)
        actions = brain.turn_ended(usage, facts=facts)
    attempts = [(e["attempt"], e["maxAttempts"]) for e in starts if e["type"] == "auto_retry_start"]
    assert attempts == [(n, 7) for n in range(1, 8)], "maxRetries 3 + 5 credentials - 1"
    assert all(e["delaySource"] == "switch" for e in starts if e["type"] == "auto_retry_start")


def test_discards_output_is_set_when_the_failed_turn_streamed_text():
    """Discards output is set when the failed turn streamed text."""
    start = events(RetryBrain().turn_ended(err(OVERLOADED), facts=TurnFacts(output_streamed=True)))[0]
    assert start["discardsOutput"] is True


def test_after_output_stop_refuses_a_turn_that_streamed():
    """After output stop refuses a turn that streamed."""
    brain = RetryBrain(RetrySettings(after_output="stop"))
    end = events(brain.turn_ended(err(OVERLOADED), facts=TurnFacts(output_streamed=True)))[0]
    assert end["endReason"] == "output_streamed" and 'retry.afterOutput is "stop"' in end["finalError"]


def test_retry_now_continues_at_once_with_the_same_attempt():
    """Retry now continues at once with the same attempt."""
    brain = RetryBrain()
    brain.turn_ended(err(OVERLOADED))
    timer = brain.timer_id
    actions = brain.retry_now()
    assert actions == [CancelBackoff(timer), ContinueTurn(1)]
    assert brain.backoff_elapsed(timer) == [], "the cancelled timer can no longer continue"
    assert RetryBrain().retry_now() == []


def test_budget_token_is_returned_when_the_retry_is_refused_for_another_reason():
    """Budget token is returned when the retry is refused for another reason."""
    brain = RetryBrain(RetrySettings(max_retries=0, budget=BudgetSettings()))
    actions = brain.turn_ended(err(OVERLOADED), facts=TurnFacts(budget_taken=True))
    assert ReturnRetryToken() in actions
    brain = RetryBrain(RetrySettings(budget=BudgetSettings()))
    actions = brain.turn_ended(err(OVERLOADED), facts=TurnFacts(budget_taken=True, budget_allows=False))
    assert ReturnRetryToken() not in actions and events(actions)[0]["endReason"] == "budget"


def test_a_success_credits_the_budget_only_when_it_is_on():
    """A success credits the budget only when it is on."""
    assert CreditRetryBudget() in RetryBrain(RetrySettings(budget=BudgetSettings())).turn_ended(
        AssistantMessage("stop", text="ok"))
    assert CreditRetryBudget() not in RetryBrain().turn_ended(AssistantMessage("stop", text="ok"))
    assert isinstance(RetryBrain().turn_ended(AssistantMessage("stop", text="ok"))[-2], CheckCompaction)


@pytest.mark.parametrize("cooldown_ms", [2_600_000_000_000_00, 10**18, -(10**18)])
def test_a_far_future_or_negative_time_never_breaks_a_decision(cooldown_ms):
    """A cooldown or time beyond the calendar (a peer writing microseconds, a corrupt store)
    reaches the brain as a fact: the turn is still decided and its end events still go out."""
    from fsm.core.brain import EmitTurnEnd, RetryBrain, TurnFacts, _clock_text
    from fsm.core.messages import AssistantMessage
    from fsm.core.settings import RetrySettings
    assert _clock_text(cooldown_ms, 0).startswith("epoch ")
    brain = RetryBrain(RetrySettings(retry_hints="honor", max_hint_wait_ms=60_000))
    failed = AssistantMessage("error", error_message="529 Overloaded", timestamp_ms=0)
    actions = brain.turn_ended(failed, 0, facts=TurnFacts(now_ms=1_700_000_000_000,
                                                         cooldown_ms=max(0, cooldown_ms)))
    assert [a.part for a in actions if isinstance(a, EmitTurnEnd)] == ["message", "agent"]


def test_a_chain_ended_by_the_fleets_cooldown_says_so_not_that_the_server_asked():
    """A refusal decided by a cooldown learned earlier (longer than this answer's own hint)
    names the fleet's cooldown; one decided by this answer's hint says the server asks."""
    text = "429 Rate limit reached. Please try again in 2s."
    by_cooldown = events(RetryBrain(HONOR).turn_ended(
        err(text), facts=TurnFacts(now_ms=1_767_225_600_000, cooldown_ms=3_600_000)))[0]
    assert by_cooldown["endReason"] == "hint_too_long"
    assert "cooldown, learned by the fleet" in by_cooldown["finalError"]
    assert "server asks" not in by_cooldown["finalError"] and "1 h" in by_cooldown["finalError"]
    by_hint = events(RetryBrain(HONOR).turn_ended(
        err("429 Quota exceeded. Please try again in 58 hours."),
        facts=TurnFacts(now_ms=1_767_225_600_000, cooldown_ms=3_600_000)))[0]
    assert "the server asks to wait 2 d 10 h" in by_hint["finalError"]


def test_a_year_long_hint_ends_the_chain_but_shares_a_cooldown_of_one_day_at_most():
    """A retry-after of 365 days: this chain ends (longer than maxHintWaitMs) and names the
    year; the cooldown shared with the fleet is capped at 24 h (MAX_SHARED_COOLDOWN_MS)."""
    from fsm.core.brain import MAX_SHARED_COOLDOWN_MS

    now = 1_767_225_600_000
    actions = RetryBrain(HONOR).turn_ended(
        err("429 Too Many Requests. Please try again in 365 days."), facts=TurnFacts(now_ms=now))
    end = events(actions)[0]
    assert end["endReason"] == "hint_too_long" and "365 d" in end["finalError"]
    shared = [a for a in actions if isinstance(a, RecordCooldown)]
    assert [(a.wait_ms, a.until_ms) for a in shared] == [(MAX_SHARED_COOLDOWN_MS, now + 86_400_000)]
    short = [a for a in RetryBrain(HONOR).turn_ended(
        err("429 Quota exceeded. Please try again in 5 hours."), facts=TurnFacts(now_ms=now))
        if isinstance(a, RecordCooldown)]
    assert short[0].wait_ms == 5 * 3_600_000


@pytest.mark.parametrize("engine", ["compiled", "transitions"])
def test_an_end_at_rest_has_a_chain_id_of_its_own(engine):
    """A first request refused at rest (``request_refused``, hint_too_long) and a refused first
    failure end with a ``chainId`` of their own, the next of the brain's (or the host's) chain
    ids, never one a chain before or after shares (docs/policy.md §3 "Invariants", §13.7)."""
    ids = iter(range(41, 50))
    brain = RetryBrain(RetrySettings(max_hint_wait_ms=60_000), chain_ids=lambda: next(ids),
                       engine=engine)
    refused = events(brain.request_refused(120_000, now_ms=1_800_000_000_000))
    assert [(e["attempt"], e["endReason"], e.get("chainId")) for e in refused] == [
        (0, "hint_too_long", 41)]
    t = timer(brain.turn_ended(err(OVERLOADED)))
    assert brain.chain_id == 42
    brain.backoff_elapsed(t)
    assert events(brain.turn_ended(AssistantMessage("stop")))[0]["chainId"] == 42
    counted = RetryBrain(RetrySettings(max_retries=0), engine=engine)
    assert events(counted.turn_ended(err(OVERLOADED)))[0]["chainId"] == 1
