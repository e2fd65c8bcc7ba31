"""``classify_ratio_vs_original`` over the corpus and ``classify_1mb_ms`` for adversarial 1 MB texts.

``classify_ratio_vs_original``: the mean time per corpus message (every row of
``tests/data/provider-errors*.jsonl``, stop reason ``error``) of :func:`fsm.core.classify.classify`
divided by that of the original agent's own patterns (:func:`original_classify`: its
context-overflow phrasings and its retryable-message regex, re-expressed with Python's ``re``
and applied the way its session applies them at the end of a failed turn — the retry check,
which tests for overflow first, then, when it does not retry, the compaction check, which tests
for overflow again), both measured interleaved in the same run, so that the
machine's load cancels out (CPU time of the process, each side's fastest round: load only ever
adds time). The means themselves are ``classify_us_mean`` and ``original_us_mean``; ``classify_us_median`` / ``_p90`` / ``_max`` are the per-message
distribution of ours (median over rounds of the mean of ``number`` calls).
``classify_corpus_pass`` and ``original_corpus_pass``: the share of corpus rows whose expected
kind each one gets (the original knows no permanent conditions: a ``fatal`` row it does not
retry counts as right).

``classify_1mb_ms``: the worst, over the adversarial families of
:data:`benchmarks._data.NEAR_MISSES` and their mix, of the fastest of ``big_repeat`` times to classify a
1,000,000-character message made of near misses (each starts like a rule and never completes
one, so every stage must scan the whole text). Every one must come out ``fatal.unmatched``.
"""

from __future__ import annotations

import re
import statistics
import time

from fsm.core.classify import classify

from ._data import ADVERSARIAL_KINDS, adversarial, corpus, corpus_messages
from ._timing import loop_us, now_ns, percentile

cpu_ns = time.process_time_ns

# --------------------------------------------------------------------------------------------
# The original's patterns (pi-coding-agent 0.73.1: agent-session's retryable-error regex and
# pi-ai's context-overflow detection), as JavaScript applies them: case-insensitive `test()`,
# i.e. a search anywhere in the text, pattern by pattern.

_I = re.IGNORECASE
ORIGINAL_OVERFLOW = tuple(re.compile(p, _I) for p in (
    r"prompt is too long",
    r"request_too_large",
    r"input is too long for requested model",
    r"exceeds the context window",
    r"exceeds (?:the )?(?:model'?s )?maximum context length(?: of [\d,]+ tokens?|\s*\([\d,]+\))",
    r"input token count.*exceeds the maximum",
    r"maximum prompt length is \d+",
    r"reduce the length of the messages",
    r"maximum context length is \d+ tokens",
    r"exceeds (?:the )?maximum allowed input length of [\d,]+ tokens?",
    r"input \(\d+ tokens\) is longer than the model'?s context length \(\d+ tokens\)",
    r"exceeds the limit of \d+",
    r"exceeds the available context size",
    r"greater than the context length",
    r"context window exceeds limit",
    r"exceeded model token limit",
    r"too large for model with \d+ maximum context length",
    r"prompt has [\d,]+ tokens?, but the configured context size is [\d,]+ tokens?",
    r"model_context_window_exceeded",
    r"prompt too long; exceeded (?:max )?context length",
    r"range of input length should be",
    r"context[_ ]length[_ ]exceeded",
    r"too many tokens",
    r"token limit exceeded",
    r"^4(?:00|13)\s*(?:status code)?\s*\(no body\)",
))
ORIGINAL_NON_OVERFLOW = tuple(re.compile(p, _I) for p in (
    r"^(?:Throttling error|Service unavailable):", r"rate limit", r"too many requests"))
ORIGINAL_RETRYABLE = re.compile(
    r"overloaded|provider.?returned.?error|rate.?limit|too many requests|429|500|502|503|504"
    r"|service.?unavailable|server.?error|internal.?error|network.?error|connection.?error"
    r"|connection.?refused|connection.?lost|websocket.?closed|websocket.?error|other side closed"
    r"|fetch failed|upstream.?connect|reset before headers|socket hang up|ended without"
    r"|http2 request did not get a response|timed? out|timeout|terminated|retry delay", _I)


