"""The brain as the OpenAI Agents SDK's model retry policy, with the real openai-agents and
openai packages against the fault server's Responses API (docs/integrations.md, "OpenAI Agents
SDK"); the SDK's trace export is off (SPEC §15.13 "No traffic off the machine")."""

from __future__ import annotations

import os
import re
from pathlib import Path

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

import openai  # noqa: E402
import pytest  # noqa: E402
from agents import Agent, OpenAIProvider, RunConfig, Runner, set_tracing_disabled  # noqa: E402

from fsm.core.settings import SettingsError  # noqa: E402
from fsm.integrations.openai_agents import BrainRetryPolicy, SDKRetriesError  # noqa: E402
from fsm.testing.fault_server import FaultServer  # noqa: E402

set_tracing_disabled(True)
ROOT = Path(__file__).resolve().parents[2]
FAST = {"baseDelayMs": 1, "maxDelayMs": 5}
OVERLOADED = {"status": 529, "json": {"error": {"type": "overloaded_error", "message": "Overloaded"}}}
UNAUTHORIZED = {"status": 401, "json": {"error": {"type": "authentication_error", "message": "bad key"}}}


def run_config(srv, max_retries=0):
    client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=max_retries)
    return RunConfig(model_provider=OpenAIProvider(openai_client=client), tracing_disabled=True)


def agent_with(brain):
    return Agent(name="a", model="m", model_settings=brain.model_settings())


async def test_a_529_then_success_is_retried_and_the_chain_ends_succeeded():
    """A 529 on /v1/responses: the policy retries, the run answers, and the hooks end the chain
    success: true (docs/integrations.md "OpenAI Agents SDK")."""
    events = []
    brain = BrainRetryPolicy(FAST, on_event=lambda e: events.append(dict(e)))
    with FaultServer([OVERLOADED]) as srv:
        result = await Runner.run(agent_with(brain), "hi", hooks=brain.hooks(), run_config=run_config(srv))
        assert result.final_output == "ok"
        assert [r["path"] for r in srv.chat_requests] == ["/v1/responses"] * 2
    assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_end"]
    assert events[-1]["success"] is True


async def test_the_policy_waits_what_the_server_hint_says():
    """retryHints honor: a 429 with retry-after-ms 40 becomes RetryDecision(delay=0.04) — the
    hint, not the backoff (the decision carries the brain's wait)."""
    events = []
    brain = BrainRetryPolicy({**FAST, "retryHints": "honor"}, on_event=lambda e: events.append(dict(e)))
    limited = {"status": 429, "headers": {"retry-after-ms": "40"},
               "json": {"error": {"type": "rate_limit_error", "message": "slow down"}}}
    with FaultServer([limited]) as srv:
        result = await Runner.run(agent_with(brain), "hi", hooks=brain.hooks(), run_config=run_config(srv))
        assert result.final_output == "ok"
    assert (events[0]["delayMs"], events[0]["delaySource"]) == (40, "hint")


async def test_a_401_is_not_retried():
    """A fatal error: the policy says no, one request, the SDK's own exception."""
    brain = BrainRetryPolicy(FAST)
    with FaultServer([UNAUTHORIZED]) as srv:
        with pytest.raises(openai.AuthenticationError):
            await Runner.run(agent_with(brain), "hi", hooks=brain.hooks(), run_config=run_config(srv))
        assert len(srv.chat_requests) == 1


async def test_an_exhausted_chain_stops_at_max_retries_with_its_end_reason():
    """maxRetries 2, every attempt overloaded: 3 requests (the SDK's max_retries is above the
    brain's, so the brain ends the chain), endReason exhausted in the exception's notes."""
    events = []
    brain = BrainRetryPolicy({**FAST, "maxRetries": 2}, on_event=lambda e: events.append(dict(e)))
    with FaultServer([OVERLOADED] * 5) as srv:
        with pytest.raises(openai.APIStatusError) as caught:
            await Runner.run(agent_with(brain), "hi", hooks=brain.hooks(), run_config=run_config(srv))
        assert len(srv.chat_requests) == 3
    assert "retry-fsm: endReason exhausted" in caught.value.__notes__
    assert events[-1]["endReason"] == "exhausted" and events[-1]["success"] is False


async def test_a_dropped_stream_before_output_is_retried_in_run_streamed():
    """run_streamed: a Responses stream cut right after response.created (before any output)
    reaches the policy, the brain retries it, and the second stream answers."""
    brain = BrainRetryPolicy(FAST)
    with FaultServer([{"stream": [], "drop": True}, {"stream": ["Hel", "lo"]}]) as srv:
        run = Runner.run_streamed(agent_with(brain), "hi", hooks=brain.hooks(), run_config=run_config(srv))
        async for _ in run.stream_events():
            pass
        assert run.final_output == "Hello"
        assert len(srv.chat_requests) == 2


async def test_the_client_s_own_retries_are_refused():
    """One retry owner: an OpenAI client with max_retries=1 retries the 529 itself; the policy
    sees x-stainless-retry-count 1 and raises SDKRetriesError instead of retrying again."""
    brain = BrainRetryPolicy(FAST)
    with FaultServer([OVERLOADED] * 4) as srv:
        with pytest.raises(SDKRetriesError, match="max_retries=0"):
            await Runner.run(agent_with(brain), "hi", hooks=brain.hooks(),
                             run_config=run_config(srv, max_retries=1))
        assert len(srv.chat_requests) == 2


def test_settings_the_policy_cannot_act_on_are_refused():
    """fallbackModels and the timeouts raise SettingsError naming the key."""
    with pytest.raises(SettingsError, match="fallbackModels"):
        BrainRetryPolicy({"fallbackModels": ["m2"]})
    with pytest.raises(SettingsError, match="attemptTimeoutMs"):
        BrainRetryPolicy({"attemptTimeoutMs": 1000})


def test_the_documented_agents_example_runs_as_written(monkeypatch):
    """docs/integrations.md's Agents SDK example runs as written, on its own (it runs its
    ``main()``), against the fault server named by OPENAI_BASE_URL."""
    docs = (ROOT / "docs" / "integrations.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n(# OpenAI Agents SDK.*?)```", docs, re.S).group(1)
    printed = []
    with FaultServer([OVERLOADED]) as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        exec(compile(block, "docs/integrations.md", "exec"), {"print": printed.append})
        assert len(srv.chat_requests) == 2
    assert printed[-1] == "ok"
    assert [type(e).__name__ for e in printed[:-1]] == ["AutoRetryStart", "AutoRetryEnd"]
