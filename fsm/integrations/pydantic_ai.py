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

   It sees what the model-request hook sees: a stream that fails to open or fails before its
   first event is retried; an error inside a stream after events reached the caller
   (``run_stream``, ``run`` with ``event_stream_handler``) propagates past the hook in
   pydantic-ai and is not retried (docs/integrations.md, "What a host cannot act on") — use
   :func:`fsm.retrying` or the agent session for that.
2. **The httpx2 transport slot** — :func:`http_client` gives the provider an ``httpx2`` client
   whose transport is :class:`~fsm.integrations.httpx2.AsyncRetryTransport` (HTTP-level
   failures only; see that module for what a transport cannot see)::

       from fsm.integrations.pydantic_ai import http_client

       client = openai.AsyncOpenAI(max_retries=0, http_client=http_client({"retryHints": "honor"}))
       agent = Agent(OpenAIChatModel("gpt-5", provider=OpenAIProvider(openai_client=client)))
       print((await agent.run("hi")).output)

Give the provider an SDK client built with ``max_retries=0`` either way, as above: an
``OpenAIProvider(api_key=..., http_client=...)`` builds its own client with the SDK's default
retries, and each of them would run a whole chain of the brain's (3 × 3 requests).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

from fsm.core.events import Event
from fsm.core.settings import RetrySettings
from fsm.host.chain import RETRY_OWNER, TIMEOUT_KEYS, Chain, refuse_unsupported
from fsm.host.clock import wait_ms
from fsm.integrations._extra import require

require("pydantic_ai", "pydantic-ai")
from pydantic_ai.capabilities import AbstractCapability  # noqa: E402
from pydantic_ai.exceptions import RetryModelRequest  # noqa: E402

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
        # here, once
        self.settings = refuse_unsupported(Chain(settings, sync=True).settings,
                                           "the pydantic-ai capability",
                                           ("fallbackModels",) + TIMEOUT_KEYS)
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
        """A failed attempt: wait the brain's backoff and attempt again, or end the chain."""
        chain = RETRY_OWNER.get()
        if not isinstance(chain, Chain):
            raise error
        delay = await chain.failed(error)
        if delay is None:
            # what reaches the caller shows no credential: the error's text and its causes'
            # scrubbed in place (fsm.core.redact.scrub_exception), its type kept
            from fsm.core.redact import request_secrets, scrub_exception
            scrub_exception(error, request_secrets(error))
            failure = chain.error()
            if failure is error:  # a first failure that starts no chain: the loop noted why
                raise error
            raise failure from error
        await chain.pause(delay, lambda ms: wait_ms(self.clock, ms))
        raise RetryModelRequest()


def http_client(settings: RetrySettings | Mapping[str, Any] | None = None, **options: Any) -> Any:
    """An ``httpx2.AsyncClient`` for a pydantic-ai provider's ``http_client=``, its transport an
    :class:`~fsm.integrations.httpx2.AsyncRetryTransport` (``options`` as that class)."""
    import httpx2

    from fsm.integrations.httpx2 import AsyncRetryTransport
    return httpx2.AsyncClient(transport=AsyncRetryTransport(settings=settings, **options),
                              timeout=httpx2.Timeout(600, connect=5))
