"""The policies the simulation compares: the ideal, the real brain, and named baselines.

Every policy makes one retrier per session (:class:`fsm.sim.engine.Retrier`):

- :class:`Ideal`: clairvoyant; each request goes out at the earliest instant the provider
  accepts it (a random 500 is re-sent at once).
- :class:`BrainRetrier`: the real :class:`fsm.core.brain.RetryBrain` with given settings,
  on the virtual clock, with the real :class:`fsm.fleet.InProcessCoordinator` (one per
  process, or one shared by the fleet as Redis would be) when the settings use hints or a
  budget. ``seed`` is this with the default settings.
- :class:`ScheduleRetrier` with a :class:`Schedule`: a baseline encoded from its source, each
  citing it: the reference behaviour by hand (:class:`SeedByHand`), the openai and anthropic
  SDK defaults, tenacity as the OpenAI Cookbook configures it, stamina's defaults,
  gemini-cli's and AWS SDK standard mode.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any, Callable

from fsm.core.classify import Classification, classify_message
from fsm.core.messages import AssistantMessage
from fsm.core.settings import RetrySettings
from fsm.fleet import CoordKey, InProcessCoordinator
from fsm.host.errors import RetryChainError
from fsm.host.loop import Attempt, RetryLoop, Send, Wait, answer_at_once
from fsm.providers.sdk_errors import error_message
from fsm.sim.engine import (DONE_FAIL, DONE_OK, PROCESSES, SEND, SEND_BOOKED, WAIT,
                            session_rng)
from fsm.sim.world import ANSWERS, Answer, Provider

__all__ = ["EPOCH_MS", "Ideal", "BrainRetrier", "BrainPolicy", "Schedule", "ScheduleRetrier",
           "SeedByHand", "OpenAIPython", "AnthropicPython", "TenacityCookbook", "Stamina",
           "GeminiCli", "AwsStandard", "BASELINES", "Messages"]

EPOCH_MS = 1_767_225_600_000
"""Virtual t = 0 as epoch ms (2026-01-01 00:00 UTC): the ``now_ms`` the brain is told."""


# -- the answers as a host sees them -----------------------------------------------------

class Messages:
    """The assistant message and the real classifier's verdict for each answer kind.

    Each kind (:data:`fsm.sim.world.ANSWERS`) is classified once by
    :func:`fsm.core.classify.classify_message` from its structured facts; an answer's own hint
    then replaces the template's (the classifier reads ``retry-after`` / ``retry-after-ms``
    exactly, which :meth:`check` verifies for each kind). Shared by every session: messages
    and classifications are immutable.
    """

    def __init__(self) -> None:
        self.ok = AssistantMessage("stop", text="ok", timestamp_ms=EPOCH_MS)
        self.ok_cls = classify_message(self.ok, now_ms=EPOCH_MS)
        self.error: dict[str, AssistantMessage] = {}
        self.cls: dict[str, Classification] = {}
        for kind, facts in ANSWERS.items():
            msg = AssistantMessage("error", timestamp_ms=EPOCH_MS, **facts)
            self.error[kind] = msg
            self.cls[kind] = classify_message(msg, now_ms=EPOCH_MS)
        self._hinted: dict[tuple[str, int], Classification] = {}

    def classification(self, answer: Answer) -> Classification:
        """The verdict for ``answer`` (its hint in place of the template's)."""
        if answer.hint_ms is None:
            return self.cls[answer.kind]
        key = (answer.kind, answer.hint_ms)
        cls = self._hinted.get(key)
        if cls is None:
            cls = self._hinted[key] = replace(self.cls[answer.kind], retry_hint_ms=answer.hint_ms)
        return cls

    def check(self) -> None:
        """Raise ``RuntimeError`` unless every kind is retryable and a hinted kind's template
        hint is what its header says (so replacing the hint is what the classifier would do)."""
        for kind, facts in ANSWERS.items():
            cls = self.cls[kind]
            headers = facts.get("headers") or {}
            if "retry-after-ms" in headers:
                expected: int | None = int(headers["retry-after-ms"])
            elif "retry-after" in headers:
                expected = int(headers["retry-after"]) * 1000
            else:
                expected = None
            if cls.kind != "retryable" or cls.retry_hint_ms != expected:
                raise RuntimeError(f"the classifier reads the simulated answer {kind!r} as {cls}; "
                                   f"the simulation expects retryable with hint {expected}")


# -- the ideal ----------------------------------------------------------------------------

class Ideal:
    """The clairvoyant limit: every request is sent at the earliest instant of free capacity
    (booked at the provider when the call starts, or at once after a random 500)."""

    __slots__ = ("provider",)

    def __init__(self, provider: Provider) -> None:
        self.provider = provider

    def start(self, t: int) -> tuple[int, int, int]:
        return SEND_BOOKED, self.provider.reserve(t), 0

    def answered(self, t: int, answer: Answer) -> tuple[int, int, int]:
        if answer.ok:
            return DONE_OK, t, 0
        return SEND_BOOKED, self.provider.reserve(t), 0

    def timer(self, t: int, token: int) -> tuple[int, int, int]:  # never asked for
        raise AssertionError("the ideal never waits on a timer")


# -- the real brain, hosted by the one loop ------------------------------------------------

class BrainPolicy:
    """What the sessions of a brain policy share: settings, messages, clock, coordinators.

    ``coordinators``: ``None`` (none: the settings use no hints, budget or pacing),
    ``"process"`` (one :class:`~fsm.fleet.InProcessCoordinator` per process) or ``"fleet"``
    (one for every session, as a Redis coordinator would be); ``processes``: how many processes
    the sessions live in (the world's). The hosts and the coordinators
    read one clock, the virtual clock as epoch ms (:class:`EpochClock`; the one clock
    convention of docs/architecture.md "The loop").
    """

    def __init__(self, settings: RetrySettings, messages: Messages, clock: Callable[[], float],
                 coordinators: str | None, processes: int = PROCESSES) -> None:
        self.settings = settings
        self.messages = messages
        self.key = CoordKey("sim", "model")
        self.clock = EpochClock(clock)
        uses = (settings.honors_hints or settings.budget is not None
                or (settings.pacing is not None and settings.pacing.enabled))
        if coordinators is None or not uses:
            self.coords: list[Any] | None = None
        else:
            count = 1 if coordinators == "fleet" else processes
            self.coords = [InProcessCoordinator(clock=self.clock.time_ms) for _ in range(count)]

    def coordinator(self, session: int) -> Any:
        if self.coords is None:
            return None
        return self.coords[session % len(self.coords)]

    def coord_key(self) -> CoordKey:
        """The provider account every simulated call goes to (the loop's ``key()``)."""
        return self.key


class EpochClock:
    """The virtual clock as a host clock (``time_ms()``: epoch ms, :data:`EPOCH_MS` at t = 0)."""

    __slots__ = ("virtual",)

    def __init__(self, virtual: Callable[[], float]) -> None:
        self.virtual = virtual

    def time_ms(self) -> int:
        return EPOCH_MS + int(self.virtual())


class BrainRetrier:
    """A session's calls, each run by the one retry loop (:class:`fsm.host.loop.RetryLoop`,
    docs/architecture.md "The loop") on the virtual clock, as the runner runs a call.

    The loop's commands become the engine's steps: :class:`~fsm.host.loop.Send` → a request
    now (:data:`SEND`), :class:`~fsm.host.loop.Wait` → a timer ``delay_ms`` later
    (:data:`WAIT`); coordinator commands (:class:`~fsm.host.loop.Admit`,
    :class:`~fsm.host.loop.Tell`) are answered at once by the in-process coordinator
    (:func:`~fsm.host.loop.answer_at_once`). Gate, first-request admission, budget re-check and
    token give-back are the loop's. An answer is handed over as a host sees it: the message's
    classification (:meth:`Messages.classification`: status, error type, headers, text), never
    the world's label. A request still in flight at the chain's deadline (``maxElapsedMs``) or
    past ``attemptTimeoutMs`` is answered as stopped when its answer arrives (the engine cannot
    abort a request; the call ends at most one service time late).
    """

    __slots__ = ("policy", "coord", "rng", "steps", "sent", "bound", "ok", "token")

    def __init__(self, policy: BrainPolicy, session: int, rng: random.Random) -> None:
        self.policy = policy
        self.coord = policy.coordinator(session)
        self.rng = rng  # the brain's jitter stream, shared with the loop's own draws
        self.steps: Any = None
        self.sent = 0      # when the request in flight went (virtual ms)
        self.bound: tuple[int | None, int | None] = (None, None)  # its timeout, its deadline
        self.ok = False    # the last answer was a success
        self.token = 0     # the id of the timer the loop waits on

    def loop(self) -> RetryLoop:
        """One call's :class:`~fsm.host.loop.RetryLoop` on the virtual clock."""
        policy = self.policy
        return RetryLoop(policy.settings, clock=policy.clock, coordinator=self.coord,
                         key=policy.coord_key, to_message=error_message, tell=answer_at_once,
                         random=self.rng.random,
                         use_coordinator=self.coord is not None)

    def start(self, t: int) -> tuple[int, int, int]:
        self.steps = self.loop().steps()
        self.ok = False
        return self._step(t, None)

    def answered(self, t: int, answer: Answer) -> tuple[int, int, int]:
        m = self.policy.messages
        self.ok = answer.ok
        timeout, deadline = self.bound
        took = t - self.sent
        if deadline is not None and took > deadline:
            self.ok = False
            return self._step(t, Attempt(stopped="deadline"))
        if timeout is not None and took > timeout:
            self.ok = False
            return self._step(t, Attempt(stopped="timeout"))
        if answer.ok:
            return self._step(t, Attempt(message=m.ok, classification=m.ok_cls))
        return self._step(t, Attempt(message=m.error[answer.kind],
                                     classification=m.classification(answer)))

    def timer(self, t: int, token: int) -> tuple[int, int, int]:
        if token != self.token:
            raise AssertionError(f"timer {token} fired; the loop waits on {self.token}")
        return self._step(t, True)

    def _step(self, t: int, value: Any) -> tuple[int, int, int]:
        """Run the loop to its next command the engine must schedule."""
        send = self.steps.send
        while True:
            try:
                command = send(value)
            except StopIteration:
                return (DONE_OK if self.ok else DONE_FAIL), t, 0
            except RetryChainError:
                return DONE_FAIL, t, 0
            kind = type(command)
            if kind is Send:
                self.sent, self.bound = t, (command.timeout_ms, command.deadline_ms)
                return SEND, t, 0
            if kind is Wait:
                self.token += 1
                return WAIT, t + command.delay_ms, self.token
            value = answer_at_once(command)


# -- baselines from their sources -----------------------------------------------------------

class Schedule:
    """A baseline: how long to wait before retry ``n`` (1-based) after ``answer``, or None to
    give up. ``elapsed_ms`` is the time since the call's first request went out; ``state`` is
    the per-call dict the schedule may keep; ``shared`` the per-process state."""

    name = ""

    def delay_ms(self, n: int, answer: Answer, rng: random.Random, elapsed_ms: int,
                 state: dict, shared: dict) -> int | None:
        raise NotImplementedError

    def succeeded(self, n: int, state: dict, shared: dict) -> None:
        """The call succeeded after ``n`` retries (for schedules with a retry quota)."""


class SeedByHand(Schedule):
    """The reference behaviour written out by hand: 2 s, 4 s, 8 s, then give up; hints
    ignored (``docs/policy.md`` §1: ``baseDelayMs × 2^(n−1)``, ``maxRetries`` 3)."""

    name = "seed_by_hand"

    def delay_ms(self, n, answer, rng, elapsed_ms, state, shared):
        return 2000 << (n - 1) if n <= 3 else None


class OpenAIPython(Schedule):
    """openai-python's defaults: ``max_retries = 2``; a ``retry-after-ms`` / ``retry-after``
    of at most 120 s is waited as given, a longer one is not retried; otherwise
    ``min(0.5 × 2^(n−1), 8) s × (1 − 0.25 × U)``. 429 and 5xx are retried.
    Source: https://github.com/openai/openai-python/blob/main/src/openai/_base_client.py
    (``_calculate_retry_timeout``, ``_should_retry``) and ``src/openai/_constants.py``
    (``DEFAULT_MAX_RETRIES``, ``INITIAL_RETRY_DELAY``, ``MAX_RETRY_DELAY``,
    ``MAX_RETRY_AFTER_DELAY``)."""

    name = "openai_python"
    max_hint_s: float | None = 120.0

    def delay_ms(self, n, answer, rng, elapsed_ms, state, shared):
        if n > 2:
            return None
        hint = answer.hint_ms
        if hint is not None and hint > 0:
            if self.max_hint_s is None or hint <= self.max_hint_s * 1000:
                return hint
            return None
        return int(min(0.5 * 2 ** (n - 1), 8.0) * (1 - 0.25 * rng.random()) * 1000)


class AnthropicPython(OpenAIPython):
    """anthropic-sdk-python's defaults: as openai-python (``max_retries = 2``, 0.5 s doubling
    to 8 s, minus up to 25 %), but any positive ``retry-after`` is waited, however long.
    Source: https://github.com/anthropics/anthropic-sdk-python/blob/main/src/anthropic/_base_client.py
    (``_calculate_retry_timeout``) and ``src/anthropic/_constants.py``."""

    name = "anthropic_python"
    max_hint_s = None


class TenacityCookbook(Schedule):
    """tenacity as the OpenAI Cookbook configures it: ``@retry(wait=wait_random_exponential(min=1,
    max=60), stop=stop_after_attempt(6))`` — five retries, each after ``U(1, max(1, min(2^(n−1),
    60)))`` s; every error is retried and hints are ignored.
    Sources: https://cookbook.openai.com/examples/how_to_handle_rate_limits and
    https://github.com/jd/tenacity/blob/main/tenacity/wait.py (``wait_random_exponential``)."""

    name = "tenacity_cookbook"

    def delay_ms(self, n, answer, rng, elapsed_ms, state, shared):
        if n > 5:
            return None
        high = max(1.0, min(2.0 ** (n - 1), 60.0))
        return int(rng.uniform(1.0, high) * 1000)


class Stamina(Schedule):
    """stamina's defaults: ``attempts=10``, ``timeout=45`` s (no retry once 45 s have passed
    since the first attempt), ``wait_initial=0.1``, ``wait_max=5``, ``wait_jitter=1``,
    ``wait_exp_base=2``: retry n after ``min(5, 0.1 × 2^(n−1) + U(0, 1))`` s; hints ignored.
    Source: https://github.com/hynek/stamina/blob/main/src/stamina/_core.py
    (``retry_context``, ``_compute_backoff``, ``_make_stop``)."""

    name = "stamina"

    def delay_ms(self, n, answer, rng, elapsed_ms, state, shared):
        if n > 9 or elapsed_ms >= 45_000:
            return None
        return int(min(5.0, 0.1 * 2 ** (n - 1) + rng.uniform(0, 1.0)) * 1000)


class GeminiCli(Schedule):
    """gemini-cli's ``retryWithBackoff`` defaults: ``maxAttempts = 10``, ``initialDelayMs =
    5000``, ``maxDelayMs = 30000``. A quota error with a retry delay waits ``max(current,
    delay)`` plus up to +20 %; others wait ``current ± 30 %``; ``current`` then doubles up to
    30 s. A retry delay over 300 s is a terminal quota error (not retried).
    Sources: https://github.com/google-gemini/gemini-cli/blob/main/packages/core/src/utils/retry.ts
    and .../packages/core/src/utils/googleQuotaErrors.ts (``MAX_RETRYABLE_DELAY_SECONDS``)."""

    name = "gemini_cli"

    def delay_ms(self, n, answer, rng, elapsed_ms, state, shared):
        hint = answer.hint_ms
        if hint is not None and hint > 300_000:
            return None
        if n > 9:
            return None
        current = state.get("current", 5000.0)
        if hint is not None and hint > 0:
            current = max(current, float(hint))
            delay = current + current * 0.2 * rng.random()
        else:
            delay = max(0.0, current + current * 0.3 * (rng.random() * 2 - 1))
        state["current"] = min(30_000.0, current * 2)
        return int(delay)


class AwsStandard(Schedule):
    """AWS SDK standard retry mode: 3 attempts; backoff ``min(20 s, U × 2^(n−1) × base)`` with
    base 500 ms for throttling errors (429) and 100 ms otherwise; a retry quota of 500 tokens
    per client (one client per process) from which each retry takes 5, refunded when the call
    succeeds (1 added after a success without retry); no retry while the quota is short. A
    ``retry-after`` hint is a floor on the delay.
    Sources: https://docs.aws.amazon.com/sdkref/latest/guide/feature-retry-behavior.html and
    https://github.com/smithy-lang/smithy-typescript/tree/main/packages/util-retry/src
    (``constants.ts``, ``StandardRetryStrategy.ts``, ``DefaultRateLimiter``)."""

    name = "aws_standard"

    def delay_ms(self, n, answer, rng, elapsed_ms, state, shared):
        if n > 2:
            return None
        tokens = shared.setdefault("quota", 500)
        if tokens < 5:
            return None
        shared["quota"] = tokens - 5
        base = 500 if answer.kind in ("rate_limited", "window", "usage_limit") else 100
        delay = int(min(20_000, rng.random() * 2 ** (n - 1) * base))
        return max(delay, answer.hint_ms or 0)

    def succeeded(self, n, state, shared):
        shared["quota"] = min(500, shared.setdefault("quota", 500) + (5 if n else 1))


class ScheduleRetrier:
    """A session under a :class:`Schedule`."""

    __slots__ = ("schedule", "rng", "shared", "state", "n", "first_sent")

    def __init__(self, schedule: Schedule, rng: random.Random, shared: dict) -> None:
        self.schedule = schedule
        self.rng = rng
        self.shared = shared
        self.state: dict = {}
        self.n = 0
        self.first_sent = 0

    def start(self, t: int) -> tuple[int, int, int]:
        self.n = 0
        self.state = {}
        self.first_sent = t
        return SEND, t, 0

    def answered(self, t: int, answer: Answer) -> tuple[int, int, int]:
        if answer.ok:
            self.schedule.succeeded(self.n, self.state, self.shared)
            return DONE_OK, t, 0
        self.n += 1
        delay = self.schedule.delay_ms(self.n, answer, self.rng, t - self.first_sent,
                                       self.state, self.shared)
        if delay is None:
            return DONE_FAIL, t, 0
        return SEND, t + max(0, delay), 0

    def timer(self, t: int, token: int) -> tuple[int, int, int]:
        raise AssertionError("a schedule sends at the time it computed")


BASELINES: dict[str, type[Schedule]] = {c.name: c for c in (
    SeedByHand, OpenAIPython, AnthropicPython, TenacityCookbook, Stamina, GeminiCli, AwsStandard)}
"""The named baselines, by policy name."""


def make_schedule_factory(name: str, seed: int,
                          processes: int = PROCESSES) -> Callable[[int, Provider, Any], ScheduleRetrier]:
    """``make_retrier`` for the baseline ``name`` (per-process shared state for quotas, in
    ``processes`` processes)."""
    schedule = BASELINES[name]()
    shared = [dict() for _ in range(processes)]

    def make(session: int, provider: Provider, context: Any) -> ScheduleRetrier:
        return ScheduleRetrier(schedule, session_rng(seed, session, 1), shared[session % processes])
    return make


def make_brain_factory(policy: BrainPolicy, seed: int) -> Callable[[int, Provider, Any], BrainRetrier]:
    """``make_retrier`` for a brain policy: each session's calls run by the one loop, its jitter
    from the session's policy stream."""
    def make(session: int, provider: Provider, context: Any) -> BrainRetrier:
        return BrainRetrier(policy, session, session_rng(seed, session, 1))
    return make

