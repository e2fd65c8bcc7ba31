"""fsm.retrying / retrying_sync / retry / RetryRunner: the runner as a host of the brain.

Plain callables and a fake clock (no network, no real waits); the real SDK clients against
the fault server are in tests/host/test_runner_sdks.py. The exception rules are docs/policy.md §10.
"""

import asyncio

import pytest

import fsm
from fsm.core import lifecycle as L
from fsm.core.messages import AssistantMessage
from fsm.host.runner import ContextOverflowError, RetryChainError, RetryRunner
from fsm.core.settings import RetrySettings, SettingsError
from fsm.testing import FakeClock


class Script:
    """A callable that raises or returns the next scripted item; counts its calls."""

    def __init__(self, *items):
        self.items = list(items)
        self.calls = 0

    def _next(self):
        item = self.items[self.calls] if self.calls < len(self.items) else "ok"
        self.calls += 1
        if isinstance(item, BaseException):
            raise item
        return item

    async def __call__(self, *args, **kwargs):
        self.args = (args, kwargs)
        return self._next()

    def sync(self, *args, **kwargs):
        self.args = (args, kwargs)
        return self._next()


async def no_sleep(seconds):
    no_sleep.waits.append(seconds)


def fast(**kw):
    return RetryRunner({"baseDelayMs": 10, **kw.pop("settings", {})}, sleep=no_sleep, **kw)


@pytest.fixture(autouse=True)
def _reset_waits():
    no_sleep.waits = []


async def test_a_retryable_failure_then_success_returns_the_result_with_the_brains_events():
    """One reset, then the answer: two calls, the default backoff, start then end events."""
    events = []
    fn = Script(ConnectionResetError("Connection reset by peer"), {"answer": 42})
    result = await fast(on_event=events.append).run(fn, 1, model="m")
    assert result == {"answer": 42} and fn.calls == 2 and fn.args == ((1,), {"model": "m"})
    assert no_sleep.waits == [0.01]
    assert [e.type for e in events] == ["auto_retry_start", "auto_retry_end"]
    assert events[0]["attempt"] == 1 and events[0]["delayMs"] == 10
    assert events[0]["errorMessage"] == "ConnectionResetError: Connection reset by peer"
    assert events[1] == {"type": "auto_retry_end", "success": True, "attempt": 1,
                         "endReason": "succeeded", "chainId": events[0]["chainId"]}


async def test_a_fatal_first_failure_is_re_raised_unchanged_and_starts_no_chain():
    """The caller's own exception, the same object: existing except clauses keep working."""
    boom = ValueError("bad request shape")
    events = []
    with pytest.raises(ValueError) as info:
        await fast(on_event=events.append).run(Script(boom))
    assert info.value is boom and events == []


async def test_retry_disabled_re_raises_a_retryable_failure_unchanged():
    """enabled false: the caller's exception itself, with a note saying why it was not retried."""
    reset = ConnectionResetError("Connection reset by peer")
    with pytest.raises(ConnectionResetError) as info:
        await fast(settings={"enabled": False}).run(Script(reset))
    assert info.value is reset
    assert info.value.__notes__ == ["retry-fsm: not retried (retry.enabled is false)"]


async def test_exhaustion_raises_the_chain_error_with_the_last_exception_chained():
    """Exhaustion raises the chain error with the last exception chained."""
    errors = [ConnectionResetError(f"Connection reset by peer #{i}") for i in range(4)]
    fn = Script(*errors)
    events = []
    with pytest.raises(RetryChainError) as info:
        await fast(on_event=events.append).run(fn)
    err = info.value
    assert err.end_reason == "exhausted" and err.attempts == 3 and err.calls == 4 == fn.calls
    assert err.__cause__ is errors[3]
    assert err.classification.kind == "retryable" and err.classification.rule == "retryable.connection"
    assert err.final_error == "ConnectionResetError: Connection reset by peer #3"
    assert no_sleep.waits == [0.01, 0.02, 0.04]
    assert events[-1]["endReason"] == "exhausted" and events[-1]["attempt"] == 3


async def test_a_fatal_error_inside_a_chain_raises_the_chain_error():
    """A fatal error inside a chain raises the chain error."""
    denied = PermissionError("401 Incorrect API key provided")
    with pytest.raises(RetryChainError) as info:
        await fast().run(Script(ConnectionResetError("reset by peer"), denied))
    assert info.value.end_reason == "fatal" and info.value.attempts == 1
    assert info.value.__cause__ is denied


