"""The pure pacer (fsm/core/pacing.py) and its settings (``retry.pacing``), and the budget's
wait mode settings: slots within a horizon, a cut on the send rate once per round, growth
fast below W_max, fast recovery to half the best throughput, a floor of probes."""

from __future__ import annotations

import ast
import math
from dataclasses import replace
from pathlib import Path

import pytest

from fsm.core import pacing
from fsm.core.pacing import (ENGAGE_EXCESS, PROBE_BACKOFF, PacerState, best_rate, fresh, observe, reserve,
                             send_rate, slot_delay_ms, throttle_rate)
from fsm.core.settings import BudgetSettings, PacingSettings, RetrySettings, SettingsError

P = PacingSettings()


def sent(state: PacerState, times: list[float], settings: PacingSettings = P) -> PacerState:
    """``state`` after one reservation at each of ``times`` (each wanting to go at once)."""
    for t in times:
        state, delay = reserve(state, t, settings)
        assert delay is not None
    return state


def throttled(state: PacerState, t: float, settings: PacingSettings = P, n: int = 2) -> PacerState:
    """``state`` after ``n`` throttles heard at ``t``. Two in one second: the key sends more than
    one request a second above what gets through, so pacing engages (``ENGAGE_EXCESS``, SPEC
    §15.7); one alone would not."""
    for _ in range(n):
        state = observe(state, t, True, settings)
    return state


def busy(state: PacerState) -> PacerState:
    """``state`` with slots booked far ahead: the rate is in use, so successes may grow it
    (fsm/core/pacing.py "growth": RFC 7661's validated phase)."""
    return replace(state, sent_sec=1e6, sent_cur=1e9)


def pacing_at(rate: float, *, now: float = 0.0, w_max: float = 0.0) -> PacerState:
    """A pacer that paces at ``rate`` since a cut at ``now``."""
    return PacerState(on=True, rate=rate, tat_ms=now, last_cut_ms=now, last_grow_ms=now, w_max=w_max)


def test_the_pacer_is_pure():
    """fsm.core.pacing imports no clock, I/O or event loop."""
    tree = ast.parse(Path(pacing.__file__).read_text())
    names = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
             for alias in node.names} | {node.module.split(".")[0] for node in ast.walk(tree)
                                          if isinstance(node, ast.ImportFrom) and node.module}
    assert not names & {"time", "asyncio", "os", "socket", "datetime", "threading", "random"}


def test_nothing_is_paced_before_the_first_throttle_but_every_send_is_counted():
    """Before a throttle every request goes when it wants; its send is still counted."""
    state = fresh()
    for t in range(0, 1000, 10):
        state = observe(state, t, False, P)
        state, delay = reserve(state, t, P, earliest_ms=7)
        assert delay == 7
    assert state.on is False and state.rate == 0.0
    assert (state.sent_sec, state.sent_cur) == (0.0, 100.0), "each counted in the second of its slot"
    assert send_rate(state, 1000.0) == 100.0


def test_sends_are_counted_in_the_second_they_are_booked_for():
    """The send window counts each request in the second of its slot (the newest two seconds)."""
    state = sent(fresh(), [0.0, 500.0, 999.0])
    assert (state.sent_sec, state.sent_cur, state.sent_prev) == (0.0, 3.0, 0.0)
    state = sent(state, [1000.0, 1500.0])
    assert (state.sent_sec, state.sent_cur, state.sent_prev) == (1.0, 2.0, 3.0)
    state = sent(state, [3200.0])
    assert (state.sent_sec, state.sent_cur, state.sent_prev) == (3.0, 1.0, 0.0), "a gap clears the older bin"


def test_the_send_rate_is_a_sliding_window_over_the_last_second():
    """The newest bin plus the share of the one before still inside the window."""
    state = sent(fresh(), [float(t) for t in range(0, 1000, 50)])  # 20 in second 0
    assert send_rate(state, 500.0) == 20.0
    assert send_rate(state, 1500.0) == pytest.approx(10.0), "half of second 0 is still in the window"
    assert send_rate(state, 2000.0) == 0.0
    state = sent(state, [1100.0, 1200.0])
    assert send_rate(state, 1250.0) == pytest.approx(20 * 0.75 + 2)


