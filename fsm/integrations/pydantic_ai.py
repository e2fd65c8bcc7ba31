"""The brain in pydantic-ai agents (``pip install 'retry-fsm[pydantic-ai]'``).

Two ways in, pick one per agent (two retry owners multiply the requests):

1. **The model-request hook** — :class:`RetryBrainCapability`, a pydantic-ai capability: every
   failed attempt at a model request (a status error, a dropped connection, an error inside the
   stream once pydantic-ai raises it) goes to the brain, which answers with its backoff (the
   capability waits and asks pydantic-ai for another attempt with ``RetryModelRequest``) or ends
   the chain (the error propagates as :func:`fsm.retrying` would raise it)::

       import openai
       from pydantic_ai import Agent
       from pydantic_ai.models.openai import OpenAIChatModel
       from pydantic_ai.providers.openai import OpenAIProvider
       from fsm.integrations.pydantic_ai import RetryBrainCapability

       client = openai.AsyncOpenAI(max_retries=0)          # one retry owner: the brain
       model = OpenAIChatModel("gpt-5", provider=OpenAIProvider(openai_client=client))
       agent = Agent(model, capabilities=[RetryBrainCapability({"retryHints": "honor"}, on_event=print)])
       print((await agent.run("hi")).output)

   Streams (``run_stream``, ``run`` with an ``event_stream_handler``): pydantic-ai opens a
   stream and pulls its first event before handing it to the consumer, so a stream that fails
   to open or fails before that event — a connection dropped mid-stream, an error event — is a
   failed attempt like any other, and retried. An error after events reached the consumer
   cannot be taken back (pydantic-ai refuses another attempt then): the capability tells the
   brain that the attempt streamed output, which ends the chain ``output_streamed`` with its
   events (``afterOutput`` acts as ``"stop"``), and the error propagates as
   :func:`fsm.retrying` raises it (docs/integrations.md, "What a host cannot act on"). To replay
   a turn after output, use the agent session.
2. **The httpx2 transport slot** — :func:`http_client` gives the provider an ``httpx2`` client
   whose transport is :class:`~fsm.integrations.httpx2.AsyncRetryTransport` (HTTP-level
   failures only; see that module for what a transport cannot see)::

       from fsm.integrations.pydantic_ai import http_client

       client = openai.AsyncOpenAI(max_retries=0, http_client=http_client({"retryHints": "honor"}))
       agent = Agent(OpenAIChatModel("gpt-5", provider=OpenAIProvider(openai_client=client)))
       print((await agent.run("hi")).output)

Give the provider an SDK client built with ``max_retries=0`` either way, as above: an
``OpenAIProvider(api_key=..., http_client=...)`` builds its own client with the SDK's default
retries, so each attempt of the brain's would be up to 3 requests (two retry owners).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Callable

from fsm.core.events import Event
from fsm.core.settings import RetrySettings
from fsm.host.chain import RETRY_OWNER, TIMEOUT_KEYS, Chain, refuse_unsupported
from fsm.host.clock import wait_ms
from fsm.integrations._drive import raise_outcome
from fsm.integrations._extra import require

require("pydantic_ai", "pydantic-ai")
from pydantic_ai.capabilities import AbstractCapability  # noqa: E402
from pydantic_ai.exceptions import RetryModelRequest  # noqa: E402
from pydantic_ai.models.wrapper import WrapperModel  # noqa: E402

__all__ = ["RetryBrainCapability", "http_client"]


class RetryBrainCapability(AbstractCapability):
    """pydantic-ai capability: the brain decides whether and when a failed model request is
    attempted again.

    Args:
        settings: :class:`~fsm.core.settings.RetrySettings` or the file's ``retry`` mapping.
        on_event: called with each :mod:`fsm.core.events` event.
        coordinator: the fleet's coordinator (docs/fleet.md); None = the event loop's.
        clock: a host clock (``time_ms()``, ``call_later``); None = real time.
        random: floats in [0, 1) for jitter.
    """

    def __init__(self, settings: RetrySettings | Mapping[str, Any] | None = None, *,
                 on_event: Callable[[Event], Any] | None = None, coordinator: Any = None,
                 clock: Any = None, random: Callable[[], float] | None = None) -> None:
        # a bad key, or one the capability cannot act on (it keeps the agent's model), raises
        # here, once. A stream whose events reached the consumer cannot be replayed (pydantic-ai
        # refuses another attempt then): afterOutput acts as "stop" (docs/integrations.md)
        self.settings = dataclasses.replace(
            refuse_unsupported(Chain(settings, sync=True).settings, "the pydantic-ai capability",
                               ("fallbackModels",) + TIMEOUT_KEYS),
            after_output="stop")
        self.on_event = on_event
        self.coordinator = coordinator
        self.clock = clock
        self._random = random

    def _chain(self, request_context: Any) -> Chain:
        model = getattr(request_context, "model", None)
        options: dict[str, Any] = {"on_event": self.on_event, "clock": self.clock,
                                   "provider": str(getattr(model, "system", None) or "default"),
                                   "model": str(getattr(model, "model_name", None) or "default")}
        if self._random is not None:
            options["random"] = self._random
        return Chain(self.settings, coordinator=self.coordinator, **options)

    async def wrap_model_request(self, ctx: Any, *, request_context: Any, handler: Any) -> Any:
        """One chain per model request step: its attempts are the handler's."""
        chain = self._chain(request_context)
        owner = RETRY_OWNER.set(chain)
        try:
            response = await handler(request_context)
        except BaseException:  # cancelled, KeyboardInterrupt...: a running chain ends cancelled
            chain.cancel()
            raise
        finally:
            RETRY_OWNER.reset(owner)
            chain.close()
        if chain.calls:  # at least one attempt failed: the chain (if any) ends succeeded
            chain.succeeded()
        return response

    async def on_model_request_error(self, ctx: Any, *, request_context: Any, error: Exception) -> Any:
        """A failed attempt: wait the brain's backoff and attempt again, or end the chain. A
        stream that fails before its first event reached the consumer is such an attempt
        (pydantic-ai opens it and pulls that event first when this hook exists)."""
        chain = RETRY_OWNER.get()
        if not isinstance(chain, Chain):
            raise error
        delay = await chain.failed(error)
        if delay is None:
            raise_outcome(chain, error)
        await chain.pause(delay, lambda ms: wait_ms(self.clock, ms))
        raise RetryModelRequest()

    def get_wrapper_model(self, model: Any) -> Any:
        """The attempt's model with its stream watched (``_WatchedStream``): an error inside
        the stream after its events reached the consumer goes to the chain of the model request."""
        chain = RETRY_OWNER.get()
        return _WatchedStream(model, chain) if isinstance(chain, Chain) else None


