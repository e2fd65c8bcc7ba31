"""retry-fsm: the retry brain of an LLM agent session.

The lifecycle is declared once (:mod:`fsm.lifecycle`), errors are classified by
:mod:`fsm.classify`, and :class:`RetryBrain` turns facts into actions for a host such as
:class:`AgentSession`. The names below are imported on first use, so ``import fsm`` is cheap.
"""

from ._lazy import lazy_exports

__version__ = "0.1.0"

_BRAIN = ("RetryBrain", "TurnFacts", "Action", "EmitTurnEnd", "Emit", "DropFailedMessage",
          "StartBackoff", "CancelBackoff", "ContinueTurn", "CheckCompaction", "RecordCooldown",
          "ReturnRetryToken", "CreditRetryBudget", "PromptMayReturn")
_EVENTS = ("Event", "AutoRetryStart", "AutoRetryEnd", "AgentStart", "TurnStart", "TurnEnd",
           "MessageStart", "MessageUpdate", "MessageEnd", "AgentEnd", "QueueUpdate",
           "ExtensionError", "CoordinatorUnavailable", "CoordinatorRestored", "CANCELLED_TEXT")

_EXPORTS = {
    **{name: "fsm.brain" for name in _BRAIN},
    **{name: "fsm.events" for name in _EVENTS},
    "Provider": "fsm.protocols",
    "CredentialStore": "fsm.protocols",
    "BudgetSettings": "fsm.settings",
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
    **{name: "fsm.runner" for name in ("retrying", "retrying_sync", "retry", "RetryRunner",
                                       "RetryChainError", "ContextOverflowError")},
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("fsm", _EXPORTS)
