"""``classify_us_median`` over the corpus and ``classify_1mb_ms`` for adversarial 1 MB texts.

``classify_us_median``: for every message of ``tests/data/provider-errors.jsonl`` (stop
reason ``error``), the median over rounds of the mean time of ``classify()`` on it; the
figure is the median over messages (``classify_us_p90`` and ``classify_us_max`` too).

``classify_1mb_ms``: the worst, over the adversarial families of
:data:`benchmarks._data.NEAR_MISSES` and their mix, of the median time to classify a
1,000,000-character message made of near misses (each starts like a rule and never completes
one, so every stage must scan the whole text). Every one must come out ``fatal.unmatched``.
"""

from __future__ import annotations

import statistics

from fsm.classify import classify

from ._data import ADVERSARIAL_KINDS, adversarial, corpus_messages
from ._timing import loop_us, now_ns, percentile


def _corpus(number: int, repeat: int, warmup: int, limit: int | None) -> list[float]:
    messages = corpus_messages()[:limit]
    runs: list[list[float]] = [[] for _ in messages]
    for m in messages:
        loop_us(lambda: classify("error", m), warmup)
    for _ in range(repeat):
        for i, m in enumerate(messages):
            runs[i].append(loop_us(lambda: classify("error", m), number))
    return [statistics.median(r) for r in runs]


def _big(kind: str, size: int, repeat: int) -> float:
    text = adversarial(kind, size)
    result = classify("error", text)
    if result.rule != "fatal.unmatched":
        raise AssertionError(f"adversarial text {kind!r} matched {result.rule}: not a near miss")
    runs = []
    for _ in range(repeat):
        t0 = now_ns()
        classify("error", text)
        runs.append((now_ns() - t0) / 1e6)
    return statistics.median(runs)


def measure(*, number: int = 200, repeat: int = 5, warmup: int = 20, big_size: int = 1_000_000,
            big_repeat: int = 3, limit: int | None = None,
            kinds: tuple[str, ...] = ADVERSARIAL_KINDS) -> dict[str, float]:
    """The figures of this group (µs for the corpus, ms for the 1 MB texts)."""
    per_message = _corpus(number, repeat, warmup, limit)
    out = {
        "classify_us_median": statistics.median(per_message),
        "classify_us_p90": percentile(per_message, 90),
        "classify_us_max": max(per_message),
        "classify_messages": float(len(per_message)),
    }
    big = {kind: _big(kind, big_size, big_repeat) for kind in kinds}
    worst = max(big, key=big.get)
    out["classify_1mb_ms"] = big[worst]
    for kind, ms in big.items():
        out[f"classify_1mb_ms_{kind}"] = ms
    out["classify_1mb_chars"] = float(big_size)
    return out
