"""The chain's deadline passes while an attempt runs (docs/policy.md §13.2; docs/integrations.md,
the one table, row "maxElapsedMs reached during an attempt"): every host that can stop its
attempt aborts it at the deadline, ends the chain ``deadline`` and raises ``RetryChainError``,
as the runner does — the agent session, the runner and LangGraph's ``async`` node alike. A
synchronous call cannot be stopped: the runner's and LangGraph's sync forms let it run to its
end, as the table says (and must then differ).

All on the virtual clock of parity_support: the async hosts' attempt hangs at the fault server
until the deadline's timer (900 ms recorded, fired as soon as the retry has reached the server)
cancels it; the sync hosts' slow attempt takes 5 s of virtual time before its request. No real
sleep."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from fsm import RetryRunner
from fsm.testing.fault_server import FaultServer

from parity_support import (DEADLINE_IN_ATTEMPT, KEY, MODEL, OK, OVERLOADED, PROMPT, SETTINGS,
                            exemptions, langgraph_async_host, Observation, observe_host,
                            one_node_graph, one_table, run_settled, runner_async_host, session_host,
                            VirtualClock)

SLOW_S = 5.0
"""How long the sync hosts' slow attempt takes (virtual seconds): past the deadline."""


DEADLINE_S = 0.9
"""The time left before the deadline when the retry goes (1 s - its 100 ms backoff)."""


class DeadlineClock(VirtualClock):
    """The virtual clock, whose timer of :data:`DEADLINE_S` fires once the retry has reached
    the fault server (``arrived()``): the deadline passes *during* the attempt, not before
    its request is sent (the other timers fire at once, as on :class:`VirtualClock`)."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived = lambda: True

    def call_later(self, delay_s: float, callback: Any, *args: Any) -> Any:
        if round(delay_s * 1000) != round(DEADLINE_S * 1000):
            return super().call_later(delay_s, callback, *args)
        self._wait(delay_s)

        async def fire() -> None:
            while not self.arrived():
                await asyncio.sleep(0.001)  # the server thread records the request
            callback(*args)
        return asyncio.get_running_loop().create_task(fire())




class SlowClient:
    """The sync OpenAI client whose second request takes :data:`SLOW_S` on the virtual clock."""

    def __init__(self, srv: FaultServer, clock: VirtualClock) -> None:
        self.client = openai.OpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0)
        self.clock, self.calls = clock, 0

    def ask(self) -> Any:
        self.calls += 1
        if self.calls == 2:
            self.clock.sleep(SLOW_S)
        return self.client.chat.completions.create(model=MODEL, messages=PROMPT)


def _runner_sync(srv, settings, clock, coordinator, events):
    client = SlowClient(srv, clock)
    runner = RetryRunner(settings, on_event=events.append, coordinator=coordinator, clock=clock,
                         sleep=clock.sleep)
    return runner.run_sync(client.ask)


def _langgraph_sync(srv, settings, clock, coordinator, events):
    from fsm.integrations.langgraph import retry_node
    client = SlowClient(srv, clock)

    @retry_node(settings, on_event=events.append, coordinator=coordinator, clock=clock,
                provider="openai", model=MODEL)
    def ask(state):
        return {"answer": client.ask().choices[0].message.content}
    return one_node_graph(ask).invoke({"answer": ""})


HOSTS = {"session": session_host, "runner async": runner_async_host, "runner sync": _runner_sync,
         "LangGraph async": langgraph_async_host, "LangGraph sync": _langgraph_sync}


def observe(name: str) -> Observation:
    """Run the script through host ``name``: the sync hosts against a server that answers at
    once (their slowness is virtual), the async ones against the script's hanging answer."""
    script = DEADLINE_IN_ATTEMPT
    answers = [OVERLOADED, OK] if name.endswith(" sync") else script.answers
    clock = DeadlineClock()

    def watch(srv: FaultServer) -> None:
        clock.arrived = lambda: len(srv.chat_requests) >= 2
    return observe_host(HOSTS[name], answers, {**SETTINGS, **script.settings}, clock, watch)


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_a_deadline_during_an_attempt(host):
    """An attempt still running at the chain's deadline is aborted there and the chain ends
    ``deadline`` (docs/policy.md §13.2), on every host that can stop it; a host the one table
    says cannot (a sync call) lets it run and differs in its waits, events and outcome."""
    exempt = exemptions(DEADLINE_IN_ATTEMPT, host, one_table())
    seen, expected = observe(host), DEADLINE_IN_ATTEMPT.expected
    held = tuple(f for f in Observation.FIELDS if f not in exempt)
    assert seen.differences(expected, held) == []
    assert [f for f in exempt if getattr(seen, f) == getattr(expected, f)] == [], (
        f"docs/integrations.md says {host} cannot act here, but it does: update the one table")
