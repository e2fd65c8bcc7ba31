"""The brain's two engines agree (docs/policy.md §3): ``RetryBrain(engine="transitions")`` fires
the ``transitions`` machine built from the declaration (:data:`fsm.core.lifecycle.MACHINE`); the
default ``"compiled"`` engine runs the dispatch compiled from that same machine object. For
every (state, trigger) cell and every outcome of its guards they try the same guards in the same
order and produce the same state, counters, actions and transition records.
"""

import itertools
import random

import pytest
from hypothesis import given, settings, strategies as st
from transitions import MachineError
from transitions.core import Event

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
ENGINES = ("transitions", "compiled")


def _cell_guards(state, trigger, machine=L.MACHINE):
    """The guard names the machine's transitions of one cell test, in the order it tries them."""
    names: list[str] = []
    for tr in machine.events[trigger].transitions.get(state, []):
        for cond in tr.conditions:
            if cond.func not in names:
                names.append(cond.func)
    return names


def _forced(env, calls):
    """A policy class whose guards answer from ``env`` and log each call to ``calls``."""
    def guard(name):
        def check(self):
            calls.append(name)
            return env[name]
        return check
    return type("Forced", (B._Policy,), {"__slots__": (), **{g: guard(g) for g in env}})


def _brain(engine, state, trigger, env, calls):
    brain = RetryBrain.in_state(state, settings=RetrySettings(base_delay_ms=100, max_elapsed_ms=60_000,
                                                             retry_hints="honor", budget=BudgetSettings()),
                                attempt=2 if state in L.IN_CHAIN else 1, timer_id=5,
                                random=lambda: 0.5, engine=engine)
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
    return brain


def _run(engine, state, trigger, env):
    """One fact through ``engine``: everything it leaves behind, records included."""
    calls: list[str] = []
    records: list = []
    brain = _brain(engine, state, trigger, env, calls)
    p = brain._p
    with L.recording(lambda owner, record: records.append((owner is brain, record))):
        actions = brain._fire(trigger)
    return (p.state, p.attempt, p.chain_id, p.max, p.timer, p.chain_start_ms, tuple(actions),
            tuple(calls), tuple(records))


def test_both_engines_agree_on_every_cell_and_guard_outcome():
    """Every (state, trigger) cell with every combination of its guards' values: same guards
    tried in the same order, same state, counters, actions and transition records, and a
    record for every fact (docs/policy.md §3, §7)."""
    cells = [(s, t, combo) for s, t in L.cells()
             for combo in itertools.product((True, False), repeat=len(_cell_guards(s, t)))]
    assert {(s, t) for s, t, _ in cells} == set(itertools.product(L.STATES, L.TRIGGERS))
    assert len(cells) > 2 * len(L.STATES) * len(L.TRIGGERS)  # guarded cells give 2^n each
    differing = []
    for state, trigger, combo in cells:
        env = dict(zip(_cell_guards(state, trigger), combo))
        declared, compiled = (_run(engine, state, trigger, env) for engine in ENGINES)
        if declared != compiled or not declared[-1]:
            differing.append(f"{state} + {trigger} {env}:\n  transitions {declared}\n"
                             f"  compiled    {compiled}")
    assert not differing, (f"{len(differing)} of {len(cells)} cells differ; the first:\n"
                           + "\n".join(differing[:3]))


def test_the_serving_dispatch_is_compiled_from_the_machine_object():
    """The dispatch holds, per cell, the machine's transitions in the machine's order; one
    compiled from a machine built from another table follows that machine (docs/policy.md §3)."""
    assert set(B._DISPATCH) == {(source, trigger) for trigger, event in L.MACHINE.events.items()
                                for source in event.transitions}
    for (state, trigger), candidates in B._DISPATCH.items():
        machine_rows = [tr.row_id for tr in L.MACHINE.events[trigger].transitions[state]]
        assert [c[3] for c in candidates] == machine_rows
    old = "at_rest     + turn_succeeded / settle_turn = idle"
    assert old in L.TABLE
    machine = L.build_machine(rows=L.parse_table(L.TABLE.replace(old, old.replace("= idle", "= exhausted"))))
    dispatch = B._compile_dispatch(machine)
    assert [c[2] for c in dispatch[(L.SUCCEEDED, L.TURN_SUCCEEDED)]] == [L.EXHAUSTED]
    assert [c[2] for c in B._DISPATCH[(L.SUCCEEDED, L.TURN_SUCCEEDED)]] == [L.IDLE]


