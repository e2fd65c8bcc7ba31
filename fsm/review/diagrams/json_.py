"""Render JSON: the declaration itself (``retry_lifecycle.json``), what ``--diff`` compares."""

from __future__ import annotations

import json
from typing import Mapping

from fsm.core import lifecycle as L

def declaration_json(decl: Mapping | None = None) -> str:
    """The declaration (default: :func:`fsm.core.lifecycle.declaration`, read from the machine
    the brain serves on) as the JSON written next
    to the diagrams (``retry_lifecycle.json``), what ``--diff`` compares: 2-space indents,
    declaration order, UTF-8, a final ``\\n``."""
    decl = L.declaration() if decl is None else decl
    return json.dumps(decl, indent=2, ensure_ascii=False) + "\n"
