"""docs/policy.md §1 ``retry.unknown``: what the brain does with a failure of family ``unknown``
(text with no status, no typed code and no rule, docs/classification.md "Families")."""

from fsm.core.brain import ContinueTurn, Emit, PromptMayReturn, RetryBrain, StartBackoff
from fsm.core.classify import classify
from fsm.core.messages import AssistantMessage
from fsm.core.settings import RetrySettings, profile_settings

UNKNOWN = "the assistant could not finish"  # no status, no typed code, no rule


def err(text):
    return AssistantMessage("error", error_message=text)


def events(actions):
    return [a.event for a in actions if isinstance(a, Emit)]


def test_the_probe_text_is_unknown():
    """The text these tests use is family ``unknown`` (docs/classification.md "Families")."""
    assert classify("error", UNKNOWN).family == "unknown"


def test_never_keeps_an_unknown_failure_fatal():
    """docs/policy.md §1: under ``retry.unknown: "never"`` (the seed) unknown text starts no chain."""
    brain = RetryBrain(RetrySettings())
    actions = brain.turn_ended(err(UNKNOWN))
    assert not any(isinstance(a, StartBackoff) for a in actions)
    assert PromptMayReturn(None) in actions and brain.state == "idle"


def test_once_retries_an_unknown_failure_once_after_the_base_delay():
    """docs/policy.md §1: ``"once"`` gives one retry after the base delay, and its start event's
    rule says why; a second unknown failure ends the chain as fatal."""
    brain = RetryBrain(RetrySettings(unknown="once", base_delay_ms=1500))
    actions = brain.turn_ended(err(UNKNOWN))
    start = events(actions)[0]
    assert start["type"] == "auto_retry_start" and start["attempt"] == 1
    assert start["delayMs"] == 1500 and start["rule"] == "retry.unknown_once"
    timer = next(a for a in actions if isinstance(a, StartBackoff))
    assert timer.delay_ms == 1500
    assert brain.backoff_elapsed(timer.timer_id) == [ContinueTurn(1)]
    end = brain.turn_ended(err(UNKNOWN))
    assert events(end)[0]["endReason"] == "fatal" and events(end)[0]["attempt"] == 1
    assert brain.state == "exhausted"


def test_once_leaves_a_known_fatal_error_fatal():
    """docs/policy.md §1: ``"once"`` is for unknown text only; a known fatal family stays fatal."""
    brain = RetryBrain(RetrySettings(unknown="once"))
    actions = brain.turn_ended(err("401 Incorrect API key provided"))
    assert not any(isinstance(a, StartBackoff) for a in actions) and brain.state == "idle"


def test_once_keeps_the_chain_guards():
    """docs/policy.md §1: the one retry passes the chain's guards (maxRetries 0 refuses it)."""
    brain = RetryBrain(RetrySettings(unknown="once", max_retries=0))
    actions = brain.turn_ended(err(UNKNOWN))
    assert events(actions)[0]["endReason"] == "exhausted" and brain.state == "exhausted"


def test_a_retryable_failure_after_the_unknown_retry_continues_the_chain():
    """docs/policy.md §1: after the one retry, a retryable failure is retried as in any chain."""
    brain = RetryBrain(RetrySettings(unknown="once"))
    timer = next(a for a in brain.turn_ended(err(UNKNOWN)) if isinstance(a, StartBackoff))
    brain.backoff_elapsed(timer.timer_id)
    start = events(brain.turn_ended(err("529 Overloaded")))[0]
    assert start["attempt"] == 2 and start["rule"] == "retryable.status_529"


def test_profiles_choose_the_unknown_mode():
    """docs/policy.md §1 "Profiles": ``seed`` never retries unknown text, ``resilient`` once."""
    assert RetrySettings().unknown == "never"
    assert profile_settings("resilient").unknown == "once"
    assert RetrySettings.from_json({"retry": {"profile": "resilient", "unknown": "never"}}).unknown == "never"
