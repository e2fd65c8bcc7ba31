"""The texts a user interface shows for the retry events (SPEC §6), shared by the terminal
front end and the demo."""

from __future__ import annotations


def seconds_half_up(ms: float) -> int:
    """Whole seconds, rounded half up: 500 ms → 1, 1499 ms → 1, 1500 ms → 2; never negative."""
    return max(0, int((ms + 500) // 1000))


def loader_text(attempt: int, max_attempts: int, remaining_ms: float) -> str:
    """``Retrying (1/3) in 2s… (esc to cancel)``."""
    return f"Retrying ({attempt}/{max_attempts}) in {seconds_half_up(remaining_ms)}s… (esc to cancel)"


def failure_text(attempts: int, final_error: str) -> str:
    """``Retry failed after 3 attempts: <finalError>`` ("1 attempt" in the singular)."""
    noun = "attempt" if attempts == 1 else "attempts"
    return f"Retry failed after {attempts} {noun}: {final_error}"


def aborted_text(attempts: int) -> str:
    """``Aborted after N retry attempts`` (singular for 1)."""
    noun = "attempt" if attempts == 1 else "attempts"
    return f"Aborted after {attempts} retry {noun}"
