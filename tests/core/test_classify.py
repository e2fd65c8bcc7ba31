"""Error classification (fsm.core.classify): docs/policy.md §2 order, every corpus row, every rule family,
the D1/D2/D3 traps, the compiled tables against a plain reference, linear time."""

from __future__ import annotations

import json
import re
import string
import time
from datetime import datetime, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support import examples

from fsm.core import classify as C
from fsm.core.classify import decide as D
from fsm.core.classify.rules import YIELDS_TO_HINT
from fsm.core.classify import scanner as S
from fsm.core.classify import (
    INWORD_RULES,
    OVERFLOW_RULES,
    PERMANENT_RULES,
    RETRYABLE_RULES,
    STATUS_RULES,
    USAGE_LIMIT_RULES,
    Classification,
    classify,
    classify_message,
)
from fsm.core.hints import MAX_HINT_MS, WORD_CHARS, normalize_text, parse_normalized_hint_ms
from fsm.commands.classify import zone_resolver
from fsm.core.messages import AssistantMessage, Usage

DATA = Path(__file__).parents[1] / "data"
# every corpus file: provider-errors.jsonl and the later collections (provider-errors-v2.jsonl…)
CORPUS_FILES = sorted(DATA.glob("provider-errors*.jsonl"))
CORPUS = [json.loads(line) for path in CORPUS_FILES for line in path.read_text("utf-8").splitlines()
          if line.strip()]
FIRST_CORPUS = [json.loads(line) for line in (DATA / "provider-errors.jsonl").read_text("utf-8").splitlines()
                if line.strip()]
ALL_RULES = (OVERFLOW_RULES + PERMANENT_RULES + STATUS_RULES + RETRYABLE_RULES + USAGE_LIMIT_RULES
             + INWORD_RULES)
KINDS = {"retryable", "context_overflow", "fatal", "none"}
# A fixed clock for the corpus: 2026-01-01T00:00:00Z.
CORPUS_NOW_MS = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp() * 1000


# The host's zone resolver (the shell's zoneinfo): named zones known, zone-less times UTC.
ZONE = zone_resolver()


def _ms(dt: datetime) -> float:
    """Epoch ms of ``dt``; a naive ``dt`` is UTC (never the machine's zone)."""
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp() * 1000


# Corpus rows whose hint is absolute (a clock time, a date, an epoch): the corpus files them as
# null because the value depends on the clock. With the clock injected, the hint is exact.
ABSOLUTE_HINTS: dict[str, tuple[float, int]] = {
    # "Claude AI usage limit reached|1749924000" (2025-06-14T18:00:00Z), one hour before
    "claude-ai-usage-limit-epoch": (1749924000 * 1000 - 3_600_000, 3_600_000),
    # "reset at 3pm (America/Santiago)", asked at noon there
    "claude-usage-limit-reset-3pm-santiago": (
        _ms(datetime(2026, 1, 10, 12, 0, tzinfo=ZoneInfo("America/Santiago"))), 3 * 3_600_000),
    # "reset at 9am (America/Chicago)", asked at 8:30 there
    "claude-usage-limit-reset-at-9am-tz": (
        _ms(datetime(2026, 1, 10, 8, 30, tzinfo=ZoneInfo("America/Chicago"))), 1_800_000),
    # "try again at Jul 5th, 2026 8:19 PM" (no zone: UTC), asked 19 minutes before
    "codex-usage-limit-try-again-at-en": (_ms(datetime(2026, 7, 5, 20, 0)), 19 * 60_000),
}
USAGE_LIMIT_ROWS = {
    "claude-5-hour-limit-reached-bare", "claude-ai-usage-limit-epoch",
    "claude-usage-limit-reset-3pm-santiago", "claude-usage-limit-reset-at-9am-tz",
    "codex-usage-limit-5d22h11m-glyph", "codex-usage-limit-add-credits",
    "codex-usage-limit-reached-free-602705s", "codex-usage-limit-reached-json-resets-in-seconds",
    "codex-usage-limit-try-again-at-en",
    # quota windows per day are usage limits (docs/policy.md §2)
    "bedrock-throttling-tokens-per-day", "g4f-500-token-limit-per-day", "groq-429-tpd-9m38s",
    "openai-rpd-7m12s",
}
PREFIX = {"retryable": "retryable.", "context_overflow": "overflow.", "fatal": "fatal."}


# --- every corpus row -----------------------------------------------------------------------

def row_now_ms(row: dict) -> float:
    """A row's clock: its ``now`` (ISO 8601; without an offset, UTC, as a zone-less time in the
    message is read), else the corpus's fixed clock."""
    if "now" not in row:
        return CORPUS_NOW_MS
    return _ms(datetime.fromisoformat(row["now"]))


@pytest.mark.parametrize("row", CORPUS, ids=[row["id"] for row in CORPUS])
def test_corpus_row(row):
    """Corpus row."""
    now_ms, absolute = ABSOLUTE_HINTS.get(row["id"], (row_now_ms(row), None))
    result = classify("error", row["message"], now_ms=now_ms, zone=ZONE)
    assert result.kind == row["expected"], (result, row["notes"])
    assert result.rule.startswith(PREFIX[result.kind])
    assert result.usage_limit == row.get("usage_limit", row["id"] in USAGE_LIMIT_ROWS)
    if absolute is not None:
        assert result.retry_hint_ms == absolute
    elif row["retry_hint_ms"] is None:
        assert result.retry_hint_ms is None
    else:
        assert result.retry_hint_ms is not None
        assert abs(result.retry_hint_ms - row["retry_hint_ms"]) <= 1000


def test_corpus_has_every_kind_and_unique_ids():
    """Corpus has every kind and unique ids."""
    assert len(FIRST_CORPUS) == 167 and len(CORPUS) >= len(FIRST_CORPUS)
    assert len({row["id"] for row in CORPUS}) == len(CORPUS)
    assert {row["expected"] for row in CORPUS} == {"retryable", "context_overflow", "fatal"}
    assert set(ABSOLUTE_HINTS) <= {row["id"] for row in CORPUS}
    assert USAGE_LIMIT_ROWS <= {row["id"] for row in CORPUS}


# --- the order of docs/policy.md §2 -------------------------------------------------------------------

@pytest.mark.parametrize("stop_reason", ["stop", "length", "toolUse", "aborted", "weird"])
def test_step1_not_an_error_is_none(stop_reason):
    """Step1 not an error is none."""
    result = classify(stop_reason, "prompt is too long", Usage(input=10**6), 1000)
    assert result == Classification("none", "stop_reason.not_error")


@pytest.mark.parametrize("message", [None, "", "   ", "\n\t"])
def test_step2_no_message_is_fatal(message):
    """Step2 no message is fatal."""
    assert classify("error", message) == Classification("fatal", "error.no_message")


def test_step2_comes_before_silent_overflow():
    """Step2 comes before silent overflow."""
    assert classify("error", None, Usage(input=5000), 1000).rule == "error.no_message"


