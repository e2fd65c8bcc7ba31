"""The diagrams' model: what :mod:`.extract` reads from the declaration and every renderer draws.

Immutable, in declaration order, and free of any output format: :class:`Diagram` (states,
triggers, guards, the transitions as the machine runs them, the rows as declared, ignored
cells, groups and effects in words), and the review diagram's view of rows (:class:`DrawnRow`,
merged into :class:`ReviewEdge` by :func:`review_edges`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

NAME = "retry_lifecycle"
"""Base name of the generated files (``retry_lifecycle.dot`` ...) and of the graph."""

TEXT_SUFFIXES: tuple[str, ...] = (".dot", ".mmd", ".md")
"""The byte-stable outputs; the SVG is written too but never compared byte for byte."""

AND, NOT = "∧", "¬"


class DiagramError(RuntimeError):
    """A diagram could not be produced (for example Graphviz's ``dot`` is not installed)."""


@dataclass(frozen=True, slots=True)
class State:
    """A state: ``group`` is ``"in_chain"``, ``"ended"``, ``"at_rest"`` (idle) or ``""``."""

    name: str
    doc: str
    group: str
    initial: bool


@dataclass(frozen=True, slots=True)
class Edge:
    """One declared transition (one :class:`fsm.core.lifecycle.Row`).

    ``order`` is the row's position among the rows of its (source, trigger) cell (rows are
    tried in that order; the first whose guards hold is taken). ``takeable`` / ``rejectable``
    say whether some combination of guard values lets the row be taken / be tried and
    rejected, given the rows tried before it: the fallback row of a cell whose earlier rows
    cover every other case can never be rejected, and a row shadowed by earlier ones can never
    be taken. Guards are treated as independent booleans.
    """

    id: str
    source: str
    trigger: str
    dest: str
    guards: tuple[str, ...]
    effect: str | None
    spec: str
    order: int
    takeable: bool
    rejectable: bool
    row: str = ""

    @property
    def guard_text(self) -> str:
        """``retry_enabled ∧ ¬has_retries_left``; empty for an unguarded row."""
        return f" {AND} ".join(NOT + g[1:] if g.startswith("!") else g for g in self.guards)

    @property
    def label(self) -> str:
        """``trigger [guards]``, e.g. ``turn_failed_retryable [retry_enabled ∧ ¬has_retries_left]``."""
        return f"{self.trigger} [{self.guard_text}]" if self.guards else self.trigger


@dataclass(frozen=True, slots=True)
class DeclaredRow:
    """One row as written in the declaration: ``source`` may be a group (``at_rest``).

    ``members`` are the ids of the transitions the machine runs for it, one per member state
    (one, the row itself, when ``source`` is a state).
    """

    id: str
    source: str
    trigger: str
    dest: str
    guards: tuple[str, ...]
    effect: str | None
    spec: str
    members: tuple[str, ...] = ()

    @property
    def guard_text(self) -> str:
        """``retry_enabled ∧ ¬has_retries_left``; empty for an unguarded row."""
        return guard_text(self.guards)

    @property
    def key(self) -> tuple[str, str, str, str | None]:
        """What identifies a row between two versions: source, trigger, dest and effect."""
        return (self.source, self.trigger, self.dest, self.effect)


def guard_text(guards: Sequence[str]) -> str:
    """``["a", "!b"]`` → ``a ∧ ¬b``."""
    return f" {AND} ".join(NOT + g[1:] if g.startswith("!") else g for g in guards)


@dataclass(frozen=True, slots=True)
class IgnoredCell:
    """A (state, trigger) cell that is explicitly not a transition, and why."""

    id: str
    source: str
    trigger: str
    reason: str


@dataclass(frozen=True, slots=True)
class Diagram:
    """The intermediate model: everything a renderer needs, in declaration order."""

    name: str
    states: tuple[State, ...]
    triggers: tuple[tuple[str, str], ...]
    guards: tuple[tuple[str, str], ...]
    edges: tuple[Edge, ...]
    ignored: tuple[IgnoredCell, ...]
    rows: tuple[DeclaredRow, ...] = ()
    groups: tuple[tuple[str, tuple[str, ...]], ...] = ()
    effects: tuple[tuple[str, str], ...] = ()

    def effect_text(self, effect: str | None) -> str:
        """What ``effect`` does in a reader's words (the declaration's ``effects``); the
        effect's name with spaces when the declaration has no words for it."""
        if not effect:
            return ""
        return dict(self.effects).get(effect) or effect.replace("_", " ")

    def state(self, name: str) -> State:
        """The state called ``name``; ``KeyError`` if there is none."""
        for s in self.states:
            if s.name == name:
                return s
        raise KeyError(name)

    def twins(self) -> tuple[tuple[str, ...], ...]:
        """Groups of two or more states whose outgoing behaviour is identical.

        Two states are twins when they have the same rows (trigger, guards, dest, effect, in
        order) and the same ignored cells (trigger, reason). Diagrams say so in the legend, since
        their identical edges are drawn once per state.
        """
        groups: dict[tuple, list[str]] = {}
        for s in self.states:
            sig = (tuple((e.trigger, e.guards, e.dest, e.effect) for e in self.edges
                         if e.source == s.name),
                   tuple((i.trigger, i.reason) for i in self.ignored if i.source == s.name))
            groups.setdefault(sig, []).append(s.name)
        return tuple(tuple(g) for g in groups.values() if len(g) > 1)

    def cell(self, source: str, trigger: str) -> tuple[tuple[Edge, ...], IgnoredCell | None]:
        """The edges (in try order) and the ignored entry of one (state, trigger) cell."""
        edges = tuple(e for e in self.edges if e.source == source and e.trigger == trigger)
        ignored = next((i for i in self.ignored if i.source == source and i.trigger == trigger),
                       None)
        return edges, ignored


@dataclass(frozen=True, slots=True)
class EdgeMark:
    """How to draw one edge in the coverage view: its ``status`` (``"covered"``, ``"partly
    covered"`` or ``"not covered"``, see :data:`fsm.review.audit.STATUSES`) and a short ``note``."""

    status: str
    note: str = ""


REVIEW = f"{NAME}_review"
"""Base name of the review diagram's files (``retry_lifecycle_review.dot`` ...)."""

ADDED, REMOVED, CHANGED = "added", "removed", "changed"


@dataclass(frozen=True, slots=True)
class DrawnRow:
    """A declared row as the review diagram draws it: ``change`` is ``""`` (as it is),
    ``"added"``, ``"removed"`` or ``"changed"``; ``was`` says what a changed row was. In the
    coverage view ``coverage`` is the row's status (``"covered"``, ``"partly covered"``,
    ``"not covered"``) and ``was`` its counts."""

    row: DeclaredRow
    change: str = ""
    was: str = ""
    coverage: str = ""

    @property
    def tone(self) -> str:
        """What colours the row: its change, else its coverage status."""
        return self.change or self.coverage


@dataclass(frozen=True, slots=True)
class ReviewEdge:
    """Rows drawn as one edge: the same source and dest (and, in a diff, removed rows apart
    from the others, added rows apart too)."""

    source: str
    dest: str
    rows: tuple[DrawnRow, ...]

    @property
    def change(self) -> str:
        """``removed`` / ``added`` when every row is; ``changed`` when some row is; else ``""``."""
        kinds = {r.change for r in self.rows}
        if kinds in ({REMOVED}, {ADDED}):
            return kinds.pop()
        return CHANGED if kinds - {""} else ""

    @property
    def coverage(self) -> str:
        """The edge's coverage status: ``covered`` when every row is, ``not covered`` when no
        row was taken, else ``partly covered`` (a taken edge is never drawn as missed); ``""``
        outside the coverage view."""
        kinds = {r.coverage for r in self.rows}
        if kinds == {""}:
            return ""
        if kinds == {"covered"}:
            return "covered"
        return "not covered" if kinds == {"not covered"} else "partly covered"

    @property
    def id(self) -> str:
        return f"{self.source}->{self.dest}" + (f"({self.change})" if self.change in (ADDED, REMOVED) else "")


def review_edges(drawn: Sequence[DrawnRow]) -> tuple[ReviewEdge, ...]:
    """Merge rows between the same two nodes into one edge, in declaration order; removed
    rows and added rows get edges of their own (drawn in their colour)."""
    merged: dict[tuple[str, str, str], list[DrawnRow]] = {}
    for d in drawn:
        bucket = d.change if d.change in (ADDED, REMOVED) else ""
        merged.setdefault((d.row.source, d.row.dest, bucket), []).append(d)
    return tuple(ReviewEdge(src, dst, tuple(rows)) for (src, dst, _), rows in merged.items())



@dataclass(frozen=True, slots=True)
class Cascade:
    """A refusal cascade: in the (``source``, ``trigger``) cell, the row that goes on needs
    every guard of ``order``; each refusal row needs the guards before one of them and that one
    false, so the rows are "the first failing guard decides" (docs/policy.md §8b.1).

    ``refusals`` holds (the failing guard, its row), in guard order.
    """

    source: str
    trigger: str
    order: tuple[str, ...]
    refusals: tuple[tuple[str, DeclaredRow], ...]

    def refused_by(self, row_id: str) -> str | None:
        """The guard whose failure takes row ``row_id``; None if it is not a refusal here."""
        return next((g for g, r in self.refusals if r.id == row_id), None)


def cascades(rows: Sequence[DeclaredRow]) -> tuple[Cascade, ...]:
    """The refusal cascades among declared ``rows``, in declaration order, at most one per
    (source, trigger) cell: the row whose guards (two or more) have the most refusals, a
    refusal being a row to another state whose guards start with ``guards[:k]`` and then the
    opposite of ``guards[k]`` (it may name more guards after that one, as ``¬budget_allows ∧
    ¬budget_waits``; a row to the same state, such as the fallback switch, is no refusal);
    at least two refusals make a cascade."""
    best: dict[tuple[str, str], Cascade] = {}
    order: list[tuple[str, str]] = []
    for go in rows:
        if len(go.guards) < 2:
            continue
        refusals = []
        for k, guard in enumerate(go.guards):
            opposite = guard[1:] if guard.startswith("!") else "!" + guard
            want = go.guards[:k] + (opposite,)
            row = next((r for r in rows if (r.source, r.trigger) == (go.source, go.trigger)
                        and r.guards[:k + 1] == want and r.dest != go.dest), None)
            if row is not None:
                refusals.append((guard, row))
        cell = (go.source, go.trigger)
        if len(refusals) >= 2 and (cell not in best or len(refusals) > len(best[cell].refusals)):
            if cell not in best:
                order.append(cell)
            best[cell] = Cascade(go.source, go.trigger, go.guards, tuple(refusals))
    return tuple(best[cell] for cell in order)
