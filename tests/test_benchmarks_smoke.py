"""Smoke test of ``make bench``: every figure group runs with tiny sizes and yields its figures.

Speed is not asserted here (benchmarks are not tests); only that each figure the benchmark
report promises exists and is a positive finite number, and that the runner formats them.
"""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import classification, decision, fleet, memory, rpc, run, sessions, transition
from benchmarks import runner as runner_bench


def assert_figures(figures: dict, keys: tuple[str, ...]) -> None:
    """``keys`` exist and are positive numbers; every other figure is a number ≥ 0 (counts of
    failures, such as ``rpc_unclean_exits``, may be 0)."""
    missing = [k for k in keys if k not in figures]
    assert not missing, f"missing figures {missing}; got {sorted(figures)}"
    for key, value in figures.items():
        assert isinstance(value, float | int) and not isinstance(value, bool), (key, value)
        assert math.isfinite(value) and value >= 0, f"{key} = {value!r} is not a number ≥ 0"
        if key in keys:
            assert value > 0, f"{key} = {value!r} is not a positive number"


def test_decision_vs_tenacity():
    """Decision vs tenacity."""
    figures = decision.measure(number=3, repeat=1, warmup=1, max_messages=3)
    assert_figures(figures, ("decision_us", "tenacity_us", "decision_ratio_vs_tenacity",
                             "decision_preclassified_us", "decision_short_us"))


def test_transition_vs_dict_table():
    """Transition vs dict table."""
    figures = transition.measure(number=50, repeat=1, warmup=5)
    assert_figures(figures, ("transition_us", "dict_baseline_us", "transition_ratio_vs_dict"))


def test_memory_and_creation():
    """Memory and creation."""
    figures = memory.measure(alive=200, small=100, large=400, repeat=1)
    assert_figures(figures, ("brain_bytes", "session_bytes", "brain_create_us_1k",
                             "brain_create_us_10k", "brain_create_growth_vs_plain"))


def test_classification():
    """Classification."""
    figures = classification.measure(number=2, repeat=1, warmup=1, limit=5, big_size=2_000,
                                     big_repeat=1, kinds=("mixed", "digits"))
    assert_figures(figures, ("classify_ratio_vs_original", "classify_us_median", "classify_1mb_ms",
                             "classify_1mb_ms_mixed", "classify_corpus_pass"))


def test_sessions():
    """Sessions."""
    figures = sessions.measure(n=30, base_delay_ms=20, rounds=1)
    assert_figures(figures, ("sessions_10k_s", "timer_lateness_p99_ms", "abort_latency_p99_us",
                             "peak_rss_mb", "tenacity_lateness_p99_ms",
                             "storm_lateness_ratio_vs_tenacity", "timer_lateness_p99_ms_spread_5s"))


@pytest.mark.subprocess
def test_fleet():
    """The coordinator's cost (on one Redis, in process and on a Redis Cluster, SPEC §15.10) and
    the simulation's figures always; the outage figures once the session takes a coordinator."""
    figures = fleet.measure(number=20, warmup=2, processes=1, sessions=2, spread_s=0.05,
                            sim_sessions=20, stress_sessions=20)
    keys = ("coordinator_decision_us_p50", "coordinator_decision_us_p99",
            "coordinator_decision_us_p50_inprocess", "coordinator_decision_us_p99_inprocess",
            "coordinator_decision_us_p50_cluster", "coordinator_decision_us_p99_cluster",
            "sim_brownout529_amplification", "sim_outage5min_peak_ratio_vs_limit", "sim_seconds",
            "sim_outage30min_amplification", "sim_flapping_amplification",
            "sim_lone_throttle_latency_ratio_vs_limit")
    assert figures["sim_seed_mismatches"] == 0
    assert figures["sim_outage30min_failure_rate_recoverable"] >= 0
    assert figures["sim_flapping_drain_ratio_vs_limit"] >= 0
    if fleet.integration_missing() is None:
        keys += ("fleet_amplification", "fleet_amplification_no_budget")
        assert "fleet_requests_in_cooldown" in figures
    assert_figures(figures, keys)


