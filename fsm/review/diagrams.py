"""Diagrams of the retry lifecycle, generated from the one declaration (docs/policy.md §7).

The pipeline is *extract → model → render*:

- :func:`extract` reads :func:`fsm.core.lifecycle.declaration` (its rows as declared, their
  groups, the effects in words, plus the state and trigger docs of :mod:`fsm.core.lifecycle`) into
  a :class:`Diagram`, a small immutable model that knows nothing about output formats;
- two diagrams are rendered from it, each as DOT (built with :class:`graphviz.Digraph`), SVG
  (laid out by the ``dot`` binary) and Mermaid ``stateDiagram-v2``:

  - the **review diagram** (:func:`build_review_digraph`, ``retry_lifecycle_review.*``), the
    one a reviewer opens first: the rows as declared, a group of states (``at_rest``) drawn
    as one cluster whose shared rows start once from the group's node, rows between the same
    two nodes merged into one edge whose label stacks them as ``trigger [guards] / what it
    does`` (the declaration's ``effects``, in words);
  - the **per-state diagram** (:func:`build_digraph`, ``retry_lifecycle.*``): every
    transition the machine runs is one edge, labelled ``trigger [guard ∧ ¬guard]``;

- :func:`render_markdown` writes the transition table and the state × trigger matrix, and
  :func:`declaration_json` the declaration itself (``retry_lifecycle.json``, what
  :mod:`fsm.review.diagrams_diff` compares).

Ignored cells are never drawn (the Markdown lists them with their reasons). The text outputs
are byte-stable: declaration order only, no timestamps or versions, ``\\n`` line endings.
The SVGs embed the Graphviz version and coordinates, so they are checked for validity only.

Both diagrams also draw a coverage view for :mod:`fsm.review.audit`: edges coloured by status —
covered, partly covered (taken, never rejected), not covered (red, dashed) — with a legend;
:func:`build_review_digraph` also draws a diff (:mod:`fsm.review.diagrams_diff`).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from fsm._extras import require
from fsm.core import lifecycle as L

NAME = "retry_lifecycle"
"""Base name of the generated files (``retry_lifecycle.dot`` ...) and of the graph."""

TEXT_SUFFIXES: tuple[str, ...] = (".dot", ".mmd", ".md")
"""The byte-stable outputs; the SVG is written too but never compared byte for byte."""

AND, NOT = "∧", "¬"

# Okabe–Ito palette: distinguishable with the common colour-vision deficiencies. One colour
# per trigger, in declaration order, so the parallel edges of the four at-rest states can be
# matched by colour. Red is kept free for the coverage view ("not covered").
_PALETTE = ("#0072B2", "#E69F00", "#009E73", "#56B4E9", "#CC79A7", "#000000", "#8C6D00",
            "#7F7F7F")
_UNCOVERED = "#D00000"
_COVERED = "#007A56"
_PARTLY = "#B86E00"
_STATUS_STYLE = {  # coverage view: (colour, style, pen width, legend text)
    "covered": (_COVERED, "solid", "1.2", "covered: taken (and rejected, when it can be)"),
    "partly covered": (_PARTLY, "solid", "2.2", "partly covered: taken, never rejected"),
    "not covered": (_UNCOVERED, "dashed", "1.6", "not covered: never taken"),
}
_GROUP_LABELS = {"in_chain": "in a retry chain", "ended": "chain ended (at rest)",
                 "at_rest": "at rest"}
_CLUSTERS = ("in_chain", "ended")  # idle stays outside: most edges of the ended states end there
_FILLS = {"in_chain": "#FFF4D6", "ended": "#EEF3FA", "at_rest": "#FFFFFF"}


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


# ----------------------------------------------------------------------------- extract

def _passes(guards: Sequence[str], values: Mapping[str, bool]) -> bool:
    return all(values[g[1:]] is False if g.startswith("!") else values[g] for g in guards)


def _reachability(cell_rows: Sequence[Sequence[str]], k: int) -> tuple[bool, bool]:
    """(takeable, rejectable) of row ``k`` among the guard lists of one cell, in try order."""
    names = sorted({g.lstrip("!") for guards in cell_rows[:k + 1] for g in guards})
    takeable = rejectable = False
    for combo in itertools.product((False, True), repeat=len(names)):
        values = dict(zip(names, combo))
        if any(_passes(earlier, values) for earlier in cell_rows[:k]):
            continue  # row k is not even tried under these values
        if _passes(cell_rows[k], values):
            takeable = True
        else:
            rejectable = True
    return takeable, rejectable


def fold_rows(transitions: Sequence[Mapping], groups: Mapping[str, Sequence[str]]
              ) -> list[dict]:
    """The declared rows of a declaration that lists only its expanded ``transitions``.

    For each group (name → member states), transitions that every member has alike (same
    trigger, guards, dest and effect) become one row with the group as its source, at the
    place of the first member's; the rest stay one row each. Each row carries ``members``,
    the ids of its transitions. Used for declarations written before rows were declared (a
    ``--diff`` against an old version), so both sides are compared row for row.
    """
    def same(t: Mapping) -> tuple:
        return (t["trigger"], tuple(t["guards"]), t["dest"], t.get("effect"))

    by_state: dict[tuple[str, tuple], Mapping] = {(t["source"], same(t)): t for t in transitions}
    folded: dict[str, dict] = {}
    for group, members in groups.items():
        if not members:
            continue
        for t in transitions:
            if t["source"] != members[0] or t["id"] in folded:
                continue
            alike = [by_state.get((m, same(t))) for m in members]
            if all(a is not None and a["id"] not in folded for a in alike):
                guards = f"[{','.join(t['guards'])}]" if t["guards"] else ""
                row = {"id": f"{group}--{t['trigger']}{guards}->{t['dest']}", "source": group,
                       "trigger": t["trigger"], "dest": t["dest"], "guards": list(t["guards"]),
                       "effect": t.get("effect"), "spec": t.get("spec", ""),
                       "members": [a["id"] for a in alike]}
                for a in alike:
                    folded[a["id"]] = row
    rows: list[dict] = []
    placed: set[str] = set()
    for t in transitions:
        row = folded.get(t["id"])
        if row is None:
            rows.append({**{k: t.get(k) for k in ("id", "source", "trigger", "dest", "effect")},
                         "guards": list(t["guards"]), "spec": t.get("spec", ""),
                         "members": [t["id"]]})
        elif row["id"] not in placed:
            placed.add(row["id"])
            rows.append(row)
    return rows


def declared_rows(decl: Mapping, groups: Mapping[str, Sequence[str]] | None = None
                  ) -> tuple[DeclaredRow, ...]:
    """The rows of ``decl`` as written (``decl["rows"]``), or folded from its transitions
    with ``groups`` (default: its own ``groups``) when it declares none; see :func:`fold_rows`.
    """
    transitions = decl["transitions"]
    if decl.get("rows"):
        members: dict[str, list[str]] = {}
        for t in transitions:
            members.setdefault(t.get("row") or t["id"], []).append(t["id"])
        # Rows may also declare ignored cells (``"ignored": true``, no dest): not drawn.
        raw = [{**r, "members": members.get(r["id"], [])} for r in decl["rows"]
               if not r.get("ignored") and r.get("dest") is not None]
    else:
        raw = fold_rows(transitions, decl.get("groups") or {} if groups is None else groups)
    return tuple(DeclaredRow(r["id"], r["source"], r["trigger"], r["dest"],
                             tuple(r.get("guards") or ()), r.get("effect"), r.get("spec") or "",
                             tuple(r.get("members") or ()))
                 for r in raw)


def extract(decl: Mapping | None = None) -> Diagram:
    """Build the :class:`Diagram` of ``decl`` (default: :func:`fsm.core.lifecycle.declaration`).

    ``decl`` has the shape of :func:`fsm.core.lifecycle.declaration`: ``states``, ``initial``,
    ``triggers``, ``guards``, ``transitions`` (one per member state), ``ignored`` and,
    optional, ``rows`` (as declared, a group as source), ``groups`` and ``effects`` (effect →
    what it does in words). State and trigger docs and the in-chain / ended grouping of the
    full diagram come from :mod:`fsm.core.lifecycle` (``STATE_DOCS``, ``TRIGGER_DOCS``,
    ``IN_CHAIN``, ``ENDED``, ``AT_REST``) and are optional. Raises ``ValueError`` when two
    rows share an id.
    """
    decl = L.declaration() if decl is None else decl
    state_docs = getattr(L, "STATE_DOCS", {})
    trigger_docs = getattr(L, "TRIGGER_DOCS", {})
    groups = (("in_chain", set(getattr(L, "IN_CHAIN", ()))), ("ended", set(getattr(L, "ENDED", ()))),
              ("at_rest", set(getattr(L, "AT_REST", ()))))
    states = tuple(
        State(name, state_docs.get(name, ""),
              next((group for group, members in groups if name in members), ""),
              name == decl["initial"])
        for name in decl["states"])
    cell_guards: dict[tuple[str, str], list[tuple[str, ...]]] = {}
    for t in decl["transitions"]:
        cell_guards.setdefault((t["source"], t["trigger"]), []).append(tuple(t["guards"]))
    groups_of = dict(decl.get("groups") or {})
    at_rest = tuple(getattr(L, "AT_REST", ()))
    if "groups" not in decl and at_rest and set(at_rest) <= set(decl["states"]):
        groups_of = {"at_rest": list(at_rest)}  # a declaration from before groups were named
    rows = declared_rows(decl, None if decl.get("rows") else groups_of)
    row_of = {m: r.id for r in rows for m in r.members}
    seen: dict[tuple[str, str], int] = {}
    edges = []
    for t in decl["transitions"]:
        cell = (t["source"], t["trigger"])
        k = seen[cell] = seen.get(cell, -1) + 1
        takeable, rejectable = _reachability(cell_guards[cell], k)
        edges.append(Edge(t["id"], t["source"], t["trigger"], t["dest"], tuple(t["guards"]),
                          t.get("effect"), t.get("spec") or "", k, takeable,
                          rejectable and bool(t["guards"]), row_of.get(t["id"], t["id"])))
    ignored = tuple(IgnoredCell(i["id"], i["source"], i["trigger"], i["reason"])
                    for i in decl["ignored"])
    ids = [e.id for e in edges] + [i.id for i in ignored]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"row ids must be unique (edges, SVG ids and audit counts use them); "
                         f"repeated: {', '.join(duplicates)}")
    return Diagram(NAME, states,
                   tuple((t, trigger_docs.get(t, "")) for t in decl["triggers"]),
                   tuple((g, doc) for g, doc in decl["guards"].items()),
                   tuple(edges), ignored, rows,
                   tuple((g, tuple(m)) for g, m in groups_of.items()),
                   tuple((e, str(doc)) for e, doc in (decl.get("effects") or {}).items()))


# ----------------------------------------------------------------------------- DOT / SVG

def _dot_text(text: str) -> str:
    # Free text (docs, specs) must not be read as a DOT escape or an HTML label.
    graphviz = require("graphviz", extra="diagrams", feature="drawing the diagrams")

    return graphviz.nohtml(text.replace("\\", "\\\\"))


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _legend(diagram: Diagram, colours: Mapping[str, str], summary: str | None) -> str:
    rows = []
    if summary is not None:
        for line in summary.split("; "):
            rows.append(f'<tr><td colspan="2" align="left"><b>{_html(line)}</b></td></tr>')
        for colour, style, _, text in _STATUS_STYLE.values():
            stroke = "╍╍" if style == "dashed" else "━━"
            rows.append(f'<tr><td align="left"><font color="{colour}">{stroke} {_html(text.split(":")[0])}'
                        f'</font></td><td align="left">{_html(text.split(": ", 1)[1])}</td></tr>')
    else:
        rows.append('<tr><td colspan="2" align="left"><b>edge colour = trigger</b></td></tr>')
        for trigger, doc in diagram.triggers:
            rows.append(f'<tr><td align="left"><font color="{colours[trigger]}">━━ {_html(trigger)}'
                        f'</font></td><td align="left">{_html(doc)}</td></tr>')
    rows.append('<tr><td colspan="2" align="left"><b>guards</b> '
                f'({AND} and, {NOT} not; rows of a cell are tried top to bottom)</td></tr>')
    for guard, doc in diagram.guards:
        rows.append(f'<tr><td align="left">{_html(guard)}</td><td align="left">{_html(doc)}</td></tr>')
    for twins in diagram.twins():
        rows.append(f'<tr><td colspan="2" align="left">{_html(_twins_text(twins))}</td></tr>')
    rows.append(f'<tr><td colspan="2" align="left">{len(diagram.ignored)} ignored (state, trigger)'
                f' cells are not drawn: see {diagram.name}.md</td></tr>')
    return ('<<table border="0" cellborder="0" cellspacing="0" cellpadding="2">'
            + "".join(rows) + "</table>>")


def _twins_text(twins: Sequence[str]) -> str:
    return (f"{', '.join(twins[1:])}: the same transitions and ignored cells as {twins[0]} "
            "(one edge each)")


def build_digraph(diagram: Diagram, marks: Mapping[str, EdgeMark] | None = None,
                  summary: str | None = None):
    """The :class:`graphviz.Digraph` of ``diagram``.

    States are grouped in two clusters (in a chain / chain ended), ``idle`` stays outside
    (most edges of the ended states lead to it); each edge has ``id`` = the row
    id, the ``trigger [guards]`` label and a tooltip with the effect and the spec reference.
    With ``marks`` (row id → :class:`EdgeMark`) edges are drawn for coverage: covered solid
    green, partly covered solid amber and thicker, not covered red and dashed; a row without a
    mark counts as not covered; ``summary`` (lines joined by ``"; "``) heads the legend, which
    explains the three.
    """
    graphviz = require("graphviz", extra="diagrams", feature="drawing the diagrams")

    colours = {t: _PALETTE[i % len(_PALETTE)] for i, (t, _) in enumerate(diagram.triggers)}
    g = graphviz.Digraph(diagram.name)
    g.attr("graph", rankdir="LR", newrank="true", nodesep="0.35", ranksep="1.1",
           fontname="Helvetica", fontsize="11", labelloc="t",
           label=_dot_text(f"{diagram.name}: generated from fsm/core/lifecycle.py"))
    g.attr("node", shape="box", style="rounded,filled", fontname="Helvetica", fontsize="12",
           fillcolor="#FFFFFF")
    g.attr("edge", fontname="Helvetica", fontsize="9", arrowsize="0.7")
    initial = [s for s in diagram.states if s.initial]
    if initial:
        g.node("__initial", label="", shape="point", width="0.15", style="filled",
               fillcolor="black")
    for group in _CLUSTERS:
        members = [s for s in diagram.states if s.group == group]
        if not members:
            continue
        with g.subgraph(name=f"cluster_{group}") as c:
            c.attr(label=_GROUP_LABELS[group], style="rounded,dashed", color="#999999",
                   fontcolor="#555555")
            for s in members:
                _state_node(c, s)
    for s in diagram.states:
        if s.group not in _CLUSTERS:
            _state_node(g, s)
    for s in initial:
        g.edge("__initial", s.name, id="initial", tooltip="initial state")
    for e in diagram.edges:
        attrs = {"id": e.id, "tooltip": _dot_text(f"{e.id} / {e.effect or '-'}: {e.spec}")}
        label = e.label
        if marks is None:
            attrs["color"] = attrs["fontcolor"] = colours[e.trigger]
        else:
            mark = marks.get(e.id, EdgeMark("not covered", "no data"))
            if mark.note:
                label = f"{label} ({mark.note})"
            colour, style, width, _ = _STATUS_STYLE[mark.status]
            attrs.update(color=colour, fontcolor=colour, style=style, penwidth=width)
        g.edge(e.source, e.dest, label=_dot_text(label), **attrs)
    g.node("__legend", label=_legend(diagram, colours, summary), shape="plaintext",
           style="", fontsize="10")
    return g


def _state_node(graph, s: State) -> None:
    graph.node(s.name, label=s.name, fillcolor=_FILLS.get(s.group, "#FFFFFF"), tooltip=_dot_text(s.doc or s.name),
               penwidth="2" if s.initial else "1")


def render_dot(diagram: Diagram, marks: Mapping[str, EdgeMark] | None = None,
               summary: str | None = None) -> str:
    """Graphviz DOT text of ``diagram`` (``\\n`` endings); see :func:`build_digraph`."""
    return build_digraph(diagram, marks, summary).source


def render_svg(diagram: Diagram, marks: Mapping[str, EdgeMark] | None = None,
               summary: str | None = None) -> bytes:
    """SVG bytes laid out by Graphviz's ``dot``.

    Raises :class:`DiagramError` when the ``dot`` binary is not on ``PATH`` (install Graphviz:
    ``make setup`` or ``apt-get install graphviz``) or when it fails.
    """
    return svg_of(build_digraph(diagram, marks, summary))


def svg_of(graph) -> bytes:
    """Lay out a :class:`graphviz.Digraph` with ``dot`` into SVG bytes; see :func:`render_svg`
    for the errors."""
    graphviz = require("graphviz", extra="diagrams", feature="drawing the diagrams")

    try:
        return graph.pipe(format="svg")
    except graphviz.ExecutableNotFound as exc:
        raise DiagramError(
            "cannot render SVG: Graphviz's 'dot' program was not found on PATH; install "
            "Graphviz ('make setup', or 'apt-get install graphviz') and run again") from exc
    except graphviz.CalledProcessError as exc:
        raise DiagramError(f"cannot render SVG: 'dot' failed: {exc}") from exc


# ----------------------------------------------------------------------------- Mermaid

def render_mermaid(diagram: Diagram) -> str:
    """Mermaid ``stateDiagram-v2`` text: one ``src --> dst : label`` line per edge."""
    lines = ["---", f"title: {diagram.name}", "---", "stateDiagram-v2", "    direction LR",
             "    %% generated from fsm/core/lifecycle.py by 'python -m fsm diagrams'; do not edit",
             f"    %% {len(diagram.ignored)} ignored (state, trigger) cells are not drawn: "
             f"see {diagram.name}.md"]
    for s in diagram.states:
        if s.doc:
            lines.append(f"    {s.name} : {_mermaid_text(s.doc)}")
    for s in diagram.states:
        if s.initial:
            lines.append(f"    [*] --> {s.name}")
    for e in diagram.edges:
        lines.append(f"    {e.source} --> {e.dest} : {_mermaid_text(e.label)}")
    for twins in diagram.twins():
        lines.append(f"    %% {_twins_text(twins)}")
    for group, css in (("in_chain", "fill:#FFF4D6,stroke:#8C6D00"),
                       ("ended", "fill:#EEF3FA,stroke:#0072B2")):
        members = [s.name for s in diagram.states if s.group == group]
        if members:
            lines.append(f"    classDef {group} {css}")
            lines.append(f"    class {','.join(members)} {group}")
    return "\n".join(lines) + "\n"


def _mermaid_text(text: str) -> str:
    # ':' separates a label and ';' ends a statement in Mermaid (a ratio sign '∶' looks the
    # same); '#' starts an entity code.
    return text.replace(":", "∶").replace(";", ",").replace("#", "no. ")


# ----------------------------------------------------------------------------- review diagram

REVIEW = f"{NAME}_review"
"""Base name of the review diagram's files (``retry_lifecycle_review.dot`` ...)."""

