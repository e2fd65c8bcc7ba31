"""Inputs shared by the figure modules: the corpus of real provider errors, adversarial texts."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "data" / "provider-errors.jsonl"


@lru_cache(maxsize=1)
def corpus() -> tuple[dict, ...]:
    """The rows of ``tests/data/provider-errors.jsonl`` and of the later collections beside it
    (``provider-errors-v2.jsonl``…), fields id, message, expected, …"""
    rows: list[dict] = []
    for path in sorted(CORPUS.parent.glob("provider-errors*.jsonl")):
        with path.open(encoding="utf-8") as fh:
            rows.extend(json.loads(line) for line in fh if line.strip())
    return tuple(rows)


def corpus_messages(expected: str | None = None) -> list[str]:
    """The corpus messages, optionally only those whose expected class is ``expected``."""
    return [r["message"] for r in corpus() if expected is None or r["expected"] == expected]


# Near misses of the classifier's rules: each starts like a rule but never completes one, so
# every stage scans the whole text and every alternative is tried at (almost) every position.
NEAR_MISSES: dict[str, tuple[str, ...]] = {
    "rate": ("rate lim ", "rate-limi ", "ratelimi ", "thrott ", "too many reque "),
    "overload": ("overloa ", "over capacit ", "server is bus ", "high deman "),
    "overflow": ("prompt is too ", "context leng ", "maximum context lengt ", "exceeds the contex ",
                 "too many toke ", "input token count "),
    "digits": ("5035035 ", "x503x ", "1500 tokens ", "4290429 ", "502.5 ", "$503 ", "#504 "),
    "network": ("connection re ", "socket hang ", "timed ou ", "fetch faile ", "upstream conn "),
    "hints": ("retry-afte ", "try again in x ", "retry after x ", "please wait x ",
              "reset after x "),
    "billing": ("insufficient_quot ", "credit balance is too ", "usage limi ", "quota exceede "),
}


def adversarial(kind: str, size: int) -> str:
    """A ``size``-character message made of near misses: one family of
    :data:`NEAR_MISSES`, or ``"mixed"`` (all of them interleaved)."""
    if kind == "mixed":
        parts = [p for family in NEAR_MISSES.values() for p in family]
    else:
        parts = list(NEAR_MISSES[kind])
    unit = "".join(parts)
    return (unit * (size // len(unit) + 1))[:size]


ADVERSARIAL_KINDS: tuple[str, ...] = ("mixed",) + tuple(NEAR_MISSES)
