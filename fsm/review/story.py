"""The story of one trace: the path the machine took, step by step, in a screenful.

``python -m fsm audit TRACE`` prints it first (:func:`format_story`), then one line of
coverage; ``--table`` prints the full coverage table instead (:func:`fsm.review.audit.format_text`).

A step is one *taken* transition (or one ignored fact) of the trace, in the order recorded:
the state it left and the one it reached, the trigger, how its guards came out (``✓`` passed,
``✗`` failed: the guard values that took the row; the rows of the cell tried and rejected
before it are counted), what the
row does in the declaration's words and the events it emits (``auto_retry_start``,
``auto_retry_end (reason)``; docs/policy.md §3). When a record carries a time (``"t"`` or
``"at"``, ms since the epoch, or ``"ms"`` since the trace began) the step shows it as
seconds since the first step; without one, the step number is all the order there is.

Records are read as :meth:`fsm.core.lifecycle.TransitionRecord.to_json` writes them; the
checks of :func:`fsm.review.audit.read_trace` are not repeated here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from fsm.review.diagrams import Diagram, extract

__all__ = ["Step", "read_steps", "format_story", "guards_text", "events_text", "ITEM",
           "GUARDS"]

ITEM = ("an item is one thing a trace can show: a transition taken, a guarded transition "
        "seen rejected, or an ignored (state, trigger) cell seen ignored")
"""What the audit counts, in one phrase (its ``items``)."""

GUARDS = ("guards: the values that took the row, '6 ✓' = six guards were true (two or fewer are "
          "named), 'name ✗' = name was false (so a row needing ¬name held)")
"""The guards column's shorthand in one line (the CLI prints it under a path, the HTML report's
legend says the same)."""

MAX_STEPS = 30
"""Steps shown before the middle of a long path is elided (a screenful with the summary)."""


@dataclass(frozen=True, slots=True)
class Step:
    """One step of the path: ``number`` (1-based, in record order), ``time_ms`` (ms since the
    first step, None without times), ``source`` → ``dest`` (``dest`` None when ignored),
    ``trigger``, ``guards`` ((name, passed) in evaluation order, over the rejected rows and the
    taken one), ``rejected`` (rows tried and rejected before it), ``effect`` (the row's effect
    name) and ``line`` (the line of the trace file)."""

    number: int
    time_ms: int | None
    source: str
    trigger: str
    dest: str | None
    guards: tuple[tuple[str, bool], ...]
    rejected: int
    effect: str | None
    line: int


def _time(obj: dict) -> int | None:
    for key in ("t", "at", "ms", "now_ms", "timestamp"):
        value = obj.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value)
    return None


def read_steps(path: str | Path, diagram: Diagram | None = None) -> list[Step]:
    """The steps of a JSON-lines trace, in order; ``[]`` for a counts file (no order).

    Raises ``OSError`` when the file cannot be read; lines that are not records are skipped
    (the audit checks them first).
    """
    diagram = extract() if diagram is None else diagram
    effects = {e.id: e.effect for e in diagram.edges}
    steps: list[Step] = []
    rejected = 0
    first: int | None = None
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            text = line.strip()
            if number == 1 and text == "{":
                return []
            try:
                obj = json.loads(text) if text else None
            except (json.JSONDecodeError, RecursionError):
                continue
            if not isinstance(obj, dict) or "row" not in obj:
                continue
            guards = obj.get("guards") or {}
            pairs = tuple((str(g), bool(ok)) for g, ok in guards.items()) \
                if isinstance(guards, dict) else ()
            outcome = obj.get("outcome")
            if outcome == "rejected":
                rejected += 1
                continue
            t = _time(obj)
            if t is not None and first is None:
                first = t
            steps.append(Step(len(steps) + 1, None if t is None else t - (first or 0),
                              str(obj.get("source", "?")), str(obj.get("trigger", "?")),
                              obj.get("dest") if outcome == "taken" else None,
                              pairs,
                              rejected, effects.get(str(obj.get("row"))), number))
            rejected = 0
    return steps


def guards_text(step: Step) -> str:
    """The guards' values that took the row: ``6 ✓``, ``retry_enabled ✓, has_retries_left ✗``
    or ``3 ✓, hint_within_wait ✗`` (a ``!name`` guard that held means ``name`` was false)."""
    if not step.guards:
        return "-"
    values = [(g.lstrip("!"), ok != g.startswith("!")) for g, ok in step.guards]
    failed = [g for g, ok in values if not ok]
    passed = [g for g, ok in values if ok]
    if not failed:
        return f"{len(passed)} ✓" if len(passed) > 2 else " ".join(f"{g} ✓" for g in passed)
    lead = (f"{len(passed)} ✓, " if len(passed) > 2
            else "".join(f"{g} ✓, " for g in passed))
    return lead + ", ".join(f"{g} ✗" for g in failed)


def events_text(diagram: Diagram, effect: str | None) -> str:
    """The events a row with ``effect`` emits: ``auto_retry_start``, ``auto_retry_end (reason)``."""
    words = diagram.effect_text(effect)
    # the event phrases of fsm.core.lifecycle.EFFECT_WORDS; auto_retry_end's note is its endReason
    found = re.findall(r"\b(auto_retry_start|auto_retry_end)(?: \((\w+)\))?", words)
    return ", ".join(f"{name} ({why})" if why and name == "auto_retry_end" else name
                     for name, why in found)


def _width(text: str) -> int:
    """Terminal columns ``text`` takes: East Asian wide and full-width characters count two,
    combining marks none (``len`` would misalign a column after a state named ``待機``)."""
    import unicodedata
    return sum(0 if unicodedata.combining(c) else
               2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _pad(text: str, width: int, *, right: bool = False) -> str:
    fill = " " * max(0, width - _width(text))
    return fill + text if right else text + fill


def format_story(path: str | Path, steps: list[Step], diagram: Diagram | None = None,
                 *, limit: int = MAX_STEPS) -> list[str]:
    """The lines of the path: a heading, a header, one line per step — ``time`` (or the step
    number), the state left, ``→`` the state reached (``ignores`` for an ignored fact), the
    trigger, its guards, its events — each column as wide as its widest cell (header
    included, in terminal columns), the middle elided past ``limit`` steps."""
    diagram = extract() if diagram is None else diagram
    timed = any(s.time_ms is not None for s in steps)
    out = [f"the path taken in {path}: {len(steps)} steps"
           + ("" if timed else " (the trace records no times: steps in order)")]
    if not steps:
        return out
    header = ("time" if timed else "step", "from", "→ to", "trigger", "guards", "events")
    rows = [(f"{s.time_ms / 1000:.3f}s" if s.time_ms is not None else f"{s.number}.",
             s.source, "ignores" if s.dest is None else f"→ {s.dest}", s.trigger,
             guards_text(s)
             + (f" ({s.rejected} row{'s' if s.rejected > 1 else ''} rejected)" if s.rejected
                else ""),
             events_text(diagram, s.effect)) for s in steps]
    shown = rows if len(rows) <= limit else rows[:limit // 2] + [None] + rows[-(limit // 2):]
    widths = [max(_width(r[i]) for r in [header] + [r for r in shown if r is not None])
              for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        return ("  " + "  ".join([_pad(cells[0], widths[0], right=True)]
                                 + [_pad(c, w) for c, w in zip(cells[1:-1], widths[1:-1])]
                                 + [cells[-1]])).rstrip()

    out.append(line(header))
    for r in shown:
        if r is None:
            out.append(f"  … {len(rows) - 2 * (limit // 2)} steps not shown (--table counts "
                       "them all) …")
            continue
        out.append(line(r))
    return out


def format_report(report, *, limit: int = MAX_STEPS) -> str:
    """Text for ``python -m fsm audit TRACE``: the path of each trace file (counts files have
    none), then one line of coverage and what an item is. ``report`` is a
    :class:`fsm.review.audit.Report`; ``limit`` caps the steps shown per trace."""
    from fsm.review.audit import MACHINE

    diagram = extract()
    out: list[str] = []
    told = False
    for t in report.traces:
        steps = read_steps(t.path, diagram)
        if steps:
            out += format_story(t.path, steps, diagram, limit=limit)
            told = told or any(s.guards for s in steps)
        else:
            out.append(f"{t.path}: a counts file ({t.records} records), no path to tell")
    for t in report.foreign:
        out.append(f"{t.path}: recorded with another declaration (version {t.version}), "
                   "not counted")
    st = report.statuses()
    out.append(f"coverage of {MACHINE}: {report.summary()}: transitions {st['covered']} "
               f"covered, {st['partly covered']} partly, {st['not covered']} not; "
               "--table lists every item")
    out.append(f"  ({ITEM})")
    if told:
        out.append(f"  ({GUARDS})")
    return "\n".join(out) + "\n"
