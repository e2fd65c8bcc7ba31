"""The brain in pydantic-ai agents: the model-request hook and the httpx2 transport slot, with
the real pydantic-ai OpenAI and Anthropic models against the fault server."""

from __future__ import annotations

import openai
import pytest
from pydantic_ai import Agent
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.openai import OpenAIProvider

import fsm
from fsm.integrations.pydantic_ai import RetryBrainCapability, http_client
from fsm.testing.fault_server import FaultServer

FAST = {"baseDelayMs": 1, "maxDelayMs": 5}
OVERLOADED = {"status": 529, "json": {"type": "error", "error": {"type": "overloaded_error",
                                                                 "message": "Overloaded"}}}


def openai_model(srv, **provider):
    client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0,
                                **provider)
    return OpenAIChatModel("gpt-test", provider=OpenAIProvider(openai_client=client))


async def test_the_capability_retries_a_529_then_succeeds():
    """RetryBrainCapability: a 529 then a success is one retry, the run's output is the answer."""
    events = []
    with FaultServer([OVERLOADED]) as srv:
        agent = Agent(openai_model(srv), capabilities=[RetryBrainCapability(FAST, on_event=lambda e: events.append(dict(e)))])
        result = await agent.run("hi")
        assert result.output == "ok"
        assert len(srv.chat_requests) == 2
    assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_end"]
    assert events[-1]["success"] is True


async def test_the_capability_ends_an_exhausted_chain_with_retry_chain_error():
    """Every attempt overloaded: maxRetries + 1 requests, then RetryChainError."""
    with FaultServer([OVERLOADED] * 5) as srv:
        agent = Agent(openai_model(srv), capabilities=[RetryBrainCapability({**FAST, "maxRetries": 2})])
        with pytest.raises(fsm.RetryChainError):
            await agent.run("hi")
        assert len(srv.chat_requests) == 3


async def test_the_transport_slot_retries_for_an_anthropic_model():
    """http_client(): the provider's httpx2 client retries a 529 on /v1/messages."""
    events = []
    with FaultServer([OVERLOADED]) as srv:
        client = http_client(FAST, on_event=lambda e: events.append(dict(e)))
        import anthropic
        sdk = anthropic.AsyncAnthropic(base_url=srv.base_url.removesuffix("/v1"), api_key="sk-ant-test",
                                       max_retries=0, http_client=client)
        agent = Agent(AnthropicModel("claude-test", provider=AnthropicProvider(anthropic_client=sdk)))
        result = await agent.run("hi")
        assert result.output
        assert len(srv.chat_requests) == 2
    assert events[-1]["success"] is True


async def test_the_capability_honours_the_hint_behind_pydantic_ais_own_error():
    """pydantic-ai's ModelHTTPError reads as the SDK error behind it: retry-after-ms is the
    wait with retryHints "honor" (docs/integrations.md, "Retry hints behind a framework's exception")."""
    import asyncio

    from fsm.testing import FakeClock
    events, clock = [], FakeClock()
    limited = {"status": 429, "headers": {"retry-after-ms": "1000"},
               "json": {"error": {"message": "slow down", "type": "rate_limit_error"}}}
    with FaultServer([limited]) as srv:
        agent = Agent(openai_model(srv), capabilities=[RetryBrainCapability(
            {**FAST, "retryHints": "honor"}, clock=clock, on_event=lambda e: events.append(dict(e)))])
        run = asyncio.create_task(agent.run("hi"))
        for _ in range(500):  # the 429's round trip runs in real time
            if clock.pending or run.done():
                break
            await asyncio.sleep(0.01)
        assert clock.pending == [1.0]
        await clock.advance(1.0)
        assert (await run).output == "ok"
        assert len(srv.chat_requests) == 2
    start = events[0]
    assert (start["type"], start["delaySource"], start["delayMs"]) == ("auto_retry_start", "hint", 1000)


