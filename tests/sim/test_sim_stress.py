"""SPEC §15.8's stress worlds in ``python -m fsm simulate`` (docs/simulation.md "Stress worlds").

Small fleets only (N ≤ 100, the fixed 10 of ``lone_throttle``): the figures at N = 1,000 belong
to ``make bench``.
"""

from __future__ import annotations

import json

import pytest

from fsm.__main__ import main
from fsm.sim import METRICS, SCENARIOS, simulate
from fsm.sim.engine import Run
from fsm.sim.metrics import metrics_of
from fsm.sim.targets import best_peer, check
from fsm.sim.world import DEFAULT_SCENARIOS, STANDARD, STRESS, Provider

N = 60


def test_the_stress_worlds_follow_the_standard_ones_in_the_default_run():
    """Every world of SPEC §15.8's table is a scenario, after §14's seven, in the table's order."""
    assert STRESS == ("cap005", "cap02", "svc10s", "outage30min", "flapping", "proc1", "proc16",
                      "herd3x", "lone_throttle")
    assert list(DEFAULT_SCENARIOS) == [*STANDARD, *STRESS]
    assert set(SCENARIOS) - set(DEFAULT_SCENARIOS) == {"live_brownout"}  # run only when named
    assert len(STANDARD) == 7 and not any(SCENARIOS[s].stress for s in STANDARD)


def test_the_world_parameters_are_the_tables():
    """Capacity, service time, processes, K and recovery per world (docs/simulation.md)."""
    cap = {s: Provider(SCENARIOS[s], 1000, 1).capacity for s in ("cap005", "cap02", "brownout529")}
    assert cap == {"cap005": 50, "cap02": 200, "brownout529": 100}
    assert SCENARIOS["svc10s"].service_ms == 10_000 and SCENARIOS["brownout529"].service_ms == 2_000
    assert (SCENARIOS["proc1"].processes, SCENARIOS["proc16"].processes) == (1, 16)
    calls = {s: SCENARIOS[s].calls for s in STRESS}
    assert calls == {"cap005": 20, "cap02": 20, "svc10s": 20, "outage30min": 30, "flapping": 40,
                     "proc1": 20, "proc16": 20, "herd3x": 25, "lone_throttle": 20}
    herd = SCENARIOS["herd3x"]
    assert [herd.factor(t) for t in (59_999, 60_000, 179_999, 180_000)] == [0.5, 3.0, 3.0, 0.5]
    assert SCENARIOS["outage30min"].recovery_s == 1830 and SCENARIOS["flapping"].recovery_s == 630


def test_a_flapping_provider_is_down_20_s_then_up_20_s():
    """flapping: down from 30 s to 50 s, up to 70 s, ..., whole from 630 s; a request while
    down is a 503 or a 529 (both occur), certain to be refused."""
    p = Provider(SCENARIOS["flapping"], 100, seed=1)
    assert p.down_until(29_999) is None
    assert p.down_until(30_000) == 50_000 and p.down_until(49_999) == 50_000
    assert p.down_until(50_000) is None and p.down_until(69_999) is None
    assert p.down_until(70_000) == 90_000
    assert p.down_until(630_000) is None
    answers = [p.request(31_000, i, 0, 0) for i in range(40)]
    assert {a.kind for a in answers} == {"unavailable", "overloaded"}
    assert all(a.wasted for a in answers)
    assert p.request(55_000, 0, 1, 0).ok
    assert p.reserve(71_000) == 90_000  # the ideal waits for the next up period


def test_the_lone_caller_meets_exactly_one_throttle_whatever_n():
    """lone_throttle runs 10 sessions at C = 10/s whatever --sessions says; the first request
    after 60 s gets a 429 with retry-after: 1, and nothing else is refused."""
    p = Provider(SCENARIOS["lone_throttle"], 5000, seed=1)
    assert p.capacity == 10
    assert p.request(59_000, 0, 0, 0).ok
    first = p.request(61_000, 1, 0, 0)
    assert (first.kind, first.hint_ms, first.wasted) == ("rate_limited", 1000, True)
    assert p.request(61_500, 2, 0, 0).ok
    seed = simulate("lone_throttle", "seed", sessions=5000)
    assert seed.capacity == 10
    assert seed.metrics["wasted_per_call"] == pytest.approx(1 / 200)  # one refusal in 10 × 20 calls


def test_a_longer_service_time_is_not_counted_as_added_latency():
    """svc10s: an accepted request is answered after 10 s; added latency counts beyond it, so
    the ideal's calls that went at once added nothing."""
    m = simulate("svc10s", "ideal", sessions=N).metrics
    assert m["added_latency_p50_s"] == 0 and m["failure_rate"] == 0


