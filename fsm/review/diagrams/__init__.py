"""Diagrams of the retry lifecycle, generated from the one declaration (docs/policy.md §7).

The pipeline is *extract → model → render*, one module each, the way python-statemachine's
``contrib/diagram/`` is laid out (https://github.com/fgmacedo/python-statemachine):

- :mod:`.extract` reads the ``transitions`` machine the brain serves on
  (:data:`fsm.core.lifecycle.MACHINE`: its ``machine.events``, their transitions, conditions
  and effects) through :func:`fsm.core.lifecycle.declaration` (with the rows as declared,
  their groups, the effects in words, the state and trigger docs) into a :class:`Diagram`;
- :mod:`.model` is that model, small, immutable and free of output formats;
- one renderer per format: :mod:`.dot` (DOT and SVG, laid out by Graphviz's ``dot``),
  :mod:`.mermaid` (``stateDiagram-v2``), :mod:`.markdown` (the transition table and the
  state × trigger matrix) and :mod:`.json_` (the declaration itself, what
  :mod:`fsm.review.diagrams_diff` compares); :mod:`.style` holds what they share (colours,
  words, a review label's lines);
- :mod:`.files` writes them all (``python -m fsm diagrams``) and checks committed ones.

Two diagrams are drawn: the **review diagram** (:func:`build_review_digraph`,
``retry_lifecycle_review.*``), the one a reviewer opens first, and the **per-state diagram**
(:func:`build_digraph`, ``retry_lifecycle.*``): every transition the machine runs is one edge.
Ignored cells are never drawn (the Markdown lists them with their reasons). The text outputs
are byte-stable: declaration order only, no timestamps or versions, ``\\n`` line endings. The
SVGs embed the Graphviz version and coordinates, so they are checked for validity only.

Both diagrams also draw a coverage view for :mod:`fsm.review.audit`, and the review diagram a
diff (:mod:`fsm.review.diagrams_diff`).

This package re-exports the public names of its modules, so ``from fsm.review import
diagrams as D; D.extract()`` keeps working.
"""

from __future__ import annotations

from fsm.review.diagrams.dot import (build_digraph, build_review_digraph, render_dot,
                                     render_review_dot, render_review_svg, render_svg, svg_of)
from fsm.review.diagrams.extract import declared_rows, extract, fold_rows
from fsm.review.diagrams.files import check, render_all, write_all, write_file
from fsm.review.diagrams.json_ import declaration_json
from fsm.review.diagrams.markdown import md_cell, render_markdown
from fsm.review.diagrams.mermaid import render_mermaid, render_review_mermaid
from fsm.review.diagrams.model import (ADDED, AND, CHANGED, NAME, NOT, REMOVED, REVIEW,
                                       TEXT_SUFFIXES, DeclaredRow, Diagram, DiagramError,
                                       DrawnRow, Edge, EdgeMark, IgnoredCell, ReviewEdge, State,
                                       Cascade, cascades, guard_text, review_edges)
from fsm.review.diagrams.dot import LABEL_WIDTH

__all__ = [
    "ADDED", "AND", "CHANGED", "NAME", "NOT", "REMOVED", "REVIEW", "TEXT_SUFFIXES", "LABEL_WIDTH",
    "DeclaredRow", "Diagram", "DiagramError", "DrawnRow", "Edge", "EdgeMark", "IgnoredCell",
    "ReviewEdge", "State", "Cascade", "cascades", "guard_text", "review_edges",
    "extract", "declared_rows", "fold_rows",
    "build_digraph", "build_review_digraph", "render_dot", "render_review_dot", "render_svg",
    "render_review_svg", "svg_of", "render_mermaid", "render_review_mermaid", "render_markdown",
    "md_cell", "declaration_json", "render_all", "write_all", "write_file", "check",
]
