"""The whole state × trigger × guard-outcome matrix, against a table written from SPEC §3.

The expected table below is written by hand from SPEC.md §3, independently of
``fsm.lifecycle``; the test walks every cell with every guard outcome and checks the brain's
next state and the kinds of actions it returns.
"""

import itertools

import pytest

from fsm import lifecycle as L
from fsm.brain import (CancelBackoff, CheckCompaction, ContinueTurn, DropFailedMessage, Emit,
                       ReleaseWaiters, RetryBrain, StartBackoff)
from fsm.classify import Classification
from fsm.messages import AssistantMessage
from fsm.settings import RetrySettings

STATES = ["idle", "backing_off", "continuing", "succeeded", "exhausted", "cancelled"]
TRIGGERS = ["turn_failed_retryable", "turn_failed_fatal", "turn_overflowed", "turn_succeeded",
            "turn_aborted", "backoff_elapsed", "retry_cancelled", "continue_failed"]
REST = {"idle", "succeeded", "exhausted", "cancelled"}

START = ["start", DropFailedMessage, StartBackoff]
END_FAIL = ["end_fail", ReleaseWaiters, CheckCompaction]


def expected(state, trigger, enabled, left, timer_current):
    """(next state, [action kinds]) per SPEC §3; 'start'/'end_*' stand for Emit events."""
    if state in REST:
        if trigger == "turn_failed_retryable":
            if not enabled:
                return "idle", [CheckCompaction]
            if left:
                return "backing_off", START
            return "exhausted", ["end_fail0", ReleaseWaiters, CheckCompaction]
        if trigger.startswith("turn_"):
            return "idle", [CheckCompaction]
        return state, []
    if state == "backing_off":
        if trigger == "backoff_elapsed":
            return ("continuing", [ContinueTurn]) if timer_current else ("backing_off", [])
        if trigger == "retry_cancelled":
            return "cancelled", [CancelBackoff, "end_cancel", ReleaseWaiters]
        return "backing_off", []
    assert state == "continuing"
    if trigger == "turn_succeeded":
        return "succeeded", ["end_ok", ReleaseWaiters, CheckCompaction]
    if trigger == "turn_failed_retryable":
        if enabled and left:
            return "backing_off", START
        return "exhausted", END_FAIL
    if trigger in ("turn_failed_fatal", "turn_overflowed"):
        return "exhausted", END_FAIL
    if trigger == "turn_aborted":
        return "cancelled", ["end_cancel", ReleaseWaiters]
    if trigger == "continue_failed":
        return "exhausted", ["end_reason", ReleaseWaiters]
    return "continuing", []


KIND = {"turn_failed_retryable": ("error", "retryable"), "turn_failed_fatal": ("error", "fatal"),
        "turn_overflowed": ("error", "context_overflow"), "turn_succeeded": ("stop", "none"),
        "turn_aborted": ("aborted", "none")}


def make_brain(state, enabled, left):
    max_retries = 3 if left or state not in REST else 0
    brain = RetryBrain(RetrySettings(enabled=enabled, max_retries=max_retries, base_delay_ms=100),
                       random=lambda: 0.5)
    brain.state = state
    if state in ("backing_off", "continuing"):
        brain._max = 3
        brain.attempt = 1 if left else 3
        brain._timer = 7
        brain.chain_id = 1
    return brain


def fire(brain, trigger, timer_current):
    if trigger in KIND:
        stop, kind = KIND[trigger]
        msg = AssistantMessage(stop, error_message="boom" if stop != "stop" else None)
        return brain.turn_ended(msg, classification=Classification(kind, "test.rule"))
    if trigger == "backoff_elapsed":
        return brain.backoff_elapsed(brain._timer if timer_current else brain._timer - 1)
    if trigger == "retry_cancelled":
        return brain.abort_retry()
    return brain.continue_failed("continue rejected")


def kinds(actions):
    out = []
    for a in actions:
        if isinstance(a, Emit):
            e = a.event
            if e["type"] == "auto_retry_start":
                out.append("start")
            elif e["success"]:
                out.append("end_ok")
            elif e["finalError"] == "Retry cancelled":
                out.append("end_cancel")
            elif e["finalError"] == "continue rejected":
                out.append("end_reason")
            elif e["attempt"] == 0:
                out.append("end_fail0")
            else:
                out.append("end_fail")
        else:
            out.append(type(a))
    return out


