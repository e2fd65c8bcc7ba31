"""The retry lifecycle, declared once (docs/policy.md §3).

This module is the single declaration of the machine: its states, the ``at_rest`` group,
triggers, guards, effects, the transition table and the cells that are explicitly ignored.
:data:`MACHINE` is the ``transitions.Machine`` built from :data:`TABLE` at import
(:func:`build_machine`), and it is the model at run time: the brain's serving dispatch is
compiled from it and ``RetryBrain(engine="transitions")`` fires it (:mod:`fsm.core.brain`); the
diagrams, the audit and :data:`VERSION` read it (:func:`declaration`, :func:`machine_rows`).

The table is written literally, one row per line:

.. code-block:: text

    source + trigger [guard, !guard] / effect = dest      ; citation
    source + trigger                 / (ignored)          ; why

``source`` is a state or the group ``at_rest`` (a row written once for its four member states).
Guards are names of predicates on the brain's private policy model; ``!name`` must be false.
Inside one (state, trigger) cell the guarded rows are mutually exclusive and together total
(checked by :func:`validate` when this module is imported: an invalid declaration cannot be
run or drawn); rows are tried in the order written, and so are the guards of a row. The one
allowed gap is a stale timer (``timer_is_current`` false drops the fact).

What ran is recorded by the engine that runs it (``docs/policy.md`` §7): a recorder is scoped,
either to the current context (:func:`recording`, :func:`add_recorder`; an asyncio task or
thread started inside inherits it) or to one brain (``RetryBrain.add_recorder``); no global list
exists that one test could clear for another.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import itertools
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple

from transitions import Machine, Transition
from transitions.core import EventData

__all__ = [
    "IDLE", "BACKING_OFF", "CONTINUING", "SUCCEEDED", "EXHAUSTED", "CANCELLED",
    "STATES", "ENDED", "AT_REST", "IN_CHAIN", "GROUPS", "STATE_DOCS",
    "TURN_FAILED_RETRYABLE", "TURN_FAILED_FATAL", "TURN_OVERFLOWED", "TURN_SUCCEEDED",
    "TURN_ABORTED", "BACKOFF_ELAPSED", "RETRY_CANCELLED", "CONTINUE_FAILED", "RETRY_REQUESTED",
    "PROMPT_CANCELLED", "DEADLINE_PASSED", "REQUEST_REFUSED", "TRIGGERS", "TURN_TRIGGERS",
    "TRIGGER_DOCS",
    "RETRY_ENABLED", "HAS_RETRIES_LEFT", "REPLAY_SAFE", "FALLBACK_DUE", "HINT_WITHIN_WAIT",
    "WITHIN_DEADLINE", "BUDGET_ALLOWS", "BUDGET_WAITS", "TIMER_IS_CURRENT", "GUARDS", "EFFECTS", "TABLE",
    "Row", "Ignored", "DeclaredRow", "ROWS", "TRANSITIONS", "IGNORED", "INITIAL", "VERSION",
    "EFFECT_WORDS", "validate", "cells", "declaration", "TransitionRecord", "Recorder", "add_recorder",
    "remove_recorder", "recording", "context_recorders", "report", "build_machine",
    "machine_rows", "MACHINE",
]

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
GROUPS: dict[str, tuple[str, ...]] = {"at_rest": AT_REST}
"""Named groups of states a row may start from; a group row stands for one row per member."""

STATE_DOCS: dict[str, str] = {
    IDLE: "no retry chain; attempt 0",
    BACKING_OFF: "waiting for the backoff timer before the next attempt",
    CONTINUING: "the retried turn is running",
    SUCCEEDED: "the chain ended: a retried turn succeeded",
    EXHAUSTED: "the chain ended: retries used up, disabled, refused by a policy guard, a "
               "non-retryable error or a failed continue",
    CANCELLED: "the chain ended: the user cancelled it (abort_retry / abort) or the prompt "
               "was cancelled",
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
RETRY_REQUESTED = "retry_requested"
PROMPT_CANCELLED = "prompt_cancelled"
DEADLINE_PASSED = "deadline_passed"
REQUEST_REFUSED = "request_refused"
TRIGGERS: tuple[str, ...] = (
    TURN_FAILED_RETRYABLE, TURN_FAILED_FATAL, TURN_OVERFLOWED, TURN_SUCCEEDED, TURN_ABORTED,
    BACKOFF_ELAPSED, RETRY_CANCELLED, CONTINUE_FAILED, RETRY_REQUESTED, PROMPT_CANCELLED,
    DEADLINE_PASSED, REQUEST_REFUSED,
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
    RETRY_REQUESTED: "retry_now(): the user asked to retry without waiting",
    PROMPT_CANCELLED: "the host's prompt task was cancelled from outside",
    DEADLINE_PASSED: "docs/policy.md §13.2: the chain's deadline (retry.maxElapsedMs) passed",
    REQUEST_REFUSED: "docs/policy.md §13.7: a first request was refused without sending (every "
                     "credential cools down beyond retry.maxHintWaitMs)",
}

# Guards: predicates on the policy model, in the order docs/policy.md §8b.1 checks them.
RETRY_ENABLED = "retry_enabled"
HAS_RETRIES_LEFT = "has_retries_left"
REPLAY_SAFE = "replay_safe"
FALLBACK_DUE = "fallback_due"
HINT_WITHIN_WAIT = "hint_within_wait"
WITHIN_DEADLINE = "within_deadline"
BUDGET_ALLOWS = "budget_allows"
BUDGET_WAITS = "budget_waits"
TIMER_IS_CURRENT = "timer_is_current"
GUARDS: dict[str, str] = {
    RETRY_ENABLED: "retry.enabled is true now (read live, so a mid-chain toggle counts)",
    HAS_RETRIES_LEFT: "attempt < maxAttempts (at rest: retry.maxRetries >= 1; in a chain: the "
                      "chain's maxAttempts)",
    REPLAY_SAFE: "D12: retry.afterOutput is \"retry\", or the failed turn streamed no text and "
                 "started no tool call",
    FALLBACK_DUE: "§13.3: a fallback model remains and the model failed retry.fallbackAfter times in a row",
    HINT_WITHIN_WAIT: "D10: retryHints is \"ignore\", or the server's wait (hint or shared "
                      "cooldown) is at most retry.maxHintWaitMs, or the credential was switched "
                      "(§13.5: or waitForUsageReset)",
    WITHIN_DEADLINE: "D11: retry.maxElapsedMs is null, or the retry goes out before the "
                     "chain's deadline",
    BUDGET_ALLOWS: "docs/policy.md §9: the shared retry budget allows this retry (gRPC retry "
                   "throttling; always true when retry.budget is null)",
    BUDGET_WAITS: "§13.7: the budget is in wait mode: a refused retry waits for its slot",
    TIMER_IS_CURRENT: "the timer that fired is the chain's current backoff timer",
}

EFFECTS: dict[str, str] = {
    "start_chain": "turn ends; auto_retry_start (attempt 1); drop message; backoff; arm deadline",
    "next_attempt": "turn ends; auto_retry_start (attempt + 1); drop message; backoff",
    "settle_turn": "no retry: turn ends; budget credit (a success); compaction; prompt done",
    "end_exhausted": "turn ends; auto_retry_end (exhausted); compaction; prompt done",
    "end_output_streamed": "turn ends; auto_retry_end (output_streamed); compaction; prompt done",
    "end_hint_too_long": "turn ends; auto_retry_end (hint_too_long); compaction; prompt done",
    "end_deadline": "turn ends; auto_retry_end (deadline); compaction; prompt done",
    "end_budget": "turn ends; auto_retry_end (budget); compaction; prompt done",
    "end_disabled": "turn ends; auto_retry_end (disabled); compaction; prompt done",
    "end_fatal": "turn ends; auto_retry_end (fatal); compaction; prompt done",
    "end_overflow": "turn ends; auto_retry_end (overflow); compaction; prompt done",
    "end_succeeded": "turn ends; auto_retry_end (succeeded); budget credit; compaction; prompt done",
    "end_cancelled": "turn ends (an aborted turn); auto_retry_end (cancelled); prompt done",
    "end_continue_failed": "auto_retry_end (continue_failed); prompt done",
    "continue_turn": "continue (on the next loop tick)",
    "retry_at_once": "cancel timer; continue (on the next loop tick)",
    "cancel_backoff": "cancel timer; auto_retry_end (cancelled); prompt done",
    "fall_back": "turn ends; retry_fallback; switch model; auto_retry_start (next model, delay 0); drop message; backoff; arm deadline (a chain's first retry)",
    "wait_for_budget": "turn ends; auto_retry_start (delaySource budget); drop message; backoff (to the budget's slot); arm deadline (a chain's first retry)",
    "recheck_budget": "backoff (to the budget's next slot, no new start)",
    "deadline_in_backoff": "cancel timer; auto_retry_end (deadline); prompt done",
    "abort_attempt": "abort the attempt; auto_retry_end (deadline); prompt done",
    "end_refused": "attempt 0: auto_retry_end (hint_too_long); prompt done",
}
"""Every effect the table names, in a reader's words: the actions it returns, in their order,
as ``; ``-separated phrases of :data:`EFFECT_WORDS` (a ``label: `` before a phrase and a
``(note)`` after it are the reader's; ``auto_retry_end``'s note is its ``endReason``). A test
runs every effect and checks the two agree."""

EFFECT_WORDS: dict[str, str] = {
    "turn ends": "EmitTurnEnd: the turn's message_end, turn_end and agent_end",
    "auto_retry_start": "Emit(auto_retry_start)",
    "auto_retry_end": "Emit(auto_retry_end), its endReason in parentheses",
    "drop message": "DropFailedMessage: the failed message leaves the runtime context",
    "backoff": "StartBackoff: the backoff timer starts",
    "cancel timer": "CancelBackoff",
    "continue": "ContinueTurn",
    "budget credit": "CreditRetryBudget (only with a retry budget set)",
    "compaction": "CheckCompaction: the compaction hook is consulted",
    "prompt done": "PromptMayReturn: the work the prompt started is over",
    "retry_fallback": "Emit(retry_fallback): from, to, reason",
    "switch model": "SwitchModel: the next attempts use the fallback model",
    "abort the attempt": "AbortAttempt: the host aborts the attempt in flight",
    "arm deadline": "ArmDeadline: the chain's deadline timer starts (retry.maxElapsedMs set)",
}
"""The phrases of :data:`EFFECTS` and the brain action each one names."""

_GO = ("retry_enabled, has_retries_left, replay_safe, !fallback_due, hint_within_wait, "
       "within_deadline, budget_allows")
_OK = "retry_enabled, has_retries_left, replay_safe, !fallback_due, hint_within_wait, within_deadline"

TABLE = f"""
at_rest     + turn_failed_retryable [{_GO}] / start_chain = backing_off  ; §3: attempt=1, usage-limit path, emit start, drop the failed message, start backoff
at_rest     + turn_failed_retryable [!retry_enabled] / settle_turn = idle  ; §3: retry disabled, the error stays; compaction check runs
at_rest     + turn_failed_retryable [retry_enabled, !has_retries_left] / end_exhausted = exhausted  ; §3: maxRetries = 0 emits end {{success:false, attempt:0}}
at_rest     + turn_failed_retryable [retry_enabled, has_retries_left, !replay_safe] / end_output_streamed = exhausted  ; §3 D12, §8b.1
at_rest     + turn_failed_retryable [retry_enabled, has_retries_left, replay_safe, fallback_due] / fall_back = backing_off  ; §13.3, §3: a switch row, at once, skipping the hint and budget checks
at_rest     + turn_failed_retryable [retry_enabled, has_retries_left, replay_safe, !fallback_due, !hint_within_wait] / end_hint_too_long = exhausted  ; §3 D10, §8b.1
at_rest     + turn_failed_retryable [retry_enabled, has_retries_left, replay_safe, !fallback_due, hint_within_wait, !within_deadline] / end_deadline = exhausted  ; §3 D11, §8b.1
at_rest     + turn_failed_retryable [{_OK}, !budget_allows, budget_waits] / wait_for_budget = backing_off  ; §13.7: the retry waits for the budget's slot
at_rest     + turn_failed_retryable [{_OK}, !budget_allows, !budget_waits] / end_budget = exhausted  ; §9, §8b.1, §8b.3
at_rest     + turn_failed_fatal / settle_turn = idle  ; §3: nothing from retry; the compaction check runs
at_rest     + turn_overflowed / settle_turn = idle  ; §3: nothing from retry; overflow goes to compaction
at_rest     + turn_succeeded / settle_turn = idle  ; §3: nothing from retry; a success credits the retry budget
at_rest     + turn_aborted / settle_turn = idle  ; §3: nothing from retry
at_rest     + request_refused / end_refused = exhausted  ; §13.7: a first request refused without sending: one end, attempt 0, no start
at_rest     + backoff_elapsed / (ignored)  ; no backoff is pending: a stale timer
at_rest     + retry_cancelled / (ignored)  ; no chain to cancel
at_rest     + continue_failed / (ignored)  ; no chain is continuing
at_rest     + retry_requested / (ignored)  ; §3: retry now is ignored outside a backoff
at_rest     + prompt_cancelled / (ignored)  ; no chain: the cancelled prompt has nothing to end
at_rest     + deadline_passed / (ignored)  ; §3: no chain, no deadline
backing_off + backoff_elapsed [timer_is_current, budget_allows] / continue_turn = continuing  ; §3: schedule continue; a stale timer never continues
backing_off + backoff_elapsed [timer_is_current, !budget_allows] / recheck_budget = backing_off  ; §13.7: the budget still refuses; wait for its next slot, no new start
backing_off + retry_requested / retry_at_once = continuing  ; §3, §8b.5: retry now, same attempt, no new auto_retry_start
backing_off + retry_cancelled / cancel_backoff = cancelled  ; §3: end {{success:false, finalError:"Retry cancelled"}}
backing_off + prompt_cancelled / cancel_backoff = cancelled  ; §3: the host's prompt task was cancelled
backing_off + deadline_passed / deadline_in_backoff = exhausted  ; §13.2, §13.7: the deadline ends the chain, also while waiting for the budget
backing_off + turn_failed_retryable / (ignored)  ; no turn runs during a backoff
backing_off + turn_failed_fatal / (ignored)  ; no turn runs during a backoff
backing_off + turn_overflowed / (ignored)  ; no turn runs during a backoff
backing_off + turn_succeeded / (ignored)  ; no turn runs during a backoff
backing_off + turn_aborted / (ignored)  ; no turn runs during a backoff
backing_off + continue_failed / (ignored)  ; no continue was started yet
backing_off + request_refused / (ignored)  ; §13.7: only a first request (at rest) is refused
continuing  + turn_succeeded / end_succeeded = succeeded  ; §3: end {{success:true}}
continuing  + turn_failed_retryable [{_GO}] / next_attempt = backing_off  ; §3: attempt+1, emit start, start backoff
continuing  + turn_failed_retryable [!retry_enabled] / end_disabled = exhausted  ; §3 D6: disabled mid-chain ends the chain
continuing  + turn_failed_retryable [retry_enabled, !has_retries_left] / end_exhausted = exhausted  ; §3: attempt = max; the error stays
continuing  + turn_failed_retryable [retry_enabled, has_retries_left, !replay_safe] / end_output_streamed = exhausted  ; §3 D12, §8b.1
continuing  + turn_failed_retryable [retry_enabled, has_retries_left, replay_safe, fallback_due] / fall_back = backing_off  ; §13.3, §3: a switch row, at once, skipping the hint and budget checks
continuing  + turn_failed_retryable [retry_enabled, has_retries_left, replay_safe, !fallback_due, !hint_within_wait] / end_hint_too_long = exhausted  ; §3 D10, §8b.1
continuing  + turn_failed_retryable [retry_enabled, has_retries_left, replay_safe, !fallback_due, hint_within_wait, !within_deadline] / end_deadline = exhausted  ; §3 D11, §8b.1
continuing  + turn_failed_retryable [{_OK}, !budget_allows, budget_waits] / wait_for_budget = backing_off  ; §13.7: the retry waits for the budget's slot
continuing  + turn_failed_retryable [{_OK}, !budget_allows, !budget_waits] / end_budget = exhausted  ; §9, §8b.1, §8b.3
continuing  + turn_failed_fatal / end_fatal = exhausted  ; §3 D6, §8.2: a fatal error ends the chain
continuing  + turn_overflowed / end_overflow = exhausted  ; §3 D6: overflow ends the chain, then goes to compaction
continuing  + turn_aborted / end_cancelled = cancelled  ; §3 D6, §8.8: an aborted message is never a success
continuing  + continue_failed / end_continue_failed = exhausted  ; §3 D6, §8.5: a rejected continue ends the chain
continuing  + prompt_cancelled / end_cancelled = cancelled  ; §3: the host's prompt task was cancelled
continuing  + deadline_passed / abort_attempt = exhausted  ; §13.2: the attempt in flight is aborted; the chain ends deadline whatever was streamed
continuing  + backoff_elapsed / (ignored)  ; a stale timer: the backoff already elapsed
continuing  + retry_cancelled / (ignored)  ; §3: the running turn decides the chain's end
continuing  + retry_requested / (ignored)  ; the retried turn is already running
continuing  + request_refused / (ignored)  ; §13.7: only a first request (at rest) is refused
"""
"""The transition table (see the module docstring for how to read a line)."""


@dataclass(frozen=True, slots=True)
class DeclaredRow:
    """One line of :data:`TABLE` as written: ``source`` may be a group (``at_rest``).

    ``effect`` is None and ``dest`` is None for an ignored line (``reason`` says why);
    ``spec`` is the citation after ``;``.
    """

    source: str
    trigger: str
    dest: str | None
    guards: tuple[str, ...] = ()
    effect: str | None = None
    spec: str = ""

    @property
    def ignored(self) -> bool:
        return self.dest is None

    @property
    def members(self) -> tuple[str, ...]:
        """The states this line stands for: the group's members, or the source itself."""
        return GROUPS.get(self.source, (self.source,))

    @property
    def id(self) -> str:
        """Stable identifier, e.g. ``at_rest--turn_failed_retryable[!retry_enabled]->idle``."""
        if self.ignored:
            return f"{self.source}--{self.trigger}->(ignored)"
        guard = f"[{','.join(self.guards)}]" if self.guards else ""
        return f"{self.source}--{self.trigger}{guard}->{self.dest}"


