"""``wasted_requests_seed`` vs ``wasted_requests_honor``: requests the server had said would fail.

A fixed mix of failures is replayed through :class:`fsm.host.session.AgentSession` with the fake
clock (no real time passes). Each case is a server that answers with one error until its
*recovery time*, then succeeds:

- hinted cases: the error carries a retry hint (``Please try again in 6.379s``,
  ``retry-after-ms: 3000``, ``Retry-After: 5``) and the server recovers exactly when the hint
  says; a request sent before that moment is **wasted** (the server had said it would fail);
- unhinted cases: a 529 or 503 with no hint, recovering after a fixed time; their requests are
  never counted as wasted (nobody said when).

Figures: ``wasted_requests_seed`` and ``wasted_requests_honor`` (sums over the mix, with
``retryHints`` ``"ignore"`` — the reference behaviour — and ``"honor"``);
``hint_recovery_ratio_honor``: the mean over hinted cases of (time to success ÷ the hint), 1.0
when the retry goes out exactly when the server said (above 1 where the normal backoff
was longer than the hint: the delay is the larger of the two); ``requests_seed`` / ``requests_honor``:
all requests sent. Target: zero wasted requests with ``honor``.
"""

from __future__ import annotations

import asyncio

from fsm.fleet import InProcessCoordinator
from fsm.core.messages import AssistantMessage
from fsm.host.session import AgentSession
from fsm.core.settings import RetrySettings
from fsm.testing import FakeClock

# (error text, recovery ms, hinted)
CASES: tuple[tuple[str, int, bool], ...] = (
    ("429 Rate limit reached for gpt-4o-mini on requests per min. Please try again in 6.379s.", 6379, True),
    ("429 Too Many Requests; retry-after-ms: 3000", 3000, True),
    ("529 Overloaded. Retry-After: 5", 5000, True),
    ("429 Rate limit exceeded. Please try again in 11s", 11_000, True),
    ("503 Service Unavailable. Please retry in 1.5s", 1500, True),
    ("529 Overloaded", 3000, False),
    ("503 Service Unavailable", 5000, False),
    ("502 Bad Gateway", 1000, False),
)


class _RecoveringServer:
    """Fails with ``text`` until ``recovery_ms`` of fake time has passed, then succeeds."""

    name = "bench"
    model = "bench-model"

    def __init__(self, clock: FakeClock, text: str, recovery_ms: int) -> None:
        self.clock, self.text, self.recovery_ms = clock, text, recovery_ms
        self.sent_at: list[int] = []

    async def complete(self, messages, *, on_text=None, api_key=None) -> AssistantMessage:
        now = int(round(self.clock.now * 1000))
        self.sent_at.append(now)
        if now < self.recovery_ms:
            return AssistantMessage("error", error_message=self.text, model=self.model)
        return AssistantMessage("stop", text="ok", model=self.model)


async def _replay(hints: str, text: str, recovery_ms: int) -> tuple[list[int], int | None]:
    clock = FakeClock()
    server = _RecoveringServer(clock, text, recovery_ms)
    # Each case is its own provider account: a fresh coordinator, so one case's cooldown
    # (same fake epoch, same key) does not lengthen the next case's retries.
    session = AgentSession(server, clock=clock, coordinator=InProcessCoordinator(),
                           settings=RetrySettings(retry_hints=hints, max_retries=3))
    task = asyncio.ensure_future(session.prompt("hi"))
    for _ in range(2000):  # 100 s of fake time in 50 ms steps
        if task.done():
            break
        await clock.advance(0.05)
    await task
    success_at = server.sent_at[-1] if server.sent_at[-1] >= recovery_ms else None
    return server.sent_at, success_at


async def _run() -> dict[str, float]:
    out: dict[str, float] = {}
    for hints, key in (("ignore", "seed"), ("honor", "honor")):
        wasted = total = 0
        ratios = []
        for text, recovery_ms, hinted in CASES:
            sent, success_at = await _replay(hints, text, recovery_ms)
            total += len(sent)
            if hinted:
                wasted += sum(1 for t in sent[1:] if t < recovery_ms)
                if success_at is not None:
                    ratios.append(success_at / recovery_ms)
        out[f"wasted_requests_{key}"] = wasted
        out[f"requests_{key}"] = total
        if key == "honor":
            out["hint_recovery_ratio_honor"] = sum(ratios) / len(ratios) if ratios else float("nan")
    return out


def measure(**_: object) -> dict[str, float]:
    """The figures of this group (counts; the ratio has no unit)."""
    return asyncio.run(_run())
