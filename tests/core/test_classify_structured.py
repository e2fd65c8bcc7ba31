"""Structured facts first: the HTTP status, the error type/code and the response headers decide
before the text rules, in the precedence of docs/policy.md §2 (§8b.8); both paths agree on the
corpus; AssistantMessage carries and validates the facts."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsm.core.classify import ERROR_CODES, FATAL_STATUSES, RETRYABLE_STATUSES, classify, classify_facts, classify_message
from fsm.core.hints import header_hint
from fsm.commands.classify import zone_resolver
from fsm.core.messages import AssistantMessage, Usage
from fsm.providers.sdk_errors import status_error_facts

NOW_MS = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp() * 1000
DATA = Path(__file__).parents[1] / "data"
CORPUS = [json.loads(line) for path in sorted(DATA.glob("provider-errors*.jsonl"))
          for line in path.read_text("utf-8").splitlines() if line.strip()]


def facts(row: dict) -> dict:
    """The structured facts of a corpus row (camelCase as in ``classify --jsonl``)."""
    out = {"status": row.get("status"), "error_type": row.get("errorType", row.get("error_type")),
           "error_code": row.get("errorCode", row.get("error_code"))}
    headers = row.get("headers")
    out["headers"] = {k.lower(): v for k, v in headers.items()} if isinstance(headers, dict) else None
    return out


def row_now_ms(row: dict) -> float:
    """A row's clock (``now``, ISO 8601, UTC without an offset), else :data:`NOW_MS`."""
    if "now" not in row:
        return NOW_MS
    when = datetime.fromisoformat(row["now"])
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp() * 1000


ZONE = zone_resolver()
"""The host's zone resolver (the shell's zoneinfo): named zones known, zone-less times UTC."""


STRUCTURED_ROWS = [row for row in CORPUS if any(v is not None for v in facts(row).values())]


# -- the two paths agree -------------------------------------------------------------------

def _bodies() -> list[tuple[int, dict, dict]]:
    """HTTP errors as providers send them: the text path reads the human text that
    fsm.providers.sdk_errors writes, the structured path reads the facts."""
    return [
        (529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, {}),
        (429, {"error": {"message": "Rate limit reached for gpt-4o on tokens per min (TPM): Limit 30000, "
                         "Used 29000, Requested 2000. Please try again in 2s.", "type": "tokens",
                         "code": "rate_limit_exceeded"}}, {"x-ratelimit-reset-tokens": "2s"}),
        (429, {"error": {"message": "You exceeded your current quota, please check your plan and "
                         "billing details.", "type": "insufficient_quota", "code": "insufficient_quota"}}, {}),
        (400, {"error": {"message": "This model's maximum context length is 128000 tokens.",
                         "type": "invalid_request_error", "code": "context_length_exceeded"}}, {}),
        (401, {"error": {"message": "Incorrect API key provided: sk-***.", "code": "invalid_api_key"}}, {}),
        (503, {"error": {"message": "Service Unavailable", "type": "server_error"}}, {"retry-after": "3"}),
        (500, {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}, {}),
        (413, {"type": "error", "error": {"type": "request_too_large", "message": "Request exceeds the maximum size"}}, {}),
        (402, {"error": {"message": "Insufficient Balance"}}, {}),
        (400, {"error": {"message": "upstream returned 429 Too Many Requests"}}, {}),
        (502, {"detail": "Not Found"}, {}),
        (429, {"error": {"message": "Too Many Requests"}}, {"x-ratelimit-reset": "20"}),
        (429, {"type": "error", "error": {"type": "rate_limit_error", "message": "rate limited"}},
         {"anthropic-ratelimit-requests-reset": "2026-01-01T00:00:30Z", "anthropic-ratelimit-requests-remaining": "0"}),
        (500, {"error": {"message": "boom"}}, {"x-should-retry": "false"}),
        (409, {"error": {"message": "conflict"}}, {"x-should-retry": "true"}),
        (404, {"error": {"message": "The model `gpt-9` does not exist", "code": "model_not_found"}}, {}),
        (400, {"error": {"message": "Provider returned error", "code": 429}}, {}),
        (403, {"error": {"message": "Access denied, please make sure your account is in good standing.",
                         "code": "Arrearage"}}, {}),
    ]


