"""The one retry loop of a call, sans-IO: every host drives it (SPEC §15.1).

A call's retry chain — pass the gate, send the attempt, judge its outcome, gather the facts,
ask the brain, carry out its actions, wait, re-check the budget — is written once, here, as a
*stepper*: :meth:`RetryLoop.steps` is a generator that yields commands and receives their
results (docs/architecture.md "The loop"). It does no I/O and reads no clock of its own; the
driver does what the commands say:

========================  =====================================================  ==============
command                   the driver                                              answers
========================  =====================================================  ==============
:class:`Send`             runs attempt ``attempt`` (with ``model`` when switched)  :class:`Attempt`
:class:`Wait`             waits ``delay_ms`` (cancellable)                         True / False
:class:`Admit`            asks the coordinator, bounded by the one rule            :class:`Admitted`
:class:`Tell` (settle)    a coordinator write the step waits for (≤ 100 ms)        None
:class:`AskStore`         asks the credential store                                its value
========================  =====================================================  ==============

Other coordinator writes go to the loop's ``tell`` sink (fire and forget). The generator ends
with the call's outcome: it returns the result, or raises the exception of the contract
(docs/policy.md §10): a refusal at rest re-raises the caller's exception with a ``__notes__``
line; a chain that started raises :class:`~fsm.host.errors.RetryChainError`; an overflow
:class:`~fsm.host.errors.ContextOverflowError`. An exception thrown into it (a cancellation)
ends a running chain ``cancelled``, gives back a budget token held for a retry that will not
go, and goes on.

The budget token's give-back is one rule, here (SPEC §15.6, docs/fleet.md "Retry budget"): a
token taken for a retry that does not go is returned, whatever the order of the coordinator's
answer, the host's abort and the read's bound. The brain returns it when it decides against
the retry; the loop when the chain ends before the retry goes (a cancel, ``abort_retry``, the
deadline), when the brain's decision neither starts the retry nor returns it, and when the
host aborts (:meth:`RetryLoop.abort`) while the attempt's facts are being gathered — that
attempt's answer is then taken as aborted. A read that misses its bound, or whose waiter is
cancelled, gives back the token its late answer took (:mod:`fsm.host.kernel`).

Drivers: :func:`run_async` (asyncio: the runner, :class:`~fsm.host.chain.Chain`'s async steps),
:func:`run_sync` (a synchronous caller: coordinator commands at once for an in-process
coordinator, else on :func:`~fsm.host.kernel.coordinator_loop`), and any loop of your own —
the simulation drives it on virtual time (:mod:`fsm.sim.policies`):

.. skip: next "a shape of a driver of one's own: the scheduler, its clock and its coordinator answers are the reader's"

::

    loop = RetryLoop(settings, clock=my_clock, emit=print, tell=answer_at_once, ...)
    steps = loop.steps()
    command = steps.send(None)
    while True:                       # your scheduler decides when each answer is given
        if isinstance(command, Send):   answer = Attempt(result=...)   # or exc=...
        elif isinstance(command, Wait): answer = True                  # after delay_ms
        else:                           answer = answer_at_once(command)
        try:
            command = steps.send(answer)
        except StopIteration as done:
            result = done.value
            break
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import random as _random
from typing import Any, Awaitable, Callable, Protocol

from fsm.core import brain as B
from fsm.core.brain import RetryBrain, TurnFacts, seconds_text
from fsm.core.classify import Classification, classify_message
from fsm.core.events import AutoRetryEnd, Event
from fsm.core.messages import AssistantMessage
from fsm.core.redact import request_secrets, scrub_exception
from fsm.core.settings import RetrySettings
from fsm.core.text import safe_message
from fsm.host.errors import (PROGRAMMING_ERRORS, AttemptTimedOut, ContextOverflowError,
                             DeadlinePassed, RetryChainError)
from fsm.host.kernel import (Admit, Admitted, AskStore, Attempt, HostKernel, Send, Steps, Tell,
                             Wait, ZoneResolver, answer_async, answer_at_once, answer_sync,
                             coordinator_loop, default_zone, drive_async)

__all__ = ["RetryLoop", "Send", "Wait", "Admit", "Admitted", "Tell", "AskStore", "Attempt",
           "Clock", "bounded", "run_async", "run_sync", "drive_sync", "answer_async", "answer_sync",
           "answer_at_once", "tell_sync", "coordinator_loop", "next_chain_id", "SUCCESS",
           "ABORTED_TEXT"]

log = logging.getLogger("fsm.host.loop")


class Clock(Protocol):
    """The one clock convention of hosts (and the coordinators they create): ``time_ms()``,
    the time in epoch milliseconds (a test's :class:`~fsm.testing.FakeClock`, the
    simulation's virtual clock)."""

    def time_ms(self) -> int: ...


_CHAIN_IDS = itertools.count(1)


def next_chain_id() -> int:
    """The next chain id of this process (1, 2, …): unique per chain across every host and
    thread (``itertools.count`` steps atomically under the GIL), so that listeners keyed by
    ``chainId`` (OpenTelemetry spans) never merge two chains."""
    return next(_CHAIN_IDS)


SUCCESS = AssistantMessage("stop", timestamp_ms=0)
"""What a returned value reads as: a success, whatever it is."""
_SUCCESS_CLS = classify_message(SUCCESS)
_DEFAULT_SECRETS: Callable[[BaseException | None], tuple[str, ...]] = request_secrets


def _is_sdk_error(exc: BaseException) -> bool:
    module = type(exc).__module__ or ""
    return module.split(".", 1)[0] in ("openai", "anthropic", "httpx", "httpx2", "httpcore")


class RetryLoop(HostKernel):
    """One call's retry chain as a stepper (see the module docstring); the host kernel's
    facts, gate and actions, with the chain's own state.

    Args:
        settings: the chain's :class:`~fsm.core.settings.RetrySettings`.
        emit: ``emit(event)``, called with each :mod:`fsm.core.events` event in order.
        clock: a :class:`Clock` (``time_ms()`` epoch ms); None = the wall clock.
        coordinator: the fleet's coordinator; None = the in-process one of the event loop
            (asyncio hosts), created when first needed.
        key: ``key() -> CoordKey`` of the provider account the call goes to.
        to_message: ``to_message(exc) -> AssistantMessage``: how an exception reads.
        secrets: ``secrets(exc) -> tuple[str, ...]``: credentials no event or error may show
            (default: the credentials the failed request carried).
        model: the caller's model (``model=``), the primary of ``retry.fallbackModels``.
        on_switch: ``on_switch(action, now_ms)`` when the brain falls back
            (:class:`~fsm.core.brain.SwitchModel`): a host's marks across calls.
        tell: where the coordinator's writes go (default: background tasks on asyncio;
            :func:`answer_at_once` off it for an in-process coordinator).
        use_coordinator, zone, random, context_window: as :class:`~fsm.host.kernel.HostKernel`
            and :class:`~fsm.core.brain.RetryBrain`.
        gate_first: pass the first request through the gate (first-request admission,
            pacing); a host that cannot wait before its first request sets False.
        brain: the :class:`~fsm.core.brain.RetryBrain` to drive (a session's, which outlives
            its chains and is steered from outside: ``abort_retry``, ``retry_now``); None = a
            new one for this call. Either way its chain ids are :func:`next_chain_id`'s.
        credentials, scrub: as :class:`~fsm.host.kernel.HostKernel` (the credential store of
            the usage-limit path; how a text is made safe for an event).
        store_entry: ``(provider, session_id)``: the credential store's entry of this host.
        on_action: ``on_action(action)`` for every host-loop action the loop does not own
            (a session's turn: its end events, the failed message dropped, a cancelled
            backoff, a continue, "prompt may return", a compaction check, an aborted
            attempt), in the brain's order; None = a call, which has no turn.
        review: ``review(message, cls, facts) -> (message, cls, facts)`` right before the
            brain decides: a host's last word on the attempt's end (a session that was
            aborted while the facts came in; the context it keeps).
        gate_bypass: ``gate_bypass() -> bool``: True when the retry about to go skips the gate
            (a session's ``retry_now``, an abort: nothing to pace).
        aborted_message: ``aborted_message() -> AssistantMessage``: what an attempt's answer
            reads as when the host aborted while its facts were gathered (:meth:`abort`);
            None = a plain ``aborted`` message saying :data:`ABORTED_TEXT`.
    """

    __slots__ = ("listener", "calls", "exc", "message", "cls", "end", "model", "switched",
                 "deadline", "context_window", "to_message", "secrets", "on_switch",
                 "gate_first", "delay", "timer", "held", "started", "on_action", "review",
                 "gate_bypass", "store_entry", "generation", "at_gate", "undecided",
                 "aborted", "aborted_message")

    def __init__(self, settings: RetrySettings, *, emit: Callable[[Event], Any] | None = None,
                 clock: Clock | None = None, coordinator: Any = None,
                 key: Callable[[], Any] | None = None,
                 to_message: Callable[[BaseException], AssistantMessage] | None = None,
                 secrets: Callable[[BaseException | None], tuple[str, ...]] | None = None,
                 model: str | None = None,
                 on_switch: Callable[[B.SwitchModel, int], None] | None = None,
                 tell: Callable[[Tell], None] | None = None, use_coordinator: bool = True,
                 zone: ZoneResolver | None = default_zone,
                 random: Callable[[], float] = _random.random, context_window: int = 0,
                 gate_first: bool = True, brain: RetryBrain | None = None,
                 credentials: Any = None, scrub: Callable[[str], str] | None = None,
                 store_entry: tuple[str, str] = ("", ""),
                 on_action: Callable[[Any], None] | None = None,
                 review: Callable[[AssistantMessage, Classification, TurnFacts | None],
                                  tuple[AssistantMessage, Classification, TurnFacts | None]]
                 | None = None,
                 gate_bypass: Callable[[], bool] | None = None,
                 aborted_message: Callable[[], AssistantMessage] | None = None) -> None:
        if brain is None:
            brain = RetryBrain(settings, random=random, chain_ids=next_chain_id)
        HostKernel.__init__(self, brain, emit=self._on_event, clock=clock,
                            coordinator=coordinator, credentials=credentials, key=key, zone=zone,
                            use_coordinator=use_coordinator, random=random, paces_at_send=True,
                            **({} if scrub is None else {"scrub": scrub}))
        if tell is not None:
            self.tell = tell
        self.listener = emit
        self.calls = 0
        self.exc: BaseException | None = None
        self.message: AssistantMessage | None = None
        self.cls: Classification | None = None
        self.end: AutoRetryEnd | None = None
        self.model = model
        self.switched = False  # the brain fell back: Send carries the model
        self.deadline: tuple[int, int] | None = None  # (chain id, host ms) of maxElapsedMs
        self.context_window = context_window
        self.to_message = to_message
        self.secrets = secrets or _DEFAULT_SECRETS
        self.on_switch = on_switch
        self.gate_first = gate_first
        self.delay: int | None = None
        self.timer = 0
        self.held = False  # a budget token is held for a retry that has not gone yet
        self.started = False
        self.on_action = on_action
        self.review = review
        self.gate_bypass = gate_bypass
        self.store_entry = store_entry
        self.generation = 0  # which chain's steps are current (begin() moves it on)
        self.at_gate = False  # a request is at the gate (asking the coordinator or waiting)
        # an attempt's answer has come and the brain has not decided on it yet (its facts are
        # being gathered); the host aborted meanwhile (abort()): the answer is taken as aborted
        self.undecided = False
        self.aborted = False
        self.aborted_message = aborted_message

    def begin(self, model: str | None = None) -> None:
        """Start a new chain on this loop (a session's next prompt; its brain at rest): the
        chain's own state starts over, and steps of an earlier chain still suspended (a
        chain that ended during its backoff, whose driver has not resumed yet) become stale:
        they neither act nor end anything when resumed or closed."""
        self.generation += 1
        self.calls, self.exc, self.message, self.cls, self.end = 0, None, None, None, None
        self.model, self.switched, self.deadline = model, False, None
        self.delay, self.timer, self.held, self.started, self.at_gate = None, 0, False, False, False
        self.undecided = self.aborted = False

    def abort(self) -> bool:
        """The host aborted the chain (a session's ``abort()``, SPEC §15.6): an attempt whose
        answer has come while its facts are still being gathered (the coordinator's answer in
        flight) is taken as aborted when they come, and a budget token they took is given
        back. True when such an answer was waiting; elsewhere it changes nothing (an attempt
        still running is the host's to stop; a backoff is the brain's ``abort``)."""
        if self.undecided:
            self.aborted = True
        return self.undecided

    # ------------------------------------------------------------------ the steps
    def steps(self) -> Steps[Any]:
        """The chain, from the first request to its outcome (see the module docstring)."""
        brain = self.brain
        self.started = True
        generation = self.generation
        try:
            if self.gate_first and self.gates(first=True):
                refused = yield from self._gate(first=True)
                if refused is not None:
                    self.carry_out(brain.request_refused(refused[0], now_ms=refused[1]))
                    end = self.end
                    raise RetryChainError(end.end_reason if end else "hint_too_long", 0, 0, None,
                                          end.final_error if end else None, None)
            while True:
                if (brain.is_retrying and self.gates()  # a retry whose backoff is over
                        and not (self.gate_bypass is not None and self.gate_bypass())):
                    if (yield from self._gate(deadline_ms=self._deadline_left)) is not None:
                        raise self._deadline_passed("the retry waited for the fleet's pacing")
                self.calls += 1
                self.held = False  # the retry goes: its token is spent
                answer: Attempt = yield Send(
                    brain.attempt, self.model if self.switched else None,
                    brain.settings.attempt_timeout_ms,
                    self._deadline_left() if brain.attempt >= 1 else None)
                exc = answer.exc
                if answer.stopped == "ended":  # the host ended the chain (a continue failed)
                    return self.outcome(answer.result, self.cls or _SUCCESS_CLS)
                if answer.stopped == "deadline":
                    raise self._deadline_passed("during the attempt")
                if answer.stopped == "timeout":
                    exc = AttemptTimedOut("attempt timed out after "
                                          f"{seconds_text(brain.settings.attempt_timeout_ms or 0)}")
                self.undecided, self.aborted = True, False  # until the brain decides
                message, cls, now = self.judge(answer, exc)
                streamed = answer.output_streamed
                if self.use_coordinator and self.uses_coordinator():
                    self.record_outcome(cls, output_streamed=streamed)  # the pacer's signal
                if cls.kind == "none":
                    facts = None
                else:  # nothing to ask the coordinator: no await on the common path
                    provider, session_id = self.store_entry
                    facts = (self.quick_facts(cls, now_ms=now, output_streamed=streamed)
                             or (yield from self.gather_steps(cls, now_ms=now,
                                                              output_streamed=streamed,
                                                              provider=provider,
                                                              session_id=session_id)))
                aborted, self.undecided, self.aborted = self.aborted, False, False
                if aborted:
                    message, cls, facts = self._taken_as_aborted(message, cls, facts, now,
                                                                 streamed)
                if self.review is not None:
                    message, cls, facts = self.review(message, cls, facts)
                self.decide(message, cls, facts)
                if self.delay is None:
                    return self.outcome(answer.result, cls)
                goes = yield from self._backoff()
                if self.generation != generation:
                    return None  # a later chain owns the loop now: nothing of ours is left
                if not goes:
                    return self.outcome(answer.result, cls)
        except BaseException:
            # A cancellation, KeyboardInterrupt, GeneratorExit (the driver closed the steps) or
            # our own end: a running chain ends ``cancelled`` (ignored at rest), a held token
            # goes back, the exception goes on. Stale steps (a later chain began) end nothing.
            # (A coordinator answer still in flight is not ours: its driver gives back what
            # it took, fsm.host.kernel.)
            if self.generation == generation:
                self.undecided = self.aborted = False
                self._end_chain()
            raise

    def _taken_as_aborted(self, message: AssistantMessage, cls: Classification,
                          facts: TurnFacts | None, now: int | None, streamed: bool
                          ) -> tuple[AssistantMessage, Classification, TurnFacts]:
        """The host aborted while the attempt's facts came in (:meth:`abort`): its answer is
        aborted (docs/policy.md §8.8: once ``abort()`` returned, no answer is taken), decided
        on local facts; a token the facts took goes back, since no retry follows an abort
        (SPEC §15.6)."""
        if facts is not None and facts.budget_taken:
            self.give_back()
        when = facts.now_ms if facts is not None else now
        if when is None:
            when = self.now_ms()
        if message.stop_reason != "aborted":
            message = (self.aborted_message() if self.aborted_message is not None
                       else AssistantMessage("aborted", error_message=ABORTED_TEXT,
                                             model=self.model, timestamp_ms=when or 0))
            cls = self.classify(message, self.context_window, when)
        return message, cls, self.local_facts(now_ms=when, output_streamed=streamed)

    def _gate(self, **options: Any) -> Steps[tuple[int, int | None] | None]:
        """:meth:`~fsm.host.kernel.HostKernel.gate_steps`, with :attr:`at_gate` True meanwhile."""
        self.at_gate = True
        try:
            return (yield from self.gate_steps(**options))
        finally:
            self.at_gate = False

    def _pending(self) -> bool:
        """The backoff this loop waits for is still the brain's (not cancelled, not elapsed
        by a host's ``retry_now``, the chain not ended meanwhile)."""
        return self.brain.is_backing_off and self.brain.timer_id == self.timer

    def _backoff(self) -> Steps[bool]:
        """Wait out the brain's backoff (docs/policy.md §3): then the timer's fact, or the
        budget's re-check in wait mode. The host may act meanwhile (``abort_retry``,
        ``retry_now``, through :meth:`carry_out`): the wait's end is then not a fact.
        True: the retry goes; False: the chain ended."""
        brain = self.brain
        generation = self.generation
        if brain.waits_for_budget:
            if not (yield from self._wait_budget()) or self.generation != generation:
                return brain.is_retrying and self.generation == generation
            return (yield from self._recheck())
        yield Wait(self.delay or 0, "backoff")
        if self.generation != generation:
            return False
        if self._pending():
            self.carry_out(brain.backoff_elapsed(self.timer))
        return brain.is_retrying

    def elapse(self, timer_id: int) -> None:
        """The backoff timer ``timer_id`` fired in the host's own timer callback (a session,
        whose state must read ``continuing`` at once): the brain's ``backoff_elapsed`` now,
        carried out here; the steps, when they resume, find the retry continuing. A stale id
        changes nothing (the brain ignores it)."""
        self.carry_out(self.brain.backoff_elapsed(timer_id))

    def _wait_budget(self) -> Steps[bool]:
        """Wait for the budget's slot (:attr:`delay`), bounded by the chain's deadline: a
        deadline that comes first ends the chain ``deadline`` (docs/policy.md §13.2, §13.7).
        True: the slot is due and the brain still waits for it."""
        delay = self.delay or 0
        left = self._deadline_left()
        if left is not None and left < delay:
            yield Wait(left, "deadline")
            if self._pending():
                raise self._deadline_passed("while the retry waited for the shared retry budget")
            return False
        yield Wait(delay, "budget")
        return self._pending()

    def _recheck(self) -> Steps[bool]:
        """A retry waited for the budget's floor slot (wait mode, docs/policy.md §13.7): ask
        again, and wait again while it refuses. True: the retry goes; False: it ended."""
        brain = self.brain
        generation = self.generation
        while True:
            facts = yield from self.recheck_steps()
            if self.generation != generation or not self._pending():
                if facts.budget_taken:  # the chain moved on while the coordinator answered
                    self.give_back()
                return brain.is_retrying and self.generation == generation
            actions = brain.backoff_elapsed(self.timer, facts)
            goes = any(type(a) is B.ContinueTurn for a in actions)
            if facts.budget_taken and not goes:
                actions.append(B.ReturnRetryToken())  # the retry does not go after all
            self.carry_out(actions)
            if goes and facts.budget_taken:
                self.held = True
            if brain.waits_for_budget and self.delay is not None:
                if not (yield from self._wait_budget()) or self.generation != generation:
                    return brain.is_retrying and self.generation == generation
                continue
            return brain.is_retrying

    # ------------------------------------------------------------------ an attempt ended
    def judge(self, answer: Attempt, exc: BaseException | None
              ) -> tuple[AssistantMessage, Classification, int | None]:
        """The attempt's message, its classification and the host's time (None for a plain
        success, which needs no time)."""
        if exc is not None:
            self.exc = exc
            message = self.to_message(exc) if self.to_message is not None else SUCCESS
        elif answer.message is not None:
            message = answer.message
        elif isinstance(answer.result, AssistantMessage):  # a Provider's complete(): judged by it
            message = answer.result
        else:
            return SUCCESS, _SUCCESS_CLS, None  # a returned value: a success, whatever it is
        now = self.now_ms()
        if answer.classification is not None:
            cls = answer.classification
        elif exc is not None and isinstance(exc, PROGRAMMING_ERRORS) and not _is_sdk_error(exc):
            # A bug in the caller's code is never transient, whatever its text says.
            cls = Classification("fatal", "runner.programming_error")
        else:
            cls = self.classify(message, self.context_window, now)
        if cls.kind != "none":
            if answer.classification is None:  # what events and errors may show: scrubbed
                message = safe_message(message, self.secrets(exc) + answer_secrets(answer))
            self.message, self.cls = message, cls
        return message, cls, now

    def decide(self, message: AssistantMessage, cls: Classification,
               facts: TurnFacts | None) -> None:
        """Hand the attempt's end to the brain and carry out its actions. A budget token the
        facts took is the retry's until it goes (``held``); a decision that starts no
        retry and does not return the token itself returns it (SPEC §15.6)."""
        if facts is not None and self.model is not None:
            facts = dataclasses.replace(facts, model=self.model)
        actions = self.brain.turn_ended(message, self.context_window, classification=cls,
                                        facts=facts)
        taken = facts is not None and facts.budget_taken
        if taken and not any(type(a) in _TOKEN_SETTLED for a in actions):
            actions.append(B.ReturnRetryToken())  # no retry: the token goes back
        self.carry_out(actions)
        if self.delay is not None and taken:
            self.held = True  # the retry's token, until it goes

    def carry_out(self, actions: list[B.Action]) -> None:
        """Carry out ``actions`` (:meth:`~fsm.host.kernel.HostKernel.perform`); the host-loop
        ones the loop acts on: the backoff, the deadline in flight, the fallback switch."""
        self.delay = None
        self.perform(actions, self._host, None if self.on_action is not None else _LOOP_ACTIONS)
        if self.held and not self.brain.is_retrying:
            # the chain ended before its retry went (abort_retry, a cancel, the deadline during
            # the backoff): the token goes back (docs/fleet.md "Retry budget")
            self._give_back_held()

    def _host(self, action: B.Action) -> None:
        kind = type(action)
        if kind is B.StartBackoff:
            self.delay, self.timer = action.delay_ms, action.timer_id
        elif kind is B.ArmDeadline:
            # docs/policy.md §13.2: an attempt still running at the chain's deadline is aborted
            self.deadline = (action.chain_id, (self.now_ms() or 0) + action.delay_ms)
        elif kind is B.SwitchModel:  # docs/policy.md §13.3: the next attempts use the fallback
            if self.on_switch is not None:
                self.on_switch(action, self.now_ms() or 0)
            self.model, self.switched = action.to_model, True
        if self.on_action is not None:
            self.on_action(action)

    def _on_event(self, event: Event) -> None:
        if type(event) is AutoRetryEnd:
            self.end = event
        if self.listener is not None:
            self.listener(event)

    def _deadline_left(self) -> int | None:
        deadline = self.deadline if self.brain.is_retrying else None
        return None if deadline is None else max(0, deadline[1] - (self.now_ms() or 0))

    def _deadline_passed(self, when: str) -> RetryChainError:
        """The chain's deadline passed (docs/policy.md §13.2): the chain ends ``deadline``;
        the caller's error, its cause the :class:`DeadlinePassed`."""
        assert self.deadline is not None
        self.carry_out(self.brain.deadline_passed(self.deadline[0]))
        self._give_back_held()
        passed = DeadlinePassed(f"the chain's deadline of retry.maxElapsedMs = "
                                f"{seconds_text(self.brain.settings.max_elapsed_ms or 0)} passed "
                                f"{when}")
        end = self.end
        assert end is not None
        error = RetryChainError(end.end_reason, end.attempt, self.calls, self.cls,
                                end.final_error, self.message)
        error.__cause__ = passed
        return error

    def _give_back_held(self) -> None:
        if self.held:
            self.held = False
            self.give_back()

    def _end_chain(self) -> None:
        """End the running chain (``cancelled``), if any, whatever stops it; an exception
        raised while its end is emitted (a listener's) does not hide the first."""
        try:
            self._give_back_held()
            self.carry_out(self.brain.prompt_cancelled())  # ignored when no chain runs
        except BaseException:  # noqa: BLE001 - the exception that stopped the run goes on
            log.exception("ending the retry chain failed")

    # ------------------------------------------------------------------ the end
    def outcome(self, result: Any, cls: Classification) -> Any:
        """The call's outcome (docs/policy.md §10): the result, or the exception raised."""
        end = self.end
        settled = (end is None and cls.kind == "none") or (end is not None and end.success)
        if self.exc is not None and not settled:
            # the caller's exception is re-raised or chained below: its text (and its causes')
            # is scrubbed of the credentials the call carried (fsm.core.redact)
            scrub_exception(self.exc, self.secrets(self.exc))
        if end is None:  # no chain: the brain settled the turn
            if cls.kind == "none":
                return result
            if cls.kind == "context_overflow":
                raise ContextOverflowError(None, 0, self.calls, cls, self.message or SUCCESS) from self.exc
            if self.exc is not None:
                if cls.kind == "retryable" and not self.brain.settings.enabled:
                    self.exc.add_note("retry-fsm: not retried (retry.enabled is false)")
                raise self.exc
            return result
        if end.success:
            return result
        if end.attempt == 0 and end.end_reason != "overflow":
            # A refusal at rest (maxRetries 0, a guard refused on the first failure): no chain
            # started, so the caller's own exception, with the end's reason in its notes.
            if self.exc is not None:
                self.exc.add_note(f"retry-fsm: not retried (endReason: {end.end_reason}, attempt 0)")
                raise self.exc
            return result
        if end.end_reason == "overflow":
            raise ContextOverflowError("overflow", end.attempt, self.calls, self.cls or _SUCCESS_CLS,
                                       self.message or SUCCESS) from self.exc
        raise RetryChainError(end.end_reason, end.attempt, self.calls, self.cls, end.final_error,
                              self.message) from self.exc


def answer_secrets(answer: Attempt) -> tuple[str, ...]:
    """Credentials the host says the failed request carried (:attr:`Attempt.secrets`)."""
    return answer.secrets


_LOOP_ACTIONS = (B.StartBackoff, B.SwitchModel, B.ArmDeadline)
_TOKEN_SETTLED = (B.StartBackoff, B.ReturnRetryToken)
"""A decision with one of these has settled the token its facts took: the retry's, or back."""

ABORTED_TEXT = "Request was aborted"
"""The error text of an answer taken as aborted (docs/policy.md §8.8)."""
"""The host-loop actions the loop acts on; the others (turn events, the context, "prompt
may return") belong to a session's turn, which a call does not have."""


# ---------------------------------------------------------------------------- the drivers

async def run_async(steps: Steps[Any], send: Callable[[Send], Awaitable[Attempt]],
                    wait: Callable[[Wait], Awaitable[bool]]) -> Any:
    """Drive ``steps`` on asyncio: ``send`` runs an attempt, ``wait`` waits; coordinator
    commands are bounded by the one rule (:func:`~fsm.host.kernel.answer_async`)."""
    return await drive_async(steps, send=send, wait=wait)


async def bounded(pending: Awaitable[Any], command: Send, clock: Any = None, *,
                  passthrough: tuple[type[BaseException], ...] = ()) -> Attempt:
    """Await one attempt (``pending``: its coroutine or awaitable), bounded as ``command``
    says (docs/policy.md §13.2): ``Send.timeout_ms`` (``retry.attemptTimeoutMs``) and
    ``Send.deadline_ms`` (the time left before ``retry.maxElapsedMs``). The attempt is
    cancelled at the first bound and the loop told which: ``Attempt(stopped="timeout")`` or
    ``Attempt(stopped="deadline")``. Its result is ``Attempt(result=...)``, an exception it
    raises ``Attempt(exc=...)`` — save one of ``passthrough`` (control flow, not a failure),
    raised as it is. The bounds are timed with ``clock.call_later(seconds, callback, *args)``
    (None = the running event loop's). A cancellation of the awaiting task (not one of the
    bounds) is raised as it is, the attempt cancelled with it.

    Every asyncio host of the loop sends its attempts through this (the runner, the
    integrations' ``fsm.integrations._drive.drive_async``)."""
    limit, left = command.timeout_ms, command.deadline_ms
    if limit is None and left is None:
        try:
            return Attempt(result=await pending)
        except passthrough:
            raise
        except Exception as failure:
            return Attempt(exc=failure)
    task = asyncio.ensure_future(pending)
    fired: list[str] = []

    def expire(why: str) -> None:
        if not task.done() and not fired:
            fired.append(why)
            task.cancel()
    timer = clock if clock is not None and hasattr(clock, "call_later") else asyncio.get_running_loop()
    handles = [timer.call_later(ms / 1000, expire, why)
               for ms, why in ((limit, "timeout"), (left, "deadline")) if ms is not None]
    try:
        return Attempt(result=await task)
    except asyncio.CancelledError:
        me = asyncio.current_task()
        if fired and (me is None or not me.cancelling()):  # ours, not the caller's cancel
            return Attempt(stopped=fired[0])
        raise
    except passthrough:
        raise
    except Exception as failure:
        return Attempt(exc=failure)
    finally:
        for handle in handles:
            handle.cancel()
        if not task.done():
            task.cancel()


def drive_sync(steps: Steps[Any], *, send: Callable[[Send], Attempt] | None = None,
               wait: Callable[[Wait], bool] | None = None) -> Any:
    """Drive ``steps`` without an event loop: ``send`` runs an attempt, ``wait`` waits (a
    sync sleep); coordinator commands by :func:`~fsm.host.kernel.answer_sync`. An exception a
    command raises (``KeyboardInterrupt``) is thrown into the steps."""
    step: Callable[[Any], Any] = steps.send
    value: Any = None
    while True:
        try:
            command = step(value)
        except StopIteration as stop:
            return stop.value
        try:
            kind = type(command)
            if kind is Send:
                assert send is not None, "these steps send no request"
                value = send(command)
            elif kind is Wait:
                assert wait is not None, "these steps wait for nothing"
                value = wait(command)
            elif kind is AskStore:
                raise TypeError("a synchronous host asks no credential store")
            else:
                value = answer_sync(command)
            step = steps.send
        except BaseException as exc:  # noqa: BLE001 - thrown into the steps, which re-raise
            value, step = exc, steps.throw


run_sync = drive_sync


def tell_sync(command: Tell) -> None:
    """The coordinator's writes of a host without an event loop: at once for an in-process
    coordinator, else in the background on :func:`coordinator_loop` (never waited for)."""
    if getattr(command.coordinator, "answers_at_once", False) is True:
        answer_at_once(command)
        return
    asyncio.run_coroutine_threadsafe(answer_async(command), coordinator_loop())
