"""The brain's two engines agree: the ``transitions`` machine and the compiled dispatch table.

Without a recorder the brain runs the compiled table (:func:`fsm.core.brain._fire_compiled`); with
one it runs the ``transitions`` machine (:func:`fsm.core.brain._fire_declared`) so the audit sees
exactly what runs. Both are derived from the one declaration; these tests prove that for every
(state, trigger) cell and every combination of its guards' values they try the same guards in
the same order and produce the same state, counters and actions.
"""

import itertools
import random

import pytest

from fsm.core import brain as B
from fsm.core import lifecycle as L
from fsm.core.brain import RetryBrain, TurnFacts
from fsm.core.classify import Classification
from fsm.core.messages import AssistantMessage
from fsm.core.settings import BudgetSettings, RetrySettings

CLS = {"turn_failed_retryable": Classification("retryable", "retryable.overloaded", False, 3000),
       "turn_failed_fatal": Classification("fatal", "fatal.unmatched"),
       "turn_overflowed": Classification("context_overflow", "overflow.prompt_too_long"),
       "turn_succeeded": Classification("none", "stop_reason.not_error"),
       "turn_aborted": Classification("none", "stop_reason.not_error")}
NOW = 1_800_000_000_000


def _cell_guards(state, trigger):
    names = []
    for row in L.TRANSITIONS:
        if (row.source, row.trigger) == (state, trigger):
            for g in row.conditions + row.unless:
                if g not in names:
                    names.append(g)
    return names


def _forced(env, calls):
    """A policy class whose guards answer from ``env`` and log each call to ``calls``."""
    def guard(name):
        def check(self):
            calls.append(name)
            return env[name]
        return check
    return type("Forced", (B._Policy,), {"__slots__": (), **{g: guard(g) for g in env}})


def _policy(state, trigger, env, calls):
    brain = RetryBrain.in_state(state, settings=RetrySettings(base_delay_ms=100, max_elapsed_ms=60_000, retry_hints="honor",
                                                             budget=BudgetSettings()),
                                attempt=2 if state in L.IN_CHAIN else 1, timer_id=5,
                                random=lambda: 0.5)
    p = brain._p
    p.__class__ = _forced(env, calls)
    if trigger in CLS:
        stop = "stop" if trigger == "turn_succeeded" else "aborted" if trigger == "turn_aborted" else "error"
        p.message = AssistantMessage(stop, error_message=None if stop == "stop" else "529 Overloaded",
                                     timestamp_ms=0)
        p.cls = CLS[trigger]
        p.facts = TurnFacts(now_ms=NOW, output_streamed=True, cooldown_ms=10)
    p.reason = "continue failed: boom"
    p.fact_timer = 5
    p.source = p.state
    return p


def _run(engine, state, trigger, env):
    calls: list[str] = []
    p = _policy(state, trigger, env, calls)
    p.actions = []
    engine(p, trigger)
    return (p.state, p.attempt, p.chain_id, p.max, p.timer, p.chain_start_ms, tuple(p.actions),
            tuple(calls))


CASES = [(s, t, combo) for s, t in L.cells()
         for combo in itertools.product((True, False), repeat=len(_cell_guards(s, t)))]


def test_the_matrix_is_the_whole_declaration():
    """Every cell is walked, and the guarded cells with every combination of their guards."""
    assert {(s, t) for s, t, _ in CASES} == set(itertools.product(L.STATES, L.TRIGGERS))
    assert len(CASES) > len(L.STATES) * len(L.TRIGGERS)  # guarded cells contribute 2^n cases


@pytest.mark.parametrize("state,trigger,combo", CASES)
def test_both_engines_agree_on_every_cell_and_guard_combination(state, trigger, combo):
    """Same guards tried in the same order, same state, counters and actions."""
    env = dict(zip(_cell_guards(state, trigger), combo))
    declared = _run(B._fire_declared, state, trigger, env)
    compiled = _run(B._fire_compiled, state, trigger, env)
    assert compiled == declared


def test_the_compiled_table_is_derived_from_the_declaration_only():
    """One entry per declared cell, with the rows of that cell in declaration order."""
    assert set(B._DISPATCH) == set(L.cells())
    for (state, trigger), candidates in B._DISPATCH.items():
        rows = [r for r in L.TRANSITIONS if (r.source, r.trigger) == (state, trigger)]
        if not rows:
            assert candidates == (((), None, None),)
        else:
            assert [(c[1], c[2]) for c in candidates] == [(r.effect, r.dest) for r in rows]


