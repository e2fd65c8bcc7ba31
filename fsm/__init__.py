"""retry-fsm: the retry brain of an LLM agent session.

The lifecycle is declared once (:mod:`fsm.lifecycle`), errors are classified by
:mod:`fsm.classify`, and :class:`RetryBrain` turns facts into actions for a host such as
:class:`AgentSession`. The names below are imported on first use, so ``import fsm`` is cheap.
"""

from ._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "RetryBrain": "fsm.brain",
    "RetrySettings": "fsm.settings",
    "SettingsError": "fsm.settings",
    "Classification": "fsm.classify",
    "classify": "fsm.classify",
    "classify_message": "fsm.classify",
    "AssistantMessage": "fsm.messages",
    "UserMessage": "fsm.messages",
    "Usage": "fsm.messages",
    "AgentSession": "fsm.session",
    "SessionBusyError": "fsm.session",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("fsm", _EXPORTS)