async def test_a_refusal_at_rest_re_raises_the_callers_exception_with_the_end_reason_noted():
    """maxRetries 0: the reference behaviour's end {success:false, attempt:0} is emitted, and the
    caller gets its own exception (as with enabled false), the end reason in its notes."""
    reset = ConnectionResetError("Connection reset by peer")
    events = []
    with pytest.raises(ConnectionResetError) as info:
        await fast(settings={"maxRetries": 0}, on_event=events.append).run(Script(reset))
    assert info.value is reset
    assert info.value.__notes__ == ["retry-fsm: not retried (endReason: exhausted, attempt 0)"]
    assert [(e.type, e["attempt"], e["endReason"]) for e in events] == [("auto_retry_end", 0, "exhausted")]


def test_a_refusal_at_rest_in_a_sync_run_re_raises_too():
    """run_sync keeps the same contract for maxRetries 0."""
    reset = ConnectionResetError("Connection reset by peer")
    with pytest.raises(ConnectionResetError) as info:
        fsm.retrying_sync(Script(reset).sync, settings={"maxRetries": 0})
    assert info.value is reset and "endReason: exhausted" in info.value.__notes__[0]


@pytest.mark.parametrize("first", [True, False])
async def test_a_context_overflow_raises_the_overflow_error_first_or_inside_a_chain(first):
    """A context overflow raises the overflow error first or inside a chain."""
    overflow = RuntimeError("400 prompt is too long: 250000 tokens > 200000 maximum")
    items = (overflow,) if first else (ConnectionResetError("reset by peer"), overflow)
    with pytest.raises(ContextOverflowError) as info:
        await fast().run(Script(*items))
    err = info.value
    assert err.__cause__ is overflow and err.classification.kind == "context_overflow"
    assert err.end_reason == (None if first else "overflow")
    assert not isinstance(err, RetryChainError)


async def test_a_hint_longer_than_the_wait_ends_the_chain_at_once():
    """retryHints honor + a 2 h reset: no request is sent into a known failure; refused on the
    first failure (attempt 0), the caller's exception comes back with the end reason noted."""
    limited = RuntimeError("429 usage limit reached, try again in 2h 13m")
    fn = Script(limited)
    with pytest.raises(RuntimeError) as info:
        await fast(settings={"retryHints": "honor"}).run(fn)
    assert info.value is limited and fn.calls == 1
    assert info.value.__notes__[-1] == "retry-fsm: not retried (endReason: hint_too_long, attempt 0)"
    assert no_sleep.waits == []


async def test_a_returned_failed_message_is_judged_like_a_provider_turn():
    """A Provider's complete() never raises: the message decides; no chain -> returned as is."""
    fatal = AssistantMessage("error", error_message="401 Incorrect API key provided")
    assert await fast().run(Script(fatal)) is fatal
    fn = Script(AssistantMessage("error", error_message="529 Overloaded"),
                AssistantMessage("stop", text="hi"))
    result = await fast().run(fn)
    assert result.text == "hi" and fn.calls == 2


async def test_cancelling_the_awaiting_task_during_a_backoff_ends_the_chain_cancelled():
    """Cancelling the awaiting task during a backoff ends the chain cancelled."""
    clock = FakeClock()
    events = []
    fn = Script(ConnectionResetError("reset by peer"))
    task = asyncio.ensure_future(RetryRunner(clock=clock, on_event=events.append).run(fn))
    await clock.settle()
    assert clock.pending == [2.0]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fn.calls == 1 and clock.pending == []
    assert events[-1] == {"type": "auto_retry_end", "success": False, "attempt": 1,
                          "finalError": fsm.CANCELLED_TEXT, "endReason": "cancelled",
                          "chainId": events[0]["chainId"]}


async def test_cancelling_during_a_retried_call_ends_the_chain_cancelled():
    """Cancelling during a retried call ends the chain cancelled."""
    gate = asyncio.Event()
    calls = []

    async def fn():
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionResetError("reset by peer")
        await gate.wait()

    events = []
    task = asyncio.ensure_future(fast(on_event=events.append).run(fn))
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(calls) == 2
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [e["endReason"] for e in events if e.type == "auto_retry_end"] == ["cancelled"]


