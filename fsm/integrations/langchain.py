"""The brain as a LangChain v1 agent middleware (``pip install 'retry-fsm[langchain]'``).

It replaces ``ModelRetryMiddleware`` (two retries of any exception, no retry hints) with the
retry brain: the failure is classified (a 401 or a context overflow is never retried, a 529 or
a dropped connection is), retry hints honoured when set, the retry budget and the fleet's
cooldowns shared, events per attempt::

    from langchain.agents import create_agent
    from langchain_openai import ChatOpenAI
    from fsm.integrations.langchain import RetryBrainMiddleware

    model = ChatOpenAI(model="gpt-5", max_retries=0)        # one retry owner: the brain
    agent = create_agent(model, tools=[], middleware=[
        RetryBrainMiddleware({"maxRetries": 5, "retryHints": "honor"}, on_event=print)])
    reply = agent.invoke({"messages": [{"role": "user", "content": "hi"}]})

With ``retry.fallbackModels`` set, the retries after ``fallbackAfter`` overloads go to the next
model (the same chat model class with its model name changed; docs/policy.md §13.3).

Each model call of the agent is one chain (``wrap_model_call`` / ``awrap_model_call``). When it
ends without success the middleware raises what :func:`fsm.retrying` raises
(:class:`~fsm.RetryChainError`, ``ContextOverflowError``); a first failure that
starts no chain is the model's own exception. LangGraph's control-flow exceptions
(``GraphBubbleUp``: interrupts) pass through untouched; like ``KeyboardInterrupt``,
``SystemExit`` and a cancellation, one raised while a chain runs ends it ``cancelled`` first.
"""

from __future__ import annotations

import functools

import time
from collections.abc import Mapping
from typing import Any, Callable

from fsm.core.events import Event
from fsm.core.settings import RetrySettings
from fsm.host.chain import RETRY_OWNER, TIMEOUT_KEYS, Chain, refuse_unsupported
from fsm.host.clock import wait_ms
from fsm.integrations._extra import require

require("langchain.agents.middleware", "langchain")
from langchain.agents.middleware import AgentMiddleware  # noqa: E402
from langgraph.errors import GraphBubbleUp  # noqa: E402

__all__ = ["RetryBrainMiddleware"]


def _model_name(model: Any) -> str:
    for attr in ("model_name", "model", "model_id"):
        value = getattr(model, attr, None)
        if isinstance(value, str) and value:
            return value
    return "default"


def _switched(request: Any, model_name: str | None) -> Any:
    """``request`` with its chat model switched to ``model_name`` (a fallback model of
    ``retry.fallbackModels``): a copy of the same chat model class with only its model name
    changed (``model_name`` for ChatOpenAI, ``model`` for ChatAnthropic and most others)."""
    if model_name is None or _model_name(request.model) == model_name:
        return request
    model = request.model
    fields = getattr(type(model), "model_fields", {})
    field = next((f for f in ("model_name", "model", "model_id") if f in fields), None)
    if field is None or not hasattr(model, "model_copy"):
        return request  # a chat model we cannot re-point: stay on it
    return request.override(model=model.model_copy(update={field: model_name}))


def _provider_name(model: Any) -> str:
    module = type(model).__module__ or ""
    root = module.split(".", 1)[0]
    return root.removeprefix("langchain_") or "default"


class RetryBrainMiddleware(AgentMiddleware):
    """Retries an agent's failed model calls under the retry brain.

    Args:
        settings: :class:`~fsm.core.settings.RetrySettings` or the file's ``retry`` mapping.
        on_event: called with each :mod:`fsm.core.events` event.
        coordinator: the fleet's coordinator (docs/fleet.md), for async and synchronous
            agents (a synchronous one asks it at once in-process, else on the process's
            background coordinator loop).
        clock: a host clock (``time_ms()``, ``call_later``, ``sleep``); None = real time.
        sleep: ``sleep(seconds)`` for synchronous agents (default ``time.sleep``).
        random: floats in [0, 1) for jitter.
    """

    def __init__(self, settings: RetrySettings | Mapping[str, Any] | None = None, *,
                 on_event: Callable[[Event], Any] | None = None, coordinator: Any = None,
                 clock: Any = None, sleep: Callable[[float], Any] | None = None,
                 random: Callable[[], float] | None = None) -> None:
        super().__init__()
        # a bad key, or a timeout the middleware cannot act on, raises here, once
        self.settings = refuse_unsupported(Chain(settings, sync=True).settings,
                                           "the LangChain middleware", TIMEOUT_KEYS)
        self.on_event = on_event
        self.coordinator = coordinator
        self.clock = clock
        self.sleep = sleep or getattr(clock, "sleep", None) or time.sleep
        self._random = random

    def _chain(self, request: Any, *, sync: bool) -> Chain:
        options: dict[str, Any] = {"on_event": self.on_event, "clock": self.clock,
                                   "provider": _provider_name(request.model),
                                   "model": _model_name(request.model)}
        if self._random is not None:
            options["random"] = self._random
        # a synchronous agent asks a given coordinator too (at once in-process, else on the
        # process's coordinator loop), as the runner's run_sync does
        return Chain(self.settings, sync=sync, coordinator=self.coordinator, **options)

    def _sleep_ms(self, delay_ms: int) -> None:
        self.sleep(delay_ms / 1000)

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Call ``handler(request)`` until it succeeds or the brain ends the chain."""
        chain = self._chain(request, sync=True)
        owner = RETRY_OWNER.set(chain)
        try:
            chain.pause_sync(chain.start_sync(), self._sleep_ms)  # the first request's gate
            while True:
                try:
                    response = handler(_switched(request, chain.switched_model))
                except GraphBubbleUp:
                    raise
                except Exception as exc:
                    delay = chain.failed_sync(exc)
                    if delay is None:
                        _raise_end(chain, exc)
                    chain.pause_sync(delay, self._sleep_ms)
                else:
                    chain.succeeded()
                    return response
        except BaseException:
            # An interrupt (GraphBubbleUp), KeyboardInterrupt or SystemExit while a chain runs:
            # the chain ends ``cancelled`` (no-op once it has ended), then the exception goes on.
            chain.cancel()
            raise
        finally:
            RETRY_OWNER.reset(owner)
            chain.close()

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """``await handler(request)`` until it succeeds or the brain ends the chain; a
        cancellation ends the chain ``cancelled``."""
        chain = self._chain(request, sync=False)
        owner = RETRY_OWNER.set(chain)
        pause = functools.partial(wait_ms, self.clock)
        try:
            await chain.pause(await chain.start(), pause)  # the first request's gate
            while True:
                try:
                    response = await handler(_switched(request, chain.switched_model))
                except GraphBubbleUp:
                    raise
                except Exception as exc:
                    delay = await chain.failed(exc)
                    if delay is None:
                        _raise_end(chain, exc)
                    await chain.pause(delay, pause)
                else:
                    chain.succeeded()
                    return response
        except BaseException:  # cancelled, interrupted (GraphBubbleUp), KeyboardInterrupt
            chain.cancel()
            raise
        finally:
            RETRY_OWNER.reset(owner)
            chain.close()



def _raise_end(chain: Chain, exc: Exception) -> None:
    # what reaches the caller shows no credential: the exception's text and its causes'
    # scrubbed in place (fsm.core.redact.scrub_exception), its type kept
    from fsm.core.redact import request_secrets, scrub_exception
    scrub_exception(exc, request_secrets(exc))
    error = chain.error()
    if error is exc:  # a first failure that starts no chain: the loop noted why
        raise exc
    raise error from exc
