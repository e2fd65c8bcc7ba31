"""The texts a user interface shows for the retry events (``docs/policy.md`` §6), shared by the
terminal front end and the demo."""

from __future__ import annotations

import math

__all__ = [
    "END_REASON_TEXT", "aborted_text", "cancelled_text", "countdown_seconds", "end_reason_text",
    "failure_text", "is_cancel", "loader_text", "retries_sent", "seconds_half_up",
]

LOADER_KEYS = "esc to cancel"
"""What the loader names inside its parentheses by default (the key a user can press)."""


def seconds_half_up(ms: float) -> int:
    """Whole seconds, rounded half up: 500 ms → 1, 1499 ms → 1, 1500 ms → 2; never negative."""
    return max(0, int((ms + 500) // 1000))


def countdown_seconds(ms: float) -> int:
    """Whole seconds left while a backoff counts down (D9): rounded up, and at least 1 while it
    still waits, so the loader never shows ``0s`` before the retry goes out: 1 ms → 1,
    1000 ms → 1, 1001 ms → 2."""
    return max(1, math.ceil(ms / 1000 - 1e-9))


def loader_text(attempt: int, max_attempts: int, remaining_ms: float, *,
                keys: str | None = LOADER_KEYS, counting: bool = False) -> str:
    """``Retrying (1/3) in 2s… (esc to cancel)``.

    ``keys`` is what the parentheses name (``"esc to cancel, enter to retry now"`` in the chat;
    None: no parentheses, for a screen where no key works). ``counting``: the seconds of a live
    countdown (:func:`countdown_seconds`); otherwise rounded half up (:func:`seconds_half_up`).
    """
    seconds = countdown_seconds(remaining_ms) if counting else seconds_half_up(remaining_ms)
    text = f"Retrying ({attempt}/{max_attempts}) in {seconds}s…"
    return f"{text} ({keys})" if keys else text


def is_cancel(final_error: str | None, end_reason: str | None = None) -> bool:
    """Whether an ``auto_retry_end`` without success was a cancel (the user's Esc, ``abort``,
    the host closing): ``endReason`` ``cancelled`` or ``finalError`` ``"Retry cancelled"``
    (:data:`fsm.core.events.CANCELLED_TEXT`; an event without ``endReason`` says it so)."""
    from fsm.core.events import CANCELLED_TEXT
    return end_reason == "cancelled" or final_error == CANCELLED_TEXT


def cancelled_text(retries: int) -> str:
    """``Retry cancelled after 2 attempts``: ``retries`` counts the retries *sent* ("1 attempt"
    in the singular; 0: ``Retry cancelled before any retry was sent``; docs/policy.md §6)."""
    if retries <= 0:
        return "Retry cancelled before any retry was sent"
    noun = "attempt" if retries == 1 else "attempts"
    return f"Retry cancelled after {retries} {noun}"


def retries_sent(attempt: int, *, backing_off: bool) -> int:
    """The retries a chain sent when it ended at ``attempt`` (the end event's ``attempt``,
    which counts the retry last *scheduled*): ``attempt - 1`` when it ended while that retry
    still waited (its backoff, or the gate after it), else ``attempt`` (docs/policy.md §6)."""
    return max(0, attempt - 1) if backing_off else max(0, attempt)


def failure_text(attempts: int, final_error: str, end_reason: str | None = None, *,
                 backing_off: bool = False) -> str:
    """What the screen shows for a chain that ended without success (docs/policy.md §6):
    ``Retry failed after 3 attempts: <finalError>`` ("1 attempt" in the singular); a cancel
    (:func:`is_cancel`: ``endReason`` ``cancelled`` or ``finalError`` ``"Retry cancelled"``)
    reads as one — ``Retry cancelled after 2 attempts`` (:func:`cancelled_text`, counting the
    retries sent: :func:`retries_sent`; ``backing_off``: the chain ended while its last
    scheduled retry had not gone out) — not as a failure whose error is "Retry cancelled".
    Only this text changes: the event's fields stay as sent."""
    if is_cancel(final_error, end_reason):
        return cancelled_text(retries_sent(attempts, backing_off=backing_off))
    noun = "attempt" if attempts == 1 else "attempts"
    return f"Retry failed after {attempts} {noun}: {final_error}"


def aborted_text(attempts: int) -> str:
    """``Aborted after N retry attempts`` (singular for 1)."""
    noun = "attempt" if attempts == 1 else "attempts"
    return f"Aborted after {attempts} retry {noun}"


END_REASON_TEXT: dict[str, str] = {
    "succeeded": "the retry got an answer",
    "exhausted": "no retries were left (retry.maxRetries)",
    "cancelled": "the retry was cancelled",
    "fatal": "the retry failed with an error that is not retried",
    "overflow": "the retry overflowed the context window (left to compaction)",
    "disabled": "auto-retry was switched off, so the failed retry was not retried",
    "continue_failed": "the turn could not be re-run",
    "hint_too_long": "the server asked to wait longer than retry.maxHintWaitMs",
    "deadline": "the next retry would have gone past retry.maxElapsedMs",
    "budget": "the shared retry budget is used up",
    "output_streamed": "part of the answer had already been shown (retry.afterOutput is \"stop\")",
}
"""Why a retry chain ended, in plain words, for each ``endReason`` of ``auto_retry_end``."""


def end_reason_text(end_reason: str | None) -> str | None:
    """``"Why: no retries were left (retry.maxRetries)"`` for an ``endReason``; None when the
    event carries none (or one this version does not know)."""
    text = END_REASON_TEXT.get(end_reason or "")
    return f"Why: {text}" if text else None
