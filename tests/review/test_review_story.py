"""The audit tells a trace's story first (fsm/review/story.py): the path taken in a screenful,
then one line of coverage; --table prints the full table."""

from __future__ import annotations

import json

import pytest

from fsm.__main__ import main
from fsm.core import lifecycle as L
from fsm.core.classify import Classification
from fsm.core.messages import AssistantMessage
from fsm.core.settings import RetrySettings
from fsm.core.brain import RetryBrain
from fsm.review import audit as A
from fsm.review import story as S

RETRYABLE = Classification("retryable", "retryable.status_503")
NONE = Classification("none", "stop_reason.not_error")


def fail(brain: RetryBrain) -> None:
    brain.turn_ended(AssistantMessage("error", error_message="503 Service Unavailable"),
                     classification=RETRYABLE)


def demo_like_trace(path, *, chains: int = 1) -> None:
    """Two retries then a success, ``chains`` times, then a refusal at rest (maxRetries 0)."""
    with A.TraceWriter(path):
        b = RetryBrain(RetrySettings(base_delay_ms=0))
        for _ in range(chains):
            fail(b)
            b.backoff_elapsed(b.timer_id)
            fail(b)
            b.backoff_elapsed(b.timer_id)
            b.turn_ended(AssistantMessage("stop", text="done"), classification=NONE)
        b.update_settings(RetrySettings(max_retries=0))
        fail(b)


