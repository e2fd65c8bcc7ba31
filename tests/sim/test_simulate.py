"""The fleet simulation (``fsm.sim``, ``python -m fsm simulate``; docs/simulation.md).

Small fleets only (N = 100-200): the figures at N = 10,000 belong to ``make bench``.
"""

from __future__ import annotations

import json
import random
import time

import pytest

from fsm.__main__ import main
from fsm.core.settings import RetrySettings, SettingsError
from fsm.sim import METRICS, POLICIES, SCENARIOS, simulate
from fsm.sim.policies import (AnthropicPython, GeminiCli, OpenAIPython, SeedByHand, Stamina,
                              TenacityCookbook)
from fsm.sim.svg import load_svg
from fsm.sim.targets import check
from fsm.sim.world import Answer, Provider

N = 100


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_seed_equals_the_hand_encoded_baseline(scenario):
    """The brain with the default settings does exactly what 2/4/8 s and give up does: the
    same figures, byte for byte, in the same run."""
    brain = simulate(scenario, "seed", sessions=N)
    hand = simulate(scenario, "seed_by_hand", sessions=N)
    assert json.dumps(brain.metrics) == json.dumps(hand.metrics)
    assert brain.sent_per_s == hand.sent_per_s


def test_two_runs_write_the_same_json_bytes(tmp_path):
    """``--json`` is reproducible byte for byte (also with worker processes), and has exactly
    the documented shape."""
    args = ["simulate", "--sessions", str(N), "--scenario", "brownout429",
            "--scenario", "outage30s", "--policy", "seed", "--policy", "resilient"]
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    assert main(args + ["--json", str(first)]) == 0
    assert main(args + ["--json", str(second)]) == 0
    assert first.read_bytes() == second.read_bytes()
    third = tmp_path / "c.json"
    assert main(args + ["--json", str(third), "--jobs", "2"]) == 0
    assert third.read_bytes() == first.read_bytes()
    data = json.loads(first.read_text())
    assert list(data) == ["scenarios"]
    assert list(data["scenarios"]) == ["brownout429", "outage30s"]
    for rows in data["scenarios"].values():
        assert list(rows) == ["ideal", "seed", "resilient"]
        for metrics in rows.values():
            assert list(metrics) == list(METRICS)
            assert 0 <= metrics["failure_rate"] <= 1


def test_a_different_seed_gives_different_traffic():
    """The seed drives the traffic: another seed, other figures (the test above can fail)."""
    a = simulate("brownout529", "seed", sessions=N, seed=1)
    b = simulate("brownout529", "seed", sessions=N, seed=2)
    assert a.sent_per_s != b.sent_per_s


def test_no_wall_clock_is_read(monkeypatch):
    """The simulation runs on virtual time only: every wall and monotonic clock raises."""
    def no_clock(*_a, **_k):
        raise AssertionError("the simulation read a clock")
    for name in ("time", "time_ns", "monotonic", "monotonic_ns", "perf_counter"):
        monkeypatch.setattr(time, name, no_clock)
    simulate("rpm_windows", "resilient", sessions=N)
    simulate("brownout529", "seed", sessions=N)


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s != "transient500"])
def test_the_ideal_never_fails_and_sends_each_call_once(scenario):
    """The clairvoyant ideal: no failure, one request per call, nothing wasted."""
    m = simulate(scenario, "ideal", sessions=N).metrics
    assert m["failure_rate"] == 0 and m["amplification"] == 1 and m["wasted_per_call"] == 0


def test_the_ideal_resends_a_random_500_at_once():
    """In transient500 the ideal sends about 1 % more requests than calls, and never fails."""
    m = simulate("transient500", "ideal", sessions=200).metrics
    assert m["failure_rate"] == 0
    assert 1.0 < m["amplification"] < 1.03


