"""The HTML transition-coverage report and its pull-request summary, without a browser."""

from __future__ import annotations

import copy
import json
from html.parser import HTMLParser

import pytest

from fsm.__main__ import main
from fsm.core import lifecycle as L
from fsm.review import audit as A
from fsm.review import report as R


class Rows(HTMLParser):
    """The ``<tr>`` of one table (by id): each row's attributes and the text and tags inside."""

    def __init__(self, table_id: str) -> None:
        super().__init__()
        self.table_id, self.inside, self.rows = table_id, False, []
        self.depth = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self.depth += 1
            if attrs.get("id") == self.table_id:
                self.inside, self.depth = True, 1
        elif self.inside and tag == "tr" and "data-row" in attrs:
            self.rows.append({"attrs": attrs, "text": "", "tags": []})
        if self.inside and self.rows:
            self.rows[-1]["tags"].append((tag, attrs))

    def handle_endtag(self, tag):
        if tag == "table" and self.inside:
            self.depth -= 1
            self.inside = self.depth > 0

    def handle_data(self, data):
        if self.inside and self.rows:
            self.rows[-1]["text"] += data


def table_rows(text: str, table_id: str = "rows-table") -> list[dict]:
    parser = Rows(table_id)
    parser.feed(text)
    return parser.rows


def write_counts(tmp_path, report: A.Report):
    path = tmp_path / "transition-coverage.json"
    path.write_text(json.dumps(report.to_json(), indent=2), encoding="utf-8")
    return path


def first_row(source, trigger, dest):
    return next(r for r in L.declaration()["rows"]
                if (r["source"], r["trigger"], r["dest"]) == (source, trigger, dest))


def test_every_row_names_a_test_or_is_marked_not_covered(sample_report):
    """The table has one line per declared row, each naming the tests that took it or marked
    not covered (docs/diagrams.md "The report")."""
    pages = R.build_pages(sample_report)
    rows = table_rows(pages["index.html"])
    assert len(rows) == len(L.declaration()["rows"])
    assert [r["attrs"]["data-row"] for r in rows] == [r["id"] for r in L.declaration()["rows"]]
    statuses = {r["attrs"]["data-status"] for r in rows}
    assert statuses == set(A.STATUSES)  # the sample has rows of each status
    for r in rows:
        names_a_test = "tests/sample.py::" in r["text"]
        if r["attrs"]["data-status"] == A.NOT_COVERED:  # it may name tests that rejected it
            assert "not covered: no test took it" in r["text"], r["attrs"]["data-row"]
        else:
            assert names_a_test, r["attrs"]["data-row"]
    start = first_row("at_rest", L.TURN_FAILED_RETRYABLE, L.BACKING_OFF)["id"]
    line = next(r for r in rows if r["attrs"]["data-row"] == start)
    assert "tests/sample.py::test_chain" in line["text"]
    assert "tests/sample.py::test_cancel" in line["text"]
    assert "taken in idle by 2 tests" in line["text"]
    # a rejection names the guard that failed, here and in the outcomes seen
    assert any("rejected (has_retries_left failed) in idle by 1 test" in r["text"]
               and "has_retries_left failed 1×" in r["text"] for r in rows)


def test_each_state_has_a_page_with_its_diagram_and_rows(sample_report):
    """One page per state, with its small diagram and its rows linked back to the table
    (docs/diagrams.md "The report")."""
    pages = R.build_pages(sample_report)
    index_rows = {r["attrs"]["data-row"]: r for r in table_rows(pages["index.html"])}
    anchors = dict(zip((x["id"] for x in L.declaration()["rows"]),
                       (row.anchor for row in R.report_rows(sample_report))))
    for state in L.STATES:
        page = pages[f"states/{state}.html"]
        assert "<svg" in page and f"State <code>{state}</code>" in page
        rows = table_rows(page, "state-rows")
        assert rows
        for r in rows:
            links = [a["href"] for tag, a in r["tags"] if tag == "a" and "href" in a]
            assert f"../index.html#{anchors[r['attrs']['data-row']]}" in links
            assert r["attrs"]["data-status"] == index_rows[r["attrs"]["data-row"]]["attrs"]["data-status"]


def test_the_report_is_offline(sample_report, tmp_path):
    """No page loads anything from elsewhere: no script, no external style sheet or font
    (docs/diagrams.md "The report")."""
    R.write(tmp_path, sample_report)
    for page in tmp_path.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert "<script" not in text and "<link" not in text and "@import" not in text
        assert "http://" not in text.replace("http://www.w3.org/", "")
        assert "https://" not in text


def base_with(extra=None, without=None) -> dict:
    """The current declaration's JSON with a row added (``extra``) or one dropped."""
    base = copy.deepcopy(L.declaration())
    if without is not None:
        base["rows"] = [r for r in base["rows"] if r["id"] != without]
        base["transitions"] = [t for t in base["transitions"] if t["row"] != without]
    if extra is not None:
        base["rows"].append(extra)
        base["transitions"].append({k: v for k, v in extra.items() if k != "ignored"}
                                   | {"row": extra["id"]})
    return base


