"""Simulation to reality: one brown-out world run live and through ``simulate`` (SPEC §15.9,
§15.13 "Live vs simulated"; docs/simulation.md "Live against simulated").

The world is ``live_brownout`` (:data:`fsm.sim.SCENARIOS`): N sessions (300), capacity C =
0.1 × N requests/s, demand 2× C for 30 s then 0.5× C, 4 calls per session, a 529 without a
hint over capacity.

**Live**, as a user runs a fleet:

- one throw-away ``redis-server`` (:class:`fsm.fleet.server.RedisServer`, a free loopback port);
- the provider: ``python -m fsm fault-server --capacity C --service-ms 2000 --refusal-ms 200``
  (the simulation's provider, docs/simulation.md "The world": a token bucket with one second of
  burst, an accepted request answered after 2 s, a refusal after 0.2 s);
- ``processes`` (4) runner processes (``python -m benchmarks.live --worker SPEC``), session *i*
  in process *i* mod 4 as in the simulation. Each call is ``await fsm.retrying(client.chat
  .completions.create, ..., settings={"retry": {"profile": "resilient"}}, coordinator=...)``
  on an ``openai.AsyncOpenAI`` client (its own retries off), the coordinator
  ``fsm.fleet.coordinator_from_url(REDIS_URL)`` shared by the fleet: the shipped runner, loop
  and profile, nothing of the benchmark's in between.
- The traffic is the simulation's, from the same seeds (:func:`fsm.sim.engine.session_rng`):
  session *i* starts its first call at the same offset, thinks as long after each call (drawn
  from the same stream, scaled by the demand at the call's end), and its jitter comes from
  its policy stream. Every process starts the world at the same whole second of the wall
  clock, so the world's second *k* is one bin of the provider's count.

What keeps the harness on time on a busy machine (a raised priority, a swept start-up heap, a
warmed-up chat path: :data:`NICE`, :func:`_worker`) is in docs/simulation.md.

The provider counts what it sees (``GET /fault/stats``: requests accepted and refused per
second), so load is measured where the simulation measures it; failures are the calls that
raised (the provider's view agrees: one accepted request per successful call, checked).

Figures (targets in ``benchmarks/run.py``):

- ``live_vs_sim_failure_points``: |live − simulated failure rate|, in percentage points (≤ 0.5);
- ``live_vs_sim_amplification``: |live − simulated requests per call| (≤ 0.05);
- ``live_vs_sim_peak_ratio``: the live peak (the highest 1-s bin of requests ÷ C) ÷ the
  simulated one (0.85–1.15);
- and beside them each side's figure (``live_failure_rate``, ``sim_failure_rate``, …,
  ``live_added_latency_mean_s``), ``live_start_late_p99_ms`` (how late the sessions' calls
  started against their schedule: the harness's own error), ``live_loop_lag_p99_ms`` (how late
  the runner processes' event loops woke a 50-ms timer, the worst process's 99th percentile:
  a busy machine's share of that error), ``live_unknown_share`` (the coordinator reads that
  missed their bound) and ``live_seconds`` (the live run's wall time, set-up included).
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import subprocess
import sys
import time
import urllib.request
from typing import Any

from ._data import ROOT

WORLD = "live_brownout"
PROCESSES = 4
SESSIONS = 300
MODEL = "fault-model"
SETTINGS = {"retry": {"profile": "resilient"}}
"""The resilient profile exactly as it ships (docs/policy.md §1)."""
LEAD_S = 2.0
"""Seconds between the last process being ready and the world's start."""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


# -- one runner process --------------------------------------------------------------------

class Traffic:
    """When session ``session``'s calls are due, drawn as :func:`fsm.sim.engine.run_world` draws
    them (the same stream of the same seed): the first at ``U(0, 10 / f) s``, each next one
    ``(10 / f − 2) s × U(0.5, 1.5)`` after the end of the one before, f the demand factor then
    (``demand``: ``[(until_s or None for ever, f), ...]``, :attr:`fsm.sim.world.Scenario.demand`).
    Times are ms from the world's start."""

    def __init__(self, seed: int, session: int, demand: list) -> None:
        from fsm.sim.engine import session_rng

        self.rng = session_rng(seed, session, 0)
        self.demand = [(math.inf if until is None else until, f) for until, f in demand]

    def factor(self, t_ms: float) -> float:
        """The demand factor at ``t_ms`` (:meth:`fsm.sim.world.Scenario.factor`)."""
        s = t_ms / 1000
        for until, f in self.demand:
            if s < until:
                return f
        return self.demand[-1][1]

    def first_due(self) -> int:
        return int(self.rng.random() * 10_000 / self.factor(0))

    def next_due(self, end_ms: float) -> int:
        """The next call's due time, the last one having ended at ``end_ms``."""
        from fsm.sim.world import SERVICE_MS

        think = (10_000 / self.factor(end_ms) - SERVICE_MS) * (0.5 + self.rng.random())
        return int(end_ms) + int(think)


