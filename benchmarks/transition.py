"""``transition_us`` vs ``dict_baseline_us``: the machine's cost for one transition.

The cycle, from ``backing_off`` each time: ``backoff_elapsed(current timer)`` → ``continuing``
(guard ``timer_is_current``, effect ``continue_turn``), back to ``backing_off`` by assignment,
then ``abort_retry()`` → ``cancelled`` (effect ``cancel_backoff``: cancel action, end event,
release waiters), back to ``backing_off`` by assignment. ``transition_us`` is half a cycle.

Subject: the brain's public methods on the default engine, i.e. the dispatch compiled from the
shared ``transitions`` machine (``RetryBrain(engine="transitions")`` would fire
``machine.events[trigger].trigger(model)`` itself; ``decision_transitions_us`` measures that). Baseline: a hand-written dictionary state table
``{(state, trigger): (guard, dest, effect)}`` for the same two cells, calling the very same
brain guard and effect methods and collecting the actions the same way. The ratio is the
price of the declarative engine over the plainest possible dispatch.
"""

from __future__ import annotations

from fsm.core import lifecycle as L
from fsm.core.brain import RetryBrain

from ._timing import compare


def _dict_table(brain: RetryBrain) -> dict:
    return {
        (L.BACKING_OFF, L.BACKOFF_ELAPSED): (brain._p.timer_is_current, L.CONTINUING,
                                             brain._p.continue_turn),
        (L.BACKING_OFF, L.RETRY_CANCELLED): (None, L.CANCELLED, brain._p.cancel_backoff),
    }


def _reset(brain: RetryBrain) -> None:
    brain._p.state = L.BACKING_OFF
    brain._p.attempt = 1


def _subject(brain: RetryBrain):
    backing_off = L.BACKING_OFF
    elapsed = brain.backoff_elapsed
    abort = brain.abort_retry

    def cycle() -> None:
        elapsed(brain._p.timer)
        brain._p.state = backing_off
        brain._p.attempt = 1
        abort()
        brain._p.state = backing_off
        brain._p.attempt = 1
    return cycle


def _baseline(brain: RetryBrain):
    table = _dict_table(brain)
    backing_off = L.BACKING_OFF
    elapsed_key = L.BACKOFF_ELAPSED
    cancel_key = L.RETRY_CANCELLED

    def fire(trigger: str) -> list:
        brain._p.actions = actions = []
        guard, dest, effect = table[(brain._p.state, trigger)]
        if guard is None or guard():
            brain._p.state = dest
            effect()
        brain._p.actions = []
        return actions

    def cycle() -> None:
        brain._p.fact_timer = brain._p.timer
        fire(elapsed_key)
        brain._p.state = backing_off
        brain._p.attempt = 1
        fire(cancel_key)
        brain._p.state = backing_off
        brain._p.attempt = 1
    return cycle, fire


def _check() -> None:
    """Both engines take the same cycle and produce the same actions."""
    a, b = RetryBrain(), RetryBrain()
    _reset(a)
    _reset(b)
    _, fire = _baseline(b)
    got_a = [a.backoff_elapsed(a._p.timer)]
    b._p.fact_timer = b._p.timer
    got_b = [fire(L.BACKOFF_ELAPSED)]
    if (a.state, b.state) != (L.CONTINUING, L.CONTINUING):
        raise AssertionError(f"backoff_elapsed: {a.state} vs {b.state}")
    _reset(a)
    _reset(b)
    got_a.append(a.abort_retry())
    got_b.append(fire(L.RETRY_CANCELLED))
    if (a.state, b.state) != (L.CANCELLED, L.CANCELLED) or got_a != got_b:
        raise AssertionError(f"the engines differ: {got_a} vs {got_b}")


def measure(*, number: int = 20_000, repeat: int = 7, warmup: int = 2_000) -> dict[str, float]:
    """The figures of this group (µs per transition)."""
    _check()
    sb, bb = RetryBrain(), RetryBrain()
    _reset(sb)
    _reset(bb)
    subject = _subject(sb)
    baseline, _ = _baseline(bb)
    s, b, _, _ = compare(subject, baseline, number=number, repeat=repeat, warmup=warmup)
    return {
        "transition_us": s / 2,
        "dict_baseline_us": b / 2,
        "transition_ratio_vs_dict": s / b,
    }
