"""Package attributes imported on first use (PEP 562), so that importing a package stays cheap:
``python -m fsm rpc`` must answer its first command long before the ``openai`` SDK is loaded."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` that import ``exports[name]`` on use.

    ``exports`` maps an attribute name to the module that defines it. An unknown name raises
    ``AttributeError`` naming the package, as a normal module would.
    """

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(exports))

    return __getattr__, __dir__