def test_a_throttle_cuts_the_rate_to_beta_times_what_got_through_in_the_last_second():
    """The first cut, at the throttle that engages pacing: rate = beta × what got through over
    the last second — the requests sent less the throttles heard (this one counted) — and
    W_max = that (fsm/core/pacing.py "the cut")."""
    state = sent(fresh(), [float(t) for t in range(0, 1000, 50)])  # 20/s
    lone = observe(state, 1400.0, True, P)
    assert lone == replace(state, seen_ms=1400.0, thr_sec=1.0, thr_cur=1.0), "one throttle: counted only"
    cut = observe(lone, 1500.0, True, P)
    assert cut.on is True
    assert (cut.thr_sec, cut.thr_cur) == (1.0, 2.0)
    assert cut.w_max == pytest.approx(10.0 - 2.0)
    assert cut.rate == pytest.approx(0.7 * 8.0)
    assert cut.last_cut_ms == 1500.0 and cut.tat_ms == 1500.0


def test_a_lone_throttle_does_not_slow_a_lone_caller():
    """SPEC §15.7: a caller sending 2 requests a second to a healthy key hears one 429: its
    send rate does not exceed what got through by more than ENGAGE_EXCESS, so nothing is
    paced — every later request goes when it wants, for the whole forgetAfterMs and beyond
    (before, every request after it waited for a slot at the floor, 1/s: 0.5 s, 1 s, ...)."""
    state = sent(fresh(), [t * 500.0 for t in range(120)])  # 60 s at 2/s
    state = observe(state, 60_200.0, True, P)
    assert state.on is False and throttle_rate(state, 60_200.0) == ENGAGE_EXCESS
    for t in range(60_250, 100_000, 500):
        state = observe(state, t - 50, False, P)
        state, delay = reserve(state, t, P)
        assert delay == 0
    assert state.on is False and state.rate == 0.0
    # another throttle, once the first has left the window (two seconds on), is a lone one too
    state = observe(observe(state, 100_000.0, True, P), 102_000.0, True, P)
    assert state.on is False


def test_throttles_above_one_a_second_engage_pacing_and_the_fleet_is_paced():
    """A fleet sending 20/s to a key that takes fewer: its throttles, more than one a second
    (a second one within the sliding window), engage pacing at the cut to beta × what got
    through, and the requests that follow are spaced by the rate (SPEC §15.7)."""
    state = sent(fresh(), [float(t) for t in range(0, 1000, 50)])  # 20 in second 0
    state = observe(state, 600.0, True, P)
    assert state.on is False
    state = observe(state, 1_900.0, True, P)  # 0.1 of the first throttle's second still counts
    assert throttle_rate(state, 1_900.0) == pytest.approx(1.1) and state.on is True
    assert send_rate(state, 1_900.0) == pytest.approx(2.0)
    assert state.rate == 1.0, "beta × (2 sent - 1.1 refused) is below the floor"
    delays = []
    for _ in range(3):
        state, delay = reserve(state, 1_900.0, P)
        delays.append(delay)
    assert delays == [0, 1000, 2000], "paced at the floor, 1/s"


def test_a_cut_where_nothing_got_through_goes_to_the_floor_at_once():
    """As many throttles heard as requests sent over the last second (an outage): the cut goes
    to minRate at once, not down by one beta (fsm/core/pacing.py "the cut")."""
    settings = PacingSettings(min_rate=1.0)
    state = replace(pacing_at(10.0, now=0.0), sent_sec=1.0, sent_cur=10.0, thr_sec=1.0,
                    thr_cur=9.0, seen_ms=1500.0)
    cut = observe(state, 1500.0, True, settings)
    assert throttle_rate(cut, 1500.0) == send_rate(cut, 1500.0) == 10.0
    assert cut.rate == 1.0 and cut.w_max == 0.0 and cut.last_cut_ms == 1500.0
    some = observe(replace(state, thr_cur=4.0), 1500.0, True, settings)
    assert some.rate == pytest.approx(0.7 * (10 - 5)), "half got through: beta × that half"


