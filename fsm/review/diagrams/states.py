"""Render one small diagram per state (small multiples): the rows that lead into it and out of it.

Each picture has three columns: the states a row comes from (left), the state itself (middle),
the states its rows lead to (right). A state that is both (``backing_off`` ⇄ ``continuing``)
appears on both sides, so no edge ever runs backwards and a picture stays a few hundred pixels
wide. Rows are the declared rows (a group row holds in each member, see :mod:`.model`), merged
per neighbour and labelled as in the review diagram (refusal cascades as one line); each label
is a node of its own on its edge, so labels stay clear of edges. The cells the state ignores
are listed under it. Written by :func:`fsm.review.diagrams.files.write_all` as
``states/<state>.dot`` (byte-stable) and ``states/<state>.svg``.
"""

from __future__ import annotations

from fsm._extras import require
from fsm.review.diagrams.dot import (dot_text, html_text, linked_review_label, review_label,
                                     svg_of)
from fsm.review.diagrams.model import Diagram, DrawnRow, ReviewEdge
from fsm.review.diagrams.style import FILLS, FONT, REVIEW_EDGE, STATUS_STYLE, group_words, wrap

__all__ = ["state_rows", "build_state_digraph", "render_state_dot", "render_state_svg"]


def state_rows(diagram: Diagram, state: str):
    """``(incoming, outgoing)`` declared rows of ``state``, in declaration order: outgoing rows
    start from it or from a group it belongs to; incoming rows lead to it from elsewhere (a
    row from a group that holds ``state`` is outgoing too, a self-loop when it leads back)."""
    groups = dict(diagram.groups)
    outgoing = [r for r in diagram.rows
                if r.source == state or state in groups.get(r.source, ())]
    incoming = [r for r in diagram.rows if r.dest == state and r.source != state
                and any(m != state for m in groups.get(r.source, (r.source,)))]
    return tuple(incoming), tuple(outgoing)


def _from_words(diagram: Diagram, source: str, state: str) -> tuple[str, str]:
    """(node label, tooltip) of where a row comes from: a state, or a group's other members."""
    groups = dict(diagram.groups)
    if source in groups:
        others = [m for m in groups[source] if m != state]
        return (f"{', '.join(others)}\n({group_words(source)})",
                f"{source}: {', '.join(groups[source])}")
    return source, source


def build_state_digraph(diagram: Diagram, state: str, drawn=None, links=None):
    """The small :class:`graphviz.Digraph` of ``state``; ``KeyError`` if there is no such state.

    ``drawn`` (row id → :class:`DrawnRow`, optional) draws the coverage view: each edge
    coloured by its rows' ``coverage`` status as the review diagram's coverage view colours it
    (:func:`fsm.review.audit.coverage_states_svgs`). ``links`` (row id or state name → URL)
    links the rows and the other states, as
    :func:`~fsm.review.diagrams.dot.build_review_digraph` does, for the HTML report."""
    drawn = drawn or {}
    links = links or {}
    graphviz = require("graphviz", extra="diagrams", feature="drawing the diagrams")

    s = diagram.state(state)
    incoming, outgoing = state_rows(diagram, state)
    ignored = [i.trigger for i in diagram.ignored if i.source == state]
    g = graphviz.Digraph(f"{diagram.name}_{state}")
    notes = [f"<b>{html_text(state)}</b>: {html_text(s.doc)}" if s.doc else f"<b>{html_text(state)}</b>"]
    if ignored:
        text = '<br align="left"/>'.join(html_text(w) for w in wrap("ignored here: "
                                                                  + ", ".join(ignored), 90))
        notes.append(text)
    notes.append(f"rows into {html_text(state)} on the left, rows out of it on the right; "
                 f"every cell: {diagram.name}.md")
    g.attr("graph", rankdir="LR", newrank="true", nodesep="0.25", ranksep="0.35",
           fontname=FONT, fontsize="10", labelloc="t", labeljust="l", pad="0.1",
           label="<" + '<br align="left"/>'.join(notes) + '<br align="left"/>>')
    g.attr("node", shape="box", style="rounded,filled", fontname=FONT, fontsize="11",
           fillcolor="#FFFFFF")
    g.attr("edge", fontname=FONT, fontsize="8", arrowsize="0.7", color=REVIEW_EDGE)
    g.node(state, label=state, fillcolor=FILLS.get(s.group, "#FFFFFF"), penwidth="2.2",
           tooltip=dot_text(s.doc or state))
    fill = {t.name: FILLS.get(t.group, "#FFFFFF") for t in diagram.states}
    merged_in: dict[str, list] = {}
    for r in incoming:
        merged_in.setdefault(r.source, []).append(r)
    for n, (source, rows) in enumerate(merged_in.items()):
        label, tip = _from_words(diagram, source, state)
        node = f"in {source}"
        g.node(node, label=dot_text(label), tooltip=dot_text(tip),
               fillcolor=fill.get(source, "#F3F6FA"), style="rounded,filled,dashed"
               if source not in fill else "rounded,filled", **_href(links, source))
        edge = ReviewEdge(source, state, tuple(drawn.get(r.id) or DrawnRow(r) for r in rows))
        _labelled_edge(g, diagram, node, state, edge, f"in{n}", links)
    merged_out: dict[str, list] = {}
    for r in outgoing:
        merged_out.setdefault(r.dest, []).append(r)
    for n, (dest, rows) in enumerate(merged_out.items()):
        edge = ReviewEdge(state, dest, tuple(drawn.get(r.id) or DrawnRow(r) for r in rows))
        target = state if dest == state else f"out {dest}"
        if dest != state:
            g.node(target, label=dest, fillcolor=fill.get(dest, "#FFFFFF"),
                   tooltip=dot_text(dest), **_href(links, dest))
        _labelled_edge(g, diagram, state, target, edge, f"out{n}", links)
    return g


def _href(links, name: str) -> dict[str, str]:
    return {"href": links[name]} if links.get(name) else {}


def _labelled_edge(g, diagram: Diagram, tail: str, head: str, edge: ReviewEdge, key: str,
                   links=None) -> None:
    label = f"__label {key}"
    tip = dot_text("; ".join(d.row.id for d in edge.rows))
    attrs = {}
    if edge.coverage:
        colour, style, width, _ = STATUS_STYLE[edge.coverage]
        attrs = {"color": colour, "style": style, "penwidth": width}
    text = review_label(diagram, edge)
    if links:
        attrs.update(_href(links, edge.rows[0].row.id))
        text = linked_review_label(diagram, edge, links)
    g.node(label, label=text, shape="box", style="", color="transparent",
           margin="0.08,0.04", fontsize="8", id=key, tooltip=tip)
    g.edge(tail, label, arrowhead="none", id=f"{key}#from", tooltip=tip, **attrs)
    g.edge(label, head, id=f"{key}#to", tooltip=tip, **attrs)


def render_state_dot(diagram: Diagram, state: str) -> str:
    """DOT text of the small diagram of ``state`` (``\\n`` endings)."""
    return build_state_digraph(diagram, state).source


def render_state_svg(diagram: Diagram, state: str, drawn=None, links=None) -> bytes:
    """SVG of the small diagram of ``state`` (``drawn``: the coverage view, see
    :func:`build_state_digraph`); raises :class:`~fsm.review.diagrams.model.DiagramError`
    without Graphviz's ``dot``."""
    return svg_of(build_state_digraph(diagram, state, drawn, links))
