"""One call's retry chain, stepped by a host that runs the attempts itself.

The runner (:mod:`fsm.host.runner`) drives the one loop (:mod:`fsm.host.loop`) itself: it
calls the callable, waits and calls again. Other hosts already have a loop of their own —
tenacity's ``Retrying``, an httpx2 transport's ``handle_request``, a LangChain middleware's
``handler`` — and only need the loop's answer at each step. :class:`Chain` is the same loop
stepped from outside (docs/architecture.md, "The loop")::

    import asyncio
    from fsm.host.chain import Chain

    async def wait(ms: int) -> None:                # the host's wait
        await asyncio.sleep(ms / 1000)

    async def call(attempt, settings=None):
        chain = Chain(settings, on_event=print)
        try:
            await chain.pause(await chain.start(), wait)    # the gate before the first request
            while True:
                try:
                    result = await attempt(model=chain.switched_model)
                except Exception as exc:
                    delay_ms = await chain.failed(exc)
                    if delay_ms is None:        # the chain is over: raise what the caller sees
                        raise chain.error() from exc
                    await chain.pause(delay_ms, wait)   # backoff, budget re-check, gate
                else:
                    chain.succeeded()
                    return result
        finally:
            chain.close()

.. invisible-code-block: python

    import httpx
    models = []

    async def attempt(model=None):
        models.append(model)
        if len(models) == 1:
            raise httpx.ConnectError("connection refused")
        return "ok"

    assert await call(attempt, {"baseDelayMs": 10}) == "ok" and models == [None, None]

``wait(ms)`` is the host's wait. The exceptions a caller sees are the runner's
(docs/policy.md §10): :meth:`Chain.error`. Every retry passes the same gate as the runner's
(cooldown, pacing: ``request_delayed``), and a budget in wait mode is asked again when its
wait ends.
"""

from __future__ import annotations

import random as _random
from collections.abc import Mapping
from typing import Any, Awaitable, Callable

from fsm.core.brain import RetryBrain
from fsm.core.classify import Classification
from fsm.core.events import AutoRetryEnd, Event
from fsm.core.messages import AssistantMessage
from fsm.core.settings import RetrySettings
from fsm.host.errors import RETRY_OWNER, ContextOverflowError, RetryChainError
from fsm.host.kernel import ZoneResolver, coordinator_loop, default_zone
from fsm.host.loop import (Attempt, RetryLoop, Send, Wait, answer_async, answer_sync,
                           tell_sync)

__all__ = ["Chain", "RETRY_OWNER", "RetryChainError", "ContextOverflowError", "http_error_message",
           "refuse_unsupported", "coordinator_loop"]

