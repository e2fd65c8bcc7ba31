"""`python -m fsm classify`: one message, or JSON lines from a file or standard input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[2]


def fsm(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "fsm", "classify", *args], input=stdin,
                          capture_output=True, cwd=ROOT, timeout=60)


def lines(out: bytes) -> list[dict]:
    return [json.loads(line) for line in out.decode("utf-8").splitlines()]


# --- one message ------------------------------------------------------------------------------

def test_one_message_prints_kind_rule_and_hint():
    """One message prints kind rule and hint."""
    proc = fsm('Error: 429 {"type":"error","error":{"type":"rate_limit_error"}} (retry-after: 30)')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().splitlines() == [
        "kind:        retryable",
        "rule:        retryable.status_429",
        "family:      rate_limit",
        "usage limit: no",
        "retry hint:  30000 ms (30s)",
    ]


def test_one_message_without_hint_and_with_usage_limit():
    """One message without hint and with usage limit."""
    out = fsm("Claude AI usage limit reached").stdout.decode()
    assert "usage limit: yes" in out and "retry hint:  none" in out
    out = fsm("You've hit your usage limit. Try again in 5 days 22 hours 11 minutes.").stdout.decode()
    assert "retry hint:  511860000 ms (5d22h11m)" in out


def test_one_message_as_json():
    """One message as JSON."""
    proc = fsm("--json", "prompt is too long: 219898 tokens > 200000 maximum")
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == {"kind": "context_overflow", "rule": "overflow.prompt_too_long",
                                       "family": "overflow", "usageLimit": False, "retryHintMs": None}


def test_options_stop_reason_context_window_tokens_and_clock():
    """Options stop reason context window tokens and clock."""
    assert json.loads(fsm("--json", "--stop-reason", "stop", "Overloaded").stdout)["kind"] == "none"
    silent = json.loads(fsm("--json", "--context-window", "1000", "--input-tokens", "900",
                            "--cache-read-tokens", "200", "weird").stdout)
    assert silent["rule"] == "overflow.silent_usage"
    hint = json.loads(fsm("--json", "--now-ms", str(1749924000 * 1000 - 60_000),
                          "Claude AI usage limit reached|1749924000").stdout)
    assert hint["retryHintMs"] == 60_000
    assert "retry hint:  250 ms (250ms)" in fsm("overloaded, retry-after-ms: 250").stdout.decode()


@pytest.mark.parametrize("args", [[], ["msg", "--jsonl", "-"]])
def test_message_or_jsonl_is_required(args):
    """Message or jsonl is required."""
    proc = fsm(*args)
    assert proc.returncode == 2
    assert b"give either a MESSAGE or --jsonl FILE" in proc.stderr


def test_negative_counts_are_refused():
    """Negative counts are refused."""
    proc = fsm("--context-window", "-1", "x")
    assert proc.returncode == 2 and b"--context-window must be >= 0, got -1" in proc.stderr


# --- JSON lines -------------------------------------------------------------------------------

def test_jsonl_file_with_a_bad_line_in_the_middle(tmp_path):
    """Jsonl file with a bad line in the middle."""
    path = tmp_path / "errors.jsonl"
    path.write_text('{"message": "Overloaded", "id": 1}\n'
                    "this is not json\n"
                    '{"message": "prompt is too long", "id": 3}\n', "utf-8")
    proc = fsm("--jsonl", str(path))
    assert proc.returncode == 1
    assert lines(proc.stdout) == [
        {"message": "Overloaded", "id": 1, "kind": "retryable", "rule": "retryable.overloaded",
         "family": "overloaded", "usageLimit": False, "retryHintMs": None},
        {"message": "prompt is too long", "id": 3, "kind": "context_overflow",
         "rule": "overflow.prompt_too_long", "family": "overflow", "usageLimit": False, "retryHintMs": None},
    ]
    assert proc.stderr.decode().splitlines() == [
        "fsm classify: line 2: invalid JSON: Expecting value at column 1"]


def test_jsonl_from_stdin_all_good_exits_0():
    """Jsonl from stdin all good exits 0."""
    data = ('{"message": "rate limit, retry-after: 4"}\n'
            "\n"
            '{"message": null}\r\n'
            '{"message": "x", "stopReason": "aborted"}\n'
            '{"errorMessage": "weird", "contextWindow": 10, "usage": {"input": 8, "cacheRead": 5}}\n'
            '{"message": "ok", "stopReason": "stop", "usage": null, "contextWindow": null}').encode()
    proc = fsm("--jsonl", "-", stdin=data)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""
    got = [(o["kind"], o["rule"], o["retryHintMs"]) for o in lines(proc.stdout)]
    assert got == [("retryable", "retryable.rate_limit", 4000),
                   ("fatal", "error.no_message", None),
                   ("none", "stop_reason.not_error", None),
                   ("context_overflow", "overflow.silent_usage", None),
                   ("none", "stop_reason.not_error", None)]


@pytest.mark.parametrize("line, problem", [
    (b"[1, 2]", "expected a JSON object, got list"),
    (b'"just a string"', "expected a JSON object, got str"),
    (b"{}", 'missing "message"'),
    (b'{"message": 5}', '"message" must be a string or null, got int'),
    (b'{"errorMessage": ["x"]}', '"errorMessage" must be a string or null, got list'),
    (b'{"message": "x", "stopReason": 1}', '"stopReason" must be a string, got int'),
    (b'{"message": "x", "contextWindow": "big"}', '"contextWindow" must be a non-negative integer'),
    (b'{"message": "x", "contextWindow": true}', '"contextWindow" must be a non-negative integer'),
    (b'{"message": "x", "contextWindow": -3}', '"contextWindow" must be a non-negative integer'),
    (b'{"message": "x", "usage": {"input": -1}}', "usage.input must be a non-negative integer"),
    (b'{"message": "x", "usage": [1]}', "usage must be an object"),
    (b'{"message": "x", "usage": {"input": 1.5}}', "usage.input must be a non-negative integer"),
    (b"\xff\xfe{}", "not valid UTF-8 (byte 0xff at offset 0)"),
    (b'{"message": "caf\xc3"}', "not valid UTF-8"),
    (b"[" * 100_000, "invalid JSON"),
    (b'{"message": "x"', "invalid JSON: Expecting ',' delimiter"),
    (b'{"message": "x", "status": "529"}', '"status" must be an HTTP status (an integer 100-599), got "529"'),
    (b'{"message": "x", "status": 1000}', '"status" must be an HTTP status'),
    (b'{"message": "x", "status": true}', '"status" must be an HTTP status'),
    (b'{"message": "x", "errorType": 5}', '"errorType" must be a string, got 5'),
    (b'{"message": "x", "errorCode": ["a"]}', '"errorCode" must be a string'),
    (b'{"message": "x", "headers": {"retry-after": 3}}', '"headers" must be an object of strings'),
    (b'{"message": "x", "headers": "retry-after: 3"}', '"headers" must be an object of strings'),
])
def test_jsonl_bad_lines_are_reported_and_the_rest_processed(line, problem):
    """Jsonl bad lines are reported and the rest processed."""
    data = b'{"message": "503"}\n' + line + b'\n{"message": "timed out"}\n'
    proc = fsm("--jsonl", "-", stdin=data)
    assert proc.returncode == 1
    assert [o["rule"] for o in lines(proc.stdout)] == ["retryable.status_503", "retryable.timeout"]
    stderr = proc.stderr.decode()
    assert stderr.startswith("fsm classify: line 2: ") and problem in stderr, stderr
    assert "Traceback" not in stderr


def test_jsonl_structured_facts_decide_first():
    """Jsonl structured facts decide first."""
    data = ('{"message": "something odd", "status": 529}\n'
            '{"message": "x", "status": 429, "errorCode": "insufficient_quota"}\n'
            '{"message": "Too Many Requests", "status": 429, "headers": {"X-RateLimit-Reset": "20"}}\n'
            '{"message": "odd", "errorType": "overloaded_error"}\n'
            '{"message": "odd", "status": 500, "headers": {"x-should-retry": "false"}}\n').encode()
    proc = fsm("--jsonl", "-", stdin=data)
    assert proc.returncode == 0, proc.stderr
    got = [(o["kind"], o["rule"], o["retryHintMs"]) for o in lines(proc.stdout)]
    assert got == [("retryable", "structured.status_529", None),
                   ("fatal", "structured.code_insufficient_quota", None),
                   ("retryable", "structured.status_429", 20_000),
                   ("retryable", "structured.type_overloaded_error", None),
                   ("fatal", "structured.x_should_retry_false", None)]
    assert lines(proc.stdout)[2]["headers"] == {"X-RateLimit-Reset": "20"}  # the line as given


def test_jsonl_keeps_unicode_and_lone_surrogates():
    """Jsonl keeps unicode and lone surrogates."""
    data = ('{"message": "请求过于频繁"}\n{"message": "\\ud800 503"}\n').encode()
    proc = fsm("--jsonl", "-", stdin=data)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    assert json.loads(first)["message"] == "请求过于频繁"
    assert "请求过于频繁".encode() in first  # written as UTF-8, not escaped
    assert json.loads(second)["rule"] == "retryable.status_503"


def test_jsonl_missing_file():
    """Jsonl missing file."""
    proc = fsm("--jsonl", "/nonexistent/errors.jsonl")
    assert proc.returncode == 1
    assert b"cannot read /nonexistent/errors.jsonl" in proc.stderr


def test_jsonl_a_megabyte_message_and_many_lines(tmp_path):
    """Jsonl a megabyte message and many lines."""
    path = tmp_path / "big.jsonl"
    rows = [{"message": "rate lim" * 131072}] + [{"message": f"connection reset (#{i})"}
                                                  for i in range(500)]
    path.write_text("\n".join(json.dumps(row) for row in rows), "utf-8")
    proc = fsm("--jsonl", str(path))
    assert proc.returncode == 0
    out = lines(proc.stdout)
    assert len(out) == 501 and out[0]["kind"] == "fatal"
    assert {o["rule"] for o in out[1:]} == {"retryable.connection"}


def test_help_lists_the_command():
    """Help lists the command."""
    proc = subprocess.run([sys.executable, "-m", "fsm", "--help"], capture_output=True, cwd=ROOT,
                          timeout=60)
    assert b"classify" in proc.stdout


def test_dash_reads_the_message_from_stdin():
    """Dash reads the message from stdin."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "fsm", "classify", "-"], input=b"503 Service Unavailable\n",
                          capture_output=True, timeout=30)
    assert proc.returncode == 0
    assert b"kind:        retryable" in proc.stdout


def test_help_documents_the_jsonl_shape():
    """Help documents the jsonl shape."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "fsm", "classify", "--help"], capture_output=True,
                          text=True, timeout=30)
    assert "contextWindow" in proc.stdout and "retryHintMs" in proc.stdout
    assert all(name in proc.stdout for name in ("status", "errorType", "errorCode", "headers"))
    assert "$ python -m fsm classify --jsonl errors.jsonl" in proc.stdout
    assert ".. code-block" not in proc.stdout  # the docstring's ReST directives are not help text