def test_hints_with_honor_waste_nothing_and_the_seed_wastes_some():
    """Hints with honor waste nothing and the seed wastes some."""
    from benchmarks import hints
    figures = hints.measure()
    assert_figures(figures, ("wasted_requests_seed", "hint_recovery_ratio_honor"))
    assert figures["wasted_requests_honor"] == 0 < figures["wasted_requests_seed"]
    assert 1.0 <= figures["hint_recovery_ratio_honor"] <= 1.2, "retries go out when the server said"


@pytest.mark.subprocess
def test_rpc():
    """RPC."""
    figures = rpc.measure(starts=1, trials=1, eof_starts=1)
    assert_figures(figures, ("rpc_ready_ms", "rpc_abort_retry_to_end_ms",
                             "rpc_get_state_roundtrip_ms", "pipe_echo_ms", "rpc_exits"))
    assert "rpc_unclean_exits" in figures


def test_no_two_groups_name_the_same_figure():
    """Figures are keyed by name in build/bench.json: the integrations group's names are its
    own (the decision group already reports ``tenacity_us``)."""
    from benchmarks import integrations
    names = [f"{key}_{figure}" for key in integrations.FRAMEWORKS
             for figure in ("us", "bare_us", "ratio_vs_bare")]
    assert len(set(run.ORDER)) == len(run.ORDER)
    assert set(names) <= set(run.ORDER) and "tenacity_us" not in names


def test_runner_checks_targets_and_formats_a_table():
    """Runner checks targets and formats a table."""
    figures = {}
    for name, value in (("decision_ratio_vs_tenacity", 0.25), ("classify_ratio_vs_original", 0.5),
                        ("decision_us", 12.5)):
        target, ok = run.check(name, value)
        figures[name] = {"value": value, "unit": run.unit_of(name), "target": target, "pass": ok}
    assert figures["decision_ratio_vs_tenacity"]["pass"] is True
    assert figures["classify_ratio_vs_original"]["pass"] is False
    assert figures["decision_us"]["pass"] is None and figures["decision_us"]["unit"] == "µs"
    text = run.table(figures)
    assert "PASS" in text and "MISS" in text and "decision_us" in text
    json.dumps(figures)  # JSON-able as written to build/bench.json
    assert set(run.TARGETS) <= set(run.ORDER)


def test_fleet_requests_in_cooldown_counts_only_retries_decided_after_another_process_learned():
    # process 0 learned at 100 a cooldown until 1000; process 1's session 0 failed (ended) at
    # 50 and retried at 500: decided before the cooldown was learned, not counted; its
    # session 1 ended at 200 and retried at 600 (inside, decided after): counted; its session
    # 2 ended at 200 and retried at 1000 (after the end): not counted.
    """Fleet requests in cooldown counts only retries decided after another process learned."""
    results = [
        {"calls": [[0, 0, 0, 90]], "learned": [[100, 1000]]},
        {"calls": [[0, 0, 0, 50], [0, 1, 500, 510], [1, 0, 0, 200], [1, 1, 600, 610],
                   [2, 0, 0, 200], [2, 1, 1000, 1010]], "learned": []},
    ]
    assert fleet._in_cooldown(results) == 1
    assert fleet._in_cooldown([results[1], results[0]]) == 1


def test_stores_prune_and_never_block_the_loop():
    """Stores prune and never block the loop."""
    from benchmarks import stores
    figures = stores.measure(sessions=2_000, calls=2, marks=10)
    assert_figures(figures, ("store_call_ms_empty", "store_prune_ms", "store_call_ms_after_prune",
                             "store_after_prune_ratio", "store_loop_lag_ms_locked"))


def test_runner_vs_tenacity_and_stamina():
    """Runner vs tenacity and stamina."""
    figures = runner_bench.measure(number=5, repeat=1, warmup=1)
    assert_figures(figures, ("runner_us", "tenacity_runner_us", "stamina_us",
                             "runner_ratio_vs_tenacity", "runner_ratio_vs_stamina",
                             "runner_recorded_us"))


def test_genai_wrapper_vs_the_bare_client():
    """Google Gen AI: the wrapper's round trip and the bare client's, sync and async, and their
    ratios (docs/integrations.md "Cost")."""
    from benchmarks import genai as genai_bench
    figures = genai_bench.measure(number=2, repeat=1, warmup=1)
    assert_figures(figures, ("genai_us", "genai_bare_us", "genai_ratio_vs_bare",
                             "genai_async_ratio_vs_bare"))


