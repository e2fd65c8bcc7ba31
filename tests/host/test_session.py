"""AgentSession against a scripted provider and a fake clock (no real backoff sleeps).

Regression tests named ``test_hazard_N_*`` pin the known failures listed in
docs/policy.md §8 items 1–8.
"""

import asyncio
import json

import pytest

from fsm.host.credentials import InMemoryCredentialStore
from fsm.core.messages import AssistantMessage, UserMessage
from fsm.host.session import AgentSession, SessionBusyError
from fsm.host.session_log import SessionLog
from fsm.core.settings import RetrySettings
from fsm.testing import FakeClock, Outcome, ScriptedProvider, error, hang, ok

OVERLOADED = 'Error code: 529 - {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
UNAVAILABLE = "503 Service Unavailable"
AUTH = "401 Incorrect API key provided"
USAGE = "You have reached your usage limit. Please try again in 2h 13m"


def make(script, **settings):
    clock = FakeClock()
    provider = ScriptedProvider(script)
    session = AgentSession(provider, settings=RetrySettings(**settings), clock=clock)
    events = []
    session.subscribe(events.append)
    return session, provider, clock, events


def retry_events(events):
    out = []
    for e in events:
        if e["type"] == "auto_retry_start":
            out.append(("start", e["attempt"], e["delayMs"]))
        elif e["type"] == "auto_retry_end":
            out.append(("end", e["success"], e["attempt"], e.get("finalError")))
    return out


async def started(clock):
    await clock.settle()


async def test_success_needs_no_retry():
    """Success needs no retry."""
    session, provider, clock, events = make([ok("Hello")])
    await session.prompt("hi")
    assert retry_events(events) == []
    assert [type(m) for m in session.messages] == [UserMessage, AssistantMessage]
    assert session.messages[-1].text == "Hello"
    types = [e["type"] for e in events]
    assert types.index("agent_start") < types.index("message_update") < types.index("agent_end")


async def test_retry_then_success_with_seed_backoffs():
    """Retry then success with seed backoffs."""
    session, provider, clock, events = make([error(OVERLOADED), error(UNAVAILABLE), ok("fine")])
    task = asyncio.ensure_future(session.prompt("hi"))
    await started(clock)
    assert clock.pending == [2.0]
    await clock.advance(1.999)
    assert len(provider.requests) == 1
    await clock.advance(0.001)
    assert len(provider.requests) == 2 and clock.pending == [4.0]
    await clock.advance(4.0)
    await asyncio.wait_for(task, 1)
    assert retry_events(events) == [("start", 1, 2000), ("start", 2, 4000), ("end", True, 2, None)]
    assert len(provider.requests) == 3
    # retries carry the same messages as the first attempt: the failed one was dropped
    assert provider.requests[0] == provider.requests[1] == provider.requests[2]


async def test_exhaustion_keeps_the_last_error_in_context():
    """Exhaustion keeps the last error in context."""
    session, provider, clock, events = make([error(UNAVAILABLE)] * 5, max_retries=3, base_delay_ms=10)
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(1)
    await asyncio.wait_for(task, 1)
    assert retry_events(events) == [("start", 1, 10), ("start", 2, 20), ("start", 3, 40),
                                    ("end", False, 3, UNAVAILABLE)]
    assert len(provider.requests) == 4
    assert session.messages[-1].error_message == UNAVAILABLE
    assert not session.is_retrying and session.retry_attempt == 0


async def test_hazard_1_prompt_does_not_return_before_the_retry_starts():
    """Hazard 1 prompt does not return before the retry starts."""
    session, provider, clock, events = make([error(OVERLOADED), ok()])
    seen = {}

    def on_event(e):
        if e["type"] == "agent_end":
            seen["agent_end_retrying"] = session.is_retrying
        if e["type"] == "auto_retry_start":
            seen["start_prompt_done"] = task.done()
    session.subscribe(on_event)
    task = asyncio.ensure_future(session.prompt("hi"))
    await started(clock)
    # the decision is taken before listeners hear of the turn's end
    assert seen == {"agent_end_retrying": True, "start_prompt_done": False}
    assert session.is_retrying and not task.done()
    types = [e["type"] for e in events]
    assert types.index("agent_end") < types.index("auto_retry_start")
    await clock.advance(2)
    await asyncio.wait_for(task, 1)
    assert retry_events(events)[-1] == ("end", True, 1, None)


