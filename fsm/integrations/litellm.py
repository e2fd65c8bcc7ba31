"""The brain as LiteLLM's retry policy (``pip install 'retry-fsm[litellm]'``; not in ``all``).

LiteLLM retries on its own (``num_retries``, ``RetryPolicy``, the ``Router``'s retries,
fallbacks and deployment cooldowns). :class:`BrainLiteLLM` runs ``litellm.completion`` /
``litellm.acompletion`` — and, through :class:`BrainRouter`, a ``litellm.Router``'s — with
those off and the brain deciding every retry: the classification (a 401 or a context overflow
is not retried, a 429, a 529 or a dropped connection is), the backoff, retry hints
(``retry-after``, ``retry-after-ms``, ``x-ratelimit-reset-*``, read from the upstream response
LiteLLM's exception carries) under ``retryHints: "honor"``, the retry budget, the fleet's
cooldowns (the same coordinator as every other host), ``retry.fallbackModels``, events and
chain ends (this runs as written, with ``OPENAI_API_KEY`` and, for another endpoint,
``OPENAI_BASE_URL``; the tests point it at the fault server)::

    import asyncio
    from fsm.integrations.litellm import BrainLiteLLM

    brain = BrainLiteLLM({"maxRetries": 5, "retryHints": "honor"}, on_event=print)
    hi = [{"role": "user", "content": "hi"}]
    print(brain.completion("openai/gpt-5", hi).choices[0].message.content)

    async def main():
        stream = await brain.acompletion("openai/gpt-5", hi, stream=True)
        print("".join([chunk.choices[0].delta.content or "" async for chunk in stream]))
        router = brain.router(model_list=[       # a litellm.Router, its own retries off
            {"model_name": "chat", "litellm_params": {"model": "openai/gpt-5"}}])
        print((await router.acompletion("chat", hi)).choices[0].message.content)

    asyncio.run(main())

Each call is one chain on :class:`~fsm.host.chain.Chain` (the one loop, docs/architecture.md
"The loop"): the first request passes the gate (first-request admission, cooldowns, pacing),
each retry passes it after its backoff (``request_delayed``).

**Streams** (``stream=True``): the attempt reads the stream until its first chunk with output
(content, a tool call, reasoning) or its end, so an error before any output — a 529 answered
to the request, an error event, a connection cut before the first token — reaches the brain
and is retried; the chunks read are handed back first, then the rest of LiteLLM's stream
(its other attributes are the stream's). An error after output reached the caller is not
retried: it is raised as LiteLLM raised it, scrubbed, with a note saying so.

**One retry owner**: every call goes with ``num_retries=0`` and ``max_retries=0`` (LiteLLM's
retries and the OpenAI client's under it); a router is used with ``num_retries=0`` and
``disable_cooldowns=True`` and without LiteLLM fallbacks. A call or a router that turns any of
them on (``num_retries=3``, ``fallbacks=[...]``, ``retry_policy=...``,
``context_window_fallback_dict=...``, a router's cooldowns,
the process-wide ``litellm.num_retries``) is refused with :class:`LiteLLMRetriesError` before
any request, naming the setting and what to do instead.

Exceptions (docs/policy.md §10, SPEC §14b.14): a fatal first failure is LiteLLM's own
exception; a refusal at rest (``maxRetries: 0``, a guard refused on the first failure) is
LiteLLM's own exception with ``retry-fsm: not retried (endReason: ..., attempt 0)`` in its
notes; a chain that started
and ended without success raises :class:`~fsm.RetryChainError` from LiteLLM's last exception;
a context overflow raises :class:`~fsm.ContextOverflowError`. Whatever is raised is scrubbed
of the call's credentials (its ``api_key``, the router's deployment keys) and of the
process's registered secrets. :class:`~fsm.core.settings.SettingsError` at construction for
``firstTokenTimeoutMs``, ``idleTimeoutMs``, ``attemptTimeoutMs`` (use LiteLLM's
``timeout=``), and for a router whose model list cannot route a ``fallbackModels`` name.
"""

from __future__ import annotations