async def test_cancelling_a_first_call_emits_nothing():
    """Cancelling a first call emits nothing."""
    async def fn():
        await asyncio.Event().wait()

    events = []
    task = asyncio.ensure_future(fast(on_event=events.append).run(fn))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert events == []


async def test_the_backoff_lives_on_the_injected_clock():
    """The backoff lives on the injected clock."""
    clock = FakeClock()
    fn = Script(ConnectionResetError("reset by peer"), ConnectionResetError("reset by peer"))
    task = asyncio.ensure_future(RetryRunner(clock=clock).run(fn))
    await clock.advance(1.999)
    assert fn.calls == 1
    await clock.advance(0.001)
    assert fn.calls == 2
    await clock.advance(4.0)
    assert await task == "ok" and fn.calls == 3


async def test_retry_at_comes_from_the_clock():
    """Retry at comes from the clock."""
    clock = FakeClock()
    events = []
    task = asyncio.ensure_future(RetryRunner(clock=clock, on_event=events.append).run(
        Script(ConnectionResetError("reset by peer"))))
    await clock.advance(2.0)
    await task
    assert events[0]["retryAt"] == FakeClock.EPOCH_MS + 2000


async def test_a_broken_listener_never_breaks_the_chain(caplog):
    """A broken listener never breaks the chain."""
    def listener(event):
        raise RuntimeError("listener bug")

    assert await fast(on_event=listener).run(Script(ConnectionResetError("reset by peer"))) == "ok"
    assert "on_event failed" in caplog.text


async def test_retrying_shorthand_passes_other_keywords_to_the_callable():
    """Retrying shorthand passes other keywords to the callable."""
    fn = Script(ConnectionResetError("reset by peer"))
    clock = FakeClock()
    task = asyncio.ensure_future(fsm.retrying(fn, "a", settings={"baseDelayMs": 1}, clock=clock,
                                              model="x", messages=[]))
    await clock.advance(0.001)
    assert await task == "ok" and fn.args == (("a",), {"model": "x", "messages": []})


async def test_the_decorator_works_on_async_and_sync_functions_and_bare():
    """The decorator works on async and sync functions and bare."""
    fn = Script(ConnectionResetError("reset by peer"))

    @fsm.retry(settings={"baseDelayMs": 0}, sleep=no_sleep)
    async def ask(x):
        return await fn(x)

    assert await ask(3) == "ok" and ask.__name__ == "ask"
    sync_fn = Script(ConnectionResetError("reset by peer"))

    @fsm.retry(settings=RetrySettings(base_delay_ms=0), sleep=lambda s: None)
    def ask_sync(x):
        return sync_fn.sync(x)

    assert ask_sync(4) == "ok" and sync_fn.calls == 2

    @fsm.retry
    def plain():
        return "plain"

    assert plain() == "plain"


def test_retrying_sync_waits_with_the_injected_sleep():
    """Retrying sync waits with the injected sleep."""
    waits = []
    fn = Script(ConnectionResetError("reset by peer"), ConnectionResetError("reset by peer"))
    assert fsm.retrying_sync(fn.sync, sleep=waits.append) == "ok"
    assert waits == [2.0, 4.0] and fn.calls == 3


def test_a_keyboard_interrupt_during_a_sync_backoff_ends_the_chain_cancelled():
    """A keyboard interrupt during a sync backoff ends the chain cancelled."""
    events = []

    def sleep(seconds):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fsm.retrying_sync(Script(ConnectionResetError("reset by peer")).sync, sleep=sleep,
                          on_event=events.append)
    assert events[-1]["endReason"] == "cancelled"


def test_sync_exhaustion_and_fatal_follow_the_same_rules():
    """Sync exhaustion and fatal follow the same rules."""
    boom = KeyError("nope")
    with pytest.raises(KeyError) as info:
        fsm.retrying_sync(Script(boom).sync)
    assert info.value is boom
    with pytest.raises(RetryChainError) as info:
        fsm.retrying_sync(Script(*[ConnectionResetError("reset by peer")] * 2).sync,
                          settings={"maxRetries": 1}, sleep=lambda s: None)
    assert info.value.end_reason == "exhausted"


