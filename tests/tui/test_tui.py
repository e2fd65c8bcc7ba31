"""The terminal's view-model (fsm.tui.view.ChatView): which Esc handler is bound and what the
loader says, driven by session events and a fake clock. No terminal, no prompt_toolkit."""

from __future__ import annotations

import pytest

from fsm.tui.view import ENTER_RETRY_NOW, ESC_ABORT_RETRY, ESC_ABORT_TURN, ChatView, Line, rest_label


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def view(clock: Clock) -> ChatView:
    return ChatView(model="m1", clock=clock)


def start(attempt=1, max_attempts=3, delay_ms=2000, error="Error code: 529 - overloaded"):
    return {"type": "auto_retry_start", "attempt": attempt, "maxAttempts": max_attempts,
            "delayMs": delay_ms, "errorMessage": error}


def end(success, attempt, final_error=None):
    event = {"type": "auto_retry_end", "success": success, "attempt": attempt}
    if final_error is not None:
        event["finalError"] = final_error
    return event


def assistant_end(stop="stop", text="", error=None):
    message = {"role": "assistant", "content": [{"type": "text", "text": text}] if text else [],
               "stopReason": stop}
    if error is not None:
        message["errorMessage"] = error
    return {"type": "message_end", "message": message}


def delta(text):
    return {"type": "message_update", "assistantMessageEvent": {"type": "text_delta", "delta": text}}


AGENT_START = {"type": "agent_start"}
AGENT_END = {"type": "agent_end", "messages": []}
ASSISTANT_START = {"type": "message_start", "message": {"role": "assistant"}}


def failed_turn(view: ChatView, error="Error code: 529 - overloaded") -> list[Line]:
    lines = []
    for event in (AGENT_START, ASSISTANT_START, assistant_end("error", error=error), AGENT_END):
        lines += view.handle(event)
    return lines


# ---------------------------------------------------------------------- idle
def test_idle_view_binds_esc_to_abort_and_shows_no_loader(view):
    """Idle view binds esc to abort and shows no loader."""
    assert view.esc_action == ESC_ABORT_TURN
    assert view.loader_text() is None
    assert view.activity_text() is None
    assert view.status_text() == "m1 · retry on · idle"
    assert not view.needs_ticks


def test_status_line_names_model_retry_switch_state_and_queue(view):
    """Status line names model retry switch state and queue."""
    view.retry_enabled = False
    view.handle({"type": "queue_update", "queued": ["a", "b"]})
    assert view.status_text() == "m1 · retry off · idle · 2 queued"


# ---------------------------------------------------------------------- the backoff
def test_retry_start_rebinds_esc_to_abort_retry_and_shows_the_loader(view):
    """Retry start rebinds esc to abort retry and shows the loader."""
    failed_turn(view)
    assert view.handle(start()) == []
    assert view.esc_action == ESC_ABORT_RETRY
    assert view.loader_text() == "Retrying (1/3) in 2s… (esc to cancel, enter to retry now)"
    assert view.enter_action == ENTER_RETRY_NOW
    assert view.activity_text() == view.loader_text()
    assert view.status_text() == "m1 · retry on · backing off 1/3"
    assert view.needs_ticks


def test_loader_counts_down_rounded_up_and_never_shows_zero_while_waiting(view, clock):
    """D9: the seconds left are rounded up while counting down; at or past the deadline (the
    retry has not gone out yet) the loader still says 1s, never 0s."""
    view.handle(start(delay_ms=2500))
    seen = []
    for elapsed in (0.0, 0.4, 0.5, 1.2, 1.5, 2.0, 2.1, 2.6, 9.0):
        clock.now = 100.0 + elapsed
        seen.append(view.loader_text())
    assert [s.split(" in ")[1].split("…")[0] for s in seen] == [
        "3s", "3s", "2s", "2s", "1s", "1s", "1s", "1s", "1s"]


def test_half_a_second_left_shows_one_second(view, clock):
    """Half a second left shows one second."""
    view.handle(start(delay_ms=500))
    assert view.loader_text() == "Retrying (1/3) in 1s… (esc to cancel, enter to retry now)"
    clock.now += 0.499
    assert view.loader_text() == "Retrying (1/3) in 1s… (esc to cancel, enter to retry now)"


