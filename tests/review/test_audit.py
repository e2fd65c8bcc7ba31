"""Transition coverage: recording (Collector, TraceWriter), reading traces, the audit command."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fsm.review import audit as A
from fsm.core import lifecycle as L
from fsm.__main__ import main
from fsm.core.brain import RetryBrain
from fsm.core.classify import Classification
from fsm.core.messages import AssistantMessage
from fsm.core.settings import RetrySettings
from brain_matrix_support import CASES, fire, setup
from diagram_support import fallback_rows

RETRYABLE = Classification("retryable", "test.retryable")
FATAL = Classification("fatal", "test.fatal")
OVERFLOW = Classification("context_overflow", "test.overflow")
NONE = Classification("none", "stop_reason.not_error")
SVG_NS = "{http://www.w3.org/2000/svg}"

ROW = {r.id: r for r in L.TRANSITIONS}

FALLBACKS = fallback_rows()


def row_id(source: str, trigger: str, dest: str) -> str:
    """The first declared transition from ``source`` on ``trigger`` to ``dest``."""
    return next(r.id for r in L.TRANSITIONS
                if (r.source, r.trigger, r.dest) == (source, trigger, dest))


CHAIN = [row_id(L.IDLE, L.TURN_FAILED_RETRYABLE, L.BACKING_OFF),
         row_id(L.BACKING_OFF, L.BACKOFF_ELAPSED, L.CONTINUING),
         row_id(L.CONTINUING, L.TURN_SUCCEEDED, L.SUCCEEDED)]
N_ROWS, N_IGNORED = len(L.TRANSITIONS), len(L.IGNORED)


def error_message() -> AssistantMessage:
    return AssistantMessage("error", error_message="503 Service Unavailable")


def fail(brain: RetryBrain, cls: Classification = RETRYABLE) -> list:
    return brain.turn_ended(error_message(), classification=cls)


def succeed(brain: RetryBrain) -> list:
    return brain.turn_ended(AssistantMessage("stop", text="done"), classification=NONE)


def abort_turn(brain: RetryBrain) -> list:
    return brain.turn_ended(AssistantMessage("aborted", error_message="aborted"), classification=NONE)


def brain_in(state: str, max_retries: int = 3) -> RetryBrain:
    """A brain brought to ``state`` through real transitions."""
    b = RetryBrain(RetrySettings(max_retries=max_retries, base_delay_ms=0))
    if state == L.IDLE:
        return b
    if state == L.EXHAUSTED:
        b.update_settings(RetrySettings(max_retries=1, base_delay_ms=0))
    fail(b)
    if state == L.CANCELLED:
        b.abort_retry()
    elif state != L.BACKING_OFF:
        b.backoff_elapsed(b.timer_id)
        if state == L.SUCCEEDED:
            succeed(b)
        elif state == L.EXHAUSTED:
            fail(b)  # attempt 1 of 1
    assert b.state == state
    return b


def tour() -> None:
    """Every row taken, every rejectable row rejected, every ignored cell ignored: the brain
    matrix's cases (each guard made the first to fail through real settings and facts)."""
    for state, trigger, fails in CASES:
        brain, hint, facts = setup(state, fails)
        fire(brain, trigger, hint, facts)


def item_count() -> int:
    """Items counted independently of fsm.review.diagrams (the fallback rows by brute force)."""
    rejectable = [r for r in L.TRANSITIONS if r.guards and r.id not in FALLBACKS]
    return len(L.TRANSITIONS) + len(rejectable) + len(L.IGNORED)


ITEMS = item_count()


def pct(covered: int) -> str:
    """The report's percentage text of ``covered`` items."""
    return f"{100 * covered / ITEMS:.2f}"


# ----------------------------------------------------------------------------- Collector

def test_collector_counts_one_chain_exactly():
    """Collector counts one chain exactly."""
    with A.Collector() as c:
        b = brain_in(L.IDLE)
        fail(b)
        b.backoff_elapsed(b.timer_id)
        succeed(b)
    assert c.counts == {(row, "taken"): 1 for row in CHAIN}


