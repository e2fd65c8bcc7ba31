"""A slow, stopped or restarted Redis never stalls or breaks a session: the guarded
coordinator answers from local state within its timeout, says so once, and shares again
when Redis is back (``docs/fleet.md``, "When Redis is down")."""

from __future__ import annotations

import asyncio
import time

import pytest

from fsm.fleet import (BudgetSettings, CoordinatorError, CoordKey, GuardedCoordinator,
                       InProcessCoordinator, RedisCoordinator, RedisCredentialStore,
                       credential_id, wall_ms)
from fleet_support import Worker, own_redis, prefix  # noqa: F401 (fixtures)

KEY = CoordKey("anthropic", "claude-x", credential_id("sk-1"))
BUDGET = BudgetSettings(max_tokens=10)
TIMEOUT_S = 0.05
PROBE_S = 0.05


def guarded(url: str, prefix: str, events: list) -> GuardedCoordinator:
    return GuardedCoordinator(RedisCoordinator.from_url(url, prefix=prefix), timeout_s=TIMEOUT_S,
                              on_event=events.append, probe_interval_s=PROBE_S)


async def timed(awaitable):
    t0 = time.monotonic()
    value = await awaitable
    return value, time.monotonic() - t0


async def settled(g: GuardedCoordinator) -> None:
    """Let the guard's background work (probes, heartbeats, give-backs) finish."""
    while g._background:
        await asyncio.gather(*tuple(g._background), return_exceptions=True)


async def until_restored(g: GuardedCoordinator, events: list) -> None:
    """Call the coordinator as a session would until the restored event (a 60 s hang guard)."""
    deadline = time.monotonic() + 60
    while g.breaker.available is False:
        assert time.monotonic() < deadline, f"not restored: {events}"
        await asyncio.sleep(PROBE_S)
        await g.cooldown_left_ms(KEY, wall_ms())


async def test_redis_killed_mid_use_answers_locally_then_shares_again(own_redis, prefix):  # noqa: F811
    """Redis killed mid use answers locally then shares again."""
    events: list = []
    g = guarded(own_redis.url, prefix, events)
    other = RedisCoordinator.from_url(own_redis.url, prefix=prefix)  # another process's view
    now = wall_ms()
    await g.learn_cooldown(KEY, now + 30_000, now)
    assert 29_000 < await other.cooldown_left_ms(KEY, now) <= 30_000
    assert await g.take_retry_token(KEY, BUDGET) is True

    own_redis.kill()
    left, took = await timed(g.cooldown_left_ms(KEY, wall_ms()))
    assert took < 5 and 25_000 < left <= 30_000, "from the local mirror, not after a connect timeout"
    assert [e["type"] for e in events] == ["coordinator_unavailable"]
    assert "127.0.0.1" in events[0]["reason"]
    # Every call keeps answering, from local state, and no second event is emitted.
    for _ in range(20):
        answers, took = await timed(asyncio.gather(
            g.take_retry_token(KEY, BUDGET), g.before_decision(KEY, wall_ms(), BUDGET), g.credit_success(KEY, BUDGET),
            g.return_retry_token(KEY, BUDGET), g.learn_cooldown(KEY, wall_ms() + 1000, wall_ms()),
            g.mark_credential_limited("anthropic", "c1", wall_ms() + 5000, wall_ms()),
            g.limited_credentials("anthropic", wall_ms())))
        assert took < 5  # local answers: no wait for the dead server (a hang guard, not a margin)
        assert "c1" in answers[6]
        assert answers[1][0] > 0, "the cooldown learned before the outage still holds"
    assert len(events) == 1 and not g.available

    own_redis.start()  # same port, empty (no persistence)
    await until_restored(g, events)
    assert [e["type"] for e in events] == ["coordinator_unavailable", "coordinator_restored"]
    # Sharing resumes: another process's hint reaches this one, and this one's reaches it.
    now = wall_ms()
    await other.learn_cooldown(KEY, now + 90_000, now)
    assert 85_000 < await g.cooldown_left_ms(KEY, now) <= 90_000
    await g.learn_cooldown(CoordKey("anthropic", "claude-z"), now + 600_000, now)
    answer = Worker(own_redis.url, prefix, [["left", "anthropic", "claude-z"]]).results()
    assert 500_000 < answer[0] <= 600_000  # however long the worker took to start
    # The restart lost the bucket this process had used: it counts as spent, not full
    # (a key nobody has seen is full).
    assert await g.take_retry_token(KEY, BUDGET) is False
    assert await other.tokens(KEY, BUDGET) == 0, "the budget is the shared one again"
    fresh = CoordKey("anthropic", "claude-fresh")
    assert await g.take_retry_token(fresh, BUDGET) is True
    assert await other.tokens(fresh, BUDGET) == 9
    left, allowed = await g.before_decision(fresh, now, BUDGET)
    assert left == 0 and allowed is True
    assert await other.tokens(fresh, BUDGET) == 8
    assert len(events) == 2
    await other.aclose()
    await g.aclose()


