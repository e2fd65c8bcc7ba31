"""The retry brain: facts in, actions out (sans-IO; docs/policy.md §3).

:class:`RetryBrain` holds one session's retry state and runs it through the machine declared
in :mod:`fsm.core.lifecycle`. It never sleeps, prints, reads a clock or calls the network: the host
tells it what happened (a turn ended with this message and these facts, the backoff elapsed,
the user cancelled or asked to retry now, the prompt task was cancelled) and carries out the
actions it returns, **in the order returned**:

======================  =================================================================
``EmitTurnEnd(part)``   emit the turn's own end events here: ``part="message"`` is the
                        assistant ``message_end``, ``part="agent"`` is ``turn_end`` and
                        ``agent_end`` (so the brain decides where they go, §4)
``Emit(event)``         send ``event`` (a :mod:`fsm.core.events` object) to listeners
``DropFailedMessage``   remove the failed assistant message from the runtime context only;
                        the persisted log keeps it (§3)
``StartBackoff``        start the one backoff timer: after ``delay_ms`` call
                        :meth:`RetryBrain.backoff_elapsed` with ``timer_id``
``CancelBackoff``       cancel the pending timer ``timer_id``
``ContinueTurn``        re-run the turn without a new user message, on the next loop tick
``CheckCompaction``     consult the compaction hook with the turn's message
``RecordCooldown``      tell the coordinator the server asked every session to wait (§9)
``ReturnRetryToken``    give back the budget token taken for a retry that was not sent (§8b.3)
``CreditRetryBudget``   a success: the budget gets ``tokenRatio`` back (§8b.3)
``PromptMayReturn``     the work the prompt started is over: ``prompt()`` may return. Sent
                        for every fact that leaves the brain at rest (a turn that starts no
                        chain, every chain end), never otherwise (§8b.7)
``SwitchModel``         model fallback (§13.3): later attempts use ``to_model``; leaving the
                        primary, the host writes the primary's fallback mark
``ArmDeadline``         start the chain's deadline timer: after ``delay_ms`` call
                        :meth:`RetryBrain.deadline_passed` with ``chain_id`` (§13.2)
``AbortAttempt``        abort the running attempt now; its end is not handed to the brain
                        (the chain already ended ``deadline``); the host emits its turn end
======================  =================================================================

What the brain needs from the world comes in as :class:`TurnFacts` (the time, whether output
was streamed, the credential store's answer, the shared cooldown and budget): the host gathers
them *before* handing the turn's end over, and does what the actions ask *after* (§8b.2).
"""

from __future__ import annotations

import random as _random
from dataclasses import dataclass
from datetime import datetime, timezone, tzinfo
from typing import Any, Callable, Union

from transitions import MachineError

from fsm.core import lifecycle as L
from fsm.core.classify import Classification, classify_message
from fsm.core.events import CANCELLED_TEXT, AutoRetryEnd, AutoRetryStart, Event, RetryFallback
from fsm.core.messages import AssistantMessage
from fsm.core.settings import RetrySettings

__all__ = [
    "RetryBrain", "TurnFacts", "Action", "EmitTurnEnd", "Emit", "DropFailedMessage",
    "StartBackoff", "CancelBackoff", "ContinueTurn", "CheckCompaction", "RecordCooldown",
    "ReturnRetryToken", "CreditRetryBudget", "PromptMayReturn", "SwitchModel", "ArmDeadline",
    "AbortAttempt", "CANCELLED_TEXT",
]


# ---------------------------------------------------------------------------- facts

@dataclass(frozen=True, slots=True)
class TurnFacts:
    """What the host knows about the world when a turn ends (all optional).

    - ``now_ms``: epoch time in ms (for ``retryAt`` and the chain deadline); None = unknown,
      then no deadline is checked and no ``retryAt`` is given.
    - ``output_streamed``: the failed turn had streamed text or started a tool call (D12).
    - ``credential_switched``: the credential store answered that another credential or
      model is now in use (the usage-limit path, §3).
    - ``credential_count``: credentials the store holds for the provider (D13, §8b.6).
    - ``cooldown_ms``: the shared cooldown left for this provider/model/credential (§9).
    - ``budget_allows``: the retry budget's answer (True when the budget is off or unknown).
    - ``budget_taken``: the host took a budget token for this failure (given back when the
      retry is not sent for another reason).
    - ``note``: a remark for the ``auto_retry_start`` event (e.g. a store that failed).
    - ``model``: the model the failed attempt used (``"model"`` or ``"provider/model"`` as in
      ``retry.fallbackModels``); None = the primary, unnamed (docs/policy.md §13.3).
    - ``budget_slot_ms``: the budget is in wait mode (docs/policy.md §13.7) and refused: the
      ms until its next slot; None = a refusal ends the chain (``endReason: "budget"``).
    - ``pacing_ms``: the ms until the pacing slot the coordinator reserved for the retry
      (docs/fleet.md "Pacing"); the delay is at least this (``delaySource: "pacing"`` when it
      decides). It counts toward the chain's deadline, not toward ``maxHintWaitMs``.
    - ``zone``: the host's time-zone resolver, ``zone(name) -> tzinfo | None`` (an IANA name
      such as ``"America/Santiago"``), used when the brain classifies the message itself; None
      = a reset time in a named zone is unknown (``docs/classification.md``).
    """

    now_ms: int | None = None
    output_streamed: bool = False
    credential_switched: bool = False
    credential_count: int = 1
    cooldown_ms: int = 0
    budget_allows: bool = True
    budget_taken: bool = False
    note: str | None = None
    model: str | None = None
    budget_slot_ms: int | None = None
    pacing_ms: int = 0
    zone: Callable[[str], tzinfo | None] | None = None


_NO_FACTS = TurnFacts()


# ---------------------------------------------------------------------------- actions

@dataclass(frozen=True, slots=True)
class EmitTurnEnd:
    """Emit the turn's end events: ``"message"`` = message_end, ``"agent"`` = turn_end + agent_end."""

    part: str


