"""Shared set-up of the test suite.

The tests mirror the package's layers (``tests/core``, ``tests/host``, ``tests/fleet``, ...);
the helpers every layer uses (``support.py``: the repository root and a subprocess environment;
``fleet_support.py``: throw-away Redis servers) sit beside this file, a layer's own shared
helpers in a ``*_support.py`` module of its folder (``host/session_support.py``,
``tui/pty_support.py``, ...); all of them import from any folder. A test module never imports
another test module (docs/architecture.md, "The layers"; tests/test_layers.py checks it).
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# The shared helpers (support modules) import from any folder: a terminal test of a provider
# uses the chat tests' pseudo-terminal driver, tui/pty_support.py.
for folder in [TESTS, *sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name.isidentifier())]:
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