def test_a_change_that_removes_a_row_shows_it_removed(sample_report, tmp_path, capsys):
    """--base with a row this version no longer has: the report and the PR summary show it
    removed (docs/diagrams.md "The report")."""
    gone = {"id": "backing_off--user_message->continuing", "source": "backing_off",
            "trigger": "user_message", "dest": L.CONTINUING, "guards": [], "effect": None,
            "spec": "a row of the old version", "ignored": False}
    base = tmp_path / "base.json"
    base.write_text(json.dumps(base_with(extra=gone)), encoding="utf-8")
    counts = write_counts(tmp_path, sample_report)
    out, pr = tmp_path / "html", tmp_path / "pr.md"
    assert main(["audit", str(counts), "--html", str(out), "--base", str(base),
                 "--pr-summary", str(pr)]) == 0
    changes = table_rows((out / "index.html").read_text(encoding="utf-8"), "changes-table")
    assert [(r["attrs"]["data-change"], r["attrs"]["data-row"]) for r in changes] == \
        [("removed", gone["id"])]
    assert "gone" in changes[0]["text"]
    summary = pr.read_text(encoding="utf-8")
    assert "**1 row removed**" in summary and "➖ removed" in summary
    assert len(summary.splitlines()) <= 12


def test_a_change_that_adds_an_untested_row_marks_it_untested(sample_report, tmp_path):
    """--base without a row no test took (and one a test took): the added rows are shown, the
    untested one marked so, here and in the PR summary (docs/diagrams.md "The report")."""
    rows = R.report_rows(sample_report)
    untested = next(r for r in rows if not r.ignored and not r.taken)
    tested = next(r for r in rows if not r.ignored and r.taken)
    base = tmp_path / "base.json"
    base.write_text(json.dumps(base_with(without=untested.id)), encoding="utf-8")
    counts = write_counts(tmp_path, sample_report)
    out, pr = tmp_path / "html", tmp_path / "pr.md"
    assert main(["audit", str(counts), "--html", str(out), "--base", str(base),
                 "--pr-summary", str(pr)]) == 0
    page = (out / "index.html").read_text(encoding="utf-8")
    changes = table_rows(page, "changes-table")
    assert [(r["attrs"]["data-change"], r["attrs"]["data-row"]) for r in changes] == \
        [("added", untested.id)]
    assert R.UNTESTED in changes[0]["text"]
    line = next(r for r in table_rows(page) if r["attrs"]["data-row"] == untested.id)
    assert "+ added" in line["text"] and R.UNTESTED in line["text"]
    assert "· **untested**" in pr.read_text(encoding="utf-8")
    # a tested row added is not marked untested
    summary = R.pr_summary(sample_report, base_with(without=tested.id), "old.json")
    assert "**1 row added**; 0 untested" in summary and "· **untested**" not in summary
    assert "tests/sample.py::" in summary


def test_the_audit_explains_what_it_reads_and_refuses_half_requests(tmp_path, monkeypatch,
                                                                     capsys):
    """--html without a TRACE reads build/transition-coverage.json and says when it is
    missing; --pr-summary needs --base; --base must be a declaration (docs/diagrams.md "The
    report")."""
    monkeypatch.chdir(tmp_path)
    assert main(["audit", "--html", "out"]) == 2
    assert "build/transition-coverage.json" in capsys.readouterr().err
    counts = tmp_path / "c.json"
    counts.write_text(json.dumps(A.coverage({}).to_json()), encoding="utf-8")
    assert main(["audit", str(counts), "--pr-summary", "pr.md"]) == 2
    assert "--base" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"states": []}', encoding="utf-8")
    assert main(["audit", str(counts), "--html", "out", "--base", str(bad)]) == 2
    assert "bad.json" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_trace_s_story_is_told_with_its_guards_spelled_out(tmp_path, sample_report):
    """--trace FILE: the steps of the trace, the "6 ✓" shorthand with every guard's value in
    its title (docs/diagrams.md "The report")."""
    from fsm.core.brain import RetryBrain
    from fsm.core.classify import Classification
    from fsm.core.messages import AssistantMessage
    from fsm.core.settings import RetrySettings

    trace = tmp_path / "trace.jsonl"
    b = RetryBrain(RetrySettings(base_delay_ms=0))
    with A.TraceWriter(trace, b):
        b.turn_ended(AssistantMessage("error", error_message="503"),
                     classification=Classification("retryable", "test.retryable"))
    page = R.build_pages(sample_report, traces=[trace])["index.html"]
    assert f"<code>{trace}</code>: 1 steps" in page
    assert 'title="retry_enabled ✓, has_retries_left ✓' in page


def test_a_trace_is_its_own_context(tmp_path):
    """Audited traces name themselves as what took each row (docs/diagrams.md "The report")."""
    from fsm.core.brain import RetryBrain
    from fsm.core.classify import Classification
    from fsm.core.messages import AssistantMessage
    from fsm.core.settings import RetrySettings

    trace = tmp_path / "trace.jsonl"
    b = RetryBrain(RetrySettings(max_retries=0))
    with A.TraceWriter(trace, b):
        b.turn_ended(AssistantMessage("error", error_message="503"),
                     classification=Classification("retryable", "test.retryable"))
    report = A.audit_files([trace])
    assert report.contexts and all(c.tests == [str(trace)] for c in report.contexts.values())
    assert any(g == "has_retries_left" for (_, o, g) in report.contexts if o == "rejected")
    again = A.audit_files([write_counts(tmp_path, report)])
    assert again.contexts == report.contexts


@pytest.mark.parametrize("bad", [[{"row": 1}], "nope", [{"row": "x", "outcome": "taken",
                                                          "tests": [], "total": 0,
                                                          "records": 1}]])
def test_a_counts_file_with_bad_contexts_is_refused(tmp_path, bad):
    """Malformed or unknown contexts in a counts file: a clear error naming the file."""
    data = A.coverage({}).to_json() | {"contexts": bad}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(A.TraceError, match="c.json"):
        A.read_trace(path)