def test_the_path_comes_first_and_fits_a_screen(tmp_path, capsys):
    """The demo's kind of trace: the path, step by step, then one coverage line and what an
    item is, in under 40 lines."""
    path = tmp_path / "trace.jsonl"
    demo_like_trace(path)
    assert main(["audit", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) <= 40
    assert lines[0].startswith(f"the path taken in {path}: 6 steps")
    steps = [l.split()[1:4] for l in lines[2:8]]
    assert steps == [["idle", "→", "backing_off"], ["backing_off", "→", "continuing"],
                     ["continuing", "→", "backing_off"], ["backing_off", "→", "continuing"],
                     ["continuing", "→", "succeeded"], ["succeeded", "→", "exhausted"]]
    assert " 6 ✓, fallback_due ✗" in lines[2] and lines[2].rstrip().endswith("auto_retry_start")
    assert "auto_retry_end (succeeded)" in lines[6]
    # the refusal: the guard values that took the row, the rows tried before it
    assert "retry_enabled ✓, has_retries_left ✗ (2 rows rejected)" in lines[7]
    assert "auto_retry_end (exhausted)" in lines[7]
    assert lines[8].startswith("coverage of retry_lifecycle: ") and "--table" in lines[8]
    assert lines[9].strip() == f"({S.ITEM})"
    assert lines[10].strip() == f"({S.GUARDS})"  # the "6 ✓" shorthand, explained
    assert all(len(l) <= 160 for l in lines)


def test_a_long_path_is_cut_in_the_middle(tmp_path, capsys):
    """Past 30 steps the middle is elided, so the report stays a screenful."""
    path = tmp_path / "long.jsonl"
    demo_like_trace(path, chains=10)
    assert main(["audit", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) <= 40
    assert any("steps not shown" in l for l in lines)
    assert lines[0].startswith(f"the path taken in {path}: 51 steps")
    assert lines[-4].split()[1:4] == ["succeeded", "→", "exhausted"]


def test_times_are_shown_when_records_carry_them(tmp_path):
    """A record with a time ("t", ms) shows seconds since the first step."""
    path = tmp_path / "timed.jsonl"
    demo_like_trace(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    timed = [lines[0]] + [json.dumps({**json.loads(l), "t": 1_000_000 + 250 * n})
                          for n, l in enumerate(lines[1:])]
    path.write_text("\n".join(timed) + "\n", encoding="utf-8")
    steps = S.read_steps(path)
    assert [s.time_ms for s in steps[:2]] == [0, 250]
    text = S.format_story(path, steps)
    assert "records no times" not in text[0]
    assert text[3].split()[0] == "0.250s"


def test_table_prints_every_item_and_counts_files_have_no_path(tmp_path, capsys):
    """--table is the full coverage table; a counts file says it has no path to tell."""
    path = tmp_path / "trace.jsonl"
    demo_like_trace(path)
    assert main(["audit", str(path), "--table"]) == 0
    table = capsys.readouterr().out
    assert all(f" {r.id} " in table for r in L.TRANSITIONS)
    counts = tmp_path / "counts.json"
    counts.write_text(json.dumps(A.audit_files([path]).to_json(), indent=2), encoding="utf-8")
    assert main(["audit", str(counts)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{counts}: a counts file (8 records), no path to tell"
    assert out[1].startswith("coverage of retry_lifecycle: ")


def test_the_audit_needs_a_trace_or_an_event_log(capsys):
    """No TRACE and no --events is a clear error."""
    assert main(["audit"]) == 2
    assert "give a TRACE" in capsys.readouterr().err


@pytest.mark.subprocess
def test_the_demo_s_trace_tells_its_story_in_a_screen(demo_run, capsys):
    """`python -m fsm demo` (the run tests/conftest.py ``demo_run`` shares) then `python -m fsm
    audit build/demo/trace.jsonl`: the path first (a 529, a 503, then success), the coverage
    line after it, under 40 lines."""
    proc, out_dir = demo_run
    assert proc.returncode == 0, proc.stderr
    trace = out_dir / "trace.jsonl"
    assert main(["audit", str(trace)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) <= 40
    assert lines[0].startswith(f"the path taken in {trace}: ")
    path = [l.split()[1:4] for l in lines[2:] if l.strip()[:1].isdigit()]
    assert path[0] == ["idle", "→", "backing_off"] and path[-1] == ["continuing", "→", "succeeded"]
    assert [l for l in lines if l.startswith("coverage of ")] == [lines[-3]]


def test_a_trace_written_with_the_host_clock_tells_when_each_step_happened(tmp_path):
    """TraceWriter with a clock stamps each line with "t"; the story then shows the times
    (seconds since the first step) instead of step numbers."""
    from fsm.core.brain import RetryBrain
    from fsm.core.messages import AssistantMessage
    from fsm.review.audit import TraceWriter
    from fsm.review.story import read_steps
    from fsm.testing import FakeClock

    clock = FakeClock()
    brain = RetryBrain()
    path = tmp_path / "trace.jsonl"
    with TraceWriter(path, model=brain, clock=clock):
        brain.turn_ended(AssistantMessage("error", error_message="529 Overloaded", timestamp_ms=0), 0)
        clock.now += 2.0  # the backoff
        brain.backoff_elapsed(1)
    steps = read_steps(path)
    assert [s.time_ms for s in steps] == [0, 2000]


def test_story_columns_align_for_any_width_of_names():
    """Every column starts at the same terminal column on every line, whatever the widths of
    the state and trigger names (wide characters included) and of the times."""
    import unicodedata

    def width(text):
        return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)

    steps = [S.Step(1, 0, "idle", "turn_failed_retryable_with_a_long_name", "backing_off",
                    (("retry_enabled", True),), 0, None, 1),
             S.Step(2, 2_500, "a_very_long_state_name_indeed", "t", "待機", (), 2, None, 2),
             S.Step(3, 123_456, "待機", "tick", None, (), 0, None, 3)]
    lines = S.format_story("trace.jsonl", steps)[1:]
    cells = [("time", "from", "→ to", "trigger", "guards"),
             ("0.000s", "idle", "→ backing_off", "turn_failed_retryable_with_a_long_name",
              "retry_enabled ✓"),
             ("2.500s", "a_very_long_state_name_indeed", "→ 待機", "t", "- (2 rows rejected)"),
             ("123.456s", "待機", "ignores", "tick", "-")]
    assert len(lines) == len(cells)
    starts = []
    for line, row in zip(lines, cells):
        at, columns = 0, []
        for cell in row:
            at = line.index(cell, at)
            columns.append(width(line[:at]))
            at += len(cell)
        starts.append(columns)
    ends = [width(line[:line.index(row[0]) + len(row[0])]) for line, row in zip(lines, cells)]
    assert len(set(ends)) == 1, lines  # the time column is right-aligned
    for column in range(1, len(cells[0])):
        assert len({s[column] for s in starts}) == 1, (cells[0][column], lines)
