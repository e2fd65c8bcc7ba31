"""The brain as tenacity strategies: Retrying, AsyncRetrying and pydantic-ai's tenacity transport."""

from __future__ import annotations

import asyncio

import httpx2
import openai
import pytest
import tenacity

import fsm
from fsm.integrations.tenacity import BrainStrategy, async_retrying, retrying
from fsm.testing.fault_server import FaultServer

FAST = {"baseDelayMs": 1, "maxDelayMs": 5}
OVERLOADED = {"status": 529, "json": {"type": "error", "error": {"type": "overloaded_error",
                                                                 "message": "Overloaded"}}}


def flaky(failures, error="529 Overloaded"):
    calls = []

    def call():
        calls.append(1)
        if len(calls) <= failures:
            raise RuntimeError(error)
        return "ok"
    return call, calls


def test_a_decorated_function_is_retried_until_it_succeeds():
    """Two overloads then success: two auto_retry_start events and a successful end."""
    events = []
    strategy = BrainStrategy(FAST, on_event=lambda e: events.append(dict(e)))
    call, calls = flaky(2)
    assert tenacity.retry(**strategy.kwargs())(call)() == "ok"
    assert len(calls) == 3
    assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_start", "auto_retry_end"]
    assert events[-1]["success"] is True


def test_a_fatal_first_failure_is_the_caller_s_own_exception():
    """A 401 starts no chain: tenacity re-raises the function's exception unchanged."""
    strategy = BrainStrategy(FAST)
    call, calls = flaky(5, "401 Incorrect API key provided")
    with pytest.raises(RuntimeError, match="401"):
        tenacity.retry(**strategy.kwargs())(call)()
    assert len(calls) == 1


def test_max_retries_zero_re_raises_with_the_end_reason_noted():
    """maxRetries 0: the caller's exception, the end event emitted and its reason in __notes__."""
    events = []
    strategy = BrainStrategy({"maxRetries": 0}, on_event=lambda e: events.append(dict(e)))
    call, _ = flaky(5)
    with pytest.raises(RuntimeError) as caught:
        tenacity.retry(**strategy.kwargs())(call)()
    assert events[-1]["type"] == "auto_retry_end" and events[-1]["attempt"] == 0
    assert any("endReason" in note for note in caught.value.__notes__)


def test_an_exhausted_chain_raises_retry_chain_error():
    """maxRetries + 1 calls, then RetryChainError from the last exception, as fsm.retrying."""
    strategy = BrainStrategy({**FAST, "maxRetries": 2})
    call, calls = flaky(10)
    with pytest.raises(fsm.RetryChainError) as caught:
        tenacity.retry(**strategy.kwargs())(call)()
    assert caught.value.end_reason == "exhausted" and len(calls) == 3
    assert isinstance(caught.value.__cause__, RuntimeError)


def test_the_for_loop_form_of_retrying_works():
    """``for attempt in retrying(...)`` with the attempt context manager."""
    call, calls = flaky(1)
    for attempt in retrying(FAST):
        with attempt:
            result = call()
    assert result == "ok" and len(calls) == 2


def test_each_call_has_its_own_chain():
    """One strategy, two calls: each numbers its own retries from 1."""
    events = []
    strategy = BrainStrategy(FAST, on_event=lambda e: events.append(dict(e)))
    for _ in range(2):
        call, _ = flaky(1)
        tenacity.retry(**strategy.kwargs())(call)()
    assert [e["attempt"] for e in events if e["type"] == "auto_retry_start"] == [1, 1]


async def test_async_retrying_waits_on_the_injected_clock():
    """AsyncRetrying under a FakeClock: the backoff is the clock's, not real time."""
    from fsm.testing import FakeClock
    clock = FakeClock()
    events = []
    strategy = BrainStrategy({"baseDelayMs": 60_000}, clock=clock, on_event=lambda e: events.append(dict(e)))
    calls = []

    @tenacity.retry(**strategy.kwargs(asynchronous=True))
    async def call():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("529 Overloaded")
        return "ok"

    task = asyncio.ensure_future(call())
    while not events:
        await asyncio.sleep(0)
    assert events[0]["delayMs"] == 60_000 and not task.done()
    await clock.advance(60)
    assert await task == "ok"