async def test_redis_paused_answers_within_the_timeout_then_resumes(own_redis, prefix):  # noqa: F811
    """A paused Redis: the slow answer is unknown (local, no event), the probe that finds no
    answer declares it down once, and it is restored once (docs/fleet.md "When Redis is slow
    or down")."""
    events: list = []
    g = guarded(own_redis.url, prefix, events)
    assert await g.take_retry_token(KEY, BUDGET) is True  # connected, 9 left
    own_redis.pause()
    try:
        allowed = await g.take_retry_token(KEY, BUDGET)
        assert allowed is True, "the local share (9 of 10, after the mirror) decides"
        assert events == [], "slow is not down"
        while not events:  # the probe started by the slow answer finds no answer
            await asyncio.sleep(PROBE_S)
        assert events == [{"type": "coordinator_unavailable",
                           "reason": "no answer to a probe within 500 ms"}]
        # While down: local answers at once; probes run in the background, and fail.
        for _ in range(50):
            await g.cooldown_left_ms(KEY, wall_ms())
            await asyncio.sleep(0.01)
        assert len(events) == 1
    finally:
        own_redis.resume()
    await until_restored(g, events)
    assert [e["type"] for e in events] == ["coordinator_unavailable", "coordinator_restored"]
    assert await g.take_retry_token(KEY, BUDGET) is True
    source = list(g._tokens[KEY].values())[-1][0]  # where the guard says this token came from
    # The remote bucket again: 9, minus this take, minus (usually) the take that timed out,
    # which sat in the paused server's socket and ran when it resumed. On a machine too busy
    # for the answer to come within the bound, this take is "unknown" (the local share) and
    # the remote bucket does not see it.
    assert await g.inner.tokens(KEY, BUDGET) in ((7, 8) if source == "remote" else (8, 9))
    await g.aclose()


async def test_a_second_outage_gets_its_own_pair_of_events(own_redis, prefix):  # noqa: F811
    """A second outage gets its own pair of events."""
    events: list = []
    g = guarded(own_redis.url, prefix, events)
    for _ in range(2):
        own_redis.kill()
        await g.cooldown_left_ms(KEY, wall_ms())
        own_redis.start()
        await until_restored(g, events)
    assert [e["type"] for e in events] == ["coordinator_unavailable", "coordinator_restored"] * 2
    await g.aclose()


async def test_credential_store_keeps_switching_while_redis_is_down(own_redis, prefix):  # noqa: F811
    """Credential store keeps switching while Redis is down."""
    events: list = []
    store = RedisCredentialStore({"p": ["sk-a", "sk-b", "sk-c"]}, url=own_redis.url,
                                 prefix=prefix, timeout_s=TIMEOUT_S, on_event=events.append)
    store.coordinator.breaker.probe_interval_s = PROBE_S
    assert store.api_key("p", "s") == "sk-a"
    own_redis.pause()
    try:
        t0 = time.monotonic()
        assert store.mark_usage_limit_reached("p", "s", 60_000) is True
        assert store.api_key("p", "s") == "sk-b"
        assert await store.amark_usage_limit_reached("p", "s", 60_000) is True
        assert await store.aapi_key("p", "s") == "sk-c"
        assert time.monotonic() - t0 < 4 * (TIMEOUT_S + 0.1)
        assert [e["type"] for e in events] == ["coordinator_unavailable"]
    finally:
        own_redis.resume()
    await asyncio.sleep(PROBE_S)
    store.api_key("p", "s")
    assert [e["type"] for e in events] == ["coordinator_unavailable", "coordinator_restored"]
    await store.aclose()


# -- the guard's own rules, with a scripted inner coordinator --------------------------------

