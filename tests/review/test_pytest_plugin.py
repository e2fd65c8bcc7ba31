"""The pytest plugin: --transition-coverage over a whole run, with xdist, and partial runs."""

from __future__ import annotations

import json
import textwrap

import pytest

from fsm.review import audit as A
from fsm.core import lifecycle as L
from fsm.__main__ import main
from fsm.review.pytest_plugin import DEFAULT_REPORT

pytest_plugins = ["pytester"]

FIRST = next(r.id for r in L.TRANSITIONS if (r.source, r.trigger, r.dest) ==
             (L.IDLE, L.TURN_FAILED_RETRYABLE, L.BACKING_OFF))

COMMON = """
from fsm.core.brain import RetryBrain
from fsm.core.classify import Classification
from fsm.core.messages import AssistantMessage
from fsm.core.settings import RetrySettings

RETRYABLE = Classification("retryable", "test.retryable")


def failed_brain():
    b = RetryBrain(RetrySettings(base_delay_ms=0))
    b.turn_ended(AssistantMessage("error", error_message="503"), classification=RETRYABLE)
    return b
"""

CHAIN = COMMON + """

def test_chain():
    b = failed_brain()
    b.backoff_elapsed(b.timer_id)
    b.turn_ended(AssistantMessage("stop", text="ok"),
                 classification=Classification("none", "stop_reason.not_error"))
    assert b.state == "succeeded"
"""

CANCEL = COMMON + """

import pytest


@pytest.mark.slow
def test_cancel():
    b = failed_brain()
    b.abort_retry()
    b.abort_retry()
    assert b.state == "cancelled"
"""

# test_chain covers 3 items (3 rows taken); test_cancel 2 more (a row taken, an ignored cell)
WHOLE = 5
CHAIN_ONLY = 3
ITEMS = A.coverage({}).declared  # every item of the declaration


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini("""
        [pytest]
        testpaths = tests
        markers = slow: a slow test
    """)
    tests = pytester.mkdir("tests")
    (tests / "test_chain.py").write_text(CHAIN)
    (tests / "test_cancel.py").write_text(CANCEL)
    (pytester.path / "test_outside.py").write_text("def test_outside():\n    pass\n")
    return pytester


# Plugins the inner runs do not need; hypothesis alone costs most of a second per session.
QUIET = ("-p", "no:hypothesispytest", "-p", "no:asyncio", "-p", "no:benchmark")


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(*QUIET, *args)


