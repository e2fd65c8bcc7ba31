"""The pacing gate (docs/fleet.md "Pacing"): every request takes the fleet pacer's slot right
before it goes — a retry once its backoff is over, not at its decision. The session and the
runner on the fake clock with an in-process coordinator (no real time)."""

import asyncio

import pytest

from fsm.core.settings import RetrySettings
from fsm.fleet import Admission, CoordKey, InProcessCoordinator
from fsm.host.kernel import HostKernel
from fsm.core.brain import RetryBrain
from fsm.host.session import AgentSession
from fsm.testing import FakeClock, ScriptedProvider, error, ok
from session_support import of, settle as _settle

OVERLOADED = "529 Overloaded"
NOW = FakeClock.EPOCH_MS


def resilient(**keys):
    return RetrySettings.from_json({"retry": {"profile": "resilient", **keys}})


Answer = Admission  # an ``admit`` answer as a coordinator of protocol v3 gives it


class GateCoordinator(InProcessCoordinator):
    """The in-process coordinator, with the gate's answers (``admit`` with ``retry=False``
    and pacing) scripted when ``answers`` holds some; every ``admit`` call is recorded."""

    def __init__(self, clock, answers=()):
        super().__init__(monotonic_ms=clock.time_ms)
        self.clock = clock
        self.answers = list(answers)
        self.calls = []  # (fake seconds, retry, pacing given)
        self.decision_slot_ms = None  # a retry's decision with pacing gets this slot

    async def admit(self, key, *, retry, budget, pacing, earliest_ms=0, floor_slot_due=False,
                    max_wait_ms=None):
        self.calls.append((self.clock.now, retry, pacing is not None))
        if not retry and pacing is not None and self.answers:
            return self.answers.pop(0)
        if retry and pacing is not None and self.decision_slot_ms is not None:
            return Answer(budget=True, pacing_ms=self.decision_slot_ms)
        return await super().admit(key, retry=retry, budget=budget, pacing=pacing,
                                   earliest_ms=earliest_ms, floor_slot_due=floor_slot_due,
                                   max_wait_ms=max_wait_ms)

    def gate_calls(self):
        """The fake times of the gate's asks (``admit`` with ``retry=False``)."""
        return [at for at, retry, _ in self.calls if not retry]


def make(settings, script, coordinator=None, answers=()):
    clock = FakeClock()
    sent = []  # fake seconds of every request
    provider = ScriptedProvider(script, on_request=lambda _: sent.append(clock.now))
    coordinator = coordinator or GateCoordinator(clock, answers)
    session = AgentSession(provider, settings=settings, clock=clock, coordinator=coordinator,
                           random=lambda: 0.5)
    events = []
    session.subscribe(events.append)
    return session, clock, coordinator, events, sent


async def settle(clock, task):
    """Advance the fake clock in 0.1 s steps until ``task`` is done (2 min at most)."""
    await _settle(clock, task, step=0.1, limit=120.0)


async def until(clock, predicate, step=0.1, limit=60.0):
    waited = 0.0
    while not predicate() and waited < limit:
        await clock.advance(step)
        waited += step
    assert predicate()


# ------------------------------------------------------------------ the session

async def test_a_retry_waits_for_the_pacer_slot_after_its_backoff_then_goes():
    """The retry asks the pacer once its backoff is over: request_delayed (pacing), then the request."""
    pacing = {"minRate": 2}  # one request per 500 ms while pacing
    session, clock, coordinator, events, sent = make(resilient(pacing=pacing),
                                                     [error(OVERLOADED), ok()])
    key = session._coord_key()
    # another process of the fleet heard a throttle just before: with the session's 529 the
    # key hears two in a second, more than a lone one (SPEC §15.7), so pacing engages
    await coordinator.record_outcome(key, success=False, throttled=True, budget=None,
                                     pacing=session.settings.pacing)
    assert not coordinator.pacer_state(key).on
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(0.1)  # the 529 came back: the pacer paces; the backoff runs
    [start] = of(events, "auto_retry_start")
    assert start["delaySource"] == "backoff" and start["delayMs"] > 100
    assert coordinator.pacer_state(key).on
    # two other requests of the fleet take the next slots meanwhile
    for _ in range(2):
        await coordinator.admit(key, retry=False, budget=None, pacing=session.settings.pacing)
    backoff_end = start["retryAt"]
    await until(clock, lambda: of(events, "request_delayed"))
    [delayed] = of(events, "request_delayed")
    assert delayed["delaySource"] == "pacing" and delayed["delayMs"] > 0
    assert delayed["retryAt"] >= backoff_end + delayed["delayMs"] - 1
    assert len(sent) == 1 and session.is_retrying  # waiting at the gate: nothing sent yet
    await settle(clock, task)
    assert len(sent) == 2 and NOW + round(sent[1] * 1000) >= delayed["retryAt"]
    assert of(events, "auto_retry_end")[-1]["success"] is True


