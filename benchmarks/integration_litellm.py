"""``litellm_ratio_vs_bare``: what the LiteLLM integration adds to a call that succeeds.

Subject: ``BrainLiteLLM().acompletion("openai/m", ..., api_base=<fault server>)`` (and
``completion`` for the ``_sync`` figures); baseline: bare ``litellm.acompletion`` /
``litellm.completion`` with the same arguments (``num_retries=0``, ``max_retries=0``, as the
integration sends them). The fault server answers every call with a plain success, in a separate
process (``python -m fsm fault-server``), so the figures are the *client* process's CPU time per
call (``time.process_time_ns``, LiteLLM's own threads included). Blocks of ``number`` calls
alternate subject and baseline, the order swapping every block (:mod:`benchmarks._timing`);
each figure is the median over ``repeat`` blocks, in µs. LiteLLM reads its bundled model cost
map (nothing leaves the machine, SPEC §15.13).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402

from benchmarks._timing import acompare, compare, cpu_us, fault_server, ratio_figures  # noqa: E402
from fsm.integrations.litellm import BrainLiteLLM  # noqa: E402

HI = [{"role": "user", "content": "hi"}]


def _ok(reply: Any) -> Any:
    assert reply.choices[0].message.content == "ok"
    return reply


def measure(*, number: int = 100, repeat: int = 7, warmup: int = 20) -> dict[str, float]:
    """The figures of this group: ``litellm_us`` / ``litellm_bare_us`` /
    ``litellm_ratio_vs_bare`` (acompletion) and the same with ``_sync`` (completion)."""
    litellm.suppress_debug_info = True
    with fault_server() as root:
        kwargs = {"api_base": root + "/v1", "api_key": "sk-bench", "num_retries": 0, "max_retries": 0}
        brain = BrainLiteLLM()

        async def ours() -> Any:
            return _ok(await brain.acompletion("openai/m", HI, **kwargs))

        async def bare() -> Any:
            return _ok(await litellm.acompletion("openai/m", HI, **kwargs))

        figures = ratio_figures("litellm", *asyncio.run(
            acompare(ours, bare, number=number, repeat=repeat, warmup=warmup)))
        s, b, _, _ = compare(lambda: _ok(brain.completion("openai/m", HI, **kwargs)),
                             lambda: _ok(litellm.completion("openai/m", HI, **kwargs)),
                             number=number, repeat=repeat, warmup=warmup, block=cpu_us)
        figures.update(ratio_figures("litellm", s, b, "_sync"))
        return figures


if __name__ == "__main__":
    print(json.dumps(measure(number=20, repeat=3, warmup=5), indent=1))