@dataclass(frozen=True, slots=True)
class Emit:
    """Send ``event`` (an :class:`fsm.core.events.Event`) to listeners, extensions and RPC clients."""

    event: Event


@dataclass(frozen=True, slots=True)
class DropFailedMessage:
    """Remove ``message`` (the failed turn's assistant message) from the runtime context."""

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
    """Continue the turn (no new user message) on the next loop tick; report a failure with
    :meth:`RetryBrain.continue_failed`."""

    attempt: int


@dataclass(frozen=True, slots=True)
class CheckCompaction:
    """Consult the compaction hook with ``message``; ``kind`` is its classification kind."""

    message: AssistantMessage
    kind: str


MAX_SHARED_COOLDOWN_MS = 86_400_000
"""The longest cooldown a single answer's hint shares with the fleet (24 h): a ``retry-after``
of a year (a misconfigured proxy, a hostile one) would otherwise refuse every session's first
request for a year; after a day one request asks the provider again and learns anew. Usage
windows of up to five hours, the longest common one, are shared whole."""


@dataclass(frozen=True, slots=True)
class RecordCooldown:
    """Share the server's wait: nobody should retry before ``until_ms`` (epoch ms); ``wait_ms``
    is the hint, at most :data:`MAX_SHARED_COOLDOWN_MS` (a longer hint still decides this
    chain, but one answer does not close the key for the fleet for longer than a day)."""

    wait_ms: int
    until_ms: int | None


@dataclass(frozen=True, slots=True)
class ReturnRetryToken:
    """Give back the retry-budget token taken for this failure (the retry was not sent)."""


@dataclass(frozen=True, slots=True)
class CreditRetryBudget:
    """A request succeeded: the retry budget gets ``tokenRatio`` back."""


@dataclass(frozen=True, slots=True)
class PromptMayReturn:
    """The work the prompt started is over. ``end_reason`` is the chain's (or the refusal's)
    :data:`fsm.core.events.END_REASONS` code, or None for a turn that started no chain."""

    end_reason: str | None = None


@dataclass(frozen=True, slots=True)
class SwitchModel:
    """Model fallback (docs/policy.md §13.3): the next attempts of this chain use ``to_model``
    instead of ``from_model`` (None = the primary). When ``from_model`` is the primary, the host
    writes the primary's fallback mark for ``revert_ms`` ms (``retry.fallbackRevertMs``), so new
    prompts go to the primary again only once it expires."""

    to_model: str
    from_model: str | None
    reason: str
    revert_ms: int


@dataclass(frozen=True, slots=True)
class ArmDeadline:
    """Start the chain's deadline timer: after ``delay_ms`` ms call
    :meth:`RetryBrain.deadline_passed` with ``chain_id`` (``retry.maxElapsedMs``, docs/policy.md
    §13.2). The host cancels it when the chain ends."""

    delay_ms: int
    chain_id: int


@dataclass(frozen=True, slots=True)
class AbortAttempt:
    """Abort the running attempt ``attempt`` at once (the chain's deadline passed, docs/policy.md
    §13.2): its end is *not* handed to the brain (the chain already ended ``deadline``); the host
    ends the turn as failed with ``error`` (stop reason ``error``) and emits its end events here."""

    attempt: int
    error: str


Action = Union[EmitTurnEnd, Emit, DropFailedMessage, StartBackoff, CancelBackoff, ContinueTurn,
               CheckCompaction, RecordCooldown, ReturnRetryToken, CreditRetryBudget,
               PromptMayReturn, SwitchModel, ArmDeadline, AbortAttempt]

_MAX_USAGE_WAIT_MS = 7 * 86_400_000
"""``waitForUsageReset`` without ``maxElapsedMs`` waits at most 7 days (docs/policy.md §13.5)."""

_TRIGGER_BY_KIND = {
    "retryable": L.TURN_FAILED_RETRYABLE,
    "context_overflow": L.TURN_OVERFLOWED,
    "fatal": L.TURN_FAILED_FATAL,
    "none": L.TURN_SUCCEEDED,
}
_DEFAULT_SETTINGS = RetrySettings()
_UNKNOWN_ONCE = Classification("retryable", "retry.unknown_once", family="unknown")
"""What an ``unknown`` failure at rest is under ``retry.unknown: "once"``; its rule id is the
``rule`` of the ``auto_retry_start`` that follows (docs/policy.md §1)."""


# ---------------------------------------------------------------------------- words

def duration_text(ms: int) -> str:
    """``ms`` in a reader's words: ``850 ms``, ``12 s``, ``4 min 10 s``, ``2 h 39 min``, ``2 d 10 h``."""
    if ms < 1000:
        return f"{ms} ms"
    s = round(ms / 1000)
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min {s} s" if s else f"{m} min"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(h, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def seconds_text(ms: int) -> str:
    """A watchdog's limit in the words of docs/policy.md §13.1/§13.2, always in seconds (the
    classifier matches these texts): ``30 s``, ``1.5 s``, ``120 s``; under a second ``800 ms``."""
    if ms < 1000:
        return f"{ms} ms"
    return f"{ms // 1000} s" if ms % 1000 == 0 else f"{ms / 1000:g} s"


def _clock_text(epoch_ms: int, now_ms: int | None = None) -> str:
    """``14:05 UTC`` (``14:05:07 UTC`` off the minute); with the date when it is not the day of
    ``now_ms`` (``2026-01-03 10:00 UTC``)."""
    try:
        t = datetime.fromtimestamp(epoch_ms / 1000, tz=timezone.utc)
        text = t.strftime("%H:%M UTC") if epoch_ms % 60_000 == 0 else t.strftime("%H:%M:%S UTC")
        if now_ms is not None and datetime.fromtimestamp(now_ms / 1000, tz=timezone.utc).date() != t.date():
            text = t.strftime("%Y-%m-%d ") + text
        return text
    except (OverflowError, ValueError, OSError):  # beyond the calendar (years 1–9999)
        return f"epoch {epoch_ms} ms"


# ---------------------------------------------------------------------------- the policy model

