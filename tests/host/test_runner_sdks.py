"""The runner around the official ``openai`` and ``anthropic`` clients, against the fault server.

Real SDK clients (``max_retries=0``: one retry layer) over real HTTP to the project's fault
server; no mock of either SDK. Backoffs are a few ms (``baseDelayMs``) or live on a fake clock.
"""

import asyncio

import anthropic
import openai
import pytest

import fsm
from fsm.testing.fault_server import FaultServer
from fsm.host.runner import RetryChainError, RetryRunner
from fsm.testing import FakeClock

OVERLOADED_BODY = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
OVERLOADED = {"status": 529, "json": OVERLOADED_BODY}
UNAUTHORIZED_OPENAI = {"status": 401, "json": {"error": {
    "message": "Incorrect API key provided: sk-bad", "type": "invalid_request_error",
    "code": "invalid_api_key"}}}
UNAUTHORIZED_ANTHROPIC = {"status": 401, "json": {"type": "error", "error": {
    "type": "authentication_error", "message": "invalid x-api-key"}}}
RATE_LIMITED = {"status": 429, "headers": {"retry-after-ms": "40"}, "json": {"error": {
    "message": "Rate limit reached for requests", "type": "requests", "code": "rate_limit_exceeded"}}}
FAST = {"baseDelayMs": 1}
CHAT = {"model": "fault-model", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "fault-model", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}


def openai_client(srv):
    return openai.AsyncOpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0)


def anthropic_client(srv, cls=anthropic.AsyncAnthropic):
    return cls(base_url=srv.base_url.removesuffix("/v1"), api_key="sk-ant-test", max_retries=0)


# ------------------------------------------------------------------ openai

async def test_openai_529_then_success_takes_exactly_two_requests():
    """OpenAI 529 then success takes exactly two requests."""
    events = []
    with FaultServer([OVERLOADED]) as srv:
        client = openai_client(srv)
        reply = await fsm.retrying(client.chat.completions.create, settings=FAST,
                                   on_event=events.append, **CHAT)
        await client.close()
        assert reply.choices[0].message.content == "ok"
        assert len(srv.chat_requests) == 2
    start, end = events
    assert start["errorMessage"].startswith("529 Overloaded") and start["rule"]
    assert end["success"] is True and end["attempt"] == 1


async def test_openai_401_is_re_raised_as_the_sdks_own_exception():
    """OpenAI 401 is re raised as the SDKs own exception."""
    events = []
    with FaultServer([UNAUTHORIZED_OPENAI]) as srv:
        client = openai_client(srv)
        with pytest.raises(openai.AuthenticationError) as info:
            await fsm.retrying(client.chat.completions.create, settings=FAST,
                               on_event=events.append, **CHAT)
        await client.close()
        assert info.value.status_code == 401 and len(srv.chat_requests) == 1
    assert events == []


async def test_openai_hinted_429_waits_the_servers_time_with_honor():
    """OpenAI hinted 429 waits the servers time with honor."""
    events = []
    with FaultServer([RATE_LIMITED]) as srv:
        client = openai_client(srv)
        await fsm.retrying(client.chat.completions.create, on_event=events.append,
                           settings={**FAST, "retryHints": "honor"}, **CHAT)
        await client.close()
        first, second = srv.chat_requests
        assert second["t_ms"] - first["t_ms"] >= 40
    assert events[0]["delayMs"] == 40 and events[0]["delaySource"] == "hint"
    assert events[0]["retryHintMs"] == 40


async def test_openai_exhaustion_raises_the_chain_error_with_the_sdk_error_chained():
    """OpenAI exhaustion raises the chain error with the SDK error chained."""
    with FaultServer([OVERLOADED] * 4) as srv:
        client = openai_client(srv)
        with pytest.raises(RetryChainError) as info:
            await fsm.retrying(client.chat.completions.create, settings=FAST, **CHAT)
        await client.close()
        assert len(srv.chat_requests) == 4
    err = info.value
    assert err.end_reason == "exhausted" and err.attempts == 3 and err.calls == 4
    assert isinstance(err.__cause__, openai.InternalServerError) and err.__cause__.status_code == 529


async def test_openai_a_dropped_stream_is_retried_by_a_callable_that_consumes_it():
    """Errors inside a stream are retried when the callable consumes the stream."""
    with FaultServer([{"stream": ["Hel"], "drop": True}, {"stream": ["Hello"]}]) as srv:
        client = openai_client(srv)

        async def ask():
            stream = await client.chat.completions.create(stream=True, **CHAT)
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        assert await fsm.retrying(ask, settings=FAST) == "Hello"
        await client.close()
        assert len(srv.chat_requests) == 2


async def test_cancelling_during_a_backoff_ends_the_chain_and_sends_nothing_more():
    """Cancelling during a backoff ends the chain and sends nothing more."""
    events = []
    clock = FakeClock()
    with FaultServer([OVERLOADED]) as srv:
        client = openai_client(srv)
        task = asyncio.ensure_future(fsm.retrying(client.chat.completions.create, clock=clock,
                                                  on_event=events.append, **CHAT))
        for _ in range(200):
            if clock.pending:
                break
            await asyncio.sleep(0.01)
        assert clock.pending == [2.0]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await client.close()
        assert len(srv.chat_requests) == 1
    assert [e.type for e in events] == ["auto_retry_start", "auto_retry_end"]
    assert events[-1]["endReason"] == "cancelled" and events[-1]["finalError"] == fsm.CANCELLED_TEXT