ADDED, REMOVED, CHANGED = "added", "removed", "changed"
_CHANGE_STYLE = {  # diff view: colour, line style, marker; Okabe–Ito, with a marker beside colour
    ADDED: ("#009E73", "solid", "+"),
    REMOVED: ("#D55E00", "dashed", "−"),
    CHANGED: ("#0072B2", "solid", "~"),
}
_REVIEW_EDGE = "#444444"
_GROUP_WORDS = {"at_rest": "at rest"}


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


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width, break_on_hyphens=False) or [""]


Line = tuple[str, str, str, str]
"""One line of a review label: ``(kind, bold, text, change)``; see :func:`_label_runs`."""


def _label_runs(diagram: Diagram, edge: ReviewEdge, width: int | None
                ) -> list[tuple[list[list[Line]], list[Line]]]:
    """The label of an edge as runs of rows that share one effect: ``[(rows, effect lines)]``,
    each row a list of lines ``(kind, bold, text, change)``; ``kind`` is ``row`` (a row's first
    line), ``more`` (its wrapped guards), ``was`` (what a changed row was) or ``effect``. A
    trigger repeated by the next rows is written once, their guards follow as ``or [guards]``;
    the effect is in the declaration's words. ``width`` wraps long lines (None: never)."""
    def wrap(text: str, n: int) -> list[str]:
        return [text] if width is None else _wrap(text, n)

    runs: list[list[DrawnRow]] = []
    for d in edge.rows:
        if runs and runs[-1][-1].row.effect == d.row.effect and runs[-1][-1].tone == d.tone:
            runs[-1].append(d)
        else:
            runs.append([d])
    n = width or 0
    previous = None
    out: list[tuple[list[list[Line]], list[Line]]] = []
    for run in runs:
        rows: list[list[Line]] = []
        for d in run:
            lines: list[Line] = []
            guards = wrap(f"[{guard_text(d.row.guards)}]", n) if d.row.guards else []
            if d.row.trigger == previous and guards:
                lines.append(("row", "", f"  or {guards.pop(0)}", d.tone))
                indent = "      "
            else:
                first = guards.pop(0) if guards and (width is None or len(d.row.trigger)
                                                     + len(guards[0]) <= n) else ""
                lines.append(("row", d.row.trigger, f" {first}" if first else "", d.tone))
                indent = "    "
            lines += [("more", "", f"{indent}{w}", d.tone) for w in guards]
            previous = d.row.trigger
            if d.was:
                lines += [("was", "", f"{indent}{w}", d.tone) for w in wrap(d.was, n)]
            rows.append(lines)
        effect = diagram.effect_text(run[-1].row.effect)
        effect_lines: list[Line] = []
        if effect:
            effect_lines = [("effect", "", ("/ " if i == 0 else "  ") + w, run[-1].change)
                            for i, w in enumerate(wrap(effect, n))]
        out.append((rows, effect_lines))
    return out


