"""The runner's decorators and entries keep the wrapped signature under mypy --strict."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ROOT / "tests" / "typing" / "runner_signatures.py"

pytest.importorskip("mypy")


def _mypy(path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                           "--no-incremental", str(path)], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


def test_the_runner_entries_keep_the_wrapped_signature(tmp_path: Path) -> None:
    """@fsm.retry, @fsm.retry(settings=...), fsm.retrying, retrying_sync keep the callable's
    types (ParamSpec; docs/embedding.md), and a wrong return type is caught."""
    ok = _mypy(CHECKED)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    wrong = tmp_path / "wrong.py"
    wrong.write_text(CHECKED.read_text().replace('assert_type(ask_sync("hi"), str)',
                                                 'assert_type(ask_sync("hi"), int)'))
    bad = _mypy(wrong)
    assert bad.returncode != 0 and "assert-type" in bad.stdout