import collections
import functools
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any, Callable

from fsm.core.events import Event
from fsm.core.messages import AssistantMessage
from fsm.core.settings import RetrySettings, SettingsError
from fsm.core.redact import register_secret
from fsm.host.chain import TIMEOUT_KEYS, Chain, http_error_message, refuse_unsupported
from fsm.host.kernel import provider_id
from fsm.integrations._drive import drive_async, drive_sync
from fsm.integrations._extra import require

litellm = require("litellm", "litellm")

__all__ = ["BrainLiteLLM", "BrainRouter", "LiteLLMRetriesError", "STREAM_HEAD_LIMIT",
           "litellm_message"]

STREAM_HEAD_LIMIT = 256
"""Chunks without output (a role delta, empty deltas) read at most before a stream is handed
back: past it the stream is the caller's, and an error in it is no longer retried."""

_CALL_RETRIES = ("num_retries", "max_retries")
# context_window_fallback_dict: LiteLLM sends the request again to another model on a
# context-window error, a fallback the brain would not see (its overflow rule decides)
_CALL_REFUSED = ("retry_policy", "fallbacks", "model_group_retry_policy", "context_window_fallback_dict")
_ROUTER_FALLBACKS = ("fallbacks", "context_window_fallbacks", "content_policy_fallbacks",
                     "default_fallbacks")
_DOCS = 'one retry owner, docs/integrations.md "LiteLLM"'


class LiteLLMRetriesError(ValueError):
    """LiteLLM would retry, fall back or cool a deployment down on its own under the brain:
    ``setting`` (``"num_retries"``, ``"Router(disable_cooldowns)"``, ``"litellm.num_retries"``)
    is set to ``value``. Raised before any request (two retry owners multiply requests)."""

    def __init__(self, setting: str, value: Any, fix: str) -> None:
        self.setting = setting
        self.value = value
        super().__init__(f"{setting}={value!r}: LiteLLM would retry on its own under "
                         f"fsm.integrations.litellm (two retry owners multiply requests); {fix} "
                         f"({_DOCS})")


# ---------------------------------------------------------------------------- how errors read
def _chain_of(exc: BaseException) -> list[BaseException]:
    out, seen, current = [], set(), exc
    while current is not None and id(current) not in seen and len(out) < 12:
        out.append(current)
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return out


def _from(exc: BaseException, package: str) -> bool:
    return (type(exc).__module__ or "").split(".", 1)[0] == package


def _upstream(exc: BaseException) -> Any:
    """The upstream HTTP response LiteLLM kept on its exception, or None when it made one up
    (a connection error becomes a 500 with no headers and no body)."""
    response = getattr(exc, "response", None)
    headers = getattr(exc, "litellm_response_headers", None) or getattr(response, "headers", None)
    if response is None or not headers:
        return None
    return response


def _speaking(exc: BaseException) -> BaseException:
    """The exception whose facts describe ``exc``: a ``MidStreamFallbackError``'s
    ``original_exception``; behind a LiteLLM exception with no upstream response, the first
    ``openai``/``httpx`` error of its chain (the connection error LiteLLM turned into a 500)."""
    for _ in range(4):
        original = getattr(exc, "original_exception", None)
        if type(exc).__name__ != "MidStreamFallbackError" or not isinstance(original, BaseException):
            break
        exc = original
    if _from(exc, "litellm") and _upstream(exc) is None:
        for inner in _chain_of(exc)[1:]:
            if any(_from(inner, p) for p in ("openai", "httpx", "httpcore", "aiohttp")):
                return inner
    return exc


