"""httpx2 transports that retry under the brain (``pip install 'retry-fsm[httpx2]'``).

The official SDKs (openai ≥ 3, anthropic ≥ 1) and pydantic-ai send their requests through an
``httpx2`` client; a transport sits under all of them::

    import httpx2
    import openai
    from fsm.integrations.httpx2 import AsyncRetryTransport

    transport = AsyncRetryTransport(settings={"retryHints": "honor"}, on_event=print)
    client = openai.AsyncOpenAI(max_retries=0,           # one retry owner: the brain
                                http_client=httpx2.AsyncClient(transport=transport))
    reply = await client.chat.completions.create(
        model="gpt-5", messages=[{"role": "user", "content": "hi"}])

Each request is one call to the brain (docs/policy.md): an HTTP error status (with its body and
headers — ``retry-after``, ``x-ratelimit-reset-*``, ``anthropic-ratelimit-*``) or a connection
error is classified, and a retryable one is sent again after the brain's backoff (retry hints,
the retry budget and the fleet's cooldowns included; events to ``on_event``). When the chain
ends without success, the transport returns the last response (or raises the last connection
error), so the SDK raises its own exception as it would have — its text free of any credential
of the request that the provider echoed in its body (the body handed back is scrubbed).

What a transport cannot see, and when to use :func:`fsm.retrying` (the runner) or the agent
session instead:

- an error *inside* a 200 stream (Anthropic's ``overloaded_error`` event, a stream cut after
  the first tokens): the response has already been handed to the SDK;
- whether streamed output reached the user (replay safety, ``retry.afterOutput``);
- the model's answer (a context overflow is a 400 here, handed back to the SDK).

What it acts on beyond the status (docs/integrations.md, the one table): a fallback model
(``retry.fallbackModels``: the retries the brain switches send the JSON body with its
``model`` rewritten; a body that is not a JSON object naming a model is sent as it is, said in
a log line) and ``retry.attemptTimeoutMs`` (an attempt is bounded up to its response headers
and the error body the transport reads: the async transport on its clock, the sync one through
httpx2's per-request timeouts, which bound each phase — connect, write, each read — rather than
their sum); an attempt that reaches it is a failed attempt (``httpx2.TimeoutException``), the
brain decides as for any.

A request whose body is a one-shot stream (an async generator, a file being read) cannot be
replayed: its failure is not retried, and a note on the exception (or a log line for a
returned error response) says so. A multipart upload whose files are held in memory (the SDKs'
``files.create(file=(name, bytes))``) is replayed like a JSON body.

**One retry owner** (docs/policy.md §12): a call already run by an fsm host (the runner, the
tenacity strategy, a session) passes straight through this transport; a request carrying
``x-stainless-retry-count`` above 0 means the SDK's own retries are on as well, and the
transport warns once.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import logging
import time
import warnings
from collections.abc import Mapping
from typing import Any, Callable

from fsm.core.brain import seconds_text
from fsm.core.events import Event
from fsm.core.settings import RetrySettings
from fsm.host.chain import RETRY_OWNER as OWNER
from fsm.host.chain import TIMEOUT_KEYS, Chain, refuse_unsupported
from fsm.host.clock import wait_ms
from fsm.host.kernel import provider_id
from fsm.integrations._extra import require

httpx2 = require("httpx2", "httpx2")

__all__ = ["RetryTransport", "AsyncRetryTransport", "OWNER", "SDKRetriesWarning"]

log = logging.getLogger("fsm.integrations.httpx2")

NOT_REPLAYABLE = ("not retried: the request body is a one-shot stream that cannot be sent "
                  "again (give the client bytes or a JSON body)")


class SDKRetriesWarning(UserWarning):
    """The SDK under the transport retries on its own too (set ``max_retries=0``)."""


_IN_MEMORY = (str, bytes, bytearray, io.BytesIO, io.StringIO)


def _replayable(request: Any) -> bool:
    """True when ``request``'s body can be sent again as it was: bytes (a JSON body), or a
    multipart form whose every file is held in memory (``files.create(file=(name, bytes))``;
    httpx2 renders such a form afresh on each send, rewinding an ``io.BytesIO``). A body read
    from a generator, a pipe or a file on disk is a one-shot stream (docs/integrations.md,
    "What a transport cannot replay")."""
    stream = request.stream
    if isinstance(stream, httpx2.ByteStream):
        return True
    fields = getattr(stream, "fields", None)
    if type(stream).__name__ != "MultipartStream" or not isinstance(fields, list):
        return False
    return all(isinstance(getattr(field, "file", ""), _IN_MEMORY) for field in fields)


def _model(request: Any) -> str:
    """The ``model`` of a JSON request body, or ``"default"``."""
    stream = request.stream
    if not isinstance(stream, httpx2.ByteStream):
        return "default"
    try:
        body = json.loads(request.content or b"null")
    except (ValueError, UnicodeDecodeError, httpx2.RequestNotRead):
        return "default"
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) and model else "default"


def _with_model(request: Any, model: str) -> Any:
    """``request`` with its JSON body's ``model`` set to ``model`` (a fallback of
    ``retry.fallbackModels``, docs/policy.md §13.3), or ``request`` itself when its body is not
    a JSON object naming a model (logged: the retry goes as it is)."""
    body: Any = None
    if isinstance(request.stream, httpx2.ByteStream):
        try:
            body = json.loads(request.content or b"null")
        except (ValueError, UnicodeDecodeError, httpx2.RequestNotRead):
            body = None
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        log.warning("cannot switch to the fallback model %r: the request body is not a JSON "
                    "object naming a model; the retry goes unchanged", model)
        return request
    if body["model"] == model:
        return request
    content = json.dumps({**body, "model": model}, ensure_ascii=False,
                         separators=(",", ":")).encode("utf-8")
    headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() != "content-length"]
    return httpx2.Request(request.method, request.url, headers=headers, content=content,
                          extensions=request.extensions)


def _fallback_entry(entry: str, provider: str) -> str:
    """The model a fallback entry names for this provider (``"provider/model"`` loses its
    prefix when it names the provider the request goes to)."""
    prefix, _, rest = entry.partition("/")
    return rest if rest and prefix == provider else entry


def _timed_out(limit_ms: int, request: Any) -> Any:
    return httpx2.TimeoutException(f"attempt timed out after {seconds_text(limit_ms)} "
                                   "(retry.attemptTimeoutMs)", request=request)


def _secrets(request: Any) -> tuple[str, ...]:
    """The credentials ``request`` carries (its ``authorization``, ``x-api-key``, ``api-key``
    ... headers, the token after the scheme, a ``?key=`` or userinfo in its URL), registered
    with :data:`fsm.core.redact.SECRETS` as the runner does: an error body that echoes one is
    scrubbed before it reaches an event or a log (fsm.core.redact)."""
    from fsm.core.redact import register_secret, request_secrets
    carrier = Exception()
    carrier.request = request  # type: ignore[attr-defined]  # request_secrets reads exc.request
    found = request_secrets(carrier)
    if found:
        register_secret(*found)
    return found


def _scrub(exc: BaseException, request: Any) -> None:
    """Scrub, in place, the text of ``exc`` (and of its causes) before the transport re-raises
    it: a wrapped transport or a proxy layer may name the request's URL, its ``user:password@``
    or ``?api_key=`` included (:func:`fsm.core.redact.scrub_exception`; type and causes kept)."""
    from fsm.core.redact import scrub_exception
    scrub_exception(exc, _secrets(request))


def _scrubbed(response: Any, request: Any) -> Any:
    """The error ``response`` (body read) handed back to the SDK, which builds its exception's
    text and ``body`` from it: when the body names a credential the request carried (a gateway
    that echoes the key) or one of :data:`fsm.core.redact.SECRETS`, a copy whose body is the
    scrubbed text (``content-encoding`` dropped: the copy is plain), else ``response`` itself."""
    from fsm.core.redact import scrub_secrets
    try:
        text = response.text
    except Exception:  # an undecodable body: nothing the SDK could show either
        return response
    clean = scrub_secrets(text, _secrets(request))
    if clean == text:
        return response
    raw = clean.encode(response.encoding or "utf-8", errors="replace")
    headers = [(k, v) for k, v in response.headers.multi_items()
               if k.lower() not in _DROPPED + ("content-encoding",)]
    headers.append(("content-length", str(len(raw))))
    copy = httpx2.Response(response.status_code, headers=headers, stream=httpx2.ByteStream(raw),
                           request=request, extensions=response.extensions)
    copy.read()
    return copy


def _error_message(response: Any) -> Any:
    """The failed assistant message for an HTTP error ``response`` (body already read)."""
    from fsm.providers.sdk_errors import status_error_facts
    try:
        body: Any = response.text
    except Exception:  # an undecodable body: no text, the status still speaks
        body = None
    return status_error_facts(response.status_code, body, response.headers).to_message()


class _Base:
    def __init__(self, wrapped: Any, settings: RetrySettings | Mapping[str, Any] | None,
                 on_event: Callable[[Event], Any] | None, coordinator: Any,
                 provider: str | None, clock: Any, random: Callable[[], float] | None,
                 *, sync: bool) -> None:
        self.wrapped = wrapped
        self._chain_options: dict[str, Any] = {"on_event": on_event, "clock": clock}
        if random is not None:
            self._chain_options["random"] = random
        # a bad key, or one a transport cannot act on, raises here, once
        self.settings = refuse_unsupported(Chain(settings, sync=True).settings,
                                           "an httpx2 transport",
                                           tuple(k for k in TIMEOUT_KEYS
                                                 if k != "attemptTimeoutMs"))
        self.coordinator = coordinator
        self.provider = provider
        self.clock = clock
        self._warned = False
        self._may_ask = not sync or coordinator is not None

    def _settings_for(self, request: Any) -> RetrySettings:
        """The settings of ``request``'s call: :attr:`settings` resolved for its provider
        (:func:`~fsm.host.kernel.provider_id`: ``provider``, else the URL's host) and its JSON
        body's ``model`` (``retry.providers``, docs/policy.md §13.4)."""
        if not self.settings.providers:
            return self.settings
        url = request.url
        return self.settings.for_provider(provider_id(self.provider, url.host, url.port),
                                          _model(request))

    def _chain_first(self, settings: RetrySettings) -> bool:
        """The chain is built before the first request only when the coordinator is asked
        before it (the gate) or told after a success (the pacer's signal, the budget's
        credit): otherwise a request that succeeds at once needs no chain, and a failed
        first attempt builds it then (the same steps from the same first failure)."""
        return self._may_ask and settings.needs_coordinator

    def _chain(self, request: Any, *, sync: bool) -> Chain:
        """The chain of ``request``'s call (its settings resolved for its provider and model:
        :class:`~fsm.host.chain.Chain`)."""
        url = request.url
        return Chain(self.settings, sync=sync, coordinator=self.coordinator,
                     provider=provider_id(self.provider, url.host, url.port),
                     model=_model(request), **self._chain_options)

    def _next(self, request: Any, chain: Chain) -> Any:
        """The request of the next attempt: the fallback model once the brain switched
        (docs/policy.md §13.3), else the same."""
        model = chain.switched_model
        if model is None:
            return request
        return _with_model(request, _fallback_entry(model, chain.provider))

    def _check_sdk_retries(self, request: Any) -> None:
        count = request.headers.get("x-stainless-retry-count", "0")
        # ASCII digits only: "²" or "٣" pass str.isdigit() but int() refuses them
        if not self._warned and count.isascii() and count.isdigit() and count.strip("0"):
            self._warned = True
            warnings.warn("the SDK over this transport retries on its own too "
                          "(x-stainless-retry-count > 0): give the client max_retries=0 so the "
                          "brain is the one retry owner", SDKRetriesWarning, stacklevel=2)


class AsyncRetryTransport(_Base, httpx2.AsyncBaseTransport):
    """An ``httpx2.AsyncBaseTransport`` that retries failed requests under the brain.

    Args:
        wrapped: the transport that sends (default ``httpx2.AsyncHTTPTransport()``).
        settings: :class:`~fsm.core.settings.RetrySettings` or the file's ``retry`` mapping.
        on_event: called with each :mod:`fsm.core.events` event.
        coordinator: the fleet's coordinator (docs/fleet.md); None = the event loop's
            in-process one when hints are honoured or a budget is set.
        provider: the provider's name for the coordinator key and ``retry.providers`` (its
            entries, and the ``"provider/model"`` entry of the JSON body's ``model``, apply
            to each request: docs/policy.md §13.4); None = from the request's host
            (``api.openai.com`` → ``openai``).
        clock: a host clock (``time_ms()``, ``call_later``); None = real time.
        random: floats in [0, 1) for jitter.
    """

    def __init__(self, wrapped: Any = None, *, settings: RetrySettings | Mapping[str, Any] | None = None,
                 on_event: Callable[[Event], Any] | None = None, coordinator: Any = None,
                 provider: str | None = None, clock: Any = None,
                 random: Callable[[], float] | None = None) -> None:
        super().__init__(wrapped or httpx2.AsyncHTTPTransport(), settings, on_event, coordinator,
                         provider, clock, random, sync=False)

    async def handle_async_request(self, request: Any) -> Any:
        """Send ``request``, retrying as the brain decides (see the module docstring)."""
        self._check_sdk_retries(request)
        if OWNER.get() is not None:
            return await self.wrapped.handle_async_request(request)
        replayable = _replayable(request)  # before sending: reading a stream makes it bytes
        settings = self._settings_for(request)
        chain = self._chain(request, sync=False) if self._chain_first(settings) else None
        token = OWNER.set(self)
        pause = functools.partial(wait_ms, self.clock)
        try:
            if chain is not None:
                await chain.pause(await chain.start(), pause)  # the gate of the first request
            while True:
                try:
                    response = await self._attempt(request, settings.attempt_timeout_ms)
                except httpx2.TransportError as exc:
                    if not replayable:
                        exc.add_note(NOT_REPLAYABLE)
                        raise
                    chain = chain or self._chain(request, sync=False)
                    delay = await chain.failed(exc, secrets=_secrets(request))
                    if delay is None:
                        _note_end(exc, chain)
                        raise
                else:
                    if response.status_code < 400:
                        if chain is not None:
                            chain.succeeded()
                        return response
                    response = await _aread(response, request)
                    if not replayable:
                        log.info("%s %s", response.status_code, NOT_REPLAYABLE)
                        return _scrubbed(response, request)
                    chain = chain or self._chain(request, sync=False)
                    delay = await chain.failed(message=_error_message(response),
                                               secrets=_secrets(request))
                    if delay is None:
                        return _scrubbed(response, request)
                    await response.aclose()
                await chain.pause(delay, pause)  # the backoff, the budget re-check, the gate
                request = self._next(request, chain)
        except BaseException as exc:  # a started chain always ends, exactly once
            _scrub(exc, request)
            if chain is not None and chain.running:
                if isinstance(exc, Exception):
                    delay = await chain.failed(exc)
                    if delay is not None:
                        chain.cancel()
                else:
                    chain.cancel()
            raise
        finally:
            OWNER.reset(token)
            if chain is not None:
                chain.close()

    async def _attempt(self, request: Any, limit: int | None) -> Any:
        """One attempt, bounded by ``limit`` ms (``retry.attemptTimeoutMs``) up to its
        response headers (on :attr:`clock` when it has ``call_later``):
        ``httpx2.TimeoutException`` at the bound."""
        if limit is None:
            return await self.wrapped.handle_async_request(request)
        task = asyncio.ensure_future(self.wrapped.handle_async_request(request))
        fired: list[bool] = []

        def expire() -> None:
            if not task.done():
                fired.append(True)
                task.cancel()
        clock = self.clock if hasattr(self.clock, "call_later") else asyncio.get_running_loop()
        handle = clock.call_later(limit / 1000, expire)
        try:
            return await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if fired and (me is None or not me.cancelling()):  # ours, not the caller's cancel
                raise _timed_out(limit, request) from None
            raise
        finally:
            handle.cancel()
            if not task.done():
                task.cancel()

    async def aclose(self) -> None:
        """Close the wrapped transport."""
        await self.wrapped.aclose()


class RetryTransport(_Base, httpx2.BaseTransport):
    """The synchronous twin of :class:`AsyncRetryTransport` (``httpx2.Client(transport=...)``).

    A ``coordinator`` (the fleet's shared cooldowns and budget) is spoken to through the
    process's background event loop (the sync facade of :func:`fsm.host.chain.coordinator_loop`);
    without one, hints and the budget apply per chain. ``sleep`` waits the backoff (default
    ``time.sleep``; a ``KeyboardInterrupt`` while waiting ends the chain ``cancelled``).
    """

    def __init__(self, wrapped: Any = None, *, settings: RetrySettings | Mapping[str, Any] | None = None,
                 on_event: Callable[[Event], Any] | None = None, coordinator: Any = None,
                 provider: str | None = None, sleep: Callable[[float], Any] | None = None,
                 clock: Any = None, random: Callable[[], float] | None = None) -> None:
        super().__init__(wrapped or httpx2.HTTPTransport(), settings, on_event, coordinator,
                         provider, clock, random, sync=True)
        self.sleep = sleep or getattr(clock, "sleep", None) or time.sleep

    def _sleep_ms(self, delay_ms: int) -> None:
        self.sleep(delay_ms / 1000)

    def handle_request(self, request: Any) -> Any:
        """Send ``request``, retrying as the brain decides (see the module docstring)."""
        self._check_sdk_retries(request)
        if OWNER.get() is not None:
            return self.wrapped.handle_request(request)
        replayable = _replayable(request)  # before sending: reading a stream makes it bytes
        settings = self._settings_for(request)
        chain = self._chain(request, sync=True) if self._chain_first(settings) else None
        token = OWNER.set(self)
        sleep = self._sleep_ms
        try:
            if chain is not None:
                chain.pause_sync(chain.start_sync(), sleep)  # the gate of the first request
            while True:
                try:
                    response = self._attempt(request, settings.attempt_timeout_ms)
                except httpx2.TransportError as exc:
                    if not replayable:
                        exc.add_note(NOT_REPLAYABLE)
                        raise
                    chain = chain or self._chain(request, sync=True)
                    delay = chain.failed_sync(exc, secrets=_secrets(request))
                    if delay is None:
                        _note_end(exc, chain)
                        raise
                else:
                    if response.status_code < 400:
                        if chain is not None:
                            chain.succeeded()
                        return response
                    response = _read(response, request)
                    if not replayable:
                        log.info("%s %s", response.status_code, NOT_REPLAYABLE)
                        return _scrubbed(response, request)
                    chain = chain or self._chain(request, sync=True)
                    delay = chain.failed_sync(message=_error_message(response),
                                              secrets=_secrets(request))
                    if delay is None:
                        return _scrubbed(response, request)
                    response.close()
                chain.pause_sync(delay, sleep)  # the backoff, the budget re-check, the gate
                request = self._next(request, chain)
        except BaseException as exc:  # a started chain always ends, exactly once
            _scrub(exc, request)
            if chain is not None and chain.running:
                if isinstance(exc, Exception):
                    if chain.failed_sync(exc) is not None:
                        chain.cancel()
                else:
                    chain.cancel()
            raise
        finally:
            OWNER.reset(token)
            if chain is not None:
                chain.close()

    def _attempt(self, request: Any, limit: int | None) -> Any:
        """One attempt, bounded by ``limit`` ms (``retry.attemptTimeoutMs``) through httpx2's
        per-request timeouts (each phase — connect, write, each read — at most the bound; a
        shorter one the client set stays): ``httpx2.TimeoutException`` at the bound."""
        if limit is None:
            return self.wrapped.handle_request(request)
        given = request.extensions.get("timeout") or {}
        bound = limit / 1000
        phases = ("connect", "read", "write", "pool")
        request.extensions["timeout"] = {
            phase: bound if given.get(phase) is None else min(given[phase], bound)
            for phase in phases}
        ours = all(given.get(phase) is None or given[phase] >= bound for phase in phases)
        try:
            return self.wrapped.handle_request(request)
        except httpx2.TimeoutException as exc:
            if not ours:  # the client's own shorter timeout: its error as it is
                raise
            raise _timed_out(limit, request) from exc

    def close(self) -> None:
        """Close the wrapped transport."""
        self.wrapped.close()


ERROR_BODY_LIMIT = 65536
"""Bytes of an error response's body read for classification (64 KiB, as sent: compressed
bodies count compressed); the rest is not read, and the response handed back carries only
this prefix (docs/integrations.md)."""

_DROPPED = ("content-length", "transfer-encoding")


def _prefix(response: Any, request: Any, chunks: list[bytes], cut: bool) -> Any:
    """A response like ``response`` whose body is ``chunks`` (its raw bytes, still encoded)."""
    if cut:
        log.info("%s error body cut to its first %d bytes", response.status_code, ERROR_BODY_LIMIT)
    headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _DROPPED]
    raw = b"".join(chunks)[:ERROR_BODY_LIMIT]
    headers.append(("content-length", str(len(raw))))
    return httpx2.Response(response.status_code, headers=headers, stream=httpx2.ByteStream(raw),
                           request=request, extensions=response.extensions)


