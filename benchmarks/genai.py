"""``genai_ratio_vs_bare``: what the Google Gen AI wrapper adds to a call that succeeds.

Subject: ``BrainClient(client).models.generate_content(...)`` (and ``client.aio``'s, for
``genai_async_ratio_vs_bare``), the call run on the brain's chain
(:mod:`fsm.integrations.genai`); baseline: the same ``google.genai.Client`` called bare. Both
clients have the SDK's retries off and talk to one loopback fault server in a separate process
(``python -m fsm fault-server``) answering Gemini's ``:generateContent`` at once, so the
figures are the *client* process's CPU time per call (``time.process_time_ns``): what the
wrapper costs the caller. Blocks of calls alternate subject and baseline (the order swapping
every block); each figure is the median over blocks, in µs. Reported, no target (docs/
integrations.md "Cost").
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from google import genai

from fsm.integrations.genai import BrainClient, http_options

ROOT = Path(__file__).resolve().parent.parent
MODEL = "gemini-bench"


def _server(tmp: str) -> tuple[subprocess.Popen, str]:
    script = Path(tmp) / "script.json"
    script.write_text("[]")
    proc = subprocess.Popen([sys.executable, "-m", "fsm", "fault-server", "--script", str(script)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    line = proc.stdout.readline()
    url = next(word for word in line.split() if word.startswith("http"))
    return proc, url.rstrip("/").removesuffix("/v1")


def _block_us(call: Callable[[], Any], number: int) -> float:
    t0 = time.process_time_ns()
    for _ in range(number):
        call()
    return (time.process_time_ns() - t0) / number / 1000.0


async def _ablock_us(call: Callable[[], Awaitable[Any]], number: int) -> float:
    t0 = time.process_time_ns()
    for _ in range(number):
        await call()
    return (time.process_time_ns() - t0) / number / 1000.0


def measure(*, number: int = 200, repeat: int = 9, warmup: int = 30) -> dict[str, float]:
    """The figures of this group: sync and async, subject and baseline, and their ratios."""
    with tempfile.TemporaryDirectory() as tmp:
        proc, root = _server(tmp)
        try:
            client = genai.Client(api_key="bench-key", http_options=http_options(base_url=root))
            brain = BrainClient(client)

            def ours() -> Any:
                return brain.models.generate_content(model=MODEL, contents="hi")

            def bare() -> Any:
                return client.models.generate_content(model=MODEL, contents="hi")

            s, b = _interleaved(lambda f, n: _block_us(f, n), ours, bare, number, repeat, warmup)
            a_s, a_b = asyncio.run(_async(client, brain, number, repeat, warmup))
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return {"genai_us": s, "genai_bare_us": b, "genai_ratio_vs_bare": s / b,
            "genai_async_us": a_s, "genai_async_bare_us": a_b, "genai_async_ratio_vs_bare": a_s / a_b}


def _interleaved(block: Callable[[Any, int], float], ours: Any, bare: Any, number: int,
                 repeat: int, warmup: int) -> tuple[float, float]:
    block(ours, warmup)
    block(bare, warmup)
    subject, baseline = [], []
    for r in range(repeat):
        pair = [(subject, ours), (baseline, bare)]
        for runs, fn in (pair if r % 2 == 0 else pair[::-1]):
            runs.append(block(fn, number))
    return statistics.median(subject), statistics.median(baseline)


async def _async(client: Any, brain: BrainClient, number: int, repeat: int,
                 warmup: int) -> tuple[float, float]:
    async def ours() -> Any:
        return await brain.aio.models.generate_content(model=MODEL, contents="hi")

    async def bare() -> Any:
        return await client.aio.models.generate_content(model=MODEL, contents="hi")

    await _ablock_us(ours, warmup)
    await _ablock_us(bare, warmup)
    subject: list[float] = []
    baseline: list[float] = []
    for r in range(repeat):
        pair = [(subject, ours), (baseline, bare)]
        for runs, fn in (pair if r % 2 == 0 else pair[::-1]):
            runs.append(await _ablock_us(fn, number))
    await client.aio.aclose()
    return statistics.median(subject), statistics.median(baseline)


if __name__ == "__main__":
    print(json.dumps(measure(number=50, repeat=3, warmup=10), indent=1))
