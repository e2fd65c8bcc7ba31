"""The brain's two engines agree: the ``transitions`` machine and the compiled dispatch table.

The brain always runs the compiled table (:func:`fsm.core.brain._fire_compiled`), which records
its own transitions; the ``transitions`` machine (:func:`fsm.core.brain._fire_declared`) is the
reference. Both are derived from the one declaration; these tests prove that for every (state,
trigger) cell and every combination of its guards' values they try the same guards in the order
written and produce the same state, counters, actions and transition records.
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
    records: list = []
    p = _policy(state, trigger, env, calls)
    p.actions = []
    with L.recording(lambda owner, record: records.append((owner is p.owner, record))):
        engine(p, trigger, L.context_recorders())
    return (p.state, p.attempt, p.chain_id, p.max, p.timer, p.chain_start_ms, tuple(p.actions),
            tuple(calls), tuple(records))


CASES = [(s, t, combo) for s, t in L.cells()
         for combo in itertools.product((True, False), repeat=len(_cell_guards(s, t)))]


def test_the_matrix_is_the_whole_declaration():
    """Every cell is walked, and the guarded cells with every combination of their guards."""
    assert {(s, t) for s, t, _ in CASES} == set(itertools.product(L.STATES, L.TRIGGERS))
    assert len(CASES) > len(L.STATES) * len(L.TRIGGERS)  # guarded cells contribute 2^n cases


@pytest.mark.parametrize("state,trigger,combo", CASES)
def test_both_engines_agree_on_every_cell_and_guard_combination(state, trigger, combo):
    """Same guards tried in the same order, same state, counters, actions and records."""
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
            assert [c[:3] for c in candidates] == [((), None, None)]
        else:
            assert [(c[1], c[2], c[3]) for c in candidates] == [(r.effect, r.dest, r.id) for r in rows]


def test_the_engine_that_serves_records_its_own_transitions(monkeypatch):
    """With a recorder listening the brain still runs the compiled table, and it reports."""
    seen = []
    monkeypatch.setattr(B, "_fire_declared", lambda *a: pytest.fail("transitions engine used"))
    with L.recording(lambda owner, record: seen.append((owner, record.row))):
        brain = RetryBrain()
        brain.turn_ended(AssistantMessage("error", error_message="529 Overloaded", timestamp_ms=0))
    assert seen and seen[0][0] is brain
    assert seen[-1][1] == "idle--turn_failed_retryable[" + L._GO.replace(" ", "") + "]->backing_off"


def test_a_brain_s_own_recorder_hears_only_that_brain():
    """A recorder added to one brain hears its transitions and no other brain's."""
    seen = []
    mine, other = RetryBrain(), RetryBrain()
    mine.add_recorder(lambda owner, record: seen.append(owner))
    for brain in (mine, other):
        brain.turn_ended(AssistantMessage("error", error_message="529 Overloaded", timestamp_ms=0))
    assert seen and set(map(id, seen)) == {id(mine)}


def test_clearing_the_context_s_recorders_inside_a_block_cannot_switch_off_the_outer_one():
    """A test that empties the recorders inside its own scope leaves the outer recorder on."""
    outer = []
    with L.recording(lambda owner, record: outer.append(record.row)):
        with L.recording(lambda owner, record: None) as inner:
            L.remove_recorder(inner)
        assert not hasattr(L, "_recorders")  # no global list exists to clear
        RetryBrain().turn_ended(AssistantMessage("stop", timestamp_ms=0))
    assert outer == ["idle--turn_succeeded->idle"]


def test_guards_are_tried_in_the_order_written():
    """A row written ``[!b, a]`` tries ``b`` first, in both engines (transitions alone would
    try its ``conditions`` before its ``unless``)."""
    old = "at_rest     + turn_failed_retryable [retry_enabled, !has_retries_left]"
    new = "at_rest     + turn_failed_retryable [!has_retries_left, retry_enabled]"
    assert old in L.TABLE
    rows = L.parse_table(L.TABLE.replace(old, new))
    machine = L.build_machine(B._Policy, rows)
    calls: list[str] = []
    env = {g: True for g in L.GUARDS}
    env["has_retries_left"] = False
    p = _policy("idle", "turn_failed_retryable", env, calls)
    p.actions = []
    records = []
    with L.recording(lambda owner, record: records.append(record)):
        machine.events["turn_failed_retryable"].trigger(p)
    tried = {r.row: [g for g, _ in r.guards] for r in records}
    assert tried["idle--turn_failed_retryable[!has_retries_left,retry_enabled]->exhausted"] == [
        "!has_retries_left", "retry_enabled"]
    assert p.state == "exhausted"


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
            records: list = []
            monkeypatch.setattr(B, "_fire_compiled", engine)  # the engine _fire takes
            with L.recording(lambda owner, record: records.append(record)):
                results.append((_step(brain, fact, facts), brain.state, brain.attempt,
                                brain.timer_id, tuple(records)))
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
