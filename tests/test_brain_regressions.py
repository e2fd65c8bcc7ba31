"""SPEC §8: the failures of the original that the brain alone can show, one test each.

Items 1 and 7 are about the host's awaits and queue; they are pinned in test_session.py.
Item 10 (the RPC client) is pinned in the RPC tests.
"""

from fsm.brain import (CancelBackoff, ContinueTurn, Emit, ReleaseWaiters, RetryBrain,
                       StartBackoff)
from fsm.classify import classify
from fsm.messages import AssistantMessage
from fsm.settings import RetrySettings

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
    brain = RetryBrain()
    into_continuing(brain)
    actions = brain.turn_ended(err("401 Incorrect API key provided"))
    assert events(actions) == [{"type": "auto_retry_end", "success": False, "attempt": 1,
                                "finalError": "401 Incorrect API key provided", "chainId": 1}]
    assert ReleaseWaiters(False) in actions and brain.state == "exhausted"


def test_8_3_disabled_mid_chain_ends_the_chain():
    brain = RetryBrain()
    into_continuing(brain)
    brain.set_enabled(False)
    actions = brain.turn_ended(err(OVERLOADED))
    assert events(actions)[0]["success"] is False and ReleaseWaiters(False) in actions
    assert not brain.is_retrying


def test_8_4_abort_resets_the_attempt_counter_for_the_next_chain():
    brain = RetryBrain()
    into_continuing(brain)
    brain.turn_ended(err(OVERLOADED))                 # attempt 2, backing off
    assert brain.attempt == 2
    brain.abort_retry()
    assert brain.attempt == 0
    start = events(brain.turn_ended(err(OVERLOADED)))[0]
    assert start["attempt"] == 1 and start["chainId"] == 2


def test_8_5_rejected_continue_ends_the_chain():
    brain = RetryBrain()
    into_continuing(brain)
    actions = brain.continue_failed("continue rejected: agent is busy")
    assert events(actions)[0]["finalError"] == "continue rejected: agent is busy"
    assert ReleaseWaiters(False) in actions and brain.state == "exhausted" and brain.attempt == 0


def test_8_6_stale_timer_of_an_aborted_chain_cannot_touch_a_newer_chain():
    brain = RetryBrain()
    old = timer(brain.turn_ended(err(OVERLOADED)))
    assert CancelBackoff(old) in brain.abort_retry()
    new = timer(brain.turn_ended(err(OVERLOADED)))
    assert new != old
    assert brain.backoff_elapsed(old) == []           # the late timer is rejected by its guard
    assert brain.state == "backing_off" and brain.attempt == 1
    assert brain.backoff_elapsed(new) == [ContinueTurn(1)]


def test_8_8_aborted_message_is_not_a_successful_retry():
    brain = RetryBrain()
    into_continuing(brain)
    actions = brain.turn_ended(AssistantMessage("aborted", error_message="Request was aborted"))
    assert events(actions) == [{"type": "auto_retry_end", "success": False, "attempt": 1,
                                "finalError": "Retry cancelled", "chainId": 1}]


def test_8_9_server_error_underscore_is_retried_and_1500_tokens_is_not_a_500():
    assert classify("error", '{"error": {"type": "server_error"}}').kind == "retryable"
    assert classify("error", "internal_error: upstream failed").kind == "retryable"
    assert classify("error", "max_tokens must be at most 1500 tokens").kind == "fatal"


def test_usage_limit_hint_is_reported_and_a_switch_makes_the_backoff_zero():
    calls = []

    def reporter(hint):
        calls.append(hint)
        return True
    brain = RetryBrain(usage_limit_reporter=reporter)
    start = events(brain.turn_ended(err("You have reached your usage limit. Please retry in 37.5s")))[0]
    assert calls == [37500] and start["delayMs"] == 0


def test_usage_limit_hint_never_lengthens_the_backoff():
    brain = RetryBrain(RetrySettings(base_delay_ms=50), usage_limit_reporter=lambda hint: False)
    start = events(brain.turn_ended(err("usage limit reached, retry-after: 3600")))[0]
    assert start["delayMs"] == 50


def test_max_attempts_is_fixed_for_a_chain():
    brain = RetryBrain(RetrySettings(max_retries=3))
    brain.turn_ended(err(OVERLOADED))
    brain.update_settings(RetrySettings(max_retries=1))
    assert brain.max_attempts == 3
    brain.backoff_elapsed(brain.timer_id)
    start = events(brain.turn_ended(err(OVERLOADED)))[0]
    assert (start["attempt"], start["maxAttempts"]) == (2, 3)


def test_update_settings_rejects_other_types():
    import pytest
    with pytest.raises(TypeError):
        RetryBrain().update_settings({"enabled": True})  # type: ignore[arg-type]


def test_events_have_exactly_the_spec_fields_plus_extras():
    brain = RetryBrain(RetrySettings(base_delay_ms=2000))
    start = events(brain.turn_ended(err(OVERLOADED)))[0]
    assert {"type", "attempt", "maxAttempts", "delayMs", "errorMessage"} <= set(start)
    assert start["type"] == "auto_retry_start" and start["delayMs"] == 2000
    assert start["errorMessage"] == OVERLOADED and start["rule"]
    brain.backoff_elapsed(brain.timer_id)
    end = events(brain.turn_ended(AssistantMessage("stop", text="hi")))[0]
    assert end == {"type": "auto_retry_end", "success": True, "attempt": 1, "chainId": 1}
    assert repr(brain).startswith("<RetryBrain state=succeeded")