def test_collector_counts_rejections_and_ignored_cells():
    """Collector counts rejections and ignored cells."""
    b = brain_in(L.IDLE)
    b.set_enabled(False)
    with A.Collector() as c:
        fail(b)
        b.abort_retry()
    # the cell's rows are tried in order: each before the [¬retry_enabled] row is rejected
    cell = [r.id for r in L.TRANSITIONS if (r.source, r.trigger) == (L.IDLE, L.TURN_FAILED_RETRYABLE)]
    taken = "idle--turn_failed_retryable[!retry_enabled]->idle"
    expected = {(row, "rejected"): 1 for row in cell[:cell.index(taken)]}
    expected.update({(taken, "taken"): 1, ("idle--retry_cancelled->(ignored)", "ignored"): 1})
    assert c.counts == expected


def test_collector_for_one_model_ignores_other_brains():
    """Collector for one model ignores other brains."""
    mine, other = brain_in(L.IDLE), brain_in(L.IDLE)
    with A.Collector(model=mine) as c:
        fail(other)
        fail(mine)
        mine.abort_retry()
    assert c.counts == {(CHAIN[0], "taken"): 1, ("backing_off--retry_cancelled->cancelled", "taken"): 1}


def test_collector_stops_when_uninstalled():
    """Collector stops when uninstalled."""
    c = A.Collector().install()
    fail(brain_in(L.IDLE))
    c.uninstall()
    fail(brain_in(L.IDLE))
    assert c.counts == {(CHAIN[0], "taken"): 1}


def test_collector_json_round_trip_and_merge():
    """Collector JSON round trip and merge."""
    c = A.Collector()
    c.add({("b", "taken"): 2, ("a", "ignored"): 1})
    data = json.loads(json.dumps(c.to_json()))
    assert data == {"version": L.VERSION, "counts": [["a", "ignored", 1], ["b", "taken", 2]]}
    other = A.Collector()
    other.add({("b", "taken"): 1})
    other.add(A.Collector.counts_from_json(data))
    assert other.counts == {("b", "taken"): 3, ("a", "ignored"): 1}
    with pytest.raises(ValueError, match="not a Collector.to_json"):
        A.Collector.counts_from_json({"counts": [["a", "taken"]]})


def test_tour_covers_every_item_and_never_rejects_a_fallback():
    """Tour covers every item and never rejects a fallback."""
    with A.Collector() as c:
        tour()
    report = A.coverage(c.counts)
    assert report.declared == ITEMS
    assert report.uncovered == []
    assert (report.covered, report.percent) == (ITEMS, 100.0)
    for row in FALLBACKS:
        assert c.counts.get((row, "rejected"), 0) == 0
        assert c.counts[(row, "taken")] >= 1
    assert sorted(report.unrejectable) == sorted(FALLBACKS)


# ----------------------------------------------------------------------------- TraceWriter

def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_trace_writer_writes_header_then_one_record_per_line(tmp_path):
    """Trace writer writes header then one record per line."""
    path = tmp_path / "sub" / "trace.jsonl"
    seen: list[L.TransitionRecord] = []
    spy = lambda model, record: seen.append(record)  # noqa: E731
    L.add_recorder(spy)
    try:
        with A.TraceWriter(path) as tw:
            b = brain_in(L.IDLE)
            fail(b)
            b.backoff_elapsed(b.timer_id)
            succeed(b)
            b.abort_retry()
    finally:
        L.remove_recorder(spy)
    lines = read_lines(path)
    assert lines[0] == {"type": "trace", "version": L.VERSION, "machine": "retry_lifecycle"}
    assert lines[1:] == [r.to_json() for r in seen]
    assert [l["row"] for l in lines[1:]] == CHAIN + ["succeeded--retry_cancelled->(ignored)"]
    assert tw.records == 4 and tw.closed and tw.error is None
    assert path.read_bytes().endswith(b"}\n") and b"\r" not in path.read_bytes()


def test_trace_writer_for_one_model_and_stops_on_close(tmp_path):
    """Trace writer for one model and stops on close."""
    path = tmp_path / "t.jsonl"
    mine, other = brain_in(L.IDLE), brain_in(L.IDLE)
    tw = A.TraceWriter(path, model=mine)
    fail(other)
    fail(mine)
    tw.close()
    tw.close()  # twice is harmless
    mine.abort_retry()
    assert [l["row"] for l in read_lines(path)[1:]] == [CHAIN[0]]


def test_trace_writer_flushes_each_line_by_default(tmp_path):
    """Trace writer flushes each line by default."""
    path = tmp_path / "t.jsonl"
    with A.TraceWriter(path):
        fail(brain_in(L.IDLE))
        assert len(read_lines(path)) == 2  # visible before close: a killed process keeps it


