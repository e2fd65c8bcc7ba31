"""Run anyone's model call under the retry brain (docs/policy.md §10; docs/embedding.md).

The runner is one more host of the declared machine, thin on the
:class:`~fsm.host.kernel.HostKernel`: each call of :meth:`RetryRunner.run` gets its own
:class:`~fsm.core.brain.RetryBrain` and kernel, which gathers the facts of every end of an
attempt, hands it to the brain and carries out the actions it returns (events to
``on_event``, the coordinator's writes); the runner runs the backoff. Decisions, events and their order are the brain's; its transitions are
recorded and audited like the session's (a recorder receives the brain).

Shorthands::

    result = await fsm.retrying(client.chat.completions.create, model=..., messages=...)
    result = fsm.retrying_sync(client.messages.create, model=..., max_tokens=..., messages=...)

    @fsm.retry(settings={"maxRetries": 5, "retryHints": "honor"})
    async def ask(prompt): ...

What the callable does decides: it returns (a success), or raises. An exception is turned into
an assistant message with its structured facts (HTTP status, the provider's error type and
code, the headers; ``openai`` / ``anthropic`` SDK errors and ``httpx`` transport errors are
understood) and classified (docs/policy.md §2). A callable that returns a
:class:`~fsm.core.messages.AssistantMessage` (a :class:`~fsm.core.protocols.Provider`'s ``complete``) is
judged by the message. To retry errors that arrive inside a stream, the callable consumes the
stream.

Exceptions, in this order (docs/policy.md §10):

- a context overflow, first failure or inside a chain: :class:`ContextOverflowError` (the
  caller compacts and calls again);
- a first failure that starts no chain — fatal, retry disabled (``enabled: false``), or refused
  at rest (``maxRetries: 0``, a guard refused on the first failure; its ``auto_retry_end``
  with ``attempt: 0`` is emitted): the caller's own exception, re-raised (``except
  openai.RateLimitError`` keeps working), with a ``__notes__`` line naming why it was not
  retried (``retry-fsm: not retried (endReason: exhausted, attempt 0)``); for a returned
  failed message, the message is returned;
- a chain that started (attempt ≥ 1) and ends without success: :class:`RetryChainError` with
  ``end_reason``, ``attempts``, ``classification`` and the last exception as ``__cause__``;
- cancelling the task that awaits the call, or any other ``BaseException`` during a chain
  (``KeyboardInterrupt``, ``SystemExit``, ``GeneratorExit`` when the awaiting coroutine is
  closed, the caller's own): the chain ends ``cancelled``, its end event is emitted, and the
  exception propagates;
- a callable that returns no awaitable (:meth:`run`: a generator, None) or an awaitable
  (:meth:`run_sync`): a ``TypeError`` saying so, raised as it is on the first call and as
  the ``__cause__`` of a ``RetryChainError`` (``fatal``) when a chain runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
import random as _random
import time
import types
from collections.abc import Mapping
from typing import Any, Awaitable, Callable, TypeVar

from fsm.providers import sdk_errors as _sdk
from fsm.core import brain as B
from fsm.core.brain import RetryBrain, TurnFacts, seconds_text
from fsm.core.classify import Classification, classify_message
from fsm.core.events import AutoRetryEnd, Event
from fsm.core.messages import AssistantMessage
from fsm.core.redact import register_secret, request_secrets, scrub_exception
from fsm.core.text import safe_message
from fsm.core.settings import RetrySettings, SettingsError
from fsm.host.chain import RETRY_OWNER
from fsm.host.clock import wait_ms
from fsm.host.kernel import COORDINATOR_TIMEOUT_S, HostKernel, ZoneResolver, default_zone

__all__ = ["RetryRunner", "RetryChainError", "ContextOverflowError", "AttemptTimedOut", "retrying", "retrying_sync",
           "retry", "COORDINATOR_TIMEOUT_S"]

log = logging.getLogger("fsm.host.runner")

T = TypeVar("T")
EventListener = Callable[[Event], Any]

_OK = AssistantMessage("stop", timestamp_ms=0)
_OK_CLS = classify_message(_OK)  # what a returned value classifies as, once
_BACKOFF = (B.StartBackoff, B.SwitchModel, B.ArmDeadline)  # the host-loop actions the runner carries out
_RAISED = object()  # the callable raised before returning an awaitable
_COROUTINE = types.CoroutineType


PROGRAMMING_ERRORS: tuple[type[BaseException], ...] = (
    LookupError, AttributeError, TypeError, NameError, AssertionError, ArithmeticError,
    NotImplementedError, ImportError, SyntaxError)
"""Exception classes that mean a bug in the caller's code: fatal whatever their text."""


