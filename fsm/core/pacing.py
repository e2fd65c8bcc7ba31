"""The fleet's pacer: a client-side rate limiter whose rate is learned from throttling answers.

Pure: a :class:`PacerState` and ``now_ms`` in, a new state and a delay out (no clock, no I/O).
The coordinators keep one state per (provider, model, credential): a request about to go calls
:func:`reserve`, its answer calls :func:`observe`. The Redis coordinator runs the same
arithmetic, in the same order, in a Lua script on the server's own clock
(``fsm/fleet/_redis.py``), so that every process of a fleet paces against one state.

The rules (docs/fleet.md "Pacing" gives the measurements behind them):

- **slots**: while pacing, requests go one per ``1000 / rate`` ms (the virtual-scheduling
  form of a token bucket without burst: a theoretical arrival time ``tat_ms`` that each
  reservation pushes on by one interval). A slot is reserved at most ``horizon_ms`` ahead of
  the time the request wants to go; beyond it nothing is reserved and the host asks again
  after ``recheck_ms`` (jittered), so that a rate that recovers is used at once instead of by
  requests booked far ahead at the old rate;
- **the cut** (AWS SDK adaptive retry mode's multiplicative decrease, botocore
  ``retries/adaptive.py`` and ``throttling.py``, β = 0.7): a throttle sets the rate to
  ``beta`` × what got through over the last second — the send rate measured on the requests
  *sent* (their answers come a service time late) less the throttles heard (a refusal comes
  back at once), the lower of it and the rate in use once pacing; at most one cut per
  ``cut_interval_ms``, so the throttles of one round of requests cut once. Where nothing got
  through (an outage, a provider down), the rate drops to the floor at once instead of by
  steps of ``beta``;
- **growth**: each second with successes multiplies the rate by ``1 + growth_per_s``, or by
  ``1 + fast_growth_per_s`` while it is below the knee, 0.9 × the rate last cut (CUBIC's
  ``W_max``, RFC 8312: capacity known to exist) — up to the knee, never past it in one step
  (one success after a quiet second multiplied the rate by 1.5, past the capacity). Only a
  rate in use grows: while the send rate over the last second is below half the rate
  (RFC 7661's non-validated phase: the fleet sends less than it may), successes do not grow
  it (measured in ``flapping``: after each down period the rate grew on the probes' successes
  to 1.3 × C before the backlog came, then the backlog went at it);
- **fast recovery**: the best successes per second seen lately is remembered (forgotten
  with the half-life ``memory_s``), each second counted as the lower of it and the second
  before it (a provider's burst second, twice its capacity after a quiet spell, is not
  capacity; a second with no success before it counts 0); a success while the rate is below
  half of it, and while
  the throttles heard over the last second are at most twice the floor's rate, jumps the rate to
  that half (after an outage, the capacity that served before is tried again within seconds,
  not minutes; the late successes of requests sent before a fault began, heard among its
  throttles, are not a recovery);
- **the floor** ``min_rate``: the fleet keeps probing at that rate, so the end of an outage is
  seen (as Linkerd's retry budget keeps ``minRetriesPerSecond``,
  https://linkerd.io/2/reference/retries/); ``max_rate`` caps the rate. The floor is the
  fleet's (one state per key, shared by every process), and it backs off while nothing gets
  through: a cut at or below the floor with no success since the second of the cut before
  lowers the rate by
  ``beta`` down to :data:`PROBE_BACKOFF` × ``min_rate`` (a long outage is probed every few
  seconds, not every second); the first success lifts it back to the floor at least;
- **engaging** (SPEC §15.7, "a lone caller is not slowed by one throttle"): the pacer paces
  only after throttles (botocore's ``_enabled``), and only when the key's send rate exceeds
  what the throttle answers imply it can send — what got through, the send rate less the
  throttles heard — by more than :data:`ENGAGE_EXCESS` request per second: while not pacing,
  a throttle engages pacing (and makes the first cut) only when the throttles heard over the
  last second (the sliding window of :func:`throttle_rate`, this one included) are more than
  one per second. A lone throttle (one 429 to an otherwise healthy key, a provider's
  per-minute window, a blip) is counted and nothing else: nothing waits. A fleet above
  capacity hears many at once and engages at its second. Once pacing, every throttle counts
  as before; it lets go after ``forget_after_ms`` without a cut;
- **clock steps**: every step reads its time as the latest clock reading seen (``seen_ms``):
  a clock that stepped back (an NTP step, a Redis failover to a server whose clock is behind)
  is clamped to it, so for the pacer no time passes until the clock is back there — nothing
  is reset, forgotten or grown meanwhile. A state whose latest reading is more than
  :data:`MAX_DELAY_MS` (400 days) ahead of the clock is not a step but a state from another
  clock (a peer writing microseconds, a corrupted key): it counts as lost (:func:`fresh`).

Units: times in ms (``float`` inside, any origin: the caller's clock), rates in requests per
second shared by the fleet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from fsm.core.settings import PacingSettings

__all__ = ["PacerState", "MAX_DELAY_MS", "FAST_BELOW", "PROBE_BACKOFF", "ENGAGE_EXCESS",
           "fresh", "slot_delay_ms", "reserve", "observe", "send_rate", "throttle_rate",
           "best_rate"]

MAX_DELAY_MS = 34_560_000_000
"""No delay told is longer than 400 days (a sane maximum for any clock text)."""

FAST_BELOW = 0.9
"""Growth is fast while the rate is below this share of the rate last cut (``W_max``)."""

PROBE_BACKOFF = 0.25
"""While nothing gets through, the rate may fall below ``min_rate`` down to this share of it
(one probe per 4 s at the default floor of 1/s)."""

ENGAGE_EXCESS = 1.0
"""Pacing engages only when the key's send rate exceeds what got through by more than this
many requests/s, i.e. when the throttles heard over the last second are more than this many
(SPEC §15.7: one throttle does not slow a lone caller)."""


@dataclass(frozen=True, slots=True)
class PacerState:
    """One key's pacer. Every field is a finite float (``on`` a bool).

    - ``on``: a throttle was seen and not forgotten (the pacer paces);
    - ``rate``: the rate allowed, requests/s (≥ ``min_rate`` while ``on``);
    - ``tat_ms``: the theoretical arrival time of the next request at ``rate``;
    - ``last_cut_ms``, ``last_grow_ms``: the last cut, the last growth step;
    - ``w_max``: the rate in use at the last cut (or the best seen, after an outage);
    - ``good``, ``good_ms``: the best successes per second seen, and when;
    - ``ok_sec``, ``ok_n``: the second (``floor(ms / 1000)``, -1 none yet) whose successes
      are being counted, and their count; ``ok_prev``: the count of the second before
      ``ok_sec`` (0 when it had none);
    - ``sent_sec``, ``sent_cur``, ``sent_prev``: the send rate's sliding window — the second
      of the newest sends, the requests sent in it and in the second before;
    - ``thr_sec``, ``thr_cur``, ``thr_prev``: the same window over the throttles heard;
    - ``seen_ms``: the latest clock reading any step saw (``-inf`` before the first step: the
      one field that may be infinite); an earlier reading is clamped to it.
    """

    on: bool = False
    rate: float = 0.0
    tat_ms: float = 0.0
    last_cut_ms: float = 0.0
    last_grow_ms: float = 0.0
    w_max: float = 0.0
    good: float = 0.0
    good_ms: float = 0.0
    ok_sec: float = -1.0
    ok_n: float = 0.0
    sent_sec: float = -1.0
    sent_cur: float = 0.0
    sent_prev: float = 0.0
    seen_ms: float = -math.inf
    thr_sec: float = -1.0
    thr_cur: float = 0.0
    thr_prev: float = 0.0
    ok_prev: float = 0.0


def fresh() -> PacerState:
    """The state of a key nobody paced yet (or whose state was lost): not pacing."""
    return PacerState()


def _finite(name: str, value: float) -> float:
    """``value`` as a float, or ``ValueError`` naming it: a NaN or infinite time would be
    written into the state (a NaN latest reading turns the clamp of clock steps off)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number):
        raise ValueError(f"pacing: {name} must be a finite number of ms, got {value!r}")
    return number