def test_trace_writer_can_buffer(tmp_path):
    """Trace writer can buffer."""
    path = tmp_path / "t.jsonl"
    b = brain_in(L.IDLE)
    with A.TraceWriter(path, flush_every=3):
        assert len(read_lines(path)) == 1  # the header is flushed at once
        b.abort_retry()  # idle: an ignored cell, one record each time
        b.abort_retry()
        assert len(read_lines(path)) == 1
        b.abort_retry()
        assert len(read_lines(path)) == 4
        b.abort_retry()
    assert len(read_lines(path)) == 5


def test_trace_writer_rejects_a_bad_flush_interval(tmp_path):
    """Trace writer rejects a bad flush interval."""
    with pytest.raises(ValueError, match="flush_every must be at least 1, got 0"):
        A.TraceWriter(tmp_path / "t.jsonl", flush_every=0)
    assert not (tmp_path / "t.jsonl").exists()


def test_a_failing_trace_never_breaks_the_brain(tmp_path):
    """A failing trace never breaks the brain."""
    tw = A.TraceWriter(tmp_path / "t.jsonl")
    tw._file.close()  # the file goes away behind the writer's back
    b = brain_in(L.IDLE)
    with pytest.warns(RuntimeWarning, match="recording stopped after 0 records"):
        actions = fail(b)
    assert b.state == L.BACKING_OFF and actions
    assert isinstance(tw.error, ValueError)
    fail(b)  # no second warning: the writer is no longer a recorder
    tw.close()
    assert tw.closed


# ----------------------------------------------------------------------------- reading traces

def write_trace(path: Path, records: list[dict], version: str = L.VERSION,
                header: dict | None = None) -> Path:
    head = header if header is not None else {"type": "trace", "version": version,
                                                "machine": "retry_lifecycle"}
    path.write_text("\n".join(json.dumps(x) for x in [head] + records) + "\n", encoding="utf-8")
    return path


def rec(row: str, outcome: str = "taken", version: str = L.VERSION) -> dict:
    return {"row": row, "outcome": outcome, "version": version}


def test_read_trace_counts_records_and_skips_blank_lines(tmp_path):
    """Read trace counts records and skips blank lines."""
    path = write_trace(tmp_path / "t.jsonl", [rec(CHAIN[0]), rec(CHAIN[0]), rec(CHAIN[0], "rejected")])
    path.write_text(path.read_text() + "\n\n")
    t = A.read_trace(path)
    assert (t.version, t.records, t.foreign) == (L.VERSION, 3, False)
    assert t.counts == {(CHAIN[0], "taken"): 2, (CHAIN[0], "rejected"): 1}


@pytest.mark.parametrize("content, line, message", [
    ("", 0, "empty file: no trace header"),
    ('{"type": "log"}\n', 1, "the first line must be the trace header"),
    ('[1, 2]\n', 1, "expected a JSON object"),
    ('{"type": "trace", "version": "V", "machine": "other"}\n', 1, "a trace of machine 'other'"),
    ('HEADER\n{"row": "x", "outcome"\n', 2, "not JSON"),
    ('HEADER\n{"row": 1, "outcome": "taken"}\n', 2, "a record needs a string 'row'"),
    ('HEADER\n{"row": "x", "outcome": "maybe"}\n', 2, "a record needs a string 'row'"),
    ('HEADER\n\n{"row": "nope", "outcome": "taken"}\n', 3, "row 'nope' is not in the declaration"),
    ('HEADER\n{"row": "idle--turn_succeeded->idle", "outcome": "rejected"}\n', 2,
     "cannot be rejected (it can be: taken)"),
    ('HEADER\n{"row": "idle--retry_cancelled->(ignored)", "outcome": "taken"}\n', 2,
     "cannot be taken (it can be: ignored)"),
    ('HEADER\n{"row": "idle--turn_succeeded->idle", "outcome": "taken", "version": "old"}\n', 2,
     "record version 'old' differs from the header's"),
])
def test_read_trace_names_the_file_and_line_of_bad_input(tmp_path, content, line, message):
    """Read trace names the file and line of bad input."""
    header = json.dumps({"type": "trace", "version": L.VERSION, "machine": "retry_lifecycle"})
    path = tmp_path / "bad.jsonl"
    path.write_text(content.replace("HEADER", header), encoding="utf-8")
    with pytest.raises(A.TraceError, match=re.escape(message)) as info:
        A.read_trace(path)
    assert (info.value.path, info.value.line) == (str(path), line)
    assert str(info.value).startswith(f"{path}:{line}: " if line else f"{path}: ")