def test_a_machine_the_dispatch_cannot_run_alike_is_refused():
    """Compiling refuses a machine whose callbacks or names the dispatch would not run as
    ``transitions`` does, naming what is wrong (docs/policy.md §3)."""
    hooked = L.build_machine()
    hooked.events[L.TURN_SUCCEEDED].transitions[L.IDLE][0].before.append("settle_turn")
    with pytest.raises(ValueError, match="only one named 'after' effect"):
        B._compile_dispatch(hooked)
    watched = L.build_machine()
    watched.after_state_change.append("settle_turn")
    with pytest.raises(ValueError, match="after_state_change"):
        B._compile_dispatch(watched)

    class Lacking:
        pass
    with pytest.raises(ValueError, match="'retry_enabled' is not a method of Lacking"):
        B._compile_dispatch(L.MACHINE, Lacking)


def test_the_default_engine_is_the_compiled_one_and_records_its_transitions(monkeypatch):
    """A brain serves on the compiled dispatch unless asked, fires ``transitions`` only with
    ``engine="transitions"``, and both report to the context's recorders (docs/policy.md §7)."""
    fired = []
    trigger = Event.trigger
    monkeypatch.setattr(Event, "trigger", lambda self, model: fired.append(self.name) or trigger(self, model))
    rows = {}
    for engine in (None, "transitions"):
        brain = RetryBrain() if engine is None else RetryBrain(engine=engine)
        seen = rows[brain.engine] = []
        with L.recording(lambda owner, record: seen.append((owner is brain, record.row))):
            brain.turn_ended(AssistantMessage("error", error_message="529 Overloaded", timestamp_ms=0))
        assert fired == ([] if engine is None else [L.TURN_FAILED_RETRYABLE])
    assert rows["compiled"] == rows["transitions"]
    assert rows["compiled"][-1] == (True, "idle--turn_failed_retryable[" + L._GO.replace(" ", "") + "]->backing_off")


@pytest.mark.parametrize("engine", ["Transitions", "fast", "", None, 1])
def test_an_unknown_engine_is_refused_by_name(engine):
    """``engine`` other than "compiled" / "transitions" raises ``ValueError`` naming the value
    (docs/policy.md §3)."""
    with pytest.raises(ValueError, match=f"got {engine!r}"):
        RetryBrain(engine=engine)
    with pytest.raises(ValueError, match="engine must be one of 'compiled', 'transitions'"):
        RetryBrain.in_state("backing_off", engine=engine)


def test_a_brain_s_own_recorder_hears_only_that_brain():
    """A recorder added to one brain hears its transitions and no other brain's, on either
    engine (docs/policy.md §7)."""
    for engine in ENGINES:
        seen = []
        mine, other = RetryBrain(engine=engine), RetryBrain(engine=engine)
        mine.add_recorder(lambda owner, record: seen.append(owner))
        for brain in (mine, other):
            brain.turn_ended(AssistantMessage("error", error_message="529 Overloaded", timestamp_ms=0))
        assert seen and set(map(id, seen)) == {id(mine)}, engine


def test_clearing_the_context_s_recorders_inside_a_block_cannot_switch_off_the_outer_one():
    """A test that empties the recorders inside its own scope leaves the outer recorder on
    (docs/policy.md §7)."""
    outer = []
    with L.recording(lambda owner, record: outer.append(record.row)):
        with L.recording(lambda owner, record: None) as inner:
            L.remove_recorder(inner)
        assert not hasattr(L, "_recorders")  # no global list exists to clear
        RetryBrain().turn_ended(AssistantMessage("stop", timestamp_ms=0))
    assert outer == ["idle--turn_succeeded->idle"]


