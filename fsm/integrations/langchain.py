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

from collections.abc import Mapping
from typing import Any, Callable

from fsm.core.events import Event
from fsm.core.settings import RetrySettings
from fsm.host.chain import TIMEOUT_KEYS, Chain
from fsm.integrations._drive import BrainHost, attempts_async, attempts_sync, owned, raise_outcome
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


class RetryBrainMiddleware(AgentMiddleware, BrainHost):
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
        self._host(settings, "the LangChain middleware", TIMEOUT_KEYS, on_event=on_event,
                   coordinator=coordinator, clock=clock, sleep=sleep, random=random)

    def _chain(self, request: Any, *, sync: bool) -> Chain:
        # a synchronous agent asks a given coordinator too (at once in-process, else on the
        # process's coordinator loop), as the runner's run_sync does
        return self._new_chain(sync=sync, provider=_provider_name(request.model),
                               model=_model_name(request.model))

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Call ``handler(request)`` until it succeeds or the brain ends the chain. An
        interrupt (``GraphBubbleUp``), ``KeyboardInterrupt`` or ``SystemExit`` while a chain
        runs ends it ``cancelled``, then goes on."""
        chain = self._chain(request, sync=True)

        def failed(exc: Exception) -> None:
            delay = chain.failed_sync(exc)
            if delay is None:
                raise_outcome(chain, exc)
            chain.pause_sync(delay, self._sleep_ms)

        with owned(chain):
            return attempts_sync(chain, lambda model: handler(_switched(request, model)), failed,
                                 self._sleep_ms, passthrough=(GraphBubbleUp,))

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """``await handler(request)`` until it succeeds or the brain ends the chain; a
        cancellation ends the chain ``cancelled``."""
        chain = self._chain(request, sync=False)
        pause = self._pause()

        async def failed(exc: Exception) -> None:
            delay = await chain.failed(exc)
            if delay is None:
                raise_outcome(chain, exc)
            await chain.pause(delay, pause)

        with owned(chain):
            return await attempts_async(chain, lambda model: handler(_switched(request, model)),
                                        failed, pause, passthrough=(GraphBubbleUp,))