def _clock(state: PacerState, now_ms: float) -> tuple[PacerState, float]:
    """``(state, the time this step reads)``: ``now_ms`` clamped to the latest reading seen (a
    backward step); a state seen more than 400 days ahead of ``now_ms`` is lost (fresh).
    ``ValueError`` for a ``now_ms`` that is not a finite number."""
    now_ms = _finite("now_ms", now_ms)
    if state.seen_ms > now_ms + MAX_DELAY_MS:
        return fresh(), now_ms
    if state.seen_ms > now_ms:
        return state, state.seen_ms
    return state, now_ms


def _forget(state: PacerState, now_ms: float, settings: PacingSettings) -> PacerState:
    if state.on and now_ms - state.last_cut_ms > settings.forget_after_ms:
        return replace(state, on=False, rate=0.0, tat_ms=0.0)
    return state


def slot_delay_ms(state: PacerState, now_ms: float, settings: PacingSettings,
                  earliest_ms: float = 0.0) -> float:
    """The delay in ms from ``now_ms`` until a request that wants to go ``earliest_ms`` after
    it could go (without reserving anything); ``earliest_ms`` when not pacing. A ``now_ms``
    before the latest reading seen counts as that reading. ``ValueError`` for a ``now_ms`` or
    ``earliest_ms`` that is not a finite number."""
    state, now_ms = _clock(state, now_ms)
    want = now_ms + max(0.0, _finite("earliest_ms", earliest_ms))
    state = _forget(state, now_ms, settings)
    if not state.on or not settings.enabled:
        return want - now_ms
    return min(float(MAX_DELAY_MS), max(want, state.tat_ms) - now_ms)


