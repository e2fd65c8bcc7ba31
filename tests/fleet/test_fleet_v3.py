"""Coordinator protocol v3 (docs/fleet.md): admission in one step (cooldown, budget take or
wait, pacing slot), first requests, the fallback mark, on the host's clock in-process and
on the server's clock in Redis; the same Lua and Python pacer and budget."""

from __future__ import annotations

import dataclasses
import random
import uuid

import hypothesis
import pytest
from hypothesis import strategies as st

from fsm.core import pacing as pure
from fsm.fleet import (FLOOR_HORIZON_MS, MAX_LEFT_MS, WAIT_RECHECK_MS, Admission, BudgetSettings,
                       Coordinator, CoordKey, GuardedCoordinator, InProcessCoordinator, PacingSettings,
                       RedisCoordinator)
from fsm.fleet._redis import pacer_ttl_ms
from fsm.testing import FakeClock
from fleet_support import any_redis, prefix, redis_server  # noqa: F401 (fixtures)

KEY = CoordKey("anthropic", "claude-x", "c0ffee")
OTHER = CoordKey("anthropic", "claude-y", "c0ffee")
WAIT = BudgetSettings(max_tokens=4, mode="wait", min_retries_per_second=2)


class Clock:
    """A host clock in ms that a test moves."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def throttles(c, pacing: PacingSettings, budget: BudgetSettings | None = None, n: int = 2,
                    **kw) -> None:
    """``n`` throttle answers at once. Two: more than one a second, a key sending above what
    gets through, so pacing engages (fsm.core.pacing.ENGAGE_EXCESS, SPEC §15.7); one alone
    would not."""
    for _ in range(n):
        await c.record_outcome(KEY, success=False, throttled=True, budget=budget, pacing=pacing, **kw)


@pytest.fixture(params=["in-process", "redis", "cluster"])
async def coord(request, prefix):  # noqa: F811
    c = InProcessCoordinator() if request.param == "in-process" else RedisCoordinator.from_url(
        request.getfixturevalue("redis_cluster" if request.param == "cluster" else "redis_server").url,
        prefix=prefix)
    yield c
    await c.aclose()


def test_every_coordinator_speaks_protocol_v3():
    """The in-process, Redis and guarded coordinators all satisfy the v3 protocol."""
    for c in (InProcessCoordinator(), RedisCoordinator.from_url("redis://127.0.0.1:1/0"),
              GuardedCoordinator(InProcessCoordinator())):
        assert isinstance(c, Coordinator)


def test_admission_delay_is_the_largest_wait():
    """``delay_ms`` is the term that decides."""
    assert Admission(cooldown_ms=5, pacing_ms=9, budget_wait_ms=7).delay_ms == 9
    assert Admission().delay_ms == 0 and Admission().budget is None


# -- in-process, on the host's clock -------------------------------------------------------

async def test_the_in_process_coordinator_counts_on_the_clock_it_is_given():
    """A FakeClock's time drives cooldowns and the fallback mark; no wall clock is read."""
    fake = FakeClock()
    c = InProcessCoordinator(clock=fake.time_ms)
    await c.learn_cooldown(KEY, 30_000)
    await c.mark_fallback(KEY, 10_000)
    await fake.advance(12)
    assert (await c.admit(KEY, retry=False, budget=None, pacing=None)).cooldown_ms == 18_000
    assert await c.fallback_left_ms(KEY) == 0
    await fake.advance(18)
    assert (await c.admit(KEY, retry=False, budget=None, pacing=None)).cooldown_ms == 0


async def test_first_request_admission_gets_cooldown_and_pacing_but_takes_no_token():
    """retry=False: the cooldown and the pacing slot apply, the budget does not."""
    clock = Clock()
    c = InProcessCoordinator(clock=clock)
    budget = BudgetSettings(max_tokens=4)
    await c.learn_cooldown(KEY, 5_000)
    await throttles(c, PacingSettings(), budget)
    a = await c.admit(KEY, retry=False, budget=budget, pacing=PacingSettings())
    assert a.cooldown_ms == 5_000 and a.budget is None and not a.token_taken
    assert a.pacing_ms == 5_000, "the slot is reserved at the cooldown's end"
    b = await c.admit(KEY, retry=False, budget=budget, pacing=PacingSettings())
    assert b.pacing_ms == 5_000 + 1_000, "the next slot follows at the floor rate (1/s)"
    assert c.tokens(KEY, budget) == 4


async def test_a_cooldown_beyond_max_wait_reserves_and_takes_nothing():
    """A request that will be refused (cooldown > maxHintWaitMs) leaves budget and pacer alone."""
    c = InProcessCoordinator(clock=Clock())
    budget = BudgetSettings(max_tokens=4)
    await throttles(c, PacingSettings())
    await c.learn_cooldown(KEY, 90_000)
    before = c.pacer_state(KEY)
    assert before.on
    a = await c.admit(KEY, retry=True, budget=budget, pacing=PacingSettings(), max_wait_ms=60_000)
    assert a == Admission(cooldown_ms=90_000)
    assert c.tokens(KEY, budget) == 4 and c.pacer_state(KEY) == before


