"""The terminal front end's view-model: session events in, what the screen shows out (pure).

:class:`ChatView` knows nothing of prompt_toolkit, asyncio or the session object. The
application feeds it every session event (:meth:`ChatView.handle`) and reads back:

- the lines to print above the input (returned by :meth:`~ChatView.handle`, as :class:`Line`);
- :attr:`~ChatView.stream_tail`, the unfinished last line of the answer being streamed;
- :attr:`~ChatView.esc_action`, which Esc handler is bound now (docs/policy.md §6): :data:`ESC_ABORT_RETRY`
  while a backoff's loader shows, otherwise the handler that was bound before it
  (:data:`ESC_ABORT_TURN`, which aborts a running turn);
- :attr:`~ChatView.enter_action`: what Enter on an empty input line does now
  (:data:`ENTER_RETRY_NOW` during a backoff, ``docs/policy.md`` §8b.5);
- :meth:`~ChatView.loader_text` (``Retrying (1/3) in 2s… (esc to cancel, enter to retry
  now)``, counted down live from the injected clock, rounded up so it never shows ``0s``
  while it waits, D9) and :meth:`~ChatView.status_text`.

The clock is ``clock() -> seconds`` (monotonic); tests inject a fake one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from fsm.core.brain import CANCELLED_TEXT  # the finalError of a chain the user cancelled
from fsm.core.ui_text import (aborted_text, countdown_seconds, end_reason_text, failure_text,
                              is_cancel, loader_text)

CHAT_KEYS = "esc to cancel, enter to retry now"
"""What the chat's loader names inside its parentheses."""

ENTER_RETRY_NOW = "retry_now"
"""Enter on an empty input line ends the backoff at once (``session.retry_now()``)."""

ESC_ABORT_TURN = "abort"
"""Esc aborts the running turn (``await session.abort()``); with no turn running it does nothing."""

ESC_ABORT_RETRY = "abort_retry"
"""Esc cancels the pending backoff (``session.abort_retry()``), bound while the loader shows."""

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


@dataclass(frozen=True, slots=True)
class Line:
    """One line to print above the input. ``kind``: ``user``, ``assistant``, ``error``,
    ``retry_failed``, ``retry_ok``, ``discarded``, ``aborted`` or ``info`` (the application
    maps kinds to styles)."""

    text: str
    kind: str


@dataclass(frozen=True, slots=True)
class Backoff:
    """The pending backoff the loader counts down: ``deadline`` is in clock seconds."""

    attempt: int
    max_attempts: int
    deadline: float


