"""The transition-coverage report a reviewer opens in a browser (docs/diagrams.md "The report").

``python -m fsm audit --html DIR [--base FILE] [--trace FILE] [--pr-summary FILE]`` and the
pytest plugin's ``--transition-coverage-html DIR`` write a static folder that opens offline in
any browser (no script, no CDN, no build step; every page carries its own style sheet):

- ``index.html``: the summary; a legend of every mark; with ``--base``, the rows added,
  removed and changed since that declaration, each marked *untested* when no test took it;
  the review diagram inline as SVG, each edge coloured by coverage and each row of its label
  linked to its line of the table; the table of every declared row (its state, trigger,
  guards, destination, effect, coverage, the outcomes seen — taken, rejected by which guard,
  ignored — and the tests that exercised it); with ``--trace``, the story of each trace;
- ``states/<state>.html``: one page per state, its small diagram (rows into and out of it)
  and the table of those rows.

:func:`pr_summary` is the Markdown of the changed rows and their coverage, short enough for a
pull request's comment. Everything is computed from a :class:`fsm.review.audit.Report` (whose
``contexts`` name the tests) and the current declaration, read when called; nothing counts the
declaration's rows in advance.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from fsm.core import lifecycle as L
from fsm.review import audit as A
from fsm.review.diagrams import Diagram, extract, guard_text
from fsm.review.diagrams.style import CHANGE_STYLE, STATUS_STYLE, group_words

__all__ = ["ReportRow", "report_rows", "build_pages", "write", "pr_summary", "UNTESTED",
           "CHANGE_WORDS"]

UNTESTED = "untested"
"""The mark of an added or changed row that no test (no trace) took."""

STATUS_MARK = {A.COVERED: "✔", A.PARTLY: "◐", A.NOT_COVERED: "✘"}
"""The sign beside each status word (colour is never the only mark)."""

STATUS_CLASS = {A.COVERED: "covered", A.PARTLY: "partly", A.NOT_COVERED: "not"}

STATUS_WORDS = {
    A.COVERED: "taken in every state the row holds in, and seen rejected when it can be "
               "(an ignored row: seen ignored in every state)",
    A.PARTLY: "taken, but not in every state it holds in, or never seen rejected",
    A.NOT_COVERED: "never taken (an ignored row: never seen ignored)",
}

CHANGE_WORDS = {"added": "a row the base declaration did not have",
                "removed": "a row of the base declaration that is gone",
                "changed": "same state, trigger, destination and effect as a row of the base; "
                           "other guards (or the same guards, another effect)"}


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


# ----------------------------------------------------------------------------- the rows

@dataclass(frozen=True, slots=True)
class Member:
    """One transition (or ignored cell) the machine runs for a declared row, in one state."""

    state: str
    coverage: A.RowCoverage


@dataclass(frozen=True, slots=True)
class ReportRow:
    """One declared row as the report shows it: ``anchor`` (its id in ``index.html``),
    ``number`` (1-based, declaration order), ``dest`` None for an ignored row, ``status`` one
    of :data:`fsm.review.audit.STATUSES`, ``members`` its transitions per state."""

    id: str
    anchor: str
    number: int
    source: str
    trigger: str
    dest: str | None
    guards: tuple[str, ...]
    effect: str
    spec: str
    status: str
    members: tuple[Member, ...]

    @property
    def ignored(self) -> bool:
        return self.dest is None

    @property
    def taken(self) -> int:
        """Records that took the row (an ignored row: that saw it ignored), every state."""
        return sum(m.coverage.ignored if self.ignored else m.coverage.taken for m in self.members)

    @property
    def states(self) -> tuple[str, ...]:
        return tuple(m.state for m in self.members)


def _anchor(number: int, source: str, trigger: str) -> str:
    return f"r{number}-" + re.sub(r"[^A-Za-z0-9_-]+", "-", f"{source}-{trigger}")


def _status(members: Sequence[A.RowCoverage], ignored: bool) -> str:
    statuses = {m.status for m in members}
    if not members or statuses <= {A.NOT_COVERED}:
        return A.NOT_COVERED
    if statuses == {A.COVERED}:
        return A.COVERED
    return A.PARTLY


def report_rows(report: A.Report, decl: Mapping[str, Any] | None = None) -> list[ReportRow]:
    """Every row of the declaration (``decl``, default: the current one), in order: its
    transitions' coverage merged as :func:`fsm.review.audit.declared_marks` merges them (and
    an ignored row's cells the same way)."""
    decl = L.declaration() if decl is None else decl
    diagram = extract(decl)
    by_id = {r.id: r for r in report.transitions + report.ignored}
    members: dict[str, list[Member]] = {}
    for t in list(decl["transitions"]) + list(decl["ignored"]):
        cov = by_id.get(t["id"])
        if cov is not None:
            members.setdefault(t.get("row") or t["id"], []).append(Member(t["source"], cov))
    rows = []
    for n, r in enumerate(decl["rows"], 1):
        ms = tuple(members.get(r["id"], ()))
        ignored = bool(r.get("ignored")) or r.get("dest") is None
        rows.append(ReportRow(
            r["id"], _anchor(n, r["source"], r["trigger"]), n, r["source"], r["trigger"],
            None if ignored else r["dest"], tuple(r.get("guards") or ()),
            "" if ignored else diagram.effect_text(r.get("effect")), r.get("spec") or "",
            _status([m.coverage for m in ms], ignored), ms))
    return rows


