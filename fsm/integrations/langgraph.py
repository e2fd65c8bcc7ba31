"""The brain in a LangGraph 1.x graph (``pip install 'retry-fsm[langgraph]'``).

Two shapes, because LangGraph's ``RetryPolicy`` can say *whether* to retry but not *how long to
wait* for one error (docs/integrations.md, "LangGraph"):

- :func:`retry_node` — **the one to use**: a decorator for a node function (sync or ``async``)
  that runs the node's attempts on a :class:`~fsm.host.chain.Chain`. Every wait comes from the
  brain: retry hints (``retry-after``, ``retry-after-ms``, ``x-ratelimit-reset-*``) under
  ``retryHints: "honor"``, the retry budget (its re-check in wait mode), ``maxElapsedMs``, the
  fleet's cooldowns and pacing (the gate before the first request and each retry), events per
  attempt, chain ends::

      import openai
      from langgraph.graph import StateGraph, MessagesState, START
      from fsm.integrations.langgraph import retry_node

      client = openai.OpenAI(max_retries=0)               # one retry owner: the brain

      @retry_node({"maxRetries": 5, "retryHints": "honor"}, on_event=print)
      def call_model(state: MessagesState):
          reply = client.chat.completions.create(model="gpt-5", messages=[
              {"role": "user", "content": state["messages"][-1].content}])
          return {"messages": [reply.choices[0].message.content]}

      graph = StateGraph(MessagesState)
      graph.add_node("call_model", call_model)            # no retry_policy: one retry owner
      graph.add_edge(START, "call_model")
      print(graph.compile().invoke({"messages": ["hi"]})["messages"][-1].content)

- :func:`brain_retry_policy` / :func:`brain_retry_on` — a ``langgraph.types.RetryPolicy`` whose
  ``retry_on(exc) -> bool`` asks the classifier (a 401 or a context overflow is not retried, a
  529 or a dropped connection is). Its waits are LangGraph's own
  (``initial_interval × backoff_factor^(n-1)``, capped at ``max_interval``, seconds): the
  ``RetryPolicy`` fields are fixed per policy, so a hint, the budget or a cooldown cannot
  reach them. Settings it cannot act on are refused (:class:`~fsm.core.settings.SettingsError`).

One retry owner: a node wrapped by :func:`retry_node` that LangGraph runs again (the node was
added with a ``retry_policy`` whose ``retry_on`` accepted the brain's end) raises
:class:`FrameworkRetriesError` — a ``RuntimeError``, which LangGraph's default ``retry_on``
does not retry — naming the node, before any request. :func:`brain_retry_on` answers False for
whatever a brain chain ended with, so the two never stack.

Exceptions: as :func:`fsm.retrying` (docs/policy.md §10): a chain that started and ended
without success raises :class:`~fsm.RetryChainError` from the last exception; a
fatal first failure is the node's own exception; LangGraph's control flow
(``GraphBubbleUp``: interrupts, ``Command`` to a parent) passes through untouched and ends a
running chain ``cancelled``.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Mapping
from typing import Any, Callable, TypeVar

from fsm.core.events import Event
from fsm.core.settings import RetrySettings, SettingsError
from fsm.host.chain import TIMEOUT_KEYS, Chain, refuse_unsupported
from fsm.integrations._drive import drive_async, drive_sync, ended_by_brain
from fsm.integrations._extra import require

require("langgraph", "langgraph")
from langgraph.errors import GraphBubbleUp  # noqa: E402
from langgraph.types import RetryPolicy  # noqa: E402

__all__ = ["FrameworkRetriesError", "brain_retry_on", "brain_retry_policy", "retry_node"]

F = TypeVar("F", bound=Callable[..., Any])

_NODE_KEYS = ("fallbackModels", *TIMEOUT_KEYS)


class FrameworkRetriesError(RuntimeError):
    """LangGraph ran a :func:`retry_node` node again after the brain ended its chain: the node
    has a ``retry_policy`` as well (two retry owners multiply requests). ``node`` names it."""

    def __init__(self, node: str, attempt: int) -> None:
        self.node = node
        super().__init__(
            f"node {node!r} is retried by the brain (fsm.integrations.langgraph.retry_node) and "
            f"LangGraph ran it again (node_attempt {attempt}): add the node without retry_policy "
            f"(one retry owner, docs/integrations.md)")


def _node_attempt() -> tuple[str, int]:
    """The running node's name and LangGraph's attempt number (1 on the first run)."""
    try:
        from langgraph.config import get_config
        config = get_config()
    except RuntimeError:  # called outside a graph: nothing retries it but the brain
        return "?", 1
    runtime = config.get("configurable", {}).get("__pregel_runtime")
    info = getattr(runtime, "execution_info", None)
    name = str(config.get("metadata", {}).get("langgraph_node", "?"))
    return name, int(getattr(info, "node_attempt", 1) or 1)


def retry_node(settings: RetrySettings | Mapping[str, Any] | None = None, *,
               on_event: Callable[[Event], Any] | None = None, coordinator: Any = None,
               clock: Any = None, sleep: Callable[[float], Any] | None = None,
               random: Callable[[], float] | None = None, provider: str = "default",
               model: str = "default") -> Callable[[F], F]:
    """A decorator: the node's attempts run under the retry brain.

    Args:
        settings: :class:`~fsm.core.settings.RetrySettings` or the file's ``retry`` mapping;
            ``fallbackModels`` and the timeouts are refused (a node wrapper can neither switch
            the model nor abort the attempt: use :func:`fsm.retrying` inside the node).
        on_event: called with each :mod:`fsm.core.events` event.
        coordinator: the fleet's coordinator (docs/fleet.md); a sync node asks it at once
            (in-process) or on the process's background coordinator loop, as
            :meth:`fsm.RetryRunner.run_sync` does. None = the event loop's in-process one for
            ``async`` nodes; a sync node then shares nothing.
        clock: a host clock (``time_ms()``, ``call_later``); None = real time.
        sleep: ``sleep(seconds)`` for sync nodes (default the clock's, else ``time.sleep``).
        random: floats in [0, 1) for jitter.
        provider, model: the coordinator key's names (``CoordKey(provider, model)``); they
            also pick the ``retry.providers`` entries the node runs on (docs/policy.md §13.4).

    Every wait is the one loop's (:mod:`fsm.host.loop`, driven as the runner drives it): the
    first request's gate (admission under the ``resilient`` profile, cooldowns, pacing), the
    backoff, the budget's re-check in wait mode and the gate before each retry.

    The wrapped function keeps its signature (LangGraph passes ``config``, ``runtime``... as
    to the original). Raises :class:`~fsm.core.settings.SettingsError` here for a bad key.
    """
    base = refuse_unsupported(Chain(settings, sync=True).settings, "the LangGraph node wrapper",
                              _NODE_KEYS)
    options: dict[str, Any] = {"on_event": on_event, "clock": clock, "provider": provider,
                               "model": model}
    if random is not None:
        options["random"] = random
    wait = sleep or getattr(clock, "sleep", None) or time.sleep

    def decorate(fn: F) -> F:
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def anode(*args: Any, **kwargs: Any) -> Any:
                _refuse_rerun()
                chain = Chain(base, coordinator=coordinator, **options)
                return await drive_async(chain, lambda: fn(*args, **kwargs), clock=clock,
                                         passthrough=(GraphBubbleUp,))
            return anode  # type: ignore[return-value]

        @functools.wraps(fn)
        def node(*args: Any, **kwargs: Any) -> Any:
            _refuse_rerun()
            chain = Chain(base, sync=True, coordinator=coordinator, **options)
            return drive_sync(chain, lambda: fn(*args, **kwargs), sleep=wait,
                              passthrough=(GraphBubbleUp,))
        return node  # type: ignore[return-value]
    return decorate


def _refuse_rerun() -> None:
    name, attempt = _node_attempt()
    if attempt > 1:
        raise FrameworkRetriesError(name, attempt)


def brain_retry_on(settings: RetrySettings | Mapping[str, Any] | None = None) -> Callable[[Exception], bool]:
    """``retry_on(exc) -> bool`` for ``langgraph.types.RetryPolicy``: True when the classifier
    calls ``exc`` retryable under ``settings`` (``unknown: "retry"`` included), False for a
    fatal error, a context overflow, and whatever a brain chain already ended with."""
    resolved = Chain(settings, sync=True).settings

    def retry_on(exc: Exception) -> bool:
        if ended_by_brain(exc):
            return False
        _, cls = Chain(resolved, sync=True).judge(exc)
        return cls.kind == "retryable"
    retry_on.__qualname__ = retry_on.__name__ = "brain_retry_on"
    return retry_on


def brain_retry_policy(settings: RetrySettings | Mapping[str, Any] | None = None) -> RetryPolicy:
    """A ``RetryPolicy`` from the settings: ``retry_on`` = :func:`brain_retry_on`,
    ``max_attempts`` = ``maxRetries + 1``, ``initial_interval`` = ``baseDelayMs / 1000`` s,
    ``max_interval`` = ``maxDelayMs / 1000`` s (LangGraph's 128 s when unset),
    ``backoff_factor`` 2, ``jitter`` unless ``jitter: "none"`` (LangGraph's: + up to 1 s).

    Raises :class:`~fsm.core.settings.SettingsError` for a setting the policy cannot act on
    (``retryHints: "honor"``, ``budget``, ``pacing``, ``maxElapsedMs``, ``fallbackModels``, the
    timeouts): use :func:`retry_node` for those."""
    s = refuse_unsupported(Chain(settings, sync=True).settings, "LangGraph's RetryPolicy",
                           _NODE_KEYS)
    for key, value, set_ in (("retryHints", s.retry_hints, s.retry_hints == "honor"),
                             ("budget", s.budget, s.budget is not None),
                             ("pacing", s.pacing, s.pacing is not None),
                             ("maxElapsedMs", s.max_elapsed_ms, s.max_elapsed_ms is not None)):
        if set_:
            raise SettingsError(key, value if not hasattr(value, "__dataclass_fields__") else "{...}",
                                "unset: LangGraph's RetryPolicy has fixed waits (use "
                                "fsm.integrations.langgraph.retry_node; docs/integrations.md)")
    return RetryPolicy(initial_interval=s.base_delay_ms / 1000,
                       max_interval=(s.max_delay_ms / 1000) if s.max_delay_ms is not None else 128.0,
                       backoff_factor=2.0, max_attempts=(s.max_retries + 1) if s.enabled else 1,
                       jitter=s.jitter != "none", retry_on=brain_retry_on(s))