def test_step3_silent_overflow():
    """Step3 silent overflow."""
    usage = Usage(input=900, cache_read=200)
    assert classify("error", "something odd", usage, 1000) == Classification(
        "context_overflow", "overflow.silent_usage")
    assert classify("error", "something odd", usage, 1100).rule == "fatal.unmatched"  # equal: fits
    assert classify("error", "something odd", usage, 0).rule == "fatal.unmatched"  # 0: off
    assert classify("error", "something odd", None, 1000).rule == "fatal.unmatched"
    # overflow beats a retryable text, but never a 429
    assert classify("error", "503 Service Unavailable", usage, 1000).kind == "context_overflow"
    assert classify("error", "Error code: 429 - rate limited", usage, 1000).kind == "retryable"


def test_step3_text_overflow_beats_retryable_and_permanent_words():
    """Step3 text overflow beats retryable and permanent words."""
    text = ("Get response error: This model's maximum context length is 4097 tokens. "
            "Response: Connection error. Please try again later. Incorrect API key provided.")
    assert classify("error", text).rule == "overflow.max_context_length"


@pytest.mark.parametrize("message", [
    "429 Too many tokens, please wait before trying again.",
    "HTTP 429: prompt is too long for the rate window",
    "ThrottlingException: Too many tokens, please reduce the prompt. prompt is too long",
    "too many requests: context length exceeded for this minute",
])
def test_step3_a_429_is_never_overflow(message):
    """Step3 a 429 is never overflow."""
    assert classify("error", message).kind == "retryable"


@pytest.mark.parametrize("message, kind", [
    ("400 status code (no body)", "context_overflow"),
    ("413 status code (no body)", "context_overflow"),
    ("413 (no body)", "context_overflow"),
    ("  400 (no body)", "context_overflow"),
    ("proxy: 400 status code (no body)", "fatal"),  # only at the start of the message
    ("429 status code (no body)", "retryable"),
])
def test_step3_bare_status_without_body(message, kind):
    """Step3 bare status without body."""
    assert classify("error", message).kind == kind


@pytest.mark.parametrize("message, rule", [
    ("You exceeded your current quota, please check your plan and billing details.",
     "fatal.exceeded_current_quota"),
    # Gemini sends the same words for per-minute quotas, with a retry delay: retry then
    ("You exceeded your current quota, please check your plan and billing details. "
     "* Quota exceeded for metric: generate_content_free_tier_requests, limit: 10\n"
     "Please retry in 42.4s.", "retryable.per_time_quota"),
    # ... but not when the quota is 0 (D1), nor when the code says insufficient_quota
    ("You exceeded your current quota. Quota exceeded for metric: x, limit: 0\n"
     "Please retry in 42.4s.", "fatal.quota_limit_zero"),
    ('You exceeded your current quota. {"code": "insufficient_quota"} Please retry in 5s.',
     "fatal.insufficient_quota"),
])
def test_step4_exceeded_current_quota_stands_down_only_for_a_retry_hint(message, rule):
    """Step4 exceeded current quota stands down only for a retry hint."""
    result = classify("error", message)
    assert result.rule == rule
    if rule.startswith("retryable"):
        assert result.retry_hint_ms == 42_400


def test_step6_unmatched_is_fatal():
    """Step6 unmatched is fatal."""
    assert classify("error", "something went wrong") == Classification("fatal", "fatal.unmatched")


def test_classify_message_uses_the_message_fields():
    """Classify message uses the message fields."""
    message = AssistantMessage(stop_reason="error", error_message="boom",
                               usage=Usage(input=5000, cache_read=1))
    assert classify_message(message, 4000).rule == "overflow.silent_usage"
    assert classify_message(message).rule == "fatal.unmatched"
    ok = AssistantMessage(stop_reason="stop", text="hi")
    assert classify_message(ok).kind == "none"
    hinted = AssistantMessage(stop_reason="error", error_message="rate limit, retry-after: 9")
    assert classify_message(hinted, now_ms=0).retry_hint_ms == 9000


# --- families, with phrasings from providers the corpus does not have -----------------------

OVERFLOW_EXAMPLES = [
    "This model's maximum context length is 16385 tokens. However, your messages resulted in 17000 tokens.",
    "Error code: 400 - {'error': {'message': 'prompt is too long: 210000 tokens > 200000 maximum'}}",
    "The input token count (1196265) exceeds the maximum number of tokens allowed (1048575).",
    "This model's maximum prompt length is 131072 but the request contains 537812 tokens.",  # xAI
    "Please reduce the length of the messages or completion.",  # Groq
    "prompt token count of 130000 exceeds the limit of 128000",  # Copilot
    "the request exceeds the available context size, try increasing it",  # llama.cpp
    "input is larger than the max context size. skipping",  # older llama.cpp
    "tokens to keep from the initial prompt is greater than the context length",  # LM Studio
    "invalid params, context window exceeds limit",  # MiniMax
    "Your request exceeded model token limit: 262144 (requested: 300000)",  # Kimi
    "Prompt contains 150000 tokens and 0 draft tokens, too large for model with 128000 maximum context length",
    "This model's maximum context length is 4096 tokens and your request has 5000 input tokens",  # vLLM
    "The decoder prompt (length 5000) is longer than the maximum model length of 4096.",  # vLLM
    "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 32769.",  # TGI
    "Input tokens exceed the configured limit of 272000 tokens.",  # Codex
    "Request payload size exceeds the limit: 20971520 bytes.",  # Gemini
    "Maximum request body size 1048576 exceeded, actual body size 1056562",
    '{"error":{"code":"model_context_window_exceeded"}}',
    "Range of input length should be [1, 30720]",  # Qwen
    "too many tokens: total number of tokens in the prompt cannot exceed 4081 - received 5000",
    "the input length exceeds the context length",  # Ollama
    "Requested tokens (5000) exceed context window of 4096",
    "This model's maximum context\nlength is 4097 tokens. However, your...",  # wrapped, truncated
]

PERMANENT_EXAMPLES = [
    "413 Request Entity Too Large",  # a proxy's page: a request-size refusal (docs/policy.md §2)
    "Your credit balance is too low to access the Anthropic API.",
    "Error code: 429 - {'error': {'message': 'quota', 'type': 'insufficient_quota'}}",
    "402 Payment Required",
    "This request requires more credits, or fewer max_tokens. You requested up to 4096 tokens, "
    "but can only afford 1000.",  # OpenRouter 402
    "Insufficient credits. Add more using the dashboard",
    "Quota exceeded for metric: generate_content_free_tier_requests, limit: 0, model: "
    "gemini-2.5-pro\nPlease retry in 37s.",
    "Rate limit reached for o1 in organization org-x on tokens per min (TPM): Limit 0, Used 0, "
    "Requested 20.",
    "500 Internal Server Error: API key not valid. Please pass a valid API key.",
    "litellm.InternalServerError: OpenAIException - certificate verify failed: unable to get "
    "local issuer certificate",
    "Error: self signed certificate in certificate chain",  # Node
    "Error: unable to verify the first certificate",  # Node
    "Server Error: Request failed with status code 400 and body {\"error\":{}}",  # axios
    "Error code: 404 - {'error': {'code': 'model_not_found'}}",
    "Your organization has been disabled.",
    '{"type":"error","error":{"type":"permission_error","message":"no access"}}',
    "Country, region, or territory not supported",
    "Error code: 401 - {'error': {'message': 'Invalid Authentication'}}",
    "Error code: 400 - {'error': {'code': 'invalid_prompt'}} Please try again with a different prompt",
    "You have reached your specified workspace spending limit",
    "Error code: 400 - billing_hard_limit_reached",
    "HTTP 403 Forbidden: Just a moment...",
]