# Errors inside a stream (docs/integrations.md, "What a host cannot act on"; issue 33): pydantic-ai
# pulls a stream's first event before handing it to the consumer, so a failure before it is an
# attempt the brain retries; after it, output reached the consumer and the chain ends
# output_streamed (pydantic-ai cannot take the events back).

DROP_BEFORE_OUTPUT = {"stream": [], "drop": True}        # the 200 answered, then the connection reset
ERROR_EVENT = {"stream": [{"error": {"type": "overloaded_error", "message": "Overloaded"}}]}
DROP_AFTER_OUTPUT = {"stream": ["Hel"], "drop": True}    # "Hel" reached the consumer, then a reset


async def consume(agent, how: str) -> tuple[str, list[str]]:
    """The run's text as the consumer saw it, and the event types its handler saw."""
    if how == "run_stream":
        async with agent.run_stream("hi") as run:
            return "".join([text async for text in run.stream_text(delta=True)]), []
    seen: list[str] = []

    async def handler(ctx, stream):
        async for event in stream:
            seen.append(type(event).__name__)
    return (await agent.run("hi", event_stream_handler=handler)).output, seen


@pytest.mark.parametrize("how", ["run_stream", "event_stream_handler"])
@pytest.mark.parametrize("failure", [DROP_BEFORE_OUTPUT, ERROR_EVENT], ids=["drop", "error-event"])
async def test_a_stream_that_fails_before_its_first_event_is_retried(how, failure):
    """run_stream and run(event_stream_handler=...): a connection dropped inside the 200 stream
    before any event, or an overloaded error event there, is a failed attempt the brain
    retries; the consumer sees only the retried answer."""
    events = []
    with FaultServer([failure]) as srv:
        agent = Agent(openai_model(srv), capabilities=[RetryBrainCapability(FAST, on_event=lambda e: events.append(dict(e)))])
        text, seen = await consume(agent, how)
        assert text == "ok"
        assert len(srv.chat_requests) == 2 and all(r["body"].get("stream") for r in srv.chat_requests)
    assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_end"]
    assert events[0]["attempt"] == 1 and events[-1]["success"] is True
    assert how == "run_stream" or seen.count("PartStartEvent") == 1


@pytest.mark.parametrize("how", ["run_stream", "event_stream_handler"])
async def test_a_stream_dropped_after_output_reached_the_consumer_ends_output_streamed(how):
    """A connection dropped after "Hel" reached the consumer: not sent again (pydantic-ai cannot
    take the events back), but the brain hears it — the refusal at rest ends output_streamed
    (attempt 0) and pydantic-ai's own ModelConnectionError says why in its notes."""
    from pydantic_ai.exceptions import ModelConnectionError
    events = []
    with FaultServer([DROP_AFTER_OUTPUT]) as srv:
        agent = Agent(openai_model(srv), capabilities=[RetryBrainCapability(FAST, on_event=lambda e: events.append(dict(e)))])
        with pytest.raises(ModelConnectionError) as caught:
            await consume(agent, how)
        assert len(srv.chat_requests) == 1
    assert [(e["type"], e["endReason"], e["attempt"]) for e in events] == [("auto_retry_end", "output_streamed", 0)]
    assert caught.value.__notes__ == ["retry-fsm: not retried (endReason: output_streamed, attempt 0)"]


async def test_a_retried_stream_that_drops_after_output_ends_its_chain_with_retry_chain_error():
    """A 529, then a stream dropped after output: the chain that started ends output_streamed
    and RetryChainError comes from pydantic-ai's error, as fsm.retrying raises it."""
    events = []
    with FaultServer([OVERLOADED, DROP_AFTER_OUTPUT]) as srv:
        agent = Agent(openai_model(srv), capabilities=[RetryBrainCapability(FAST, on_event=lambda e: events.append(dict(e)))])
        with pytest.raises(fsm.RetryChainError) as caught:
            await consume(agent, "run_stream")
        assert len(srv.chat_requests) == 2
    assert caught.value.end_reason == "output_streamed"
    assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_end"]
    assert events[-1]["endReason"] == "output_streamed" and events[-1]["success"] is False
