"""The httpx2 transports read at most a 64 KiB prefix of an error body to classify it; the
response handed back stays usable (its body that prefix)."""

from __future__ import annotations

import gzip
import json

import httpx2

from fsm.integrations.httpx2 import ERROR_BODY_LIMIT, AsyncRetryTransport, RetryTransport

URL = "http://127.0.0.1:1/v1/chat/completions"
ONE_SHOT = {"maxRetries": 0}


class _Endless(httpx2.SyncByteStream, httpx2.AsyncByteStream):
    """A 1 MiB-chunk body of 100 chunks that counts the chunks it yielded."""

    def __init__(self):
        self.yielded = 0

    def __iter__(self):
        for _ in range(100):
            self.yielded += 1
            yield b"x" * (1 << 20)

    async def __aiter__(self):
        for chunk in self.__iter__():
            yield chunk


def test_a_huge_error_body_is_read_only_up_to_the_limit():
    """Sync: a 100 MiB 503 body: 1 chunk read, the SDK gets a 503 whose body is the 64 KiB prefix."""
    body = _Endless()
    transport = RetryTransport(httpx2.MockTransport(lambda r: httpx2.Response(503, stream=body)),
                               settings=ONE_SHOT)
    with httpx2.Client(transport=transport) as client:
        response = client.post(URL, json={"model": "m"})
    assert response.status_code == 503
    assert body.yielded == 1
    assert len(response.content) == ERROR_BODY_LIMIT


async def test_a_huge_error_body_is_read_only_up_to_the_limit_async():
    """Async: the same through AsyncRetryTransport and a streamed request."""
    body = _Endless()
    transport = AsyncRetryTransport(httpx2.MockTransport(lambda r: httpx2.Response(503, stream=body)),
                                    settings=ONE_SHOT)
    async with httpx2.AsyncClient(transport=transport) as client:
        async with client.stream("POST", URL, json={"model": "m"}) as response:
            content = await response.aread()
    assert response.status_code == 503 and body.yielded == 1
    assert len(content) == ERROR_BODY_LIMIT


def test_a_small_gzip_error_body_still_reads_whole_for_the_sdk():
    """A gzip-encoded streamed 400 body under the limit is handed back decoded and whole."""
    payload = {"error": {"message": "bad request", "type": "invalid_request_error"}}

    class Gz(httpx2.SyncByteStream):
        def __iter__(self):
            yield gzip.compress(json.dumps(payload).encode())

    def handler(request):
        return httpx2.Response(400, headers={"content-encoding": "gzip"}, stream=Gz())

    with httpx2.Client(transport=RetryTransport(httpx2.MockTransport(handler))) as client:
        response = client.post(URL, json={"model": "m"})
    assert response.status_code == 400 and response.json() == payload