def litellm_message(exc: BaseException) -> AssistantMessage:
    """How a LiteLLM exception reads for the brain (docs/policy.md §2 "Structured facts
    first"): an error with an upstream response (``RateLimitError``, ``APIError`` for a 529,
    ``AuthenticationError``...) by its status, its body and the hint headers of that response
    (``retry-after``, ``retry-after-ms``, ``x-ratelimit-reset-*``); a ``MidStreamFallbackError``
    by the error it wraps; a connection error LiteLLM reports as a bodiless 500 by the
    ``openai``/``httpx`` connection error behind it (a network failure, not a server error);
    anything else as ``fsm.host.chain.http_error_message`` reads it."""
    from fsm.providers.sdk_errors import status_error_facts
    exc = _speaking(exc)
    status = getattr(exc, "status_code", None)
    response = _upstream(exc) if _from(exc, "litellm") else None
    if response is not None and isinstance(status, int) and not isinstance(status, bool) and status >= 400:
        try:
            body: Any = response.text
        except Exception:  # a body not read: the status and the headers still speak
            body = None
        if not body:
            body = getattr(exc, "body", None) or None
        headers = getattr(exc, "litellm_response_headers", None) or response.headers
        return status_error_facts(status, body, headers).to_message()
    return http_error_message(exc)


def _scrub(exc: BaseException, secrets: tuple[str, ...]) -> None:
    from fsm.core.redact import scrub_exception
    scrub_exception(exc, secrets)
    original = getattr(exc, "original_exception", None)
    if isinstance(original, BaseException):
        scrub_exception(original, secrets)


def _scrub_raised(raised: BaseException, secrets: tuple[str, ...]) -> None:
    """Scrub what the caller sees (docs/policy.md §10: LiteLLM's own exception, or the
    :class:`~fsm.RetryChainError` of a chain that started, from it) of ``secrets`` and of the
    credentials the failed request carried, LiteLLM's ``original_exception`` included."""
    from fsm.core.redact import request_secrets
    cause = raised.__cause__ if raised.__cause__ is not None else raised
    for exc in (raised, cause):
        _scrub(exc, secrets + request_secrets(exc))


# ---------------------------------------------------------------------------- streams
def _has_output(chunk: Any) -> bool:
    """A chunk that carries output the caller would see: content, a tool or function call,
    reasoning (SPEC §14b.8: the first content, thinking or tool delta)."""
    for choice in getattr(chunk, "choices", None) or ():
        delta = getattr(choice, "delta", None)
        if delta is None:
            continue
        for field in ("content", "tool_calls", "function_call", "reasoning_content",
                      "thinking_blocks", "audio", "images"):
            if getattr(delta, field, None):
                return True
    return False


_AFTER_OUTPUT = ("retry-fsm: not retried: the stream failed after its output reached the caller "
                 "(docs/integrations.md \"LiteLLM\")")


class _Stream:
    """LiteLLM's stream with the chunks read before its first output handed back first; any
    other attribute is the stream's."""

    def __init__(self, stream: Any, head: list[Any], secrets: tuple[str, ...], ended: bool) -> None:
        self._stream = stream
        self._head = collections.deque(head)
        self._secrets = secrets
        self._ended = ended

    def __getattr__(self, name: str) -> Any:
        if name in ("_stream", "_head", "_secrets", "_ended"):  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self._stream, name)

    def _failed(self, exc: BaseException) -> None:
        _scrub(exc, self._secrets)
        try:
            exc.add_note(_AFTER_OUTPUT)
        except Exception:
            pass

    def __iter__(self) -> "_Stream":
        return self

    def __next__(self) -> Any:
        if self._head:
            return self._head.popleft()
        if self._ended:
            raise StopIteration
        try:
            return next(self._stream)
        except StopIteration:
            raise
        except Exception as exc:
            self._failed(exc)
            raise

    def __aiter__(self) -> "_Stream":
        return self

    async def __anext__(self) -> Any:
        if self._head:
            return self._head.popleft()
        if self._ended:
            raise StopAsyncIteration
        try:
            return await self._stream.__anext__()
        except StopAsyncIteration:
            raise
        except Exception as exc:
            self._failed(exc)
            raise


def _read_head(stream: Any, secrets: tuple[str, ...]) -> _Stream:
    head: list[Any] = []
    iterator = iter(stream)
    while len(head) < STREAM_HEAD_LIMIT:
        try:
            chunk = next(iterator)
        except StopIteration:
            return _Stream(iterator, head, secrets, True)
        head.append(chunk)
        if _has_output(chunk):
            break
    return _Stream(iterator, head, secrets, False)


