"""One call's retry chain, stepped by a host that runs the attempts itself.

The runner (:mod:`fsm.host.runner`) owns its loop: it calls the callable, waits and calls
again. Other hosts already have a loop of their own — tenacity's ``Retrying``, an httpx2
transport's ``handle_request``, a LangChain middleware's ``handler`` — and only need the brain's
answer at each step. :class:`Chain` is that answer, thin on the
:class:`~fsm.host.kernel.HostKernel` (the facts, the brain call and the actions are the
kernel's; docs/architecture.md, "The host kernel")::

    chain = Chain(settings, on_event=print)
    while True:
        try:
            result = await attempt()
        except Exception as exc:
            delay_ms = await chain.failed(exc)
            if delay_ms is None:            # the chain is over: raise what the caller sees
                raise chain.error() from exc
            await asyncio.sleep(delay_ms / 1000)
            chain.backoff_elapsed()
        else:
            chain.succeeded()
            return result

The exceptions a caller sees are the runner's (docs/policy.md §10): :meth:`Chain.error`.

A chain has no pacing gate (the session and the runner take each request's pacing slot right
before it goes, :meth:`fsm.host.kernel.HostKernel.gate`): with ``retry.pacing`` on, a retry's
slot is reserved at its decision, part of the delay :meth:`Chain.failed` answers
(``delaySource: "pacing"`` when it is the longest wait; docs/fleet.md, "The gate").
"""

from __future__ import annotations

import random as _random
from contextvars import ContextVar
from collections.abc import Mapping
from typing import Any, Callable

from fsm.core import brain as B
from fsm.core.brain import RetryBrain, TurnFacts
from fsm.core.classify import Classification
from fsm.core.events import AutoRetryEnd, Event
from fsm.core.messages import AssistantMessage
from fsm.core.settings import RetrySettings
from fsm.host.kernel import HostKernel, ZoneResolver, default_zone

__all__ = ["Chain", "RETRY_OWNER", "http_error_message", "refuse_unsupported"]

RETRY_OWNER: ContextVar[object | None] = ContextVar("fsm_retry_owner", default=None)
"""Set while an fsm host (the runner, a transport) owns a call: one retry owner per call — a
transport under it passes requests through instead of retrying them again (docs/integrations.md)."""

_OK = AssistantMessage("stop", timestamp_ms=0)

#: Exception classes that mean a bug in the caller's code: fatal whatever their text.
PROGRAMMING_ERRORS: tuple[type[BaseException], ...] = (
    LookupError, AttributeError, TypeError, NameError, AssertionError, ArithmeticError,
    NotImplementedError, ImportError, SyntaxError)

_SDK_MODULES = ("openai", "anthropic", "httpx", "httpx2", "httpcore")


def _settings(settings: RetrySettings | Mapping[str, Any] | None) -> RetrySettings:
    if settings is None:
        return RetrySettings()
    if isinstance(settings, RetrySettings):
        return settings
    if isinstance(settings, Mapping):
        inner = settings.get("retry", settings) if "retry" in settings else settings
        return RetrySettings.from_json({"retry": inner})
    raise TypeError(f"settings must be RetrySettings or a mapping of retry keys such as "
                    f"{{'maxRetries': 5}}, got {type(settings).__name__}")


TIMEOUT_KEYS = ("firstTokenTimeoutMs", "idleTimeoutMs", "attemptTimeoutMs")
"""Settings only a host that runs (and can abort) the attempt itself acts on."""


