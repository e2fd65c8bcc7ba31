"""The public names: ``fsm`` exports what a host needs (docs/architecture.md), and every core
module declares ``__all__`` naming only what it defines or re-exports on purpose."""

import importlib

import pytest

import fsm

CORE = ["fsm.core.lifecycle", "fsm.core.brain", "fsm.core.events", "fsm.core.protocols", "fsm.host.session", "fsm.core.settings"]


@pytest.mark.parametrize("name", sorted(fsm.__all__))
def test_every_top_level_export_resolves(name):
    """Every top level export resolves."""
    assert getattr(fsm, name) is not None


def test_the_top_level_is_what_a_host_needs():
    """``fsm`` exports the runner, settings, session, brain, kernel and host protocols; the
    brain's actions and the other events live in their modules."""
    for name in ("retrying", "retry", "RetryRunner", "RetryChainError", "RetrySettings",
                 "AgentSession", "RetryBrain", "TurnFacts", "HostKernel", "AssistantMessage",
                 "AutoRetryStart", "AutoRetryEnd", "Provider", "CredentialStore", "CANCELLED_TEXT"):
        assert name in fsm.__all__, name
    assert len(fsm.__all__) <= 30
    brain = importlib.import_module("fsm.core.brain")
    for name in ("PromptMayReturn", "EmitTurnEnd", "StartBackoff", "Action"):
        assert name in brain.__all__ and name not in fsm.__all__, name


def test_former_names_and_module_paths_are_gone():
    """0.3 removed the deprecated top-level aliases and the module paths of 0.1 (CHANGELOG.md,
    0.3.0): ``fsm.EmitTurnEnd`` and ``import fsm.brain`` fail, naming what is missing."""
    with pytest.raises(AttributeError, match="no attribute 'EmitTurnEnd'"):
        fsm.EmitTurnEnd  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        fsm.NoSuchName  # noqa: B018
    for old in ("fsm.brain", "fsm.session", "fsm.runner", "fsm.providers.fault_server"):
        with pytest.raises(ModuleNotFoundError, match=old.replace(".", r"\.")):
            importlib.import_module(old)


def test_load_settings_is_top_level(tmp_path):
    """``fsm.load_settings(path)`` reads a settings file (the core reads no file; README,
    "Settings")."""
    path = tmp_path / "settings.json"
    path.write_text('{"retry": {"maxRetries": 2}}')
    assert fsm.load_settings(path).max_retries == 2


@pytest.mark.parametrize("module", CORE)
def test_core_modules_declare_all(module):
    """Core modules declare all."""
    mod = importlib.import_module(module)
    assert isinstance(mod.__all__, list) and mod.__all__
    missing = [n for n in mod.__all__ if not hasattr(mod, n)]
    assert not missing, f"{module}.__all__ names what it does not define: {missing}"