async def _aread_head(stream: Any, secrets: tuple[str, ...]) -> _Stream:
    head: list[Any] = []
    iterator = stream.__aiter__()
    while len(head) < STREAM_HEAD_LIMIT:
        try:
            chunk = await iterator.__anext__()
        except StopAsyncIteration:
            return _Stream(iterator, head, secrets, True)
        head.append(chunk)
        if _has_output(chunk):
            break
    return _Stream(iterator, head, secrets, False)


# ---------------------------------------------------------------------------- refusals, keys
def _refuse_call(kwargs: Mapping[str, Any], where: str, *, process_wide: bool = True) -> None:
    for name in _CALL_RETRIES:
        value = kwargs.get(name)
        if value not in (None, 0):
            raise LiteLLMRetriesError(f"{where}{name}", value,
                                      f"leave {name} out (the brain sends 0) and set "
                                      f"retry.maxRetries instead")
    for name in _CALL_REFUSED:
        if kwargs.get(name):
            raise LiteLLMRetriesError(f"{where}{name}", kwargs[name],
                                      "leave it out; retry.fallbackModels names the fallback "
                                      "models" if "fallback" in name else "leave it out")
    if process_wide and getattr(litellm, "num_retries", None):
        raise LiteLLMRetriesError("litellm.num_retries", litellm.num_retries,
                                  "set litellm.num_retries = None (LiteLLM reads it even when a "
                                  "call passes num_retries=0)")


def _secret_of(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) and value and not value.startswith("os.environ/"):
        return (value,)
    return ()


def _endpoint_key(model: str, params: Mapping[str, Any], provider: str | None) -> tuple[str, str]:
    """(provider id, model) of a LiteLLM model string and its params: the same key a
    transport under the same endpoint uses (SPEC §14b.11): an explicit ``provider`` first, then
    ``api_base``'s host (``api.openai.com`` → ``openai``, else ``host:port``), then LiteLLM's
    provider name (``openai/gpt-5`` → ``openai``); the model without LiteLLM's prefix."""
    api_base = params.get("api_base") or params.get("base_url")
    custom = params.get("custom_llm_provider")
    return _key_of(model, api_base if isinstance(api_base, str) else None,
                   custom if isinstance(custom, str) else None, provider)


@functools.lru_cache(maxsize=1024)
def _key_of(model: str, api_base: str | None, custom: str | None,
            provider: str | None) -> tuple[str, str]:
    try:
        name, llm_provider, _, _ = litellm.get_llm_provider(
            model=model, custom_llm_provider=custom, api_base=api_base)
    except Exception:  # a model LiteLLM does not know: it will say so when called
        name, llm_provider = model, None
    if provider is None and isinstance(api_base, str) and api_base:
        url = urllib.parse.urlsplit(api_base)
        try:
            port = url.port
        except ValueError:
            port = None
        if url.hostname:
            provider = provider_id(None, url.hostname, port)
    return provider_id(provider or llm_provider or None), name or model or "default"