_OK = AssistantMessage("stop", timestamp_ms=0)



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
    (docs/integrations.md, "Settings each integration honours"), and so does one of them in a
    ``retry.providers`` entry (``providers["openai"].idleTimeoutMs``). A value a *profile* set (the
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
    for name, entry in settings.providers:  # an override per provider (§13.4) is refused alike
        for key in keys:
            value = entry.get(key)
            if value is not None and value != ():
                raise SettingsError(f'providers["{name}"].{key}',
                                    list(value) if isinstance(value, tuple) else value,
                                    f"unset: {host} cannot act on it (docs/integrations.md)")
    return settings


def http_error_message(exc: BaseException) -> AssistantMessage:
    """How an exception reads for the brain: an ``httpx``/``httpx2`` ``HTTPStatusError``
    (``response.raise_for_status()``, as in pydantic-ai's tenacity transports) by its response's
    status, body and hint headers (also behind a framework's exception:
    :func:`fsm.providers.sdk_errors.speaking_error`); anything else by
    :func:`fsm.providers.sdk_errors.error_message` (the SDKs' and transports' errors)."""
    from fsm.providers import sdk_errors
    exc = sdk_errors.speaking_error(exc)  # a framework's exception reads as the error behind it
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if type(exc).__name__ == "HTTPStatusError" and isinstance(status, int) and status >= 400:
        try:
            body: Any = response.text
        except Exception:  # a body not read (a stream): the status and headers still speak
            body = None
        return sdk_errors.status_error_facts(status, body, response.headers).to_message()
    return sdk_errors.error_message(exc)


class Chain:
    """The brain's answers for one call whose attempts the host runs: the one loop
    (:class:`~fsm.host.loop.RetryLoop`) stepped from outside (see the module docstring).

    Args:
        settings: :class:`~fsm.core.settings.RetrySettings` or the file's ``retry`` mapping
            (``{"maxRetries": 5}`` or ``{"retry": {...}}``); None = the defaults. The chain
            runs on them resolved for its provider and model
            (:meth:`~fsm.RetrySettings.for_provider`: the ``retry.providers``
            entries of ``key``'s provider and model, else of ``provider``/``model``;
            docs/policy.md §13.4): :attr:`settings`.
        on_event: called with each :mod:`fsm.core.events` event, in the brain's order; an
            exception it raises is swallowed (a broken listener never breaks the chain).
        coordinator: the fleet's coordinator (``docs/fleet.md``); None = the in-process one of
            the event loop (async steps), used only with hints honoured, a budget or pacing.
            A sync chain asks a given coordinator at once (in-process) or on the process's
            background coordinator loop.
        key: the :class:`~fsm.fleet.CoordKey` of the provider account the call goes to; None =
            ``CoordKey(provider, model)`` from ``provider``/``model``.
        provider, model: names for the default key (``"openai"``, ``"gpt-5"``).
        clock: the host clock (``time_ms()``); None = the wall clock.
        random: floats in [0, 1) for jitter.
        context_window: the model's context window in tokens (the silent-overflow rule).
        to_message: ``to_message(exc) -> AssistantMessage``: how an exception reads (default:
            :func:`http_error_message`).
        zone: the time-zone resolver for reset times named in a zone.
        sync: True for a host without an event loop: no coordinator unless one is given.
    """

    __slots__ = ("settings", "on_event", "loop", "provider", "model", "_key", "_sync", "_steps",
                 "_at", "_error", "_done", "delay_ms")

    def __init__(self, settings: RetrySettings | Mapping[str, Any] | None = None, *,
                 on_event: Callable[[Event], Any] | None = None, coordinator: Any = None,
                 key: Any = None, provider: str = "default", model: str = "default",
                 clock: Any = None, random: Callable[[], float] = _random.random,
                 context_window: int = 0,
                 to_message: Callable[[BaseException], AssistantMessage] | None = None,
                 zone: ZoneResolver | None = default_zone, sync: bool = False) -> None:
        if on_event is not None and not callable(on_event):
            raise TypeError(f"on_event must be callable, got {type(on_event).__name__}")
        self.provider = provider or "default"
        self.model = model or "default"
        self.settings = _settings(settings).for_provider(*self._names(key))
        self.on_event = on_event
        self._key = key
        self._sync = sync
        self.loop = RetryLoop(self.settings, emit=self._emit, clock=clock, coordinator=coordinator,
                              key=self.coord_key, to_message=to_message or http_error_message,
                              zone=zone, random=random, context_window=context_window,
                              use_coordinator=not sync or coordinator is not None,
                              tell=tell_sync if sync else None, gate_first=False,
                              model=model if model and model != "default" else None)
        self._steps: Any = None
        self._at: Any = None  # the command the steps wait at: a Send or a Wait
        self._error: BaseException | None = None
        self._done = False
        self.delay_ms: int | None = None

    def _names(self, key: Any) -> tuple[str | None, str | None]:
        """The provider and model whose ``retry.providers`` entries apply (docs/policy.md
        §13.4): ``key``'s when given, else ``provider``/``model``; ``"default"`` is unknown."""
        provider = getattr(key, "provider", None) if key is not None else self.provider
        model = getattr(key, "model", None) if key is not None else self.model
        return (provider if provider and provider != "default" else None,
                model if model and model != "default" else None)

    # ------------------------------------------------------------------ the loop's state
    @property
    def brain(self) -> RetryBrain:
        return self.loop.brain

    @property
    def kernel(self) -> RetryLoop:
        """The loop (the host kernel of this chain)."""
        return self.loop

    @property
    def calls(self) -> int:
        """Attempts sent so far."""
        return self.loop.calls

    @property
    def end(self) -> AutoRetryEnd | None:
        return self.loop.end

    @property
    def exc(self) -> BaseException | None:
        return self.loop.exc

    @property
    def message(self) -> AssistantMessage | None:
        return self.loop.message

    @property
    def cls(self) -> Classification | None:
        return self.loop.cls

    @property
    def switched_model(self) -> str | None:
        """The model the next attempt should use: None until ``retry.fallbackModels``
        switches it (docs/policy.md §13.3)."""
        return self.loop.model if self.loop.switched else None

    @property
    def running(self) -> bool:
        """True while a chain has started (``auto_retry_start`` emitted) and not yet ended."""
        return self.brain.attempt > 0 and self.end is None

    @property
    def attempt(self) -> int:
        """The brain's attempt counter (0 at rest; 1 during the first retry, ...)."""
        return self.brain.attempt

    # ------------------------------------------------------------------ stepping
    def _advance(self, value: Any, *, throw: bool = False) -> Any:
        """Run the steps without an event loop until they wait at a Send or a Wait (returned)
        or end (None)."""
        steps = self._steps
        while True:
            try:
                command = steps.throw(value) if throw else steps.send(value)
            except StopIteration:
                return self._ended(None)
            except BaseException as exc:  # noqa: BLE001 - the outcome: error() gives it
                return self._ended(exc)
            throw = False
            if type(command) in (Send, Wait):
                self._at = command
                return command
            try:
                value = answer_sync(command)
            except BaseException as exc:  # noqa: BLE001 - thrown into the steps
                value, throw = exc, True

    async def _aadvance(self, value: Any) -> Any:
        """:meth:`_advance` on asyncio: coordinator commands bounded by the one rule."""
        steps, throw = self._steps, False
        while True:
            try:
                command = steps.throw(value) if throw else steps.send(value)
            except StopIteration:
                return self._ended(None)
            except BaseException as exc:  # noqa: BLE001 - the outcome: error() gives it
                return self._ended(exc)
            throw = False
            if type(command) in (Send, Wait):
                self._at = command
                return command
            try:
                value = await answer_async(command)
            except BaseException as exc:  # noqa: BLE001 - thrown into the steps
                value, throw = exc, True

    def _ended(self, error: BaseException | None) -> None:
        self._done, self._at, self._error = True, None, error
        if isinstance(error, (KeyboardInterrupt, SystemExit, GeneratorExit)):
            raise error
        return None

    def _prime(self, gate: bool) -> bool:
        """Start the steps (the first request passes the gate when ``gate``); False when they
        were already started."""
        if self._steps is not None:
            return False
        self.loop.gate_first = gate
        self._steps = self.loop.steps()
        return True

    def _delay(self, command: Any) -> int | None:
        self.delay_ms = command.delay_ms if type(command) is Wait else None
        return self.delay_ms

    # ------------------------------------------------------------------ the host's steps
    async def start(self) -> int | None:
        """Before the first request: the gate (first-request admission under the resilient
        profile, pacing; docs/fleet.md "First requests"). None: send now; else wait that many
        ms and call :meth:`resume`. A refused first request ends the steps: :meth:`error`."""
        if not self._prime(True):
            return None
        return self._delay(await self._aadvance(None))

    def start_sync(self) -> int | None:
        """:meth:`start` for a host without an event loop."""
        if not self._prime(True):
            return None
        return self._delay(self._advance(None))

    async def resume(self) -> int | None:
        """The wait :meth:`failed` (or :meth:`start`, or :meth:`resume`) asked for is over: the
        budget re-check (wait mode) and the gate (cooldown, pacing) run. None: send the next
        attempt now (or the chain ended: :attr:`done`); else wait that many ms more and call
        again."""
        if type(self._at) is not Wait:
            return None
        return self._delay(await self._aadvance(True))

    def resume_sync(self) -> int | None:
        """:meth:`resume` for a host without an event loop."""
        if type(self._at) is not Wait:
            return None
        return self._delay(self._advance(True))

    backoff_elapsed = resume_sync

    async def pause(self, delay_ms: int | None, wait: Callable[[int], Awaitable[Any]]) -> None:
        """Wait ``delay_ms`` with ``wait(ms)``, then :meth:`resume`, until the next attempt may
        go. Raises :meth:`error` when the chain ended meanwhile (its deadline, the budget)."""
        while delay_ms is not None:
            await wait(delay_ms)
            delay_ms = await self.resume() if type(self._at) is Wait else None
        if self._done:
            raise self.error()

    def pause_sync(self, delay_ms: int | None, sleep: Callable[[int], Any]) -> None:
        """:meth:`pause` for a host without an event loop (``sleep(ms)``)."""
        while delay_ms is not None:
            sleep(delay_ms)
            delay_ms = self.resume_sync() if type(self._at) is Wait else None
        if self._done:
            raise self.error()

    @property
    def done(self) -> bool:
        """True once the steps ended (:meth:`error` says how, when not a success)."""
        return self._done

    def _outcome(self, exc: BaseException | None, message: AssistantMessage | None,
                 secrets: tuple[str, ...], output_streamed: bool = False) -> Any:
        return Attempt(exc=exc, message=message, secrets=tuple(secrets),
                       output_streamed=output_streamed)

    def judge(self, exc: BaseException | None = None, *,
              message: AssistantMessage | None = None,
              secrets: tuple[str, ...] = ()) -> tuple[AssistantMessage, Classification]:
        """How the end of an attempt reads, without stepping the chain: ``exc`` (what it
        raised) or ``message`` (a failed assistant message); neither = a success. Returns the
        message (scrubbed of ``secrets`` and of the credentials ``exc``'s request carried) and
        its :class:`~fsm.core.classify.Classification` (a framework's ``retry_on`` asks this)."""
        read, cls, _ = self.loop.judge(self._outcome(exc, message, secrets), exc)
        return read, cls

    async def failed(self, exc: BaseException | None = None, *,
                     message: AssistantMessage | None = None,
                     secrets: tuple[str, ...] = (), output_streamed: bool = False) -> int | None:
        """An attempt failed (``exc`` raised, or ``message`` is a failed assistant message):
        the wait in ms before the next attempt (then :meth:`pause`), or None when no retry
        follows (:meth:`error` is what the caller should see). ``secrets``: credentials the
        failed request carried, scrubbed from what events and errors show;
        ``output_streamed``: the attempt had already streamed output (its retry is then the
        ``retry.afterOutput`` decision, docs/policy.md §3 D12)."""
        if self._prime(False):
            await self._aadvance(None)
        if type(self._at) is not Send:  # not at an attempt (it failed during a wait)
            self.cancel()
            return None
        return self._delay(await self._aadvance(self._outcome(exc, message, secrets,
                                                              output_streamed)))

    def failed_sync(self, exc: BaseException | None = None, *,
                    message: AssistantMessage | None = None,
                    secrets: tuple[str, ...] = (), output_streamed: bool = False) -> int | None:
        """:meth:`failed` for a host without an event loop."""
        if self._prime(False):
            self._advance(None)
        if type(self._at) is not Send:
            self.cancel()
            return None
        return self._delay(self._advance(self._outcome(exc, message, secrets, output_streamed)))

    def succeeded(self) -> None:
        """The attempt succeeded: a running chain ends ``success: true`` (the budget is
        credited, the end event emitted)."""
        if self._prime(False):
            self._advance(None)
        if type(self._at) is Send:
            self._advance(Attempt(result=None))

    def cancel(self) -> None:
        """The caller gave up (a cancelled task, ``KeyboardInterrupt``): a running chain ends
        ``cancelled``, a token held for its retry goes back, its end event is emitted; nothing
        happens at rest."""
        if self._steps is not None and not self._done:
            self._steps.close()
            self._done, self._at = True, None
        elif self._steps is None:
            self.loop.carry_out(self.brain.prompt_cancelled())

    def error(self) -> BaseException:
        """What the caller should see after :meth:`failed` answered None (docs/policy.md §10,
        as the runner): :class:`~fsm.host.errors.ContextOverflowError` for an overflow,
        :class:`~fsm.host.errors.RetryChainError` for a chain that started and ended without
        success (its ``__cause__`` the last exception), the attempt's own exception for a
        first failure that starts no chain (a refusal at rest carries its ``endReason`` in a
        ``__notes__`` line)."""
        if self._error is not None:
            return self._error
        end, cls = self.end, self.cls
        if end is not None and not end.success:
            return RetryChainError(end.end_reason, end.attempt, self.calls, cls, end.final_error,
                                   self.message)
        if self.exc is not None:
            return self.exc
        return RuntimeError(f"the call failed: {(self.message or _OK).error_message or 'no message'}")

    # ------------------------------------------------------------------ plumbing
    def coord_key(self) -> Any:
        """The coordinator's key for this call (built on first use)."""
        if self._key is None:
            from fsm.fleet import CoordKey  # the fleet sits below the host
            self._key = CoordKey(self.provider, self.model)
        return self._key

    def _emit(self, event: Event) -> None:
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:  # a broken listener must not break the chain
                pass

    def close(self) -> None:
        """Stop forwarding the coordinator's events."""
        self.loop.close()

    async def aclose(self) -> None:
        """Finish the coordinator's writes in flight, then :meth:`close`."""
        await self.loop.aclose()
