"""Write the generated files (and check the committed ones against the declaration, read from
the ``transitions`` machine the brain serves on, :data:`fsm.core.lifecycle.MACHINE`)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from fsm.core import lifecycle as L
from fsm.review.diagrams.dot import render_review_dot, render_review_svg
from fsm.review.diagrams.extract import extract
from fsm.review.diagrams.json_ import declaration_json
from fsm.review.diagrams.markdown import render_markdown
from fsm.review.diagrams.mermaid import render_review_mermaid
from fsm.review.diagrams.model import REVIEW, Diagram
from fsm.review.diagrams.policy import PolicyCard, policy_card
from fsm.review.diagrams.states import render_state_dot, render_state_svg

STATES_DIR = "states"
"""Folder (inside ``--out``) of the small multiples, one ``<state>.dot`` / ``.svg`` each."""


def render_all(diagram: Diagram | None = None, decl: Mapping | None = None,
               policy: PolicyCard | None = None) -> dict[str, str]:
    """The byte-stable text outputs, file name → text: the table (``.md``), the review diagram
    (``_review.dot``, ``_review.mmd``; its legend card from ``policy``, default: the default
    settings), one small diagram per state (``states/<state>.dot``) and the declaration as
    JSON (``.json``)."""
    decl = L.declaration() if decl is None and diagram is None else decl
    diagram = extract(decl) if diagram is None else diagram
    policy = policy_card() if policy is None else policy
    out = {f"{diagram.name}.md": render_markdown(diagram),
           f"{REVIEW}.dot": render_review_dot(diagram, policy),
           f"{REVIEW}.mmd": render_review_mermaid(diagram)}
    for s in diagram.states:
        out[f"{STATES_DIR}/{s.name}.dot"] = render_state_dot(diagram, s.name)
    if decl is not None:
        out[f"{diagram.name}.json"] = declaration_json(decl)
    return out


def write_file(path: Path, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8 with ``\\n`` endings) to ``path``, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)


def write_all(out: Path | str, *, svg: bool = True, settings=None,
              source: str = "the defaults") -> list[Path]:
    """Write every output into the folder ``out``; return the paths written, in order.

    ``settings`` (a :class:`fsm.core.settings.RetrySettings`, default: the defaults) is the
    policy the review diagram's legend card states; ``source`` says where it comes from. The
    text files are written first, so a missing ``dot`` (:class:`DiagramError`) still leaves
    them up to date.
    """
    out = Path(out)
    decl = L.declaration()
    diagram = extract(decl)
    written = []
    policy = policy_card(settings, source=source)
    for name, text in render_all(diagram, decl, policy).items():
        write_file(out / name, text)
        written.append(out / name)
    if svg:
        pictures = [(REVIEW, render_review_svg(diagram, policy))]
        pictures += [(f"{STATES_DIR}/{s.name}", render_state_svg(diagram, s.name))
                     for s in diagram.states]
        for name, data in pictures:
            write_file(out / f"{name}.svg", data)
            written.append(out / f"{name}.svg")
    return written


def check(out: Path | str) -> list[str]:
    """Compare the committed text outputs in ``out`` with fresh ones; return the stale names."""
    out = Path(out)
    stale = []
    for name, text in render_all().items():
        path = out / name
        if not path.is_file() or path.read_bytes() != text.encode("utf-8"):
            stale.append(name)
    return stale