class _Host:
    """What ``BrainLiteLLM`` and ``BrainRouter`` share: the settings, the chain's options and
    the two drivers."""

    def __init__(self, settings: RetrySettings, options: dict[str, Any], coordinator: Any,
                 clock: Any, sleep: Callable[[float], Any] | None, provider: str | None) -> None:
        self.settings = settings
        self._options = options
        self.coordinator = coordinator
        self.clock = clock
        self.provider = provider
        self._sleep = sleep or getattr(clock, "sleep", None) or time.sleep

    def _chain(self, key: tuple[str, str], sync: bool) -> Chain:
        return Chain(self.settings, sync=sync, coordinator=self.coordinator, provider=key[0],
                     model=key[1], to_message=litellm_message, **self._options)

    def _drive_sync(self, call: Callable[[str], Any], model: str, key: tuple[str, str],
                    secrets: tuple[str, ...], stream: bool) -> Any:
        """The call's attempts on the one loop, with its own sync driver
        (:func:`fsm.integrations._drive.drive_sync`): ``call(model)`` — a stream read to its
        first output inside the attempt — until it returns or the brain ends the chain; what
        is raised is scrubbed of ``secrets`` (LiteLLM's ``original_exception`` too)."""
        register_secret(*secrets)

        def attempt(switched: str | None) -> Any:
            result = call(switched or model)
            return _read_head(result, secrets) if stream else result
        try:
            return drive_sync(self._chain(key, sync=True), attempt, sleep=self._sleep,
                              takes_model=True, secrets=secrets)
        except BaseException as exc:
            _scrub_raised(exc, secrets)
            raise

    async def _drive_async(self, call: Callable[[str], Any], model: str, key: tuple[str, str],
                           secrets: tuple[str, ...], stream: bool) -> Any:
        """:meth:`_drive_sync` on asyncio (:func:`fsm.integrations._drive.drive_async`)."""
        register_secret(*secrets)

        async def attempt(switched: str | None) -> Any:
            result = await call(switched or model)
            return (await _aread_head(result, secrets)) if stream else result
        try:
            return await drive_async(self._chain(key, sync=False), attempt, clock=self.clock,
                                     takes_model=True, secrets=secrets)
        except BaseException as exc:
            _scrub_raised(exc, secrets)
            raise


class BrainLiteLLM:
    """``litellm.completion`` / ``litellm.acompletion`` with the brain as their retry policy.

    Args:
        settings: :class:`~fsm.core.settings.RetrySettings` or the file's ``retry`` mapping.
            ``fallbackModels`` are LiteLLM model strings (``"anthropic/claude-sonnet-4-5"``),
            sent with the call's other arguments; the timeouts are refused
            (:class:`~fsm.core.settings.SettingsError`: use LiteLLM's ``timeout=``).
        on_event: called with each :mod:`fsm.core.events` event.
        coordinator: the fleet's coordinator (docs/fleet.md), shared with every other host;
            None = the event loop's in-process one for async calls (hints honoured, a budget,
            pacing), none for sync calls.
        clock: a host clock (``time_ms()``, ``call_later``); None = real time.
        sleep: ``sleep(seconds)`` for sync calls (default the clock's, else ``time.sleep``).
        random: floats in [0, 1) for jitter.
        provider: the provider id of the coordinator key (and ``retry.providers``); None = from
            ``api_base``'s host, else LiteLLM's provider (``openai/gpt-5`` → ``openai``).
    """

    def __init__(self, settings: RetrySettings | Mapping[str, Any] | None = None, *,
                 on_event: Callable[[Event], Any] | None = None, coordinator: Any = None,
                 clock: Any = None, sleep: Callable[[float], Any] | None = None,
                 random: Callable[[], float] | None = None, provider: str | None = None) -> None:
        resolved = refuse_unsupported(Chain(settings, sync=True).settings, "the LiteLLM integration",
                                      TIMEOUT_KEYS)
        options: dict[str, Any] = {"on_event": on_event, "clock": clock}
        if random is not None:
            options["random"] = random
        self._calls = _Host(resolved, options, coordinator, clock, sleep, provider)
        self.settings, self.coordinator, self.clock, self.provider = resolved, coordinator, clock, provider
        self._sleep = self._calls._sleep
        self._on_event = on_event
        self._random = random

    def _prepare(self, model: Any, kwargs: dict[str, Any]) -> tuple[tuple[str, str], tuple[str, ...]]:
        if not isinstance(model, str) or not model:
            raise TypeError(f"model must be a LiteLLM model string such as 'openai/gpt-5', got {model!r}")
        _refuse_call(kwargs, "")
        if getattr(litellm, "model_fallbacks", None):
            raise LiteLLMRetriesError("litellm.model_fallbacks", litellm.model_fallbacks,
                                      "set it to None; retry.fallbackModels names the fallbacks")
        kwargs["num_retries"] = 0
        kwargs["max_retries"] = 0
        key = _endpoint_key(model, kwargs, self.provider)
        return key, _secret_of(kwargs.get("api_key"))

    def completion(self, model: str, messages: list[Any] | None = None, **kwargs: Any) -> Any:
        """``litellm.completion(model, messages, **kwargs)`` under the brain: its
        ``ModelResponse``, or with ``stream=True`` its stream (the chunks before the first
        output already read, see the module docstring). Raises :class:`LiteLLMRetriesError`
        for ``num_retries``/``max_retries`` above 0, ``fallbacks``, ``retry_policy``."""
        key, secrets = self._prepare(model, kwargs)
        return self._calls._drive_sync(lambda m: litellm.completion(m, messages, **kwargs), model,
                                       key, secrets, bool(kwargs.get("stream")))

    async def acompletion(self, model: str, messages: list[Any] | None = None, **kwargs: Any) -> Any:
        """``await litellm.acompletion(model, messages, **kwargs)`` under the brain (see
        :meth:`completion`); a cancellation ends a running chain ``cancelled``."""
        key, secrets = self._prepare(model, kwargs)
        return await self._calls._drive_async(
            lambda m: litellm.acompletion(m, messages, **kwargs), model, key, secrets,
            bool(kwargs.get("stream")))

    def router(self, router: Any = None, /, **router_kwargs: Any) -> "BrainRouter":
        """A :class:`BrainRouter` on ``router`` (a ``litellm.Router`` built with
        ``num_retries=0, disable_cooldowns=True``), or on a new ``litellm.Router(**router_kwargs)``
        with those two set. Raises :class:`LiteLLMRetriesError` for a router that retries,
        cools deployments down or falls back on its own."""
        if router is None:
            router_kwargs.setdefault("num_retries", 0)
            router_kwargs.setdefault("disable_cooldowns", True)
            _refuse_router_kwargs(router_kwargs)
            router = litellm.Router(**router_kwargs)
        elif router_kwargs:
            raise TypeError("pass a litellm.Router or its keyword arguments, not both")
        return BrainRouter(router, self.settings, on_event=self._on_event,
                           coordinator=self.coordinator, clock=self.clock, sleep=self._sleep,
                           random=self._random, provider=self.provider)


