"""The module paths of earlier releases, kept importable after the re-layout into layer folders.

``import fsm.brain`` (and ``from fsm.brain import RetryBrain``) still works: it is the module
``fsm.core.brain`` itself, not a copy. New code should import from the new paths (or from the
top-level ``fsm`` names); these aliases are listed in CHANGELOG.md.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType

MOVED: dict[str, str] = {
    "fsm.lifecycle": "fsm.core.lifecycle",
    "fsm.brain": "fsm.core.brain",
    "fsm.classify": "fsm.core.classify",
    "fsm.hints": "fsm.core.hints",
    "fsm.events": "fsm.core.events",
    "fsm.messages": "fsm.core.messages",
    "fsm.text": "fsm.core.text",
    "fsm.settings": "fsm.core.settings",
    "fsm.protocols": "fsm.core.protocols",
    "fsm.ui_text": "fsm.core.ui_text",
    "fsm.sdk_errors": "fsm.providers.sdk_errors",
    "fsm.clock": "fsm.host.clock",
    "fsm.session": "fsm.host.session",
    "fsm.runner": "fsm.host.runner",
    "fsm.session_log": "fsm.host.session_log",
    "fsm.credentials": "fsm.host.credentials",
    "fsm.otel": "fsm.integrations.otel",
    "fsm.diagrams": "fsm.review.diagrams",
    "fsm.diagrams_diff": "fsm.review.diagrams_diff",
    "fsm.audit": "fsm.review.audit",
    "fsm.pytest_plugin": "fsm.review.pytest_plugin",
    "fsm.providers.fault_server": "fsm.testing.fault_server",
    "fsm.providers.fault_anthropic": "fsm.testing.fault_anthropic",
}
"""Old dotted path → the module that now holds it."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    """Finds an old path in :data:`MOVED` and hands back the new module under it."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new))


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was executed under its new name."""


def install() -> None:
    """Put the finder on ``sys.meta_path`` once."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
