"""The changes to the lifecycle between two versions of its declaration, for a review.

``python -m fsm diagrams --diff OLD.json`` and ``--diff-ref GIT_REF`` (``make diagrams-diff
BASE=main``) compare an old declaration — the JSON written next to the diagrams
(``diagrams/retry_lifecycle.json``), or read from the repository at a revision — with the
current one, and draw the review diagram (:func:`fsm.review.diagrams.build_review_digraph`) with the
changes marked, plus a Markdown table of the same changes (Mermaid included) to paste in a
pull request.

Rows are compared as declared (a group such as ``at_rest`` is one row); an old declaration
that lists only expanded transitions is folded with the groups of the new one first
(:func:`fsm.review.diagrams.fold_rows`), so regrouping rows is no change. Rows are matched by
source, trigger, dest and effect: a row whose guards differ is *changed*, not one row removed
and another added; rows that also match on guards but not on effect are changed too (the
effect). Everything else is *added* or *removed*. The row's spec citation is not compared.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from fsm.review import diagrams as D
from fsm.core import lifecycle as L

DIFF = f"{D.NAME}_diff"
"""Base name of the diff's files (``retry_lifecycle_diff.svg``, ``.dot``, ``.md``)."""

JSON_PATH = f"diagrams/{D.NAME}.json"
"""Where the declaration's JSON lives in the repository (what ``--diff-ref`` reads)."""

REQUIRED = ("states", "initial", "triggers", "guards", "transitions", "ignored")


class DiffError(ValueError):
    """An old declaration could not be read: the message names the file or revision."""


@dataclass(frozen=True, slots=True)
class RowChange:
    """One changed row: ``change`` is ``"added"``, ``"removed"`` or ``"changed"``; ``what``
    names what changed in a changed row (``"guards"``, ``"effect"``)."""

    change: str
    old: D.DeclaredRow | None
    new: D.DeclaredRow | None
    what: tuple[str, ...] = ()

    @property
    def row(self) -> D.DeclaredRow:
        """The row as it is now (the old one for a removed row)."""
        return self.new if self.new is not None else self.old  # type: ignore[return-value]


@dataclass
class MachineDiff:
    """The changes from ``old`` to ``new``, each list in declaration order: ``rows`` the
    changed rows (added and changed in the new order, then the removed ones), ``unchanged``
    the rest; ``states``, ``triggers``, ``guards`` and ``ignored`` (cells) as (added,
    removed) names; ``effect_words`` as (effect, old words, new words)."""

    old_name: str
    new_name: str
    rows: list[RowChange] = field(default_factory=list)
    unchanged: list[D.DeclaredRow] = field(default_factory=list)
    # (added, removed) names of each kind
    states: tuple[list[str], list[str]] = field(default_factory=lambda: ([], []))
    triggers: tuple[list[str], list[str]] = field(default_factory=lambda: ([], []))
    guards: tuple[list[str], list[str]] = field(default_factory=lambda: ([], []))
    ignored: tuple[list[str], list[str]] = field(default_factory=lambda: ([], []))
    effect_words: list[tuple[str, str, str]] = field(default_factory=list)
    old_effects: dict[str, str] = field(default_factory=dict)

    def count(self, change: str) -> int:
        return sum(c.change == change for c in self.rows)

    @property
    def empty(self) -> bool:
        return not self.rows and not any(
            a or r for a, r in (self.states, self.triggers, self.guards, self.ignored))

    def other_changes(self) -> list[tuple[str, list[str]]]:
        """The changes besides rows, each ``(what, names)``: ``("states added", [...])``,
        ``("ignored cells removed", [...])``; only the non-empty ones."""
        out = []
        for label, (added, removed) in (("states", self.states), ("triggers", self.triggers),
                                        ("guards", self.guards), ("ignored cells", self.ignored)):
            out += [(f"{label} {change}", names)
                    for change, names in (("added", added), ("removed", removed)) if names]
        return out

    def summary(self) -> str:
        """``1 row removed, 1 row changed (guards)`` or ``no change to the rows``."""
        parts = []
        for change in (D.ADDED, D.REMOVED, D.CHANGED):
            n = self.count(change)
            if n:
                what = ""
                if change == D.CHANGED:
                    names = sorted({w for c in self.rows if c.change == change for w in c.what})
                    what = f" ({', '.join(names)})"
                parts.append(f"{n} row{'s' if n > 1 else ''} {change}{what}")
        return ", ".join(parts) or "no change to the rows"