def _refuse_router_kwargs(kwargs: Mapping[str, Any]) -> None:
    if kwargs.get("num_retries") not in (None, 0):
        raise LiteLLMRetriesError("Router(num_retries)", kwargs["num_retries"],
                                  "build the router with num_retries=0")
    if kwargs.get("disable_cooldowns") is not True:
        raise LiteLLMRetriesError("Router(disable_cooldowns)", kwargs.get("disable_cooldowns"),
                                  "build the router with disable_cooldowns=True; the fleet's "
                                  "cooldowns come from the coordinator")


def _check_router(router: Any) -> None:
    """Refuse a router that retries, cools deployments down or falls back on its own."""
    try:
        settings = router.settings()
        values = dict(settings.as_dict())
        cooldowns_off = getattr(settings, "disable_cooldowns", None)
    except Exception as exc:
        raise TypeError(f"router must be a litellm.Router, got {type(router).__name__}") from exc
    if values.get("num_retries") != 0:
        raise LiteLLMRetriesError("Router(num_retries)", values.get("num_retries"),
                                  "build the router with num_retries=0")
    if cooldowns_off is not True:
        raise LiteLLMRetriesError("Router(disable_cooldowns)", cooldowns_off,
                                  "build the router with disable_cooldowns=True; the fleet's "
                                  "cooldowns come from the coordinator")
    for name in _ROUTER_FALLBACKS:
        value = values.get(name, getattr(settings, name, None))
        if value:
            raise LiteLLMRetriesError(f"Router({name})", value,
                                      "leave it out; retry.fallbackModels names the fallback "
                                      "model groups")
    for name in ("retry_policy", "model_group_retry_policy", "enable_weighted_failover",
                 "enable_mid_stream_fallback_continuation"):
        if values.get(name):
            raise LiteLLMRetriesError(f"Router({name})", values[name], "leave it out")


