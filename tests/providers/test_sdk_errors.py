"""fsm.providers.sdk_errors: exceptions of the real openai and anthropic SDKs (driven through a mock
transport) and of httpx2 become error messages with human text and structured facts."""

from __future__ import annotations

import json

import anthropic
import httpx2
import openai
import pytest

from fsm.core.classify import classify, classify_message
from fsm.providers.sdk_errors import (
    BODY_LIMIT,
    ErrorFacts,
    error_facts,
    error_message,
    kept_headers,
    status_error_facts,
    stream_error_facts,
)

HI = [{"role": "user", "content": "hi"}]
NOW_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _anthropic(handler) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="sk-ant-test", max_retries=0,
                               http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))


def _openai(handler) -> openai.OpenAI:
    return openai.OpenAI(api_key="sk-test", max_retries=0, base_url="http://provider.test/v1",
                         http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))


def anthropic_error(handler, *, stream: bool = False) -> BaseException:
    client = _anthropic(handler)
    with pytest.raises(anthropic.AnthropicError) as info:
        if stream:
            with client.messages.stream(model="m", max_tokens=5, messages=HI) as events:
                for _ in events:
                    pass
        else:
            client.messages.create(model="m", max_tokens=5, messages=HI)
    return info.value


def openai_error(handler) -> BaseException:
    with pytest.raises(openai.OpenAIError) as info:
        _openai(handler).chat.completions.create(model="m", messages=HI)
    return info.value


def respond(status: int, body=None, headers=None, text: str | None = None):
    def handler(request: httpx2.Request) -> httpx2.Response:
        if text is not None:
            return httpx2.Response(status, text=text, headers=headers)
        if body is None:
            return httpx2.Response(status, headers=headers)
        return httpx2.Response(status, json=body, headers=headers)
    return handler


# -- the Anthropic SDK ----------------------------------------------------------------------

def test_anthropic_529_overloaded_reads_as_the_original_writes_it():
    """Anthropic 529 overloaded reads as the original writes it."""
    exc = anthropic_error(respond(529, {"type": "error", "error": {
        "type": "overloaded_error", "message": "Overloaded"}, "request_id": "req_1"},
        {"retry-after": "7", "request-id": "req_1", "set-cookie": "session=secret"}))
    facts = error_facts(exc)
    assert facts == ErrorFacts("529 Overloaded (retry-after: 7)", 529, "overloaded_error", None,
                               {"retry-after": "7", "request-id": "req_1"})
    message = facts.to_message(text="partial", model="claude")
    assert (message.stop_reason, message.text, message.model) == ("error", "partial", "claude")
    result = classify_message(message)
    assert (result.kind, result.rule, result.retry_hint_ms) == (
        "retryable", "structured.type_overloaded_error", 7000)


def test_anthropic_stream_error_event():
    """Anthropic stream error event."""
    events = (b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","type":'
              b'"message","role":"assistant","content":[],"model":"m","stop_reason":null,'
              b'"stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":1}}}\n\n'
              b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
              b'"message":"Overloaded"}}\n\n')

    def handler(request):
        return httpx2.Response(200, content=events, headers={
            "content-type": "text/event-stream", "anthropic-ratelimit-tokens-reset": "2026-01-01T00:01:00Z"})
    facts = error_facts(anthropic_error(handler, stream=True))
    # no status (the stream was a 200) and none of the stream's rate-limit window headers
    assert facts == ErrorFacts("Stream error: Overloaded (overloaded_error)", None, "overloaded_error")
    assert classify_message(facts.to_message()).rule == "structured.type_overloaded_error"


def test_anthropic_rate_limit_with_rfc3339_reset_headers():
    """Anthropic rate limit with rfc3339 reset headers."""
    exc = anthropic_error(respond(429, {"type": "error", "error": {
        "type": "rate_limit_error", "message": "Number of request tokens has exceeded your per-minute rate limit"}},
        {"anthropic-ratelimit-tokens-reset": "2026-01-01T00:00:20Z",
         "anthropic-ratelimit-tokens-remaining": "0",
         "anthropic-ratelimit-requests-reset": "2026-01-01T00:00:05Z"}))
    facts = error_facts(exc, now_ms=NOW_MS)
    assert facts.message == ("429 Number of request tokens has exceeded your per-minute rate limit "
                             "(anthropic-ratelimit-tokens-reset: 2026-01-01T00:00:20Z)")
    structured = classify_message(facts.to_message(), now_ms=NOW_MS)
    text_only = classify("error", facts.message, now_ms=NOW_MS)
    assert structured.retry_hint_ms == text_only.retry_hint_ms == 20_000
    assert structured.kind == text_only.kind == "retryable"


