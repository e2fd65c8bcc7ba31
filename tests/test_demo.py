"""`python -m fsm demo`, the README's main job, run for real with short backoffs."""

import json
import subprocess
import sys


def run_demo(tmp_path, *extra):
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"retry": {"baseDelayMs": 20, "provider": {"maxRetries": 0}}}))
    return subprocess.run([sys.executable, "-m", "fsm", "demo", "--out", str(tmp_path / "out"),
                           "--settings", str(settings), *extra],
                          capture_output=True, text=True, timeout=60)


def test_demo_survives_529_and_503(tmp_path):
    proc = run_demo(tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Retrying (1/3) in 0s… (esc to cancel)" in out
    assert "Retrying (2/3) in 0s… (esc to cancel)" in out
    assert "overloaded_error" in out and "503" in out
    assert '"type": "auto_retry_end", "success": true, "attempt": 2' in out
    assert "HTTP requests: 3 (one per attempt)" in out
    log = [json.loads(line) for line in (tmp_path / "out" / "session.jsonl").read_text().splitlines()]
    assert [e["message"].get("stopReason", "user") for e in log[1:]] == ["user", "error", "error", "stop"]
    trace = [json.loads(line) for line in (tmp_path / "out" / "trace.jsonl").read_text().splitlines()]
    assert trace[0]["type"] == "trace"
    assert any(r.get("dest") == "succeeded" and r.get("outcome") == "taken" for r in trace[1:])


def test_demo_reports_exhaustion_with_failure_line(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"status": 503, "json": {"error": {"message": "down"}}}] * 4))
    proc = run_demo(tmp_path, "--script", str(script))
    assert proc.returncode == 1
    assert "Retry failed after 3 attempts: " in proc.stdout


def test_demo_refuses_bad_script(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"status": 999}]))
    proc = run_demo(tmp_path, "--script", str(script))
    assert proc.returncode == 2
    assert "0" in proc.stderr and "status" in proc.stderr
