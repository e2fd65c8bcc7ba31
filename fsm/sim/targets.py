"""The resilient profile's targets (docs/simulation.md "Targets"; docs/fleet.md).

Each target is absolute; the ideal's figure (for the peak and the latency) comes from the
same run. :func:`check` gives the verdicts for one scenario.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Verdict", "check", "FAILURE_LIMITS", "PEAK_MARGIN"]

PEAK_MARGIN = 0.1
"""How far above the ideal's peak (in multiples of capacity) the resilient profile's peak may
go (docs/simulation.md "Targets"): the ideal resends a random failure at once, a policy with
any backoff moves it into a later second, which may be a busier one of the same ramp."""

FAILURE_LIMITS: dict[str, float] = {"brownout529": 0.005, "brownout429": 0.005,
                                    "outage30s": 0.005, "rpm_windows": 0.005, "outage5min": 0.01}
"""Failure rate limits (a fraction) per scenario; the others have none."""


class Verdict(NamedTuple):
    """One target: ``metric`` of ``policy`` is ``value``, the limit is ``limit`` (``<=``)."""

    metric: str
    value: float
    limit: float
    ok: bool
    text: str


def check(scenario: str, rows: dict[str, dict[str, float]], policy: str = "resilient") -> list[Verdict]:
    """The verdicts of ``policy``'s row in ``scenario`` (``rows``: policy -> metrics; the
    ``ideal`` row, when present, sets the peak and latency limits). Empty when ``policy`` is
    not in ``rows``."""
    m = rows.get(policy)
    if m is None:
        return []
    ideal = rows.get("ideal")
    out: list[Verdict] = []

    def add(metric: str, limit: float, text: str) -> None:
        value = m[metric]
        out.append(Verdict(metric, value, limit, value <= limit + 1e-9, text))

    if scenario == "usage5h":
        add("amplification", 0.1, "no request per call into a known limit")
        return out
    if scenario in FAILURE_LIMITS:
        add("failure_rate", FAILURE_LIMITS[scenario], "user-visible failures")
    add("amplification", 1.10, "requests per call")
    add("wasted_per_call", 0.05, "requests sent into a certain refusal, per call")
    if ideal is not None:
        add("peak_load_x_capacity", ideal["peak_load_x_capacity"] + PEAK_MARGIN,
            "at most the ideal's peak + 0.1")
        add("added_latency_mean_s", 2 * ideal["added_latency_mean_s"] + 1, "2 × the ideal's + 1 s")
    return out
