"""Render DOT (with :class:`graphviz.Digraph`) and SVG (laid out by Graphviz's ``dot``): the
per-state diagram (:func:`build_digraph`) and the review diagram (:func:`build_review_digraph`),
each also as the audit's coverage view and the review one as a diff."""

from __future__ import annotations

import re
from typing import Mapping, Sequence

from fsm._extras import require
from fsm.review.diagrams.model import (ADDED, AND, CHANGED, NOT, REMOVED, REVIEW, Diagram,
                                       DiagramError, DrawnRow, EdgeMark, ReviewEdge, State,
                                       cascades, review_edges)
from fsm.review.diagrams.style import (CHANGE_STYLE, GROUP_LABELS, STATUS_STYLE, Line,
                                       group_words, label_lines, linked_label_runs, twins_text,
                                       wrap)
from fsm.review.diagrams.policy import PolicyCard, policy_card
from fsm.review.diagrams.style import CLUSTERS, FILLS, FONT, PALETTE, REVIEW_EDGE

def dot_text(text: str) -> str:
    # Free text (docs, specs) must not be read as a DOT escape or an HTML label.
    graphviz = require("graphviz", extra="diagrams", feature="drawing the diagrams")

    return graphviz.nohtml(text.replace("\\", "\\\\"))


def html_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _legend(diagram: Diagram, colours: Mapping[str, str], summary: str | None) -> str:
    rows = []
    if summary is not None:
        for line in summary.split("; "):
            rows.append(f'<tr><td colspan="2" align="left"><b>{html_text(line)}</b></td></tr>')
        for colour, style, _, text in STATUS_STYLE.values():
            stroke = "╍╍" if style == "dashed" else "━━"
            rows.append(f'<tr><td align="left"><font color="{colour}">{stroke} {html_text(text.split(":")[0])}'
                        f'</font></td><td align="left">{html_text(text.split(": ", 1)[1])}</td></tr>')
    else:
        rows.append('<tr><td colspan="2" align="left"><b>edge colour = trigger</b></td></tr>')
        for trigger, doc in diagram.triggers:
            rows.append(f'<tr><td align="left"><font color="{colours[trigger]}">━━ {html_text(trigger)}'
                        f'</font></td><td align="left">{html_text(doc)}</td></tr>')
    rows.append('<tr><td colspan="2" align="left"><b>guards</b></td></tr>')
    rows.append(f'<tr><td colspan="2" align="left">{AND} and, {NOT} not; rows of a cell are '
                'tried top to bottom</td></tr>')
    for guard, doc in diagram.guards:
        rows.append(f'<tr><td align="left">{html_text(guard)}</td><td align="left">{html_text(doc)}</td></tr>')
    for twins in diagram.twins():
        rows.append(f'<tr><td colspan="2" align="left">{html_text(twins_text(twins))}</td></tr>')
    rows.append(f'<tr><td colspan="2" align="left">{len(diagram.ignored)} ignored (state, trigger)'
                f' cells are not drawn: see {diagram.name}.md</td></tr>')
    return ('<<table border="0" cellborder="0" cellspacing="0" cellpadding="2">'
            + "".join(rows) + "</table>>")


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

    colours = {t: PALETTE[i % len(PALETTE)] for i, (t, _) in enumerate(diagram.triggers)}
    g = graphviz.Digraph(diagram.name)
    g.attr("graph", rankdir="LR", newrank="true", nodesep="0.35", ranksep="1.1",
           fontname=FONT, fontsize="11", labelloc="t",
           label=dot_text(f"{diagram.name}: generated from fsm/core/lifecycle.py"))
    g.attr("node", shape="box", style="rounded,filled", fontname=FONT, fontsize="12",
           fillcolor="#FFFFFF")
    g.attr("edge", fontname=FONT, fontsize="9", arrowsize="0.7")
    initial = [s for s in diagram.states if s.initial]
    if initial:
        g.node("__initial", label="", shape="point", width="0.15", style="filled",
               fillcolor="black")
    for group in CLUSTERS:
        members = [s for s in diagram.states if s.group == group]
        if not members:
            continue
        with g.subgraph(name=f"cluster_{group}") as c:
            c.attr(label=GROUP_LABELS[group], style="rounded,dashed", color="#999999",
                   fontcolor="#555555")
            for s in members:
                _state_node(c, s)
    for s in diagram.states:
        if s.group not in CLUSTERS:
            _state_node(g, s)
    for s in initial:
        g.edge("__initial", s.name, id="initial", tooltip="initial state")
    for e in diagram.edges:
        attrs = {"id": e.id, "tooltip": dot_text(f"{e.id} / {e.effect or '-'}: {e.spec}")}
        label = e.label
        if marks is None:
            attrs["color"] = attrs["fontcolor"] = colours[e.trigger]
        else:
            mark = marks.get(e.id, EdgeMark("not covered", "no data"))
            if mark.note:
                label = f"{label} ({mark.note})"
            colour, style, width, _ = STATUS_STYLE[mark.status]
            attrs.update(color=colour, fontcolor=colour, style=style, penwidth=width)
        g.edge(e.source, e.dest, label=dot_text(label), **attrs)
    g.node("__legend", label=_legend(diagram, colours, summary), shape="plaintext",
           style="", fontsize="10")
    return g


