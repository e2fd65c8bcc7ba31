"""Fleet mode with real processes and a real Redis on loopback: the coordinator's cost, and
what a fleet sends during an outage.

``coordinator_decision_us_p50``/``_p99``/``_max``: what the shell awaits before handing a
failed turn to the brain (``before_decision``: the cooldown left and a budget take, one
script) on a :class:`~fsm.fleet.RedisCoordinator` on a throw-away ``redis-server`` on
127.0.0.1 (the round trip itself; the guard adds a task and a timer), ``number`` decisions;
``coordinator_decision_us_p50_inprocess``/``_p99_inprocess`` are the same call on the
embedded :class:`~fsm.fleet.InProcessCoordinator`; ``coordinator_decision_us_p50_cluster``/
``_p99_cluster`` on a throw-away three-master Redis Cluster on 127.0.0.1
(:class:`~fsm.fleet.server.RedisClusterServer`, ``redis+cluster://``; SPEC §15.10: one bench
runs against a real cluster; the cluster client adds its slot routing to each call).

The ``redis-server`` runs at a raised scheduling priority where permitted (``nice -10``): on
a 2-core machine the four worker processes saturate the CPUs, and a fleet's Redis has a host
of its own. The outage figures (they need the session's coordinator wiring: ``AgentSession(...,
coordinator=...)`` and the ``retry.budget``/``retry.retryHints`` settings; without it they are
left out, and a line on stderr says so): ``processes`` (4) processes × ``sessions`` (250)
:class:`~fsm.host.session.AgentSession`, each one prompt at a random moment of the first
``spread_s`` seconds, all against one :class:`~fsm.testing.fault_server.FaultServer` (in
this process's threads) in a full outage: every chat request gets a 529 overloaded error with
a ``retry-after-ms`` hint (300 ms; three answers of 2,000 ms, see :func:`outage_script`). ``maxRetries`` 3, base delay 50 ms,
``retryHints: "honor"``. The window is from the first request until every chain has ended.

- ``fleet_amplification``: requests ÷ first attempts with the retry budget on (defaults:
  100 tokens, ratio 0.1), the fleet sharing one Redis; ``fleet_amplification_no_budget`` is
  the same fleet without the budget (the baseline: 1 + maxRetries).
- ``fleet_requests_in_cooldown``: in the fleet run without the budget (so that every chain
  retries), the retries any process sent before the end of a cooldown that another process
  had learned before this retry was decided (a retry already scheduled is not re-checked, as
  ``docs/policy.md`` §8b.4 says); ``fleet_requests_in_cooldown_unshared`` is the same count
  when every process keeps its own in-process coordinator (the baseline: not 0).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import os
import random
import statistics
import subprocess
import sys
from typing import Any

from fsm.fleet import (BudgetSettings, CoordKey, GuardedCoordinator, InProcessCoordinator,
                       RedisCoordinator, credential_id, wall_ms)
from fsm.fleet.server import RedisClusterServer, RedisServer

from ._data import ROOT
from ._timing import now_ns, percentile

OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
MODEL = "fault-model"


# -- the coordinator's cost -------------------------------------------------------------------

async def _decisions_us(coord: Any, number: int, warmup: int) -> list[float]:
    key = CoordKey("bench", MODEL, credential_id("sk-bench"))
    budget = BudgetSettings()
    out: list[float] = []
    for i in range(warmup + number):
        t0 = now_ns()
        await coord.before_decision(key, wall_ms(), budget)
        t1 = now_ns()
        await coord.credit_success(key, budget)
        if i >= warmup:
            out.append((t1 - t0) / 1000)
    return out


async def _cluster_cost(url: str, number: int, warmup: int) -> dict[str, float]:
    remote = RedisCoordinator.from_url(url, prefix="bench")
    await remote.warm_up()
    cluster_us = await _decisions_us(remote, number, warmup)
    await remote.aclose()
    return {"coordinator_decision_us_p50_cluster": statistics.median(cluster_us),
            "coordinator_decision_us_p99_cluster": percentile(cluster_us, 99)}


async def _coordinator_cost(url: str, number: int, warmup: int) -> dict[str, float]:
    remote = RedisCoordinator.from_url(url, prefix="bench")
    local = InProcessCoordinator()
    await remote.warm_up()
    redis_us = await _decisions_us(remote, number, warmup)
    local_us = await _decisions_us(local, number, warmup)
    await remote.aclose()
    return {
        "coordinator_decision_us_p50": statistics.median(redis_us),
        "coordinator_decision_us_p99": percentile(redis_us, 99),
        "coordinator_decision_us_max": max(redis_us),
        "coordinator_decision_us_p50_inprocess": statistics.median(local_us),
        "coordinator_decision_us_p99_inprocess": percentile(local_us, 99),
    }


# -- the outage ---------------------------------------------------------------------------

class CountingCoordinator:
    """Any coordinator, with the names of the coroutine methods called on it in ``calls``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return await attr(*args, **kwargs)
        return call