# ----------------------------------------------------------------------------- HTML pieces

CSS = """
:root { color-scheme: light; --ink: #1d1d1f; --muted: #555; --rule: #d0d4da; --focus: #1a5fb4; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.45 "DejaVu Sans", system-ui, sans-serif; color: var(--ink);
       background: #fff; }
header, main, footer { max-width: 1240px; margin: 0 auto; padding: 0 16px; }
h1 { font-size: 1.5rem; margin: 16px 0 4px; } h2 { font-size: 1.2rem; margin: 28px 0 8px; }
a { color: #0b57a4; } a:focus-visible, [tabindex]:focus-visible, summary:focus-visible {
  outline: 3px solid var(--focus); outline-offset: 2px; }
svg a:focus { outline: 3px solid var(--focus); }
.skip { position: absolute; left: -9999px; } .skip:focus { left: 16px; top: 8px; background: #fff;
  padding: 4px 8px; z-index: 2; }
nav ul { list-style: none; padding: 0; margin: 8px 0; display: flex; flex-wrap: wrap; gap: 4px 16px; }
.summary { font-size: 1.05rem; } .muted { color: var(--muted); }
.diagram { overflow: auto; max-height: 640px; border: 1px solid var(--rule); border-radius: 4px;
  padding: 4px; background: #fff; }
.diagram svg { display: block; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
caption { text-align: left; font-weight: bold; padding: 4px 0; }
th, td { border-bottom: 1px solid var(--rule); padding: 4px 6px; text-align: left; vertical-align: top; }
thead th { position: sticky; top: 0; background: #f4f6f8; z-index: 1; }
td.guards { max-width: 260px; } td.tests { max-width: 360px; } td.tests code, td code.id {
  overflow-wrap: anywhere; font-size: 12px; }
td.tests ul { margin: 0; padding-left: 16px; } td.tests p { margin: 0; }
tr:target { outline: 3px solid var(--focus); outline-offset: -3px; background: #eef4fb; }
.mark { font-weight: bold; white-space: nowrap; }
.mark.covered { color: @covered@; } .mark.partly { color: @partly@; } .mark.not { color: @not@; }
.change { font-weight: bold; white-space: nowrap; }
.change.added { color: @added@; } .change.removed { color: @removed@; } .change.changed { color: @changed@; }
.untested { color: #fff; background: @not@; padding: 0 4px; border-radius: 3px; font-weight: bold; }
dl.legend { display: grid; grid-template-columns: minmax(auto, 15em) 1fr; gap: 2px 12px;
  margin: 0; align-content: start; font-size: 13px; }
dl.legend dt { font-weight: bold; } dl.legend dd { margin: 0; }
.legend-cols { display: grid; grid-template-columns: 1fr 1fr; gap: 8px 32px; }
@media (max-width: 900px) { .legend-cols { grid-template-columns: 1fr; } }
.swatch { display: inline-block; width: 28px; height: 0; vertical-align: middle; border-top: 3px solid; }
"""
_COLOURS = {"covered": STATUS_STYLE[A.COVERED][0], "partly": STATUS_STYLE[A.PARTLY][0],
       "not": STATUS_STYLE[A.NOT_COVERED][0], "added": CHANGE_STYLE["added"][0],
       "removed": CHANGE_STYLE["removed"][0], "changed": CHANGE_STYLE["changed"][0]}
