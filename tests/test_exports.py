"""The public names: ``fsm`` exports the brain's actions, the events and the host protocols, and
every core module declares ``__all__`` naming only what it defines or re-exports on purpose."""

import importlib

import pytest

import fsm

CORE = ["fsm.core.lifecycle", "fsm.core.brain", "fsm.core.events", "fsm.core.protocols", "fsm.host.session", "fsm.core.settings"]


@pytest.mark.parametrize("name", sorted(fsm.__all__))
def test_every_top_level_export_resolves(name):
    assert getattr(fsm, name) is not None


def test_the_host_contract_is_exported():
    for name in ("RetryBrain", "TurnFacts", "PromptMayReturn", "EmitTurnEnd", "AutoRetryStart",
                 "AutoRetryEnd", "Provider", "CredentialStore", "CANCELLED_TEXT"):
        assert name in fsm.__all__, name


@pytest.mark.parametrize("module", CORE)
def test_core_modules_declare_all(module):
    mod = importlib.import_module(module)
    assert isinstance(mod.__all__, list) and mod.__all__
    missing = [n for n in mod.__all__ if not hasattr(mod, n)]
    assert not missing, f"{module}.__all__ names what it does not define: {missing}"
