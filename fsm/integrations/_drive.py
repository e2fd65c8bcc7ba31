"""The attempt loop the integrations of docs/integrations.md share: one call's attempts stepped
on a :class:`~fsm.host.chain.Chain`, sync and async, with the call owned (``RETRY_OWNER``) so
that a transport under it passes requests through.

``attempt()`` runs one attempt (a request, a stream consumed); an exception it raises is the
failure the brain classifies. ``passthrough``: exception classes that are control flow, not
failures (re-raised untouched; a running chain ends ``cancelled`` first). When the chain ends
without success, :func:`raise_end` raises what :func:`fsm.retrying` raises (docs/policy.md §10).
"""

from __future__ import annotations

import time
from typing import Any, Awaitable, Callable

from fsm.host.chain import RETRY_OWNER, Chain
from fsm.host.clock import wait_ms

__all__ = ["ENDED_BY_BRAIN", "drive_async", "drive_sync", "ended_by_brain", "raise_end"]

ENDED_BY_BRAIN = "_fsm_chain_ended"
"""The attribute :func:`raise_end` sets on what it raises: a framework retry hook that sees it
knows the brain already decided (one retry owner)."""


def ended_by_brain(exc: BaseException) -> bool:
    """True for an exception a chain ended with (raised by :func:`raise_end`)."""
    return bool(getattr(exc, ENDED_BY_BRAIN, False))


def _mark(exc: BaseException) -> BaseException:
    try:
        setattr(exc, ENDED_BY_BRAIN, True)
    except Exception:  # an exception class with __slots__: nothing to mark
        pass
    return exc


def raise_end(chain: Chain, exc: BaseException) -> None:
    """Raise what the caller sees once ``chain`` answered None for ``exc``: the chain's
    :meth:`~fsm.host.chain.Chain.error` from ``exc``, or ``exc`` itself (scrubbed of the
    request's credentials, with ``retry-fsm: endReason ...`` in its notes when a chain ended)."""
    from fsm.core.redact import request_secrets, scrub_exception
    scrub_exception(exc, request_secrets(exc))
    error = chain.error()
    _mark(error)
    if error is exc:
        if chain.end is not None:
            exc.add_note(f"retry-fsm: endReason {chain.end.end_reason}")
        raise exc
    raise error from exc


def drive_sync(chain: Chain, attempt: Callable[[], Any], *,
               sleep: Callable[[float], Any] = time.sleep,
               passthrough: tuple[type[BaseException], ...] = ()) -> Any:
    """Run ``attempt()`` until it returns or the brain ends the chain (``chain`` built with
    ``sync=True``); ``sleep(seconds)`` waits each backoff. Closes ``chain``."""
    owner = RETRY_OWNER.set(chain)
    try:
        while True:
            try:
                result = attempt()
            except passthrough:
                raise
            except Exception as exc:
                delay = chain.failed_sync(exc)
                if delay is None:
                    raise_end(chain, exc)
                sleep(delay / 1000)
                chain.backoff_elapsed()
            else:
                chain.succeeded()
                return result
    except BaseException:  # KeyboardInterrupt, control flow: a running chain ends cancelled
        chain.cancel()
        raise
    finally:
        RETRY_OWNER.reset(owner)
        chain.close()


async def drive_async(chain: Chain, attempt: Callable[[], Awaitable[Any]], *, clock: Any = None,
                      passthrough: tuple[type[BaseException], ...] = ()) -> Any:
    """``await attempt()`` until it succeeds or the brain ends the chain; each backoff waits on
    ``clock`` (:func:`fsm.host.clock.wait_ms`); a cancellation ends the chain ``cancelled``.
    Closes ``chain``."""
    owner = RETRY_OWNER.set(chain)
    try:
        while True:
            try:
                result = await attempt()
            except passthrough:
                raise
            except Exception as exc:
                delay = await chain.failed(exc)
                if delay is None:
                    raise_end(chain, exc)
                await wait_ms(clock, delay)
                chain.backoff_elapsed()
            else:
                chain.succeeded()
                return result
    except BaseException:
        chain.cancel()
        raise
    finally:
        RETRY_OWNER.reset(owner)
        await chain.aclose()