async def test_a_first_request_without_a_slot_asks_again_at_rest():
    """Resilient first request, not booked: request_delayed at rest for the re-check, then booked and sent."""
    session, clock, coordinator, events, sent = make(
        resilient(pacing={"recheckMs": 2_000}), [ok()],
        answers=[Answer(pacing_booked=False), Answer()])
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(1.9)
    assert of(events, "request_delayed") == [{"type": "request_delayed", "delayMs": 2_000,
                                              "retryAt": NOW + 2_000, "delaySource": "pacing"}]
    assert sent == [] and not session.is_retrying
    await settle(clock, task)
    assert sent == [pytest.approx(2.0)] and coordinator.gate_calls() == [0.0, pytest.approx(2.0)]


async def test_pacing_without_the_profile_paces_first_requests_but_no_cooldown_holds_them():
    """Seed profile + pacing: a first request takes its pacer slot at the gate too (every
    request is paced), while a known cooldown never delays nor refuses it (docs/policy.md §8b)."""
    settings = RetrySettings.from_json({"retry": {"retryHints": "honor", "pacing": {}}})
    session, clock, coordinator, events, sent = make(
        settings, [ok()], answers=[Answer(cooldown_ms=600_000, pacing_ms=1_500)])
    task = asyncio.ensure_future(session.prompt("hi"))
    await settle(clock, task)
    assert of(events, "request_delayed") == [{"type": "request_delayed", "delayMs": 1_500,
                                              "retryAt": NOW + 1_500, "delaySource": "pacing"}]
    assert sent == [pytest.approx(1.5)] and not of(events, "auto_retry_end")


async def test_the_retry_decision_reserves_no_pacing_slot():
    """Decision time: the coordinator is asked for cooldown and budget with pacing None; the delay never says pacing."""
    session, clock, coordinator, events, sent = make(resilient(), [error(OVERLOADED), ok()])
    task = asyncio.ensure_future(session.prompt("hi"))
    await settle(clock, task)
    decisions = [(retry, paced) for _, retry, paced in coordinator.calls if retry]
    assert decisions == [(True, False)]
    assert [s["delaySource"] for s in of(events, "auto_retry_start")] == ["backoff"]


async def test_no_slot_within_the_horizon_asks_again_after_the_jittered_recheck():
    """Not booked: request_delayed for the re-check (recheckMs × U(0.5, 1.5), here ×1), then booked and sent."""
    settings = resilient(pacing={"recheckMs": 4_000})
    session, clock, coordinator, events, sent = make(
        settings, [error(OVERLOADED), ok()],
        answers=[Answer(), Answer(pacing_booked=False), Answer(pacing_ms=0)])  # first request, retry ×2
    task = asyncio.ensure_future(session.prompt("hi"))
    await until(clock, lambda: of(events, "request_delayed"))
    [start] = of(events, "auto_retry_start")
    [delayed] = of(events, "request_delayed")
    asked = coordinator.gate_calls()[1]
    assert delayed == {"type": "request_delayed", "delayMs": 4_000,
                       "retryAt": NOW + round(asked * 1000) + 4_000, "delaySource": "pacing"}
    assert asked * 1000 >= start["delayMs"]  # asked once the backoff was over
    await clock.advance(3.9)
    assert len(sent) == 1  # still waiting for the re-check
    await settle(clock, task)
    assert coordinator.gate_calls()[1:] == [asked, pytest.approx(asked + 4.0, abs=0.11)]
    assert len(sent) == 2 and sent[1] == pytest.approx(asked + 4.0, abs=0.11)
    assert len(of(events, "request_delayed")) == 1  # booked at once: no second wait


