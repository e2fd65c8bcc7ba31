"""The declaration itself (fsm/core/lifecycle.py): the literal table, groups, validate(), recording."""

import json

import pytest
from transitions import MachineError

from fsm.core import lifecycle as L
from fsm.core.brain import RetryBrain
from fsm.core.classify import Classification
from fsm.core.messages import AssistantMessage
from fsm.core.settings import RetrySettings


def test_every_line_of_the_table_is_one_declared_row():
    """Every line of the table is one declared row."""
    lines = [ln for ln in L.TABLE.splitlines() if ln.strip()]
    assert len(lines) == len(L.ROWS)
    for line, row in zip(lines, L.ROWS):
        assert line.split()[0] == row.source and line.split()[2] == row.trigger


def test_group_rows_expand_once_per_member_state():
    """Group rows expand once per member state."""
    group_rows = [d for d in L.ROWS if d.source == "at_rest"]
    assert group_rows and L.GROUPS["at_rest"] == ("idle", "succeeded", "exhausted", "cancelled")
    for d in group_rows:
        expanded = [r for r in L.TRANSITIONS if r.declared == d.id] + \
                   [i for i in L.IGNORED if i.declared == d.id]
        assert sorted(r.source for r in expanded) == sorted(L.AT_REST)


def test_every_cell_is_a_transition_or_ignored_exactly_once():
    """Every cell is a transition or ignored exactly once."""
    moving = {(r.source, r.trigger) for r in L.TRANSITIONS}
    ignored = [(i.source, i.trigger) for i in L.IGNORED]
    assert len(ignored) == len(set(ignored))
    assert not moving & set(ignored)
    assert moving | set(ignored) == set(L.cells())


def test_refusals_follow_the_documented_guard_order():
    """§8b.1, §3: has_retries_left, replay_safe, (fallback_due), hint_within_wait,
    within_deadline, budget_allows; a due fallback passes into its own row first."""
    order = ["has_retries_left", "replay_safe", "hint_within_wait", "within_deadline", "budget_allows"]
    for source in ("at_rest", "continuing"):
        refusals = [d for d in L.ROWS if d.source == source and d.trigger == "turn_failed_retryable"
                    and d.dest == "exhausted" and "retry_enabled" in d.guards]
        failing = [next(g[1:] for g in d.guards if g.startswith("!") and g != "!fallback_due")
                   for d in refusals]
        assert all("!fallback_due" in d.guards for d in refusals[2:])
        switch = [d for d in L.ROWS if d.source == source and d.effect == "fall_back"]
        assert [d.guards for d in switch] == [("retry_enabled", "has_retries_left", "replay_safe",
                                               "fallback_due")]
        assert failing == order
        assert [d.effect for d in refusals] == ["end_exhausted", "end_output_streamed",
                                                "end_hint_too_long", "end_deadline", "end_budget"]


def test_parse_table_names_a_bad_line():
    """Parse table names a bad line."""
    with pytest.raises(ValueError, match="table line 2"):
        L.parse_table("idle + turn_succeeded / settle_turn = idle\nidle turn_succeeded idle\n")


BASE = L.TABLE


@pytest.mark.parametrize("edit,message", [
    (lambda t: t + "\nidle + nope / settle_turn = idle", "undeclared trigger"),
    (lambda t: t + "\nnowhere + turn_succeeded / settle_turn = idle", "undeclared state or group"),
    (lambda t: t + "\nidle + backoff_elapsed [ghost] / settle_turn = idle", "undeclared guard"),
    (lambda t: t + "\nidle + backoff_elapsed / setle_turn = idle", "undeclared effect"),
    (lambda t: t + "\nidle + backoff_elapsed / settle_turn = idle", "both a transition and ignored"),
    (lambda t: "\n".join(ln for ln in t.splitlines()
                         if not ln.startswith("at_rest     + turn_succeeded")), "no declared outcome"),
    (lambda t: t + "\nidle + turn_succeeded / settle_turn = exhausted", "overlap"),
    (lambda t: t + "\nidle + retry_requested / (ignored)", "ignored twice"),
    (lambda t: "\n".join(ln for ln in t.splitlines() if "!budget_waits] / end_budget" not in ln
                         or not ln.startswith("continuing")), "no row passes"),
])
def test_validate_rejects_broken_declarations(edit, message):
    """Validate rejects broken declarations."""
    with pytest.raises(ValueError, match=message):
        L.validate(rows=L.parse_table(edit(BASE)))


