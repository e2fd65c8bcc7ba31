"""Colours, words and label lines shared by the renderers (:mod:`.dot`, :mod:`.mermaid`,
:mod:`.markdown`): the coverage and diff styles, group names in words, and a review edge's
label as lines (:func:`label_lines`), before any format is applied."""

from __future__ import annotations

import re
from typing import Sequence

from fsm.review.diagrams.model import (ADDED, CHANGED, REMOVED, Diagram, DrawnRow, ReviewEdge,
                                       cascades, guard_text)

# Okabe–Ito palette: distinguishable with the common colour-vision deficiencies. One colour
# per trigger, in declaration order, so the parallel edges of the four at-rest states can be
# matched by colour. Red is kept free for the coverage view ("not covered").
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#56B4E9", "#CC79A7", "#000000", "#8C6D00",
            "#7F7F7F")
UNCOVERED = "#D00000"
COVERED = "#007A56"
PARTLY = "#B86E00"
STATUS_STYLE = {  # coverage view: (colour, style, pen width, legend text)
    "covered": (COVERED, "solid", "1.2", "covered: taken (and rejected, when it can be)"),
    "partly covered": (PARTLY, "solid", "2.2", "partly covered: taken, never rejected"),
    "not covered": (UNCOVERED, "dashed", "1.6", "not covered: never taken"),
}
GROUP_LABELS = {"in_chain": "in a retry chain", "ended": "chain ended (at rest)",
                 "at_rest": "at rest"}
CLUSTERS = ("in_chain", "ended")  # idle stays outside: most edges of the ended states end there
FILLS = {"in_chain": "#FFF4D6", "ended": "#EEF3FA", "at_rest": "#FFFFFF"}
CHANGE_STYLE = {  # diff view: colour, line style, marker; Okabe–Ito, with a marker beside colour
    ADDED: ("#009E73", "solid", "+"),
    REMOVED: ("#D55E00", "dashed", "−"),
    CHANGED: ("#0072B2", "solid", "~"),
}
REVIEW_EDGE = "#444444"
FONT = "DejaVu Sans"
"""The font every DOT names (Debian's ``fonts-dejavu-core``, which ``make setup`` installs):
Graphviz measures the labels with it and a browser draws them with it, so a label's box fits
its text and stays next to its edge (docs/diagrams.md "The report")."""
GROUP_WORDS = {"at_rest": "at rest"}


def group_words(group: str) -> str:
    """A group's name in words (``at_rest`` → ``at rest``)."""
    return GROUP_WORDS.get(group, group.replace("_", " "))


def twins_text(twins: Sequence[str]) -> str:
    return (f"{', '.join(twins[1:])}: the same transitions and ignored cells as {twins[0]} "
            "(one edge each)")


def wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width, break_on_hyphens=False) or [""]


Line = tuple[str, str, str, str]
"""One line of a review label: ``(kind, bold, text, change)``; see :func:`label_runs`."""


REFUSED = "refused: the first failing guard → endReason"
"""How a refusal cascade reads on its edge (its guard order is listed once, in the legend)."""


def refusal_words(diagram: Diagram, rows: Sequence[DrawnRow]) -> str:
    """What the refusal rows ``rows`` do, in one phrase: their effects' words when they differ
    only in the reason in parentheses (``emit auto_retry_end (endReason); ...``), else the
    effects' names joined by ``|``."""
    texts = {re.sub(r"\(([a-z_]+)\)", "(endReason)", diagram.effect_text(d.row.effect))
             for d in rows}
    if len(texts) == 1:
        return texts.pop()
    return " | ".join(dict.fromkeys(d.row.effect or "-" for d in rows))