async def test_budget_in_wait_mode_holds_no_token_and_reserves_floor_slots():
    """Wait mode: a retry the bucket cannot afford takes nothing and is told when its floor
    slot is (one per 1/minRetriesPerSecond s, fleet-wide); at that slot it is admitted."""
    clock = Clock(1_000)
    c = InProcessCoordinator(clock=clock)
    assert (await c.admit(KEY, retry=True, budget=WAIT, pacing=None)).budget is True   # 3 > 2
    first = await c.admit(KEY, retry=True, budget=WAIT, pacing=None)    # 2: not above 2
    assert (first.budget, first.token_taken, first.budget_wait_ms) == (True, False, 0), \
        "the floor's slot was free: admitted at once, no token"
    waits = [await c.admit(KEY, retry=True, budget=WAIT, pacing=None) for _ in range(3)]
    assert [(w.budget, w.token_taken, w.budget_wait_ms) for w in waits] == \
        [(False, False, 500), (False, False, 1000), (False, False, 1500)]
    assert c.tokens(KEY, WAIT) == 3, "waiting retries hold no token"
    clock.now += 500
    due = await c.admit(KEY, retry=True, budget=WAIT, pacing=None, floor_slot_due=True)
    assert due.budget is True and due.token_taken is False


async def test_budget_in_wait_mode_without_a_floor_books_nothing_and_rechecks(coord):
    """No floor: the retry is told WAIT_RECHECK_MS with ``budget_slot_booked`` False."""
    budget = BudgetSettings(max_tokens=2, mode="wait")
    a = await coord.admit(KEY, retry=True, budget=budget, pacing=None)
    assert (a.budget, a.token_taken, a.budget_wait_ms, a.budget_slot_booked) == \
        (False, False, WAIT_RECHECK_MS, False)
    assert a.delay_ms == WAIT_RECHECK_MS == 3_000


async def admit_at(c, now: float, **kw) -> Admission:
    """``c.admit(KEY, retry=True, pacing=None, **kw)`` at time ``now`` (the host's clock
    in-process, the script's NOW in Redis)."""
    if isinstance(c, InProcessCoordinator):
        return c.admit_at(KEY, now, retry=True, pacing=None, **kw)
    return await c.admit(KEY, retry=True, pacing=None, _now=now, **kw)


async def success_at(c, now: float, budget: BudgetSettings) -> None:
    """A success recorded for ``KEY`` at time ``now`` (credits ``token_ratio``)."""
    if isinstance(c, InProcessCoordinator):
        c.record_outcome_at(KEY, now, success=True, throttled=False, budget=budget, pacing=None)
    else:
        await c.record_outcome(KEY, success=True, throttled=False, budget=budget, pacing=None,
                               _now=now)


async def test_the_floor_slot_is_booked_only_within_the_horizon(coord):
    """Wait mode books floor slots up to FLOOR_HORIZON_MS ahead; beyond it nothing is reserved."""
    assert FLOOR_HORIZON_MS == 3_000
    budget = BudgetSettings(max_tokens=2, mode="wait", min_retries_per_second=1)
    t = 1_700_000_000_000.0
    answers = [await admit_at(coord, t, budget=budget) for _ in range(4)]
    assert [(a.budget, a.budget_wait_ms, a.budget_slot_booked) for a in answers] == \
        [(True, 0, True), (False, 1_000, True), (False, 2_000, True), (False, 3_000, True)]
    for _ in range(2):
        beyond = await admit_at(coord, t, budget=budget)
        assert beyond == Admission(budget=False, budget_wait_ms=WAIT_RECHECK_MS,
                                   budget_slot_booked=False)
    later = await admit_at(coord, t + 1_000, budget=budget)
    assert (later.budget, later.budget_wait_ms, later.budget_slot_booked) == (False, 3_000, True), \
        "the slot 4 s after t was not reserved by the answers beyond the horizon"
    assert not any(a.token_taken for a in [*answers, beyond, later])


async def test_a_recheck_after_an_unbooked_wait_asks_the_bucket_afresh(coord):
    """A re-check with floor_slot_due=False waits again, then takes a token once refilled."""
    budget = BudgetSettings(max_tokens=4, token_ratio=1.0, mode="wait")
    t = 1_700_000_000_000.0
    assert (await admit_at(coord, t, budget=budget)).token_taken  # 4 -> 3
    first = await admit_at(coord, t, budget=budget)
    assert (first.budget, first.budget_slot_booked) == (False, False)
    again = await admit_at(coord, t + first.budget_wait_ms, budget=budget, floor_slot_due=False)
    assert (again.budget, again.token_taken, again.budget_slot_booked) == (False, False, False)
    await success_at(coord, t + 4_000, budget)  # 3 -> 4
    third = await admit_at(coord, t + 6_000, budget=budget, floor_slot_due=False)
    assert (third.budget, third.token_taken, third.budget_slot_booked) == (True, True, True)


async def test_refuse_mode_floor_lets_one_retry_per_interval_through():
    """Refuse mode with a floor: above the bucket's refusals, one retry per interval passes
    (Linkerd's minRetriesPerSecond); the rest are refused at once, waiting for nothing."""
    clock = Clock()
    c = InProcessCoordinator(clock=clock)
    budget = BudgetSettings(max_tokens=2, min_retries_per_second=1)
    answers = [(await c.admit(KEY, retry=True, budget=budget, pacing=None)).budget for _ in range(3)]
    assert answers == [True, False, False] and c.tokens(KEY, budget) == 0
    clock.now += 1000
    assert (await c.admit(KEY, retry=True, budget=budget, pacing=None)).budget is True