def _state_node(graph, s: State, href: str | None = None) -> None:
    extra = {"href": href} if href else {}
    graph.node(s.name, label=s.name, fillcolor=FILLS.get(s.group, "#FFFFFF"), tooltip=dot_text(s.doc or s.name),
               penwidth="2" if s.initial else "1", **extra)


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


def _line_html(line: Line) -> str:
    kind, bold, text, change = line
    if change in STATUS_STYLE:  # the coverage view: coloured words, no marker
        colour = STATUS_STYLE[change][0]
        html = (f"<b>{html_text(bold)}</b>" if bold else "") + html_text(text)
        if kind == "was":
            return f'<font color="{colour}" point-size="7"><i>{html}</i></font>'
        return f'<font color="{colour}">{html}</font>' if kind != "effect" else (
            f'<font color="#555555"><i>{html}</i></font>')
    colour, _, mark = CHANGE_STYLE.get(change, ("#000000", "", ""))
    html = (f"<b>{html_text(bold)}</b>" if bold else "") + html_text(text)
    if kind == "effect":
        return f'<font color="{colour if change else "#555555"}"><i>{html}</i></font>'
    if kind == "was":
        return f'<font color="{colour}" point-size="7"><i>{html}</i></font>'
    if change:
        return f'<font color="{colour}">{mark if kind == "row" else " "} {html}</font>'
    return html


LABEL_WIDTH = 50
"""Characters per line of a review label before it wraps."""


def review_label(diagram: Diagram, edge: ReviewEdge) -> str:
    """The edge's stacked lines (:func:`label_lines`) as a Graphviz HTML label."""
    br = '<br align="left"/>'
    text = br.join(_line_html(line) for line in label_lines(diagram, edge, LABEL_WIDTH))
    return f"<{text}{br}>"


def linked_review_label(diagram: Diagram, edge: ReviewEdge, links: Mapping[str, str]) -> str:
    """The edge's label (as :func:`review_label`) as a table whose cells link each row to
    ``links[row id]`` (a refusal cascade's cell to its first row; its title names them all):
    the HTML report's diagram, where every row of an edge leads to its line of the table."""
    cells = []
    for rows, effect in linked_label_runs(diagram, edge, LABEL_WIDTH):
        for lines, ids in rows:
            body = _BR.join(_line_html(line) for line in lines)
            href = links.get(ids[0])
            attrs = (f' href="{html_text(href)}" title="{html_text("; ".join(ids))}"'
                     if href else "")
            cells.append(f'<tr><td align="left" balign="left"{attrs}>{body}</td></tr>')
        if effect:
            cells.append('<tr><td align="left" balign="left">'
                         + _BR.join(_line_html(line) for line in effect) + "</td></tr>")
    return ('<<table border="0" cellborder="0" cellspacing="0" cellpadding="0">'
            + "".join(cells) + "</table>>")


def _row(cells: str) -> str:
    return f"<tr>{cells}</tr>"


# The legend's layout, so that no two texts can overlap whatever font the SVG viewer uses
# (Graphviz places each run of text by its own estimate of the font's widths):
# - a bold heading is never followed by plain text in the same cell (the viewer's bold is
#   wider than Graphviz's estimate: the plain run would be drawn over it): its text goes in
#   the next column;
# - a (name, text) row puts both cells at the top, the text's lines left-aligned by the cell
#   (``balign``), without a trailing line break (which adds an empty line and drops the text
#   half a line below its name);
# - a name is followed by a gap of a few em, wider than the estimate's error on a long name.
_GAP = "&#160;" * 5
_GUTTER = 40  # points between the legend's two columns
_BR = "<br/>"