def run_subprocess(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(*QUIET, *args, timeout=300)


def report(pytester: pytest.Pytester, path: str = DEFAULT_REPORT) -> dict:
    return json.loads((pytester.path / path).read_text(encoding="utf-8"))


def summary_line(result: pytest.RunResult) -> str:
    lines = [l for l in result.outlines if l.startswith("transition coverage: ")]
    assert len(lines) == 1, result.outlines
    return lines[0]


def test_off_by_default(suite):
    """Off by default."""
    result = run(suite)
    result.assert_outcomes(passed=2)
    assert not (suite.path / "build").exists()
    assert not any("transition coverage" in l for l in result.outlines)


def test_whole_run_writes_the_report_and_a_summary(suite):
    """Whole run writes the report and a summary."""
    result = run(suite, "--transition-coverage")
    result.assert_outcomes(passed=2)
    assert result.ret == 0
    data = report(suite)
    assert (data["declared"], data["covered"]) == (ITEMS, WHOLE)
    assert data["percent"] == round(100 * WHOLE / ITEMS, 2)
    assert data["partial"] is False and data["partial_reasons"] == []
    assert data["version"] == L.VERSION
    rows = {r["id"]: r for r in data["transitions"]}
    assert (rows[FIRST]["taken"], rows[FIRST]["rejected"]) == (2, 0)
    assert {"row": FIRST, "need": "rejected"} in data["uncovered"]
    ignored = {r["id"]: r["ignored"] for r in data["ignored"]}
    assert ignored["cancelled--retry_cancelled->(ignored)"] == 1
    assert summary_line(result) == (f"transition coverage: {WHOLE}/{ITEMS} items "
                                    f"({100 * WHOLE / ITEMS:.2f}%), report "
                                    f"{suite.path / DEFAULT_REPORT}")


def test_the_report_is_a_counts_file_the_audit_reads_and_draws(suite, tmp_path, capsys):
    """The report is a counts file the audit reads and draws."""
    run(suite, "--transition-coverage")
    path = suite.path / DEFAULT_REPORT
    data = report(suite)
    assert [FIRST, "taken", 2] in data["counts"]
    svg, md = tmp_path / "cov.svg", tmp_path / "cov.md"
    capsys.readouterr()
    assert main(["audit", str(path), "--format", "json", "--svg", str(svg), "--md", str(md)]) == 0
    again = json.loads(capsys.readouterr().out)
    for key in ("declared", "covered", "percent", "statuses", "transitions", "ignored", "counts"):
        assert again[key] == data[key], key
    assert again["traces"] == [{"path": str(path), "records": sum(n for *_, n in data["counts"])}]
    assert svg.read_text(encoding="utf-8").lstrip().startswith(("<?xml", "<svg"))
    assert md.read_text(encoding="utf-8").startswith("# Transition coverage of `retry_lifecycle`")


def test_threshold_fails_a_whole_run(suite):
    """Threshold fails a whole run."""
    result = run(suite, "--transition-coverage", "--transition-coverage-fail-under=50")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert summary_line(result).endswith("; FAIL: under --transition-coverage-fail-under=50")
    data = report(suite)
    assert data["failed"] is True and data["fail_under"] == 50


def test_a_threshold_alone_turns_recording_on(suite):
    """A threshold alone turns recording on."""
    result = run(suite, "--transition-coverage-fail-under=50")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert report(suite)["covered"] == WHOLE


def test_threshold_met_passes(suite):
    """Threshold met passes."""
    result = run(suite, "--transition-coverage",
                 f"--transition-coverage-fail-under={100 * WHOLE / ITEMS - 0.005:.2f}")
    assert result.ret == 0
    assert "FAIL" not in summary_line(result)
    assert report(suite)["failed"] is False


def test_failing_tests_keep_their_exit_status(suite):
    """Failing tests keep their exit status."""
    (suite.path / "tests" / "test_broken.py").write_text("def test_broken():\n    assert False\n")
    result = run(suite, "--transition-coverage", "--transition-coverage-fail-under=50")
    result.assert_outcomes(passed=2, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert report(suite)["failed"] is True


NARROWER = "paths or test ids narrower than testpaths: "


@pytest.mark.parametrize("args, reasons", [
    (["-k", "chain"], ["-k", "1 tests deselected"]),
    (["-m", "not slow"], ["-m", "1 tests deselected"]),
    (["--deselect", "tests/test_cancel.py::test_cancel"], ["--deselect", "1 tests deselected"]),
    (["tests/test_chain.py"], [NARROWER + "tests/test_chain.py"]),
    (["tests/test_chain.py::test_chain", "tests/test_cancel.py"],
     [NARROWER + "tests/test_chain.py::test_chain tests/test_cancel.py"]),
    (["--ignore", "tests/test_cancel.py"], ["--ignore"]),
])
def test_a_partial_run_never_fails_on_the_threshold(suite, args, reasons):
    """A partial run never fails on the threshold."""
    result = run(suite, "--transition-coverage", "--transition-coverage-fail-under=99", *args)
    assert result.ret == 0
    assert summary_line(result).endswith(
        f"; partial run ({', '.join(reasons)}): threshold not enforced")
    data = report(suite)
    assert data["partial"] is True and data["failed"] is False
    assert data["partial_reasons"] == reasons


def test_partial_run_reports_only_what_ran(suite):
    """Partial run reports only what ran."""
    run(suite, "--transition-coverage", "-k", "chain")
    assert report(suite)["covered"] == CHAIN_ONLY


def test_collect_only_is_partial(suite):
    """Collect only is partial."""
    result = run(suite, "--transition-coverage", "--transition-coverage-fail-under=99",
                             "--collect-only")
    assert result.ret == 0
    assert report(suite)["partial_reasons"] == ["--collect-only"]
    assert report(suite)["covered"] == 0


@pytest.mark.parametrize("args", [["tests"], ["."], ["tests", "tests/test_chain.py"]])
def test_paths_covering_testpaths_are_a_whole_run(suite, args):
    """Paths covering testpaths are a whole run."""
    result = run(suite, "--transition-coverage", "--transition-coverage-fail-under=50", *args)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert report(suite)["partial"] is False


def test_without_testpaths_the_invocation_dir_is_the_suite(suite):
    """Without testpaths the invocation dir is the suite."""
    suite.makeini("[pytest]\nmarkers = slow: a slow test\n")
    whole = run(suite, "--transition-coverage", "--transition-coverage-fail-under=50")
    whole.assert_outcomes(passed=3)
    assert whole.ret == pytest.ExitCode.TESTS_FAILED
    narrow = run(suite, "--transition-coverage", "--transition-coverage-fail-under=50", "tests")
    assert narrow.ret == 0 and report(suite)["partial"] is True


def test_glob_testpaths(suite):
    """Glob testpaths."""
    suite.makeini("[pytest]\ntestpaths = tes*\nmarkers = slow: a slow test\n")
    # tes* matches tests/ and test_outside.py: both must be given
    narrow = run(suite, "--transition-coverage", "--transition-coverage-fail-under=50", "tests")
    assert narrow.ret == 0 and report(suite)["partial"] is True
    whole = run(suite, "--transition-coverage", "--transition-coverage-fail-under=50", "tests",
                            "test_outside.py")
    whole.assert_outcomes(passed=3)
    assert whole.ret == pytest.ExitCode.TESTS_FAILED
    assert report(suite)["partial"] is False


def test_deselection_by_a_plugin_is_partial(suite):
    """Deselection by a plugin is partial."""
    (suite.path / "conftest.py").write_text(textwrap.dedent("""
        def pytest_collection_modifyitems(config, items):
            drop = [i for i in items if "cancel" in i.name]
            items[:] = [i for i in items if i not in drop]
            config.hook.pytest_deselected(items=drop)
    """))
    result = run(suite, "--transition-coverage", "--transition-coverage-fail-under=50")
    assert result.ret == 0
    assert report(suite)["partial_reasons"] == ["1 tests deselected"]


def test_report_path_option(suite, tmp_path):
    """Report path option."""
    target = tmp_path / "elsewhere" / "cov.json"
    run(suite, "--transition-coverage", f"--transition-coverage-report={target}")
    assert json.loads(target.read_text())["covered"] == WHOLE
    run(suite, "--transition-coverage", "--transition-coverage-report=out/r.json")
    assert report(suite, "out/r.json")["covered"] == WHOLE


@pytest.mark.parametrize("value", ["150", "x"])
def test_bad_threshold_is_a_usage_error(suite, value):
    """Bad threshold is a usage error."""
    result = run(suite, "--transition-coverage", f"--transition-coverage-fail-under={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*expected a percentage from 0 to 100*"])


def test_recorder_is_removed_after_the_run(suite):
    """The plugin's recorder leaves the context as it found it."""
    before = L.context_recorders()
    run(suite, "--transition-coverage")
    assert L.context_recorders() == before


# ----------------------------------------------------------------------------- pytest-xdist

@pytest.mark.subprocess
def test_xdist_workers_send_their_counts_to_the_controller(suite):
    """With -n 2 the workers send their counts and their test ids to the controller: one report
    of the whole run."""
    result = run_subprocess(suite, "-n", "2", "--transition-coverage",
                                        "--transition-coverage-fail-under=50")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    data = report(suite)
    assert data["covered"] == WHOLE and data["partial"] is False
    rows = {r["id"]: r for r in data["transitions"]}
    assert rows[FIRST]["taken"] == 2
    assert summary_line(result).startswith(f"transition coverage: {WHOLE}/{ITEMS} items")
    # each worker's test ids reach the controller's report too (docs/diagrams.md "The report")
    ctx = contexts_of(data)
    assert sorted(ctx[(FIRST, "taken", "")]["tests"]) == [CANCEL_ID, CHAIN_ID]
    assert ctx[(FIRST, "taken", "")]["total"] == 2


@pytest.mark.subprocess
def test_xdist_partial_run_does_not_fail(suite):
    """Xdist partial run does not fail."""
    result = run_subprocess(suite, "-n", "2", "--transition-coverage",
                                        "--transition-coverage-fail-under=50", "-k", "chain")
    result.assert_outcomes(passed=1)
    assert result.ret == 0
    data = report(suite)
    assert data["covered"] == CHAIN_ONLY
    assert data["partial_reasons"] == ["-k", "1 tests deselected"]


@pytest.mark.subprocess
def test_xdist_worker_deselection_reaches_the_controller(suite):
    """Xdist worker deselection reaches the controller."""
    (suite.path / "conftest.py").write_text(textwrap.dedent("""
        def pytest_collection_modifyitems(config, items):
            drop = [i for i in items if "cancel" in i.name]
            items[:] = [i for i in items if i not in drop]
            config.hook.pytest_deselected(items=drop)
    """))
    result = run_subprocess(suite, "-n", "2", "--transition-coverage",
                                        "--transition-coverage-fail-under=50")
    assert result.ret == 0
    assert report(suite)["partial_reasons"] == ["1 tests deselected"]


# ----------------------------------------------------------------------------- test contexts

def contexts_of(data: dict) -> dict[tuple[str, str, str], dict]:
    return {(c["row"], c["outcome"], c["guard"]): c for c in data["contexts"]}


CHAIN_ID = "tests/test_chain.py::test_chain"
CANCEL_ID = "tests/test_cancel.py::test_cancel"


def test_each_row_names_the_tests_that_exercised_it(suite):
    """The report names, per row and outcome, the node ids of the tests that took it (docs/diagrams.md "The report")."""
    run(suite, "--transition-coverage")
    data = report(suite)
    ctx = contexts_of(data)
    assert sorted(ctx[(FIRST, "taken", "")]["tests"]) == [CANCEL_ID, CHAIN_ID]
    assert ctx[(FIRST, "taken", "")]["total"] == 2
    assert ctx[("cancelled--retry_cancelled->(ignored)", "ignored", "")]["tests"] == [CANCEL_ID]
    assert data["context_limit"] == A.CONTEXT_LIMIT
    assert all(c["tests"] for c in data["contexts"])  # nothing ran outside a test here


def test_a_rejection_names_the_guard_that_failed():
    """A rejected row's context is kept per failing guard (docs/diagrams.md "The report")."""
    from fsm.core.brain import RetryBrain
    from fsm.core.classify import Classification
    from fsm.core.messages import AssistantMessage
    from fsm.core.settings import RetrySettings

    with A.Collector(contexts=True) as c:
        c.context = "t::no_retries"
        b = RetryBrain(RetrySettings(max_retries=0))
        b.turn_ended(AssistantMessage("error", error_message="503"),
                     classification=Classification("retryable", "test.retryable"))
    rejected = {key: ctx for key, ctx in c.contexts.items() if key[1] == "rejected"}
    assert rejected and all(key[2] for key in rejected)
    assert any(key[2] == "has_retries_left" and ctx.tests == ["t::no_retries"]
               for key, ctx in rejected.items())


def test_contexts_are_bounded_and_counted():
    """A row keeps the first CONTEXT_LIMIT test ids and counts the rest (docs/diagrams.md "The report")."""
    ctx = A.Context()
    for n in range(A.CONTEXT_LIMIT + 5):
        ctx.hear(f"t{n}")
        ctx.hear(f"t{n}")  # the same test again: one context
    ctx.hear(None)  # outside any test: a record, no context
    assert ctx.tests == [f"t{n}" for n in range(A.CONTEXT_LIMIT)]
    assert (ctx.total, ctx.more, ctx.records) == (A.CONTEXT_LIMIT + 5, 5, 2 * A.CONTEXT_LIMIT + 11)
    other = A.Context(1, ["u"], 1)
    ctx.merge(other)
    assert ctx.total == A.CONTEXT_LIMIT + 6 and len(ctx.tests) == A.CONTEXT_LIMIT
    again = A.contexts_from_json(A.contexts_to_json({("r", "taken", ""): ctx}))
    assert again[("r", "taken", "")].tests == ctx.tests and again[("r", "taken", "")].total == ctx.total


def test_the_html_option_writes_the_report_naming_the_tests(suite):
    """--transition-coverage-html DIR writes the browser report (implies recording), its rows
    naming the tests that took them (docs/diagrams.md "The report")."""
    result = run(suite, "--transition-coverage-html", "build/transition-coverage-html")
    result.assert_outcomes(passed=2)
    index = suite.path / "build" / "transition-coverage-html" / "index.html"
    text = index.read_text(encoding="utf-8")
    assert CHAIN_ID in text and CANCEL_ID in text
    assert (index.parent / "states" / "idle.html").is_file()
    assert any(l == f"transition coverage: HTML report {index}" for l in result.outlines)