RETRYABLE_EXAMPLES = [
    "Error code: 503 - {'error': {'message': 'Service Unavailable'}}",
    '{"type":"error","error":{"type":"api_error","message":"Internal server error"}}',
    "Error code: 502 - Bad Gateway",
    "openai.APITimeoutError: Request timed out.",
    "httpx.ConnectError: [Errno 111] Connection refused",
    "httpx.ReadTimeout: timed out",
    "httpx.ReadError",
    "httpx.RemoteProtocolError: Server disconnected without sending a response.",
    "requests.exceptions.ConnectionError: ('Connection aborted.', RemoteDisconnected('Remote end "
    "closed connection without response'))",
    "requests.exceptions.ChunkedEncodingError: ('Connection broken: IncompleteRead(0 bytes read)')",
    "aiohttp.client_exceptions.ServerDisconnectedError: Server disconnected",
    "aiohttp.client_exceptions.ClientConnectorError: Cannot connect to host api.openai.com:443",
    "aiohttp.client_exceptions.ClientPayloadError: Response payload is not completed",
    "TypeError: fetch failed",
    "Error: read ECONNRESET",
    "Error: connect ECONNREFUSED 127.0.0.1:11434",
    "getaddrinfo EAI_AGAIN api.anthropic.com",
    "Error: socket hang up",
    "SocketError: other side closed",
    "Error [ERR_STREAM_PREMATURE_CLOSE]: Premature close",
    "net/http: TLS handshake timeout",
    "read tcp 10.0.0.1:52000->1.2.3.4:443: read: connection reset by peer",
    "http2: server sent GOAWAY and closed the connection; LastStreamID=1999",
    "context deadline exceeded (Client.Timeout exceeded while awaiting headers)",
    "upstream request timeout",
    "no healthy upstream",
    "ServiceUnavailableException: Bedrock is unable to process your request.",
    "ThrottlingException: Rate exceeded",
    "ModelNotReadyException: Model is not ready to serve inference requests.",
    "ModelTimeoutException: Model has timed out in processing the request.",
    "google.api_core.exceptions.ServiceUnavailable: 503 The service is currently unavailable.",
    "google.api_core.exceptions.ResourceExhausted: 429 Resource has been exhausted",
    "The model is overloaded. Please try again later.",
    "This model is currently experiencing high demand. Please try again later.",
    "Rate limit exceeded: free-models-per-day. Add 10 credits to unlock 1000 free model requests",
    "server busy, please try again.  maximum pending requests exceeded",  # Ollama
    "Model is currently loading",  # Hugging Face
    "Error 524: A timeout occurred",  # Cloudflare
    "Stream ended without a finish_reason or [DONE] (premature close)",
    "Connection error. (ConnectError: All connection attempts failed)",
    "java.net.SocketTimeoutException: Read timed out",
    "System.IO.IOException: Unable to read data from the transport connection: An existing "
    "connection was forcibly closed by the remote host.",
    "reqwest::Error { kind: Request, source: hyper::Error(IncompleteMessage) }",
    "当前分组上游负载已饱和，请稍后再试",  # one-api / new-api
    "Mistral API error: 429 Too Many Requests",
    "TooManyRequestsError",
    "Too Many Concurrent Requests",
    "Please retry after 30 seconds",
    "HTTP 408 Request Timeout",
]


@pytest.mark.parametrize("message", OVERFLOW_EXAMPLES)
def test_overflow_family(message):
    """Overflow family."""
    assert classify("error", message).kind == "context_overflow"


@pytest.mark.parametrize("message", PERMANENT_EXAMPLES)
def test_permanent_family(message):
    """Permanent family."""
    assert classify("error", message).kind == "fatal"


@pytest.mark.parametrize("message", RETRYABLE_EXAMPLES)
def test_retryable_family(message):
    """Retryable family."""
    assert classify("error", message).kind == "retryable"


@pytest.mark.parametrize("message", [
    "Error: Connection error.",  # the TS SDKs' APIConnectionError
    "Error: connect ECONNREFUSED 127.0.0.1:8080",
    "read ECONNRESET",
    "Connection closed mid-response",
    "socket hang up",
    "other side closed",
    "Premature close",
    "TypeError: terminated",
    "Request timed out.",
    "upstream connect error or disconnect/reset before headers. reset reason: connection failure",
    "API Error: 529 Overloaded",
    "err_stream_premature_close",
])
def test_d2_network_transients(message):
    """D2 network transients."""
    assert classify("error", message).kind == "retryable"


@pytest.mark.parametrize("message", [
    "Your account has been terminated.",  # not the network's "terminated"
    "The session was terminated by an administrator: invalid api key",
])
def test_terminated_needs_the_network_sense(message):
    """Terminated needs the network sense."""
    assert classify("error", message).kind == "fatal"


# --- D3: status codes are standalone numbers ------------------------------------------------

@pytest.mark.parametrize("message", [
    "server_error", "internal_error", '{"type": "server_error"}', "INTERNAL_ERROR: stream reset",
    "Error code: 500 - {}", "[503]", "status=503", "HTTP/1.1 503", '{"code":502}', "(504)",
    "error 500", "HTTP请求失败: 500, 响应", "Error:500:server_error", "<title>502 Bad Gateway</title>",
])
def test_d3_status_numbers_and_underscored_names_match(message):
    """D3 status numbers and underscored names match."""
    assert classify("error", message).kind == "retryable"


@pytest.mark.parametrize("message", [
    "max_tokens must be at most 1500 tokens",
    "Invalid value: 500 tokens is below the minimum",
    "prompt is 200000 maximum",
    "request id req_503abc failed validation",
    "request req-503-b failed validation",
    "The model `gpt-4-0503` does not exist",
    "invalid budget 500,000 for this key",
    "invalid budget 502.5",
    "Value at 'maxTokens' failed to satisfy constraint: Member must have value less than or "
    "equal to 200000",
    "invalid file size: 503kb",
    "ids 15003, 5030 and 2504 are invalid",
    "see /errors/503 for details of your bad request",
    "you owe $500",
])
def test_d3_traps_are_not_server_errors(message):
    """D3 traps are not server errors."""
    assert classify("error", message).kind == "fatal"


# --- usage limits -----------------------------------------------------------------------------

@pytest.mark.parametrize("message, usage_limit, hint", [
    ("You've hit your usage limit. Try again in 3 hours.", True, 10_800_000),
    ('{"type":"usage_limit_reached","resets_in_seconds":60}', True, 60_000),
    ("5-hour limit reached ∙ resets 3pm", True, 3_600_000),  # 3pm UTC (no zone), asked at 2pm UTC
    ("Weekly limit reached", True, None),
    ("Rate limit reached for gpt-4 in organization org-x. Please try again in 20s.", False, 20_000),
    ("503 Service Unavailable (retry-after: 5)", False, 5_000),
])
def test_usage_limits_and_hints(message, usage_limit, hint):
    """Usage limits and hints."""
    result = classify("error", message, now_ms=_ms(datetime(2026, 3, 1, 14, 0)))
    assert result.kind == "retryable"
    assert result.usage_limit is usage_limit
    assert result.retry_hint_ms == hint