CASES = list(itertools.product(STATES, TRIGGERS, [True, False], [True, False], [True, False]))


@pytest.mark.parametrize("state,trigger,enabled,left,timer_current", CASES,
                         ids=["-".join(map(str, c)) for c in CASES])
def test_matrix_cell(state, trigger, enabled, left, timer_current):
    brain = make_brain(state, enabled, left)
    actions = fire(brain, trigger, timer_current)
    want_state, want_kinds = expected(state, trigger, enabled, left, timer_current)
    assert brain.state == want_state
    assert kinds(actions) == want_kinds
    if brain.state in REST:
        assert brain.attempt == 0
    assert not brain.is_retrying or brain.state in ("backing_off", "continuing")


def test_matrix_walks_every_declared_cell():
    """The matrix above covers exactly the declaration's states and triggers."""
    assert set(STATES) == set(L.STATES)
    assert set(TRIGGERS) == set(L.TRIGGERS)
    cells = {(s, t) for s, t in L.cells()}
    assert cells == {(s, t) for s in STATES for t in TRIGGERS}


def test_every_cell_is_a_transition_or_ignored_exactly_once():
    moving = {(r.source, r.trigger) for r in L.TRANSITIONS}
    ignored = [(i.source, i.trigger) for i in L.IGNORED]
    assert len(ignored) == len(set(ignored))
    assert not moving & set(ignored)
    assert moving | set(ignored) == set(L.cells())


def test_no_auto_transitions_and_undeclared_cells_raise():
    from transitions import MachineError
    machine = L.build_machine()
    assert not any(name.startswith("to_") for name in machine.events)
    machine.add_state("orphan")

    class Model:
        state = "orphan"
    with pytest.raises(MachineError):
        machine.events["backoff_elapsed"].trigger(Model())


@pytest.mark.parametrize("mutate,message", [
    (lambda: L.TRANSITIONS + (L.Row("idle", "nope", "idle"),), "undeclared state or trigger"),
    (lambda: L.TRANSITIONS + (L.Row("idle", "backoff_elapsed", "idle", ("ghost",)),), "undeclared guard"),
    (lambda: L.TRANSITIONS + (L.Row("idle", "backoff_elapsed", "idle"),), "both a transition and ignored"),
    (lambda: tuple(r for r in L.TRANSITIONS if (r.source, r.trigger) != ("idle", "turn_succeeded")),
     "no declared outcome"),
    (lambda: L.TRANSITIONS[1:], "no row passes"),
    (lambda: L.TRANSITIONS + (L.Row("idle", "turn_succeeded", "exhausted"),), "overlap"),
])
def test_validate_rejects_broken_declarations(monkeypatch, mutate, message):
    monkeypatch.setattr(L, "TRANSITIONS", mutate())
    with pytest.raises(ValueError, match=message):
        L.validate()


def test_validate_rejects_double_ignored(monkeypatch):
    monkeypatch.setattr(L, "IGNORED", L.IGNORED + (L.IGNORED[0],))
    with pytest.raises(ValueError, match="ignored twice"):
        L.validate()


def test_declaration_is_json_and_versioned():
    import json
    d = L.declaration()
    assert json.loads(json.dumps(d)) == d
    assert len(d["transitions"]) == len(L.TRANSITIONS)
    assert len(L.VERSION) == 16


def test_recorder_sees_guards_and_outcomes():
    seen = []

    def rec(model, record):
        seen.append((model, record))
    L.add_recorder(rec)
    try:
        brain = RetryBrain(RetrySettings(max_retries=0))
        msg = AssistantMessage("error", error_message="503")
        brain.turn_ended(msg, classification=Classification("retryable", "x"))
        brain.abort_retry()
    finally:
        L.remove_recorder(rec)
        L.remove_recorder(rec)  # removing twice is harmless
    records = [r for m, r in seen if m is brain]
    assert [r.outcome for r in records] == ["rejected", "taken", "ignored"]
    assert records[0].guards == (("retry_enabled", True), ("has_retries_left", False))
    assert records[1].dest == "exhausted" and records[2].dest is None
    assert records[1].to_json()["guards"] == {"retry_enabled": True, "!has_retries_left": True}
    assert all(r.version == L.VERSION for r in records)
