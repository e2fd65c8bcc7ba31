"""Optional packages: a missing extra fails where it is used, naming the exact install line.

Each test hides one optional package (a finder first on ``sys.meta_path`` answers for it as
for a package that is not installed) and uses the feature that needs it.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from fsm._extras import EXTRAS, OUTSIDE_ALL, MissingExtraError, install_line, require

ROOT = Path(__file__).resolve().parent.parent


class _NotInstalled:
    """A meta path finder that answers for ``package`` as if it were not installed."""

    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.package or fullname.startswith(self.package + "."):
            raise ModuleNotFoundError(f"No module named {self.package!r}", name=self.package)
        return None


def _hide(monkeypatch: pytest.MonkeyPatch, package: str, *modules: str) -> None:
    """Make ``package`` (and its submodules) unimportable, and forget ``modules`` so that they
    are imported again; everything is restored after the test."""
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")] + list(modules):
        if name in sys.modules:
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_NotInstalled(package), *sys.meta_path])


def _import(name: str) -> None:
    importlib.import_module(name)


def _redis_coordinator() -> None:
    from fsm.fleet import RedisCoordinator
    RedisCoordinator.from_url("redis://127.0.0.1:1/0")


def _redis_credentials() -> None:
    from fsm.fleet import RedisCredentialStore
    store = RedisCredentialStore.__new__(RedisCredentialStore)
    store._sync, store._url = None, "redis://127.0.0.1:1/0"
    store._sync_client()


def _diagrams() -> None:
    from fsm.review import diagrams
    diagrams.render_dot(diagrams.extract())


CASES = [
    ("openai", "openai", lambda: _import("fsm.providers.openai_chat"), ("fsm.providers.openai_chat",)),
    ("anthropic", "anthropic", lambda: _import("fsm.providers.anthropic_messages"),
     ("fsm.providers.anthropic_messages",)),
    ("redis", "redis", _redis_coordinator, ()),
    ("tui", "prompt_toolkit", lambda: _import("fsm.tui.app"), ("fsm.tui.app",)),
    ("diagrams", "graphviz", _diagrams, ()),
    ("otel", "opentelemetry", lambda: _import("fsm.integrations.otel"), ("fsm.integrations.otel",)),
    ("httpx2", "httpx2", lambda: _import("fsm.integrations.httpx2"), ("fsm.integrations.httpx2",)),
    ("tenacity", "tenacity", lambda: _import("fsm.integrations.tenacity"), ("fsm.integrations.tenacity",)),
    ("langchain", "langchain", lambda: _import("fsm.integrations.langchain"),
     ("fsm.integrations.langchain",)),
    ("pydantic-ai", "pydantic_ai", lambda: _import("fsm.integrations.pydantic_ai"),
     ("fsm.integrations.pydantic_ai",)),
    ("langgraph", "langgraph", lambda: _import("fsm.integrations.langgraph"),
     ("fsm.integrations.langgraph",)),
    ("openai-agents", "agents", lambda: _import("fsm.integrations.openai_agents"),
     ("fsm.integrations.openai_agents",)),
    ("genai", "google.genai", lambda: _import("fsm.integrations.genai"), ("fsm.integrations.genai",)),
]


@pytest.mark.parametrize("extra,package,use,fresh", CASES, ids=[c[0] for c in CASES])
def test_missing_extra_names_the_install_line(monkeypatch, extra, package, use, fresh):
    """Using a feature whose package is missing raises MissingExtraError with its pip line."""
    _hide(monkeypatch, package, *fresh)
    with pytest.raises(MissingExtraError) as info:
        use()
    assert info.value.extra == extra
    assert f"pip install 'retry-fsm[{extra}]'" in str(info.value)
    assert repr(package) in str(info.value)
    assert isinstance(info.value, ImportError)  # `except ImportError` keeps working


def test_missing_redis_for_the_credential_store(monkeypatch):
    """The blocking Redis credential store names the redis extra too."""
    _hide(monkeypatch, "redis")
    with pytest.raises(MissingExtraError, match=r"pip install 'retry-fsm\[redis\]'"):
        _redis_credentials()


def test_core_imports_without_any_extra():
    """The brain, the runner and the session import and run with every optional package hidden
    (in a fresh interpreter, so that no module of this process is imported twice)."""
    import subprocess
    code = textwrap.dedent("""
        import sys
        HIDDEN = ("openai", "anthropic", "redis", "prompt_toolkit", "graphviz", "opentelemetry",
                  "httpx", "httpx2", "tenacity", "langchain", "pydantic_ai")
        class NotInstalled:
            def find_spec(self, fullname, path=None, target=None):
                top = fullname.split(".")[0]
                if top in HIDDEN:
                    raise ModuleNotFoundError(f"No module named {top!r}", name=top)
        sys.meta_path.insert(0, NotInstalled())
        import fsm
        assert fsm.RetryBrain().settings.max_retries == 3
        assert callable(fsm.retrying) and callable(fsm.AgentSession)
        assert fsm.retrying_sync(lambda: "ok") == "ok"
        print("core ok", sorted(m for m in sys.modules if m.split(".")[0] in HIDDEN))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "core ok []"


def test_a_broken_install_keeps_its_own_error(monkeypatch):
    """A package that is present but fails on a missing dependency of its own is not reported as
    a missing extra (the real cause stays visible)."""
    with pytest.raises(MissingExtraError):
        require("fsm_test_fake_pkg", extra="openai", feature="x")
    with pytest.raises(ModuleNotFoundError) as info:
        require("json.fsm_no_such_submodule", extra="openai", feature="x")
    assert not isinstance(info.value, MissingExtraError)


def test_undeclared_extra_is_refused():
    """install_line refuses an extra that pyproject.toml does not declare."""
    with pytest.raises(ValueError, match="unknown extra 'opneai'"):
        install_line("opneai")
    assert install_line("all") == "pip install 'retry-fsm[all]'"


def test_extras_match_the_metadata():
    """Every extra the helper names is declared in pyproject.toml, `all` holds them all, and no
    requirement in the metadata is pinned with `==`."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = meta["optional-dependencies"]
    assert set(EXTRAS) | {"all"} == set(declared)
    everything = declared["all"][0]
    in_all = set(everything.split("[", 1)[1].rstrip("]").split(","))
    assert in_all == set(EXTRAS) - OUTSIDE_ALL
    assert OUTSIDE_ALL == {"litellm"}
    assert meta["dependencies"] == [d for d in meta["dependencies"] if d.startswith("transitions")]
    for requirement in meta["dependencies"] + [r for rs in declared.values() for r in rs]:
        assert "==" not in requirement, requirement