class Flaky(InProcessCoordinator):
    """An inner coordinator that fails the way it is told to."""

    def __init__(self) -> None:
        super().__init__()
        self.fail: BaseException | None = None
        self.closed = False

    async def cooldown_left_ms(self, key, now_ms):
        if self.fail is not None:
            raise self.fail
        return await super().cooldown_left_ms(key, now_ms)

    async def ping(self):
        if self.fail is not None:
            raise self.fail

    async def aclose(self):
        self.closed = True
        raise RuntimeError("close failed")


async def test_guard_never_raises_whatever_the_inner_raises():
    """Guard never raises whatever the inner raises."""
    clock = [0.0]
    inner = Flaky()
    events: list = []
    g = GuardedCoordinator(inner, on_event=events.append, monotonic=lambda: clock[0])
    inner.fail = ValueError("boom")
    assert await g.cooldown_left_ms(KEY, 0) == 0
    assert events == [{"type": "coordinator_unavailable", "reason": "ValueError"}]
    inner.fail = None
    assert await g.cooldown_left_ms(KEY, 0) == 0 and len(events) == 1, "no probe before the interval"
    await settled(g)
    assert len(events) == 1
    clock[0] = 1.0
    await g.cooldown_left_ms(KEY, 0)  # answered locally; the probe due now runs beside it
    await settled(g)
    assert events[-1] == {"type": "coordinator_restored"}
    inner.fail = CoordinatorError("refused by 127.0.0.1:1")
    await g.cooldown_left_ms(KEY, 0)
    assert events[-1] == {"type": "coordinator_unavailable", "reason": "refused by 127.0.0.1:1"}
    inner.fail = asyncio.CancelledError()  # the inner call's own cancellation: local answer
    clock[0] = 2.0
    assert await g.cooldown_left_ms(KEY, 0) == 0
    await g.aclose()
    assert inner.closed


class Hanging(InProcessCoordinator):
    """An inner coordinator whose cooldown read waits for ``release``, as a command that was
    sent (``in_flight``) or, with ``sent=False``, as one still waiting for a connection."""

    def __init__(self, sent: bool = True) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.finished = False
        self.cancelled = False
        self.sent = sent
        self.in_flight: set = set()

    async def cooldown_left_ms(self, key, now_ms):
        if self.sent:
            self.in_flight.add(asyncio.current_task())
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        self.finished = True
        return 1234


async def test_a_late_call_that_sent_nothing_is_cancelled_and_declares_nothing():
    """A call that never got its turn (this process is busy) is answered locally, but the
    remote is not declared down."""
    inner = Hanging(sent=False)
    events: list = []
    g = GuardedCoordinator(inner, timeout_s=0.02, on_event=events.append)
    assert await g.cooldown_left_ms(KEY, 0) == 0
    await asyncio.sleep(0)
    assert inner.cancelled and not inner.finished
    assert events == [] and g.available


async def test_the_callers_cancellation_propagates_and_the_late_call_finishes_alone():
    """The callers cancellation propagates and the late call finishes alone."""
    inner = Hanging()
    g = GuardedCoordinator(inner, timeout_s=5)
    task = asyncio.ensure_future(g.cooldown_left_ms(KEY, 0))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    inner.release.set()
    await asyncio.sleep(0.01)
    assert inner.finished, "the call was left to finish, not cancelled"


async def test_an_answer_that_arrived_while_the_loop_was_busy_is_taken():
    """The loop is blocked past the deadline (another task's CPU work); the answer that came
    in meanwhile is used, and the remote is not declared down."""
    inner = Hanging()
    events: list = []
    g = GuardedCoordinator(inner, timeout_s=0.05, on_event=events.append)
    loop = asyncio.get_running_loop()
    loop.call_later(0.04, inner.release.set)
    loop.call_later(0.01, time.sleep, 0.1)  # a busy loop from 10 ms to 110 ms
    assert await g.cooldown_left_ms(KEY, 0) == 1234
    assert events == [] and g.available


async def test_a_late_answer_after_the_extension_is_given_up():
    """An answer later than the bound (and its extension) is unknown: answered locally, and
    the remote, which a probe finds answering, is not declared down (docs/fleet.md)."""
    inner = Hanging()
    events: list = []
    g = GuardedCoordinator(inner, timeout_s=0.05, on_event=events.append)
    assert await g.cooldown_left_ms(KEY, 0) == 0
    await settled(g)
    assert events == [] and g.available
    inner.release.set()