def refuse_unsupported(settings: RetrySettings, host: str, keys: tuple[str, ...]) -> RetrySettings:
    """Refuse the settings ``host`` cannot act on rather than accept and ignore them: the first
    of ``keys`` (camelCase: ``fallbackModels``, ``attemptTimeoutMs``) set in ``settings``
    raises :class:`~fsm.core.settings.SettingsError` naming it and the host
    (docs/integrations.md, "Settings each integration honours"). A value a *profile* set (the
    resilient profile's ``idleTimeoutMs``) is left out instead, as the runner does
    (docs/policy.md §13.1). Returns ``settings``, without those profile values."""
    import dataclasses

    from fsm.core.settings import _KEYS, PROFILES, SettingsError
    profile = PROFILES.get(settings.profile, {})
    for key in keys:
        value = getattr(settings, _KEYS[key])
        if value is not None and profile.get(key) == value:
            settings = dataclasses.replace(settings, **{_KEYS[key]: None})
        elif value is not None and value != ():
            raise SettingsError(key, list(value) if isinstance(value, tuple) else value,
                                f"unset: {host} cannot act on it (docs/integrations.md; use "
                                f"fsm.retrying or the agent session)")
    return settings


def http_error_message(exc: BaseException) -> AssistantMessage:
    """How an exception reads for the brain: an ``httpx``/``httpx2`` ``HTTPStatusError``
    (``response.raise_for_status()``, as in pydantic-ai's tenacity transports) by its response's
    status, body and hint headers; anything else by
    :func:`fsm.providers.sdk_errors.error_message` (the SDKs' and transports' errors)."""
    from fsm.providers import sdk_errors
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if type(exc).__name__ == "HTTPStatusError" and isinstance(status, int) and status >= 400:
        try:
            body: Any = response.text
        except Exception:  # a body not read (a stream): the status and headers still speak
            body = None
        return sdk_errors.status_error_facts(status, body, response.headers).to_message()
    return sdk_errors.error_message(exc)


_LOOP: Any = None


def coordinator_loop() -> Any:
    """The process's background event loop on which synchronous hosts talk to a coordinator
    (one daemon thread, started on first use)."""
    global _LOOP
    if _LOOP is None:
        import asyncio
        import threading
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="fsm-coordinator", daemon=True).start()
        _LOOP = loop
    return _LOOP


