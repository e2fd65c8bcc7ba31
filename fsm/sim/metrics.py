"""The figures of one run (docs/simulation.md "Metrics").

- ``failure_rate``: calls that ended in error ÷ calls (a fraction);
- ``amplification``: requests sent ÷ calls;
- ``wasted_per_call``: requests sent while the provider was certain to refuse them ÷ calls;
- ``added_latency_p50_s`` / ``_p99_s`` / ``_mean_s``: over the calls that succeeded, call end −
  call start − the 2-s service time, in s (nearest-rank percentiles);
- ``peak_load_x_capacity``: the highest 1-s bin of requests *sent* ÷ C;
- ``drain_s``: from recovery until the last call that was in progress at recovery ended (0 when
  none was, or the scenario has no recovery);
- ``failure_rate_recoverable`` (``outage30min`` only, right after ``failure_rate``): the failure
  rate of the calls that started at most :data:`fsm.sim.world.RECOVERABLE_MS` (600 s, the
  resilient profile's ``maxElapsedMs``) before the recovery, or later (SPEC §15.8).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fsm.sim.engine import Run
from fsm.sim.world import RECOVERABLE_MS

__all__ = ["METRICS", "RECOVERABLE_WORLDS", "Result", "metrics_of", "percentile"]

METRICS: tuple[str, ...] = ("failure_rate", "amplification", "wasted_per_call",
                            "added_latency_p50_s", "added_latency_p99_s", "added_latency_mean_s",
                            "peak_load_x_capacity", "drain_s")
"""The figures, in the order of the table and of ``--json``."""

RECOVERABLE_WORLDS: frozenset[str] = frozenset({"outage30min"})
"""The worlds whose rows also have ``failure_rate_recoverable`` (after ``failure_rate``)."""


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0 < q ≤ 100) of an ascending list; 0.0 when empty."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def _r(x: float) -> float:
    return round(x, 6)


def metrics_of(run: Run) -> dict[str, float]:
    """The :data:`METRICS` of ``run`` (rounded to 6 decimals, so the JSON is stable)."""
    calls = run.calls
    n = len(calls) or 1
    failed = sum(1 for c in calls if not c[2])
    service = run.service_ms
    latencies = sorted((end - start - service) / 1000 for start, end, ok in calls if ok)
    mean = sum(latencies) / len(latencies) if latencies else 0.0
    peak = max(run.sent_per_s.values(), default=0) / run.capacity
    drain = 0.0
    if run.recovery_ms is not None and run.waiting_at_recovery_end_ms is not None:
        drain = max(0.0, (run.waiting_at_recovery_end_ms - run.recovery_ms) / 1000)
    out = {"failure_rate": _r(failed / n)}
    if run.scenario.name in RECOVERABLE_WORLDS and run.recovery_ms is not None:
        since = run.recovery_ms - RECOVERABLE_MS
        late = [c for c in calls if c[0] >= since]
        out["failure_rate_recoverable"] = _r(sum(1 for c in late if not c[2]) / (len(late) or 1))
    out.update({
        "amplification": _r(run.requests / n),
        "wasted_per_call": _r(run.wasted / n),
        "added_latency_p50_s": _r(percentile(latencies, 50)),
        "added_latency_p99_s": _r(percentile(latencies, 99)),
        "added_latency_mean_s": _r(mean),
        "peak_load_x_capacity": _r(peak),
        "drain_s": _r(drain),
    })
    return out


@dataclass(frozen=True, slots=True)
class Result:
    """One (scenario, policy) run: its :data:`METRICS` and the load per second for the picture
    (``sent_per_s``: ``[(second, requests sent), ...]`` ascending; ``capacity``: C)."""

    scenario: str
    policy: str
    metrics: dict[str, float]
    sent_per_s: tuple[tuple[int, int], ...]
    capacity: float
