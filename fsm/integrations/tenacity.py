"""The retry brain as tenacity strategies (``pip install 'retry-fsm[tenacity]'``).

Code already written for tenacity — a ``@retry`` decorator, a ``for attempt in Retrying()``
loop, pydantic-ai's ``AsyncHTTPX2TenacityTransport`` — gets the brain's classification, retry
hints, retry budget, fleet cooldowns, events and chain ends by swapping its strategies::

    import openai
    import tenacity
    from fsm.integrations.tenacity import BrainStrategy

    brain = BrainStrategy({"maxRetries": 5, "retryHints": "honor"}, on_event=print)
    messages = [{"role": "user", "content": "hi"}]

    @tenacity.retry(**brain.kwargs())                 # retry, stop, wait, before_sleep, sleep
    def ask(client: openai.OpenAI):
        return client.chat.completions.create(model="gpt-5", messages=messages)

    ask(openai.OpenAI(max_retries=0))                 # one retry owner: the brain

    client = openai.AsyncOpenAI(max_retries=0)
    async for attempt in tenacity.AsyncRetrying(**brain.kwargs(asynchronous=True)):
        with attempt:
            reply = await client.chat.completions.create(model="gpt-5", messages=messages)

One :class:`BrainStrategy` serves any number of calls, concurrent ones included: each call
(tenacity's ``RetryCallState``) gets its own :class:`~fsm.host.chain.Chain`. The strategies
work together and are meant to be used together (``kwargs()`` sets them all):

- ``before``: claims the one retry ownership (:data:`fsm.host.chain.RETRY_OWNER`) while the
  attempt runs: an fsm httpx2 transport under the call passes its requests through.
- ``retry``: gives the ownership back and hands the attempt's outcome to the brain; True while the chain goes on *or*
  ended without success after at least one retry (so ``stop`` ends it). A success ends a
  running chain ``success: true``. A first failure that starts no chain (fatal, retry
  disabled, ``maxRetries: 0``) is re-raised as the caller's own exception, its ``endReason``
  in ``__notes__`` when the brain emitted an end (docs/policy.md §10).
- ``stop``: True when the brain ended the chain.
- ``wait``: the brain's backoff in seconds (jitter, retry hints, cooldowns included).
- ``sleep`` / ``asleep``: wait that long (on the injected clock when one is given) and tell
  the brain the backoff is over; a cancellation (``CancelledError``, ``KeyboardInterrupt``)
  while waiting ends the chain ``cancelled``.
- ``before_sleep``: logs the retry at INFO (the events carry the details).
- ``retry_error_callback`` (set by ``kwargs()``): an ended chain raises
  :class:`~fsm.RetryChainError` (or ``ContextOverflowError``) from the last
  exception, as :func:`fsm.retrying` does.

Async hosts get the coordinator (``coordinator=``, or the event loop's in-process one when
hints are honoured or a budget is set): tenacity awaits async strategies in ``AsyncRetrying``.
A synchronous ``Retrying`` asks a given coordinator too (an in-process one at once, another on
the process's background coordinator loop, as :meth:`fsm.RetryRunner.run_sync` does); without
one it shares nothing with the fleet.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any, Callable

from fsm.core.events import Event
from fsm.core.settings import RetrySettings
from fsm.host.chain import RETRY_OWNER, TIMEOUT_KEYS, Chain, refuse_unsupported
from fsm.host.clock import wait_ms
from fsm.integrations._extra import require

tenacity = require("tenacity", "tenacity")

__all__ = ["BrainStrategy", "retrying", "async_retrying"]

log = logging.getLogger("fsm.integrations.tenacity")

_current: ContextVar[Chain | None] = ContextVar("fsm_tenacity_chain", default=None)


class BrainStrategy:
    """The brain's tenacity strategies for any number of calls (see the module docstring).

    Args:
        settings: :class:`~fsm.core.settings.RetrySettings` or the file's ``retry`` mapping.
        on_event: called with each :mod:`fsm.core.events` event (``auto_retry_start``,
            ``auto_retry_end``, ...).
        coordinator: the fleet's coordinator (docs/fleet.md), for async and sync calls.
        provider, model: the coordinator key's names (``"openai"``, ``"gpt-5"``).
        clock: a host clock (``time_ms()``, ``call_later``) — :class:`~fsm.testing.FakeClock`
            in tests; None = real time.
        random: floats in [0, 1) for jitter.
        to_message: how an exception reads (default: the SDK error mapping).
    """

    def __init__(self, settings: RetrySettings | Mapping[str, Any] | None = None, *,
                 on_event: Callable[[Event], Any] | None = None, coordinator: Any = None,
                 provider: str = "default", model: str = "default", clock: Any = None,
                 random: Callable[[], float] | None = None,
                 to_message: Callable[[BaseException], Any] | None = None) -> None:
        self._options: dict[str, Any] = {"on_event": on_event, "provider": provider,
                                         "model": model, "clock": clock, "to_message": to_message}
        if random is not None:
            self._options["random"] = random
        self.coordinator = coordinator
        self.clock = clock
        # validated once, here: a bad key raises SettingsError before any call
        self.settings = refuse_unsupported(Chain(settings, sync=True).settings,
                                           "the tenacity strategy",
                                           ("fallbackModels",) + TIMEOUT_KEYS)
        self._chains: "weakref.WeakKeyDictionary[Any, Chain]" = weakref.WeakKeyDictionary()
        self._owners: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()

    # ---------------------------------------------------------------- one call's chain
    def chain(self, state: Any, *, sync: bool) -> Chain:
        """The chain of the tenacity call ``state`` (a ``RetryCallState``), made on first use."""
        chain = self._chains.get(state)
        if chain is None:
            # a sync call asks a given coordinator too (at once in-process, else on the
            # process's coordinator loop), as the runner's run_sync does
            chain = Chain(self.settings, sync=sync, coordinator=self.coordinator,
                          **self._options)
            self._chains[state] = chain
        return chain

    # ---------------------------------------------------------------- before, retry
    def before(self, state: Any) -> None:
        """tenacity ``before`` for ``Retrying``: the attempt about to run is owned by this
        chain (:data:`fsm.host.chain.RETRY_OWNER`), so an fsm transport under it passes the
        request through instead of retrying it again (one retry owner, docs/policy.md §12)."""
        self._own(state, sync=True)

    async def abefore(self, state: Any) -> None:
        """tenacity ``before`` for ``AsyncRetrying`` (as :meth:`before`)."""
        self._own(state, sync=False)

    def _own(self, state: Any, *, sync: bool) -> None:
        self._release(state)
        chain = self.chain(state, sync=sync)
        self._owners[state] = RETRY_OWNER.set(chain)
        if "set_result" not in vars(state):
            self._watch_success(state, chain)

    def _watch_success(self, state: Any, chain: Chain) -> None:
        """The attempt's success ends the chain when tenacity records it (``set_result``), not
        only when ``retry`` runs: ``for attempt in Retrying(...): with attempt: return call()``
        leaves the loop from inside the attempt, and tenacity never asks ``retry`` again
        (docs/integrations.md, "tenacity")."""
        record = state.set_result

        def set_result(value: Any) -> None:
            record(value)
            self._release(state)
            chain.succeeded()  # a no-op at rest and once the chain has ended

        state.set_result = set_result

    def _release(self, state: Any) -> None:
        """The attempt is over: the ownership :meth:`before` claimed is given back."""
        token = self._owners.pop(state, None)
        if token is not None:
            try:
                RETRY_OWNER.reset(token)
            except ValueError:  # claimed in another context (tenacity ran the hook elsewhere)
                pass

    def retry(self, state: Any) -> bool:
        """tenacity ``retry`` for ``Retrying`` (a given coordinator is asked synchronously)."""
        self._release(state)
        chain = self.chain(state, sync=True)
        outcome = state.outcome
        if not outcome.failed:
            chain.succeeded()
            return False
        exc = outcome.exception()
        if not isinstance(exc, Exception):  # KeyboardInterrupt, CancelledError, SystemExit...
            chain.cancel()
            return False
        return self._after_failure(chain, chain.failed_sync(exc), exc)

    async def aretry(self, state: Any) -> bool:
        """tenacity ``retry`` for ``AsyncRetrying`` (reads the coordinator)."""
        self._release(state)
        chain = self.chain(state, sync=False)
        outcome = state.outcome
        if not outcome.failed:
            chain.succeeded()
            return False
        exc = outcome.exception()
        if not isinstance(exc, Exception):
            chain.cancel()
            return False
        return self._after_failure(chain, await chain.failed(exc), exc)

    @staticmethod
    def _after_failure(chain: Chain, delay_ms: int | None, exc: BaseException) -> bool:
        if delay_ms is not None:
            return True
        end = chain.end
        if end is not None and not end.success and end.attempt >= 1:
            return True  # stop ends it; retry_error_callback raises RetryChainError
        # an end at rest: the caller's own exception, the reason noted by the loop
        _scrub(exc)  # tenacity re-raises it to the caller
        return False

    # ---------------------------------------------------------------- stop, wait
    def stop(self, state: Any) -> bool:
        """tenacity ``stop``: True when the brain ended the chain."""
        chain = self._chains.get(state)
        return chain is None or chain.delay_ms is None

    def wait(self, state: Any) -> float:
        """tenacity ``wait``: the brain's backoff in seconds (0 when the chain is over)."""
        chain = self._chains.get(state)
        if chain is None or chain.delay_ms is None:
            return 0.0
        _current.set(chain)
        return chain.delay_ms / 1000

    def before_sleep(self, state: Any) -> None:
        """tenacity ``before_sleep``: one INFO line per retry."""
        chain = self._chains.get(state)
        if chain is not None and chain.delay_ms is not None:
            log.info("retry %d of %d in %d ms", chain.attempt, chain.brain.max_attempts,
                     chain.delay_ms)

    # ---------------------------------------------------------------- sleep
    def sleep(self, seconds: float) -> None:
        """tenacity ``sleep`` for ``Retrying``: ``time.sleep`` (or the clock's ``sleep``),
        then the brain hears the backoff is over. ``KeyboardInterrupt`` ends the chain."""
        chain = _current.get()
        clock_sleep = getattr(self.clock, "sleep", None) or time.sleep
        try:
            clock_sleep(seconds)
            if chain is not None:  # the budget re-check and the gate, then more waits
                chain.pause_sync(chain.resume_sync(), lambda ms: clock_sleep(ms / 1000))
        except BaseException as exc:
            if chain is not None and not isinstance(exc, Exception):
                chain.cancel()
            raise

    async def asleep(self, seconds: float) -> None:
        """tenacity ``sleep`` for ``AsyncRetrying``: waits on the clock (or the event loop),
        then the brain hears the backoff is over. A cancellation ends the chain ``cancelled``."""
        chain = _current.get()
        try:
            await wait_ms(self.clock, seconds * 1000)
            if chain is not None:  # the budget re-check and the gate, then more waits
                await chain.pause(await chain.resume(), lambda ms: wait_ms(self.clock, ms))
        except BaseException as exc:
            if chain is not None and not isinstance(exc, Exception):
                chain.cancel()
            raise

    # ---------------------------------------------------------------- all hooks
    def error_callback(self, state: Any) -> Any:
        """tenacity ``retry_error_callback``: raise what :func:`fsm.retrying` would."""
        chain = self._chains.get(state)
        exc = _scrub(state.outcome.exception())
        if chain is None:
            raise exc
        raise chain.error() from exc

    def kwargs(self, *, asynchronous: bool = False) -> dict[str, Any]:
        """Every hook for ``tenacity.Retrying(**kwargs)`` (or ``AsyncRetrying`` with
        ``asynchronous=True``, ``tenacity.retry(**kwargs)`` on an async function)."""
        return {"before": self.abefore if asynchronous else self.before,
                "retry": self.aretry if asynchronous else self.retry, "stop": self.stop,
                "wait": self.wait, "before_sleep": self.before_sleep,
                "sleep": self.asleep if asynchronous else self.sleep,
                "retry_error_callback": self.error_callback}



def _scrub(exc: BaseException) -> BaseException:
    """``exc`` with its text (and its causes') scrubbed in place before it reaches the caller:
    the credentials its request carried and the process's (:func:`fsm.core.redact.scrub_exception`)."""
    from fsm.core.redact import request_secrets, scrub_exception
    return scrub_exception(exc, request_secrets(exc))


def retrying(settings: RetrySettings | Mapping[str, Any] | None = None, **options: Any) -> Any:
    """A ``tenacity.Retrying`` run by the brain (``options`` as :class:`BrainStrategy`)."""
    return tenacity.Retrying(**BrainStrategy(settings, **options).kwargs())


def async_retrying(settings: RetrySettings | Mapping[str, Any] | None = None, **options: Any) -> Any:
    """A ``tenacity.AsyncRetrying`` run by the brain (``options`` as :class:`BrainStrategy`)."""
    return tenacity.AsyncRetrying(**BrainStrategy(settings, **options).kwargs(asynchronous=True))
