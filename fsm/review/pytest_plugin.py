"""pytest plugin: transition coverage of the retry lifecycle over a test run (docs/policy.md §7).

Registered through the ``pytest11`` entry point and off unless asked for:

``--transition-coverage``
    record every transition tried by any machine during the run (an in-process
    :class:`fsm.review.audit.Collector`); with pytest-xdist each worker sends its counts to the
    controller, which merges them;
``--transition-coverage-report=PATH``
    where to write the JSON report (default ``build/transition-coverage.json``, relative to
    the directory pytest was started in): ``{"declared", "covered", "percent", "uncovered",
    ...}`` plus per-row counts (see :meth:`fsm.review.audit.Report.to_json`) and the run's
    ``partial`` reasons, and ``contexts``: for every row and outcome (taken, rejected by which
    guard, ignored) the node ids of the tests that exercised it, the first
    :data:`fsm.review.audit.CONTEXT_LIMIT` of them and how many there were (from a test's
    set-up to its tear-down; with xdist, every worker's). It is also a counts file:
    ``python -m fsm audit PATH --svg OUT`` draws it (``make test`` writes
    ``build/transition-coverage.svg`` and ``.md`` that way);
``--transition-coverage-html=DIR``
    (implies ``--transition-coverage``) also write the HTML report into the folder ``DIR``
    (:mod:`fsm.review.report`; ``make test`` writes ``build/transition-coverage-html/``),
    whatever the tests' outcome; a report that cannot be drawn (no Graphviz) is said in the
    summary and does not change the exit status;
``--transition-coverage-fail-under=PCT``
    (implies ``--transition-coverage``) fail the run when the coverage is under PCT percent, but only when the whole suite ran:
    a run narrowed by ``-k``, ``-m``, ``--lf``, ``--sw``, ``--deselect``, ``--ignore``, any
    deselection, or paths / test ids narrower than ``testpaths`` is *partial*: the report is
    written and the summary printed, the threshold is not enforced.

What counts as covered is defined in :mod:`fsm.review.audit`.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest

DEFAULT_REPORT = "build/transition-coverage.json"
_WORKER_KEY = "transition_coverage"


def _percent(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 100.0:
        raise argparse.ArgumentTypeError(f"expected a percentage from 0 to 100, got {text!r}")
    return value


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("transition-coverage", "retry lifecycle transition coverage")
    group.addoption("--transition-coverage", action="store_true", default=False,
                    help="record which lifecycle transitions the tests take, reject and ignore")
    group.addoption("--transition-coverage-fail-under", type=_percent, default=None,
                    metavar="PCT",
                    help="fail a whole-suite run whose transition coverage is under PCT percent "
                         "(implies --transition-coverage)")
    group.addoption("--transition-coverage-report", default=DEFAULT_REPORT, metavar="PATH",
                    help=f"JSON report path (default: {DEFAULT_REPORT})")
    group.addoption("--transition-coverage-html", default=None, metavar="DIR",
                    help="also write the HTML report (the diagram, every row with the tests "
                         "that took it, a page per state) into DIR (implies "
                         "--transition-coverage)")


def pytest_configure(config: pytest.Config) -> None:
    # A threshold alone turns recording on: a CI line that sets one expects it enforced.
    if (config.getoption("transition_coverage")
            or config.getoption("transition_coverage_html")
            or config.getoption("transition_coverage_fail_under") is not None):
        config.pluginmanager.register(TransitionCoverage(config), "transition-coverage-collector")


def partial_reasons(config: pytest.Config, deselected: int) -> list[str]:
    """Why this run is narrower than the whole suite (empty: the whole suite ran)."""
    opt = config.option
    reasons = []
    for attr, flag in (("keyword", "-k"), ("markexpr", "-m"), ("lf", "--lf"),
                       ("stepwise", "--sw"), ("deselect", "--deselect"), ("ignore", "--ignore"),
                       ("ignore_glob", "--ignore-glob"), ("collectonly", "--collect-only")):
        if getattr(opt, attr, None):
            reasons.append(flag)
    if deselected:
        reasons.append(f"{deselected} tests deselected")
    if _narrower_than_testpaths(config):
        reasons.append("paths or test ids narrower than testpaths: " + " ".join(config.args))
    return reasons


def _narrower_than_testpaths(config: pytest.Config) -> bool:
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        return False  # the default: testpaths, or the invocation directory
    invocation = config.invocation_params.dir
    testpaths = config.getini("testpaths")
    if testpaths:
        targets = []
        for tp in testpaths:
            pattern = str(config.rootpath / tp)
            targets += [Path(p) for p in sorted(glob.glob(pattern, recursive=True))] or [Path(pattern)]
    else:
        targets = [invocation]
    args = [(invocation / a).resolve() for a in config.args if "::" not in a]
    return not all(any(t.resolve() == a or a in t.resolve().parents for a in args)
                   for t in targets)


class TransitionCoverage:
    """The plugin object of one run (controller or xdist worker)."""

    def __init__(self, config: pytest.Config) -> None:
        from fsm.review.audit import Collector

        self.config = config
        self.worker = hasattr(config, "workerinput")
        self.collector = Collector(contexts=True).install()
        self.deselected = 0
        self.report = None
        self.reasons: list[str] = []
        self.failed = False
        self.path: Path | None = None
        self.html: str = ""

    def pytest_deselected(self, items) -> None:
        self.deselected += len(items)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        # Every transition heard from the test's set-up to its tear-down is the test's.
        self.collector.context = item.nodeid
        try:
            return (yield)
        finally:
            self.collector.context = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        data = getattr(node, "workeroutput", {}).get(_WORKER_KEY)
        if data is not None:
            from fsm.review.audit import Collector, contexts_from_json

            self.collector.add(Collector.counts_from_json(data),
                               contexts_from_json(data.get("contexts", [])))
            self.deselected = max(self.deselected, data.get("deselected", 0))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus) -> None:
        self.collector.uninstall()
        if self.worker:
            data = self.collector.to_json()
            data["deselected"] = self.deselected
            self.config.workeroutput[_WORKER_KEY] = data
            return
        from fsm.review.audit import coverage

        report = self.report = coverage(self.collector.counts, None, self.collector.contexts)
        fail_under = self.config.getoption("transition_coverage_fail_under")
        self.reasons = partial_reasons(self.config, self.deselected)
        self.failed = (fail_under is not None and not self.reasons and report.below(fail_under))
        out = report.to_json()
        out.update(partial=bool(self.reasons), partial_reasons=self.reasons,
                   fail_under=fail_under, failed=self.failed)
        path = Path(self.config.getoption("transition_coverage_report"))
        self.path = path if path.is_absolute() else self.config.invocation_params.dir / path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        self._write_html(report)
        if self.failed and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _write_html(self, report) -> None:
        folder = self.config.getoption("transition_coverage_html")
        if not folder:
            return
        from fsm.review.diagrams import DiagramError
        from fsm.review import report as html_report

        out = Path(folder)
        out = out if out.is_absolute() else self.config.invocation_params.dir / out
        try:
            html_report.write(out, report)
            self.html = f"HTML report {out / 'index.html'}"
        except (DiagramError, OSError) as exc:
            self.html = f"no HTML report: {exc}"

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.report is None:
            return
        line = f"transition coverage: {self.report.summary()}, report {self.path}"
        fail_under = self.config.getoption("transition_coverage_fail_under")
        if self.reasons:
            line += f"; partial run ({', '.join(self.reasons)}): threshold not enforced"
        elif self.failed:
            line += f"; FAIL: under --transition-coverage-fail-under={fail_under:g}"
        terminalreporter.write_line(line, red=self.failed, bold=self.failed)
        if self.html:
            terminalreporter.write_line(f"transition coverage: {self.html}")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.collector.uninstall()
