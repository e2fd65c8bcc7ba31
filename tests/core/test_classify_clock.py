"""The classifier and its hints read no clock and no time zone: the host's now_ms and zone decide."""

from __future__ import annotations

import ast
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from fsm.commands.classify import zone_resolver
from fsm.core.classify import classify, classify_facts
from fsm.core.hints import header_hint

NOW_MS = datetime(2026, 6, 14, 12, 0, tzinfo=timezone.utc).timestamp() * 1000
ZONE = zone_resolver()
CORE = Path(__file__).resolve().parents[2] / "fsm" / "core"

# Absolute hints of every kind the classifier resolves against the host's clock.
ABSOLUTE_MESSAGES = [
    "429 Too Many Requests (retry-after: Sun, 14 Jun 2026 12:00:30 GMT)",
    "429 rate limited (x-ratelimit-reset: 1781438460)",  # epoch seconds
    "429 rate limited (x-ratelimit-reset-ms: 1781438460000)",  # epoch ms
    "429 rate_limit_error (anthropic-ratelimit-tokens-reset: 2026-06-14T12:05:00Z)",
    "Claude AI usage limit reached|1781442000",
    "You've hit your limit · resets 3pm (Europe/Berlin)",
    "5-hour limit reached ∙ resets 3pm",  # no zone: UTC
    "You've hit your usage limit. Try again at Jun 15th, 2026 8:19 PM.",
    "You will regain access on 2026-06-15 at 00:00 UTC (usage limit)",
]


def _hints() -> list[int | None]:
    return [classify("error", m, now_ms=NOW_MS, zone=ZONE).retry_hint_ms for m in ABSOLUTE_MESSAGES]


def test_every_absolute_message_gives_a_hint():
    """Each message of the clock test does carry an absolute hint the classifier resolves."""
    assert all(h is not None and h > 0 for h in _hints()), _hints()


def test_wrong_wall_clock_and_far_zone_give_the_same_hints(monkeypatch):
    """A wall clock in 1990 and TZ=UTC+14 change nothing: only the host's now_ms counts."""
    expected = _hints()
    monkeypatch.setattr(time, "time", lambda: 631_152_000.0)  # 1990-01-01
    monkeypatch.setattr(time, "time_ns", lambda: 631_152_000 * 10**9)
    for tz in ("Pacific/Kiritimati", "America/Adak", "Asia/Kathmandu"):
        monkeypatch.setenv("TZ", tz)
        time.tzset()
        try:
            assert _hints() == expected
            headers = {"retry-after": "Sun, 14 Jun 2026 12:00:30 GMT"}
            assert header_hint(headers, rate_limited=True, now_ms=NOW_MS).ms == 30_000
            assert classify_facts("error", "rate limited", status=429, headers=headers,
                                  now_ms=NOW_MS).retry_hint_ms == 30_000
        finally:
            monkeypatch.delenv("TZ")
            time.tzset()


def test_without_the_hosts_clock_absolute_hints_are_none():
    """With no now_ms the core has no time to measure an absolute hint against: no hint."""
    for message in ABSOLUTE_MESSAGES:
        result = classify("error", message, zone=ZONE)
        assert result.kind == "retryable" and result.retry_hint_ms is None, (message, result)
    assert classify("error", "429 please retry in 7s").retry_hint_ms == 7000


_FORBIDDEN_CALLS = {("time", "time"), ("time", "time_ns"), ("time", "monotonic"), ("time", "localtime"),
                    ("datetime", "now"), ("datetime", "today"), ("datetime", "utcnow"), ("date", "today"),
                    ("time", "tzset")}


@pytest.mark.parametrize("path", sorted((CORE / "classify").glob("*.py")) + [CORE / "hints.py"],
                         ids=lambda p: p.name)
def test_classifier_source_reads_no_clock_or_zone(path):
    """No clock call, no zone database and no argument-less astimezone() in the classifier."""
    tree = ast.parse(path.read_text("utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n and n.split(".")[0] in ("zoneinfo", "time") for n in names), (path, names)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            owner_name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
            assert (owner_name, node.func.attr) not in _FORBIDDEN_CALLS, (path, node.lineno)
            assert not (node.func.attr == "astimezone" and not node.args), (path, node.lineno)
