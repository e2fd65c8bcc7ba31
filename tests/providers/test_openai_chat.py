"""OpenAIChatProvider against the in-process FaultServer: streams, failures as error messages,
one HTTP request per call, cancellation."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx2
import openai
import pytest

from fsm.core.classify import classify, classify_message
from fsm.core.messages import AssistantMessage, Usage
from fsm.providers import FaultServer, OpenAIChatProvider, Provider, describe_error
from fsm.providers.openai_chat import NO_KEY_PLACEHOLDER, TRUNCATED_MESSAGE

HI = [{"role": "user", "content": "hi"}]
OVERLOADED_529 = {"status": 529, "json": {"type": "error", "error": {
    "type": "overloaded_error", "message": "Overloaded"}}}
UNAVAILABLE_503 = {"status": 503, "json": {"error": {
    "message": "Service Unavailable", "type": "server_error", "code": "service_unavailable"}}}
BAD_KEY_401 = {"status": 401, "json": {"error": {
    "message": "Incorrect API key provided: oracle-***-key.", "type": "invalid_request_error",
    "code": "invalid_api_key"}}}
RATE_LIMIT_429 = {"status": 429, "headers": {"retry-after": "60"}, "json": {"error": {
    "message": "Rate limit reached. Please try again in 60s.", "type": "rate_limit_error",
    "code": "rate_limit_exceeded"}}}


def complete(script: list[dict], *, calls: int = 1, **kwargs) -> tuple[list[AssistantMessage], list[dict]]:
    """Run ``calls`` completions against a server playing ``script``; return messages, requests."""
    async def go(base_url: str) -> list[AssistantMessage]:
        provider = OpenAIChatProvider(base_url=base_url, model="test-model",
                                      **{"api_key": "test-key", **kwargs})
        try:
            return [await provider.complete(HI) for _ in range(calls)]
        finally:
            await provider.aclose()

    with FaultServer(script) as srv:
        messages = asyncio.run(go(srv.base_url))
        return messages, srv.chat_requests


def one(entry: dict, **kwargs) -> AssistantMessage:
    messages, requests = complete([entry], **kwargs)
    assert len(requests) == 1
    return messages[0]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- success ----------------------------------------------------------------------------

def test_success_stream_delivers_deltas_text_and_usage():
    """Success stream delivers deltas text and usage."""
    deltas: list[str] = []

    async def go(base_url: str) -> AssistantMessage:
        provider = OpenAIChatProvider(base_url=base_url, model="test-model", api_key="k")
        msg = await provider.complete(HI, on_text=deltas.append)
        await provider.aclose()
        return msg

    usage = {"prompt_tokens": 120, "completion_tokens": 7, "total_tokens": 127,
             "prompt_tokens_details": {"cached_tokens": 100}}
    with FaultServer([{"stream": ["Hel", "lo"], "usage": usage}]) as srv:
        msg = asyncio.run(go(srv.base_url))
        [req] = srv.chat_requests
    assert deltas == ["Hel", "lo"]
    assert msg.stop_reason == "stop" and msg.text == "Hello" and msg.error_message is None
    assert msg.usage == Usage(input=20, output=7, cache_read=100)
    assert msg.model == "test-model"
    assert req["body"]["stream"] is True
    assert req["body"]["stream_options"] == {"include_usage": True}
    assert req["body"]["messages"] == HI and req["body"]["model"] == "test-model"


def test_usage_is_none_when_the_server_sends_none():
    """Usage is none when the server sends none."""
    msg = one({"stream": ["a"], "usage": None})
    assert msg.stop_reason == "stop" and msg.usage is None


@pytest.mark.parametrize("finish_reason, stop_reason", [
    ("stop", "stop"), ("length", "length"), ("tool_calls", "toolUse"),
    ("function_call", "toolUse"), ("end_turn", "stop")])
def test_finish_reason_mapping(finish_reason, stop_reason):
    """Finish reason mapping."""
    msg = one({"stream": ["abc"], "finish_reason": finish_reason})
    assert msg.stop_reason == stop_reason and msg.text == "abc" and msg.error_message is None


def test_content_filter_is_an_error_that_keeps_the_text():
    """Content filter is an error that keeps the text."""
    msg = one({"stream": ["abc"], "finish_reason": "content_filter"})
    assert msg.stop_reason == "error" and msg.text == "abc"
    assert msg.error_message == ("Response blocked by the provider's content filter "
                                 "(finish_reason: content_filter)")


def test_finish_reason_error_is_an_error():
    """Finish reason error is an error."""
    msg = one({"stream": ["abc"], "finish_reason": "error"})
    assert msg.stop_reason == "error" and msg.text == "abc"
    assert msg.error_message == "Provider finish_reason: error"
    assert classify_message(msg).kind == "retryable"


def test_unknown_finish_reason_network_error_is_retryable_error():
    # a router ends the stream with a reason the provider layer does not know: the partial text
    # is not the answer, the turn is an error and a network error is retried (docs/policy.md §8 item 14)
    """Unknown finish reason network error is retryable error."""
    msg = one({"stream": ["partial answ"], "finish_reason": "network_error"})
    assert msg.stop_reason == "error" and msg.text == "partial answ"
    assert msg.error_message == "Provider finish_reason: network_error"
    assert classify_message(msg).kind == "retryable"


def test_other_unknown_finish_reasons_are_errors_classified_by_the_same_rules():
    """Other unknown finish reasons are errors classified by the same rules."""
    msg = one({"stream": ["x"], "finish_reason": "MALFORMED_FUNCTION_CALL"})
    assert msg.stop_reason == "error"
    assert msg.error_message == "Provider finish_reason: MALFORMED_FUNCTION_CALL"
    assert classify_message(msg).kind == "fatal"


def test_choices_other_than_the_first_are_ignored():
    """Choices other than the first are ignored."""
    other = {"object": "chat.completion.chunk", "id": "x", "created": 0, "model": "m",
             "choices": [{"index": 1, "delta": {"content": "NO"}, "finish_reason": None}]}
    msg = one({"stream": ["yes", other]})
    assert msg.text == "yes"


# -- HTTP errors --------------------------------------------------------------------------

def test_529_anthropic_style_body():
    """529 Anthropic style body."""
    msg = one(OVERLOADED_529)
    assert msg.stop_reason == "error" and msg.text == ""
    assert msg.error_message == "529 Overloaded"
    assert (msg.status, msg.error_type, msg.error_code) == (529, "overloaded_error", None)
    assert classify_message(msg).rule == "structured.type_overloaded_error"


def test_503():
    """503."""
    msg = one(UNAVAILABLE_503)
    assert msg.error_message == "503 Service Unavailable"
    assert (msg.status, msg.error_type, msg.error_code) == (503, "server_error", "service_unavailable")


def test_401():
    """401."""
    msg = one(BAD_KEY_401)
    assert msg.error_message == "401 Incorrect API key provided: oracle-***-key."
    assert (msg.status, msg.error_code) == (401, "invalid_api_key")
    assert classify_message(msg).kind == "fatal"


def test_429_with_retry_after_carries_the_hint():
    """429 with retry after carries the hint."""
    msg = one(RATE_LIMIT_429)
    assert msg.error_message == "429 Rate limit reached. Please try again in 60s. (retry-after: 60)"
    assert msg.headers["retry-after"] == "60"
    assert classify_message(msg).retry_hint_ms == 60_000


def test_the_chosen_hint_header_is_carried_and_other_headers_are_dropped():
    """The chosen hint header is carried and other headers are dropped."""
    msg = one({"status": 429, "json": {"error": {"message": "slow down"}}, "headers": {
        "x-ratelimit-reset-requests": "1s", "x-ratelimit-remaining-requests": "5",
        "x-ratelimit-reset-tokens": "6m0s", "x-ratelimit-remaining-tokens": "0",
        "x-request-id": "req_1", "set-cookie": "session=secret"}})
    # the limit that was hit (remaining 0) gives the hint, in the facts and in the text
    assert msg.error_message == "429 slow down (x-ratelimit-reset-tokens: 6m0s)"
    assert msg.headers["x-request-id"] == "req_1" and "set-cookie" not in msg.headers
    assert "req_1" not in msg.error_message
    assert classify_message(msg).retry_hint_ms == 360_000


def test_x_ratelimit_reset_hint_survives_classification():
    # docs/policy.md §8 item 15: the reset header must reach the classification (20 s, not the default)
    """X ratelimit reset hint survives classification."""
    msg = one({"status": 429, "json": {"error": {"message": "Too Many Requests"}},
               "headers": {"x-ratelimit-reset": "20"}})
    assert msg.error_message == "429 Too Many Requests (x-ratelimit-reset: 20)"
    assert classify_message(msg).retry_hint_ms == 20_000
    assert classify("error", msg.error_message).retry_hint_ms == 20_000  # the text alone too


def test_html_error_page_reads_as_its_title():
    """Html error page reads as its title."""
    msg = one({"status": 502, "body": "<html><head><title>502 Bad Gateway</title></head></html>"})
    assert msg.error_message == "502 Bad Gateway"
    assert classify_message(msg).kind == "retryable"


def test_non_json_body_is_kept_as_text():
    """Non JSON body is kept as text."""
    msg = one({"status": 502, "body": "upstream went away"})
    assert msg.error_message == "502 upstream went away"


def test_huge_non_json_body_is_cut():
    """Huge non JSON body is cut."""
    msg = one({"status": 500, "body": "x" * 5000})
    assert msg.error_message == f"500 {'x' * 2000}… (3000 more characters)"


@pytest.mark.parametrize("status", [400, 413])
def test_empty_body_says_no_body(status):
    """Empty body says no body."""
    assert one({"status": status}).error_message == f"{status} status code (no body)"


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504, 529])
def test_exactly_one_request_even_when_the_sdk_would_retry(status):
    # retry-after 1 s and x-should-retry would both make a default SDK client retry and wait.
    """Exactly one request even when the SDK would retry."""
    entry = {"status": status, "json": {"error": {"message": "try later"}},
             "headers": {"retry-after": "1", "x-should-retry": "true"}}
    messages, requests = complete([entry] * 3)
    assert len(requests) == 1  # the SDK did not retry (one request, so no wait either)
    assert messages[0].stop_reason == "error"
    assert messages[0].error_message == f"{status} try later (retry-after: 1, x-should-retry: true)"


def test_each_call_is_one_request():
    """Each call is one request."""
    messages, requests = complete([OVERLOADED_529, UNAVAILABLE_503, {"stream": ["ok"]}], calls=3)
    assert [m.stop_reason for m in messages] == ["error", "error", "stop"]
    assert [r["index"] for r in requests] == [0, 1, 2]


# -- broken streams and network errors ----------------------------------------------------

def test_mid_stream_reset_keeps_the_partial_text():
    """Mid stream reset keeps the partial text."""
    msg = one({"stream": ["par", "tial"], "drop": True})
    assert msg.stop_reason == "error" and msg.text == "partial"
    assert msg.error_message == ("Connection error. "
                                 "(ConnectionResetError: [Errno 104] Connection reset by peer)")


def test_mid_stream_close_keeps_the_partial_text():
    """Mid stream close keeps the partial text."""
    msg = one({"stream": ["partial"], "drop": True, "drop_mode": "fin"})
    assert msg.stop_reason == "error" and msg.text == "partial"
    assert msg.error_message == (
        "Connection error. (RemoteProtocolError: peer closed connection without sending "
        "complete message body (incomplete chunked read))")


def test_truncated_stream():
    """Truncated stream."""
    msg = one({"stream": ["partial"], "no_done": True})
    assert msg.stop_reason == "error" and msg.text == "partial"
    assert msg.error_message == TRUNCATED_MESSAGE == (
        "Stream ended without a finish_reason or [DONE] (premature close)")


def test_error_event_inside_the_stream():
    """Error event inside the stream."""
    event = {"error": {"message": "Overloaded", "type": "overloaded_error"}}
    msg = one({"stream": ["partial", event]})
    assert msg.stop_reason == "error" and msg.text == "partial"
    assert msg.error_message == "Stream error: Overloaded (overloaded_error)"
    assert (msg.status, msg.error_type) == (None, "overloaded_error")
    assert classify_message(msg).rule == "structured.type_overloaded_error"


def test_error_event_with_only_a_message():
    """Error event with only a message."""
    msg = one({"stream": [{"error": {"message": "boom"}}]})
    assert msg.error_message == "Stream error: boom"


def test_connection_refused():
    """Connection refused."""
    async def go() -> AssistantMessage:
        provider = OpenAIChatProvider(base_url=f"http://127.0.0.1:{closed_port()}/v1", model="m")
        try:
            return await provider.complete(HI)
        finally:
            await provider.aclose()
    msg = asyncio.run(go())
    assert msg.stop_reason == "error" and msg.text == ""
    assert msg.error_message.startswith("Connection error. (ConnectError: All connection attempts failed; "
                                        "ConnectionRefusedError: [Errno 111] Connect call failed")
    assert msg.error_message.endswith("[Connection refused])")


def test_read_timeout_before_the_headers():
    """Read timeout before the headers."""
    msg = one({"delay_ms": 5000}, timeout_s=0.2)
    assert msg.stop_reason == "error" and msg.error_message == "Request timed out. (ReadTimeout)"


def test_read_timeout_mid_stream_keeps_the_text():
    """Read timeout mid stream keeps the text."""
    msg = one({"stream": ["a", "b"], "chunk_delay_ms": 5000}, timeout_s=0.2)
    assert msg.stop_reason == "error" and msg.text == "a"
    assert msg.error_message == "Request timed out. (ReadTimeout)"


# -- cancellation ---------------------------------------------------------------------------

@pytest.mark.parametrize("entry", [
    {"stream": ["first", "never"], "chunk_delay_ms": 10_000},   # cancelled mid-stream
    {"delay_ms": 10_000},                                       # cancelled before the headers
])
def test_cancellation_propagates_and_closes_the_request(entry):
    """Cancellation propagates and closes the request."""
    async def go(srv: FaultServer) -> None:
        provider = OpenAIChatProvider(base_url=srv.base_url, model="m")
        first = asyncio.Event()
        task = asyncio.create_task(provider.complete(HI, on_text=lambda _: first.set()))
        if "stream" in entry:
            await asyncio.wait_for(first.wait(), 5)
        else:
            while not srv.chat_requests:
                await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await provider.aclose()

    with FaultServer([entry]) as srv:
        asyncio.run(go(srv))
        deadline = time.monotonic() + 5
        while srv.chat_requests[0]["outcome"] is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv.chat_requests[0]["outcome"].startswith("client_gone")
        assert len(srv.chat_requests) == 1


def test_on_text_exceptions_propagate():
    """On text exceptions propagate."""
    def boom(_: str) -> None:
        raise RuntimeError("listener failed")

    async def go(base_url: str) -> None:
        provider = OpenAIChatProvider(base_url=base_url, model="m")
        with pytest.raises(RuntimeError, match="listener failed"):
            await provider.complete(HI, on_text=boom)
        await provider.aclose()

    with FaultServer([{"stream": ["a", "b"]}]) as srv:
        asyncio.run(go(srv.base_url))


# -- keys, names, clients ---------------------------------------------------------------------

def test_api_key_override_and_client_cache(monkeypatch):
    """API key override and client cache."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    async def go(base_url: str) -> OpenAIChatProvider:
        provider = OpenAIChatProvider(base_url=base_url, model="m", api_key="first")
        await provider.complete(HI)
        await provider.complete(HI, api_key="second")
        await provider.complete(HI)
        assert len(provider._clients) == 2
        await provider.aclose()
        assert provider._clients == {}
        return provider

    with FaultServer() as srv:
        asyncio.run(go(srv.base_url))
        keys = [r["headers"]["authorization"] for r in srv.chat_requests]
    assert keys == ["Bearer first", "Bearer second", "Bearer first"]