async def test_hazard_2_retried_turn_with_fatal_error_ends_the_chain():
    """Hazard 2 retried turn with fatal error ends the chain."""
    session, provider, clock, events = make([error(OVERLOADED), error(AUTH)])
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(2)
    await asyncio.wait_for(task, 1)
    assert retry_events(events) == [("start", 1, 2000), ("end", False, 1, AUTH)]
    assert not session.is_retrying


async def test_hazard_3_disabling_mid_chain_ends_the_chain():
    """Hazard 3 disabling mid chain ends the chain."""
    session, provider, clock, events = make([error(OVERLOADED), error(OVERLOADED), ok()])
    task = asyncio.ensure_future(session.prompt("hi"))
    await started(clock)
    session.set_auto_retry_enabled(False)
    assert clock.pending == [2.0], "disabling does not cancel the pending backoff"
    await clock.advance(2)
    await asyncio.wait_for(task, 1)
    assert len(provider.requests) == 2
    assert retry_events(events) == [("start", 1, 2000), ("end", False, 1, OVERLOADED)]


async def test_hazard_4_abort_resets_the_attempt_counter():
    """Hazard 4 abort resets the attempt counter."""
    session, provider, clock, events = make([error(OVERLOADED), error(OVERLOADED), error(OVERLOADED), ok()])
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(2)
    assert session.retry_attempt == 2
    session.abort_retry()
    await asyncio.wait_for(task, 1)
    assert session.retry_attempt == 0
    task = asyncio.ensure_future(session.prompt("again"))
    await started(clock)
    assert session.retry_attempt == 1
    await clock.advance(2)
    await asyncio.wait_for(task, 1)
    assert retry_events(events)[2:] == [("end", False, 2, "Retry cancelled"), ("start", 1, 2000),
                                        ("end", True, 1, None)]


async def test_hazard_5_rejected_continue_ends_the_chain():
    """Hazard 5 rejected continue ends the chain."""
    session, provider, clock, events = make([error(OVERLOADED), ok()])
    task = asyncio.ensure_future(session.prompt("hi"))
    await started(clock)
    session.messages.append(AssistantMessage("stop", text="injected"))  # nothing to continue from
    await clock.advance(2)
    await asyncio.wait_for(task, 1)
    end = retry_events(events)[-1]
    assert end[:3] == ("end", False, 1) and "cannot continue" in end[3]
    assert not session.is_retrying and not session.is_streaming
    assert len(provider.requests) == 1


async def test_hazard_6_stale_timer_of_an_older_chain_never_touches_a_newer_one():
    """Hazard 6 stale timer of an older chain never touches a newer one."""
    session, provider, clock, events = make([error(OVERLOADED), error(OVERLOADED), ok()])
    task = asyncio.ensure_future(session.prompt("hi"))
    await started(clock)
    old_timer = session.brain.timer_id
    session.abort_retry()
    await asyncio.wait_for(task, 1)
    task = asyncio.ensure_future(session.prompt("again"))
    await started(clock)
    assert session.retry_attempt == 1
    session._on_backoff_timer(old_timer)  # a late callback from the cancelled chain
    await clock.settle()
    assert session.retry_attempt == 1 and session.brain.state == "backing_off"
    assert len(provider.requests) == 2
    await clock.advance(2)
    await asyncio.wait_for(task, 1)
    assert retry_events(events)[-1] == ("end", True, 1, None)


async def test_hazard_7_message_during_backoff_is_queued_not_sent():
    """Hazard 7 message during backoff is queued not sent."""
    session, provider, clock, events = make([error(OVERLOADED), ok()])
    task = asyncio.ensure_future(session.prompt("hi"))
    await started(clock)
    with pytest.raises(SessionBusyError, match="retry chain"):
        await session.prompt("now!")
    await session.prompt("also this", streaming_behavior="steer")
    assert len(provider.requests) == 1
    await clock.advance(1.9)
    assert len(provider.requests) == 1, "the queued message bypassed the backoff"
    await clock.advance(0.1)
    await asyncio.wait_for(task, 1)
    assert provider.requests[1][-1] == {"role": "user", "content": "also this"}
    assert len(provider.requests) == 2