def test_loader_keys_can_be_chosen():
    """Loader keys can be chosen."""
    view = ChatView(keys="esc to cancel", clock=lambda: 0.0)
    view.handle(start(delay_ms=1200))
    assert view.loader_text() == "Retrying (1/3) in 2s… (esc to cancel)"


def test_retried_turn_start_restores_esc_and_clears_the_loader(view):
    """Retried turn start restores esc and clears the loader."""
    failed_turn(view)
    view.handle(start(attempt=2, max_attempts=3))
    view.handle(AGENT_START)
    assert view.esc_action == ESC_ABORT_TURN
    assert view.loader_text() is None
    assert view.status_text() == "m1 · retry on · retrying 2/3"
    assert view.activity_text().endswith("Retry 2/3 running… (esc to interrupt)")


def test_success_end_clears_the_loader_quietly(view):
    """Success end clears the loader quietly."""
    failed_turn(view)
    view.handle(start())
    view.handle(AGENT_START)
    lines = view.handle(ASSISTANT_START) + view.handle(delta("hi")) + view.handle(
        assistant_end(text="hi")) + view.handle(AGENT_END) + view.handle(end(True, 1))
    assert lines == [Line("hi", "assistant"), Line("Retry succeeded on attempt 1 of 3", "retry_ok")]
    assert view.esc_action == ESC_ABORT_TURN and view.enter_action is None
    assert view.loader_text() is None and view.activity_text() is None
    assert view.status_text() == "m1 · retry on · idle (last chain succeeded)"


def test_end_without_a_retried_turn_also_restores_esc(view):
    """End without a retried turn also restores esc."""
    failed_turn(view)
    view.handle(start())
    view.handle(end(True, 1))
    assert view.esc_action == ESC_ABORT_TURN
    assert view.loader_text() is None


def test_esc_cancel_during_the_first_backoff_says_no_retry_was_sent(view):
    """Esc in the first backoff reads as a cancel with no retry sent (the end's ``attempt`` 1
    counts the retry scheduled, not sent; docs/policy.md §6)."""
    failed_turn(view)
    view.handle(start())
    lines = view.handle(end(False, 1, "Retry cancelled"))
    assert lines == [Line("Retry cancelled before any retry was sent", "aborted")]
    assert view.esc_action == ESC_ABORT_TURN
    assert view.loader_text() is None


def test_exhausted_chain_prints_the_final_error_plural(view):
    """Exhausted chain prints the final error plural."""
    failed_turn(view)
    for attempt in (1, 2, 3):
        view.handle(start(attempt=attempt))
        view.handle(AGENT_START)
        view.handle(ASSISTANT_START)
        view.handle(assistant_end("error", error="503 Service Unavailable"))
        view.handle(AGENT_END)
    lines = view.handle(end(False, 3, "503 Service Unavailable"))
    assert lines == [Line("Retry failed after 3 attempts: 503 Service Unavailable", "retry_failed")]
    assert view.esc_action == ESC_ABORT_TURN


def test_a_cancel_counts_the_retries_sent_not_the_one_scheduled(view):
    """A cancel counts the retries sent (docs/policy.md §6): Esc in the third backoff, two
    retries sent, reads "after 2 attempts" (the end's ``attempt`` is 3), no "failed"; a cancel
    while the second retry runs reads "after 2 attempts" too; a chain ended cancelled by its
    endReason alone reads the same."""
    failed_turn(view)
    for attempt in (1, 2):
        view.handle(start(attempt=attempt))
        failed_turn(view)
    view.handle(start(attempt=3))
    lines = view.handle({**end(False, 3, "Retry cancelled"), "endReason": "cancelled"})
    assert lines == [Line("Retry cancelled after 2 attempts", "aborted")]
    assert not any("failed" in line.text for line in lines)
    failed_turn(view)
    view.handle(start(attempt=1))
    failed_turn(view)
    view.handle(start(attempt=2))
    view.handle(AGENT_START)  # the second retry goes out, then the prompt is cancelled
    assert view.handle({**end(False, 2, "stopped"), "endReason": "cancelled"}) == [
        Line("Retry cancelled after 2 attempts", "aborted")]


