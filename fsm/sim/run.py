"""Running one (scenario, policy) pair: the policy names and what they build.

Policies (:data:`POLICIES`): ``ideal``; ``seed`` (the default settings, no coordinator);
``resilient`` (the resilient profile, one coordinator and pacer shared by the whole fleet); the
named baselines of :data:`fsm.sim.policies.BASELINES`; and a user's settings (:func:`simulate`
with ``settings=``; one in-process coordinator per process, as ``python -m fsm rpc`` without
``--redis`` has). ``seed``, ``resilient`` and the settings run each call through the one retry
loop (:class:`fsm.host.loop.RetryLoop`, :class:`fsm.sim.policies.BrainRetrier`).
"""

from __future__ import annotations

from fsm.core.settings import RetrySettings
from fsm.sim.engine import VirtualClock, run_world
from fsm.sim.metrics import Result, metrics_of
from fsm.sim.policies import (BASELINES, BrainPolicy, Ideal, Messages, make_brain_factory,
                              make_schedule_factory)
from fsm.sim.world import SCENARIOS

__all__ = ["POLICIES", "resilient_settings", "simulate"]

POLICIES: tuple[str, ...] = ("ideal", "seed", "resilient", *BASELINES)
"""The policy names ``--policy`` knows (a settings file adds its own)."""

def resilient_settings() -> RetrySettings:
    """The resilient profile's retry settings (``docs/policy.md`` §1, "The resilient profile")."""
    return RetrySettings.from_json({"retry": {"profile": "resilient"}})


def simulate(scenario: str, policy: str, *, sessions: int = 1000, seed: int = 1,
             settings: RetrySettings | None = None) -> Result:
    """Run ``scenario`` (a :data:`fsm.sim.world.SCENARIOS` name) under ``policy`` with
    ``sessions`` sessions and the random ``seed``. ``policy`` is a :data:`POLICIES` name, or
    any name with ``settings`` given (a user's settings). A world with a fixed fleet size
    (``lone_throttle``) runs that many sessions whatever ``sessions`` says. Raises ``ValueError`` naming an
    unknown scenario or policy, or ``sessions < 1``."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; expected one of {', '.join(SCENARIOS)}")
    world = SCENARIOS[scenario]
    clock = VirtualClock()
    procs = world.processes
    if settings is not None:
        make = make_brain_factory(BrainPolicy(settings, _messages(), clock, "process", procs), seed)
    elif policy == "ideal":
        def make(session, provider, context):
            return Ideal(provider)
    elif policy == "seed":
        make = make_brain_factory(BrainPolicy(RetrySettings(), _messages(), clock, None, procs), seed)
    elif policy == "resilient":
        make = make_brain_factory(
            BrainPolicy(resilient_settings(), _messages(), clock, "fleet", procs), seed)
    elif policy in BASELINES:
        make = make_schedule_factory(policy, seed, procs)
    else:
        raise ValueError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}"
                         " (or --settings FILE)")
    run = run_world(world, sessions, seed, make, clock=clock)
    return Result(scenario, policy, metrics_of(run), tuple(sorted(run.sent_per_s.items())),
                  run.capacity)


_MESSAGES: list[Messages] = []


def _messages() -> Messages:
    """The answers' messages and verdicts, classified once per process."""
    if not _MESSAGES:
        m = Messages()
        m.check()
        _MESSAGES.append(m)
    return _MESSAGES[0]
