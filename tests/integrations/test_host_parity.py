"""One failure script, every host a user can choose (SPEC §15.1, issue 30's "Done when";
docs/integrations.md "What a host cannot act on (one table)"): the agent session, the runner
(async and sync), the httpx2 transports (async and sync), tenacity, LangChain and pydantic-ai
send the same requests, wait the same waits, emit the same ``auto_retry_*`` events, end with the
same outcome (docs/policy.md §10) and spend the same retry-budget tokens — except where the one
table says a host cannot act, which is read from the table (and must then show)."""

from __future__ import annotations

from typing import Any, Callable

import httpx2
import openai
import pytest
import tenacity

from fsm import RetryRunner
from fsm.integrations.httpx2 import AsyncRetryTransport, RetryTransport
from fsm.integrations.tenacity import BrainStrategy
from fsm.testing.fault_server import FaultServer

from parity_support import (KEY, MODEL, PROMPT, SCRIPTS, SETTINGS, exemptions, langgraph_async_host,
                            Observation, observe_host, one_node_graph, one_table,
                            RecordingCoordinator, run_settled, runner_async_host, session_host,
                            VirtualClock)

Host = Callable[[FaultServer, dict, VirtualClock, RecordingCoordinator, list], Any]
"""``host(server, settings, clock, coordinator, events)``: runs one call, returns its result or
raises (a session returns its TurnOutcome)."""


# ---------------------------------------------------------------------------- the hosts
def _runner_sync(srv, settings, clock, coordinator, events):
    client = openai.OpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0)
    runner = RetryRunner(settings, on_event=events.append, coordinator=coordinator, clock=clock,
                         sleep=clock.sleep)
    return runner.run_sync(client.chat.completions.create, model=MODEL, messages=PROMPT)


def _httpx2_async(srv, settings, clock, coordinator, events):
    async def run():
        transport = AsyncRetryTransport(settings=settings, on_event=events.append,
                                        coordinator=coordinator, clock=clock)
        async with httpx2.AsyncClient(transport=transport) as http:
            client = openai.AsyncOpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0,
                                        http_client=http)
            return await client.chat.completions.create(model=MODEL, messages=PROMPT)
    return run_settled(run())


def _httpx2_sync(srv, settings, clock, coordinator, events):
    transport = RetryTransport(settings=settings, on_event=events.append,
                               coordinator=coordinator, clock=clock, sleep=clock.sleep)
    with httpx2.Client(transport=transport) as http:
        client = openai.OpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0,
                               http_client=http)
        return client.chat.completions.create(model=MODEL, messages=PROMPT)


def _tenacity(srv, settings, clock, coordinator, events):
    client = openai.OpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0)
    brain = BrainStrategy(settings, on_event=events.append, coordinator=coordinator, clock=clock)

    @tenacity.retry(**brain.kwargs())
    def ask():
        return client.chat.completions.create(model=MODEL, messages=PROMPT)
    return ask()


def _langchain(srv, settings, clock, coordinator, events):
    from langchain.agents import create_agent
    from langchain_openai import ChatOpenAI

    from fsm.integrations.langchain import RetryBrainMiddleware
    model = ChatOpenAI(model=MODEL, base_url=srv.base_url, api_key=KEY, max_retries=0)
    agent = create_agent(model, tools=[], middleware=[RetryBrainMiddleware(
        settings, on_event=events.append, coordinator=coordinator, clock=clock,
        sleep=clock.sleep)])
    return agent.invoke({"messages": PROMPT})


def _pydantic_ai(srv, settings, clock, coordinator, events):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from fsm.integrations.pydantic_ai import RetryBrainCapability

    async def run():
        async with openai.AsyncOpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0) as client:
            agent = Agent(OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=client)),
                          capabilities=[RetryBrainCapability(settings, on_event=events.append,
                                                             coordinator=coordinator,
                                                             clock=clock)])
            return await agent.run("hi")
    return run_settled(run())


def _langgraph_sync(srv, settings, clock, coordinator, events):
    from fsm.integrations.langgraph import retry_node
    client = openai.OpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0)

    @retry_node(settings, on_event=events.append, coordinator=coordinator, clock=clock,
                provider="openai", model=MODEL)
    def ask(state):
        reply = client.chat.completions.create(model=MODEL, messages=PROMPT)
        return {"answer": reply.choices[0].message.content}
    return one_node_graph(ask).invoke({"answer": ""})