def integration_missing() -> str | None:
    """Why the outage figures cannot run on this checkout (None: they can): a session that
    fails once with a hint must read its coordinator before deciding."""
    from fsm.host.clock import FakeClock
    from fsm.host.session import AgentSession
    from fsm.core.settings import BudgetSettings as Budget, RetrySettings
    from fsm.testing import ScriptedProvider, error

    if "coordinator" not in inspect.signature(AgentSession).parameters:
        return "AgentSession takes no coordinator= yet"
    counting = CountingCoordinator(InProcessCoordinator())

    async def probe() -> None:
        clock = FakeClock()
        settings = RetrySettings(base_delay_ms=10, retry_hints="honor", budget=Budget())
        session = AgentSession(ScriptedProvider([error(
            '529 {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}} '
            "(retry-after-ms: 20)")]), settings=settings, clock=clock, coordinator=counting)
        task = asyncio.ensure_future(session.prompt("hello"))
        for _ in range(10):
            await clock.advance(0.05)
            if task.done():
                break
        await asyncio.wait_for(task, 5)
    asyncio.run(probe())
    if not counting.calls:
        return "the session does not call its coordinator yet"
    return None


LONG_HINTS_AT = (200, 700, 1200)
"""The chat requests whose answers ask for a long wait (2,000 ms)."""


def outage_script(requests: int) -> list[dict]:
    """Every chat request fails: a 529 with a hint of 300 ms, except the requests of
    :data:`LONG_HINTS_AT`: 2,000 ms. One process learns each long wait; only a shared
    cooldown holds the other processes' retries back."""
    return [{"status": 529, "json": OVERLOADED,
             "headers": {"retry-after-ms": "2000" if i in LONG_HINTS_AT else "300"}}
            for i in range(requests)]


