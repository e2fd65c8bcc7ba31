"""Four ``python -m fsm rpc --redis URL`` processes on the resilient profile against the fault
server's capacity mode (docs/fleet.md "Pacing"): a short brown-out where the fleet wants far more
than the provider's capacity. The shared pacer keeps every 1-s window of requests sent at most
2× the capacity, and no chain end is lost (every ``auto_retry_start`` chain gets its
``auto_retry_end``). The ratio itself is a figure of ``make bench`` (benchmarks/fleet_rpc.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fsm.testing.capacity import Capacity
from fsm.testing.fault_server import FaultServer
from fleet_support import redis_server  # noqa: F401  (fixture)
from support import ROOT, env, stop_process

pytestmark = pytest.mark.subprocess

CAPACITY = 10.0  # requests/s the fault server serves
PROCESSES = 4
CALLS = 12  # prompts per process, one every THINK_S: demand 1.5× capacity for 3.2 s
THINK_S = PROCESSES / (1.5 * CAPACITY)

SETTINGS = {"retry": {"profile": "resilient", "pacing": {"minRate": 1},
                      "baseDelayMs": 100, "maxDelayMs": 1000, "maxElapsedMs": 30000}}


def run_fleet(redis_url: str, settings_path: Path, *, capacity: float = CAPACITY,
              processes: int = PROCESSES, calls: int = CALLS, timeout_s: float = 120.0) -> dict:
    """Run the brown-out: ``processes`` rpc processes each send ``calls`` prompts, one after the
    other, to a fault server of ``capacity`` requests/s (529 over it). Returns
    ``{"windows": [requests per 1-s bin from the first request], "events": [[event, ...] per
    process], "refused": n, "accepted": n}``."""
    with FaultServer(capacity=Capacity(capacity, answer="529")) as server:
        procs = [subprocess.Popen(
            [sys.executable, "-m", "fsm", "rpc", "--base-url", server.base_url, "--model", "m",
             "--api-key", "sk-fleet-pacing", "--settings", str(settings_path), "--no-session",
             "--redis", redis_url],
            cwd=ROOT, env=env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True) for _ in range(processes)]
        events: list[list[dict]] = [[] for _ in procs]
        errors: list[str] = []
        deadline = time.monotonic() + timeout_s
        start = threading.Barrier(processes)

        t0: list[float] = []

        def drive(i: int) -> None:
            proc, seen = procs[i], events[i]
            try:
                # warm-up: one call each (process start and the SDK's import are slow on a
                # loaded machine); the brown-out starts when every process is ready
                call(proc, "warm-up", [])
                if start.wait(timeout_s) == 0:
                    t0.append(time.monotonic() * 1000.0)
                time.sleep(1.0)  # the provider idles a second before the brown-out (full bucket)
                begin = time.monotonic()
                for k in range(calls):  # a call every THINK_S (a call still running delays it)
                    time.sleep(max(0.0, begin + k * THINK_S - time.monotonic()))
                    call(proc, f"call {k}", seen)
            except Exception as exc:  # reported by the test thread
                errors.append(f"process {i}: {exc}")

        def call(proc: subprocess.Popen, text: str, seen: list) -> None:
            proc.stdin.write(json.dumps({"type": "prompt", "message": text}) + "\n")
            proc.stdin.flush()
            while time.monotonic() < deadline:
                line = proc.stdout.readline()
                if not line:
                    raise AssertionError("the rpc process closed its output")
                event = json.loads(line)
                seen.append(event)
                if _call_over(event):
                    return
            raise AssertionError(f"{text} did not end in time")

        threads = [threading.Thread(target=drive, args=(i,), daemon=True) for i in range(processes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout_s + 5)
        for proc in procs:
            stop_process(proc)
        assert not errors, errors
        times = sorted(rec["t_ms"] for rec in server.chat_requests if rec["t_ms"] >= t0[0])
        first = times[0]
        windows = [0] * (int((times[-1] - first) // 1000) + 1)
        for t in times:
            windows[int((t - first) // 1000)] += 1
        return {"windows": windows, "events": events, "refused": server.capacity.refused,
                "accepted": server.capacity.accepted}


def _call_over(event: dict) -> bool:
    """A prompt's work is over: a turn ended without an error (a success after a chain comes
    after its ``auto_retry_end``), or a chain (or a refusal at rest) ended in failure."""
    if event.get("type") == "auto_retry_end":
        return not event.get("success")
    if event.get("type") == "agent_end":
        messages = event.get("messages") or []
        last = messages[-1] if messages else {}
        return last.get("role") == "assistant" and last.get("stopReason") != "error"
    return False


def test_four_rpc_processes_hold_the_provider_near_its_capacity(redis_server, tmp_path):  # noqa: F811
    """Shared pacing through Redis: every 1-s window ≤ 2× capacity; every chain that starts ends."""
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps(SETTINGS))
    out = run_fleet(redis_server.url, settings)
    assert max(out["windows"]) <= 2 * CAPACITY, out["windows"]
    for seen in out["events"]:
        chains = [e["chainId"] for e in seen if e["type"] == "auto_retry_start"]
        ends = [e for e in seen if e["type"] == "auto_retry_end"]
        assert set(chains) <= {e.get("chainId") for e in ends}, (chains, ends)
        assert all(e["success"] for e in ends), ends
    assert out["accepted"] == PROCESSES * (CALLS + 1)  # every call (and warm-up) got its answer