def test_guards_are_tried_in_the_order_written(monkeypatch):
    """A row written ``[!b, a]`` tries ``b`` first, in both engines (transitions alone would
    try its ``conditions`` before its ``unless``; docs/policy.md §3)."""
    old = "at_rest     + turn_failed_retryable [retry_enabled, !has_retries_left]"
    new = "at_rest     + turn_failed_retryable [!has_retries_left, retry_enabled]"
    assert old in L.TABLE
    machine = L.build_machine(B._Policy, L.parse_table(L.TABLE.replace(old, new)))
    monkeypatch.setattr(B, "_EVENTS", machine.events)
    monkeypatch.setattr(B, "_DISPATCH", B._compile_dispatch(machine))
    env = {g: True for g in _cell_guards("idle", "turn_failed_retryable", machine)}
    env["has_retries_left"] = False
    runs = [_run(engine, "idle", "turn_failed_retryable", env) for engine in ENGINES]
    assert runs[0] == runs[1]
    tried = {r.row: [g for g, _ in r.guards] for _, r in runs[0][-1]}
    assert tried["idle--turn_failed_retryable[!has_retries_left,retry_enabled]->exhausted"] == [
        "!has_retries_left", "retry_enabled"]
    assert runs[0][0] == "exhausted"


TEXTS = {"retryable": ("error", "503 Service Unavailable"),
         "hinted": ("error", "429 Too Many Requests. Please retry in 7s"),
         "fatal": ("error", "401 Incorrect API key provided"),
         "overflow": ("error", "prompt is too long: 250000 tokens > 200000 maximum"),
         "ok": ("stop", None), "aborted": ("aborted", "Request was aborted")}
FACTS = [*TEXTS, "elapsed", "stale", "abort_retry", "retry_now", "prompt_cancelled",
         "continue_failed", "deadline", "refused", "toggle"]


def _step(brain, fact, facts):
    if fact in TEXTS:
        stop, text = TEXTS[fact]
        return brain.turn_ended(AssistantMessage(stop, error_message=text, timestamp_ms=0), facts=facts)
    if fact in ("elapsed", "stale"):
        return brain.backoff_elapsed(brain.timer_id - (fact == "stale"), facts)
    if fact == "deadline":
        return brain.deadline_passed(brain.chain_id)
    if fact == "refused":
        return brain.request_refused(90_000, now_ms=facts.now_ms)
    if fact == "toggle":
        brain.set_enabled(not brain.settings.enabled)
        return []
    return brain.continue_failed("boom") if fact == "continue_failed" else getattr(brain, fact)()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), max_retries=st.integers(0, 4),
       max_elapsed_ms=st.sampled_from([None, 6000]), after_output=st.sampled_from(["retry", "stop"]),
       fallback=st.booleans(),
       steps=st.lists(st.tuples(st.sampled_from(FACTS), st.integers(0, 3000), st.booleans(),
                                st.booleans(), st.sampled_from([0, 2000, 9000]),
                                st.sampled_from([None, 500])), max_size=40))
def test_random_fact_sequences_agree_on_both_engines(seed, max_retries, max_elapsed_ms, after_output,
                                                     fallback, steps):
    """Two brains fed the same random facts (real settings and guards, jitter on, a budget in
    wait mode, fallback models) end every step identical, one on each engine: same actions,
    state, attempt, timer and records (docs/policy.md §3)."""
    settings_ = RetrySettings(max_retries=max_retries, base_delay_ms=1000, jitter="full",
                              retry_hints="honor", max_hint_wait_ms=5000,
                              max_elapsed_ms=max_elapsed_ms, after_output=after_output,
                              budget=BudgetSettings(),
                              fallback_models=("backup",) if fallback else ())
    brains = [RetryBrain(settings_, random=random.Random(seed).random, engine=e) for e in ENGINES]
    now = NOW
    for fact, dt, streamed, allows, cooldown, slot in steps:
        now += dt
        facts = TurnFacts(now_ms=now, output_streamed=streamed, budget_allows=allows,
                          cooldown_ms=cooldown, budget_slot_ms=slot)
        results = []
        for brain in brains:
            records: list = []
            with L.recording(lambda owner, record: records.append((owner is brain, record))):
                results.append((_step(brain, fact, facts), brain.state, brain.attempt,
                                brain.timer_id, brain.chain_id, tuple(records)))
        assert results[0] == results[1], fact


def test_a_cell_outside_the_declaration_raises_as_transitions_does():
    """Unreachable for a validated declaration; if it ever happened, either engine raises
    ``MachineError`` naming the state (docs/policy.md §3)."""
    for engine in ENGINES:
        p = RetryBrain(engine=engine)._p
        with pytest.raises(MachineError, match="from state idle"):
            B.ENGINES[engine](p, "no_such_trigger", ())