# ----------------------------------------------------------------------------- compare

def _pairs(a: Sequence, b: Sequence) -> tuple[list[str], list[str]]:
    return [x for x in b if x not in a], [x for x in a if x not in b]


def _groups(*decls: Mapping) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for decl in decls:
        for group, members in (decl.get("groups") or {}).items():
            out.setdefault(group, list(members))
    return out


def compare(old: Mapping, new: Mapping, *, old_name: str = "old",
            new_name: str = "new") -> MachineDiff:
    """The :class:`MachineDiff` from ``old`` to ``new`` (both shaped like
    :func:`fsm.core.lifecycle.declaration`); see the module doc for how rows are matched."""
    groups = _groups(new, old)
    old_rows = list(D.declared_rows(old, groups))
    new_rows = list(D.declared_rows(new, groups))
    matched_old: dict[int, tuple[str, ...]] = {}  # old index -> what changed
    match_of_new: dict[int, int] = {}
    for exact in (True, False):  # same key: first equal guards, then any guards (changed)
        for j, n in enumerate(new_rows):
            if j in match_of_new:
                continue
            for i, o in enumerate(old_rows):
                if i in matched_old or o.key != n.key:
                    continue
                if exact and o.guards != n.guards:
                    continue
                matched_old[i] = () if exact else ("guards",)
                match_of_new[j] = i
                break
    for j, n in enumerate(new_rows):  # same source, trigger, dest and guards: the effect changed
        if j in match_of_new:
            continue
        for i, o in enumerate(old_rows):
            if (i not in matched_old and (o.source, o.trigger, o.dest, o.guards)
                    == (n.source, n.trigger, n.dest, n.guards)):
                matched_old[i] = ("effect",)
                match_of_new[j] = i
                break
    result = MachineDiff(old_name, new_name)
    for j, n in enumerate(new_rows):
        if j not in match_of_new:
            result.rows.append(RowChange(D.ADDED, None, n))
        elif matched_old[match_of_new[j]]:
            result.rows.append(RowChange(D.CHANGED, old_rows[match_of_new[j]], n,
                                         matched_old[match_of_new[j]]))
        else:
            result.unchanged.append(n)
    result.rows += [RowChange(D.REMOVED, o, None) for i, o in enumerate(old_rows)
                    if i not in matched_old]
    result.states = _pairs(old["states"], new["states"])
    result.triggers = _pairs(old["triggers"], new["triggers"])
    result.guards = _pairs(list(old["guards"]), list(new["guards"]))
    cells = lambda d: [f"{i['source']} + {i['trigger']}" for i in d["ignored"]]  # noqa: E731
    result.ignored = _pairs(cells(old), cells(new))
    old_words, new_words = old.get("effects") or {}, new.get("effects") or {}
    result.old_effects = {str(k): str(v) for k, v in old_words.items()}
    result.effect_words = [(e, old_words[e], new_words[e]) for e in new_words
                           if e in old_words and old_words[e] != new_words[e]]
    return result


def _was(diagram: D.Diagram, c: RowChange) -> str:
    old = c.old
    assert old is not None
    parts = []
    if "guards" in c.what:
        parts.append(f"guards were [{D.guard_text(old.guards)}]" if old.guards
                     else "had no guards")
    if "effect" in c.what:
        parts.append(f"effect was: {diagram.effect_text(old.effect) or 'none'}")
    return "; ".join(parts)


def drawn_rows(result: MachineDiff, diagram: D.Diagram) -> list[D.DrawnRow]:
    """The rows the diff's review diagram draws: the new rows in order, marked, then the
    removed ones."""
    changes = {c.new.id: c for c in result.rows if c.new is not None}
    out = []
    for row in diagram.rows:
        c = changes.get(row.id)
        if c is None:
            out.append(D.DrawnRow(row))
        else:
            out.append(D.DrawnRow(row, c.change, _was(diagram, c) if c.change == D.CHANGED else ""))
    out += [D.DrawnRow(c.old, D.REMOVED) for c in result.rows if c.change == D.REMOVED]
    return out


