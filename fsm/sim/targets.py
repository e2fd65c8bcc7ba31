"""The resilient profile's targets (docs/simulation.md "Targets"; SPEC §14.3, §15.8).

Each target is absolute; the ideal's figure (for the peak, the drain and the latency) comes
from the same run. :func:`check` gives the verdicts for one scenario; :func:`best_peer` names
the peer printed beside them.
"""

from __future__ import annotations

from typing import NamedTuple

from fsm.sim.world import SCENARIOS, STRESS

__all__ = ["Verdict", "check", "best_peer", "peak_margin", "FAILURE_LIMITS", "PEAK_MARGIN",
           "PEAK_MARGINS", "PEERS"]

PEAK_MARGIN = 0.1
"""How far above the ideal's peak (in multiples of capacity) the resilient profile's peak may
go (docs/simulation.md "Targets"): the ideal resends a random failure at once, a policy with
any backoff moves it into a later second, which may be a busier one of the same ramp."""

PEAK_MARGINS: dict[str, float] = {"cap005": 0.5}
"""Worlds with another peak margin (SPEC §15.8: ``cap005``'s onset sends 4× C before any
answer)."""

FAILURE_LIMITS: dict[str, float] = {"brownout529": 0.005, "brownout429": 0.005,
                                    "outage30s": 0.005, "rpm_windows": 0.005, "outage5min": 0.01,
                                    **{s: 0.005 for s in STRESS if s != "outage30min"}}
"""Failure rate limits (a fraction) per scenario; the others have none (``outage30min``'s
limit is on ``failure_rate_recoverable``: :data:`RECOVERABLE_LIMITS`)."""

RECOVERABLE_LIMITS: dict[str, float] = {"outage30min": 0.01}
"""Limits of ``failure_rate_recoverable`` (SPEC §15.8: the calls that started within
``maxElapsedMs`` of the recovery)."""

PEERS: tuple[str, ...] = ("openai_python", "anthropic_python", "tenacity_cookbook", "stamina",
                          "gemini_cli", "aws_standard")
"""The peers :func:`best_peer` chooses from (other clients' default retry)."""


def peak_margin(scenario: str) -> float:
    """The peak's margin over the ideal's in ``scenario`` (multiples of capacity)."""
    return PEAK_MARGINS.get(scenario, PEAK_MARGIN)


class Verdict(NamedTuple):
    """One target: ``metric`` of ``policy`` is ``value``, the limit is ``limit`` (``<=``)."""

    metric: str
    value: float
    limit: float
    ok: bool
    text: str


def best_peer(rows: dict[str, dict[str, float]]) -> str | None:
    """The best peer among ``rows`` (:data:`PEERS`): the fewest failures, then the fewest
    requests per call (the first in :data:`PEERS` order on a tie); None when no peer ran."""
    peers = [p for p in PEERS if p in rows]
    if not peers:
        return None
    return min(peers, key=lambda p: (rows[p]["failure_rate"], rows[p]["amplification"]))


def check(scenario: str, rows: dict[str, dict[str, float]], policy: str = "resilient") -> list[Verdict]:
    """The verdicts of ``policy``'s row in ``scenario`` (``rows``: policy -> metrics; the
    ``ideal`` row, when present, sets the peak, drain and latency limits). Empty when
    ``policy`` is not in ``rows``."""
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
    if scenario in RECOVERABLE_LIMITS and "failure_rate_recoverable" in m:
        add("failure_rate_recoverable", RECOVERABLE_LIMITS[scenario],
            "failures of the calls that started within maxElapsedMs of the recovery")
    add("amplification", 1.10, "requests per call")
    add("wasted_per_call", 0.05, "requests sent into a certain refusal, per call")
    if ideal is not None:
        margin = peak_margin(scenario)
        add("peak_load_x_capacity", ideal["peak_load_x_capacity"] + margin,
            f"at most the ideal's peak + {margin:g}")
        world = SCENARIOS.get(scenario)
        if world is not None and world.stress and world.recovery_s is not None:
            add("drain_s", 2 * ideal["drain_s"] + 10, "2 × the ideal's + 10 s")
        add("added_latency_mean_s", 2 * ideal["added_latency_mean_s"] + 1, "2 × the ideal's + 1 s")
    return out
