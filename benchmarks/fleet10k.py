"""Ten thousand concurrent runner calls on one healthy local Redis: the fleet's bounds under
load (SPEC §15.6; docs/fleet.md "When Redis is slow or down").

One process, ``calls`` (10,000) concurrent :func:`fsm.retrying` calls sharing one
:func:`fsm.fleet.coordinator_from_url` on a throw-away ``redis-server`` (a free loopback
port, started and stopped here), every call failing with a connection reset (a full outage
of the provider), ``maxRetries`` 3, base delay 10 ms, the retry budget on (``maxTokens``
100: at most 50 retries for the fleet).

- ``fleet_admit_p99_ms_10k``: the 99th percentile of the guard's ``admit`` (what a caller
  awaits before its decision or its request: remote, unknown or local), ms;
- ``fleet_unknown_share_10k``: the share of those answers that were "unknown" (the remote's
  answer missed its bound: decided on the local share of the budget);
- ``fleet_retries_10k``: the retries sent (calls of the callable beyond the first of each
  chain); target at most twice the bucket's bound (100);
- ``fleet_unavailable_10k``: ``coordinator_unavailable`` events of the guard (target 0: a
  healthy Redis is never declared down on load alone);
- ``fleet_script_calls_10k``: the ADMIT script calls that carried those admissions (the
  calls of one loop iteration for one key are one call: a round trip each);
- ``fleet_redis_ms_per_script_10k``: the time Redis spent running one script call (its own
  ``INFO commandstats``, ``EVALSHA``'s mean), ms: Redis's share of an ``admit``; the rest of
  ``fleet_admit_p99_ms_10k`` is this process's event loop running the other chains' Python
  work (the reply of a call is read when the loop gets to it).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ._timing import percentile

MAX_TOKENS = 100


class _CountedScript:
    """The coordinator's ADMIT script with its calls counted."""

    def __init__(self, script: Any) -> None:
        self.script = script
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.script(*args, **kwargs)


class _Timed:
    """The guard with every ``admit`` timed (wall clock, ms)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.admit_ms: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def admit(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await self.inner.admit(*args, **kwargs)
        finally:
            self.admit_ms.append((time.perf_counter() - t0) * 1000)


async def _run(url: str, calls: int) -> dict[str, float]:
    import fsm
    from fsm.fleet import CoordKey, coordinator_from_url

    guard = coordinator_from_url(url, prefix=f"bench10k-{time.time_ns()}")
    await guard.warm_up()
    timed = _Timed(guard)
    script = guard.inner._scripts["admit"] = _CountedScript(guard.inner._scripts["admit"])
    await guard.inner.client.config_resetstat()
    sent = [0]

    async def provider() -> None:
        sent[0] += 1
        await asyncio.sleep(0)
        raise ConnectionResetError("Connection reset by peer")

    settings = {"maxRetries": 3, "baseDelayMs": 10, "maxDelayMs": 50,
                "budget": {"maxTokens": MAX_TOKENS}}
    key = CoordKey("bench", "fault-model")
    await asyncio.gather(*(fsm.retrying(provider, settings=settings, coordinator=timed, key=key)
                           for _ in range(calls)), return_exceptions=True)
    answers = guard.answers
    total = sum(answers.values()) or 1
    unavailable = sum(e["type"] == "coordinator_unavailable" for e in guard.breaker.events)
    evalsha = (await guard.inner.client.info("commandstats")).get("cmdstat_evalsha", {})
    await guard.aclose()
    return {"fleet_admit_p99_ms_10k": round(percentile(timed.admit_ms, 99), 2),
            "fleet_unknown_share_10k": round(answers["unknown"] / total, 4),
            "fleet_retries_10k": float(sent[0] - calls),
            "fleet_unavailable_10k": float(unavailable),
            "fleet_script_calls_10k": float(script.calls),
            "fleet_redis_ms_per_script_10k": round(float(evalsha.get("usec_per_call", 0)) / 1000, 3)}


def measure(*, calls: int = 10_000) -> dict[str, float]:
    from fsm.fleet.server import RedisServer

    with RedisServer() as server:
        return asyncio.run(_run(server.url, calls))