# ----------------------------------------------------------------------------- render

def _title(result: MachineDiff) -> str:
    return f"{D.NAME}, changes from {result.old_name} to {result.new_name}"


def with_old_words(result: MachineDiff, diagram: D.Diagram) -> D.Diagram:
    """``diagram`` whose effect words also cover the old version's effects (removed rows)."""
    words = dict(result.old_effects)
    words.update(diagram.effects)
    return dataclasses.replace(diagram, effects=tuple(words.items()))


def build_digraph(result: MachineDiff, diagram: D.Diagram):
    """The review :class:`graphviz.Digraph` with the changes marked (see the module doc)."""
    diagram = with_old_words(result, diagram)
    return D.build_review_digraph(diagram, drawn_rows(result, diagram),
                                  diff=result.summary(), title=_title(result))


def render_markdown(result: MachineDiff, diagram: D.Diagram) -> str:
    """A Markdown section for a pull request: the changes as a table, the other changes of
    the declaration, then the review diagram with the changes marked as Mermaid."""
    diagram = with_old_words(result, diagram)
    out = [f"### Lifecycle changes: `{result.old_name}` → `{result.new_name}`", "",
           f"**{result.summary()}.** Rows are matched by source, trigger, destination and "
           "effect; `at_rest` is the group of idle, succeeded, exhausted and cancelled.", ""]
    if result.rows:
        out += ["| change | from | trigger | guards | to | effect |", "|---|---|---|---|---|---|"]
        marks = {D.ADDED: "➕ added", D.REMOVED: "➖ removed", D.CHANGED: "✏️ changed"}
        for c in result.rows:
            row = c.row
            guards = D.guard_text(row.guards)
            effect = diagram.effect_text(row.effect)
            if "guards" in c.what:
                was = D.guard_text(c.old.guards) if c.old.guards else "none"
                guards = f"~~{was}~~ → {guards or 'none'}"
            if "effect" in c.what:
                effect = f"~~{diagram.effect_text(c.old.effect)}~~ → {effect}"
            change = marks[c.change] + (f" ({', '.join(c.what)})" if c.what else "")
            out.append(f"| {change} | `{row.source}` | `{row.trigger}` | {D.md_cell(guards)} | "
                       f"`{row.dest}` | {D.md_cell(effect)} |")
        out.append("")
    other = [f"- {what}: " + ", ".join(f"`{x}`" for x in names)
             for what, names in result.other_changes()]
    other += [f"- effect `{e}` now reads “{new}” (was “{old}”)" for e, old, new in result.effect_words]
    if other:
        out += ["Also changed in the declaration:", ""] + other + [""]
    mermaid = D.render_review_mermaid(diagram, drawn_rows(result, diagram), title=_title(result))
    out += ["The review diagram with the changes (`+` added, `−` removed, `~` changed):", "",
            "```mermaid", mermaid.rstrip("\n"), "```"]
    return "\n".join(out) + "\n"


def write(result: MachineDiff, diagram: D.Diagram, out: Path | str, *,
          svg: bool = True) -> list[Path]:
    """Write ``retry_lifecycle_diff.md``, ``.dot`` and (``svg``) ``.svg`` into ``out``;
    return the paths written. Raises :class:`fsm.review.diagrams.DiagramError` without ``dot``
    (after the text files are written)."""
    out = Path(out)
    graph = build_digraph(result, diagram)
    written = []
    for suffix, data in ((".md", render_markdown(result, diagram)), (".dot", graph.source)):
        D.write_file(out / f"{DIFF}{suffix}", data)
        written.append(out / f"{DIFF}{suffix}")
    if svg:
        D.write_file(out / f"{DIFF}.svg", D.svg_of(graph))
        written.append(out / f"{DIFF}.svg")
    return written


# ----------------------------------------------------------------------------- inputs

