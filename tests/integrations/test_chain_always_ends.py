"""A started chain always gets exactly one ``auto_retry_end``, whatever ends the call: the
httpx2 transports, the LangChain middleware and the pydantic-ai capability."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
import httpx2
import openai
import pytest
from langgraph.errors import GraphInterrupt

from fsm.integrations.httpx2 import AsyncRetryTransport, RetryTransport
from fsm.integrations.langchain import RetryBrainMiddleware

FAST = {"baseDelayMs": 1, "maxDelayMs": 5, "maxRetries": 3}
URL = "http://127.0.0.1:1/v1/chat/completions"


def _second_fails(second):
    """A mock handler: a 503 first, then ``second()`` (a response, or raises)."""
    calls = {"n": 0}

    def handler(request):
        calls["n"] += 1
        if calls["n"] == 1:
            return httpx2.Response(503, json={"error": {"message": "overloaded"}})
        return second()
    return handler


def _raise(exc):
    def go():
        raise exc
    return go


def _ends(events):
    return [e for e in events if e["type"] == "auto_retry_end"]


BAD_GZIP = lambda: httpx2.Response(503, headers={"content-encoding": "gzip"}, content=b"notgzip")  # noqa: E731


@pytest.mark.parametrize("second", [_raise(ValueError("boom")), _raise(KeyboardInterrupt())],
                         ids=["ValueError", "KeyboardInterrupt"])
def test_sync_transport_ends_a_started_chain_on_any_exception(second):
    """RetryTransport: an unhandled exception in a retried attempt ends the chain once, re-raised."""
    events = []
    transport = RetryTransport(httpx2.MockTransport(_second_fails(second)), settings=FAST,
                               sleep=lambda s: None, on_event=lambda e: events.append(dict(e)))
    with httpx2.Client(transport=transport) as client, pytest.raises(BaseException) as info:
        client.post(URL, json={"model": "m"})
    assert type(info.value).__name__ in ("ValueError", "KeyboardInterrupt")
    assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_end"]
    assert _ends(events)[0]["success"] is False


@pytest.mark.parametrize("second", [_raise(ValueError("boom")), _raise(KeyboardInterrupt())],
                         ids=["ValueError", "KeyboardInterrupt"])
async def test_async_transport_ends_a_started_chain_on_any_exception(second):
    """AsyncRetryTransport: the same for the async transport."""
    events = []
    transport = AsyncRetryTransport(httpx2.MockTransport(_second_fails(second)), settings=FAST,
                                    on_event=lambda e: events.append(dict(e)))
    async with httpx2.AsyncClient(transport=transport) as client:
        with pytest.raises(BaseException):
            await client.post(URL, json={"model": "m"})
    assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_end"]


async def test_an_undecodable_error_body_is_classified_by_its_status():
    """A 503 whose gzip body cannot be decoded is still a 503: retried, one end, no DecodingError."""
    events = []
    transport = AsyncRetryTransport(httpx2.MockTransport(_second_fails(BAD_GZIP)), settings=FAST,
                                    on_event=lambda e: events.append(dict(e)))
    async with httpx2.AsyncClient(transport=transport) as client:
        with pytest.raises(httpx2.DecodingError):  # the SDK's own read of the returned body
            await client.post(URL, json={"model": "m"})
    assert len(_ends(events)) == 1
    assert _ends(events)[0]["success"] is False


def _overloaded():
    request = httpx.Request("POST", "http://x/v1/chat/completions")
    response = httpx.Response(503, request=request, json={"error": {"message": "overloaded"}})
    return openai.InternalServerError("overloaded", response=response, body=None)


REQUEST = SimpleNamespace(model=SimpleNamespace(model_name="m"))


@pytest.mark.parametrize("second", [lambda: GraphInterrupt([]), KeyboardInterrupt, lambda: SystemExit(1)],
                         ids=["GraphInterrupt", "KeyboardInterrupt", "SystemExit"])
def test_langchain_middleware_ends_a_started_chain_cancelled(second):
    """RetryBrainMiddleware: an interrupt or exit in a retried call ends the chain cancelled, sync and async."""
    for run_async in (False, True):
        events = []
        middleware = RetryBrainMiddleware(FAST, on_event=lambda e: events.append(dict(e)),
                                          sleep=lambda s: None)
        calls = {"n": 0}

        def handler(request):
            calls["n"] += 1
            if calls["n"] == 1:
                raise _overloaded()
            raise second()

        async def ahandler(request):
            return handler(request)

        with pytest.raises(BaseException) as info:
            if run_async:
                asyncio.run(middleware.awrap_model_call(REQUEST, ahandler))
            else:
                middleware.wrap_model_call(REQUEST, handler)
        assert type(info.value) is type(second())
        assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_end"]
        assert events[-1]["endReason"] == "cancelled"


async def test_pydantic_ai_capability_ends_a_started_chain_on_keyboard_interrupt():
    """RetryBrainCapability: a KeyboardInterrupt in a retried request ends the chain cancelled."""
    from pydantic_ai import Agent
    from pydantic_ai.exceptions import ModelHTTPError
    from pydantic_ai.models.function import FunctionModel

    from fsm.integrations.pydantic_ai import RetryBrainCapability
    events, calls = [], {"n": 0}

    async def model(messages, info):
        calls["n"] += 1
        if calls["n"] == 1:
            raise ModelHTTPError(503, "m", body={"error": {"message": "overloaded"}})
        raise KeyboardInterrupt

    agent = Agent(FunctionModel(model), capabilities=[
        RetryBrainCapability(FAST, on_event=lambda e: events.append(dict(e)))])
    with pytest.raises(KeyboardInterrupt):
        await agent.run("hi")
    assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_end"]
    assert events[-1]["endReason"] == "cancelled"


@pytest.mark.parametrize("value", [b"\xb2", b"\xd9\xa3", "99999999999999999999999"])
def test_a_non_ascii_stainless_retry_count_does_not_crash(value):
    """x-stainless-retry-count "²" (non-ASCII digits): the request goes out, no crash, no warning."""
    import warnings
    transport = RetryTransport(httpx2.MockTransport(lambda r: httpx2.Response(200)))
    with httpx2.Client(transport=transport) as client, warnings.catch_warnings():
        warnings.simplefilter("error" if isinstance(value, bytes) else "ignore")
        assert client.get(URL, headers={"x-stainless-retry-count": value}).status_code == 200


def test_a_one_shot_body_read_by_the_sender_is_still_not_retried():
    """A generator body is not retried even when the sender read it into bytes (request.read())."""
    sent = []

    def handler(request):
        request.read()
        sent.append(request)
        return httpx2.Response(503)

    def body():
        yield b'{"model":'
        yield b'"m"}'

    transport = RetryTransport(httpx2.MockTransport(handler), settings=FAST, sleep=lambda s: None)
    with httpx2.Client(transport=transport) as client:
        assert client.post(URL, content=body()).status_code == 503
    assert len(sent) == 1