@pytest.mark.parametrize("status, body, headers", _bodies())
def test_structured_and_text_paths_agree_on_provider_bodies(status, body, headers):
    """Structured and text paths agree on provider bodies."""
    made = status_error_facts(status, body, headers, now_ms=NOW_MS)
    structured = classify_message(made.to_message(), now_ms=NOW_MS)
    text_only = classify("error", made.message, now_ms=NOW_MS)
    assert structured.kind == text_only.kind, (made.message, structured, text_only)
    assert structured.usage_limit == text_only.usage_limit
    assert structured.retry_hint_ms == text_only.retry_hint_ms


@pytest.mark.skipif(not STRUCTURED_ROWS, reason="no corpus row carries structured facts yet")
@pytest.mark.parametrize("row", STRUCTURED_ROWS, ids=[row["id"] for row in STRUCTURED_ROWS])
def test_structured_and_text_paths_agree_on_the_corpus(row):
    """Structured and text paths agree on the corpus."""
    now_ms = row_now_ms(row)
    structured = classify_facts("error", row["message"], now_ms=now_ms, zone=ZONE, **facts(row))
    text_only = classify("error", row["message"], now_ms=now_ms, zone=ZONE)
    assert structured.kind == text_only.kind == row["expected"], (structured, text_only)
    assert structured.usage_limit == text_only.usage_limit == row.get("usage_limit", text_only.usage_limit)
    if row.get("retry_hint_ms") is not None:
        assert structured.retry_hint_ms is not None
        assert abs(structured.retry_hint_ms - row["retry_hint_ms"]) <= 1000


# -- precedence ------------------------------------------------------------------------------

def test_no_facts_is_the_text_path():
    """No facts is the text path."""
    assert classify_facts("error", "529 Overloaded") == classify("error", "529 Overloaded")
    assert classify_facts("stop", "x", status=529).kind == "none"


@pytest.mark.parametrize("kwargs, rule", [
    ({"status": 529}, "structured.status_529"),
    ({"status": 503, "error_type": "overloaded_error"}, "structured.type_overloaded_error"),
    ({"status": 429, "error_code": "rate_limit_exceeded", "error_type": "tokens"}, "structured.code_rate_limit_exceeded"),
    ({"status": 400, "error_code": "context_length_exceeded"}, "structured.code_context_length_exceeded"),
    ({"status": 429, "error_code": "insufficient_quota"}, "structured.code_insufficient_quota"),
    ({"status": 402}, "structured.status_402"),
    ({"status": 413}, "structured.status_413"),
    ({"status": 401}, "structured.status_401"),
    ({"status": 500, "headers": {"x-should-retry": "false"}}, "structured.x_should_retry_false"),
    ({"status": 400, "headers": {"x-should-retry": "true"}}, "structured.x_should_retry_true"),
    ({"error_code": "usage_limit_reached"}, "structured.code_usage_limit_reached"),
])
def test_a_fact_decides_and_names_itself(kwargs, rule):
    """A fact decides and names itself."""
    assert classify_facts("error", "something odd", **kwargs).rule == rule


def test_overflow_markers_of_any_source_come_first():
    # a text overflow beats a retryable status and a permanent code
    """Overflow markers of any source come first."""
    assert classify_facts("error", "prompt is too long: 300000 tokens", status=503).kind == "context_overflow"
    assert classify_facts("error", "prompt is too long", error_code="insufficient_quota").kind == "context_overflow"
    # a structured overflow beats a retryable text
    assert classify_facts("error", "Service Unavailable", error_code="context_length_exceeded").kind == \
        "context_overflow"
    # a 429 is rate limiting, never overflow, unless the request itself is above the limit
    assert classify_facts("error", "too many tokens in this minute", status=429).kind == "retryable"
    assert classify_facts("error", "Request too large for gpt-4o on tokens per min (TPM): Limit 30000, "
                          "Requested 45000.", status=429).kind == "context_overflow"


def test_permanent_conditions_of_any_source_beat_statuses_and_types():
    """Permanent conditions of any source beat statuses and types."""
    assert classify_facts("error", "Your credit balance is too low", status=503).rule == "fatal.credit_balance"
    assert classify_facts("error", "Overloaded", status=529, error_code="insufficient_quota").kind == "fatal"
    assert classify_facts("error", "rate limited", status=429, headers={"x-should-retry": "true"},
                          error_code="billing_hard_limit_reached").kind == "fatal"


