"""The brain in a LangGraph graph: the node wrapper and the classifier's RetryPolicy, with the
real langgraph and openai packages against the fault server (docs/integrations.md, "LangGraph")."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TypedDict

import openai
import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import RetryPolicy

import fsm
from fsm.core.settings import SettingsError
from fsm.integrations.langgraph import (FrameworkRetriesError, brain_retry_on, brain_retry_policy,
                                        retry_node)
from fsm.testing.fault_server import FaultServer

ROOT = Path(__file__).resolve().parents[2]
FAST = {"baseDelayMs": 1, "maxDelayMs": 5}
OVERLOADED = {"status": 529, "json": {"error": {"type": "overloaded_error", "message": "Overloaded"}}}
UNAUTHORIZED = {"status": 401, "json": {"error": {"type": "authentication_error",
                                                  "message": "invalid api key"}}}


class State(TypedDict):
    answer: str


def graph_for(node, *, retry_policy=None):
    builder = StateGraph(State)
    builder.add_node("ask", node, retry_policy=retry_policy)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    return builder.compile()


def asker(client):
    def ask(state: State) -> dict:
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        return {"answer": reply.choices[0].message.content}
    return ask


def sync_client(srv):
    return openai.OpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0)


def test_the_node_wrapper_retries_a_529_and_the_graph_gets_the_answer():
    """A wrapped node failing once with 529: one retry by the brain, the graph's state has the
    answer, auto_retry_start then a successful auto_retry_end (docs/integrations.md "LangGraph")."""
    events = []
    with FaultServer([OVERLOADED]) as srv:
        node = retry_node(FAST, on_event=lambda e: events.append(dict(e)), sleep=lambda s: None)(asker(sync_client(srv)))
        assert graph_for(node).invoke({"answer": ""}) == {"answer": "ok"}
        assert len(srv.chat_requests) == 2
    assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_end"]
    assert events[-1]["success"] is True


def test_the_node_wrapper_waits_what_the_server_hint_says():
    """retryHints honor: a 429 with retry-after-ms 1500 makes the node wait 1.5 s (the hint, not
    the 1 ms backoff) — what RetryPolicy cannot carry (docs/integrations.md "LangGraph")."""
    slept, events = [], []
    limited = {"status": 429, "headers": {"retry-after-ms": "1500"},
               "json": {"error": {"type": "rate_limit_error", "message": "slow down"}}}
    with FaultServer([limited]) as srv:
        node = retry_node({**FAST, "retryHints": "honor"}, sleep=slept.append,
                          on_event=lambda e: events.append(dict(e)))(asker(sync_client(srv)))
        assert graph_for(node).invoke({"answer": ""})["answer"] == "ok"
    assert slept == [1.5]
    assert events[0]["delaySource"] == "hint"


def test_a_401_in_a_wrapped_node_is_the_sdk_s_own_exception():
    """A fatal error is not retried: one request, openai.AuthenticationError, no events."""
    events = []
    with FaultServer([UNAUTHORIZED]) as srv:
        node = retry_node(FAST, on_event=events.append, sleep=lambda s: None)(asker(sync_client(srv)))
        with pytest.raises(openai.AuthenticationError):
            graph_for(node).invoke({"answer": ""})
        assert len(srv.chat_requests) == 1
    assert events == []


async def test_an_async_node_exhausts_into_retry_chain_error():
    """An async wrapped node, every attempt overloaded: maxRetries + 1 requests, then
    RetryChainError with endReason exhausted (docs/policy.md §10)."""
    with FaultServer([OVERLOADED] * 5) as srv:
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0)

        @retry_node({**FAST, "maxRetries": 2})
        async def ask(state: State) -> dict:
            reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            return {"answer": reply.choices[0].message.content}

        with pytest.raises(fsm.RetryChainError) as caught:
            await graph_for(ask).ainvoke({"answer": ""})
        assert caught.value.end_reason == "exhausted"
        assert len(srv.chat_requests) == 3


def test_a_stream_dropped_inside_the_node_is_retried():
    """A stream cut mid-body inside the node (the node consumes it) reaches the brain and is
    retried; the second stream's text is the answer."""
    with FaultServer([{"stream": ["Hel"], "drop": True}, {"stream": ["Hel", "lo"]}]) as srv:
        client = sync_client(srv)

        @retry_node(FAST, sleep=lambda s: None)
        def ask(state: State) -> dict:
            stream = client.chat.completions.create(model="m", stream=True,
                                                    messages=[{"role": "user", "content": "hi"}])
            return {"answer": "".join(c.choices[0].delta.content or "" for c in stream if c.choices)}

        assert graph_for(ask).invoke({"answer": ""}) == {"answer": "Hello"}
        assert len(srv.chat_requests) == 2


