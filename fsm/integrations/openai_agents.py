"""The brain as the OpenAI Agents SDK's model retry policy (``pip install 'retry-fsm[openai-agents]'``).

The Agents SDK runs a model call's retries itself and asks a policy at each failure
(``ModelSettings(retry=ModelRetrySettings(policy=...))``; the policy answers
``RetryDecision(retry, delay, reason, approve_unsafe_replay)``, ``delay`` in seconds).
:class:`BrainRetryPolicy` is that policy: each decision is the brain's — the classification (a
401 or a context overflow is not retried, a 529 or a dropped connection is), the backoff, retry
hints under ``retryHints: "honor"``, the retry budget, the fleet's cooldowns with a
``coordinator`` — with events per attempt and chain ends::

    import openai
    from agents import Agent, OpenAIProvider, RunConfig, Runner
    from fsm.integrations.openai_agents import BrainRetryPolicy

    client = openai.AsyncOpenAI(max_retries=0)                     # one retry owner: the brain
    brain = BrainRetryPolicy({"maxRetries": 5, "retryHints": "honor"}, on_event=print)
    agent = Agent(name="a", model="gpt-5", model_settings=brain.model_settings())
    result = await Runner.run(agent, "hi", hooks=brain.hooks(),
                              run_config=RunConfig(model_provider=OpenAIProvider(openai_client=client)))
    print(result.final_output)

- :meth:`BrainRetryPolicy.model_settings` builds the ``ModelSettings`` (``max_retries`` =
  ``maxRetries + 1``, so the SDK never ends a chain before the brain does);
- :meth:`BrainRetryPolicy.hooks` is a ``RunHooks`` whose ``on_llm_end`` tells the brain the
  retried call succeeded (the policy is asked on failures only): the chain ends
  ``success: true`` and the budget is credited. Without it a chain that recovered stays open
  until the next model call of the same run fails (it then ends ``cancelled``).

**Replay** follows the brain's ``replay_safe`` guard (docs/policy.md §3 D12): a failure after
the response started streaming (``RetryPolicyContext.response_started``) or one the provider
marks replay-unsafe is the brain's ``output_streamed`` fact; under ``afterOutput: "retry"``
(the default) the brain retries it and the decision carries ``approve_unsafe_replay=True``;
under ``afterOutput: "stop"`` the chain ends ``output_streamed``. The SDK's own absolute vetoes
(an abort, streamed output already shown to the user) stand: the policy is not asked then.

**One retry owner**: give the OpenAI client ``max_retries=0``
(``set_default_openai_client(AsyncOpenAI(max_retries=0))``); a failed request that the client
already retried (``x-stainless-retry-count`` above 0) makes the policy raise
:class:`SDKRetriesError` instead of multiplying requests.

Exceptions: what the SDK raises when the policy says no (the SDK's own exception, with
``retry-fsm: endReason ...`` in its notes once a chain ended); :class:`SDKRetriesError`;
:class:`~fsm.core.settings.SettingsError` at construction for a key the policy cannot act on
(``fallbackModels``, the timeouts: use ``ModelSettings`` / the SDK's ``timeout``).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any, Callable

from fsm.core.events import Event
from fsm.core.settings import RetrySettings
from fsm.host.chain import TIMEOUT_KEYS, Chain, refuse_unsupported
from fsm.integrations._extra import require

require("agents", "openai-agents")
from agents import ModelSettings, RunHooks  # noqa: E402
from agents.retry import ModelRetrySettings, RetryDecision, RetryPolicyContext  # noqa: E402

__all__ = ["BrainRetryPolicy", "SDKRetriesError"]


class SDKRetriesError(RuntimeError):
    """The OpenAI client under the Agents SDK retried the request itself (its
    ``x-stainless-retry-count`` was ``count``): give it ``max_retries=0`` (one retry owner)."""

    def __init__(self, count: str) -> None:
        self.count = count
        super().__init__(
            f"the OpenAI client retried this request on its own (x-stainless-retry-count {count}) "
            f"under fsm.integrations.openai_agents.BrainRetryPolicy: build it with max_retries=0 "
            f"(one retry owner, docs/integrations.md)")


def _sdk_retry_count(exc: BaseException) -> str | None:
    request = getattr(getattr(exc, "response", None), "request", None) or getattr(exc, "request", None)
    headers = getattr(request, "headers", None)
    try:
        count = headers.get("x-stainless-retry-count") if headers is not None else None
    except Exception:
        return None
    return count if isinstance(count, str) and count not in ("0", "") else None


class BrainRetryPolicy:
    """The Agents SDK's model retry policy, decided by the retry brain.

    Args:
        settings: :class:`~fsm.core.settings.RetrySettings` or the file's ``retry`` mapping;
            ``fallbackModels`` and the timeouts are refused.
        on_event: called with each :mod:`fsm.core.events` event.
        coordinator: the fleet's coordinator (docs/fleet.md).
        clock: a host clock (``time_ms()``); None = the wall clock.
        random: floats in [0, 1) for jitter.
        provider, model: the coordinator key's names (``CoordKey(provider, model)``).

    Calling the object with a ``RetryPolicyContext`` returns a ``RetryDecision`` (async).
    One object serves many concurrent runs: each run's chain lives in its own context.
    """

    def __init__(self, settings: RetrySettings | Mapping[str, Any] | None = None, *,
                 on_event: Callable[[Event], Any] | None = None, coordinator: Any = None,
                 clock: Any = None, random: Callable[[], float] | None = None,
                 provider: str = "openai", model: str = "default") -> None:
        self.settings = refuse_unsupported(Chain(settings, sync=True).settings,
                                           "the Agents SDK retry policy",
                                           ("fallbackModels", *TIMEOUT_KEYS))
        self._options: dict[str, Any] = {"on_event": on_event, "coordinator": coordinator,
                                         "clock": clock, "provider": provider, "model": model}
        if random is not None:
            self._options["random"] = random
        self._chain: ContextVar[Chain | None] = ContextVar(f"fsm_agents_chain_{id(self)}", default=None)

    def __deepcopy__(self, memo: dict) -> "BrainRetryPolicy":
        return self  # the SDK copies its ModelSettings: the policy (and its chains) is shared

    def model_settings(self, **fields: Any) -> Any:
        """``ModelSettings(retry=ModelRetrySettings(max_retries=maxRetries + 1, policy=self),
        **fields)``."""
        return ModelSettings(retry=self.retry_settings(), **fields)

    def retry_settings(self) -> Any:
        """The ``ModelRetrySettings`` with this policy (for a ``ModelSettings`` of your own)."""
        resolved = Chain(self.settings, sync=True, provider=self._options["provider"],
                         model=self._options["model"]).settings  # retry.providers (§13.4)
        return ModelRetrySettings(max_retries=resolved.max_retries + 1, policy=self)

    def hooks(self) -> Any:
        """A ``RunHooks`` telling the brain when a model call succeeded (pass it as
        ``Runner.run(..., hooks=...)``; subclass it to add your own hooks)."""
        return _BrainHooks(self)

    async def __call__(self, context: RetryPolicyContext) -> RetryDecision:
        exc = context.error
        count = _sdk_retry_count(exc)
        if count is not None:
            raise SDKRetriesError(count)
        chain = self._chain.get()
        if context.attempt <= 1 or chain is None or chain.end is not None:
            if chain is not None and chain.end is None:
                chain.cancel()  # a chain whose success the hooks never reported
                await chain.aclose()
            chain = Chain(self.settings, **self._options)
            self._chain.set(chain)
        streamed = context.response_started or context.replay_safety == "unsafe"
        delay = await chain.failed(exc, output_streamed=streamed)
        if delay is None:
            end = chain.end
            if end is not None:
                try:
                    exc.add_note(f"retry-fsm: endReason {end.end_reason}")
                except Exception:
                    pass
                await chain.aclose()
            return RetryDecision(retry=False, reason=end.end_reason if end else "not retryable")
        chain.backoff_elapsed()  # the SDK sleeps `delay` before its next attempt
        return RetryDecision(retry=True, delay=delay / 1000, approve_unsafe_replay=streamed,
                             reason=f"retry-fsm attempt {chain.attempt}")

    def succeeded(self) -> None:
        """The model call of this context succeeded: a running chain ends ``success: true``."""
        chain = self._chain.get()
        if chain is not None and chain.end is None:
            chain.succeeded()
            chain.close()


class _BrainHooks(RunHooks):
    def __init__(self, policy: BrainRetryPolicy) -> None:
        self._policy = policy

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        self._policy.succeeded()
