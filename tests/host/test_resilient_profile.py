"""The resilient profile in the session (docs/fleet.md "First requests", "Pacing"; docs/policy.md
§13.7): first requests admitted through the coordinator, the pacer's slot as a delay term (a
decision-time slot: a Chain host's; the session's retries take theirs at the gate,
tests/host/test_pacing_gate.py), the budget in wait mode re-checked at its slot. Everything on
the fake clock (no real time)."""

import asyncio

import pytest

from fsm.core.brain import RetryBrain, TurnFacts
from fsm.core.messages import AssistantMessage
from fsm.core.settings import RetrySettings, SettingsError
from fsm.fleet import InProcessCoordinator
from fsm.host.session import AgentSession
from fsm.testing import FakeClock, ScriptedProvider, error, ok
from session_support import of, settle

OVERLOADED = "529 Overloaded"
NOW = FakeClock.EPOCH_MS


def resilient(**keys):
    return RetrySettings.from_json({"retry": {"profile": "resilient", **keys}})


def make(settings, script=None, random=None):
    clock = FakeClock()
    provider = ScriptedProvider(script or [ok()])
    coordinator = InProcessCoordinator(monotonic_ms=clock.time_ms)
    session = AgentSession(provider, settings=settings, clock=clock, coordinator=coordinator,
                           random=random)
    events = []
    session.subscribe(events.append)
    return session, provider, clock, coordinator, events


# ------------------------------------------------------------------ the profile's values

def test_the_resilient_profile_names_itself_and_admits_first_requests():
    """`retry.profile: "resilient"` sets its values (docs/policy.md §1) and is told apart from the seed."""
    s = resilient()
    assert s.profile == "resilient" and s.admits_first_requests
    assert s.idle_timeout_ms == 300_000 and s.wait_for_usage_reset is False
    assert s.max_retries == 100 and s.max_elapsed_ms == 600_000
    seed = RetrySettings.from_json({"retry": {}})
    assert seed.profile == "seed" and not seed.admits_first_requests
    assert RetrySettings.from_json({"retry": s.to_json()}) == s


def test_an_unknown_profile_is_refused_naming_the_key():
    """A profile name that is not one of the table raises SettingsError naming retry.profile."""
    with pytest.raises(SettingsError, match="retry.profile"):
        RetrySettings(profile="turbo")


# ------------------------------------------------------------------ first requests

async def test_under_seed_a_known_cooldown_never_touches_a_first_request():
    """Seed (§8b.3): a recorded cooldown does not delay the first request."""
    session, provider, clock, coordinator, events = make(RetrySettings(retry_hints="honor"))
    await coordinator.learn_cooldown(session._coord_key(), 5_000)
    await session.prompt("hi")
    assert len(provider.requests) == 1 and not of(events, "request_delayed")


async def test_a_cooldown_delays_a_first_request_at_rest():
    """Resilient: a 5 s cooldown makes the first request wait 5 s, said in request_delayed."""
    session, provider, clock, coordinator, events = make(resilient())
    await coordinator.learn_cooldown(session._coord_key(), 5_000)
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(4.5)
    assert provider.requests == [] and not session.is_retrying and session.is_busy
    [delayed] = of(events, "request_delayed")
    assert delayed == {"type": "request_delayed", "delayMs": 5_000, "retryAt": NOW + 5_000,
                       "delaySource": "cooldown"}
    await settle(clock, task)
    assert len(provider.requests) == 1 and not of(events, "auto_retry_start")


async def test_a_cooldown_beyond_max_hint_wait_refuses_a_first_request_without_sending():
    """Resilient: every credential cooling down beyond maxHintWaitMs → one attempt-0 end."""
    session, provider, clock, coordinator, events = make(resilient())
    await coordinator.learn_cooldown(session._coord_key(), 120_000)
    outcome = await session.prompt("hi")
    assert provider.requests == []
    [end] = of(events, "auto_retry_end")
    assert (end["success"], end["attempt"], end["endReason"]) == (False, 0, "hint_too_long")
    assert end["chainId"] == session.brain.chain_id  # an end at rest names a chain of its own
    assert (outcome.message, outcome.success, outcome.end_reason, outcome.attempts) == (
        None, False, "hint_too_long", 0)
    assert not of(events, "auto_retry_start") and session.brain.state == "exhausted"


async def test_abort_during_a_first_request_wait_ends_the_turn_aborted_with_nothing_sent():
    """Resilient: abort() while the first request waits ends the turn aborted, no request."""
    session, provider, clock, coordinator, events = make(resilient())
    await coordinator.learn_cooldown(session._coord_key(), 20_000)
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(1)
    await session.abort()
    await settle(clock, task)
    assert provider.requests == []
    ends = [e for e in of(events, "message_end") if e["message"].get("role") == "assistant"]
    assert [e["message"]["stopReason"] for e in ends] == ["aborted"]
    assert not of(events, "auto_retry_end")


async def test_the_pacer_slot_delays_a_first_request():
    """Resilient with pacing on: a throttled pacer gives the next first request a slot."""
    session, provider, clock, coordinator, events = make(resilient(pacing={"minRate": 0.5}))
    key = session._coord_key()
    for _ in range(3):  # throttles learnt: the pacer paces at its floor
        await coordinator.record_outcome(key, success=False, throttled=True, budget=None,
                                         pacing=session.settings.pacing)
    await coordinator.admit(key, retry=False, budget=None, pacing=session.settings.pacing)
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(0.01)
    [delayed] = of(events, "request_delayed")
    assert delayed["delaySource"] == "pacing" and delayed["delayMs"] > 0
    assert provider.requests == []
    await settle(clock, task)
    assert len(provider.requests) == 1


