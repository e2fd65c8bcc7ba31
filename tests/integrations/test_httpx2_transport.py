"""The httpx2 transports under the real openai and anthropic SDKs, against the fault server."""

from __future__ import annotations

import asyncio
import warnings

import anthropic
import httpx2
import openai
import pytest

from fsm.integrations.httpx2 import AsyncRetryTransport, RetryTransport, SDKRetriesWarning
from fsm.testing.fault_server import FaultServer

OVERLOADED = {"status": 529, "json": {"type": "error", "error": {"type": "overloaded_error",
                                                                 "message": "Overloaded"}}}
RATE_LIMITED = {"status": 429, "headers": {"retry-after-ms": "30"},
                "json": {"error": {"type": "rate_limit_error", "message": "Rate limit reached"}}}
UNAUTHORIZED = {"status": 401, "json": {"error": {"type": "authentication_error",
                                                  "message": "invalid x-api-key"}}}
FAST = {"baseDelayMs": 1, "maxDelayMs": 5}


def openai_client(srv, transport, **kw):
    return openai.AsyncOpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0,
                              http_client=httpx2.AsyncClient(transport=transport), **kw)


def anthropic_client(srv, transport):
    return anthropic.AsyncAnthropic(base_url=srv.base_url.removesuffix("/v1"), api_key="sk-ant-test",
                                    max_retries=0, http_client=httpx2.AsyncClient(transport=transport))


async def ask_openai(client):
    reply = await client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "hi"}])
    return reply.choices[0].message.content


async def ask_anthropic(client):
    reply = await client.messages.create(model="claude-test", max_tokens=16,
                                         messages=[{"role": "user", "content": "hi"}])
    return reply


async def test_a_529_then_success_is_retried_once_under_openai():
    """A 529 then a success: one retry, the SDK sees the success, the chain ends succeeded."""
    events = []
    with FaultServer([OVERLOADED]) as srv:
        client = openai_client(srv, AsyncRetryTransport(settings=FAST, on_event=lambda e: events.append(dict(e))))
        assert await ask_openai(client) == "ok"
        assert len(srv.chat_requests) == 2
    assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_end"]
    assert events[0]["attempt"] == 1 and events[-1]["success"] is True


async def test_a_529_then_success_is_retried_once_under_anthropic():
    """The same through the Anthropic SDK and the Messages API."""
    events = []
    with FaultServer([OVERLOADED]) as srv:
        client = anthropic_client(srv, AsyncRetryTransport(settings=FAST, on_event=lambda e: events.append(dict(e))))
        reply = await ask_anthropic(client)
        assert reply.content[0].text
        assert [r["path"] for r in srv.chat_requests] == ["/v1/messages", "/v1/messages"]
    assert events[-1]["type"] == "auto_retry_end" and events[-1]["success"] is True


async def test_a_429_retry_after_ms_is_honoured():
    """With hints honoured the retry waits what the server asked (delaySource hint)."""
    events = []
    with FaultServer([RATE_LIMITED]) as srv:
        transport = AsyncRetryTransport(settings={**FAST, "retryHints": "honor", "maxHintWaitMs": 1000},
                                        on_event=lambda e: events.append(dict(e)))
        assert await ask_openai(openai_client(srv, transport)) == "ok"
    start = events[0]
    assert start["delaySource"] == "hint" and start["delayMs"] >= 30


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
async def test_a_401_is_raised_as_the_sdk_s_own_exception(sdk):
    """A fatal 401 is not retried: the response goes back and the SDK raises its own error."""
    events = []
    with FaultServer([UNAUTHORIZED]) as srv:
        transport = AsyncRetryTransport(settings=FAST, on_event=lambda e: events.append(dict(e)))
        if sdk == "openai":
            with pytest.raises(openai.AuthenticationError):
                await ask_openai(openai_client(srv, transport))
        else:
            with pytest.raises(anthropic.AuthenticationError):
                await ask_anthropic(anthropic_client(srv, transport))
        assert len(srv.chat_requests) == 1
    assert events == []


async def test_an_exhausted_chain_hands_the_last_response_to_the_sdk():
    """Every attempt overloaded: maxRetries + 1 requests, then the SDK raises its 529 error."""
    events = []
    with FaultServer([OVERLOADED] * 5) as srv:
        transport = AsyncRetryTransport(settings={**FAST, "maxRetries": 2}, on_event=lambda e: events.append(dict(e)))
        with pytest.raises(openai.APIStatusError) as caught:
            await ask_openai(openai_client(srv, transport))
        assert caught.value.status_code == 529
        assert len(srv.chat_requests) == 3
    assert events[-1]["endReason"] == "exhausted" and events[-1]["attempt"] == 2


async def test_a_cancelled_call_ends_its_chain():
    """Cancelling the task during the backoff ends the chain cancelled, no further request."""
    events = []
    with FaultServer([OVERLOADED] * 3) as srv:
        transport = AsyncRetryTransport(settings={"baseDelayMs": 60_000}, on_event=lambda e: events.append(dict(e)))
        task = asyncio.ensure_future(ask_openai(openai_client(srv, transport)))
        while not events:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(srv.chat_requests) == 1
    assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_end"]
    assert events[-1]["endReason"] == "cancelled"


async def test_a_connection_error_is_retried():
    """A connection reset before any answer is a retryable network failure."""
    seen = []

    def answer(request):
        seen.append(request)
        if len(seen) == 1:
            raise httpx2.ReadError("Connection reset by peer")
        return httpx2.Response(200, json={"id": "x", "object": "chat.completion", "created": 0,
                                          "model": "m", "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": "ok"}}]})

    events = []
    transport = AsyncRetryTransport(httpx2.MockTransport(answer), settings=FAST,
                                    on_event=lambda e: events.append(dict(e)))
    client = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="sk-test", max_retries=0,
                                http_client=httpx2.AsyncClient(transport=transport))
    assert await ask_openai(client) == "ok"
    assert len(seen) == 2 and events[0]["type"] == "auto_retry_start"


