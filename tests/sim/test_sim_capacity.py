"""The simulation's pacer hears what a real host hears (docs/simulation.md, docs/classification.md
"Capacity signal"): the classification of the message received, never the world's own label."""

from __future__ import annotations

from fsm.core.classify import Classification
from fsm.sim.engine import VirtualClock
from fsm.sim.policies import BrainPolicy, Messages, make_brain_factory
from fsm.sim.run import resilient_settings
from fsm.sim.world import ANSWERS, Answer


def test_each_world_answer_is_a_capacity_signal_by_its_message_alone():
    """The world's 429s, 503 and 529 classify as capacity signals, its random 500 and usage limit do not (docs/classification.md "Capacity signal")."""
    messages = Messages()
    signals = {kind: messages.cls[kind].capacity_signal for kind in ANSWERS}
    assert signals == {"overloaded": True, "rate_limited": True, "window": True, "unavailable": True,
                       "usage_limit": False, "server_error": False}


def session_for(messages: Messages):
    policy = BrainPolicy(resilient_settings(), messages, VirtualClock(), "fleet")
    session = make_brain_factory(policy, 1)(0, None, None)
    session.start(0)
    return policy, session


def test_the_pacer_learns_from_the_classification_not_the_label():
    """A random 500 is no throttle for the fleet's pacer; the same answer whose message classified as a 503 is one: the label is not read (docs/simulation.md)."""
    policy, session = session_for(Messages())
    session.answered(200, Answer("server_error"))
    assert session.coord.pacer_state(policy.key).thr_cur == 0

    messages = Messages()
    messages.cls["server_error"] = Classification("retryable", "structured.status_503")
    policy, session = session_for(messages)
    session.answered(200, Answer("server_error"))
    assert session.coord.pacer_state(policy.key).thr_cur == 1


def test_the_retry_budget_counts_on_one_clock_in_the_simulation():
    """A retry takes a token and its success credits tokenRatio back, on the one clock of
    hosts and coordinators: a credit does not refill the bucket (docs/simulation.md "What runs")."""
    from fsm.core.settings import RetrySettings
    from fsm.sim.engine import DONE_OK, SEND, WAIT

    settings = RetrySettings.from_json({"retry": {"budget": {"maxTokens": 10, "tokenRatio": 0.1}}})
    clock = VirtualClock()
    policy = BrainPolicy(settings, Messages(), clock, "fleet")
    session = make_brain_factory(policy, 1)(0, None, None)
    coord, budget = session.coord, settings.budget
    assert session.start(0) == (SEND, 0, 0)
    clock.now = 200
    what, at, token = session.answered(200, Answer("overloaded"))
    assert what == WAIT and coord.tokens(policy.key, budget) == 9
    clock.now = at
    assert session.timer(at, token) == (SEND, at, 0)
    clock.now = at + 2000
    assert session.answered(at + 2000, Answer("ok"))[0] == DONE_OK
    assert abs(coord.tokens(policy.key, budget) - 9.1) < 1e-9
