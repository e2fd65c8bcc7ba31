"""The httpx2 transports scrub the request's credentials from what they report: an error body
that echoes the API key (a header or ``?key=`` in the URL) never reaches an event."""

from __future__ import annotations

import httpx2
import pytest

from fsm.integrations.httpx2 import AsyncRetryTransport, RetryTransport

FAST = {"baseDelayMs": 1, "maxDelayMs": 2, "maxRetries": 1}


def _echo(request):
    return httpx2.Response(429, json={"error": {"message": "rate limited for "
                                                + request.headers.get("x-api-key", "")
                                                + request.headers.get("authorization", "")
                                                + " at " + str(request.url)}})


@pytest.mark.parametrize("where", ["x-api-key", "authorization", "url"])
def test_an_error_body_echoing_the_api_key_is_scrubbed_from_events(where):
    """Sync transport: the echoed key (header or URL) is absent from every event."""
    key = f"Zq9xK2mW7vP4rT8yL3nB6cJ1{where.replace('-', '')}Sync"
    headers, url = {}, "http://127.0.0.1:1/v1/chat/completions"
    if where == "x-api-key":
        headers["x-api-key"] = key
    elif where == "authorization":
        headers["authorization"] = f"Bearer {key}"
    else:
        url = f"http://127.0.0.1:1/v1/models/m:generate?key={key}"
    events = []
    transport = RetryTransport(httpx2.MockTransport(_echo), settings=FAST, sleep=lambda s: None,
                               on_event=lambda e: events.append(dict(e)))
    with httpx2.Client(transport=transport) as client:
        assert client.post(url, json={"model": "m"}, headers=headers).status_code == 429
    assert events and events[0]["type"] == "auto_retry_start"
    assert "rate limited" in events[0]["errorMessage"]
    assert key not in repr(events)


async def test_the_async_transport_scrubs_an_echoed_api_key():
    """Async transport: the same for an ``api-key`` header."""
    key = "Zq9xK2mW7vP4rT8yL3nB6cJ1apikeyAsync"
    events = []

    def echo(request):
        return httpx2.Response(503, json={"error": {"message": "bad " + request.headers["api-key"]}})

    transport = AsyncRetryTransport(httpx2.MockTransport(echo), settings=FAST,
                                    on_event=lambda e: events.append(dict(e)))
    async with httpx2.AsyncClient(transport=transport) as client:
        await client.post("http://127.0.0.1:1/v1/chat/completions", json={"model": "m"},
                          headers={"api-key": key})
    assert events and "bad" in events[0]["errorMessage"]
    assert key not in repr(events)