async def test_the_pacing_slot_is_reserved_in_the_same_step_as_the_budget_take():
    """A refused retry reserves no slot; an admitted one reserves it after ``earliest_ms``."""
    clock = Clock()
    c = InProcessCoordinator(clock=clock)
    budget = BudgetSettings(max_tokens=2)
    await throttles(c, PacingSettings(), budget)
    before = c.pacer_state(KEY)
    assert before.on
    refused = await c.admit(KEY, retry=True, budget=budget, pacing=PacingSettings())
    assert refused.budget is False and refused.pacing_ms == 0 and refused.pacing_booked
    assert c.pacer_state(KEY) == before, "a refused retry reserves no slot and counts no send"
    first = await c.admit(KEY, retry=False, budget=budget, pacing=PacingSettings(), earliest_ms=3_000)
    assert first.pacing_ms == 3_000
    second = await c.admit(KEY, retry=False, budget=budget, pacing=PacingSettings(), earliest_ms=3_000)
    assert second.pacing_ms == 4_000, "the next slot follows it at the floor rate (1/s)"


async def test_the_in_process_pacer_counts_every_admitted_send_before_any_throttle():
    """Not pacing yet, an admission still counts its send (a pacer not yet stored is made);
    a lone throttle is counted only (SPEC §15.7); the one that engages pacing cuts to beta ×
    what got through over the last second (the send rate less the throttles heard: two)."""
    clock = Clock(0.0)
    c = InProcessCoordinator(clock=clock)
    settings = PacingSettings()
    for k in range(20):
        clock.now = k * 50.0
        a = await c.admit(KEY, retry=False, budget=None, pacing=settings)
        assert (a.pacing_ms, a.pacing_booked) == (0, True)
    assert c.pacer_state(KEY).sent_cur == 20 and not c.pacer_state(KEY).on
    clock.now = 1500.0
    await c.record_outcome(KEY, success=False, throttled=True, budget=None, pacing=settings)
    assert not c.pacer_state(KEY).on and c.pacer_state(KEY).thr_cur == 1
    await c.record_outcome(KEY, success=False, throttled=True, budget=None, pacing=settings)
    assert c.pacer_state(KEY).on and c.pacer_state(KEY).rate == pytest.approx(0.7 * (10 - 2))


async def test_the_in_process_pacer_tells_a_success_from_any_other_answer():
    """A success grows the rate; an answer that is neither a success nor a throttle (a fatal
    error) leaves the pacer as it was."""
    clock = Clock(0.0)
    c = InProcessCoordinator(clock=clock)
    settings = PacingSettings()
    await throttles(c, settings)
    clock.now = 1000.0
    await c.admit(KEY, retry=False, budget=None, pacing=settings)  # the rate in use (RFC 7661)
    before = c.pacer_state(KEY)
    assert before.on
    await c.record_outcome(KEY, success=False, throttled=False, budget=None, pacing=settings)
    assert c.pacer_state(KEY) == before  # nothing learned
    await c.record_outcome(KEY, success=True, throttled=False, budget=None, pacing=settings)
    assert c.pacer_state(KEY).rate > before.rate


async def pacer_of(c) -> pure.PacerState:
    return c.pacer_state(KEY) if isinstance(c, InProcessCoordinator) else await stored_pacer(c, KEY)


async def tokens_of(c, budget: BudgetSettings) -> float:
    got = c.tokens(KEY, budget)
    return await got if hasattr(got, "__await__") else got


async def test_no_slot_within_the_horizon_takes_and_reserves_nothing(coord):
    """The pacer has no slot within horizonMs: ``pacing_booked`` False, only the cooldown told;
    no budget token taken, no slot reserved, no send counted."""
    budget = BudgetSettings(max_tokens=10)
    settings = PacingSettings(min_rate=1.0, horizon_ms=500)
    await coord.learn_cooldown(KEY, 3_000)
    await throttles(coord, settings)
    first = await coord.admit(KEY, retry=True, budget=budget, pacing=settings)
    assert first.pacing_booked and first.token_taken and first.pacing_ms == first.cooldown_ms
    before = await pacer_of(coord)
    second = await coord.admit(KEY, retry=True, budget=budget, pacing=settings)
    assert second.pacing_booked is False and 0 < second.cooldown_ms <= 3_000
    assert second == Admission(cooldown_ms=second.cooldown_ms, pacing_booked=False)
    assert await tokens_of(coord, budget) == 9
    assert await pacer_of(coord) == before


