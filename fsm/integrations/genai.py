"""The brain around the Google Gen AI SDK's calls (``pip install 'retry-fsm[genai]'``).

:class:`BrainClient` wraps a ``google.genai.Client``: its ``models.generate_content`` and
``models.generate_content_stream``, and the same two of ``client.aio`` (async), run their
attempts on the one loop (:class:`~fsm.host.chain.Chain`, docs/architecture.md "The loop"), so
each decision is the brain's — the classification of Gemini's errors (a 429
``RESOURCE_EXHAUSTED`` or a 503 ``UNAVAILABLE`` is retried, a 400 ``INVALID_ARGUMENT`` or a
quota whose limit is 0 is not), retry hints under ``retryHints: "honor"`` (``RetryInfo``'s
``retryDelay`` in the error's details, ``retry-after`` headers), the retry budget, the fleet's
cooldowns with a ``coordinator`` — with events per attempt and chain ends (this runs as
written, with ``GEMINI_API_KEY`` and ``GOOGLE_GEMINI_BASE_URL``, the variables the SDK itself
reads; the tests point them at the fault server)::

    import asyncio, os
    from google import genai
    from fsm.integrations.genai import BrainClient, http_options

    client = genai.Client(api_key=os.environ["GEMINI_API_KEY"],   # the SDK retries off:
                          http_options=http_options(base_url=os.environ["GOOGLE_GEMINI_BASE_URL"]))
    gemini = BrainClient(client, {"maxRetries": 5, "retryHints": "honor"}, on_event=print)
    reply = gemini.models.generate_content(model="gemini-2.5-flash", contents="hi")
    for chunk in gemini.models.generate_content_stream(model="gemini-2.5-flash", contents="hi"):
        print(chunk.text, end="")

    async def main():
        reply = await gemini.aio.models.generate_content(model="gemini-2.5-flash", contents="hi")
        print(reply.text)

    asyncio.run(main())

**Streams**: an error inside a stream (a connection cut, an ``{"error": {...}}`` event) reaches
the brain like any other. Before any chunk reached the caller it is retried as a failed
request; after, it is the brain's ``retry.afterOutput`` decision (docs/policy.md §3 D12: under
``"retry"`` the stream starts again and the caller receives the new attempt's chunks after
the ones already given; under ``"stop"`` the chain ends ``output_streamed``). The async
``generate_content_stream`` returns once the first chunk has arrived (an error before it raises
at the ``await``, as the SDK's HTTP errors do).

**One retry owner**: build the client with :func:`http_options` (``HttpRetryOptions(
attempts=1)``: the SDK's tenacity retries off, and with them the async client's own retry of an
``aiohttp`` connection error). A client built without ``retry_options`` (the SDK's default) is
accepted too: its async calls then go with one attempt in their ``config.http_options``. A
client built with retries (``HttpRetryOptions(attempts=N)`` with N > 1, or ``attempts`` unset,
which the SDK reads as 5) or a call whose ``config`` asks for them raises
:class:`SDKRetriesError` before any request.

Other attributes (``client.files``, ``client.chats``, ``models.count_tokens``…) are the
wrapped client's, not retried by the brain.

Exceptions (docs/integrations.md "Google Gen AI"): what the SDK raises — its
``google.genai.errors.APIError`` (``ClientError``, ``ServerError``), or the transport's
connection error — re-raised when the chain ends without success, with ``retry-fsm: endReason
<reason>`` in its ``__notes__`` (``retry-fsm: not retried (endReason: …, attempt 0)`` for a
refusal at rest) and its text scrubbed of the API key and of any credential the request carried
(``fsm.core.redact.scrub_exception``); a first request the gate refuses without sending
raises :class:`~fsm.RetryChainError` (no ``__cause__``: there is no SDK error);
:class:`~fsm.core.settings.SettingsError` at construction for a key the wrapper cannot act on
(``firstTokenTimeoutMs``, ``idleTimeoutMs``, ``attemptTimeoutMs``: set ``HttpOptions(timeout=ms)``).
``retry.fallbackModels`` is honoured: a retry after the switch calls the fallback model.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator, Mapping
from typing import Any, Callable

from fsm.core.events import Event
from fsm.core.settings import RetrySettings
from fsm.host.chain import RETRY_OWNER, TIMEOUT_KEYS, Chain
from fsm.host.errors import RetryChainError
from fsm.integrations._drive import (BrainHost, attempts_async, attempts_sync, mark_ended, owned,
                                     owned_async)
from fsm.integrations._extra import require

require("google.genai", "genai")
from google.genai import types  # noqa: E402

__all__ = ["BrainClient", "SDKRetriesError", "http_options"]

_SDK_DEFAULT_ATTEMPTS = 5
"""What ``HttpRetryOptions(attempts=None)`` means to google-genai (its ``_RETRY_ATTEMPTS``)."""


class SDKRetriesError(ValueError):
    """The Google Gen AI client (or one call's ``config``) retries on its own: ``where`` names
    the options, ``attempts`` the attempts they allow. Give it ``HttpRetryOptions(attempts=1)``
    (:func:`http_options`): one retry owner, docs/integrations.md."""

    def __init__(self, where: str, attempts: int) -> None:
        self.where = where
        self.attempts = attempts
        super().__init__(
            f"{where} retries on its own (HttpRetryOptions allows {attempts} attempts) under "
            f"fsm.integrations.genai.BrainClient: build it with "
            f"http_options=fsm.integrations.genai.http_options(...) "
            f"(HttpRetryOptions(attempts=1); one retry owner, docs/integrations.md)")


def http_options(**fields: Any) -> Any:
    """``google.genai.types.HttpOptions(retry_options=HttpRetryOptions(attempts=1), **fields)``:
    the client's HTTP options with the SDK's retries off (``base_url=``, ``timeout=`` in ms,
    ``headers=``… as ``HttpOptions`` takes them). Raises :class:`SDKRetriesError` for a
    ``retry_options`` allowing more than one attempt."""
    options = types.HttpOptions(**fields)
    return _one_attempt(options, "http_options(retry_options=...)")


def _attempts(retry: Any) -> int:
    attempts = getattr(retry, "attempts", None)
    if attempts is None:
        return _SDK_DEFAULT_ATTEMPTS
    return max(1, int(attempts))  # the SDK reads 0 as 1


def _one_attempt(options: Any, where: str) -> Any:
    """``options`` (``HttpOptions``, a mapping or None) with ``retry_options`` of one attempt;
    :class:`SDKRetriesError` when they allow more."""
    if options is None:
        options = types.HttpOptions()
    elif isinstance(options, Mapping):
        options = types.HttpOptions.model_validate(dict(options))
    retry = options.retry_options
    if retry is None:
        return options.model_copy(update={"retry_options": types.HttpRetryOptions(attempts=1)})
    if _attempts(retry) > 1:
        raise SDKRetriesError(where, _attempts(retry))
    return options


_WHERE = "the call's config.http_options"


def _call_config(config: Any, inject: bool) -> Any:
    """The call's ``config``: refused (:class:`SDKRetriesError`) when its
    ``http_options.retry_options`` allow more than one attempt; with ``inject``, given
    ``retry_options`` of one attempt (a mapping stays a mapping, a ``GenerateContentConfig`` is
    copied), else returned as it is (no copy: the common case costs nothing)."""
    options = config.get("http_options") if isinstance(config, Mapping) else getattr(config, "http_options", None)
    if not inject:
        if options is not None:
            retry = options.get("retry_options") if isinstance(options, Mapping) else options.retry_options
            if retry is not None and _attempts(retry if not isinstance(retry, Mapping)
                                               else types.HttpRetryOptions.model_validate(retry)) > 1:
                _one_attempt(options, _WHERE)  # raises, naming the attempts
        return config
    if config is None:
        return types.GenerateContentConfig(http_options=_one_attempt(None, _WHERE))
    if isinstance(config, Mapping):
        return {**config, "http_options": _one_attempt(options, _WHERE)}
    return config.model_copy(update={"http_options": _one_attempt(options, _WHERE)})


def _client_retry(client: Any) -> Any:
    """The client's own ``HttpOptions.retry_options`` (None when unset: the SDK's default
    client does not retry with tenacity, but its async client retries an aiohttp connection
    error once, after 1–10 s, unless a call's ``retry_options`` are set)."""
    api = getattr(client, "_api_client", None)
    options = getattr(api, "_http_options", None)
    return getattr(options, "retry_options", None)


def _model_name(model: Any) -> str:
    name = model if isinstance(model, str) and model else "default"
    return name.rsplit("/", 1)[-1]


_DONE = object()
_TAKEN = object()


class BrainClient(BrainHost):
    """A ``google.genai.Client`` whose generate calls run under the retry brain.

    Args:
        client: the ``google.genai.Client`` (Gemini API or Vertex AI); its retries must be off
            (:func:`http_options`), else :class:`SDKRetriesError`.
        settings: :class:`~fsm.core.settings.RetrySettings` or the file's ``retry`` mapping;
            the timeouts are refused (:class:`~fsm.core.settings.SettingsError`).
        on_event: called with each :mod:`fsm.core.events` event.
        coordinator: the fleet's coordinator (docs/fleet.md); async calls ask it on their loop,
            sync calls on the process's background coordinator loop.
        clock: a host clock (``time_ms()``, ``call_later``, ``sleep``); None = real time.
        sleep: ``sleep(seconds)`` for sync calls (default the clock's, else ``time.sleep``).
        random: floats in [0, 1) for jitter.
        provider: the coordinator key's provider name (``CoordKey(provider, model)``, the model
            being each call's ``model`` without its ``models/`` prefix).

    ``models`` and ``aio.models`` are the wrapped generate calls; every other attribute is the
    client's own. One object serves any number of concurrent calls (a chain per call).
    """

    def __init__(self, client: Any, settings: RetrySettings | Mapping[str, Any] | None = None, *,
                 on_event: Callable[[Event], Any] | None = None, coordinator: Any = None,
                 clock: Any = None, sleep: Callable[[float], Any] | None = None,
                 random: Callable[[], float] | None = None, provider: str = "google") -> None:
        if not hasattr(client, "models") or not hasattr(client, "aio"):
            raise TypeError(f"client must be a google.genai.Client, got {type(client).__name__}")
        retry = _client_retry(client)
        if retry is not None and _attempts(retry) > 1:
            raise SDKRetriesError("the google.genai.Client", _attempts(retry))
        self._inject_async = retry is None  # each async call then carries one attempt
        self._host(settings, "the Google Gen AI client wrapper", TIMEOUT_KEYS, on_event=on_event,
                   coordinator=coordinator, clock=clock, sleep=sleep, random=random)
        self.client = client
        self.provider = provider
        api_key = getattr(getattr(client, "_api_client", None), "api_key", None)
        self._secrets: tuple[str, ...] = (api_key,) if isinstance(api_key, str) and api_key else ()
        self.models = _Models(self, client.models, sync=True)
        self.aio = _Aio(self, client.aio)

    def __getattr__(self, name: str) -> Any:
        if name == "client":  # not set yet (a failed __init__, a copy): no recursion
            raise AttributeError(name)
        return getattr(self.client, name)

    # ------------------------------------------------------------------ plumbing
    def _chain(self, model: Any, *, sync: bool) -> Chain:
        return self._new_chain(sync=sync, provider=self.provider, model=_model_name(model))

    def _raise_end(self, chain: Chain, exc: BaseException) -> None:
        """Raise the SDK's own exception once the chain ended without success (the module
        docstring's contract), scrubbed of the key and the request's credentials."""
        from fsm.core.redact import request_secrets, scrub_exception
        # its text, its parsed body (an APIError's ``details``) and its response's body
        scrub_exception(exc, self._secrets + request_secrets(exc))
        error = chain.error()
        end = chain.end
        if error is not exc:  # a chain that ended, or an overflow the loop names
            reason = end.end_reason if end is not None else "overflow"
            note = f"retry-fsm: endReason {reason}"
            if end is None:
                note = "retry-fsm: not retried (context overflow)"
            if note not in getattr(exc, "__notes__", ()):
                exc.add_note(note)
        raise mark_ended(exc)

    def _failed_sync(self, chain: Chain, exc: Exception, streamed: bool) -> None:
        """One failed attempt (sync): wait for the next one, or raise what the caller sees."""
        delay = chain.failed_sync(exc, secrets=self._secrets, output_streamed=streamed)
        if delay is None:
            self._raise_end(chain, exc)
        try:
            chain.pause_sync(delay, self._sleep_ms)
        except RetryChainError:  # the chain ended while waiting (its deadline, the budget)
            self._raise_end(chain, exc)

    async def _failed(self, chain: Chain, exc: Exception, streamed: bool) -> None:
        delay = await chain.failed(exc, secrets=self._secrets, output_streamed=streamed)
        if delay is None:
            self._raise_end(chain, exc)
        try:
            await chain.pause(delay, self._pause())
        except RetryChainError:
            self._raise_end(chain, exc)

    # ------------------------------------------------------------------ sync calls
    def _generate_sync(self, models: Any, model: Any, kwargs: dict) -> Any:
        config = _call_config(kwargs.pop("config", None), False)
        chain = self._chain(model, sync=True)
        with owned(chain):
            return attempts_sync(chain, lambda name: models.generate_content(
                model=name or model, config=config, **kwargs),
                lambda exc: self._failed_sync(chain, exc, False), self._sleep_ms)

    def _stream_sync(self, models: Any, model: Any, kwargs: dict) -> Iterator[Any]:
        config = _call_config(kwargs.pop("config", None), False)  # SDKRetriesError at the call
        return self._chunks_sync(models, model, config, kwargs)

    def _chunks_sync(self, models: Any, model: Any, config: Any, kwargs: dict) -> Generator[Any, None, None]:
        chain = self._chain(model, sync=True)
        stream: Any = None
        try:
            chain.pause_sync(chain.start_sync(), self._sleep_ms)
            streamed = False  # a chunk of the chain reached the caller
            while True:
                owner = RETRY_OWNER.set(chain)  # only while the SDK works, never across a yield
                try:
                    if stream is None:
                        stream = iter(models.generate_content_stream(
                            model=chain.switched_model or model, config=config, **kwargs))
                    chunk = next(stream, _DONE)
                except Exception as exc:
                    _close(stream)
                    stream = None
                    self._failed_sync(chain, exc, streamed)
                    continue
                finally:
                    RETRY_OWNER.reset(owner)
                if chunk is _DONE:
                    chain.succeeded()
                    return
                streamed = True
                yield chunk
        except BaseException:  # the caller stopped early (GeneratorExit), an interrupt
            chain.cancel()
            raise
        finally:
            _close(stream)
            chain.close()

    # ------------------------------------------------------------------ async calls
    async def _generate(self, models: Any, model: Any, kwargs: dict) -> Any:
        config = _call_config(kwargs.pop("config", None), self._inject_async)
        chain = self._chain(model, sync=False)
        async with owned_async(chain):
            return await attempts_async(chain, lambda name: models.generate_content(
                model=name or model, config=config, **kwargs),
                lambda exc: self._failed(chain, exc, False), self._pause())

    async def _stream(self, models: Any, model: Any, kwargs: dict) -> AsyncIterator[Any]:
        config = _call_config(kwargs.pop("config", None), self._inject_async)
        chunks = self._chunks(models, model, config, kwargs)
        try:
            first = await chunks.__anext__()  # errors before any output raise here
        except StopAsyncIteration:
            first = _DONE
        except BaseException:
            await chunks.aclose()
            raise
        return _Resumed(first, chunks)

    async def _chunks(self, models: Any, model: Any, config: Any, kwargs: dict) -> AsyncGenerator[Any, None]:
        chain = self._chain(model, sync=False)
        stream: Any = None
        try:
            await chain.pause(await chain.start(), self._pause())
            streamed = False
            while True:
                owner = RETRY_OWNER.set(chain)
                try:
                    if stream is None:
                        stream = await models.generate_content_stream(
                            model=chain.switched_model or model, config=config, **kwargs)
                    chunk = await anext(stream, _DONE)
                except Exception as exc:
                    await _aclose(stream)
                    stream = None
                    await self._failed(chain, exc, streamed)
                    continue
                finally:
                    RETRY_OWNER.reset(owner)
                if chunk is _DONE:
                    chain.succeeded()
                    return
                streamed = True
                yield chunk
        except BaseException:  # cancelled, the caller stopped early (GeneratorExit)
            chain.cancel()
            raise
        finally:
            await _aclose(stream)
            await chain.aclose()


class _Resumed:
    """An async iterator yielding ``first`` (already received), then the rest of ``rest``."""

    __slots__ = ("_first", "_rest")

    def __init__(self, first: Any, rest: Any) -> None:
        self._first, self._rest = first, rest

    def __aiter__(self) -> "_Resumed":
        return self

    async def __anext__(self) -> Any:
        first, self._first = self._first, _TAKEN
        if first is _DONE:
            raise StopAsyncIteration
        if first is not _TAKEN:
            return first
        return await self._rest.__anext__()

    async def aclose(self) -> None:
        """Stop the stream early: a running chain ends ``cancelled``."""
        await self._rest.aclose()


def _close(stream: Any) -> None:
    close = getattr(stream, "close", None)
    if close is not None:
        try:
            close()
        except Exception:
            pass


async def _aclose(stream: Any) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:
            pass


class _Models:
    """``client.models`` (or ``client.aio.models``) with the generate calls under the brain."""

    def __init__(self, brain: BrainClient, models: Any, *, sync: bool) -> None:
        self._brain, self._models, self._sync = brain, models, sync

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._models, name)

    def generate_content(self, *, model: str, **kwargs: Any) -> Any:
        """``models.generate_content(model=..., contents=..., config=...)`` under the brain
        (sync: the response; async: a coroutine)."""
        if self._sync:
            return self._brain._generate_sync(self._models, model, kwargs)
        return self._brain._generate(self._models, model, kwargs)

    def generate_content_stream(self, *, model: str, **kwargs: Any) -> Any:
        """``models.generate_content_stream(...)`` under the brain: sync, an iterator of
        chunks; async, a coroutine whose result is an async iterator of chunks."""
        if self._sync:
            return self._brain._stream_sync(self._models, model, kwargs)
        return self._brain._stream(self._models, model, kwargs)


class _Aio:
    """``client.aio`` with ``models`` under the brain."""

    def __init__(self, brain: BrainClient, aio: Any) -> None:
        self._aio = aio
        self.models = _Models(brain, aio.models, sync=False)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._aio, name)