async def test_the_fallback_bucket_continues_from_the_fleets_count(own_redis, prefix):  # noqa: F811
    """Redis said the fleet's bucket is drained; when Redis goes away, this process does not
    start again from a full bucket of retries (docs/fleet.md "When Redis is slow or down")."""
    events: list = []
    # a bound long enough that no answer is "unknown" on a busy machine: the local share is
    # lowered to what Redis told, and nothing else takes from it
    g = GuardedCoordinator(RedisCoordinator.from_url(own_redis.url, prefix=prefix), timeout_s=5,
                           on_event=events.append, probe_interval_s=PROBE_S)
    budget = BudgetSettings(max_tokens=10)
    answers = [await g.take_retry_token(KEY, budget) for _ in range(8)]
    assert answers == [True] * 4 + [False] * 4  # 2 tokens left in Redis
    assert g.fallback.tokens(KEY, budget) == 2
    own_redis.kill()
    assert await g.before_decision(KEY, wall_ms(), budget) == (0, False)  # local: 1 left
    await g.credit_success(KEY, budget)
    assert g.fallback.tokens(KEY, budget) == 1.1
    await g.aclose()


async def test_a_failing_listener_does_not_reach_the_caller():
    """A failing listener does not reach the caller."""
    inner = Flaky()
    heard: list = []

    def broken(event):
        raise RuntimeError("listener bug")
    g = GuardedCoordinator(inner, on_event=broken)
    unsubscribe = g.subscribe(heard.append)
    inner.fail = OSError("down")
    assert await g.cooldown_left_ms(KEY, 0) == 0
    assert heard == [{"type": "coordinator_unavailable", "reason": "OSError"}]
    unsubscribe()
    unsubscribe()
    inner.fail = None
    assert await g.ping() is True
    assert len(heard) == 1 and g.breaker.events[-1]["type"] == "coordinator_restored"


def test_guard_settings_are_checked():
    """Guard settings are checked."""
    with pytest.raises(ValueError, match="timeout_s"):
        GuardedCoordinator(InProcessCoordinator(), timeout_s=0)
    with pytest.raises(ValueError, match="probe_interval_s"):
        GuardedCoordinator(InProcessCoordinator(), probe_interval_s=-1)
    with pytest.raises(ValueError, match="write_timeout_s"):
        GuardedCoordinator(InProcessCoordinator(), write_timeout_s=0)


async def test_an_unreachable_server_is_a_coordinator_error_without_the_password():
    """An unreachable server is a coordinator error without the password."""
    c = RedisCoordinator.from_url("redis://:hunter2@127.0.0.1:1/0")
    with pytest.raises(CoordinatorError) as info:
        await c.ping()
    assert "hunter2" not in str(info.value) and "127.0.0.1" in str(info.value)
    await c.aclose()


async def test_warm_up_reports_a_server_that_is_not_there():
    """Warm up reports a server that is not there."""
    events: list = []
    g = GuardedCoordinator(RedisCoordinator.from_url("redis://127.0.0.1:1/0"), on_event=events.append)
    assert await g.warm_up() is False
    assert [e["type"] for e in events] == ["coordinator_unavailable"]
    assert await GuardedCoordinator(InProcessCoordinator()).warm_up() is True


async def test_warm_up_of_a_paused_server_gives_up_in_time(own_redis, prefix):  # noqa: F811
    """docs/fleet.md "When Redis is slow or down": a warm-up of a server that does not answer
    gives up at its bound (declared down once, with the bound in the reason) instead of waiting
    for the server, and a warm-up once the server answers again restores it. The time is only
    checked against a hang guard far above the bound (a loaded machine may be slow)."""
    events: list = []
    g = guarded(own_redis.url, prefix, events)
    own_redis.pause()
    try:
        ok, took = await timed(g.warm_up(timeout_s=0.1))
    finally:
        own_redis.resume()
    assert ok is False and took < 5
    assert events == [{"type": "coordinator_unavailable", "reason": "no answer within 100 ms"}]
    assert await g.warm_up(timeout_s=30) is True and events[-1] == {"type": "coordinator_restored"}
    await g.aclose()


def test_the_guard_and_the_in_process_coordinator_say_they_bound_themselves():
    """A shell adds no timeout of its own around these (docs/fleet.md)."""
    assert GuardedCoordinator(InProcessCoordinator()).self_bounded is True
    assert InProcessCoordinator().self_bounded is True
    assert getattr(RedisCoordinator.from_url("redis://127.0.0.1:1/0"), "self_bounded", False) is False


