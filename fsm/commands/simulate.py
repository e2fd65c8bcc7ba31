"""``python -m fsm simulate``: the fleet near the clairvoyant limit, measured (docs/simulation.md).

Runs the standard scenarios against the policies in a deterministic, virtual-time simulation
(the real brain and coordinators; no wall clock is read) and prints one table per scenario:

.. code-block:: console

    $ python -m fsm simulate                                   # every scenario and policy, N = 1000
    $ python -m fsm simulate --sessions 10000 --json out.json  # the figures as JSON
    $ python -m fsm simulate --scenario brownout529 --policy seed --policy resilient
    $ python -m fsm simulate --settings my-settings.json --svg build/sim

``--json FILE`` writes ``{"scenarios": {SCENARIO: {POLICY: {"failure_rate", "amplification",
"wasted_per_call", "added_latency_p50_s", "added_latency_p99_s", "added_latency_mean_s",
"peak_load_x_capacity", "drain_s"}}}}`` (failure_rate as a fraction; ``outage30min`` adds
"failure_rate_recoverable" after it); two runs with the same
arguments write the same bytes. ``--svg DIR`` draws each scenario's load over time against
capacity (``DIR/SCENARIO.svg``). ``--settings FILE`` adds the policy ``settings``: the brain
with that file's settings (one in-process coordinator per process); it runs whenever
``--settings`` is given, also next to the ``--policy`` names chosen. The ideal always runs:
the resilient profile's targets, printed under each table beside the ideal's and the best
peer's figures, are measured against it. The stress worlds (cap005, cap02, svc10s,
outage30min, flapping, proc1, proc16, herd3x, lone_throttle) run after the standard ones. Exit
status: 0 when the run completes, also when a verdict says MISSED (the verdicts report; make
bench is where a missed target counts); 2 for bad arguments or an output (--json, --svg) that
cannot be written.

Policies: ideal (clairvoyant: each request is sent at the earliest instant the provider will
accept it; the yardstick); seed (this brain with the default settings: the original's behaviour, no
coordinator); seed_by_hand (the same schedule written out by hand: 2 s, 4 s, 8 s, then give
up); resilient (the brain with retry.profile "resilient", one coordinator and a pacer shared by the
fleet); settings (the brain with the --settings file); and the baselines, other clients'
default retry: openai_python, anthropic_python, tenacity_cookbook, stamina, gemini_cli,
aws_standard (docs/simulation.md).
"""

from __future__ import annotations

import argparse
import json
import re
import os
import sys

from fsm.commands.common import output_file_problem, write_output_file

HELP = "simulate a fleet against one provider's faults: failures, load and waiting per policy"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from fsm.sim import POLICIES, SCENARIOS
    from fsm.sim.world import NOT_BY_DEFAULT

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    # the module docstring without its summary and its ReST directive lines (.. code-block::)
    parser.epilog = re.sub(r"^\.\. [\w-]+::? ?.*\n\n?", "", __doc__.split("\n", 2)[2],
                           flags=re.M).replace("``", "").replace("::", ":")
    parser.add_argument("--sessions", type=int, default=1000, metavar="N",
                        help="the fleet's size N (capacity C = 0.1 × N requests/s; default 1000); "
                             "lone_throttle runs its 10 sessions whatever N")
    parser.add_argument("--scenario", action="append", choices=list(SCENARIOS), metavar="NAME",
                        help=f"run only this scenario (repeatable): {', '.join(SCENARIOS)} "
                             f"(default: all but {', '.join(sorted(NOT_BY_DEFAULT))})")
    parser.add_argument("--policy", action="append", metavar="NAME",
                        help=f"run only this policy (repeatable): {', '.join(POLICIES)}, settings "
                             "(what each is: see Policies below; the ideal always runs, and "
                             "settings whenever --settings is given)")
    parser.add_argument("--settings", metavar="FILE",
                        help='add the policy "settings": the brain with this settings file')
    parser.add_argument("--seed", type=int, default=1, help="the random seed (default 1)")
    parser.add_argument("--json", metavar="FILE", help="write the figures as JSON to FILE")
    parser.add_argument("--svg", metavar="DIR", help="draw DIR/SCENARIO.svg: load over time vs capacity")
    parser.add_argument("--jobs", type=int, default=1, metavar="J",
                        help="run J simulations at once in worker processes (default 1); the "
                             "figures do not depend on it")


def _fmt(metric: str, value: float) -> str:
    if metric.startswith("failure_rate"):
        return f"{value * 100:.2f} %"
    if metric in ("amplification", "peak_load_x_capacity"):
        return f"{value:.3f}×"
    if metric == "wasted_per_call":
        return f"{value:.4f}"
    return f"{value:.2f}"


_HEAD = {"failure_rate": "failed", "failure_rate_recoverable": "failed (recoverable)",
         "amplification": "requests/call",
         "wasted_per_call": "wasted/call", "added_latency_p50_s": "wait p50 s",
         "added_latency_p99_s": "wait p99 s", "added_latency_mean_s": "wait mean s",
         "peak_load_x_capacity": "peak ÷ C", "drain_s": "drain s"}


def table(rows: dict[str, dict[str, float]]) -> str:
    """One scenario's rows (policy -> metrics) as aligned text."""
    keys = list(next(iter(rows.values()), {}))
    lines = [["policy"] + [_HEAD[m] for m in keys]]
    for policy, m in rows.items():
        lines.append([policy] + [_fmt(k, m[k]) for k in keys])
    widths = [max(len(r[i]) for r in lines) for i in range(len(lines[0]))]
    out = []
    for n, r in enumerate(lines):
        out.append("  ".join([r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]))
        if n == 0:
            out.append("-" * len(out[0]))
    return "\n".join(out)