async def test_hazard_8_aborted_retry_is_not_a_success():
    """Hazard 8 aborted retry is not a success."""
    session, provider, clock, events = make([error(OVERLOADED), hang()])
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(2)
    assert session.is_streaming
    await session.abort()
    await asyncio.wait_for(task, 1)
    assert retry_events(events)[-1] == ("end", False, 1, "Retry cancelled")
    assert session.messages[-1].stop_reason == "aborted"


async def test_abort_between_backoff_end_and_continue_prevents_the_request():
    """Abort between backoff end and continue prevents the request."""
    session, provider, clock, events = make([error(OVERLOADED), ok()])
    task = asyncio.ensure_future(session.prompt("hi"))
    await started(clock)
    session._on_backoff_timer(session.brain.timer_id)   # the timer fires ...
    await session.abort()                               # ... and the abort lands before the continue
    await asyncio.wait_for(task, 1)
    assert len(provider.requests) == 1
    assert retry_events(events)[-1] == ("end", False, 1, "Retry cancelled")


async def test_abort_after_the_answer_arrived_but_before_the_turn_took_it_starts_no_retry():
    """Abort in the tick between the provider's answer (a 529) and the turn taking it: the
    stream task is done, so nothing is cancelled, yet once abort() returned no retry is
    pending (docs/policy.md §8.8: an answer arriving with the abort is taken as aborted)."""
    answered = asyncio.get_running_loop().create_future()

    class Gated(ScriptedProvider):
        async def complete(self, messages, *, on_text=None, api_key=None):
            if not self.requests:
                await answered
            return await super().complete(messages, on_text=on_text, api_key=api_key)
    clock = FakeClock()
    session = AgentSession(Gated([error(OVERLOADED), ok()]), clock=clock)
    events = []
    session.subscribe(events.append)
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.settle()
    assert session.is_streaming and not answered.done()
    answered.set_result(None)  # the provider's answer is due: its task runs next ...
    await asyncio.sleep(0)     # ... and is done when this one resumes; the turn has not run on
    assert session._stream_task is not None and session._stream_task.done()
    await session.abort()
    assert not session.is_retrying and clock.pending == [], "abort() returned with a retry pending"
    await asyncio.wait_for(task, 1)
    await clock.advance(10)
    assert len(session.provider.requests) == 1
    assert session.messages[-1].stop_reason == "aborted"
    assert retry_events(events) == []


async def test_global_abort_during_backoff_cancels():
    """Global abort during backoff cancels."""
    session, provider, clock, events = make([error(OVERLOADED), ok()])
    task = asyncio.ensure_future(session.prompt("hi"))
    await started(clock)
    await session.abort()
    await asyncio.wait_for(task, 1)
    assert clock.pending == []
    assert retry_events(events)[-1] == ("end", False, 1, "Retry cancelled")
    assert len(provider.requests) == 1


async def test_abort_of_a_plain_turn_is_not_a_chain():
    """Abort of a plain turn is not a chain."""
    session, provider, clock, events = make([hang()])
    task = asyncio.ensure_future(session.prompt("hi"))
    await started(clock)
    await session.abort()
    await asyncio.wait_for(task, 1)
    assert retry_events(events) == []
    assert session.messages[-1].stop_reason == "aborted"
    assert session.messages[-1].error_message == "Request was aborted"


async def test_max_retries_zero_emits_the_seed_end_without_start():
    """Max retries zero emits the seed end without start."""
    session, provider, clock, events = make([error(OVERLOADED)], max_retries=0)
    await asyncio.wait_for(session.prompt("hi"), 1)
    assert retry_events(events) == [("end", False, 0, OVERLOADED)]


async def test_disabled_never_retries():
    """Disabled never retries."""
    session, provider, clock, events = make([error(OVERLOADED)], enabled=False)
    await asyncio.wait_for(session.prompt("hi"), 1)
    assert retry_events(events) == [] and len(provider.requests) == 1