for _name, _colour in _COLOURS.items():
    CSS = CSS.replace(f"@{_name}@", _colour)


def _page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{_e(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}\n"
            "</body>\n</html>\n")


def _inline_svg(svg: bytes, label: str) -> str:
    """Graphviz's SVG without its XML prologue, labelled for assistive technology."""
    text = svg.decode("utf-8")
    start = text.find("<svg")
    text = text[start:] if start >= 0 else text
    text = re.sub(r"<!--.*?-->\s*", "", text, flags=re.S)
    return text.replace("<svg", f'<svg role="img" aria-label="{_e(label)}"', 1)


def _status_html(status: str) -> str:
    return (f'<span class="mark {STATUS_CLASS[status]}">{STATUS_MARK[status]} '
            f"{_e(status)}</span>")


def _guards_html(guards: Sequence[str], docs: Mapping[str, str]) -> str:
    if not guards:
        return '<span class="muted">none</span>'
    parts = []
    for g in guards:
        name = g.lstrip("!")
        shown = guard_text([g])
        parts.append(f'<abbr title="{_e(docs.get(name, name))}">{_e(shown)}</abbr>')
    return " ∧ ".join(parts)


def _state_link(state: str, diagram: Diagram, prefix: str) -> str:
    groups = dict(diagram.groups)
    if state in groups:
        members = ", ".join(f'<a href="{prefix}states/{_e(m)}.html">{_e(m)}</a>'
                            for m in groups[state])
        return f"{_e(group_words(state))} ({members})"
    return f'<a href="{prefix}states/{_e(state)}.html">{_e(state)}</a>'


def _outcomes_html(row: ReportRow, report: A.Report) -> str:
    """What was seen, per state: taken n, rejected m (by guard), or ignored n."""
    lines = []
    several = len(row.members) > 1
    for m in row.members:
        c = m.coverage
        where = f"{_e(m.state)}: " if several else ""
        if row.ignored:
            lines.append(f"{where}ignored {c.ignored}" if c.ignored else f"{where}never seen ignored")
            continue
        text = f"taken {c.taken}" if c.taken else "never taken"
        if c.no_rejection:
            text += f"; rejected — ({c.no_rejection})"
        elif c.rejected:
            by = ", ".join(f"{_e(guard_text([g]) if g else '?')} failed {ctx.records}×"
                           for g, ctx in report.context(c.id, "rejected"))
            text += f"; rejected {c.rejected}" + (f" ({by})" if by else "")
        else:
            text += "; never rejected"
        lines.append(where + text)
    return "<br>".join(lines) or '<span class="muted">not run by the machine</span>'