def test_hints_only_for_retryable():
    """Hints only for retryable."""
    assert classify("error", "Invalid API key. retry-after: 30").retry_hint_ms is None
    assert classify("error", "prompt is too long. retry-after: 30").retry_hint_ms is None


def test_usage_limit_found_anywhere_in_the_message():
    """Usage limit found anywhere in the message."""
    result = classify("error", "Error code: 429 - {'type': 'usage_limit_reached'}")
    assert (result.rule, result.usage_limit) == ("retryable.status_429", True)


# --- the tables are data -----------------------------------------------------------------------

def test_rule_rows_are_well_formed():
    """Rule rows are well formed."""
    ids = [rule.id for rule in ALL_RULES]
    assert len(ids) == len(set(ids))
    for rule in ALL_RULES:
        stage = ("overflow." if rule in OVERFLOW_RULES else "fatal." if rule in PERMANENT_RULES
                 else ("fatal.", "retryable.") if rule in STATUS_RULES else "retryable.")
        assert rule.id.startswith(stage) and re.fullmatch(r"[a-z0-9_.]+", rule.id)
        # a word-start alternative must begin with a literal: the scan's first-character
        # filter and the one-alternative-per-position trie depend on it
        if not rule.anywhere:
            for alt in S.alternatives(rule.pattern):
                assert alt[:1] > "\x7f" or S.literal_prefix(alt.lstrip("^")), (rule.id, alt)
        assert rule.family in C.FAMILIES and rule.family not in ("none", "other"), rule.id
        assert len(rule.source) > 10
        compiled = re.compile(rule.pattern)
        assert compiled.groups == 0, f"{rule.id}: use (?:...), not capturing groups"
        unescaped = re.sub(r"\\.", "", rule.pattern)
        assert unescaped == unescaped.lower(), f"{rule.id}: patterns match lower-case text"
    assert {rule.family for rule in USAGE_LIMIT_RULES} == {"usage_limit"}
    assert {rule.family for rule in OVERFLOW_RULES} == {"overflow"}
    families = {rule.family for rule in RETRYABLE_RULES}
    assert {"overloaded", "rate_limit", "server_error", "network", "retry_later", "stalled", "timeout"} <= families


RULE_EXAMPLES = {
    "overflow.prompt_too_long": "prompt is too long: 210000 tokens > 200000 maximum",
    "overflow.input_too_long": "Input is too long for requested model.",
    "overflow.exceeds_context": "Your input exceeds the context window of this model.",
    "overflow.context_window_exceeds": "invalid params, context window exceeds limit",
    "overflow.max_context_length": "This model's maximum context length is 8192 tokens.",
    "overflow.token_count_exceeds": "The input token count (81881) exceeds the maximum number",
    "overflow.input_tokens_exceed": "Input tokens exceed the configured limit of 272000 tokens.",
    "overflow.length_exceeds": "prompt length exceeds maximum input length",
    "overflow.longer_than_context": "is longer than the maximum model length of 4096",
    "overflow.context_length_exceeded": '{"code":"context_length_exceeded"}',
    "overflow.lm_studio": "Trying to keep the first 15857 tokens when context the overflows.",
    "overflow.reduce_length": "Please reduce the length of the messages.",
    "overflow.maximum_prompt_length": "This model's maximum prompt length is 131072 but ...",
    "overflow.token_limit": "Error: Message exceeds token limit.",
    "overflow.too_many_tokens": "too many tokens: total number of tokens in the prompt",
    "overflow.tgi_inputs": "`inputs` must have less than 1024 tokens. Given: 1168.",
    "overflow.qwen_input_length_range": "Range of input length should be [1, 30720]",
    "overflow.request_too_large": '{"type":"request_too_large"}',
    "overflow.bedrock_body_length": "Value at 'body' failed to satisfy constraint: Member must "
                                    "have length less than or equal to 25000000",
    "overflow.status_no_body": "400 status code (no body)",
    "fatal.insufficient_quota": "insufficient_quota",
    "fatal.exceeded_current_quota": "You exceeded your current quota, please check your plan.",
    "fatal.credit_balance": "Your credit balance is too low to access the Anthropic API.",
    "fatal.spending_limit": "reached its monthly spending limit",
    "fatal.payment_required": "OpenRouter returned 402: add credits",
    "fatal.quota_limit_zero": "Quota exceeded for metric: x, limit: 0, model: y",
    "fatal.invalid_api_key": "Incorrect API key provided: sk-xxxx.",
    "fatal.authentication": '{"type":"authentication_error"}',
    "fatal.region_unsupported": "User location is not supported for the API use.",
    "fatal.tls_certificate": "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed",
    "fatal.content_policy": "The response was filtered due to the prompt triggering Azure "
                            "OpenAI's content management policy. Please modify your prompt and retry.",
    "fatal.model_not_found": 'model "mistral" not found, try pulling it first',
    "fatal.client_status": "Request failed with status code 422",
    "fatal.client_status_phrase": "upstream said 405 Method Not Allowed",
    "fatal.client_status_leading": "422 The request body is invalid.",
    "retryable.usage_limit": "Claude AI usage limit reached",
    "retryable.usage_window_limit": "5-hour limit reached ∙ resets 3pm",
    "retryable.overloaded": "The server is currently overloaded with other requests.",
    "retryable.status_529": "API Error: 529",
    "retryable.capacity": "No capacity available for model x on the server",
    "retryable.rate_limit": "Rate limit is exceeded.",
    "retryable.throttled": "Request was throttled. Please wait.",
    "retryable.status_429": "HTTP 429",
    "retryable.too_many_requests": "Too Many Requests",
    "retryable.too_many_tokens": "Too many tokens, please wait before trying again.",
    "retryable.per_time_quota": "Resource has been exhausted (e.g. check quota).",
    "retryable.cn_rate_limit": "很抱歉，你的请求受速率限制。",
    "retryable.status_5xx": "ChatGPT error 500",
    "retryable.status_408": "HTTP 408",
    "retryable.service_unavailable": "Service Unavailable",
    "retryable.status_503": "upstream answered 503",
    "retryable.bad_gateway": "Bad Gateway",
    "retryable.server_error": "The server had an error while processing your request.",
    "retryable.connection": "Connection error.",
    "retryable.errno": "read ECONNRESET",
    "retryable.cannot_connect": "No connection could be made because the target machine "
                                "actively refused it",
    "retryable.fetch_failed": "TypeError: fetch failed",
    "retryable.socket_closed": "socket hang up",
    "retryable.premature_close": "Premature close",
    "retryable.stream_finish_error": "The provider ended the stream with finish_reason: error",
    "retryable.terminated": "TypeError: terminated",
    "retryable.timeout": "Request timed out.",
    "retryable.stream_stalled": "stream stalled: no response within 30 s",
    "retryable.attempt_timeout": "attempt timed out after 120 s",
    "overflow.length_validation": "Input length (160062 tokens) exceeds the maximum allowed length (59862 tokens).",
    "overflow.context_size_exceeded": "500 Internal Server Error: context size has been exceeded",
    "fatal.quota_value_zero": "Quota exceeded for metric: free_tier_requests, quota_limit_value: '0'",
    "fatal.host_undefined": "request to http://undefined/v1/messages failed, reason: getaddrinfo ENOTFOUND undefined",
    "fatal.route_not_found": "502 Bad Gateway: <pre>Cannot POST /v1/chat/completions</pre>",
    "retryable.gateway_no_response": '400 {"error":[{"code":2005,"message":"Failed to get response from provider"}]}',
    "retryable.free_quota_window": "402 Payment Required: daily free quota used up, come back in 3h47m",
    "retryable.request_failed_retry": "The request failed, please retry.",
    "retryable.try_again_i18n": "Error interno. Por favor, inténtalo de nuevo en 30 segundos.",
    "retryable.rate_limit_i18n": "Demasiadas solicitudes",
    "retryable.overloaded_i18n": "Le serveur est surchargé",
    "retryable.retry_delay": "Please retry after 30 seconds",
    # the v2 families
    "overflow.request_above_limit": "Error code: 429 - Request too large for gpt-4o in organization "
                                    "org-x on tokens per min (TPM): Limit 30000, Requested 45000.",
    "overflow.max_input_length": "Input validation error: the input is longer than the model's "
                                 "maximum input length",
    "overflow.cannot_truncate": "the prompt cannot be truncated to fit the context",
    "fatal.cn_billing": "您的账户已欠费，请充值后重试",
    "fatal.out_of_memory": "llama runner process has terminated: cudaMalloc failed: out of memory",
    "fatal.not_found": '502 Bad Gateway {"detail":"Not Found"}',
    "retryable.usage_hit_your_limit": "You've hit your limit · resets 3pm (Europe/Berlin)",
    "retryable.quota_window": "Free tier: 50 requests per day for this model",
    "retryable.gateway_relay": "new_api_error: failed to forward request to upstream",
    "retryable.websocket": "WebSocket connection to ' ' failed",
    "retryable.no_response": "http2 request did not get a response",
    "retryable.try_request_again": "We hit an unexpected error. Please try your request again.",
    "retryable.inword_rate_limit": "OpenRouterRatelimitException: slow",
    "retryable.inword_overloaded": "ModelOverloadedException",
    "retryable.inword_timeout": "UpstreamTimeoutError",
    "fatal.should_not_retry": "500 The model produced invalid content. (x-should-retry: false)",
    "retryable.should_retry": "409 Conflict (x-should-retry: true)",
    "retryable.typed_transient": '{"type":"overloaded_error","message":"Overloaded"}',
    "fatal.model_load_failed": "Failed to load the model. Try a different model and/or config.",
    "retryable.inword_quota_window": "QuotaFailure: GenerateRequestsPerDayPerProjectPerModel-FreeTier",
    # round 4 (docs/classification.md "Round 4")
    "overflow.context_wording": "The agent ran out of room in the model's context window.",
    "fatal.entitlement": "429 rate_limit_error: Long context is not enabled for your plan.",
    "fatal.trial_allowance": "Your free trial request limit has been reached.",
    "fatal.request_entity_too_large": "<html><head><title>413 Request Entity Too Large</title></head>",
    "fatal.permission_denied": "PERMISSION_DENIED: the caller does not have permission",
    "retryable.model_output": "The model failed to generate valid JSON for the tool call.",
    "retryable.concurrency": "Too much concurrency on this key; reduce concurrency and retry.",
    "retryable.request_rate": "Your request rate increased too fast. Scale up gradually.",
}


