"""The brain as a LangChain v1 agent middleware, with the real langchain and langchain-openai /
langchain-anthropic chat models against the fault server."""

from __future__ import annotations

import openai
import pytest
from langchain.agents import create_agent
from langchain_anthropic import ChatAnthropic
from langchain_openai import ChatOpenAI

import fsm
from fsm.integrations.langchain import RetryBrainMiddleware
from fsm.testing.fault_server import FaultServer

FAST = {"baseDelayMs": 1, "maxDelayMs": 5}
OVERLOADED = {"status": 529, "json": {"type": "error", "error": {"type": "overloaded_error",
                                                                 "message": "Overloaded"}}}
UNAUTHORIZED = {"status": 401, "json": {"error": {"type": "authentication_error",
                                                  "message": "invalid api key"}}}


def agent_for(model, events, settings=FAST):
    return create_agent(model, tools=[], middleware=[
        RetryBrainMiddleware(settings, on_event=lambda e: events.append(dict(e)), sleep=lambda s: None)])


def openai_model(srv):
    return ChatOpenAI(model="gpt-test", base_url=srv.base_url, api_key="sk-test", max_retries=0)


def test_a_529_then_success_is_retried_by_the_brain():
    """The agent's model call fails once with 529 and then answers: one retry, success."""
    events = []
    with FaultServer([OVERLOADED]) as srv:
        result = agent_for(openai_model(srv), events).invoke({"messages": [{"role": "user", "content": "hi"}]})
        assert result["messages"][-1].content == "ok"
        assert len(srv.chat_requests) == 2
    assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_end"]


def test_the_anthropic_chat_model_is_retried_too():
    """ChatAnthropic against /v1/messages: the same retry."""
    events = []
    with FaultServer([OVERLOADED]) as srv:
        model = ChatAnthropic(model="claude-test", base_url=srv.base_url.removesuffix("/v1"),
                              api_key="sk-ant-test", max_retries=0)
        result = agent_for(model, events).invoke({"messages": [{"role": "user", "content": "hi"}]})
        assert result["messages"][-1].content
    assert events[-1]["success"] is True


def test_a_401_is_the_model_s_own_exception():
    """A fatal error is not retried and reaches the caller as the SDK's own exception."""
    events = []
    with FaultServer([UNAUTHORIZED]) as srv:
        with pytest.raises(openai.AuthenticationError):
            agent_for(openai_model(srv), events).invoke({"messages": [{"role": "user", "content": "hi"}]})
        assert len(srv.chat_requests) == 1
    assert events == []


async def test_an_exhausted_async_agent_raises_retry_chain_error():
    """ainvoke: every attempt overloaded, maxRetries + 1 requests, then RetryChainError."""
    events = []
    with FaultServer([OVERLOADED] * 5) as srv:
        agent = agent_for(openai_model(srv), events, {**FAST, "maxRetries": 2})
        with pytest.raises(fsm.RetryChainError) as caught:
            await agent.ainvoke({"messages": [{"role": "user", "content": "hi"}]})
        assert caught.value.end_reason == "exhausted"
        assert len(srv.chat_requests) == 3


def test_fallback_models_switch_the_chat_model_after_two_overloads():
    """retry.fallbackModels: after two 529s on the primary the retry goes to the fallback model,
    a retry_fallback event says so, and the fallback answers."""
    events = []
    with FaultServer([OVERLOADED, OVERLOADED]) as srv:
        agent = agent_for(openai_model(srv), events, {**FAST, "fallbackModels": ["gpt-small"]})
        result = agent.invoke({"messages": [{"role": "user", "content": "hi"}]})
        assert result["messages"][-1].content == "ok"
        models = [r["body"]["model"] for r in srv.chat_requests]
    assert models == ["gpt-test", "gpt-test", "gpt-small"]
    assert "retry_fallback" in [e["type"] for e in events]
