"""AgentSession and the v2 host contract and policy (docs/policy.md §3, §4, §8 items 11-13).

Each test replays one reported problem through the session with the fake clock; the name says
which. Regression tests for the host contract (a store that raises or blocks, a cancelled
prompt's trace row, the event order) are here too.
"""

import asyncio
import json
import threading

import pytest

from fsm.core import lifecycle as L
from fsm.host.credentials import InMemoryCredentialStore
from fsm.host.session import AgentSession
from fsm.core.settings import RetrySettings
from fsm.testing import FakeClock, Outcome, ScriptedProvider, error, hang, ok
from session_support import of, run, settle

OVERLOADED = "529 Overloaded"


def make(script, credentials=None, **settings):
    clock = FakeClock()
    provider = ScriptedProvider(script)
    session = AgentSession(provider, settings=RetrySettings(**settings), clock=clock,
                           credentials=credentials)
    events = []
    session.subscribe(events.append)
    return session, provider, clock, events


# ------------------------------------------------------------------ the six reports

async def test_hint_of_6_379_s_is_waited_out_with_honor_and_no_request_goes_out_before():
    """Hint of 6 379's is waited out with honor and no request goes out before."""
    text = "429 Rate limit reached for gpt-4o-mini on requests per min. Please try again in 6.379s."
    session, provider, clock, events = make([error(text), ok()], retry_hints="honor")
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.settle()
    assert clock.pending == [6.379]
    await clock.advance(6.378)
    assert len(provider.requests) == 1, "no request before the server's time"
    await clock.advance(0.001)
    await asyncio.wait_for(task, 1)
    assert len(provider.requests) == 2
    start = of(events, "auto_retry_start")[0]
    assert start["delaySource"] == "hint" and start["retryAt"] == FakeClock.EPOCH_MS + 6379


async def test_hint_of_6_379_s_with_the_seed_defaults_keeps_the_seed_backoff():
    """Hint of 6 379's with the seed defaults keeps the seed backoff."""
    text = "429 Rate limit reached. Please try again in 6.379s."
    session, provider, clock, events = make([error(text), error(text), ok()])
    await run(session, clock)
    assert [e["delayMs"] for e in of(events, "auto_retry_start")] == [2000, 4000]


async def test_quota_reset_in_58_hours_sends_no_second_request_with_honor():
    """Quota reset in 58 hours sends no second request with honor."""
    session, provider, clock, events = make([error("429 You exceeded your current quota. "
                                                   "Please try again in 58 hours.")],
                                            retry_hints="honor")
    await session.prompt("hi")
    assert len(provider.requests) == 1
    end = of(events, "auto_retry_end")[0]
    assert end["endReason"] == "hint_too_long" and end["attempt"] == 0
    assert "retry.maxHintWaitMs = 1 min" in end["finalError"]


async def test_codex_usage_limit_resets_in_9568_s_ends_at_once_with_honor():
    """Codex usage limit resets in 9568's ends at once with honor."""
    text = ('{"error":{"type":"usage_limit_reached","message":"The usage limit has been reached",'
            '"resets_in_seconds":9568}}')
    session, provider, clock, events = make([error(text)], retry_hints="honor")
    await session.prompt("hi")
    assert len(provider.requests) == 1
    assert of(events, "auto_retry_end")[0]["endReason"] == "hint_too_long"


async def test_queue_expiry_of_900_s_is_bounded_by_the_chain_deadline():
    """Queue expiry of 900's is bounded by the chain deadline."""
    slow = Outcome("error", error_message="503 Service Unavailable: queue expired", hang=False)
    session, provider, clock, events = make([slow] * 4, max_elapsed_ms=10_000)
    waited = await run(session, clock)
    end = of(events, "auto_retry_end")[0]
    assert end["endReason"] == "deadline" and waited <= 10
    assert len(provider.requests) == 3, "2 s and 4 s fit in 10 s; the third retry (8 s) would not"


