"""``python -m fsm audit TRACE...``: transition coverage of the lifecycle from trace files.

A TRACE is a JSON-lines trace (``--trace``, :class:`fsm.review.audit.TraceWriter`) or a counts file,
such as the pytest plugin's ``build/transition-coverage.json``.

Exit status: 0 when the coverage is at least ``--fail-under`` (or no threshold was given),
1 when it is under it, 2 on bad input (a missing or malformed trace, only foreign traces, an
SVG that cannot be rendered).
"""

from __future__ import annotations

import argparse
import sys

HELP = "report which declared transitions and ignored cells some traces covered"


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage from 0 to 100, got {text!r}")
    if not 0.0 <= value <= 100.0:
        raise argparse.ArgumentTypeError(f"expected a percentage from 0 to 100, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("traces", nargs="+", metavar="TRACE",
                   help="trace files (JSON lines) written by --trace or fsm.review.audit.TraceWriter, "
                        "or counts files (the pytest plugin's build/transition-coverage.json)")
    p.add_argument("--format", choices=("text", "json", "md"), default="text",
                   help="report format on standard output (default: text)")
    p.add_argument("--svg", metavar="OUT", default=None,
                   help="also draw the review diagram into OUT, each declared row covered, "
                        "partly covered or not covered (red, dashed), with a legend")
    p.add_argument("--svg-states", metavar="OUT", default=None,
                   help="also draw the per-state diagram into OUT (one edge per transition "
                        "counted), coloured the same way")
    p.add_argument("--md", metavar="OUT", default=None,
                   help="also write the Markdown report into OUT")
    p.add_argument("--fail-under", type=_percent, default=None, metavar="PCT",
                   help="exit 1 when the coverage is under PCT percent")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from fsm.review import audit
    from fsm.review.diagrams import DiagramError, write_file

    from fsm.commands.common import check_input_file
    try:
        for path in args.traces:  # a FIFO or /dev/zero is refused at once
            check_input_file(path, what="trace")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        report = audit.audit_files(args.traces)
    except (audit.TraceError, audit.AllForeignError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RecursionError:  # fsm.review.audit.read_trace lets json's RecursionError through
        print(f"error: a trace line is JSON nested too deeply to be a trace record "
              f"(in {', '.join(args.traces)})", file=sys.stderr)
        return 2
    sys.stdout.write(audit.FORMATS[args.format](report))
    for t in report.foreign:
        print(f"warning: {t.path} was recorded with another declaration (version {t.version}, "
              f"this one is {report.version}): its {t.records} records were not counted",
              file=sys.stderr)
    try:
        if args.md:
            write_file(Path(args.md), audit.format_markdown(report))
        if args.svg:
            write_file(Path(args.svg), audit.coverage_svg(report))
        if args.svg_states:
            write_file(Path(args.svg_states), audit.coverage_states_svg(report))
    except (DiagramError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.fail_under is not None and report.below(args.fail_under):
        print(f"FAIL: transition coverage {report.percent:.2f}% is under --fail-under "
              f"{args.fail_under:g}% ({len(report.uncovered)} items uncovered)", file=sys.stderr)
        return 1
    return 0
