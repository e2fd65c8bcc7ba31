"""``python -m fsm audit TRACE...``: the story of a trace, and its transition coverage.

A TRACE is a JSON-lines trace (``--trace``, :class:`fsm.review.audit.TraceWriter`) or a counts file,
such as the pytest plugin's ``build/transition-coverage.json``. The text report tells the path
each trace took first (:mod:`fsm.review.story`), then one line of coverage; ``--table`` prints
the full coverage table instead (every item: a transition taken, a guarded transition seen
rejected, an ignored cell seen ignored).

``--events LOG`` (repeatable) checks an event log of any implementation against the machine's
invariants (:mod:`fsm.review.events`: RPC stdout JSON lines, a session's events, a
conformance trace, an OpenTelemetry export) and prints each violation with its line.

Exit status: 0 when the coverage is at least ``--fail-under`` (or no threshold was given) and
no event log breaks an invariant, 1 when the coverage is under it or a log has violations, 2
on bad input (a missing or malformed trace or log, only foreign traces, an SVG that cannot be
rendered, a file given as the ``--svg-states`` folder).

``--svg-states DIR`` draws one small picture per state, ``DIR/<state>.svg`` (the rows into and
out of it, as ``python -m fsm diagrams`` draws ``diagrams/states/``), coloured by coverage.

``--html DIR`` writes the report a reviewer opens in a browser (:mod:`fsm.review.report`): the
diagram, every row with the tests that exercised it, one page per state; ``--base FILE`` (a
declaration's JSON, such as another commit's ``diagrams/retry_lifecycle.json``) adds the rows
added, removed and changed since it, ``--trace FILE`` (repeatable) the story of a trace, and
``--pr-summary FILE`` writes the changed rows and their coverage as Markdown for a pull
request (it needs ``--base``). Without a TRACE these read the pytest plugin's
``build/transition-coverage.json``.
"""

from __future__ import annotations

import argparse
import os
import sys