def _client_secrets(fn: Any) -> tuple[str, ...]:
    """The API key of the SDK client a bound method belongs to (``client.chat.completions
    .create``: the resource's ``_client.api_key``), else ``()``. Never raises."""
    try:
        owner = getattr(fn, "__self__", None)
        client = getattr(owner, "_client", None) or owner
        key = getattr(client, "api_key", None)
    except Exception:
        return ()
    return (key,) if isinstance(key, str) and key else ()


def _is_sdk_error(exc: BaseException) -> bool:
    module = type(exc).__module__ or ""
    return module.split(".", 1)[0] in ("openai", "anthropic", "httpx", "httpx2", "httpcore")


class RetryChainError(Exception):
    """A retry chain that started (attempt ≥ 1) ended without success. A refusal at rest
    (attempt 0) re-raises the caller's own exception instead (see the module docstring).

    Attributes: ``end_reason`` (the ``auto_retry_end`` ``endReason``: ``exhausted``,
    ``fatal``, ``disabled``, ``hint_too_long``, ``deadline``, ``budget``, ``output_streamed``,
    ``cancelled``…), ``attempts`` (the end event's ``attempt``: retries made in the chain, 0 for
    a refusal at rest), ``calls`` (times the callable was called), ``classification`` (the
    :class:`~fsm.core.classify.Classification` of the last failure), ``final_error`` (the end
    event's ``finalError``), ``message`` (the last failure as an assistant message). The last
    exception is ``__cause__``.
    """

    def __init__(self, end_reason: str, attempts: int, calls: int,
                 classification: Classification | None, final_error: str | None,
                 message: AssistantMessage | None) -> None:
        plural = "attempt" if attempts == 1 else "attempts"
        super().__init__(f"retry chain ended ({end_reason}) after {attempts} {plural}, "
                         f"{calls} calls: {final_error or ''}".rstrip(": "))
        self.end_reason = end_reason
        self.attempts = attempts
        self.calls = calls
        self.classification = classification
        self.final_error = final_error
        self.message = message


class DeadlinePassed(Exception):
    """The chain's deadline (``retry.maxElapsedMs``) passed while an attempt was running (or
    while the retry waited at the pacing gate, before it was sent): the attempt was aborted and
    the chain ended ``deadline`` (docs/policy.md §13.2). Private to the run loop, which raises
    :class:`RetryChainError` from it."""


class AttemptTimedOut(TimeoutError):
    """An attempt ran longer than ``retry.attemptTimeoutMs`` (docs/policy.md §13.2): a
    retryable failure (family ``timeout``), the ``__cause__`` of a chain that ends on it."""


class ContextOverflowError(Exception):
    """The request is larger than the model's context: compact and call again (never retried).

    Attributes as :class:`RetryChainError` (``end_reason`` is ``"overflow"`` inside a chain,
    None when the first call overflowed); the SDK's exception is ``__cause__``.
    """

    def __init__(self, end_reason: str | None, attempts: int, calls: int,
                 classification: Classification, message: AssistantMessage) -> None:
        super().__init__(f"context overflow ({classification.rule}): {message.error_message or ''}")
        self.end_reason = end_reason
        self.attempts = attempts
        self.calls = calls
        self.classification = classification
        self.final_error = message.error_message
        self.message = message


def _settings(settings: RetrySettings | Mapping[str, Any] | None) -> RetrySettings | None:
    settings = RetrySettings.coerce(settings)  # {"retry": {...}} or the inner object, camelCase
    if settings is not None:
        settings = _without_profile_watchdog(settings)
        for key, value in (("firstTokenTimeoutMs", settings.first_token_timeout_ms),
                           ("idleTimeoutMs", settings.idle_timeout_ms)):
            if value is not None:  # docs/policy.md §13.1: the runner sees no stream
                raise SettingsError(key, value, "null in the runner, which sees no stream "
                                    "(a stall watchdog needs the deltas; use attemptTimeoutMs)")
    return settings


