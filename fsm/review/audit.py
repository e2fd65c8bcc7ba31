"""Transition coverage of the retry lifecycle: recording, trace files and the audit (docs/policy.md §7).

Recording hooks into the engine that runs the brain: a recorder hears every *tried* transition
as a :class:`fsm.core.lifecycle.TransitionRecord`, either of every brain firing in the current
context (:func:`fsm.core.lifecycle.recording` / :func:`~fsm.core.lifecycle.add_recorder`; the
asyncio tasks started inside inherit it) or of one brain (``RetryBrain.add_recorder``):

- :class:`Collector` counts records in memory per (row id, outcome) and, asked to, keeps their
  *contexts* (:class:`Context`: the first :data:`CONTEXT_LIMIT` test ids per row, outcome and
  failing guard, and their count); the pytest plugin (:mod:`fsm.review.pytest_plugin`) uses
  it, and :mod:`fsm.review.report` shows them;
- :class:`TraceWriter` writes them to a JSON-lines trace file, for ``--trace FILE`` of the
  ``demo``, ``rpc`` and ``chat`` commands.

A trace file is a header line ``{"type": "trace", "version": VERSION, "machine":
"retry_lifecycle"}`` and then one :meth:`TransitionRecord.to_json` object per line.

:func:`coverage` turns counts into a :class:`Report`. The coverage *items* are:

- one per declared transition: it was **taken** at least once;
- one more per guarded transition: it was seen **rejected** (a guard failed) at least once,
  except a cell's fallback row, which the declaration never lets be rejected (whenever its
  guards fail an earlier row of the cell is taken; see :class:`fsm.review.diagrams.Edge`);
- one per ignored cell: it was seen **ignored** at least once.

``percent`` is covered items / all items. The transitions counted are the ones the machine
runs: a row declared once for a group of states (``at_rest``) counts once per member state
(docs/policy.md §7). A trace recorded with another declaration (another
:data:`fsm.core.lifecycle.VERSION`) is listed apart and never mixed in.

Each transition has one of three statuses (:data:`STATUSES`): **covered** (every item seen),
**partly covered** (taken, but its rejection was never seen) and **not covered** (never taken).
A taken transition is never reported or drawn as missed.

:func:`read_trace` also reads a *counts file*: one JSON object with ``"version"``,
``"machine"`` and ``"counts": [[row, outcome, n], ...]`` — what :meth:`Report.to_json`
writes, so the pytest plugin's ``build/transition-coverage.json`` can be audited and drawn
like a trace.
"""

from __future__ import annotations

import json
import stat
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterable, Mapping

from fsm.core import lifecycle as L
from fsm.review.diagrams import Diagram, EdgeMark, extract

MACHINE = "retry_lifecycle"
"""The ``machine`` field of a trace header."""

OUTCOMES: tuple[str, ...] = ("taken", "rejected", "ignored")

DEFINITION = (
    "covered means: every transition the machine runs (a row declared for a group of states "
    "counts once per member state) taken at least once; every guarded transition "
    "also seen rejected at least once (except the fallback row of a cell, which can never be "
    "rejected); every ignored (state, trigger) cell seen ignored at least once"
)

Counts = dict[tuple[str, str], int]
"""``{(row id, outcome): number of records}``."""

CONTEXT_LIMIT = 10
"""How many test ids (contexts) a report keeps per (row, outcome, failing guard); the rest are
only counted (:attr:`Context.total`)."""

ContextKey = tuple[str, str, str]
"""``(row id, outcome, guard)``: ``guard`` is the guard whose failure rejected the row (the
last one evaluated, ``!name`` as declared) for ``"rejected"``, else ``""``."""


@dataclass(slots=True)
class Context:
    """Who exercised one (row, outcome, failing guard): ``records`` (how many times), ``tests``
    (the first :data:`CONTEXT_LIMIT` contexts, in the order seen: pytest node ids, or the path
    of a trace file) and ``total`` (how many distinct contexts, listed or not)."""

    records: int = 0
    tests: list[str] = field(default_factory=list)
    total: int = 0
    last: str | None = field(default=None, repr=False, compare=False)

    def hear(self, context: str | None, n: int = 1) -> None:
        """``n`` more records in ``context`` (None: outside any test; counted, not listed).
        Records of one context arrive together (a test runs to its end before the next
        starts), so a change of context is a new one."""
        self.records += n
        if context is None or context == self.last:
            return
        self.last = context
        self.total += 1
        if len(self.tests) < CONTEXT_LIMIT:
            self.tests.append(context)

    def merge(self, other: "Context") -> None:
        """Add ``other``'s records and contexts (another xdist worker's: its tests are others)."""
        self.records += other.records
        self.total += other.total
        for t in other.tests:
            if len(self.tests) >= CONTEXT_LIMIT:
                break
            if t not in self.tests:
                self.tests.append(t)

    @property
    def more(self) -> int:
        """Contexts counted but not listed."""
        return max(0, self.total - len(self.tests))