def _label_lines(diagram: Diagram, edge: ReviewEdge, width: int | None) -> list[Line]:
    """Every line of :func:`_label_runs`, in reading order (each run's effect after it)."""
    return [line for rows, effect in _label_runs(diagram, edge, width)
            for line in [l for row in rows for l in row] + effect]


def _line_html(line: Line) -> str:
    kind, bold, text, change = line
    if change in _STATUS_STYLE:  # the coverage view: coloured words, no marker
        colour = _STATUS_STYLE[change][0]
        html = (f"<b>{_html(bold)}</b>" if bold else "") + _html(text)
        if kind == "was":
            return f'<font color="{colour}" point-size="7"><i>{html}</i></font>'
        return f'<font color="{colour}">{html}</font>' if kind != "effect" else (
            f'<font color="#555555"><i>{html}</i></font>')
    colour, _, mark = _CHANGE_STYLE.get(change, ("#000000", "", ""))
    html = (f"<b>{_html(bold)}</b>" if bold else "") + _html(text)
    if kind == "effect":
        return f'<font color="{colour if change else "#555555"}"><i>{html}</i></font>'
    if kind == "was":
        return f'<font color="{colour}" point-size="7"><i>{html}</i></font>'
    if change:
        return f'<font color="{colour}">{mark if kind == "row" else " "} {html}</font>'
    return html