async def test_runtime_context_drops_failed_messages_but_the_log_keeps_them(tmp_path):
    """Runtime context drops failed messages but the log keeps them."""
    clock = FakeClock()
    provider = ScriptedProvider([error(OVERLOADED), error(UNAVAILABLE), ok("done")])
    log = SessionLog(tmp_path / "s.jsonl", "sid")
    session = AgentSession(provider, clock=clock, session_log=log, session_id="sid")
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(10)
    await asyncio.wait_for(task, 1)
    await session.close()
    assert [getattr(m, "stop_reason", "user") for m in session.messages] == ["user", "stop"]
    entries = list(SessionLog.read(tmp_path / "s.jsonl"))
    assert entries[0]["type"] == "session" and entries[0]["id"] == "sid"
    stops = [e["message"].get("stopReason", "user") for e in entries[1:]]
    assert stops == ["user", "error", "error", "stop"]
    assert entries[2]["message"]["errorMessage"] == OVERLOADED


async def test_second_prompt_while_turn_runs_is_rejected_or_followed_up():
    """Second prompt while turn runs is rejected or followed up."""
    session, provider, clock, events = make([hang(), ok("second")])
    task = asyncio.ensure_future(session.prompt("first"))
    await started(clock)
    with pytest.raises(SessionBusyError, match="turn is running"):
        await session.prompt("x")
    await session.prompt("later", streaming_behavior="follow_up")
    provider.release.set()
    await asyncio.wait_for(task, 1)
    assert provider.requests[1][-1] == {"role": "user", "content": "later"}
    assert session.messages[-1].text == "second"


async def test_bad_prompt_arguments():
    """Bad prompt arguments."""
    session, *_ = make([])
    with pytest.raises(TypeError):
        await session.prompt(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="streaming_behavior"):
        await session.prompt("x", streaming_behavior="now")
    with pytest.raises(TypeError):
        session.set_auto_retry_enabled("no")  # type: ignore[arg-type]


async def test_provider_that_raises_is_a_failed_turn():
    """Provider that raises is a failed turn."""
    session, provider, clock, events = make([Outcome(raises=ConnectionResetError("reset by peer")), ok()])
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(2)
    await asyncio.wait_for(task, 1)
    assert retry_events(events)[0][0] == "start"
    assert retry_events(events)[-1] == ("end", True, 1, None)


async def test_cancelling_the_prompt_task_ends_the_chain():
    """Cancelling the prompt task ends the chain."""
    session, provider, clock, events = make([error(OVERLOADED), ok()])
    task = asyncio.ensure_future(session.prompt("hi"))
    await started(clock)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not session.is_retrying and clock.pending == []
    assert retry_events(events)[-1] == ("end", False, 1, "Retry cancelled")


async def test_extensions_are_awaited_in_order_and_failures_reported():
    """Extensions are awaited in order and failures reported."""
    session, provider, clock, events = make([error(OVERLOADED), ok()])
    calls = []

    async def slow(event):
        await asyncio.sleep(0)
        calls.append(("slow", event["type"]))

    def broken(event):
        raise RuntimeError("extension bug")
    session.on("auto_retry_start", slow)
    session.on("auto_retry_start", broken)
    session.on("auto_retry_end", lambda e: calls.append(("end", e["success"])))
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(2)
    await asyncio.wait_for(task, 1)
    await session.drain_extensions()
    assert calls == [("slow", "auto_retry_start"), ("end", True)]
    errors = [e for e in events if e["type"] == "extension_error"]
    assert errors and "extension bug" in errors[0]["error"]


async def test_broken_listener_does_not_break_the_chain():
    """Broken listener does not break the chain."""
    session, provider, clock, events = make([error(OVERLOADED), ok()])
    session.subscribe(lambda e: 1 / 0)
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(2)
    await asyncio.wait_for(task, 1)
    assert retry_events(events)[-1] == ("end", True, 1, None)


async def test_unsubscribe_and_state():
    """Unsubscribe and state."""
    session, provider, clock, events = make([ok()])
    seen = []
    unsubscribe = session.subscribe(seen.append)
    unsubscribe()
    unsubscribe()
    await session.prompt("hi")
    assert seen == []
    state = session.state()
    assert state["autoRetryEnabled"] is True and state["isRetrying"] is False
    assert state["messageCount"] == 2 and state["model"] == "scripted-model"
    assert json.loads(json.dumps(state)) == state


async def test_usage_limit_switches_credentials_and_skips_the_backoff():
    """Usage limit switches credentials and skips the backoff."""
    clock = FakeClock()
    store = InMemoryCredentialStore({"scripted": ["key-a", "key-b"]}, clock=lambda: 1_000_000)
    provider = ScriptedProvider([error(USAGE), ok()])
    session = AgentSession(provider, clock=clock, credentials=store, session_id="s1")
    events = []
    session.subscribe(events.append)
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(0)
    await asyncio.wait_for(task, 1)
    assert retry_events(events) == [("start", 1, 0), ("end", True, 1, None)]
    assert provider.api_keys == ["key-a", "key-b"]
    assert store.blocked_until("scripted")["key-a"] == 1_000_000 + (2 * 3600 + 13 * 60) * 1000


