"""The fleet's shared pacing over real processes: ``pacing_peak_ratio`` and its companions.

Four ``python -m fsm rpc --redis URL`` processes (a throw-away ``redis-server`` on a free
loopback port) on the resilient profile, with pacing on, each send prompts one after another
(a call every ``THINK_S``: demand 1.5× capacity for about 3 s) to a
:class:`~fsm.testing.fault_server.FaultServer` in capacity mode
(:class:`~fsm.testing.capacity.Capacity`, ``CAPACITY`` requests/s, one second of burst, 529
over it). A warm-up call per process comes first (process start and the SDK's import are slow on
a loaded machine), then one idle second, then the brown-out.

- ``pacing_peak_ratio``: the highest 1-s bin of requests *sent* (from the first request of the
  brown-out) ÷ capacity; target ≤ 2 (docs/fleet.md "Pacing").
- ``pacing_peak_ratio_unpaced``: the same fleet with ``retry.pacing: null`` (for comparison).
- ``pacing_refused_per_call``, ``pacing_refused_per_call_unpaced``: 529s per call.
- ``pacing_chain_ends_lost``: ``auto_retry_start`` chains without their ``auto_retry_end``
  (target 0).

These are wall-clock figures of real processes, so they live here, not in the default test run;
there, pacing shared by every process of a fleet is
``tests/fleet/test_fleet_v3.py::test_pacing_is_shared_by_every_process_of_a_redis_fleet`` (one
Redis and a cluster) and the pacer itself is tested on virtual time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from fsm.testing.capacity import Capacity
from fsm.testing.fault_server import FaultServer

from ._data import ROOT  # the checkout (children import it first)

CAPACITY = 10.0  # requests/s the fault server serves
PROCESSES = 4
CALLS = 12  # prompts per process, one every THINK_S: demand 1.5× capacity for 3.2 s
THINK_S = PROCESSES / (1.5 * CAPACITY)

SETTINGS = {"retry": {"profile": "resilient", "pacing": {"minRate": 1},
                      "baseDelayMs": 100, "maxDelayMs": 1000, "maxElapsedMs": 30000}}
"""The resilient profile with pacing on, short delays (a brown-out of seconds)."""

UNPACED = {"retry": {**SETTINGS["retry"], "pacing": None}}


def _env() -> dict[str, str]:
    import os
    out = dict(os.environ)
    out["PYTHONPATH"] = str(ROOT) + (os.pathsep + out["PYTHONPATH"] if out.get("PYTHONPATH") else "")
    return out


def _stop(proc: subprocess.Popen, timeout: float = 5.0) -> int:
    try:
        proc.stdin.close()
    except OSError:
        pass
    try:
        return proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_fleet(redis_url: str, settings_path: Path, *, capacity: float = CAPACITY,
              processes: int = PROCESSES, calls: int = CALLS, timeout_s: float = 600.0) -> dict:
    """Run the brown-out: ``processes`` rpc processes each send ``calls`` prompts, one after the
    other, to a fault server of ``capacity`` requests/s (529 over it). Returns
    ``{"windows": [requests per 1-s bin from the first request], "events": [[event, ...] per
    process], "refused": n, "accepted": n}``."""
    with FaultServer(capacity=Capacity(capacity, answer="529")) as server:
        procs = [subprocess.Popen(
            [sys.executable, "-m", "fsm", "rpc", "--base-url", server.base_url, "--model", "m",
             "--api-key", "sk-fleet-pacing", "--settings", str(settings_path), "--no-session",
             "--redis", redis_url],
            cwd=ROOT, env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
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
            _stop(proc)
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


def chain_ends_lost(events: list[list[dict]]) -> int:
    """``auto_retry_start`` chains (by ``chainId``, per process) with no ``auto_retry_end``."""
    lost = 0
    for seen in events:
        chains = {e.get("chainId") for e in seen if e.get("type") == "auto_retry_start"}
        ends = {e.get("chainId") for e in seen if e.get("type") == "auto_retry_end"}
        lost += len(chains - ends)
    return lost


def measure(*, compare: bool = True) -> dict[str, float]:
    """The figures of this group (see the module docstring)."""
    from fsm.fleet.server import RedisServer

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for suffix, settings in (("", SETTINGS), ("_unpaced", UNPACED)):
            if suffix and not compare:
                continue
            path = Path(tmp) / f"settings{suffix}.json"
            path.write_text(json.dumps(settings))
            with RedisServer() as redis:
                run = run_fleet(redis.url, path)
            calls = PROCESSES * CALLS
            out[f"pacing_peak_ratio{suffix}"] = max(run["windows"]) / CAPACITY
            out[f"pacing_refused_per_call{suffix}"] = run["refused"] / calls
            if not suffix:
                out["pacing_chain_ends_lost"] = float(chain_ends_lost(run["events"]))
    return out