def test_the_seed_retries_into_a_known_usage_limit():
    """usage5h: the seed sends 1 + 3 requests per call into the exhausted credential; the
    resilient profile sends almost none (first requests refused at rest)."""
    seed = simulate("usage5h", "seed", sessions=N).metrics
    resilient = simulate("usage5h", "resilient", sessions=N).metrics
    assert seed["amplification"] == 4 and seed["failure_rate"] == 1
    assert resilient["amplification"] <= 0.1


def test_resilient_meets_its_targets_in_a_brownout_at_small_scale():
    """brownout529 with N = 200: the resilient profile fails nothing, sends at most 1.10
    requests per call, and never sends more in a second than the ideal does."""
    rows = {p: simulate("brownout529", p, sessions=200).metrics for p in ("ideal", "resilient", "seed")}
    verdicts = check("brownout529", rows)
    assert {v.metric for v in verdicts} >= {"failure_rate", "amplification", "peak_load_x_capacity"}
    failed = [v for v in verdicts if not v.ok]
    assert not failed, failed
    assert not all(v.ok for v in check("brownout529", rows, policy="seed"))


def test_the_provider_is_a_token_bucket_with_one_second_of_burst():
    """C = 10/s for N = 100: 10 requests in one instant pass, the 11th is refused; one more
    token comes back after 100 ms."""
    p = Provider(SCENARIOS["transient500"], 100, seed=7)
    answers = [p.request(1000, i, 0, 0) for i in range(11)]
    assert sum(a.kind in ("ok", "server_error") for a in answers[:10]) == 10
    assert answers[10].kind == "overloaded" and answers[10].wasted
    assert p.request(1099, 0, 1, 0).kind == "overloaded"
    assert p.request(1100, 0, 1, 0).kind in ("ok", "server_error")


def test_the_windows_answer_with_the_exact_wait_until_the_reset():
    """rpm_windows: over the minute's limit the answer's retry-after-ms is the time left."""
    p = Provider(SCENARIOS["rpm_windows"], 100, seed=1)
    limit = p.window_limit
    for k in range(limit):
        assert p.request(100 * k, 0, k, 0).ok
    late = p.request(59_000, 0, 0, 1)
    assert late.kind == "window" and late.hint_ms == 1_000


def test_the_baselines_follow_their_sources():
    """Spot checks of each encoded schedule against its source's arithmetic."""
    rng = random.Random(3)
    plain, hinted = Answer("overloaded"), Answer("rate_limited", 130_000)
    assert [SeedByHand().delay_ms(n, plain, rng, 0, {}, {}) for n in (1, 2, 3, 4)] == [2000, 4000, 8000, None]
    assert OpenAIPython().delay_ms(1, hinted, rng, 0, {}, {}) is None      # over 120 s: no retry
    assert AnthropicPython().delay_ms(1, hinted, rng, 0, {}, {}) == 130_000
    assert 375 <= OpenAIPython().delay_ms(1, plain, rng, 0, {}, {}) <= 500
    assert OpenAIPython().delay_ms(3, plain, rng, 0, {}, {}) is None
    assert TenacityCookbook().delay_ms(1, plain, rng, 0, {}, {}) == 1000
    assert TenacityCookbook().delay_ms(6, plain, rng, 0, {}, {}) is None
    assert Stamina().delay_ms(2, plain, rng, 45_000, {}, {}) is None
    assert 200 <= Stamina().delay_ms(2, plain, rng, 0, {}, {}) <= 1200
    state: dict = {}
    first = GeminiCli().delay_ms(1, plain, rng, 0, state, {})
    assert 3500 <= first <= 6500 and state["current"] == 10_000
    assert GeminiCli().delay_ms(1, Answer("usage_limit", 301_000), rng, 0, {}, {}) is None