Contexts = dict[ContextKey, Context]


def failing_guard(guards) -> str:
    """The guard that rejected a row: the last ``(guard, passed)`` pair, when it failed
    (evaluation stops at the first failing guard); ``""`` if none failed. ``guards`` is a
    record's pairs or its JSON mapping ``{guard: passed}``."""
    pairs = list(guards.items()) if isinstance(guards, Mapping) else list(guards)
    return next((str(g) for g, ok in pairs if not ok), "")


def contexts_to_json(contexts: Mapping[ContextKey, Context]) -> list[dict]:
    """``[{"row", "outcome", "guard", "records", "tests", "total"}, ...]`` sorted by key."""
    return [{"row": row, "outcome": outcome, "guard": guard, "records": c.records,
             "tests": list(c.tests), "total": c.total}
            for (row, outcome, guard), c in sorted(contexts.items())]


def contexts_from_json(data: object) -> Contexts:
    """The contexts of :func:`contexts_to_json`; ``ValueError`` naming the entry if malformed."""
    out: Contexts = {}
    if not isinstance(data, list):
        raise ValueError(f"contexts must be a list, got {type(data).__name__}")
    for entry in data:
        try:
            key = (str(entry["row"]), str(entry["outcome"]), str(entry.get("guard", "")))
            tests = [str(t) for t in entry["tests"]]
            c = Context(int(entry["records"]), tests[:CONTEXT_LIMIT],
                        max(int(entry["total"]), len(tests)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"a context must be {{row, outcome, guard, records, tests, total}}; "
                             f"got {entry!r:.160}") from exc
        if key in out:
            out[key].merge(c)
        else:
            out[key] = c
    return out


def merge_contexts(into: Contexts, other: Mapping[ContextKey, Context]) -> None:
    """Merge ``other`` into ``into`` (see :meth:`Context.merge`)."""
    for key, c in other.items():
        if key in into:
            into[key].merge(c)
        else:
            into[key] = Context(c.records, list(c.tests), c.total)


# ----------------------------------------------------------------------------- recording

class Collector:
    """In-memory counts of tried transitions: ``counts[(row id, outcome)] -> int``.

    A recorder of the current context (:func:`fsm.core.lifecycle.add_recorder`); ``model``
    restricts it to one brain. Use :meth:`install` / :meth:`uninstall` or ``with Collector() as
    c:``.

    With ``contexts=True`` it also keeps, per (row, outcome, failing guard), who exercised it
    (:class:`Context`): whatever :attr:`context` names when the record arrives (the pytest
    plugin sets it to the running test's node id; None: outside any test).
    """

    __slots__ = ("counts", "model", "contexts", "context")

    def __init__(self, model: object | None = None, *, contexts: bool = False) -> None:
        self.counts: Counts = {}
        self.model = model
        self.contexts: Contexts | None = {} if contexts else None
        self.context: str | None = None

    def __call__(self, model: object, record: L.TransitionRecord) -> None:
        if self.model is not None and model is not self.model:
            return
        key = (record.row, record.outcome)
        self.counts[key] = self.counts.get(key, 0) + 1
        contexts = self.contexts
        if contexts is not None:
            guard = ""
            if record.outcome == "rejected":  # the last guard evaluated is the one that failed
                guard = next((g for g, ok in record.guards if not ok), "")
            ckey = (record.row, record.outcome, guard)
            c = contexts.get(ckey)
            if c is None:
                c = contexts[ckey] = Context()
            if self.context is None or self.context == c.last:
                c.records += 1  # the common case, without a call: the same test again
            else:
                c.hear(self.context)

    def install(self) -> "Collector":
        L.add_recorder(self)
        return self

    def uninstall(self) -> None:
        L.remove_recorder(self)

    def __enter__(self) -> "Collector":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()

    def add(self, counts: Mapping[tuple[str, str], int],
            contexts: Mapping[ContextKey, Context] | None = None) -> None:
        """Add other counts and contexts (for example a pytest-xdist worker's) to these."""
        for key, n in counts.items():
            self.counts[key] = self.counts.get(key, 0) + n
        if contexts and self.contexts is not None:
            merge_contexts(self.contexts, contexts)

    def to_json(self) -> dict:
        """``{"version": VERSION, "counts": [[row, outcome, n], ...]}`` (sorted), plus
        ``"contexts"`` (:func:`contexts_to_json`) when it keeps them."""
        out: dict[str, Any] = {
            "version": L.VERSION,
            "counts": [[row, outcome, n] for (row, outcome), n in sorted(self.counts.items())]}
        if self.contexts is not None:
            out["contexts"] = contexts_to_json(self.contexts)
        return out

    @staticmethod
    def counts_from_json(data: Mapping) -> Counts:
        """The counts of a :meth:`to_json` object; ``ValueError`` if it is not one."""
        try:
            return {(str(row), str(outcome)): int(n) for row, outcome, n in data["counts"]}
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a Collector.to_json() object: {data!r:.200}") from exc


class TraceWriter:
    """Write every tried transition to ``path`` as JSON lines (see the module doc).

    ``model`` restricts the trace to one brain; with a ``clock`` (the host's, ``time_ms()``) every
    line also carries ``"t"``, the epoch ms of the step. The file is truncated (its folder created);
    the header is written at once. The buffer is flushed every ``flush_every`` records and on
    :meth:`close`; the default, 1, flushes each line, so a killed process still leaves every
    transition it made in the file. Measured on a 2-core box: a brain transition costs about
    10 µs unrecorded, +3 µs traced with a flush per line, +1.4 µs with ``flush_every=64``
    (encoded lines are cached per distinct record). A write error never reaches the brain:
    the writer warns once (``RuntimeWarning``), stops recording and keeps the error in
    :attr:`error`. Use it as a context manager or call :meth:`close`.
    """

    def __init__(self, path: str | Path, model: object | None = None, *,
                 flush_every: int = 1, clock: Any = None) -> None:
        if flush_every < 1:
            raise ValueError(f"flush_every must be at least 1, got {flush_every}")
        self.path = Path(path)
        self.model = model
        # the host clock (``time_ms()``): each line then carries ``"t"`` (epoch ms), so the
        # audit's story of the trace shows when each step happened
        self._time_ms = getattr(clock, "time_ms", None)
        self.records = 0
        self.error: Exception | None = None
        self._flush_every = flush_every
        self._lines: dict[L.TransitionRecord, str] = {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A trace shows what a conversation did: private to its user, like the session log.
        # O_NONBLOCK: a FIFO with no reader fails at once instead of blocking the start-up.
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK, 0o600)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(f"trace file {self.path} is not a regular file")
        os.set_blocking(fd, True)
        self._file: IO[str] | None = os.fdopen(fd, "w", encoding="utf-8", newline="\n")
        header = {"type": "trace", "version": L.VERSION, "machine": MACHINE}
        self._file.write(json.dumps(header) + "\n")
        self._file.flush()
        self._attach()

    def _attach(self) -> None:
        # A brain records to its own recorders; otherwise the current context's.
        add = getattr(self.model, "add_recorder", None)
        (add or L.add_recorder)(self)

    def _detach(self) -> None:
        remove = getattr(self.model, "remove_recorder", None)
        (remove or L.remove_recorder)(self)

    def __call__(self, model: object, record: L.TransitionRecord) -> None:
        if self.model is not None and model is not self.model:
            return
        try:
            if self._time_ms is not None:
                line = json.dumps({**record.to_json(), "t": self._time_ms()}, ensure_ascii=False) + "\n"
            else:
                line = self._lines.get(record)
            if line is None:
                # A record holds no per-call data (no time, no attempt), so the few distinct
                # ones are encoded once: this keeps tracing at about a dict look-up plus a write.
                line = self._lines[record] = json.dumps(record.to_json(), ensure_ascii=False) + "\n"
            self._file.write(line)
            self.records += 1
            if self.records % self._flush_every == 0:
                self._file.flush()
        except (OSError, ValueError, AttributeError) as exc:
            # A trace is an observer: it must never break the session it watches.
            self.error = exc
            self._detach()
            warnings.warn(f"trace {self.path}: recording stopped after {self.records} records:"
                          f" {exc}", RuntimeWarning, stacklevel=2)

    @property
    def closed(self) -> bool:
        return self._file is None

    def close(self) -> None:
        """Stop recording, flush and close the file; closing twice does nothing."""
        self._detach()
        if self._file is not None:
            f, self._file = self._file, None
            f.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ----------------------------------------------------------------------------- traces

class TraceError(ValueError):
    """A trace file is missing or malformed: ``path`` and ``line`` (1-based, 0 if none) say where."""

    def __init__(self, path: str | Path, line: int, message: str) -> None:
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {message}")
        self.path = str(path)
        self.line = line


@dataclass
class Trace:
    """One trace file read: its declaration ``version``, ``records``, their ``counts`` and
    ``contexts`` (a trace's records are all of one context, its path; a counts file carries
    the contexts it was written with, the pytest plugin's test ids)."""

    path: str
    version: str
    records: int = 0
    counts: Counts = field(default_factory=dict)
    contexts: Contexts = field(default_factory=dict)

    @property
    def foreign(self) -> bool:
        """True when it was recorded with another declaration than this one."""
        return self.version != L.VERSION


def _row_kinds(diagram: Diagram) -> dict[str, tuple[str, ...]]:
    kinds = {e.id: ("taken", "rejected") if e.guards else ("taken",) for e in diagram.edges}
    kinds.update({i.id: ("ignored",) for i in diagram.ignored})
    return kinds


def read_trace(path: str | Path, diagram: Diagram | None = None) -> Trace:
    """Read and check one trace file or counts file (see the module doc).

    Raises :class:`TraceError` naming the file and the line when the file cannot be read, has
    no valid header, or a line is not a JSON object with a string ``row`` and an ``outcome`` in
    :data:`OUTCOMES`; for a trace of the current declaration also when a record names a row
    the declaration does not have, an outcome that row cannot have, or another version.
    A foreign trace's records are counted but not checked against this declaration. A counts
    file is checked the same way, its errors name line 1.
    """
    diagram = extract() if diagram is None else diagram
    kinds = _row_kinds(diagram)
    try:
        f = open(path, encoding="utf-8")
    except OSError as exc:
        raise TraceError(path, 0, f"cannot read the trace: {exc.strerror or exc}") from exc
    with f:
        trace: Trace | None = None
        number = 0
        try:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                if trace is None and line.strip() == "{":
                    # A pretty-printed JSON object: a counts file (a coverage report).
                    return _counts_file(path, line + f.read(), kinds)
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TraceError(path, number, f"not JSON ({exc.msg}): {line.strip()!r:.120}") \
                        from None
                except RecursionError:
                    raise TraceError(path, number, "JSON nested too deeply") from None
                if not isinstance(obj, dict):
                    raise TraceError(path, number, f"expected a JSON object, got {line.strip()!r:.120}")
                if trace is None:
                    if "counts" in obj and obj.get("type") != "trace":
                        return _counts_object(path, obj, kinds)
                    trace = _header(path, number, obj)
                    continue
                _count(trace, kinds, path, number, obj)
        except UnicodeDecodeError as exc:
            raise TraceError(path, number + 1, f"not UTF-8 text: {exc.reason}") from None
    if trace is None:
        raise TraceError(path, 0, "empty file: no trace header (is it a trace written by "
                                  "--trace / fsm.review.audit.TraceWriter, or a counts file?)")
    return trace


def _counts_file(path, text: str, kinds: Mapping[str, tuple[str, ...]]) -> Trace:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(path, exc.lineno, f"not JSON ({exc.msg})") from None
    except RecursionError:
        raise TraceError(path, 1, "JSON nested too deeply") from None
    return _counts_object(path, obj, kinds)


def _counts_object(path, obj: dict, kinds: Mapping[str, tuple[str, ...]]) -> Trace:
    """A counts file: ``{"version", "machine", "counts": [[row, outcome, n], ...]}``."""
    if not isinstance(obj.get("version"), str) or not isinstance(obj.get("counts"), list):
        raise TraceError(path, 1, 'a counts file needs "version" (a string) and "counts" (a '
                                  f'list of [row, outcome, n]); got keys {sorted(obj)[:8]}')
    if obj.get("machine", MACHINE) != MACHINE:
        raise TraceError(path, 1, f"counts of machine {obj.get('machine')!r}, not {MACHINE!r}")
    trace = Trace(str(path), obj["version"])
    for entry in obj["counts"]:
        if (not isinstance(entry, list) or len(entry) != 3 or not isinstance(entry[2], int)
                or isinstance(entry[2], bool) or entry[2] < 0):
            raise TraceError(path, 1, f"a count must be [row, outcome, n >= 0]; got {entry!r:.160}")
        row, outcome, n = entry
        _count(trace, kinds, path, 1, {"row": row, "outcome": outcome}, n, context=False)
    try:
        trace.contexts = contexts_from_json(obj.get("contexts", []))
    except ValueError as exc:
        raise TraceError(path, 1, str(exc)) from None
    if not trace.foreign:
        for row, outcome, _ in trace.contexts:
            if outcome not in kinds.get(row, ()):
                raise TraceError(path, 1, f"a context names row {row!r} as {outcome}, which "
                                          f"the declaration (version {trace.version}) does not have")
    return trace


def _header(path, number: int, obj: dict) -> Trace:
    if obj.get("type") != "trace" or not isinstance(obj.get("version"), str):
        raise TraceError(path, number, 'the first line must be the trace header {"type": "trace", '
                                       f'"version": ..., "machine": "{MACHINE}"}}, got {obj!r:.120}')
    if obj.get("machine") != MACHINE:
        raise TraceError(path, number, f"a trace of machine {obj.get('machine')!r}, not {MACHINE!r}")
    return Trace(str(path), obj["version"])


def _count(trace: Trace, kinds: Mapping[str, tuple[str, ...]], path, number: int,
           obj: dict, n: int = 1, *, context: bool = True) -> None:
    row, outcome = obj.get("row"), obj.get("outcome")
    if not isinstance(row, str) or outcome not in OUTCOMES:
        raise TraceError(path, number, "a record needs a string 'row' and an 'outcome' in "
                                       f"{', '.join(OUTCOMES)}; got {obj!r:.160}")
    if not trace.foreign:
        if obj.get("version", trace.version) != trace.version:
            raise TraceError(path, number, f"record version {obj.get('version')!r} differs from the "
                                           f"header's {trace.version!r}")
        if row not in kinds:
            raise TraceError(path, number, f"row {row!r} is not in the declaration "
                                           f"(version {trace.version})")
        if outcome not in kinds[row]:
            raise TraceError(path, number, f"row {row!r} cannot be {outcome} "
                                           f"(it can be: {', '.join(kinds[row])})")
    key = (row, outcome)
    trace.counts[key] = trace.counts.get(key, 0) + n
    trace.records += n
    if context:  # a trace's record: the trace file is its context
        guards = obj.get("guards") if isinstance(obj.get("guards"), (dict, list)) else {}
        ckey = (row, outcome, failing_guard(guards) if outcome == "rejected" else "")
        trace.contexts.setdefault(ckey, Context()).hear(str(path), n)


# ----------------------------------------------------------------------------- report

COVERED, PARTLY, NOT_COVERED = "covered", "partly covered", "not covered"
STATUSES: tuple[str, ...] = (COVERED, PARTLY, NOT_COVERED)
"""The status of a transition: every item seen; taken but never seen rejected; never taken.
An ignored cell is covered or not covered."""

STATUS_TEXT = {COVERED: "covered", PARTLY: "partly covered (taken, never rejected)",
               NOT_COVERED: "not covered"}

UNGUARDED = "unguarded"
"""Why a transition has no *rejected* item: it has no guard to fail."""
FALLBACK = "fallback"
"""Why a transition has no *rejected* item: whenever its guards fail, an earlier row of its
(state, trigger) cell is taken, so it is never tried and rejected."""
NO_REJECTION = (f"— : a rejection is impossible; '{UNGUARDED}': the row has no guard, "
                f"'{FALLBACK}': whenever its guards fail an earlier row of the cell is taken")


@dataclass(frozen=True, slots=True)
class Item:
    """One coverage item: ``row`` must be seen with outcome ``need``."""

    row: str
    need: str
    covered: bool

    def to_json(self) -> dict:
        return {"row": self.row, "need": self.need}


@dataclass(frozen=True, slots=True)
class RowCoverage:
    """Counts and items of one transition the machine runs (``dest`` set) or ignored cell.

    ``declared`` is the id of the declared row it comes from (a group row counts once per
    member state); ``no_rejection`` says why a transition has no *rejected* item
    (:data:`UNGUARDED`, :data:`FALLBACK`), empty when it has one.
    """

    id: str
    source: str
    trigger: str
    dest: str | None
    guards: tuple[str, ...]
    taken: int
    rejected: int
    ignored: int
    items: tuple[Item, ...]
    reason: str = ""
    declared: str = ""
    no_rejection: str = ""

    @property
    def covered(self) -> bool:
        return all(i.covered for i in self.items)

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(i.need for i in self.items if not i.covered)

    @property
    def status(self) -> str:
        """One of :data:`STATUSES`: never taken (or never seen ignored) is *not covered*."""
        if self.covered:
            return COVERED
        if self.dest is None or not self.taken:
            return NOT_COVERED
        return PARTLY

    def to_json(self) -> dict:
        out = {"id": self.id, "source": self.source, "trigger": self.trigger}
        if self.dest is None:
            out.update(reason=self.reason, ignored=self.ignored)
        else:
            out.update(dest=self.dest, guards=list(self.guards), taken=self.taken,
                       rejected=self.rejected)
            if self.no_rejection:
                out["no_rejection"] = self.no_rejection
            if self.declared and self.declared != self.id:
                out["declared"] = self.declared
        out.update(status=self.status, covered=self.covered, missing=list(self.missing))
        return out


@dataclass
class Report:
    """The coverage of one declaration by some counts (see the module doc for the items)."""

    version: str
    transitions: tuple[RowCoverage, ...]
    ignored: tuple[RowCoverage, ...]
    unrejectable: tuple[str, ...]
    traces: list[Trace] = field(default_factory=list)
    foreign: list[Trace] = field(default_factory=list)
    counts: Counts = field(default_factory=dict)
    contexts: Contexts = field(default_factory=dict)

    def context(self, row: str, outcome: str) -> list[tuple[str, Context]]:
        """``[(failing guard, Context)]`` of a transition or ignored cell ``row`` seen with
        ``outcome`` (one entry, guard ``""``, unless rejected), in guard order of the keys."""
        return [(g, c) for (r, o, g), c in sorted(self.contexts.items()) if (r, o) == (row, outcome)]

    @property
    def items(self) -> list[Item]:
        return [i for r in self.transitions + self.ignored for i in r.items]

    @property
    def declared(self) -> int:
        return len(self.items)

    @property
    def covered(self) -> int:
        return sum(i.covered for i in self.items)

    @property
    def percent(self) -> float:
        """Covered items in percent, rounded to 2 decimals (100.0 when nothing is declared)."""
        return round(100.0 * self.covered / self.declared, 2) if self.declared else 100.0

    @property
    def uncovered(self) -> list[Item]:
        return [i for i in self.items if not i.covered]

    def statuses(self) -> dict[str, int]:
        """``{status: number of transitions}`` for every status in :data:`STATUSES`."""
        out = dict.fromkeys(STATUSES, 0)
        for r in self.transitions:
            out[r.status] += 1
        return out

    def below(self, fail_under: float) -> bool:
        """True when :attr:`percent` (as shown, 2 decimals) is under ``fail_under``."""
        return self.percent < fail_under

    def summary(self) -> str:
        """``61/69 items (88.41%)``."""
        return f"{self.covered}/{self.declared} items ({self.percent:.2f}%)"

    def breakdown(self) -> list[str]:
        """Two lines: the transitions by status, the ignored cells seen."""
        st = self.statuses()
        seen = sum(r.covered for r in self.ignored)
        return [f"transitions ({len(self.transitions)}): {st[COVERED]} covered, {st[PARTLY]} "
                f"partly covered (taken, never rejected), {st[NOT_COVERED]} not covered",
                f"ignored cells ({len(self.ignored)}): {seen} seen ignored, "
                f"{len(self.ignored) - seen} never seen"]

    def to_json(self) -> dict:
        """The report; its ``version``, ``machine`` and ``counts`` make it a counts file."""
        return {
            "declared": self.declared, "covered": self.covered, "percent": self.percent,
            "statuses": self.statuses(),
            "uncovered": [i.to_json() for i in self.uncovered],
            "version": self.version, "machine": MACHINE, "definition": DEFINITION,
            "transitions": [r.to_json() for r in self.transitions],
            "ignored": [r.to_json() for r in self.ignored],
            "unrejectable": list(self.unrejectable),
            "traces": [{"path": t.path, "records": t.records} for t in self.traces],
            "foreign": [{"path": t.path, "version": t.version, "records": t.records}
                        for t in self.foreign],
            "counts": [[row, outcome, n] for (row, outcome), n in sorted(self.counts.items())],
            "context_limit": CONTEXT_LIMIT,
            "contexts": contexts_to_json(self.contexts),
        }


def coverage(counts: Mapping[tuple[str, str], int], diagram: Diagram | None = None,
             contexts: Mapping[ContextKey, Context] | None = None) -> Report:
    """The :class:`Report` of ``counts`` (``{(row id, outcome): n}``) and their ``contexts``
    (who exercised each row, optional) for ``diagram`` (default: the current declaration).
    Counts and contexts of rows it does not declare are ignored."""
    diagram = extract() if diagram is None else diagram
    get = counts.get
    rows = []
    for e in diagram.edges:
        taken, rejected = get((e.id, "taken"), 0), get((e.id, "rejected"), 0)
        items = [Item(e.id, "taken", taken > 0)]
        if e.rejectable:
            items.append(Item(e.id, "rejected", rejected > 0))
        why = "" if e.rejectable else UNGUARDED if not e.guards else FALLBACK
        rows.append(RowCoverage(e.id, e.source, e.trigger, e.dest, e.guards, taken, rejected, 0,
                                tuple(items), declared=e.row or e.id, no_rejection=why))
    ignored = []
    for i in diagram.ignored:
        n = get((i.id, "ignored"), 0)
        ignored.append(RowCoverage(i.id, i.source, i.trigger, None, (), 0, 0, n,
                                   (Item(i.id, "ignored", n > 0),), i.reason))
    unrejectable = tuple(e.id for e in diagram.edges if e.guards and not e.rejectable)
    known = {r.id for r in rows} | {r.id for r in ignored}
    kept = {key: n for key, n in counts.items() if key[0] in known and n}
    kept_contexts = {key: c for key, c in (contexts or {}).items() if key[0] in known}
    return Report(L.VERSION, tuple(rows), tuple(ignored), unrejectable, counts=kept,
                  contexts=kept_contexts)


class AllForeignError(ValueError):
    """Every trace given was recorded with another declaration: there is nothing to audit."""


def audit_files(paths: Iterable[str | Path]) -> Report:
    """Read the trace (or counts) files ``paths`` and report their merged coverage.

    Foreign traces are listed in :attr:`Report.foreign` and not counted. Raises
    :class:`TraceError` for a missing or malformed file and :class:`AllForeignError` when every
    trace is foreign.
    """
    diagram = extract()
    traces = [read_trace(p, diagram) for p in paths]
    ours = [t for t in traces if not t.foreign]
    foreign = [t for t in traces if t.foreign]
    if not ours:
        versions = ", ".join(sorted({t.version for t in foreign}))
        raise AllForeignError(
            f"every trace was recorded with another declaration of the lifecycle (version "
            f"{versions}; this one is {L.VERSION}): record the traces again with this version")
    counts: Counts = {}
    contexts: Contexts = {}
    for t in ours:
        for key, n in t.counts.items():
            counts[key] = counts.get(key, 0) + n
        merge_contexts(contexts, t.contexts)
    report = coverage(counts, diagram, contexts)
    report.traces, report.foreign = ours, foreign
    return report


# ----------------------------------------------------------------------------- formats

def _need_text(need: str) -> str:
    return {"taken": "never taken", "rejected": "never rejected",
            "ignored": "never seen ignored"}[need]


def _rejected_cell(r: RowCoverage) -> str:
    return str(r.rejected) if not r.no_rejection else f"— {r.no_rejection}"


def _notes(r: RowCoverage) -> str:
    return "; ".join(_need_text(n) for n in r.missing)


def _sources(report: Report) -> list[str]:
    out = []
    if report.traces:
        out.append(f"traces ({sum(t.records for t in report.traces)} records):")
        out += [f"  {t.path}: {t.records} records" for t in report.traces]
    if report.foreign:
        out.append("foreign traces (another declaration version: not counted):")
        out += [f"  {t.path}: version {t.version}, {t.records} records" for t in report.foreign]
    return out


def format_text(report: Report) -> str:
    """A plain-text report: the summary first, then every transition and ignored cell once,
    each with its status word and counts."""
    out = [f"transition coverage of {MACHINE}: {report.summary()}"]
    out += [f"  {line}" for line in report.breakdown()]
    out += [f"declaration {report.version}; {DEFINITION}"] + _sources(report) + [""]
    rows = report.transitions + report.ignored
    width = max((len(r.id) for r in rows), default=0)
    sw = max(len(s) for s in STATUSES)
    out.append(f"transitions ({len(report.transitions)}): status, taken, rejected")
    out.append(f"  ({NO_REJECTION})")
    for r in report.transitions:
        notes = _notes(r)
        out.append(f"  {r.status:<{sw}}  {r.id:<{width}}  {r.taken:>6}  {_rejected_cell(r):<11}"
                   f"  {notes}".rstrip())
    out.append(f"ignored cells ({len(report.ignored)}): status, times seen ignored")
    for r in report.ignored:
        out.append(f"  {r.status:<{sw}}  {r.id:<{width}}  {r.ignored:>6}")
    return "\n".join(out) + "\n"


def format_json(report: Report) -> str:
    return json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


_MD_STATUS = {COVERED: "✅ covered", PARTLY: "🟡 partly covered", NOT_COVERED: "❌ not covered"}


def format_markdown(report: Report) -> str:
    """The report as Markdown: the summary first, then one table row per transition and
    ignored cell (for a CI summary or a pull request)."""
    out = [f"# Transition coverage of `{MACHINE}`", "",
           f"**{report.summary()}** (declaration `{report.version}`)", ""]
    out += [f"- {line}" for line in report.breakdown()]
    out += ["", f"_{DEFINITION}._", ""]
    if report.traces:
        out += ["Traces: " + ", ".join(f"`{t.path}` ({t.records})" for t in report.traces), ""]
    if report.foreign:
        out += ["Foreign traces, not counted: " + ", ".join(
            f"`{t.path}` (version `{t.version}`, {t.records})" for t in report.foreign), ""]
    out += ["## Transitions", "",
            f"*partly covered*: taken, but never seen rejected. {NO_REJECTION}.", "",
            "| status | transition | taken | rejected | notes |", "|---|---|---:|---:|---|"]
    for r in report.transitions:
        out.append(f"| {_MD_STATUS[r.status]} | `{_md_cell(r.id)}` | {r.taken} | "
                   f"{_rejected_cell(r)} | {_md_cell(_notes(r))} |")
    out += ["", "## Ignored cells", "", "| status | cell | ignored | reason |",
            "|---|---|---:|---|"]
    for r in report.ignored:
        out.append(f"| {_MD_STATUS[r.status]} | `{_md_cell(r.id)}` | {r.ignored} | "
                   f"{_md_cell(r.reason)} |")
    return "\n".join(out) + "\n"


FORMATS = {"text": format_text, "json": format_json, "md": format_markdown}


def edge_marks(report: Report) -> dict[str, EdgeMark]:
    """Row id → :class:`fsm.review.diagrams.EdgeMark` (status and a count note) for the overlay."""
    marks = {}
    for r in report.transitions:
        if not r.taken:
            note = "never taken"
        else:
            note = f"{r.taken} taken"
            if r.rejected:
                note += f", {r.rejected} rejected"
            elif "rejected" in r.missing:
                note += ", never rejected"
        marks[r.id] = EdgeMark(r.status, note)
    return marks


def declared_marks(report: Report, diagram: Diagram | None = None) -> dict[str, EdgeMark]:
    """Declared row id → :class:`fsm.review.diagrams.EdgeMark` over its member states' transitions:
    covered when all are, not covered when none was taken, else partly covered; the note
    gives the counts (``taken 5 (in 3 of 4 states), rejected 2``; ``never taken``)."""
    diagram = extract() if diagram is None else diagram
    by_row: dict[str, list[RowCoverage]] = {}
    for r in report.transitions:
        by_row.setdefault(r.declared or r.id, []).append(r)
    marks = {}
    for row in diagram.rows:
        members = by_row.get(row.id, [])
        statuses = {m.status for m in members}
        status = (COVERED if statuses == {COVERED} else NOT_COVERED
                  if statuses <= {NOT_COVERED} else PARTLY)
        taken, rejected = sum(m.taken for m in members), sum(m.rejected for m in members)
        if not taken:
            note = "never taken"
        else:
            note = f"taken {taken}"
            if len(members) > 1:
                note += f" (in {sum(m.taken > 0 for m in members)} of {len(members)} states)"
            if any(not m.no_rejection for m in members):
                note += f", rejected {rejected}" if rejected else ", never rejected"
        marks[row.id] = EdgeMark(status, note)
    return marks


def _summary_lines(report: Report) -> str:
    return "; ".join([f"transition coverage {report.summary()}"] + report.breakdown())


def coverage_svg(report: Report, links: Mapping[str, str] | None = None) -> bytes:
    """The review diagram coloured by coverage: each declared row covered, partly covered
    (taken somewhere, but a state or a rejection is missing) or not covered (red, dashed),
    with its counts, and a legend. A row drawn from a group is as covered as its member
    states' transitions together. ``links`` (declared row id or state → URL) links the
    picture's rows and states (the HTML report, :mod:`fsm.review.report`).

    Raises :class:`fsm.review.diagrams.DiagramError` when Graphviz's ``dot`` is missing.
    """
    from fsm.review.diagrams import DrawnRow, build_review_digraph, svg_of

    diagram = extract()
    marks = declared_marks(report, diagram)
    drawn = [DrawnRow(r, was=marks[r.id].note, coverage=marks[r.id].status) for r in diagram.rows]
    return svg_of(build_review_digraph(diagram, drawn, summary=_summary_lines(report),
                                       title=f"{diagram.name}: transition coverage",
                                       links=links))


def coverage_states_svgs(report: Report, links=None) -> dict[str, bytes]:
    """One small SVG per state (``{state: svg}``, the pictures ``python -m fsm diagrams``
    writes into ``diagrams/states/``), each edge coloured by the coverage of its declared rows:
    covered, partly covered, not covered (red, dashed), as :func:`coverage_svg` colours them.
    ``links(state)`` (optional) gives the row id / state → URL mapping of each state's picture.

    Raises :class:`fsm.review.diagrams.DiagramError` when Graphviz's ``dot`` is missing.
    """
    from fsm.review.diagrams import DrawnRow
    from fsm.review.diagrams.states import render_state_svg

    diagram = extract()
    marks = declared_marks(report, diagram)
    drawn = {r.id: DrawnRow(r, was=marks[r.id].note, coverage=marks[r.id].status)
             for r in diagram.rows}
    return {s.name: render_state_svg(diagram, s.name, drawn, links(s.name) if links else None)
            for s in diagram.states}


def coverage_states_svg(report: Report) -> bytes:
    """The per-state diagram, one edge per transition the machine runs (what the items
    count), coloured by status: covered, partly covered, not covered (red and dashed).

    Raises :class:`fsm.review.diagrams.DiagramError` when Graphviz's ``dot`` is missing.
    """
    from fsm.review.diagrams import render_svg

    return render_svg(extract(), edge_marks(report), _summary_lines(report))
