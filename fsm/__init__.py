"""retry-fsm: the retry brain of an LLM agent session.

The lifecycle is declared once (:mod:`fsm.core.lifecycle`), errors are classified by
:mod:`fsm.core.classify`, and :class:`RetryBrain` turns facts into actions for a host such as
:class:`AgentSession`. The names below are imported on first use, so ``import fsm`` is cheap.
"""

from fsm._lazy import lazy_exports
from fsm._moved import install as _install_moved_paths

_install_moved_paths()

from fsm._version import __version__

_BRAIN = ("RetryBrain", "TurnFacts", "Action", "EmitTurnEnd", "Emit", "DropFailedMessage",
          "StartBackoff", "CancelBackoff", "ContinueTurn", "CheckCompaction", "RecordCooldown",
          "ReturnRetryToken", "CreditRetryBudget", "PromptMayReturn")
_EVENTS = ("Event", "AutoRetryStart", "AutoRetryEnd", "AgentStart", "TurnStart", "TurnEnd",
           "MessageStart", "MessageUpdate", "MessageEnd", "AgentEnd", "QueueUpdate",
           "ExtensionError", "CoordinatorUnavailable", "CoordinatorRestored", "CANCELLED_TEXT")

_EXPORTS = {
    **{name: "fsm.core.brain" for name in _BRAIN},
    **{name: "fsm.core.events" for name in _EVENTS},
    "Provider": "fsm.core.protocols",
    "CredentialStore": "fsm.core.protocols",
    "BudgetSettings": "fsm.core.settings",
    "RetrySettings": "fsm.core.settings",
    "SettingsError": "fsm.core.settings",
    "Classification": "fsm.core.classify",
    "classify": "fsm.core.classify",
    "classify_message": "fsm.core.classify",
    "AssistantMessage": "fsm.core.messages",
    "UserMessage": "fsm.core.messages",
    "Usage": "fsm.core.messages",
    "AgentSession": "fsm.host.session",
    "SessionBusyError": "fsm.host.session",
    **{name: "fsm.host.runner" for name in ("retrying", "retrying_sync", "retry", "RetryRunner",
                                       "RetryChainError", "ContextOverflowError")},
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("fsm", _EXPORTS)
