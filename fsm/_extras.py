"""Optional packages: one import helper, so that a missing extra fails where it is used, with the
exact line to run.

``pip install retry-fsm`` installs the core only (the brain, the lifecycle, the classifier, the
runner and the session, with ``transitions``). Everything else is an *extra* named after its
layer (pyproject.toml ``[project.optional-dependencies]``; README "Install")::

    from fsm._extras import require

    openai = require("openai", extra="openai", feature="the OpenAI provider")

raises :class:`MissingExtraError` when ``openai`` is not installed:

.. code-block:: text

    the OpenAI provider needs the package 'openai', which is not installed:
    pip install 'retry-fsm[openai]'
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXTRAS", "OUTSIDE_ALL", "MissingExtraError", "require", "install_line"]

EXTRAS: dict[str, tuple[str, ...]] = {
    "openai": ("openai",),
    "anthropic": ("anthropic",),
    "redis": ("redis",),
    "tui": ("prompt_toolkit",),
    "diagrams": ("graphviz",),
    "otel": ("opentelemetry",),
    "httpx2": ("httpx2",),
    "tenacity": ("tenacity",),
    "langchain": ("langchain", "langchain_core"),
    "pydantic-ai": ("pydantic_ai",),
    "langgraph": ("langgraph",),
    "openai-agents": ("agents",),
    "genai": ("google.genai",),
    "litellm": ("litellm",),
}
"""Extra name → the top-level modules it provides (as pyproject.toml declares them). ``all``
holds every extra but :data:`OUTSIDE_ALL` (LiteLLM: its weight)."""

OUTSIDE_ALL: frozenset[str] = frozenset({"litellm"})
"""Extras that ``retry-fsm[all]`` does not install (SPEC §15.13: LiteLLM is kept out for its weight)."""


class MissingExtraError(ImportError):
    """An optional package is not installed. ``extra`` names the extra that installs it,
    ``install`` is the command to run (``pip install 'retry-fsm[openai]'``); ``name`` is the
    missing module (as :class:`ImportError`'s)."""

    def __init__(self, module: str, extra: str, feature: str) -> None:
        self.extra = extra
        self.install = install_line(extra)
        super().__init__(f"{feature} needs the package {module!r}, which is not "
                         f"installed: {self.install}", name=module)


def install_line(extra: str) -> str:
    """``pip install 'retry-fsm[EXTRA]'``; ``ValueError`` for an extra that is not declared."""
    if extra not in EXTRAS and extra != "all":
        raise ValueError(f"unknown extra {extra!r}; the extras are {', '.join(sorted(EXTRAS))}, all")
    return f"pip install 'retry-fsm[{extra}]'"


def require(module: str, *, extra: str, feature: str) -> ModuleType:
    """``importlib.import_module(module)``, or :class:`MissingExtraError` naming ``extra`` when
    the module (or its top-level package) is not installed.

    Only a missing ``module`` or package of its path (``google`` or ``google.genai`` for
    ``google.genai``: a namespace package can be there without the extra) becomes
    :class:`MissingExtraError`, naming the one missing; an installed package whose own import
    fails (a broken install, an incompatible version, a dependency of its own missing) keeps
    its own error, so the real cause is not hidden.
    """
    install_line(extra)  # an undeclared extra is a bug here, not the user's
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module == missing or module.startswith(missing + ".")) \
                and missing.count(".") <= _PACKAGE_DEPTH.get(module.split(".")[0], 0):
            # a namespace package's own part is named (google.genai, not google)
            package = ".".join(module.split(".")[:_PACKAGE_DEPTH.get(module.split(".")[0], 0) + 1])
            raise MissingExtraError(package, extra, feature) from None
        raise


_PACKAGE_DEPTH = {"google": 1}
"""Top-level names that are namespace packages shared by many distributions, and how many dots
deep the distribution's own package is (``google.genai``: 1); elsewhere only the top level."""
