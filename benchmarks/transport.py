"""``transport_ratio_vs_httpx2``: what the retry transport adds to a request that succeeds.

Subject: ``httpx2.AsyncClient(transport=AsyncRetryTransport())`` posting a small JSON body to
a loopback server that answers 200 at once; baseline: the same client over the bare
``httpx2.AsyncHTTPTransport``. ``transport_sync_ratio_vs_httpx2``: the same with
``httpx2.Client`` over ``RetryTransport`` and over ``httpx2.HTTPTransport`` (reported). The
server is a separate process (``python -m fsm fault-server``), so the figures are the *client*
process's CPU time per request (``time.process_time_ns``): what the transport costs the caller,
not what the server or the kernel spend. Blocks alternate subject and baseline, the order
swapping every block (:mod:`benchmarks._timing`); each figure is the median over blocks, in µs.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx2

from benchmarks._timing import acompare, compare, cpu_us, fault_server
from fsm.integrations.httpx2 import AsyncRetryTransport, RetryTransport

BODY = {"model": "m", "stream": False, "messages": [{"role": "user", "content": "hi"}]}


def measure(*, number: int = 300, repeat: int = 9, warmup: int = 50) -> dict[str, float]:
    """The figures of this group."""
    with fault_server() as root:
        url = root + "/v1/chat/completions"
        figures = asyncio.run(_measure(url, number, repeat, warmup))
        figures.update(_measure_sync(url, number, repeat, warmup))
        return figures


async def _measure(url: str, number: int, repeat: int, warmup: int) -> dict[str, float]:
    async with httpx2.AsyncClient(transport=AsyncRetryTransport()) as ours, \
            httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport()) as bare:
        async def subject() -> Any:
            (await ours.post(url, json=BODY)).raise_for_status()

        async def baseline() -> Any:
            (await bare.post(url, json=BODY)).raise_for_status()

        s, b = await acompare(subject, baseline, number=number, repeat=repeat, warmup=warmup)
    return {"transport_us": s, "httpx2_transport_us": b, "transport_ratio_vs_httpx2": s / b}


def _measure_sync(url: str, number: int, repeat: int, warmup: int) -> dict[str, float]:
    with httpx2.Client(transport=RetryTransport()) as ours, \
            httpx2.Client(transport=httpx2.HTTPTransport()) as bare:
        s, b, _, _ = compare(lambda: ours.post(url, json=BODY).raise_for_status(),
                             lambda: bare.post(url, json=BODY).raise_for_status(),
                             number=number, repeat=repeat, warmup=warmup, block=cpu_us)
    return {"transport_sync_us": s, "httpx2_transport_sync_us": b,
            "transport_sync_ratio_vs_httpx2": s / b}


if __name__ == "__main__":
    print(json.dumps(measure(number=50, repeat=3, warmup=10), indent=1))
