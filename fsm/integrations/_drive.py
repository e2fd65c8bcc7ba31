"""The attempt loop the integrations of docs/integrations.md share: one call's attempts stepped
on a :class:`~fsm.host.chain.Chain`, sync and async, with the call owned (``RETRY_OWNER``) so
that a transport under it passes requests through.

``attempt()`` runs one attempt (a request, a stream consumed); an exception it raises is the
failure the brain classifies. ``passthrough``: exception classes that are control flow, not
failures (re-raised untouched; a running chain ends ``cancelled`` first). When the chain ends
without success, what :func:`fsm.retrying` raises is raised (docs/policy.md §10): by the loop
itself in :func:`drive_sync` / :func:`drive_async` (the runner's drivers,
:mod:`fsm.host.loop`), by :func:`raise_outcome` for a host that steps a chain from outside.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, Awaitable, Callable, NoReturn

from fsm.core.events import Event
from fsm.core.settings import RetrySettings
from fsm.host.chain import RETRY_OWNER, Chain, refuse_unsupported
from fsm.host.clock import wait_ms
from fsm.host.loop import Attempt, Send, Wait, bounded, run_async, run_sync

__all__ = ["ENDED_BY_BRAIN", "BrainHost", "attempts_async", "attempts_sync", "drive_async",
           "drive_sync", "ended_by_brain", "mark_ended", "owned", "owned_async", "raise_outcome"]


class BrainHost:
    """What an integration that runs a call's attempts keeps (the Google Gen AI client wrapper,
    the LangChain middleware): the settings, resolved and refused once, and what each call's
    :class:`~fsm.host.chain.Chain` is built with.

    Args:
        settings: :class:`~fsm.core.settings.RetrySettings` or the file's ``retry`` mapping.
        host: the integration's name in a refusal (``"the LangChain middleware"``).
        refused: the keys it cannot act on (:func:`~fsm.host.chain.refuse_unsupported`:
            :class:`~fsm.core.settings.SettingsError` naming the first one set).
        on_event, coordinator, clock, random: as :class:`~fsm.host.chain.Chain` takes them.
        sleep: ``sleep(seconds)`` for sync calls (default the clock's, else ``time.sleep``).
    """

    def _host(self, settings: RetrySettings | Mapping[str, Any] | None, host: str,
              refused: tuple[str, ...], *, on_event: Callable[[Event], Any] | None,
              coordinator: Any, clock: Any, sleep: Callable[[float], Any] | None,
              random: Callable[[], float] | None) -> None:
        # a bad key, or one the host cannot act on, raises here, once
        self.settings = refuse_unsupported(Chain(settings, sync=True).settings, host, refused)
        self.on_event = on_event
        self.coordinator = coordinator
        self.clock = clock
        self.sleep = sleep or getattr(clock, "sleep", None) or time.sleep
        self._random = random

    def _new_chain(self, *, sync: bool, **names: str) -> Chain:
        """A chain for one call; ``names``: ``provider``, ``model`` (the coordinator key's)."""
        if self._random is not None:
            names["random"] = self._random  # type: ignore[assignment]
        return Chain(self.settings, sync=sync, coordinator=self.coordinator,
                     on_event=self.on_event, clock=self.clock, **names)  # type: ignore[arg-type]

    def _sleep_ms(self, delay_ms: int) -> None:
        self.sleep(delay_ms / 1000)

    def _pause(self) -> Callable[[int], Awaitable[Any]]:
        """``wait(ms)`` on :attr:`clock` for :meth:`~fsm.host.chain.Chain.pause`."""
        return functools.partial(wait_ms, self.clock)


@contextlib.contextmanager
def owned(chain: Chain, *, close: bool = True) -> Iterator[Chain]:
    """The call is ``chain``'s (:data:`~fsm.host.chain.RETRY_OWNER`: a transport under it
    passes requests through) while the block runs; whatever stops the block (an exception,
    ``KeyboardInterrupt``, a cancellation) ends a running chain ``cancelled`` and goes on;
    the chain is closed on the way out (:meth:`~fsm.host.chain.Chain.close`) when ``close``."""
    owner = RETRY_OWNER.set(chain)
    try:
        yield chain
    except BaseException:
        chain.cancel()
        raise
    finally:
        RETRY_OWNER.reset(owner)
        if close:
            chain.close()


@contextlib.asynccontextmanager
async def owned_async(chain: Chain) -> AsyncIterator[Chain]:
    """:func:`owned`, the chain closed with :meth:`~fsm.host.chain.Chain.aclose` (the
    coordinator's writes in flight finished first)."""
    try:
        with owned(chain, close=False):
            yield chain
    finally:
        await chain.aclose()


def attempts_sync(chain: Chain, attempt: Callable[[str | None], Any],
                  failed: Callable[[Exception], Any], sleep_ms: Callable[[int], Any], *,
                  passthrough: tuple[type[BaseException], ...] = ()) -> Any:
    """The first request's gate (:meth:`~fsm.host.chain.Chain.start_sync`, waited with
    ``sleep_ms``), then ``attempt(model)`` — ``model`` the fallback the brain switched to, or
    None — until it returns (the chain ends ``success``; its result returned). An exception
    of ``passthrough`` goes on untouched; any other is ``failed(exc)``'s: it waits for the next
    attempt or raises what the caller sees."""
    chain.pause_sync(chain.start_sync(), sleep_ms)
    while True:
        try:
            result = attempt(chain.switched_model)
        except passthrough:
            raise
        except Exception as exc:
            failed(exc)
        else:
            chain.succeeded()
            return result


async def attempts_async(chain: Chain, attempt: Callable[[str | None], Awaitable[Any]],
                         failed: Callable[[Exception], Awaitable[Any]],
                         pause: Callable[[int], Awaitable[Any]], *,
                         passthrough: tuple[type[BaseException], ...] = ()) -> Any:
    """:func:`attempts_sync` on asyncio: ``await attempt(model)``, ``await failed(exc)``, the
    gate waited with ``pause(ms)``."""
    await chain.pause(await chain.start(), pause)
    while True:
        try:
            result = await attempt(chain.switched_model)
        except passthrough:
            raise
        except Exception as exc:
            await failed(exc)
        else:
            chain.succeeded()
            return result

ENDED_BY_BRAIN = "_fsm_chain_ended"
"""The attribute :func:`mark_ended` sets on what a chain ended with (:func:`drive_sync` and
:func:`drive_async` mark what they raise): a framework retry hook that sees it knows the brain
already decided (one retry owner)."""


def ended_by_brain(exc: BaseException) -> bool:
    """True for an exception a chain ended with (:func:`mark_ended`)."""
    return bool(getattr(exc, ENDED_BY_BRAIN, False))


def mark_ended(exc: BaseException) -> BaseException:
    """``exc``, marked as what a chain ended with (:func:`ended_by_brain`: a framework retry
    hook that sees it knows the brain already decided)."""
    try:
        setattr(exc, ENDED_BY_BRAIN, True)
    except Exception:  # an exception class with __slots__: nothing to mark
        pass
    return exc


def raise_outcome(chain: Chain, exc: BaseException) -> NoReturn:
    """Raise what :func:`fsm.retrying` raises once ``chain`` answered None for ``exc``
    (docs/policy.md §10): the chain's :meth:`~fsm.host.chain.Chain.error` from ``exc``, or
    ``exc`` itself (a first failure that starts no chain: the loop noted why), ``exc`` and its
    causes scrubbed in place of the request's credentials
    (:func:`fsm.core.redact.scrub_exception`), its type kept."""
    from fsm.core.redact import request_secrets, scrub_exception
    scrub_exception(exc, request_secrets(exc))
    error = chain.error()
    if error is exc:
        raise exc
    raise error from exc


def _send(attempt: Callable[[str | None], Any], passthrough: tuple[type[BaseException], ...],
          secrets: tuple[str, ...]) -> Callable[[Send], Attempt]:
    def send(command: Send) -> Attempt:
        try:
            return Attempt(result=attempt(command.model))
        except passthrough:
            raise  # thrown into the steps: a running chain ends cancelled, then it goes on
        except Exception as exc:
            return Attempt(exc=exc, secrets=secrets)
    return send


def _model_arg(attempt: Callable[..., Any], takes_model: bool) -> Callable[[str | None], Any]:
    return attempt if takes_model else (lambda model: attempt())


def drive_sync(chain: Chain, attempt: Callable[..., Any], *,
               sleep: Callable[[float], Any] = time.sleep,
               passthrough: tuple[type[BaseException], ...] = (), takes_model: bool = False,
               secrets: tuple[str, ...] = ()) -> Any:
    """Run ``attempt()`` on ``chain``'s loop (built with ``sync=True``) with the loop's own
    driver, :func:`fsm.host.loop.run_sync`, as the runner's :meth:`~fsm.host.runner.RetryRunner.run_sync`
    does: every wait the steps ask for — the first request's gate (admission, cooldown,
    pacing), the backoff, the budget's re-check in wait mode, the gate before each retry — is
    waited with ``sleep(seconds)``, until ``attempt()`` returns (its result) or the brain ends
    the chain (the exception of docs/policy.md §10, marked :func:`ended_by_brain`). An
    exception of ``passthrough`` ends a running chain ``cancelled`` and goes on untouched.
    ``takes_model``: ``attempt(model)`` is called with the fallback the brain switched to
    (None = the caller's model). ``secrets``: credentials the requests carry, scrubbed from
    what events and errors show. A sync attempt runs to its end: the chain's deadline
    (``Send.deadline_ms``) cannot stop it (docs/integrations.md, the one table). Closes
    ``chain``."""
    loop = chain.loop
    loop.gate_first = True

    def wait(command: Wait) -> bool:
        sleep(command.delay_ms / 1000)
        return True

    owner = RETRY_OWNER.set(chain)
    try:
        return run_sync(loop.steps(), send=_send(_model_arg(attempt, takes_model), passthrough,
                                                 secrets), wait=wait)
    except passthrough:
        raise
    except Exception as exc:
        mark_ended(exc)
        raise
    finally:
        RETRY_OWNER.reset(owner)
        chain.close()


async def drive_async(chain: Chain, attempt: Callable[..., Awaitable[Any]], *, clock: Any = None,
                      passthrough: tuple[type[BaseException], ...] = (),
                      takes_model: bool = False, secrets: tuple[str, ...] = ()) -> Any:
    """:func:`drive_sync` on asyncio with :func:`fsm.host.loop.run_async` (the runner's
    driver): ``await attempt()`` (``attempt(model)`` when ``takes_model``), every wait on
    ``clock`` (:func:`fsm.host.clock.wait_ms`); a cancellation ends the chain ``cancelled``.
    Each attempt is bounded as the runner bounds it (:func:`fsm.host.loop.bounded`,
    docs/policy.md §13.2): cancelled at ``retry.attemptTimeoutMs`` and at the chain's
    deadline (``retry.maxElapsedMs``), timed on ``clock`` (``call_later``; None = the event
    loop's). Closes ``chain`` (its coordinator writes in flight finished first)."""
    loop = chain.loop
    loop.gate_first = True
    call = _model_arg(attempt, takes_model)

    async def send(command: Send) -> Attempt:
        try:
            pending = call(command.model)
        except passthrough:
            raise
        except Exception as exc:
            return Attempt(exc=exc, secrets=secrets)
        answer = await bounded(pending, command, clock, passthrough=passthrough)
        if answer.exc is not None and secrets:
            answer = dataclasses.replace(answer, secrets=secrets)
        return answer

    async def wait(command: Wait) -> bool:
        await wait_ms(clock, command.delay_ms)
        return True

    owner = RETRY_OWNER.set(chain)
    try:
        return await run_async(loop.steps(), send, wait)
    except passthrough:
        raise
    except Exception as exc:
        mark_ended(exc)
        raise
    finally:
        RETRY_OWNER.reset(owner)
        await chain.aclose()
