"""Run anyone's model call under the retry brain (docs/policy.md §10; docs/embedding.md).

The runner is one more host of the declared machine: each call of :meth:`RetryRunner.run`
gets its own :class:`~fsm.core.brain.RetryBrain`, hands it every end of an attempt as a fact and
carries out the actions it returns (events to ``on_event``, the backoff timer, the
coordinator's writes). Decisions, events and their order are the brain's; its transitions are
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
- a first failure that starts no chain (fatal, retry disabled): the caller's own exception,
  re-raised unchanged (for a returned failed message: the message is returned);
- a chain (or a refusal at rest) that ends without success — every case where an
  ``auto_retry_end`` with ``success: false`` was emitted: :class:`RetryChainError` with
  ``end_reason``, ``attempts``, ``classification`` and the last exception as ``__cause__``;
- cancelling the task that awaits the call (or ``KeyboardInterrupt`` in :meth:`run_sync`)
  during a chain: the chain ends ``cancelled``, its end event is emitted, and the
  cancellation propagates.
"""

from __future__ import annotations

import asyncio
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
from fsm.core.brain import RetryBrain, TurnFacts
from fsm.core.classify import Classification, classify_message
from fsm.core.events import AutoRetryEnd, CoordinatorRestored, CoordinatorUnavailable, Event
from fsm.core.messages import AssistantMessage
from fsm.host import session as _session
from fsm.core.settings import RetrySettings, SettingsError

__all__ = ["RetryRunner", "RetryChainError", "ContextOverflowError", "AttemptTimedOut", "retrying", "retrying_sync",
           "retry", "COORDINATOR_TIMEOUT_S"]

log = logging.getLogger("fsm.host.runner")

T = TypeVar("T")
EventListener = Callable[[Event], Any]

COORDINATOR_TIMEOUT_S = _session.COORDINATOR_TIMEOUT_S
"""How long the runner waits for one coordinator read or write before it decides on local
state (docs/policy.md §8b.2): the session's bound."""

_OK = AssistantMessage("stop", timestamp_ms=0)
_RAISED = object()  # the callable raised before returning an awaitable
_COROUTINE = types.CoroutineType


PROGRAMMING_ERRORS: tuple[type[BaseException], ...] = (
    LookupError, AttributeError, TypeError, NameError, AssertionError, ArithmeticError,
    NotImplementedError, ImportError, SyntaxError)
"""Exception classes that mean a bug in the caller's code: fatal whatever their text."""


def _is_sdk_error(exc: BaseException) -> bool:
    module = type(exc).__module__ or ""
    return module.split(".", 1)[0] in ("openai", "anthropic", "httpx", "httpx2", "httpcore")