def test_a_later_cut_takes_the_lower_of_the_send_rate_and_the_rate_in_use():
    """Once pacing, the base of a cut is min(rate in use, what got through) (the send rate less
    the throttles heard, when something was sent)."""
    low_sends = sent(pacing_at(50.0), [1000.0 + t for t in range(0, 1000, 100)])  # 10 in second 1
    assert observe(low_sends, 2000.0, True, P).rate == pytest.approx(0.7 * (10.0 - 1.0)), \
        "the send rate less the one throttle heard"
    high_sends = sent(pacing_at(5.0), [1000.0 + t for t in range(0, 600, 100)])  # slots 1000..2000
    assert send_rate(high_sends, 2000.0) == 6.0
    assert observe(high_sends, 2000.0, True, P).rate == pytest.approx(0.7 * 5.0)
    none_sent = pacing_at(5.0)
    assert observe(none_sent, 5000.0, True, P).rate == pytest.approx(0.7 * 5.0), \
        "nothing sent lately: the rate in use is the base"


def test_one_cut_per_cut_interval():
    """The throttles of one round of requests cut once; a throttle after cutIntervalMs cuts again."""
    settings = PacingSettings(cut_interval_ms=1000, min_rate=0.1)
    state = pacing_at(10.0, now=-2000.0)
    first = observe(state, 1.0, True, settings)
    assert first.rate == pytest.approx(7.0)
    # only the time seen and the throttle heard
    assert observe(first, 900.0, True, settings) == replace(first, seen_ms=900.0, thr_cur=2.0)
    again = observe(first, 1001.0, True, settings)
    assert again.rate == pytest.approx(4.9) and again.last_cut_ms == 1001.0


def test_the_probes_back_off_below_the_floor_while_nothing_gets_through_and_never_stop():
    """Repeated throttles with no success cannot stop the fleet: probes go on, the floor backing
    off by beta per cut down to PROBE_BACKOFF × ``minRate``, spaced evenly; the first success
    lifts the rate back to ``minRate`` at least (fsm/core/pacing.py "the floor")."""
    settings = PacingSettings(min_rate=2.0, horizon_ms=10_000)
    state = fresh()
    rates = []
    for t in range(0, 20_000, 1000):
        state = observe(state, t, True, settings)
        rates.append(state.rate)
    assert rates[0] == 0.0, "a lone throttle does not engage pacing"
    assert rates[1:4] == [2.0, pytest.approx(1.4), pytest.approx(0.98)], "one a second does"
    assert state.on is True and state.rate == 2.0 * PROBE_BACKOFF == 0.5
    delays = []
    for _ in range(4):
        state, delay = reserve(state, 20_000, settings)
        delays.append(delay)
    assert delays == [0, 2000, 4000, 6000]
    assert observe(state, 21_000, False, settings).rate >= 2.0


def test_growth_never_passes_max_rate():
    """``maxRate`` caps the rate whatever the growth."""
    settings = PacingSettings(max_rate=3.0, fast_growth_per_s=10.0, growth_per_s=10.0)
    state = busy(pacing_at(2.9, w_max=100.0))
    for t in range(1000, 20_000, 1000):
        state = observe(state, float(t), False, settings)
    assert state.rate == 3.0


