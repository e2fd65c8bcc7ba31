"""Terminal front end (docs/policy.md §6): ``python -m fsm chat``.

:mod:`fsm.tui.view` is the pure view-model (which Esc handler is bound, what the loader says);
:mod:`fsm.tui.app` is the prompt_toolkit application around it. Import ``fsm.tui.app`` only
when a terminal is at hand: it loads prompt_toolkit.
"""

from fsm.tui.view import ESC_ABORT_RETRY, ESC_ABORT_TURN, ChatView, Line

__all__ = ["ChatView", "ESC_ABORT_RETRY", "ESC_ABORT_TURN", "Line"]
