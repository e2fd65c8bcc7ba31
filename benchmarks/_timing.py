"""Timing helpers shared by the figure modules: ``perf_counter_ns`` or process CPU, warm-ups,
medians, the loopback fault server the integration figures talk to.

Every helper returns per-call times in microseconds. The garbage collector is left as it is
(enabled): allocation-heavy code pays for its collections here as it does in production, and
the subject and its baseline are measured under the same rule, interleaved repeat by repeat
so that a noisy neighbour on the machine hits both alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator

now_ns = time.perf_counter_ns
ROOT = Path(__file__).resolve().parent.parent


def loop_us(fn: Callable[[], Any], number: int) -> float:
    """Mean time of one ``fn()`` over ``number`` back-to-back calls, in µs."""
    t0 = now_ns()
    for _ in range(number):
        fn()
    return (now_ns() - t0) / number / 1000.0


async def aloop_us(fn: Callable[[], Awaitable[Any]], number: int) -> float:
    """Mean time of one ``await fn()`` over ``number`` back-to-back calls, in µs."""
    t0 = now_ns()
    for _ in range(number):
        await fn()
    return (now_ns() - t0) / number / 1000.0


def cpu_us(fn: Callable[[], Any], number: int) -> float:
    """This process's CPU time (``time.process_time_ns``, every thread) per ``fn()`` over
    ``number`` back-to-back calls, in µs: what a client costs its caller when the server it
    talks to runs in another process."""
    t0 = time.process_time_ns()
    for _ in range(number):
        fn()
    return (time.process_time_ns() - t0) / number / 1000.0


async def acpu_us(fn: Callable[[], Awaitable[Any]], number: int) -> float:
    """:func:`cpu_us` for ``await fn()``."""
    t0 = time.process_time_ns()
    for _ in range(number):
        await fn()
    return (time.process_time_ns() - t0) / number / 1000.0


def compare(subject: Callable[[], Any], baseline: Callable[[], Any], *, number: int,
            repeat: int, warmup: int, block: Callable[[Callable[[], Any], int], float] = loop_us,
            ) -> tuple[float, float, list[float], list[float]]:
    """Median per-call µs of ``subject`` and ``baseline``, measured interleaved.

    Each of ``repeat`` rounds times ``number`` calls of one then of the other with ``block``
    (:func:`loop_us`: wall time; :func:`cpu_us`: process CPU), the order alternating every
    round. Returns ``(subject_median, baseline_median, subject_runs, baseline_runs)``.
    """
    block(subject, warmup)
    block(baseline, warmup)
    s_runs: list[float] = []
    b_runs: list[float] = []
    for r in range(repeat):
        if r % 2:
            b_runs.append(block(baseline, number))
            s_runs.append(block(subject, number))
        else:
            s_runs.append(block(subject, number))
            b_runs.append(block(baseline, number))
    return statistics.median(s_runs), statistics.median(b_runs), s_runs, b_runs


async def acompare(subject: Callable[[], Awaitable[Any]], baseline: Callable[[], Awaitable[Any]], *,
                   number: int, repeat: int, warmup: int,
                   block: Callable[[Callable[[], Awaitable[Any]], int], Awaitable[float]] = acpu_us,
                   ) -> tuple[float, float]:
    """:func:`compare` for coroutine functions, timed by ``block`` (default :func:`acpu_us`);
    returns ``(subject_median, baseline_median)``."""
    await block(subject, warmup)
    await block(baseline, warmup)
    s_runs: list[float] = []
    b_runs: list[float] = []
    for r in range(repeat):
        pair = [(s_runs, subject), (b_runs, baseline)]
        for runs, fn in (pair if r % 2 == 0 else pair[::-1]):
            runs.append(await block(fn, number))
    return statistics.median(s_runs), statistics.median(b_runs)


def ratio_figures(name: str, subject_us: float, baseline_us: float, suffix: str = "") -> dict[str, float]:
    """``{name_us, name_bare_us, name_ratio_vs_bare}`` (each name + ``suffix``): a wrapper's
    per-call cost beside its bare framework's, and their ratio."""
    return {f"{name}_us{suffix}": subject_us, f"{name}_bare_us{suffix}": baseline_us,
            f"{name}_ratio_vs_bare{suffix}": subject_us / baseline_us}


@contextlib.contextmanager
def fault_server() -> Iterator[str]:
    """A loopback ``python -m fsm fault-server`` in its own process answering every request
    with a plain success (an empty script), so its CPU is not the client's; yields its root URL
    (no ``/v1``); terminated on exit."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "script.json"
        script.write_text("[]")
        proc = subprocess.Popen([sys.executable, "-m", "fsm", "fault-server", "--script", str(script)],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            line = proc.stdout.readline() if proc.stdout is not None else ""
            url = next(word for word in line.split() if word.startswith("http"))
            yield url.rstrip("/").removesuffix("/v1")
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def median_us(fn: Callable[[], Any], *, number: int, repeat: int, warmup: int) -> float:
    """Median over ``repeat`` rounds of the mean per-call µs of ``number`` calls."""
    loop_us(fn, warmup)
    return statistics.median(loop_us(fn, number) for _ in range(repeat))


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0–100) by the nearest-rank method; ``values`` non-empty."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n*q/100), at least 1
    return ordered[int(rank) - 1]


def run_async(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``coro_fn()`` in a fresh event loop (closed afterwards)."""
    return asyncio.run(coro_fn())
