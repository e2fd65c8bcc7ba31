"""``genai_ratio_vs_bare``: what the Google Gen AI wrapper adds to a call that succeeds.

Subject: ``BrainClient(client).models.generate_content(...)`` (and ``client.aio``'s, for
``genai_async_ratio_vs_bare``), the call run on the brain's chain
(:mod:`fsm.integrations.genai`); baseline: the same ``google.genai.Client`` called bare. Both
clients have the SDK's retries off and talk to one loopback fault server in a separate process
(``python -m fsm fault-server``) answering Gemini's ``:generateContent`` at once, so the
figures are the *client* process's CPU time per call (``time.process_time_ns``): what the
wrapper costs the caller. Blocks of calls alternate subject and baseline (the order swapping
every block, :mod:`benchmarks._timing`); each figure is the median over blocks, in µs.
Reported, no target (docs/integrations.md "Cost").
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from google import genai

from benchmarks._timing import acompare, compare, cpu_us, fault_server
from fsm.integrations.genai import BrainClient, http_options

MODEL = "gemini-bench"


def measure(*, number: int = 200, repeat: int = 9, warmup: int = 30) -> dict[str, float]:
    """The figures of this group: sync and async, subject and baseline, and their ratios."""
    with fault_server() as root:
        client = genai.Client(api_key="bench-key", http_options=http_options(base_url=root))
        brain = BrainClient(client)
        s, b, _, _ = compare(lambda: brain.models.generate_content(model=MODEL, contents="hi"),
                             lambda: client.models.generate_content(model=MODEL, contents="hi"),
                             number=number, repeat=repeat, warmup=warmup, block=cpu_us)
        a_s, a_b = asyncio.run(_async(client, brain, number, repeat, warmup))
    return {"genai_us": s, "genai_bare_us": b, "genai_ratio_vs_bare": s / b,
            "genai_async_us": a_s, "genai_async_bare_us": a_b, "genai_async_ratio_vs_bare": a_s / a_b}


async def _async(client: Any, brain: BrainClient, number: int, repeat: int,
                 warmup: int) -> tuple[float, float]:
    async def ours() -> Any:
        return await brain.aio.models.generate_content(model=MODEL, contents="hi")

    async def bare() -> Any:
        return await client.aio.models.generate_content(model=MODEL, contents="hi")

    try:
        return await acompare(ours, bare, number=number, repeat=repeat, warmup=warmup)
    finally:
        await client.aio.aclose()


if __name__ == "__main__":
    print(json.dumps(measure(number=50, repeat=3, warmup=10), indent=1))