def test_validate_checks_guards_and_effects_against_the_model():
    """Validate checks guards and effects against the model."""
    class Model:
        def retry_enabled(self):
            return True
    with pytest.raises(ValueError, match="has no method"):
        L.validate(Model)


def test_no_auto_transitions_and_undeclared_cells_raise():
    """No auto transitions and undeclared cells raise."""
    machine = L.build_machine()
    assert not any(name.startswith("to_") for name in machine.events)
    machine.add_state("orphan")

    class Model:
        state = "orphan"
    with pytest.raises(MachineError):
        machine.events["backoff_elapsed"].trigger(Model())


def test_the_machine_holds_the_declaration_in_its_own_order():
    """``MACHINE``'s events, their transitions per source, conditions (``unless`` as ``!``) and
    effects are the declaration's rows, a cell's rows in the order written; read back from the
    machine they are exactly ``TRANSITIONS`` and ``IGNORED`` (docs/policy.md §3)."""
    assert list(L.MACHINE.events) == list(L.TRIGGERS)
    assert list(L.MACHINE.states) == list(L.STATES) and L.MACHINE.initial == L.INITIAL
    for trigger, event in L.MACHINE.events.items():
        assert list(event.transitions) == [s for s in L.STATES if s in event.transitions]
        for source, candidates in event.transitions.items():
            written = [r.id for r in L.TRANSITIONS if (r.source, r.trigger) == (source, trigger)]
            assert [tr.row_id for tr in candidates] == (written or [f"{source}--{trigger}->(ignored)"])
    assert L.machine_rows() == (L.TRANSITIONS, L.IGNORED)
    assert L.declaration(L.build_machine()) == L.declaration()


def test_a_transition_the_declaration_did_not_make_is_refused_by_name():
    """A transition added to a machine by hand has no row: reading the machine names it
    (docs/policy.md §3)."""
    machine = L.build_machine()
    machine.add_transition("retry_requested", "idle", "continuing")
    with pytest.raises(ValueError, match="idle--retry_requested->continuing was not built"):
        L.machine_rows(machine)


def test_declaration_is_json_with_rows_groups_and_effects():
    """Declaration is JSON with rows groups and effects."""
    d = L.declaration()
    assert json.loads(json.dumps(d)) == d
    assert len(d["transitions"]) == len(L.TRANSITIONS) and len(d["rows"]) == len(L.ROWS)
    assert d["groups"] == {"at_rest": list(L.AT_REST)}
    assert {r["effect"] for r in d["rows"] if r["effect"]} <= set(d["effects"])
    assert all(t["row"] in {r["id"] for r in d["rows"]} for t in d["transitions"])
    assert len(L.VERSION) == 16


def test_recorder_sees_guards_outcomes_and_the_brain():
    """Recorder sees guards outcomes and the brain."""
    seen = []

    def rec(owner, record):
        seen.append((owner, record))
    L.add_recorder(rec)
    try:
        brain = RetryBrain(RetrySettings(max_retries=0))
        msg = AssistantMessage("error", error_message="503")
        brain.turn_ended(msg, classification=Classification("retryable", "x"))
        brain.abort_retry()
    finally:
        L.remove_recorder(rec)
        L.remove_recorder(rec)  # removing twice is harmless
    records = [r for owner, r in seen if owner is brain]
    assert [r.outcome for r in records] == ["rejected", "rejected", "taken", "ignored"]
    assert records[0].guards == (("retry_enabled", True), ("has_retries_left", False))
    assert records[2].dest == "exhausted" and records[3].dest is None
    assert records[2].to_json()["guards"] == {"retry_enabled": True, "!has_retries_left": True}
    assert all(r.version == L.VERSION for r in records)