def test_each_failed_attempt_shows_its_error(view):
    """Each failed attempt shows its error."""
    lines = failed_turn(view, error="Error code: 529 - {'type': 'overloaded_error'}")
    assert lines == [Line("Error: Error code: 529 - {'type': 'overloaded_error'}", "error")]


def test_abort_during_retried_turn_says_aborted_after_n_attempts_once(view):
    """Abort during retried turn says aborted after n attempts once."""
    failed_turn(view)
    view.handle(start(attempt=1))
    view.handle(AGENT_START)
    failed_turn_lines = view.handle(ASSISTANT_START) + view.handle(
        assistant_end("error", error="503")) + view.handle(AGENT_END)
    assert failed_turn_lines == [Line("Error (retry 1/3): 503", "error")]
    view.handle(start(attempt=2))
    view.handle(AGENT_START)
    lines = view.handle(ASSISTANT_START) + view.handle(delta("par")) + view.handle(
        assistant_end("aborted", text="par", error="Request was aborted")) + view.handle(AGENT_END)
    lines += view.handle(end(False, 2, "Retry cancelled"))
    assert lines == [Line("par", "assistant"), Line("Aborted after 2 retry attempts", "aborted")]
    assert view.esc_action == ESC_ABORT_TURN


def test_abort_after_one_retry_is_singular(view):
    """Abort after one retry is singular."""
    failed_turn(view)
    view.handle(start(attempt=1))
    view.handle(AGENT_START)
    lines = view.handle(assistant_end("aborted", error="Request was aborted"))
    assert lines == [Line("Aborted after 1 retry attempt", "aborted")]


def test_abort_of_a_plain_turn_says_aborted(view):
    """Abort of a plain turn says aborted."""
    view.handle(AGENT_START)
    assert view.handle(assistant_end("aborted", error="Request was aborted")) == [Line("Aborted", "aborted")]


def test_a_new_chain_after_a_cancelled_one_reports_its_own_failure(view):
    """A new chain after a cancelled one reports its own failure."""
    failed_turn(view)
    view.handle(start(attempt=1))
    view.handle(AGENT_START)
    view.handle(assistant_end("aborted", error="Request was aborted"))
    view.handle(AGENT_END)
    view.handle(end(False, 1, "Retry cancelled"))
    failed_turn(view)
    view.handle(start(attempt=1))
    assert view.handle(end(False, 1, "Retry cancelled")) == [
        Line("Retry cancelled before any retry was sent", "aborted")]


def test_max_retries_zero_end_without_start_keeps_esc_bound_to_abort(view):
    """Max retries zero end without start keeps esc bound to abort."""
    failed_turn(view)
    lines = view.handle(end(False, 0, "overloaded"))
    assert lines == [Line("Retry failed after 0 attempts: overloaded", "retry_failed")]
    assert view.esc_action == ESC_ABORT_TURN


def test_two_starts_without_a_turn_between_push_one_handler(view, clock):
    """Two starts without a turn between push one handler."""
    view.handle(start(attempt=1, delay_ms=1000))
    view.handle(start(attempt=2, delay_ms=4000))
    assert view.loader_text() == "Retrying (2/3) in 4s… (esc to cancel, enter to retry now)"
    view.handle(end(False, 2, "Retry cancelled"))
    assert view.esc_action == ESC_ABORT_TURN
    view.handle(end(True, 2))  # a stray end never pops the base handler
    assert view.esc_action == ESC_ABORT_TURN


