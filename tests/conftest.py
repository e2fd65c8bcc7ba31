"""Shared set-up of the test suite.

The tests mirror the package's layers (``tests/core``, ``tests/host``, ``tests/fleet``, ...);
the helpers every layer uses (``support.py``: the repository root and a subprocess environment;
``fleet_support.py``: throw-away Redis servers) sit beside this file and are importable from
every folder, as are the layers' own test modules.
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# The shared helpers, and the layers' test modules some tests borrow from (a terminal test of a
# provider uses the terminal tests' pseudo-terminal driver), import from any folder.
for folder in [TESTS, *sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name.isidentifier())]:
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
