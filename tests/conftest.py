"""Shared set-up of the test suite.

The tests mirror the package's layers (``tests/core``, ``tests/host``, ``tests/fleet``, ...);
the helpers every layer uses (``support.py``: the repository root and a subprocess environment;
``fleet_support.py``: throw-away Redis servers) sit beside this file and are importable from
every folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