async def test_the_guard_passes_pacing_booked_through_and_its_local_pacer_follows(any_redis, prefix):  # noqa: F811
    """Through the guard: Redis's ``pacing_booked`` comes out as answered; the local pacer
    counts the sends Redis admitted and hears every answer (successes too), so that a local
    throttle cuts from this process's own send rate."""
    clock = Clock(0.0)
    settings = PacingSettings(min_rate=1.0, horizon_ms=500)
    g = GuardedCoordinator(RedisCoordinator.from_url(any_redis.url, prefix=prefix), timeout_s=1.0,
                           clock=clock)
    for _ in range(5):
        assert (await g.admit(KEY, retry=False, budget=None, pacing=settings)).pacing_booked
    assert g.fallback.pacer_state(KEY).sent_cur == 5
    await throttles(g, settings)
    local = g.fallback.pacer_state(KEY)
    assert local.on and local.rate == pytest.approx(0.7 * (5 - 2))  # 5 sent, 2 throttled
    answers = [await g.admit(KEY, retry=False, budget=None, pacing=settings) for _ in range(4)]
    assert Admission(pacing_booked=False) in answers, "Redis paces at most 2.1/s: no 4 slots in 500 ms"
    assert g.available
    clock.now = 1000.0
    await g.record_outcome(KEY, success=True, throttled=False, budget=None, pacing=settings)
    assert g.fallback.pacer_state(KEY).ok_n == 1
    await g.aclose()


async def test_the_guards_local_fallback_answers_pacing_booked_too():
    """The remote down, the in-process fallback's pacer answers, refusals included."""
    clock = Clock(0.0)
    settings = PacingSettings(min_rate=1.0, horizon_ms=500)
    g = GuardedCoordinator(RedisCoordinator.from_url("redis://127.0.0.1:1/0"), timeout_s=0.5,
                           clock=clock, probe_interval_s=60)
    await throttles(g, settings)
    assert not g.available
    first = await g.admit(KEY, retry=False, budget=None, pacing=settings)
    second = await g.admit(KEY, retry=False, budget=None, pacing=settings)
    assert (first.pacing_booked, first.pacing_ms) == (True, 0)
    assert second == Admission(pacing_booked=False)
    await g.aclose()


async def test_the_guard_passes_budget_slot_booked_through_and_its_fallback_answers_it(any_redis, prefix):  # noqa: F811
    """The guard passes Redis's unbooked wait through; its fallback books within the horizon only."""
    no_floor = BudgetSettings(max_tokens=2, mode="wait")
    g = GuardedCoordinator(RedisCoordinator.from_url(any_redis.url, prefix=prefix),
                           timeout_s=1.0)
    a = await g.admit(KEY, retry=True, budget=no_floor, pacing=None)
    assert g.available and a == Admission(budget=False, budget_wait_ms=WAIT_RECHECK_MS,
                                          budget_slot_booked=False)
    await g.aclose()
    clock = Clock(0.0)
    down = GuardedCoordinator(RedisCoordinator.from_url("redis://127.0.0.1:1/0"), timeout_s=0.5,
                              clock=clock, probe_interval_s=60)
    floor = BudgetSettings(max_tokens=2, mode="wait", min_retries_per_second=1)
    answers = [await down.admit(KEY, retry=True, budget=floor, pacing=None) for _ in range(5)]
    assert not down.available
    assert [(x.budget, x.budget_wait_ms, x.budget_slot_booked) for x in answers] == \
        [(True, 0, True), (False, 1_000, True), (False, 2_000, True), (False, 3_000, True),
         (False, WAIT_RECHECK_MS, False)]
    await down.aclose()


async def test_the_redis_pacer_hash_expires_after_forget_after_ms_plus_its_memory(any_redis, prefix):  # noqa: F811
    """The pacer hash lives forgetAfterMs + 4 half-lives of memoryS + a minute after its
    last write."""
    c = RedisCoordinator.from_url(any_redis.url, prefix=prefix)
    settings = PacingSettings(forget_after_ms=30_000, memory_s=60.0)
    assert pacer_ttl_ms(settings) == 30_000 + 240_000 + 60_000
    await c.admit(KEY, retry=False, budget=None, pacing=settings)
    ttl = await c.client.pttl(c.keys.pacer(KEY))
    assert pacer_ttl_ms(settings) - 5_000 < ttl <= pacer_ttl_ms(settings)
    await c.aclose()


async def test_the_fallback_mark_keeps_the_later_end(coord):
    """``mark_fallback`` / ``fallback_left_ms``: the primary's cooldown, durations in."""
    assert await coord.fallback_left_ms(KEY) == 0
    await coord.mark_fallback(KEY, 20_000)
    await coord.mark_fallback(KEY, 5_000)
    assert 19_000 < await coord.fallback_left_ms(KEY) <= 20_000
    assert await coord.fallback_left_ms(OTHER) == 0


async def test_a_returned_token_restores_the_count_after_an_abort(coord):
    """An aborted or cancelled retry gives back the token its admission took."""
    budget = BudgetSettings(max_tokens=10)
    a = await coord.admit(KEY, retry=True, budget=budget, pacing=None)
    assert a.token_taken
    await coord.return_retry_token(KEY, budget)
    got = coord.tokens(KEY, budget)
    assert (await got if hasattr(got, "__await__") else got) == 10


async def test_no_duration_in_or_out_goes_beyond_400_days(coord):
    """A duration beyond the maximum is clipped to it; nothing told is longer."""
    await coord.learn_cooldown(KEY, 10 ** 18)
    await coord.mark_fallback(KEY, float("1e300"))
    await coord.mark_credential_limited("p", "c", 2.6e14)
    assert 0 < (await coord.admit(KEY, retry=False, budget=None, pacing=None)).cooldown_ms <= MAX_LEFT_MS
    assert 0 < await coord.fallback_left_ms(KEY) <= MAX_LEFT_MS
    assert 0 < (await coord.limited_credentials("p"))["c"] <= MAX_LEFT_MS
    with pytest.raises(TypeError, match="duration_ms"):
        await coord.learn_cooldown(KEY, "30s")


