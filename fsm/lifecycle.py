"""The retry lifecycle, declared once (SPEC §3).

This module is the single declaration of the machine: its states, triggers, guards, the
transition table and the cells that are explicitly ignored. The running machine
(:func:`build_machine`, a ``transitions.Machine``), the diagrams, the matrix tests and the
coverage audit are all derived from :data:`TRANSITIONS` and :data:`IGNORED`.

Read a row as ``source + trigger [guards] / effect = dest``. Guards are names of predicates on
the model (the brain); a guard written ``!name`` must be false. Every (state, trigger) cell is
either one or more transitions or one explicit ignored entry; :func:`validate` checks that.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple

from transitions import Machine, Transition

# States: adjectives or participles.
IDLE = "idle"
BACKING_OFF = "backing_off"
CONTINUING = "continuing"
SUCCEEDED = "succeeded"
EXHAUSTED = "exhausted"
CANCELLED = "cancelled"
STATES: tuple[str, ...] = (IDLE, BACKING_OFF, CONTINUING, SUCCEEDED, EXHAUSTED, CANCELLED)
ENDED: tuple[str, ...] = (SUCCEEDED, EXHAUSTED, CANCELLED)
AT_REST: tuple[str, ...] = (IDLE,) + ENDED
IN_CHAIN: tuple[str, ...] = (BACKING_OFF, CONTINUING)

STATE_DOCS: dict[str, str] = {
    IDLE: "no retry chain; attempt 0",
    BACKING_OFF: "waiting for the backoff timer before the next attempt",
    CONTINUING: "the retried turn is running",
    SUCCEEDED: "the chain ended: a retried turn succeeded",
    EXHAUSTED: "the chain ended: retries used up, disabled, a non-retryable error or a failed continue",
    CANCELLED: "the chain ended: the user cancelled it (abort_retry / abort)",
}

# Triggers: facts that happened.
TURN_FAILED_RETRYABLE = "turn_failed_retryable"
TURN_FAILED_FATAL = "turn_failed_fatal"
TURN_OVERFLOWED = "turn_overflowed"
TURN_SUCCEEDED = "turn_succeeded"
TURN_ABORTED = "turn_aborted"
BACKOFF_ELAPSED = "backoff_elapsed"
RETRY_CANCELLED = "retry_cancelled"
CONTINUE_FAILED = "continue_failed"
TRIGGERS: tuple[str, ...] = (
    TURN_FAILED_RETRYABLE, TURN_FAILED_FATAL, TURN_OVERFLOWED, TURN_SUCCEEDED, TURN_ABORTED,
    BACKOFF_ELAPSED, RETRY_CANCELLED, CONTINUE_FAILED,
)
TURN_TRIGGERS: tuple[str, ...] = TRIGGERS[:5]

TRIGGER_DOCS: dict[str, str] = {
    TURN_FAILED_RETRYABLE: "a turn ended with an error classified retryable",
    TURN_FAILED_FATAL: "a turn ended with an error classified fatal",
    TURN_OVERFLOWED: "a turn ended with a context overflow (handed to compaction)",
    TURN_SUCCEEDED: "a turn ended without error (stop, length, toolUse)",
    TURN_ABORTED: "a turn ended with stop reason aborted",
    BACKOFF_ELAPSED: "the backoff timer fired",
    RETRY_CANCELLED: "abort_retry() or abort() was called",
    CONTINUE_FAILED: "the host could not continue the turn (rejected or raised)",
}

# Guards: predicates, evaluated on the brain.
RETRY_ENABLED = "retry_enabled"
HAS_RETRIES_LEFT = "has_retries_left"
TIMER_IS_CURRENT = "timer_is_current"
GUARDS: dict[str, str] = {
    RETRY_ENABLED: "retry.enabled is true now (read live, so a mid-chain toggle counts)",
    HAS_RETRIES_LEFT: "attempt < maxRetries (at rest: retry.maxRetries >= 1; in a chain: the chain's maxRetries)",
    TIMER_IS_CURRENT: "the timer that fired is the chain's current backoff timer",
}


@dataclass(frozen=True, slots=True)
class Row:
    """One declared transition: ``source + trigger [guards] / effect = dest``.

    ``guards`` holds guard names, ``!name`` for a guard that must be false. ``effect`` names
    the brain method that produces the actions; ``spec`` cites where the row comes from.
    """

    source: str
    trigger: str
    dest: str
    guards: tuple[str, ...] = ()
    effect: str | None = None
    spec: str = ""

    @property
    def id(self) -> str:
        """Stable identifier, e.g. ``continuing--turn_failed_retryable[retry_enabled,!has_retries_left]->exhausted``."""
        guard = f"[{','.join(self.guards)}]" if self.guards else ""
        return f"{self.source}--{self.trigger}{guard}->{self.dest}"

    @property
    def conditions(self) -> list[str]:
        return [g for g in self.guards if not g.startswith("!")]

    @property
    def unless(self) -> list[str]:
        return [g[1:] for g in self.guards if g.startswith("!")]


@dataclass(frozen=True, slots=True)
class Ignored:
    """A (state, trigger) cell that is deliberately not a transition, and why."""

    source: str
    trigger: str
    reason: str

    @property
    def id(self) -> str:
        return f"{self.source}--{self.trigger}->(ignored)"


def _rows() -> Iterator[Row]:
    for s in AT_REST:
        yield Row(s, TURN_FAILED_RETRYABLE, BACKING_OFF, (RETRY_ENABLED, HAS_RETRIES_LEFT),
                  "start_chain", "SPEC §3: attempt=1, usage-limit path, emit start, drop the failed message, start backoff")
        yield Row(s, TURN_FAILED_RETRYABLE, EXHAUSTED, (RETRY_ENABLED, "!" + HAS_RETRIES_LEFT),
                  "end_without_start", "SPEC §3 / seed: maxRetries = 0 emits end {success:false, attempt:0}")
        yield Row(s, TURN_FAILED_RETRYABLE, IDLE, ("!" + RETRY_ENABLED,),
                  "hand_to_compaction", "SPEC §3: retry disabled, the error stays; compaction check runs")
        for t in (TURN_FAILED_FATAL, TURN_OVERFLOWED, TURN_SUCCEEDED, TURN_ABORTED):
            yield Row(s, t, IDLE, (), "hand_to_compaction",
                      "SPEC §3: nothing from retry; the compaction check runs")
    yield Row(BACKING_OFF, BACKOFF_ELAPSED, CONTINUING, (TIMER_IS_CURRENT,), "continue_turn",
              "SPEC §3: schedule continue; a stale timer never continues (§3 invariants)")
    yield Row(BACKING_OFF, RETRY_CANCELLED, CANCELLED, (), "cancel_backoff",
              "SPEC §3: end {success:false, finalError:'Retry cancelled'}")
    yield Row(CONTINUING, TURN_SUCCEEDED, SUCCEEDED, (), "end_succeeded", "SPEC §3: end {success:true}")
    yield Row(CONTINUING, TURN_FAILED_RETRYABLE, BACKING_OFF, (RETRY_ENABLED, HAS_RETRIES_LEFT),
              "next_attempt", "SPEC §3: attempt+1, emit start, start backoff")
    yield Row(CONTINUING, TURN_FAILED_RETRYABLE, EXHAUSTED, (RETRY_ENABLED, "!" + HAS_RETRIES_LEFT),
              "end_failed", "SPEC §3: attempt = max, end {success:false, attempt:max}; error stays")
    yield Row(CONTINUING, TURN_FAILED_RETRYABLE, EXHAUSTED, ("!" + RETRY_ENABLED,),
              "end_failed", "SPEC §3 D6: disabled mid-chain ends the chain")
    yield Row(CONTINUING, TURN_FAILED_FATAL, EXHAUSTED, (), "end_failed",
              "SPEC §3 D6, §8.2: a fatal error ends the chain")
    yield Row(CONTINUING, TURN_OVERFLOWED, EXHAUSTED, (), "end_failed",
              "SPEC §3 D6: overflow ends the chain, then goes to compaction")
    yield Row(CONTINUING, TURN_ABORTED, CANCELLED, (), "end_cancelled",
              "SPEC §3 D6, §8.8: an aborted message is never a success")
    yield Row(CONTINUING, CONTINUE_FAILED, EXHAUSTED, (), "end_continue_failed",
              "SPEC §3 D6, §8.5: a rejected continue ends the chain")


def _ignored() -> Iterator[Ignored]:
    for s in AT_REST:
        yield Ignored(s, BACKOFF_ELAPSED, "no backoff is pending: a stale timer")
        yield Ignored(s, RETRY_CANCELLED, "no chain to cancel")
        yield Ignored(s, CONTINUE_FAILED, "no chain is continuing")
    for t in TURN_TRIGGERS:
        yield Ignored(BACKING_OFF, t, "no turn runs during a backoff (new prompts are rejected or queued)")
    yield Ignored(BACKING_OFF, CONTINUE_FAILED, "no continue was started yet")
    yield Ignored(CONTINUING, BACKOFF_ELAPSED, "a stale timer: the backoff already elapsed")
    yield Ignored(CONTINUING, RETRY_CANCELLED, "seed: the running turn decides the chain's end")


TRANSITIONS: tuple[Row, ...] = tuple(_rows())
IGNORED: tuple[Ignored, ...] = tuple(_ignored())
INITIAL = IDLE


def validate() -> None:
    """Check the declaration: every (state, trigger) cell is covered exactly one way.

    Raises ``ValueError`` naming the first problem: an undeclared state, trigger or guard; a
    cell with no outcome, declared both as a transition and as ignored, or ignored twice; a
    cell whose guarded rows overlap (two rows pass for the same guard values, so only their
    order would decide) or leave a gap (no row passes). The one allowed gap is a stale timer:
    ``timer_is_current`` false means the fact is dropped.
    """
    names = set(STATES)
    for row in TRANSITIONS:
        if row.source not in names or row.dest not in names or row.trigger not in TRIGGERS:
            raise ValueError(f"row {row.id} names an undeclared state or trigger")
        for g in row.guards:
            if g.lstrip("!") not in GUARDS:
                raise ValueError(f"row {row.id} names an undeclared guard {g!r}")
    by_cell: dict[tuple[str, str], list[Row]] = {}
    for row in TRANSITIONS:
        by_cell.setdefault((row.source, row.trigger), []).append(row)
    seen: set[tuple[str, str]] = set()
    for ig in IGNORED:
        cell = (ig.source, ig.trigger)
        if cell in by_cell:
            raise ValueError(f"cell {cell} is both a transition and ignored")
        if cell in seen:
            raise ValueError(f"cell {cell} is ignored twice")
        seen.add(cell)
    for cell in itertools.product(STATES, TRIGGERS):
        if cell not in by_cell and cell not in seen:
            raise ValueError(f"cell {cell} has no declared outcome")
    for cell, rows in by_cell.items():
        guards = sorted({g.lstrip("!") for r in rows for g in r.guards})
        for values in itertools.product((True, False), repeat=len(guards)):
            env = dict(zip(guards, values))
            passing = [r for r in rows
                       if all(env[g.lstrip("!")] != g.startswith("!") for g in r.guards)]
            if len(passing) > 1:
                raise ValueError(f"cell {cell}: rows {[r.id for r in passing]} overlap for {env}")
            if not passing and env.get(TIMER_IS_CURRENT, True):
                raise ValueError(f"cell {cell}: no row passes for {env}")


def cells() -> Iterator[tuple[str, str]]:
    """Every (state, trigger) cell in declaration order."""
    for s in STATES:
        for t in TRIGGERS:
            yield s, t


def declaration() -> dict:
    """The declaration as plain JSON-able data (what diagrams and the audit read)."""
    return {
        "states": list(STATES),
        "initial": INITIAL,
        "triggers": list(TRIGGERS),
        "guards": dict(GUARDS),
        "transitions": [
            {"id": r.id, "source": r.source, "trigger": r.trigger, "dest": r.dest,
             "guards": list(r.guards), "effect": r.effect, "spec": r.spec}
            for r in TRANSITIONS
        ],
        "ignored": [{"id": i.id, "source": i.source, "trigger": i.trigger, "reason": i.reason}
                    for i in IGNORED],
    }


def _version() -> str:
    # Only what changes behaviour counts: a reworded citation or reason keeps old traces valid.
    d = declaration()
    structure = {
        "states": d["states"], "initial": d["initial"], "triggers": d["triggers"],
        "guards": sorted(d["guards"]),
        "transitions": [[t["source"], t["trigger"], t["guards"], t["dest"], t["effect"]]
                        for t in d["transitions"]],
        "ignored": [[i["source"], i["trigger"]] for i in d["ignored"]],
    }
    blob = json.dumps(structure, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


VERSION: str = _version()
"""A short hash of the declaration; traces carry it so the audit never mixes versions."""


# ---------------------------------------------------------------------------- recording

class TransitionRecord(NamedTuple):
    """One tried transition, as a recorder receives it and a trace stores it.

    ``row`` is the :attr:`Row.id` / :attr:`Ignored.id` that was tried; ``dest`` is None for an
    ignored cell; ``guards`` holds ``(guard, passed)`` pairs in evaluation order (evaluation
    stops at the first failing guard; ``!name`` passes when ``name`` is false); ``outcome`` is
    ``"taken"``, ``"rejected"`` (a guard failed) or ``"ignored"``; ``version`` is
    :data:`VERSION` of the declaration that produced it.
    """

    row: str
    source: str
    trigger: str
    dest: str | None
    guards: tuple[tuple[str, bool], ...]
    outcome: str
    version: str

    def to_json(self) -> dict:
        return {"row": self.row, "source": self.source, "trigger": self.trigger,
                "dest": self.dest, "guards": {g: ok for g, ok in self.guards},
                "outcome": self.outcome, "version": self.version}


Recorder = Callable[[object, TransitionRecord], None]
"""``recorder(model, record)``: ``model`` is the object the machine ran for (a brain)."""

_recorders: list[Recorder] = []


def add_recorder(recorder: Recorder) -> None:
    """Call ``recorder`` for every transition tried on any machine of this process."""
    _recorders.append(recorder)
    _RecordingTransition.recording = True


def remove_recorder(recorder: Recorder) -> None:
    """Stop calling ``recorder``; unknown recorders are ignored."""
    if recorder in _recorders:
        _recorders.remove(recorder)
    _RecordingTransition.recording = bool(_recorders)


class _RecordingTransition(Transition):
    """A ``transitions.Transition`` that reports every try, guard outcome and ignored cell."""

    recording = False
    row_id = ""
    ignored = False

    def _eval_conditions(self, event_data):
        if not self.recording:
            return super()._eval_conditions(event_data)
        outcomes: list[tuple[str, bool]] = []
        passed = True
        for cond in self.conditions:
            passed = cond.check(event_data)
            outcomes.append((cond.func if cond.target else "!" + cond.func, passed))
            if not passed:
                break
        event_data.guard_outcomes = tuple(outcomes)
        return passed

    def execute(self, event_data):  # type: ignore[override]
        ok = super().execute(event_data)
        if self.recording:
            outcome = ("ignored" if self.ignored else "taken") if ok else "rejected"
            self._report(event_data, getattr(event_data, "guard_outcomes", ()), outcome)
        return ok

    def _report(self, event_data, outcomes: tuple, outcome: str) -> None:
        record = TransitionRecord(self.row_id, self.source, event_data.event.name, self.dest,
                                  outcomes, outcome, VERSION)
        for rec in tuple(_recorders):
            rec(event_data.model, record)


class _LifecycleMachine(Machine):
    transition_cls = _RecordingTransition


def build_machine() -> Machine:
    """Build the ``transitions`` machine from the declaration.

    One machine serves every brain: brains are not added as models (that would cost memory
    and an O(n) membership check per brain); a brain fires a trigger with
    ``machine.events[trigger].trigger(brain)``. ``auto_transitions`` is off, ignored cells are
    internal transitions (``dest=None``) and any undeclared cell raises ``MachineError``.
    """
    validate()
    machine = _LifecycleMachine(model=None, states=list(STATES), initial=INITIAL,
                                auto_transitions=False, ignore_invalid_triggers=False,
                                send_event=False)
    for row in TRANSITIONS:
        machine.add_transition(row.trigger, row.source, row.dest, conditions=row.conditions or None,
                               unless=row.unless or None, after=row.effect)
        tr = machine.events[row.trigger].transitions[row.source][-1]
        tr.row_id = row.id
    for ig in IGNORED:
        machine.add_transition(ig.trigger, ig.source, None)
        tr = machine.events[ig.trigger].transitions[ig.source][-1]
        tr.row_id = ig.id
        tr.ignored = True
    return machine