LABEL_WIDTH = 64
"""Characters per line of a review label before it wraps."""


def _review_label(diagram: Diagram, edge: ReviewEdge) -> str:
    """The edge's stacked lines (:func:`_label_lines`) as a Graphviz HTML label."""
    br = '<br align="left"/>'
    text = br.join(_line_html(line) for line in _label_lines(diagram, edge, LABEL_WIDTH))
    return f"<{text}{br}>"


def _review_legend(diagram: Diagram, diff: str | None, summary: str | None = None) -> str:
    rows = []
    if summary is not None:
        for line in summary.split("; "):
            rows.append(f'<tr><td colspan="2" align="left"><b>{_html(line)}</b></td></tr>')
        words = {"covered": "taken in every state it holds in (and rejected, when it can be)",
                 "partly covered": "taken, but not in every state, or never rejected",
                 "not covered": "never taken"}
        for status, (colour, style, _, _) in _STATUS_STYLE.items():
            stroke = "╍╍" if style == "dashed" else "━━"
            rows.append(f'<tr><td align="left"><font color="{colour}">{stroke} {_html(status)}'
                        f'</font></td><td align="left">{_html(words[status])}</td></tr>')
        rows.append('<tr><td colspan="2" align="left">a row drawn from a group counts once per '
                    'member state (per state: --svg-states); an edge is as covered as its rows'
                    '</td></tr>')
    if diff is not None:
        rows.append(f'<tr><td colspan="2" align="left"><b>{_html(diff)}</b></td></tr>')
        for change, (colour, style, mark) in _CHANGE_STYLE.items():
            stroke = "╍╍" if style == "dashed" else "━━"
            rows.append(f'<tr><td align="left"><font color="{colour}">{stroke} {mark} {change}'
                        '</font></td><td align="left">'
                        + {ADDED: "a row the old version did not have",
                           REMOVED: "a row of the old version that is gone",
                           CHANGED: "same source, trigger, dest and effect; other guards (or "
                                    "the same guards, another effect)"}[change]
                        + "</td></tr>")
    rows.append('<tr><td colspan="2" align="left"><b>read an edge as</b> trigger [guards] / '
                f'what it does; {AND} and, {NOT} not; a cell\'s rows are tried top to bottom</td></tr>')
    for guard, doc in diagram.guards:
        text = '<br align="left"/>'.join(_html(w) for w in _wrap(doc, 110))
        rows.append(f'<tr><td align="left" valign="top">{_html(guard)}&#160;&#160;</td>'
                    f'<td align="left">{text}<br align="left"/></td></tr>')
    for group, members in diagram.groups:
        rows.append(f'<tr><td colspan="2" align="left">{_html(_group_words(group))}: a row drawn '
                    f'from it holds in each of {_html(", ".join(members))} (the audit counts it '
                    'once per state)</td></tr>')
    rows.append(f'<tr><td colspan="2" align="left">{len(diagram.ignored)} ignored (state, trigger)'
                f' cells are not drawn; every cell, per state: {diagram.name}.md</td></tr>')
    return ('<<table border="0" cellborder="0" cellspacing="0" cellpadding="1">'
            + "".join(rows) + "</table>>")


