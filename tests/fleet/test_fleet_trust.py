"""The fleet trusts nothing it reads (docs/fleet.md, "What the coordinator trusts"): values
of every type and size in every key degrade that key only; a lost budget is spent, not
full; a bucket is never deleted when full; one machine's clock skew changes nobody's wait.
Against real ``redis-server`` processes of the tests' own, one Redis and a three-master Redis
Cluster (SPEC §15.10)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fsm.fleet import (MAX_LEFT_MS, BudgetSettings, CoordKey, GuardedCoordinator, InProcessCoordinator,
                       PacingSettings, RedisCoordinator)
from fsm.fleet.server import RedisServer
from fleet_support import any_redis, prefix, redis_server  # noqa: F401 (fixtures)

KEY = CoordKey("anthropic", "claude-x", "c0ffee")
BUDGET = BudgetSettings(max_tokens=10)
PACING = PacingSettings()
HOUR = 3_600_000


def guard(url: str, prefix: str, events: list) -> GuardedCoordinator:
    return GuardedCoordinator(RedisCoordinator.from_url(url, prefix=prefix), timeout_s=1.0,
                              on_event=events.append, probe_interval_s=0.05)


async def every_call(c, key: CoordKey = KEY) -> dict:
    """Every v3 call once; what the reads answered."""
    a = await c.admit(key, retry=True, budget=BUDGET, pacing=PACING)
    first = await c.admit(key, retry=False, budget=BUDGET, pacing=PACING)
    await c.record_outcome(key, success=False, throttled=True, budget=BUDGET, pacing=PACING)
    await c.record_outcome(key, success=True, throttled=False, budget=BUDGET, pacing=PACING)
    await c.return_retry_token(key, BUDGET)
    fallback = await c.fallback_left_ms(key)
    limited = await c.limited_credentials(key.provider)
    return {"admit": a, "first": first, "fallback": fallback, "limited": limited}


def sane(answers: dict) -> None:
    for name in ("admit", "first"):
        a = answers[name]
        for v in (a.cooldown_ms, a.pacing_ms, a.budget_wait_ms):
            assert isinstance(v, int) and 0 <= v <= MAX_LEFT_MS, (name, a)
    assert isinstance(answers["fallback"], int) and 0 <= answers["fallback"] <= MAX_LEFT_MS
    assert all(isinstance(v, int) and 0 < v <= MAX_LEFT_MS for v in answers["limited"].values())


# -- item 1: a number out of range -------------------------------------------------------

async def test_a_cooldown_of_2_6e14_ms_is_ignored_and_never_copied_to_the_fallback(any_redis, prefix):  # noqa: F811
    """A peer writing microseconds: the cooldown key is ignored (and repaired), the guard's
    local fallback never holds it, and the process is fine once the key is gone."""
    events: list = []
    g = guard(any_redis.url, prefix, events)
    raw = g.inner.client
    await raw.set(g.inner.keys.cooldown(KEY), "260000000000000", px=260_000_000_000_000)
    await raw.set(g.inner.keys.fallback(KEY), "1", px=260_000_000_000_000)
    await raw.zadd(g.inner.keys.limited("anthropic"), {"c1": 1e300, "c2": float("inf")})
    answers = await every_call(g)
    sane(answers)
    assert answers["admit"].cooldown_ms == 0 and answers["fallback"] == 0 and answers["limited"] == {}
    assert g.fallback.cooldown_left_at(KEY, g.fallback.now_ms()) == 0, "nothing absurd copied locally"
    assert await raw.exists(g.inner.keys.cooldown(KEY)) == 0, "the bad key is repaired"
    assert events == [] and g.available
    await g.aclose()


async def test_a_sane_cooldown_still_counts_next_to_a_bad_one(any_redis, prefix):  # noqa: F811
    """The bad value degrades its own key: another key's cooldown is read as ever."""
    g = guard(any_redis.url, prefix, [])
    other = CoordKey("anthropic", "claude-y", "c0ffee")
    await g.inner.client.set(g.inner.keys.cooldown(KEY), "x", px=260_000_000_000_000)
    await g.learn_cooldown(other, 30_000)
    assert (await g.admit(KEY, retry=False, budget=None, pacing=None)).cooldown_ms == 0
    assert 29_000 < (await g.admit(other, retry=False, budget=None, pacing=None)).cooldown_ms <= 30_000
    await g.aclose()


# -- item 3: one bad value does not upset every key ---------------------------------------

