"""``litellm_ratio_vs_bare``: what the LiteLLM integration adds to a call that succeeds.

Subject: ``BrainLiteLLM().acompletion("openai/m", ..., api_base=<fault server>)`` (and
``completion`` for the ``_sync`` figures); baseline: bare ``litellm.acompletion`` /
``litellm.completion`` with the same arguments (``num_retries=0``, ``max_retries=0``, as the
integration sends them). The fault server answers every call with a plain success, in a separate
process (``python -m fsm fault-server``), so the figures are the *client* process's CPU time per
call (``time.process_time_ns``, LiteLLM's own threads included). Blocks of ``number`` calls
alternate subject and baseline; each figure is the median over ``repeat`` blocks, in µs.
LiteLLM reads its bundled model cost map (nothing leaves the machine, SPEC §15.13).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402

from benchmarks.transport import _server  # noqa: E402
from fsm.integrations.litellm import BrainLiteLLM  # noqa: E402

HI = [{"role": "user", "content": "hi"}]


async def _async_block(call, number: int) -> float:
    t0 = time.process_time_ns()
    for _ in range(number):
        reply = await call()
        assert reply.choices[0].message.content == "ok"
    return (time.process_time_ns() - t0) / number / 1000.0


def _sync_block(call, number: int) -> float:
    t0 = time.process_time_ns()
    for _ in range(number):
        reply = call()
        assert reply.choices[0].message.content == "ok"
    return (time.process_time_ns() - t0) / number / 1000.0


def measure(*, number: int = 100, repeat: int = 7, warmup: int = 20) -> dict[str, float]:
    """The figures of this group: ``litellm_us`` / ``litellm_bare_us`` /
    ``litellm_ratio_vs_bare`` (acompletion) and the same with ``_sync`` (completion)."""
    litellm.suppress_debug_info = True
    with tempfile.TemporaryDirectory() as tmp:
        proc, base = _server(tmp)
        try:
            kwargs = {"api_base": base, "api_key": "sk-bench", "num_retries": 0, "max_retries": 0}
            brain = BrainLiteLLM()
            figures = asyncio.run(_measure_async(brain, kwargs, number, repeat, warmup))
            figures.update(_measure_sync(brain, kwargs, number, repeat, warmup))
            return figures
        finally:
            proc.terminate()
            proc.wait(timeout=10)


async def _measure_async(brain: BrainLiteLLM, kwargs: dict, number: int, repeat: int,
                         warmup: int) -> dict[str, float]:
    ours = lambda: brain.acompletion("openai/m", HI, **kwargs)  # noqa: E731
    bare = lambda: litellm.acompletion("openai/m", HI, **kwargs)  # noqa: E731
    await _async_block(ours, warmup)
    await _async_block(bare, warmup)
    subject, baseline = [], []
    for _ in range(repeat):
        subject.append(await _async_block(ours, number))
        baseline.append(await _async_block(bare, number))
    s, b = statistics.median(subject), statistics.median(baseline)
    return {"litellm_us": s, "litellm_bare_us": b, "litellm_ratio_vs_bare": s / b}


def _measure_sync(brain: BrainLiteLLM, kwargs: dict, number: int, repeat: int,
                  warmup: int) -> dict[str, float]:
    ours = lambda: brain.completion("openai/m", HI, **kwargs)  # noqa: E731
    bare = lambda: litellm.completion("openai/m", HI, **kwargs)  # noqa: E731
    _sync_block(ours, warmup)
    _sync_block(bare, warmup)
    subject, baseline = [], []
    for _ in range(repeat):
        subject.append(_sync_block(ours, number))
        baseline.append(_sync_block(bare, number))
    s, b = statistics.median(subject), statistics.median(baseline)
    return {"litellm_us_sync": s, "litellm_bare_us_sync": b, "litellm_ratio_vs_bare_sync": s / b}


if __name__ == "__main__":
    print(json.dumps(measure(number=20, repeat=3, warmup=5), indent=1))