class _WatchedStream(WrapperModel):
    """One attempt's model, whose streamed events are watched on their way to the consumer
    (``run_stream``, ``run`` with an ``event_stream_handler``). pydantic-ai pulls a stream's
    first event before handing it over, so an error before it is the model-request hook's
    (retried); an error after it — a connection dropped mid-stream, an error event — comes after
    output reached the consumer, which pydantic-ai cannot take back: it goes to the request's
    chain as output streamed, which ends it ``output_streamed`` (the events, the budget), and
    propagates as :func:`fsm.retrying` raises it (docs/integrations.md, "What a host cannot act
    on")."""

    def __init__(self, wrapped: Any, chain: Chain) -> None:
        super().__init__(wrapped)
        self._chain = chain

    @asynccontextmanager
    async def request_stream(self, messages: Any, model_settings: Any, model_request_parameters: Any,
                             run_context: Any = None) -> AsyncIterator[Any]:
        async with self.wrapped.request_stream(messages, model_settings, model_request_parameters,
                                               run_context) as response:
            events = response._get_event_iterator
            response._get_event_iterator = lambda: self._watch(events)
            yield response

    async def _watch(self, events: Callable[[], AsyncIterator[Any]]) -> AsyncIterator[Any]:
        shown = False
        try:
            async for event in events():
                shown = True
                yield event
        except Exception as error:
            if not shown or isinstance(error, RetryModelRequest) or self._chain.done:
                raise  # before the first event: on_model_request_error's
            if await self._chain.failed(error, output_streamed=True) is not None:
                self._chain.cancel()  # afterOutput "stop": the brain does not answer a retry
            raise_outcome(self._chain, error)


def http_client(settings: RetrySettings | Mapping[str, Any] | None = None, **options: Any) -> Any:
    """An ``httpx2.AsyncClient`` for a pydantic-ai provider's ``http_client=``, its transport an
    :class:`~fsm.integrations.httpx2.AsyncRetryTransport` (``options`` as that class)."""
    import httpx2

    from fsm.integrations.httpx2 import AsyncRetryTransport
    return httpx2.AsyncClient(transport=AsyncRetryTransport(settings=settings, **options),
                              timeout=httpx2.Timeout(600, connect=5))
