"""Render Markdown: the transition table, the state × trigger matrix and the ignored cells."""

from __future__ import annotations

from fsm.review.diagrams.model import AND, NOT, Diagram
from fsm.review.diagrams.style import GROUP_LABELS, twins_text

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
        f"Pictures: the review diagram [{diagram.name}_review.svg]({diagram.name}_review.svg) "
        f"(Mermaid: [{diagram.name}_review.mmd]({diagram.name}_review.mmd)) and one small "
        "diagram per state, below.",
        "",
        "## One state at a time",
        "",
        "Each picture shows the rows into the state (left) and out of it (right), and the "
        "triggers it ignores.",
        "",
    ]
    out += [f"- [{_code(s.name)}](states/{s.name}.svg): {_md(s.doc)}" for s in diagram.states]
    out += [
        "",
        "## States",
        "",
        "| state | group | meaning |",
        "|---|---|---|",
    ]
    for s in diagram.states:
        group = GROUP_LABELS.get(s.group, "")
        name = _code(s.name) + (" (initial)" if s.initial else "")
        out.append(f"| {name} | {group} | {_md(s.doc)} |")
    if diagram.twins():
        out.append("")
        out += [f"- {twins_text(t)}." for t in diagram.twins()]
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