def _tests_html(row: ReportRow, report: A.Report, limit: int) -> str:
    """The tests (or traces) that exercised the row, per outcome and state; "not covered: no
    test took it" when none took it (the tests that saw it rejected are still listed); a row
    seen only outside any test says so."""
    blocks = []
    several = len(row.members) > 1
    for m in row.members:
        outcomes = ("ignored",) if row.ignored else ("taken", "rejected")
        for outcome in outcomes:
            for guard, ctx in report.context(m.coverage.id, outcome):
                what = outcome if not guard else f"rejected ({guard_text([guard])} failed)"
                where = f" in {m.state}" if several else ""
                head = f"<p>{_e(what)}{_e(where)} by {ctx.total} test{'s' if ctx.total != 1 else ''}"
                if not ctx.tests:
                    blocks.append(f"<p>{_e(what)}{_e(where)} {ctx.records}× outside any test "
                                  "(collection or session set-up)</p>")
                    continue
                items = "".join(f"<li><code>{_e(t)}</code></li>" for t in ctx.tests[:limit])
                more = ctx.total - min(len(ctx.tests), limit)
                tail = f"<li>… and {more} more</li>" if more > 0 else ""
                blocks.append(f"{head}:</p><ul>{items}{tail}</ul>")
    if not row.taken:  # never taken: perhaps seen rejected, by the tests listed
        blocks.insert(0, f'<p>{_status_html(A.NOT_COVERED)}: no test took it</p>')
    elif not blocks:  # counted without contexts: an old counts file
        blocks.append('<p class="muted">no test ids recorded (counts without contexts)</p>')
    return "".join(blocks)


def _table(rows: Sequence[ReportRow], report: A.Report, diagram: Diagram, *, prefix: str,
           table_id: str, caption: str, link_rows: bool, changes: Mapping[str, str],
           limit: int) -> str:
    docs = dict(diagram.guards)
    head = ("<tr><th scope=\"col\">#</th><th scope=\"col\">state</th><th scope=\"col\">trigger</th>"
            "<th scope=\"col\">guards</th><th scope=\"col\">→ to</th><th scope=\"col\">effect</th>"
            "<th scope=\"col\">coverage</th><th scope=\"col\">outcomes seen</th>"
            "<th scope=\"col\">tests</th></tr>")
    body = []
    for r in rows:
        number = (f'<a href="{prefix}index.html#{r.anchor}">{r.number}</a>' if link_rows
                  else str(r.number))
        change = changes.get(r.id, "")
        mark = ""
        if change:
            sign = CHANGE_STYLE[change][2]
            mark = f'<br><span class="change {change}">{sign} {change}</span>'
            if not r.taken:
                mark += f' <span class="untested">{UNTESTED}</span>'
        dest = ('<span class="muted">ignored</span>' if r.ignored
                else _state_link(r.dest or "", diagram, prefix))
        effect = _e(r.effect) if not r.ignored else f'<span class="muted">{_e(r.spec)}</span>'
        attrs = (f' id="{r.anchor}"' if not link_rows else "") + \
            f' class="row {STATUS_CLASS[r.status]}" data-status="{_e(r.status)}" data-row="{_e(r.id)}"'
        body.append(
            f"<tr{attrs}><th scope=\"row\">{number}</th>"
            f"<td>{_state_link(r.source, diagram, prefix)}</td><td><code>{_e(r.trigger)}</code></td>"
            f"<td class=\"guards\">{_guards_html(r.guards, docs)}</td><td>{dest}</td>"
            f"<td>{effect}</td><td>{_status_html(r.status)}{mark}</td>"
            f"<td>{_outcomes_html(r, report)}</td>"
            f"<td class=\"tests\">{_tests_html(r, report, limit)}</td></tr>")
    return (f'<table id="{table_id}"><caption>{_e(caption)}</caption><thead>{head}</thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def _legend(report: A.Report, *, base: bool, limit: int) -> str:
    status = "".join(
        f'<dt><span class="swatch" style="border-top-color:{STATUS_STYLE[s][0]};'
        f'border-top-style:{STATUS_STYLE[s][1]}"></span> {_status_html(s)}</dt>'
        f"<dd>{_e(STATUS_WORDS[s])}</dd>" for s in A.STATUSES)
    marks = [
        ("∧, ¬", "and, not: a row needs all its guards; the rows of a (state, trigger) cell are "
                 "tried top to bottom and the first whose guards hold is taken"),
        ("rejected — (unguarded / fallback)", "a rejection is impossible: the row has no guard, "
         "or whenever its guards fail an earlier row of its cell is taken"),
        ("rejected n (g failed k×)", "the row was tried n times and refused; k of them by g, "
         "the first of its guards to fail; the tests are listed per failing guard"),
        ("6 ✓ (a trace's story)", "the guard values that took the row: six guards were true "
         "(two or fewer are named); 'name ✗': name was false (so a row needing ¬name held); "
         "hover for every value"),
        ("tests", f"the pytest node ids (or trace files) that exercised the row, per outcome: "
                  f"the first {limit} are listed, '… and n more' counts the rest; "
                  "a test counts from its set-up to its tear-down; 'outside any test': "
                  "records heard while no test ran (collection, session set-up)"),
        ("at rest (…)", "a row declared for the group holds in each member state; the "
                        "outcomes are shown per state"),
    ]
    if base:
        marks += [(f"{CHANGE_STYLE[c][2]} {c}", CHANGE_WORDS[c]) for c in CHANGE_STYLE]
        marks.append((UNTESTED, "an added or changed row that no test took"))
    other = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in marks)
    return (f'<section id="legend" aria-labelledby="legend-h"><h2 id="legend-h">Legend</h2>'
            f'<div class="legend-cols"><dl class="legend">{status}'
            f"<dt>edge</dt><dd>the diagram colours an edge as its rows: covered when all are, not "
            f"covered when none was taken, else partly covered; select a row of a label to reach "
            f"its line of the table, a state to reach its page</dd></dl>"
            f'<dl class="legend">{other}</dl></div>'
            f'<p class="muted">{_e(A.DEFINITION)}.</p></section>')


