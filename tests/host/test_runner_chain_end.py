"""Every auto_retry_start of the runner gets its auto_retry_end, whatever ends the chain
(docs/reliability.md, item 7): a KeyboardInterrupt, SystemExit, GeneratorExit or any
BaseException at any await of a chain, a later call that returns a generator or None; and a
100 MB exception text is clipped before it is copied into anything."""

from __future__ import annotations

import asyncio
import json

import pytest

from fsm.host.runner import RetryChainError, RetryRunner

SETTINGS = {"maxRetries": 3, "baseDelayMs": 1}


class Boom(BaseException):
    """A BaseException of the caller's own."""


BASE_EXCEPTIONS = [KeyboardInterrupt, SystemExit, GeneratorExit, Boom]


def assert_every_start_ended(events: list) -> None:
    open_chains = 0
    for event in events:
        if event.type == "auto_retry_start":
            open_chains = 1
        elif event.type == "auto_retry_end":
            assert open_chains == 1, "an end without a start"
            open_chains = 0
    assert open_chains == 0, f"a chain without an end: {[e.type for e in events]}"


def overloaded() -> Exception:
    return ConnectionError("503 Service Unavailable: overloaded")


@pytest.mark.parametrize("kind", BASE_EXCEPTIONS)
@pytest.mark.parametrize("at", ["in_the_call", "in_the_awaited_call", "in_the_backoff", "in_the_listener"])
async def test_a_base_exception_at_any_await_still_ends_the_chain(kind, at):
    """Only CancelledError ended the chain; any other BaseException left it open."""
    events: list = []
    calls = 0

    def listener(event):
        events.append(event)
        if at == "in_the_listener" and event.type == "auto_retry_start" and event.attempt == 2:
            raise kind()

    async def sleep(_seconds):
        if at == "in_the_backoff" and calls == 2:
            raise kind()

    def call():
        nonlocal calls
        calls += 1
        if calls == 2 and at == "in_the_call":
            raise kind()

        async def attempt():
            if calls == 2 and at == "in_the_awaited_call":
                raise kind()
            raise overloaded()
        return attempt()

    with pytest.raises(kind):
        await RetryRunner(SETTINGS, on_event=listener, sleep=sleep).run(call)
    assert events[0].type == "auto_retry_start"
    assert_every_start_ended(events)
    assert events[-1].type == "auto_retry_end" and events[-1].success is False


@pytest.mark.parametrize("kind", BASE_EXCEPTIONS)
def test_a_base_exception_in_a_sync_chain_still_ends_it(kind):
    """run_sync ended the chain on KeyboardInterrupt only."""
    events: list = []
    calls = 0

    def call():
        nonlocal calls
        calls += 1
        if calls == 2:
            raise kind()
        raise overloaded()

    with pytest.raises(kind):
        RetryRunner(SETTINGS, on_event=events.append, sleep=lambda s: None).run_sync(call)
    assert_every_start_ended(events)
    assert events[-1].type == "auto_retry_end"


@pytest.mark.parametrize("returned", ["generator", "none", "number"])
async def test_a_later_call_that_returns_no_awaitable_ends_the_chain(returned):
    """A TypeError raised for the second call's return value left the chain open; now the
    chain ends (fatal) and RetryChainError carries the TypeError."""
    events: list = []
    calls = 0

    def gen():
        yield 1

    def call():
        nonlocal calls
        calls += 1
        if calls == 1:
            async def fail():
                raise overloaded()
            return fail()
        return {"generator": gen(), "none": None, "number": 42}[returned]

    async def no_sleep(_s):
        return None

    with pytest.raises(RetryChainError) as info:
        await RetryRunner(SETTINGS, on_event=events.append, sleep=no_sleep).run(call)
    assert_every_start_ended(events)
    assert info.value.end_reason == "fatal"
    assert isinstance(info.value.__cause__, TypeError)
    assert "not an awaitable" in str(info.value)


async def test_a_first_call_that_returns_no_awaitable_is_still_a_type_error():
    """Without a chain the caller's mistake is raised as it was: a TypeError, no event."""
    events: list = []
    with pytest.raises(TypeError, match="not an awaitable"):
        await RetryRunner(SETTINGS, on_event=events.append).run(lambda: None)
    assert events == []


def test_a_sync_call_that_returns_an_awaitable_later_ends_the_chain():
    """run_sync: an awaitable returned by a later call ends the chain (fatal)."""
    events: list = []
    calls = 0

    async def coro():
        return 1

    def call():
        nonlocal calls
        calls += 1
        if calls == 1:
            raise overloaded()
        return coro()

    with pytest.raises(RetryChainError) as info:
        RetryRunner(SETTINGS, on_event=events.append, sleep=lambda s: None).run_sync(call)
    assert_every_start_ended(events)
    assert isinstance(info.value.__cause__, TypeError)


async def test_closing_the_awaiting_coroutine_ends_the_chain():
    """A GeneratorExit thrown in by closing the coroutine that awaits the run (no event loop
    cancellation) still ends the chain."""
    events: list = []
    gate = asyncio.Event()

    async def call():
        if len(events) >= 1:
            await gate.wait()  # the second attempt hangs
        raise overloaded()

    async def no_sleep(_s):
        return None

    coro = RetryRunner(SETTINGS, on_event=events.append, sleep=no_sleep).run(call)
    # Drive the coroutine by hand until it waits on the gate, then close it.
    future = coro.send(None)
    while not events or events[-1].type != "auto_retry_start":
        future = coro.send(None)
    coro.close()
    assert_every_start_ended(events)


async def test_a_100_mb_exception_text_is_clipped_before_it_reaches_an_event():
    """The text was copied whole into auto_retry_start and RetryChainError (100 MB each)."""
    events: list = []
    huge = "overloaded " + "x" * 100_000_000

    async def call():
        raise ConnectionError(huge)

    async def no_sleep(_s):
        return None

    with pytest.raises(RetryChainError) as info:
        await RetryRunner({"maxRetries": 1, "baseDelayMs": 1}, on_event=events.append,
                          sleep=no_sleep).run(call)
    for event in events:
        assert len(json.dumps(event.to_json())) < 20_000
    assert len(str(info.value)) < 20_000 and len(info.value.final_error) < 20_000
