"""Timing helpers shared by the figure modules: ``perf_counter_ns``, warm-ups, medians.

Every helper returns per-call times in microseconds. The garbage collector is left as it is
(enabled): allocation-heavy code pays for its collections here as it does in production, and
the subject and its baseline are measured under the same rule, interleaved repeat by repeat
so that a noisy neighbour on the machine hits both alike.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any, Awaitable, Callable

now_ns = time.perf_counter_ns


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


def compare(subject: Callable[[], Any], baseline: Callable[[], Any], *, number: int,
            repeat: int, warmup: int) -> tuple[float, float, list[float], list[float]]:
    """Median per-call µs of ``subject`` and ``baseline``, measured interleaved.

    Each of ``repeat`` rounds times ``number`` calls of one then of the other (the order
    alternates every round). Returns ``(subject_median, baseline_median, subject_runs,
    baseline_runs)``.
    """
    loop_us(subject, warmup)
    loop_us(baseline, warmup)
    s_runs: list[float] = []
    b_runs: list[float] = []
    for r in range(repeat):
        if r % 2:
            b_runs.append(loop_us(baseline, number))
            s_runs.append(loop_us(subject, number))
        else:
            s_runs.append(loop_us(subject, number))
            b_runs.append(loop_us(baseline, number))
    return statistics.median(s_runs), statistics.median(b_runs), s_runs, b_runs


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