def test_bad_options_are_refused_with_the_value_named():
    """Bad options are refused with the value named."""
    with pytest.raises(SettingsError, match="maxRetries"):
        RetryRunner({"maxRetries": -1})
    with pytest.raises(TypeError, match="settings must be"):
        RetryRunner(["maxRetries"])
    with pytest.raises(TypeError, match="on_event must be callable"):
        RetryRunner(on_event=3)
    with pytest.raises(ValueError, match="context_window"):
        RetryRunner(context_window=-5)
    assert RetryRunner(coordinator=__import__('fsm.fleet').fleet.InProcessCoordinator()).run_sync(lambda: 1) == 1


async def test_the_runners_transitions_are_recorded_with_the_brain_as_owner():
    """The audit sees the runner's machine like the session's (the recorder gets the brain)."""
    seen = []
    recorder = lambda owner, record: seen.append((type(owner).__name__, record.row))  # noqa: E731
    L.add_recorder(recorder)
    try:
        await fast().run(Script(ConnectionResetError("reset by peer")))
    finally:
        L.remove_recorder(recorder)
    assert [owner for owner, _ in seen] == ["RetryBrain"] * len(seen)
    taken = [row for _, row in seen if "->" in row]
    assert taken[-1] == "continuing--turn_succeeded->succeeded"
    assert "backing_off--backoff_elapsed[timer_is_current,budget_allows]->continuing" in taken


class FakeCoordinator:
    """The coordinator protocol's calls the runner makes, recorded (docs/policy.md §9)."""

    def __init__(self, cooldown_ms=0, allowed=True, slow=False):
        self.cooldown_ms, self.allowed, self.slow = cooldown_ms, allowed, slow
        self.calls = []

    async def before_decision(self, key, now_ms, budget):
        self.calls.append(("before_decision", key))
        if self.slow:
            await asyncio.sleep(10)
        return self.cooldown_ms, (None if budget is None else self.allowed)

    async def learn_cooldown(self, key, until_ms, now_ms):
        self.calls.append(("learn_cooldown", until_ms - now_ms))

    async def return_retry_token(self, key, budget):
        self.calls.append(("return_retry_token",))

    async def credit_success(self, key, budget):
        self.calls.append(("credit_success",))


async def test_the_coordinator_is_read_before_and_written_after_each_decision():
    """The coordinator is read before and written after each decision."""
    coord = FakeCoordinator(cooldown_ms=50)
    events = []
    runner = RetryRunner({"baseDelayMs": 1, "retryHints": "honor", "budget": {}}, sleep=no_sleep,
                         coordinator=coord, key="acct", on_event=events.append)
    fn = Script(RuntimeError("429 Too Many Requests (retry-after-ms: 30)"))
    assert await runner.run(fn) == "ok"
    for _ in range(10):  # the writes run in the background, after the decision
        await asyncio.sleep(0)
    assert coord.calls[0] == ("before_decision", "acct")
    assert ("learn_cooldown", 30) in coord.calls and ("credit_success",) in coord.calls
    assert events[0]["delaySource"] == "cooldown" and events[0]["delayMs"] == 50


async def test_a_budget_refusal_ends_the_chain_and_a_slow_coordinator_is_not_waited_for():
    """A budget refusal ends the chain and a slow coordinator is not waited for."""
    refuse = RetryRunner({"baseDelayMs": 1, "budget": {}}, sleep=no_sleep,
                         coordinator=FakeCoordinator(allowed=False))
    with pytest.raises(ConnectionResetError) as info:  # refused at attempt 0: the caller's own
        await refuse.run(Script(ConnectionResetError("reset by peer")))
    assert "endReason: budget" in info.value.__notes__[-1]
    slow = RetryRunner({"baseDelayMs": 1, "budget": {}}, sleep=no_sleep,
                       coordinator=FakeCoordinator(slow=True))
    assert await asyncio.wait_for(slow.run(Script(ConnectionResetError("reset by peer"))), 2) == "ok"


OUTCOMES = {"reset": ConnectionResetError("Connection reset by peer"),
            "fatal": ValueError("bad input"),
            "overflow": RuntimeError("prompt is too long: 300000 tokens > 200000 maximum"),
            "ok": "ok"}


