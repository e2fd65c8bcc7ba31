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


async def until_restored(g: GuardedCoordinator, events: list) -> None:
    """Call the coordinator as a session would until the restored event (at most 5 s)."""
    deadline = time.monotonic() + 5
    while g.breaker.available is False:
        assert time.monotonic() < deadline, f"not restored: {events}"
        await asyncio.sleep(PROBE_S)
        await g.cooldown_left_ms(KEY, wall_ms())


async def test_redis_killed_mid_use_answers_locally_then_shares_again(own_redis, prefix):  # noqa: F811
    events: list = []
    g = guarded(own_redis.url, prefix, events)
    other = RedisCoordinator.from_url(own_redis.url, prefix=prefix)  # another process's view
    now = wall_ms()
    await g.learn_cooldown(KEY, now + 30_000, now)
    assert 29_000 < await other.cooldown_left_ms(KEY, now) <= 30_000
    assert await g.take_retry_token(KEY, BUDGET) is True

    own_redis.kill()
    left, took = await timed(g.cooldown_left_ms(KEY, wall_ms()))
    assert took < TIMEOUT_S + 0.1 and 25_000 < left <= 30_000, "from the local mirror"
    assert [e["type"] for e in events] == ["coordinator_unavailable"]
    assert "127.0.0.1" in events[0]["reason"]
    # Every call keeps answering, from local state, and no second event is emitted.
    for _ in range(20):
        answers, took = await timed(asyncio.gather(
            g.take_retry_token(KEY, BUDGET), g.before_decision(KEY, wall_ms(), BUDGET), g.credit_success(KEY, BUDGET),
            g.return_retry_token(KEY, BUDGET), g.learn_cooldown(KEY, wall_ms() + 1000, wall_ms()),
            g.mark_credential_limited("anthropic", "c1", wall_ms() + 5000, wall_ms()),
            g.limited_credentials("anthropic", wall_ms())))
        assert took < TIMEOUT_S + 0.1
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
    await g.learn_cooldown(CoordKey("anthropic", "claude-z"), now + 20_000, now)
    answer = Worker(own_redis.url, prefix, [["left", "anthropic", "claude-z"]]).results()
    assert 10_000 < answer[0] <= 20_000
    assert await g.take_retry_token(KEY, BUDGET) is True
    assert await other.tokens(KEY, BUDGET) == 9, "the budget is the shared one again"
    assert await g.before_decision(KEY, now, BUDGET) == (90_000, True)
    assert await other.tokens(KEY, BUDGET) == 8
    assert len(events) == 2
    await other.aclose()
    await g.aclose()


async def test_redis_paused_answers_within_the_timeout_then_resumes(own_redis, prefix):  # noqa: F811
    events: list = []
    g = guarded(own_redis.url, prefix, events)
    assert await g.take_retry_token(KEY, BUDGET) is True  # connected, 9 left
    own_redis.pause()
    try:
        allowed, took = await timed(g.take_retry_token(KEY, BUDGET))
        assert took < TIMEOUT_S + 0.1
        assert allowed is True, "the local bucket (full) decides"
        assert events == [{"type": "coordinator_unavailable", "reason": "no answer within 50 ms"}]
        # While paused: instant local answers, except one probe per interval (each bounded).
        t0 = time.monotonic()
        for _ in range(50):
            _, took = await timed(g.cooldown_left_ms(KEY, wall_ms()))
            assert took < TIMEOUT_S + 0.1
        assert time.monotonic() - t0 < 2
        assert len(events) == 1
    finally:
        own_redis.resume()
    await until_restored(g, events)
    assert [e["type"] for e in events] == ["coordinator_unavailable", "coordinator_restored"]
    assert await g.take_retry_token(KEY, BUDGET) is True
    # The remote bucket again: 9, minus this take, minus (usually) the take that timed out,
    # which sat in the paused server's socket and ran when it resumed.
    assert await g.inner.tokens(KEY, BUDGET) in (7, 8)
    await g.aclose()


async def test_a_second_outage_gets_its_own_pair_of_events(own_redis, prefix):  # noqa: F811
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
    clock = [0.0]
    inner = Flaky()
    events: list = []
    g = GuardedCoordinator(inner, on_event=events.append, monotonic=lambda: clock[0])
    inner.fail = ValueError("boom")
    assert await g.cooldown_left_ms(KEY, 0) == 0
    assert events == [{"type": "coordinator_unavailable", "reason": "ValueError"}]
    inner.fail = None
    assert await g.cooldown_left_ms(KEY, 0) == 0 and len(events) == 1, "no probe before the interval"
    clock[0] = 1.0
    await g.cooldown_left_ms(KEY, 0)
    assert events[-1] == {"type": "coordinator_restored"}
    inner.fail = CoordinatorError("refused by 127.0.0.1:1")
    await g.cooldown_left_ms(KEY, 0)
    assert events[-1] == {"type": "coordinator_unavailable", "reason": "refused by 127.0.0.1:1"}
    inner.fail = asyncio.CancelledError()
    clock[0] = 2.0
    with pytest.raises(asyncio.CancelledError):
        await g.cooldown_left_ms(KEY, 0)
    await g.aclose()
    assert inner.closed


async def test_a_failing_listener_does_not_reach_the_caller():
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
    with pytest.raises(ValueError, match="timeout_s"):
        GuardedCoordinator(InProcessCoordinator(), timeout_s=0)
    with pytest.raises(ValueError, match="probe_interval_s"):
        GuardedCoordinator(InProcessCoordinator(), probe_interval_s=-1)


async def test_an_unreachable_server_is_a_coordinator_error_without_the_password():
    c = RedisCoordinator.from_url("redis://:hunter2@127.0.0.1:1/0")
    with pytest.raises(CoordinatorError) as info:
        await c.ping()
    assert "hunter2" not in str(info.value) and "127.0.0.1" in str(info.value)
    await c.aclose()