async def test_pacing_is_shared_by_every_process_of_a_redis_fleet(any_redis, prefix):  # noqa: F811
    """The throttles one process heard pace another's requests: one from each process is more
    than one a second for the key (SPEC §15.7: the fleet's send rate, not a process's)."""
    a = RedisCoordinator.from_url(any_redis.url, prefix=prefix)
    b = RedisCoordinator.from_url(any_redis.url, prefix=prefix)
    settings = PacingSettings(min_rate=1.0)
    now = 1_700_000_000_000.0  # one time for both (the server's TIME would add load-dependent drift)
    await a.record_outcome(KEY, success=False, throttled=True, budget=None, pacing=settings, _now=now)
    assert (await b.admit(KEY, retry=False, budget=None, pacing=settings, _now=now)).pacing_ms == 0
    assert (await b.admit(KEY, retry=False, budget=None, pacing=settings, _now=now)).pacing_ms == 0, \
        "one throttle alone paces nothing"
    await b.record_outcome(KEY, success=False, throttled=True, budget=None, pacing=settings, _now=now)
    delays = [(await b.admit(KEY, retry=False, budget=None, pacing=settings, _now=now)).pacing_ms
              for _ in range(3)]
    assert delays == [0, 1000, 2000]
    await a.aclose()
    await b.aclose()


# -- the same arithmetic in Lua and in Python ----------------------------------------------

#: The pacer hash's fields (fsm/fleet/_redis.py ``_LUA_PACER``) -> PacerState's.
HASH_FIELDS = {"on": "on", "rate": "rate", "tat": "tat_ms", "lcut": "last_cut_ms",
               "lgrow": "last_grow_ms", "wmax": "w_max", "good": "good", "goodt": "good_ms",
               "oks": "ok_sec", "okn": "ok_n", "sents": "sent_sec", "sentc": "sent_cur",
               "sentp": "sent_prev", "seen": "seen_ms", "thrs": "thr_sec", "thrc": "thr_cur",
               "thrp": "thr_prev", "okp": "ok_prev"}


async def stored_pacer(c: RedisCoordinator, key: CoordKey) -> pure.PacerState:
    """The pacer state in ``key``'s hash (a fresh one when there is none)."""
    raw = await c.client.hgetall(c.keys.pacer(key))
    if not raw:
        return pure.fresh()
    fields = {HASH_FIELDS[k.decode()]: float(v) for k, v in raw.items()}
    fields["on"] = fields["on"] == 1.0
    return pure.PacerState(**fields)


#: Clock steps of the twin runs: forward, and back (a failover, an NTP step) by up to a day.
FORWARD = [0, 1, 3, 10, 50, 120, 400, 999, 2000, 9000, 25_000]
BACKWARD = [-1, -999, -30_000, -61_000, -300_000, -3_600_000, -86_400_000]


async def twin_step(c: RedisCoordinator, state: pure.PacerState, now: float, settings: PacingSettings,
                    action: tuple) -> tuple[pure.PacerState, int | None]:
    """One step in both pacers: ``("observe", throttled, success)`` or ``("reserve",
    earliest)``. Asserts the same delay (or horizon refusal) and the same state field by field;
    returns the pure pacer's new state and the delay (None: an answer, or no slot)."""
    delay = None
    if action[0] == "observe":
        _, throttled, success = action
        state = pure.observe(state, now, throttled, settings, success=success)
        await c.record_outcome(KEY, success=success, throttled=throttled, budget=None,
                               pacing=settings, _now=now)
    else:
        new, delay = pure.reserve(state, now, settings, action[1])
        got = await c.admit(KEY, retry=False, budget=None, pacing=settings, earliest_ms=action[1], _now=now)
        if delay is None:
            assert (got.pacing_booked, got.pacing_ms) == (False, 0)
        else:
            state = new
            assert (got.pacing_booked, got.pacing_ms) == (True, delay)
    assert await stored_pacer(c, KEY) == state
    return state, delay