def test_every_rule_has_an_example():
    """Every rule has an example."""
    assert set(RULE_EXAMPLES) == {rule.id for rule in ALL_RULES}


@pytest.mark.parametrize("rule_id, message", sorted(RULE_EXAMPLES.items()))
def test_rule_example_is_decided_by_its_rule(rule_id, message):
    """Rule example is decided by its rule."""
    assert classify("error", message).rule == rule_id


# --- the compiled scan against a plain reference ----------------------------------------------

_BOUND = re.compile(f"[^{WORD_CHARS}]")


def _reference_regexes(rules, word_start_only=False):
    """Each rule as one plain regex with the same word-start semantics as the compiled scan
    (``word_start_only``: without the alternatives looked for anywhere)."""
    out = []
    for rule in rules:
        alts = S.alternatives(rule.pattern)
        parts = []
        for alt in alts:
            if alt.startswith("^"):
                parts.append(r"\A (?:" + alt[1:] + ")")
            elif alt[:1] > "\x7f" or rule.anywhere:
                if not word_start_only:
                    parts.append(f"(?:{alt})")
            else:
                parts.append(f"(?<=[^{WORD_CHARS}])(?:{alt})")
        if parts:
            out.append((rule, re.compile("|".join(parts))))
    return out


_REF_OVERFLOW = _reference_regexes(OVERFLOW_RULES)
_REF_PERMANENT = _reference_regexes(PERMANENT_RULES)
_REF_RETRYABLE = _reference_regexes(tuple(r for r in STATUS_RULES if r.id.startswith("retryable."))
                                    + RETRYABLE_RULES + USAGE_LIMIT_RULES)
_REF_RETRYABLE_WORD_START = _reference_regexes(
    tuple(r for r in STATUS_RULES if r.id.startswith("retryable.")) + RETRYABLE_RULES + USAGE_LIMIT_RULES,
    word_start_only=True)
_REF_STATUS = _reference_regexes(STATUS_RULES)
_REF_ANYWHERE = _reference_regexes(INWORD_RULES)
_GUARD_IDS = {"retryable.status_429", "retryable.too_many_requests", "retryable.throttled"}
_USAGE_IDS = {rule.id for rule in USAGE_LIMIT_RULES}


def _leftmost(table, t, keep=lambda rule: True):
    best = None
    for order, (rule, rx) in enumerate(table):
        if not keep(rule):
            continue
        m = rx.search(t)
        if m is not None and (best is None or m.start() < best[0]):
            best = (m.start(), order, rule)
    return None if best is None else best[2]


def reference_classify(stop_reason, message, usage=None, window=0, now_ms=None):
    """docs/policy.md §2 applied rule by rule, with no compilation tricks (the family refined by
    the text as the classifier does)."""
    return D._refine(_reference_verdict(stop_reason, message, usage, window, now_ms), message)