class _Policy:
    """The object the machine fires on: guards, effects and the chain's bookkeeping. Private."""

    __slots__ = ("owner", "state", "settings", "attempt", "chain_id", "max", "timer",
                 "fact_timer", "chain_start_ms", "actions", "message", "cls", "facts", "reason",
                 "random", "plan", "source", "recs", "model", "fallback_count", "last_error",
                 "waiting_for", "refusal", "chain_ids", "engine")

    def __init__(self, owner: "RetryBrain", settings: RetrySettings,
                 random: Callable[[], float],
                 engine: Callable[["_Policy", str, tuple[L.Recorder, ...]], None]) -> None:
        self.owner = owner
        self.engine = engine  # how a fact runs through the machine (ENGINES)
        self.chain_ids: Callable[[], int] | None = None  # the host's chain ids (unique per process)
        self.state = L.INITIAL
        self.settings = settings
        self.attempt = 0
        self.chain_id = 0
        self.max = 0
        self.timer = 0
        self.fact_timer = 0
        self.chain_start_ms: int | None = None
        self.actions: list[Action] = []
        self.message: AssistantMessage | None = None
        self.cls: Classification | None = None
        self.facts: TurnFacts = _NO_FACTS
        self.reason = ""
        self.random = random
        self.plan: tuple[int, str] | None = None
        self.source = L.INITIAL  # the state the current fact found the machine in
        self.model: str | None = None  # the model the chain's attempts use (None = primary)
        self.fallback_count = 0  # failures in a row of a fallbackOn family on self.model
        self.last_error = ""  # the chain's last error text (for an end without a turn)
        self.waiting_for = "backoff"  # what the pending backoff waits for: backoff | budget
        self.refusal: tuple[int, bool, int | None] = (0, False, None)  # request_refused facts
        self.recs: tuple[L.Recorder, ...] = ()  # this brain's own recorders

    def recorders(self) -> tuple[L.Recorder, ...]:
        """This brain's recorders (the engines add the context's)."""
        return self.recs

    # ---------------------------------------------------------------- guards
    def retry_enabled(self) -> bool:
        return self.settings.enabled

    def _in_chain(self) -> bool:
        return self.source in L.IN_CHAIN

    def _chain_start(self, now: int) -> int:
        return self.chain_start_ms if self._in_chain() and self.chain_start_ms is not None else now

    def has_retries_left(self) -> bool:
        if self._in_chain():
            return self.attempt < self.max
        return self.settings.max_retries >= 1

    def replay_safe(self) -> bool:
        return self.settings.after_output == "retry" or not self.facts.output_streamed

    def hint_within_wait(self) -> bool:
        if self._waits_for_usage_reset():
            return self.settings.max_elapsed_ms is not None or self._server_wait() <= _MAX_USAGE_WAIT_MS
        if not self.settings.honors_hints or self._switched():
            return True
        return self._server_wait() <= self.settings.max_hint_wait_ms

    def fallback_due(self) -> bool:
        s = self.settings
        if not s.fallback_models or self._switched() or self.cls is None:
            return False
        if self._model_index() >= len(s.fallback_models):
            return False  # after the last fallback, retries stay on it (§13.3)
        if self.cls.family not in s.fallback_on:
            return False
        if self._fallback_count() + 1 >= s.fallback_after:
            return True
        wait = max(self.cls.retry_hint_ms or 0, self.facts.cooldown_ms or 0)
        return wait > s.max_hint_wait_ms

    def budget_waits(self) -> bool:
        return self.facts.budget_slot_ms is not None

    def within_deadline(self) -> bool:
        limit = self.settings.max_elapsed_ms
        now = self.facts.now_ms
        if limit is None or now is None:
            return True
        return now + self._plan()[0] <= self._chain_start(now) + limit

    def budget_allows(self) -> bool:
        return self.facts.budget_allows

    def timer_is_current(self) -> bool:
        return self.fact_timer == self.timer

    # ---------------------------------------------------------------- planning (pure)
    def _current_model(self) -> str | None:
        return self.model if self._in_chain() else self.facts.model

    def _model_index(self) -> int:
        """0 for the primary, i for ``fallbackModels[i-1]``."""
        model = self._current_model()
        models = self.settings.fallback_models
        return models.index(model) + 1 if model in models else 0

    def _fallback_count(self) -> int:
        return self.fallback_count if self._in_chain() else 0

    def _count_failure(self) -> None:
        """Count this failure toward ``fallbackAfter`` (§13.3): a fallbackOn family in a row on
        the current model; another family resets; a credential switch does not count."""
        if self._switched():
            return
        base = self._fallback_count()
        on = self.cls is not None and self.cls.family in self.settings.fallback_on
        self.fallback_count = base + 1 if on else 0

    def _waits_for_usage_reset(self) -> bool:
        return bool(self.settings.wait_for_usage_reset and self.cls is not None
                    and self.cls.usage_limit and not self._switched())

    def _reset_at(self) -> int | None:
        """``resetAt``: now + the hint of a usage-limit failure (§13.5), or None."""
        cls, now = self.cls, self.facts.now_ms
        if cls is None or not cls.usage_limit or not cls.retry_hint_ms or now is None:
            return None
        return now + cls.retry_hint_ms

    def _switched(self) -> bool:
        return bool(self.cls is not None and self.cls.usage_limit and self.facts.credential_switched)

    def _server_wait(self) -> int:
        """The wait the server asked for: the hint or the shared cooldown, whichever is longer."""
        if not self.settings.honors_hints and not self._waits_for_usage_reset():
            return 0
        hint = (self.cls.retry_hint_ms if self.cls is not None else None) or 0
        return max(hint, self.facts.cooldown_ms or 0)

    def _plan(self) -> tuple[int, str]:
        """``(delay_ms, delaySource)`` of the next retry, computed once per fact."""
        if self.plan is None:
            attempt = self.attempt + 1 if self._in_chain() else 1
            if self._switched():
                self.plan = (0, "switch")
            else:
                backoff = self.settings.backoff_ms(attempt, self.random)
                wait = self._server_wait()
                if wait > backoff:
                    hint = (self.cls.retry_hint_ms if self.cls is not None else None) or 0
                    self.plan = (self.settings.hinted_delay_ms(wait, self.random),
                                 "hint" if hint >= (self.facts.cooldown_ms or 0) else "cooldown")
                else:
                    self.plan = (backoff, "backoff")
                slot = self.facts.budget_slot_ms
                if not self.facts.budget_allows and slot is not None and slot > self.plan[0]:
                    self.plan = (slot, "budget")
                pacing = self.facts.pacing_ms or 0
                if pacing > self.plan[0]:  # max(backoff, hint/cooldown, pacer slot) (§14b.5)
                    self.plan = (pacing, "pacing")
        return self.plan

    # ---------------------------------------------------------------- effects
    def start_chain(self) -> None:
        self._plan()  # planned from the source state, before the attempt moves
        self._count_failure()
        self._begin()
        self._schedule()

    def _next_chain(self) -> None:
        """Take the next chain id: of ``chain_ids()`` when the host gave one (unique per
        process), else counted per brain."""
        self.chain_id = self.chain_ids() if self.chain_ids is not None else self.chain_id + 1

    def _begin(self) -> None:
        """A chain starts: attempt 1 and its maxAttempts, fixed now (§8b.6, §13.3); its id is
        the next of ``chain_ids()`` when the host gave one (unique per process), else counted."""
        self._next_chain()
        self.attempt = 1
        self.model = self.facts.model
        self.max = self.settings.max_retries + len(self.settings.fallback_models)
        if self.cls is not None and self.cls.usage_limit and self.facts.credential_count > 1:
            self.max += self.facts.credential_count - 1  # D13: every credential gets a try
        self.chain_start_ms = self.facts.now_ms

    def next_attempt(self) -> None:
        self._plan()
        self._count_failure()
        self.attempt += 1
        self._schedule()

    def wait_for_budget(self) -> None:
        if self._in_chain():
            self.next_attempt()
        else:
            self.start_chain()
        self.waiting_for = "budget"

    def fall_back(self) -> None:
        start = not self._in_chain()
        source_model = self._current_model()
        models, index = self.settings.fallback_models, self._model_index()
        # the guard checked that a fallback remains; a host forcing the row stays on the model
        to_model = models[index] if index < len(models) else (source_model or "")
        if start:
            self._begin()
        else:
            self.attempt += 1
        self.model = to_model
        self.fallback_count = 0
        self.plan = (0, "fallback")
        reason = self.cls.family if self.cls is not None else "other"
        self.actions += (EmitTurnEnd("message"), EmitTurnEnd("agent"),
                         Emit(RetryFallback(source_model, to_model, reason, self.chain_id)),
                         SwitchModel(to_model, source_model, reason,
                                     self.settings.fallback_revert_ms))
        self._schedule(turn_end=False, arm=start)

    def recheck_budget(self) -> None:
        slot = self.facts.budget_slot_ms
        self.timer += 1
        self.waiting_for = "budget"
        self.actions.append(StartBackoff(max(0, slot or 0), self.timer))

    def _schedule(self, *, turn_end: bool = True, arm: bool | None = None) -> None:
        delay, source = self._plan()
        message, cls, facts = self.message, self.cls, self.facts
        assert message is not None and cls is not None  # a retry follows a failed turn
        self.timer += 1
        self.waiting_for = "backoff"
        self.last_error = message.error_message or ""
        event = AutoRetryStart(
            attempt=self.attempt, max_attempts=self.max, delay_ms=delay,
            error_message=message.error_message or "", chain_id=self.chain_id, rule=cls.rule,
            retry_hint_ms=cls.retry_hint_ms,
            retry_at_ms=None if facts.now_ms is None else facts.now_ms + delay,
            delay_source=source, discards_output=facts.output_streamed, note=facts.note,
            model=self.model if self.settings.fallback_models else None,
            reset_at_ms=self._reset_at())
        if turn_end:
            self.actions += (EmitTurnEnd("message"), EmitTurnEnd("agent"))
        self.actions += (Emit(event), DropFailedMessage(message), StartBackoff(delay, self.timer))
        if arm is None:
            arm = self.attempt == 1
        limit = self.settings.max_elapsed_ms
        if arm and limit is not None and facts.now_ms is not None:
            self.actions.append(ArmDeadline(limit, self.chain_id))

    def settle_turn(self) -> None:
        assert self.message is not None and self.cls is not None  # a turn ended
        self.attempt = 0
        self.actions += (EmitTurnEnd("message"), EmitTurnEnd("agent"))
        if self.cls.kind == "none" and self.settings.budget is not None:
            self.actions.append(CreditRetryBudget())
        self.actions += (CheckCompaction(self.message, self.cls.kind), PromptMayReturn(None))

    def end_exhausted(self) -> None:
        self._end(False, "exhausted", self._error())

    def end_disabled(self) -> None:
        self._end(False, "disabled", self._error())

    def end_fatal(self) -> None:
        self._end(False, "fatal", self._error())

    def end_overflow(self) -> None:
        self._end(False, "overflow", self._error())

    def end_output_streamed(self) -> None:
        self._refuse("output_streamed", 'the failed turn had already streamed output and '
                     'retry.afterOutput is "stop"')

    def end_hint_too_long(self) -> None:
        wait = self._server_wait()
        now = self.facts.now_ms
        until = "" if now is None else f" (until {_clock_text(now + wait, now)})"
        hint = (self.cls.retry_hint_ms if self.cls is not None else None) or 0
        # the longer term decides the wait: this answer's hint, or a cooldown the fleet learned
        # from an earlier answer (another session's, possibly)
        who = ("the server asks to wait" if hint >= (self.facts.cooldown_ms or 0)
               else "the provider's cooldown, learned by the fleet from an earlier answer, has")
        self._refuse("hint_too_long", f"{who} {duration_text(wait)}{until}, longer "
                     f"than retry.maxHintWaitMs = {duration_text(self.settings.max_hint_wait_ms)}")

    def end_deadline(self) -> None:
        now = self.facts.now_ms or 0
        start = self._chain_start(now)
        at = now + self._plan()[0]
        self._refuse("deadline", f"the retry would go out at {_clock_text(at, now)}, after the chain's "
                     f"deadline of retry.maxElapsedMs = {duration_text(self.settings.max_elapsed_ms or 0)} "
                     f"(started {_clock_text(start)})")

    def deadline_in_backoff(self) -> None:
        self.actions.append(CancelBackoff(self.timer))
        self.timer += 1
        what = ("while the retry waited for the shared retry budget" if self.waiting_for == "budget"
                else "during the backoff")
        self._deadline_end(what)

    def abort_attempt(self) -> None:
        why = self._deadline_text("while the retried attempt was running")
        self.actions.append(AbortAttempt(self.attempt, why))
        self._deadline_end("while the retried attempt was running")

    def _deadline_text(self, what: str) -> str:
        limit = self.settings.max_elapsed_ms
        shown = duration_text(limit) if limit is not None else "?"
        return f"the chain's deadline of retry.maxElapsedMs = {shown} passed {what}"

    def _deadline_end(self, what: str) -> None:
        why = self._deadline_text(what)
        error = self.last_error
        self._end(False, "deadline", f"{why}; last error: {error}" if error else why)

    def end_refused(self) -> None:
        wait, usage, now = self.refusal
        until = "" if now is None else f" (until {_clock_text(now + wait, now)})"
        what = "a usage limit" if usage else "a cooldown"
        self._end(False, "hint_too_long", f"not sent: every credential is under {what} for "
                  f"{duration_text(wait)}{until}, longer than retry.maxHintWaitMs = "
                  f"{duration_text(self.settings.max_hint_wait_ms)}",
                  reset_at=now + wait if usage and now is not None else None)

    def end_budget(self) -> None:
        budget = self.settings.budget
        size = f" (retry.budget.maxTokens = {budget.max_tokens})" if budget is not None else ""
        self._refuse("budget", f"the shared retry budget is spent{size}: not retrying into an outage")

    def end_succeeded(self) -> None:
        assert self.message is not None and self.cls is not None  # a turn ended
        self.actions.append(EmitTurnEnd("message"))
        self._emit_end(True, "succeeded", None)
        self.actions.append(EmitTurnEnd("agent"))
        if self.settings.budget is not None:
            self.actions.append(CreditRetryBudget())
        self.actions += (CheckCompaction(self.message, self.cls.kind), PromptMayReturn("succeeded"))

    def end_cancelled(self) -> None:
        self._end(False, "cancelled", CANCELLED_TEXT, compaction=False)

    def end_continue_failed(self) -> None:
        self._end(False, "continue_failed", self.reason, compaction=False)

    def continue_turn(self) -> None:
        self.actions.append(ContinueTurn(self.attempt))

    def retry_at_once(self) -> None:
        self.actions += (CancelBackoff(self.timer), ContinueTurn(self.attempt))
        self.timer += 1  # the cancelled timer can no longer continue, whatever the host does

    def cancel_backoff(self) -> None:
        self.actions.append(CancelBackoff(self.timer))
        self.timer += 1
        self._end(False, "cancelled", CANCELLED_TEXT, compaction=False)

    def _error(self) -> str:
        """The failed turn's error text ("" when there is none)."""
        return (self.message.error_message or "") if self.message is not None else ""

    def _refuse(self, reason: str, why: str) -> None:
        error = self._error()
        self._end(False, reason, f"{why}; last error: {error}" if error else why,
                  reset_at=self._reset_at())

    def _end(self, success: bool, reason: str, final_error: str | None, *,
             compaction: bool = True, reset_at: int | None = None) -> None:
        turn = self.message is not None
        if turn:
            self.actions += (EmitTurnEnd("message"), EmitTurnEnd("agent"))
        self._emit_end(success, reason, final_error, reset_at)
        if turn and compaction:
            assert self.message is not None and self.cls is not None
            self.actions.append(CheckCompaction(self.message, self.cls.kind))
        self.actions.append(PromptMayReturn(reason))

    def _emit_end(self, success: bool, reason: str, final_error: str | None,
                  reset_at: int | None = None) -> None:
        attempt = self.attempt
        if not attempt:  # a refusal at rest is a chain of its own, with its own id
            self._next_chain()
        self.actions.append(Emit(AutoRetryEnd(success, attempt, final_error, reason,
                                              self.chain_id, reset_at)))
        self.attempt = 0
        self.chain_start_ms = None
        self.fallback_count = 0
        self.last_error = ""


