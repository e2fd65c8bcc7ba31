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