# ------------------------------------------------------------------ retries: pacing and budget

def test_the_pacer_slot_decides_a_retry_delay_when_it_is_the_longest():
    """delay = max(backoff, hint/cooldown, decision-time pacer slot); delaySource names the pacer."""
    brain = RetryBrain(RetrySettings(base_delay_ms=1_000))
    actions = brain.turn_ended(AssistantMessage("error", error_message=OVERLOADED),
                               facts=TurnFacts(now_ms=NOW, pacing_ms=7_000))
    [start] = [a.event for a in actions if getattr(getattr(a, "event", None), "type", "") == "auto_retry_start"]
    assert (start.delay_ms, start.delay_source, start.retry_at_ms) == (7_000, "pacing", NOW + 7_000)


async def test_a_throttle_is_told_to_the_pacer():
    """Every retryable failure without progress is a capacity signal for the shared pacer: it
    hears the throttle (a lone one: counted, pacing not engaged, SPEC §15.7)."""
    session, provider, clock, coordinator, events = make(
        resilient(pacing={}), [error(OVERLOADED), ok()])
    task = asyncio.ensure_future(session.prompt("hi"))
    await settle(clock, task)
    await session.close()
    state = coordinator.pacer_state(session._coord_key())
    assert state.thr_cur + state.thr_prev == 1 and not state.on
    assert of(events, "auto_retry_end")[-1]["success"] is True


async def test_a_retry_the_budget_cannot_afford_waits_for_its_floor_slot():
    """Budget in wait mode: a refused retry waits (delaySource budget) and goes at its slot."""
    # no jitter and a fixed random source (the floor's re-check is jittered): a wait long enough
    # would find the floor's slot free already, and the test would not test the wait
    settings = resilient(jitter="none", budget={"maxTokens": 1, "tokenRatio": 0.1, "mode": "wait",
                                                "minRetriesPerSecond": 0.2})
    session, provider, clock, coordinator, events = make(
        settings, [error(OVERLOADED), error(OVERLOADED), ok()], random=lambda: 0.5)
    task = asyncio.ensure_future(session.prompt("hi"))
    await settle(clock, task)
    starts = of(events, "auto_retry_start")
    assert "budget" in [s["delaySource"] for s in starts]
    assert len(starts) == 2  # the wait for the budget starts no new attempt
    assert of(events, "auto_retry_end")[-1]["success"] is True and len(provider.requests) == 3


# ------------------------------------------------------------------ the runner

async def test_the_runner_admits_a_first_call_through_the_coordinator():
    """Resilient runner: a known cooldown delays the first call (request_delayed); beyond
    maxHintWaitMs the call is refused without being made (RetryChainError, calls 0)."""
    from fsm.fleet import CoordKey
    from fsm.host.runner import RetryChainError, RetryRunner

    clock = FakeClock()
    coordinator = InProcessCoordinator(monotonic_ms=clock.time_ms)
    key = CoordKey("p", "m")
    events, calls = [], []
    runner = RetryRunner(resilient(), clock=clock, coordinator=coordinator, key=key,
                         on_event=events.append)

    async def fn():
        calls.append(clock.time_ms())
        return "done"

    await coordinator.learn_cooldown(key, 3_000)
    task = asyncio.ensure_future(runner.run(fn))
    await settle(clock, task)
    assert task.result() == "done" and calls == [NOW + 3_000]
    assert [dict(e) for e in events if e["type"] == "request_delayed"] == [
        {"type": "request_delayed", "delayMs": 3_000, "retryAt": NOW + 3_000, "delaySource": "cooldown"}]

    await coordinator.learn_cooldown(key, 120_000)
    with pytest.raises(RetryChainError) as raised:
        await runner.run(fn)
    assert (raised.value.end_reason, raised.value.calls, raised.value.__cause__) == ("hint_too_long", 0, None)
    assert len(calls) == 1
    assert [e["attempt"] for e in events if e["type"] == "auto_retry_end"] == [0]


async def test_the_runner_retry_waits_for_the_budget_floor_slot():
    """Resilient runner, budget in wait mode: a refused retry waits for its slot, then goes."""
    from fsm.host.runner import RetryRunner

    clock = FakeClock()
    # no jitter and a fixed random source (the floor's re-check is jittered): a wait long enough
    # would find the floor's slot free already, and the test would not test the wait
    settings = resilient(jitter="none", budget={"maxTokens": 1, "tokenRatio": 0.1, "mode": "wait",
                                                "minRetriesPerSecond": 0.2})
    events, answers = [], [RuntimeError("529 Overloaded"), RuntimeError("529 Overloaded"), "ok"]
    runner = RetryRunner(settings, clock=clock, on_event=events.append, random=lambda: 0.5,
                         coordinator=InProcessCoordinator(monotonic_ms=clock.time_ms))

    async def fn():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    task = asyncio.ensure_future(runner.run(fn))
    await settle(clock, task)
    assert task.result() == "ok"
    sources = [e["delaySource"] for e in events if e["type"] == "auto_retry_start"]
    assert len(sources) == 2 and "budget" in sources
