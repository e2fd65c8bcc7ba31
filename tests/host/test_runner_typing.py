"""The runner's decorators and entries keep the wrapped signature, under mypy --strict and under
pyright (strict): docs/embedding.md "Sync callers" (``ParamSpec``), SPEC §15.13."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ROOT / "tests" / "typing" / "runner_signatures.py"
PYRIGHT = Path(sys.executable).with_name("pyright")

REVEALED = {
    "ask": (("prompt: str", "temperature: float"), "Coroutine[Any, Any, int]"),
    "ask_blocking": (("prompt: str", "temperature: float"), "bytes"),
    "ask_sync": (("prompt: str",), "str"),
    "ask_async": (("prompt: str", "count: int"), "Coroutine[Any, Any, list[str]]"),
    "ask_with_runner": (("prompt: str",), "Coroutine[Any, Any, float]"),
    "ask_sync_with_runner": (("prompt: str",), "tuple[str, int]"),
}
"""What each ``reveal_type`` of the checked file must show: the wrapped parameters (never
``Any`` in their place) and the result (a coroutine function stays one)."""

WRONG = [
    ('assert_type(ask_sync("hi"), str)', 'assert_type(ask_sync("hi"), int)'),
    ('assert_type(await ask("hi", temperature=0.5), int)', 'assert_type(await ask(1, temperature=0.5), int)'),
    ('assert_type(asyncio.run(ask_with_runner("hi")), float)', 'assert_type(asyncio.run(ask_with_runner("hi")), str)'),
    ("assert_type(await coordinator.warm_up(), bool | None)", "assert_type(await coordinator.warm_up(), int)"),
]
"""Edits of the checked file each checker must refuse, each on its own line (the check can fail)."""


def _mypy(*paths: Path) -> tuple[dict[tuple[str, int], str], dict[tuple[str, int], str], str]:
    """(errors, revealed types, the output) of ``mypy --strict`` on ``paths``, by (file name, line)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                           "--no-incremental", *map(str, paths)], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    revealed = {(Path(m[1]).name, int(m[2])): m[3]
                for m in re.finditer(r"^(.*?):(\d+): note: Revealed type is \"(.*)\"", done.stdout, re.M)}
    errors = {(Path(m[1]).name, int(m[2])): m[3] for m in re.finditer(r"^(.*?):(\d+): error: (.*)", done.stdout, re.M)}
    assert (done.returncode == 0) == (not errors), done.stdout + done.stderr
    return errors, revealed, done.stdout + done.stderr


def _pyright(*paths: Path) -> tuple[dict[tuple[str, int], str], dict[tuple[str, int], str], str]:
    """The same from pyright as the venv has it: its bundled JavaScript on the machine's
    ``node``, offline — no version check against PyPI (``--outputjson``,
    ``PYRIGHT_PYTHON_IGNORE_WARNINGS``), no npm download (the bundled version is the one asked
    for), no nodeenv. The checked file asks for strict mode (``# pyright: strict``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1",
           "PYRIGHT_PYTHON_GLOBAL_NODE": "1"}
    for name in ("PYRIGHT_PYTHON_FORCE_VERSION", "PYRIGHT_PYTHON_PYLANCE_VERSION",
                 "PYRIGHT_PYTHON_USE_BUNDLED_PYRIGHT"):
        env.pop(name, None)
    done = subprocess.run([str(PYRIGHT), "--outputjson", "--pythonpath", sys.executable, *map(str, paths)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    report = json.loads(done.stdout)
    revealed, errors = {}, {}
    for d in report["generalDiagnostics"]:
        line = (Path(d["file"]).name, d["range"]["start"]["line"] + 1)
        if d["severity"] == "information" and d["message"].startswith("Type of "):
            revealed[line] = d["message"].split(" is ", 1)[1].strip('"')
        elif d["severity"] == "error":
            errors[line] = f"{d['message']} ({d.get('rule')})"
    assert (done.returncode == 0) == (not errors), done.stdout + done.stderr
    return errors, revealed, json.dumps(report["generalDiagnostics"], indent=1) + done.stderr


CHECKERS = [pytest.param(_mypy, id="mypy-strict",
                         marks=pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                                                  reason="mypy is not installed")),
            pytest.param(_pyright, id="pyright-strict",
                         marks=pytest.mark.skipif(not PYRIGHT.exists() or shutil.which("node") is None,
                                                  reason="pyright or node is not installed"))]


def _line_of(source: str, text: str) -> int:
    [n] = [n for n, line in enumerate(source.splitlines(), 1) if line.strip() == text]
    return n


@pytest.mark.subprocess
@pytest.mark.parametrize("check", CHECKERS)
def test_the_runner_entries_keep_the_wrapped_signature(check, tmp_path: Path) -> None:
    """@fsm.retry (bare and with settings, over async and sync functions), a RetryRunner used as
    a decorator, fsm.retrying, retrying_sync and the runner's run / run_sync keep the wrapped
    callable's parameters and result (a decorated coroutine function stays a coroutine function
    for asyncio.run and create_task), and coordinator_from_url's type has the warm_up
    docs/fleet.md calls; each checker refuses a wrong result type, a wrong argument and a wrong
    warm_up type."""
    source = CHECKED.read_text()
    wrong = tmp_path / "wrong_signatures.py"
    wrong_source = source
    for old, new in WRONG:
        assert old in wrong_source
        wrong_source = wrong_source.replace(old, new)
    wrong.write_text(wrong_source)
    errors, revealed, output = check(CHECKED, wrong)
    assert not {line for line in errors if line[0] == CHECKED.name}, output
    for name, (parameters, result) in REVEALED.items():
        shown = revealed[CHECKED.name, _line_of(source, f"reveal_type({name})")]
        params, _, returns = shown.rpartition(" -> ")
        assert all(p in params for p in parameters) and "Any" not in params, (name, shown)
        assert returns.removeprefix("typing.") == result, (name, shown)
    assert len([line for line in revealed if line[0] == CHECKED.name]) == len(REVEALED)
    assert {(wrong.name, _line_of(wrong_source, new)) for _, new in WRONG} <= set(errors), output