@pytest.mark.parametrize("kind", ["list", "hash", "set", "zset", "string-garbage"])
async def test_a_key_of_the_wrong_type_does_not_make_the_guard_flap(any_redis, prefix, kind):  # noqa: F811
    """Wrong types in every key: no script fails, no unavailable/restored event, and the
    shared budget of a good key is still the fleet's."""
    events: list = []
    g = guard(any_redis.url, prefix, events)
    raw, keys = g.inner.client, g.inner.keys
    for name in [*keys.of(KEY), keys.limited("anthropic")]:
        if kind == "list":
            await raw.rpush(name, "1", "2")
        elif kind == "hash":
            await raw.hset(name, mapping={"m": "nan", "t": "-inf", "on": "7", "rate": "1e999"})
        elif kind == "set":
            await raw.sadd(name, "x")
        elif kind == "zset":
            await raw.zadd(name, {"x": 1.0})
        else:
            await raw.set(name, b"\xff\x00not a number")
    sane(await every_call(g.inner))  # the bare coordinator: no script fails
    for _ in range(30):
        sane(await every_call(g))
    good = CoordKey("anthropic", "claude-good", "c0ffee")
    await g.admit(good, retry=True, budget=BUDGET, pacing=None)
    assert await g.inner.tokens(good, BUDGET) == 9, "the good key is shared in Redis"
    assert events == [] and g.available


# -- item 4: a lost budget comes back spent, never full ---------------------------------------

async def test_a_lost_bucket_counts_as_spent_for_a_process_that_used_it(any_redis, prefix):  # noqa: F811
    """Eviction, FLUSHALL or a restart lose the key: a process that used it continues from
    empty; a process that never saw it starts full."""
    a = RedisCoordinator.from_url(any_redis.url, prefix=prefix)
    for _ in range(8):
        await a.admit(KEY, retry=True, budget=BUDGET, pacing=None)
    await a.client.delete(a.keys.bucket(KEY))  # what volatile-lru or FLUSHALL does
    answer = await a.admit(KEY, retry=True, budget=BUDGET, pacing=None)
    assert answer.budget is False and await a.tokens(KEY, BUDGET) == 0
    b = RedisCoordinator.from_url(any_redis.url, prefix=prefix)
    fresh_key = CoordKey("anthropic", "never-seen", "c0ffee")
    assert (await b.admit(fresh_key, retry=True, budget=BUDGET, pacing=None)).budget is True
    assert await b.tokens(fresh_key, BUDGET) == 9
    await a.aclose()
    await b.aclose()


async def test_a_bucket_idle_for_bucket_idle_ms_is_full_again_even_if_seen(any_redis, prefix):  # noqa: F811
    """Idle refill still holds: seen long ago is not "seen" any more."""
    a = RedisCoordinator.from_url(any_redis.url, prefix=prefix, bucket_idle_ms=1000)
    await a.admit(KEY, retry=True, budget=BUDGET, pacing=None)
    a._seen_at[KEY] -= 5_000  # this process used it 5 s ago, beyond bucket_idle_ms
    await a.client.delete(a.keys.bucket(KEY))
    assert (await a.admit(KEY, retry=True, budget=BUDGET, pacing=None)).budget is True
    assert await a.tokens(KEY, BUDGET) == 9
    await a.aclose()


async def test_a_full_bucket_is_never_deleted(any_redis, prefix):  # noqa: F811
    """Credits up to the maximum keep the key (absent would mean full to a newcomer but spent
    to a process that has seen it)."""
    a = RedisCoordinator.from_url(any_redis.url, prefix=prefix)
    await a.admit(KEY, retry=True, budget=BUDGET, pacing=None)
    for _ in range(50):
        await a.record_outcome(KEY, success=True, throttled=False, budget=BUDGET, pacing=None)
    await a.return_retry_token(KEY, BUDGET)
    assert await a.client.hget(a.keys.bucket(KEY), "m") == b"10000"
    await a.aclose()


async def test_a_restart_of_redis_does_not_hand_a_spent_fleet_its_budget():
    """The server restarts empty (no persistence): the process that spent the budget stays
    spent."""
    server = RedisServer().start()
    try:
        a = RedisCoordinator.from_url(server.url, prefix="r")
        for _ in range(6):
            await a.admit(KEY, retry=True, budget=BUDGET, pacing=None)
        server.kill()
        server.start()
        assert (await a.admit(KEY, retry=True, budget=BUDGET, pacing=None)).budget is False
        await a.aclose()
    finally:
        server.stop()


class SlowRedis(RedisCoordinator):
    """A Redis coordinator whose admissions reach the server only once the test sets
    ``release`` (a slow network), counted as sent (in flight) meanwhile."""

    admitted = 0

    async def admit(self, *args, **kwargs):
        import asyncio
        task = asyncio.current_task()
        self.in_flight.add(task)
        await self.release.wait()
        answer = await super().admit(*args, **kwargs)
        self.admitted += 1
        self.in_flight.discard(task)
        return answer