_MACHINE = L.MACHINE
_EVENTS = _MACHINE.events
_context_recorders = L.context_recorders


# ---------------------------------------------------------------------------- the engines

_Candidate = tuple[tuple[tuple[str, bool], ...], "str | None", "str | None", str,
                   tuple[str, ...], str]


def _compile_candidate(tr: Any, trigger: str, model: type) -> _Candidate:
    """One ``transitions`` transition as a dispatch candidate ``(guards, effect, dest, row_id,
    labels, outcome)``; raises ``ValueError`` for what the dispatch cannot run as
    ``transitions`` would (a callable guard, a callback other than one named ``after`` effect,
    a name ``model`` lacks, a transition without a row id)."""
    row_id = getattr(tr, "row_id", "")
    where = row_id or f"{tr.source}--{trigger}->{tr.dest}"
    if not row_id:
        raise ValueError(f"transition {where} has no row id: build it with "
                         f"fsm.core.lifecycle.build_machine")
    if tr.prepare or tr.before or len(tr.after) > 1:
        raise ValueError(f"transition {where}: only one named 'after' effect compiles "
                         f"(prepare={tr.prepare!r}, before={tr.before!r}, after={tr.after!r})")
    names = [c.func for c in tr.conditions] + list(tr.after)
    for name in names:
        if not isinstance(name, str) or not callable(getattr(model, name, None)):
            raise ValueError(f"transition {where}: {name!r} is not a method of {model.__name__}")
    guards = tuple((c.func, bool(c.target)) for c in tr.conditions)
    labels = tuple(name if expected else "!" + name for name, expected in guards)
    effect = tr.after[0] if tr.after else None
    return (guards, effect, tr.dest, row_id, labels,
            "ignored" if getattr(tr, "ignored", False) else "taken")