def test_read_trace_rejects_binary_and_missing_files(tmp_path):
    """Read trace rejects binary and missing files."""
    path = tmp_path / "bin.jsonl"
    write_trace(path, [])
    path.write_bytes(path.read_bytes() + b"\xff\xfe\n")
    with pytest.raises(A.TraceError, match="not UTF-8"):
        A.read_trace(path)
    with pytest.raises(A.TraceError, match="cannot read the trace") as info:
        A.read_trace(tmp_path / "missing.jsonl")
    assert info.value.line == 0


def test_foreign_trace_records_are_counted_apart_and_not_checked(tmp_path):
    """Foreign trace records are counted apart and not checked."""
    path = write_trace(tmp_path / "old.jsonl", [rec("a--row->gone", "taken", "0ld"),
                                                rec("a--row->gone", "ignored", "0ld")],
                       version="0ld")
    t = A.read_trace(path)
    assert t.foreign and t.records == 2
    bad = write_trace(tmp_path / "old-bad.jsonl", [], version="0ld")
    bad.write_text(bad.read_text() + "{not json\n")
    with pytest.raises(A.TraceError, match=r"old-bad.jsonl:2: not JSON"):
        A.read_trace(bad)


def test_audit_files_merges_ours_and_lists_foreign_apart(tmp_path):
    """Audit files merges ours and lists foreign apart."""
    a = write_trace(tmp_path / "a.jsonl", [rec(CHAIN[0]), rec(CHAIN[1])])
    b = write_trace(tmp_path / "b.jsonl", [rec(CHAIN[0]), rec(CHAIN[1], "rejected")])
    old = write_trace(tmp_path / "old.jsonl", [rec(CHAIN[2], "taken", "0ld")], version="0ld")
    report = A.audit_files([a, b, old])
    rows = {r.id: r for r in report.transitions}
    assert (rows[CHAIN[0]].taken, rows[CHAIN[0]].rejected) == (2, 0)
    assert (rows[CHAIN[1]].taken, rows[CHAIN[1]].rejected) == (1, 1)
    assert rows[CHAIN[2]].taken == 0  # the foreign record is not mixed in
    assert rows[CHAIN[1]].covered and not rows[CHAIN[0]].covered
    assert rows[CHAIN[0]].missing == ("rejected",)
    assert report.covered == 3
    assert [t.path for t in report.traces] == [str(a), str(b)]
    assert [(t.path, t.version) for t in report.foreign] == [(str(old), "0ld")]


def test_audit_files_with_only_foreign_traces_is_an_error(tmp_path):
    """Audit files with only foreign traces is an error."""
    old = write_trace(tmp_path / "old.jsonl", [], version="0ld")
    with pytest.raises(A.AllForeignError, match="version 0ld; this one is " + L.VERSION):
        A.audit_files([old])


# ----------------------------------------------------------------------------- the report

def test_coverage_items_and_percent():
    """Coverage items and percent."""
    report = A.coverage({(CHAIN[0], "taken"): 5, (CHAIN[0], "rejected"): 1,
                         ("idle--retry_cancelled->(ignored)", "ignored"): 2,
                         ("not-a-row", "taken"): 9})
    assert (report.declared, report.covered) == (ITEMS, 3)
    assert report.percent == round(300 / ITEMS, 2) == float(pct(3))
    assert report.summary() == f"3/{ITEMS} items ({pct(3)}%)"
    assert report.below(report.percent + 0.01) and not report.below(report.percent)
    uncovered = report.uncovered
    assert len(uncovered) == ITEMS - 3
    assert A.Item(CHAIN[0], "taken", True) not in uncovered
    by_row = {r.id: r for r in report.ignored}
    assert by_row["idle--retry_cancelled->(ignored)"].to_json() == {
        "id": "idle--retry_cancelled->(ignored)", "source": "idle", "trigger": "retry_cancelled",
        "reason": "no chain to cancel", "ignored": 2, "status": "covered", "covered": True,
        "missing": []}


def test_fallback_rows_have_only_a_taken_item():
    """Fallback rows have only a taken item."""
    report = A.coverage({})
    rows = {r.id: r for r in report.transitions}
    for row in FALLBACKS:
        assert [i.need for i in rows[row].items] == ["taken"]
    guarded = next(r for r in L.TRANSITIONS if r.guards and r.id not in FALLBACKS)
    assert [i.need for i in rows[guarded.id].items] == ["taken", "rejected"]


