"""Event logs checked against the machine (fsm/review/events.py, docs/policy.md §3 Invariants):
the original implementation's recorded traces, our own sessions, OpenTelemetry exports, and logs
with injected violations of every kind."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from fsm.__main__ import main
from fsm.core.settings import RetrySettings
from fsm.host.session import AgentSession
from fsm.review import events as E
from fsm.testing import FakeClock, ScriptedProvider, error, ok

ROOT = Path(__file__).resolve().parents[2]
ORIGINAL = ROOT / "tests" / "data" / "events" / "original"
OURS = ROOT / "tests" / "data" / "events" / "ours"
PI_EXPECTED = ROOT / "tests" / "conformance" / "expected"
UNAVAILABLE = "503 Service Unavailable"
AUTH = "401 Incorrect API key provided"
OVERFLOW = "prompt is too long: 213462 tokens > 200000 maximum"


def kinds(report: E.EventsReport) -> list[tuple[str, int]]:
    return [(v.kind, v.line) for v in report.violations]


# ----------------------------------------------------------------------------- the original

def test_the_original_s_recorded_traces_break_only_its_known_bugs():
    """pi 0.73.1 (the oracle's traces): a chain disabled during its backoff and a fatal error
    mid-chain never end (the bugs docs/policy.md §3 D6 fixes); a refusal at rest with
    maxRetries 0 is no violation; every other trace is clean."""
    found = {p.stem: E.check_file(p) for p in sorted(ORIGINAL.glob("*.json"))}
    assert set(found) >= {"disable_during_backoff", "fatal_after_retry", "max_retries_zero",
                          "exhaust", "two_chains", "cancel_during_backoff", "overloaded_then_ok"}
    broken = {name: [v.kind for v in r.violations] for name, r in found.items() if not r.ok}
    assert broken == {"disable_during_backoff": ["unended"], "fatal_after_retry": ["unended"]}
    assert found["max_retries_zero"].refusals == 1
    assert found["two_chains"].chains == 2 and found["exhaust"].chains == 1
    assert all(r.times and r.format == "conformance trace (timeline)" for r in found.values())
    # the line is where the unended chain's auto_retry_start object begins
    text = (ORIGINAL / "fatal_after_retry.json").read_text(encoding="utf-8").splitlines()
    (v,) = found["fatal_after_retry"].violations
    assert text[v.line - 1].strip() == "{"
    assert '"type": "auto_retry_start"' in "\n".join(text[v.line - 1:v.line + 4])


def test_pi_s_conformance_events_in_the_repository():
    """tests/conformance/expected (pi's events through its own RPC client): the same bug, and
    no other violation."""
    found = {p.stem: E.check_file(p) for p in sorted(PI_EXPECTED.glob("*.json"))}
    assert found and all(r.format == "conformance events" for r in found.values())
    broken = {name: [v.kind for v in r.violations] for name, r in found.items() if not r.ok}
    assert broken == {"disable_during_backoff": ["unended"]}


# ----------------------------------------------------------------------------- ours

def test_our_recorded_rpc_traces_are_clean():
    """The oracle harness's traces of our RPC server, in the scenarios where the original broke
    an invariant and in ordinary ones: no violation; the refusal at rest is counted."""
    found = {p.stem: E.check_file(p) for p in sorted(OURS.glob("*.json"))}
    assert {"disable_during_backoff", "fatal_after_retry", "max_retries_zero"} <= set(found)
    assert {name: kinds(r) for name, r in found.items() if not r.ok} == {}
    assert found["disable_during_backoff"].chains == found["fatal_after_retry"].chains == 1
    assert found["max_retries_zero"].refusals == 1 and found["two_chains"].chains == 2


async def run_session(tmp_path: Path, name: str, script, steps=None, **settings) -> Path:
    """Run one prompt of an AgentSession on a fake clock; write its events, each stamped
    with the clock's time ("t", ms), as JSON lines; return the file."""
    clock = FakeClock()
    session = AgentSession(ScriptedProvider(script), settings=RetrySettings(**settings),
                           clock=clock)
    path = tmp_path / f"{name}.jsonl"
    lines = []
    session.subscribe(lambda e: lines.append(json.dumps({**e, "t": clock.time_ms()},
                                                        default=str)))
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.settle()
    for step in steps or ():
        await step(session, clock)
    for _ in range(50):
        if task.done():
            break
        await clock.advance(1.0)
    await asyncio.wait_for(task, 1)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


async def disable(session, clock):
    session.set_auto_retry_enabled(False)


async def abort_retry(session, clock):
    session.abort_retry()


async def our_logs(tmp_path: Path) -> dict[str, Path]:
    return {
        "retry_then_success": await run_session(tmp_path, "a", [error(UNAVAILABLE),
                                                                error(UNAVAILABLE), ok()]),
        "exhaust": await run_session(tmp_path, "b", [error(UNAVAILABLE)] * 5, base_delay_ms=10),
        "max_retries_zero": await run_session(tmp_path, "c", [error(UNAVAILABLE)], max_retries=0),
        "fatal_after_retry": await run_session(tmp_path, "d", [error(UNAVAILABLE), error(AUTH)]),
        "overflow_after_retry": await run_session(tmp_path, "e", [error(UNAVAILABLE),
                                                                  error(OVERFLOW), ok()]),
        "disable_during_backoff": await run_session(tmp_path, "f", [error(UNAVAILABLE),
                                                                    error(UNAVAILABLE)],
                                                    steps=[disable]),
        "cancel_during_backoff": await run_session(tmp_path, "g", [error(UNAVAILABLE), ok()],
                                                   steps=[abort_retry]),
        "success": await run_session(tmp_path, "h", [ok()]),
    }


async def test_our_sessions_break_no_invariant(tmp_path):
    """Our own sessions, in the scenarios where the original broke one and in the ordinary ones:
    no violation; the refusal at rest is counted, the chains reconstructed."""
    logs = await our_logs(tmp_path)
    found = {name: E.check_file(path) for name, path in logs.items()}
    assert {name: kinds(r) for name, r in found.items() if not r.ok} == {}
    assert found["max_retries_zero"].refusals == 1 and found["max_retries_zero"].chains == 0
    assert found["exhaust"].chains == 1 and found["success"].chains == 0
    assert all(r.times for r in found.values())


async def test_the_command_checks_logs_and_exits_1_on_a_violation(tmp_path, capsys):
    """audit --events LOG: 0 and a clean summary for our log; 1 and FILE:LINE: kind for a
    broken one; 2 for a log that is not one."""
    logs = await our_logs(tmp_path)
    assert main(["audit", "--events", str(logs["exhaust"])]) == 0
    out = capsys.readouterr().out
    assert f"{logs['exhaust']} (JSON lines of events):" in out and "no violation" in out
    broken = ORIGINAL / "fatal_after_retry.json"
    assert main(["audit", "--events", str(logs["exhaust"]), "--events", str(broken)]) == 1
    out = capsys.readouterr().out
    assert f"{broken}:" in out and ": unended: the chain started here" in out
    assert main(["audit", "--events", str(broken), "--format", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["events"][0]["violations"][0]["kind"] == "unended"
    junk = tmp_path / "junk.txt"
    junk.write_text("not json\n")
    assert main(["audit", "--events", str(junk)]) == 2
    assert f"{junk}:1: not JSON" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"type": "agent_start"}\n')
    assert main(["audit", "--events", str(empty)]) == 2
    assert "no retry events" in capsys.readouterr().err


# ----------------------------------------------------------------------------- injected

def lines_of(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text(encoding="utf-8").splitlines() if l.strip()]


def write(path: Path, events: list[dict]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    return path


def index_of(events: list[dict], kind: str, n: int = 0) -> int:
    return [i for i, e in enumerate(events) if e["type"] == kind][n]


async def test_every_injected_violation_is_found_at_its_line(tmp_path):
    """Each kind, injected into a clean log of ours, is reported at the line it was put on
    (and the clean log has none)."""
    logs = await our_logs(tmp_path)
    base = lines_of(logs["exhaust"])  # starts 1, 2, 3, then the end
    assert E.check_file(logs["exhaust"]).ok
    cases = {}
    # unended: drop the end
    ev = list(base)
    end = index_of(ev, "auto_retry_end")
    first_start = index_of(ev, "auto_retry_start")
    del ev[end]
    cases["unended"] = (ev, first_start + 1)
    # end without start: a second end after the chain's end
    ev = list(base)
    ev.insert(end + 1, dict(ev[end]))
    cases["end_without_start"] = (ev, end + 2)
    # end without start: an end with attempt 2 where no chain runs (before the first start)
    ev = list(base)
    ev.insert(first_start, {"type": "auto_retry_end", "success": False, "attempt": 2,
                            "chainId": 99, "t": ev[first_start]["t"]})
    cases["end_without_start (stray)"] = (ev, first_start + 1)
    # attempt: skip from 1 to 3
    ev = [dict(e) for e in base]
    second = index_of(ev, "auto_retry_start", 1)
    ev[second]["attempt"] = 3
    cases["attempt"] = (ev, second + 1)
    # attempt: beyond maxAttempts
    ev = [dict(e) for e in base]
    third = index_of(ev, "auto_retry_start", 2)
    ev.insert(third + 1, {**ev[third], "attempt": 4})
    cases["attempt (over max)"] = (ev, third + 2)
    # request during a backoff: a turn starts 1 ms after the start that scheduled 10 ms
    ev = list(base)
    ev.insert(first_start + 1, {"type": "turn_start", "t": ev[first_start]["t"] + 1})
    cases["request_in_backoff"] = (ev, first_start + 2)
    for name, (events, line) in cases.items():
        report = E.check_file(write(tmp_path / f"{name.split()[0]}.jsonl", events))
        kind = name.split()[0]
        assert (kind, line) in kinds(report), (name, kinds(report))
    assert {n.split()[0] for n in cases} == set(E.KINDS)


def test_a_timeline_with_an_early_request_is_caught(tmp_path):
    """The oracle's format: an HTTP request inside the 50 ms backoff of the original's exhaust
    trace is found, with its line."""
    doc = json.loads((ORIGINAL / "exhaust.json").read_text(encoding="utf-8"))
    timeline = doc["timeline"]
    k = next(i for i, t in enumerate(timeline) if t["type"] == "auto_retry_start")
    timeline.insert(k + 1, {"t_ms": timeline[k]["t_ms"] + 5, "type": "HTTP_REQUEST", "index": 9})
    text = json.dumps(doc, indent=2)
    path = tmp_path / "early.json"
    path.write_text(text, encoding="utf-8")
    report = E.check_file(path)
    (v,) = report.violations
    assert v.kind == "request_in_backoff" and "45.0 ms before" in v.message
    assert '"type": "HTTP_REQUEST"' in "\n".join(text.splitlines()[v.line - 1:v.line + 3])


def test_chains_are_keyed_by_chain_id_and_session():
    """With chainId (and sessionId, in a merged fleet log) two sessions' chains interleave
    without being mistaken for one another; a new chain of one session ends its unended one."""
    events = [
        E.Event(E.START, 1, chain=("s1", 1), attempt=1, max_attempts=3),
        E.Event(E.START, 2, chain=("s2", 1), attempt=1, max_attempts=3),
        E.Event(E.START, 3, chain=("s1", 1), attempt=2, max_attempts=3),
        E.Event(E.END, 4, chain=("s2", 1), attempt=1, success=True),
        E.Event(E.START, 5, chain=("s2", 2), attempt=1, max_attempts=3),
        E.Event(E.START, 6, chain=("s1", 2), attempt=1, max_attempts=3),
        E.Event(E.END, 7, chain=("s1", 2), attempt=1),
        E.Event(E.END, 8, chain=("s2", 2), attempt=1),
    ]
    report = E.check(events)
    assert kinds(report) == [("unended", 1)]
    assert report.chains == 4


# ----------------------------------------------------------------------------- OpenTelemetry

async def test_opentelemetry_spans_of_our_sessions_are_checked(tmp_path):
    """Spans recorded by fsm.integrations.otel (console exporter JSON and OTLP JSON): chains
    come from retry_chain spans and their retry_attempt events; ours are clean, a span whose
    attempts skip one is not."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from fsm.integrations.otel import RetryTelemetry

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = RetryTelemetry(tracer_provider=provider)
    logs = await our_logs(tmp_path)
    for name in ("retry_then_success", "exhaust", "max_retries_zero", "cancel_during_backoff"):
        listener = telemetry.listener()
        for e in lines_of(logs[name]):
            listener(e)
    spans = exporter.get_finished_spans()
    assert len(spans) == 4
    console = tmp_path / "spans.json"
    console.write_text("\n".join(s.to_json() for s in spans) + "\n", encoding="utf-8")
    report = E.check_file(console)
    assert report.format == "opentelemetry spans" and report.ok, kinds(report)
    assert report.chains == 3 and report.refusals == 1
    # OTLP JSON, as a collector's file exporter writes it
    otlp = {"resourceSpans": [{"scopeSpans": [{"spans": [otlp_span(s) for s in spans]}]}]}
    path = tmp_path / "otlp.json"
    path.write_text(json.dumps(otlp, indent=2), encoding="utf-8")
    report = E.check_file(path)
    assert report.format == "opentelemetry (OTLP JSON)" and report.ok and report.chains == 3
    # an attempt skipped inside a span
    bad = json.loads(path.read_text(encoding="utf-8"))
    exhaust = next(s for s in bad["resourceSpans"][0]["scopeSpans"][0]["spans"]
                   if len(s["events"]) == 3)
    exhaust["events"][1]["attributes"][0]["value"]["intValue"] = "3"
    path.write_text(json.dumps(bad, indent=2), encoding="utf-8")
    report = E.check_file(path)
    assert [v.kind for v in report.violations] == ["attempt", "attempt"]
    lines = path.read_text(encoding="utf-8").splitlines()
    assert '"retry_chain"' in lines[report.violations[0].line - 1]


def otlp_span(span) -> dict:
    """One SDK span in OTLP JSON (attributes as typed values, times in ns)."""
    def value(v):
        if isinstance(v, bool):
            return {"boolValue": v}
        if isinstance(v, int):
            return {"intValue": str(v)}
        if isinstance(v, float):
            return {"doubleValue": v}
        return {"stringValue": str(v)}

    def attrs(mapping):
        return [{"key": k, "value": value(v)} for k, v in (mapping or {}).items()]

    return {"name": span.name, "startTimeUnixNano": str(span.start_time),
            "endTimeUnixNano": str(span.end_time), "attributes": attrs(span.attributes),
            "events": [{"name": e.name, "timeUnixNano": str(e.timestamp),
                        "attributes": attrs(e.attributes)} for e in span.events]}


async def test_rpc_stdout_and_session_logs_are_read(tmp_path, capsys):
    """RPC stdout (responses between the events) reads like the events alone; a session log
    has requests but no retry events, and the report says no chain could be checked."""
    logs = await our_logs(tmp_path)
    events = lines_of(logs["retry_then_success"])
    stdout = [{"type": "response", "command": "prompt", "success": True, "id": "1"}] + events
    report = E.check_file(write(tmp_path / "stdout.jsonl", stdout))
    assert report.ok and report.chains == 1 and report.events == len(
        [e for e in events if e["type"] in ("auto_retry_start", "auto_retry_end", "turn_start")])
    log = [{"type": "session", "version": 1, "id": "s", "timestamp": 1},
           {"type": "message", "message": {"role": "user", "content": [], "timestamp": 2}},
           {"type": "message", "message": {"role": "assistant", "content": [],
                                           "stopReason": "error", "timestamp": 3}}]
    path = write(tmp_path / "session.jsonl", log)
    report = E.check_file(path)
    assert report.format == "session log" and report.events == 1 and report.retry_events == 0
    assert main(["audit", "--events", str(path)]) == 0
    assert "no retry events (auto_retry_start / auto_retry_end), so no chain to check" in \
        capsys.readouterr().out


# ----------------------------------------------------------------------------- hostile input

@pytest.mark.parametrize("path", ["/dev/zero", "/dev/urandom"])
def test_audit_events_refuses_a_device_before_reading_it(path, capsys):
    """--events /dev/zero (or /dev/urandom) exits 2 with one line naming it, reading nothing."""
    assert main(["audit", "--events", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {path}: a character device, not a file: an event log must be a "
                   "regular file"]


def test_audit_events_refuses_a_fifo_without_blocking(tmp_path, capsys):
    """A FIFO with no writer is refused at once (the open does not wait for a writer)."""
    import os
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert main(["audit", "--events", str(fifo)]) == 2
    assert "a FIFO (named pipe), not a file" in capsys.readouterr().err


def test_audit_events_reads_at_most_the_cap_plus_one_byte(tmp_path, monkeypatch):
    """A log over the bound is refused as larger, after reading cap + 1 bytes, not all of it."""
    log = write(tmp_path / "big.jsonl", [{"type": "auto_retry_start", "attempt": 1}] * 50)
    monkeypatch.setattr(E, "_MAX_BYTES", 100)
    read = []
    real = E.os.fdopen

    def spy(fd, mode):
        fh = real(fd, mode)
        orig = fh.read
        fh.read = lambda n=-1: read.append(n) or orig(n)  # type: ignore[method-assign]
        return fh
    monkeypatch.setattr(E.os, "fdopen", spy)
    with pytest.raises(E.EventLogError, match="larger than"):
        E.read_events(log)
    assert read == [101]


@pytest.mark.parametrize("line, says", [
    ('{"type":"auto_retry_start","attempt":1e400}', "attempt is not an integer"),
    ('{"type":"auto_retry_start","attempt":1,"delayMs":-1e400}', "delayMs is not an integer"),
    ('{"type":"auto_retry_start","attempt":1,"maxAttempts":' + "9" * 40 + "}",
     "maxAttempts is not an integer in range"),
    ('{"type":"auto_retry_start","attempt":1,"chainId":{"a":1}}', "chainId is not a string"),
    ('{"type":"auto_retry_end","attempt":1,"chainId":"c","sessionId":[1]}',
     "sessionId is not a string"),
    ('{"type":"auto_retry_start","attempt":' + "9" * 5000 + "}", "not an integer"),
    ('{"type":"auto_retry_start","attempt":1,"t_ms":' + "9" * 400 + "}", "not a finite time"),
    ('{"name":"retry_chain","attributes":[{"key":"retry.attempts","value":{"intValue":"x"}}]}',
     "retry.attempts is not an integer"),
])
def test_audit_events_reports_a_hostile_value_with_its_file_and_line(tmp_path, capsys, line,
                                                                      says):
    """An unreadable value (1e400, a 5000-digit integer, an object as chainId) exits 2 with one
    line naming the file and the line, never a traceback."""
    log = tmp_path / "hostile.jsonl"
    log.write_text('{"type":"turn_start"}\n' + line + "\n")
    assert main(["audit", "--events", str(log)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {log}:2: ") and says in err[0], err


# ----------------------------------------------------------------------------- linear work

def _chain_lines(n: int, session: str = "s") -> list[str]:
    """``n`` chains as JSON lines, each a start and an end, with a request between them."""
    out = []
    for i in range(n):
        out += [json.dumps({"type": "auto_retry_start", "sessionId": session, "chainId": i + 1,
                            "attempt": 1, "maxAttempts": 3, "delayMs": 10, "t": 1000 * i}),
                json.dumps({"type": "request", "sessionId": session, "t": 1000 * i + 20}),
                json.dumps({"type": "auto_retry_end", "sessionId": session, "chainId": i + 1,
                            "attempt": 1, "success": True, "t": 1000 * i + 30})]
    return out


@pytest.mark.parametrize("shape", ["lines", "otlp_lines"])
def test_line_numbers_cost_one_pass_over_the_log(tmp_path, monkeypatch, shape):
    """audit --events was quadratic (each event's line counted from the file's start): the
    reader now examines each character once to number all lines, and the numbers are right
    (a chain left open on the last line is reported there). docs/diagrams.md "audit --events"."""
    made: list = []

    class Counted(E._LineIndex):
        def __init__(self, text):
            super().__init__(text)
            made.append(self)

    monkeypatch.setattr(E, "_LineIndex", Counted)
    if shape == "lines":
        lines = _chain_lines(3000) + [json.dumps({"type": "auto_retry_start", "sessionId": "s",
                                                  "chainId": 9999, "attempt": 1, "t": 9e9})]
    else:
        span = {"name": "retry_chain", "startTimeUnixNano": "1", "endTimeUnixNano": "2",
                "attributes": [{"key": "retry.attempts", "value": {"intValue": "1"}}]}
        lines = [json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})] * 3000
    log = tmp_path / "events.jsonl"
    text = "\n".join(lines) + "\n"
    log.write_text(text, encoding="utf-8")
    fmt, found = E.read_events(log)
    assert len(made) == 1 and made[0].scanned <= len(text)
    assert found[-1].line == len(lines)
    if shape == "lines":
        assert [(v.kind, v.line) for v in E.check(found).violations] == [("unended", len(lines))]