def test_a_success_grows_fast_below_0_9_w_max_and_slowly_above():
    """CUBIC's W_max: below the knee, 0.9 × the rate last cut, a second of successes grows the
    rate by fastGrowthPerS, up to the knee and not past it; above it by growthPerS."""
    below = observe(busy(pacing_at(5.0, w_max=10.0)), 1000.0, False, P)
    assert below.rate == pytest.approx(5.0 * 1.5)
    knee = observe(busy(pacing_at(8.0, w_max=10.0)), 1000.0, False, P)
    assert knee.rate == pytest.approx(9.0), "8 × 1.5 stops at the knee, 9"
    above = observe(busy(pacing_at(9.5, w_max=10.0)), 1000.0, False, P)
    assert above.rate == pytest.approx(9.5 * 1.03)
    half = observe(busy(pacing_at(5.0, w_max=10.0)), 500.0, False, P)
    assert half.rate == pytest.approx(5.0 * 1.5 ** 0.5), "growth is per second, pro rata"
    long = observe(busy(pacing_at(5.0, w_max=10.0)), 9000.0, False, P)
    assert long.rate == pytest.approx(5.0 * 1.5), "at most one second's growth per success"


def test_a_rate_the_fleet_does_not_use_does_not_grow():
    """RFC 7661's validated phase: a success grows the rate only while the send rate over the
    last second is at least half of it; the fleet sending less (its requests waiting in their
    backoff, a quiet spell), successes leave the rate as it is (measured in flapping: it grew
    on the probes' successes to 1.3 × C before the backlog came)."""
    state = sent(pacing_at(10.0, w_max=40.0), [0.0, 100.0, 200.0, 300.0])  # 4 sent: below 10 / 2
    assert observe(state, 1000.0, False, P).rate == 10.0
    state = sent(state, [400.0 + 10 * k for k in range(4)])  # 8 sent
    assert send_rate(state, 999.0) == 8.0
    assert observe(state, 999.0, False, P).rate == pytest.approx(10.0 * 1.5 ** 0.999), "5 or more: it grows"


def test_an_answer_that_is_neither_a_success_nor_a_throttle_teaches_nothing():
    """``success=False, throttled=False`` (a fatal error, a usage limit): the state is kept
    (only the latest time seen moves)."""
    state = pacing_at(5.0, w_max=10.0)
    assert observe(state, 1000.0, False, P, success=False) == replace(state, seen_ms=1000.0)
    assert observe(fresh(), 1000.0, False, P, success=False) == replace(fresh(), seen_ms=1000.0)


def test_the_best_throughput_is_remembered_and_halves_every_memory_s():
    """A complete second of successes, counted as the lower of it and the second before it,
    sets the best rate (a burst second after a quiet one is not capacity); it decays with
    half-life memoryS."""
    settings = PacingSettings(memory_s=10.0)
    state = fresh()
    for t in range(0, 1000, 10):  # 100 successes in second 0: a burst
        state = observe(state, float(t), False, settings)
    for t in range(1000, 2000, 25):  # 40 in second 1
        state = observe(state, float(t), False, settings)
    assert state.good == 0.0, "second 0 had no second of successes before it"
    state = observe(state, 2000.0, False, settings)  # second 1 is complete: measured
    assert (state.good, state.good_ms) == (40.0, 2000.0)
    assert best_rate(state, 12_000.0, settings) == pytest.approx(20.0)
    assert best_rate(state, 22_000.0, settings) == pytest.approx(10.0)


def test_fast_recovery_jumps_the_rate_to_half_the_best_throughput():
    """After an outage (rate at the floor) a success jumps the rate to half of the best
    successes/s seen lately, and W_max to that best (so growth stays fast up to it)."""
    settings = PacingSettings(min_rate=1.0)
    state = fresh()
    for t in range(0, 3000, 25):  # 40 successes/s for three seconds
        state = sent(state, [float(t)], settings)
        state = observe(state, float(t), False, settings)
    for t in range(3000, 23_000, 1000):  # an outage: throttles bring the rate to the floor
        state = observe(state, float(t), True, settings)
    assert state.rate == 1.0 * PROBE_BACKOFF  # and its probes backed off
    assert best_rate(state, 22_500.0, settings) == pytest.approx(40.0, rel=0.03)
    back = observe(state, 22_500.0, False, settings)
    assert back.good == 40.0
    assert back.w_max == pytest.approx(40.0)
    assert back.rate == pytest.approx(20.0, rel=0.03), "half the best (not grown: nothing is being sent)"
    busier = observe(sent(back, [22_600.0 + k for k in range(10)], settings), 23_000.0, False, settings)
    assert busier.rate == pytest.approx(back.rate * 1.5 ** 0.5), "sent at half of it: fast growth"