async def _worker(spec: dict) -> dict:
    """One process of the fleet: the sessions ``i`` with ``i % processes == index`` (see the
    module docstring). Prints ``"ready"`` when warmed up, reads the world's start (epoch ms) on
    stdin, and returns ``{"calls": [[session, k, due_ms, start_ms, end_ms, ok, error], ...],
    "events": {type: n}, "answers": {...}}`` (times relative to the world's start)."""
    import openai

    import fsm
    from fsm.core.settings import RetrySettings
    from fsm.fleet import coordinator_from_url
    from fsm.sim.engine import session_rng

    seed, calls_per_session = spec["seed"], spec["calls"]
    settings = RetrySettings.from_json(SETTINGS)  # read once, as a long-running host does
    trace: list[list] = []  # with spec["trace"]: [t_ms, what, detail], for a diagnosis
    hooks: dict[str, list] = {}
    if spec.get("trace"):
        async def sent(request: Any) -> None:
            trace.append([now(), "send", None])

        async def answered(response: Any) -> None:
            trace.append([now(), "answer", response.status_code])
        hooks = {"request": [sent], "response": [answered]}
    client = openai.AsyncOpenAI(base_url=spec["base_url"], api_key="sk-live-bench", max_retries=0,
                                http_client=openai.DefaultAsyncHttpxClient(event_hooks=hooks))
    coord = coordinator_from_url(spec["redis"], prefix=spec["prefix"])
    if not await coord.warm_up():
        raise SystemExit("Redis did not answer")
    events: dict[str, int] = {}

    def count(event: Any) -> None:
        events[event.type] = events.get(event.type, 0) + 1
        if spec.get("trace"):
            trace.append([now(), event.type, event.to_json()])

    t0 = 0.0

    def now() -> float:
        return time.time() * 1000 - t0

    messages = [{"role": "user", "content": "hello"}]
    # Warm-up, off the world's books: the chat path's lazy imports (the SDK's chat types, a
    # failure's mapping and classification: about 0.2 s, which otherwise delayed and bunched
    # the onset's first requests) on a fault server of this process's own, under a key of its
    # own (not the world's pacer); then a connection to the provider and the coordinator's
    # scripts on a path the provider does not count (GET /models).
    from fsm.testing.fault_server import FaultServer
    with FaultServer([{"status": 529, "json": {"type": "error", "error": {
            "type": "overloaded_error", "message": "Overloaded"}}}]) as warm:
        warm_client = openai.AsyncOpenAI(base_url=warm.base_url, api_key="sk-live-bench",
                                         max_retries=0)
        await fsm.retrying(warm_client.chat.completions.create, model="warm-up",
                           messages=messages, settings=settings, coordinator=coord)
        await warm_client.close()
    await fsm.retrying(client.models.list, settings=settings, coordinator=coord)
    # A host that has run a while has swept its start-up heap long ago: without this, the
    # first full collection of the imports' objects (1-1.5 s on a busy 2-core machine) falls
    # on the world's onset and holds every call of the process back.
    gc.collect()
    gc.freeze()
    print(json.dumps("ready"), flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    t0 = float(line)  # epoch ms of the world's t = 0

    rows: list[list] = []

    async def session(i: int) -> None:
        traffic = Traffic(seed, i, spec["demand"])
        jitter = session_rng(seed, i, 1)  # the policy's stream in the simulation
        due = traffic.first_due()
        for k in range(calls_per_session):
            wait = due - now()
            if wait > 0:
                await asyncio.sleep(wait / 1000)
            start = now()
            ok, error = True, None
            try:
                await fsm.retrying(client.chat.completions.create, model=MODEL, messages=messages,
                                   settings=settings, coordinator=coord, on_event=count,
                                   random=jitter.random)
            except Exception as exc:  # a failed call, as the user sees it
                ok, error = False, type(exc).__name__
            end = now()
            rows.append([i, k, due, start, end, ok, error])
            if k + 1 < calls_per_session:
                due = traffic.next_due(end)

    lags: list[float] = []

    async def ticker() -> None:  # how late this process's event loop wakes a timer
        while True:
            before = now()
            await asyncio.sleep(0.05)
            lags.append(now() - before - 50)

    cpu = time.process_time()
    tick = asyncio.ensure_future(ticker())
    await asyncio.gather(*(session(i) for i in range(spec["index"], spec["sessions"],
                                                      spec["processes"])))
    tick.cancel()
    cpu = time.process_time() - cpu
    answers = dict(getattr(coord, "answers", {}))
    await client.close()
    await coord.aclose()
    lags.sort()
    return {"calls": rows, "events": events, "answers": answers, "cpu_s": cpu, "trace": trace,
            "lags_ms": [lags[int(q * (len(lags) - 1))] for q in (0.5, 0.9, 0.99, 1.0)] if lags else []}


# -- the live run --------------------------------------------------------------------------

def _stats(root_url: str) -> dict:
    with urllib.request.urlopen(root_url + "/fault/stats", timeout=30) as resp:
        return json.loads(resp.read())


NICE = -10
"""The scheduling priority of the live fleet's processes (Redis, the provider, the runners) where
permitted: a fleet's hosts are its own, while this machine may be shared with other work, whose
queue would delay every wake-up of a process by up to a second (the world's onset would reach
the provider seconds late: a harness artifact, not the fleet's behaviour). Under Linux's
autogroup scheduling a nice value orders a process only within its session, so each live process
starts a session of its own and its autogroup gets the same priority."""


def _raise_priority(pid: int) -> bool:
    """Give process ``pid`` (and its autogroup, on Linux) the priority :data:`NICE`; False where
    not permitted."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, NICE)
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/autogroup", "w") as fh:
            fh.write(str(NICE))
    except OSError:  # no autogroup scheduling here: the process's own priority is what counts
        pass
    return True


def _cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` has used so far (Linux ``/proc``), or None."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 1)
    except (OSError, ValueError, IndexError):
        return None


def run_live(scenario: Any, *, sessions: int, seed: int, processes: int,
             timeout_s: float = 600.0, trace: bool = False) -> dict:
    """Run ``scenario`` (a :class:`fsm.sim.world.Scenario`) live (see the module docstring).
    Returns ``{"calls": [...], "per_second": [[k, accepted, refused], ...] from the world's
    second 0, "capacity": C, "events", "answers", "seconds", "loop_lag_p99_ms", "traces"}``;
    with ``trace`` each runner records every request sent, answer and event (``traces``: one
    list of ``[t_ms, what, detail]`` per process), for a diagnosis. Raises ``RuntimeError``
    when a process fails or the run outlives ``timeout_s``."""
    from fsm.fleet.server import RedisServer
    from fsm.sim.world import REFUSAL_MS, SERVICE_MS, capacity_per_s

    capacity = capacity_per_s(sessions)
    started = time.monotonic()
    procs: list[subprocess.Popen] = []
    with RedisServer() as redis:
        raised = _raise_priority(redis.process.pid)
        server = subprocess.Popen(
            [sys.executable, "-m", "fsm", "fault-server", "--capacity", repr(capacity),
             "--service-ms", str(SERVICE_MS), "--refusal-ms", str(REFUSAL_MS)],
            cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        procs.append(server)
        raised = _raise_priority(server.pid) and raised
        try:
            base_url = server.stdout.readline().strip()
            if not base_url.startswith("http://"):
                raise RuntimeError(f"the fault server did not start: {server.stderr.read()[-500:]}")
            root_url = base_url.rsplit("/v1", 1)[0]
            demand = [[None if math.isinf(u) else u, f] for u, f in scenario.demand]
            workers = []
            for index in range(processes):
                spec = {"index": index, "processes": processes, "sessions": sessions,
                        "seed": seed, "calls": scenario.calls, "demand": demand,
                        "base_url": base_url, "redis": redis.url, "prefix": f"live-{seed}",
                        "trace": trace}
                workers.append(subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.live", "--worker", json.dumps(spec)],
                    cwd=ROOT, env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    text=True, start_new_session=True))
                raised = _raise_priority(workers[-1].pid) and raised
            procs.extend(workers)
            if not raised:
                print(f"[bench] live: could not raise the fleet's priority (nice {NICE}): on a "
                      "busy machine its timing suffers", file=sys.stderr)
            for proc in workers:
                line = proc.stdout.readline().strip()
                if line != '"ready"':
                    raise RuntimeError(f"a runner process did not start: {line!r}")
            ready_s = time.monotonic() - started
            t0_s = math.ceil(time.time() + LEAD_S)  # a whole second: the world's bins are the server's
            for proc in workers:
                proc.stdin.write(f"{t0_s * 1000}\n")
                proc.stdin.flush()
            results = []
            deadline = time.monotonic() + timeout_s
            for proc in workers:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
                if proc.returncode != 0:
                    raise RuntimeError(f"a runner process failed with exit status {proc.returncode}")
                results.append(json.loads(out.strip().splitlines()[-1]))
            stats = _stats(root_url)
            cpu_other = {"fault server": _cpu_s(server.pid), "redis": _cpu_s(redis.process.pid)}
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
    per_second = [[s - t0_s, a, r] for s, a, r in stats["capacity"]["per_second"] if s >= t0_s]
    events: dict[str, int] = {}
    answers: dict[str, int] = {}
    for r in results:
        for name, n in r["events"].items():
            events[name] = events.get(name, 0) + n
        for name, n in r["answers"].items():
            answers[name] = answers.get(name, 0) + n
    print(f"[bench] live: runner processes' CPU {[round(r['cpu_s'], 1) for r in results]} s, "
          f"event loop lag p50/p90/p99/max {[[round(x) for x in r['lags_ms']] for r in results]} ms; "
          f"ready after {ready_s:.1f} s; CPU of {cpu_other} s", file=sys.stderr)
    return {"calls": [c for r in results for c in r["calls"]], "per_second": per_second,
            "capacity": capacity, "events": events, "answers": answers,
            "seconds": time.monotonic() - started, "traces": [r["trace"] for r in results],
            "loop_lag_p99_ms": max((r["lags_ms"][2] for r in results if r["lags_ms"]), default=0.0)}


def live_metrics(run: dict) -> dict[str, float]:
    """The simulation's metrics (:mod:`fsm.sim.metrics`) of a live run, from the provider's
    count (requests, peak) and the calls' outcomes (failures, added latency)."""
    from fsm.sim.metrics import percentile
    from fsm.sim.world import SERVICE_MS

    calls = run["calls"]
    n = len(calls) or 1
    requests = sum(a + r for _, a, r in run["per_second"])
    latencies = sorted((end - start - SERVICE_MS) / 1000 for _, _, _, start, end, ok, _ in calls if ok)
    late = sorted(max(0.0, start - due) for _, _, due, start, _, _, _ in calls)
    return {
        "failure_rate": sum(1 for c in calls if not c[5]) / n,
        "amplification": requests / n,
        "peak_load_x_capacity": max((a + r for _, a, r in run["per_second"]), default=0) / run["capacity"],
        "added_latency_mean_s": sum(latencies) / len(latencies) if latencies else 0.0,
        "added_latency_p99_s": percentile(latencies, 99),
        "accepted": float(sum(a for _, a, _ in run["per_second"])),
        "start_late_p99_ms": percentile(late, 99),
    }


def measure(*, sessions: int = SESSIONS, seed: int = 1, processes: int = PROCESSES,
            scenario: str = WORLD) -> dict[str, float]:
    """The figures of this group (see the module docstring)."""
    from fsm.sim import SCENARIOS, simulate

    world = SCENARIOS[scenario]
    sim = simulate(scenario, "resilient", sessions=sessions, seed=seed)
    run = run_live(world, sessions=sessions, seed=seed, processes=processes)
    live = live_metrics(run)
    s = sim.metrics
    expected = sessions * world.calls
    if len(run["calls"]) != expected:
        raise RuntimeError(f"{len(run['calls'])} calls ended live, {expected} were due")
    successes = sum(1 for c in run["calls"] if c[5])
    if live["accepted"] != successes:  # each accepted request answers one successful call
        print(f"[bench] live: the provider accepted {live['accepted']:.0f} requests for "
              f"{successes} successful calls", file=sys.stderr)
    total = sum(run["answers"].values()) or 1
    print(f"[bench] live: {len(run['calls'])} calls in {run['seconds']:.0f} s; events "
          f"{run['events']}; coordinator reads {run['answers']}; load per second (live | sim) "
          f"{[a + r for _, a, r in run['per_second']][:40]} | "
          f"{[n for _, n in sim.sent_per_s][:40]}; refused per second live "
          f"{[r for _, _, r in run['per_second']][:40]}", file=sys.stderr)
    return {
        "live_vs_sim_failure_points": abs(live["failure_rate"] - s["failure_rate"]) * 100,
        "live_vs_sim_amplification": abs(live["amplification"] - s["amplification"]),
        "live_vs_sim_peak_ratio": live["peak_load_x_capacity"] / s["peak_load_x_capacity"],
        "live_failure_rate": live["failure_rate"],
        "sim_failure_rate": s["failure_rate"],
        "live_amplification": live["amplification"],
        "sim_amplification": s["amplification"],
        "live_peak_load_x_capacity": live["peak_load_x_capacity"],
        "sim_peak_load_x_capacity": s["peak_load_x_capacity"],
        "live_added_latency_mean_s": live["added_latency_mean_s"],
        "sim_added_latency_mean_s": s["added_latency_mean_s"],
        "live_start_late_p99_ms": live["start_late_p99_ms"],
        "live_loop_lag_p99_ms": run["loop_lag_p99_ms"],
        "live_unknown_share": run["answers"].get("unknown", 0) / total,
        "live_seconds": run["seconds"],
    }


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        print(json.dumps(asyncio.run(_worker(json.loads(sys.argv[2])))))
    else:
        print(json.dumps(measure()))