HELP = ("tell the path a trace took and its transition coverage; check event logs against "
        "the machine (--events)")


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage from 0 to 100, got {text!r}")
    if not 0.0 <= value <= 100.0:
        raise argparse.ArgumentTypeError(f"expected a percentage from 0 to 100, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("traces", nargs="*", metavar="TRACE",
                   help="trace files (JSON lines) written by --trace or fsm.review.audit.TraceWriter, "
                        "or counts files (the pytest plugin's build/transition-coverage.json)")
    p.add_argument("--format", choices=("text", "json", "md"), default="text",
                   help="report format on standard output (default: text: the path taken, "
                        "then one line of coverage)")
    p.add_argument("--table", action="store_true",
                   help="text: print the full coverage table (every item) instead of the path")
    p.add_argument("--events", action="append", default=[], metavar="LOG",
                   help="check an event log (RPC stdout, session events, a conformance trace, "
                        "an OpenTelemetry export) against the machine's invariants; repeatable")
    p.add_argument("--svg", metavar="OUT", default=None,
                   help="also draw the review diagram into OUT, each declared row covered, "
                        "partly covered or not covered (red, dashed), with a legend")
    p.add_argument("--svg-states", metavar="DIR", default=None,
                   help="also draw one small picture per state into the folder DIR "
                        "(DIR/<state>.svg, as python -m fsm diagrams writes diagrams/states/), "
                        "each row into and out of the state coloured the same way")
    p.add_argument("--md", metavar="OUT", default=None,
                   help="also write the Markdown report into OUT")
    p.add_argument("--fail-under", type=_percent, default=None, metavar="PCT",
                   help="exit 1 when the coverage is under PCT percent")
    p.add_argument("--html", metavar="DIR", default=None,
                   help="also write the HTML report into the folder DIR (index.html, one page "
                        "per state): the diagram coloured by coverage, every row with the tests "
                        "that exercised it; without a TRACE it reads "
                        "build/transition-coverage.json")
    p.add_argument("--base", metavar="FILE", default=None,
                   help="the declaration (JSON, e.g. another commit's "
                        "diagrams/retry_lifecycle.json) to compare with: the report lists the "
                        "rows added, removed and changed, marking the untested ones")
    p.add_argument("--trace", action="append", default=[], metavar="FILE", dest="story",
                   help="tell the path this trace took in the HTML report (repeatable; its "
                        "records are not counted unless it is also a TRACE)")
    p.add_argument("--pr-summary", metavar="FILE", default=None,
                   help="write the changed rows (since --base) and their coverage as Markdown "
                        "for a pull request's comment")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from fsm.review import audit
    from fsm.review.diagrams import DiagramError, write_file

    if not args.traces and (args.html or args.pr_summary) and not args.events:
        from fsm.review.pytest_plugin import DEFAULT_REPORT

        if not os.path.exists(DEFAULT_REPORT):
            print(f"error: no TRACE given and no {DEFAULT_REPORT}: run the tests with "
                  "--transition-coverage (make test) first, or give a TRACE", file=sys.stderr)
            return 2
        args.traces = [DEFAULT_REPORT]
    if not args.traces and not args.events:
        print("error: give a TRACE to audit or --events LOG to check (or both)", file=sys.stderr)
        return 2
    if args.pr_summary and not args.base:
        print("error: --pr-summary lists the rows changed since a base declaration: give "
              "--base FILE (e.g. diagrams/retry_lifecycle.json of the target branch)",
              file=sys.stderr)
        return 2
    if (args.base or args.story) and not args.html and not args.pr_summary:
        print("error: --base and --trace shape the HTML report or the pull-request summary: "
              "give --html DIR or --pr-summary FILE", file=sys.stderr)
        return 2
    if args.html and os.path.exists(args.html) and not os.path.isdir(args.html):
        print(f"error: --html {args.html} is a file; give a folder to write index.html into",
              file=sys.stderr)
        return 2
    base = None
    if args.base:
        from fsm.review.diagrams_diff import DiffError, load_file

        try:
            base = load_file(args.base)
        except DiffError as exc:
            print(f"error: --base: {exc}", file=sys.stderr)
            return 2
    for path in args.story:
        if not os.path.isfile(path):
            print(f"error: --trace {path}: no such file", file=sys.stderr)
            return 2
    if args.svg_states and os.path.exists(args.svg_states) \
            and not os.path.isdir(args.svg_states):
        print(f"error: --svg-states {args.svg_states} is a file; give a folder to draw "
              f"<state>.svg into", file=sys.stderr)
        return 2
    status = _events(args) if args.events else 0
    if not args.traces:
        return status
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
    if args.format == "text" and not args.table:
        from fsm.review.story import format_report

        sys.stdout.write(format_report(report))
    else:
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
            pictures = audit.coverage_states_svgs(report)
            out = Path(args.svg_states)
            out.mkdir(parents=True, exist_ok=True)
            for state, svg in pictures.items():
                write_file(out / f"{state}.svg", svg)
        if args.html:
            from fsm.review import report as html_report

            html_report.write(args.html, report, base=base, base_name=args.base or "base",
                              traces=args.story)
            print(f"HTML report: {Path(args.html) / 'index.html'}", file=sys.stderr)
        if args.pr_summary:
            from fsm.review.report import pr_summary

            write_file(Path(args.pr_summary), pr_summary(report, base, args.base))
    except (DiagramError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.fail_under is not None and report.below(args.fail_under):
        print(f"FAIL: transition coverage {report.percent:.2f}% is under --fail-under "
              f"{args.fail_under:g}% ({len(report.uncovered)} items uncovered)", file=sys.stderr)
        return 1
    return status


def _events(args: argparse.Namespace) -> int:
    """Check each ``--events`` log; 1 when one breaks an invariant, 2 when one is unreadable."""
    import json

    from fsm.review import events

    try:
        reports = [events.check_file(path) for path in args.events]
    except events.EventLogError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps({"events": [r.to_json() for r in reports]}, indent=2))
    else:
        sys.stdout.write(events.format_violations(reports))
    return 0 if all(r.ok for r in reports) else 1