def _wide(html: str) -> str:
    return _row(f'<td colspan="3" align="left" balign="left">{html}</td>')


def _heading(title: str, text: str = "") -> list[str]:
    """A bold ``title``; ``text`` (plain, optional) in the text column of the same row."""
    if not text:
        return [_wide(f"<b>{html_text(title)}</b>")]
    return [_row(f'<td colspan="2" align="left" valign="top"><b>{html_text(title)}{_GAP}</b></td>'
                 f'<td align="left" valign="top" balign="left">{_lines(text)}</td>')]


def _lines(text: str, width: int = 84) -> str:
    """``text`` wrapped at ``width`` characters, as lines of one table cell."""
    return _BR.join(html_text(w) for w in wrap(text, width))


def _pair(name_html: str, body_html: str, lead: str = "") -> str:
    """A legend row: ``lead`` (a number), the name, its text; every cell from the top."""
    return _row(f'<td align="right" valign="top">{lead}</td>'
                f'<td align="left" valign="top">{name_html}{_GAP}</td>'
                f'<td align="left" valign="top" balign="left">{body_html}</td>')


def _guard_order_rows(diagram: Diagram) -> list[str]:
    """The legend's guard order: each cascade's guards once, numbered, with what refuses."""
    rows: list[str] = []
    found = cascades(diagram.rows)
    order: list[str] = []
    for c in found:
        order += [g for g in c.order if g not in order]
    if not order:
        return rows
    triggers = ", ".join(dict.fromkeys(c.trigger for c in found))
    rows += _heading("guard order", f"({triggers}) tried in turn; the first that fails "
                     "refuses the retry, with its endReason")
    docs = dict(diagram.guards)
    for n, guard in enumerate(order, 1):
        reasons: dict[str, list[str]] = {}
        for c in found:
            for g, r in c.refusals:
                if g == guard:
                    words = diagram.effect_text(r.effect)
                    m = re.search(r"\(([a-z_]+)\)", words)
                    reason = m.group(1) if m else "no retry"
                    where = group_words(c.source) if c.source in dict(diagram.groups) else c.source
                    reasons.setdefault(reason, []).append(where)
        said = "; ".join(r if len(reasons) == 1 else f"{r} ({', '.join(w)})"
                         for r, w in reasons.items())
        doc = docs.get(guard, "")
        body = (_lines(doc) + _BR if doc else "") + \
            f'<font color="#8C2D00">fails → {html_text(said) or "-"}</font>'
        rows.append(_pair(html_text(guard), body, lead=f"{n}&#160;"))
    return rows