def _already_read(response: Any) -> bool:
    try:
        response.content
    except httpx2.ResponseNotRead:
        return False
    return True


async def _aread(response: Any, request: Any) -> Any:
    """Read at most :data:`ERROR_BODY_LIMIT` bytes of an error ``response``'s body for
    classification (a 400 MB error body is not held in memory): returns the response to hand
    back, its body that prefix, read. An undecodable body (a bad gzip stream:
    ``httpx2.DecodingError``) is left unread: the status and headers still speak."""
    if not _already_read(response):
        chunks: list[bytes] = []
        size, cut = 0, False
        try:
            async for chunk in response.aiter_raw():
                chunks.append(chunk)
                size += len(chunk)
                if size > ERROR_BODY_LIMIT:
                    cut = True
                    break
        finally:
            await response.aclose()
        response = _prefix(response, request, chunks, cut)
    try:
        await response.aread()
    except httpx2.DecodingError:
        pass
    return response


def _read(response: Any, request: Any) -> Any:
    """The synchronous :func:`_aread`."""
    if not _already_read(response):
        chunks: list[bytes] = []
        size, cut = 0, False
        try:
            for chunk in response.iter_raw():
                chunks.append(chunk)
                size += len(chunk)
                if size > ERROR_BODY_LIMIT:
                    cut = True
                    break
        finally:
            response.close()
        response = _prefix(response, request, chunks, cut)
    try:
        response.read()
    except httpx2.DecodingError:
        pass
    return response


def _note_end(exc: BaseException, chain: Chain) -> None:
    end = chain.end
    if end is not None and end.attempt >= 1:  # at rest the loop noted it (docs/policy.md §10)
        exc.add_note(f"retry-fsm: endReason {end.end_reason} after {end.attempt} retries")