def _compile_dispatch(machine: Any = _MACHINE, model: type = _Policy
                      ) -> dict[tuple[str, str], tuple[_Candidate, ...]]:
    """The serving dispatch, compiled from ``machine`` (a ``transitions.Machine`` made by
    :func:`fsm.core.lifecycle.build_machine`; default the one the brain serves on): (state,
    trigger) -> the candidates ``transitions`` would try, in its order — for each of
    ``machine.events``, each source's ``transitions`` as ``(guards, effect, dest, row_id,
    labels, outcome)``. ``guards`` is each transition's ``conditions`` as ``((name,
    expected), ...)`` (``expected`` False for an ``unless`` guard), ``labels`` the same as a
    record shows them (``name`` / ``!name``), ``effect`` its ``after`` callback, ``dest`` None
    for an internal transition (an ignored cell), ``outcome`` what a record says when it runs.

    Raises ``ValueError`` when the machine runs something the dispatch would not: a
    machine-wide or state callback, events sent as objects, or a transition
    :func:`_compile_candidate` refuses; or when ``model`` lacks a guard or effect it names.
    """
    # a hook an older transitions does not know (0.9.0 has no on_final) is a hook not set
    hooks = {name: getattr(machine, name, None) for name in (
        "prepare_event", "before_state_change", "after_state_change", "finalize_event",
        "on_exception", "on_final")}
    hooks.update({f"{s.name}.on_enter": s.on_enter for s in machine.states.values()})
    hooks.update({f"{s.name}.on_exit": s.on_exit for s in machine.states.values()})
    used = {name: value for name, value in hooks.items() if value}
    if used or machine.send_event:
        raise ValueError(f"the machine runs callbacks the dispatch would not: {used!r} "
                         f"(send_event={machine.send_event!r})")
    return {(source, trigger): tuple(_compile_candidate(tr, trigger, model) for tr in candidates)
            for trigger, event in machine.events.items()
            for source, candidates in event.transitions.items()}


