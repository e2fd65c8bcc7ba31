"""``brain_bytes`` and ``brain_create_us_1k`` / ``brain_create_us_10k``.

``brain_bytes``: tracemalloc's count of bytes allocated per idle ``RetryBrain`` while 10,000
are alive (the list that holds them is allocated before the first snapshot, so it is not
counted). ``session_bytes`` is the same for an idle ``AgentSession`` (brain included), for
context.

``brain_create_us_N``: time to create ``N`` brains, kept alive, divided by ``N`` (median of
rounds). Nothing in the brain grows with the number of brains (they are not registered with
the machine), but CPython's own cost per new object does: more of the cyclic GC's young
collections promote into older generations, and the fresh memory no longer fits in the CPU
caches. So the same is measured for a plain ``__slots__`` object with the policy model's fields
(``plain_create_us_N``), interleaved with the brain, and ``brain_create_growth_vs_plain`` —
the brain's 10k/1k growth over the plain object's — says whether the brain adds any growth
of its own (1.0: none).
"""

from __future__ import annotations

import gc
import statistics
import tracemalloc

from fsm.core.brain import RetryBrain, _Policy
from fsm.core.settings import RetrySettings

from ._timing import now_ns


class PlainSlots:
    """The baseline object: as many slots as the brain's policy model, set to the same kinds of
    values (the brain itself is one more small object holding the model)."""

    __slots__ = _Policy.__slots__

    def __init__(self, settings: RetrySettings) -> None:
        self.owner = None
        self.state = "idle"
        self.settings = settings
        self.attempt = 0
        self.chain_id = 0
        self.max = 0
        self.timer = 0
        self.fact_timer = 0
        self.chain_start_ms = None
        self.actions = []
        self.message = None
        self.cls = None
        self.facts = None
        self.reason = ""
        self.random = None
        self.plan = None
        self.source = "idle"


def _bytes_per(factory, count: int) -> float:
    gc.collect()
    keep: list = [None] * count
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(count):
            keep[i] = factory()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del keep
    gc.collect()
    return (after - before) / count


def _session_factory():
    from fsm.host.session import AgentSession
    from fsm.testing import ScriptedProvider
    provider = ScriptedProvider()
    settings = RetrySettings()
    return lambda: AgentSession(provider, settings=settings)


def _create_us(cls, settings: RetrySettings, count: int) -> float:
    gc.collect()
    keep: list = [None] * count
    t0 = now_ns()
    for i in range(count):
        keep[i] = cls(settings)
    elapsed = now_ns() - t0
    del keep
    return elapsed / count / 1000.0


def measure(*, alive: int = 10_000, small: int = 1_000, large: int = 10_000,
            repeat: int = 9) -> dict[str, float]:
    """The figures of this group."""
    settings = RetrySettings()
    runs: dict[tuple[type, int], list[float]] = {(c, n): [] for c in (RetryBrain, PlainSlots)
                                                 for n in (small, large)}
    for cls in (RetryBrain, PlainSlots):
        _create_us(cls, settings, small)  # warm-up
    for r in range(repeat):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for cls, n in order:
            runs[(cls, n)].append(_create_us(cls, settings, n))
    med = {k: statistics.median(v) for k, v in runs.items()}
    brain_growth = med[(RetryBrain, large)] / med[(RetryBrain, small)]
    plain_growth = med[(PlainSlots, large)] / med[(PlainSlots, small)]
    return {
        "brain_bytes": _bytes_per(lambda: RetryBrain(settings), alive),
        "session_bytes": _bytes_per(_session_factory(), alive),
        "brain_create_us_1k": med[(RetryBrain, small)],
        "brain_create_us_10k": med[(RetryBrain, large)],
        "plain_create_us_1k": med[(PlainSlots, small)],
        "plain_create_us_10k": med[(PlainSlots, large)],
        "brain_create_growth": brain_growth,
        "brain_create_growth_vs_plain": brain_growth / plain_growth,
    }