def _expected(script, max_retries):
    """(result or exception, calls made, whether an auto_retry_end is emitted): the rules of
    docs/policy.md §10, written from the table, not from the runner."""
    first = script[0]
    if first == "ok":
        return "ok", 1, False
    if first == "overflow":
        return ContextOverflowError, 1, False
    if first == "fatal":
        return "same", 1, False
    if max_retries == 0:  # a refusal at rest: the caller's own exception, its end emitted
        return "reraise", 1, True
    for i, item in enumerate(script[1:], 1):
        if item == "ok":
            return "ok", i + 1, True
        if item == "overflow":
            return ContextOverflowError, i + 1, True
        if item == "fatal" or i == max_retries:
            return RetryChainError, i + 1, True
    raise AssertionError("script too short")


@pytest.mark.parametrize("case", range(60))
async def test_random_scripts_follow_the_exception_rules(case):
    """Random outcomes and maxRetries: the result or exception, the calls made and the events
    emitted are those the rules say; every start is followed by one end."""
    import random
    rng = random.Random(case)
    max_retries = rng.randint(0, 3)
    script = [rng.choice(["reset", "reset", "fatal", "overflow", "ok"]) for _ in range(6)]
    expected, calls, ended = _expected(script, max_retries)
    fn = Script(*[OUTCOMES[s] for s in script])
    events = []
    runner = RetryRunner({"maxRetries": max_retries, "baseDelayMs": 0}, sleep=no_sleep,
                         on_event=events.append)
    if expected == "ok":
        assert await runner.run(fn) == "ok"
    elif expected == "same":
        with pytest.raises(ValueError) as info:
            await runner.run(fn)
        assert info.value is OUTCOMES["fatal"]
    elif expected == "reraise":
        with pytest.raises(Exception) as info:
            await runner.run(fn)
        assert info.value is OUTCOMES[script[0]]
    else:
        with pytest.raises(expected) as info:
            await runner.run(fn)
        assert info.value.__cause__ is OUTCOMES[script[calls - 1]]
        assert info.value.calls == calls
    assert fn.calls == calls
    starts = [e for e in events if e.type == "auto_retry_start"]
    ends = [e for e in events if e.type == "auto_retry_end"]
    assert len(ends) == (1 if ended else 0) and len(starts) == (calls - 1)
    assert events[-1:] == ends  # the end, when there is one, comes last


class SubscribingCoordinator(FakeCoordinator):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.listeners = []

    def subscribe(self, listener):
        self.listeners.append(listener)
        return lambda: self.listeners.remove(listener)

    async def before_decision(self, key, now_ms, budget):
        for listener in list(self.listeners):
            listener({"type": "coordinator_unavailable", "reason": "redis: connection refused"})
        return await super().before_decision(key, now_ms, budget)


async def test_the_coordinators_events_reach_on_event_while_the_call_runs():
    """The coordinators events reach on event while the call runs."""
    coord = SubscribingCoordinator()
    events = []
    runner = RetryRunner({"baseDelayMs": 0, "retryHints": "honor"}, sleep=no_sleep,
                         coordinator=coord, on_event=events.append)
    assert await runner.run(Script(ConnectionResetError("reset by peer"))) == "ok"
    assert events[0] == {"type": "coordinator_unavailable", "reason": "redis: connection refused"}
    assert coord.listeners == []  # unsubscribed when the call ended


async def test_the_default_key_names_the_sdk_module_and_the_model():
    """The default key names the SDK module and the model."""
    from fsm.fleet import CoordKey
    coord = FakeCoordinator()
    runner = RetryRunner({"baseDelayMs": 0, "retryHints": "honor"}, sleep=no_sleep, coordinator=coord)
    fn = Script(ConnectionResetError("reset by peer"))
    fn.__module__ = "openai.resources.chat.completions"
    await runner.run(fn, model="gpt-x")
    assert coord.calls[0] == ("before_decision", CoordKey("openai", "gpt-x", "default"))


async def test_without_a_coordinator_honor_shares_the_loops_in_process_one():
    """Two runner calls on one loop: the hint the first learned is the second's cooldown."""
    events = []
    runner = RetryRunner({"baseDelayMs": 1, "retryHints": "honor"}, sleep=no_sleep,
                         on_event=events.append, key=None)
    hinted = RuntimeError("429 Too Many Requests (retry-after-ms: 300)")
    await runner.run(Script(hinted), model="shared-model")
    for _ in range(10):
        await asyncio.sleep(0)
    await runner.run(Script(ConnectionResetError("reset by peer")), model="shared-model")
    second = [e for e in events if e.type == "auto_retry_start"][1]
    assert second["delaySource"] == "cooldown" and 0 < second["delayMs"] <= 300


