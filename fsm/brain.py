"""The retry brain: facts in, actions out (sans-IO).

:class:`RetryBrain` holds one session's retry state and runs it through the machine declared
in :mod:`fsm.lifecycle`. It never sleeps, prints or calls the network: the host tells it what
happened (a turn ended with this message, the backoff elapsed, the user cancelled) and carries
out the actions it returns, in order:

=====================  ==================================================================
``Emit(event)``        send ``event`` (a JSON-able dict, SPEC §4) to listeners
``DropFailedMessage``  remove the failed assistant message from the runtime context only;
                       the persisted log keeps it (SPEC §3)
``StartBackoff``       start the one backoff timer: after ``delay_ms`` call
                       :meth:`RetryBrain.backoff_elapsed` with ``timer_id``
``CancelBackoff``      cancel the pending timer ``timer_id``
``ContinueTurn``       re-run the turn without a new user message (on the next loop tick)
``ReleaseWaiters``     the chain is over: ``prompt()`` may return
``CheckCompaction``    consult the compaction hook with the turn's message
=====================  ==================================================================

The usage-limit path (SPEC §3) needs one answer from the host's credential store; it is
injected as ``usage_limit_reporter(retry_after_ms) -> bool`` (True when another credential or
model is now in use, which makes the backoff 0), called synchronously inside the transition.
"""

from __future__ import annotations

import random as _random
from dataclasses import dataclass
from typing import Any, Callable, Union

from . import lifecycle as L
from .classify import Classification, classify_message
from .messages import AssistantMessage
from .settings import RetrySettings

CANCELLED_TEXT = "Retry cancelled"


@dataclass(frozen=True, slots=True)
class Emit:
    """Send ``event`` to listeners, extensions and RPC clients."""

    event: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DropFailedMessage:
    """Remove ``message`` (the failed turn's last assistant message) from the runtime context."""

    message: AssistantMessage


@dataclass(frozen=True, slots=True)
class StartBackoff:
    """Start the backoff timer: call ``backoff_elapsed(timer_id)`` after ``delay_ms`` ms."""

    delay_ms: int
    timer_id: int


@dataclass(frozen=True, slots=True)
class CancelBackoff:
    """Cancel the pending backoff timer ``timer_id``."""

    timer_id: int


@dataclass(frozen=True, slots=True)
class ContinueTurn:
    """Continue the turn (no new user message); report a failure with ``continue_failed``."""

    attempt: int


@dataclass(frozen=True, slots=True)
class ReleaseWaiters:
    """The chain is over (``success`` says how); ``prompt()`` may return."""

    success: bool


@dataclass(frozen=True, slots=True)
class CheckCompaction:
    """Consult the compaction hook with ``message`` (retry did not take this turn)."""

    message: AssistantMessage
    kind: str


Action = Union[Emit, DropFailedMessage, StartBackoff, CancelBackoff, ContinueTurn,
               ReleaseWaiters, CheckCompaction]

_MACHINE = L.build_machine()
_EVENTS = _MACHINE.events
_DEFAULT_SETTINGS = RetrySettings()

_TRIGGER_BY_KIND = {
    "retryable": L.TURN_FAILED_RETRYABLE,
    "context_overflow": L.TURN_OVERFLOWED,
    "fatal": L.TURN_FAILED_FATAL,
    "none": L.TURN_SUCCEEDED,
}