def _reference_verdict(stop_reason, message, usage=None, window=0, now_ms=None):
    if stop_reason != "error":
        return Classification("none", "stop_reason.not_error")
    if not message or message.isspace():
        return Classification("fatal", "error.no_message")
    t = " " + normalize_text(message)
    silent = usage is not None and window > 0 and usage.input + usage.cache_read > window
    overflow = _leftmost(_REF_OVERFLOW, t)
    guard = any(rx.search(t) for rule, rx in _REF_RETRYABLE if rule.id in _GUARD_IDS)
    above = [rule for rule, rx in _REF_OVERFLOW if rule.id == "overflow.request_above_limit" and rx.search(t)]
    if guard and above:
        return Classification("context_overflow", above[0].id)  # even inside a 429
    if (overflow or silent) and not guard:
        return Classification("context_overflow", overflow.id if overflow else "overflow.silent_usage")
    strict = _leftmost(_REF_PERMANENT, t, lambda r: r.id not in YIELDS_TO_HINT)
    if strict is not None and strict.id in D._USAGE_WINDOW_ONLY:
        retryable = _leftmost(_REF_RETRYABLE_WORD_START, t) or _leftmost(_REF_RETRYABLE, t)
        usage = any(rx.search(t) for rule, rx in _REF_RETRYABLE if rule.id in _USAGE_IDS)
        hint = parse_normalized_hint_ms(t, now_ms=now_ms)
        if usage and retryable is not None and (hint is not None or D._states_a_reset(t)):
            return Classification("retryable", retryable.id, True, hint)
    if strict is not None:
        return Classification("fatal", strict.id)
    # the innermost (last) status marker decides over the families
    last = None
    for rule, rx in _REF_STATUS:
        for m in rx.finditer(t):
            if last is None or m.start() > last[0]:
                last = (m.start(), rule)
    if last is not None and last[1].id.startswith("fatal."):
        # the model's own invalid output outranks a 4xx (docs/policy.md §2)
        if re.search(next(r for r in RETRYABLE_RULES if r.family == "model_output").pattern, t):
            return Classification("retryable", "retryable.model_output")
        return Classification("fatal", last[1].id)
    yielding = _leftmost(_REF_PERMANENT, t)
    retryable = _leftmost(_REF_RETRYABLE_WORD_START, t)
    if retryable is None:
        retryable = _leftmost(_REF_RETRYABLE, t) or _leftmost(_REF_ANYWHERE, t)
    usage_limit = (any(rx.search(t) for rule, rx in _REF_RETRYABLE if rule.id in _USAGE_IDS)
                   or "perday" in t or "perhour" in t)
    hint = parse_normalized_hint_ms(t, now_ms=now_ms)
    if yielding is not None and (retryable is None or (hint is None and not D._names_a_quota_window(t))):
        return Classification("fatal", yielding.id)
    if retryable is None:
        return Classification("fatal", "fatal.unmatched")
    return Classification("retryable", retryable.id, usage_limit, hint)


def _same(a: Classification, b: Classification) -> bool:
    """Equal, except that two rules of one step matching at the same place may differ."""
    same_step = a.rule.split(".")[0] == b.rule.split(".")[0]
    return (a.kind, a.usage_limit, a.retry_hint_ms) == (b.kind, b.usage_limit, b.retry_hint_ms) and same_step


@pytest.mark.parametrize("message", [row["message"] for row in CORPUS] + OVERFLOW_EXAMPLES
                         + PERMANENT_EXAMPLES + RETRYABLE_EXAMPLES + list(RULE_EXAMPLES.values()))
def test_compiled_scan_agrees_with_the_reference(message):
    """Compiled scan agrees with the reference."""
    fast = classify("error", message, now_ms=CORPUS_NOW_MS)
    slow = reference_classify("error", message, now_ms=CORPUS_NOW_MS)
    assert fast == slow


# Fragments of real messages: hypothesis glues them into texts that hit many rules at once.
_FRAGMENTS = sorted({w for text in list(RULE_EXAMPLES.values()) + [r["message"] for r in CORPUS[::4]]
                     for w in re.split(r"(?<=[\s,.:;])", text) if w.strip()})
_texts = st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.sampled_from(
    ["429", "503", " ", "\n", '"', "_", "-", ":", "(", "retry in 3s", "limit: 0", "(no body)",
     "400 status code (no body)", "usage limit", "try again later", "prompt is too long"]),
    st.text(max_size=5)), max_size=14).map("".join)


@settings(max_examples=examples(600), deadline=None)
@given(_texts, st.integers(min_value=0, max_value=3000), st.integers(min_value=0, max_value=2000))
def test_compiled_scan_agrees_with_the_reference_on_mixed_texts(text, input_tokens, window):
    """Compiled scan agrees with the reference on mixed texts."""
    usage = Usage(input=input_tokens)
    fast = classify("error", text, usage, window, now_ms=CORPUS_NOW_MS)
    slow = reference_classify("error", text, usage, window, now_ms=CORPUS_NOW_MS)
    assert _same(fast, slow), (fast, slow)


@settings(max_examples=examples(300), deadline=None)
@given(_texts)
def test_needles_are_necessary_for_the_429_guard(text):
    """Needles are necessary for the 429 guard."""
    t = " " + normalize_text(text)
    if D._subset(frozenset({D._G})).regex.search(t) is not None:
        assert any(needle in t for needle in D._GUARD_NEEDLES)


def test_very_many_matches_take_the_staged_path_with_the_same_decisions():
    """Very many matches take the staged path with the same decisions."""
    cases = [
        ("rate limit " * 60, "retryable.rate_limit"),
        ("rate limit " * 60 + "prompt is too long", "overflow.prompt_too_long"),
        ("429 " * 60 + "prompt is too long", "retryable.status_429"),
        ("rate limit " * 60 + "invalid api key", "fatal.invalid_api_key"),
        ("invalid api key " * 60, "fatal.invalid_api_key"),
        ("exceeded your current quota " * 60 + "quota exceeded, retry in 3s", "retryable.per_time_quota"),
        ("exceeded your current quota " * 60, "fatal.exceeded_current_quota"),
        ("exceeded your current quota " * 60 + "insufficient_quota", "fatal.insufficient_quota"),
        ("usage limit " * 60 + "retry-after: 4", "retryable.usage_limit"),
        ("retry " * 60, "fatal.unmatched"),
        ("rate limit " * 60 + "you exceeded your current quota, retry in 3s", "retryable.rate_limit"),
        ("rate limit " * 60 + "you exceeded your current quota", "fatal.exceeded_current_quota"),
        ("rate limit " * 60 + "usage limit reached", "retryable.rate_limit"),
        ("retry " * 60 + "请求过于频繁", "retryable.cn_rate_limit"),
    ]
    for message, rule in cases:
        fast = classify("error", message, now_ms=0)
        assert fast.rule == rule
        assert _same(fast, reference_classify("error", message, now_ms=0))
    assert classify("error", "rate limit " * 60 + "usage limit reached").usage_limit
    assert classify("error", "rate limit " * 60 + "exceeded your current quota, retry in 3s",
                    now_ms=0).retry_hint_ms == 3000
    usage = Usage(input=10)
    assert classify("error", "retry " * 60, usage, 5).rule == "overflow.silent_usage"
    assert classify("error", "429 " * 60, usage, 5).kind == "retryable"


# --- properties -------------------------------------------------------------------------------

_usages = st.one_of(st.none(), st.builds(Usage, input=st.integers(0, 10**7),
                                         output=st.integers(0, 10**6),
                                         cache_read=st.integers(0, 10**7),
                                         cache_write=st.integers(0, 10**6)))


@settings(max_examples=examples(500), deadline=None)
@given(st.sampled_from(["error", "stop", "length", "toolUse", "aborted", ""]),
       st.one_of(st.none(), st.text(), _texts), _usages, st.integers(-5, 10**7),
       st.one_of(st.none(), st.floats(0, 4e12), st.floats()))