def test_a_sync_run_with_honor_and_a_budget_shares_nothing_and_works():
    """A sync run with honor and a budget shares nothing and works."""
    waits = []
    fn = Script(RuntimeError("429 Too Many Requests (retry-after-ms: 30)"))
    assert fsm.retrying_sync(fn.sync, settings={"retryHints": "honor", "budget": {}, "baseDelayMs": 1},
                             sleep=waits.append) == "ok"
    assert waits == [0.03]


async def test_a_sync_callable_given_to_the_async_runner_is_named_in_the_error():
    """A sync callable given to the async runner is named in the error."""
    def sync_call():
        return "not awaitable"

    with pytest.raises(TypeError, match=r"sync_call returned str, not an awaitable: use fsm.retrying_sync"):
        await fsm.retrying(sync_call)


def test_an_async_callable_given_to_the_sync_runner_is_named_in_the_error():
    """An async callable given to the sync runner is named in the error."""
    async def async_call():
        return "ok"

    with pytest.raises(TypeError, match=r"async_call returned an awaitable: use fsm.retrying"):
        fsm.retrying_sync(async_call)


async def test_the_chains_deadline_is_read_on_the_clock():
    """maxElapsedMs 3000 with 2 s then 4 s backoffs: the second retry would go out at 6 s."""
    clock = FakeClock()
    fn = Script(*[ConnectionResetError("reset by peer")] * 3)
    task = asyncio.ensure_future(RetryRunner({"maxElapsedMs": 3000}, clock=clock).run(fn))
    await clock.advance(2.0)
    with pytest.raises(RetryChainError) as info:
        await task
    assert info.value.end_reason == "deadline" and fn.calls == 2 and info.value.attempts == 1


async def test_a_sync_callable_returning_none_is_refused_too():
    """A sync callable returning none is refused too."""
    with pytest.raises(TypeError, match=r"returned NoneType, not an awaitable"):
        await fsm.retrying(lambda: None)


async def test_a_programming_error_is_fatal_whatever_its_text():
    """Attack report: KeyError("overloaded") was retried three times."""
    import fsm
    calls = []

    async def buggy():
        calls.append(1)
        raise KeyError("overloaded")
    with pytest.raises(KeyError):
        await fsm.retrying(buggy, settings={"baseDelayMs": 0})
    assert len(calls) == 1


async def test_an_exception_whose_str_raises_is_re_raised_as_it_came():
    """Attack report: the caller got a ZeroDivisionError from our text mapping instead."""
    import fsm

    class Weird(Exception):
        def __str__(self):
            return str(1 / 0)

    async def call():
        raise Weird()
    with pytest.raises(Weird):
        await fsm.retrying(call)


def test_two_runner_chains_never_share_a_chain_id():
    """Every chain gets a chain id unique in the process, whatever its host (SPEC §15.1):
    OpenTelemetry spans keyed by chainId never merge two calls (docs/integrations.md)."""
    ids = []
    for _ in range(2):
        events = []
        answers = [ConnectionResetError("reset"), "ok"]

        def fn() -> str:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer
        RetryRunner(on_event=events.append, sleep=lambda s: None).run_sync(fn)
        ids.append(events[0]["chainId"])
    assert ids[0] != ids[1] and all(isinstance(i, int) and i >= 1 for i in ids)


async def test_the_async_entry_refuses_a_sync_sdk_resource_before_calling_it():
    """fsm.retrying refuses a known sync SDK resource before any call, naming retrying_sync
    (SPEC §15.13 "Sync and async"; docs/embedding.md)."""
    import openai
    client = openai.OpenAI(api_key="sk-test", base_url="http://127.0.0.1:9")
    with pytest.raises(TypeError, match="retrying_sync"):
        await fsm.retrying(client.chat.completions.create, model="m", messages=[])


async def test_a_sync_function_that_raises_is_called_once_on_the_async_entry():
    """A synchronous function that raises is not retried on the event loop: one call, then
    TypeError naming retrying_sync from its exception (SPEC §15.13; docs/policy.md §10)."""
    calls = []

    def sync_fn() -> None:
        calls.append(1)
        raise ConnectionResetError("reset")
    with pytest.raises(TypeError, match="retrying_sync") as info:
        await fsm.retrying(sync_fn, sleep=no_sleep)
    assert len(calls) == 1 and isinstance(info.value.__cause__, ConnectionResetError)