@pytest.mark.parametrize("env, expected", [("from-env", "from-env"), (None, NO_KEY_PLACEHOLDER)])
def test_default_key_from_environment_or_placeholder(monkeypatch, env, expected):
    """Default key from environment or placeholder."""
    if env is None:
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    else:
        monkeypatch.setenv("OPENAI_API_KEY", env)

    async def go(base_url: str) -> None:
        provider = OpenAIChatProvider(base_url=base_url, model="m")
        assert (await provider.complete(HI)).stop_reason == "stop"
        await provider.aclose()

    with FaultServer() as srv:
        asyncio.run(go(srv.base_url))
        assert srv.chat_requests[0]["headers"]["authorization"] == f"Bearer {expected}"


def test_default_base_url_needs_no_network_until_called():
    """Default base URL needs no network until called."""
    provider = OpenAIChatProvider(model="m", api_key="k")
    assert str(provider._client(None).base_url).startswith("https://api.openai.com/")
    asyncio.run(provider.aclose())


def test_names():
    """Names."""
    assert OpenAIChatProvider(model="m").name == "openai"
    assert OpenAIChatProvider(model="m", base_url="http://LocalHost:8080/v1").name == "localhost"
    assert OpenAIChatProvider(model="m", base_url="http://h/v1", name="mine").name == "mine"
    provider = OpenAIChatProvider(model="gpt", base_url="http://h/v1")
    assert isinstance(provider, Provider)
    assert repr(provider) == "OpenAIChatProvider(name='h', model='gpt', base_url='http://h/v1')"