def _group_words(group: str) -> str:
    return _GROUP_WORDS.get(group, group.replace("_", " "))


def build_review_digraph(diagram: Diagram, drawn: Sequence[DrawnRow] | None = None,
                         diff: str | None = None, title: str | None = None,
                         summary: str | None = None):
    """The review :class:`graphviz.Digraph`: the declared rows, not one edge per state.

    Each group of states (``at_rest``) is a cluster holding its member states and one node
    for the group itself, from which the group's rows are drawn once; rows between the same
    two nodes are one edge whose label stacks them (``trigger [guards]``, then ``/ what it
    does`` from the declaration's ``effects``). ``drawn`` (default: every row, unchanged) and
    ``diff`` (a summary line heading the legend) are how :mod:`fsm.review.diagrams_diff` draws a
    change; a row whose states are gone from ``diagram`` gets a dashed node of its own. Rows
    with a ``coverage`` status draw the coverage view (:func:`fsm.review.audit.coverage_svg`): each
    row in its status colour with its counts, each edge as its rows' status, ``summary``
    (lines joined by ``"; "``) heading a legend of the three statuses.
    """
    graphviz = require("graphviz", extra="diagrams", feature="drawing the diagrams")

    drawn = tuple(DrawnRow(r) for r in diagram.rows) if drawn is None else tuple(drawn)
    g = graphviz.Digraph(REVIEW)
    g.attr("graph", rankdir="TB", newrank="true", nodesep="0.3", ranksep="0.45",
           fontname="Helvetica", fontsize="11", labelloc="t", labeljust="l", pad="0.1",
           label=_dot_text(title or f"{diagram.name}: the rows as declared in fsm/core/lifecycle.py "
                                    f"(per state: {diagram.name}.svg)"))
    g.attr("node", shape="box", style="rounded,filled", fontname="Helvetica", fontsize="12",
           fillcolor="#FFFFFF")
    g.attr("edge", fontname="Helvetica", fontsize="8", arrowsize="0.7", color=_REVIEW_EDGE)
    names = {s.name for s in diagram.states}
    grouped = {m: group for group, members in diagram.groups for m in members}
    initial = [s for s in diagram.states if s.initial]
    if initial:
        g.node("__initial", label="", shape="point", width="0.12", style="filled",
               fillcolor="black")
    for group, members in diagram.groups:
        with g.subgraph(name=f"cluster_{group}") as c:
            c.attr(label=_dot_text(_group_words(group)), style="rounded,filled", color="#7F98B5",
                   fillcolor="#F3F6FA", fontcolor="#2B4A6F")
            c.node(group, label=_dot_text(f"any state {_group_words(group)}"), shape="box",
                   style="rounded,filled,bold", fillcolor="#DCE6F2", color="#2B4A6F",
                   tooltip=_dot_text(f"{group}: {', '.join(members)}"))
            for s in diagram.states:
                if s.name in members:
                    _state_node(c, s)
    for s in diagram.states:
        if s.name not in grouped:
            _state_node(g, s)
    known = names | {group for group, _ in diagram.groups}
    ghosts = []
    for d in drawn:
        for end in (d.row.source, d.row.dest):
            if end not in known and end not in ghosts:
                ghosts.append(end)
    for end in ghosts:
        g.node(end, label=_dot_text(f"{end} (gone)"), style="rounded,dashed",
               color=_CHANGE_STYLE[REMOVED][0], fontcolor=_CHANGE_STYLE[REMOVED][0])
    for s in initial:
        g.edge("__initial", s.name, id="initial", tooltip="initial state")
    for e in review_edges(drawn):
        attrs = {"id": e.id, "tooltip": _dot_text("; ".join(d.row.id for d in e.rows))}
        if e.change:
            colour, style, _ = _CHANGE_STYLE[e.change]
            attrs.update(color=colour, style=style, penwidth="1.8")
        elif e.coverage:
            colour, style, width, _ = _STATUS_STYLE[e.coverage]
            attrs.update(color=colour, style=style, penwidth=width)
        g.edge(e.source, e.dest, label=_review_label(diagram, e), **attrs)
    g.node("__legend", label=_review_legend(diagram, diff, summary), shape="plaintext",
           style="", fontsize="9")
    # The legend sits beside the last states drawn (the bottom row), not above the machine.
    bottom = [s.name for s in diagram.states if s.name in grouped and s.name != diagram.states[0].name]
    if bottom:
        with g.subgraph() as r:
            r.attr(rank="same")
            r.node(bottom[-1])
            r.node("__legend")
    return g


