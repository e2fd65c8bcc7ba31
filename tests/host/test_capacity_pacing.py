"""What teaches the shipped host's pacer (docs/fleet.md "Pacing", docs/classification.md
"Capacity signal"): the runner's kernel on the fake clock with an in-process coordinator and
pacing on, a fleet of chains whose first attempts fail at once; no real time."""

import asyncio

from fsm.core.settings import RetrySettings
from fsm.fleet import CoordKey, InProcessCoordinator
from fsm.host.runner import RetryRunner
from fsm.testing import FakeClock

KEY = CoordKey("p", "m")
CHAINS = 20


async def fleet_through(failure: str):
    """``CHAINS`` chains on one runner and one coordinator: each first attempt raises
    ``failure`` at t = 0, each retry succeeds. Returns (events, coordinator, results)."""
    clock = FakeClock()
    coordinator = InProcessCoordinator(monotonic_ms=clock.time_ms)
    events = []
    settings = RetrySettings.from_json({"retry": {"profile": "resilient"}})
    runner = RetryRunner(settings, clock=clock, coordinator=coordinator, key=KEY,
                         on_event=events.append, random=lambda: 0.5)
    attempts: dict[int, int] = {}

    def call(chain: int):
        async def fn():
            attempts[chain] = attempts.get(chain, 0) + 1
            if attempts[chain] == 1:
                raise RuntimeError(failure)
            return "ok"
        return fn

    tasks = [asyncio.ensure_future(runner.run(call(n))) for n in range(CHAINS)]
    waited = 0.0
    while not all(t.done() for t in tasks) and waited < 600:
        await clock.advance(0.1)
        waited += 0.1
    results = [await asyncio.wait_for(t, 1) for t in tasks]
    return [dict(e) for e in events], coordinator, results


def delayed_for_pacing(events):
    return [e for e in events if e["type"] == "request_delayed" and e["delaySource"] == "pacing"]


async def test_random_500s_teach_the_pacer_nothing_and_delay_no_request():
    """A fleet's random 500s (not a capacity signal) leave the pacer off: no request_delayed, every retry at its backoff (docs/fleet.md "Pacing")."""
    events, coordinator, results = await fleet_through("500 Internal Server Error")
    assert results == ["ok"] * CHAINS
    assert len([e for e in events if e["type"] == "auto_retry_start"]) == CHAINS
    assert [e for e in events if e["type"] == "request_delayed"] == []
    assert not coordinator.pacer_state(KEY).on


async def test_529s_engage_the_pacer_and_spread_the_retries():
    """A fleet's 529s (a capacity signal) turn pacing on: the retries wait for slots, told as request_delayed pacing (docs/fleet.md "Pacing")."""
    events, coordinator, results = await fleet_through("529 Overloaded")
    assert results == ["ok"] * CHAINS
    assert coordinator.pacer_state(KEY).on
    assert len(delayed_for_pacing(events)) >= CHAINS // 2


async def test_a_stall_teaches_the_pacer_nothing():
    """The stall watchdog's failure is not a capacity signal: no pacing, no request_delayed (docs/classification.md "Capacity signal")."""
    events, coordinator, _ = await fleet_through("stream stalled: no response within 30 s")
    assert [e for e in events if e["type"] == "request_delayed"] == []
    assert not coordinator.pacer_state(KEY).on


async def test_a_refused_connection_engages_the_pacer():
    """A connection refused before any answer is a capacity signal: the pacer engages (docs/classification.md "Capacity signal")."""
    events, coordinator, _ = await fleet_through(
        "Connection error. (ConnectError: [Errno 111] Connection refused)")
    assert coordinator.pacer_state(KEY).on
    assert delayed_for_pacing(events)