def test_anthropic_connection_and_timeout_errors():
    """Anthropic connection and timeout errors."""
    def refuse(request):
        raise httpx2.ConnectError("All connection attempts failed", request=request)

    def slow(request):
        raise httpx2.ReadTimeout("timed out", request=request)
    refused = error_facts(anthropic_error(refuse))
    assert refused == ErrorFacts("Connection error. (ConnectError: All connection attempts failed)")
    timed_out = error_facts(anthropic_error(slow))
    assert timed_out.message.startswith("Request timed out or interrupted.")
    assert timed_out.message.endswith("(ReadTimeout: timed out)")
    for facts in (refused, timed_out):
        assert classify_message(facts.to_message()).kind == "retryable"


def test_anthropic_credit_balance_is_permanent_even_as_a_400():
    """Anthropic credit balance is permanent even as a 400."""
    exc = anthropic_error(respond(400, {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "Your credit balance is too low to access the Anthropic API."}}))
    facts = error_facts(exc)
    assert facts.message == "400 Your credit balance is too low to access the Anthropic API."
    assert classify_message(facts.to_message()).rule == "fatal.credit_balance"


# -- the OpenAI SDK -------------------------------------------------------------------------

def test_openai_401_reads_as_status_and_message():
    """OpenAI 401 reads as status and message."""
    exc = openai_error(respond(401, {"error": {
        "message": "Incorrect API key provided: sk-abc***xyz.", "type": "invalid_request_error",
        "code": "invalid_api_key"}}))
    facts = error_facts(exc)
    assert facts.message == "401 Incorrect API key provided: sk-abc***xyz."
    assert (facts.status, facts.error_type, facts.error_code) == (401, "invalid_request_error", "invalid_api_key")
    assert classify_message(facts.to_message()).kind == "fatal"


def test_openai_insufficient_quota_429_is_permanent():
    """OpenAI insufficient quota 429 is permanent."""
    exc = openai_error(respond(429, {"error": {
        "message": "You exceeded your current quota, please check your plan and billing details.",
        "type": "insufficient_quota", "code": "insufficient_quota"}}, {"retry-after": "20"}))
    result = classify_message(error_message(exc))
    assert (result.kind, result.rule) == ("fatal", "structured.code_insufficient_quota")


def test_openai_x_should_retry_false_is_the_servers_verdict():
    """OpenAI x should retry false is the servers verdict."""
    exc = openai_error(respond(500, {"error": {"message": "The model produced invalid content."}},
                               {"x-should-retry": "false"}))
    message = error_message(exc)
    assert message.error_message == "500 The model produced invalid content. (x-should-retry: false)"
    assert classify_message(message).rule == "structured.x_should_retry_false"
    assert classify("error", message.error_message).kind == "fatal"  # the text says so too


def test_openai_empty_and_raw_bodies():
    """OpenAI empty and raw bodies."""
    assert error_facts(openai_error(respond(400))).message == "400 status code (no body)"
    assert error_facts(openai_error(respond(503, text="upstream connect error"))).message == \
        "503 upstream connect error"
    long = error_facts(openai_error(respond(500, text="y" * (BODY_LIMIT + 10)))).message
    assert long == f"500 {'y' * BODY_LIMIT}… (10 more characters)"
    page = "<!DOCTYPE html><html><head><title>Just a moment...</title></head><body>x</body></html>"
    assert error_facts(openai_error(respond(403, text=page))).message == "403 Just a moment..."


def test_openai_connection_error_names_the_transport_cause():
    """OpenAI connection error names the transport cause."""
    def refuse(request):
        raise httpx2.ConnectError("[Errno 111] Connection refused", request=request)
    facts = error_facts(openai_error(refuse))
    assert facts == ErrorFacts("Connection error. (ConnectError: [Errno 111] Connection refused)")


# -- bodies, wrappers, headers --------------------------------------------------------------

def test_a_wrapped_upstream_error_is_unwrapped():
    """A wrapped upstream error is unwrapped."""
    body = {"error": {"message": "Provider returned error", "code": 429, "metadata": {
        "provider_name": "Anthropic",
        "raw": json.dumps({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})}}}
    facts = status_error_facts(400, body)
    assert facts.message == "400 Provider returned error (Anthropic: Overloaded)"
    assert (facts.error_type, facts.error_code) == ("overloaded_error", None)
    assert classify_message(facts.to_message()).kind == "retryable"  # the innermost verdict


def test_a_numeric_code_without_a_raw_body_is_an_inner_status():
    """A numeric code without a raw body is an inner status."""
    facts = status_error_facts(400, {"error": {"message": "Provider returned error", "code": 429}})
    assert (facts.message, facts.error_code) == ("400 Provider returned error (code 429)", "429")
    result = classify_message(facts.to_message())
    assert (result.kind, result.rule) == ("retryable", "structured.inner_status_429")


@pytest.mark.parametrize("body", [
    {"error": {"message": {"nested": ["a", 1]}, "type": "server_error"}},
    {"error": {}},
    {"detail": [{"loc": ["body"], "msg": "field required"}]},
    ["not", "an", "object"],
    {"type": "error", "error": {"type": "api_error"}},
])
def test_no_text_is_a_python_repr(body):
    """No text is a python repr."""
    text = status_error_facts(500, body).message
    assert "{'" not in text and "['" not in text and "None" not in text
    assert text.startswith("500 ")