async def test_what_redis_told_is_remembered_for_local_answers(own_redis, prefix):  # noqa: F811
    """A cooldown and a mark another process wrote, read once through the guard, still hold
    when Redis goes away."""
    events: list = []
    g = guarded(own_redis.url, prefix, events)
    other = RedisCoordinator.from_url(own_redis.url, prefix=prefix)
    now = wall_ms()
    await other.learn_cooldown(KEY, now + 60_000, now)
    await other.mark_credential_limited("anthropic", "c9", now + 60_000, now)
    assert 59_000 < (await g.before_decision(KEY, now, None))[0] <= 60_000
    assert "c9" in await g.limited_credentials("anthropic", now)
    await other.aclose()
    own_redis.kill()
    left, allowed = await g.before_decision(KEY, now + 1_000, None)
    assert 58_000 < left <= 60_000 and allowed is None, "counted on the local clock, not the caller's now_ms"
    marks = await g.limited_credentials("anthropic", now + 1_000)
    assert set(marks) == {"c9"} and now + 59_000 < marks["c9"] <= now + 61_000
    assert [e["type"] for e in events] == ["coordinator_unavailable"]
    await g.aclose()


class Silent(InProcessCoordinator):
    """A remote that never answers an admission or an outcome (a Redis that drops bytes)."""

    async def admit(self, *args, **kwargs):
        await asyncio.Event().wait()

    async def record_outcome(self, *args, **kwargs):
        await asyncio.Event().wait()


class Refusing(InProcessCoordinator):
    """A remote that refuses every call (a Redis that is down)."""

    async def admit(self, *args, **kwargs):
        raise CoordinatorError("refused by 127.0.0.1:1")

    async def record_outcome(self, *args, **kwargs):
        raise CoordinatorError("refused by 127.0.0.1:1")


async def _wave(c, clock: list, order: str) -> list:
    """One wave of 30 calls as the issue-31 reproducer makes it, on the fake clock ``clock``
    (ms): each first request is admitted at the gate and throttled once, then each retry
    takes its slot. ``order`` "burst": every first request goes before the first throttle
    (what the in-process coordinator saw); "interleaved": one admission, one throttle, in
    turn. Returns the retries' pacing delays (ms)."""
    from fsm.core.settings import PacingSettings
    pacing = PacingSettings()
    if order == "burst":
        for _ in range(30):
            await c.admit(KEY, retry=False, budget=None, pacing=pacing)
        clock[0] += 5
        for _ in range(30):
            await c.record_outcome(KEY, success=False, throttled=True, budget=None, pacing=pacing)
    else:
        for _ in range(30):
            await c.admit(KEY, retry=False, budget=None, pacing=pacing)
            clock[0] += 1
            await c.record_outcome(KEY, success=False, throttled=True, budget=None, pacing=pacing)
    clock[0] += 20  # the retries' backoff
    return [(await c.admit(KEY, retry=False, budget=None, pacing=pacing)).pacing_ms
            for _ in range(30)]


@pytest.mark.parametrize("remote", [Silent, Refusing])
@pytest.mark.parametrize("order", ["burst", "interleaved"])
async def test_the_local_pacer_hears_every_send_and_throttle_decided_without_the_remote(remote, order):
    """Issue 31: with the remote unknown (no answer within the bound) or down, the guard's
    local pacer gets the same facts as an in-process coordinator for this process's own
    traffic (SPEC §15.6): every send it admitted and every throttle heard, so its state
    after N sends and M throttles is the in-process pacer's, field by field, and a wave of
    first requests that each throttle once is not held at the floor (its retries all get a
    slot within the horizon, at the rate the cut left: about 1.5 s for 30)."""
    clock = [1_000_000.0]
    alone = InProcessCoordinator(clock=lambda: clock[0])
    expected = await _wave(alone, clock, order)
    clock[0] = 1_000_000.0
    g = GuardedCoordinator(remote(), timeout_s=0.001, write_timeout_s=0.001,
                           probe_interval_s=3600, monotonic=lambda: 0.0,
                           fallback=InProcessCoordinator(clock=lambda: clock[0]))
    assert await _wave(g, clock, order) == expected
    assert g.fallback.pacer_state(KEY) == alone.pacer_state(KEY)
    assert g.answers["remote"] == 0 and g.answers["unknown" if remote is Silent else "down"] >= 30
    if order == "burst":  # the reproducer's wave: one cut from what got through, not the floor
        state = g.fallback.pacer_state(KEY)
        assert state.on and state.w_max == 28 and state.rate == pytest.approx(19.6)
        assert max(expected) < 2000
    for task in list(g._background):
        task.cancel()
