"""``runner_us`` vs ``tenacity_runner_us`` and ``stamina_us``: CPU per retried call.

Subject: ``RetryRunner.run(fn)`` where ``fn`` fails once with a connection reset, then
succeeds — per call a new brain, two classifications, three transitions (idle → backing_off →
continuing → succeeded), the ``auto_retry_start`` / ``auto_retry_end`` events, a zero backoff
through an injected ``sleep`` that returns at once, and the result.

Baselines, in the same run and interleaved round by round: ``tenacity.AsyncRetrying`` (wait
none, stop after 4 attempts, retry on the exception type, the same injected ``sleep``), and
``stamina.retry_context`` (4 attempts, zero waits and jitter, its default instrumentation
hooks off, its async sleep replaced by the same no-op). Each figure is the median over rounds
of the mean CPU time (``time.process_time_ns``) per retried call, in µs; CPU time rather than
wall time, so a neighbour on a shared machine hits the figure less.

``runner_recorded_us`` is the same call with a transition recorder installed (the audit's path
through the ``transitions`` engine), to show what the compiled dispatch saves.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import stamina
import stamina._core as _stamina_core
import tenacity

from fsm.core import lifecycle as L
from fsm.host.runner import RetryRunner

ERROR_TEXT = "Connection reset by peer"


async def _no_sleep(seconds: float) -> None:
    return None


def _flaky():
    state = {"calls": 0}

    async def call() -> str:
        state["calls"] += 1
        if state["calls"] % 2:
            raise ConnectionResetError(ERROR_TEXT)
        return "ok"
    return call


async def _cpu_us(fn, number: int) -> float:
    t0 = time.process_time_ns()
    for _ in range(number):
        await fn()
    return (time.process_time_ns() - t0) / number / 1000.0


def measure(*, number: int = 2_000, repeat: int = 9, warmup: int = 200) -> dict[str, float]:
    """The figures of this group (µs of CPU per retried call)."""
    runner = RetryRunner({"baseDelayMs": 0}, sleep=_no_sleep)
    subject_fn = _flaky()
    ten_fn = _flaky()
    sta_fn = _flaky()
    _stamina_core._smart_sleep = _no_sleep  # the same no-op wait as the others
    stamina.instrumentation.set_on_retry_hooks([])

    async def ours() -> None:
        if await runner.run(subject_fn) != "ok":
            raise AssertionError("the runner did not return the call's result")

    async def ten() -> None:
        async for attempt in tenacity.AsyncRetrying(
                wait=tenacity.wait_none(), stop=tenacity.stop_after_attempt(4), sleep=_no_sleep,
                retry=tenacity.retry_if_exception_type(ConnectionResetError), reraise=True):
            with attempt:
                await ten_fn()

    async def sta() -> None:
        async for attempt in stamina.retry_context(on=ConnectionResetError, attempts=4,
                                                   wait_initial=0, wait_max=0, wait_jitter=0,
                                                   timeout=None):
            with attempt:
                await sta_fn()

    def record(owner, rec) -> None:
        pass

    async def rounds() -> dict[str, list[float]]:
        runs: dict[str, list[float]] = {"ours": [], "ten": [], "sta": [], "rec": []}
        subjects = [("ours", ours), ("ten", ten), ("sta", sta)]
        for _, fn in subjects:
            await _cpu_us(fn, warmup)
        for r in range(repeat):
            order = subjects if r % 2 else subjects[::-1]
            for name, fn in order:
                runs[name].append(await _cpu_us(fn, number))
            L.add_recorder(record)
            try:
                runs["rec"].append(await _cpu_us(ours, max(1, number // 4)))
            finally:
                L.remove_recorder(record)
        return runs

    runs = asyncio.run(rounds())
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {
        "runner_us": med["ours"],
        "tenacity_runner_us": med["ten"],
        "stamina_us": med["sta"],
        "runner_ratio_vs_tenacity": med["ours"] / med["ten"],
        "runner_ratio_vs_stamina": med["ours"] / med["sta"],
        "runner_recorded_us": med["rec"],
    }


if __name__ == "__main__":
    for k, v in measure().items():
        print(f"{k:28} {v:10.2f}")