@pytest.mark.parametrize("seed", range(6))
async def test_the_redis_pacer_does_the_same_arithmetic_as_the_pure_one(any_redis, prefix, seed):  # noqa: F811
    """fsm.core.pacing "clock steps": a random run of reservations and answers (throttled,
    success, other) with clock steps forward and back (beyond a minute too) gives, step by step,
    the same delays, the same horizon refusals and the same state, field by field and to the
    last bit, in the Lua script (fed the same times) as in fsm.core.pacing."""
    rng = random.Random(seed)
    settings = PacingSettings(min_rate=rng.choice([0.5, 2.0]), max_rate=rng.choice([None, 40.0]),
                              beta=rng.choice([0.5, 0.7]), growth_per_s=rng.choice([0.03, 0.2]),
                              fast_growth_per_s=rng.choice([0.5, 2.0]),
                              cut_interval_ms=rng.choice([0, 1000]),
                              horizon_ms=rng.choice([0, 700, 2000]), forget_after_ms=20_000,
                              memory_s=rng.choice([5.0, 600.0]))
    c = RedisCoordinator.from_url(any_redis.url, prefix=prefix)
    state, now = pure.fresh(), 1_700_000_000_000.0
    refused = cuts = clamped = lone = engaged = 0
    for _ in range(400):
        now += rng.choice(BACKWARD) if rng.random() < 0.08 else rng.choice(FORWARD)
        clamped += now < state.seen_ms
        if rng.random() < 0.45:
            kind = rng.choices(["throttled", "success", "other"], [0.25, 0.65, 0.1])[0]
            before = state
            state, _ = await twin_step(c, state, now, settings, ("observe", kind == "throttled", kind == "success"))
            cuts += state.last_cut_ms != before.last_cut_ms
            if kind == "throttled" and not before.on:
                lone += not state.on   # SPEC §15.7: counted, nothing engaged
                engaged += state.on
        else:
            before = state
            state, delay = await twin_step(c, state, now, settings, ("reserve", rng.choice([0, 0, 0, 700, 2500])))
            refused += delay is None and before.on
    assert cuts > 0 and refused > 0, "the run cut the rate and met the horizon"
    assert lone > 0 and engaged > 0, "the run met lone throttles and throttles that engage pacing"
    assert clamped > 0, "the run stepped the clock back"
    await c.aclose()


async def test_both_pacers_clamp_a_step_back_to_the_latest_time_seen_and_agree_at_the_extremes(
        any_redis, prefix):  # noqa: F811
    """fsm.core.pacing "clock steps": after a cut, a step back of 2 minutes keeps pacing in both
    (no reset, the best throughput kept: the same slot, field by field); a slot booked 400
    days ahead and a step back of exactly 400 days are accepted; one of 400 days + 1 ms is
    another clock: both pacers start afresh."""
    settings = PacingSettings(min_rate=1.0, forget_after_ms=20_000)
    c = RedisCoordinator.from_url(any_redis.url, prefix=prefix)
    state, t0 = pure.fresh(), 1_700_000_000_000.0
    for i in range(20):  # 10 successes a second for 2 s, then two throttles: pacing at 0.7 × 8/s
        state, _ = await twin_step(c, state, t0 + i * 100, settings, ("reserve", 0))
        state, _ = await twin_step(c, state, t0 + i * 100 + 50, settings, ("observe", False, True))
    state, _ = await twin_step(c, state, t0 + 2000, settings, ("observe", False, True))
    state, _ = await twin_step(c, state, t0 + 2005, settings, ("observe", True, False))
    assert not state.on, "a lone throttle engages nothing, in both pacers"
    state, _ = await twin_step(c, state, t0 + 2010, settings, ("observe", True, False))
    assert state.on and state.good == 10
    back = t0 + 2010 - 120_000  # two minutes back: the time read is still t0 + 2010
    paced = []
    for _ in range(3):
        state, delay = await twin_step(c, state, back, settings, ("reserve", 0))
        paced.append(delay)
    assert state.on and state.seen_ms == t0 + 2010 and state.good == 10
    assert paced[0] is not None and paced[1] > paced[0], "still pacing after the step back"
    state, delay = await twin_step(c, state, back + 1, settings, ("reserve", MAX_LEFT_MS))
    assert delay is not None and delay >= MAX_LEFT_MS
    state, _ = await twin_step(c, state, t0 + 3_000, settings, ("observe", False, True))
    edge = state.seen_ms - MAX_LEFT_MS  # exactly 400 days back: clamped, kept
    state, _ = await twin_step(c, state, edge, settings, ("observe", False, False))
    assert state.on and state.seen_ms == t0 + 3_000
    state, _ = await twin_step(c, state, edge - 1, settings, ("observe", False, False))
    assert state == dataclasses.replace(pure.fresh(), seen_ms=edge - 1), "beyond 400 days: another clock"
    await c.aclose()


async def test_both_pacers_leave_a_lone_caller_alone_after_one_throttle_and_pace_a_fleet_above_it(
        any_redis, prefix):  # noqa: F811
    """SPEC §15.7, in the Lua and the pure pacer alike (step by step, field by field): a caller
    sending 2 requests a second hears one 429 — nothing is paced, every request after it goes
    at once; a fleet sending 20 a second to a key that takes 10 hears its throttles, more than
    one a second — pacing engages at the cut to beta × what got through and the next requests
    are spaced by it."""
    settings = PacingSettings(min_rate=1.0)
    c = RedisCoordinator.from_url(any_redis.url, prefix=prefix)
    state, t = pure.fresh(), 1_700_000_000_000.0
    for k in range(20):  # 10 s at 2/s, each answered by a success 200 ms later
        state, delay = await twin_step(c, state, t + 500 * k, settings, ("reserve", 0))
        state, _ = await twin_step(c, state, t + 500 * k + 200, settings, ("observe", False, True))
    state, _ = await twin_step(c, state, t + 10_200, settings, ("observe", True, False))  # one 429
    delays = []
    for k in range(21, 40):
        state, delay = await twin_step(c, state, t + 500 * k, settings, ("reserve", 0))
        delays.append(delay)
        state, _ = await twin_step(c, state, t + 500 * k + 200, settings, ("observe", False, True))
    assert delays == [0] * 19 and not state.on, "the lone caller is not slowed"
    t += 60_000
    for k in range(20):  # a fleet sends 20 in a second, then hears half of them refused
        state, delay = await twin_step(c, state, t + 50 * k, settings, ("reserve", 0))
        assert delay == 0
    for k in range(20):
        state, _ = await twin_step(c, state, t + 1_000 + 10 * k, settings, ("observe", k % 2 == 0, k % 2 == 1))
        if k == 0:
            assert not state.on, "its first throttle alone engages nothing"
    assert state.on and state.last_cut_ms == t + 1_020, "the second throttle engaged pacing"
    assert state.w_max == pytest.approx(20 * 0.98 - 2) and state.rate < 20, "cut from what got through"
    slots = []
    for _ in range(3):
        state, delay = await twin_step(c, state, t + 1_200, settings, ("reserve", 0))
        slots.append(delay)
    assert slots[1] - slots[0] == slots[2] - slots[1] == pytest.approx(1000 / state.rate, abs=1)
    await c.aclose()


