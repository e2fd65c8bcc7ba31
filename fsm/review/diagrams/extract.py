"""Extract: read the ``transitions`` machine the brain serves on (:data:`fsm.core.lifecycle.MACHINE`:
its ``machine.events``, their transitions, conditions and effects, through
:func:`fsm.core.lifecycle.declaration`), or a declaration of the same shape such as an older
``retry_lifecycle.json``, into the :class:`~fsm.review.diagrams.model.Diagram`."""

from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

from fsm.core import lifecycle as L
from fsm.review.diagrams.model import (NAME, DeclaredRow, Diagram, Edge, IgnoredCell, State)

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


def extract(decl: Mapping | None = None, *, machine: Any = None) -> Diagram:
    """Build the :class:`Diagram` of ``decl``; by default the declaration read from ``machine``
    (a ``transitions.Machine`` from :func:`fsm.core.lifecycle.build_machine`; default
    :data:`fsm.core.lifecycle.MACHINE`, the one the brain serves on): its states, events and
    each event's transitions, conditions and effects (:func:`fsm.core.lifecycle.declaration`).

    ``decl`` has the shape of :func:`fsm.core.lifecycle.declaration`: ``states``, ``initial``,
    ``triggers``, ``guards``, ``transitions`` (one per member state), ``ignored`` and,
    optional, ``rows`` (as declared, a group as source), ``groups`` and ``effects`` (effect →
    what it does in words). State and trigger docs and the in-chain / ended grouping of the
    full diagram come from :mod:`fsm.core.lifecycle` (``STATE_DOCS``, ``TRIGGER_DOCS``,
    ``IN_CHAIN``, ``ENDED``, ``AT_REST``) and are optional. Raises ``ValueError`` when two
    rows share an id.
    """
    decl = L.declaration(machine) if decl is None else decl
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