@pytest.mark.parametrize("how", ["abort", "abort_retry"])
async def test_an_abort_during_a_retry_wait_at_the_gate_sends_nothing(how):
    """abort()/abort_retry() while a retry waits for its slot: the turn ends aborted, the chain cancelled, no request."""
    session, clock, coordinator, events, sent = make(
        resilient(), [error(OVERLOADED), ok()],
        answers=[Answer(), Answer(pacing_ms=20_000)])
    task = asyncio.ensure_future(session.prompt("hi"))
    await until(clock, lambda: of(events, "request_delayed"))
    if how == "abort":
        await session.abort()
    else:
        session.abort_retry()
    await settle(clock, task)
    assert len(sent) == 1
    [end] = of(events, "auto_retry_end")
    assert (end["success"], end["endReason"]) == (False, "cancelled")
    stops = [e["message"]["stopReason"] for e in of(events, "message_end")
             if e["message"].get("role") == "assistant"]
    assert stops == ["error", "aborted"] and clock.pending == []


async def test_retry_now_during_the_backoff_bypasses_the_gate():
    """retry_now() in the backoff: that retry goes at once without asking the gate."""
    session, clock, coordinator, events, sent = make(
        resilient(), [error(OVERLOADED), ok()],
        answers=[Answer(), Answer(pacing_ms=20_000)])
    task = asyncio.ensure_future(session.prompt("hi"))
    await until(clock, lambda: session.brain.is_backing_off)
    at = clock.now
    session.retry_now()
    await settle(clock, task)
    assert len(sent) == 2 and sent[1] == at
    assert coordinator.gate_calls() == [0.0] and not of(events, "request_delayed")


async def test_retry_now_during_a_wait_at_the_gate_sends_at_once():
    """retry_now() while the retry waits for its pacer slot: the request goes now."""
    session, clock, coordinator, events, sent = make(
        resilient(), [error(OVERLOADED), ok()],
        answers=[Answer(), Answer(pacing_ms=20_000)])
    task = asyncio.ensure_future(session.prompt("hi"))
    await until(clock, lambda: of(events, "request_delayed"))
    at = clock.now
    session.retry_now()
    await settle(clock, task)
    assert len(sent) == 2 and sent[1] == at
    assert of(events, "auto_retry_end")[-1]["success"] is True


async def test_the_deadline_reached_at_the_gate_ends_the_chain_as_during_an_attempt():
    """maxElapsedMs passing while a retry waits for its slot: auto_retry_end deadline, no request."""
    session, clock, coordinator, events, sent = make(
        resilient(maxElapsedMs=5_000), [error(OVERLOADED), ok()],
        answers=[Answer(), Answer(pacing_ms=20_000)])
    task = asyncio.ensure_future(session.prompt("hi"))
    await settle(clock, task)
    assert len(sent) == 1
    [end] = of(events, "auto_retry_end")
    assert (end["success"], end["endReason"]) == (False, "deadline")
    assert "maxElapsedMs" in end["finalError"] and not session.is_retrying


async def test_the_seed_profile_asks_no_gate_and_keeps_its_figures():
    """Seed (hints honoured, no pacing): no gate call, no request_delayed, the backoff of docs/policy.md §1."""
    session, clock, coordinator, events, sent = make(
        RetrySettings(retry_hints="honor"), [error(OVERLOADED), error(OVERLOADED), ok()])
    task = asyncio.ensure_future(session.prompt("hi"))
    await settle(clock, task)
    assert coordinator.gate_calls() == [] and not of(events, "request_delayed")
    starts = [(s["attempt"], s["delayMs"], s["delaySource"]) for s in of(events, "auto_retry_start")]
    assert starts == [(1, 2_000, "backoff"), (2, 4_000, "backoff")]
    assert sent == [0.0, 2.0, 6.0]


