"""Render Mermaid ``stateDiagram-v2`` text: the per-state diagram and the review diagram."""

from __future__ import annotations

from typing import Sequence

from fsm.review.diagrams.model import REVIEW, Diagram, DrawnRow, review_edges
from fsm.review.diagrams.style import CHANGE_STYLE, group_words, label_lines, twins_text

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
        lines.append(f"    %% {twins_text(twins)}")
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


def render_review_mermaid(diagram: Diagram, drawn: Sequence[DrawnRow] | None = None,
                          title: str | None = None) -> str:
    """Mermaid ``stateDiagram-v2`` of the review diagram: one line per merged edge, its rows
    stacked with ``<br>``; a group's rows are drawn from its first member (``idle``), whose
    description says the other members answer as it does (no state for the group, so no arrow
    from a group into its own members). The rows of a refusal cascade are one line. In a
    diff, rows are marked ``+`` added, ``−`` removed, ``~`` changed."""
    drawn = tuple(DrawnRow(r) for r in diagram.rows) if drawn is None else tuple(drawn)
    lines = ["---", f"title: {title or REVIEW}", "---", "stateDiagram-v2", "    direction LR",
             "    %% generated from fsm/core/lifecycle.py by 'python -m fsm diagrams'; do not edit",
             f"    %% {len(diagram.ignored)} ignored (state, trigger) cells are not drawn: "
             f"see {diagram.name}.md"]
    first = {group: members[0] for group, members in diagram.groups if members}
    for group, members in diagram.groups:
        if len(members) > 1:
            lines.append(f"    {members[0]} : {group_words(group)}∶ {', '.join(members[1:])} "
                         f"answer as {members[0]}")
    for s in diagram.states:
        if s.initial:
            lines.append(f"    [*] --> {s.name}")
    for e in review_edges(drawn):
        parts = []
        for kind, bold, text, change in label_lines(diagram, e, None):
            mark = CHANGE_STYLE[change][2] + " " if change and kind == "row" else ""
            if kind in ("row", "effect") or not parts:
                parts.append(f"{mark}{bold}{text}".strip())
            elif kind == "was":
                parts[-1] += f" ({text.strip()})"
            else:
                parts[-1] += " " + text.strip()
        lines.append(f"    {first.get(e.source, e.source)} --> {e.dest} : "
                     + "<br>".join(_mermaid_text(p) for p in parts))
    css = {"in_chain": "fill:#FFF4D6,stroke:#8C6D00", "ended": "fill:#EEF3FA,stroke:#0072B2"}
    for group in ("in_chain", "ended"):
        members = [s.name for s in diagram.states if s.group == group]
        if members:
            lines.append(f"    classDef {group} {css[group]}")
            lines.append(f"    class {','.join(members)} {group}")
    return "\n".join(lines) + "\n"