def test_a_wrapped_node_with_a_retry_policy_too_is_refused_before_a_second_chain():
    """One retry owner: LangGraph's own RetryPolicy (retrying everything) runs the wrapped node
    again after the brain's chain ended — FrameworkRetriesError naming the node, and no request
    beyond the brain's maxRetries + 1."""
    with FaultServer([OVERLOADED] * 6) as srv:
        node = retry_node({**FAST, "maxRetries": 1}, sleep=lambda s: None)(asker(sync_client(srv)))
        graph = graph_for(node, retry_policy=RetryPolicy(max_attempts=3, initial_interval=0.001,
                                                         jitter=False, retry_on=lambda e: True))
        with pytest.raises(FrameworkRetriesError, match="node 'ask'.*without retry_policy"):
            graph.invoke({"answer": ""})
        assert len(srv.chat_requests) == 2


def test_the_classifier_retry_policy_retries_a_529_and_not_a_401():
    """brain_retry_policy on a plain node: LangGraph retries the 529 (two requests) and raises
    the 401 at once (one request) — the classifier decides, LangGraph waits."""
    policy = brain_retry_policy({"baseDelayMs": 1, "maxDelayMs": 2, "maxRetries": 2})
    assert (policy.max_attempts, policy.initial_interval, policy.max_interval, policy.jitter) == (3, 0.001, 0.002, False)
    with FaultServer([OVERLOADED]) as srv:
        assert graph_for(asker(sync_client(srv)), retry_policy=policy).invoke({"answer": ""}) == {"answer": "ok"}
        assert len(srv.chat_requests) == 2
    with FaultServer([UNAUTHORIZED]) as srv:
        with pytest.raises(openai.AuthenticationError):
            graph_for(asker(sync_client(srv)), retry_policy=policy).invoke({"answer": ""})
        assert len(srv.chat_requests) == 1


def test_brain_retry_on_refuses_what_a_brain_chain_ended_with():
    """brain_retry_on: a dropped connection is retryable, a programming error is not, and an
    error a brain chain ended with is never retried again (one retry owner)."""
    retry_on = brain_retry_on()
    assert retry_on(openai.APIConnectionError(request=None)) is True
    assert retry_on(KeyError("x")) is False
    ended = fsm.RetryChainError("exhausted", 3, 4, None, "Overloaded", None)
    setattr(ended, "_fsm_chain_ended", True)
    assert retry_on(ended) is False


def test_the_policy_refuses_settings_it_cannot_act_on():
    """retryHints honor, a budget or fallbackModels on the RetryPolicy raise SettingsError naming
    the key (never accepted and ignored); the node wrapper refuses the timeouts."""
    with pytest.raises(SettingsError, match="retryHints.*retry_node"):
        brain_retry_policy({"retryHints": "honor"})
    with pytest.raises(SettingsError, match="budget"):
        brain_retry_policy({"budget": {"maxTokens": 10}})
    with pytest.raises(SettingsError, match="fallbackModels"):
        brain_retry_policy({"fallbackModels": ["m2"]})
    with pytest.raises(SettingsError, match="attemptTimeoutMs"):
        retry_node({"attemptTimeoutMs": 1000})


def test_the_documented_langgraph_example_runs_as_written(monkeypatch):
    """docs/integrations.md's LangGraph example runs as written, on its own, against the fault
    server named by OPENAI_BASE_URL (one 529, then the answer)."""
    docs = (ROOT / "docs" / "integrations.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n(# LangGraph node.*?)```", docs, re.S).group(1)
    printed = []
    with FaultServer([OVERLOADED]) as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        exec(compile(block, "docs/integrations.md", "exec"), {"print": printed.append})
        assert len(srv.chat_requests) == 2
    assert printed[-1] == "ok"
    assert [type(e).__name__ for e in printed[:-1]] == ["AutoRetryStart", "AutoRetryEnd"]