async def test_a_cancelled_async_call_ends_its_chain():
    """Cancelling during the backoff: the chain ends cancelled and the cancellation propagates."""
    events = []
    strategy = BrainStrategy({"baseDelayMs": 60_000}, on_event=lambda e: events.append(dict(e)))

    @tenacity.retry(**strategy.kwargs(asynchronous=True))
    async def call():
        raise RuntimeError("529 Overloaded")

    task = asyncio.ensure_future(call())
    while not events:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert events[-1]["type"] == "auto_retry_end" and events[-1]["endReason"] == "cancelled"


async def test_pydantic_ai_s_tenacity_transport_runs_the_brain():
    """pydantic-ai's AsyncHTTPX2TenacityTransport with the brain's strategies, under the real
    openai SDK against the fault server: a 529 then success."""
    from pydantic_ai.retries import AsyncHTTPX2TenacityTransport
    events = []
    strategy = BrainStrategy(FAST, on_event=lambda e: events.append(dict(e)))

    def validate(response):
        response.raise_for_status()

    transport = AsyncHTTPX2TenacityTransport(config=strategy.kwargs(asynchronous=True),
                                             validate_response=validate)
    with FaultServer([OVERLOADED]) as srv:
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0,
                                    http_client=httpx2.AsyncClient(transport=transport))
        reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content == "ok"
        assert len(srv.chat_requests) == 2
    assert events[0]["type"] == "auto_retry_start" and events[-1]["success"] is True


def test_a_bad_setting_is_refused_when_the_strategy_is_built():
    """An unknown or bad retry key raises SettingsError before any call."""
    with pytest.raises(fsm.SettingsError):
        BrainStrategy({"maxRetries": -1})


async def test_a_raise_for_status_error_is_read_by_its_status_and_headers():
    """An httpx2 HTTPStatusError (raise_for_status) is classified by its response: a 429 with
    retry-after-ms is a rate limit whose hint the brain honours."""
    events = []
    strategy = BrainStrategy({"retryHints": "honor", "maxHintWaitMs": 1000, **FAST},
                             on_event=lambda e: events.append(dict(e)))
    request = httpx2.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    limited = httpx2.Response(429, headers={"retry-after-ms": "40"}, request=request,
                              json={"error": {"type": "rate_limit_error", "message": "slow down"}})
    calls = []

    @tenacity.retry(**strategy.kwargs(asynchronous=True))
    async def call():
        calls.append(1)
        if len(calls) == 1:
            limited.raise_for_status()
        return "ok"

    assert await call() == "ok"
    assert events[0]["delaySource"] == "hint" and events[0]["delayMs"] >= 40


def test_returning_inside_with_attempt_ends_the_chain():
    """`for attempt in Retrying(...): with attempt: return call()` ends the chain success: true
    (docs/integrations.md, "tenacity")."""
    events = []
    with FaultServer([OVERLOADED]) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0)

        def ask():
            for attempt in retrying(FAST, on_event=lambda e: events.append(dict(e))):
                with attempt:
                    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert ask().choices[0].message.content == "ok"
        assert len(srv.chat_requests) == 2
    assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_end"]
    assert events[-1]["success"] is True


async def test_returning_inside_with_attempt_ends_an_async_chain():
    """The same idiom with AsyncRetrying ends the chain success: true (docs/integrations.md, "tenacity")."""
    events = []
    with FaultServer([OVERLOADED]) as srv:
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0)

        async def ask():
            async for attempt in async_retrying(FAST, on_event=lambda e: events.append(dict(e))):
                with attempt:
                    return await client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": "hi"}])
        assert (await ask()).choices[0].message.content == "ok"
        assert len(srv.chat_requests) == 2
    assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_end"]
    assert events[-1]["success"] is True