# ------------------------------------------------------------------ the runner

def runner_for(settings, answers, script):
    from fsm.host.runner import RetryRunner

    clock = FakeClock()
    coordinator = GateCoordinator(clock, answers)
    events, calls = [], []
    runner = RetryRunner(settings, clock=clock, coordinator=coordinator, key=CoordKey("p", "m"),
                         on_event=events.append, random=lambda: 0.5)
    answers_left = list(script)

    async def fn():
        calls.append(clock.now)
        answer = answers_left.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer
    return runner, fn, clock, coordinator, events, calls


async def test_the_runner_retry_waits_for_its_pacer_slot_after_the_backoff():
    """Runner: after the backoff the retry asks the gate, waits its slot (request_delayed pacing), then calls."""
    runner, fn, clock, coordinator, events, calls = runner_for(
        resilient(), [Answer(), Answer(pacing_ms=1_500)], [RuntimeError(OVERLOADED), "ok"])
    task = asyncio.ensure_future(runner.run(fn))
    await settle(clock, task)
    assert task.result() == "ok"
    [start] = [dict(e) for e in events if e["type"] == "auto_retry_start"]
    [delayed] = [dict(e) for e in events if e["type"] == "request_delayed"]
    backoff = start["delayMs"] / 1000
    assert delayed == {"type": "request_delayed", "delayMs": 1_500,
                       "retryAt": start["retryAt"] + 1_500, "delaySource": "pacing"}
    assert calls == [0.0, pytest.approx(backoff + 1.5)]
    assert coordinator.gate_calls() == [0.0, pytest.approx(backoff)]


async def test_the_runner_chain_ends_deadline_when_it_passes_at_the_gate():
    """Runner: maxElapsedMs passing while the retry waits at the gate: RetryChainError deadline, no call."""
    from fsm.host.runner import RetryChainError

    runner, fn, clock, coordinator, events, calls = runner_for(
        resilient(maxElapsedMs=5_000), [Answer(), Answer(pacing_ms=20_000)],
        [RuntimeError(OVERLOADED), "ok"])
    task = asyncio.ensure_future(runner.run(fn))
    waited = 0.0
    while not task.done() and waited < 60:
        await clock.advance(0.1)
        waited += 0.1
    with pytest.raises(RetryChainError) as raised:
        await task
    assert raised.value.end_reason == "deadline" and calls == [0.0]
    assert clock.now == pytest.approx(5.0, abs=0.11)


async def test_the_seed_runner_asks_no_gate():
    """Runner under seed with hints honoured: no gate call, no request_delayed."""
    runner, fn, clock, coordinator, events, calls = runner_for(
        RetrySettings(retry_hints="honor"), [], [RuntimeError(OVERLOADED), "ok"])
    task = asyncio.ensure_future(runner.run(fn))
    await settle(clock, task)
    assert task.result() == "ok" and calls == [0.0, 2.0]
    assert coordinator.gate_calls() == []
    assert not [e for e in events if e["type"] == "request_delayed"]


async def test_a_chain_host_passes_the_gate_after_its_backoff_as_the_runner_does():
    """Chain (docs/fleet.md "The gate"): the decision reserves no slot; once the backoff is
    over, resume() asks the gate, tells request_delayed and answers the slot's wait."""
    from fsm.host.chain import Chain

    clock = FakeClock()
    coordinator = GateCoordinator(clock, [Answer(pacing_ms=9_000)])
    events = []
    chain = Chain(resilient(baseDelayMs=100), coordinator=coordinator, clock=clock,
                  random=lambda: 0.5, on_event=events.append)
    backoff = await chain.failed(RuntimeError(OVERLOADED))
    assert backoff is not None and backoff < 9_000
    assert [(retry, paced) for _, retry, paced in coordinator.calls] == [(True, False)]
    assert await chain.resume() == 9_000
    assert [(retry, paced) for _, retry, paced in coordinator.calls][1:] == [(False, True)]
    assert [e["delayMs"] for e in events if e["type"] == "request_delayed"] == [9_000]
    assert await chain.resume() is None  # booked: the retry goes once the slot's wait is over
    await chain.aclose()