def test_litellm_integration_beside_bare_litellm():
    """The LiteLLM integration's round trip ÷ bare litellm's (docs/integrations.md "Cost"):
    both figures, sync and async, against the fault server."""
    from benchmarks import integration_litellm
    figures = integration_litellm.measure(number=2, repeat=1, warmup=1)
    assert_figures(figures, ("litellm_us", "litellm_bare_us", "litellm_ratio_vs_bare",
                             "litellm_us_sync", "litellm_bare_us_sync", "litellm_ratio_vs_bare_sync"))


def test_the_live_fleet_draws_the_simulated_traffic():
    """The live run's sessions are due when the simulation's are (docs/simulation.md "Live
    against simulated": the same seeds): with every call taking 8 s, the world's engine and
    :class:`benchmarks.live.Traffic` give the same calls at the same times, across the change
    of demand at 30 s."""
    from benchmarks.live import Traffic
    from fsm.sim import SCENARIOS
    from fsm.sim.engine import DONE_OK, run_world

    took = 8_000

    class Served:  # every call ends 8 s after it starts, nothing sent
        def start(self, t):
            return DONE_OK, t + took, 0

    world = SCENARIOS["live_brownout"]
    simulated = run_world(world, 40, 7, lambda *_: Served())
    demand = [[None if math.isinf(u) else u, f] for u, f in world.demand]
    live = []
    for i in range(40):
        traffic = Traffic(7, i, demand)
        due = traffic.first_due()
        for k in range(world.calls):
            live.append((due, due + took, True))
            if k + 1 < world.calls:
                due = traffic.next_due(due + took)
    assert sorted(live) == sorted(simulated.calls)
    assert any(start < 30_000 < end for start, end, _ in live), "calls end in the second phase"


@pytest.mark.subprocess
def test_live_against_simulated(monkeypatch):
    """The group's plumbing, end to end at the smallest size: a real Redis, the fault server's
    capacity mode, one runner process, one session with one call (due within 0.2 s: demand
    50× C; then the 2-s service time), the same world simulated. One accepted request either
    way, so the three figures are exact: no difference in failures or requests per call, the
    same peak (1 request ÷ C = 0.1)."""
    from benchmarks import live
    from fsm.sim import SCENARIOS
    from fsm.sim.world import Scenario

    monkeypatch.setitem(SCENARIOS, "live_smoke", Scenario(
        "live_smoke", 1, ((math.inf, 50.0),), "brownout529", "one call within 0.2 s"))
    figures = live.measure(sessions=1, processes=1, scenario="live_smoke")
    assert_figures(figures, ("live_vs_sim_peak_ratio", "live_amplification", "sim_amplification",
                             "live_peak_load_x_capacity", "live_seconds"))
    assert figures["live_vs_sim_failure_points"] == 0 == figures["live_vs_sim_amplification"]
    assert figures["live_vs_sim_peak_ratio"] == 1 and figures["live_peak_load_x_capacity"] == 10
    for name in ("live_vs_sim_failure_points", "live_vs_sim_amplification", "live_vs_sim_peak_ratio"):
        assert run.check(name, figures[name]) == (run.check(name, figures[name])[0], True)
    assert run.check("live_vs_sim_peak_ratio", 1.2) == ("in 0.85–1.15", False)


@pytest.mark.parametrize("name", ["tenacity_strategy", "langchain", "langgraph", "pydantic_ai",
                                  "openai_agents"])
def test_each_framework_integration_beside_its_bare_framework(name):
    """Each framework integration's call ÷ the bare framework's same call against the fault
    server (docs/integrations.md "Cost"): the three figures of that integration, no other."""
    from benchmarks import integrations
    assert name in integrations.FRAMEWORKS
    figures = integrations.measure(number=1, repeat=1, warmup=1, only=[name])
    keys = (f"{name}_us", f"{name}_bare_us", f"{name}_ratio_vs_bare")
    assert_figures(figures, keys)
    assert sorted(figures) == sorted(keys)
