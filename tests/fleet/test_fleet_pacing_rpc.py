"""Four ``python -m fsm rpc --redis URL`` processes on the resilient profile against the fault
server's capacity mode (docs/fleet.md "Pacing"): a short brown-out where the fleet wants 1.5× the
provider's capacity. The shared pacer keeps every 1-s window of requests sent at most 2× the
capacity, and no chain end is lost (every ``auto_retry_start`` chain gets its
``auto_retry_end``). The driver is the benchmark's (``benchmarks/pacing.py``), where the ratio
itself is a figure of ``make bench``."""

from __future__ import annotations

import json

import pytest

from benchmarks.pacing import CALLS, CAPACITY, PROCESSES, SETTINGS, chain_ends_lost, run_fleet
from fleet_support import redis_server  # noqa: F401  (fixture)

pytestmark = pytest.mark.subprocess


def test_four_rpc_processes_hold_the_provider_near_its_capacity(redis_server, tmp_path):  # noqa: F811
    """Shared pacing through Redis: every 1-s window ≤ 2× capacity; every chain that starts ends."""
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps(SETTINGS))
    out = run_fleet(redis_server.url, settings)
    assert max(out["windows"]) <= 2 * CAPACITY, out["windows"]
    assert chain_ends_lost(out["events"]) == 0
    for seen in out["events"]:
        ends = [e for e in seen if e["type"] == "auto_retry_end"]
        assert all(e["success"] for e in ends), ends
    assert out["accepted"] == PROCESSES * (CALLS + 1)  # every call (and warm-up) got its answer