async def usage_limit_chain(credentials):
    """One usage-limit failure then a success, 2 s of fake time; the session's events."""
    clock = FakeClock()
    session = AgentSession(ScriptedProvider([error(USAGE), ok()]), clock=clock, credentials=credentials)
    events = []
    session.subscribe(events.append)
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(2)
    await asyncio.wait_for(task, 1)
    return events


async def test_usage_limit_without_another_credential_keeps_the_normal_backoff():
    """Usage limit without another credential keeps the normal backoff."""
    events = await usage_limit_chain(InMemoryCredentialStore({"scripted": ["only"]}))
    assert retry_events(events)[0] == ("start", 1, 2000)


async def test_concurrent_sessions_share_one_credential_store():
    """Concurrent sessions share one credential store."""
    clock = FakeClock()
    store = InMemoryCredentialStore({"scripted": ["k1", "k2"]})
    providers = [ScriptedProvider([error(USAGE), ok()]) for _ in range(2)]
    sessions = [AgentSession(p, clock=clock, credentials=store, session_id=f"s{i}")
                for i, p in enumerate(providers)]
    tasks = [asyncio.ensure_future(s.prompt("hi")) for s in sessions]
    await clock.advance(0)
    await asyncio.wait_for(asyncio.gather(*tasks), 1)
    # both hit the limit on k1; the first switches, the second follows to k2: no backoff for either
    assert [p.api_keys for p in providers] == [["k1", "k2"], ["k1", "k2"]]


async def test_broken_credential_store_falls_back_to_the_normal_backoff():
    """Broken credential store falls back to the normal backoff."""
    class Broken:
        def api_key(self, provider, session_id):
            return None

        def mark_usage_limit_reached(self, *a):
            raise OSError("disk full")
    events = await usage_limit_chain(Broken())
    assert retry_events(events)[0] == ("start", 1, 2000)


async def test_compaction_hook_gets_overflow_and_not_retried_turns():
    """Compaction hook gets overflow and not retried turns."""
    calls = []

    async def hook(session, message, kind):
        calls.append((kind, message.error_message))
    clock = FakeClock()
    provider = ScriptedProvider([error("prompt is too long: 219898 tokens > 200000 maximum"),
                                 error(OVERLOADED), ok()])
    session = AgentSession(provider, clock=clock, compaction_hook=hook)
    await session.prompt("big")
    assert calls == [("context_overflow", "prompt is too long: 219898 tokens > 200000 maximum")]
    task = asyncio.ensure_future(session.prompt("again"))
    await started(clock)
    assert len(calls) == 1, "compaction is skipped on a turn that starts a retry"
    await clock.advance(2)
    await asyncio.wait_for(task, 1)
    assert calls[-1] == ("none", None)
    assert session.state()["autoCompactionEnabled"] is True


async def test_queue_is_announced_when_delivered_and_kept_after_a_cancel():
    """Queue is announced when delivered and kept after a cancel."""
    session, provider, clock, events = make([error(OVERLOADED), ok("second")])
    task = asyncio.ensure_future(session.prompt("hi"))
    await started(clock)
    await session.prompt("queued", streaming_behavior="follow_up")
    session.abort_retry()
    await asyncio.wait_for(task, 1)
    assert len(provider.requests) == 1, "a cancel must not send the queued message at once"
    assert session.queued_messages == ["queued"]
    await session.prompt("next")
    assert provider.requests[1][-2:] == [{"role": "user", "content": "queued"},
                                         {"role": "user", "content": "next"}]
    queue_events = [e["queued"] for e in events if e["type"] == "queue_update"]
    assert queue_events == [["queued"], []]


async def test_compaction_hook_failure_is_reported_not_raised(caplog):
    """Compaction hook failure is reported not raised."""
    async def hook(session, message, kind):
        raise RuntimeError("compactor broke")
    session = AgentSession(ScriptedProvider([error("prompt is too long")]), clock=FakeClock(),
                           compaction_hook=hook)
    await session.prompt("x")
    assert "compactor broke" in caplog.text
    assert not session.is_busy


