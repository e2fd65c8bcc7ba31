"""`python -m fsm demo`, the README's main job, run for real with short backoffs."""

import json
import re
import subprocess
import sys

from support import run_demo


def test_demo_survives_529_and_503(demo_run):
    """Demo survives 529 and 503 (part 1 of the shared run, tests/conftest.py ``demo_run``)."""
    proc, out_dir = demo_run
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert re.search(r"request 1 failed: .*529", out)
    # Each decision in a plain sentence: the error, the rule, the wait, the attempt.
    assert re.search(r"529.* is retryable \(rule [a-z_.0-9]+\): waiting 0\.02 s, attempt 1 of 3", out), out
    assert re.search(r"503.* is retryable \(rule [a-z_.0-9]+\): waiting 0\.04 s, attempt 2 of 3", out), out
    assert "the retry succeeded on attempt 2: the chain is over" in out
    # No key is offered (the demo reads no keyboard), and the answer says where it came from.
    assert "esc" not in out.lower()
    assert "A local fault server at http://127.0.0.1:" in out and "no model is called" in out
    assert "answer (canned text from the local fault server, not a model): " in out
    assert "(script:" not in out and "{" not in out  # no jargon, no raw JSON
    assert "HTTP requests: 3 (one per attempt)" in out
    log = [json.loads(line) for line in (out_dir / "session.jsonl").read_text().splitlines()]
    assert [e["message"].get("stopReason", "user") for e in log[1:]] == ["user", "error", "error", "stop"]
    trace = [json.loads(line) for line in (out_dir / "trace.jsonl").read_text().splitlines()]
    assert trace[0]["type"] == "trace"
    assert any(r.get("dest") == "succeeded" and r.get("outcome") == "taken" for r in trace[1:])


def test_demo_reports_exhaustion_with_failure_line(tmp_path):
    """Demo reports exhaustion with failure line."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"status": 503, "json": {"error": {"message": "down"}}}] * 4))
    proc = run_demo(tmp_path, "--script", str(script))
    assert proc.returncode == 1
    assert "It answers: 503 down, then 503 down, then 503 down, then 503 down;" in proc.stdout
    assert "Retry failed after 3 attempts: " in proc.stdout
    assert "no answer: the turn ended with " in proc.stdout


def test_demo_says_when_an_error_is_not_retried(tmp_path):
    """Demo says when an error is not retried."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"status": 401, "json": {"error": {"message": "Incorrect API key provided"}}}]))
    proc = run_demo(tmp_path, "--script", str(script))
    assert proc.returncode == 1
    assert re.search(r"that is not retried \(fatal, rule [a-z_.0-9]+\): the turn ends with this error",
                     proc.stdout), proc.stdout


def test_demo_keeps_the_default_settings_without_a_settings_file():
    """make demo runs with the defaults: 3 retries, 2 s first backoff."""
    from fsm.commands.common import load_settings
    settings = load_settings(None, prog="demo")
    assert (settings.max_retries, settings.base_delay_ms) == (3, 2000)


def test_demo_refuses_bad_script(tmp_path):
    """Demo refuses bad script."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"status": 999}]))
    proc = run_demo(tmp_path, "--script", str(script))
    assert proc.returncode == 2
    assert "0" in proc.stderr and "status" in proc.stderr


def test_demo_part_two_honours_a_short_hint_and_refuses_a_long_one_in_words(demo_run):
    """Demo part two honours a short hint (``--hint-ms 150``) and refuses a long one in words."""
    proc, out_dir = demo_run
    assert proc.returncode == 0, proc.stderr
    part2 = proc.stdout.split('Part 2: the same kind of session with retryHints: "honor"', 1)[1]
    assert re.search(r"is retryable \(rule [a-z_.0-9]+\): waiting 0\.15 s as the server asked, "
                     r"attempt 1 of 3", part2), part2
    assert re.search(r"Not retrying: the server asks to wait 2 h \(until \d\d:\d\d(:\d\d)? UTC\), "
                     r"longer than retry.maxHintWaitMs = 1 min", part2), part2
    assert "HTTP requests: 3 (one per attempt)" in part2
    assert "no answer to the last prompt, as intended" in part2
    log = [json.loads(x) for x in (out_dir / "session-honor.jsonl").read_text().splitlines()]
    assert [e["message"].get("stopReason", "user") for e in log[1:]] == \
        ["user", "error", "stop", "user", "error"]


_FIRST_REQUEST = r"""
import asyncio, json, sys
from fsm.providers.apis import build_provider
from fsm.testing.fault_server import FaultServer
STACK = ("openai", "httpx2", "httpcore2", "h11", "h2", "anyio", "sniffio")
with FaultServer([{"status": 503, "json": {"error": {"message": "down"}}}]) as server:
    provider = build_provider("openai", base_url=server.base_url, model="m", api_key="k")
    async def main():
        if sys.argv[1] == "warm":
            await provider.warm_up()
        before = set(sys.modules)
        await provider.complete([{"role": "user", "content": "hi"}])
        await provider.aclose()
        return sorted(m for m in set(sys.modules) - before if m.split(".")[0] in STACK)
    print(json.dumps(asyncio.run(main())))
"""


def test_the_demo_s_clock_starts_after_the_sdk_is_loaded():
    """The demo's printed times are the session's (README "make demo"): it awaits the
    provider's ``warm_up()`` before its clock starts, and after it the first request imports
    nothing more of the SDK or its HTTP stack (a cold client's first request imports
    ``httpcore2``, ``h11``, the chat resource and anyio's backend: a few hundred ms that the
    demo printed as the first request's time)."""
    import pathlib
    source = pathlib.Path(__file__).resolve().parents[2] / "fsm" / "commands" / "demo.py"
    text = source.read_text()
    assert text.index("await warm_up()") < text.index("t0 = time.monotonic()")
    loaded = json.loads(subprocess.run([sys.executable, "-c", _FIRST_REQUEST, "warm"],
                                       capture_output=True, text=True, timeout=60,
                                       check=True).stdout)
    assert loaded == [], loaded