@pytest.mark.parametrize("kwargs, match", [
    ({"model": ""}, "model must be a non-empty string"),
    ({"model": "m", "timeout_s": 0}, "timeout_s must be a positive number"),
    ({"model": "m", "timeout_s": float("nan")}, "timeout_s must be a positive number"),
    ({"model": "m", "timeout_s": True}, "timeout_s must be a positive number"),
])
def test_bad_arguments(kwargs, match):
    """Bad arguments."""
    with pytest.raises(ValueError, match=match):
        OpenAIChatProvider(**kwargs)


def test_callers_http_client_is_used_and_left_open():
    """Callers HTTP client is used and left open."""
    async def go(base_url: str) -> None:
        http = httpx2.AsyncClient()
        provider = OpenAIChatProvider(base_url=base_url, model="m", http_client=http)
        assert (await provider.complete(HI)).text == "ok"
        await provider.aclose()
        assert not http.is_closed
        await http.aclose()

    with FaultServer() as srv:
        asyncio.run(go(srv.base_url))


def test_a_failing_stream_close_is_ignored(monkeypatch):
    """A failing stream close is ignored."""
    async def broken_close(self) -> None:
        raise OSError("close failed")

    monkeypatch.setattr(openai.AsyncStream, "close", broken_close)
    assert one({"stream": ["fine"]}).text == "fine"