async def test_five_credentials_four_limited_every_key_is_tried():
    """Five credentials four limited every key is tried."""
    store = InMemoryCredentialStore({"scripted": ["k1", "k2", "k3", "k4", "k5"]})
    usage = error("You have hit your usage limit. Try again in 5h8m26s")
    session, provider, clock, events = make([usage] * 4 + [ok("fifth key")], credentials=store)
    await run(session, clock)
    assert provider.api_keys == ["k1", "k2", "k3", "k4", "k5"]
    starts = of(events, "auto_retry_start")
    assert [(s["attempt"], s["maxAttempts"], s["delaySource"]) for s in starts] == \
        [(n, 7, "switch") for n in range(1, 5)]
    assert of(events, "auto_retry_end")[0]["success"] is True


async def test_per_day_quota_429_reaches_the_credential_store():
    """Per day quota 429 reaches the credential store."""
    store = InMemoryCredentialStore({"scripted": ["k1", "k2"]})
    text = ("429 Rate limit exceeded: free-models-per-day. Add 10 credits to unlock 1000 free "
            "model requests per day; retry-after-ms=57071146")
    session, provider, clock, events = make([error(text), ok()], credentials=store)
    await run(session, clock)
    assert provider.api_keys == ["k1", "k2"]
    assert of(events, "auto_retry_start")[0]["delaySource"] == "switch"


async def test_partial_output_then_failure_is_marked_discarded():
    """Partial output then failure is marked discarded."""
    class Streams(ScriptedProvider):
        async def complete(self, messages, *, on_text=None, api_key=None):
            if not self.requests and on_text is not None:
                on_text("Here is the plan: step 1, ")
            return await super().complete(messages, on_text=on_text, api_key=api_key)
    clock = FakeClock()
    session = AgentSession(Streams([error(OVERLOADED), ok("Here is the plan: all of it")]), clock=clock)
    events = []
    session.subscribe(events.append)
    await run(session, clock)
    start = of(events, "auto_retry_start")[0]
    assert start["discardsOutput"] is True
    deltas = [e["assistantMessageEvent"]["type"] for e in of(events, "message_update")]
    assert deltas[:3] == ["text_start", "text_delta", "text_end"]


async def test_after_output_stop_ends_a_chain_whose_turn_streamed():
    """After output stop ends a chain whose turn streamed."""
    class Streams(ScriptedProvider):
        async def complete(self, messages, *, on_text=None, api_key=None):
            on_text("partial ")
            return await super().complete(messages, on_text=on_text, api_key=api_key)
    clock = FakeClock()
    session = AgentSession(Streams([error(OVERLOADED)]), clock=clock,
                           settings=RetrySettings(after_output="stop"))
    events = []
    session.subscribe(events.append)
    await session.prompt("hi")
    assert of(events, "auto_retry_end")[0]["endReason"] == "output_streamed"


async def test_retry_now_during_a_long_backoff_retries_within_one_loop_tick():
    """Retry now during a long backoff retries within one loop tick."""
    session, provider, clock, events = make([error(OVERLOADED), ok()], base_delay_ms=60_000)
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.settle()
    assert session.brain.is_backing_off
    session.retry_now()
    assert clock.pending == [], "the backoff timer is cancelled"
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(provider.requests) == 2
    await asyncio.wait_for(task, 1)
    assert len(of(events, "auto_retry_start")) == 1, "retry now emits no new auto_retry_start"
    session.retry_now()  # ignored at rest
    assert session.brain.state == "succeeded"


# ------------------------------------------------------------------ the host contract

async def test_event_order_failed_turn_then_retry_start_then_successful_retry():
    """Event order failed turn then retry start then successful retry."""
    session, provider, clock, events = make([error(OVERLOADED), ok("fine")])
    await run(session, clock)
    types = [e["type"] for e in events if e["type"] not in ("message_update",)]
    assert types == [
        "agent_start", "turn_start", "message_start", "message_end", "message_start",
        "message_end", "turn_end", "agent_end", "auto_retry_start",
        "agent_start", "turn_start", "message_start", "message_end", "auto_retry_end",
        "turn_end", "agent_end"]  # pi's order: the chain's end, then turn_end beside agent_end
    assert of(events, "message_start")[1]["message"]["role"] == "assistant"


