"""The layers of docs/architecture.md as a test: no module imports upward, at any level.

The package's folders are its layers (docs/architecture.md, "The layers"): core → fleet →
providers → host → {integrations, sim, testing} → rpc → tui → commands; review depends on the
core only (its pytest plugin also on the host). An import inside a function, a method or an
``if TYPE_CHECKING:`` block is an edge like any other: deferring an import may keep an optional
extra (an SDK) off the import path, never hide an upward edge. Importing the package face
(``import fsm``, ``from fsm import X``) from inside a layer is refused too: its lazy names reach
every layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RANK = {"core": 0, "fleet": 1, "review": 1, "providers": 2, "host": 3, "integrations": 4,
        "sim": 4, "testing": 4, "rpc": 5, "tui": 6, "commands": 7}
"""A layer may import the layers of a lower rank only (and itself)."""
ALLOWED = {("fsm.review.pytest_plugin", "host")}
"""(module, layer) edges the architecture allows beyond the ranks: the review's pytest plugin
records the hosts' brains (docs/architecture.md)."""
SHARED = {"fsm._extras", "fsm._lazy", "fsm._version"}
"""The package's private utilities: any layer may import them; they import no layer."""


def module_name(path: Path) -> str:
    """``fsm/host/kernel.py`` → ``fsm.host.kernel``; ``fsm/core/__init__.py`` → ``fsm.core``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(module: str, source: str, is_package: bool = False) -> list[tuple[str, int]]:
    """Every ``fsm`` module that ``source`` (the text of ``module``) imports, at any depth of
    the tree, with its line: ``[("fsm.host.kernel", 12), ...]``. Relative imports are resolved
    against ``module`` (a package's ``__init__`` when ``is_package``)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                names = [".".join(base + ([node.module] if node.module else []))]
            else:
                names = [node.module or ""]
            if names[0] == "fsm":  # from fsm import core / from fsm import RetryBrain
                names = [f"fsm.{alias.name}" if f"fsm.{alias.name}".split(".")[1] in RANK
                         else "fsm" for alias in node.names]
        else:
            continue
        found += [(name, node.lineno) for name in names if name == "fsm" or name.startswith("fsm.")]
    return found


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    """The upward edges of ``module``: ``"fsm.core.settings:40 imports fsm.host.settings_file
    (core may not import host)"``; empty when it keeps to its layer."""
    parts = module.split(".")
    if module in SHARED:
        layer = None
    elif len(parts) < 2 or parts[1] not in RANK:
        return []  # the package face and its entry point (fsm, fsm.__main__) stand above all
    else:
        layer = parts[1]
    out = []
    for target, line in imported(module, source, is_package):
        tparts = target.split(".")
        if target in SHARED or (len(tparts) > 1 and tparts[1] == layer):
            continue
        tlayer = tparts[1] if len(tparts) > 1 and tparts[1] in RANK else None
        if layer is None:
            why = "a shared utility imports no layer"
        elif tlayer is None:
            why = "a layer does not import the package face"
        elif RANK[tlayer] < RANK[layer] or (module, tlayer) in ALLOWED:
            continue
        else:
            why = f"{layer} may not import {tlayer}"
        out.append(f"{module}:{line} imports {target} ({why})")
    return out


def test_no_module_imports_upward():
    """Every module of fsm/ keeps to the layer order of docs/architecture.md, its deferred and
    type-checking imports included (docs/architecture.md, "The layers")."""
    found = []
    for path in sorted((ROOT / "fsm").rglob("*.py")):
        found += violations(module_name(path), path.read_text(encoding="utf-8"),
                            path.name == "__init__.py")
    assert not found, "upward imports:\n" + "\n".join(found)


@pytest.mark.parametrize("module, source", [
    ("fsm.core.settings", "def load():\n    from fsm.host.settings_file import load_settings\n"),
    ("fsm.fleet._types", "from fsm.host import kernel\n"),
    ("fsm.host.kernel", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fsm.sim import run\n"),
    ("fsm.rpc.server", "async def serve():\n    from fsm.commands.common import open_session\n"),
    ("fsm.sim.engine", "from fsm.testing import FakeClock\n"),
    ("fsm.review.audit", "from fsm.host.session import AgentSession\n"),
    ("fsm.core.brain", "import fsm\n"),
    ("fsm.core.brain", "from fsm import RetryRunner\n"),
    ("fsm.host.kernel", "from ..commands import common\n"),
])
def test_an_injected_upward_import_is_caught(module, source):
    """The checker itself: an upward edge at module level, inside a function, under
    TYPE_CHECKING, through a relative import or through the package face is reported (a
    layer test that cannot fail protects nothing)."""
    assert violations(module, source), f"{module} importing upward was not caught"


def test_downward_and_same_layer_imports_pass():
    """Imports down the order, within one layer, of the shared utilities and of an optional
    extra are no violations."""
    source = ("from fsm.core.brain import RetryBrain\nfrom fsm.fleet import CoordKey\n"
              "from fsm.host.clock import LoopClock\nfrom fsm._extras import require\n"
              "def f():\n    import openai\n    from fsm.providers import sdk_errors\n")
    assert violations("fsm.host.runner", source) == []
    assert violations("fsm.review.pytest_plugin", "from fsm.host.session import AgentSession\n") == []


def test_no_test_module_imports_another():
    """Tests share helpers through support modules, conftest.py or fsm.testing, never by importing another
    test module (docs/architecture.md, "The layers")."""
    tests = {p.stem for p in (ROOT / "tests").rglob("test_*.py")}
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            for name in names:
                if name.split(".")[0] == "tests" or name.split(".")[-1] in tests:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not found, "test modules importing each other:\n" + "\n".join(found)