class RecordingCoordinator:
    """A coordinator that records every cooldown it learns: ``[learned_at_ms, until_ms]``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.learned: list[list[int]] = []
        self.answers: dict[str, int] = {}  # the budget's answers before decisions, counted

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def learn_cooldown(self, key: CoordKey, *args: int) -> None:
        """Protocol v3 ``(key, duration_ms)``, or the earlier ``(key, until_ms, now_ms)``."""
        await self.inner.learn_cooldown(key, *args)
        now = wall_ms()
        until = now + args[0] if len(args) == 1 else args[0]
        self.learned.append([now, until])

    async def admit(self, key: CoordKey, *args: Any, **kwargs: Any) -> Any:
        answer = await self.inner.admit(key, *args, **kwargs)
        self.answers[str(answer.budget)] = self.answers.get(str(answer.budget), 0) + 1
        return answer

    async def before_decision(self, key: CoordKey, now_ms: int, budget: Any) -> Any:
        answer = await self.inner.before_decision(key, now_ms, budget)
        self.answers[str(answer[1])] = self.answers.get(str(answer[1]), 0) + 1
        return answer


async def _worker(spec: dict) -> dict:
    """One fleet process: ``spec["sessions"]`` sessions, one prompt each (see the module)."""
    from fsm.providers.openai_chat import OpenAIChatProvider
    from fsm.host.session import AgentSession
    from fsm.core.settings import RetrySettings

    if spec["redis"]:
        inner: Any = GuardedCoordinator(RedisCoordinator.from_url(spec["redis"], prefix=spec["prefix"]))
    else:
        inner = InProcessCoordinator()
    coord = RecordingCoordinator(inner)
    provider = OpenAIChatProvider(base_url=spec["base_url"], model=MODEL, api_key="sk-bench",
                                  name="fault", timeout_s=30)
    calls: list[list] = []  # [session index, attempt (0 = first), start ms, end ms]

    class Counted:
        name, model = provider.name, provider.model

        def __init__(self, index: int) -> None:
            self.index, self.n = index, 0

        async def complete(self, messages, **kw):
            row = [self.index, self.n, wall_ms(), 0]
            self.n += 1
            calls.append(row)
            try:
                return await provider.complete(messages, **kw)
            finally:
                row[3] = wall_ms()

    budget = BudgetSettings() if spec["budget"] else None
    settings = RetrySettings(max_retries=3, base_delay_ms=50, retry_hints="honor", budget=budget)
    sessions = [AgentSession(Counted(i), settings=settings, coordinator=coord)
                for i in range(spec["sessions"])]
    # Warm up (imports, the HTTP client) on a fault server of our own, so that the outage's
    # requests are not queued behind a first-request's imports.
    from fsm.testing.fault_server import FaultServer
    with FaultServer([{}, {"status": 529, "json": OVERLOADED}]) as warm:
        probe = OpenAIChatProvider(base_url=warm.base_url, model=MODEL, api_key="sk-bench")
        for _ in range(2):
            await probe.complete([{"role": "user", "content": "warm-up"}])
        await probe.aclose()
    if isinstance(inner, GuardedCoordinator) and not await inner.warm_up():
        raise SystemExit(f"Redis did not answer: {inner.breaker.events}")
    rng = random.Random(spec["seed"])
    offsets = [rng.uniform(0, spec["spread_s"]) for _ in sessions]
    print(json.dumps("ready"), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

    async def one(s: AgentSession, offset: float) -> None:
        await asyncio.sleep(offset)
        await s.prompt("hello")
    await asyncio.gather(*(one(s, o) for s, o in zip(sessions, offsets)))
    await provider.aclose()
    await inner.aclose()
    events = inner.breaker.events if isinstance(inner, GuardedCoordinator) else []
    return {"calls": calls, "learned": coord.learned, "events": events, "answers": coord.answers}


def _run_fleet(*, processes: int, sessions: int, redis_url: str | None, budget: bool,
               spread_s: float, prefix: str) -> dict[str, Any]:
    from fsm.testing.fault_server import FaultServer

    with FaultServer(outage_script(processes * sessions * 5)) as server:
        workers = []
        for p in range(processes):
            spec = {"redis": redis_url, "prefix": prefix, "base_url": server.base_url,
                    "sessions": sessions, "budget": budget, "spread_s": spread_s, "seed": p}
            proc = subprocess.Popen([sys.executable, "-m", "benchmarks.fleet", "--worker",
                                     json.dumps(spec)], cwd=ROOT, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True,
                                    env={**os.environ, "PYTHONPATH": str(ROOT)})
            workers.append(proc)
        for proc in workers:
            line = proc.stdout.readline().strip()
            if line != '"ready"':
                raise AssertionError(f"a fleet worker did not start: {line!r}")
        for proc in workers:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = []
        for proc in workers:
            out, _ = proc.communicate(timeout=120)
            if proc.returncode != 0:
                raise AssertionError(f"a fleet worker failed with {proc.returncode}")
            results.append(json.loads(out.strip().splitlines()[-1]))
        served = len(server.chat_requests)
    calls = [c for r in results for c in r["calls"]]
    first = sum(1 for c in calls if c[1] == 0)
    if first != processes * sessions or served != len(calls):
        raise AssertionError(f"{first} first attempts of {processes * sessions}; "
                             f"{served} requests served, {len(calls)} sent")
    print(f"[bench] fleet: budget answers {[r['answers'] for r in results]}", file=sys.stderr)
    events = [e for r in results for e in r["events"]]
    if events:
        print(f"[bench] fleet: coordinator events during the run: {events[:6]}", file=sys.stderr)
    return {"amplification": len(calls) / first, "in_cooldown": _in_cooldown(results),
            "outages": sum(e["type"] == "coordinator_unavailable" for e in events)}


def _in_cooldown(results: list[dict]) -> int:
    """Retries sent before the end of a cooldown another process learned before the retry
    was decided (the end of the session's previous request)."""
    count = 0
    for p, result in enumerate(results):
        others = [c for q, r in enumerate(results) if q != p for c in r["learned"]]
        ends: dict[tuple[int, int], int] = {(c[0], c[1]): c[3] for c in result["calls"]}
        for index, attempt, start, _ in result["calls"]:
            if attempt == 0:
                continue
            decided = ends[(index, attempt - 1)]
            if any(learned < decided and start < until for learned, until in others):
                count += 1
    return count


# -- the simulation (python -m fsm simulate) --------------------------------------------------

SIM_POLICIES = ("ideal", "resilient", "seed", "seed_by_hand")


def sim_figure_names(scenario: str) -> list[tuple[str, str, float | None]]:
    """``(figure, metric, static limit or None)`` for ``scenario``'s figures: the resilient
    profile's failure rate, amplification and waste (absolute targets), and its peak, mean
    added latency and (in a stress world with a recovery) drain as ratios to their limits
    from the ideal of the same run (targets 1; SPEC §14.3, §15.8)."""
    from fsm.sim import SCENARIOS
    from fsm.sim.targets import FAILURE_LIMITS, RECOVERABLE_LIMITS

    if scenario == "usage5h":
        return [(f"sim_{scenario}_amplification", "amplification", 0.1)]
    out: list[tuple[str, str, float | None]] = []
    if scenario in FAILURE_LIMITS:
        out.append((f"sim_{scenario}_failure_rate", "failure_rate", FAILURE_LIMITS[scenario]))
    if scenario in RECOVERABLE_LIMITS:
        out.append((f"sim_{scenario}_failure_rate_recoverable", "failure_rate_recoverable",
                    RECOVERABLE_LIMITS[scenario]))
    out += [(f"sim_{scenario}_amplification", "amplification", 1.10),
            (f"sim_{scenario}_wasted_per_call", "wasted_per_call", 0.05),
            (f"sim_{scenario}_peak_ratio_vs_limit", "peak_load_x_capacity", None),
            (f"sim_{scenario}_latency_ratio_vs_limit", "added_latency_mean_s", None)]
    world = SCENARIOS[scenario]
    if world.stress and world.recovery_s is not None:
        out.append((f"sim_{scenario}_drain_ratio_vs_limit", "drain_s", None))
    return out


def measure_simulation(sessions: int = 10_000, seed: int = 1,
                       stress_sessions: int = 1_000) -> dict[str, float]:
    """The simulation's figures (deterministic: the same on a noisy machine): for every
    scenario, the resilient profile's figures of :func:`sim_figure_names` (the standard
    worlds with ``sessions`` sessions, SPEC §14.3's N = 10,000; the stress worlds with
    ``stress_sessions``, SPEC §15.8's N = 1,000); ``sim_seed_mismatches``: scenarios where
    the brain with the default settings differs from the hand-encoded 2/4/8 s baseline
    (target 0); ``sim_seconds``: CPU time of the runs."""
    import time as _time

    from fsm.sim import SCENARIOS, simulate
    from fsm.sim.world import DEFAULT_SCENARIOS  # not live_brownout: benchmarks/live.py
    from fsm.sim.targets import peak_margin  # the peak's limit: the ideal's + 0.1 (cap005: 0.5)

    out: dict[str, float] = {}
    mismatches = 0
    started = _time.process_time()
    for scenario in DEFAULT_SCENARIOS:
        world = SCENARIOS[scenario]
        n = stress_sessions if world.stress else sessions
        rows = {p: simulate(scenario, p, sessions=n, seed=seed).metrics for p in SIM_POLICIES}
        mismatches += json.dumps(rows["seed"]) != json.dumps(rows["seed_by_hand"])
        ideal, res = rows["ideal"], rows["resilient"]
        for name, metric, _ in sim_figure_names(scenario):
            if name.endswith("_peak_ratio_vs_limit"):
                out[name] = res[metric] / (ideal[metric] + peak_margin(scenario))
            elif name.endswith("_latency_ratio_vs_limit"):
                out[name] = res[metric] / (2 * ideal[metric] + 1)
            elif name.endswith("_drain_ratio_vs_limit"):
                out[name] = res[metric] / (2 * ideal[metric] + 10)
            else:
                out[name] = res[metric]
    out["sim_seed_mismatches"] = float(mismatches)
    out["sim_seconds"] = _time.process_time() - started
    return out


def measure(*, number: int = 2_000, warmup: int = 200, processes: int = 4, sessions: int = 250,
            spread_s: float = 1.0, sim_sessions: int = 10_000,
            stress_sessions: int = 1_000) -> dict[str, float]:
    """The figures of this group (see the module docstring and :func:`measure_simulation`)."""
    out: dict[str, float] = measure_simulation(sim_sessions, stress_sessions=stress_sessions)
    with RedisClusterServer() as cluster:
        out.update(asyncio.run(_cluster_cost(cluster.url, number, warmup)))
    with RedisServer() as redis_server:
        try:  # the priority a Redis on its own host would have (the workers saturate the CPUs)
            os.setpriority(os.PRIO_PROCESS, redis_server.process.pid, -10)
        except OSError:
            pass
        out.update(asyncio.run(_coordinator_cost(redis_server.url, number, warmup)))
        missing = integration_missing()
        if missing:
            print(f"[bench] fleet: outage figures left out: {missing}", file=sys.stderr)
            return out
        common = {"processes": processes, "sessions": sessions, "spread_s": spread_s}
        budgeted = _run_fleet(redis_url=redis_server.url, budget=True, prefix="b1", **common)
        shared = _run_fleet(redis_url=redis_server.url, budget=False, prefix="b2", **common)
        unshared = _run_fleet(redis_url=None, budget=False, prefix="b3", **common)
    out["fleet_amplification"] = budgeted["amplification"]
    out["fleet_amplification_no_budget"] = shared["amplification"]
    out["fleet_requests_in_cooldown"] = float(shared["in_cooldown"])
    out["fleet_requests_in_cooldown_unshared"] = float(unshared["in_cooldown"])
    return out


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        print(json.dumps(asyncio.run(_worker(json.loads(sys.argv[2])))))
    else:
        print(json.dumps(measure()))
