"""The fleet's pacer: a client-side rate limiter whose rate is learned from throttling answers.

Pure: a :class:`PacerState` and ``now_ms`` in, a new state and a delay out (no clock, no I/O).
The coordinators keep one state per (provider, model, credential) and call :func:`reserve`
before a request goes out and :func:`observe` when its answer comes back; the Redis
coordinator runs the same arithmetic in a Lua script on the server's own clock
(``fsm/fleet/_redis.py``), so that every process of a fleet paces against one state.

The design is AWS SDK adaptive retry mode's client-side rate limiter (botocore,
https://github.com/boto/botocore/blob/develop/botocore/retries/adaptive.py,
``bucket.py``, ``throttling.py``; the mode is described at
https://docs.aws.amazon.com/sdkref/latest/guide/feature-retry-behavior.html):

- a **token bucket** whose fill rate is the send rate allowed (requests per second) and which
  holds one second's worth of it, at least one token (``bucket.py``: ``TokenBucket``, whose
  capacity is ``max(rate, 1)``); here the bucket is written in its equivalent *virtual
  scheduling* form (the generic cell rate algorithm, ITU-T I.371): a theoretical arrival time
  ``tat_ms`` that each reservation pushes on by one interval, so that a slot can be reserved
  in the future and the delay told in advance;
- the fill rate follows **CUBIC** (``throttling.py``: ``CubicCalculator``, RFC 8312): on a
  throttle the rate drops to ``beta`` (0.7) × the rate it was sending at, and the curve
  ``W(t) = C (t − K)³ + W_max`` with ``K = ∛(W_max (1 − beta) / C)`` brings it back, first
  fast, flat around the last rate that was throttled, then probing above it;
- a **measured send rate** (``adaptive.py``: ``RateClocker``): answers counted in half-second
  buckets, smoothed (0.8 × newest + 0.2 × before); the rate after a throttle starts from the
  lower of the measured and the allowed rate, and the allowed rate never exceeds twice the
  measured one (``ClientRateLimiter._MAX_RATE_ADJUST_SCALE``);
- the bucket only starts pacing after the first throttle (botocore's ``_enabled``);

and two additions of this project:

- a **floor** ``min_rate`` (botocore's bucket has one of 0.5 requests/s, ``_MIN_RATE``): the
  fleet keeps probing at that rate, so that the end of an outage is seen, as Linkerd's retry
  budget keeps ``minRetriesPerSecond`` (https://linkerd.io/2/reference/service-profiles/);
- after ``forget_after_ms`` without a throttle the pacer lets go (the state is as new).

Units: times in ms (``float`` inside, any origin: the caller's clock), rates in requests per
second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from fsm.core.settings import PacingSettings

__all__ = ["PacerState", "MEASURE_BUCKET_MS", "SMOOTHING", "MAX_RATE_SCALE", "reserve",
           "observe", "slot_delay_ms", "fresh"]

MEASURE_BUCKET_MS = 500.0
"""The measured rate is updated once per this many ms (botocore ``RateClocker._TIME_BUCKET_RANGE``)."""

SMOOTHING = 0.8
"""Weight of the newest bucket in the measured rate (botocore ``RateClocker._DEFAULT_SMOOTHING``)."""

MAX_RATE_SCALE = 2.0
"""The allowed rate is at most this × the measured rate (botocore
``ClientRateLimiter._MAX_RATE_ADJUST_SCALE``)."""

MAX_DELAY_MS = 34_560_000_000
"""No delay told is longer than 400 days (a sane maximum for any clock text)."""


@dataclass(frozen=True, slots=True)
class PacerState:
    """One key's pacer.

    - ``on``: a throttle was seen and not forgotten (the bucket paces);
    - ``fill``: the allowed rate, requests/s (> 0 while ``on``);
    - ``tat_ms``: the theoretical arrival time of the next request at the allowed rate;
    - ``w_max``, ``last_fail_ms``: CUBIC's rate at the last throttle and its time;
    - ``m_rate``, ``m_bucket``, ``m_count``: the measured rate (requests/s), the start of
      its current half-second bucket (ms, or -1 before the first answer) and the answers
      counted in it.

    Every field is a finite float (``on`` a bool); :func:`fresh` is the state of a key
    nobody paced yet.
    """

    on: bool = False
    fill: float = 0.0
    tat_ms: float = 0.0
    w_max: float = 0.0
    last_fail_ms: float = 0.0
    m_rate: float = 0.0
    m_bucket: float = -1.0
    m_count: float = 0.0


def fresh() -> PacerState:
    """The state of a key nobody paced yet (or whose state was lost): not pacing."""
    return PacerState()


def _interval_ms(fill: float) -> float:
    return 1000.0 / fill


def slot_delay_ms(state: PacerState, now_ms: float, settings: PacingSettings,
                  earliest_ms: float = 0.0) -> float:
    """The delay in ms until a request may go (without reserving it); 0 when not pacing."""
    if not state.on or not settings.enabled:
        return 0.0
    interval = _interval_ms(state.fill)
    tolerance = max(0.0, state.fill * settings.burst_s - 1.0) * interval
    start = max(now_ms + max(0.0, earliest_ms), state.tat_ms - tolerance)
    return min(float(MAX_DELAY_MS), start - now_ms)


def reserve(state: PacerState, now_ms: float, settings: PacingSettings,
            earliest_ms: float = 0.0) -> tuple[PacerState, int]:
    """Reserve the next slot for one request that will not go before ``now_ms + earliest_ms``.

    Returns ``(new state, delay_ms)``: the request goes ``delay_ms`` (an int ≥ 0, rounded
    up, at most 400 days) after ``now_ms``. Not pacing (no throttle seen, or pacing off):
    ``(state, 0)`` unchanged. The bucket holds ``max(1, fill × burst_s)`` requests: that many
    go at once after a quiet spell, then one per ``1000 / fill`` ms (the GCRA form of
    botocore's ``TokenBucket.acquire``, which blocks instead of telling the delay).
    """
    if not state.on or not settings.enabled:
        return state, 0
    state = _forget(state, now_ms, settings)
    if not state.on:
        return state, 0
    delay = slot_delay_ms(state, now_ms, settings, earliest_ms)
    start = now_ms + delay
    tat = max(state.tat_ms, start) + _interval_ms(state.fill)
    return replace(state, tat_ms=tat), max(0, math.ceil(delay))


def _forget(state: PacerState, now_ms: float, settings: PacingSettings) -> PacerState:
    if state.on and now_ms - state.last_fail_ms >= settings.forget_after_ms:
        return replace(fresh(), m_rate=state.m_rate, m_bucket=state.m_bucket, m_count=state.m_count)
    return state


def _measure(state: PacerState, now_ms: float) -> PacerState:
    """botocore ``RateClocker.record``: count one answer; close the half-second bucket."""
    bucket = math.floor(now_ms / MEASURE_BUCKET_MS) * MEASURE_BUCKET_MS
    count = state.m_count + 1.0
    if state.m_bucket < 0:
        return replace(state, m_bucket=bucket, m_count=count)
    if bucket > state.m_bucket:
        current = count / ((bucket - state.m_bucket) / 1000.0)
        rate = current * SMOOTHING + state.m_rate * (1.0 - SMOOTHING)
        return replace(state, m_rate=rate, m_bucket=bucket, m_count=0.0)
    return replace(state, m_count=count)


def _cubic_k(w_max: float, settings: PacingSettings) -> float:
    return float((w_max * (1.0 - settings.beta) / settings.scale) ** (1.0 / 3.0))


def observe(state: PacerState, now_ms: float, throttled: bool,
            settings: PacingSettings) -> PacerState:
    """An answer came back at ``now_ms``; ``throttled`` when it said the provider is over
    capacity (any retryable failure without progress: 429, 503, 529, a connection error, a
    stall — docs/fleet.md "Pacing").

    botocore ``ClientRateLimiter.on_receiving_response``: the measured rate counts the
    answer; a throttle sets CUBIC's ``W_max`` to the rate in use (the measured rate, or the
    lower of it and the allowed rate once pacing) and the allowed rate to ``beta`` × that;
    an answer that is not a throttle moves the allowed rate along the cubic curve. The
    allowed rate is then capped at twice the measured rate and at ``max_rate``, and kept at
    least ``min_rate`` (the probes' floor). Returns the new state.
    """
    if not settings.enabled:
        return state
    state = _forget(state, now_ms, settings)
    state = _measure(state, now_ms)
    measured = state.m_rate
    if throttled:
        in_use = min(measured, state.fill) if state.on else measured
        new_rate = in_use * settings.beta
        state = replace(state, on=True, w_max=in_use, last_fail_ms=now_ms)
    elif state.on:
        dt_s = (now_ms - state.last_fail_ms) / 1000.0
        new_rate = settings.scale * (dt_s - _cubic_k(state.w_max, settings)) ** 3 + state.w_max
    else:
        return state
    new_rate = min(new_rate, MAX_RATE_SCALE * measured)
    if settings.max_rate is not None:
        new_rate = min(new_rate, settings.max_rate)
    new_rate = max(new_rate, settings.min_rate)
    tat = state.tat_ms
    if state.on and state.fill > 0 and new_rate != state.fill:
        # A new rate applies to the slots not yet started: the backlog beyond now is
        # rescaled (botocore refills at the old rate before setting a new one).
        backlog = max(0.0, tat - now_ms)
        tat = now_ms + backlog * (state.fill / new_rate)
    return replace(state, fill=new_rate, tat_ms=tat)