class BrainRouter:
    """A ``litellm.Router``'s ``completion`` / ``acompletion`` with the brain as their retry
    policy (build it with :meth:`BrainLiteLLM.router`). The router still picks the deployment
    of a model group (its routing strategy); the brain decides whether and when to ask again,
    and switches to ``retry.fallbackModels`` — model group names of this router. The coordinator
    key of a group is its deployments' endpoint (as :class:`BrainLiteLLM`'s) when they share
    one, else ``("litellm-router", group)``. Other router members are the router's
    (``brain_router.router``).

    Raises :class:`LiteLLMRetriesError` for a router with ``num_retries`` above 0, cooldowns
    on, LiteLLM fallbacks or a retry policy; :class:`~fsm.core.settings.SettingsError` for a
    ``fallbackModels`` name the router cannot route."""

    def __init__(self, router: Any, settings: RetrySettings | Mapping[str, Any] | None = None, *,
                 on_event: Callable[[Event], Any] | None = None, coordinator: Any = None,
                 clock: Any = None, sleep: Callable[[float], Any] | None = None,
                 random: Callable[[], float] | None = None, provider: str | None = None) -> None:
        resolved = refuse_unsupported(Chain(settings, sync=True).settings,
                                      "the LiteLLM integration", TIMEOUT_KEYS)
        _check_router(router)
        registry = router.registry()
        unknown = [m for m in resolved.fallback_models
                   if not registry.resolve(m, kind="recognized")]
        if unknown:
            raise SettingsError("fallbackModels", list(resolved.fallback_models),
                                f"model groups of the router's model_list ({unknown[0]!r} is not "
                                f"one it can route)")
        options: dict[str, Any] = {"on_event": on_event, "clock": clock}
        if random is not None:
            options["random"] = random
        self._calls = _Host(resolved, options, coordinator, clock, sleep, provider)
        self.settings, self.coordinator, self.provider = resolved, coordinator, provider
        self.router = router
        self._keys: dict[str, tuple[str, str]] = {}
        self._version: Any = None
        self._secrets: tuple[str, ...] = ()

    def _group(self, model: str) -> tuple[tuple[str, str], tuple[str, ...]]:
        registry = self.router.registry()
        version = registry.version
        if version != self._version:
            self._keys, self._version = {}, version
            found: list[str] = []
            for deployment in registry.all() or ():
                found += _secret_of((deployment.get("litellm_params") or {}).get("api_key"))
            self._secrets = tuple(dict.fromkeys(found))
        key = self._keys.get(model)
        if key is None:
            keys = {_endpoint_key(str(params.get("model", model)), params, self.provider)
                    for params in (d.get("litellm_params") or {}
                                   for d in registry.deployments(model) or ())}
            key = keys.pop() if len(keys) == 1 else (self.provider or "litellm-router", model)
            self._keys[model] = key
        return key, self._secrets

    def _prepare(self, model: Any, kwargs: dict[str, Any]) -> tuple[tuple[str, str], tuple[str, ...]]:
        if not isinstance(model, str) or not model:
            raise TypeError(f"model must be a model group of the router, got {model!r}")
        # a router's own num_retries (0, checked below) overrides the process-wide one
        _refuse_call(kwargs, "router call ", process_wide=False)
        _check_router(self.router)  # its settings can change after construction (router.apply)
        key, secrets = self._group(model)
        return key, secrets + _secret_of(kwargs.get("api_key"))

    def completion(self, model: str, messages: list[Any] | None = None, **kwargs: Any) -> Any:
        """``router.completion(model, messages, **kwargs)`` under the brain (streams as
        :meth:`BrainLiteLLM.completion`)."""
        key, secrets = self._prepare(model, kwargs)
        return self._calls._drive_sync(
            lambda m: self.router.completion(m, messages, **kwargs), model, key, secrets,
            bool(kwargs.get("stream")))

    async def acompletion(self, model: str, messages: list[Any] | None = None, **kwargs: Any) -> Any:
        """``await router.acompletion(model, messages, **kwargs)`` under the brain."""
        key, secrets = self._prepare(model, kwargs)
        return await self._calls._drive_async(
            lambda m: self.router.acompletion(m, messages, **kwargs), model, key, secrets,
            bool(kwargs.get("stream")))