def test_the_innermost_status_decides_over_the_outer_one():
    # a 400 whose body says the upstream answered 429 …
    """The innermost status decides over the outer one."""
    wrapped = classify_facts("error", '400 {"error":{"message":"upstream answered 429 Too Many Requests"}}',
                             status=400)
    assert (wrapped.kind, wrapped.rule) == ("retryable", "retryable.status_429")
    # … a 502 whose body says Not Found or that access is denied
    assert classify_facts("error", '502 {"detail":"Not Found"}', status=502).rule == "fatal.not_found"
    assert classify_facts("error", "502 Bad Gateway: Access is denied", status=502).kind == "fatal"
    # the text only repeats the outer status: the structured id is reported
    assert classify_facts("error", "503 Service Unavailable", status=503).rule == "structured.status_503"


def test_the_outer_status_beats_the_text_families():
    """The outer status beats the text families."""
    assert classify_facts("error", "connection reset by upstream", status=400).rule == "structured.status_400"
    assert classify_facts("error", "something odd", status=504).rule == "structured.status_504"
    # a status that says nothing by itself leaves the decision to the text
    assert classify_facts("error", "upstream connect error", status=409).rule == "retryable.socket_closed"
    assert classify_facts("error", "conflict", status=409).rule == "structured.status_409"


def test_generic_types_decide_nothing():
    """Generic types decide nothing."""
    assert classify_facts("error", "rate limit exceeded", error_type="invalid_request_error").kind == "retryable"


def test_facts_decide_without_any_text():
    """Facts decide without any text."""
    assert classify_facts("error", None, status=529).rule == "structured.status_529"
    assert classify_facts("error", "  ", status=418).kind == "fatal"
    assert classify_facts("error", None, headers={"retry-after": "2"}).rule == "fatal.unmatched"


# -- hints from headers -----------------------------------------------------------------------

def test_hint_headers_in_order():
    """Hint headers in order."""
    msg = "429 Too Many Requests"
    both = {"retry-after-ms": "1500", "retry-after": "9", "x-ratelimit-reset": "20"}
    assert classify_facts("error", msg, status=429, headers=both).retry_hint_ms == 1500
    assert classify_facts("error", msg, status=429, headers={"retry-after": "9"}).retry_hint_ms == 9000
    assert classify_facts("error", msg, status=429, headers={
        "retry-after": "Thu, 01 Jan 2026 00:00:10 GMT"}, now_ms=NOW_MS).retry_hint_ms == 10_000
    assert classify_facts("error", msg, status=429, headers={"x-ratelimit-reset-ms": "2500"}).retry_hint_ms == 2500
    assert classify_facts("error", msg, status=429, headers={
        "anthropic-ratelimit-input-tokens-reset": "2026-01-01T00:00:42Z"}, now_ms=NOW_MS).retry_hint_ms == 42_000


def test_reset_headers_are_hints_for_rate_limits_only():
    # every response carries them; for an overload they do not say when to retry
    """Reset headers are hints for rate limits only."""
    headers = {"x-ratelimit-reset-requests": "20s"}
    assert classify_facts("error", "529 Overloaded", status=529, headers=headers).retry_hint_ms is None
    assert classify_facts("error", "429 slow down", status=429, headers=headers).retry_hint_ms == 20_000
    assert classify_facts("error", "slow down", error_code="rate_limit_exceeded",
                          headers=headers).retry_hint_ms == 20_000


def test_the_limit_that_was_hit_gives_the_reset():
    """The limit that was hit gives the reset."""
    headers = {"x-ratelimit-reset-requests": "1s", "x-ratelimit-remaining-requests": "10",
               "x-ratelimit-reset-tokens": "30s", "x-ratelimit-remaining-tokens": "0"}
    assert header_hint(headers, rate_limited=True).ms == 30_000
    assert header_hint({"x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "30s"},
                       rate_limited=True).ms == 30_000  # none hit: the longest wait
    assert header_hint(headers, rate_limited=False) is None
    assert header_hint(None, rate_limited=True) is None


@pytest.mark.parametrize("value", ["1e3", "1e309", "-5", "NaN", "١٢", "１２", "", "soon"])
def test_absurd_header_values_are_ignored(value):
    """Absurd header values are ignored."""
    assert header_hint({"retry-after": value, "retry-after-ms": value}, rate_limited=True) is None
    result = classify_facts("error", "429 Too Many Requests", status=429, headers={"retry-after": value})
    assert result.kind == "retryable" and result.retry_hint_ms is None


def test_a_header_wait_beyond_four_hundred_days_is_too_long_not_ignored():
    """docs/policy.md §2 "Hints are monotonic": a header beyond 400 days reads as 400 days."""
    from fsm.core.hints import MAX_HINT_MS
    assert header_hint({"retry-after": "99999999999"}, rate_limited=False).ms == MAX_HINT_MS
    result = classify_facts("error", "429 Too Many Requests", status=429, headers={"retry-after": "99999999999"})
    assert result.kind == "retryable" and result.retry_hint_ms == MAX_HINT_MS


def test_the_text_hint_is_used_when_the_headers_have_none():
    """The text hint is used when the headers have none."""
    result = classify_facts("error", "429 Rate limit reached. Please try again in 6.4s.", status=429,
                            headers={"x-request-id": "r"})
    assert result.retry_hint_ms == 6400
    result = classify_facts("error", "try again in 5s", status=503)  # text unmatched, status decides
    assert (result.rule, result.retry_hint_ms) == ("structured.status_503", 5000)


def test_usage_limit_flag_from_codes_and_text():
    """Usage limit flag from codes and text."""
    assert classify_facts("error", "x", error_code="usage_limit_reached").usage_limit
    assert classify_facts("error", "The usage limit has been reached", status=429).usage_limit
    assert not classify_facts("error", "x", status=429).usage_limit


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), st.text(max_size=60)),
       st.one_of(st.none(), st.integers(100, 599)),
       st.one_of(st.none(), st.sampled_from(sorted(ERROR_CODES)), st.text(max_size=12)),
       st.one_of(st.none(), st.dictionaries(st.sampled_from(
           ["retry-after", "retry-after-ms", "x-ratelimit-reset", "x-should-retry", "x-other"]),
           st.text(max_size=12), max_size=3)))
