#!/usr/bin/env python3
"""``make bench``: measure the retry brain against baselines from the same run.

Runs each figure group in its own Python process (so one group's heap, GC state and peak RSS
do not leak into another's), prints a table of figures against their targets and writes
``build/bench.json``::

    {"machine": {...}, "duration_s": ..., "figures": {name: {"value", "unit", "group",
     "target", "pass"}}, "missed": [...], "errors": {...}}

Usage: ``python benchmarks/run.py [--quick] [--only GROUP ...] [--out PATH] [--strict]``.
Exit status: 0 when every group ran (missed targets are reported, not failed, unless
``--strict``: then 3); 1 when a group crashed or timed out. Groups: see :data:`GROUPS`.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GROUPS: dict[str, dict] = {
    # group: {"full": measure() kwargs, "quick": kwargs for --quick, "timeout": s}
    "memory": {"full": {}, "quick": {"alive": 2_000, "repeat": 3}, "timeout": 120},
    "decision": {"full": {"number": 300, "repeat": 11},
                 "quick": {"number": 30, "repeat": 3, "warmup": 10}, "timeout": 360},
    "transition": {"full": {"repeat": 15},
                   "quick": {"number": 2_000, "repeat": 3, "warmup": 200}, "timeout": 120},
    "classification": {"full": {"number": 300, "repeat": 11, "big_repeat": 5},
                       "quick": {"number": 20, "repeat": 3, "big_size": 100_000, "big_repeat": 1},
                       "timeout": 300},
    "sessions": {"full": {"rounds": 5}, "quick": {"n": 1_000, "rounds": 1}, "timeout": 300},
    "hints": {"full": {}, "quick": {}, "timeout": 120},
    "rpc": {"full": {"starts": 15, "trials": 80, "eof_starts": 30},
            "quick": {"starts": 3, "trials": 5, "eof_starts": 5}, "timeout": 240},
    "fleet": {"full": {}, "quick": {"number": 200, "warmup": 20, "sessions": 50, "sim_sessions": 1_000,
                                    "stress_sessions": 200},
              "timeout": 1_200},
    "stores": {"full": {}, "quick": {"sessions": 20_000, "calls": 5, "marks": 50}, "timeout": 120},
    "runner": {"full": {}, "quick": {"number": 200, "repeat": 3, "warmup": 20}, "timeout": 180},
    "transport": {"full": {}, "quick": {"number": 30, "repeat": 3, "warmup": 5}, "timeout": 180},
    "genai": {"full": {}, "quick": {"number": 20, "repeat": 3, "warmup": 5}, "timeout": 300},
    "integration_litellm": {"full": {}, "quick": {"number": 10, "repeat": 3, "warmup": 3},
                            "timeout": 900},
    "integrations": {"full": {}, "quick": {"number": 10, "repeat": 3, "warmup": 3},
                     "timeout": 900},
    "pacing": {"full": {}, "quick": {"compare": False}, "timeout": 400},
    "fleet10k": {"full": {}, "quick": {"calls": 2_000}, "timeout": 900},
    "audit": {"full": {"size_mb": 100}, "quick": {"size_mb": 5}, "timeout": 300},
    "live": {"full": {}, "quick": {}, "timeout": 600},
}

# name: (comparison, limit, note); "in": limit is (low, high), both included
TARGETS: dict[str, tuple[str, Any, str]] = {
    "decision_ratio_vs_tenacity": ("<=", 0.5, ""),
    "brain_bytes": ("<=", 6_000, ""),
    "brain_create_growth_vs_plain": ("<=", 1.25, "flat creation: growth 1k→10k over a plain "
                                     "__slots__ object's (threshold ours)"),
    "storm_lateness_ratio_vs_tenacity": ("<=", 0.5, "10,000 failures in one loop iteration, "
                                         "ours ÷ tenacity.AsyncRetrying's p99 lateness"),
    "timer_lateness_p99_ms_spread_5s": ("<=", 10, "10,000 sessions, failures spread over 5 s"),
    "abort_latency_p99_us": ("<=", 1_000, ""),
    "classify_ratio_vs_original": ("<=", 0.3, "mean per corpus message, ours / the original's "
                                   "patterns in Python re, same run"),
    "classify_1mb_ms": ("<=", 50, ""),
    "wasted_requests_honor": ("<=", 0, "requests sent before the server's hint, retryHints honor"),
    "rpc_ready_ms": ("<=", 300, ""),
    "rpc_abort_retry_to_end_ms": ("<=", 1, ""),
    "runner_ratio_vs_tenacity": ("<=", 0.7, "CPU per retried call (one failure, then success)"),
    "transport_ratio_vs_httpx2": ("<=", 1.1, "client CPU per loopback success, the retry "
                                  "transport ÷ the bare httpx2 transport"),
    "rpc_unclean_exits": ("<=", 0, "the rpc process must exit with status 0 on EOF (check ours)"),
    "coordinator_decision_us_p99": ("<=", 50_000, "Redis on loopback, inside the shell's 50 ms "
                                    "coordinator timeout"),
    "coordinator_decision_us_p99_cluster": ("<=", 50_000, "the same on a three-master Redis "
                                            "Cluster on loopback (redis+cluster://)"),
    "fleet_amplification": ("<=", 1.2, "4 processes x 250 sessions, full outage, budget on"),
    "fleet_requests_in_cooldown": ("<=", 0, ""),
    "sim_seed_mismatches": ("<=", 0, "python -m fsm simulate: seed = the hand-encoded 2/4/8 s "
                            "baseline in every scenario"),
    "store_after_prune_ratio": ("<=", 2, "JSON credential store: a call after 300k idle sessions "
                                "were pruned ÷ a call on a fresh store"),
    "store_loop_lag_ms_locked": ("<=", 50, "200 marks waiting on a lock another process holds"),
    "pacing_peak_ratio": ("<=", 2.0, "4 rpc --redis processes, resilient + pacing, demand 1.5x "
                          "capacity: highest 1-s bin of requests sent / capacity"),
    "pacing_chain_ends_lost": ("<=", 0, "auto_retry_start chains without their auto_retry_end"),
    "fleet_retries_10k": ("<=", 100, "10,000 concurrent runner calls, one healthy local Redis, "
                          "budget of 100 tokens: at most twice its bound of 50 retries"),
    "fleet_unavailable_10k": ("<=", 0, "coordinator_unavailable events of a healthy Redis "
                              "under that load"),
    "audit_events_100mb_s": ("<=", 30, "audit --events reading and checking a generated 100 MB "
                             "log of 64 interleaved sessions (linear: extrapolated under --quick)"),
    "live_vs_sim_failure_points": ("<=", 0.5, "live_brownout, 300 sessions in 4 runner processes "
                                   "on Redis, live vs simulate: |Δ failed calls|, points"),
    "live_vs_sim_amplification": ("<=", 0.05, "the same run: |Δ requests per call|"),
    "live_vs_sim_peak_ratio": ("in", (0.85, 1.15), "the same run: the highest 1-s bin of requests "
                               "÷ C at the provider, live ÷ simulated"),
}



def _simulation_targets() -> dict[str, tuple[str, Any, str]]:
    """The fleet simulation's targets (``python -m fsm simulate``, resilient profile, N =
    10,000 in the standard worlds, 1,000 in the stress worlds): absolutes, and ratios to the
    limits the ideal of the same run sets (SPEC §14.3, §15.8)."""
    from benchmarks.fleet import sim_figure_names
    from fsm.sim.world import DEFAULT_SCENARIOS as SCENARIOS  # live_brownout: benchmarks/live.py

    out: dict[str, tuple[str, Any, str]] = {}
    for scenario in SCENARIOS:
        for name, metric, limit in sim_figure_names(scenario):
            if limit is not None:
                out[name] = ("<=", limit, "")
            elif name.endswith("_peak_ratio_vs_limit"):
                out[name] = ("<=", 1.0, "peak load ÷ (the ideal's peak + 0.1; cap005: + 0.5), same run")
            elif name.endswith("_drain_ratio_vs_limit"):
                out[name] = ("<=", 1.0, "drain ÷ (2 × the ideal's + 10 s), same run")
            else:
                out[name] = ("<=", 1.0, "mean added latency ÷ (2 × the ideal's + 1 s), same run")
    return out


TARGETS.update(_simulation_targets())

# The order of the table: the brief's figures first, then the ones that explain them.
ORDER = (
    "decision_us", "tenacity_us", "decision_ratio_vs_tenacity", "decision_preclassified_us",
    "decision_short_us", "decision_transitions_us", "decision_transitions_ratio_vs_tenacity",
    "transition_us", "dict_baseline_us", "transition_ratio_vs_dict",
    "brain_bytes", "session_bytes", "brain_create_us_1k", "brain_create_us_10k",
    "brain_create_growth", "plain_create_us_1k", "plain_create_us_10k",
    "brain_create_growth_vs_plain",
    "sessions_10k_s", "sessions_create_s", "timer_lateness_p50_ms", "timer_lateness_p99_ms",
    "timer_lateness_max_ms", "timer_lateness_p99_worst_ms", "timer_creation_spread_ms",
    "tenacity_lateness_p99_ms", "storm_lateness_ratio_vs_tenacity", "timer_lateness_p99_ms_spread_5s",
    "abort_latency_p50_us", "abort_latency_p99_us", "abort_latency_max_us",
    "abort_release_all_ms", "rss_start_mb", "peak_rss_mb",
    "classify_ratio_vs_original", "classify_us_mean", "original_us_mean",
    "classify_us_median", "classify_us_p90", "classify_us_max", "classify_corpus_pass",
    "original_corpus_pass", "classify_1mb_ms",
    "wasted_requests_seed", "wasted_requests_honor", "requests_seed", "requests_honor",
    "hint_recovery_ratio_honor",
    "rpc_ready_ms", "rpc_ready_max_ms", "python_ready_ms", "rpc_unclean_exits", "rpc_exits",
    "rpc_abort_retry_to_end_ms", "rpc_abort_retry_to_end_p90_ms",
    "rpc_abort_retry_to_end_max_ms", "rpc_get_state_roundtrip_ms", "pipe_echo_ms",
    "coordinator_decision_us_p50", "coordinator_decision_us_p99", "coordinator_decision_us_max",
    "coordinator_decision_us_p50_inprocess", "coordinator_decision_us_p99_inprocess",
    "coordinator_decision_us_p50_cluster", "coordinator_decision_us_p99_cluster",
    "fleet_amplification", "fleet_amplification_no_budget", "fleet_requests_in_cooldown",
    "fleet_requests_in_cooldown_unshared", "sim_seed_mismatches", "sim_seconds",
    "store_call_ms_empty", "store_prune_ms", "store_call_ms_after_prune", "store_after_prune_ratio",
    "store_loop_lag_ms_locked",
    "runner_us", "tenacity_runner_us", "stamina_us", "runner_ratio_vs_tenacity",
    "runner_ratio_vs_stamina", "runner_recorded_us",
    "transport_us", "httpx2_transport_us", "transport_ratio_vs_httpx2", "transport_sync_us",
    "httpx2_transport_sync_us", "transport_sync_ratio_vs_httpx2",
    "genai_us", "genai_bare_us", "genai_ratio_vs_bare", "genai_async_us", "genai_async_bare_us",
    "genai_async_ratio_vs_bare",
    "litellm_us", "litellm_bare_us", "litellm_ratio_vs_bare", "litellm_us_sync",
    "litellm_bare_us_sync", "litellm_ratio_vs_bare_sync",
    *(f"{name}_{figure}" for name in ("tenacity_strategy", "langchain", "langgraph", "pydantic_ai",
                                      "openai_agents") for figure in ("us", "bare_us", "ratio_vs_bare")),
    "pacing_peak_ratio", "pacing_peak_ratio_unpaced", "pacing_refused_per_call",
    "pacing_refused_per_call_unpaced", "pacing_chain_ends_lost",
    "fleet_admit_p99_ms_10k", "fleet_unknown_share_10k", "fleet_retries_10k", "fleet_unavailable_10k",
    "fleet_script_calls_10k", "fleet_redis_ms_per_script_10k",
    "audit_events_100mb_s", "audit_events_mib_per_sec", "audit_events_log_mb",
    "live_vs_sim_failure_points", "live_vs_sim_amplification", "live_vs_sim_peak_ratio",
    "live_failure_rate", "sim_failure_rate", "live_amplification", "sim_amplification",
    "live_peak_load_x_capacity", "sim_peak_load_x_capacity", "live_added_latency_mean_s",
    "sim_added_latency_mean_s", "live_start_late_p99_ms", "live_loop_lag_p99_ms",
    "live_unknown_share", "live_seconds",
)
ORDER += tuple(name for name in TARGETS if name.startswith("sim_") and name not in ORDER)


def unit_of(name: str) -> str:
    for suffix, unit in (("_us", "µs"), ("_ms", "ms"), ("_s", "s"), ("_bytes", "bytes"),
                         ("_mb", "MiB"), ("_chars", "chars")):
        if name.endswith(suffix):
            return unit
    if "_us_" in name:
        return "µs"
    if "_ms_" in name:
        return "ms"
    if "ratio" in name or "growth" in name:
        return "×"
    return ""


def check(name: str, value: float) -> tuple[str | None, bool | None]:
    if name not in TARGETS:
        return None, None
    op, limit, _ = TARGETS[name]
    if op == "in":
        low, high = limit
        return f"in {low:g}–{high:g}", low <= value <= high
    ok = value <= limit if op == "<=" else value >= limit
    return f"{op} {limit:g}", ok


def machine() -> dict:
    info = {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
    }
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import tenacity
        import transitions
        info["transitions"] = transitions.__version__
        info["tenacity"] = getattr(tenacity, "__version__", None) or _dist_version("tenacity")
    except Exception:  # the figures say more than a missing version string
        pass
    return info


def _dist_version(name: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def measure_group(group: str, quick: bool) -> dict[str, float]:
    """Run one group in this process and return its figures."""
    module = importlib.import_module(f"benchmarks.{group}")
    spec = GROUPS[group]
    return module.measure(**(spec["quick"] if quick else spec["full"]))


def run_child(group: str, quick: bool) -> tuple[dict[str, float] | None, str | None, float]:
    """Run one group in a fresh interpreter; returns (figures, error, seconds)."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", group]
    if quick:
        argv.append("--quick")
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                              timeout=GROUPS[group]["timeout"])
    except subprocess.TimeoutExpired:
        return None, f"timed out after {GROUPS[group]['timeout']} s", time.monotonic() - t0
    took = time.monotonic() - t0
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-12:]
        return None, f"exit {proc.returncode}: " + "\n".join(tail), took
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1]), None, took
    except (ValueError, IndexError):
        return None, f"no JSON on stdout: {proc.stdout[-500:]!r}", took


def fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def table(figures: dict[str, dict]) -> str:
    names = [n for n in ORDER if n in figures] + sorted(n for n in figures if n not in ORDER)
    rows = [("figure", "value", "unit", "target", "")]
    for n in names:
        f = figures[n]
        mark = "" if f["pass"] is None else ("PASS" if f["pass"] else "MISS")
        rows.append((n, fmt(f["value"]), f["unit"], f["target"] or "", mark))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = []
    for k, r in enumerate(rows):
        lines.append("  ".join((r[0].ljust(widths[0]), r[1].rjust(widths[1]), r[2].ljust(widths[2]),
                                r[3].ljust(widths[3]), r[4])).rstrip())
        if k == 0:
            lines.append("-" * len(lines[0]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes (a minute; figures are rough)")
    p.add_argument("--only", nargs="+", choices=sorted(GROUPS), metavar="GROUP",
                   help=f"run only these groups ({', '.join(GROUPS)})")
    p.add_argument("--out", default=str(ROOT / "build" / "bench.json"), help="JSON output path")
    p.add_argument("--strict", action="store_true", help="exit 3 when a target is missed")
    p.add_argument("--child", metavar="GROUP", choices=sorted(GROUPS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.child:
        print(json.dumps(measure_group(args.child, args.quick)))
        return 0

    started = time.monotonic()
    load_before = os.getloadavg()
    figures: dict[str, dict] = {}
    errors: dict[str, str] = {}
    seconds: dict[str, float] = {}
    for group in args.only or list(GROUPS):
        print(f"[bench] {group} …", file=sys.stderr, flush=True)
        values, err, took = run_child(group, args.quick)
        seconds[group] = round(took, 2)
        if err is not None:
            errors[group] = err
            print(f"[bench] {group} FAILED ({took:.1f} s): {err}", file=sys.stderr, flush=True)
            continue
        print(f"[bench] {group} done in {took:.1f} s", file=sys.stderr, flush=True)
        for name, value in values.items():
            target, ok = check(name, value)
            figures[name] = {"value": value, "unit": unit_of(name), "group": group,
                             "target": target, "pass": ok}
            if name in TARGETS and TARGETS[name][2]:
                figures[name]["note"] = TARGETS[name][2]
    duration = time.monotonic() - started
    missed = [n for n, f in figures.items() if f["pass"] is False]
    report = {
        "machine": machine(),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(duration, 1),
        "group_seconds": seconds,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "quick": args.quick,
        "figures": figures,
        "missed": missed,
        "errors": errors,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    m = report["machine"]
    print(f"retry-fsm benchmarks: {m['cpu_count']} CPUs, Python {m['python']}, "
          f"load average {load_before[0]:.2f} → {report['load_average']['after'][0]:.2f}"
          f"{' (quick sizes)' if args.quick else ''}")
    print(table(figures))
    print(f"\n{len(missed)} target(s) missed{': ' + ', '.join(missed) if missed else ''}; "
          f"{len(errors)} group error(s); {duration:.0f} s; written to {out}")
    if errors:
        return 1
    return 3 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