class Chain:
    """The brain's answers for one call whose attempts the host runs.

    Args:
        settings: :class:`~fsm.core.settings.RetrySettings` or the file's ``retry`` mapping
            (``{"maxRetries": 5}`` or ``{"retry": {...}}``); None = the defaults.
        on_event: called with each :mod:`fsm.core.events` event, in the brain's order; an
            exception it raises is swallowed (a broken listener never breaks the chain).
        coordinator: the fleet's coordinator (``docs/fleet.md``); None = the in-process one of
            the event loop, used only with hints honoured or a budget. Async steps only.
        key: the :class:`~fsm.fleet.CoordKey` of the provider account the call goes to; None =
            ``CoordKey(provider, model)`` from ``provider``/``model``.
        provider, model: names for the default key (``"openai"``, ``"gpt-5"``).
        clock: the host clock (``time_ms()``); None = the wall clock.
        random: floats in [0, 1) for jitter.
        context_window: the model's context window in tokens (the silent-overflow rule).
        to_message: ``to_message(exc) -> AssistantMessage``: how an exception reads (default:
            :func:`fsm.providers.sdk_errors.error_message`).
        zone: the time-zone resolver for reset times named in a zone.
        sync: True for a host without an event loop: no coordinator is read or written.
    """

    __slots__ = ("settings", "on_event", "brain", "kernel", "calls", "exc", "message", "cls",
                 "end", "delay_ms", "_timer", "_key", "_loop", "switched_model", "provider", "model", "to_message",
                 "context_window")

    def __init__(self, settings: RetrySettings | Mapping[str, Any] | None = None, *,
                 on_event: Callable[[Event], Any] | None = None, coordinator: Any = None,
                 key: Any = None, provider: str = "default", model: str = "default",
                 clock: Any = None, random: Callable[[], float] = _random.random,
                 context_window: int = 0,
                 to_message: Callable[[BaseException], AssistantMessage] | None = None,
                 zone: ZoneResolver | None = default_zone, sync: bool = False) -> None:
        if on_event is not None and not callable(on_event):
            raise TypeError(f"on_event must be callable, got {type(on_event).__name__}")
        self.settings = _settings(settings)
        self.on_event = on_event
        self.provider = provider or "default"
        self.model = model or "default"
        self._key = key
        self.to_message = to_message or http_error_message
        self.context_window = context_window
        self.brain = RetryBrain(self.settings, random=random)
        # A synchronous host with a coordinator speaks to it through a background event loop
        # (the coordinators are asyncio objects): the sync coordinator facade.
        self._loop = coordinator_loop() if sync and coordinator is not None else None
        self.kernel = HostKernel(self.brain, emit=self._emit, clock=clock,
                                 coordinator=coordinator, key=self.coord_key, zone=zone,
                                 use_coordinator=not sync or self._loop is not None,
                                 random=random)
        self.calls = 0
        self.exc: BaseException | None = None
        self.message: AssistantMessage | None = None
        self.cls: Classification | None = None
        self.end: AutoRetryEnd | None = None
        self.delay_ms: int | None = None
        self._timer = 0
        # the model the next attempt should use: None until retry.fallbackModels switches it
        self.switched_model: str | None = None

    # ------------------------------------------------------------------ steps
    def judge(self, exc: BaseException | None = None, *,
              message: AssistantMessage | None = None,
              secrets: tuple[str, ...] = ()) -> tuple[AssistantMessage, Classification]:
        """Classify the end of an attempt: ``exc`` (what it raised) or ``message`` (a failed
        assistant message); neither = a success. Counts the attempt. ``secrets``: credentials
        the failed request carried (an error body may echo them), scrubbed from the message
        as those read from ``exc``'s request."""
        self.calls += 1
        if exc is not None:
            self.exc = exc
            message = self.to_message(exc)
        elif message is None:
            message = _OK
        if exc is not None and isinstance(exc, PROGRAMMING_ERRORS) and \
                (type(exc).__module__ or "").split(".", 1)[0] not in _SDK_MODULES:
            cls = Classification("fatal", "runner.programming_error")
        else:
            cls = self.kernel.classify(message, self.context_window)
        if cls.kind != "none":
            # As the runner: events and errors show the failure scrubbed (the credentials the
            # request carried, of any shape) and clipped (fsm.core.redact).
            from fsm.core.redact import request_secrets
            from fsm.core.text import safe_message
            message = safe_message(message, request_secrets(exc) + tuple(secrets))
            self.message, self.cls = message, cls
        return message, cls

    async def failed(self, exc: BaseException | None = None, *,
                     message: AssistantMessage | None = None,
                     secrets: tuple[str, ...] = (), output_streamed: bool = False) -> int | None:
        """An attempt failed (``exc`` raised, or ``message`` is a failed assistant message):
        the backoff in ms before the next attempt, or None when no retry follows (the chain
        ended, or none started: :meth:`error` is what the caller should see). ``secrets`` as
        :meth:`judge`; ``output_streamed``: the attempt had already streamed output (its retry
        is then the ``retry.afterOutput`` decision, docs/policy.md §3 D12)."""
        msg, cls = self.judge(exc, message=message, secrets=secrets)
        now = self.kernel.now_ms()
        if self.kernel.needs_world(cls):
            facts = await self.kernel.gather(cls, now_ms=now, output_streamed=output_streamed)
        else:
            facts = self.kernel.local_facts(now_ms=now, output_streamed=output_streamed)
        return self._decide(msg, cls, facts)

    def failed_sync(self, exc: BaseException | None = None, *,
                    message: AssistantMessage | None = None,
                    secrets: tuple[str, ...] = ()) -> int | None:
        """:meth:`failed` for a host without an event loop. With a coordinator the facts are
        gathered on the coordinator's background loop (bounded as for every host); without
        one, no coordinator is asked."""
        if self._loop is not None:
            return self._on_loop(self.failed(exc, message=message, secrets=secrets))
        msg, cls = self.judge(exc, message=message, secrets=secrets)
        return self._decide(msg, cls, self.kernel.local_facts())

    def succeeded(self) -> None:
        """The attempt succeeded: a running chain ends ``success: true`` (the budget is
        credited, the end event emitted)."""
        self.calls += 1
        self._step(lambda: self._decide(_OK, Classification("none", "ok"), self.kernel.local_facts()))

    def backoff_elapsed(self) -> None:
        """The backoff the last :meth:`failed` asked for is over; the next attempt goes out."""
        self._step(lambda: self._perform(self.brain.backoff_elapsed(self._timer)))

    def cancel(self) -> None:
        """The caller gave up (a cancelled task, ``KeyboardInterrupt``): a running chain ends
        ``cancelled`` and its end event is emitted; nothing happens at rest."""
        self._step(lambda: self._perform(self.brain.prompt_cancelled()))

    def _step(self, fn: Callable[[], Any]) -> Any:
        if self._loop is None:
            return fn()

        async def run() -> Any:
            return fn()
        return self._on_loop(run())

    def _on_loop(self, coro: Any) -> Any:
        import asyncio
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def error(self) -> BaseException:
        """What the caller should see after :meth:`failed` answered None (docs/policy.md §10):
        :class:`~fsm.host.runner.ContextOverflowError` for an overflow,
        :class:`~fsm.host.runner.RetryChainError` for a chain that ended without success (or a
        refusal at rest), else the attempt's own exception (a fatal first failure)."""
        from fsm.host.runner import ContextOverflowError, RetryChainError
        end, cls = self.end, self.cls
        if cls is not None and cls.kind == "context_overflow":
            return ContextOverflowError(end.end_reason if end else None,
                                        end.attempt if end else 0, self.calls, cls,
                                        self.message or _OK)
        if end is not None and not end.success:
            return RetryChainError(end.end_reason, end.attempt, self.calls, cls, end.final_error,
                                   self.message)
        if self.exc is not None:
            return self.exc
        return RuntimeError(f"the call failed: {(self.message or _OK).error_message or 'no message'}")

    @property
    def running(self) -> bool:
        """True while a chain has started (``auto_retry_start`` emitted) and not yet ended."""
        return self.brain.attempt > 0 and self.end is None

    @property
    def attempt(self) -> int:
        """The brain's attempt counter (0 at rest; 1 during the first retry, ...)."""
        return self.brain.attempt

    # ------------------------------------------------------------------ plumbing
    def coord_key(self) -> Any:
        """The coordinator's key for this call (built on first use)."""
        if self._key is None:
            from fsm.fleet import CoordKey
            self._key = CoordKey(self.provider, self.model)
        return self._key

    def _decide(self, message: AssistantMessage, cls: Classification, facts: TurnFacts) -> int | None:
        self.delay_ms = None
        self.kernel.turn_ended(message, self.context_window, cls, facts, self._host)
        return self.delay_ms

    def _perform(self, actions: list[B.Action]) -> None:
        self.delay_ms = None
        self.kernel.perform(actions, self._host)

    def _emit(self, event: Event) -> None:
        if type(event) is AutoRetryEnd:
            self.end = event
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:  # a broken listener must not break the chain
                pass

    def _host(self, action: B.Action) -> None:
        if type(action) is B.StartBackoff:
            self.delay_ms, self._timer = action.delay_ms, action.timer_id
        elif type(action) is B.SwitchModel:  # retry.fallbackModels (docs/policy.md §13.3)
            self.switched_model = action.to_model

    def close(self) -> None:
        """Stop forwarding the coordinator's events."""
        self.kernel.close()

    async def aclose(self) -> None:
        """Finish the coordinator's writes in flight, then :meth:`close`."""
        await self.kernel.aclose()
