"""Schema of the later provider-error corpora, ``tests/data/provider-errors-v2.jsonl``,
``tests/data/provider-errors-v3.jsonl`` and ``tests/data/provider-errors-v4.jsonl``.

Every row is a real error message copied from a public report, with the class and retry hint
the classification rules of ``docs/policy.md §2`` give it (``docs/corpus.md`` explains the
fields and how the rows were collected). This module checks the *data*: that each row is well
formed, cites its public source, carries no secret and stays small, and that a later file adds
messages the earlier ones do not hold. Whether the classifier agrees with a row is checked by
the classification tests, not here.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

DATA = Path(__file__).parents[1] / "data"
V2_PATH = DATA / "provider-errors-v2.jsonl"
V3_PATH = DATA / "provider-errors-v3.jsonl"
V4_PATH = DATA / "provider-errors-v4.jsonl"
V1_PATH = DATA / "provider-errors.jsonl"

CLASSES = {"retryable", "context_overflow", "fatal"}
FAMILIES = {
    "overloaded_5xx", "rate_limit", "rate_limit_hint", "usage_limit", "quota_zero", "billing",
    "context_overflow", "network", "websocket", "gateway_relay", "wrapped", "auth",
    "fatal_request", "model_not_found", "content_filter", "local_runtime", "model_output",
}
REQUIRED = {"id": str, "family": str, "provider": str, "message": str, "expected": str,
            "usage_limit": bool, "notes": str, "source": str}
OPTIONAL = {"status": int, "errorType": str, "errorCode": str, "headers": dict, "now": str}
FIELDS = set(REQUIRED) | set(OPTIONAL) | {"retry_hint_ms"}
MAX_MESSAGE_BYTES = 2048
MAX_NOTES_CHARS = 600
ID_PATTERN = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
# Credential shapes that must never be committed; a redacted key reads "sk-...REDACTED".
SECRET_PATTERNS = {
    "OpenAI/Anthropic-style key": re.compile(r"(?<![A-Za-z0-9])sk-(?!\.\.\.REDACTED)[A-Za-z0-9_-]{8,}"),
    "Google API key": re.compile(r"AIza[0-9A-Za-z_-]{30,}"),
    "bearer token": re.compile(r"Bearer\s+[A-Za-z0-9._~+/=-]{16,}"),
    "GitHub token": re.compile(r"gh[pousr]_[A-Za-z0-9]{20,}"),
    "AWS access key id": re.compile(r"AKIA[0-9A-Z]{16}"),
    "xAI key": re.compile(r"xai-[A-Za-z0-9]{20,}"),
    "JSON web token": re.compile(r"eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"),
}


def _load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def _normal(text: str) -> str:
    return " ".join(text.lower().split())


def row_problems(row: Any) -> list[str]:
    """What is wrong with one corpus row, as readable sentences (empty when it is well formed)."""
    if not isinstance(row, dict):
        return [f"a row must be a JSON object, got {type(row).__name__}"]
    problems = [f"unknown field {key!r}" for key in sorted(set(row) - FIELDS)]
    for key, kind in REQUIRED.items():
        if not isinstance(row.get(key), kind):
            problems.append(f"{key!r} must be a {kind.__name__}, got {row.get(key)!r:.60}")
    for key, kind in OPTIONAL.items():
        if key in row and (not isinstance(row[key], kind) or isinstance(row[key], bool)):
            problems.append(f"{key!r} must be a {kind.__name__}, got {row[key]!r:.60}")
    if problems:
        return problems
    if not ID_PATTERN.fullmatch(row["id"]):
        problems.append(f"id {row['id']!r} must be lower-case words joined by '-'")
    if row["family"] not in FAMILIES:
        problems.append(f"family {row['family']!r} is not one of {sorted(FAMILIES)}")
    if row["expected"] not in CLASSES:
        problems.append(f"expected {row['expected']!r} is not one of {sorted(CLASSES)}")
    for key in ("provider", "message", "notes"):
        if not row[key].strip():
            problems.append(f"{key!r} is blank")
    size = len(row["message"].encode("utf-8"))
    if size > MAX_MESSAGE_BYTES:
        problems.append(f"message is {size} bytes, more than {MAX_MESSAGE_BYTES}")
    if len(row["notes"]) > MAX_NOTES_CHARS:
        problems.append(f"notes are {len(row['notes'])} characters, more than {MAX_NOTES_CHARS}")
    source = urlsplit(row["source"])
    if source.scheme not in ("http", "https") or not source.netloc or " " in row["source"]:
        problems.append(f"source {row['source']!r} is not an http(s) URL")
    hint = row.get("retry_hint_ms")
    if hint is not None and (isinstance(hint, bool) or not isinstance(hint, int) or hint < 0):
        problems.append(f"retry_hint_ms must be null or a non-negative integer, got {hint!r}")
    if row["expected"] != "retryable" and hint is not None:
        problems.append(f"a {row['expected']} row carries no retry hint, got {hint!r}")
    if row["expected"] != "retryable" and row["usage_limit"]:
        problems.append(f"a usage limit is retryable, but the row expects {row['expected']}")
    if "status" in row and not 100 <= row["status"] <= 599:
        problems.append(f"status {row['status']} is not an HTTP status")
    if "headers" in row and not all(isinstance(k, str) and isinstance(v, str)
                                    for k, v in row["headers"].items()):
        problems.append("headers must map names to string values")
    if "now" in row:
        try:
            datetime.fromisoformat(row["now"])
        except ValueError:
            problems.append(f"now {row['now']!r} is not an ISO 8601 date-time")
        if hint is None:
            problems.append("'now' is only for rows whose hint depends on the clock")
    text = json.dumps(row, ensure_ascii=False)
    problems += [f"looks like a {name} — redact it to sk-...REDACTED"
                 for name, pattern in SECRET_PATTERNS.items() if pattern.search(text)]
    return problems


V2 = _load(V2_PATH)
V3 = _load(V3_PATH)
V4 = _load(V4_PATH)
V1 = _load(V1_PATH)
LATER = {"v2": (V2_PATH, V2, V1), "v3": (V3_PATH, V3, V1 + V2), "v4": (V4_PATH, V4, V1 + V2 + V3)}
"""Each later file, its rows, and the rows of the files before it."""


@pytest.mark.parametrize("row", V2 + V3 + V4, ids=[str(row.get("id")) for row in V2 + V3 + V4])
def test_row_is_well_formed(row):
    """Each row has the documented fields, a known class, a public source and no secret."""
    assert row_problems(row) == []


@pytest.mark.parametrize("name", sorted(LATER))
def test_every_line_is_a_json_object(name):
    """The file is JSON lines: one object per non-empty line, UTF-8."""
    path = LATER[name][0]
    for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
        if line.strip():
            assert isinstance(json.loads(line), dict), f"line {number}"


@pytest.mark.parametrize("name", sorted(LATER))
def test_ids_are_unique_sorted_and_new(name):
    """Ids are unique within the file, sorted, and do not reuse an id of an earlier corpus."""
    _, rows, earlier = LATER[name]
    ids = [row["id"] for row in rows]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    assert not set(ids) & {row["id"] for row in earlier}


@pytest.mark.parametrize("name", sorted(LATER))
def test_messages_are_not_copies_of_an_earlier_corpus(name):
    """A row adds a message no earlier corpus already holds (up to case and spacing)."""
    _, rows, earlier = LATER[name]
    earlier_messages = {_normal(row["message"]) for row in earlier}
    assert [row["id"] for row in rows if _normal(row["message"]) in earlier_messages] == []


def test_third_corpus_is_large_dated_and_covers_the_round_families():
    """At least 120 rows from public threads; every class; the families of the third round and
    the providers the earlier files had few of are all there."""
    assert len(V3) >= 120
    assert {row["expected"] for row in V3} == CLASSES
    families = {row["family"] for row in V3}
    assert {"context_overflow", "quota_zero", "usage_limit", "gateway_relay", "network",
            "rate_limit_hint", "billing", "websocket", "local_runtime"} <= families
    providers = " ".join(row["provider"].lower() for row in V3)
    for name in ("minimax", "volcengine", "siliconflow", "hugging face", "cursor", "copilot",
                 "vllm", "sglang", "llama.cpp", "ollama", "lm studio", "new-api"):
        assert name in providers, name
    assert all(row["source"].startswith("https://github.com/") for row in V3)


def test_fourth_corpus_is_large_and_spread_over_the_providers_of_round_four():
    """docs/corpus.md "The fourth file": at least 100 rows from public GitHub threads, every class,
    the round's families (model_output, entitlements, concurrency, local servers) and the
    providers the earlier files had few of (Chinese clouds, inference hosts, IDE assistants,
    local servers)."""
    assert len(V4) >= 100
    assert {row["expected"] for row in V4} == CLASSES
    assert {"model_output", "billing", "rate_limit", "context_overflow", "local_runtime",
            "network"} <= {row["family"] for row in V4}
    providers = " ".join(row["provider"].lower() for row in V4)
    for name in ("dashscope", "zhipu", "moonshot", "volcengine", "siliconflow", "minimax", "qianfan",
                 "groq", "cerebras", "together", "deepinfra", "sambanova", "nvidia",
                 "cursor", "copilot", "windsurf", "kilo code", "continue",
                 "ollama", "lm studio", "vllm"):
        assert name in providers, name
    assert all(row["source"].startswith("https://github.com/") for row in V4)


def test_corpus_is_large_and_balanced():
    """At least 150 rows; every class appears; no family is a token one (three rows or more)."""
    assert len(V2) >= 150
    assert {row["expected"] for row in V2} == CLASSES
    per_family = {family: sum(row["family"] == family for row in V2) for family in FAMILIES - {"model_output"}}
    assert min(per_family.values()) >= 3, per_family


GOOD = {"id": "a-b", "family": "network", "provider": "p", "message": "socket hang up",
        "expected": "retryable", "retry_hint_ms": None, "usage_limit": False, "notes": "n",
        "source": "https://github.com/o/r/issues/1"}


@pytest.mark.parametrize(("change", "complaint"), [
    ({"expected": "maybe"}, "expected 'maybe'"),
    ({"source": "github.com/o/r/issues/1"}, "is not an http(s) URL"),
    ({"source": "ftp://example.org/x"}, "is not an http(s) URL"),
    ({"message": "x" * 2049}, "more than 2048"),
    ({"message": "Incorrect API key provided: sk-proj-abcdefghijkl1234"}, "OpenAI/Anthropic-style"),
    ({"message": "key=AIzaSyA1234567890abcdefghijklmnopqrstu"}, "Google API key"),
    ({"expected": "fatal", "retry_hint_ms": 1000}, "carries no retry hint"),
    ({"expected": "fatal", "usage_limit": True}, "a usage limit is retryable"),
    ({"retry_hint_ms": -5}, "non-negative integer"),
    ({"status": 1015}, "is not an HTTP status"),
    ({"now": "yesterday", "retry_hint_ms": 5}, "is not an ISO 8601"),
    ({"now": "2026-01-01T00:00:00+00:00"}, "'now' is only for"),
    ({"family": "misc"}, "family 'misc'"),
    ({"id": "Has Spaces"}, "lower-case words"),
    ({"extra": 1}, "unknown field 'extra'"),
    ({"usage_limit": "no"}, "'usage_limit' must be a bool"),
])
def test_row_problems_names_what_is_wrong(change, complaint):
    """The checker rejects each kind of bad row and says why (so the row test can fail)."""
    assert row_problems(GOOD) == []
    problems = row_problems({**GOOD, **change})
    assert any(complaint in problem for problem in problems), problems


def test_redacted_key_is_accepted():
    """A key written as sk-...REDACTED is the documented redaction, not a secret."""
    assert row_problems({**GOOD, "message": "Incorrect API key provided: sk-...REDACTED."}) == []