@dataclass(frozen=True, slots=True)
class Row:
    """One transition as the machine runs it (a declared row expanded for one member state).

    ``guards`` holds guard names, ``!name`` for a guard that must be false. ``effect`` names
    the policy-model method that produces the actions; ``spec`` cites docs/policy.md;
    ``declared`` is the :attr:`DeclaredRow.id` it comes from.
    """

    source: str
    trigger: str
    dest: str
    guards: tuple[str, ...] = ()
    effect: str | None = None
    spec: str = ""
    declared: str = ""

    @property
    def id(self) -> str:
        """Stable identifier, e.g. ``continuing--turn_failed_retryable[!retry_enabled]->exhausted``."""
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
    declared: str = ""

    @property
    def id(self) -> str:
        return f"{self.source}--{self.trigger}->(ignored)"


_LINE = re.compile(r"^(?P<source>\w+)\s*\+\s*(?P<trigger>\w+)\s*(?:\[(?P<guards>[^\]]*)\])?\s*/\s*"
                   r"(?:(?P<ignored>\(ignored\))|(?P<effect>\w+)\s*=\s*(?P<dest>\w+))\s*"
                   r"(?:;\s*(?P<spec>.*))?$")


def parse_table(text: str) -> tuple[DeclaredRow, ...]:
    """Parse table lines (see the module docstring); raises ``ValueError`` naming a bad line."""
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            raise ValueError(f"table line {number} is not 'source + trigger [guards] / effect = "
                             f"dest ; citation': {line!r}")
        guards = tuple(g.strip() for g in (m["guards"] or "").split(",") if g.strip())
        spec = (m["spec"] or "").strip()
        if m["ignored"]:
            rows.append(DeclaredRow(m["source"], m["trigger"], None, guards, None, spec))
        else:
            rows.append(DeclaredRow(m["source"], m["trigger"], m["dest"], guards, m["effect"], spec))
    return tuple(rows)