# ---------------------------------------------------------------------- streaming
def test_streamed_lines_are_printed_as_they_complete(view):
    """Streamed lines are printed as they complete."""
    view.handle(AGENT_START)
    view.handle(ASSISTANT_START)
    assert view.handle(delta("Hel")) == []
    assert view.stream_tail == "Hel"
    assert view.handle(delta("lo\nwor")) == [Line("Hello", "assistant")]
    assert view.stream_tail == "wor"
    assert view.handle(delta("ld\n\nbye")) == [Line("world", "assistant"), Line("", "assistant")]
    assert view.handle(assistant_end(text="Hello\nworld\n\nbye")) == [Line("bye", "assistant")]
    assert view.stream_tail == ""


def test_an_answer_that_was_not_streamed_is_printed_whole(view):
    """An answer that was not streamed is printed whole."""
    view.handle(AGENT_START)
    view.handle(ASSISTANT_START)
    assert view.handle(assistant_end(text="one\ntwo")) == [Line("one", "assistant"), Line("two", "assistant")]


def test_partial_text_of_a_failed_stream_is_kept_before_the_error(view):
    """Partial text of a failed stream is kept before the error."""
    view.handle(AGENT_START)
    view.handle(ASSISTANT_START)
    view.handle(delta("half an ans"))
    assert view.handle(assistant_end("error", text="half an ans", error="premature close")) == [
        Line("half an ans", "assistant"), Line("Error: premature close", "error")]


def test_user_messages_are_echoed_when_sent(view):
    """User messages are echoed when sent."""
    event = {"type": "message_end", "message": {"role": "user", "content": [{"type": "text", "text": "hi"}]}}
    assert view.handle(event) == [Line("› hi", "user")]


def test_a_turn_takes_the_queued_messages(view):
    """A turn takes the queued messages."""
    view.handle({"type": "queue_update", "queued": ["later"]})
    assert view.queued == 1
    view.handle(AGENT_START)
    assert view.queued == 0


def test_unknown_events_are_ignored(view):
    """Unknown events are ignored."""
    assert view.handle({"type": "something_new", "x": 1}) == []
    assert view.handle({}) == []


def test_working_spinner_while_a_turn_runs(view):
    """Working spinner while a turn runs."""
    view.handle(AGENT_START)
    assert view.activity_text().endswith("Working… (esc to interrupt)")
    assert view.status_text() == "m1 · retry on · streaming"
    view.handle(AGENT_END)
    assert view.activity_text() is None


# ---------------------------------------------------------------------- saying why
def test_partial_output_of_a_failed_attempt_is_marked_discarded_when_the_retry_replaces_it(view):
    """Partial output of a failed attempt is marked discarded when the retry replaces it."""
    view.handle(AGENT_START)
    view.handle(ASSISTANT_START)
    view.handle(delta("half an ans"))
    view.handle(assistant_end("error", text="half an ans", error="terminated"))
    view.handle(AGENT_END)
    assert view.handle({**start(), "discardsOutput": True}) == [
        Line("↑ partial answer discarded: the retry replaces it", "discarded")]


def test_no_discard_note_when_nothing_was_shown(view):
    """No discard note when nothing was shown."""
    failed_turn(view)
    assert view.handle({**start(), "discardsOutput": True}) == []


def test_a_failure_with_retry_off_says_it_is_not_retried(view):
    """A failure with retry off says it is not retried."""
    view.retry_enabled = False
    assert failed_turn(view, error="529 Overloaded") == [
        Line("Error: 529 Overloaded", "error"),
        Line("Not retrying: auto-retry is off (/retry on turns it back on)", "info")]


def test_a_failed_chain_says_why_it_ended_in_plain_words(view):
    """A failed chain says why it ended in plain words."""
    failed_turn(view)
    view.handle(start())
    lines = view.handle({**end(False, 3, "503 Service Unavailable"), "endReason": "exhausted"})
    assert lines == [Line("Retry failed after 3 attempts: 503 Service Unavailable", "retry_failed"),
                     Line("Why: no retries were left (retry.maxRetries)", "info")]
    assert view.status_text() == "m1 · retry on · idle (last chain exhausted)"


def test_a_cancelled_chain_needs_no_why(view):
    """A cancelled chain needs no why."""
    failed_turn(view)
    view.handle(start())
    lines = view.handle({**end(False, 1, "Retry cancelled"), "endReason": "cancelled"})
    assert lines == [Line("Retry cancelled before any retry was sent", "aborted")]
    assert view.state_label == rest_label("cancelled") == "idle (last chain cancelled)"