# -- describe_error on its own ----------------------------------------------------------------

class _UnreadableResponse(httpx2.Response):
    @property
    def text(self) -> str:
        raise httpx2.ResponseNotRead()


def test_describe_status_error_whose_body_cannot_be_read():
    """Describe status error whose body cannot be read."""
    response = _UnreadableResponse(500, request=httpx2.Request("POST", "http://h/v1"))
    exc = openai.APIStatusError("Error code: 500", response=response, body={"message": "kept"})
    assert describe_error(exc) == "500 kept"
    exc.body = None
    assert describe_error(exc) == "500 status code (no body)"


def test_describe_other_exceptions():
    """Describe other exceptions."""
    assert describe_error(ValueError("bad chunk")) == "ValueError: bad chunk"
    assert describe_error(RuntimeError()) == "RuntimeError (no message)"
    try:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except OSError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as exc:
        assert describe_error(exc) == (
            "RuntimeError: wrapped (ConnectionResetError: [Errno 104] Connection reset by peer)")


def test_describe_connection_error_causes():
    """Describe connection error causes."""
    request = httpx2.Request("POST", "http://h/v1")
    group = ExceptionGroup("multiple connection attempts failed", [
        ConnectionRefusedError(111, "Connect call failed ('::1', 1)"),
        ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 1)")])
    try:
        try:
            raise OSError("All connection attempts failed") from group
        except OSError as inner:
            raise openai.APIConnectionError(request=request) from inner
    except openai.APIConnectionError as exc:
        assert describe_error(exc) == (
            "Connection error. (OSError: All connection attempts failed; "
            "ConnectionRefusedError: [Errno 111] Connect call failed ('::1', 1) [Connection refused]; "
            "ConnectionRefusedError: [Errno 111] Connect call failed ('127.0.0.1', 1) [Connection refused])")
    assert describe_error(openai.APIConnectionError(request=request)) == "Connection error."
    assert describe_error(openai.APIError("boom", request, body=None)) == "Stream error: boom"
