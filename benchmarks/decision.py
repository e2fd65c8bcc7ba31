"""``decision_us`` vs ``tenacity_us``: the cost of deciding one retried failure.

Subject: ``RetryBrain.turn_ended(message)`` from ``idle`` into ``backing_off`` — classification
of the error text, the guarded transition through the dispatch compiled from the ``transitions``
machine (the default engine) and the actions (``auto_retry_start`` event, drop, start backoff) — then the brain is put back to
``idle`` by assigning ``state``/``attempt`` (two attribute stores, included in the figure).
The messages are the corpus's real retryable errors; ``decision_us`` is the median over
messages of each message's median time.

Baseline: ``tenacity.AsyncRetrying`` (wait none, stop after 4, retry on one exception type)
retrying one exception: per iteration a new retry loop, one failed attempt, then success —
what a hand-rolled agent loop would otherwise pay for "retry this once".

Extra figures that explain the split: ``decision_preclassified_us`` (the same call with the
classification handed in, so only transition + actions) and ``decision_short_us`` (a short
``"503 Service Unavailable"`` message), ``decision_transitions_us`` (the same decision on a
``RetryBrain(engine="transitions")``, which fires the ``transitions`` machine itself) and its
``decision_transitions_ratio_vs_tenacity``.
"""

from __future__ import annotations

import asyncio
import statistics

import tenacity

from fsm.core import lifecycle as L
from fsm.core.brain import RetryBrain
from fsm.core.classify import classify_message
from fsm.core.messages import AssistantMessage
from fsm.core.settings import RetrySettings

from ._data import corpus_messages
from ._timing import aloop_us, loop_us

SHORT_MESSAGE = "503 Service Unavailable"


class ProviderError(Exception):
    """What a provider call would raise in a tenacity-wrapped agent loop."""


def _decider(brain: RetryBrain, message: AssistantMessage, classification=None):
    idle = L.IDLE
    turn_ended = brain.turn_ended

    if classification is None:
        def decide() -> None:
            turn_ended(message)
            brain._p.state = idle
            brain._p.attempt = 0
    else:
        def decide() -> None:
            turn_ended(message, classification=classification)
            brain._p.state = idle
            brain._p.attempt = 0
    return decide


def _check(brain: RetryBrain, message: AssistantMessage) -> None:
    actions = brain.turn_ended(message)
    if brain.state != L.BACKING_OFF or len(actions) != 5:
        raise AssertionError(f"expected idle -> backing_off with 5 actions for "
                             f"{message.error_message!r:.80}, got {brain.state} {actions}")
    brain._p.state = L.IDLE
    brain._p.attempt = 0


async def _tenacity_once() -> None:
    calls = 0
    async for attempt in tenacity.AsyncRetrying(
            wait=tenacity.wait_none(), stop=tenacity.stop_after_attempt(4),
            retry=tenacity.retry_if_exception_type(ProviderError), reraise=True):
        with attempt:
            calls += 1
            if calls == 1:
                raise ProviderError(SHORT_MESSAGE)


def measure(*, number: int = 200, repeat: int = 5, warmup: int = 50,
            max_messages: int | None = None) -> dict[str, float]:
    """The figures of this group (µs); ``number`` calls per message per round."""
    texts = corpus_messages("retryable")[:max_messages]
    messages = [AssistantMessage("error", error_message=t) for t in texts]
    brain = RetryBrain(RetrySettings())
    for m in messages:
        _check(brain, m)
    deciders = [_decider(brain, m) for m in messages]
    pre = [_decider(brain, m, classify_message(m)) for m in messages]
    fired = RetryBrain(RetrySettings(), engine="transitions")
    for m in messages:
        _check(fired, m)
    on_machine = [_decider(fired, m) for m in messages]
    short = AssistantMessage("error", error_message=SHORT_MESSAGE)
    short_decider = _decider(brain, short)
    tenacity_number = max(20, number * 5)

    async def rounds() -> dict[str, list]:
        per_msg: list[list[float]] = [[] for _ in messages]
        per_pre: list[list[float]] = [[] for _ in messages]
        per_fired: list[list[float]] = [[] for _ in messages]
        short_runs: list[float] = []
        ten_runs: list[float] = []
        for d in deciders + pre + on_machine + [short_decider]:
            loop_us(d, warmup)
        await aloop_us(_tenacity_once, warmup)
        for r in range(repeat):
            if r % 2:
                ten_runs.append(await aloop_us(_tenacity_once, tenacity_number))
            for i, d in enumerate(deciders):
                per_msg[i].append(loop_us(d, number))
            for i, d in enumerate(pre):
                per_pre[i].append(loop_us(d, number))
            for i, d in enumerate(on_machine):
                per_fired[i].append(loop_us(d, number))
            short_runs.append(loop_us(short_decider, number * 5))
            if not r % 2:
                ten_runs.append(await aloop_us(_tenacity_once, tenacity_number))
        return {"msg": per_msg, "pre": per_pre, "fired": per_fired, "short": short_runs,
                "ten": ten_runs}

    runs = asyncio.run(rounds())
    decision = statistics.median(statistics.median(x) for x in runs["msg"])
    preclassified = statistics.median(statistics.median(x) for x in runs["pre"])
    fired_us = statistics.median(statistics.median(x) for x in runs["fired"])
    ten = statistics.median(runs["ten"])
    return {
        "decision_us": decision,
        "tenacity_us": ten,
        "decision_ratio_vs_tenacity": decision / ten,
        "decision_preclassified_us": preclassified,
        "decision_short_us": statistics.median(runs["short"]),
        "decision_transitions_us": fired_us,
        "decision_transitions_ratio_vs_tenacity": fired_us / ten,
        "decision_messages": float(len(messages)),
    }
