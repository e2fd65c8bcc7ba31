"""Gemini's error shapes read as facts (docs/policy.md §2 "Structured facts first";
fsm.providers.sdk_errors): the Google Gen AI SDK's ``APIError`` (its ``code``, Google's
``error.status``, the typed ``error.details`` — ``RetryInfo.retryDelay`` as a hint,
``QuotaFailure``, ``ErrorInfo`` — and the response's headers), the same body read by a host
that has only the HTTP exchange, and the aiohttp errors under the SDK's async client."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import pytest

# the genai extra (google-genai, and aiohttp under it); the lowest-direct run has neither
aiohttp = pytest.importorskip("aiohttp")
errors = pytest.importorskip("google.genai.errors")

from fsm.core.classify import classify_message
from fsm.providers.sdk_errors import error_facts, error_message, status_error_facts

DATA = Path(__file__).resolve().parents[1] / "data"
RPC = "type.googleapis.com/google.rpc."


def raised(status, body, response=None):
    """The exception google-genai raises for ``status`` and the parsed ``body``."""
    try:
        errors.APIError.raise_error(status, body, response)
    except errors.APIError as exc:
        return exc
    raise AssertionError("raise_error did not raise")


def _json_bodied_rows():
    """Corpus rows whose message is a JSON error body (``{"error": {...}}``, or a one-element
    list of one) with a status: the row's, else the body's ``error.code``."""
    rows = []
    for path in sorted(DATA.glob("provider-errors*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            try:
                body = json.loads(row["message"].strip())
            except ValueError:
                continue
            if isinstance(body, list) and len(body) == 1:
                body = body[0]
            if not (isinstance(body, dict) and isinstance(body.get("error"), dict)):
                continue
            status = row.get("status") or body["error"].get("code")
            if isinstance(status, int) and 400 <= status <= 599:
                rows.append(pytest.param(row, body, status, id=row["id"]))
    return rows


JSON_ROWS = _json_bodied_rows()


def test_the_corpus_has_json_bodied_rows_to_check():
    """The corpus check below is not vacuous: at least a dozen rows (Gemini's among them)."""
    assert len(JSON_ROWS) >= 12
    assert sum("gemini" in p.id for p in JSON_ROWS) >= 3


@pytest.mark.parametrize("row,body,status", JSON_ROWS)
def test_every_json_error_body_of_the_corpus_reads_the_same_through_the_genai_sdk(row, body, status):
    """A corpus error body raised by google-genai (ClientError / ServerError with that status)
    classifies as the row says, its hint within a second (docs/corpus.md conventions)."""
    cls = classify_message(error_message(raised(status, body)))
    assert cls.kind == row["expected"]
    if row["retry_hint_ms"] is None:
        assert cls.retry_hint_ms is None
    else:
        assert abs(cls.retry_hint_ms - row["retry_hint_ms"]) <= 1000


def gemini(code, status, message, *details):
    error = {"code": code, "message": message, "status": status}
    if details:
        error["details"] = list(details)
    return {"error": error}


FREE_TIER = ("You exceeded your current quota, please check your plan and billing details. For "
             "more information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.")

# (id, status, body, kind, family or None (not asserted), hint ms): the shapes of the Gemini
# API's errors
# (https://ai.google.dev/gemini-api/docs/troubleshooting; google/rpc/error_details.proto)
SHAPES = [
    ("free-tier-per-minute-retry-info", 429, gemini(
        429, "RESOURCE_EXHAUSTED", FREE_TIER,
        {"@type": RPC + "QuotaFailure", "violations": [{
            "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
            "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "quotaValue": "10"}]},
        {"@type": RPC + "Help", "links": [{"description": "Learn more", "url": "https://ai.google.dev"}]},
        {"@type": RPC + "RetryInfo", "retryDelay": "38s"}), "retryable", "rate_limit", 38000),
    ("free-tier-model-not-included-limit-0", 429, gemini(
        429, "RESOURCE_EXHAUSTED", FREE_TIER,
        {"@type": RPC + "QuotaFailure", "violations": [{
            "quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier", "quotaValue": "0"}]},
        {"@type": RPC + "RetryInfo", "retryDelay": "20s"}), "fatal", "billing", None),
    ("billing-wording-without-window-or-hint", 429, gemini(429, "RESOURCE_EXHAUSTED", FREE_TIER),
     "fatal", "billing", None),
    ("resource-exhausted-fractional-retry-delay", 429, gemini(
        429, "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota).",
        {"@type": RPC + "RetryInfo", "retryDelay": "1.5s"}), "retryable", "rate_limit", 1500),
    ("resource-exhausted-no-details", 429, gemini(
        429, "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota)."),
     "retryable", "rate_limit", None),
    ("unavailable-overloaded", 503, gemini(503, "UNAVAILABLE", "The model is overloaded. Please try again later."),
     "retryable", "overloaded", None),
    ("internal", 500, gemini(500, "INTERNAL", "An internal error has occurred. Please retry or report in "
                                               "https://developers.generativeai.google/guide/troubleshooting"),
     "retryable", "server_error", None),
    ("deadline-exceeded", 504, gemini(504, "DEADLINE_EXCEEDED", "Deadline expired before operation could complete."),
     "retryable", None, None),
    ("api-key-invalid", 400, gemini(
        400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid API key.",
        {"@type": RPC + "ErrorInfo", "reason": "API_KEY_INVALID", "domain": "googleapis.com",
         "metadata": {"service": "generativelanguage.googleapis.com"}}), "fatal", "auth", None),
    ("permission-denied", 403, gemini(403, "PERMISSION_DENIED", "Method doesn't allow unregistered callers."),
     "fatal", "auth", None),
    ("user-location", 400, gemini(400, "FAILED_PRECONDITION", "User location is not supported for the API use."),
     "fatal", None, None),
    ("input-token-count", 400, gemini(
        400, "INVALID_ARGUMENT", "The input token count (1200293) exceeds the maximum number of tokens "
                                 "allowed (1048576)."), "context_overflow", "overflow", None),
    ("quota-limit-value-zero-error-info", 429, gemini(
        429, "RESOURCE_EXHAUSTED", "Quota exceeded for quota metric 'Generate Content API requests'.",
        {"@type": RPC + "ErrorInfo", "reason": "RATE_LIMIT_EXCEEDED",
         "metadata": {"quota_limit_value": "0", "quota_metric": "generate_content_requests"}}),
     "fatal", "billing", None),
]


@pytest.mark.parametrize("status,body,kind,family,hint", [s[1:] for s in SHAPES], ids=[s[0] for s in SHAPES])
def test_gemini_error_shapes_through_the_sdk_and_the_http_exchange(status, body, kind, family, hint):
    """The SDK's APIError and a host with only the HTTP exchange (status, body) agree: kind,
    family and the RetryInfo hint; status and Google's error.status are the facts."""
    facts = error_facts(raised(status, body))
    assert (facts.status, facts.error_type) == (status, body["error"]["status"])
    for message in (facts.to_message(), status_error_facts(status, body).to_message()):
        cls = classify_message(message)
        assert (cls.kind, cls.retry_hint_ms) == (kind, hint)
        if family is not None:
            assert cls.family == family


def test_a_retry_after_header_of_the_response_is_read():
    """The SDK's error keeps the response: its retry-after header is the hint (headers first,
    docs/policy.md §2), and RetryInfo stays in the text."""
    body = gemini(429, "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota).",
                  {"@type": RPC + "RetryInfo", "retryDelay": "30s"})
    response = httpx2.Response(429, headers={"retry-after": "7", "set-cookie": "a=b"}, json=body)
    exc = raised(429, body, response)
    facts = error_facts(exc)
    assert facts.headers == {"retry-after": "7"}
    assert classify_message(facts.to_message()).retry_hint_ms == 7000
    assert 'retryDelay: "30s"' in facts.message


def test_a_body_that_is_not_json_reads_as_the_empty_answer_it_was():
    """An empty 500 (the SDK keeps {"message": "", "status": reason phrase}): '500 status code
    (no body)', retryable, not a JSON dump."""
    exc = raised(500, {"message": "", "status": "Internal Server Error"})
    assert error_facts(exc).message == "500 status code (no body)"
    assert classify_message(error_message(exc)).kind == "retryable"


@pytest.mark.parametrize("exc,family,capacity", [
    (aiohttp.ClientPayloadError("Response payload is not completed"), "network", False),
    (aiohttp.ServerDisconnectedError(), "network", False),
    (aiohttp.ServerTimeoutError("Timeout on reading data from socket"), "timeout", False),
], ids=["payload-cut", "server-disconnected", "server-timeout"])
def test_the_async_client_s_aiohttp_errors_read_as_transport_errors(exc, family, capacity):
    """aiohttp (google-genai's async transport): a body cut short or a disconnect is a
    connection error, a read timeout a timeout — as httpx's are (docs/classification.md)."""
    facts = error_facts(exc)
    assert facts.message.startswith(("Connection error.", "Request timed out."))
    cls = classify_message(facts.to_message())
    assert (cls.kind, cls.family) == ("retryable", family)
    assert cls.capacity_signal is capacity