def _review_legend(diagram: Diagram, diff: str | None, summary: str | None = None,
                   policy: PolicyCard | None = None, title: str = "") -> str:
    """The legend card, in two columns under the machine: the title; the policy drawn (its
    settings and classification families) or the coverage / diff key; then how to read an
    edge, the guard order of each refusal cascade and the other guards."""
    rows = []
    if policy is not None and summary is None and diff is None:
        rows += _heading(policy.title)
        for name, text in policy.settings:
            rows.append(_pair(html_text(name), _lines(text)))
        rows += _heading("classification", "which trigger a turn that ends fires (families; "
                         "docs/classification.md)")
        for name, text in policy.families:
            rows.append(_pair(html_text(name), _lines(text)))
    if summary is not None:
        for line in summary.split("; "):
            rows.append(_wide(f"<b>{html_text(line)}</b>"))
        words = {"covered": "taken in every state it holds in (and rejected, when it can be)",
                 "partly covered": "taken, but not in every state, or never rejected",
                 "not covered": "never taken"}
        for status, (colour, style, _, _) in STATUS_STYLE.items():
            stroke = "╍╍" if style == "dashed" else "━━"
            rows.append(_pair(f'<font color="{colour}">{stroke} {html_text(status)}</font>',
                              html_text(words[status])))
        rows.append(_wide("a row drawn from a group counts once per member state (per state: "
                          "--svg-states); an edge is as covered as its rows"))
    if diff is not None:
        rows.append(_wide(f"<b>{html_text(diff)}</b>"))
        for change, (colour, style, mark) in CHANGE_STYLE.items():
            stroke = "╍╍" if style == "dashed" else "━━"
            rows.append(_pair(f'<font color="{colour}">{stroke} {mark} {change}</font>',
                              {ADDED: "a row the old version did not have",
                               REMOVED: "a row of the old version that is gone",
                               CHANGED: "same source, trigger, dest and effect; other guards "
                                        "(or the same guards, another effect)"}[change]))
    left = rows
    right = _heading("read an edge as", f"trigger [guards] / what it does; {AND} and, {NOT} "
                     "not; a cell's rows are tried top to bottom")
    right += _guard_order_rows(diagram)
    in_order = {g for c in cascades(diagram.rows) for g in c.order}
    for guard, doc in diagram.guards:
        if guard in in_order:
            continue
        right.append(_pair(html_text(guard), _lines(doc)))
    for group, members in diagram.groups:
        rest = [m for m in members if m != members[0]]
        if rest:
            left += _heading(group_words(group), f"{', '.join(rest)} answer every trigger as "
                             f"{members[0]} does (the rows drawn from {members[0]} hold in each)")
    left.append(_wide(f"{len(diagram.ignored)} ignored (state, trigger) cells are not drawn; "
                      f"every cell, per state: {diagram.name}.md"))
    table = '<table border="0" cellborder="0" cellspacing="0" cellpadding="1">'
    if policy is None or summary is not None or diff is not None:
        # Without the policy card the key is short: one column (Graphviz would spread the
        # rows of a short column over the height of its neighbour).
        return (f'<<table border="0" cellborder="0" cellspacing="0" cellpadding="1">'
                f'<tr><td colspan="3" align="left"><font point-size="11">{html_text(title)}'
                f'</font></td></tr>{"".join(left + right)}</table>>')
    return (f'<<table border="0" cellborder="0" cellspacing="0" cellpadding="4">'
            f'<tr><td colspan="3" align="left"><font point-size="11">{html_text(title)}</font></td></tr>'
            f'<tr><td valign="top" align="left">{table}{"".join(left)}</table></td>'
            # a gutter: a viewer's font up to ~10 % wider than Graphviz's estimate stays in
            # its column
            f'<td width="{_GUTTER}"></td>'
            f'<td valign="top" align="left">{table}{"".join(right)}</table></td></tr></table>>')


