"""retry-fsm: the retry brain of an LLM agent session.

The lifecycle is declared once (:mod:`fsm.core.lifecycle`), errors are classified by
:mod:`fsm.core.classify`, and :class:`RetryBrain` turns facts into actions for a host such as
:class:`AgentSession`. The names below are imported on first use, so ``import fsm`` is cheap.
"""

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:  # type checkers see the real names (py.typed); at run time: on first use
    # "X as X": an explicit re-export (PEP 484), as __all__ is computed
    from fsm.core.brain import (Action as Action, CancelBackoff as CancelBackoff,
                                CheckCompaction as CheckCompaction, ContinueTurn as ContinueTurn,
                                CreditRetryBudget as CreditRetryBudget,
                                DropFailedMessage as DropFailedMessage, Emit as Emit,
                                EmitTurnEnd as EmitTurnEnd, PromptMayReturn as PromptMayReturn,
                                RecordCooldown as RecordCooldown, RetryBrain as RetryBrain,
                                ReturnRetryToken as ReturnRetryToken, StartBackoff as StartBackoff,
                                TurnFacts as TurnFacts)
    from fsm.core.classify import (Classification as Classification, classify as classify,
                                   classify_message as classify_message)
    from fsm.core.events import (AgentEnd as AgentEnd, AgentStart as AgentStart,
                                 AutoRetryEnd as AutoRetryEnd, AutoRetryStart as AutoRetryStart,
                                 CANCELLED_TEXT as CANCELLED_TEXT,
                                 CoordinatorRestored as CoordinatorRestored,
                                 CoordinatorUnavailable as CoordinatorUnavailable, Event as Event,
                                 ExtensionError as ExtensionError, MessageEnd as MessageEnd,
                                 MessageStart as MessageStart, MessageUpdate as MessageUpdate,
                                 QueueUpdate as QueueUpdate, TurnEnd as TurnEnd,
                                 TurnStart as TurnStart)
    from fsm.core.messages import (AssistantMessage as AssistantMessage, Usage as Usage,
                                   UserMessage as UserMessage)
    from fsm.core.protocols import (CredentialStore as CredentialStore, Provider as Provider)
    from fsm.core.settings import (BudgetSettings as BudgetSettings, RetrySettings as RetrySettings,
                                   SettingsError as SettingsError)
    from fsm.host.runner import (ContextOverflowError as ContextOverflowError, retry as retry,
                                 RetryChainError as RetryChainError, retrying as retrying,
                                 retrying_sync as retrying_sync, RetryRunner as RetryRunner)
    from fsm.host.session import (AgentSession as AgentSession,
                                  SessionBusyError as SessionBusyError)