def _count_send(state: PacerState, at_ms: float) -> PacerState:
    sec = float(math.floor(at_ms / 1000.0))
    if sec <= state.sent_sec:
        return replace(state, sent_cur=state.sent_cur + 1.0)
    prev = state.sent_cur if sec == state.sent_sec + 1.0 else 0.0
    return replace(state, sent_sec=sec, sent_cur=1.0, sent_prev=prev)


def _count_throttle(state: PacerState, at_ms: float) -> PacerState:
    sec = float(math.floor(at_ms / 1000.0))
    if sec <= state.thr_sec:
        return replace(state, thr_cur=state.thr_cur + 1.0)
    prev = state.thr_cur if sec == state.thr_sec + 1.0 else 0.0
    return replace(state, thr_sec=sec, thr_cur=1.0, thr_prev=prev)


def _window_rate(newest: float, cur: float, prev: float, now_ms: float) -> float:
    sec = math.floor(now_ms / 1000.0)
    if sec > newest + 1.0 or newest < 0:
        return 0.0
    frac = (now_ms - sec * 1000.0) / 1000.0
    if sec == newest + 1.0:
        return cur * (1.0 - frac)
    if sec == newest:
        return prev * (1.0 - frac) + cur
    return prev + cur  # slots reserved ahead of now


def send_rate(state: PacerState, now_ms: float) -> float:
    """The requests/s sent over the second before ``now_ms`` (a sliding window over two
    one-second bins: the newest plus the share of the one before still inside the window)."""
    return _window_rate(state.sent_sec, state.sent_cur, state.sent_prev, now_ms)


def throttle_rate(state: PacerState, now_ms: float) -> float:
    """The throttles/s heard over the second before ``now_ms`` (the same window as
    :func:`send_rate`)."""
    return _window_rate(state.thr_sec, state.thr_cur, state.thr_prev, now_ms)


def best_rate(state: PacerState, now_ms: float, settings: PacingSettings) -> float:
    """The best successes/s seen lately (halved every ``memory_s``)."""
    if state.good <= 0.0:
        return 0.0
    # a clock that stepped back (a server failover, an NTP step) counts as no time passed
    age = max(0.0, now_ms - state.good_ms)
    return float(state.good * 0.5 ** (age / 1000.0 / settings.memory_s))


def reserve(state: PacerState, now_ms: float, settings: PacingSettings,
            earliest_ms: float = 0.0) -> tuple[PacerState, int | None]:
    """Reserve the slot of one request that wants to go ``earliest_ms`` after ``now_ms``.

    Returns ``(new state, delay_ms)``: the request goes ``delay_ms`` (an int ≥ 0, rounded up,
    at most 400 days) after ``now_ms``; ``delay_ms`` is ``earliest_ms`` rounded up when not
    pacing (the send is still counted: the send rate the cut that engages pacing starts
    from). ``(new
    state, None)``: no slot within ``horizon_ms`` of the time it wants to go — nothing is
    reserved or counted; ask again after ``recheck_ms`` (jittered). Pacing off
    (``enabled`` false): ``(state, earliest)`` unchanged. A ``now_ms`` before the latest
    reading seen counts as that reading (the delay is then counted from it). ``ValueError``
    for a ``now_ms`` or ``earliest_ms`` that is not a finite number.
    """
    earliest = max(0.0, _finite("earliest_ms", earliest_ms))
    if not settings.enabled:
        return state, math.ceil(earliest)
    state, now_ms = _clock(state, now_ms)
    state = replace(_forget(state, now_ms, settings), seen_ms=now_ms)
    want = now_ms + earliest
    at = want
    if state.on:
        at = max(want, state.tat_ms)
        if at - want > settings.horizon_ms:
            return state, None
        state = replace(state, tat_ms=at + 1000.0 / state.rate)
    booked = math.ceil(at)
    state = _count_send(state, booked)
    return state, int(min(float(MAX_DELAY_MS), booked - now_ms))


