"""The diagram tests' shared helpers: the fallback-row oracle, a small grouped declaration and a
reader of review DOT edges (tests share helpers through support modules, docs/architecture.md
"The layers"; the diagrams: docs/diagrams.md)."""

from __future__ import annotations

import itertools
import re

from fsm.core import lifecycle as L


def fallback_rows() -> list[str]:
    """Guarded rows that can never be tried and rejected (whenever their guards fail an
    earlier row of the cell is taken), found by trying every guard value: the oracle the
    diagrams' and the audit's own reasoning is checked against."""
    cells: dict[tuple[str, str], list[L.Row]] = {}
    for r in L.TRANSITIONS:
        cells.setdefault((r.source, r.trigger), []).append(r)

    def holds(row, env):
        return all(env[g.lstrip("!")] != g.startswith("!") for g in row.guards)

    found = set()
    for rows in cells.values():
        names = sorted({g.lstrip("!") for r in rows for g in r.guards})
        envs = [dict(zip(names, v)) for v in itertools.product((True, False), repeat=len(names))]
        for k, row in enumerate(rows):
            if row.guards and not any(not holds(row, env) and not any(holds(e, env) for e in rows[:k])
                                      for env in envs):
                found.add(row.id)
    return [r.id for r in L.TRANSITIONS if r.id in found]


def grouped_declaration(rows=None, effects=None) -> dict:
    """A small declaration with a group, in the shape of lifecycle.declaration(): rows as
    declared (``source`` may be the group ``rest``), transitions expanded per member state."""
    groups = {"rest": ["calm", "done"]}
    rows = rows if rows is not None else [
        ("rest", "go", "busy", ["ready"], "start"),
        ("rest", "go", "calm", ["!ready"], "nothing"),
        ("rest", "stop", "calm", [], "nothing"),
        ("busy", "finish", "done", [], "report"),
        ("busy", "fail", "busy", ["ready"], "again"),
        ("busy", "fail", "done", ["!ready"], "report"),
        ("busy", "stop", "calm", [], "report"),
    ]
    def rid(src, trig, guards, dest):
        return f"{src}--{trig}" + (f"[{','.join(guards)}]" if guards else "") + f"->{dest}"
    declared, transitions = [], []
    for src, trig, dest, guards, effect in rows:
        row_id = rid(src, trig, guards, dest)
        declared.append({"id": row_id, "source": src, "trigger": trig, "dest": dest,
                         "guards": list(guards), "effect": effect, "spec": "test"})
        for s in groups.get(src, [src]):
            transitions.append({"id": rid(s, trig, guards, dest), "source": s, "trigger": trig,
                                "dest": dest, "guards": list(guards), "effect": effect,
                                "spec": "test", "row": row_id})
    states = ["calm", "busy", "done"]
    triggers = ["go", "stop", "finish", "fail"]
    cells = {(t["source"], t["trigger"]) for t in transitions}
    ignored = [{"id": f"{s}--{t}->(ignored)", "source": s, "trigger": t, "reason": "n/a"}
               for s in states for t in triggers if (s, t) not in cells]
    return {"states": states, "initial": "calm", "triggers": triggers,
            "guards": {"ready": "the work is ready"}, "transitions": transitions,
            "ignored": ignored, "groups": groups, "rows": declared,
            "effects": effects if effects is not None else {
                "start": "emits started; starts the work", "nothing": "does nothing",
                "report": "emits finished", "again": "emits retry; starts again"}}


def _unquote(name: str) -> str:
    return name[1:-1] if name.startswith('"') else name


def _label_text(body: str) -> str:
    label = re.search(r"label=<(.*)>(?= \w+=)", body)
    text = re.sub(r"<[^>]+>", "\n", label.group(1)) if label else ""
    text = "\n".join(t.strip() for t in text.split("\n") if t.strip())
    return text.replace("&gt;", ">").replace("&lt;", "<").replace("&amp;", "&")


def _attrs(body: str) -> dict[str, str]:
    rest = re.sub(r"label=<(.*)>(?= \w+=)", "", body)
    return {k: v.strip('"') for k, v in re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s\]]+)', rest)}


def review_dot_edges(source: str) -> list[tuple[str, str, dict[str, str], str]]:
    """(tail, head, attributes, label text) of every edge of a review DOT text. An edge is drawn
    as ``tail -> "__label ID"`` and ``"__label ID" -> head``; the attributes are those of the
    second half, with the label node's ``id``."""
    labels, halves = {}, {}
    for line in source.splitlines():
        m = re.match(r'\t"__label (.+?)" \[(.*)\]$', line)
        if m:
            labels[m.group(1)] = _label_text(m.group(2))
            continue
        m = re.match(r'\t("[^"]+"|\S+) -> ("[^"]+"|\S+) \[(.*)\]$', line)
        if m:
            tail, head, body = _unquote(m.group(1)), _unquote(m.group(2)), m.group(3)
            halves.setdefault(tail if tail.startswith("__label ") else head, []).append(
                (tail, head, _attrs(body), _label_text(body)))
    edges = []
    for key, parts in halves.items():
        if not key.startswith("__label "):
            edges += [(t, h, a, text) for t, h, a, text in parts]
            continue
        (tail, _, first, _), (_, head, second, _) = sorted(parts, key=lambda p: p[0] == key)
        assert first["id"].endswith("#from") and second["id"].endswith("#to")
        edges.append((tail, head, dict(second, id=second["id"].removesuffix("#to")),
                      labels[key[len("__label "):]]))
    return edges