def test_classify_never_raises_and_stays_in_its_vocabulary(stop, message, usage, window, now_ms):
    """Classify never raises and stays in its vocabulary."""
    result = classify(stop, message, usage, window, now_ms=now_ms)
    assert result.kind in KINDS
    assert isinstance(result.rule, str) and result.rule
    assert result.usage_limit in (True, False)
    assert result.retry_hint_ms is None or 0 <= result.retry_hint_ms <= MAX_HINT_MS
    if result.kind != "retryable":
        assert not result.usage_limit and result.retry_hint_ms is None
    if stop != "error":
        assert result.kind == "none"


@settings(max_examples=examples(300), deadline=None)
@given(st.one_of(_texts, st.text(alphabet=string.printable, max_size=200)))
def test_case_and_whitespace_do_not_matter(text):
    """Case and whitespace do not matter."""
    base = classify("error", text, now_ms=0)
    if text.isascii():
        assert classify("error", text.upper(), now_ms=0) == base
    assert classify("error", "  " + text.replace(" ", " \n\t ") + "\r\n", now_ms=0) == base


# --- linear time ------------------------------------------------------------------------------

MB = 1 << 20


def _repeat(piece: str) -> str:
    return (piece * (MB // len(piece) + 1))[:MB]


ADVERSARIAL = ["rate lim", "503", "503 ", "429 ", "prompt is too ", "1234567890", "1 2 3 ", "e ",
               "input token count ", "exceed the ", "retry in 1", "reset at 3pm ", "status code 4",
               "limit 0 ", "try again at jul 5 ", "usage limit ", "connection ", '{"a":"b",',
               "keep the first 123 tokens when context ", "请求过于频", "a  \n ", "http://a ",
               "exceeded your current quota please retry in 1s ", "retry-after: ", "\\n"]


@pytest.mark.parametrize("piece", ADVERSARIAL)
def test_one_megabyte_adversarial_message_is_linear(piece):
    """One megabyte adversarial message is linear."""
    message = _repeat(piece)
    start = time.process_time()
    result = classify("error", message)
    elapsed = time.process_time() - start
    assert result.kind in KINDS
    assert elapsed < 1.0, f"{piece!r}: {elapsed:.3f} s"  # measured 5-55 ms; generous for CI


def test_a_voided_anchored_overflow_goes_on_to_the_next_steps():
    """A voided anchored overflow goes on to the next steps."""
    assert classify("error", "413 status code (no body) then 429 Too Many Requests").rule == \
        "retryable.status_429"
    # a 400 that is not an overflow is a permanent client error
    # a leading 400 that is not an overflow wraps an inner 429: the innermost status decides
    assert classify("error", "400 status code (no body) then 429 Too Many Requests").rule == \
        "retryable.status_429"
    assert classify("error", "400 invalid model, then 429 Too Many Requests").rule == \
        "retryable.status_429"
    assert classify("error", "400 invalid model").rule == "fatal.client_status_leading"
    assert classify("error", "413 (no body); 429; invalid api key").rule == "fatal.invalid_api_key"


def test_patterns_with_capturing_groups_are_refused():
    """Patterns with capturing groups are refused."""
    bad = C.Rule("overflow.bad", "context_overflow", "(prompt) too long", "test")
    with pytest.raises(ValueError, match="capturing groups"):
        S.compile_rules([(S.OVERFLOW, bad)], frozenset())


# --- regressions ------------------------------------------------------------------------------

@pytest.mark.parametrize("message, hint", [
    ("429 Too Many Requests (x-ratelimit-reset: 20)", 20_000),
    ("Rate limited (x-ratelimit-reset-ms: 20000)", 20_000),
    ("429 rate limit exceeded (x-ratelimit-reset-requests: 20s)", 20_000),
    ("rate_limit_error (anthropic-ratelimit-tokens-reset: 2026-01-01T00:00:20Z)", 20_000),
    ("ratelimit hit; x-ratelimit-reset-tokens: 20s", 20_000),
])
def test_x_ratelimit_reset_hint_survives_classification(message, hint):
    # the rate-limit rule matched the word "ratelimit" where the reset header starts, and the
    # hint was never read: the credential store then blocked for its default instead of 20 s
    """X ratelimit reset hint survives classification."""
    result = classify("error", message, now_ms=CORPUS_NOW_MS)
    assert (result.kind, result.retry_hint_ms) == ("retryable", hint)


def test_unknown_finish_reason_network_error_is_retryable_error():
    # the provider layer's text for a stream that ended with a finish reason it does not know
    """Unknown finish reason network error is retryable error."""
    result = classify("error", "Provider finish_reason: network_error")
    assert (result.kind, result.rule) == ("retryable", "retryable.connection")
    assert classify("error", "Provider finish_reason: error").kind == "retryable"
    assert classify("error", "Provider finish_reason: MALFORMED_FUNCTION_CALL").kind == "fatal"


def test_classification_reads_the_whole_text_before_any_clipping():
    # the verdict at the end of a long body (past the 8 KB kept in events) still decides
    """Classification reads the whole text before any clipping."""
    body = "x " * 10_000 + "Your credit balance is too low"
    assert classify("error", "503 " + body).rule == "fatal.credit_balance"


# --- families (docs/classification.md "Families") ---------------------------------------------

@pytest.mark.parametrize("result, family", [
    (lambda: classify("error", "529 Overloaded"), "overloaded"),
    (lambda: classify("error", '{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'),
     "overloaded"),
    (lambda: classify("error", "503 The engine is currently overloaded, please try again later"), "overloaded"),
    (lambda: C.classify_facts("error", "Service Unavailable", status=503), "server_error"),
    (lambda: C.classify_facts("error", "The server is overloaded", status=503), "overloaded"),
    (lambda: C.classify_facts("error", "x", status=529), "overloaded"),
    (lambda: C.classify_facts("error", "x", error_type="overloaded_error", status=400), "overloaded"),
    (lambda: classify("error", "429 Too Many Requests"), "rate_limit"),
    (lambda: classify("error", "Claude AI usage limit reached"), "usage_limit"),
    (lambda: classify("error", "502 Bad Gateway"), "server_error"),
    (lambda: classify("error", "read ECONNRESET"), "network"),
    (lambda: classify("error", "stream stalled: no data for 60 s"), "stalled"),
    (lambda: classify("error", "attempt timed out after 120 s"), "timeout"),
    (lambda: classify("error", "prompt is too long: 250000 tokens > 200000 maximum"), "overflow"),
    (lambda: classify("error", "Your credit balance is too low"), "billing"),
    (lambda: classify("error", "401 invalid x-api-key"), "auth"),
    (lambda: classify("error", "400 Bad Request: messages.0.content is required"), "invalid_request"),
    (lambda: classify("error", "something odd happened"), "unknown"),
    (lambda: C.classify_facts("error", "something odd happened", error_type="odd"), "other"),
    (lambda: C.classify_facts("error", "something odd happened", status=409), "invalid_request"),
    (lambda: classify("stop", None), "none"),
])
def test_family_of_a_verdict(result, family):
    """Each verdict carries its family; 529, overloaded_error and 'overloaded' text are overloaded."""
    assert result().family == family


def test_family_outside_the_closed_set_is_refused():
    """A Classification built by hand with an unknown family raises, naming it."""
    with pytest.raises(ValueError, match="'bogus'"):
        Classification("retryable", "x", family="bogus")
    assert Classification("retryable", "retryable.status_429").family == "rate_limit"
    assert Classification("retryable", "structured.status_529").family == "overloaded"
    assert Classification("fatal", "structured.code_insufficient_quota").family == "billing"


@pytest.mark.parametrize("row", CORPUS, ids=[row["id"] for row in CORPUS])
def test_corpus_row_family_is_in_the_closed_set(row):
    """Every corpus verdict has a family of the set, consistent with its kind."""
    result = classify("error", row["message"], now_ms=CORPUS_NOW_MS, zone=ZONE)
    assert result.family in C.FAMILIES
    if result.kind == "context_overflow":
        assert result.family == "overflow"
    if result.usage_limit:
        assert result.family == "usage_limit"
    if result.kind == "retryable":
        assert result.family in ("overloaded", "rate_limit", "usage_limit", "server_error", "network",
                                 "stalled", "timeout", "retry_later", "model_output")


def test_a_free_window_with_a_stated_reset_is_a_usage_limit_even_without_a_clock():
    """A 402 / insufficient_quota free window with a reset stays retryable without now_ms; billing stays fatal."""
    message = ('API Error: 402 {"error":{"message":"Free quota used (30 requests / 5h). Resets at '
               '10:00 UTC.","type":"insufficient_quota","code":"free_quota_exceeded"}}')
    for result in (classify("error", message),
                   C.classify_facts("error", message, status=402, error_type="insufficient_quota")):
        assert (result.kind, result.usage_limit, result.family) == ("retryable", True, "usage_limit")
        assert result.retry_hint_ms is None
    assert classify("error", message, now_ms=_ms(datetime(2026, 6, 6, 8, 0))).retry_hint_ms == 7_200_000
    assert classify("error", '402 {"type":"insufficient_quota"} please retry in 5s').kind == "fatal"
    assert C.classify_facts("error", "usage limit reached", status=402).kind == "fatal"


# --- round 4: general wordings of the families (docs/classification.md "Round 4") --------------

ROUND4_CASES = [
    # (message, kind, family)
    ("relay error (channel #7): Your authentication token has expired, please log in again", "fatal", "auth"),
    ("Upstream error from Provider: Request rate increased too quickly", "retryable", "rate_limit"),
    ("upstream error: the assistant could not finish", "fatal", "unknown"),
    ("Upstream request failed:", "retryable", "server_error"),
    ("400 Bad Request: tool_use_failed, the model produced an invalid tool call", "retryable", "model_output"),
    ("429 Usage credits are required for this model", "fatal", "billing"),
    ("403 Forbidden: this model requires a paid plan", "fatal", "billing"),
    ("You have exhausted your trial credits", "fatal", "billing"),
    ("Your monthly spending limit has been reached", "fatal", "billing"),
    ("Workspace budget exceeded", "fatal", "billing"),
    ("The engine is temporarily overloaded", "retryable", "overloaded"),
    ("429 The engine is currently overloaded", "retryable", "overloaded"),
    ("The system is too busy right now", "retryable", "overloaded"),
    ("Model foo/bar is currently loading", "retryable", "overloaded"),
    ("Cluster busy, retry later", "retryable", "overloaded"),
    ("Please wait ~45s before retrying", "retryable", "retry_later"),
    ("Input length 9000 exceeds the maximum length 8192", "context_overflow", "overflow"),
    ("prompt tokens (130000) exceeded max_prompt_tokens (128000)", "context_overflow", "overflow"),
    ("connection error to the local server, please retry", "retryable", "network"),
    ("Error: could not connect to the model server", "retryable", "network"),
    # other languages: synonyms, variants and word orders
    ("Demasiadas llamadas. Prueba de nuevo más tarde.", "retryable", "rate_limit"),
    ("Límite de concurrencia alcanzado", "retryable", "rate_limit"),
    ("Trop de requêtes simultanées, réessayez ultérieurement", "retryable", "rate_limit"),
    ("Zu viele gleichzeitige Anfragen. Bitte später erneut versuchen.", "retryable", "rate_limit"),
    ("Probieren Sie es später noch einmal", "retryable", "retry_later"),
    ("Muitas chamadas simultâneas. Tente novamente mais tarde.", "retryable", "rate_limit"),
    ("同時リクエスト数の上限に達しました。時間を置いて再度お試しください。", "retryable", "rate_limit"),
    ("リクエスト過多です。後ほどお試しください。", "retryable", "rate_limit"),
    ("并发数过高，请稍候再试", "retryable", "rate_limit"),
    ("請求過於頻繁，請稍後重試", "retryable", "rate_limit"),
    ("동시 요청 한도를 초과했습니다. 나중에 다시 시도하세요.", "retryable", "rate_limit"),
    ("서버 트래픽이 많습니다. 잠시 뒤 다시 시도해 주세요.", "retryable", "overloaded"),
    ("El servidor está saturado", "retryable", "overloaded"),
    ("Reintenta más tarde", "retryable", "retry_later"),
    ("Der Server ist ausgelastet", "retryable", "overloaded"),
]


@pytest.mark.parametrize(("message", "kind", "family"), ROUND4_CASES)
def test_round4_family_wordings(message, kind, family):
    """docs/classification.md "Round 4": gateway prefixes decide nothing, model_output is
    retryable, entitlements and spend caps are fatal, approximate hints, every wording of an
    overloaded engine is ``overloaded``, and the other languages' variants."""
    result = classify("error", message)
    assert (result.kind, result.family) == (kind, family), result


def test_approximate_hints_are_hints():
    """docs/policy.md §2: 'wait ~30s' and 'try again in about 30 seconds' are 30,000 ms hints."""
    assert classify("error", "Wait ~30s before retrying.").retry_hint_ms == 30_000
    assert classify("error", "Busy; try again in about 30 seconds").retry_hint_ms == 30_000


def test_model_output_outranks_a_4xx_in_the_facts():
    """docs/policy.md §2: a 400 whose code or text is the model's invalid output is retryable."""
    assert C.classify_facts("error", "x", status=400, error_code="tool_use_failed").family == "model_output"
    verdict = C.classify_facts("error", '{"message":"Failed to call a function.","status_code":400}', status=400)
    assert (verdict.kind, verdict.family) == ("retryable", "model_output")


def test_a_proxy_413_page_is_fatal_but_a_provider_size_error_is_overflow():
    """docs/policy.md §2: the 413 reason phrase alone is a size refusal; request_too_large is overflow."""
    assert C.classify_facts("error", "<title>413 Request Entity Too Large</title>", status=413).kind == "fatal"
    assert C.classify_facts("error", "413 Request Entity Too Large", status=413,
                            error_type="request_too_large").kind == "context_overflow"


def test_a_permission_refusal_with_a_reset_stands_down():
    """docs/classification.md "Round 4": 'Permission denied:' with a rate limit and a reset is retried."""
    result = classify("error", "Permission denied: Reached message rate limit. Resets in: 2m0s")
    assert (result.kind, result.retry_hint_ms) == ("retryable", 120_000)
    assert classify("error", "Permission denied: an internal error occurred").kind == "fatal"