def test_late_successes_among_many_throttles_are_not_a_recovery():
    """A success heard while the throttles of the last second exceed twice the floor (a
    request sent before a fault began, answered a service time later) does not jump the rate
    to half the best: it grows by one step only (fsm/core/pacing.py "fast recovery")."""
    state = replace(pacing_at(1.0, now=0.0), good=40.0, good_ms=0.0, ok_sec=0.0, ok_n=1.0)
    for t in range(0, 300, 10):  # 30 throttles heard in 0.3 s
        state = observe(state, float(t), True, P)
    late = observe(state, 400.0, False, P)
    assert late.rate < 2.0
    quiet = observe(state, 2500.0, False, P)  # the throttles are out of the window
    assert quiet.rate >= best_rate(state, 2500.0, P) / 2


def test_fast_recovery_does_not_raise_w_max_above_the_floor_band():
    """A rate below half the best but well above the floor jumps to the half; W_max is kept."""
    state = busy(replace(pacing_at(4.0, w_max=30.0), good=40.0, good_ms=0.0, ok_sec=0.0, ok_n=1.0))
    back = observe(state, 100.0, False, P)
    assert back.w_max == 30.0
    assert back.rate == pytest.approx(best_rate(state, 100.0, P) / 2 * 1.5 ** 0.1)
    assert back.rate > 20.0


def test_no_slot_within_the_horizon_reserves_and_counts_nothing():
    """A slot more than horizonMs after the time the request wants to go: (state, None),
    the state as it was (no slot, no send counted)."""
    settings = PacingSettings(min_rate=1.0, horizon_ms=1500)
    state = throttled(sent(fresh(), [0.0]), 100.0, settings)  # rate 1/s
    state, first = reserve(state, 100.0, settings)
    state, second = reserve(state, 100.0, settings)
    assert (first, second) == (0, 1000)
    before = state
    after, none = reserve(state, 100.0, settings)
    assert none is None and after == before
    _, later = reserve(state, 100.0, settings, earliest_ms=1000)
    assert later == 2000, "a request that wants to go later finds the slot within its horizon"


def test_a_slot_is_reserved_no_earlier_than_the_request_goes():
    """``earliest_ms`` (a backoff or cooldown already known) moves the slot, and the next
    slot follows it."""
    state = pacing_at(1.0)
    state, delay = reserve(state, 1000, P, earliest_ms=5000)
    assert delay == 5000
    state, delay = reserve(state, 1000, P, earliest_ms=5000)
    assert delay == 6000
    assert slot_delay_ms(state, 1000, P, earliest_ms=5000) == 7000, "slot_delay_ms reserves nothing"
    assert slot_delay_ms(state, 1000, P, earliest_ms=5000) == 7000


def test_the_pacer_lets_go_after_forget_after_ms_without_a_throttle():
    """No throttle for ``forgetAfterMs``: unpaced again (the send counts survive)."""
    settings = PacingSettings(forget_after_ms=10_000, min_rate=0.1, horizon_ms=86_400_000)
    state = throttled(fresh(), 0, settings)
    state, _ = reserve(state, 1, settings)
    state, delay = reserve(state, 1, settings)
    assert delay > 0
    state, delay = reserve(state, 10_000, settings)
    assert delay > 0, "not yet: exactly forgetAfterMs is still remembered"
    state, delay = reserve(state, 10_001, settings)
    assert delay == 0 and state.on is False and state.rate == 0.0
    assert state.sent_cur > 0


def test_pacing_off_changes_nothing():
    """``enabled: false``: reserve gives earliest rounded up, observe keeps the state."""
    off = PacingSettings(enabled=False)
    state = pacing_at(1.0, now=0.0)
    assert reserve(state, 0, off, earliest_ms=2.5) == (state, 3)
    assert observe(state, 10, True, off) == state