async def test_both_pacers_agree_through_an_outage_flapping_and_a_step_back(redis_server, prefix):  # noqa: F811
    """fsm.core.pacing "the cut", "the floor", "fast recovery": a fleet sending 20/s is
    refused (a cut to what got through, then the floor at once), probes back off below the
    floor while nothing gets through, late successes among throttles do not jump the rate, a
    probe's success does; with steps of the clock back (an hour, a day) and forward (a
    minute) between, and a throttle exactly at the end of the cut interval: the Lua and the
    Python pacer agree step by step, field by field."""
    settings = PacingSettings(min_rate=1.0, forget_after_ms=600_000, horizon_ms=2_000)
    c = RedisCoordinator.from_url(redis_server.url, prefix=prefix)
    state, t = pure.fresh(), 1_700_000_000_000.0
    for k in range(40):  # a second of 20 sends and 20 successes, then the fault
        state, _ = await twin_step(c, state, t + 50 * k, settings, ("reserve", 0))
        state, _ = await twin_step(c, state, t + 50 * k + 25, settings, ("observe", False, True))
    t += 2000
    for k in range(20):  # every answer refused
        state, _ = await twin_step(c, state, t + 50 * k, settings, ("observe", True, False))
    assert state.on and state.thr_cur > 1
    rates = [state.rate]
    for step in (1000, 1000, -3_600_000, 3_601_000, 60_000, 1000, -86_400_000, 86_401_000,
                 1000, 1000, 1000, 1000):
        t += step
        state, _ = await twin_step(c, state, t, settings, ("reserve", 0))
        state, _ = await twin_step(c, state, t + 200, settings, ("observe", True, False))
        rates.append(state.rate)
    assert min(rates) == pytest.approx(1.0 * pure.PROBE_BACKOFF), "the probes backed off"
    t = max(t, state.seen_ms)
    for k in range(20):  # the provider flaps down again: many throttles at once
        state, _ = await twin_step(c, state, t + 10 * k, settings, ("observe", True, False))
    state, _ = await twin_step(c, state, t + 300, settings, ("observe", False, True))  # late
    assert state.rate < 2.0
    state, _ = await twin_step(c, state, t + 5_000, settings, ("observe", False, True))  # a probe
    assert state.rate >= pure.best_rate(state, t + 5_000, settings) / 2
    await c.aclose()


@pytest.mark.parametrize("absent", [("thrs", "thrc", "thrp"), ("okp",)])
async def test_a_pacer_hash_without_the_throttle_window_is_kept(redis_server, prefix, absent):  # noqa: F811
    """A pacer hash written before the throttles' window or the count of the second before
    ``oks`` was kept (those fields absent: an older process of the fleet) is read with them
    empty, not as a fresh pacer."""
    settings = PacingSettings(min_rate=1.0)
    c = RedisCoordinator.from_url(redis_server.url, prefix=prefix)
    name = c.keys.pacer(KEY)
    await throttles(c, settings)
    await c.client.hdel(name, *absent)
    a = await c.admit(KEY, retry=False, budget=None, pacing=settings)
    b = await c.admit(KEY, retry=False, budget=None, pacing=settings)
    assert (await c.client.hget(name, "on")) == b"1" and b.pacing_ms > a.pacing_ms
    assert float(await c.client.hget(name, absent[0])) == (-1.0 if absent[0] == "thrs" else 0.0)
    await c.aclose()


@pytest.mark.parametrize("where, seed", [*(("redis", seed) for seed in range(6)),
                                         ("cluster", 0), ("cluster", 3)])