def _collapse(diagram: Diagram, edge: ReviewEdge) -> list[list[DrawnRow]]:
    """The edge's rows as items: one row each, except that two or more rows of one refusal
    cascade with the same tone and the same ``was`` (a diff's old version, the coverage
    view's counts), one after the other, make one item."""
    found = cascades(diagram.rows)
    items: list[list[DrawnRow]] = []
    key_of = []
    for d in edge.rows:
        cascade = next((c for c in found if c.refused_by(d.row.id)), None)
        key = (id(cascade), d.tone, d.was) if cascade is not None else None
        if key is not None and key_of and key_of[-1] == key:
            items[-1].append(d)
        else:
            items.append([d])
            key_of.append(key)
    out: list[list[DrawnRow]] = []
    for item, key in zip(items, key_of):
        if key is not None and len(item) == 1:
            out.append(item)
        elif key is None:
            out.extend([d] for d in item)
        else:
            out.append(item)
    return out


def label_runs(diagram: Diagram, edge: ReviewEdge, width: int | None
               ) -> list[tuple[list[list[Line]], list[Line]]]:
    """The label of an edge as runs of rows sharing one effect; see :func:`linked_label_runs`,
    which also names each row's ids."""
    return [([lines for lines, _ in rows], effect)
            for rows, effect in linked_label_runs(diagram, edge, width)]


def linked_label_runs(diagram: Diagram, edge: ReviewEdge, width: int | None
                      ) -> list[tuple[list[tuple[list[Line], tuple[str, ...]]], list[Line]]]:
    """The label of an edge as runs of rows that share one effect: ``[(rows, effect lines)]``,
    each row ``(lines, row ids)`` — the declared rows it stands for (several for a refusal
    cascade) and its lines ``(kind, bold, text, change)``; ``kind`` is ``row`` (a row's first
    line), ``more`` (its wrapped guards), ``was`` (what a changed row was) or ``effect``. A
    trigger repeated by the next rows is written once, their guards follow as ``or [guards]``;
    the effect is in the declaration's words. Two or more rows of a refusal cascade
    (:func:`~fsm.review.diagrams.model.cascades`) are one line, :data:`REFUSED`, their effect
    one phrase (:func:`refusal_words`). ``width`` wraps long lines (None: never)."""
    def fit(text: str, n: int) -> list[str]:
        return [text] if width is None else wrap(text, n)

    runs: list[list[list[DrawnRow]]] = []
    for item in _collapse(diagram, edge):
        d = item[0]
        if (runs and len(item) == 1 and len(runs[-1][-1]) == 1
                and runs[-1][-1][0].row.effect == d.row.effect and runs[-1][-1][0].tone == d.tone):
            runs[-1].append(item)
        else:
            runs.append([item])
    n = width or 0
    previous = None
    out: list[tuple[list[tuple[list[Line], tuple[str, ...]]], list[Line]]] = []
    for run in runs:
        rows: list[tuple[list[Line], tuple[str, ...]]] = []
        if len(run[0]) > 1:  # a refusal cascade
            d = run[0][0]
            rows.append(([("row", d.row.trigger, "", d.tone), ("more", "", f"  {REFUSED}", d.tone)]
                         + [("was", "", f"    {w}", d.tone) for w in fit(d.was, n)] * bool(d.was),
                         tuple(x.row.id for x in run[0])))
            previous = None
            effect = refusal_words(diagram, run[0])
            effect_lines = [("effect", "", ("/ " if i == 0 else "  ") + w, d.change)
                            for i, w in enumerate(fit(effect, n))]
            out.append((rows, effect_lines))
            continue
        for (d,) in run:
            lines: list[Line] = []
            guards = fit(f"[{guard_text(d.row.guards)}]", n) if d.row.guards else []
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
                lines += [("was", "", f"{indent}{w}", d.tone) for w in fit(d.was, n)]
            rows.append((lines, (d.row.id,)))
        last = run[-1][0]
        effect = diagram.effect_text(last.row.effect)
        effect_lines = []
        if effect:
            effect_lines = [("effect", "", ("/ " if i == 0 else "  ") + w, last.change)
                            for i, w in enumerate(fit(effect, n))]
        out.append((rows, effect_lines))
    return out


def label_lines(diagram: Diagram, edge: ReviewEdge, width: int | None) -> list[Line]:
    """Every line of :func:`label_runs`, in reading order (each run's effect after it)."""
    return [line for rows, effect in label_runs(diagram, edge, width)
            for line in [l for row in rows for l in row] + effect]

