"""Adversarial tests of AgentSession: random interleavings of every control, checked against
the invariants of docs/policy.md §3, plus pinned reproductions of the session bugs found that way.

The hypothesis machine drives one session on its own event loop with a FakeClock that does
*not* let the loop run when a timer fires (``settle=0``), so a control can land in every
window: before a turn ends, between the backoff timer firing and the continue starting, during
the continue. The provider answers from a random script (success, retryable, fatal, overflow,
usage limit, a hang that only an abort or a release ends, an exception); listeners and the
credential store may raise; settings change mid-chain.

Invariants checked on every event and request (docs/policy.md §3):
- every ``auto_retry_start`` is followed by exactly one ``auto_retry_end`` of its chain
  (attempts 1, 2, … in order; an end without a start only for ``maxRetries = 0``);
- ``retry_attempt`` is 0 outside a chain and 1..maxAttempts inside one;
- no request while backing off, and none before the backoff has elapsed on the clock;
- no request after a cancelled chain until a new prompt starts a new run;
- a prompt() that started a run never returns while its chain is active, and once the chain
  has ended every prompt() returns (nothing hangs);
- at most one pending backoff timer.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from fsm.core.messages import AssistantMessage
from fsm.host.session import AgentSession, SessionBusyError
from fsm.host.session_log import SessionLog
from fsm.core.settings import RetrySettings
from fsm.testing import FakeClock, ScriptedProvider, error, hang, ok

RETRYABLE = "503 Service Unavailable"
USAGE = "You have reached your usage limit. Please try again in 2h 13m"
FATAL = "401 Incorrect API key provided"
OVERFLOW = "prompt is too long: 250000 tokens > 200000 maximum"
OUTCOMES = ("ok", "retryable", "retryable", "retryable", "usage", "fatal", "overflow", "hang", "raise")


class ScriptProvider:
    """Answers from a mutable list of outcome names; records the state at every request."""

    name = "adv"
    model = "adv-model"

    def __init__(self, on_request) -> None:
        self.script: list[str] = []
        self.requests = 0
        self.release = asyncio.Event()
        self.on_request = on_request

    async def complete(self, messages, *, on_text=None, api_key=None) -> AssistantMessage:
        self.requests += 1
        self.on_request(messages)
        what = self.script.pop(0) if self.script else "ok"
        await asyncio.sleep(0)  # a real provider always awaits at least once
        if what == "hang":
            await self.release.wait()
            return AssistantMessage("stop", text="released", model=self.model)
        if what == "raise":
            raise RuntimeError("provider blew up")
        if what == "ok":
            if on_text is not None:
                on_text("hi")
            return AssistantMessage("stop", text="hi", model=self.model)
        text = {"retryable": RETRYABLE, "usage": USAGE, "fatal": FATAL, "overflow": OVERFLOW}[what]
        return AssistantMessage("error", error_message=text, model=self.model)


class FlakyStore:
    """A credential store whose usage-limit answer is scripted (True, False or an exception)."""

    def __init__(self) -> None:
        self.answers: list[object] = []

    def api_key(self, provider, session_id):
        return "key"

    def mark_usage_limit_reached(self, provider, session_id, retry_after_ms):
        answer = self.answers.pop(0) if self.answers else False
        if isinstance(answer, BaseException):
            raise answer
        return answer


class SessionMachine(RuleBasedStateMachine):
    @initialize(max_retries=st.integers(0, 3), enabled=st.booleans(),
                base=st.sampled_from([0, 10, 1000]))
    def setup(self, max_retries, enabled, base):
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock(settle=0)
        self.store = FlakyStore()
        self.provider = ScriptProvider(self.on_request)
        self.session = AgentSession(self.provider, clock=self.clock, credentials=self.store,
                                    settings=RetrySettings(enabled=enabled, max_retries=max_retries,
                                                           base_delay_ms=base))
        self.session.subscribe(self.on_event)
        self.events: list[dict] = []
        self.open_chain: dict | None = None  # {"id", "attempt", "max", "due"}: started, not ended
        self.cancelled_block = False  # a chain was cancelled: no request until a new run starts
        self.runs: list[asyncio.Task] = []  # prompt() calls that started a run
        self.others: list[asyncio.Task] = []  # queued prompts, aborts
        self.raising_listener = None
        self.violations: list[str] = []  # listener and provider failures are swallowed by the session

    def check(self, ok, what):
        if not ok:
            self.violations.append(str(what))

    # ------------------------------------------------------------ observation
    def on_event(self, event):
        self.events.append(event)
        if event["type"] == "auto_retry_start":
            chain = self.open_chain
            if chain is None:
                self.check(event["attempt"] == 1, event)
                chain = self.open_chain = {"id": event["chainId"], "attempt": event["attempt"] - 1,
                                           "max": event["maxAttempts"]}
            self.check(event["chainId"] == chain["id"], (event, chain))
            self.check(event["attempt"] == chain["attempt"] + 1, (event, chain))
            self.check(1 <= event["attempt"] <= event["maxAttempts"] == chain["max"], event)
            chain["attempt"] = event["attempt"]
            chain["due"] = self.clock.now + event["delayMs"] / 1000
        elif event["type"] == "auto_retry_end":
            chain = self.open_chain
            if event["attempt"] == 0:
                self.check(chain is None and event["success"] is False, (event, chain))
            else:
                self.check(chain is not None, f"end without a start: {event}")
                self.check(chain is not None and event.get("chainId") == chain["id"]
                           and event["attempt"] == chain["attempt"], (event, chain))
            self.open_chain = None
            if event.get("finalError") == "Retry cancelled":
                self.cancelled_block = True

    def on_request(self, messages):
        self.check(not self.session.brain.is_backing_off, "a request was sent during a backoff")
        if self.open_chain is not None:
            self.check(self.clock.now >= self.open_chain["due"] - 1e-9,
                       f"request at {self.clock.now} before the backoff ended at {self.open_chain['due']}")
        self.check(not self.cancelled_block, "a request was sent after a cancelled chain")

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    async def _ticks(self, n):
        for _ in range(n):
            await asyncio.sleep(0)

    # ------------------------------------------------------------ rules
    @rule(script=st.lists(st.sampled_from(OUTCOMES), max_size=4))
    def script_provider(self, script):
        self.provider.script.extend(script)

    @rule(answers=st.lists(st.sampled_from([True, False, OSError("store down")]), max_size=2))
    def script_store(self, answers):
        self.store.answers.extend(answers)

    @rule(behavior=st.sampled_from([None, None, "steer", "follow_up"]))
    def prompt(self, behavior):
        session = self.session

        async def call():
            busy = session.is_busy
            if not busy:
                self.cancelled_block = False  # a new run may send requests again
            try:
                await session.prompt("p", streaming_behavior=behavior)
            except SessionBusyError:
                assert busy and behavior is None
                return
            if not busy:
                # docs/policy.md §3: prompt() never returns while a chain it started is still active.
                assert not session.brain.is_retrying, session.brain
        task = self.loop.create_task(call())
        (self.runs if not session.is_busy else self.others).append(task)
        self.run(self._ticks(1))

    @rule()
    def abort_retry(self):
        self.session.abort_retry()

    @rule()
    def abort(self):
        self.others.append(self.loop.create_task(self.session.abort()))

    @rule(enabled=st.booleans())
    def set_auto_retry(self, enabled):
        self.session.set_auto_retry_enabled(enabled)

    @rule(max_retries=st.integers(0, 3))
    def change_settings(self, max_retries):
        # Mid-chain too: maxAttempts of a running chain must not change.
        current = self.session.settings
        self.session.brain.update_settings(RetrySettings(enabled=current.enabled, max_retries=max_retries,
                                                         base_delay_ms=current.base_delay_ms))

    @rule(n=st.integers(1, 6))
    def ticks(self, n):
        self.run(self._ticks(n))

    @rule(how=st.sampled_from(["due", "tiny", "zero", "long"]))
    def advance(self, how):
        pending = self.clock.pending
        if how == "due" and pending:
            delta = pending[0]
        else:
            delta = {"due": 0.0, "tiny": 0.001, "zero": 0.0, "long": 3600.0}[how]
        self.run(self.clock.advance(delta))

    @rule()
    def release_hangs(self):
        self.provider.release.set()
        self.provider.release = asyncio.Event()

    @rule()
    def toggle_raising_listener(self):
        if self.raising_listener is None:
            def boom(event):
                raise ValueError("listener bug")
            self.raising_listener = self.session.subscribe(boom)
        else:
            self.raising_listener()
            self.raising_listener = None

    # ------------------------------------------------------------ invariants
    @invariant()
    def attempt_in_range(self):
        session = getattr(self, "session", None)
        if session is None:
            return
        assert not self.violations, self.violations
        if session.is_retrying:
            assert 1 <= session.retry_attempt <= session.brain.max_attempts
        else:
            assert session.retry_attempt == 0
        assert len(self.clock.pending) <= 1, self.clock.pending

    def teardown(self):
        if not hasattr(self, "loop"):
            return
        try:
            # Let everything finish: successes from now on, hangs released, time moved on.
            self.provider.script.clear()
            self.store.answers.clear()
            for _ in range(20):
                self.provider.release.set()
                self.run(self.clock.advance(3600))
                self.run(self._ticks(5))
                if all(t.done() for t in self.runs + self.others) and not self.session.is_busy:
                    break
            hung = [t for t in self.runs + self.others if not t.done()]
            assert not hung, f"prompt()/abort() still pending after the chain ended: {self.session.brain}"
            assert self.open_chain is None, f"a chain never ended: {self.open_chain}"
            for task in self.runs + self.others:
                task.result()  # re-raise assertion failures from inside the calls
        finally:
            for task in self.runs + self.others:
                task.cancel()
            self.loop.run_until_complete(asyncio.sleep(0))
            self.loop.close()


SessionMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_session_random_interleavings = SessionMachine.TestCase


# ---------------------------------------------------------------------------------- pinned
def make(script, **retry):
    clock = FakeClock()
    provider = ScriptedProvider(script)
    session = AgentSession(provider, clock=clock, settings=RetrySettings(**retry))
    events: list[dict] = []
    session.subscribe(events.append)
    return session, provider, clock, events


async def test_lowering_max_retries_mid_chain_keeps_the_chains_max_attempts():
    """Lowering max retries mid chain keeps the chains max attempts."""
    session, provider, clock, events = make([error(RETRYABLE)] * 3, max_retries=3, base_delay_ms=10)
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(0.01)  # attempt 1 failed too: attempt 2 is backing off
    assert session.retry_attempt == 2
    session.brain.update_settings(RetrySettings(max_retries=1, base_delay_ms=10))
    await clock.advance(1)
    await asyncio.wait_for(task, 1)
    starts = [(e["attempt"], e["maxAttempts"]) for e in events if e["type"] == "auto_retry_start"]
    ends = [(e["success"], e["attempt"]) for e in events if e["type"] == "auto_retry_end"]
    assert starts == [(1, 3), (2, 3), (3, 3)] and ends == [(True, 3)]
    assert len(provider.requests) == 4


async def test_steer_between_the_timer_and_the_continue_goes_with_the_continue():
    """Steer between the timer and the continue goes with the continue."""
    clock = FakeClock(settle=0)
    provider = ScriptedProvider([error(RETRYABLE), ok()])
    session = AgentSession(provider, clock=clock, settings=RetrySettings(base_delay_ms=10))
    task = asyncio.ensure_future(session.prompt("first"))
    for _ in range(5):
        await asyncio.sleep(0)
    await clock.advance(0.01)  # the timer fired; the continue has not started yet
    assert session.brain.state == "continuing" and len(provider.requests) == 1
    await session.prompt("steer", streaming_behavior="steer")
    await asyncio.wait_for(task, 1)
    assert [m["content"] for m in provider.requests[1]] == ["first", "steer"]


async def test_abort_between_the_timer_and_the_continue_sends_nothing():
    """Abort between the timer and the continue sends nothing."""
    clock = FakeClock(settle=0)
    provider = ScriptedProvider([error(RETRYABLE), ok()])
    session = AgentSession(provider, clock=clock, settings=RetrySettings(base_delay_ms=10))
    events: list[dict] = []
    session.subscribe(events.append)
    task = asyncio.ensure_future(session.prompt("first"))
    for _ in range(5):
        await asyncio.sleep(0)
    await clock.advance(0.01)
    await asyncio.wait_for(session.abort(), 1)
    await asyncio.wait_for(task, 1)
    assert len(provider.requests) == 1
    assert events[-1] == {**events[-1], "type": "auto_retry_end", "success": False,
                          "finalError": "Retry cancelled"}


# ---------------------------------------------------------------------------------- bugs
@pytest.mark.parametrize("how", ["abort_retry", "abort"])
async def test_prompt_right_after_cancelling_a_chain_is_not_refused(how):
    """Prompt right after cancelling a chain is not refused."""
    session, provider, clock, _ = make([error(RETRYABLE)], base_delay_ms=1000)
    first = asyncio.ensure_future(session.prompt("hi"))
    await clock.settle()
    assert session.brain.is_backing_off
    if how == "abort_retry":
        session.abort_retry()
    else:
        await session.abort()
    assert not session.is_streaming and not session.is_retrying
    await session.prompt("next")  # raises SessionBusyError today (awaited directly, as documented)
    await first
    assert len(provider.requests) == 2


async def test_steer_right_after_cancelling_a_chain_is_sent():
    """Steer right after cancelling a chain is sent."""
    session, provider, clock, _ = make([error(RETRYABLE)], base_delay_ms=1000)
    first = asyncio.ensure_future(session.prompt("hi"))
    await clock.settle()
    session.abort_retry()
    await session.prompt("next", streaming_behavior="steer")
    await first
    await clock.settle()
    assert session.queued_messages == [] and len(provider.requests) == 2


async def test_prompt_with_a_lone_surrogate_is_rejected_before_anything_happens(tmp_path):
    """Prompt with a lone surrogate is rejected before anything happens."""
    log = SessionLog(tmp_path / "s.jsonl", "sid")
    provider = ScriptedProvider([])
    session = AgentSession(provider, session_log=log, clock=FakeClock())
    events: list[dict] = []
    session.subscribe(events.append)
    with pytest.raises((ValueError, TypeError)):
        await session.prompt("a\ud800b")
    assert session.messages == [] and events == []


async def test_credential_store_whose_api_key_raises_fails_the_turn_cleanly():
    """Credential store whose API key raises fails the turn cleanly."""
    class Broken:
        def api_key(self, provider, session_id):
            raise ValueError("credentials.json: not valid JSON")

        def mark_usage_limit_reached(self, *args):
            return False
    session = AgentSession(ScriptedProvider([]), clock=FakeClock(), credentials=Broken())
    events: list[dict] = []
    session.subscribe(events.append)
    await asyncio.wait_for(session.prompt("hi"), 1)  # raises ValueError today
    types = [e["type"] for e in events]
    assert types[0] == "agent_start" and types[-1] == "agent_end"
    assert session.messages[-1].stop_reason == "error"


async def test_abort_of_a_plain_turn_does_not_send_the_queued_follow_up():
    """Abort of a plain turn does not send the queued follow up."""
    provider = ScriptedProvider([hang()])
    session = AgentSession(provider, clock=FakeClock())
    first = asyncio.ensure_future(session.prompt("hi"))
    for _ in range(5):
        await asyncio.sleep(0)
    await session.prompt("later", streaming_behavior="follow_up")
    await session.abort()
    await asyncio.wait_for(first, 1)
    assert len(provider.requests) == 1 and session.queued_messages == ["later"]
