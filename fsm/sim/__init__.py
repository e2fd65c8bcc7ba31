"""The deterministic fleet simulation: ``python -m fsm simulate`` (docs/simulation.md).

One provider (capacity C = 0.1 × N requests/s), N sessions in 4 processes, a standard fault
(:data:`SCENARIOS`), and a policy (:data:`POLICIES`, or a settings file): the real brain and
the real coordinators on a virtual clock, bit-for-bit reproducible for a given seed. No wall
clock is read.

::

    from fsm.sim import simulate
    result = simulate("brownout529", "seed", sessions=100)
    result.metrics   # {"failure_rate": ..., "amplification": ..., ...}
"""

from __future__ import annotations

from fsm.sim.metrics import METRICS, Result, metrics_of
from fsm.sim.run import POLICIES, resilient_settings, simulate
from fsm.sim.world import SCENARIOS, Scenario

__all__ = ["METRICS", "POLICIES", "Result", "SCENARIOS", "Scenario",
           "metrics_of", "resilient_settings", "simulate"]
