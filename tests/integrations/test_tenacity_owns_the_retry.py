"""tenacity's BrainStrategy is the one retry owner while an attempt runs: an fsm httpx2
transport under a tenacity-retried call passes its requests through."""

from __future__ import annotations

import httpx2
import pytest
import tenacity

from fsm.host.chain import RETRY_OWNER
from fsm.host.runner import RetryChainError
from fsm.integrations.httpx2 import AsyncRetryTransport, RetryTransport
from fsm.integrations.tenacity import BrainStrategy

SETTINGS = {"baseDelayMs": 1, "maxDelayMs": 2, "maxRetries": 2}
URL = "http://127.0.0.1:1/v1/chat/completions"


def _overloaded_handler(sent):
    def handler(request):
        sent.append(request)
        return httpx2.Response(503, json={"error": {"message": "overloaded"}})
    return handler


def test_a_transport_under_a_tenacity_retried_call_passes_through():
    """Retrying + RetryTransport: 3 requests (tenacity's 1 + 2 retries), not 3 × 3."""
    sent = []
    client = httpx2.Client(transport=RetryTransport(httpx2.MockTransport(_overloaded_handler(sent)),
                                                     settings=SETTINGS, sleep=lambda s: None))
    brain = BrainStrategy(SETTINGS)
    kwargs = brain.kwargs()
    kwargs["sleep"] = lambda seconds: brain.sleep(0)

    @tenacity.retry(**kwargs)
    def ask():
        client.post(URL, json={"model": "m"}).raise_for_status()

    with pytest.raises(RetryChainError):
        ask()
    assert len(sent) == 3
    assert RETRY_OWNER.get() is None  # ownership given back after the call


async def test_an_async_transport_under_async_retrying_passes_through():
    """AsyncRetrying + AsyncRetryTransport: 3 requests, and no owner left behind."""
    sent = []
    client = httpx2.AsyncClient(transport=AsyncRetryTransport(
        httpx2.MockTransport(_overloaded_handler(sent)), settings=SETTINGS))
    brain = BrainStrategy(SETTINGS)
    with pytest.raises(RetryChainError):
        async for attempt in tenacity.AsyncRetrying(**brain.kwargs(asynchronous=True)):
            with attempt:
                (await client.post(URL, json={"model": "m"})).raise_for_status()
    assert len(sent) == 3
    assert RETRY_OWNER.get() is None