async def test_the_redis_budget_answers_as_the_in_process_one(request, prefix, where, seed):  # noqa: F811
    """Over a random run the Lua and in-process budgets give the same answers, bucket and floor
    (on one Redis every mode; on the cluster, SPEC §15.10, refuse with a floor and wait with
    one: the same script, one slot)."""
    redis_server = request.getfixturevalue("redis_cluster" if where == "cluster" else "redis_server")
    rng = random.Random(seed)
    mode, floor = [("refuse", 1.0), ("wait", 0.0), ("wait", 0.3), ("wait", 2.0), ("wait", 7.0),
                   ("refuse", 0.0)][seed]
    budget = BudgetSettings(max_tokens=rng.choice([4, 10]), token_ratio=rng.choice([0.1, 0.5, 1.0]),
                            mode=mode, min_retries_per_second=floor)
    now = 1_700_000_000_000.0
    local = InProcessCoordinator(clock=lambda: now)
    c = RedisCoordinator.from_url(redis_server.url, prefix=prefix)
    seen: set[tuple] = set()
    for _ in range(300):
        now += rng.choice([0, 0, 1, 7, 50, 143, 333, 999, 2000, 3001, 9000, 700_000])
        roll = rng.random()
        if roll < 0.7:
            for _ in range(rng.choice([1, 1, 1, 10, 30])):  # a burst at one time
                due = rng.random() < 0.2
                want = local.admit_at(KEY, now, retry=True, budget=budget, pacing=None,
                                      floor_slot_due=due)
                got = await c.admit(KEY, retry=True, budget=budget, pacing=None, floor_slot_due=due,
                                    _now=now)
                assert got == want
                seen.add((want.budget, want.token_taken, want.budget_wait_ms > 0,
                          want.budget_slot_booked))
        elif roll < 0.9:
            local.record_outcome_at(KEY, now, success=True, throttled=False, budget=budget,
                                    pacing=None)
            await c.record_outcome(KEY, success=True, throttled=False, budget=budget, pacing=None,
                                   _now=now)
        else:
            local.add_tokens_sync(KEY, budget, 1000)
            await c._credit(KEY, budget, 1000, "", None, _now=now)
        assert int(await c.client.hget(c.keys.bucket(KEY), "m")) == local._buckets[KEY][0]
        stored = await c.client.get(c.keys.floor(KEY))
        assert (None if stored is None else float(stored)) == local._floor.get(KEY)
    assert (True, True, False, True) in seen, "the run took tokens"
    assert (False, False, False, True) in seen or mode == "wait", "refuse mode refused"
    if mode == "wait":
        assert (False, False, True, False) in seen, "the run met a wait with nothing booked"
        if floor:
            assert (False, False, True, True) in seen, "the run booked a floor slot ahead"
    await c.aclose()


async def test_callers_of_both_protocols_share_one_table_without_mixing_clocks():
    """While the session still calls the protocol before v3 (with its own epoch ``now_ms``),
    a v3 caller on the same coordinator sees the same time left, and vice versa: only
    durations cross."""
    clock = Clock(5_000.0)  # a monotonic clock, nowhere near the epoch
    c = InProcessCoordinator(clock=clock)
    epoch = 1_800_000_000_000
    await c.learn_cooldown(KEY, epoch + 30_000, epoch)              # before v3, epoch frame
    assert (await c.admit(KEY, retry=False, budget=None, pacing=None)).cooldown_ms == 30_000
    await c.mark_credential_limited("p", "c1", 20_000)               # v3
    assert await c.limited_credentials("p", epoch) == {"c1": epoch + 20_000}
    clock.now += 10_000
    assert await c.cooldown_left_ms(KEY, epoch + 10_000) == 20_000
    assert await c.limited_credentials("p") == {"c1": 10_000}


_PACING = st.builds(
    PacingSettings, min_rate=st.sampled_from([0.001, 0.5, 1.0, 3.0]),
    max_rate=st.sampled_from([None, 3.0, 40.0, 1e6]), beta=st.sampled_from([0.01, 0.5, 0.7, 0.99]),
    growth_per_s=st.sampled_from([0.03, 0.2, 10.0]), fast_growth_per_s=st.sampled_from([0.5, 2.0, 10.0]),
    cut_interval_ms=st.sampled_from([0, 1000, 600_000]), horizon_ms=st.sampled_from([0, 700, 2000, 86_400_000]),
    forget_after_ms=st.sampled_from([1000, 20_000, 604_800_000]), memory_s=st.sampled_from([0.001, 5.0, 600.0, 1e6]))
#: One step: a clock step in ms (forward, back, beyond 400 days either way) and an action.
_STEP = st.tuples(
    st.one_of(st.sampled_from(FORWARD + BACKWARD), st.integers(-2 * MAX_LEFT_MS, 2 * MAX_LEFT_MS)),
    st.one_of(st.tuples(st.just("observe"), st.booleans(), st.booleans()),
              st.tuples(st.just("reserve"), st.sampled_from([0, 1, 700, 2500, MAX_LEFT_MS]))))


@hypothesis.settings(max_examples=40, deadline=None,
                     suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.given(settings=_PACING, steps=st.lists(_STEP, min_size=1, max_size=60),
                  start=st.sampled_from([0.0, 1_700_000_000_000.0, 4_102_444_800_000.0]))
def test_both_pacers_agree_on_any_settings_and_any_clock(redis_server, settings, steps, start):  # noqa: F811
    """fsm.core.pacing (every rule: slots, the cut to what got through, the floor's probe
    back-off, growth, fast recovery, forgetting, clock steps back and beyond 400 days): over
    any valid settings at their extremes and any run of answers, reservations and clock steps,
    the Lua pacer and the pure one give the same delays and the same state, field by field."""
    import asyncio

    async def run() -> None:
        c = RedisCoordinator.from_url(redis_server.url, prefix=f"h-{uuid.uuid4().hex[:12]}")
        state, now = pure.fresh(), start
        try:
            for step, action in steps:
                now = max(0.0, now + step)
                state, _ = await twin_step(c, state, now, settings, action)
        finally:
            await c.aclose()

    asyncio.run(run())
