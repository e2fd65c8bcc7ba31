"""Render DOT (with :class:`graphviz.Digraph`) and SVG (laid out by Graphviz's ``dot``): the
per-state diagram (:func:`build_digraph`) and the review diagram (:func:`build_review_digraph`),
each also as the audit's coverage view and the review one as a diff."""

from __future__ import annotations

from typing import Mapping, Sequence

from fsm.review.diagrams.model import (ADDED, AND, CHANGED, NOT, REMOVED, REVIEW, Diagram,
                                       DiagramError, DrawnRow, EdgeMark, ReviewEdge, State,
                                       review_edges)
from fsm.review.diagrams.style import (CHANGE_STYLE, GROUP_LABELS, STATUS_STYLE, Line,
                                       group_words, label_lines, twins_text, wrap)
from fsm.review.diagrams.style import _CLUSTERS, _FILLS, _PALETTE, _REVIEW_EDGE

def _dot_text(text: str) -> str:
    # Free text (docs, specs) must not be read as a DOT escape or an HTML label.
    import graphviz

    return graphviz.nohtml(text.replace("\\", "\\\\"))


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _legend(diagram: Diagram, colours: Mapping[str, str], summary: str | None) -> str:
    rows = []
    if summary is not None:
        for line in summary.split("; "):
            rows.append(f'<tr><td colspan="2" align="left"><b>{_html(line)}</b></td></tr>')
        for colour, style, _, text in STATUS_STYLE.values():
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
        rows.append(f'<tr><td colspan="2" align="left">{_html(twins_text(twins))}</td></tr>')
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
    import graphviz

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
            c.attr(label=GROUP_LABELS[group], style="rounded,dashed", color="#999999",
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
            colour, style, width, _ = STATUS_STYLE[mark.status]
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
    import graphviz

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
        html = (f"<b>{_html(bold)}</b>" if bold else "") + _html(text)
        if kind == "was":
            return f'<font color="{colour}" point-size="7"><i>{html}</i></font>'
        return f'<font color="{colour}">{html}</font>' if kind != "effect" else (
            f'<font color="#555555"><i>{html}</i></font>')
    colour, _, mark = CHANGE_STYLE.get(change, ("#000000", "", ""))
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
    """The edge's stacked lines (:func:`label_lines`) as a Graphviz HTML label."""
    br = '<br align="left"/>'
    text = br.join(_line_html(line) for line in label_lines(diagram, edge, LABEL_WIDTH))
    return f"<{text}{br}>"


def _review_legend(diagram: Diagram, diff: str | None, summary: str | None = None) -> str:
    rows = []
    if summary is not None:
        for line in summary.split("; "):
            rows.append(f'<tr><td colspan="2" align="left"><b>{_html(line)}</b></td></tr>')
        words = {"covered": "taken in every state it holds in (and rejected, when it can be)",
                 "partly covered": "taken, but not in every state, or never rejected",
                 "not covered": "never taken"}
        for status, (colour, style, _, _) in STATUS_STYLE.items():
            stroke = "╍╍" if style == "dashed" else "━━"
            rows.append(f'<tr><td align="left"><font color="{colour}">{stroke} {_html(status)}'
                        f'</font></td><td align="left">{_html(words[status])}</td></tr>')
        rows.append('<tr><td colspan="2" align="left">a row drawn from a group counts once per '
                    'member state (per state: --svg-states); an edge is as covered as its rows'
                    '</td></tr>')
    if diff is not None:
        rows.append(f'<tr><td colspan="2" align="left"><b>{_html(diff)}</b></td></tr>')
        for change, (colour, style, mark) in CHANGE_STYLE.items():
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
        text = '<br align="left"/>'.join(_html(w) for w in wrap(doc, 110))
        rows.append(f'<tr><td align="left" valign="top">{_html(guard)}&#160;&#160;</td>'
                    f'<td align="left">{text}<br align="left"/></td></tr>')
    for group, members in diagram.groups:
        rows.append(f'<tr><td colspan="2" align="left">{_html(group_words(group))}: a row drawn '
                    f'from it holds in each of {_html(", ".join(members))} (the audit counts it '
                    'once per state)</td></tr>')
    rows.append(f'<tr><td colspan="2" align="left">{len(diagram.ignored)} ignored (state, trigger)'
                f' cells are not drawn; every cell, per state: {diagram.name}.md</td></tr>')
    return ('<<table border="0" cellborder="0" cellspacing="0" cellpadding="1">'
            + "".join(rows) + "</table>>")


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
    import graphviz

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
            c.attr(label=_dot_text(group_words(group)), style="rounded,filled", color="#7F98B5",
                   fillcolor="#F3F6FA", fontcolor="#2B4A6F")
            c.node(group, label=_dot_text(f"any state {group_words(group)}"), shape="box",
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
               color=CHANGE_STYLE[REMOVED][0], fontcolor=CHANGE_STYLE[REMOVED][0])
    for s in initial:
        g.edge("__initial", s.name, id="initial", tooltip="initial state")
    for e in review_edges(drawn):
        attrs = {"id": e.id, "tooltip": _dot_text("; ".join(d.row.id for d in e.rows))}
        if e.change:
            colour, style, _ = CHANGE_STYLE[e.change]
            attrs.update(color=colour, style=style, penwidth="1.8")
        elif e.coverage:
            colour, style, width, _ = STATUS_STYLE[e.coverage]
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