def test_a_sync_openai_client_under_retrying_sync():
    """A sync OpenAI client under retrying sync."""
    waits = []
    with FaultServer([OVERLOADED]) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0)
        reply = fsm.retrying_sync(client.chat.completions.create, sleep=waits.append, **CHAT)
        client.close()
        assert reply.choices[0].message.content == "ok" and len(srv.chat_requests) == 2
    assert waits == [2.0]


# ------------------------------------------------------------------ anthropic

async def test_anthropic_529_then_success_takes_exactly_two_requests():
    """Anthropic 529 then success takes exactly two requests."""
    with FaultServer([OVERLOADED]) as srv:
        client = anthropic_client(srv)
        message = await fsm.retrying(client.messages.create, settings=FAST, **MESSAGES)
        await client.close()
        assert message.content[0].text == "ok"
        assert [r["path"] for r in srv.chat_requests] == ["/v1/messages"] * 2


async def test_anthropic_401_is_re_raised_as_the_sdks_own_exception():
    """Anthropic 401 is re raised as the SDKs own exception."""
    with FaultServer([UNAUTHORIZED_ANTHROPIC]) as srv:
        client = anthropic_client(srv)
        with pytest.raises(anthropic.AuthenticationError):
            await fsm.retrying(client.messages.create, settings=FAST, **MESSAGES)
        await client.close()
        assert len(srv.chat_requests) == 1


@pytest.mark.parametrize("how", ["stream_helper", "create_stream"])
async def test_anthropic_overloaded_error_inside_a_200_stream_is_retried(how):
    """anthropic-sdk-python #688: the 529 arrives as an SSE error event in an HTTP 200 stream,
    where the SDK's own retries never see it. A callable that consumes the stream retries it."""
    events = []
    with FaultServer([{"stream": ["Hel", OVERLOADED_BODY]}, {"stream": ["Hello"]}]) as srv:
        client = anthropic_client(srv)

        async def ask():
            if how == "stream_helper":
                async with client.messages.stream(**MESSAGES) as stream:
                    return "".join([t async for t in stream.text_stream])
            stream = await client.messages.create(stream=True, **MESSAGES)
            return "".join([e.delta.text async for e in stream if e.type == "content_block_delta"])

        assert await fsm.retrying(ask, settings=FAST, on_event=events.append) == "Hello"
        await client.close()
        assert len(srv.chat_requests) == 2
    assert "Overloaded" in events[0]["errorMessage"] and "overloaded_error" in events[0]["errorMessage"]
    assert "overloaded" in events[0]["rule"]  # the rule that decided names the family


async def test_anthropic_exhaustion_chains_the_sdk_error():
    """Anthropic exhaustion chains the SDK error."""
    with FaultServer([OVERLOADED] * 3) as srv:
        client = anthropic_client(srv)
        with pytest.raises(RetryChainError) as info:
            await RetryRunner({**FAST, "maxRetries": 2}).run(client.messages.create, **MESSAGES)
        await client.close()
    assert isinstance(info.value.__cause__, anthropic.OverloadedError)
    assert info.value.attempts == 2 and info.value.calls == 3


def test_a_sync_anthropic_client_under_retrying_sync():
    """A sync Anthropic client under retrying sync."""
    with FaultServer([OVERLOADED]) as srv:
        client = anthropic_client(srv, anthropic.Anthropic)
        message = fsm.retrying_sync(client.messages.create, settings=FAST, **MESSAGES)
        client.close()
        assert message.content[0].text == "ok" and len(srv.chat_requests) == 2


async def test_a_connection_refused_is_a_retryable_transport_error():
    """httpx's connect error under the SDK: retried, then the chain error chains the SDK's."""
    with FaultServer([]) as srv:
        base = srv.base_url
    client = openai.AsyncOpenAI(base_url=base, api_key="sk-test", max_retries=0)
    with pytest.raises(RetryChainError) as info:
        await fsm.retrying(client.chat.completions.create, settings={**FAST, "maxRetries": 1}, **CHAT)
    await client.close()
    assert isinstance(info.value.__cause__, openai.APIConnectionError)
    assert info.value.classification.kind == "retryable"


async def test_openai_an_error_event_inside_the_stream_is_retried_by_a_consuming_callable():
    """A router's ``{"error": {...}}`` event in a 200 stream: the SDK raises APIError (no
    status); the runner reads it as a stream error and retries."""
    events = []
    error = {"error": {"message": "Upstream overloaded, please retry", "type": "server_error",
                       "code": 502}}
    with FaultServer([{"stream": ["Hel", error]}, {"stream": ["Hello"]}]) as srv:
        client = openai_client(srv)

        async def ask():
            stream = await client.chat.completions.create(stream=True, **CHAT)
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        assert await fsm.retrying(ask, settings=FAST, on_event=events.append) == "Hello"
        await client.close()
    assert events[0]["errorMessage"].startswith("Stream error: Upstream overloaded")