ROWS: tuple[DeclaredRow, ...] = parse_table(TABLE)
"""The table's lines as declared (group sources kept): what the review diagram draws."""


def _expand(rows: tuple[DeclaredRow, ...]) -> tuple[tuple[Row, ...], tuple[Ignored, ...]]:
    transitions: list[Row] = []
    ignored: list[Ignored] = []
    for state in STATES:  # state-major order: the cells of a state stay together
        for d in rows:
            if state not in d.members:
                continue
            if d.ignored:
                ignored.append(Ignored(state, d.trigger, d.spec, d.id))
            else:
                assert d.dest is not None  # validated: only an ignored line has no dest
                transitions.append(Row(state, d.trigger, d.dest, d.guards, d.effect, d.spec, d.id))
    return tuple(transitions), tuple(ignored)


TRANSITIONS, IGNORED = _expand(ROWS)
"""Every row as the machine runs it, one per member state (docs/policy.md §8b.11)."""
INITIAL = IDLE


def validate(model: type | None = None, rows: tuple[DeclaredRow, ...] | None = None) -> None:
    """Check the declaration: every (state, trigger) cell is covered exactly one way.

    Raises ``ValueError`` naming the first problem: an undeclared state, group, trigger, guard
    or effect; a cell with no outcome, declared both as a transition and as ignored, or ignored
    twice; a cell whose guarded rows overlap (two rows pass for the same guard values) or leave
    a gap (no row passes; the one allowed gap is a stale timer, ``timer_is_current`` false).
    With ``model`` (a class), every guard and effect must also name a method of it.
    """
    declared = ROWS if rows is None else rows
    transitions, ignored = _expand(declared) if rows is not None else (TRANSITIONS, IGNORED)
    names = set(STATES)
    for d in declared:
        if d.source not in names and d.source not in GROUPS:
            raise ValueError(f"row {d.id} starts from an undeclared state or group {d.source!r}")
        if d.trigger not in TRIGGERS:
            raise ValueError(f"row {d.id} names an undeclared trigger {d.trigger!r}")
        if d.dest is not None and d.dest not in names:
            raise ValueError(f"row {d.id} goes to an undeclared state {d.dest!r}")
        for g in d.guards:
            if g.lstrip("!") not in GUARDS:
                raise ValueError(f"row {d.id} names an undeclared guard {g!r}")
        if d.effect is not None and d.effect not in EFFECTS:
            raise ValueError(f"row {d.id} names an undeclared effect {d.effect!r}")
        if model is not None:
            for name in [g.lstrip("!") for g in d.guards] + ([d.effect] if d.effect else []):
                if not callable(getattr(model, name, None)):
                    raise ValueError(f"row {d.id}: {model.__name__} has no method {name!r}")
    by_cell: dict[tuple[str, str], list[Row]] = {}
    for row in transitions:
        by_cell.setdefault((row.source, row.trigger), []).append(row)
    seen: set[tuple[str, str]] = set()
    for ig in ignored:
        cell = (ig.source, ig.trigger)
        if cell in by_cell:
            raise ValueError(f"cell {cell} is both a transition and ignored")
        if cell in seen:
            raise ValueError(f"cell {cell} is ignored twice")
        seen.add(cell)
    for cell in itertools.product(STATES, TRIGGERS):
        if cell not in by_cell and cell not in seen:
            raise ValueError(f"cell {cell} has no declared outcome")
    for cell, cell_rows in by_cell.items():
        guards = sorted({g.lstrip("!") for r in cell_rows for g in r.guards})
        for values in itertools.product((True, False), repeat=len(guards)):
            env = dict(zip(guards, values))
            passing = [r for r in cell_rows
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


validate()  # at import: nothing can run or draw a declaration with a gap or an overlap


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

    def to_json(self) -> dict[str, Any]:
        return {"row": self.row, "source": self.source, "trigger": self.trigger,
                "dest": self.dest, "guards": {g: ok for g, ok in self.guards},
                "outcome": self.outcome, "version": self.version}


Recorder = Callable[[object, TransitionRecord], None]
"""``recorder(owner, record)``: ``owner`` is the brain whose machine ran."""

_CONTEXT_RECORDERS: contextvars.ContextVar[tuple[Recorder, ...]] = contextvars.ContextVar(
    "fsm_lifecycle_recorders", default=())


context_recorders: Callable[[], tuple[Recorder, ...]] = _CONTEXT_RECORDERS.get
"""``context_recorders()``: the recorders of the current context (what a machine firing here
reports to)."""


@contextlib.contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """``with recording(recorder):`` — ``recorder`` hears every transition tried in this context
    (and in the asyncio tasks and ``asyncio.to_thread`` calls started inside it) until the block
    ends; then the recorders are exactly those before it, whatever happened inside."""
    token = _CONTEXT_RECORDERS.set(_CONTEXT_RECORDERS.get() + (recorder,))
    try:
        yield recorder
    finally:
        _CONTEXT_RECORDERS.reset(token)


def add_recorder(recorder: Recorder) -> None:
    """Add ``recorder`` to the current context's recorders (see :func:`recording`; tasks
    started afterwards inherit it). Adding one twice adds it once."""
    current = _CONTEXT_RECORDERS.get()
    if recorder not in current:
        _CONTEXT_RECORDERS.set(current + (recorder,))


def remove_recorder(recorder: Recorder) -> None:
    """Remove ``recorder`` from the current context's recorders; only that one, and an unknown
    one is ignored (a recorder cannot remove another's)."""
    current = _CONTEXT_RECORDERS.get()
    if recorder in current:
        _CONTEXT_RECORDERS.set(tuple(r for r in current if r is not recorder))


def report(recorders: tuple[Recorder, ...], owner: object, record: TransitionRecord) -> None:
    """Hand ``record`` of ``owner``'s machine to each of ``recorders``, in order."""
    for rec in recorders:
        rec(owner, record)


class _RecordingTransition(Transition):
    """A ``transitions.Transition`` that reports every try, guard outcome and ignored cell to
    the recorders of the firing model (``model.recorders()``) and of the context.

    It carries its row's identity (set by :func:`build_machine`): ``row_id`` (:attr:`Row.id`
    / :attr:`Ignored.id`), ``declared`` (the :attr:`DeclaredRow.id` it comes from), ``spec``
    (the citation, or an ignored cell's reason), ``ignored`` and ``position`` (its place in the
    declaration, state-major, as :data:`TRANSITIONS` / :data:`IGNORED` list it)."""

    row_id = ""
    declared = ""
    spec = ""
    ignored = False
    position = 0

    def _eval_conditions(self, event_data: EventData) -> bool:
        outcomes: list[tuple[str, bool]] = []
        passed = True
        for cond in self.conditions:  # in the order the row writes them (build_machine)
            passed = cond.check(event_data)
            name = cond.func if isinstance(cond.func, str) else getattr(cond.func, "__name__", "?")
            outcomes.append((name if cond.target else "!" + name, passed))
            if not passed:
                break
        event_data.guard_outcomes = tuple(outcomes)  # type: ignore[attr-defined]  # read by execute()
        return passed

    def execute(self, event_data: EventData) -> bool:
        ok = super().execute(event_data)
        model = event_data.model
        owned = getattr(model, "recorders", None)
        recorders = (owned() if owned is not None else ()) + _CONTEXT_RECORDERS.get()
        if recorders:
            outcome = ("ignored" if self.ignored else "taken") if ok else "rejected"
            record = TransitionRecord(self.row_id, self.source, event_data.event.name, self.dest,
                                      getattr(event_data, "guard_outcomes", ()), outcome, VERSION)
            report(recorders, getattr(model, "owner", model), record)
        return ok


class _LifecycleMachine(Machine):
    transition_cls = _RecordingTransition
    declared: tuple[DeclaredRow, ...] = ()
    """The table the machine was built from, as declared (group sources kept)."""


def build_machine(model: type | None = None,
                  rows: tuple[DeclaredRow, ...] | None = None) -> Machine:
    """Build the ``transitions`` machine from the declaration (or from ``rows``, a table
    parsed by :func:`parse_table`, validated the same way).

    ``model`` is the class of the objects the machine will fire on (the brain's private policy
    model); :func:`validate` checks that it has every guard and effect. One machine serves
    every model: models are not added to it (that would cost memory and an O(n) membership
    check each); a model fires a trigger with ``machine.events[trigger].trigger(model)``.
    ``auto_transitions`` is off, ignored cells are internal transitions (``dest=None``) and
    any undeclared cell raises ``MachineError``. A row's guards are tried in the order written
    (``transitions`` itself would try every ``conditions`` guard before the ``unless`` ones).

    The machine's own order: its ``events`` in :data:`TRIGGERS` order, each event's
    ``transitions`` per source in :data:`STATES` order, a cell's rows in the order written
    (the order ``transitions`` tries them). Each transition carries its row's identity (see
    ``_RecordingTransition``); the table it was built from is ``machine.declared``.
    Raises ``ValueError`` for a bad declaration.
    """
    validate(model, rows)
    declared = ROWS if rows is None else rows
    transitions, ignored = (TRANSITIONS, IGNORED) if rows is None else _expand(declared)
    machine = _LifecycleMachine(model=None, states=list(STATES), initial=INITIAL,
                                auto_transitions=False, ignore_invalid_triggers=False,
                                send_event=False)
    machine.declared = declared
    items: list[Row | Ignored] = [*transitions, *ignored]
    place = {id(item): i for i, item in enumerate(transitions)}
    place.update({id(item): i for i, item in enumerate(ignored)})
    items.sort(key=lambda item: (TRIGGERS.index(item.trigger), STATES.index(item.source)))
    for item in items:  # stable: a cell's rows stay in the order written
        if isinstance(item, Row):
            conditions: list[str | Callable[..., bool | None]] = list(item.conditions)
            unless: list[str | Callable[..., bool | None]] = list(item.unless)
            machine.add_transition(item.trigger, item.source, item.dest,
                                   conditions=conditions or None, unless=unless or None,
                                   after=item.effect)
        else:
            machine.add_transition(item.trigger, item.source, None)
        tr = machine.events[item.trigger].transitions[item.source][-1]
        assert isinstance(tr, _RecordingTransition)
        tr.row_id, tr.position = item.id, place[id(item)]
        if isinstance(item, Row):
            tr.declared, tr.spec = item.declared, item.spec
            written = {(g.lstrip("!"), not g.startswith("!")): i for i, g in enumerate(item.guards)}
            tr.conditions.sort(key=lambda c: written[(str(c.func), c.target)])
        else:
            tr.declared, tr.spec, tr.ignored = item.declared, item.reason, True
    return machine


def _name(callback: Any) -> str:
    """A guard's or effect's name as the declaration writes it (:func:`build_machine` gives
    names, never callables)."""
    return callback if isinstance(callback, str) else getattr(callback, "__name__", repr(callback))


def machine_rows(machine: Machine | None = None) -> tuple[tuple[Row, ...], tuple[Ignored, ...]]:
    """The transitions and ignored cells of ``machine`` (default :data:`MACHINE`), read from
    the ``transitions.Machine`` itself: each of its ``events``, each event's ``transitions``
    per source state, each transition's ``conditions`` (``unless`` ones as ``!name``, in the
    order the machine tries them), ``dest`` and ``after`` effect.

    Returned in declaration order (state-major, rows as written: each transition keeps its
    place from :func:`build_machine`), what the diagrams and the audit list them by; the
    machine itself holds them per event, then per source. Raises ``ValueError`` for a
    transition that :func:`build_machine` did not make (no row id).
    """
    m = MACHINE if machine is None else machine
    moving: list[tuple[int, Row]] = []
    ignored: list[tuple[int, Ignored]] = []
    for trigger, event in m.events.items():
        for source, candidates in event.transitions.items():
            for tr in candidates:
                if not isinstance(tr, _RecordingTransition) or not tr.row_id:
                    raise ValueError(f"transition {source}--{trigger}->{tr.dest} was not built "
                                     f"by build_machine (it has no row id)")
                if tr.ignored:
                    ignored.append((tr.position, Ignored(source, trigger, tr.spec, tr.declared)))
                    continue
                guards = tuple(_name(c.func) if c.target else "!" + _name(c.func)
                               for c in tr.conditions)
                effect = _name(tr.after[0]) if tr.after else None
                dest = source if tr.dest is None else tr.dest  # internal: it stays
                moving.append((tr.position, Row(source, trigger, dest, guards, effect,
                                                tr.spec, tr.declared)))
    moving.sort(key=lambda item: item[0])
    ignored.sort(key=lambda item: item[0])
    return tuple(r for _, r in moving), tuple(i for _, i in ignored)


def declaration(machine: Machine | None = None) -> dict[str, Any]:
    """The declaration as plain JSON-able data (what diagrams, the diff and the audit read),
    read from ``machine`` (default :data:`MACHINE`, the one the brain serves on).

    Keys: ``states``, ``initial``, ``triggers`` (the machine's states, initial state and
    events), ``groups``, ``guards`` and ``effects`` (name -> words), ``rows`` (the table the
    machine was built from, group sources kept), ``transitions`` and ``ignored`` (the
    machine's, one per member state, see :func:`machine_rows`; each names its declared
    ``row``).
    """
    m = MACHINE if machine is None else machine
    transitions, ignored = machine_rows(m)
    return {
        "states": list(m.states),
        "initial": m.initial,
        "groups": {name: list(members) for name, members in GROUPS.items()},
        "triggers": list(m.events),
        "guards": dict(GUARDS),
        "effects": dict(EFFECTS),
        "rows": [
            {"id": d.id, "source": d.source, "trigger": d.trigger, "dest": d.dest,
             "guards": list(d.guards), "effect": d.effect, "spec": d.spec,
             "ignored": d.ignored}
            for d in m.declared
        ],
        "transitions": [
            {"id": r.id, "source": r.source, "trigger": r.trigger, "dest": r.dest,
             "guards": list(r.guards), "effect": r.effect, "spec": r.spec, "row": r.declared}
            for r in transitions
        ],
        "ignored": [{"id": i.id, "source": i.source, "trigger": i.trigger, "reason": i.reason,
                     "row": i.declared}
                    for i in ignored],
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


MACHINE: Machine = build_machine()
"""The ``transitions.Machine`` built from the declaration at import: the brain serves on it
(its dispatch is compiled from this object; ``RetryBrain(engine="transitions")`` fires it),
and the diagrams, the audit and :data:`VERSION` read it (:func:`declaration`)."""

VERSION: str = _version()
"""A short hash of the declaration; traces carry it so the audit never mixes versions."""
