"""The pure pacer (fsm/core/pacing.py) and its settings (``retry.pacing``), and the budget's
wait mode settings: AWS adaptive retry's CUBIC token bucket with a probe floor."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from fsm.core import pacing
from fsm.core.pacing import PacerState, fresh, observe, reserve
from fsm.core.settings import BudgetSettings, PacingSettings, RetrySettings, SettingsError

P = PacingSettings()


def throttled_at(rate_per_s: float, seconds: float = 3.0, *, start: float = 0.0) -> tuple[PacerState, float]:
    """A pacer that saw ``rate_per_s`` successes for ``seconds`` then one throttle."""
    state, now = fresh(), start
    step = 1000.0 / rate_per_s
    while now < start + seconds * 1000:
        state = observe(state, now, False, P)
        now += step
    return observe(state, now, True, P), now


def test_the_pacer_is_pure():
    """fsm.core.pacing imports no clock, I/O or event loop."""
    tree = ast.parse(Path(pacing.__file__).read_text())
    names = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
             for alias in node.names} | {node.module.split(".")[0] for node in ast.walk(tree)
                                          if isinstance(node, ast.ImportFrom) and node.module}
    assert not names & {"time", "asyncio", "os", "socket", "datetime", "threading", "random"}


def test_nothing_is_paced_before_the_first_throttle():
    """botocore enables its bucket on the first throttle only."""
    state = fresh()
    for t in range(0, 5000, 10):
        state = observe(state, t, False, P)
        state, delay = reserve(state, t, P)
        assert delay == 0
    assert state.on is False


def test_a_throttle_cuts_the_rate_to_beta_times_the_measured_rate():
    """CUBIC's multiplicative decrease: W_max = the measured rate, the new rate 0.7 × that."""
    state, _ = throttled_at(100.0)
    assert state.on is True
    assert 80 < state.w_max < 120, "the measured send rate"
    assert state.fill == pytest.approx(0.7 * state.w_max)


def test_the_rate_grows_back_along_the_cubic_curve():
    """W(t) = C (t - K)^3 + W_max: back at W_max after K seconds, above it later."""
    state, t0 = throttled_at(100.0)
    w_max = state.w_max
    k = (w_max * (1 - P.beta) / P.scale) ** (1 / 3)
    rates = []
    now = t0
    for _ in range(int((k + 2) * 100)):  # answers at 100/s keep the measured rate up
        now += 10
        state = observe(state, now, False, P)
        rates.append((now - t0, state.fill))
    at_k = min(rates, key=lambda r: abs(r[0] / 1000 - k))[1]
    assert at_k == pytest.approx(w_max, rel=0.02)
    assert rates[-1][1] > w_max
    assert all(b >= a - 1e-9 for (_, a), (_, b) in zip(rates, rates[1:])), "monotone growth"


def test_the_rate_never_falls_below_the_probe_floor():
    """Repeated throttles cannot stop the fleet: probes continue at ``minRate``."""
    settings = PacingSettings(min_rate=2.0)
    state = fresh()
    for t in range(0, 20_000, 100):
        state = observe(state, t, True, settings)
    assert state.fill == 2.0
    delays = []
    for _ in range(5):
        state, delay = reserve(state, 20_000, settings)
        delays.append(delay)
    assert delays == [0, 0, 500, 1000, 1500], "a bucket of two (2/s × 1 s), then one per 500 ms"


def test_the_allowed_rate_is_capped_at_twice_the_measured_rate_and_max_rate():
    """botocore's _MAX_RATE_ADJUST_SCALE, and the optional ceiling ``maxRate``."""
    state, now = throttled_at(10.0)
    for _ in range(6000):  # a long quiet climb with the measured rate at ~10/s
        now += 100
        state = observe(state, now, False, P)
    assert state.fill <= 2 * state.m_rate + 1e-9
    capped = PacingSettings(max_rate=3.0)
    state2, now2 = fresh(), 0.0
    state2 = observe(state2, 0.0, True, capped)
    for _ in range(600):
        now2 += 10
        state2 = observe(state2, now2, False, capped)
    assert state2.fill <= 3.0