def test_no_delay_told_exceeds_400_days():
    """A far reservation is clipped to the sane maximum."""
    state = replace(pacing_at(1.0), tat_ms=1e15)
    _, delay = reserve(state, 0, PacingSettings(horizon_ms=86_400_000), earliest_ms=1e15)
    assert delay == pacing.MAX_DELAY_MS


# -- settings ------------------------------------------------------------------------------

def test_pacing_settings_default_off_and_round_trip():
    """``retry.pacing`` is null (off) by default; ``{}`` is on with the defaults."""
    assert RetrySettings().pacing is None
    s = RetrySettings.from_json({"retry": {"pacing": {}}})
    assert s.pacing == PacingSettings() and s.pacing.enabled
    assert RetrySettings.from_json({"retry": s.to_json()}) == s
    full = PacingSettings(enabled=False, min_rate=1, max_rate=50, beta=0.5, growth_per_s=0.1,
                          fast_growth_per_s=1.0, cut_interval_ms=500, horizon_ms=4000,
                          recheck_ms=1000, forget_after_ms=60_000, memory_s=30)
    assert PacingSettings.from_json(full.to_json()) == full
    assert set(full.to_json()) == {"enabled", "minRate", "maxRate", "beta", "growthPerS",
                                   "fastGrowthPerS", "cutIntervalMs", "horizonMs", "recheckMs",
                                   "forgetAfterMs", "memoryS"}


@pytest.mark.parametrize("key, value", [
    ("minRate", 0), ("minRate", -1), ("minRate", float("nan")), ("minRate", "1"), ("minRate", True),
    ("maxRate", 0.1), ("beta", 1), ("beta", 0), ("growthPerS", 0), ("fastGrowthPerS", 11),
    ("cutIntervalMs", -1), ("horizonMs", 1.5), ("recheckMs", 0), ("recheckMs", 99), ("memoryS", 0),
    ("forgetAfterMs", 10), ("forgetAfterMs", 1.5), ("enabled", "yes"),
])
def test_a_bad_pacing_value_names_its_key_and_value(key, value):
    """Validated like the other settings: the error names retry.pacing.KEY and the value."""
    with pytest.raises(SettingsError, match=rf"retry\.pacing\.{key}") as info:
        PacingSettings.from_json({key: value, **({"minRate": 0.5} if key == "maxRate" else {})})
    assert repr(value)[:10] in str(info.value)


@pytest.mark.parametrize("key", ["burstS", "scale", "minrate"])
def test_an_unknown_pacing_key_is_refused(key):
    """A typo, or a key of the pacer before (burstS, scale), is named."""
    with pytest.raises(SettingsError, match=rf"retry\.pacing.*{key}"):
        PacingSettings.from_json({key: 1})


def test_budget_mode_and_floor_are_validated():
    """``retry.budget.mode`` is refuse|wait; ``minRetriesPerSecond`` a number 0..1000."""
    b = BudgetSettings.from_json({"mode": "wait", "minRetriesPerSecond": 2})
    assert b.waits and b.min_retries_per_second == 2.0
    assert BudgetSettings.from_json(b.to_json()) == b
    assert BudgetSettings().mode == "refuse" and BudgetSettings().min_retries_per_second == 0
    with pytest.raises(SettingsError, match=r"retry\.budget\.mode.*'later'"):
        BudgetSettings.from_json({"mode": "later"})
    with pytest.raises(SettingsError, match=r"retry\.budget\.minRetriesPerSecond"):
        BudgetSettings.from_json({"minRetriesPerSecond": -1})
    with pytest.raises(SettingsError, match=r"retry\.budget\.minRetriesPerSecond"):
        BudgetSettings.from_json({"minRetriesPerSecond": math.inf})