def test_outage30min_counts_the_failures_of_the_calls_that_could_recover():
    """failure_rate_recoverable (outage30min only, after failure_rate): the calls that started
    at most 600 s before the recovery at 1,830 s, or later (SPEC §15.8)."""
    run = Run(SCENARIOS["outage30min"], 10, 1.0, recovery_ms=1_830_000)
    run.calls = [(100_000, 700_000, False),     # started too early to be recoverable
                 (1_229_999, 1_829_999, False),  # just too early
                 (1_230_000, 1_900_000, True), (1_500_000, 1_900_000, False),
                 (2_000_000, 2_002_000, True), (2_100_000, 2_102_000, True)]
    m = metrics_of(run)
    assert list(m) == ["failure_rate", "failure_rate_recoverable", *METRICS[1:]]
    assert m["failure_rate"] == 0.5 and m["failure_rate_recoverable"] == 0.25
    other = Run(SCENARIOS["outage5min"], 10, 1.0, recovery_ms=330_000)
    assert list(metrics_of(other)) == list(METRICS)


def test_the_per_process_state_follows_the_worlds_processes():
    """proc1 / proc16 put the sessions in 1 / 16 processes: a per-process retry quota
    (aws_standard) is shared by more sessions in proc1, so the two worlds differ for it;
    the traffic is brownout529's."""
    one = simulate("proc1", "aws_standard", sessions=N).metrics
    sixteen = simulate("proc16", "aws_standard", sessions=N).metrics
    assert one != sixteen
    assert simulate("proc16", "ideal", sessions=N).metrics == simulate("brownout529", "ideal", sessions=N).metrics


def test_the_stress_targets_add_the_drain_and_cap005s_peak_margin():
    """§15.8: drain ≤ 2 × the ideal's + 10 s in a stress world with a recovery; the peak's margin
    is 0.5 in cap005, 0.1 elsewhere; failures ≤ 0.5 % (outage30min: the recoverable calls ≤ 1 %)."""
    ideal = {"failure_rate": 0.0, "amplification": 1.0, "wasted_per_call": 0.0,
             "peak_load_x_capacity": 2.0, "added_latency_mean_s": 3.0, "drain_s": 10.0,
             "failure_rate_recoverable": 0.0}
    res = dict(ideal, peak_load_x_capacity=2.4, drain_s=31.0, failure_rate=0.2)
    limits = {v.metric: (v.limit, v.ok) for v in check("cap005", {"ideal": ideal, "resilient": res})}
    assert limits["peak_load_x_capacity"] == (2.5, True)
    assert limits["drain_s"] == (30.0, False)
    assert limits["failure_rate"] == (0.005, False)
    herd = {v.metric: v.limit for v in check("herd3x", {"ideal": ideal, "resilient": res})}
    assert herd["peak_load_x_capacity"] == pytest.approx(2.1)
    outage = {v.metric: v.ok for v in check("outage30min", {"ideal": ideal, "resilient": res})}
    assert "failure_rate" not in outage and outage["failure_rate_recoverable"]
    assert "drain_s" not in {v.metric for v in check("lone_throttle", {"ideal": ideal, "resilient": res})}
    assert "drain_s" not in {v.metric for v in check("brownout529", {"ideal": ideal, "resilient": res})}


def test_the_best_peer_has_the_fewest_failures_then_requests():
    """The peer printed beside the targets: fewest failures, then fewest requests per call;
    the seed, its hand encoding and the ideal are not peers."""
    rows = {"ideal": {"failure_rate": 0.0, "amplification": 1.0},
            "seed": {"failure_rate": 0.0, "amplification": 1.0},
            "stamina": {"failure_rate": 0.01, "amplification": 1.1},
            "gemini_cli": {"failure_rate": 0.0, "amplification": 1.3},
            "aws_standard": {"failure_rate": 0.0, "amplification": 1.2}}
    assert best_peer(rows) == "aws_standard"
    assert best_peer({"ideal": rows["ideal"]}) is None


def test_a_stress_run_prints_the_ideal_and_the_best_peer_and_repeats_byte_for_byte(tmp_path, capsys):
    """``python -m fsm simulate --scenario outage30min`` prints the verdicts beside the ideal's
    and the best peer's figures; its JSON has failure_rate_recoverable and is the same bytes
    twice."""
    args = ["simulate", "--sessions", "20", "--scenario", "outage30min", "--scenario",
            "lone_throttle", "--policy", "resilient", "--policy", "gemini_cli"]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(args + ["--json", str(a)]) == 0
    out = capsys.readouterr().out
    assert "best peer gemini_cli" in out and "failure_rate_recoverable" in out
    assert "(N = 10, C = 10 requests/s)" in out  # lone_throttle's own fleet
    assert main(args + ["--json", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes()
    data = json.loads(a.read_text())["scenarios"]
    assert list(data["outage30min"]["resilient"])[:2] == ["failure_rate", "failure_rate_recoverable"]
    assert "failure_rate_recoverable" not in data["lone_throttle"]["resilient"]