@pytest.mark.parametrize("how", ["abort", "deadline", "abort-before-v3"])
async def test_an_abort_while_redis_answers_gives_back_the_token(redis_server, prefix, how):  # noqa: F811
    """A retry whose admission the caller stopped waiting for (cancelled by an abort, or past
    the guard's deadline) never leaks the token Redis took for it."""
    import asyncio
    inner = SlowRedis.from_url(redis_server.url, prefix=prefix)
    inner.release = asyncio.Event()
    g = GuardedCoordinator(inner, timeout_s=0.05 if how == "deadline" else 5.0)
    if how == "abort-before-v3":
        call = asyncio.ensure_future(g.before_decision(KEY, 0, BUDGET))
    else:
        call = asyncio.ensure_future(g.admit(KEY, retry=True, budget=BUDGET, pacing=None))
    if how == "deadline":
        assert (await call).budget is True and g.available, "answered locally; slow is not down"
    else:
        await asyncio.sleep(0.05)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    inner.release.set()  # now the admission reaches Redis, after nobody waits for it
    for _ in range(100):  # until it has and its clean-up ran
        await asyncio.sleep(0.02)
        if inner.admitted and not inner.in_flight and not g._background:
            break
    assert inner.admitted == 1, "the admission did reach Redis"
    assert await RedisCoordinator.tokens(inner, KEY, BUDGET) == 10, "the token came back"
    await g.aclose()


# -- item 5: one machine's clock skew ----------------------------------------------------

@pytest.mark.parametrize("skew_ms", [HOUR, -HOUR, 10 * 86_400_000, -10 * 86_400_000])
async def test_a_machine_with_a_skewed_clock_learns_a_30s_hint_as_30s(any_redis, prefix, skew_ms):  # noqa: F811
    """A cooldown is a duration: a writer whose clock is an hour (or ten days) ahead or behind
    still makes a 30 s cooldown, even through the before-v3 ``(until_ms, now_ms)`` form."""
    skewed = RedisCoordinator.from_url(any_redis.url, prefix=prefix)
    honest = RedisCoordinator.from_url(any_redis.url, prefix=prefix)
    now = 1_800_000_000_000 + skew_ms
    await skewed.learn_cooldown(KEY, now + 30_000, now)
    await skewed.mark_credential_limited("anthropic", "c1", now + 30_000, now)
    assert 29_000 < (await honest.admit(KEY, retry=False, budget=None, pacing=None)).cooldown_ms <= 30_000
    assert 29_000 < (await honest.limited_credentials("anthropic"))["c1"] <= 30_000
    await skewed.aclose()
    await honest.aclose()


def test_credential_stores_on_skewed_clocks_agree_on_a_marks_time_left(any_redis, prefix):  # noqa: F811
    """A store whose machine is ten days ahead marks a key for 30 s: a store on an honest
    machine sees 30 s left, and skips the key."""
    from fsm.fleet import RedisCredentialStore, credential_id
    keys = {"openai": ["sk-one", "sk-two"]}
    now = 1_800_000_000_000
    ahead = RedisCredentialStore(keys, url=any_redis.url, prefix=prefix,
                                 clock=lambda: now + 10 * 86_400_000)
    honest = RedisCredentialStore(keys, url=any_redis.url, prefix=prefix, clock=lambda: now)
    try:
        assert ahead.blocked_until("openai") == honest.blocked_until("openai") == {}  # connected
        assert ahead.mark_usage_limit_reached("openai", "s", 30_000) is True
        until = honest.blocked_until("openai")[credential_id("sk-one")]
        assert now + 29_000 < until <= now + 30_000
        assert honest.api_key("openai", "t") == "sk-two"
    finally:
        ahead.close()
        honest.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(skews=st.lists(st.integers(-400 * 86_400_000, 400 * 86_400_000), min_size=2, max_size=4),
       hint=st.integers(1, 600_000))
def test_clocks_skewed_both_ways_agree_on_every_wait(skews, hint):
    """Processes whose host clocks are anywhere within ±400 days of each other: in-process
    coordinators on those clocks all report the same time left for the same duration."""
    answers = []
    for skew in skews:
        c = InProcessCoordinator(clock=lambda skew=skew: 1_800_000_000_000 + skew)
        c.learn_cooldown_at(KEY, hint, c.now_ms())
        c.mark_fallback_at(KEY, hint, c.now_ms())
        answers.append((c.cooldown_left_at(KEY, c.now_ms()), c.fallback_left_at(KEY, c.now_ms())))
    assert answers == [(hint, hint)] * len(skews)


