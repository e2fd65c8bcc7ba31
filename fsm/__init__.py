"""retry-fsm: the retry brain of an LLM agent session.

The lifecycle is declared once (:mod:`fsm.core.lifecycle`), errors are classified by
:mod:`fsm.core.classify`, and :class:`RetryBrain` turns facts into actions for a host such as
:class:`AgentSession`. The names below are imported on first use, so ``import fsm`` is cheap.
"""

from typing import TYPE_CHECKING

from fsm._lazy import lazy_exports
from fsm._version import __version__

_EXPORTS = {
    # Run anyone's call under the brain (docs/embedding.md).
    **{name: "fsm.host.runner" for name in ("retrying", "retrying_sync", "retry", "RetryRunner",
                                            "RetryChainError", "ContextOverflowError")},
    # Settings (docs/policy.md §1).
    "RetrySettings": "fsm.core.settings",
    "BudgetSettings": "fsm.core.settings",
    "SettingsError": "fsm.core.settings",
    "load_settings": "fsm.host.settings_file",
    # An agent session with a provider.
    "AgentSession": "fsm.host.session",
    "SessionBusyError": "fsm.host.session",
    # A host of one's own: the brain, the kernel around it, what they read and say.
    "RetryBrain": "fsm.core.brain",
    "TurnFacts": "fsm.core.brain",
    "HostKernel": "fsm.host.kernel",
    "AssistantMessage": "fsm.core.messages",
    "UserMessage": "fsm.core.messages",
    "Usage": "fsm.core.messages",
    "Classification": "fsm.core.classify",
    "classify_message": "fsm.core.classify",
    "Provider": "fsm.core.protocols",
    "CredentialStore": "fsm.core.protocols",
    "Event": "fsm.core.events",
    "AutoRetryStart": "fsm.core.events",
    "AutoRetryEnd": "fsm.core.events",
    "CANCELLED_TEXT": "fsm.core.events",
}
"""The top-level names: what a host needs (docs/architecture.md). Everything else lives in its
documented module: the brain's actions in :mod:`fsm.core.brain`, every event in
:mod:`fsm.core.events`, the classifier in :mod:`fsm.core.classify`."""

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("fsm", _EXPORTS)


if TYPE_CHECKING:  # type checkers see the real names (py.typed); at run time: on first use
    # "X as X": an explicit re-export (PEP 484), as __all__ is computed
    from fsm.core.brain import (RetryBrain as RetryBrain, TurnFacts as TurnFacts)
    from fsm.core.classify import (Classification as Classification,
                                   classify_message as classify_message)
    from fsm.core.events import (AutoRetryEnd as AutoRetryEnd, AutoRetryStart as AutoRetryStart,
                                 CANCELLED_TEXT as CANCELLED_TEXT, Event as Event)
    from fsm.core.messages import (AssistantMessage as AssistantMessage, Usage as Usage,
                                   UserMessage as UserMessage)
    from fsm.core.protocols import (CredentialStore as CredentialStore, Provider as Provider)
    from fsm.core.settings import (BudgetSettings as BudgetSettings, RetrySettings as RetrySettings,
                                   SettingsError as SettingsError)
    from fsm.host.kernel import (HostKernel as HostKernel)
    from fsm.host.settings_file import load_settings as load_settings
    from fsm.host.runner import (ContextOverflowError as ContextOverflowError, retry as retry,
                                 RetryChainError as RetryChainError, retrying as retrying,
                                 retrying_sync as retrying_sync, RetryRunner as RetryRunner)
    from fsm.host.session import (AgentSession as AgentSession,
                                  SessionBusyError as SessionBusyError)