def test_a_clock_that_steps_back_neither_inflates_nor_overflows_the_best_rate():
    """Successes recorded, then one 30 s earlier (a server failover, an NTP step) with a tiny
    memoryS: the best rate stays what was seen (no 2^3000 blow-up, no OverflowError)."""
    settings = PacingSettings(memory_s=0.01)
    state = pacing.fresh()
    for t in range(0, 3_000, 100):
        state = pacing.observe(state, 100_000 + t, False, settings)
    state = throttled(state, 100_000 + 3_000, settings)  # pacing on
    assert state.on
    stepped = pacing.observe(state, 70_000, False, settings)
    assert math.isfinite(stepped.rate) and stepped.rate <= stepped.good == 10  # half the best: 5
    assert pacing.best_rate(stepped, 70_000, settings) <= stepped.good


def test_no_rate_grows_beyond_the_largest_max_rate_without_a_max_rate():
    """Minutes of successes with fast growth and no maxRate: the rate stops at MAX_RATE (1e6/s),
    where the Redis script's state stays valid too."""
    settings = PacingSettings(growth_per_s=10, fast_growth_per_s=10, forget_after_ms=600_000)
    state = busy(throttled(pacing.fresh(), 0, settings))
    for t in range(1, 300):
        state = pacing.observe(state, t * 1_000, False, settings)
    assert state.on and state.rate == pacing.MAX_RATE


def test_a_forgotten_pacer_does_not_bring_back_its_old_slots_at_the_next_throttle():
    """At the floor (0.01/s: one slot per 100 s), pacing lets go after forgetAfterMs; the next
    throttle starts pacing from now, not from the slot booked 100 s ahead before."""
    settings = PacingSettings(min_rate=0.01, forget_after_ms=1_000, horizon_ms=200_000)
    state = throttled(fresh(), 0, settings)
    state, delay = reserve(state, 0, settings)
    assert delay == 0 and state.tat_ms == 100_000
    state = throttled(state, 5_000, settings)          # forgotten, then throttled again
    state, delay = reserve(state, 5_000, settings)
    assert delay == 0


def test_a_clock_stepped_back_is_clamped_to_the_latest_time_seen():
    """fsm.core.pacing "clock steps": a step back of two minutes reads as the latest time seen
    (pacing goes on with the same slots, nothing forgotten or grown); a state seen more than
    400 days ahead is another clock's and counts as lost."""
    settings = PacingSettings(min_rate=1.0, forget_after_ms=20_000)
    state = observe(pacing_at(10.0, now=0.0, w_max=10.0), 500.0, True, settings)
    ahead, slot_ahead = reserve(state, 500.0, settings)
    back, slot_back = reserve(state, 500.0 - 120_000, settings)
    assert (back, slot_back) == (ahead, slot_ahead) and back.on and back.seen_ms == 500.0
    assert observe(state, -200_000.0, False, settings) == observe(state, 500.0, False, settings)
    assert observe(state, 500.0 - pacing.MAX_DELAY_MS, False, settings, success=False).on
    lost = observe(state, 499.0 - pacing.MAX_DELAY_MS, False, settings, success=False)
    assert lost == replace(fresh(), seen_ms=499.0 - pacing.MAX_DELAY_MS)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_time_that_is_not_finite_is_refused_naming_it(bad):
    """fsm.core.pacing "clock steps" (STYLE: a clear error naming the value): a NaN or
    infinite ``now_ms`` or ``earliest_ms`` raises ValueError naming it, in every step; a NaN
    was written as the latest reading seen (an answer that teaches nothing), which turned the
    clamp of a later step back off, and elsewhere failed inside ``math.floor``."""
    settings = PacingSettings(min_rate=1.0)
    paced = throttled(pacing.fresh(), 1000.0, settings)
    assert paced.on
    steps = [lambda: pacing.reserve(paced, bad, settings), lambda: pacing.slot_delay_ms(paced, bad, settings),
             lambda: pacing.observe(paced, bad, True, settings),
             lambda: pacing.observe(paced, bad, False, settings, success=False),
             lambda: pacing.reserve(paced, 2000.0, settings, bad),
             lambda: pacing.slot_delay_ms(paced, 2000.0, settings, bad)]
    for step in steps:
        with pytest.raises(ValueError, match=r"pacing: (now_ms|earliest_ms) must be a finite number of ms, got"):
            step()
