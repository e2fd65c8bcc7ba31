"""Run anyone's model call under the retry brain (docs/policy.md §10; docs/embedding.md).

The runner is one more host of the declared machine: each call of :meth:`RetryRunner.run` (or
:meth:`RetryRunner.run_sync`) gets its own :class:`~fsm.host.loop.RetryLoop` — the one loop
every host drives (the brain, the facts, the gate, the actions) — and drives it: the runner
calls the callable and waits. Decisions, events and their order are the brain's; its
transitions are recorded and audited like the session's.

Shorthands (the SDK clients with ``max_retries=0``: one retry owner, the brain)::

    import anthropic
    import openai
    import fsm

    messages = [{"role": "user", "content": "hi"}]
    client = openai.AsyncOpenAI(max_retries=0)
    result = await fsm.retrying(client.chat.completions.create, model="gpt-5", messages=messages)
    claude = anthropic.Anthropic(max_retries=0)                 # a sync client: the sync entry
    result = fsm.retrying_sync(claude.messages.create, model="claude-sonnet-4-5",
                               max_tokens=100, messages=messages)

    @fsm.retry(settings={"maxRetries": 5, "retryHints": "honor"})
    async def ask(prompt: str) -> str | None:
        reply = await client.chat.completions.create(
            model="gpt-5", messages=[{"role": "user", "content": prompt}])
        return reply.choices[0].message.content

    print(await ask("hello"))

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
  the ``__cause__`` of a ``RetryChainError`` (``fatal``) when a chain runs;
- :meth:`run` (``fsm.retrying``) refuses a known synchronous SDK resource (a method of an
  ``openai.OpenAI`` / ``anthropic.Anthropic`` client) before calling it, and a synchronous
  function that raises on its first call (it is not retried 4 times on the event loop): a
  ``TypeError`` naming ``fsm.retrying_sync``.
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
from typing import Any, Awaitable, Callable, Coroutine, ParamSpec, TypeVar, overload

from fsm.providers import sdk_errors as _sdk
from fsm.core import brain as B
from fsm.core.events import Event
from fsm.core.messages import AssistantMessage
from fsm.core.redact import register_secret, request_secrets
from fsm.core.settings import PROFILES, RetrySettings, SettingsError
from fsm.host.clock import wait_ms
from fsm.host.errors import (PROGRAMMING_ERRORS, RETRY_OWNER, AttemptTimedOut,
                             ContextOverflowError, DeadlinePassed, RetryChainError)
from fsm.host.kernel import COORDINATOR_TIMEOUT_S, ZoneResolver, default_zone, drive_async
from fsm.host.loop import Attempt, RetryLoop, Send, Wait, bounded, drive_sync, tell_sync

__all__ = ["RetryRunner", "RetryChainError", "ContextOverflowError", "AttemptTimedOut",
           "DeadlinePassed", "PROGRAMMING_ERRORS", "retrying", "retrying_sync", "retry",
           "COORDINATOR_TIMEOUT_S"]

log = logging.getLogger("fsm.host.runner")

T = TypeVar("T")
P = ParamSpec("P")
EventListener = Callable[[Event], Any]

_COROUTINE = types.CoroutineType


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


def _settings(settings: RetrySettings | Mapping[str, Any] | None) -> RetrySettings | None:
    settings = RetrySettings.coerce(settings)  # {"retry": {...}} or the inner object, camelCase
    if settings is not None:
        settings = _without_profile_watchdog(settings)
        stall = [(key, value) for key, value in (
            ("firstTokenTimeoutMs", settings.first_token_timeout_ms),
            ("idleTimeoutMs", settings.idle_timeout_ms))]
        stall += [(f'providers["{name}"].{key}', entry.get(key))
                  for name, entry in settings.providers
                  for key in ("firstTokenTimeoutMs", "idleTimeoutMs")]
        for key, value in stall:
            if value is not None:  # docs/policy.md §13.1: the runner sees no stream
                raise SettingsError(key, value, "null in the runner, which sees no stream "
                                    "(a stall watchdog needs the deltas; use attemptTimeoutMs)")
    return settings


def _without_profile_watchdog(settings: RetrySettings) -> RetrySettings:
    """The runner sees no stream: the stall watchdog a *profile* turns on (the resilient
    profile's ``idleTimeoutMs``) is left out here, while a stall key the user gave still
    raises (docs/policy.md §13.1). A value equal to the profile's counts as the profile's."""
    profile = PROFILES.get(settings.profile)
    if not profile:  # the seed profile turns no watchdog on
        return settings
    fields = {}
    for key, attr in (("firstTokenTimeoutMs", "first_token_timeout_ms"),
                      ("idleTimeoutMs", "idle_timeout_ms")):
        value = getattr(settings, attr)
        if value is not None and profile.get(key) == value:
            fields[attr] = None
    return dataclasses.replace(settings, **fields) if fields else settings


_DEFAULT_SETTINGS = RetrySettings()
"""The settings of a runner given none (docs/policy.md §1's defaults); immutable, so shared."""


def _default_key(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> tuple[str, str]:
    module = getattr(fn, "__module__", None) or getattr(type(fn), "__module__", "") or "runner"
    model = kwargs.get("model")
    return module.split(".")[0] or "runner", model if isinstance(model, str) and model else "default"


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
        coordinator: the shared coordinator (docs/fleet.md), read before each decision within
            :data:`COORDINATOR_TIMEOUT_S` (late = decided on local state, as every host does:
            :mod:`fsm.host.loop`), written after it; None = the in-process one every session
            and runner on the event loop shares, used only with ``retryHints: "honor"``, a
            ``budget`` or pacing. Its ``coordinator_unavailable`` / ``coordinator_restored``
            events go to ``on_event`` while a call runs. :meth:`run_sync` asks a given
            coordinator at once (in-process) or on the process's background coordinator loop;
            without one it shares nothing.
        key: the coordinator's key for this call's provider account; None = the callable's
            top-level module (``openai``, ``anthropic``) and its ``model=`` argument. Its
            provider and model also pick the ``retry.providers`` entries each call runs on
            (:meth:`~fsm.RetrySettings.for_provider`, docs/policy.md §13.4).
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

    def _loop(self, fn: Callable[..., Any], kwargs: Mapping[str, Any], *, sync: bool) -> RetryLoop:
        """The one loop of this call (:class:`~fsm.host.loop.RetryLoop`)."""
        cached: list[Any] = []

        def key() -> Any:
            if not cached:
                key = self.key
                if key is None:
                    from fsm.fleet import CoordKey  # the fleet sits below the host
                    key = CoordKey(*_default_key(fn, kwargs))
                cached.append(key)
            return cached[0]

        def secrets(exc: BaseException | None) -> tuple[str, ...]:
            # the runner's, the key of the callable's SDK client and the credentials the failed
            # request carried, registered with the process's scrubbing layer
            found = request_secrets(exc) + _client_secrets(fn)
            if found:
                register_secret(*found)
            return self.secrets + found

        model = kwargs.get("model")
        settings = self.settings or _DEFAULT_SETTINGS
        if settings.providers:  # the entries of the call's provider and model (§13.4)
            given = self.key
            provider, name = ((getattr(given, "provider", None), getattr(given, "model", None))
                              if given is not None else _default_key(fn, kwargs))
            settings = settings.for_provider(provider, name if name != "default" else None)
        return RetryLoop(settings, emit=self._emit, clock=self.clock,
                         coordinator=self.coordinator, key=key, to_message=self.to_message,
                         secrets=secrets, model=model if isinstance(model, str) else None,
                         on_switch=self._switched, zone=self.zone, random=self.random,
                         context_window=self.context_window,
                         use_coordinator=not sync or self.coordinator is not None,
                         tell=tell_sync if sync else None)

    def _switched(self, action: B.SwitchModel, now_ms: int) -> None:
        """docs/policy.md §13.3: leaving the primary writes the runner-wide fallback mark (new
        calls start on the fallback until it expires, ``fallbackRevertMs``)."""
        if self._fallback is None or self._fallback[0] is None:
            self._fallback = (None, now_ms + action.revert_ms)
        self._fallback = (action.to_model, self._fallback[1])

    # -------------------------------------------------------------- async
    async def run(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``await fn(*args, **kwargs)`` under the brain; returns its result or raises as the
        module docstring says. A known synchronous SDK resource (``openai.OpenAI().chat.
        completions.create``) is refused before it is called (``TypeError`` naming
        :func:`retrying_sync`)."""
        _refuse_sync_resource(fn)
        kwargs = self._model_for_new_call(kwargs)  # type: ignore[assignment]
        loop = self._loop(fn, kwargs, sync=False)
        owner = RETRY_OWNER.set(loop)  # a retrying transport under this call passes through

        async def send(command: Send) -> Attempt:
            call = kwargs if command.model is None else {**kwargs, "model": command.model}
            try:
                pending = fn(*args, **call)  # type: ignore[arg-type]
            except Exception as failure:
                if loop.calls == 1 and not _is_async_callable(fn):
                    # a synchronous function that raised: it is not retried on the event loop
                    raise TypeError(f"{_name(fn)} raised before returning an awaitable (it is "
                                    "synchronous): use fsm.retrying_sync (RetryRunner.run_sync) "
                                    "for a synchronous callable") from failure
                return Attempt(exc=failure)
            if type(pending) is not _COROUTINE and not inspect.isawaitable(pending):
                _close(pending)
                # The caller's mistake: a fatal failure of this attempt, so that a chain already
                # running ends (RetryChainError from this TypeError); a first call raises it.
                return Attempt(exc=TypeError(
                    f"{_name(fn)} returned {type(pending).__name__}, not an awaitable: use "
                    "fsm.retrying_sync (RetryRunner.run_sync) for a synchronous callable"))
            if command.timeout_ms is None and command.deadline_ms is None:
                try:  # nothing bounds the attempt: awaited here, one coroutine fewer
                    return Attempt(result=await pending)
                except Exception as failure:
                    return Attempt(exc=failure)
            return await bounded(pending, command, self.clock)

        sleep = self.sleep

        async def wait(command: Wait) -> bool:
            if sleep is not None:
                await sleep(command.delay_ms / 1000)
            else:
                await wait_ms(self.clock, command.delay_ms)
            return True

        try:
            return await drive_async(loop.steps(), send=send, wait=wait)
        finally:
            RETRY_OWNER.reset(owner)
            loop.close()

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

    # -------------------------------------------------------------- sync
    def run_sync(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` under the brain, waiting with ``sleep`` (default
        ``time.sleep``); the same loop, results and exceptions as :meth:`run`. A
        ``KeyboardInterrupt`` during a chain ends it ``cancelled`` and propagates."""
        sleep = self.sleep or time.sleep
        kwargs = self._model_for_new_call(kwargs)  # type: ignore[assignment]
        loop = self._loop(fn, kwargs, sync=True)
        if loop.brain.settings.attempt_timeout_ms is not None:
            loop.close()
            raise TypeError("retry.attemptTimeoutMs needs an async call (a sync call cannot be "
                            "stopped): use RetryRunner.run (or fsm.retrying)")

        def send(command: Send) -> Attempt:
            call = kwargs if command.model is None else {**kwargs, "model": command.model}
            try:
                result = fn(*args, **call)  # type: ignore[arg-type]
            except Exception as failure:
                return Attempt(exc=failure)
            if inspect.isawaitable(result):
                _close(result)  # never awaited: no "was never awaited" warning
                return Attempt(exc=TypeError(f"{_name(fn)} returned an awaitable: use "
                                             "fsm.retrying (RetryRunner.run) for an async callable"))
            return Attempt(result=result)

        def wait(command: Wait) -> bool:
            sleep(command.delay_ms / 1000)
            return True

        try:
            return drive_sync(loop.steps(), send=send, wait=wait)  # type: ignore[no-any-return]
        finally:
            loop.close()

    # -------------------------------------------------------------- decorator
    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]: ...
    @overload
    def __call__(self, fn: Callable[P, T]) -> Callable[P, T]: ...

    def __call__(self, fn: Callable[P, Any]) -> Callable[P, Any]:
        """Decorate ``fn`` so every call runs under this runner: :meth:`run` for a coroutine
        function (``inspect.iscoroutinefunction``), :meth:`run_sync` for any other."""
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def run_async_(*args: P.args, **kwargs: P.kwargs) -> Any:
                return await self.run(fn, *args, **kwargs)
            return run_async_

        @functools.wraps(fn)
        def run_blocking(*args: P.args, **kwargs: P.kwargs) -> Any:
            return self.run_sync(fn, *args, **kwargs)
        return run_blocking


_SYNC_CLIENTS = ("SyncAPIClient",)
"""The base class of the ``openai`` and ``anthropic`` SDKs' synchronous clients."""


def _refuse_sync_resource(fn: Any) -> None:
    """Raise ``TypeError`` for a known synchronous SDK resource (a bound method of a resource
    whose ``_client`` is an ``openai.OpenAI`` / ``anthropic.Anthropic``) before it is called:
    its call would block the event loop (SPEC §15.13, "Sync and async")."""
    try:
        owner = getattr(fn, "__self__", None)
        client = getattr(owner, "_client", None) or owner
        mro = type(client).__mro__ if client is not None else ()
    except Exception:
        return
    for cls in mro:
        if cls.__name__ in _SYNC_CLIENTS and (cls.__module__ or "").split(".", 1)[0] in ("openai", "anthropic"):
            raise TypeError(f"{_name(fn)} belongs to a synchronous {type(client).__name__} client: "
                            "use fsm.retrying_sync (RetryRunner.run_sync) for it, or its async "
                            "client with fsm.retrying")


def _is_async_callable(fn: Any) -> bool:
    """True when ``fn`` is known to give an awaitable: a coroutine function (through
    ``functools.partial`` and ``__call__`` too) or a bound method of an async SDK resource."""
    target = fn
    while isinstance(target, functools.partial):
        target = target.func
    if inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(getattr(target, "__call__", None)):
        return True
    return not inspect.isfunction(target) and not inspect.ismethod(target)


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
    The result's type is ``fn``'s (a type checker sees ``await retrying(f, ...)`` as ``f``'s).
    """
    return await RetryRunner(settings, on_event=on_event, coordinator=coordinator, key=key,
                             clock=clock, sleep=sleep, random=random, context_window=context_window,
                             to_message=to_message).run(fn, *args, **kwargs)


def retrying_sync(fn: Callable[..., T], /, *args: Any,
                  settings: RetrySettings | Mapping[str, Any] | None = None,
                  on_event: EventListener | None = None, coordinator: Any = None,
                  key: Any = None, clock: Any = None,
                  sleep: Callable[[float], Any] | None = None,
                  random: Callable[[], float] = _random.random, context_window: int = 0,
                  to_message: Callable[[BaseException], AssistantMessage] | None = None,
                  **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` under the retry brain, for synchronous callables (a sync SDK
    client: ``openai.OpenAI().chat.completions.create``); backoffs wait with ``sleep``
    (default ``time.sleep``). The runner's keywords never reach ``fn``, as for
    :func:`retrying`; a ``coordinator`` is asked at once (in-process) or on the process's
    background coordinator loop."""
    return RetryRunner(settings, on_event=on_event, coordinator=coordinator, key=key,
                       clock=clock, sleep=sleep, random=random, context_window=context_window,
                       to_message=to_message).run_sync(fn, *args, **kwargs)


@overload
def retry(fn: Callable[P, Coroutine[Any, Any, T]], /) -> Callable[P, Coroutine[Any, Any, T]]: ...
@overload
def retry(fn: Callable[P, T], /) -> Callable[P, T]: ...
@overload
def retry(fn: None = None, /, *, settings: RetrySettings | Mapping[str, Any] | None = None,
          **options: Any) -> RetryRunner: ...


def retry(fn: Callable[..., Any] | None = None, /, *,
          settings: RetrySettings | Mapping[str, Any] | None = None, **options: Any) -> Any:
    """Decorator: ``@fsm.retry`` or ``@fsm.retry(settings=..., on_event=..., ...)`` over an
    async or a sync function (the options of :class:`RetryRunner`): a coroutine function runs
    on :meth:`RetryRunner.run`, any other on :meth:`RetryRunner.run_sync`. Each call of the
    decorated function runs its own chain; its signature is kept for type checkers."""
    runner = RetryRunner(settings, **options)
    return runner if fn is None else runner(fn)
