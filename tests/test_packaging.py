"""The package as the ecosystem expects it: one version, ``--version``, ``py.typed``, a changelog."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest

import fsm
from fsm import __main__ as cli
from fsm._extras import MissingExtraError

ROOT = Path(__file__).resolve().parent.parent


def test_version_in_one_place():
    """pyproject.toml reads the version from fsm._version, which fsm.__version__ re-exports."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in meta["project"]["dynamic"] and "version" not in meta["project"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "fsm._version.__version__"}
    from fsm._version import __version__
    assert fsm.__version__ == __version__
    assert __version__.count(".") >= 2 and __version__[0].isdigit()


def test_version_option(capsys):
    """`retry-fsm --version` prints the program and the version and exits 0."""
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"retry-fsm {fsm.__version__}"


@pytest.mark.subprocess
def test_python_m_fsm_version():
    """`python -m fsm --version` answers in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-m", "fsm", "--version"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == f"retry-fsm {fsm.__version__}"


def test_missing_extra_in_a_command_is_one_line(monkeypatch, capsys):
    """A command whose extra is missing exits 2 with the install line, not a traceback."""
    def run(args):
        raise MissingExtraError("graphviz", "diagrams", "drawing the diagrams")
    fake = types.SimpleNamespace(HELP="x", add_arguments=lambda p: None, run=run)
    monkeypatch.setattr(cli, "_module", lambda name: fake)
    assert cli.main(["diagrams"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'retry-fsm[diagrams]'" in err and "Traceback" not in err


def test_py_typed_and_changelog():
    """The package carries the PEP 561 marker (declared as package data) and a changelog names
    this version."""
    assert (ROOT / "fsm" / "py.typed").is_file()
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in meta["tool"]["setuptools"]["package-data"]["fsm"]
    assert f"## {fsm.__version__}" in (ROOT / "CHANGELOG.md").read_text()


def test_set_up_says_what_it_installs_before_installing():
    """Every install in the Makefile is announced (what and why) on the line before, and none is
    silenced (no -qq, no output thrown away)."""
    text = (ROOT / "Makefile").read_text()
    assert "-qq" not in text and "install -y -q " not in text
    lines = text.splitlines()
    installs = [i for i, line in enumerate(lines)
                if "$(call system_install" in line or "pip install" in line or "$(UV) sync" in line]
    assert len(installs) >= 5
    for i in installs:
        said = next(lines[j] for j in range(i - 1, -1, -1) if "echo" in lines[j])
        assert '"installing ' in said and ":" in said.split('"installing ', 1)[1], said
    for line in lines:
        if "install" in line and ">/dev/null" in line:
            assert "command -v" in line, line  # only the "is it there?" checks are quiet


def test_type_checkers_see_every_top_level_name():
    """Each lazily imported top-level name is also imported under TYPE_CHECKING, so that a user's
    type checker sees its real type (not Any) through py.typed."""
    import ast
    tree = ast.parse((ROOT / "fsm" / "__init__.py").read_text())
    guarded = next(node for node in tree.body if isinstance(node, ast.If)
                   and getattr(node.test, "id", None) == "TYPE_CHECKING")
    seen = {(node.module, alias.name) for node in guarded.body if isinstance(node, ast.ImportFrom)
            for alias in node.names if alias.asname == alias.name}  # "X as X": re-exported
    assert seen == {(module, name) for name, module in fsm._EXPORTS.items()}


def test_the_readme_install_lines_are_true_today():
    """README "Install": the wheel named is the one `make dist` builds for this version, each
    extra named is declared, and the published name is said to be future, not available."""
    from fsm._version import __version__
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Install"):readme.index("## Quick start")]
    assert f"build/dist/retry_fsm-{__version__}-py3-none-any.whl[" in section
    assert "not on PyPI yet" in section and "will be published as **`retry-fsm`**" in section
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named = {e for group in re.findall(r"\.\[([a-z0-9,-]+)\]", section) for e in group.split(",")}
    named |= {e for group in re.findall(r"whl\[([a-z0-9,-]+)\]", section) for e in group.split(",")}
    assert named and named <= extras, named - extras
    assert "make test" in readme and "about 7 minutes on 2 cores" in readme