def test_rest_label_names_the_machine_state_at_rest():
    """Rest label names the machine state at rest."""
    assert rest_label(None) == rest_label("idle") == "idle"
    assert rest_label("succeeded") == "idle (last chain succeeded)"


# ---------------------------------------------------------------------- the texts
def test_loader_text_rounds_half_up_once_and_up_while_counting():
    """Loader text rounds half up once and up while counting."""
    from fsm.core.ui_text import countdown_seconds, loader_text
    assert loader_text(1, 3, 1200) == "Retrying (1/3) in 1s… (esc to cancel)"
    assert loader_text(1, 3, 1200, counting=True) == "Retrying (1/3) in 2s… (esc to cancel)"
    assert loader_text(2, 3, 500, keys=None) == "Retrying (2/3) in 1s…"
    assert [countdown_seconds(ms) for ms in (0, 1, 1000, 1001, 2500)] == [1, 1, 1, 2, 3]


def test_end_reason_text_covers_every_reason_and_nothing_else():
    """End reason text covers every reason and nothing else."""
    from fsm.core.events import END_REASONS
    from fsm.core.ui_text import END_REASON_TEXT, end_reason_text
    assert set(END_REASON_TEXT) == set(END_REASONS)
    assert end_reason_text("deadline") == "Why: the next retry would have gone past retry.maxElapsedMs"
    assert end_reason_text(None) is None and end_reason_text("new_reason") is None


def test_a_retry_wait_at_the_gate_is_counted_down_after_its_backoff(view, clock):
    """request_delayed after a retry's backoff: its countdown replaces the loader; Esc aborts it; the retried turn starts after."""
    view.handle(start(delay_ms=1000))
    clock.now += 1.5  # the backoff is over: the retry waits for its pacer slot
    view.handle({"type": "request_delayed", "delayMs": 2500, "retryAt": 1, "delaySource": "pacing"})
    assert view.activity_text() == "Sending in 3s… (the fleet's pacing; esc to cancel)"
    assert view.esc_action == ESC_ABORT_RETRY
    view.handle({"type": "agent_start"})
    assert view.esc_action == ESC_ABORT_TURN and view.retried_turn
    assert view.activity_text().endswith("Retry 1/3 running… (esc to interrupt)")


def test_a_first_request_wait_is_counted_down_and_esc_cancels_it(view, clock):
    """request_delayed (resilient): a countdown above the input, Esc bound to abort_retry
    (which ends the wait with nothing sent), cleared when the turn starts."""
    view.handle({"type": "request_delayed", "delayMs": 2500, "retryAt": 1, "delaySource": "pacing"})
    assert view.esc_action == ESC_ABORT_RETRY and view.needs_ticks
    assert view.activity_text() == "Sending in 3s… (the fleet's pacing; esc to cancel)"
    clock.now += 2.0
    assert view.activity_text() == "Sending in 1s… (the fleet's pacing; esc to cancel)"
    assert view.state_label == "idle"  # at rest: no chain
    view.handle({"type": "agent_start"})
    assert view.esc_action == ESC_ABORT_TURN and view.first_wait_text() is None


def test_cancelled_text_counts_retries_sent():
    """The cancel text counts retries sent, from the end's ``attempt`` and whether the
    scheduled retry still waited (docs/policy.md §6)."""
    from fsm.core.ui_text import cancelled_text, failure_text, retries_sent

    assert [retries_sent(3, backing_off=True), retries_sent(3, backing_off=False)] == [2, 3]
    assert [cancelled_text(n) for n in (0, 1, 2)] == [
        "Retry cancelled before any retry was sent", "Retry cancelled after 1 attempt",
        "Retry cancelled after 2 attempts"]
    assert failure_text(3, "Retry cancelled", "cancelled", backing_off=True) == \
        "Retry cancelled after 2 attempts"
    assert failure_text(3, "529", "exhausted", backing_off=True) == "Retry failed after 3 attempts: 529"