_DISPATCH = _compile_dispatch()


def _fire_transitions(p: _Policy, trigger: str, recorders: tuple[L.Recorder, ...] = ()) -> None:
    """Run ``trigger`` on ``p`` by firing it on the ``transitions`` machine itself (the
    ``transitions`` engine, ``RetryBrain(engine="transitions")``): the machine's transitions
    report to the brain's and the context's recorders themselves (``recorders`` is taken for
    the same signature as :func:`_fire_compiled`). Raises ``MachineError`` for a cell the
    machine does not declare."""
    event = _EVENTS.get(trigger)
    if event is None:  # unreachable for a validated declaration; as transitions says it
        raise MachineError(f"Can't trigger event {trigger} from state {p.state}!")
    event.trigger(p)


def _fire_compiled(p: _Policy, trigger: str, recorders: tuple[L.Recorder, ...] = ()) -> None:
    """Run ``trigger`` on ``p`` through :data:`_DISPATCH` (the ``compiled`` engine, the
    default): the same candidates, guards (in the machine's order, stopping at the first that
    fails), state change and effect as :func:`_fire_transitions`, at a fraction of the cost.
    With ``recorders`` it reports each candidate tried to them, the same records as the
    ``transitions`` engine reports (docs/policy.md §7). Raises ``MachineError`` for a cell
    the machine does not declare."""
    candidates = _DISPATCH.get((p.state, trigger))
    if candidates is None:  # unreachable for a validated declaration; as transitions says it
        raise MachineError(f"Can't trigger event {trigger} from state {p.state}!")
    if recorders:
        _fire_recorded(p, trigger, candidates, recorders)
        return
    for guards, effect, dest, _, _, _ in candidates:
        for name, expected in guards:
            if getattr(p, name)() != expected:  # transitions' Condition.check compares so
                break
        else:
            if dest is not None:
                p.state = dest
            if effect is not None:
                getattr(p, effect)()
            return


def _fire_recorded(p: _Policy, trigger: str, candidates: tuple[_Candidate, ...],
                   recorders: tuple[L.Recorder, ...]) -> None:
    source = p.state
    owner = p.owner
    for guards, effect, dest, row_id, labels, outcome in candidates:
        outcomes: list[tuple[str, bool]] = []
        passed = True
        for (name, expected), label in zip(guards, labels):
            passed = getattr(p, name)() == expected
            outcomes.append((label, passed))
            if not passed:
                break
        if not passed:
            L.report(recorders, owner, L.TransitionRecord(row_id, source, trigger, dest,
                                                          tuple(outcomes), "rejected", L.VERSION))
            continue
        if dest is not None:
            p.state = dest
        if effect is not None:
            getattr(p, effect)()
        L.report(recorders, owner, L.TransitionRecord(row_id, source, trigger, dest,
                                                      tuple(outcomes), outcome, L.VERSION))
        return


ENGINES: dict[str, Callable[[_Policy, str, tuple[L.Recorder, ...]], None]] = {
    "compiled": _fire_compiled,
    "transitions": _fire_transitions,
}
"""``RetryBrain(engine=)``: ``"compiled"`` (the default) runs the dispatch compiled from the
``transitions`` machine; ``"transitions"`` fires the machine itself. Same actions, states and
transition records (docs/policy.md §3)."""


# ---------------------------------------------------------------------------- the brain

