"""Shared by the review tests: a coverage report whose rows name the tests that took them."""

from __future__ import annotations

import pytest

from fsm.review import audit as A


def run_brains(collector: A.Collector) -> None:
    """A few retry chains, each under its own test id: taken, rejected and ignored rows."""
    from fsm.core.brain import RetryBrain
    from fsm.core.classify import Classification
    from fsm.core.messages import AssistantMessage
    from fsm.core.settings import RetrySettings

    retryable = Classification("retryable", "test.retryable")
    collector.context = "tests/sample.py::test_chain"
    b = RetryBrain(RetrySettings(base_delay_ms=0))
    b.turn_ended(AssistantMessage("error", error_message="503"), classification=retryable)
    b.backoff_elapsed(b.timer_id)
    b.turn_ended(AssistantMessage("stop", text="ok"),
                 classification=Classification("none", "stop_reason.not_error"))
    collector.context = "tests/sample.py::test_no_retries"
    b = RetryBrain(RetrySettings(max_retries=0))
    b.turn_ended(AssistantMessage("error", error_message="503"), classification=retryable)
    collector.context = "tests/sample.py::test_cancel"
    b = RetryBrain(RetrySettings(base_delay_ms=0))
    b.turn_ended(AssistantMessage("error", error_message="503"), classification=retryable)
    b.abort_retry()
    b.abort_retry()
    collector.context = None


@pytest.fixture
def sample_report() -> A.Report:
    """The coverage of :func:`run_brains`, with its test contexts."""
    with A.Collector(contexts=True) as c:
        run_brains(c)
    return A.coverage(c.counts, None, c.contexts)