def test_the_sync_transport_retries_under_the_sync_client():
    """httpx2.Client with RetryTransport: a 529 then success through openai.OpenAI."""
    slept = []
    with FaultServer([OVERLOADED]) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0,
                               http_client=httpx2.Client(transport=RetryTransport(settings=FAST, sleep=slept.append)))
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content == "ok"
    assert len(slept) == 1


def test_a_one_shot_body_is_not_retried_and_says_so():
    """A streamed request body cannot be replayed: the error response is returned as it came."""
    with FaultServer([OVERLOADED]) as srv:
        with httpx2.Client(transport=RetryTransport(settings=FAST, sleep=lambda s: None)) as http:
            response = http.post(srv.base_url + "/chat/completions", content=iter([b'{"model": "m"}']))
        assert response.status_code == 529
        assert len(srv.chat_requests) == 1


async def test_the_sdk_s_own_retries_are_named_in_a_warning():
    """An SDK with its own retries on sends x-stainless-retry-count > 0 when it retries: the
    transport warns once that there are two retry owners."""
    boom = {"status": 500, "json": {"error": {"message": "boom"}}}
    with FaultServer([boom] * 4) as srv:
        transport = AsyncRetryTransport(settings={**FAST, "maxRetries": 0})
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=2,
                                    http_client=httpx2.AsyncClient(transport=transport))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with pytest.raises(openai.InternalServerError):
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert len(srv.chat_requests) == 3
    assert [w.category for w in seen if issubclass(w.category, SDKRetriesWarning)] == [SDKRetriesWarning]


async def test_a_call_already_owned_by_an_fsm_host_passes_through():
    """Under fsm.retrying the transport does not retry: the runner is the one retry owner."""
    import fsm
    events = []
    with FaultServer([OVERLOADED]) as srv:
        transport = AsyncRetryTransport(settings=FAST, on_event=lambda e: events.append(("transport", e.type)))
        client = openai_client(srv, transport)
        result = await fsm.retrying(ask_openai, client, settings=FAST,
                                    on_event=lambda e: events.append(("runner", e.type)))
        assert result == "ok"
        assert len(srv.chat_requests) == 2
    assert {who for who, _ in events} == {"runner"}


def test_sync_transports_share_a_cooldown_through_the_coordinator_facade():
    """Two sync transports on one coordinator: a retry hint one learned delays the other's retry
    (the coordinator is asynchronous; the sync facade speaks to it on a background loop). The
    coordinator's clock stands still, so that a loaded machine cannot let the cooldown run out
    between the two calls (docs/integrations.md)."""
    from fsm.fleet import InProcessCoordinator
    coordinator = InProcessCoordinator(clock=lambda: 1_000_000)
    hinted = {"status": 429, "headers": {"retry-after-ms": "400"},
              "json": {"error": {"type": "rate_limit_error", "message": "Rate limit reached"}}}
    settings = {**FAST, "retryHints": "honor", "maxHintWaitMs": 5000}
    first, second = [], []
    with FaultServer([hinted, {}, OVERLOADED]) as srv:
        for events in (first, second):
            transport = RetryTransport(settings=settings, coordinator=coordinator, sleep=lambda s: None,
                                       on_event=lambda e, events=events: events.append(dict(e)))
            with httpx2.Client(transport=transport) as http:
                assert http.post(srv.base_url + "/chat/completions", json={"model": "m"}).status_code == 200
    assert first[0]["delaySource"] == "hint"
    assert second[0]["delaySource"] == "cooldown" and second[0]["delayMs"] > FAST["maxDelayMs"]


async def test_an_in_memory_multipart_upload_is_retried():
    """files.create(file=(name, bytes)) with a 529 is sent again, the same form both times
    (docs/integrations.md, "What a transport cannot replay")."""
    events = []
    with FaultServer([OVERLOADED]) as srv:
        client = openai_client(srv, AsyncRetryTransport(settings=FAST, on_event=lambda e: events.append(dict(e))))
        uploaded = await client.files.create(file=("batch.jsonl", b'{"a": 1}\n'), purpose="batch")
        assert uploaded.id == "file-fault-1"
        first, second = srv.chat_requests
        assert first["body_bytes"] == second["body_bytes"] > len(b'{"a": 1}\n')
    assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_end"]


def test_a_sync_in_memory_multipart_upload_is_retried():
    """The sync transport replays an in-memory multipart form too (docs/integrations.md)."""
    with FaultServer([OVERLOADED]) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0,
                               http_client=httpx2.Client(transport=RetryTransport(settings=FAST)))
        assert client.files.create(file=("batch.jsonl", b"{}\n"), purpose="batch").id == "file-fault-1"
        assert len(srv.chat_requests) == 2


def test_a_multipart_upload_from_a_pipe_is_not_replayed():
    """A form whose file is a one-shot stream is sent once (docs/integrations.md)."""
    with FaultServer([OVERLOADED]) as srv:
        transport = RetryTransport(settings=FAST)
        request = httpx2.Request("POST", srv.base_url + "/files", files={"file": ("a.bin", _OneShot())})
        response = transport.handle_request(request)
        assert response.status_code == 529 and len(srv.chat_requests) == 1


class _OneShot:
    """A file-like object read once (a pipe)."""

    def __init__(self):
        self.data = b"once"

    def read(self, size=-1):
        data, self.data = self.data, b""
        return data