def test_report_json_shape():
    """Report JSON shape."""
    data = A.coverage({(CHAIN[0], "taken"): 1}).to_json()
    assert {"declared", "covered", "percent", "uncovered", "version", "definition",
            "transitions", "ignored", "unrejectable", "traces", "foreign", "statuses",
            "counts"} <= set(data)
    assert data["counts"] == [[CHAIN[0], "taken", 1]]
    assert data["statuses"] == {"covered": 0, "partly covered": 1, "not covered": N_ROWS - 1}
    assert (data["declared"], data["covered"], data["percent"]) == (ITEMS, 1, float(pct(1)))
    assert {"row": CHAIN[0], "need": "rejected"} in data["uncovered"]
    assert {"row": CHAIN[0], "need": "taken"} not in data["uncovered"]
    first = data["transitions"][0]
    assert first == {"id": CHAIN[0], "source": "idle", "trigger": "turn_failed_retryable",
                     "dest": "backing_off", "guards": list(ROW[CHAIN[0]].guards),
                     "taken": 1, "rejected": 0, "status": "partly covered", "covered": False,
                     "missing": ["rejected"], "declared": ROW[CHAIN[0]].declared}
    assert first["declared"].startswith("at_rest--")


def test_formats_of_a_report_without_traces_or_fallbacks():
    """Formats of a report without traces or fallbacks."""
    from fsm.review.diagrams import extract

    decl = {"states": ["a", "b"], "initial": "a", "triggers": ["t"], "guards": {"g": "g"},
            "transitions": [{"id": "a--t[g]->b", "source": "a", "trigger": "t", "dest": "b",
                             "guards": ["g"], "effect": None, "spec": ""}],
            "ignored": [{"id": "b--t->(ignored)", "source": "b", "trigger": "t", "reason": "r|s"}]}
    report = A.coverage({("a--t[g]->b", "taken"): 1, ("a--t[g]->b", "rejected"): 2,
                         ("b--t->(ignored)", "ignored"): 1}, extract(decl))
    text = A.format_text(report)
    assert "traces" not in text and "— fallback" not in text
    assert text.startswith("transition coverage of retry_lifecycle: 3/3 items (100.00%)\n"
                           "  transitions (1): 1 covered, 0 partly covered (taken, never "
                           "rejected), 0 not covered\n")
    assert re.search(r"^  covered +a--t\[g\]->b +1  2$", text, re.M)
    md = A.format_markdown(report)
    assert "Traces:" not in md
    assert "| ✅ covered | `a--t[g]->b` | 1 | 2 |  |" in md
    assert "| ✅ covered | `b--t->(ignored)` | 1 | r\\|s |" in md
    assert json.loads(A.format_json(report))["percent"] == 100.0


def test_empty_declaration_counts_as_fully_covered():
    """Empty declaration counts as fully covered."""
    from fsm.review.diagrams import Diagram

    report = A.coverage({}, Diagram("x", (), (), (), (), ()))
    assert (report.declared, report.percent, report.below(100)) == (0, 100.0, False)


# ----------------------------------------------------------------------------- the command

@pytest.fixture
def full_trace(tmp_path) -> Path:
    path = tmp_path / "full.jsonl"
    with A.TraceWriter(path):
        tour()
    return path


@pytest.fixture
def one_chain(tmp_path) -> Path:
    path = tmp_path / "chain.jsonl"
    with A.TraceWriter(path):
        b = brain_in(L.IDLE)
        fail(b)
        b.backoff_elapsed(b.timer_id)
        succeed(b)
    return path


