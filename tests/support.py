"""Shared by the tests that start the project's own processes (rpc, chat, fault server)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The fault-server entry for an Anthropic-style 529 overloaded_error.
OVERLOADED = {"status": 529, "json": {"type": "error", "error": {"type": "overloaded_error",
                                                                  "message": "Overloaded"}}}


def env() -> dict[str, str]:
    """The environment for a child ``python -m fsm ...``: this checkout first on the path."""
    out = dict(os.environ)
    out["PYTHONPATH"] = str(ROOT) + (os.pathsep + out["PYTHONPATH"] if out.get("PYTHONPATH") else "")
    return out


def stop_process(proc, timeout: float = 30.0) -> int:
    """Close a child's stdin (EOF), wait for it, kill it if it outlives ``timeout`` (a hang guard,
    far above how long a server takes to stop, so that a loaded machine does not fail it); its
    status."""
    try:
        proc.stdin.close()
    except OSError:
        pass
    try:
        return proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def examples(n: int) -> int:
    """Hypothesis examples for a costly property test: ``n`` with ``FSM_HYPOTHESIS_DEEP=1`` (a
    deep run), else two fifths of it (at least 20) — the default run's profile is small (SPEC
    §15.13 "Suite time")."""
    return n if os.environ.get("FSM_HYPOTHESIS_DEEP") == "1" else max(20, n * 2 // 5)


def run_demo(folder: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``python -m fsm demo`` with short backoffs (20 ms first, the SDK's own retries off),
    writing into ``folder/out``; the finished process (text output)."""
    settings = folder / "settings.json"
    settings.write_text(json.dumps({"retry": {"baseDelayMs": 20, "provider": {"maxRetries": 0}}}))
    return subprocess.run([sys.executable, "-m", "fsm", "demo", "--out", str(folder / "out"),
                           "--settings", str(settings), *extra],
                          capture_output=True, text=True, timeout=60, env=env())