def test_the_brain_uses_the_transitions_engine_while_a_recorder_listens(monkeypatch):
    """The audit sees exactly what runs: with a recorder, every fact goes through transitions."""
    seen = []
    monkeypatch.setattr(B, "_fire_compiled", lambda p, t: pytest.fail("compiled path used"))
    recorder = lambda owner, record: seen.append((owner, record.row))  # noqa: E731
    L.add_recorder(recorder)
    try:
        brain = RetryBrain()
        brain.turn_ended(AssistantMessage("error", error_message="529 Overloaded"))
    finally:
        L.remove_recorder(recorder)
    assert seen and seen[0][0] is brain
    assert seen[-1][1] == "idle--turn_failed_retryable[" + L._GO.replace(" ", "") + "]->backing_off"


def test_without_a_recorder_the_compiled_engine_runs(monkeypatch):
    """The lean path is the one taken when nobody records (the transition-coverage recorder of
    ``make test`` is switched off for this one test, so it runs in CI too)."""
    monkeypatch.setattr(L._RecordingTransition, "recording", False)
    monkeypatch.setattr(B, "_fire_declared", lambda p, t: pytest.fail("transitions path used"))
    brain = RetryBrain()
    actions = brain.turn_ended(AssistantMessage("error", error_message="529 Overloaded"))
    assert brain.state == "backing_off" and any(isinstance(a, B.StartBackoff) for a in actions)


FACTS = ["retryable", "hinted", "fatal", "overflow", "ok", "aborted", "elapsed", "stale",
         "abort_retry", "retry_now", "prompt_cancelled", "continue_failed", "toggle"]


@pytest.mark.parametrize("case", range(40))
def test_random_walks_with_real_guards_agree(case, monkeypatch):
    """Two brains fed the same random facts (real settings and guards, jitter on) end every
    step identical, one on each engine."""
    rng = random.Random(case)
    settings = RetrySettings(max_retries=rng.randint(0, 4), base_delay_ms=1000, jitter="full",
                             retry_hints="honor", max_hint_wait_ms=5000,
                             max_elapsed_ms=rng.choice([None, 6000]), after_output=rng.choice(["retry", "stop"]),
                             budget=BudgetSettings())
    brains = [RetryBrain(settings, random=random.Random(case).random) for _ in range(2)]
    engines = [B._fire_declared, B._fire_compiled]
    now = NOW
    for _ in range(60):
        fact = rng.choice(FACTS)
        now += rng.randint(0, 3000)
        facts = TurnFacts(now_ms=now, output_streamed=rng.random() < 0.3,
                          budget_allows=rng.random() < 0.8, cooldown_ms=rng.choice([0, 2000, 9000]))
        results = []
        for brain, engine in zip(brains, engines):
            monkeypatch.setattr(L._RecordingTransition, "recording", False)
            monkeypatch.setattr(B, "_fire_compiled", engine)  # the engine _fire takes unrecorded
            results.append((_step(brain, fact, facts), brain.state, brain.attempt, brain.timer_id))
            monkeypatch.undo()
        assert results[0] == results[1]


def _step(brain, fact, facts):
    texts = {"retryable": ("error", "503 Service Unavailable"),
             "hinted": ("error", "429 Too Many Requests. Please retry in 7s"),
             "fatal": ("error", "401 Incorrect API key provided"),
             "overflow": ("error", "prompt is too long: 250000 tokens > 200000 maximum"),
             "ok": ("stop", None), "aborted": ("aborted", "Request was aborted")}
    if fact in texts:
        stop, text = texts[fact]
        return brain.turn_ended(AssistantMessage(stop, error_message=text, timestamp_ms=0), facts=facts)
    if fact == "elapsed":
        return brain.backoff_elapsed(brain.timer_id)
    if fact == "stale":
        return brain.backoff_elapsed(brain.timer_id - 1)
    if fact == "toggle":
        brain.set_enabled(not brain.settings.enabled)
        return []
    return getattr(brain, fact)() if fact != "continue_failed" else brain.continue_failed("boom")


def test_a_cell_outside_the_declaration_raises_as_transitions_does():
    """Unreachable for a validated declaration; if it ever happened, it would not pass silently."""
    from transitions import MachineError
    p = RetryBrain()._p
    with pytest.raises(MachineError, match="from state idle"):
        B._fire_compiled(p, "no_such_trigger")