def test_slots_are_spaced_at_the_fill_rate_after_a_burst_of_burst_s():
    """The bucket holds ``fill × burstS`` requests (at least one), then one per 1/fill s."""
    state = PacerState(on=True, fill=4.0, tat_ms=0.0, last_fail_ms=0.0)
    settings = PacingSettings(burst_s=1.0)
    delays = []
    for _ in range(7):
        state, delay = reserve(state, 10_000, settings)
        delays.append(delay)
    assert delays == [0, 0, 0, 0, 250, 500, 750]


def test_a_slot_is_reserved_no_earlier_than_the_request_goes():
    """``earliest_ms`` (a backoff or cooldown already known) moves the slot, and the next
    slot follows it."""
    state = PacerState(on=True, fill=1.0, tat_ms=0.0, last_fail_ms=0.0)
    state, delay = reserve(state, 1000, P, earliest_ms=5000)
    assert delay == 5000
    state, delay = reserve(state, 1000, P)
    assert delay == 6000


def test_the_pacer_lets_go_after_forget_after_ms_without_a_throttle():
    """No throttle for ``forgetAfterMs``: unpaced again."""
    settings = PacingSettings(forget_after_ms=10_000, min_rate=0.1)
    state = observe(fresh(), 0, True, settings)
    state, delay = reserve(state, 1, settings)
    state, delay = reserve(state, 1, settings)
    assert delay > 0
    state, delay = reserve(state, 10_001, settings)
    assert delay == 0 and state.on is False


def test_a_new_rate_rescales_the_reserved_backlog():
    """Slots reserved at the old rate are spread at the new one (botocore refills at the old
    rate before a new one applies)."""
    state = PacerState(on=True, fill=10.0, tat_ms=2000.0, last_fail_ms=0.0, m_rate=10.0, m_bucket=1000.0)
    after = observe(state, 1000.0, True, P)
    assert after.fill == pytest.approx(7.0)
    assert after.tat_ms == pytest.approx(1000 + 1000 * 10 / 7)


def test_no_delay_told_exceeds_400_days():
    """A far reservation is clipped to the sane maximum."""
    state = PacerState(on=True, fill=1.0, tat_ms=1e15, last_fail_ms=0.0)
    _, delay = reserve(state, 0, PacingSettings(forget_after_ms=7 * 86_400_000))
    assert delay == pacing.MAX_DELAY_MS


# -- settings ------------------------------------------------------------------------------

def test_pacing_settings_default_off_and_round_trip():
    """``retry.pacing`` is null (off) by default; ``{}`` is on with the defaults."""
    assert RetrySettings().pacing is None
    s = RetrySettings.from_json({"retry": {"pacing": {}}})
    assert s.pacing == PacingSettings() and s.pacing.enabled
    assert RetrySettings.from_json({"retry": s.to_json()}) == s
    full = PacingSettings(enabled=False, min_rate=1, max_rate=50, burst_s=2, beta=0.5, scale=1,
                          forget_after_ms=60_000)
    assert PacingSettings.from_json(full.to_json()) == full


@pytest.mark.parametrize("key, value", [
    ("minRate", 0), ("minRate", -1), ("minRate", float("nan")), ("minRate", "1"), ("minRate", True),
    ("maxRate", 0.1), ("burstS", 0), ("burstS", 61), ("beta", 1), ("beta", 0), ("scale", 0),
    ("forgetAfterMs", 10), ("forgetAfterMs", 1.5), ("enabled", "yes"),
])
def test_a_bad_pacing_value_names_its_key_and_value(key, value):
    """Validated like the other settings: the error names retry.pacing.KEY and the value."""
    with pytest.raises(SettingsError, match=rf"retry\.pacing\.{key}") as info:
        PacingSettings.from_json({key: value, **({"minRate": 0.5} if key == "maxRate" else {})})
    assert repr(value)[:10] in str(info.value)


def test_an_unknown_pacing_key_is_refused():
    """A typo is named."""
    with pytest.raises(SettingsError, match=r"retry\.pacing.*minrate"):
        PacingSettings.from_json({"minrate": 1})


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