def original_is_context_overflow(message: str) -> bool:
    """pi-ai's ``isContextOverflow`` on an error message: no exclusion matches and one of the
    overflow phrasings does."""
    return not any(p.search(message) for p in ORIGINAL_NON_OVERFLOW) and any(
        p.search(message) for p in ORIGINAL_OVERFLOW)


def original_classify(message: str | None) -> str:
    """The original's verdict on an error message, reached as its session reaches it at the
    end of a failed turn: ``_isRetryableError`` (not an overflow, and the retryable regex
    matches) and, when it does not retry, ``_checkCompaction`` (the overflow test again).
    ``context_overflow`` (handed to compaction), ``retryable``, or ``fatal`` (not retried)."""
    if not message:
        return "fatal"
    if not original_is_context_overflow(message) and ORIGINAL_RETRYABLE.search(message):
        return "retryable"
    return "context_overflow" if original_is_context_overflow(message) else "fatal"


# --------------------------------------------------------------------------------------------

def _per_message(messages: list[str], number: int, repeat: int, warmup: int) -> list[float]:
    runs: list[list[float]] = [[] for _ in messages]
    for m in messages:
        loop_us(lambda: classify("error", m), warmup)
    for _ in range(repeat):
        for i, m in enumerate(messages):
            runs[i].append(loop_us(lambda: classify("error", m), number))
    return [statistics.median(r) for r in runs]


def _ratio(messages: list[str], number: int, repeat: int, warmup: int) -> tuple[float, float]:
    """Mean µs per message of ours and of the original's, interleaved round by round (the
    order alternating), in CPU time of this process: time spent descheduled on a shared machine
    counts for neither; of each side the fastest round."""
    def ours() -> None:
        for m in messages:
            classify("error", m)

    def original() -> None:
        for m in messages:
            original_classify(m)
    passes = max(2, number // 20)
    for fn in (ours, original):
        for _ in range(max(1, warmup // 10)):
            fn()
    best = {ours: float("inf"), original: float("inf")}
    for r in range(repeat):
        for fn in ((ours, original) if r % 2 == 0 else (original, ours)):
            t0 = cpu_ns()
            for _ in range(passes):
                fn()
            best[fn] = min(best[fn], (cpu_ns() - t0) / passes / 1000.0)
    return best[ours] / len(messages), best[original] / len(messages)


def _accuracy(rows: list[dict]) -> tuple[float, float]:
    ours = sum(classify("error", r["message"]).kind == r["expected"] for r in rows)
    def original_right(row: dict) -> bool:
        verdict = original_classify(row["message"])
        return verdict == row["expected"] or (row["expected"] == "fatal" and verdict != "retryable"
                                              and verdict != "context_overflow")
    theirs = sum(original_right(r) for r in rows)
    return ours / len(rows), theirs / len(rows)


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
    return min(runs)  # the least disturbed run: on a shared machine the load only adds time


def measure(*, number: int = 200, repeat: int = 5, warmup: int = 20, big_size: int = 1_000_000,
            big_repeat: int = 3, limit: int | None = None,
            kinds: tuple[str, ...] = ADVERSARIAL_KINDS) -> dict[str, float]:
    """The figures of this group (µs for the corpus, ms for the 1 MB texts, ratios)."""
    messages = corpus_messages()[:limit]
    ours_us, original_us = _ratio(messages, number, repeat, warmup)
    per_message = _per_message(messages, number, repeat, warmup)
    ours_ok, original_ok = _accuracy(list(corpus())[:limit])
    out = {
        "classify_ratio_vs_original": ours_us / original_us,
        "classify_us_mean": ours_us,
        "original_us_mean": original_us,
        "classify_us_median": statistics.median(per_message),
        "classify_us_p90": percentile(per_message, 90),
        "classify_us_max": max(per_message),
        "classify_messages": float(len(per_message)),
        "classify_corpus_pass": ours_ok,
        "original_corpus_pass": original_ok,
    }
    big = {kind: _big(kind, big_size, big_repeat) for kind in kinds}
    worst = max(big, key=big.get)
    out["classify_1mb_ms"] = big[worst]
    for kind, ms in big.items():
        out[f"classify_1mb_ms_{kind}"] = ms
    out["classify_1mb_chars"] = float(big_size)
    return out
