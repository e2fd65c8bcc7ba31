"""``Classification.capacity_signal`` (docs/classification.md "Capacity signal"): which failures
say the provider has no capacity now — a 429 rate limit, a 529 or overloaded, a 503 or
unavailable, a connection refused or reset — across the corpus' families and both paths."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from fsm.core.classify import Classification, capacity_signal_of, classify, classify_facts

DATA = Path(__file__).parents[1] / "data"
CORPUS = [json.loads(line) for path in sorted(DATA.glob("provider-errors*.jsonl"))
          for line in path.read_text("utf-8").splitlines() if line.strip()]

SIGNALS = [
    # (text, structured facts, capacity signal)
    ("HTTP 429", {}, True),
    ("Rate limit is exceeded.", {}, True),
    ('{"type":"error","error":{"type":"rate_limit_error"}}', {"status": 429, "error_type": "rate_limit_error"}, True),
    ("API Error: 529", {}, True),
    ("The server is currently overloaded with other requests.", {}, True),
    ("Overloaded", {"status": 529, "error_type": "overloaded_error"}, True),
    ("503 The engine is currently overloaded, please try again later", {}, True),
    ("503 Service Unavailable", {}, True),
    ("Service Unavailable", {}, True),
    ("", {"status": 503}, True),
    ('{"error":{"status":"UNAVAILABLE"}}', {"status": 503, "error_code": "unavailable"}, True),
    ("Connection error. (ConnectError: [Errno 111] Connection refused)", {}, True),
    ("connect ECONNREFUSED 127.0.0.1:443", {}, True),
    ("read ECONNRESET", {}, True),
    ("[Errno 104] Connection reset by peer", {}, True),
    ("Overloaded", {"status": 529, "headers": {"x-should-retry": "true"}}, True),
    ("500 Internal Server Error", {}, False),
    ("Internal server error", {"status": 500, "error_type": "api_error"}, False),
    ("Internal", {"status": 500, "headers": {"x-should-retry": "true"}}, False),
    ("502 Bad Gateway", {}, False),
    ("Bad Gateway", {}, False),
    ("504 Gateway Timeout", {}, False),
    ("stream stalled: no response within 30 s", {}, False),
    ("attempt timed out after 120 s", {}, False),
    ("Request timed out.", {}, False),
    ("socket hang up", {}, False),
    ("Premature close", {}, False),
    ("TypeError: terminated", {}, False),
    ("Claude AI usage limit reached", {}, False),
    ("5-hour limit reached ∙ resets 3pm", {}, False),
    ('429 {"error":{"type":"usage_limit_reached","message":"The usage limit has been reached"}}',
     {"status": 429, "error_type": "usage_limit_reached", "headers": {"retry-after": "1"}}, False),
    ("Please try your request again.", {}, False),
    ("Incorrect API key provided: sk-xxxx.", {"status": 401}, False),
    ("prompt is too long: 219898 tokens > 200000 maximum", {"status": 400}, False),
    ("You exceeded your current quota, please check your plan and billing details.",
     {"status": 429, "error_code": "insufficient_quota"}, False),
]


@pytest.mark.parametrize("text, facts, expected", SIGNALS)
def test_capacity_signal_of_each_kind_of_failure(text, facts, expected):
    """429, 529/overloaded, 503/unavailable, refused/reset are signals; 500, 502/504, stall, timeout, drop, usage limit, fatal are not (docs/classification.md "Capacity signal")."""
    cls = classify_facts("error", text or None, **facts) if facts else classify("error", text)
    assert cls.capacity_signal is expected, cls


def test_corpus_capacity_signal_follows_the_family():
    """On every corpus row: a signal is retryable and never a usage limit; rate_limit/overloaded always are; stalled/timeout/retry_later never (docs/classification.md "Capacity signal")."""
    wrong = []
    for row in CORPUS:
        cls = classify("error", row["message"])
        if cls.kind != "retryable" or cls.usage_limit or cls.family in ("usage_limit", "stalled",
                                                                        "timeout", "retry_later"):
            expected = {False}
        elif cls.family in ("rate_limit", "overloaded"):
            expected = {True}
        else:
            expected = {True, False}
        if cls.capacity_signal not in expected or not isinstance(cls.capacity_signal, bool):
            wrong.append((row["id"], cls))
    assert wrong == []


def test_the_corpus_holds_signals_and_non_signals_of_every_retryable_family_that_has_both():
    """The corpus exercises both answers for server_error (503 vs 500) and network (refused/reset vs dropped) (docs/classification.md "Capacity signal")."""
    seen: dict[str, set[bool]] = {}
    for row in CORPUS:
        cls = classify("error", row["message"])
        if cls.kind == "retryable":
            seen.setdefault(cls.family, set()).add(cls.capacity_signal)
    assert seen["server_error"] == {True, False}
    assert seen["network"] == {True, False}
    assert seen["rate_limit"] == {True} and seen["overloaded"] == {True}
    assert seen["usage_limit"] == {False} and seen["timeout"] == {False}


def test_a_hand_built_classification_derives_the_signal_from_its_rule():
    """Left out, capacity_signal comes from kind, rule and family (capacity_signal_of; docs/classification.md "Capacity signal")."""
    assert Classification("retryable", "structured.status_529").capacity_signal is True
    assert Classification("retryable", "structured.status_503").capacity_signal is True
    assert Classification("retryable", "structured.status_500").capacity_signal is False
    assert Classification("retryable", "retryable.status_429", True).capacity_signal is False
    assert Classification("fatal", "fatal.unmatched").capacity_signal is False
    assert capacity_signal_of("retryable", "retryable.rate_limit", "rate_limit") is True
    assert capacity_signal_of("retryable", "retryable.rate_limit", "rate_limit", True) is False


def test_an_explicit_signal_holds_only_for_a_retryable_verdict_that_is_no_usage_limit():
    """An explicit True is kept for a retryable network verdict, dropped for a fatal one or a usage limit; equality ignores it (docs/classification.md "Capacity signal")."""
    assert Classification("retryable", "retryable.connection", capacity_signal=True).capacity_signal is True
    assert Classification("fatal", "fatal.unmatched", capacity_signal=True).capacity_signal is False
    assert Classification("retryable", "retryable.usage_limit", True, capacity_signal=True).capacity_signal is False
    refused = classify("error", "connect ECONNREFUSED 127.0.0.1:443")
    assert refused == Classification("retryable", refused.rule)
    assert replace(refused, retry_hint_ms=1_000).capacity_signal is True


@pytest.mark.parametrize("text", [
    "503 The engine is currently overloaded", "503 we are over capacity", "503 no capacity left",
    "503 the model is at capacity", "503 capacity exhausted", "503 high demand right now",
    "503 high traffic", "503 heavy load", "503 heavy traffic", "503 under heavy load",
    "503 the server is too busy", "503 server busy", "503 models are currently busy",
    "503 the engine is currently loading", "503 serveur surchargé", "503 servidor sobrecargado",
    "503 Server überlastet", "503 Dienst ausgelastet", "503 服务器繁忙", "503 服务过载",
    "503 サーバー過負荷", "503 サーバー混雑", "503 서버 과부하"])
def test_every_wording_of_an_engine_at_capacity_is_overloaded(text):
    """docs/classification.md "Families": a retryable 5xx whose text says the engine is at
    capacity is ``overloaded``, in every wording the family knows — each one holds a word of
    the cheap test that runs before the family's regex (fsm.core.classify.decide)."""
    from fsm.core.classify.decide import _OVERLOADED_NEEDLES
    assert any(needle in text.lower() for needle in _OVERLOADED_NEEDLES)
    assert classify("error", text).family == "overloaded"
    assert classify("error", "503 the server had an error").family != "overloaded"