def render_review_dot(diagram: Diagram) -> str:
    """DOT text of the review diagram (``\\n`` endings); see :func:`build_review_digraph`."""
    return build_review_digraph(diagram).source


def render_review_svg(diagram: Diagram) -> bytes:
    """SVG of the review diagram; raises :class:`DiagramError` as :func:`render_svg` does."""
    return svg_of(build_review_digraph(diagram))


def render_review_mermaid(diagram: Diagram, drawn: Sequence[DrawnRow] | None = None,
                          title: str | None = None) -> str:
    """Mermaid ``stateDiagram-v2`` of the review diagram: one line per merged edge, its rows
    stacked with ``<br>``; a group is a state of its own (``at_rest``, "any state at rest").
    In a diff, rows are marked ``+`` added, ``−`` removed, ``~`` changed."""
    drawn = tuple(DrawnRow(r) for r in diagram.rows) if drawn is None else tuple(drawn)
    lines = ["---", f"title: {title or REVIEW}", "---", "stateDiagram-v2", "    direction LR",
             "    %% generated from fsm/core/lifecycle.py by 'python -m fsm diagrams'; do not edit",
             f"    %% {len(diagram.ignored)} ignored (state, trigger) cells are not drawn: "
             f"see {diagram.name}.md"]
    for group, members in diagram.groups:
        lines.append(f"    state \"any state {_group_words(group)} ({', '.join(members)})\" as {group}")
    for s in diagram.states:
        if s.initial:
            lines.append(f"    [*] --> {s.name}")
    for e in review_edges(drawn):
        parts = []
        for kind, bold, text, change in _label_lines(diagram, e, None):
            mark = _CHANGE_STYLE[change][2] + " " if change and kind == "row" else ""
            if kind in ("row", "effect") or not parts:
                parts.append(f"{mark}{bold}{text}".strip())
            elif kind == "was":
                parts[-1] += f" ({text.strip()})"
            else:
                parts[-1] += " " + text.strip()
        lines.append(f"    {e.source} --> {e.dest} : "
                     + "<br>".join(_mermaid_text(p) for p in parts))
    css = {"group": "fill:#DCE6F2,stroke:#2B4A6F", "in_chain": "fill:#FFF4D6,stroke:#8C6D00",
           "ended": "fill:#EEF3FA,stroke:#0072B2"}
    if diagram.groups:
        lines.append(f"    classDef group {css['group']}")
        lines.append(f"    class {','.join(g for g, _ in diagram.groups)} group")
    for group in ("in_chain", "ended"):
        members = [s.name for s in diagram.states if s.group == group]
        if members:
            lines.append(f"    classDef {group} {css[group]}")
            lines.append(f"    class {','.join(members)} {group}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- Markdown

def md_cell(text: str) -> str:
    """``text`` safe in a Markdown table cell (``|`` escaped, on one line)."""
    return _md(text)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(name: str) -> str:
    return f"`{name}`"


def render_markdown(diagram: Diagram) -> str:
    """The transition table, the state × trigger matrix and the ignored cells, as Markdown."""
    out: list[str] = [
        f"# The retry lifecycle ({diagram.name})",
        "",
        "Generated from `fsm/core/lifecycle.py` by `python -m fsm diagrams` (`make diagrams`); "
        "do not edit by hand.",
        f"Pictures: [{diagram.name}.svg]({diagram.name}.svg) (Graphviz), "
        f"[{diagram.name}.mmd]({diagram.name}.mmd) (Mermaid).",
        "",
        "## States",
        "",
        "| state | group | meaning |",
        "|---|---|---|",
    ]
    for s in diagram.states:
        group = _GROUP_LABELS.get(s.group, "")
        name = _code(s.name) + (" (initial)" if s.initial else "")
        out.append(f"| {name} | {group} | {_md(s.doc)} |")
    if diagram.twins():
        out.append("")
        out += [f"- {_twins_text(t)}." for t in diagram.twins()]
    out += ["", "## Triggers", "", "| trigger | meaning |", "|---|---|"]
    out += [f"| {_code(t)} | {_md(doc)} |" for t, doc in diagram.triggers]
    out += ["", "## Guards", "",
            f"`!name` in the declaration, `{NOT}name` in the diagrams: the guard must be false; "
            f"`{AND}` joins guards that must all hold.", "",
            "| guard | meaning |", "|---|---|"]
    out += [f"| {_code(g)} | {_md(doc)} |" for g, doc in diagram.guards]
    if diagram.effects:
        out += ["", "## Effects", "", "What each row's effect does (the review diagram's "
                "`/ ...` text).", "", "| effect | what it does |", "|---|---|"]
        out += [f"| {_code(e)} | {_md(doc)} |" for e, doc in diagram.effects]
    out += ["", "## Transitions", "",
            "One row per declared transition, in declaration order. Within a (state, trigger) "
            "cell the rows are tried top to bottom and the first whose guards hold is taken.",
            "", "| # | source | trigger | guards | dest | effect | spec |",
            "|---|---|---|---|---|---|---|"]
    for n, e in enumerate(diagram.edges, 1):
        out.append(f"| {n} | {_code(e.source)} | {_code(e.trigger)} | {_md(e.guard_text)} | "
                   f"{_code(e.dest)} | {_code(e.effect) if e.effect else ''} | {_md(e.spec)} |")
    reasons: dict[str, str] = {}
    for i in diagram.ignored:
        reasons.setdefault(i.reason, f"I{len(reasons) + 1}")
    out += ["", "## State × trigger matrix", "",
            "Each cell holds its transitions (`→ dest [guards]`, in try order) or *ignored* "
            "with the key of its reason; an empty cell has no declared outcome.", "",
            "| state \\ trigger | " + " | ".join(_code(t) for t, _ in diagram.triggers) + " |",
            "|---|" + "---|" * len(diagram.triggers)]
    for s in diagram.states:
        cells = []
        for t, _ in diagram.triggers:
            edges, ignored = diagram.cell(s.name, t)
            parts = [f"→ {_code(e.dest)}" + (f" [{e.guard_text}]" if e.guards else "")
                     for e in edges]
            if ignored is not None:
                parts.append(f"*ignored* ({reasons[ignored.reason]})")
            cells.append("<br>".join(_md(p) for p in parts))
        out.append(f"| {_code(s.name)} | " + " | ".join(cells) + " |")
    out += ["", "Reasons:", ""]
    out += [f"- **{key}**: {_md(reason)}" for reason, key in reasons.items()]
    out += ["", "## Ignored cells", "",
            "Not drawn as edges. The coverage audit counts each as covered once it is seen "
            "ignored.", "", "| # | state | trigger | reason |", "|---|---|---|---|"]
    out += [f"| {n} | {_code(i.source)} | {_code(i.trigger)} | {_md(i.reason)} |"
            for n, i in enumerate(diagram.ignored, 1)]
    fallbacks = [e for e in diagram.edges if e.guards and e.takeable and not e.rejectable]
    shadowed = [e for e in diagram.edges if not e.takeable]
    out += ["", "## Rows the audit cannot see rejected", ""]
    if fallbacks:
        out += ["These guarded rows are the fallback of their cell: whenever their guards fail, "
                "an earlier row of the cell is taken, so they are never tried and rejected. "
                "The coverage audit does not ask for their rejection.", ""]
        out += [f"- {_code(e.id)}" for e in fallbacks]
    else:
        out.append("None: every guarded row can be rejected.")
    if shadowed:
        out += ["", "## Rows that can never be taken", "",
                "Earlier rows of the same cell take every case these rows' guards allow: "
                "probably a mistake in the declaration.", ""]
        out += [f"- {_code(e.id)}" for e in shadowed]
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- files

def declaration_json(decl: Mapping | None = None) -> str:
    """The declaration (default: :func:`fsm.core.lifecycle.declaration`) as the JSON written next
    to the diagrams (``retry_lifecycle.json``), what ``--diff`` compares: 2-space indents,
    declaration order, UTF-8, a final ``\\n``."""
    decl = L.declaration() if decl is None else decl
    return json.dumps(decl, indent=2, ensure_ascii=False) + "\n"


def render_all(diagram: Diagram | None = None, decl: Mapping | None = None) -> dict[str, str]:
    """The byte-stable text outputs, file name → text: the per-state diagram (``.dot``,
    ``.mmd``, ``.md``), the review diagram (``_review.dot``, ``_review.mmd``) and the
    declaration as JSON (``.json``)."""
    decl = L.declaration() if decl is None and diagram is None else decl
    diagram = extract(decl) if diagram is None else diagram
    out = {f"{diagram.name}.dot": render_dot(diagram),
           f"{diagram.name}.mmd": render_mermaid(diagram),
           f"{diagram.name}.md": render_markdown(diagram),
           f"{REVIEW}.dot": render_review_dot(diagram),
           f"{REVIEW}.mmd": render_review_mermaid(diagram)}
    if decl is not None:
        out[f"{diagram.name}.json"] = declaration_json(decl)
    return out


def write_file(path: Path, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8 with ``\\n`` endings) to ``path``, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)


def write_all(out: Path | str, *, svg: bool = True) -> list[Path]:
    """Write every output into the folder ``out``; return the paths written, in order.

    The text files are written first, so a missing ``dot`` (:class:`DiagramError`) still
    leaves them up to date.
    """
    out = Path(out)
    decl = L.declaration()
    diagram = extract(decl)
    written = []
    for name, text in render_all(diagram, decl).items():
        write_file(out / name, text)
        written.append(out / name)
    if svg:
        for name, data in ((diagram.name, render_svg(diagram)),
                           (REVIEW, render_review_svg(diagram))):
            write_file(out / f"{name}.svg", data)
            written.append(out / f"{name}.svg")
    return written


def check(out: Path | str) -> list[str]:
    """Compare the committed text outputs in ``out`` with fresh ones; return the stale names."""
    out = Path(out)
    stale = []
    for name, text in render_all().items():
        path = out / name
        if not path.is_file() or path.read_bytes() != text.encode("utf-8"):
            stale.append(name)
    return stale
