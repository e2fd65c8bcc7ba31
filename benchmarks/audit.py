"""``audit_events_100mb_s``: ``python -m fsm audit --events`` on a generated 100 MB event log.

The log is JSON lines as a fleet of sessions writes them (``docs/diagrams.md`` "audit
--events"): 64 sessions interleaved, each running chains of a start, a request and an end, a
few chains with a second attempt, one chain left open at the very end (so the checker reports
one violation on the last line, the one place a quadratic line count costs most). It is
written to a temporary folder before the clock starts; the figure is the wall time of reading
and checking it (:func:`fsm.review.events.check_file`), in seconds. Target: under 30 s on 2
cores. ``audit_events_mib_per_sec`` is the same run's throughput (MiB/s); with ``size_mb``
below 100 (``--quick``), ``audit_events_100mb_s`` is extrapolated from it (the work is linear).
"""

from __future__ import annotations

import json
import os
import tempfile
import time

SESSIONS = 64


def _write_log(path: str, size_mb: float) -> int:
    """Write about ``size_mb`` MiB of JSON lines to ``path``; returns the number of lines."""
    limit = int(size_mb * (1 << 20))
    written = lines = chain = 0
    with open(path, "w", encoding="utf-8") as fh:
        while written < limit:
            block = []
            for s in range(SESSIONS):
                chain += 1
                t = chain * 1000
                session = f"session-{s:03d}"
                block.append(json.dumps({"type": "auto_retry_start", "sessionId": session,
                                         "chainId": chain, "attempt": 1, "maxAttempts": 3,
                                         "delayMs": 200, "errorMessage": "529 Overloaded", "t": t}))
                block.append(json.dumps({"type": "request", "sessionId": session, "t": t + 250}))
                if chain % 7 == 0:
                    block.append(json.dumps({"type": "auto_retry_start", "sessionId": session,
                                             "chainId": chain, "attempt": 2, "maxAttempts": 3,
                                             "delayMs": 400, "t": t + 300}))
                    block.append(json.dumps({"type": "request", "sessionId": session, "t": t + 710}))
                block.append(json.dumps({"type": "auto_retry_end", "sessionId": session,
                                         "chainId": chain, "attempt": 2 if chain % 7 == 0 else 1,
                                         "success": True, "t": t + 900}))
            text = "\n".join(block) + "\n"
            fh.write(text)
            written += len(text)
            lines += len(block)
        fh.write(json.dumps({"type": "auto_retry_start", "sessionId": "last", "chainId": chain + 1,
                             "attempt": 1, "maxAttempts": 3, "t": (chain + 1) * 1000}) + "\n")
    return lines + 1


def measure(size_mb: float = 100, **_: object) -> dict[str, float]:
    """Generate the log, then time one read-and-check of it (seconds)."""
    from fsm.review.events import check_file

    with tempfile.TemporaryDirectory(prefix="retry-fsm-audit-") as folder:
        path = os.path.join(folder, "events.jsonl")
        lines = _write_log(path, size_mb)
        mb = os.path.getsize(path) / (1 << 20)
        start = time.perf_counter()
        report = check_file(path)
        took = time.perf_counter() - start
    if [v.line for v in report.violations] != [lines]:
        raise AssertionError(f"expected one violation on line {lines}, got {report.violations[:3]}")
    return {"audit_events_100mb_s": took * 100 / mb, "audit_events_mib_per_sec": mb / took,
            "audit_events_log_mb": mb}