def test_a_body_of_plain_text_json_is_decoded():
    """A body of plain text JSON is decoded."""
    facts = status_error_facts(503, '{"error": {"message": "busy", "type": "server_error"}}')
    assert (facts.message, facts.error_type) == ("503 busy", "server_error")


def test_stream_error_event_shapes():
    """Stream error event shapes."""
    assert stream_error_facts({"error": {"message": "boom"}}).message == "Stream error: boom"
    assert stream_error_facts({"error": {"message": "rate limited", "code": "rate_limit_exceeded"}}) == \
        ErrorFacts("Stream error: rate limited (rate_limit_exceeded)", None, None, "rate_limit_exceeded")
    assert stream_error_facts({}).message == "Stream error: the provider reported an error without a message"


def test_kept_headers_are_the_hints_the_verdict_and_the_request_id():
    """Kept headers are the hints the verdict and the request id."""
    headers = httpx2.Headers({"Retry-After": "3", "X-RateLimit-Reset-Tokens": "1s", "Set-Cookie": "a=b",
                              "Authorization": "Bearer sk-secret", "X-Should-Retry": "true",
                              "X-Request-ID": "r1", "Content-Type": "application/json"})
    assert kept_headers(headers) == {"retry-after": "3", "x-ratelimit-reset-tokens": "1s",
                                     "x-should-retry": "true", "x-request-id": "r1"}
    assert kept_headers(None) is None and kept_headers({"a": "b"}) is None and kept_headers(42) is None


def test_credentials_in_an_exception_text_are_masked():
    """Credentials in an exception text are masked."""
    exc = ValueError("Illegal header value b'Bearer sk-proj-abcdef123456\\r'")
    text = error_facts(exc).message
    assert "abcdef123456" not in text and "Bearer ***" in text


def test_other_exceptions_name_their_type_and_causes():
    """Other exceptions name their type and causes."""
    assert error_facts(RuntimeError()).message == "RuntimeError (no message)"
    try:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except OSError as inner:
            raise httpx2.ReadError("read failed") from inner
    except httpx2.ReadError as exc:
        facts = error_facts(exc)
    assert facts.message == ("Connection error. (ReadError: read failed; "
                             "ConnectionResetError: [Errno 104] Connection reset by peer)")
    assert classify_message(facts.to_message()).kind == "retryable"


def test_odd_bodies_and_wrappers():
    # a body string that looks like JSON but is not
    """Odd bodies and wrappers."""
    assert status_error_facts(500, "{not json").message == "500 {not json"
    # {"error": "text"} and Anthropic's error.details.error_code
    assert status_error_facts(429, {"error": "Too many requests", "code": "rate_limited"}) == \
        ErrorFacts("429 Too many requests", 429, None, "rate_limited")
    facts = status_error_facts(400, {"type": "error", "error": {
        "type": "invalid_request_error", "message": "no", "details": {"error_code": "model_gone"}}})
    assert facts.error_code == "model_gone"
    # a wrapped raw body that is plain text, without a provider name
    facts = status_error_facts(502, {"error": {"message": "Provider returned error", "metadata": {
        "raw": "upstream connect error or disconnect/reset before headers"}}})
    assert facts.message == "502 Provider returned error (upstream connect error or disconnect/reset before headers)"
    # Google's status as the type; a typed rate limit makes reset headers count
    facts = status_error_facts(503, {"error": {"message": "busy", "status": "UNAVAILABLE"}},
                               {"x-ratelimit-reset": "7"})
    assert (facts.error_type, facts.message) == ("UNAVAILABLE", "503 busy")
    facts = status_error_facts(400, {"error": {"message": "slow", "code": "rate_limit_exceeded"}},
                               {"x-ratelimit-reset": "7"})
    assert facts.message == "400 slow (x-ratelimit-reset: 7)"
    # an unusable retry-after is kept as sent, and classifies as no hint
    facts = status_error_facts(503, {"error": {"message": "busy"}}, {"retry-after": "soon"})
    assert facts.message == "503 busy (retry-after: soon)"
    assert classify_message(facts.to_message()).retry_hint_ms is None


def test_a_stream_error_whose_body_is_text_or_json_text():
    """A stream error whose body is text or JSON text."""
    request = httpx2.Request("POST", "http://h/v1")
    response = httpx2.Response(200, request=request)
    raw = anthropic.APIStatusError("x", response=response, body='{"type":"error","error":{"type":"api_error","message":"Internal"}}')
    assert error_facts(raw) == ErrorFacts("Stream error: Internal (api_error)", None, "api_error")
    text = anthropic.APIStatusError("x", response=response, body="upstream closed")
    assert error_facts(text).message == "Stream error: upstream closed"