MAX_RATE = 1_000_000.0
"""No rate grows beyond this many requests/s (the largest ``maxRate``), ``maxRate`` or not."""


def _cap(rate: float, settings: PacingSettings) -> float:
    if settings.max_rate is not None:
        rate = min(rate, settings.max_rate)
    rate = min(rate, MAX_RATE)
    return max(rate, settings.min_rate)


def observe(state: PacerState, now_ms: float, throttled: bool, settings: PacingSettings,
            *, success: bool = True) -> PacerState:
    """An answer came back at ``now_ms``. ``throttled``: it said the provider has no capacity
    now (a capacity signal without progress: 429, 503, 529, a connection refused or reset —
    :attr:`fsm.core.classify.Classification.capacity_signal`, docs/fleet.md "Pacing");
    otherwise ``success`` tells a success (it grows the rate) from any other answer (a fatal
    error, a usage limit, a random 500, a stall, a timeout: nothing learned). While not
    pacing, a throttle engages pacing (and cuts) only when the throttles heard over the last
    second, this one included, are more than :data:`ENGAGE_EXCESS` a second; a lone one is
    only counted (SPEC §15.7).
    Returns the new state. A ``now_ms`` before the latest reading seen counts as that reading;
    ``ValueError`` for one that is not a finite number."""
    if not settings.enabled:
        return state
    state, now_ms = _clock(state, now_ms)
    state = replace(_forget(state, now_ms, settings), seen_ms=now_ms)
    if throttled:
        state = _count_throttle(state, now_ms)
        if state.on and now_ms - state.last_cut_ms < settings.cut_interval_ms:
            return state  # this round of requests was cut once already
        if not state.on and throttle_rate(state, now_ms) <= ENGAGE_EXCESS:
            return state  # a lone throttle: the send rate is not above what got through
        measured = send_rate(state, now_ms)
        if measured > 0.0:  # what got through: sent less refused
            through = max(0.0, measured - throttle_rate(state, now_ms))
        else:
            through = state.rate if state.on else 0.0
        base = through if not state.on else min(state.rate, through)
        rate = _cap(settings.beta * base, settings)
        if (state.on and state.rate <= settings.min_rate
                and state.ok_sec < math.floor(state.last_cut_ms / 1000.0)):
            # at the floor and no success since the second of the last cut: the probes back
            # off (PROBE_BACKOFF); the first success lifts the rate back to the floor
            rate = max(settings.min_rate * PROBE_BACKOFF, settings.beta * state.rate)
        return replace(state, on=True, rate=rate, w_max=base,
                       last_cut_ms=now_ms, last_grow_ms=now_ms, tat_ms=max(state.tat_ms, now_ms))
    if not success:
        return state
    sec = float(math.floor(now_ms / 1000.0))
    good, good_ms, ok_n, ok_prev = state.good, state.good_ms, state.ok_n, state.ok_prev
    if sec != state.ok_sec:  # the second counted is complete: measure it
        sustained = min(ok_n, ok_prev)
        if sustained > best_rate(state, now_ms, settings):
            good, good_ms = sustained, now_ms
        ok_prev = ok_n if sec == state.ok_sec + 1.0 else 0.0
        ok_n = 0.0
    state = replace(state, good=good, good_ms=good_ms, ok_sec=sec, ok_n=ok_n + 1.0, ok_prev=ok_prev)
    if not state.on:
        return state
    rate, w_max = state.rate, state.w_max
    best = best_rate(state, now_ms, settings)
    if rate < best / 2.0 and throttle_rate(state, now_ms) <= 2.0 * settings.min_rate:
        if rate <= 2.0 * settings.min_rate:  # back from an outage: capacity reached the best
            w_max = max(w_max, best)         # seen lately
        rate = best / 2.0
    dt = now_ms - state.last_grow_ms
    if dt > 0 and send_rate(state, now_ms) >= rate / 2.0:
        knee = FAST_BELOW * w_max
        if rate < knee:  # fast growth up to the knee, not past it in one step
            rate = min(knee, rate * math.exp(math.log1p(settings.fast_growth_per_s) * min(dt, 1000.0) / 1000.0))
        else:
            rate *= math.exp(math.log1p(settings.growth_per_s) * min(dt, 1000.0) / 1000.0)
    # the slots already booked keep their times: pulling them in at a rate that grows turned
    # each growth step into a burst (measured: brown-out waste 0.02 → 0.17 per call)
    return replace(state, rate=_cap(rate, settings), w_max=w_max, last_grow_ms=now_ms)
