"""Fixtures shared by the RPC tests."""

from __future__ import annotations

import pytest

from fsm.testing.fault_server import FaultServer


@pytest.fixture(scope="module")
def provider():
    """One fault server per test module whose empty script answers every request with a plain
    successful stream."""
    with FaultServer([]) as fs:
        yield fs