def _changes(diff, rows: Sequence[ReportRow], report: A.Report, diagram: Diagram,
             base_name: str) -> str:
    by_id = {r.id: r for r in rows}
    out = [f'<section id="changes" aria-labelledby="changes-h"><h2 id="changes-h">Changes since '
           f"<code>{_e(base_name)}</code>: {_e(diff.summary())}</h2>"]
    if diff.rows:
        out.append('<table id="changes-table"><caption>Rows added, removed or changed</caption>'
                   '<thead><tr><th scope="col">change</th><th scope="col">state</th>'
                   '<th scope="col">trigger</th><th scope="col">guards</th><th scope="col">→ to</th>'
                   '<th scope="col">effect</th><th scope="col">coverage</th></tr></thead><tbody>')
        for c in diff.rows:
            row = c.row
            sign = CHANGE_STYLE[c.change][2]
            what = f" ({', '.join(c.what)})" if c.what else ""
            guards = _e(guard_text(row.guards)) or '<span class="muted">none</span>'
            if "guards" in c.what and c.old is not None:
                guards += f'<br><span class="muted">were: {_e(guard_text(c.old.guards) or "none")}</span>'
            effect = _e(diagram.effect_text(row.effect))
            if "effect" in c.what and c.old is not None:
                effect += (f'<br><span class="muted">was: {_e(diagram.effect_text(c.old.effect))}'
                           "</span>")
            now = by_id.get(row.id) if c.change != "removed" else None
            if now is None:
                cov = '<span class="muted">gone: nothing to cover</span>'
            else:
                cov = f'{_status_html(now.status)} <a href="#{now.anchor}">row {now.number}</a>'
                if not now.taken:
                    cov += f' <span class="untested">{UNTESTED}</span>'
            out.append(f'<tr class="change-row" data-change="{c.change}" data-row="{_e(row.id)}">'
                       f'<td><span class="change {c.change}">{sign} {c.change}{_e(what)}</span></td>'
                       f"<td>{_e(row.source)}</td><td><code>{_e(row.trigger)}</code></td>"
                       f"<td>{guards}</td><td>{_e(row.dest)}</td><td>{effect}</td><td>{cov}</td></tr>")
        out.append("</tbody></table>")
    other = [f"<li>{what}: {_e(', '.join(names))}</li>" for what, names in diff.other_changes()]
    if other:
        out.append("<p>Also changed in the declaration:</p><ul>" + "".join(other) + "</ul>")
    out.append("</section>")
    return "".join(out)