def check_declaration(data: object, where: str) -> dict:
    """``data`` if it has the shape of a declaration; :class:`DiffError` naming ``where``."""
    if not isinstance(data, dict):
        raise DiffError(f"{where}: expected a JSON object (a lifecycle declaration), got "
                        f"{type(data).__name__}")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise DiffError(f"{where}: not a lifecycle declaration (missing {', '.join(missing)})")
    for t in data["transitions"]:
        if not isinstance(t, dict) or not {"id", "source", "trigger", "dest", "guards"} <= set(t):
            raise DiffError(f"{where}: a transition needs id, source, trigger, dest and guards; "
                            f"got {t!r:.160}")
    return data


def load_file(path: str | Path) -> dict:
    """The declaration in the JSON file ``path``; :class:`DiffError` when it is not one."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DiffError(f"{path}: cannot read the declaration: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DiffError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    return check_declaration(data, str(path))


def _git(args: Sequence[str], cwd: Path) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=60)
    except FileNotFoundError as exc:
        raise DiffError("--diff-ref needs git on PATH") from exc


def load_ref(ref: str, cwd: Path | str = ".") -> dict:
    """The declaration at the git revision ``ref`` of the repository around ``cwd``.

    Reads ``diagrams/retry_lifecycle.json`` at ``ref`` (``git show REF:PATH``). A revision
    from before that file existed still works: its ``fsm`` package is exported to a temporary
    folder (``git archive``) and asked for its declaration. Raises :class:`DiffError` when
    ``cwd`` is not in a git repository, ``ref`` is unknown, or neither way gives one.
    """
    if ref.startswith("-"):
        raise DiffError(f"not a git revision: {ref!r}")
    cwd = Path(cwd)
    top = _git(["rev-parse", "--show-toplevel"], cwd)
    if top.returncode:
        raise DiffError(f"--diff-ref {ref}: {cwd.resolve()} is not inside a git repository")
    root = Path(top.stdout.decode().strip())
    if _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], root).returncode:
        raise DiffError(f"--diff-ref {ref}: no such revision in {root}")
    shown = _git(["show", f"{ref}:{JSON_PATH}"], root)
    if shown.returncode == 0:
        try:
            return check_declaration(json.loads(shown.stdout.decode("utf-8")), f"{ref}:{JSON_PATH}")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DiffError(f"{ref}:{JSON_PATH}: not JSON ({exc})") from None
    return _declaration_from_source(ref, root)


# A revision's declaration module: fsm/core/lifecycle.py since the layer folders, fsm/lifecycle.py
# before them.
_ASK = ("import importlib, json, os, sys, fsm\n"
        "here = os.path.dirname(fsm.__file__)\n"
        "name = 'fsm.core.lifecycle' if os.path.isfile(os.path.join(here, 'core', 'lifecycle.py')) "
        "else 'fsm.lifecycle'\n"
        "L = importlib.import_module(name)\n"
        "sys.stdout.write(json.dumps({'file': fsm.__file__, 'lifecycle': L.__file__, "
        "'declaration': L.declaration()}))")


def _declaration_from_source(ref: str, root: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="fsm-diff-") as tmp:
        archive = _git(["archive", "--format=tar", ref, "fsm"], root)
        if archive.returncode:
            raise DiffError(f"--diff-ref {ref}: neither {JSON_PATH} nor an fsm package at {ref}")
        import io
        import tarfile

        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4: refuse links out of tmp
                tar.extractall(tmp, filter="data")
            else:  # pragma: no cover - older 3.11 releases; git archive writes plain files
                tar.extractall(tmp)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        done = subprocess.run([sys.executable, "-c", _ASK], cwd=tmp, env=env,
                              capture_output=True, timeout=120)
        try:
            answer = json.loads(done.stdout.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            answer = None
        if (done.returncode or not answer or not str(answer["file"]).startswith(tmp)
                or not str(answer["lifecycle"]).startswith(tmp)):
            tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["?"]
            raise DiffError(f"--diff-ref {ref}: {JSON_PATH} is not in that revision and its "
                            f"lifecycle module did not give a declaration ({tail[0]})")
        return check_declaration(answer["declaration"], f"{ref}:fsm lifecycle")


def current() -> dict:
    """The current declaration (:func:`fsm.core.lifecycle.declaration`)."""
    return L.declaration()
