"""``transport_ratio_vs_httpx2``: what the retry transport adds to a request that succeeds.

Subject: ``httpx2.AsyncClient(transport=AsyncRetryTransport())`` posting a small JSON body to
a loopback server that answers 200 at once; baseline: the same client over the bare
``httpx2.AsyncHTTPTransport``. The server is a separate process (``python -m fsm fault-server``),
so the figures are the *client* process's CPU time per request (``time.process_time_ns``):
what the transport costs the caller, not what the server or the kernel spend. Rounds
alternate subject and baseline; each figure is the median over rounds, in µs.
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

import httpx2

from fsm.integrations.httpx2 import AsyncRetryTransport

ROOT = Path(__file__).resolve().parent.parent
BODY = {"model": "m", "stream": False, "messages": [{"role": "user", "content": "hi"}]}


def _server(tmp: str) -> tuple[subprocess.Popen, str]:
    script = Path(tmp) / "script.json"
    script.write_text("[]")
    proc = subprocess.Popen([sys.executable, "-m", "fsm", "fault-server", "--script", str(script)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    line = proc.stdout.readline()
    url = next(word for word in line.split() if word.startswith("http"))
    return proc, url.rstrip("/").removesuffix("/v1") + "/v1"


async def _per_request_us(client: httpx2.AsyncClient, url: str, number: int) -> float:
    t0 = time.process_time_ns()
    for _ in range(number):
        response = await client.post(url, json=BODY)
        response.raise_for_status()
    return (time.process_time_ns() - t0) / number / 1000.0


def measure(*, number: int = 300, repeat: int = 9, warmup: int = 50) -> dict[str, float]:
    """The figures of this group."""
    with tempfile.TemporaryDirectory() as tmp:
        proc, base = _server(tmp)
        try:
            return asyncio.run(_measure(base + "/chat/completions", number, repeat, warmup))
        finally:
            proc.terminate()
            proc.wait(timeout=10)


async def _measure(url: str, number: int, repeat: int, warmup: int) -> dict[str, float]:
    async with httpx2.AsyncClient(transport=AsyncRetryTransport()) as ours, \
            httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport()) as bare:
        await _per_request_us(ours, url, warmup)
        await _per_request_us(bare, url, warmup)
        subject, baseline = [], []
        for _ in range(repeat):
            subject.append(await _per_request_us(ours, url, number))
            baseline.append(await _per_request_us(bare, url, number))
    s, b = statistics.median(subject), statistics.median(baseline)
    return {"transport_us": s, "httpx2_transport_us": b, "transport_ratio_vs_httpx2": s / b}


if __name__ == "__main__":
    print(json.dumps(measure(number=50, repeat=3, warmup=10), indent=1))