def _story(paths: Sequence[str | Path], diagram: Diagram) -> str:
    from fsm.review.story import events_text, guards_text, read_steps

    out = ['<section id="story" aria-labelledby="story-h"><h2 id="story-h">The path a trace took</h2>']
    for path in paths:
        steps = read_steps(path, diagram)
        timed = any(s.time_ms is not None for s in steps)
        out.append(f"<h3><code>{_e(path)}</code>: {len(steps)} steps"
                   + ("" if timed or not steps else " (no times recorded: steps in order)") + "</h3>")
        if not steps:
            continue
        out.append(f'<table class="story"><thead><tr><th scope="col">{"time" if timed else "step"}'
                   '</th><th scope="col">from</th><th scope="col">→ to</th><th scope="col">trigger'
                   '</th><th scope="col">guards</th><th scope="col">events</th></tr></thead><tbody>')
        for s in steps:
            when = f"{s.time_ms / 1000:.3f} s" if s.time_ms is not None else f"{s.number}."
            full = ", ".join(f"{g.lstrip('!')} {'✓' if ok != g.startswith('!') else '✗'}"
                             for g, ok in s.guards)
            shown = guards_text(s) + (f" ({s.rejected} row{'s' if s.rejected > 1 else ''} "
                                      "rejected)" if s.rejected else "")
            guards = f'<abbr title="{_e(full)}">{_e(shown)}</abbr>' if full else _e(shown)
            dest = "ignores" if s.dest is None else f"→ {s.dest}"
            out.append(f"<tr><td>{_e(when)}</td><td>{_e(s.source)}</td><td>{_e(dest)}</td>"
                       f"<td><code>{_e(s.trigger)}</code></td><td>{guards}</td>"
                       f"<td>{_e(events_text(diagram, s.effect))}</td></tr>")
        out.append("</tbody></table>")
    out.append("</section>")
    return "".join(out)


# ----------------------------------------------------------------------------- pages

def _links(rows: Sequence[ReportRow], diagram: Diagram, prefix: str, here: str = ""
           ) -> dict[str, str]:
    """Row id → its line of the table; state → its page (for the diagrams' maps)."""
    links = {r.id: f"{prefix}index.html#{r.anchor}" if prefix or here else f"#{r.anchor}"
             for r in rows}
    links.update({s.name: f"{prefix}states/{s.name}.html" for s in diagram.states
                  if s.name != here})
    return links