@pytest.mark.parametrize("field, value", [
    ("on", "7"), ("rate", "1e300"), ("rate", "-1"), ("rate", "0"), ("tat", "1e300"), ("lcut", "nan"),
    ("lgrow", "inf"), ("wmax", "2e9"), ("good", "-3"), ("goodt", "9e99"), ("oks", "1.5"),
    ("okn", "-1"), ("sents", "-2"), ("sentc", "1e10"), ("sentp", "x"), ("tat", ""),
    ("thrs", "1.5"), ("thrc", "-1"), ("thrp", "nan"), ("okp", "-1"),
])
async def test_an_absurd_pacer_field_makes_a_fresh_pacer(redis_server, prefix, field, value):  # noqa: F811
    """A pacer hash with one field out of range (or not a number) is read as a fresh pacer:
    the next admission is not paced and the hash is written whole again."""
    c = RedisCoordinator.from_url(redis_server.url, prefix=prefix)
    name = c.keys.pacer(KEY)
    for _ in range(2):  # two throttles at once: pacing engages (one alone would not, SPEC §15.7)
        await c.record_outcome(KEY, success=False, throttled=True, budget=None, pacing=PACING)
    assert (await c.client.hget(name, "on")) == b"1"
    await c.client.hset(name, field, value)
    answer = await c.admit(KEY, retry=False, budget=None, pacing=PACING)
    assert (answer.pacing_booked, answer.pacing_ms) == (True, 0)
    stored = await c.client.hgetall(name)
    assert stored[b"on"] == b"0" and float(stored[b"sentc"]) == 1.0 and len(stored) == 18
    await c.aclose()


async def test_a_pacer_cut_stamped_days_ahead_of_the_servers_clock_makes_a_fresh_pacer(any_redis, prefix):  # noqa: F811
    """A last cut ten days ahead (a peer's clock, a corrupted key) would keep the pacer from
    ever forgetting: it is read as a fresh pacer instead."""
    c = RedisCoordinator.from_url(any_redis.url, prefix=prefix)
    name = c.keys.pacer(KEY)
    for _ in range(2):  # two throttles at once: pacing engages (one alone would not, SPEC §15.7)
        await c.record_outcome(KEY, success=False, throttled=True, budget=None, pacing=PACING)
    assert (await c.client.hget(name, "on")) == b"1"
    sec, usec = await c.client.time()
    ahead = sec * 1000 + usec // 1000 + 10 * 86_400_000
    await c.client.hset(name, "lcut", repr(float(ahead)))
    await c.admit(KEY, retry=False, budget=None, pacing=PACING)
    assert (await c.client.hget(name, "on")) == b"0"
    await c.aclose()


# -- the attack's family: values of every type and size in every key ---------------------

_NUMBERS = st.one_of(st.integers(-(10 ** 30), 10 ** 30), st.floats(allow_nan=True, allow_infinity=True),
                     st.sampled_from([2.6e14, 2 ** 63, -1, 0, 1e308, 5e-324]))
_TEXTS = st.one_of(_NUMBERS.map(lambda n: repr(n).encode()), st.binary(max_size=40),
                   st.sampled_from([b"", b"nan", b"inf", b"-inf", b"0x10", b" 5 ", b"1e400", b"\x00"]))
_VALUES = st.tuples(st.sampled_from(["string", "list", "hash", "set", "zset", "none"]), _TEXTS,
                    st.one_of(st.none(), st.integers(1, 10 ** 15)))


@pytest.fixture(scope="module")
def fuzz_server():
    with RedisServer() as server:
        yield server


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(_VALUES, min_size=6, max_size=6))
def test_values_of_every_type_and_size_in_every_key_never_raise(fuzz_server, values):
    """Whatever sits in the six keys of one (provider, model, credential) and its provider's
    marks, every call answers, within 0..400 days, with no outage event."""
    import asyncio
    import redis

    sync = redis.Redis.from_url(fuzz_server.url)
    events: list = []

    async def run() -> None:
        g = guard(fuzz_server.url, "fz", events)
        names = [*g.inner.keys.of(KEY), g.inner.keys.limited("anthropic")]
        for name, (kind, text, px) in zip(names, values):
            sync.delete(name)
            if kind == "string":
                sync.set(name, text, px=px)
            elif kind == "list":
                sync.rpush(name, text)
            elif kind == "hash":
                sync.hset(name, mapping={f: text for f in ("m", "t", "on", "rate", "tat", "lcut",
                                                           "lgrow", "wmax", "good", "goodt", "oks",
                                                           "okn", "sents", "sentc", "sentp")})
            elif kind == "set":
                sync.sadd(name, text)
            elif kind == "zset":
                try:
                    score = float(text)
                except ValueError:
                    score = 1.0
                sync.zadd(name, {text: score if math.isfinite(score) else 1.0})
            if px is not None and kind != "none" and kind != "string":
                sync.pexpire(name, px)
        sane(await every_call(g.inner))  # the bare coordinator itself never raises either
        sane(await every_call(g))
        await g.aclose()

    try:
        asyncio.run(run())
    finally:
        sync.close()
    assert events == []