def _without_profile_watchdog(settings: RetrySettings) -> RetrySettings:
    """The runner sees no stream: the stall watchdog a *profile* turns on (the resilient
    profile's ``idleTimeoutMs``) is left out here, while a stall key the user gave still
    raises (docs/policy.md §13.1). A value equal to the profile's counts as the profile's."""
    from fsm.core.settings import PROFILES
    profile = PROFILES.get(settings.profile, {})
    fields = {}
    for key, attr in (("firstTokenTimeoutMs", "first_token_timeout_ms"),
                      ("idleTimeoutMs", "idle_timeout_ms")):
        value = getattr(settings, attr)
        if value is not None and profile.get(key) == value:
            fields[attr] = None
    return dataclasses.replace(settings, **fields) if fields else settings


def _default_key(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> tuple[str, str]:
    module = getattr(fn, "__module__", None) or getattr(type(fn), "__module__", "") or "runner"
    model = kwargs.get("model")
    return module.split(".")[0] or "runner", model if isinstance(model, str) and model else "default"


class _Call(HostKernel):
    """One run: its brain and the host kernel around it (the call *is* the kernel: one object
    per call), the last failure, the pending end. Private."""

    __slots__ = ("runner", "calls", "exc", "message", "cls", "end", "delay", "timer",
                 "cached_key", "fn", "kwargs", "model", "deadline")

    def __init__(self, runner: "RetryRunner", fn: Callable[..., Any], kwargs: Mapping[str, Any],
                 sync: bool = False) -> None:
        # a sync run has no loop: no coordinator (docs/embedding.md)
        HostKernel.__init__(self, RetryBrain(runner.settings, random=runner.random),
                            emit=self.on_event, clock=runner.clock,
                            coordinator=None if sync else runner.coordinator,
                            key=self.coord_key, zone=runner.zone, use_coordinator=not sync,
                            random=runner.random, paces_at_send=True)
        self.runner = runner
        self.calls = 0
        self.exc: BaseException | None = None
        self.message: AssistantMessage | None = None
        self.cls: Classification | None = None
        self.end: AutoRetryEnd | None = None
        self.delay: int | None = None
        self.timer = 0
        self.cached_key: Any = None
        self.fn = fn
        self.kwargs = kwargs
        model = kwargs.get("model")
        self.model: str | None = model if isinstance(model, str) else None  # the model in use
        # (chain id, host time in ms) of the chain's deadline (retry.maxElapsedMs), once armed
        self.deadline: tuple[int, int] | None = None

    # -------------------------------------------------------------- an attempt ended
    def judge(self, result: Any, exc: BaseException | None
              ) -> tuple[AssistantMessage, Classification, int | None]:
        """The attempt's message, its classification and the host's time (None for a plain
        success, which needs no time)."""
        runner = self.runner
        if exc is not None:
            self.exc = exc
            message = runner.to_message(exc)
        elif isinstance(result, AssistantMessage):
            message = result
        else:
            return _OK, _OK_CLS, None  # a returned value: a success, whatever it is
        now = self.now_ms()
        if exc is not None and isinstance(exc, PROGRAMMING_ERRORS) and not _is_sdk_error(exc):
            # A bug in the caller's code is never transient, whatever its text says
            # (KeyError("overloaded") is not an overload).
            cls = Classification("fatal", "runner.programming_error")
        else:
            cls = self.classify(message, runner.context_window, now)
        if cls.kind != "none":
            # What events, RetryChainError and logs may show: credentials of any shape the
            # call was made with scrubbed, the text clipped as the session clips it.
            message = safe_message(message, self.secrets(exc))
            self.message, self.cls = message, cls
        return message, cls, now

    def secrets(self, exc: BaseException | None) -> tuple[str, ...]:
        """The runner's ``secrets``, the key of the callable's SDK client and the
        credentials the failed request carried (its headers and URL), all registered with
        the process's scrubbing layer (:mod:`fsm.core.redact`)."""
        found = request_secrets(exc) + _client_secrets(self.fn)
        if found:
            register_secret(*found)
        return self.runner.secrets + found

    def decide(self, message: AssistantMessage, cls: Classification, facts: TurnFacts | None) -> None:
        self.delay = None
        if facts is not None and self.model is not None:
            facts = dataclasses.replace(facts, model=self.model)
        self.perform(self.brain.turn_ended(message, self.runner.context_window,
                                           classification=cls, facts=facts),
                     self.host, _BACKOFF)

    def carry_out(self, actions: list[B.Action]) -> None:
        self.delay = None
        self.perform(actions, self.host, _BACKOFF)

    def on_event(self, event: Event) -> None:
        if type(event) is AutoRetryEnd:
            self.end = event
        self.runner._emit(event)

    def host(self, action: B.Action) -> None:
        if type(action) is B.StartBackoff:
            self.delay, self.timer = action.delay_ms, action.timer_id
        elif type(action) is B.ArmDeadline:
            # docs/policy.md §13.2: an attempt still running at the chain's deadline is aborted
            self.deadline = (action.chain_id, (self.now_ms() or 0) + action.delay_ms)
        elif type(action) is B.SwitchModel:
            # docs/policy.md §13.3: the next attempts call with model=<the fallback>; leaving
            # the primary writes its (runner-wide) fallback mark
            runner = self.runner
            if runner._fallback is None or runner._fallback[0] is None:
                now = self.now_ms() or 0
                runner._fallback = (None, now + action.revert_ms)
            self.model = action.to_model
            self.kwargs = {**self.kwargs, "model": action.to_model}
            runner._fallback = (action.to_model, runner._fallback[1])
        # EmitTurnEnd, DropFailedMessage, CheckCompaction, CancelBackoff, ContinueTurn,
        # PromptMayReturn: the runner has no turn events, no context and one loop.

    # -------------------------------------------------------------- the end
    def outcome(self, result: Any, cls: Classification) -> Any:
        end = self.end
        settled = (end is None and cls.kind == "none") or (end is not None and end.success)
        if self.exc is not None and not settled:
            # the caller's exception is re-raised or chained below: its text (and its causes')
            # is scrubbed in place of the credentials the call carried (fsm.core.redact); a
            # call that succeeded raises nothing, and pays nothing for it
            scrub_exception(self.exc, self.secrets(self.exc))
        if end is None:  # no chain: the brain settled the turn
            if cls.kind == "none":
                return result
            if cls.kind == "context_overflow":
                raise ContextOverflowError(None, 0, self.calls, cls, self.message) from self.exc
            if self.exc is not None:
                if cls.kind == "retryable" and not self.brain.settings.enabled:
                    self.exc.add_note("retry-fsm: not retried (retry.enabled is false)")
                raise self.exc
            return result
        if end.success:
            return result
        if end.attempt == 0 and end.end_reason != "overflow":
            # A refusal at rest (maxRetries 0, a guard refused on the first failure): no chain
            # started, so the caller's own exception, as for retry disabled, with the end
            # event's reason in its notes (docs/policy.md §10).
            if self.exc is not None:
                self.exc.add_note(f"retry-fsm: not retried (endReason: {end.end_reason}, attempt 0)")
                raise self.exc
            return result
        if end.end_reason == "overflow":
            raise ContextOverflowError("overflow", end.attempt, self.calls, self.cls,
                                       self.message) from self.exc
        raise RetryChainError(end.end_reason, end.attempt, self.calls, self.cls, end.final_error,
                              self.message) from self.exc

    def coord_key(self) -> Any:
        if self.cached_key is None:
            key = self.runner.key
            if key is None:
                from fsm.fleet import CoordKey
                key = CoordKey(*_default_key(self.fn, self.kwargs))
            self.cached_key = key
        return self.cached_key


class RetryRunner:
    """Runs callables under the retry brain; reusable and safe to share between tasks (each
    call has its own brain).

    Args:
        settings: :class:`~fsm.core.settings.RetrySettings`, or a mapping of the ``retry`` keys
            (``{"maxRetries": 5, "baseDelayMs": 500, "retryHints": "honor"}``); None = the
            defaults of docs/policy.md §1. ``SettingsError`` names a bad key and value.
        on_event: called with each :mod:`fsm.core.events` event (``auto_retry_start`` /
            ``auto_retry_end``), synchronously and in the brain's order; an exception it raises
            is logged, never breaks the chain.
        coordinator: the shared coordinator of docs/policy.md §9 (``before_decision``,
            ``learn_cooldown``, ``return_retry_token``, ``credit_success``), read before each
            decision within :data:`COORDINATOR_TIMEOUT_S` (late = decided on local state, as
            every host does: :mod:`fsm.host.kernel`), written after it; None =
            the in-process one every session and runner on the event loop shares, used only
            with ``retryHints: "honor"`` or a ``budget``. Its ``coordinator_unavailable`` /
            ``coordinator_restored`` events go to ``on_event`` while a call runs. Async runs
            only: :meth:`run_sync` refuses one and shares nothing.
        key: the coordinator's key for this call's provider account; None = the callable's
            top-level module (``openai``, ``anthropic``) and its ``model=`` argument.
        clock: a :class:`~fsm.host.clock.Clock` (``call_later`` for the backoff, ``time_ms`` for
            the time; :class:`~fsm.testing.FakeClock` in tests). None = asyncio's loop and
            ``time.time()``.
        sleep: ``await sleep(seconds)`` (async) or ``sleep(seconds)`` (sync) for the backoff,
            instead of the clock; :meth:`run_sync` defaults to ``time.sleep``.
        random: floats in [0, 1) for jitter (inject for tests).
        context_window: the model's context window in tokens, for the silent-overflow rule.
        to_message: ``to_message(exc) -> AssistantMessage``: how an exception reads (default:
            :func:`fsm.providers.sdk_errors.error_message`, the one mapping of SDK and transport errors).
        secrets: credentials that no event, log or :class:`RetryChainError` may show, of any
            shape (the callable's SDK client key and the credentials a failed request carried
            are found without being listed; ``sk-…`` keys and bearer tokens always are).
        zone: the time-zone resolver for reset times named in a zone
            (:func:`fsm.host.kernel.default_zone`; None = named zones are unknown).
    """

    def __init__(self, settings: RetrySettings | Mapping[str, Any] | None = None, *,
                 on_event: EventListener | None = None, coordinator: Any = None, key: Any = None,
                 clock: Any = None, sleep: Callable[[float], Any] | None = None,
                 random: Callable[[], float] = _random.random, context_window: int = 0,
                 to_message: Callable[[BaseException], AssistantMessage] | None = None,
                 zone: ZoneResolver | None = default_zone, secrets: Any = ()) -> None:
        if on_event is not None and not callable(on_event):
            raise TypeError(f"on_event must be callable, got {type(on_event).__name__}")
        if sleep is not None and not callable(sleep):
            raise TypeError(f"sleep must be callable, got {type(sleep).__name__}")
        if isinstance(context_window, bool) or not isinstance(context_window, int) or context_window < 0:
            raise ValueError(f"context_window must be a non-negative number of tokens, got {context_window!r}")
        self.settings = _settings(settings)
        self.on_event = on_event
        self.coordinator = coordinator
        self.key = key
        self.clock = clock
        self.sleep = sleep
        self.random = random
        self.context_window = context_window
        self.to_message = to_message or _sdk.error_message
        self.zone = zone
        if isinstance(secrets, str):
            secrets = (secrets,)
        self.secrets: tuple[str, ...] = tuple(v for v in secrets if isinstance(v, str) and v)
        register_secret(*self.secrets)
        self._fallback: tuple[str | None, int] | None = None  # (fallback in use, primary's mark)

    def _emit(self, event: Event) -> None:
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:  # a broken listener must not break the chain
                log.exception("on_event failed on %s", event.type)

    # -------------------------------------------------------------- async
    async def run(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        """``await fn(*args, **kwargs)`` under the brain; returns its result or raises as the
        module docstring says."""
        kwargs = self._model_for_new_call(kwargs)
        call = _Call(self, fn, kwargs)
        owner = RETRY_OWNER.set(call)  # a retrying transport under this call passes through
        try:
            if call.gates(first=True):
                await self._admit_first(call)
            while True:
                if call.brain.is_retrying:  # a retry whose backoff is over: the gate first
                    await self._pace_retry(call)
                call.calls += 1
                kwargs = call.kwargs  # a fallback model replaces model= (docs/policy.md §13.3)
                try:
                    pending = fn(*args, **kwargs)
                except Exception as failure:
                    pending, result, exc = _RAISED, None, failure
                if pending is not _RAISED:
                    if type(pending) is not _COROUTINE and not inspect.isawaitable(pending):
                        _close(pending)
                        # The caller's mistake: a fatal failure of this attempt, so that a
                        # chain already running ends (RetryChainError from this TypeError); a
                        # first call raises it as it is.
                        result, exc = None, TypeError(
                            f"{_name(fn)} returned {type(pending).__name__}, not an awaitable: use "
                            "fsm.retrying_sync (RetryRunner.run_sync) for a synchronous callable")
                    else:
                        try:
                            result, exc = await self._bounded(pending, call), None
                        except DeadlinePassed as passed:
                            # the chain already ended ``deadline``: what the caller sees
                            end = call.end
                            assert end is not None
                            raise RetryChainError(end.end_reason, end.attempt, call.calls, call.cls,
                                                  end.final_error, call.message) from passed
                        except Exception as failure:
                            result, exc = None, failure
                message, cls, now = call.judge(result, exc)
                if call.uses_coordinator():
                    call.record_outcome(cls)  # the pacer's signal (docs/fleet.md "Pacing")
                if cls.kind == "none":  # a success: the brain needs no fact of the world
                    facts = None
                else:  # nothing to ask the coordinator: no await on the common path
                    facts = call.quick_facts(cls, now_ms=now) or await call.gather(cls, now_ms=now)
                call.decide(message, cls, facts)
                if call.delay is None:
                    return call.outcome(result, cls)
                await self._wait(call.delay)
                if not call.brain.waits_for_budget:
                    call.carry_out(call.brain.backoff_elapsed(call.timer))
                elif not await self._recheck_budget(call):
                    return call.outcome(result, cls)
        except BaseException:
            # Cancellation, KeyboardInterrupt, SystemExit, GeneratorExit (the awaiting
            # coroutine closed) or any BaseException at any await: the chain that runs ends
            # ``cancelled`` (its auto_retry_end is emitted, synchronously: no await here), then
            # the exception goes on. Ignored by the brain when no chain runs.
            _end_chain(call)
            raise
        finally:
            RETRY_OWNER.reset(owner)
            call.close()

    async def _admit_first(self, call: _Call) -> None:
        """Admit the call's first attempt through the gate (the resilient profile,
        docs/fleet.md "First requests"; :meth:`~fsm.host.kernel.HostKernel.gate`): a known
        cooldown or the pacer's slot is waited out (a ``request_delayed`` event first); a
        cooldown beyond ``maxHintWaitMs`` refuses it: one ``auto_retry_end {attempt: 0,
        endReason: "hint_too_long"}`` and :class:`RetryChainError` (``calls`` 0, no
        ``__cause__``), the callable never called."""
        refused = await call.gate(self._gate_wait(call), first=True)
        if refused is not None:
            call.carry_out(call.brain.request_refused(refused[0], now_ms=refused[1]))
            end = call.end
            raise RetryChainError(end.end_reason if end else "hint_too_long", 0, 0, None,
                                  end.final_error if end else None, None)

    async def _pace_retry(self, call: _Call) -> None:
        """A retry whose backoff is over passes the gate right before it goes (docs/fleet.md
        "Pacing"): it waits for the key's cooldown and the fleet pacer's slot (each wait a
        ``request_delayed`` event; with no slot within the pacer's horizon it asks again after
        the jittered re-check). The chain's deadline (``maxElapsedMs``) reached while it waits
        ends the chain ``deadline`` as during an attempt: :class:`RetryChainError`, the
        callable not called again."""
        if not call.gates():
            return
        try:
            await call.gate(self._gate_wait(call))
        except DeadlinePassed as passed:
            end = call.end
            assert end is not None
            raise RetryChainError(end.end_reason, end.attempt, call.calls, call.cls,
                                  end.final_error, call.message) from passed

    def _gate_wait(self, call: _Call) -> Callable[[int], Awaitable[bool]]:
        """The runner's wait at the gate: ``delay_ms`` on its clock (or ``sleep``), cut short
        by the chain's deadline, which ends the chain (:class:`DeadlinePassed` raised)."""
        async def wait(delay_ms: int) -> bool:
            deadline = call.deadline if call.brain.is_retrying else None
            if deadline is not None:
                left = max(0, deadline[1] - (call.now_ms() or 0))
                if left < delay_ms:
                    await self._wait(left)
                    call.carry_out(call.brain.deadline_passed(deadline[0]))
                    raise DeadlinePassed(
                        f"the chain's deadline of retry.maxElapsedMs = "
                        f"{seconds_text(call.brain.settings.max_elapsed_ms or 0)} passed while "
                        "the retry waited for the fleet's pacing")
            await self._wait(delay_ms)
            return True
        return wait

    async def _recheck_budget(self, call: _Call) -> bool:
        """A retry waited for the budget's floor slot (wait mode, docs/policy.md §13.7): ask
        again, and wait again while it refuses. True: the retry goes; False: the chain ended."""
        while True:
            facts = await call.recheck_budget()
            actions = call.brain.backoff_elapsed(call.timer, facts)
            if facts.budget_taken and not any(isinstance(a, B.ContinueTurn) for a in actions):
                actions.append(B.ReturnRetryToken())  # the retry does not go after all
            call.carry_out(actions)
            if call.brain.waits_for_budget and call.delay is not None:
                await self._wait(call.delay)
                continue
            return call.brain.is_retrying

    def _model_for_new_call(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """A new call starts on the fallback in use until the primary's mark expires
        (``fallbackRevertMs``, docs/policy.md §13.3); only a call with ``model=`` is switched."""
        mark = self._fallback
        if mark is None or "model" not in kwargs:
            return kwargs
        entry, until = mark
        clock = self.clock
        now = clock.time_ms() if clock is not None and hasattr(clock, "time_ms") else int(time.time() * 1000)
        if entry is None or now >= until:
            self._fallback = None
            return kwargs
        return {**kwargs, "model": entry}

    async def _bounded(self, pending: Awaitable[Any], call: _Call) -> Any:
        """Await one attempt, bounded by ``attemptTimeoutMs`` (docs/policy.md §13.2): a timed
        out attempt raises :class:`AttemptTimedOut`, a retryable failure."""
        limit = call.brain.settings.attempt_timeout_ms
        deadline = call.deadline if call.brain.attempt >= 1 else None
        left = None if deadline is None else max(0, deadline[1] - (call.now_ms() or 0))
        if limit is None and left is None:
            return await pending
        task = asyncio.ensure_future(pending)
        fired: list[str] = []

        def expire(why: str) -> None:
            if not task.done() and not fired:
                fired.append(why)
                task.cancel()
        clock = self.clock if self.clock is not None else asyncio.get_running_loop()
        handles = [clock.call_later(ms / 1000, expire, why)
                   for ms, why in ((limit, "timeout"), (left, "deadline")) if ms is not None]
        try:
            return await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if fired and (me is None or not me.cancelling()):  # ours, not the caller's cancel
                if fired[0] == "deadline" and deadline is not None:
                    # the chain's deadline reached the attempt in flight: the chain ends
                    # ``deadline`` (the attempt is already aborted); the caller gets
                    # RetryChainError from the run loop
                    call.carry_out(call.brain.deadline_passed(deadline[0]))
                    raise DeadlinePassed(f"the chain's deadline of retry.maxElapsedMs = "
                                         f"{seconds_text(call.brain.settings.max_elapsed_ms or 0)} "
                                         "passed during the attempt") from None
                raise AttemptTimedOut(f"attempt timed out after {seconds_text(limit or 0)}") from None
            raise
        finally:
            for handle in handles:
                handle.cancel()
            if not task.done():
                task.cancel()

    async def _wait(self, delay_ms: int) -> None:
        if self.sleep is not None:
            await self.sleep(delay_ms / 1000)
        else:
            await wait_ms(self.clock, delay_ms)

    # -------------------------------------------------------------- sync
    def run_sync(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` under the brain, waiting with ``sleep`` (default
        ``time.sleep``); the same results and exceptions as :meth:`run`. A
        ``KeyboardInterrupt`` during a chain ends it ``cancelled`` and propagates."""
        if self.coordinator is not None:
            raise TypeError("a coordinator is async: use RetryRunner.run (or fsm.retrying) for it")
        if self.settings is not None and self.settings.attempt_timeout_ms is not None:
            raise TypeError("retry.attemptTimeoutMs needs an async call (a sync call cannot be "
                            "stopped): use RetryRunner.run (or fsm.retrying)")
        sleep = self.sleep or time.sleep
        kwargs = self._model_for_new_call(kwargs)
        call = _Call(self, fn, kwargs, sync=True)
        try:
            while True:
                call.calls += 1
                kwargs = call.kwargs
                try:
                    result, exc = fn(*args, **kwargs), None
                except Exception as failure:
                    result, exc = None, failure
                if inspect.isawaitable(result):
                    _close(result)  # never awaited: no "was never awaited" warning
                    result, exc = None, TypeError(f"{_name(fn)} returned an awaitable: use "
                                                  "fsm.retrying (RetryRunner.run) for an async callable")
                message, cls, now = call.judge(result, exc)
                call.decide(message, cls, None if cls.kind == "none"
                            else call.local_facts(now_ms=now))
                if call.delay is None:
                    return call.outcome(result, cls)
                sleep(call.delay / 1000)
                call.carry_out(call.brain.backoff_elapsed(call.timer))
        except BaseException:  # KeyboardInterrupt, SystemExit, ...: the chain ends first
            _end_chain(call)
            raise

    # -------------------------------------------------------------- decorator
    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorate ``fn`` (async or sync) so every call runs under this runner."""
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                return await self.run(fn, *args, **kwargs)
            return run_async

        @functools.wraps(fn)
        def run_blocking(*args: Any, **kwargs: Any) -> Any:
            return self.run_sync(fn, *args, **kwargs)
        return run_blocking


def _end_chain(call: _Call) -> None:
    """End the running chain (``cancelled``), if any, whatever stops the run; an exception
    raised while its end is emitted (a listener's BaseException) does not hide the first."""
    try:
        call.carry_out(call.brain.prompt_cancelled())  # ignored when no chain runs
    except BaseException:  # noqa: BLE001 - the exception that stopped the run goes on
        log.exception("ending the retry chain failed")


def _close(value: Any) -> None:
    """Close a coroutine or generator the runner will not run (no "never awaited" warning)."""
    if inspect.iscoroutine(value) or inspect.isgenerator(value):
        try:
            value.close()
        except Exception:  # noqa: BLE001 - its own clean-up failing is not the caller's error
            pass


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__



RUNNER_OPTIONS: tuple[str, ...] = ("settings", "on_event", "coordinator", "key", "clock", "sleep",
                                   "random", "context_window", "to_message")
"""The keywords :func:`retrying` and :func:`retrying_sync` keep for the runner (never passed to
the callable): :class:`RetryRunner`'s arguments."""


async def retrying(fn: Callable[..., Awaitable[T]], /, *args: Any,
                   settings: RetrySettings | Mapping[str, Any] | None = None,
                   on_event: EventListener | None = None, coordinator: Any = None,
                   key: Any = None, clock: Any = None, sleep: Callable[[float], Any] | None = None,
                   random: Callable[[], float] = _random.random, context_window: int = 0,
                   to_message: Callable[[BaseException], AssistantMessage] | None = None,
                   **kwargs: Any) -> T:
    """``await fn(*args, **kwargs)`` under the retry brain (see the module docstring).

    The keywords of :data:`RUNNER_OPTIONS` (``settings``, ``on_event``, ``coordinator``,
    ``key``, ``clock``, ``sleep``, ``random``, ``context_window``, ``to_message``) are the
    runner's, as :class:`RetryRunner` takes them, and never reach ``fn``; every other keyword
    goes to ``fn``. For a callable that itself takes one of those names, build a
    :class:`RetryRunner` and call :meth:`RetryRunner.run` (or pass a ``functools.partial``).
    """
    return await RetryRunner(settings, on_event=on_event, coordinator=coordinator, key=key,
                             clock=clock, sleep=sleep, random=random, context_window=context_window,
                             to_message=to_message).run(fn, *args, **kwargs)


def retrying_sync(fn: Callable[..., T], /, *args: Any,
                  settings: RetrySettings | Mapping[str, Any] | None = None,
                  on_event: EventListener | None = None, key: Any = None, clock: Any = None,
                  sleep: Callable[[float], Any] | None = None,
                  random: Callable[[], float] = _random.random, context_window: int = 0,
                  to_message: Callable[[BaseException], AssistantMessage] | None = None,
                  **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` under the retry brain, for synchronous callables; backoffs
    wait with ``sleep`` (default ``time.sleep``). The runner's keywords never reach ``fn``, as
    for :func:`retrying` (a sync run takes no ``coordinator``)."""
    return RetryRunner(settings, on_event=on_event, key=key, clock=clock, sleep=sleep,
                       random=random, context_window=context_window,
                       to_message=to_message).run_sync(fn, *args, **kwargs)


def retry(fn: Callable[..., Any] | None = None, /, *,
          settings: RetrySettings | Mapping[str, Any] | None = None, **options: Any) -> Any:
    """Decorator: ``@fsm.retry`` or ``@fsm.retry(settings=..., on_event=..., ...)`` over an
    async or a sync function (the options of :class:`RetryRunner`). Each call of the
    decorated function runs its own chain."""
    runner = RetryRunner(settings, **options)
    return runner if fn is None else runner(fn)