def test_the_resilient_profile_is_a_settings_value():
    """``retry.profile: "resilient"`` sets its values below the top-level keys; ``seed`` is
    the default and changes nothing; an unknown profile is refused naming the key."""
    r = RetrySettings.from_json({"retry": {"profile": "resilient", "maxRetries": 7}})
    assert (r.max_retries, r.retry_hints, r.jitter, r.max_elapsed_ms) == (7, "honor", "full", 600_000)
    assert RetrySettings.from_json({"retry": {"profile": "seed"}}) == RetrySettings()
    with pytest.raises(SettingsError, match="retry.profile"):
        RetrySettings.from_json({"retry": {"profile": "fast"}})


def test_a_users_settings_file_is_a_policy(tmp_path, capsys):
    """``--settings FILE`` adds the policy ``settings``; a bad file exits 2 naming the key."""
    good = tmp_path / "s.json"
    good.write_text(json.dumps({"retry": {"maxRetries": 5, "retryHints": "honor"}}))
    out = tmp_path / "o.json"
    assert main(["simulate", "--sessions", "50", "--scenario", "outage30s", "--settings", str(good),
                 "--policy", "settings", "--json", str(out)]) == 0
    assert list(json.loads(out.read_text())["scenarios"]["outage30s"]) == ["ideal", "settings"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"retry": {"maxRetries": -1}}))
    assert main(["simulate", "--settings", str(bad)]) == 2
    assert "retry.maxRetries" in capsys.readouterr().err
    assert main(["simulate", "--policy", "nobody"]) == 2


def test_the_picture_draws_every_policy_and_the_capacity():
    """The SVG has one line per policy, a legend entry for each, and the capacity line."""
    results = [simulate("outage30s", p, sessions=50) for p in ("ideal", "seed")]
    svg = load_svg("outage30s", "an outage", results)
    assert svg.startswith("<svg") and svg.count("<polyline") == 2
    assert ">ideal</text>" in svg and ">seed</text>" in svg and "capacity C" in svg


def test_every_policy_name_runs():
    """Each named policy runs a tiny fleet through transient 500s: every call ends, almost
    all of them well."""
    for policy in POLICIES:
        m = simulate("transient500", policy, sessions=20).metrics
        assert m["failure_rate"] < 0.05 and m["amplification"] >= 1.0, (policy, m)


def test_the_resilient_policy_is_the_library_profile_with_one_coordinator():
    """The resilient policy runs retry.profile "resilient" as shipped (budget in wait mode,
    pacing on) with one coordinator for the whole fleet, on the loop's epoch clock
    (docs/simulation.md "The resilient policy")."""
    from fsm.core.settings import profile_settings
    from fsm.sim.engine import PROCESSES, VirtualClock
    from fsm.sim.policies import BrainPolicy, Messages, make_brain_factory
    from fsm.sim.run import resilient_settings

    settings = resilient_settings()
    assert settings == profile_settings("resilient")
    assert settings.budget is not None and settings.budget.waits and settings.pacing is not None
    clock = VirtualClock()
    clock.now = 1234
    policy = BrainPolicy(settings, Messages(), clock, "fleet")
    make = make_brain_factory(policy, 1)
    a, b = make(0, None, None), make(1, None, None)
    assert a.coord is b.coord is not None
    assert a.coord.now_ms() == a.loop().now_ms() == 1_767_225_601_234
    per_process = BrainPolicy(settings, Messages(), clock, "process")
    assert per_process.coordinator(0) is not per_process.coordinator(1)
    assert per_process.coordinator(0) is per_process.coordinator(PROCESSES)


