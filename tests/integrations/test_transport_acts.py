"""What the httpx2 transports act on beyond the status (docs/integrations.md, the one table:
"fallback switch", "attemptTimeoutMs"): the retries the brain switches to a fallback model send
the JSON body with its ``model`` rewritten, and an attempt is bounded by ``attemptTimeoutMs``,
under the real openai SDK against the fault server."""

from __future__ import annotations

import asyncio

import httpx2
import openai
import pytest

from fsm.integrations.httpx2 import AsyncRetryTransport, RetryTransport
from fsm.testing import FakeClock
from fsm.testing.fault_server import FaultServer

OVERLOADED = {"status": 529, "json": {"type": "error", "error": {"type": "overloaded_error",
                                                                 "message": "Overloaded"}}}
FAST = {"baseDelayMs": 1, "maxDelayMs": 5}
PROMPT = [{"role": "user", "content": "hi"}]


def _models(srv):
    return [r["body"]["model"] for r in srv.chat_requests]


def _sync_ask(srv, transport, **create):
    with httpx2.Client(transport=transport) as http:
        client = openai.OpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0,
                               http_client=http)
        return client.chat.completions.create(model="gpt-test", messages=PROMPT, **create)


async def _async_ask(srv, transport, **create):
    async with httpx2.AsyncClient(transport=transport) as http:
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0,
                                    http_client=http)
        return await client.chat.completions.create(model="gpt-test", messages=PROMPT, **create)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_the_retries_after_two_overloads_go_to_the_fallback_model(kind):
    """retry.fallbackModels (docs/policy.md §13.3): two 529s on the primary, then the retry's
    JSON body names the fallback; retry_fallback says so; the fallback answers; the other
    fields of the body are sent as they were."""
    events = []
    settings = {**FAST, "fallbackModels": ["gpt-small"]}
    with FaultServer([OVERLOADED, OVERLOADED]) as srv:
        if kind == "sync":
            reply = _sync_ask(srv, RetryTransport(settings=settings, on_event=events.append,
                                                  sleep=lambda s: None), temperature=0.5)
        else:
            reply = asyncio.run(_async_ask(srv, AsyncRetryTransport(
                settings=settings, on_event=events.append), temperature=0.5))
        assert reply.choices[0].message.content == "ok"
        assert _models(srv) == ["gpt-test", "gpt-test", "gpt-small"]
        assert [r["body"]["temperature"] for r in srv.chat_requests] == [0.5] * 3
        assert [r["body"]["messages"] for r in srv.chat_requests] == [PROMPT] * 3
    fallback = [dict(e) for e in events if e["type"] == "retry_fallback"]
    assert [(f["from"], f["to"]) for f in fallback] == [("gpt-test", "gpt-small")]
    starts = [e for e in events if e["type"] == "auto_retry_start"]
    assert [(s["delaySource"], s["model"]) for s in starts] == [
        ("backoff", "gpt-test"), ("fallback", "gpt-small")]


def test_a_provider_prefixed_fallback_names_the_model_alone():
    """A fallback entry "provider/model" for the provider the request goes to sends "model"."""
    settings = {**FAST, "fallbackModels": ["fault/gpt-small"], "fallbackAfter": 1}
    with FaultServer([OVERLOADED]) as srv:
        _sync_ask(srv, RetryTransport(settings=settings, provider="fault", sleep=lambda s: None))
        assert _models(srv) == ["gpt-test", "gpt-small"]


def test_an_attempt_past_attempt_timeout_ms_is_retried_sync():
    """retry.attemptTimeoutMs (docs/policy.md §13.2): the sync transport stops an attempt whose
    answer does not come within the bound (httpx2's per-request timeouts) and retries it; the
    chain's event names the timeout."""
    events = []
    slow = {"delay_ms": 5000, "stream": ["late"]}
    with FaultServer([slow]) as srv:
        reply = _sync_ask(srv, RetryTransport(settings={**FAST, "attemptTimeoutMs": 200},
                                              on_event=events.append, sleep=lambda s: None))
        assert reply.choices[0].message.content == "ok"
        assert len(srv.chat_requests) == 2
    start = next(e for e in events if e["type"] == "auto_retry_start")
    assert "attempt timed out after 200 ms" in start["errorMessage"]
    assert events[-1]["type"] == "auto_retry_end" and events[-1]["success"] is True