async def test_a_raising_credential_store_never_leaves_the_chain_without_its_actions():
    """A raising credential store never leaves the chain without its actions."""
    class Raising:
        def api_key(self, provider, session_id):
            return None

        def mark_usage_limit_reached(self, *a):
            raise RuntimeError("store exploded")
    session, provider, clock, events = make([error("usage limit reached"), ok()], credentials=Raising())
    await run(session, clock)
    start = of(events, "auto_retry_start")[0]
    assert start["delayMs"] == 2000 and "credential store failed" in start["note"]
    assert of(events, "auto_retry_end")[0]["success"] is True


async def test_a_store_holding_its_lock_for_5_s_stalls_neither_the_chain_nor_the_loop():
    """A store holding its lock for 5's stalls neither the chain nor the loop."""
    held = threading.Event()

    class Locked:
        blocking = True

        def api_key(self, provider, session_id):
            return None

        def mark_usage_limit_reached(self, *a):
            held.wait(5)  # a lock held by another process for 5 s (runs off the loop)
            return True
    clock = FakeClock()
    session = AgentSession(ScriptedProvider([error("usage limit reached"), ok()]), clock=clock,
                           credentials=Locked())
    loop = asyncio.get_running_loop()
    fired = loop.create_future()
    planned = loop.time() + 0.02
    loop.call_at(planned, lambda: fired.set_result(loop.time()))
    task = asyncio.ensure_future(session.prompt("hi"))
    late = await asyncio.wait_for(fired, 1) - planned
    assert late < 0.5, f"the event loop stalled for {late:.3f} s"
    for _ in range(200):  # the 50 ms store timeout passes in real time, then the decision
        if session.brain.is_backing_off:
            break
        await asyncio.sleep(0.01)
    assert session.brain.is_backing_off and clock.pending == [2.0]
    await clock.advance(2)
    await asyncio.wait_for(task, 1)
    held.set()  # let the worker thread go so the loop closes at once


async def test_a_cancelled_prompt_task_records_its_own_trace_row():
    """A cancelled prompt task records its own trace row."""
    seen = []
    with L.recording(lambda owner, record: seen.append(record.row)):
        session, provider, clock, events = make([error(OVERLOADED), hang()])
        task = asyncio.ensure_future(session.prompt("hi"))
        await clock.advance(2)
        assert session.brain.state == "continuing"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert "continuing--prompt_cancelled->cancelled" in seen
    assert not any("continue_failed" in row and "->exhausted" in row for row in seen)
    end = of(events, "auto_retry_end")[0]
    assert end["endReason"] == "cancelled" and not session.is_busy


async def test_abort_as_the_retried_answer_arrives_sends_no_further_request():
    """Abort() lands in the same moment the retried turn's 529 arrives."""
    class Racing(ScriptedProvider):
        async def complete(self, messages, *, on_text=None, api_key=None):
            result = await super().complete(messages, on_text=on_text, api_key=api_key)
            if len(self.requests) == 2:
                asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(session.abort()))
                await asyncio.sleep(0)
                await asyncio.sleep(0)
            return result
    clock = FakeClock()
    session = AgentSession(Racing([error(OVERLOADED)] * 4), clock=clock)
    events = []
    session.subscribe(events.append)
    await run(session, clock)
    assert len(session.provider.requests) == 2, "no request after abort() returned"
    end = of(events, "auto_retry_end")[0]
    assert end["endReason"] == "cancelled"


# ------------------------------------------------------------------ reliability

async def test_a_surrogate_pair_split_across_deltas_is_joined_and_the_turn_is_decided():
    """A surrogate pair split across deltas is joined and the turn is decided."""
    class Splits(ScriptedProvider):
        async def complete(self, messages, *, on_text=None, api_key=None):
            on_text("smile \ud83d")
            on_text("\ude00 and a lone \ud800")
            return await super().complete(messages, on_text=on_text, api_key=api_key)
    clock = FakeClock()
    session = AgentSession(Splits([Outcome("error", error_message="529 \ud800 Overloaded")]), clock=clock)
    events = []
    session.subscribe(events.append)
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.settle()
    assert session.brain.is_backing_off, "the turn with broken Unicode was still decided"
    deltas = "".join(e["assistantMessageEvent"].get("delta", "") for e in of(events, "message_update"))
    assert deltas == "smile \U0001F600 and a lone \ufffd"
    start = of(events, "auto_retry_start")[0]
    assert start["errorMessage"] == "529 \ufffd Overloaded"
    json.dumps(start).encode("utf-8")  # the event can be written as UTF-8 JSON
    await clock.advance(2)
    await asyncio.wait_for(task, 1)