def test_the_pacing_gate_spaces_first_requests_after_a_throttle():
    """After two 529s (more than a lone throttle, SPEC §15.7) cut the fleet's pacer to its
    floor (1/s), first requests go through the loop's gate: one slot a second, and beyond the
    2 s horizon a re-check after recheckMs × U(0.5, 1.5) (docs/fleet.md "Pacing")."""
    from fsm.sim.engine import SEND, VirtualClock, WAIT
    from fsm.sim.policies import BrainPolicy, Messages, make_brain_factory
    from fsm.sim.run import resilient_settings

    clock = VirtualClock()
    policy = BrainPolicy(resilient_settings(), Messages(), clock, "fleet")
    make = make_brain_factory(policy, 1)
    first, other = make(0, None, None), make(5, None, None)
    assert first.start(0) == (SEND, 0, 0)            # not pacing before a throttle
    assert other.start(0) == (SEND, 0, 0)
    clock.now = 200
    assert first.answered(200, Answer("overloaded", None, True))[0] == WAIT
    assert not first.coord.pacer_state(policy.key).on, "a lone throttle engages nothing"
    assert other.answered(200, Answer("overloaded", None, True))[0] == WAIT
    assert first.coord.pacer_state(policy.key).on
    sessions = [make(i, None, None) for i in range(1, 5)]
    steps = [s.start(200) for s in sessions]
    assert [s[:2] for s in steps[:3]] == [(SEND, 200), (WAIT, 1200), (WAIT, 2200)]
    recheck = policy.settings.pacing.recheck_ms
    what, at, _ = steps[3]
    assert what == WAIT and 200 + recheck // 2 <= at <= 200 + recheck * 3 // 2
    clock.now = 1200
    assert sessions[1].timer(1200, steps[1][2]) == (SEND, 1200, 0)  # booked: goes at its slot


def test_the_brain_policies_run_the_one_loop():
    """seed, resilient and a user's settings run each call through fsm.host.loop.RetryLoop on
    the virtual clock; the seed uses no coordinator (docs/simulation.md "Policies")."""
    from fsm.host.loop import RetryLoop
    from fsm.sim.engine import DONE_FAIL, DONE_OK, SEND, VirtualClock, WAIT
    from fsm.sim.policies import BrainPolicy, BrainRetrier, Messages

    clock = VirtualClock()
    clock.now = 1234
    seed = BrainRetrier(BrainPolicy(RetrySettings(), Messages(), clock, None), 0, random.Random(1))
    loop = seed.loop()
    assert isinstance(loop, RetryLoop) and loop.now_ms() == 1_767_225_601_234
    assert seed.coord is None and not loop.uses_coordinator()
    assert seed.start(1234) == (SEND, 1234, 0)
    what, at, token = seed.answered(1434, Answer("overloaded"))
    assert what == WAIT and at >= 1434 + 1000          # the seed's first backoff (2 s ± jitter)
    assert seed.timer(at, token) == (SEND, at, 0)
    assert seed.answered(at + 2000, Answer("ok")) == (DONE_OK, at + 2000, 0)
    exhausted = BrainRetrier(BrainPolicy(RetrySettings(max_retries=0), Messages(), clock, None),
                             0, random.Random(1))
    exhausted.start(0)
    assert exhausted.answered(200, Answer("overloaded"))[0] == DONE_FAIL
    honor = BrainRetrier(BrainPolicy(RetrySettings(retry_hints="honor"), Messages(), clock, "fleet"),
                         0, random.Random(1))
    assert honor.coord is not None and honor.loop().uses_coordinator()