def test_classify_facts_never_raises(text, status, code, headers):
    """Classify facts never raises."""
    result = classify_facts("error", text, status=status, error_code=code, headers=headers, now_ms=NOW_MS)
    assert result.kind in ("retryable", "context_overflow", "fatal")
    if result.kind != "retryable":
        assert result.retry_hint_ms is None and not result.usage_limit


def test_status_sets():
    """Status sets."""
    assert {429, 500, 502, 503, 504, 529} <= RETRYABLE_STATUSES
    assert {400, 401, 403, 404, 422} <= FATAL_STATUSES
    assert not {408, 409, 413, 425, 429, 499} & FATAL_STATUSES


# -- AssistantMessage carries the facts -------------------------------------------------------

def test_message_facts_round_trip_through_json():
    """Message facts round trip through JSON."""
    msg = AssistantMessage("error", error_message="529 Overloaded", status=529, error_type="overloaded_error",
                           error_code="x", headers={"Retry-After": "3"}, usage=Usage(input=1), timestamp_ms=5)
    assert msg.headers == {"retry-after": "3"}
    data = msg.to_json()
    assert (data["status"], data["errorType"], data["errorCode"], data["headers"]) == (
        529, "overloaded_error", "x", {"retry-after": "3"})
    assert AssistantMessage.from_json(data) == msg
    plain = AssistantMessage("stop", text="hi", timestamp_ms=1).to_json()
    assert not {"status", "errorType", "errorCode", "headers"} & set(plain)
    assert AssistantMessage.from_json({"role": "assistant", "content": "hi", "stopReason": "stop"}).text == "hi"


@pytest.mark.parametrize("kwargs, needle", [
    ({"stop_reason": "oops"}, "'oops'"),
    ({"stop_reason": "error", "status": 99}, "99"),
    ({"stop_reason": "error", "status": True}, "True"),
    ({"stop_reason": "error", "status": "529"}, "'529'"),
    ({"stop_reason": "error", "error_type": 5}, "5"),
    ({"stop_reason": "error", "headers": {"retry-after": 3}}, "3"),
    ({"stop_reason": "error", "headers": "retry-after: 3"}, "retry-after"),
    ({"stop_reason": "error", "error_message": 529}, "529"),
])
def test_bad_message_facts_raise_naming_the_value(kwargs, needle):
    """Bad message facts raise naming the value."""
    with pytest.raises(ValueError) as info:
        AssistantMessage(**kwargs)
    assert needle in str(info.value)


def test_unknown_stop_reason_is_refused():
    """Unknown stop reason is refused."""
    with pytest.raises(ValueError, match="stop_reason must be one of stop, length, toolUse, error, aborted; got 'oops'"):
        AssistantMessage("oops")


@pytest.mark.parametrize("data", [
    [], {"stopReason": "nope"}, {"stopReason": "stop", "content": 5},
    {"stopReason": "stop", "timestamp": "now"}, {"stopReason": "stop", "model": 1},
])
def test_from_json_refuses_bad_shapes(data):
    """From JSON refuses bad shapes."""
    with pytest.raises(ValueError):
        AssistantMessage.from_json(data)