# ------------------------------------------------------------------ the kernel

@pytest.mark.parametrize("draw, expected", [(0.0, 1_500), (0.5, 3_000), (0.999, 4_497)])
async def test_the_kernel_jitters_the_recheck_with_the_random_source(draw, expected):
    """pace(): not booked → (cooldown, recheckMs × (0.5 + random()), False), from the source given."""
    clock = FakeClock()
    settings = resilient(pacing={"recheckMs": 3_000})
    coordinator = GateCoordinator(clock, [Answer(pacing_booked=False)])
    kernel = HostKernel(RetryBrain(settings), emit=lambda e: None, clock=clock,
                        coordinator=coordinator, key=lambda: CoordKey("p", "m"),
                        random=lambda: draw, paces_at_send=True)
    assert await kernel.pace() == (0, expected, False)


async def test_the_kernel_gate_never_raises_for_a_failing_coordinator():
    """pace(): a coordinator whose admit raises (and a local state that fails too) lets the request go."""
    clock = FakeClock()

    class Broken(GateCoordinator):
        async def admit(self, *args, **kwargs):
            raise RuntimeError("down")

    broken = Broken(clock)
    broken.fallback = Broken(clock)  # its local state fails too
    kernel = HostKernel(RetryBrain(resilient()), emit=lambda e: None, clock=clock,
                        coordinator=broken, key=lambda: CoordKey("p", "m"), paces_at_send=True)
    assert await kernel.pace() == (0, 0, True)


async def test_an_abort_at_the_gate_gives_the_unsent_answer_its_message_start():
    """Abort during a first request's wait: the aborted assistant message has a message_start
    before its message_end (every assistant message_end has one), and nothing is sent."""
    session, clock, coordinator, events, sent = make(
        resilient(), [ok()], answers=[Answer(pacing_ms=5_000)])
    task = asyncio.ensure_future(session.prompt("hi"))
    await until(clock, lambda: of(events, "request_delayed"))
    session.abort_retry()
    await settle(clock, task)
    assistant = [e["type"] for e in events if e["type"] in ("message_start", "message_end")
                 and e["message"].get("role") == "assistant"]
    assert assistant == ["message_start", "message_end"] and sent == []


class SlowGate(GateCoordinator):
    """The gate's ``admit`` (after the first request's) waits until released: a Redis round trip."""

    def __init__(self, clock):
        super().__init__(clock)
        self.release = asyncio.Event()
        self.pending = False

    async def admit(self, key, *, retry, budget, pacing, **kwargs):
        if not retry and [c for c in self.calls if not c[1]]:
            self.calls.append((self.clock.now, retry, pacing is not None))
            self.pending = True
            await self.release.wait()
            self.pending = False
            return Answer(pacing_ms=2_000)
        return await super().admit(key, retry=retry, budget=budget, pacing=pacing, **kwargs)


@pytest.mark.parametrize("how, requests, success", [("abort_retry", 1, False), ("retry_now", 2, True)])
async def test_abort_retry_or_retry_now_while_the_gate_asks_the_coordinator_is_not_lost(
        how, requests, success):
    """abort_retry() while the retry's gate is still asking the coordinator: nothing more is
    sent once the answer comes; retry_now() then: the retry goes at once, not after the slot."""
    clock = FakeClock()
    coordinator = SlowGate(clock)
    session, clock, coordinator, events, sent = make(resilient(), [error(OVERLOADED), ok()],
                                                     coordinator=coordinator)
    task = asyncio.ensure_future(session.prompt("hi"))
    await until(clock, lambda: coordinator.pending)
    asked = clock.now
    getattr(session, how)()
    coordinator.release.set()
    await settle(clock, task)
    assert len(sent) == requests and of(events, "auto_retry_end")[-1]["success"] is success
    if how == "retry_now":
        assert sent[-1] == pytest.approx(asked, abs=0.2)  # not 2 s later at the slot