HOSTS: dict[str, Host] = {
    "session": session_host, "runner async": runner_async_host, "runner sync": _runner_sync,
    "httpx2 async": _httpx2_async, "httpx2 sync": _httpx2_sync, "tenacity": _tenacity,
    "LangChain": _langchain, "pydantic-ai": _pydantic_ai, "LangGraph sync": _langgraph_sync,
    "LangGraph async": langgraph_async_host}


def observe(host: Host, name: str) -> Observation:
    """Run script ``name`` through ``host`` against a fresh fault server."""
    script = SCRIPTS[name]
    return observe_host(host, script.answers, {**SETTINGS, **script.settings}, VirtualClock())


# ---------------------------------------------------------------------------- the tests
def problems(host: str, script: str, seen: Observation,
             table: dict[str, dict[str, str]]) -> list[str]:
    """How ``seen`` (``host`` on ``script``) departs from the script's expectation, save where
    the one table exempts the host — where it must then depart (else the table is stale)."""
    expected = SCRIPTS[script].expected
    exempt = exemptions(SCRIPTS[script], host, table)
    held = tuple(f for f in Observation.FIELDS if f not in exempt)
    found = seen.differences(expected, held)
    found += [f"{field}: docs/integrations.md says {host} does not act here ({cell!r}), but it "
              "does: update the one table" for field, cell in exempt.items()
              if getattr(seen, field) == getattr(expected, field)]
    return found


@pytest.mark.parametrize("script", sorted(SCRIPTS))
@pytest.mark.parametrize("host", sorted(HOSTS))
def test_every_host_gives_what_the_script_says(host, script):
    """The host sends the script's requests, waits its waits, emits its retry events, ends
    with its outcome (docs/policy.md §10) and accounts its budget tokens; where the one table
    says the host cannot act (docs/integrations.md), that field must differ as documented."""
    assert problems(host, script, observe(HOSTS[host], script), one_table()) == []


# ---------------------------------------------------------------------------- broken hosts
def _ignores_hints(srv, settings, clock, coordinator, events):
    return runner_async_host(srv, {**settings, "retryHints": "ignore"}, clock, coordinator, events)


def _one_retry_more(srv, settings, clock, coordinator, events):
    more = {**settings, "maxRetries": settings.get("maxRetries", 3) + 1}
    return _runner_sync(srv, more, clock, coordinator, events)


def _keeps_its_token(srv, settings, clock, coordinator, events):
    coordinator.return_retry_token = _nothing  # type: ignore[method-assign]
    return session_host(srv, settings, clock, coordinator, events)


def _wraps_a_refusal(srv, settings, clock, coordinator, events):
    from fsm import RetryChainError
    try:
        return _runner_sync(srv, settings, clock, coordinator, events)
    except RetryChainError:
        raise
    except Exception as exc:
        if getattr(exc, "__notes__", None):
            raise RetryChainError("hint_too_long", 0, 1, None, None, None) from exc
        raise


def _hides_its_events(srv, settings, clock, coordinator, events):
    return _httpx2_sync(srv, settings, clock, coordinator, [])


async def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


BROKEN = {"ignores retry hints": (_ignores_hints, "429 with hint"),
          "one retry more": (_one_retry_more, "exhausted chain"),
          "keeps a budget token": (_keeps_its_token, "hint too long"),
          "RetryChainError at attempt 0": (_wraps_a_refusal, "hint too long"),
          "no events": (_hides_its_events, "529 burst then success")}


@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_a_broken_host_is_caught(broken):
    """The comparison can fail: a host that ignores a hint, retries once more, keeps a budget
    token, wraps a refusal at rest in RetryChainError (docs/policy.md §10) or emits no events
    is reported."""
    host, script = BROKEN[broken]
    name = "runner sync" if host is _wraps_a_refusal else "session"
    assert problems(name, script, observe(host, script), one_table()) != []


def test_a_stale_table_is_caught():
    """A cell saying a host cannot act where it does is reported (docs/integrations.md, the one
    table, stays true both ways)."""
    table = one_table()
    row = next(name for name in table if name.startswith("the exception of a chain's end"))
    table[row] = {**table[row], "runner": "cannot (a stale cell)"}
    assert any("update the one table" in p for p in problems(
        "runner sync", "exhausted chain", observe(HOSTS["runner sync"], "exhausted chain"), table))
