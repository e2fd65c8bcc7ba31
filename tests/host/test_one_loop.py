"""One failure script through every host of the one loop gives the same requests, waits,
events and outcome (SPEC §15.1; docs/architecture.md "The loop")."""

from __future__ import annotations

import asyncio

import pytest

from fsm.host.chain import Chain
from fsm.host.runner import RetryRunner

OVERLOADED = "529 Overloaded"
FATAL = "401 Incorrect API key provided"
SCRIPTS = {
    "529, 529, success": ([OVERLOADED, OVERLOADED, None], {}),
    "maxRetries 0": ([OVERLOADED], {"maxRetries": 0}),
    "fatal": ([FATAL], {}),
    "exhausted": ([OVERLOADED] * 3, {"maxRetries": 2}),
}


def _settings(extra):
    return {"baseDelayMs": 100, "jitter": "none", **extra}


def _outcome(run):
    """(requests, waits, event types and reasons, outcome type, notes)."""
    calls, waits, events = [], [], []
    try:
        result = run(calls, waits, events)
        kind, notes = type(result).__name__, ()
    except Exception as exc:  # noqa: BLE001 - the outcome compared
        kind, notes = type(exc).__name__, tuple(getattr(exc, "__notes__", ()))
    shown = [(e["type"], e.get("endReason"), e.get("delayMs")) for e in events]
    return len(calls), waits, shown, kind, notes


def _attempt(script, calls):
    text = script[len(calls)]
    calls.append(1)
    if text is not None:
        raise RuntimeError(text)
    return "ok"


def _runner_async(script, settings):
    def run(calls, waits, events):
        async def fn():
            return _attempt(script, calls)

        async def sleep(seconds):
            waits.append(round(seconds * 1000))
        return asyncio.run(RetryRunner(settings, on_event=events.append, sleep=sleep).run(fn))
    return run


def _runner_sync(script, settings):
    def run(calls, waits, events):
        return RetryRunner(settings, on_event=events.append,
                           sleep=lambda s: waits.append(round(s * 1000))).run_sync(
            lambda: _attempt(script, calls))
    return run


def _chain_sync(script, settings):
    def run(calls, waits, events):
        chain = Chain(settings, on_event=events.append, sync=True)
        chain.pause_sync(chain.start_sync(), waits.append)
        while True:
            try:
                result = _attempt(script, calls)
            except RuntimeError as exc:
                delay = chain.failed_sync(exc)
                if delay is None:
                    raise chain.error() from exc
                chain.pause_sync(delay, waits.append)
            else:
                chain.succeeded()
                return result
    return run


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_runner_async_sync_and_a_chain_agree_on_one_failure_script(name):
    """Same requests, waits, auto_retry_* events and outcome (the §14b.14 contract) from the
    runner (async and sync) and a Chain (docs/architecture.md "The loop")."""
    script, extra = SCRIPTS[name]
    settings = _settings(extra)
    seen = [_outcome(host(script, settings))
            for host in (_runner_async, _runner_sync, _chain_sync)]
    assert seen[0] == seen[1] == seen[2]
    if name == "maxRetries 0":  # a refusal at rest: the caller's exception, its reason noted
        assert seen[0][3] == "RuntimeError"
        assert seen[0][4] == ("retry-fsm: not retried (endReason: exhausted, attempt 0)",)
    if name == "exhausted":
        assert seen[0][0] == 3 and seen[0][3] == "RetryChainError"