class RetryBrain:
    """One session's retry state, decided by the declared machine (docs/policy.md §3).

    Args:
        settings: :class:`~fsm.core.settings.RetrySettings` (the defaults of §1 when None).
            ``retry.enabled`` is read live; ``maxAttempts`` is fixed when a chain starts.
        random: returns floats in [0, 1) for the jitter modes (inject for tests).
        engine: how the brain runs the ``transitions`` machine built from the declaration
            (:data:`fsm.core.lifecycle.MACHINE`): ``"compiled"`` (the default, for speed) runs
            a dispatch compiled from that machine; ``"transitions"`` fires the machine itself
            (slower). Both give the same actions, states and transition records
            (docs/policy.md §3). Raises ``ValueError`` naming any other value.

    Queries: :attr:`state` (a lifecycle state name), :attr:`attempt` (0 outside a chain),
    :attr:`chain_id`, :attr:`max_attempts`, :attr:`timer_id`, :attr:`is_retrying`,
    :attr:`is_backing_off`, :attr:`settings`. Facts: :meth:`turn_ended`,
    :meth:`backoff_elapsed`, :meth:`abort_retry` / :meth:`abort`, :meth:`retry_now`,
    :meth:`prompt_cancelled`, :meth:`continue_failed`; each returns the list of actions for
    the host, in order, possibly empty. Raises ``TypeError`` for bad settings.
    """

    __slots__ = ("_p",)

    def __init__(self, settings: RetrySettings | None = None, *,
                 random: Callable[[], float] = _random.random,
                 chain_ids: Callable[[], int] | None = None, engine: str = "compiled") -> None:
        if settings is not None and not isinstance(settings, RetrySettings):
            raise TypeError(f"settings must be RetrySettings, got {type(settings).__name__}")
        fire = ENGINES.get(engine) if isinstance(engine, str) else None
        if fire is None:
            raise ValueError(f"engine must be one of {', '.join(map(repr, ENGINES))}, "
                             f"got {engine!r:.80}")
        self._p = _Policy(self, settings or _DEFAULT_SETTINGS, random, fire)
        self._p.chain_ids = chain_ids

    @classmethod
    def in_state(cls, state: str, *, settings: RetrySettings | None = None, attempt: int = 1,
                 max_attempts: int | None = None, chain_id: int = 1, timer_id: int = 1,
                 chain_start_ms: int | None = None,
                 random: Callable[[], float] = _random.random,
                 engine: str = "compiled") -> "RetryBrain":
        """A brain placed in ``state`` (for tests and for hosts restoring a session).

        In ``backing_off`` / ``continuing``: at ``attempt`` of ``max_attempts`` (default the
        settings' ``maxRetries``), chain ``chain_id``, current timer ``timer_id``. At rest the
        attempt is 0. ``engine`` as for the constructor. Raises ``ValueError`` for an unknown
        state or engine, or impossible numbers.
        """
        if state not in L.STATES:
            raise ValueError(f"unknown state {state!r}; expected one of {', '.join(L.STATES)}")
        brain = cls(settings, random=random, engine=engine)
        p = brain._p
        p.state = state
        if state in L.IN_CHAIN:
            top = p.settings.max_retries if max_attempts is None else max_attempts
            if not 1 <= attempt <= top:
                raise ValueError(f"attempt must be within 1..{top}, got {attempt}")
            p.attempt, p.max, p.chain_id, p.timer = attempt, top, chain_id, timer_id
            p.chain_start_ms = chain_start_ms
        return brain

    # ------------------------------------------------------------------ queries
    @property
    def engine(self) -> str:
        """``"compiled"`` or ``"transitions"``: how this brain runs the machine (see the class)."""
        fire = self._p.engine
        return next(name for name, f in ENGINES.items() if f is fire)

    @property
    def state(self) -> str:
        return self._p.state

    @property
    def attempt(self) -> int:
        """1-based attempt inside a chain, 0 outside one."""
        return self._p.attempt

    @property
    def chain_id(self) -> int:
        """Number of chains started so far (the current one's id inside a chain)."""
        return self._p.chain_id

    @property
    def settings(self) -> RetrySettings:
        return self._p.settings

    @property
    def is_retrying(self) -> bool:
        """True while a chain is backing off or continuing."""
        return self._p.state in L.IN_CHAIN

    @property
    def waits_for_budget(self) -> bool:
        """True while the pending backoff waits for the shared retry budget in wait mode
        (``delaySource: "budget"``, docs/policy.md §13.7): when its timer fires the host asks
        the budget again and passes the answer to :meth:`backoff_elapsed`."""
        return self._p.state == L.BACKING_OFF and self._p.waiting_for == "budget"

    @property
    def is_backing_off(self) -> bool:
        return self._p.state == L.BACKING_OFF

    @property
    def max_attempts(self) -> int:
        """``maxAttempts`` of the current chain, or ``maxRetries`` of the settings outside one."""
        p = self._p
        return p.max if p.state in L.IN_CHAIN else p.settings.max_retries

    @property
    def model(self) -> str | None:
        """The model the current chain's attempts use (None = the primary or unnamed)."""
        return self._p.model if self._p.state in L.IN_CHAIN else None

    @property
    def timer_id(self) -> int:
        """The id of the current (or last) backoff timer."""
        return self._p.timer

    # ------------------------------------------------------------------ recording
    def add_recorder(self, recorder: L.Recorder) -> None:
        """Report every transition this brain tries to ``recorder(brain, record)`` (a
        :class:`fsm.core.lifecycle.TransitionRecord`), besides the context's recorders
        (:func:`fsm.core.lifecycle.recording`). Adding one twice adds it once."""
        p = self._p
        if recorder not in p.recs:
            p.recs = p.recs + (recorder,)

    def remove_recorder(self, recorder: L.Recorder) -> None:
        """Stop reporting to ``recorder``; an unknown one is ignored."""
        p = self._p
        p.recs = tuple(r for r in p.recs if r is not recorder)

    # ------------------------------------------------------------------ settings
    def update_settings(self, settings: RetrySettings) -> None:
        """Replace the settings; takes effect at the next decision. Raises ``TypeError``."""
        if not isinstance(settings, RetrySettings):
            raise TypeError(f"settings must be RetrySettings, got {type(settings).__name__}")
        self._p.settings = settings

    def set_enabled(self, enabled: bool) -> None:
        """``set_auto_retry_enabled``: a pending backoff is not cancelled (§3)."""
        self.update_settings(self._p.settings.with_enabled(enabled))

    # ------------------------------------------------------------------ facts
    def retries_unknown(self, cls: Classification) -> bool:
        """True when ``cls`` (an ``unknown`` failure: text no rule knows) starts a chain of one
        retry under ``retry.unknown: "once"`` at rest (docs/policy.md §1): a host gathers the
        facts of a retry for it (the budget, the cooldown), as for any retryable failure."""
        p = self._p
        return (cls.family == "unknown" and cls.kind == "fatal" and p.settings.unknown == "once"
                and p.state not in L.IN_CHAIN)

    def turn_ended(self, message: AssistantMessage, context_window: int = 0, *,
                   classification: Classification | None = None,
                   facts: TurnFacts | None = None) -> list[Action]:
        """A turn ended with ``message``; ``context_window`` in tokens (0 = unknown).

        The message is classified with :func:`fsm.core.classify.classify_message` unless
        ``classification`` is given, against the host's ``facts.now_ms`` and ``facts.zone``
        (never the machine's clock or zone); ``facts`` are what the host gathered before
        (§8b.2). Call this before any ``await`` once the facts are in (§8.1).
        """
        if classification is not None:
            cls = classification
        else:
            f = facts or _NO_FACTS
            cls = classify_message(message, context_window, now_ms=f.now_ms, zone=f.zone)
        p = self._p
        if self.retries_unknown(cls):
            # retry.unknown "once": text no rule knows starts a chain of one retry at attempt 1's
            # backoff; an unknown failure inside a chain stays fatal (docs/policy.md §1)
            cls = _UNKNOWN_ONCE
        trigger = L.TURN_ABORTED if message.stop_reason == "aborted" else _TRIGGER_BY_KIND[cls.kind]
        p.message, p.cls, p.facts = message, cls, facts or _NO_FACTS
        try:
            actions = self._fire(trigger)
            if cls.kind == "retryable":
                f = p.facts
                if f.budget_taken and f.budget_allows and not any(isinstance(a, StartBackoff) for a in actions):
                    actions.append(ReturnRetryToken())
                if p.settings.honors_hints and cls.retry_hint_ms and p.settings.enabled:
                    shared = min(cls.retry_hint_ms, MAX_SHARED_COOLDOWN_MS)
                    until = None if f.now_ms is None else f.now_ms + shared
                    actions.append(RecordCooldown(shared, until))
            return actions
        finally:
            p.message, p.cls, p.facts = None, None, _NO_FACTS

    def backoff_elapsed(self, timer_id: int, facts: TurnFacts | None = None) -> list[Action]:
        """The backoff timer ``timer_id`` fired; a stale id never continues.

        ``facts`` (optional): the budget's answer when the budget is in wait mode
        (``budget_allows``, ``budget_slot_ms``; docs/policy.md §13.7); a refusal waits for the
        next slot without a new ``auto_retry_start``.
        """
        p = self._p
        p.fact_timer = timer_id
        p.facts = facts or _NO_FACTS
        try:
            return self._fire(L.BACKOFF_ELAPSED)
        finally:
            p.facts = _NO_FACTS

    def deadline_passed(self, chain_id: int | None = None) -> list[Action]:
        """The chain's deadline (``retry.maxElapsedMs``) passed (docs/policy.md §13.2): a
        backoff is cancelled, a running attempt aborted (:class:`AbortAttempt`), and the chain
        ends ``deadline``; ignored at rest. A ``chain_id`` of an earlier chain is stale and
        returns no actions (as a cancelled timer would)."""
        if chain_id is not None and chain_id != self._p.chain_id:
            return []
        return self._fire(L.DEADLINE_PASSED)

    def request_refused(self, wait_ms: int, *, usage_limit: bool = False,
                        now_ms: int | None = None) -> list[Action]:
        """A first request was refused without sending (docs/policy.md §13.7): every
        credential cools down for ``wait_ms`` ms, beyond ``retry.maxHintWaitMs``. At rest the
        brain ends with one ``auto_retry_end {attempt: 0, endReason: "hint_too_long"}`` (with
        ``resetAt`` for a usage limit, and a ``chainId`` of its own, the next of the brain's chain
        ids, as every end at rest has); ignored inside a chain. Raises ``ValueError`` for a
        negative ``wait_ms``."""
        if isinstance(wait_ms, bool) or not isinstance(wait_ms, int) or wait_ms < 0:
            raise ValueError(f"wait_ms must be a non-negative int, got {wait_ms!r:.80}")
        self._p.refusal = (wait_ms, bool(usage_limit), now_ms)
        return self._fire(L.REQUEST_REFUSED)

    def abort_retry(self) -> list[Action]:
        """``abort_retry()``: cancels a pending backoff; ignored while a turn runs (§3)."""
        return self._fire(L.RETRY_CANCELLED)

    abort = abort_retry
    """``abort()`` cancels the retry first; the host then stops the running turn."""

    def retry_now(self) -> list[Action]:
        """Retry now: during a backoff, cancel the timer and continue at once (same attempt,
        no new ``auto_retry_start``; §8b.5); ignored elsewhere."""
        return self._fire(L.RETRY_REQUESTED)

    def prompt_cancelled(self) -> list[Action]:
        """The host's prompt task was cancelled: a chain in progress ends ``cancelled``."""
        return self._fire(L.PROMPT_CANCELLED)

    def continue_failed(self, reason: str) -> list[Action]:
        """The host's continue was rejected or raised, with ``reason`` as the final error."""
        self._p.reason = reason
        return self._fire(L.CONTINUE_FAILED)

    # ------------------------------------------------------------------ engine
    def _fire(self, trigger: str) -> list[Action]:
        p = self._p
        actions: list[Action] = []
        p.actions = actions
        p.plan = None
        p.source = p.state
        try:
            recs = p.recs
            p.engine(p, trigger, recs + _context_recorders() if recs else _context_recorders())
        finally:
            p.actions = []
            p.plan = None
        return actions

    def __repr__(self) -> str:
        p = self._p
        return f"<RetryBrain state={p.state} attempt={p.attempt} chain={p.chain_id}>"