async def test_an_attempt_past_attempt_timeout_ms_is_retried_async():
    """The async transport times the attempt on its clock (a FakeClock here: no real wait for
    the bound), stops it at the bound and retries it."""
    events, clock = [], FakeClock()
    slow = {"delay_ms": 5000, "stream": ["late"]}
    with FaultServer([slow]) as srv:
        transport = AsyncRetryTransport(settings={**FAST, "attemptTimeoutMs": 30_000},
                                        on_event=events.append, clock=clock)
        call = asyncio.ensure_future(_async_ask(srv, transport))
        bound_reached = False
        for _ in range(400):  # the requests' round trips run in real time
            if call.done():
                break
            # a backoff's timer at once; the 30 s bound once, when the slow first attempt is
            # at the server (the retry's own bound never comes: it is answered at once)
            first_waits = len(srv.chat_requests) == 1 and not bound_reached
            if clock.pending and (clock.pending[0] < 1 or first_waits):
                bound_reached = bound_reached or clock.pending[0] >= 1
                await clock.advance(clock.pending[0])
            else:
                await asyncio.sleep(0.01)
        reply = await asyncio.wait_for(call, 5)
        assert reply.choices[0].message.content == "ok"
        assert len(srv.chat_requests) == 2
    start = next(e for e in events if e["type"] == "auto_retry_start")
    assert "attempt timed out after 30 s" in start["errorMessage"]


def test_an_exhausted_chain_of_timeouts_raises_the_sdk_s_timeout_error():
    """Every attempt past the bound: the chain ends exhausted and the SDK raises its own
    timeout error (the transport re-raises the last one, docs/integrations.md)."""
    slow = {"delay_ms": 5000, "stream": ["late"]}
    with FaultServer([slow, slow]) as srv:
        with pytest.raises(openai.APITimeoutError):
            _sync_ask(srv, RetryTransport(settings={**FAST, "attemptTimeoutMs": 150,
                                                    "maxRetries": 1}, sleep=lambda s: None))
        assert len(srv.chat_requests) == 2


class _Answers(httpx2.AsyncBaseTransport):
    """Answers each request with the next status of ``statuses`` (a small JSON body)."""

    def __init__(self, *statuses: int) -> None:
        self.statuses = list(statuses)

    async def handle_async_request(self, request):
        return httpx2.Response(self.statuses.pop(0), json={"error": {"message": "overloaded"}},
                               request=request)


async def test_a_success_at_once_credits_the_budget_and_a_first_failure_still_starts_a_chain():
    """Settings with a retry budget: the chain is built before the first request, so a
    success at once is credited to the budget (the coordinator told). Without them the first
    attempt goes before any chain is built; its failure then starts the chain from that
    attempt (events from attempt 1, the backoff), as before (docs/integrations.md "Cost")."""
    from fsm.fleet import InProcessCoordinator
    from parity_support import VirtualClock

    class Crediting(InProcessCoordinator):
        credited = asyncio.Event()

        async def record_outcome(self, key, **options):
            if options.get("success") and options.get("budget") is not None:
                self.credited.set()
            return await super().record_outcome(key, **options)

    clock = VirtualClock()
    coordinator = Crediting(clock=clock.time_ms)
    budgeted = AsyncRetryTransport(_Answers(200), settings={"budget": {"maxTokens": 4}},
                                   coordinator=coordinator, clock=clock)
    async with httpx2.AsyncClient(transport=budgeted) as client:
        assert (await client.post("http://127.0.0.1:9/v1/chat/completions", json={"model": "m"})).status_code == 200
    await asyncio.wait_for(coordinator.credited.wait(), 10)  # the write goes off the request's path

    events = []
    plain = AsyncRetryTransport(_Answers(529, 200), settings={"baseDelayMs": 100, "jitter": "none"},
                                clock=clock, on_event=lambda e: events.append(dict(e)))
    async with httpx2.AsyncClient(transport=plain) as client:
        assert (await client.post("http://127.0.0.1:9/v1/chat/completions", json={"model": "m"})).status_code == 200
    assert [(e["type"], e.get("attempt")) for e in events] == [("auto_retry_start", 1), ("auto_retry_end", 1)]
    assert events[-1]["success"] is True and clock.waits == [100]