def build_review_digraph(diagram: Diagram, drawn: Sequence[DrawnRow] | None = None,
                         diff: str | None = None, title: str | None = None,
                         summary: str | None = None, policy: PolicyCard | None = None,
                         links: Mapping[str, str] | None = None):
    """The review :class:`graphviz.Digraph`: the declared rows, not one edge per state.

    A group of states (``at_rest``) is a cluster; its rows are drawn once, from its first
    member (``idle``), and the other members say they answer as it does (no node for the group
    itself, so no arrow runs from a group into its own members); a row that leaves the group
    starts at the cluster's border. Rows between the same two nodes are one edge whose label
    stacks them (``trigger [guards]``, then ``/ what it does`` from the declaration's
    ``effects``); the rows of a refusal cascade are one line, "refused: the first failing guard
    → endReason", and the guard order is listed once, in the legend. Each label is a node of
    its own on its edge (``src → label → dest``), so the layout keeps labels clear of edges.

    ``policy`` (:func:`fsm.review.diagrams.policy.policy_card`; default: the default settings)
    heads the legend with the settings and classification families drawn (not in the coverage
    and diff views, whose legends explain their colours). ``drawn`` (default: every row, unchanged) and
    ``diff`` (a summary line heading the legend) are how :mod:`fsm.review.diagrams_diff` draws a
    change; a row whose states are gone from ``diagram`` gets a dashed node of its own. Rows
    with a ``coverage`` status draw the coverage view (:func:`fsm.review.audit.coverage_svg`):
    each row in its status colour with its counts, each edge as its rows' status, ``summary``
    (lines joined by ``"; "``) heading a legend of the three statuses.

    ``links`` (row id or state name → URL) makes the SVG a map (the HTML report): each state
    links to its URL, each edge to its first row's, and each row of a label to its own
    (:func:`linked_review_label`).
    """
    graphviz = require("graphviz", extra="diagrams", feature="drawing the diagrams")

    drawn = tuple(DrawnRow(r) for r in diagram.rows) if drawn is None else tuple(drawn)
    if policy is None and summary is None and diff is None:
        policy = policy_card()
    g = graphviz.Digraph(REVIEW)
    title = title or (f"{diagram.name}: the rows as declared in fsm/core/lifecycle.py (per "
                      f"state: {diagram.name}.md)")
    # The legend card is the graph's label, under the machine: no edge can run through it.
    g.attr("graph", rankdir="BT", compound="true", nodesep="0.3",
           ranksep="0.3", fontname=FONT, fontsize="9", labelloc="b", labeljust="l",
           pad="0.1", label=_review_legend(diagram, diff, summary, policy, title))
    g.attr("node", shape="box", style="rounded,filled", fontname=FONT, fontsize="12",
           fillcolor="#FFFFFF")
    g.attr("edge", fontname=FONT, fontsize="8", arrowsize="0.7", color=REVIEW_EDGE)
    names = {s.name for s in diagram.states}
    groups = {group: members for group, members in diagram.groups if members}
    grouped = {m: group for group, members in groups.items() for m in members}
    initial = [s for s in diagram.states if s.initial]
    if initial:
        g.node("__initial", label="", shape="point", width="0.12", style="filled",
               fillcolor="black")
    for group, members in groups.items():
        with g.subgraph(name=f"cluster_{group}") as c:
            c.attr(label=dot_text(f"{group_words(group)}: {', '.join(members[1:])} answer as "
                                   f"{members[0]}" if len(members) > 1 else group_words(group)),
                   style="rounded,filled", color="#7F98B5", fillcolor="#F3F6FA",
                   fontcolor="#2B4A6F", fontsize="10")
            for s in diagram.states:
                if s.name in members:
                    _state_node(c, s, (links or {}).get(s.name))
    for s in diagram.states:
        if s.name not in grouped:
            _state_node(g, s, (links or {}).get(s.name))
    known = names | set(groups)
    ghosts = []
    for d in drawn:
        for end in (d.row.source, d.row.dest):
            if end not in known and end not in ghosts:
                ghosts.append(end)
    for end in ghosts:
        g.node(end, label=dot_text(f"{end} (gone)"), style="rounded,dashed",
               color=CHANGE_STYLE[REMOVED][0], fontcolor=CHANGE_STYLE[REMOVED][0])
    for s in initial:
        g.edge("__initial", s.name, id="initial", tooltip="initial state")
    for e in review_edges(drawn):
        attrs = {"tooltip": dot_text("; ".join(d.row.id for d in e.rows))}
        node = {"fontcolor": "#000000"}
        if e.change:
            colour, style, _ = CHANGE_STYLE[e.change]
            attrs.update(color=colour, style=style, penwidth="1.8")
        elif e.coverage:
            colour, style, width, _ = STATUS_STYLE[e.coverage]
            attrs.update(color=colour, style=style, penwidth=width)
        tail = groups[e.source][0] if e.source in groups else e.source
        first = dict(attrs, id=f"{e.id}#from", arrowhead="none")
        if e.source in groups and e.dest not in groups[e.source]:
            first["ltail"] = f"cluster_{e.source}"
        if links and links.get(e.rows[0].row.id):
            attrs["href"] = links[e.rows[0].row.id]
        label = f"__label {e.id}"
        text = linked_review_label(diagram, e, links) if links else review_label(diagram, e)
        g.node(label, label=text, shape="box", style="", color="transparent", id=e.id,
               margin="0.08,0.04",
               tooltip=attrs["tooltip"], fontsize="8", **node)
        g.edge(tail, label, **first)
        g.edge(label, e.dest, **dict(attrs, id=f"{e.id}#to"))
    return g


def render_review_dot(diagram: Diagram, policy: PolicyCard | None = None) -> str:
    """DOT text of the review diagram (``\\n`` endings); see :func:`build_review_digraph`."""
    return build_review_digraph(diagram, policy=policy).source


def render_review_svg(diagram: Diagram, policy: PolicyCard | None = None) -> bytes:
    """SVG of the review diagram; raises :class:`DiagramError` as :func:`render_svg` does."""
    return svg_of(build_review_digraph(diagram, policy=policy))