def test_audit_table_puts_the_summary_first_and_lists_every_row_once(one_chain, capsys):
    """--table: the coverage summary first, then every transition and ignored cell once."""
    assert main(["audit", str(one_chain), "--table"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"transition coverage of retry_lifecycle: 3/{ITEMS} items ({pct(3)}%)"
    assert lines[1] == (f"  transitions ({N_ROWS}): 1 covered, 2 partly covered (taken, never "
                        f"rejected), {N_ROWS - 3} not covered")
    assert lines[2] == f"  ignored cells ({N_IGNORED}): 0 seen ignored, {N_IGNORED} never seen"
    assert A.DEFINITION in out
    for r in L.TRANSITIONS:
        assert sum(f" {r.id} " in l for l in lines) == 1, r.id  # listed once, never repeated
    for i in L.IGNORED:
        assert sum(f" {i.id} " in l for l in lines) == 1, i.id
    assert "uncovered items" not in out
    line = next(l for l in lines if f" {CHAIN[2]} " in l)
    assert line.split()[0] == "covered" and line.split()[-3:] == ["1", "—", "unguarded"]
    line = next(l for l in lines if f" {CHAIN[0]} " in l)
    assert line.startswith("  partly covered ") and line.endswith("1  0            never rejected")
    line = next(l for l in lines if f" {FALLBACKS[0]} " in l)
    assert line.startswith("  not covered ") and line.endswith("0  — fallback   never taken")
    assert f"{one_chain}: 3 records" in out


def test_a_taken_row_is_never_reported_not_covered(tmp_path, capsys):
    """The demo's chain (two retries, then a success): every row it took is covered or partly
    covered, never "not covered" (the issue: "a transition the demo took is reported MISS")."""
    path = tmp_path / "demo.jsonl"
    with A.TraceWriter(path):
        b = brain_in(L.IDLE)
        fail(b)
        b.backoff_elapsed(b.timer_id)
        fail(b)
        b.backoff_elapsed(b.timer_id)
        succeed(b)
    taken = {l["row"] for l in read_lines(path)[1:]}
    assert main(["audit", str(path), "--format", "json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)["transitions"]}
    assert len(taken) == 4
    for row in taken:
        assert rows[row]["status"] in ("covered", "partly covered"), row
    assert rows["continuing--turn_succeeded->succeeded"]["status"] == "covered"
    assert {r["status"] for r in rows.values() if r["id"] not in taken} == {"not covered"}


def test_audit_json_and_markdown(one_chain, capsys):
    """Audit JSON and markdown."""
    assert main(["audit", str(one_chain), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["declared"], data["covered"], data["percent"]) == (ITEMS, 3, float(pct(3)))
    assert data["traces"] == [{"path": str(one_chain), "records": 3}]
    assert main(["audit", str(one_chain), "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert md.index(f"**3/{ITEMS} items ({pct(3)}%)**") < md.index("## Transitions")
    assert f"| ✅ covered | `{CHAIN[2]}` | 1 | — unguarded |  |" in md
    assert f"| 🟡 partly covered | `{CHAIN[0]}` | 1 | 0 | never rejected |" in md
    assert f"| ❌ not covered | `{FALLBACKS[0]}` | 0 | — fallback | never taken |" in md
    assert "| ❌ not covered | `idle--retry_cancelled->(ignored)` | 0 | no chain to cancel |" in md


def test_audit_fail_under(one_chain, full_trace, capsys):
    """Audit fail under."""
    low, high = pct(3), f"{float(pct(3)) + 0.01:.2f}"
    assert main(["audit", str(one_chain), "--fail-under", low]) == 0
    assert main(["audit", str(one_chain), "--fail-under", high]) == 1
    assert (f"FAIL: transition coverage {low}% is under --fail-under {float(high):g}% "
            f"({ITEMS - 3} items uncovered)") in capsys.readouterr().err
    assert main(["audit", str(full_trace), "--fail-under", "100", "--table"]) == 0
    assert capsys.readouterr().out.startswith(
        f"transition coverage of retry_lifecycle: {ITEMS}/{ITEMS} items (100.00%)\n")
    assert main(["audit", str(full_trace), "--fail-under", "100"]) == 0
    assert (f"coverage of retry_lifecycle: {ITEMS}/{ITEMS} items (100.00%)"
            in capsys.readouterr().out)


@pytest.mark.parametrize("value", ["101", "-1", "lots"])
def test_audit_rejects_a_bad_threshold(one_chain, value, capsys):
    """Audit rejects a bad threshold."""
    with pytest.raises(SystemExit) as info:
        main(["audit", str(one_chain), "--fail-under", value])
    assert info.value.code == 2
    assert "expected a percentage from 0 to 100" in capsys.readouterr().err


def test_audit_bad_input_exits_2_naming_file_and_line(tmp_path, one_chain, capsys):
    """Audit bad input exits 2 naming file and line."""
    assert main(["audit", str(tmp_path / "missing.jsonl")]) == 2
    assert f"error: {tmp_path / 'missing.jsonl'}: cannot read the trace" in capsys.readouterr().err
    broken = tmp_path / "broken.jsonl"
    broken.write_text(one_chain.read_text() + '{"row": \n')
    assert main(["audit", str(one_chain), str(broken)]) == 2
    assert f"error: {broken}:5: not JSON" in capsys.readouterr().err


def test_audit_reports_foreign_traces(tmp_path, one_chain, capsys):
    """Audit reports foreign traces."""
    old = write_trace(tmp_path / "old.jsonl", [rec(CHAIN[2], "taken", "0ld")], version="0ld")
    assert main(["audit", str(one_chain), str(old)]) == 0
    captured = capsys.readouterr()
    assert (f"{old}: recorded with another declaration (version 0ld), not counted"
            in captured.out)
    assert f"warning: {old} was recorded with another declaration (version 0ld" in captured.err
    assert main(["audit", str(one_chain), str(old), "--table"]) == 0
    captured = capsys.readouterr()
    assert f"  {old}: version 0ld, 1 records" in captured.out
    assert captured.out.startswith(f"transition coverage of retry_lifecycle: 3/{ITEMS} items")
    assert f"warning: {old} was recorded with another declaration (version 0ld" in captured.err
    assert main(["audit", str(old)]) == 2
    assert "every trace was recorded with another declaration" in capsys.readouterr().err
    assert main(["audit", str(one_chain), str(old), "--format", "md"]) == 0
    assert f"Foreign traces, not counted: `{old}` (version `0ld`, 1)" in capsys.readouterr().out


def svg_edge_styles(path: Path) -> dict[str, tuple[bool, str]]:
    """Edge id → (drawn dashed, stroke colour); the review diagram draws an edge in two halves
    around its label (``ID#from``, ``ID#to``), both styled alike: they count as one."""
    root = ET.parse(path).getroot()
    out = {}
    for g in root.iter(f"{SVG_NS}g"):
        if g.get("class") == "edge":
            paths = list(g.iter(f"{SVG_NS}path"))
            out[g.get("id").split("#")[0]] = (any(p.get("stroke-dasharray") for p in paths),
                                              paths[0].get("stroke"))
    return out


def test_audit_svg_states_writes_one_small_picture_per_state_by_coverage(one_chain, tmp_path):
    """--svg-states DIR writes DIR/<state>.svg for every state (the small pictures of
    diagrams/states/), each edge coloured by its rows' coverage: a chain's rows solid, the
    rows never taken red and dashed."""
    out = tmp_path / "cov"
    assert main(["audit", str(one_chain), "--svg-states", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{s}.svg" for s in L.STATES)
    backing_off = (out / f"{L.BACKING_OFF}.svg").read_text(encoding="utf-8")
    assert backing_off.startswith("<?xml") or backing_off.lstrip().startswith("<svg") \
        or "<svg" in backing_off[:400]
    width = float(re.search(r'<svg width="([\d.]+)pt"', backing_off).group(1))
    assert width < 1500  # a small picture, not the per-transition one of thousands of points
    styles = svg_edge_styles(out / f"{L.BACKING_OFF}.svg")
    solid = {colour for dashed, colour in styles.values() if not dashed}
    dashed = {colour for is_dashed, colour in styles.values() if is_dashed}
    assert solid and dashed and not solid & dashed  # taken rows solid, the others red, dashed
    assert "never taken" in backing_off and "turn_failed_fatal" in backing_off


def test_audit_svg_states_refuses_a_file_as_its_folder(one_chain, tmp_path, capsys):
    """--svg-states FILE (an existing file) exits 2 with one line, before reading the traces."""
    f = tmp_path / "states.svg"
    f.write_text("x")
    assert main(["audit", str(one_chain), "--svg-states", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a file" in err[0] and f.read_text() == "x"


def test_audit_svg_draws_declared_rows_by_status(one_chain, tmp_path):
    """The review-level picture: a row drawn once for the at-rest group is as covered as its
    member states together; an edge the chain took is never dashed."""
    out = tmp_path / "review.svg"
    assert main(["audit", str(one_chain), "--svg", str(out)]) == 0
    styles = svg_edge_styles(out)
    chain = [("at_rest", L.BACKING_OFF), (L.BACKING_OFF, L.CONTINUING), (L.CONTINUING, L.SUCCEEDED)]
    # (the at-rest rows are drawn from idle, the group's first member; their ids keep the group)
    for src, dst in chain:
        assert styles[f"{src}->{dst}"][0] is False, (src, dst)
    assert styles["at_rest->backing_off"][1] == styles["backing_off->continuing"][1]  # partly
    assert styles["continuing->succeeded"][1] != styles["at_rest->backing_off"][1]  # covered
    untaken = [k for k in styles if k != "initial" and (k.split("->")[0], k.split("->")[1]) not in chain
               and k != "continuing->backing_off"]
    assert untaken and all(styles[k][0] for k in untaken)
    text = out.read_text(encoding="utf-8")
    assert "taken 1 (in 1 of 4 states), never rejected" in text
    assert ">never taken</text>" in text
    assert "taken, but not in every state, or never rejected" in text  # the legend
    assert f"transition coverage 3/{ITEMS} items ({pct(3)}%)" in text


def test_audit_svg_of_a_full_trace_is_all_solid(full_trace, tmp_path):
    """Audit svg of a full trace is all solid."""
    out = tmp_path / "full.svg"
    states = tmp_path / "states"
    assert main(["audit", str(full_trace), "--svg", str(out), "--svg-states", str(states)]) == 0
    assert not any(dashed for dashed, _ in svg_edge_styles(out).values())
    for picture in states.glob("*.svg"):
        assert not any(dashed for dashed, _ in svg_edge_styles(picture).values()), picture.name
    assert len({colour for _, colour in svg_edge_styles(out).values()}) <= 2  # covered, initial
    assert len(list(states.glob("*.svg"))) == len(L.STATES)


def test_audit_svg_without_dot_exits_2(one_chain, tmp_path, monkeypatch, capsys):
    """Audit svg without dot exits 2."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(["audit", str(one_chain), "--svg", str(tmp_path / "c.svg")]) == 2
    assert "Graphviz's 'dot' program was not found" in capsys.readouterr().err
    assert main(["audit", str(one_chain), "--svg-states", str(tmp_path / "c.svg")]) == 2
    assert "Graphviz's 'dot' program was not found" in capsys.readouterr().err


def counts_file(path: Path, data: dict, pretty: bool = True) -> Path:
    path.write_text(json.dumps(data, indent=2 if pretty else None) + "\n", encoding="utf-8")
    return path


def test_a_counts_file_is_read_like_a_trace(tmp_path):
    """A counts file is read like a trace."""
    data = {"version": L.VERSION, "machine": "retry_lifecycle",
            "counts": [[CHAIN[0], "taken", 3], [CHAIN[0], "rejected", 2]]}
    for pretty in (True, False):
        t = A.read_trace(counts_file(tmp_path / f"c{pretty}.json", data, pretty))
        assert t.counts == {(CHAIN[0], "taken"): 3, (CHAIN[0], "rejected"): 2}
        assert (t.records, t.foreign) == (5, False)
    old = A.read_trace(counts_file(tmp_path / "old.json", {**data, "version": "0ld",
                                                             "counts": [["gone", "taken", 1]]}))
    assert old.foreign and old.records == 1


@pytest.mark.parametrize("data, message", [
    ({"counts": []}, 'a counts file needs "version"'),
    ({"version": L.VERSION, "counts": {}}, 'a counts file needs "version"'),
    ({"version": L.VERSION, "machine": "other", "counts": []}, "counts of machine 'other'"),
    ({"version": L.VERSION, "counts": [[CHAIN[0], "taken"]]}, "a count must be [row, outcome, n >= 0]"),
    ({"version": L.VERSION, "counts": [[CHAIN[0], "taken", -1]]}, "a count must be"),
    ({"version": L.VERSION, "counts": [[CHAIN[0], "taken", True]]}, "a count must be"),
    ({"version": L.VERSION, "counts": [["nope", "taken", 1]]}, "row 'nope' is not in the declaration"),
])
def test_a_bad_counts_file_is_a_clear_error(tmp_path, data, message):
    """A bad counts file is a clear error."""
    path = counts_file(tmp_path / "bad.json", data)
    with pytest.raises(A.TraceError, match=re.escape(message)):
        A.read_trace(path)


def test_a_broken_pretty_counts_file_names_its_line(tmp_path):
    """A broken pretty counts file names its line."""
    path = tmp_path / "broken.json"
    path.write_text('{\n  "version": "x",\n  "counts": [\n', encoding="utf-8")
    with pytest.raises(A.TraceError, match=r"broken.json:4: not JSON") as info:
        A.read_trace(path)
    assert info.value.line == 4


def test_a_trace_path_that_is_a_fifo_is_refused_at_once(tmp_path):
    """Attack report: --trace on a FIFO with no reader hung the start-up forever."""
    import os

    import pytest as _pytest

    from fsm.review.audit import TraceWriter
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with _pytest.raises(OSError):
        TraceWriter(fifo)