async def test_cancelling_prompt_mid_stream_cancels_the_request():
    """Cancelling prompt mid stream cancels the request."""
    session, provider, clock, events = make([hang()])
    task = asyncio.ensure_future(session.prompt("hi"))
    await started(clock)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not session.is_busy


async def test_cancelling_prompt_while_continuing_ends_the_chain():
    """Cancelling prompt while continuing ends the chain."""
    session, provider, clock, events = make([error(OVERLOADED), hang()])
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(2)
    assert session.brain.state == "continuing"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert retry_events(events)[-1] == ("end", False, 1, "Retry cancelled")
    assert not session.is_busy and not session.is_retrying


async def test_continue_that_raises_ends_the_chain(tmp_path):
    """Continue that raises ends the chain."""
    class FullDisk(SessionLog):
        fail = False

        def append(self, message):
            if self.fail:
                raise OSError("No space left on device")
            super().append(message)
    clock = FakeClock()
    log = FullDisk(tmp_path / "s.jsonl", "sid")
    session = AgentSession(ScriptedProvider([error(OVERLOADED), ok()]), clock=clock, session_log=log)
    events = []
    session.subscribe(events.append)
    task = asyncio.ensure_future(session.prompt("hi"))
    await started(clock)
    log.fail = True
    session._queue.append((UserMessage("queued"), "follow_up"))  # the continue must write it to the log
    await clock.advance(2)
    await asyncio.wait_for(task, 1)
    end = retry_events(events)[-1]
    assert end[:3] == ("end", False, 1) and "No space left on device" in end[3]
    assert not session.is_busy


async def test_jitter_source_is_injectable_and_close_cancels_a_backoff():
    """Jitter source is injectable and close cancels a backoff."""
    clock = FakeClock()
    session = AgentSession(ScriptedProvider([error(OVERLOADED)]), clock=clock,
                           settings=RetrySettings(jitter="full"), random=lambda: 0.25)
    events = []
    session.subscribe(events.append)
    task = asyncio.ensure_future(session.prompt("hi"))
    await started(clock)
    assert retry_events(events)[0] == ("start", 1, 500)
    await session.close()
    await asyncio.wait_for(task, 1)
    assert retry_events(events)[-1] == ("end", False, 1, "Retry cancelled")
    assert clock.pending == []


async def test_event_order_matches_the_original():
    """Event order matches the original."""
    session, provider, clock, events = make([error(OVERLOADED), ok()])
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(2)
    await asyncio.wait_for(task, 1)
    order = [e["type"] for e in events if e["type"] in
             ("agent_start", "message_end", "agent_end", "auto_retry_start", "auto_retry_end")]
    assert order == ["agent_start", "message_end", "message_end", "agent_end", "auto_retry_start",
                     "agent_start", "message_end", "auto_retry_end", "agent_end"]


async def test_failed_end_comes_after_agent_end():
    """Failed end comes after agent end."""
    session, provider, clock, events = make([error(OVERLOADED), error(AUTH)])
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(2)
    await asyncio.wait_for(task, 1)
    order = [e["type"] for e in events][-2:]
    assert order == ["agent_end", "auto_retry_end"]


async def test_abort_retry_while_the_retried_turn_runs_lets_the_turn_decide():
    """docs/policy.md §3: abort_retry in continuing only releases waiters; the running turn ends the chain."""
    session, provider, clock, events = make([error(OVERLOADED), hang()])
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(2)
    assert session.brain.state == "continuing" and session.is_streaming
    session.abort_retry()
    assert session.is_retrying and retry_events(events) == [("start", 1, 2000)]
    provider.release.set()
    await asyncio.wait_for(task, 1)
    assert retry_events(events)[-1] == ("end", True, 1, None)


def test_scripted_provider_refuses_a_script_of_messages_at_construction():
    """ScriptedProvider([AssistantMessage(...)]) used to fail on every call instead."""
    with pytest.raises(TypeError, match=r"script\[0\] must be an Outcome .*AssistantMessage"):
        ScriptedProvider([AssistantMessage("error", error_message="529 Overloaded")])
    with pytest.raises(TypeError, match="default must be an Outcome"):
        ScriptedProvider([], default="ok")