async def test_error_texts_are_clipped_and_scrubbed_in_events_and_context():
    """Error texts are clipped and scrubbed in events and context."""
    secret = "sk-proj-abcdefghijklmnop1234567890"
    huge = "503 " + "x" * 100_000 + f" Bearer {secret}"
    session, provider, clock, events = make([error(huge)] * 4, max_retries=0)
    await session.prompt("hi")
    end = of(events, "auto_retry_end")[0]
    assert len(end["finalError"].encode()) <= 9000 and secret not in end["finalError"]
    assert len(session.messages[-1].error_message.encode()) <= 8192
    assert secret not in session.messages[-1].error_message


def test_the_coordinator_key_is_the_configured_keys_hash_not_default():
    """Attack report: sessions of different accounts (--api-key) shared one cooldown."""
    from fsm.fleet import credential_id
    a, b = ScriptedProvider(), ScriptedProvider()
    a.api_key, b.api_key = "sk-account-a-0123456789", "sk-account-b-0123456789"
    key_a, key_b = AgentSession(a)._coord_key(), AgentSession(b)._coord_key()
    assert key_a.credential == credential_id("sk-account-a-0123456789") != key_b.credential
    assert AgentSession(ScriptedProvider())._coord_key().credential == "default"


async def test_a_provider_returning_something_else_is_a_failed_turn_that_ends_its_events():
    """A provider returning something else is a failed turn that ends its events."""
    class Broken(ScriptedProvider):
        async def complete(self, messages, *, on_text=None, api_key=None):
            return None
    events = []
    session = AgentSession(Broken(), clock=FakeClock())
    session.subscribe(events.append)
    await session.prompt("hi")
    assert [e["type"] for e in events][-2:] == ["turn_end", "agent_end"]
    assert "provider returned NoneType" in session.messages[-1].error_message


# ------------------------------------------------------------------ prompt()'s outcome

async def prompt_outcome(script, **settings):
    session, provider, clock, events = make(script, **settings)
    task = asyncio.ensure_future(session.prompt("hi"))
    await settle(clock, task)
    outcome = task.result()
    return outcome, session


@pytest.mark.parametrize("script,settings,want", [
    ([error(OVERLOADED), error(OVERLOADED), ok("hello")], {}, (True, "succeeded", 2, "stop")),
    ([ok("hello")], {}, (True, None, 0, "stop")),
    ([error(OVERLOADED), error(OVERLOADED)], {"max_retries": 1}, (False, "exhausted", 1, "error")),
    ([error("401 Incorrect API key provided")], {}, (False, None, 0, "error")),
    ([error(OVERLOADED)], {"max_retries": 0}, (False, "exhausted", 0, "error")),
    ([error(OVERLOADED)], {"enabled": False}, (False, None, 0, "error")),
])
async def test_prompt_returns_the_turns_outcome(script, settings, want):
    """prompt() returns a frozen TurnOutcome: success, the chain's endReason (None without a
    chain), the retried turns it ran and the final message (docs/embedding.md "The agent
    session")."""
    from fsm.host.session import TurnOutcome

    outcome, session = await prompt_outcome(script, **settings)
    assert isinstance(outcome, TurnOutcome)
    assert (outcome.success, outcome.end_reason, outcome.attempts,
            outcome.message.stop_reason) == want
    assert outcome.message is session.messages[-1] or want[0] is False
    with pytest.raises(AttributeError):
        outcome.success = not outcome.success


async def test_a_cancel_in_the_backoff_is_the_outcome_and_a_queued_prompt_returns_none():
    """abort_retry() in the first backoff: the outcome is cancelled with no retry run and the
    failed message; a message queued meanwhile returns None at once (docs/embedding.md "The
    agent session")."""
    session, provider, clock, events = make([error(OVERLOADED), ok()])
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.settle()
    assert await session.prompt("later", streaming_behavior="follow_up") is None
    session.abort_retry()
    outcome = await asyncio.wait_for(task, 1)
    assert (outcome.success, outcome.end_reason, outcome.attempts) == (False, "cancelled", 0)
    assert outcome.message.error_message == OVERLOADED and len(provider.requests) == 1