def test_simulate_refuses_a_folder_as_json_before_simulating(tmp_path, capsys, monkeypatch):
    """--json DIR (a folder) exits 2 with one line before any simulation runs."""
    import fsm.commands.simulate as cmd
    monkeypatch.setattr(cmd, "_one", lambda job: pytest.fail("simulated before checking --json"))
    assert main(["simulate", "--sessions", "10", "--scenario", "outage30s",
                 "--json", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a folder" in err[0] and str(tmp_path) in err[0]
    assert main(["simulate", "--sessions", "10", "--json", str(tmp_path / "no" / "o.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_simulate_refuses_an_existing_file_as_svg_before_simulating(tmp_path, capsys,
                                                                     monkeypatch):
    """--svg FILE (an existing file) exits 2 with one line before any simulation runs."""
    import fsm.commands.simulate as cmd
    monkeypatch.setattr(cmd, "_one", lambda job: pytest.fail("simulated before checking --svg"))
    f = tmp_path / "pic.svg"
    f.write_text("x")
    assert main(["simulate", "--sessions", "10", "--scenario", "outage30s", "--svg", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a file" in err[0] and str(f) in err[0]
    assert f.read_text() == "x"


def test_simulate_runs_the_settings_policy_whenever_settings_is_given(tmp_path, capsys):
    """--settings FILE with --policy seed runs the user's settings too, and says so in one line."""
    good = tmp_path / "s.json"
    good.write_text(json.dumps({"retry": {"maxRetries": 5}}))
    out = tmp_path / "o.json"
    assert main(["simulate", "--sessions", "20", "--scenario", "outage30s", "--settings", str(good),
                 "--policy", "seed", "--json", str(out)]) == 0
    assert list(json.loads(out.read_text())["scenarios"]["outage30s"]) == ["ideal", "seed",
                                                                           "settings"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'also running the policy "settings"' in err[0]


def test_simulate_help_says_what_each_policy_name_means(capsys):
    """--help names and explains every policy: ideal, seed, seed_by_hand, resilient, settings,
    each baseline."""
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = capsys.readouterr().out
    policies = text[text.index("Policies:"):]
    for name in (*POLICIES, "settings"):
        assert f"{name} (" in policies or f"{name}," in policies or f"{name}\n" in policies \
            or f"{name} " in policies, name
    assert "clairvoyant" in policies and "by hand" in policies and "--settings" in policies


def test_a_settings_file_with_pacing_is_paced_per_process():
    """``--settings`` with a pacing block runs the pacer (one per process, as rpc without
    --redis): its figures differ from the same settings without it."""
    honor = {"retryHints": "honor", "maxRetries": 8}
    plain = simulate("brownout529", "settings", sessions=200,
                     settings=RetrySettings.from_json({"retry": honor}))
    paced = simulate("brownout529", "settings", sessions=200,
                     settings=RetrySettings.from_json({"retry": {**honor, "pacing": {}}}))
    assert paced.metrics != plain.metrics
    assert paced.metrics["amplification"] < plain.metrics["amplification"]


def test_live_brownout_runs_only_when_named(tmp_path):
    """``live_brownout`` (the world ``make bench`` also runs live, docs/simulation.md "Live
    against simulated") is left out of the default run and runs when named."""
    from fsm.sim.world import DEFAULT_SCENARIOS

    every, named = tmp_path / "every.json", tmp_path / "named.json"
    assert main(["simulate", "--sessions", "20", "--policy", "seed", "--json", str(every)]) == 0
    assert list(json.loads(every.read_text())["scenarios"]) == list(DEFAULT_SCENARIOS)
    assert "live_brownout" in SCENARIOS and "live_brownout" not in DEFAULT_SCENARIOS
    assert main(["simulate", "--sessions", "20", "--scenario", "live_brownout", "--policy",
                 "resilient", "--json", str(named)]) == 0
    rows = json.loads(named.read_text())["scenarios"]["live_brownout"]
    assert list(rows) == ["ideal", "resilient"] and rows["resilient"]["amplification"] >= 1


def test_a_missed_target_is_reported_and_the_exit_status_stays_0(capsys):
    """docs/simulation.md "Targets": a verdict that says MISSED is a report; the run exits 0
    (2 only for bad arguments or an output that cannot be written). At N = 20 in
    ``transient500`` the resilient profile misses the peak (one request more in a second of C =
    2 is half a C)."""
    assert main(["simulate", "--sessions", "20", "--scenario", "transient500",
                 "--policy", "resilient"]) == 0
    out = capsys.readouterr().out
    assert "peak_load_x_capacity" in out and " MISSED (" in out, out


def test_simulate_help_states_the_exit_status(capsys):
    """``simulate --help`` says what the exit status is, a missed target included."""
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Exit status: 0 when the run completes, also when a verdict says MISSED" in text
    assert "2 for bad arguments or an output (--json, --svg) that cannot be written" in text