def build_pages(report: A.Report, *, base: Mapping[str, Any] | None = None,
                base_name: str = "base", traces: Sequence[str | Path] = (),
                decl: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The report's files, relative path → HTML text (see the module doc). ``base`` is
    another declaration (:func:`fsm.review.diagrams_diff.load_file`) to compare with;
    ``traces`` are trace files whose story the index tells. Raises
    :class:`fsm.review.diagrams.DiagramError` without Graphviz's ``dot``."""
    from fsm.review.diagrams.states import state_rows

    decl = L.declaration() if decl is None else decl
    diagram = extract(decl)
    rows = report_rows(report, decl)
    limit = A.CONTEXT_LIMIT
    diff = None
    changes: dict[str, str] = {}
    if base is not None:
        from fsm.review import diagrams_diff

        diff = diagrams_diff.compare(base, decl, old_name=base_name, new_name="this version")
        changes = {c.new.id: c.change for c in diff.rows if c.new is not None}
    svg = A.coverage_svg(report, _links(rows, diagram, ""))
    row_status = {s: sum(r.status == s for r in rows) for s in A.STATUSES}
    states_nav = " ".join(f'<a href="states/{_e(s.name)}.html">{_e(s.name)}</a>'
                          for s in diagram.states)
    sections = ([("changes", "changes")] if diff else []) + [("diagram", "diagram"),
        ("legend", "legend"), ("rows", "every row")] + ([("story", "trace")] if traces else [])
    nav = "".join(f'<li><a href="#{i}">{w}</a></li>' for i, w in sections)
    inputs = ", ".join(f"<code>{_e(t.path)}</code> ({t.records} records)" for t in report.traces)
    body = [
        '<a class="skip" href="#rows-table">Skip to the table of rows</a>',
        f"<header><h1>Transition coverage of <code>{_e(A.MACHINE)}</code></h1>",
        f'<p class="summary"><strong>{_e(report.summary())}</strong>; declared rows: '
        f"{len(rows)} — {row_status[A.COVERED]} covered, {row_status[A.PARTLY]} partly covered, "
        f"{row_status[A.NOT_COVERED]} not covered.</p>",
        f'<p class="muted">The machine runs a row declared for a group once per member state: '
        + _e("; ".join(report.breakdown()))
        + f". Declaration <code>{_e(report.version)}</code>"
        + (f"; from {inputs}" if inputs else "") + ".</p>",
        f'<nav aria-label="sections"><ul>{nav}<li>states: {states_nav}</li></ul></nav></header>',
        "<main>"]
    if diff is not None:
        body.append(_changes(diff, rows, report, diagram, base_name))
    body += [
        '<section id="diagram" aria-labelledby="diagram-h"><h2 id="diagram-h">The review diagram'
        "</h2><p class=\"muted\">Each edge in its coverage colour; each row of a label links to "
        "its line of the table, each state to its page. Scroll the picture with the arrow keys "
        "once it has the focus.</p>",
        f'<div class="diagram" tabindex="0" role="region" aria-label="the review diagram">'
        f"{_inline_svg(svg, 'the review diagram coloured by coverage')}</div></section>",
        _legend(report, base=diff is not None, limit=limit),
        '<section id="rows" aria-labelledby="rows-h"><h2 id="rows-h">Every row of the declaration'
        "</h2>",
        _table(rows, report, diagram, prefix="", table_id="rows-table",
               caption=f"{len(rows)} rows, in declaration order (ignored rows included)",
               link_rows=False, changes=changes, limit=limit),
        "</section>"]
    if traces:
        body.append(_story(traces, diagram))
    body.append("</main>")
    pages = {"index.html": _page(f"Transition coverage of {A.MACHINE}", "\n".join(body))}
    pictures = A.coverage_states_svgs(
        report, lambda state: _links(rows, diagram, "../", here=state))
    groups = dict(diagram.groups)
    for s in diagram.states:
        incoming, outgoing = state_rows(diagram, s.name)
        ids = {r.id for r in incoming + outgoing}
        mine = [r for r in rows if r.id in ids or (r.ignored and (
            r.source == s.name or s.name in groups.get(r.source, ())))]
        others = " ".join(f'<a href="{_e(o.name)}.html">{_e(o.name)}</a>'
                          for o in diagram.states if o.name != s.name)
        page = [
            '<a class="skip" href="#state-rows">Skip to the table of rows</a>',
            f'<header><p><a href="../index.html">← the whole report</a></p>'
            f"<h1>State <code>{_e(s.name)}</code></h1><p>{_e(s.doc)}</p>"
            f'<nav aria-label="states"><ul><li>other states: {others}</li></ul></nav></header>',
            "<main>",
            '<section aria-labelledby="small-h"><h2 id="small-h">Rows into and out of it</h2>'
            '<p class="muted">Rows into the state on the left, out of it on the right, in their '
            "coverage colours (the legend is on the whole report's page).</p>",
            f'<div class="diagram" tabindex="0" role="region" aria-label="the diagram of {_e(s.name)}">'
            f"{_inline_svg(pictures[s.name], f'the rows into and out of {s.name}')}</div></section>",
            '<section aria-labelledby="state-rows-h"><h2 id="state-rows-h">Its rows</h2>',
            _table(mine, report, diagram, prefix="../", table_id="state-rows",
                   caption=f"{len(mine)} rows into, out of or ignored in {s.name}; the number "
                           "links to the row in the whole table",
                   link_rows=True, changes=changes, limit=limit),
            "</section></main>"]
        pages[f"states/{s.name}.html"] = _page(f"{s.name}: transition coverage", "\n".join(page))
    return pages


def write(out: str | Path, report: A.Report, **kwargs: Any) -> list[Path]:
    """Write :func:`build_pages` into the folder ``out`` (created); return the paths written.
    Raises ``OSError`` when it cannot write, :class:`fsm.review.diagrams.DiagramError` without
    ``dot`` (nothing is written then)."""
    from fsm.review.diagrams import write_file

    pages = build_pages(report, **kwargs)
    out = Path(out)
    written = []
    for name, text in pages.items():
        write_file(out / name, text)
        written.append(out / name)
    return written


# ----------------------------------------------------------------------------- pull request

def pr_summary(report: A.Report, base: Mapping[str, Any], base_name: str = "base",
               decl: Mapping[str, Any] | None = None, *, max_rows: int = 30) -> str:
    """Markdown for a pull request's comment: the rows added, removed and changed since
    ``base`` with their coverage, each added or changed row no test took marked
    **untested**; at most ``max_rows`` rows (the rest counted)."""
    from fsm.review import diagrams_diff
    from fsm.review.diagrams import md_cell

    decl = L.declaration() if decl is None else decl
    diagram = extract(decl)
    rows = {r.id: r for r in report_rows(report, decl)}
    diff = diagrams_diff.compare(base, decl, old_name=base_name, new_name="this version")
    untested = [c for c in diff.rows if c.change != "removed" and c.new is not None
                and not rows[c.new.id].taken]
    out = [f"### Transition coverage of the changed rows (since `{base_name}`)", "",
           f"**{diff.summary()}**; {len(untested)} untested. Whole machine: "
           f"{report.summary()}.", ""]
    if diff.rows:
        out += ["| change | row | coverage | tests |", "|---|---|---|---|"]
        for c in diff.rows[:max_rows]:
            row = c.row
            guards = f" [{guard_text(row.guards)}]" if row.guards else ""
            text = f"`{row.source}` —{row.trigger}{guards}→ `{row.dest}`"
            sign = {"added": "➕ added", "removed": "➖ removed", "changed": "✏️ changed"}[c.change]
            if c.what:
                sign += f" ({', '.join(c.what)})"
            if c.change == "removed":
                cov, tests = "gone", ""
            else:
                r = rows[c.new.id]  # type: ignore[union-attr]
                cov = f"{STATUS_MARK[r.status]} {r.status}"
                if not r.taken:
                    cov += " · **untested**"
                names = [t for m in r.members for o in ("taken", "rejected")
                         for _, ctx in report.context(m.coverage.id, o) for t in ctx.tests]
                names = list(dict.fromkeys(names))
                tests = ", ".join(f"`{t}`" for t in names[:2])
                total = sum(ctx.total for m in r.members for o in ("taken", "rejected")
                            for _, ctx in report.context(m.coverage.id, o))
                if total > 2:
                    tests += f" (+{total - min(2, len(names))} more)"
            out.append(f"| {sign} | {md_cell(text)} | {cov} | {md_cell(tests)} |")
        if len(diff.rows) > max_rows:
            out.append(f"| … | {len(diff.rows) - max_rows} more rows: see the HTML report | | |")
        out.append("")
    out.append("✔ covered: taken everywhere it holds and seen rejected when it can be; ◐ partly; "
               "✘ not covered (never taken); **untested**: added or changed and no test took it.")
    return "\n".join(out) + "\n"