class RetryBrain:
    """One session's retry state: ``state`` (a lifecycle state name) and ``attempt``.

    ``settings`` is a :class:`~fsm.settings.RetrySettings`; ``retry.enabled`` is read live,
    ``maxRetries`` is fixed for a chain when it starts (so ``maxAttempts`` never changes inside
    a chain). ``random`` returns floats in [0, 1) for the jitter modes.

    Every fact method returns the list of actions for the host, possibly empty.
    """

    __slots__ = ("state", "attempt", "settings", "chain_id", "_max", "_timer", "_fact_timer",
                 "_actions", "_message", "_classification", "_reason", "_reporter", "_random")

    def __init__(self, settings: RetrySettings | None = None, *,
                 usage_limit_reporter: Callable[[int | None], bool] | None = None,
                 random: Callable[[], float] = _random.random) -> None:
        self.state: str = L.INITIAL
        self.attempt: int = 0
        self.settings: RetrySettings = settings or _DEFAULT_SETTINGS
        self.chain_id: int = 0
        self._max = 0
        self._timer = 0
        self._fact_timer = 0
        self._actions: list[Action] = []
        self._message: AssistantMessage | None = None
        self._classification: Classification | None = None
        self._reason = ""
        self._reporter = usage_limit_reporter
        self._random = random

    # ------------------------------------------------------------------ queries
    @property
    def is_retrying(self) -> bool:
        """True while a chain is backing off or continuing."""
        return self.state in L.IN_CHAIN

    @property
    def is_backing_off(self) -> bool:
        return self.state == L.BACKING_OFF

    @property
    def max_attempts(self) -> int:
        """``maxRetries`` of the current chain, or of the settings outside a chain."""
        return self._max if self.state in L.IN_CHAIN else self.settings.max_retries

    @property
    def timer_id(self) -> int:
        """The id of the current (or last) backoff timer."""
        return self._timer

    # ------------------------------------------------------------------ settings
    def update_settings(self, settings: RetrySettings) -> None:
        """Replace the settings; takes effect at the next decision (no transition)."""
        if not isinstance(settings, RetrySettings):
            raise TypeError(f"settings must be RetrySettings, got {type(settings).__name__}")
        self.settings = settings

    def set_enabled(self, enabled: bool) -> None:
        """``set_auto_retry_enabled``: a pending backoff is not cancelled (SPEC §3)."""
        self.update_settings(self.settings.with_enabled(enabled))

    # ------------------------------------------------------------------ facts
    def turn_ended(self, message: AssistantMessage, context_window: int = 0, *,
                   classification: Classification | None = None) -> list[Action]:
        """A turn ended with ``message``; ``context_window`` in tokens (0 = unknown).

        The message is classified with :func:`fsm.classify.classify_message` unless
        ``classification`` is given. Call this before any ``await`` (SPEC §8.1).
        """
        cls = classification if classification is not None else classify_message(message, context_window)
        trigger = L.TURN_ABORTED if message.stop_reason == "aborted" else _TRIGGER_BY_KIND[cls.kind]
        self._message = message
        self._classification = cls
        try:
            return self._fire(trigger)
        finally:
            self._message = None
            self._classification = None

    def backoff_elapsed(self, timer_id: int) -> list[Action]:
        """The backoff timer ``timer_id`` fired; a stale id never continues."""
        self._fact_timer = timer_id
        return self._fire(L.BACKOFF_ELAPSED)

    def abort_retry(self) -> list[Action]:
        """``abort_retry()``: cancels a pending backoff; ignored while a turn runs (seed)."""
        return self._fire(L.RETRY_CANCELLED)

    abort = abort_retry
    """``abort()`` cancels the retry first; the host then stops the running turn."""

    def continue_failed(self, reason: str) -> list[Action]:
        """The host's continue was rejected or raised, with ``reason`` as the final error."""
        self._reason = reason
        return self._fire(L.CONTINUE_FAILED)

    # ------------------------------------------------------------------ guards
    def retry_enabled(self) -> bool:
        return self.settings.enabled

    def has_retries_left(self) -> bool:
        return self.attempt < self.max_attempts

    def timer_is_current(self) -> bool:
        return self._fact_timer == self._timer

    # ------------------------------------------------------------------ effects
    def start_chain(self) -> None:
        self.chain_id += 1
        self._max = self.settings.max_retries
        self.attempt = 1
        self._schedule()

    def next_attempt(self) -> None:
        self.attempt += 1
        self._schedule()

    def _schedule(self) -> None:
        cls = self._classification
        message = self._message
        delay = self.settings.backoff_ms(self.attempt, self._random)
        if cls.usage_limit and self._reporter is not None and self._reporter(cls.retry_hint_ms):
            delay = 0
        self._timer += 1
        event = {"type": "auto_retry_start", "attempt": self.attempt, "maxAttempts": self._max,
                 "delayMs": delay, "errorMessage": message.error_message or "",
                 "chainId": self.chain_id, "rule": cls.rule}
        if cls.retry_hint_ms is not None:
            event["retryHintMs"] = cls.retry_hint_ms
        self._actions += (Emit(event), DropFailedMessage(message), StartBackoff(delay, self._timer))

    def continue_turn(self) -> None:
        self._actions.append(ContinueTurn(self.attempt))

    def hand_to_compaction(self) -> None:
        self.attempt = 0
        self._actions.append(CheckCompaction(self._message, self._classification.kind))

    def end_without_start(self) -> None:
        self._end(False, 0, self._message.error_message or "")
        self._actions.append(CheckCompaction(self._message, self._classification.kind))

    def end_succeeded(self) -> None:
        self._end(True, self.attempt, None)
        self._actions.append(CheckCompaction(self._message, self._classification.kind))

    def end_failed(self) -> None:
        self._end(False, self.attempt, self._message.error_message or "")
        self._actions.append(CheckCompaction(self._message, self._classification.kind))

    def cancel_backoff(self) -> None:
        self._actions.append(CancelBackoff(self._timer))
        self._timer += 1  # whatever the host does with the timer, it can no longer continue
        self._end(False, self.attempt, CANCELLED_TEXT)

    def end_cancelled(self) -> None:
        self._end(False, self.attempt, CANCELLED_TEXT)

    def end_continue_failed(self) -> None:
        self._end(False, self.attempt, self._reason)

    def _end(self, success: bool, attempt: int, final_error: str | None) -> None:
        event: dict[str, Any] = {"type": "auto_retry_end", "success": success, "attempt": attempt}
        if final_error is not None:
            event["finalError"] = final_error
        if attempt:
            event["chainId"] = self.chain_id
        self.attempt = 0
        self._actions += (Emit(event), ReleaseWaiters(success))

    # ------------------------------------------------------------------ engine
    def _fire(self, trigger: str) -> list[Action]:
        self._actions = actions = []
        _EVENTS[trigger].trigger(self)
        self._actions = []
        return actions

    def __repr__(self) -> str:
        return f"<RetryBrain state={self.state} attempt={self.attempt} chain={self.chain_id}>"