class ChatView:
    """What the chat screen shows, derived from session events only.

    ``model`` and ``retry_enabled`` feed the status line; set :attr:`retry_enabled` when the
    user toggles it. ``clock`` returns monotonic seconds.
    """

    def __init__(self, *, model: str = "", retry_enabled: bool = True,
                 clock: Callable[[], float] = time.monotonic, keys: str = CHAT_KEYS) -> None:
        self.model = model
        self.retry_enabled = retry_enabled
        self.keys = keys
        self.last_chain: str | None = None  # at-rest state the last chain left: succeeded, ...
        self._clock = clock
        # pi's terminal swaps the Esc handler and later restores "the previous
        # one": a stack says exactly that.
        self._esc: list[str] = [ESC_ABORT_TURN]
        self.backoff: Backoff | None = None
        # a request waiting at the gate (request_delayed: a first request at rest, or a retry
        # after its backoff): (deadline in clock s, delaySource)
        self.first_wait: tuple[float, str] | None = None
        self.chain_attempt = 0          # attempt of the active retry chain, 0 outside one
        self.chain_max = 0
        self.turn_running = False
        self.retried_turn = False       # the running turn is a retry (a continue)
        self.stream_tail = ""
        self.queued = 0
        self._abort_reported = False    # "Aborted after N retry attempts" already shown
        self._streamed = False          # the current assistant message streamed some text
        self._failed_streamed = False   # the last failed turn had shown part of an answer

    # ------------------------------------------------------------------ reading
    @property
    def esc_action(self) -> str:
        """:data:`ESC_ABORT_RETRY` while the loader shows, else the handler bound before it."""
        return self._esc[-1]

    @property
    def enter_action(self) -> str | None:
        """:data:`ENTER_RETRY_NOW` while the loader shows (Enter on an empty line), else None."""
        return ENTER_RETRY_NOW if self.backoff is not None else None

    @property
    def loader_visible(self) -> bool:
        return self.backoff is not None

    @property
    def needs_ticks(self) -> bool:
        """The screen changes with time alone (a countdown or a spinner is showing)."""
        return self.backoff is not None or self.turn_running or self.first_wait is not None

    def first_wait_text(self) -> str | None:
        """``Sending in 3s… (the provider's cooldown; esc to cancel)`` while a request waits at
        the gate (``request_delayed``: a first request under the resilient profile, or a retry
        whose backoff is over, docs/fleet.md "First requests", "Pacing"), counted down like a
        backoff (rounded up, never 0 while it waits), else None."""
        if self.first_wait is None:
            return None
        deadline, source = self.first_wait
        remaining = max(0.0, (deadline - self._clock()) * 1000.0)
        why = "the fleet's pacing" if source == "pacing" else "the provider's cooldown"
        return f"Sending in {countdown_seconds(remaining)}s… ({why}; esc to cancel)"

    def remaining_ms(self) -> float:
        """Milliseconds left in the pending backoff (0 when none or elapsed)."""
        if self.backoff is None:
            return 0.0
        return max(0.0, (self.backoff.deadline - self._clock()) * 1000.0)

    def loader_text(self) -> str | None:
        """``Retrying (1/3) in 2s… (esc to cancel, enter to retry now)`` during a backoff, else
        None; the seconds are rounded up and never 0 while it waits (D9)."""
        b = self.backoff
        if b is None:
            return None
        return loader_text(b.attempt, b.max_attempts, self.remaining_ms(), keys=self.keys,
                           counting=True)

    def activity_text(self) -> str | None:
        """The line above the input: a request's wait at the gate, the loader, a working
        indicator, or None (a retry's wait at the gate follows its backoff, whose loader
        would otherwise stay at 1s)."""
        text = self.first_wait_text() or self.loader_text()
        if text is not None:
            return text
        if self.turn_running:
            spin = SPINNER[int(self._clock() * 10) % len(SPINNER)]
            what = (f"Retry {self.chain_attempt}/{self.chain_max} running…" if self.retried_turn
                    else "Working…")
            return f"{spin} {what} (esc to interrupt)"
        return None

    @property
    def state_label(self) -> str:
        if self.backoff is not None:
            return f"backing off {self.backoff.attempt}/{self.backoff.max_attempts}"
        if self.turn_running:
            if self.retried_turn:
                return f"retrying {self.chain_attempt}/{self.chain_max}"
            return "streaming"
        return rest_label(self.last_chain)

    def status_text(self) -> str:
        """``model · retry on · idle`` (plus ``· 1 queued``)."""
        parts = [self.model or "?", f"retry {'on' if self.retry_enabled else 'off'}",
                 self.state_label]
        if self.queued:
            parts.append(f"{self.queued} queued")
        return " · ".join(parts)

    # ------------------------------------------------------------------ events
    def handle(self, event: dict[str, Any]) -> list[Line]:
        """Apply one session event; returns the lines to print above the input, in order."""
        kind = event.get("type")
        handler = getattr(self, "_on_" + str(kind), None)
        if handler is None:
            return []
        return handler(event)

    def _on_request_delayed(self, event: dict[str, Any]) -> list[Line]:
        """A request waits at the gate (a first request at rest, or a retry after its
        backoff): counted down; Esc aborts it (nothing is sent)."""
        delay_ms = float(event.get("delayMs", 0) or 0)
        if self.first_wait is None:
            self._esc.append(ESC_ABORT_RETRY)  # session.abort_retry() ends the wait, aborted
        self.first_wait = (self._clock() + delay_ms / 1000.0, str(event.get("delaySource") or ""))
        return []

    def _end_first_wait(self) -> None:
        if self.first_wait is not None:
            self.first_wait = None
            if len(self._esc) > 1 and self._esc[-1] == ESC_ABORT_RETRY:
                self._esc.pop()

    def _on_agent_start(self, event: dict[str, Any]) -> list[Line]:
        self._end_first_wait()  # the request's wait at the gate is over: the turn starts
        self.turn_running = True
        self.stream_tail = ""
        self.queued = 0  # a turn takes every queued message with it (AgentSession._run_turn)
        if self.backoff is not None:  # the retried turn starts: the backoff is over
            self.retried_turn = True
            self._end_backoff()
        return []

    def _on_message_update(self, event: dict[str, Any]) -> list[Line]:
        delta = (event.get("assistantMessageEvent") or {}).get("delta") or ""
        if not delta:
            return []
        self._streamed = True
        *done, self.stream_tail = (self.stream_tail + delta).split("\n")
        return [Line(text, "assistant") for text in done]

    def _on_message_start(self, event: dict[str, Any]) -> list[Line]:
        message = event.get("message") or {}
        if message.get("role") == "assistant":
            self.stream_tail, self._streamed = "", False
            if isinstance(message.get("model"), str) and message["model"]:
                self.model = message["model"]  # the model in use (a fallback, or the primary again)
        return []

    def _on_message_end(self, event: dict[str, Any]) -> list[Line]:
        message = event.get("message") or {}
        text = "".join(c.get("text", "") for c in message.get("content") or ()
                       if isinstance(c, dict))
        if message.get("role") == "user":
            return [Line(f"› {text}", "user")]
        out: list[Line] = []
        streamed = self._streamed
        if self._streamed:
            if self.stream_tail:
                out.append(Line(self.stream_tail, "assistant"))
        elif text:  # nothing was streamed (an answer in one piece): print it whole
            out.extend(Line(t, "assistant") for t in text.split("\n"))
        self.stream_tail, self._streamed = "", False
        stop = message.get("stopReason")
        if stop == "error":
            self._failed_streamed = streamed or bool(text)
            where = f" (retry {self.chain_attempt}/{self.chain_max})" if self.retried_turn else ""
            out.append(Line(f"Error{where}: {message.get('errorMessage') or 'unknown error'}", "error"))
            if not self.retry_enabled and not self.retried_turn:
                out.append(Line("Not retrying: auto-retry is off (/retry on turns it back on)", "info"))
        elif stop == "aborted":
            if self.retried_turn and self.chain_attempt > 0:
                out.append(Line(aborted_text(self.chain_attempt), "aborted"))
                self._abort_reported = True
            else:
                out.append(Line("Aborted", "aborted"))
        elif stop == "length":
            out.append(Line("(the answer was cut: the model hit its output limit)", "info"))
        return out

    def _on_agent_end(self, event: dict[str, Any]) -> list[Line]:
        self.turn_running = False
        self.retried_turn = False
        return []

    def _on_auto_retry_start(self, event: dict[str, Any]) -> list[Line]:
        attempt = int(event.get("attempt", 1))
        max_attempts = int(event.get("maxAttempts", attempt))
        delay_ms = float(event.get("delayMs", 0) or 0)
        self.chain_attempt, self.chain_max = attempt, max_attempts
        if self.backoff is None:
            self._esc.append(ESC_ABORT_RETRY)
        self.backoff = Backoff(attempt, max_attempts, self._clock() + delay_ms / 1000.0)
        self.last_chain = None
        out: list[Line] = []
        if event.get("discardsOutput") and self._failed_streamed:
            out.append(Line("↑ partial answer discarded: the retry replaces it", "discarded"))
        self._failed_streamed = False
        return out

    def _on_retry_fallback(self, event: dict[str, Any]) -> list[Line]:
        """Model fallback (docs/policy.md §13.3): the status line names the model in use."""
        to = str(event.get("to") or "")
        if to:
            self.model = to
        why = str(event.get("reason") or "failures")
        return [Line(f"Switching to {to or '?'} ({why} on {event.get('from') or '?'})", "info")]

    def _on_auto_retry_end(self, event: dict[str, Any]) -> list[Line]:
        backing_off = self.backoff is not None  # the scheduled retry had not gone out
        self._end_backoff()
        self._end_first_wait()
        attempt = int(event.get("attempt", 0))
        out: list[Line] = []
        if event.get("success"):
            self.last_chain = "succeeded"
            of = f" of {self.chain_max}" if self.chain_max else ""
            out.append(Line(f"Retry succeeded on attempt {attempt}{of}", "retry_ok"))
        else:
            final = str(event.get("finalError", ""))
            cancelled = is_cancel(final, event.get("endReason"))
            self.last_chain = "cancelled" if cancelled else "exhausted"
            if not (self._abort_reported and final == CANCELLED_TEXT):
                # a cancel reads as one ("Retry cancelled after 2 attempts"), not as a failure
                out.append(Line(failure_text(attempt, final, event.get("endReason"),
                                             backing_off=backing_off),
                                "aborted" if cancelled else "retry_failed"))
            why = None if cancelled else end_reason_text(event.get("endReason"))
            if why:
                out.append(Line(why, "info"))
        self.chain_attempt = self.chain_max = 0
        self._abort_reported = False
        return out

    def _on_queue_update(self, event: dict[str, Any]) -> list[Line]:
        self.queued = len(event.get("queued") or ())
        return []

    def _on_extension_error(self, event: dict[str, Any]) -> list[Line]:
        return [Line(f"extension failed on {event.get('event')}: {event.get('error')}", "info")]

    def _end_backoff(self) -> None:
        if self.backoff is not None:
            self.backoff = None
            if len(self._esc) > 1 and self._esc[-1] == ESC_ABORT_RETRY:
                self._esc.pop()


def rest_label(last_chain: str | None) -> str:
    """The status line's word for a session at rest: ``idle``, or ``idle (last chain
    succeeded)`` after a chain (``succeeded``, ``exhausted``, ``cancelled``: the retry
    machine's at-rest state, so the status line and ``/state`` say the same)."""
    if last_chain in (None, "idle"):
        return "idle"
    return f"idle (last chain {last_chain})"