class RetryChainError(Exception):
    """A retry chain (or a policy refusal at rest) ended without success.

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
    if isinstance(settings, Mapping):
        settings = RetrySettings.from_json({"retry": settings})
    if settings is None or isinstance(settings, RetrySettings):
        if settings is not None:
            for key, value in (("firstTokenTimeoutMs", settings.first_token_timeout_ms),
                               ("idleTimeoutMs", settings.idle_timeout_ms)):
                if value is not None:  # docs/policy.md §13.1: the runner sees no stream
                    raise SettingsError(key, value, "null in the runner, which sees no stream "
                                        "(a stall watchdog needs the deltas; use "
                                        "attemptTimeoutMs)")
        return settings
    raise TypeError(f"settings must be RetrySettings or a mapping of retry keys such as "
                    f"{{'maxRetries': 5}}, got {type(settings).__name__}")


def _default_key(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> tuple[str, str]:
    module = getattr(fn, "__module__", None) or getattr(type(fn), "__module__", "") or "runner"
    model = kwargs.get("model")
    return module.split(".")[0] or "runner", model if isinstance(model, str) and model else "default"


class _Call:
    """The state of one run: its brain, the last failure, the pending end. Private."""

    __slots__ = ("runner", "brain", "calls", "exc", "message", "cls", "end", "delay", "timer",
                 "key", "fn", "kwargs", "coordinator", "unsubscribe", "sync", "model")

    def __init__(self, runner: "RetryRunner", fn: Callable[..., Any], kwargs: Mapping[str, Any],
                 sync: bool = False) -> None:
        self.runner = runner
        self.sync = sync  # a sync run has no loop: no coordinator (docs/embedding.md)
        self.brain = RetryBrain(runner.settings, random=runner.random)
        self.calls = 0
        self.exc: BaseException | None = None
        self.message: AssistantMessage | None = None
        self.cls: Classification | None = None
        self.end: AutoRetryEnd | None = None
        self.delay: int | None = None
        self.timer = 0
        self.key: Any = None
        self.fn = fn
        self.kwargs = kwargs
        self.coordinator: Any = None
        self.unsubscribe: Callable[[], None] | None = None
        model = kwargs.get("model")
        self.model: str | None = model if isinstance(model, str) else None  # the model in use

    # -------------------------------------------------------------- an attempt ended
    def judge(self, result: Any, exc: BaseException | None) -> tuple[AssistantMessage, Classification]:
        runner = self.runner
        if exc is not None:
            self.exc = exc
            message = runner.to_message(exc)
        elif isinstance(result, AssistantMessage):
            message = result
        else:
            message = _OK
        if exc is not None and isinstance(exc, PROGRAMMING_ERRORS) and not _is_sdk_error(exc):
            # A bug in the caller's code is never transient, whatever its text says
            # (KeyError("overloaded") is not an overload).
            cls = Classification("fatal", "runner.programming_error")
        else:
            cls = classify_message(message, runner.context_window)
        if cls.kind != "none":
            self.message, self.cls = message, cls
        return message, cls

    def decide(self, message: AssistantMessage, cls: Classification, facts: TurnFacts | None) -> None:
        self.perform(self.brain.turn_ended(message, self.runner.context_window,
                                           classification=cls, facts=facts))

    def perform(self, actions: list[B.Action]) -> None:
        self.delay = None
        for action in actions:
            kind = type(action)
            if kind is B.Emit:
                event = action.event
                if type(event) is AutoRetryEnd:
                    self.end = event
                self.runner._emit(event)
            elif kind is B.StartBackoff:
                self.delay, self.timer = action.delay_ms, action.timer_id
            elif (kind is B.RecordCooldown or kind is B.ReturnRetryToken
                  or kind is B.CreditRetryBudget) and not self.sync:
                self.runner._coordinator_write(self, action)
            elif kind is B.SwitchModel:
                # docs/policy.md §13.3: the next attempts call with model=<the fallback>
                if self.runner._fallback is None or self.runner._fallback[0] is None:
                    self.runner._fallback = (None, self.now_ms() + action.revert_ms)
                self.model = action.to_model
                self.kwargs = {**self.kwargs, "model": action.to_model}
                self.runner._fallback = (action.to_model, self.runner._fallback[1])
            # EmitTurnEnd, DropFailedMessage, CheckCompaction, CancelBackoff, ContinueTurn,
            # PromptMayReturn: the runner has no turn events, no context and one loop.

    def facts(self, **more: Any) -> TurnFacts:
        return TurnFacts(now_ms=self.now_ms(), model=self.model, **more)

    def now_ms(self) -> int:
        clock = self.runner.clock
        return clock.time_ms() if clock is not None else int(time.time() * 1000)

    # -------------------------------------------------------------- the end
    def outcome(self, result: Any, cls: Classification) -> Any:
        end = self.end
        if end is None:  # no chain: the brain settled the turn
            if cls.kind == "none":
                return result
            if cls.kind == "context_overflow":
                raise ContextOverflowError(None, 0, self.calls, cls, self.message) from self.exc
            if self.exc is not None:
                raise self.exc
            return result
        if end.success:
            return result
        if end.end_reason == "overflow":
            raise ContextOverflowError("overflow", end.attempt, self.calls, self.cls,
                                       self.message) from self.exc
        raise RetryChainError(end.end_reason, end.attempt, self.calls, self.cls, end.final_error,
                              self.message) from self.exc

    def coord_key(self) -> Any:
        if self.key is None:
            key = self.runner.key
            if key is None:
                from fsm.fleet import CoordKey
                key = CoordKey(*_default_key(self.fn, self.kwargs))
            self.key = key
        return self.key

    def coord(self) -> Any:
        """The coordinator of this call: the runner's, else the one every session and runner
        on this event loop shares (as the session's); its availability events are forwarded
        to ``on_event`` while the call runs."""
        if self.coordinator is None:
            self.coordinator = self.runner.coordinator or _session._loop_coordinator()
            subscribe = getattr(self.coordinator, "subscribe", None)
            if subscribe is not None and self.runner.on_event is not None:
                self.unsubscribe = subscribe(self._coordinator_event)
        return self.coordinator

    def _coordinator_event(self, event: Any) -> None:
        kind = event.get("type") if isinstance(event, Mapping) else getattr(event, "type", None)
        if kind == "coordinator_unavailable":
            reason = event.get("reason", "") if isinstance(event, Mapping) else event.reason
            self.runner._emit(CoordinatorUnavailable(str(reason)))
        elif kind == "coordinator_restored":
            self.runner._emit(CoordinatorRestored())

    def close(self) -> None:
        if self.unsubscribe is not None:
            self.unsubscribe()
            self.unsubscribe = None


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
            decision with a timeout of :data:`COORDINATOR_TIMEOUT_S`, written after it; None =
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
    """

    def __init__(self, settings: RetrySettings | Mapping[str, Any] | None = None, *,
                 on_event: EventListener | None = None, coordinator: Any = None, key: Any = None,
                 clock: Any = None, sleep: Callable[[float], Any] | None = None,
                 random: Callable[[], float] = _random.random, context_window: int = 0,
                 to_message: Callable[[BaseException], AssistantMessage] | None = None) -> None:
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
        try:
            while True:
                call.calls += 1
                kwargs = call.kwargs
                try:
                    pending = fn(*args, **kwargs)
                except Exception as failure:
                    pending, result, exc = _RAISED, None, failure
                if pending is not _RAISED:
                    if type(pending) is not _COROUTINE and not inspect.isawaitable(pending):
                        raise TypeError(f"{_name(fn)} returned {type(pending).__name__}, not an "
                                        "awaitable: use fsm.retrying_sync (RetryRunner.run_sync) "
                                        "for a synchronous callable")
                    try:
                        result, exc = await self._bounded(pending, call), None
                    except Exception as failure:
                        result, exc = None, failure
                message, cls = call.judge(result, exc)
                settings = call.brain.settings
                if (cls.kind == "retryable" and settings.enabled
                        and (settings.budget is not None or settings.honors_hints)):
                    facts = await self._gather(call)
                elif cls.kind == "none":  # a success: the brain needs no fact of the world
                    facts = None
                else:  # nothing to ask the coordinator: no await on the common path
                    facts = call.facts()
                call.decide(message, cls, facts)
                if call.delay is None:
                    return call.outcome(result, cls)
                await self._wait(call.delay)
                call.perform(call.brain.backoff_elapsed(call.timer))
        except asyncio.CancelledError:
            call.perform(call.brain.prompt_cancelled())  # ignored when no chain runs
            raise
        finally:
            call.close()

    def _model_for_new_call(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """A new call starts on the fallback in use until the primary's mark expires
        (``fallbackRevertMs``, docs/policy.md §13.3); only a call with ``model=`` is switched."""
        mark = self._fallback
        if mark is None or "model" not in kwargs:
            return kwargs
        entry, until = mark
        now = self.clock.time_ms() if self.clock is not None else int(time.time() * 1000)
        if entry is None or now >= until:
            self._fallback = None
            return kwargs
        return {**kwargs, "model": entry}

    async def _bounded(self, pending: Awaitable[Any], call: _Call) -> Any:
        """Await one attempt, bounded by ``attemptTimeoutMs`` (docs/policy.md §13.2): a timed
        out attempt raises ``TimeoutError("attempt timed out after N s")``, a retryable failure."""
        limit = call.brain.settings.attempt_timeout_ms
        if limit is None:
            return await pending
        task = asyncio.ensure_future(pending)
        fired: list[bool] = []

        def expire() -> None:
            if not task.done():
                fired.append(True)
                task.cancel()
        if self.clock is not None:
            handle = self.clock.call_later(limit / 1000, expire)
        else:
            handle = asyncio.get_running_loop().call_later(limit / 1000, expire)
        try:
            return await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if fired and (me is None or not me.cancelling()):  # ours, not the caller's cancel
                raise AttemptTimedOut(f"attempt timed out after {_session._seconds(limit)}") from None
            raise
        finally:
            handle.cancel()
            if not task.done():
                task.cancel()

    async def _wait(self, delay_ms: int) -> None:
        if self.sleep is not None:
            await self.sleep(delay_ms / 1000)
        elif self.clock is not None:
            future = asyncio.get_running_loop().create_future()
            handle = self.clock.call_later(delay_ms / 1000, _resolve, future)
            try:
                await future
            finally:
                handle.cancel()
        else:
            await asyncio.sleep(delay_ms / 1000)

    async def _gather(self, call: _Call) -> TurnFacts:
        """The coordinator's answer before the decision on a retryable failure with hints
        honoured or a budget (docs/policy.md §8b.2), as the session gathers it; a slow or
        failing coordinator leaves the local state."""
        now = call.now_ms()
        settings = call.brain.settings
        honor = settings.honors_hints
        try:
            left, ok = await asyncio.wait_for(
                call.coord().before_decision(call.coord_key(), now, settings.budget),
                COORDINATOR_TIMEOUT_S)
        except asyncio.TimeoutError:
            log.warning("coordinator did not answer in time: deciding on local state")
            return TurnFacts(now_ms=now, model=call.model)
        except Exception as exc:  # a coordinator must not break the chain: local state
            log.warning("coordinator failed: %s: %s", type(exc).__name__, exc)
            return TurnFacts(now_ms=now, model=call.model)
        return TurnFacts(now_ms=now, cooldown_ms=int(left or 0) if honor else 0,
                         budget_allows=ok is not False, budget_taken=ok is not None,
                         model=call.model)

    def _coordinator_write(self, call: _Call, action: B.Action) -> None:
        """The write a decision asked for, off the critical path (§8b.2); async runs only."""
        budget = call.brain.settings.budget
        if type(action) is B.RecordCooldown:
            if action.until_ms is None:
                return
            coro = call.coord().learn_cooldown(call.coord_key(), action.until_ms,
                                               action.until_ms - action.wait_ms)
        elif budget is None:
            return
        elif type(action) is B.ReturnRetryToken:
            coro = call.coord().return_retry_token(call.coord_key(), budget)
        else:
            coro = call.coord().credit_success(call.coord_key(), budget)
        task = asyncio.get_running_loop().create_task(_session._bounded(coro))
        _PENDING.add(task)
        task.add_done_callback(_PENDING.discard)

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
                    if inspect.iscoroutine(result):
                        result.close()  # never awaited: no "was never awaited" warning
                    raise TypeError(f"{_name(fn)} returned an awaitable: use fsm.retrying "
                                    "(RetryRunner.run) for an async callable")
                message, cls = call.judge(result, exc)
                call.decide(message, cls, call.facts())
                if call.delay is None:
                    return call.outcome(result, cls)
                sleep(call.delay / 1000)
                call.perform(call.brain.backoff_elapsed(call.timer))
        except (KeyboardInterrupt, asyncio.CancelledError):
            call.perform(call.brain.prompt_cancelled())
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


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


_PENDING: set[asyncio.Task] = set()  # the coordinator's writes in flight (kept alive)


async def retrying(fn: Callable[..., Awaitable[T]], /, *args: Any,
                   settings: RetrySettings | Mapping[str, Any] | None = None,
                   on_event: EventListener | None = None, coordinator: Any = None,
                   clock: Any = None, **kwargs: Any) -> T:
    """``await fn(*args, **kwargs)`` under the retry brain (see the module docstring).

    ``settings``, ``on_event``, ``coordinator`` and ``clock`` are the runner's (as
    :class:`RetryRunner`); every other keyword goes to ``fn``. For more options (``sleep``,
    ``random``, ``key``, ``context_window``) or a callable that itself takes one of those four
    names, build a :class:`RetryRunner` and call :meth:`RetryRunner.run`.
    """
    return await RetryRunner(settings, on_event=on_event, coordinator=coordinator,
                             clock=clock).run(fn, *args, **kwargs)


def retrying_sync(fn: Callable[..., T], /, *args: Any,
                  settings: RetrySettings | Mapping[str, Any] | None = None,
                  on_event: EventListener | None = None,
                  sleep: Callable[[float], Any] | None = None, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` under the retry brain, for synchronous callables; backoffs
    wait with ``sleep`` (default ``time.sleep``). As :func:`retrying` otherwise."""
    return RetryRunner(settings, on_event=on_event, sleep=sleep).run_sync(fn, *args, **kwargs)


def retry(fn: Callable[..., Any] | None = None, /, *,
          settings: RetrySettings | Mapping[str, Any] | None = None, **options: Any) -> Any:
    """Decorator: ``@fsm.retry`` or ``@fsm.retry(settings=..., on_event=..., ...)`` over an
    async or a sync function (the options of :class:`RetryRunner`). Each call of the
    decorated function runs its own chain."""
    runner = RetryRunner(settings, **options)
    return runner if fn is None else runner(fn)