def verdict_lines(name: str, rows: dict[str, dict[str, float]]) -> str:
    """The resilient profile's verdicts in scenario ``name``, each with the ideal's and the
    best peer's figure beside it ("" when resilient did not run)."""
    from fsm.sim.targets import best_peer, check

    verdicts = check(name, rows)
    if not verdicts:
        return ""
    ideal, peer = rows.get("ideal"), best_peer(rows)
    head = "resilient vs targets" + (f" (beside: ideal, best peer {peer})" if peer else " (beside: ideal)")
    parts = []
    for v in verdicts:
        beside = [_fmt(v.metric, r[v.metric]) for r in (ideal, rows.get(peer or "")) if r]
        parts.append(f"  {v.metric} {_fmt(v.metric, v.value)} ≤ {_fmt(v.metric, v.limit)} "
                     f"{'ok' if v.ok else 'MISSED'} ({' | '.join(beside)})")
    return head + ":\n" + "\n".join(parts)


def _one(job: tuple) -> "object":
    """One (scenario, policy) run; a module-level function so that worker processes can run it."""
    from fsm.sim import simulate

    name, policy, sessions, seed, settings = job
    return simulate(name, policy, sessions=sessions, seed=seed, settings=settings)


def _output_problem(json_path: str | None, svg_dir: str | None) -> str | None:
    """Why ``--json FILE`` or ``--svg DIR`` cannot be written, checked before the simulation
    runs (minutes at large N): ``--json`` a folder or in a missing folder, ``--svg`` an
    existing file; None when both can be written (the ``--svg`` folder is created here)."""
    if json_path is not None:
        if os.path.isdir(json_path):
            return f"--json {json_path} is a folder; give a file to write the figures to"
        problem = output_file_problem(json_path, what="--json")  # a FIFO, /dev/full, ...
        if problem:
            return problem
    if svg_dir is not None:
        if os.path.exists(svg_dir) and not os.path.isdir(svg_dir):
            return f"--svg {svg_dir} is a file; give a folder to draw SCENARIO.svg into"
        try:
            os.makedirs(svg_dir, exist_ok=True)
        except OSError as exc:
            return f"--svg {svg_dir}: cannot create the folder ({exc.strerror or exc})"
        if not os.access(svg_dir, os.W_OK):
            return f"--svg {svg_dir} cannot be written (permission denied)"
    return None


def run(args: argparse.Namespace) -> int:
    from fsm.commands.common import load_settings
    from fsm.core.settings import SettingsError
    from fsm.sim import POLICIES, SCENARIOS
    from fsm.sim.svg import load_svg
    from fsm.sim.world import DEFAULT_SCENARIOS

    if args.sessions < 1 or args.sessions > 1_000_000:
        print(f"fsm simulate: --sessions must be from 1 to 1000000, got {args.sessions}", file=sys.stderr)
        return 2
    settings = None
    if args.settings is not None:
        try:
            settings = load_settings(args.settings, prog="fsm simulate")
        except SettingsError as exc:
            print(f"fsm simulate: {args.settings}: {exc}", file=sys.stderr)
            return 2
    known = list(POLICIES) + (["settings"] if settings is not None else [])
    policies = args.policy or known
    if settings is not None and "settings" not in policies:
        policies = [*policies, "settings"]
        print(f"fsm simulate: --settings {args.settings}: also running the policy \"settings\" "
              f"next to {', '.join(args.policy)}", file=sys.stderr)
    for p in policies:
        if p not in known:
            hint = " (give --settings FILE)" if p == "settings" else ""
            print(f"fsm simulate: unknown policy {p!r}{hint}; expected one of {', '.join(known)}",
                  file=sys.stderr)
            return 2
    if "ideal" not in policies:  # the targets are measured against the ideal of the same run
        policies = ["ideal", *policies]
    if not 1 <= args.jobs <= 256:
        print(f"fsm simulate: --jobs must be from 1 to 256, got {args.jobs}", file=sys.stderr)
        return 2
    problem = _output_problem(args.json, args.svg)
    if problem:
        print(f"fsm simulate: {problem}", file=sys.stderr)
        return 2
    scenarios = args.scenario or list(DEFAULT_SCENARIOS)
    jobs = [(name, p, args.sessions, args.seed, settings if p == "settings" else None)
            for name in scenarios for p in policies]
    if args.jobs > 1:
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            done = list(pool.map(_one, jobs))
    else:
        done = [_one(job) for job in jobs]
    by_key = {(r.scenario, r.policy): r for r in done}
    report: dict[str, dict[str, dict[str, float]]] = {}
    for name in scenarios:
        results = [by_key[(name, p)] for p in policies]
        rows = {r.policy: r.metrics for r in results}
        report[name] = rows
        world = SCENARIOS[name]
        print(f"\n{name} — {world.text} (N = {world.fleet_size(args.sessions)}, C = "
              f"{results[0].capacity:g} requests/s)")
        print(table(rows))
        print(verdict_lines(name, rows))
        if args.svg:
            where = os.path.join(args.svg, f"{name}.svg")
            try:
                os.makedirs(args.svg, exist_ok=True)
                write_output_file(where, load_svg(name, SCENARIOS[name].text, results))
            except OSError as exc:
                print(f"fsm simulate: cannot write --svg {where}: {exc.strerror or exc}", file=sys.stderr)
                return 2
    if args.json:
        try:  # whole or not at all: a full disk leaves no partial file behind
            write_output_file(args.json, json.dumps({"scenarios": report}, indent=2, sort_keys=False) + "\n")
        except OSError as exc:
            print(f"fsm simulate: cannot write --json {args.json}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    return 0
