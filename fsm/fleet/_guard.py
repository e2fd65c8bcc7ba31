"""A coordinator that never raises and never stalls: timeouts, a local fallback, two events.

Strictly private: import these names from :mod:`fsm.fleet`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import itertools
from dataclasses import replace
from typing import Any, Awaitable, Callable

from fsm.core.settings import PacingSettings
from fsm.fleet._local import InProcessCoordinator
from fsm.fleet._types import (MAX_LEFT_MS, Admission, BudgetSettings, Coordinator, CoordinatorError, CoordinatorKeyError,
                              CoordinatorSlowError, CoordKey)

log = logging.getLogger("fsm.fleet")

DEFAULT_TIMEOUT_S = 0.05
DEFAULT_PROBE_INTERVAL_S = 0.1
DEFAULT_WRITE_TIMEOUT_S = 1.0
DEFAULT_PROBE_TIMEOUT_S = 0.5

#: While down, the probe interval doubles after each failed probe up to this (seconds).
MAX_PROBE_INTERVAL_S = 5.0
#: The probe interval goes back to its base only after the remote stayed up this long (s).
STABLE_S = 30.0
#: How often the guard says its process is alive and reads how many are (s).
HEARTBEAT_S = 10.0
#: A token handed out is remembered (to give it back where it came from) for this long (s).
TOKEN_MEMORY_S = 3600.0
#: At most this many tokens are remembered per key (the oldest are forgotten first).
MAX_TOKENS_KEPT = 4096

# A deadline the event loop reaches later than this was missed because the loop was busy:
# the deadline moves on by as long as it was late (at most the timeout), at most this often.
# An answer read late passes through a few loop iterations (the reply read, the batch's
# callers woken, the caller's task), and under a load that makes each iteration longer than
# the bound (10,000 concurrent callers in one process) each of them is late: 3 extensions
# left a fifth of a healthy Redis's answers "unknown" there, 10 leave none (make bench,
# fleet10k). Redis itself still gets at most the bound of loop time that was not late.
LOOP_LAG_TOLERANCE_S = 0.005
MAX_EXTENSIONS = 10

EventListener = Callable[[dict[str, Any]], None]
"""What ``on_event`` is given: each ``coordinator_unavailable`` / ``coordinator_restored`` event
as its dict (docs/fleet.md "When Redis is slow or down")."""


def _forget(task: "asyncio.Task[Any]") -> None:
    """Retrieve the outcome of a call that was given up on (so asyncio does not log it)."""
    if not task.cancelled():
        task.exception()


_PROBE_KEY = CoordKey("retry-fsm", "probe")


class _Patience:
    """When a bound waited for on the event loop gives up (:func:`_bounded`), sans clock: told
    the loop's time each time its deadline is reached, it answers the next deadline or None
    (give up). Times are in seconds on one clock (the loop's).

    A deadline reached more than :data:`LOOP_LAG_TOLERANCE_S` late means the loop was busy
    (an answer may be sitting unread): the deadline moves on by as long as it was late, at
    most ``timeout``. A call's bound does so at most :data:`MAX_EXTENSIONS` times. A
    ``patient`` bound (a probe, a heartbeat) counts only the time the loop was not busy: the
    lateness of each deadline is not patience spent, so it gives up only at a deadline the
    loop reaches on time once ``timeout`` of time that was not late has passed — never on load
    alone (SPEC §15.6: the guard declares the coordinator down only on errors or a probe that
    confirms it). A loop that stays busy for good is bounded by the remote's socket timeout
    (a probe's ``PING`` that gets no answer raises)."""

    __slots__ = ("timeout", "patient", "deadline", "extensions")

    def __init__(self, start: float, timeout: float, *, patient: bool = False) -> None:
        self.timeout = timeout
        self.patient = patient
        self.deadline = start + timeout
        self.extensions = 0

    def reached(self, now: float) -> float | None:
        """The loop reached :attr:`deadline` at ``now``: the next deadline, or None. Each
        deadline is set ``timeout`` (or a lateness, at most ``timeout``) after the time it was
        set at, so the one reached on time closes at least ``timeout`` of time that was not
        lateness."""
        late = now - self.deadline
        if late > LOOP_LAG_TOLERANCE_S and (self.patient or self.extensions < MAX_EXTENSIONS):
            self.extensions += 1
            self.deadline = now + min(late, self.timeout)
            return self.deadline
        return None


async def _bounded(task: "asyncio.Future[Any]", timeout: float, *, patient: bool = False) -> bool:
    """Wait for ``task`` at most ``timeout`` seconds: True when it is done. A bound the event
    loop reaches late (it was busy: an answer may be sitting unread) moves on as
    :class:`_Patience` says: a call's :data:`MAX_EXTENSIONS` times; a ``patient`` one (a
    probe, a heartbeat) until ``timeout`` of time the loop was not busy has passed. The
    caller's cancellation propagates; ``task`` is left as it is."""
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    patience = _Patience(loop.time(), timeout, patient=patient)

    def on_deadline() -> None:
        nonlocal handle
        deadline = patience.reached(loop.time())
        if deadline is None:
            wake()
        else:
            handle = loop.call_at(deadline, on_deadline)

    task.add_done_callback(wake)
    handle = loop.call_at(patience.deadline, on_deadline)
    try:
        await waiter
    finally:
        handle.cancel()
        task.remove_done_callback(wake)
    return task.done()


class Breaker:
    """Whether the remote coordinator is answering, and the two events that say it changed.

    Up: every call goes to the remote. Down after an error (:meth:`failed`: a refused or
    reset connection, an error reply) or a probe that confirms it (:meth:`probe_done`), never
    because an answer was slow: a slow answer is "unknown" and only starts a probe
    (:meth:`probe_due`). While down, a probe is due every ``probe_interval_s``, doubling
    after each failed probe up to :data:`MAX_PROBE_INTERVAL_S`; the first probe (or answer)
    that succeeds brings it back up. The interval goes back to ``probe_interval_s`` only
    after the remote has stayed up for :data:`STABLE_S`, so a remote that flaps costs at most
    one pair of events per interval. Emits ``{"type": "coordinator_unavailable", "reason":
    str}`` when it goes down and ``{"type": "coordinator_restored"}`` when it comes back:
    each exactly once per change of state. Thread-safe. ``monotonic`` gives seconds (inject
    it in tests).
    """

    def __init__(self, *, probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
                 on_event: EventListener | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(probe_interval_s, int | float) or not probe_interval_s >= 0:
            raise ValueError(f"probe_interval_s must be a number >= 0, got {probe_interval_s!r}")
        self.probe_interval_s = float(probe_interval_s)
        self._monotonic = monotonic
        self._listeners: list[EventListener] = [on_event] if on_event is not None else []
        self._lock = threading.Lock()
        self.available = True          # invariant: False exactly between the two events
        self.reason: str | None = None  # why it went down (None while available)
        self._next_probe = 0.0
        self._interval: float | None = None  # the current probe interval (None: the base)
        self._up_since = -math.inf
        self.probing = False           # a probe is running
        self.events: list[dict] = []    # every event emitted, in order (for diagnostics)

    def subscribe(self, listener: EventListener) -> Callable[[], None]:
        """Add ``listener`` for the two events; returns a function that removes it."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)
        return unsubscribe

    def _step(self) -> float:
        return self.probe_interval_s if self._interval is None else self._interval

    def may_try(self) -> bool:
        """For a caller without probes of its own (a blocking client): True when the next
        call should go to the remote (up, or a probe is due; that call is the probe)."""
        if self.available:
            return True
        with self._lock:
            now = self._monotonic()
            if now >= self._next_probe:
                self._next_probe = now + self._step()
                return True
            return False

    def probe_due(self) -> bool:
        """True when a probe should start now (then one is counted as running): while down,
        once per interval; while up (a slow answer), when none ran within the interval."""
        with self._lock:
            now = self._monotonic()
            if self.probing or now < self._next_probe:
                return False
            self.probing = True
            self._next_probe = now + self._step()
            return True

    def probe_done(self, ok: bool, reason: str | None = None) -> None:
        """The probe :meth:`probe_due` allowed has ended: answered (``ok``) or not (``reason``)."""
        with self._lock:
            self.probing = False
        if ok:
            self.succeeded()
        else:
            self.failed(reason or "no answer to a probe")

    def succeeded(self) -> None:
        if self.available:
            return
        with self._lock:
            if self.available:
                return
            self.available, self.reason = True, None
            self._up_since = self._monotonic()
        self._emit({"type": "coordinator_restored"})

    def failed(self, reason: str) -> None:
        with self._lock:
            now = self._monotonic()
            if not self.available:  # a failed probe while down: wait longer for the next
                self._interval = min(MAX_PROBE_INTERVAL_S, max(self._step(), self.probe_interval_s) * 2)
                self._next_probe = now + self._step()
                return
            if now - self._up_since >= STABLE_S:
                self._interval = None  # it had been up long enough: probe at the base interval
            self._next_probe = now + self._step()
            self.available, self.reason = False, reason
        log.warning("fleet coordinator unavailable (%s): deciding on local state", reason)
        self._emit({"type": "coordinator_unavailable", "reason": reason})

    def _emit(self, event: dict) -> None:
        self.events.append(event)
        for listener in list(self._listeners):
            try:
                listener(dict(event))
            except Exception:  # a listener's bug must not reach the session's decision
                log.exception("coordinator event listener failed")


class GuardedCoordinator:
    """``inner`` (say a :class:`~fsm.fleet.RedisCoordinator`) with a bound on every call and
    ``fallback`` (an :class:`~fsm.fleet.InProcessCoordinator`) for when it misses it
    (``docs/fleet.md`` "When Redis is slow or down").

    - No call raises (except ``CancelledError``, which is the caller's). A read waits at most
      ``timeout_s`` (default 50 ms); a write (``learn_cooldown``, ``mark_credential_limited``,
      ``return_retry_token``, ``credit_success``: the shell makes them after the decision,
      off its path) at most ``write_timeout_s`` (default 1 s).
    - **Slow is not down.** An answer that misses its bound is *unknown*: that call is answered
      by ``fallback`` and the remote stays up (no event); a probe (``inner.probe()``, a
      ``PING`` on a connection of its own, bounded by ``probe_timeout_s``, default 0.5 s, in
      the background) checks whether the server answers at all. The remote is declared down
      only on an error (a refused or reset connection, an error reply) or a probe that fails.
      While down, calls answer from ``fallback`` at once and never wait for the remote; a
      probe runs in the background every ``probe_interval_s`` (doubling, at most 5 s, while
      it keeps failing); the first that succeeds brings the remote back (:class:`Breaker`).
      ``coordinator_unavailable {reason}`` and ``coordinator_restored`` are emitted exactly
      once per change (``on_event``, :meth:`subscribe`).
    - **A local share of the budget.** A retry decided on "unknown" or while down spends this
      process's share of the fleet's bucket: ``fallback``'s bucket holds ``maxTokens ÷ P``
      (``P``: the fleet's processes heard within 30 s, from a heartbeat every 10 s through
      ``inner.processes()``; 1 until one was heard), with the same rule (a retry only while
      the count after the take is above half of it), refilled by this process's successes,
      and never raised by what the remote tells (the remote's count ÷ P only lowers it). The
      fleet's retries are then at most the remote's bound plus the shares' (at most the
      remote's again): within twice the bound under any load or fault.
    - **Every token goes back where it came from, once.** A token handed out is remembered
      (remote or local); :meth:`return_retry_token` gives back the latest one not given back
      to where it was taken, and does nothing when none is outstanding. An :meth:`admit`
      whose remote answer comes after nobody waits for it (its bound passed, or the caller
      was cancelled) gives back the token it took, in the background.
    - Writes (``learn_cooldown``, ``mark_credential_limited``) go to both, and reads take the
      later of both; what the remote answers (cooldowns, marks) is kept in ``fallback`` too.
    - A key whose data in the remote is bad (:class:`~fsm.fleet.CoordinatorKeyError`) is
      answered from ``fallback`` for that call only; the remote stays up (no event). Nothing
      the remote answers is copied into ``fallback`` unless it passed the remote's validation.
    - ``fallback`` counts on ``clock`` (default: the monotonic clock). Its pacer hears every
      outcome and counts every send the remote admitted (local pacing while the remote is
      down or slow).
    """

    self_bounded = True
    """Every call answers within about ``timeout_s`` and never raises: a caller needs no
    timeout of its own around it (one would only replace its local answer by a default)."""

    def __init__(self, inner: Coordinator, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 fallback: InProcessCoordinator | None = None,
                 on_event: EventListener | None = None,
                 probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
                 write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S,
                 probe_timeout_s: float = DEFAULT_PROBE_TIMEOUT_S,
                 monotonic: Callable[[], float] = time.monotonic,
                 clock: Callable[[], float] | None = None) -> None:
        for name, value in (("timeout_s", timeout_s), ("write_timeout_s", write_timeout_s),
                            ("probe_timeout_s", probe_timeout_s)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 60:
                raise ValueError(f"{name} must be a number above 0 and at most 60, got {value!r}")
        self.inner = inner
        self.timeout_s = float(timeout_s)
        self.write_timeout_s = float(write_timeout_s)
        self.probe_timeout_s = float(probe_timeout_s)
        self.fallback = fallback if fallback is not None else InProcessCoordinator(clock=clock)
        self.breaker = Breaker(probe_interval_s=probe_interval_s, on_event=on_event,
                               monotonic=monotonic)
        self._monotonic = monotonic
        self._background: set[asyncio.Task] = set()  # late give-backs, probes, heartbeats
        self._next_heartbeat = -math.inf
        self.processes = 1  # the fleet's processes heard lately (the local share's divisor)
        # key -> token id -> (where from, when (monotonic s)): handed out, not given back
        self._tokens: dict[CoordKey, dict[int, tuple[str, float]]] = {}
        self._token_ids = itertools.count(1)
        self.answers = {"remote": 0, "unknown": 0, "down": 0}  # how each read was answered

    def __repr__(self) -> str:
        return f"GuardedCoordinator({self.inner!r}, timeout_s={self.timeout_s})"

    @property
    def available(self) -> bool:
        """False while the remote is down (between the two events)."""
        return self.breaker.available

    def subscribe(self, listener: EventListener) -> Callable[[], None]:
        """Add a listener for the two events; returns a function that removes it."""
        return self.breaker.subscribe(listener)

    # -- background: probes and heartbeats -------------------------------------------------
    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_forget)

    def _maybe_probe(self) -> None:
        """Start a background probe when one is due (:meth:`Breaker.probe_due`)."""
        if self.breaker.probe_due():
            self._spawn(self._probe())

    async def _probe(self) -> bool:
        probe = getattr(self.inner, "probe", None) or getattr(self.inner, "ping", None)
        ok, reason = False, None
        try:
            if probe is None:  # nothing to probe with: a cheap read stands in
                task = asyncio.get_running_loop().create_task(self.inner.fallback_left_ms(_PROBE_KEY))
            else:
                task = asyncio.get_running_loop().create_task(probe())
            if await _bounded(task, self.probe_timeout_s, patient=True):
                task.result()
                ok = True
            else:
                task.add_done_callback(_forget)
                task.cancel()
                reason = f"no answer to a probe within {self.probe_timeout_s * 1000:g} ms"
        except CoordinatorError as exc:
            reason = str(exc)
        except BaseException as exc:  # whatever else the remote raises: not an answer
            me = asyncio.current_task()
            if me is not None and me.cancelling():  # this probe itself was stopped (shutdown)
                self.breaker.probing = False
                raise
            reason = type(exc).__name__
        self.breaker.probe_done(ok, reason)
        return ok

    def _maybe_heartbeat(self) -> None:
        """Every :data:`HEARTBEAT_S`: say this process is alive and read how many are, in the
        background (``inner.processes()``); the local share follows."""
        beat = getattr(self.inner, "processes", None)
        now = self._monotonic()
        if beat is None or now < self._next_heartbeat:
            return
        self._next_heartbeat = now + HEARTBEAT_S

        async def heartbeat() -> None:
            task = asyncio.get_running_loop().create_task(beat())
            if await _bounded(task, self.write_timeout_s, patient=True):
                count = task.result()
                if isinstance(count, int) and not isinstance(count, bool) and count >= 1:
                    self.processes = count
                    self.fallback.set_budget_share(count)
            else:
                task.add_done_callback(_forget)
                task.cancel()
        self._spawn(heartbeat())

    # -- one call to the remote ------------------------------------------------------------
    async def _remote(self, call: Callable[[], Awaitable[Any]],
                      timeout_s: float | None = None,
                      on_late: Callable[[Any], None] | None = None) -> tuple[bool, Any]:
        """``(True, answer)`` from the remote, or ``(False, None)``: down (answered at once,
        nothing sent), unknown (no answer within the bound), or failing (the breaker hears
        of an error).

        ``on_late(answer)`` is called with the answer of a call that completes after nobody
        waits for it any more (its bound passed, or the caller was cancelled: an abort):
        :meth:`admit` gives back the token such an answer took.

        The call runs as its own task. At the bound a call that is mid-command (in the
        inner's ``in_flight``) is left to finish in the background rather than cancelled
        (cancelling redis-py mid-reply closes the connection); a call still waiting for its
        turn is cancelled (it sent nothing). A bound the loop reaches late (it was busy, so an
        answer may be sitting unread) is extended by as long as it was late, at most
        ``timeout_s``, :data:`MAX_EXTENSIONS` times: the bound measures the remote, not this
        process's load.
        Neither kind of miss declares the remote down; a slow one starts a probe.
        """
        self._maybe_heartbeat()
        if not self.breaker.available:
            self._maybe_probe()
            return False, None
        loop = asyncio.get_running_loop()
        task = loop.create_task(call())
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            done = await _bounded(task, timeout)
        finally:
            task.add_done_callback(_forget)  # whoever stops waiting, its outcome is retrieved
            if not task.done():
                in_flight = getattr(self.inner, "in_flight", None)
                if in_flight is not None and task not in in_flight:
                    task.cancel()  # still waiting for its turn: it sent nothing
                elif on_late is not None:
                    task.add_done_callback(lambda t: self._late(t, on_late))
        if not done:
            self._maybe_probe()  # slow: unknown, and a probe says whether it is down
            return False, None
        exc = None if task.cancelled() else task.exception()
        if isinstance(exc, CoordinatorKeyError):
            # The server answered: one key's data is bad. That key is answered locally; the
            # coordinator is up (no event, no flapping).
            log.debug("coordinator key degraded: %s", exc)
            return False, None
        if isinstance(exc, CoordinatorSlowError):
            self._maybe_probe()
            return False, None
        if task.cancelled() or exc is not None:
            if isinstance(exc, CoordinatorError):
                self.breaker.failed(str(exc))
            else:  # whatever else the remote raises, the session decides locally
                self.breaker.failed(type(exc).__name__ if exc is not None else "cancelled")
            return False, None
        return True, task.result()

    def _late(self, task: "asyncio.Task[Any]", on_late: Callable[[Any], None]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        try:
            on_late(task.result())
        except Exception:  # a late answer's clean-up must never reach anyone
            log.debug("late coordinator answer not handled", exc_info=True)

    def _give_back_late(self, key: CoordKey, budget: BudgetSettings | None) -> Callable[[Any], None]:
        """For :meth:`admit`: a late answer that took a token (nobody will send its retry)
        gives the token back, in the background."""
        def give_back(answer: Any) -> None:
            taken = (answer.token_taken if isinstance(answer, Admission)
                     else answer[1] is True if isinstance(answer, tuple) and len(answer) == 2
                     else answer is True)  # before v3: (left, allowed) or allowed
            if budget is None or not taken:
                return
            self._spawn(self.inner.return_retry_token(key, budget))
        return give_back

    # -- the tokens handed out -------------------------------------------------------------
    def _handed(self, key: CoordKey, source: str) -> int:
        """A token taken from ``source`` ("remote" or "local") is handed to a caller: its id.
        Remembered for :data:`TOKEN_MEMORY_S` (a retry that went never gives it back)."""
        now = self._monotonic()
        tokens = self._tokens.setdefault(key, {})
        for token in [t for t, (_, at) in tokens.items() if now - at > TOKEN_MEMORY_S]:
            del tokens[token]
        while len(tokens) >= MAX_TOKENS_KEPT:
            del tokens[next(iter(tokens))]
        token = next(self._token_ids)
        tokens[token] = (source, now)
        if len(self._tokens) > 1024:
            for k in [k for k, t in self._tokens.items() if not t]:
                del self._tokens[k]
        return token

    def _answered(self, how: str) -> None:
        self.answers[how] += 1

    async def ping(self) -> bool:
        """Probe the remote now (even while down), waiting for the answer: True when it
        answered within ``probe_timeout_s`` (a success brings it back up, a failure takes it
        down: the events as for any probe)."""
        if not self.breaker.probe_due():
            self.breaker._next_probe = 0.0
            if not self.breaker.probe_due():  # one is already running: let it decide
                return self.available
        return await self._probe()

    async def warm_up(self, timeout_s: float = 2.0) -> bool:
        """Connect and load the remote's scripts now (``RedisCoordinator.warm_up``), allowing
        ``timeout_s``, and say this process is alive (the heartbeat): call it when the host
        starts. True when the remote answered; otherwise it is declared down (a check at
        start stands for a probe); a command that misses its socket timeout is asked again
        within ``timeout_s`` (slow is not down). Never raises."""
        warm = getattr(self.inner, "warm_up", None)
        if warm is None:
            return await self.ping()
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    try:
                        await warm()
                        break
                    except CoordinatorSlowError:
                        # slow is not down (docs/fleet.md "When Redis is slow or down"): a
                        # command that missed its socket timeout on a busy machine or a server
                        # just resumed is asked again, within the warm-up's own time
                        await asyncio.sleep(0.05)
        except (TimeoutError, Exception) as exc:
            reason = str(exc) if isinstance(exc, CoordinatorError) else (
                f"no answer within {timeout_s * 1000:g} ms" if isinstance(exc, TimeoutError)
                else type(exc).__name__)
            self.breaker.failed(reason)
            return False
        self.breaker.succeeded()
        self._maybe_heartbeat()
        return True

    # -- protocol v3 ----------------------------------------------------------------------
    async def admit(self, key: CoordKey, *, retry: bool, budget: BudgetSettings | None,
                    pacing: PacingSettings | None, earliest_ms: int = 0,
                    floor_slot_due: bool = False, max_wait_ms: int | None = None) -> Admission:
        was_up = self.breaker.available
        ok, answer = await self._remote(lambda: self.inner.admit(
            key, retry=retry, budget=budget, pacing=pacing, earliest_ms=earliest_ms,
            floor_slot_due=floor_slot_due, max_wait_ms=max_wait_ms),
            on_late=self._give_back_late(key, budget if retry else None))
        if not ok or not isinstance(answer, Admission):
            self._answered("unknown" if was_up else "down")
            answer = await self.fallback.admit(key, retry=retry, budget=budget, pacing=pacing,
                                               earliest_ms=earliest_ms,
                                               floor_slot_due=floor_slot_due,
                                               max_wait_ms=max_wait_ms)
            if answer.token_taken:
                answer = replace(answer, token=self._handed(key, "local"))
            return answer
        self._answered("remote")
        now = self.fallback.now_ms()
        if 0 < answer.cooldown_ms <= MAX_LEFT_MS:
            self.fallback.learn_cooldown_at(key, answer.cooldown_ms, now)
        if retry and budget is not None:
            self._mirror(key, budget)
        if answer.token_taken:
            answer = replace(answer, token=self._handed(key, "remote"))
        refused = max_wait_ms is not None and answer.cooldown_ms > max_wait_ms
        if answer.pacing_booked and answer.budget is not False and not refused:
            # the local pacer counts this process's sends (the rate a local throttle cuts
            # from while the remote is down); its own slots are left alone
            self.fallback.count_send_at(key, now, answer.pacing_ms, pacing)
        local = self.fallback.cooldown_left_at(key, now)
        if local > answer.cooldown_ms:
            answer = replace(answer, cooldown_ms=local)
        return answer

    async def record_outcome(self, key: CoordKey, *, success: bool, throttled: bool,
                             budget: BudgetSettings | None,
                             pacing: PacingSettings | None) -> None:
        # The local pacer hears every outcome (local pacing while the remote is down), and
        # the local share is refilled by this process's successes.
        self.fallback.record_outcome_at(key, self.fallback.now_ms(), success=success,
                                        throttled=throttled, budget=budget, pacing=pacing)
        ok, _ = await self._remote(lambda: self.inner.record_outcome(
            key, success=success, throttled=throttled, budget=budget, pacing=pacing),
            self.write_timeout_s)
        if ok and budget is not None and success:
            self._mirror(key, budget)

    async def mark_fallback(self, key: CoordKey, duration_ms: int) -> None:
        self.fallback.mark_fallback_at(key, duration_ms, self.fallback.now_ms())
        await self._remote(lambda: self.inner.mark_fallback(key, duration_ms), self.write_timeout_s)

    async def fallback_left_ms(self, key: CoordKey) -> int:
        ok, remote = await self._remote(lambda: self.inner.fallback_left_ms(key))
        now = self.fallback.now_ms()
        if ok and isinstance(remote, int) and 0 < remote <= MAX_LEFT_MS:
            self.fallback.mark_fallback_at(key, remote, now)
        return self.fallback.fallback_left_at(key, now)

    # -- before v3 (thin wrappers while the session and runner call them) ------------------
    async def cooldown_left_ms(self, key: CoordKey, now_ms: int) -> int:
        local = self.fallback.cooldown_left_sync(key, now_ms)
        ok, remote = await self._remote(lambda: self.inner.cooldown_left_ms(key, now_ms))
        if not ok:
            return local
        self._mirror_cooldown(key, remote, now_ms)
        return max(local, remote)

    async def learn_cooldown(self, key: CoordKey, duration_ms: int,
                             now_ms: int | None = None) -> None:
        """v3: ``(key, duration_ms)``; before v3: ``(key, until_ms, now_ms)``."""
        if now_ms is None:
            self.fallback.learn_cooldown_at(key, duration_ms, self.fallback.now_ms())
            await self._remote(lambda: self.inner.learn_cooldown(key, duration_ms),
                               self.write_timeout_s)
            return
        until_ms = duration_ms
        self.fallback.learn_cooldown_sync(key, until_ms, now_ms)
        await self._remote(lambda: self.inner.learn_cooldown(key, until_ms, now_ms),
                           self.write_timeout_s)

    def _mirror_cooldown(self, key: CoordKey, left_ms: int, now_ms: int) -> None:
        """Keep a cooldown the remote told of in the fallback too, so that a local answer
        (Redis slow or down) still knows the fleet's cooldowns this process has seen."""
        if left_ms > 0:
            self.fallback.learn_cooldown_sync(key, now_ms + left_ms, now_ms)

    def _mirror(self, key: CoordKey, budget: BudgetSettings) -> None:
        """Lower the local share to the remote bucket's last count ÷ the processes, never
        raise it: a fleet that spent its budget does not get a fresh share per process when
        the remote goes slow or away, and what this process spent of its share on "unknown"
        is not handed back by the next answer."""
        milli = getattr(self.inner, "observed_milli", {}).get(key)
        if milli is not None:
            self.fallback.lower_share_milli(key, budget, milli)

    async def take_retry_token(self, key: CoordKey, budget: BudgetSettings) -> bool:
        ok, allowed = await self._remote(lambda: self.inner.take_retry_token(key, budget),
                                         on_late=self._give_back_late(key, budget))
        if not ok:
            allowed = self.fallback.take_retry_token_sync(key, budget)
            if allowed:
                self._handed(key, "local")
            return allowed
        self._mirror(key, budget)
        if allowed:
            self._handed(key, "remote")
        return bool(allowed)

    async def before_decision(self, key: CoordKey, now_ms: int,
                              budget: BudgetSettings | None) -> tuple[int, bool | None]:
        ok, answer = await self._remote(lambda: self.inner.before_decision(key, now_ms, budget),
                                        on_late=self._give_back_late(key, budget))
        if not ok:
            left, allowed = self.fallback.before_decision_sync(key, now_ms, budget)
            if allowed:
                self._handed(key, "local")
            return left, allowed
        left, allowed = answer
        if budget is not None:
            self._mirror(key, budget)
            if allowed:
                self._handed(key, "remote")
        self._mirror_cooldown(key, left, now_ms)
        return max(left, self.fallback.cooldown_left_sync(key, now_ms)), allowed

    async def return_retry_token(self, key: CoordKey, budget: BudgetSettings, *,
                                 token: int | None = None) -> None:
        """Give back a token this guard handed out for ``key``, to where it was taken (the
        remote bucket or the local share): ``token`` (:attr:`Admission.token`) once, however
        often it is passed; without it, the latest one not given back. Nothing when none is
        outstanding. A remote that does not take it back (down, or no answer in time) keeps
        it spent: never the local share."""
        tokens = self._tokens.get(key)
        if token is not None:
            entry = tokens.pop(token, None) if tokens else None
        else:
            entry = tokens.pop(next(reversed(tokens))) if tokens else None
        if entry is None:
            log.debug("no such budget token outstanding for %s: nothing to give back", key)
            return
        source, _ = entry
        if source == "local":
            await self.fallback.return_retry_token(key, budget)
            return
        ok, _ = await self._remote(lambda: self.inner.return_retry_token(key, budget),
                                   self.write_timeout_s)
        if ok:
            self._mirror(key, budget)

    async def credit_success(self, key: CoordKey, budget: BudgetSettings) -> None:
        await self.fallback.credit_success(key, budget)  # the local share: own successes
        ok, _ = await self._remote(lambda: self.inner.credit_success(key, budget),
                                   self.write_timeout_s)
        if ok:
            self._mirror(key, budget)

    async def mark_credential_limited(self, provider: str, credential: str, until_ms: int,
                                      now_ms: int | None = None) -> None:
        """v3: ``(provider, credential, duration_ms)``; before v3: ``(..., until_ms, now_ms)``."""
        if now_ms is None:
            duration_ms = until_ms
            self.fallback.mark_credential_limited_at(provider, credential, duration_ms,
                                                     self.fallback.now_ms())
            await self._remote(lambda: self.inner.mark_credential_limited(provider, credential,
                                                                          duration_ms),
                               self.write_timeout_s)
            return
        self.fallback.mark_credential_limited_sync(provider, credential, until_ms, now_ms)
        await self._remote(lambda: self.inner.mark_credential_limited(provider, credential,
                                                                      until_ms, now_ms),
                           self.write_timeout_s)

    async def limited_credentials(self, provider: str, now_ms: int | None = None) -> dict[str, int]:
        """v3: id -> ms left; before v3 (``now_ms`` given): id -> end in the caller's clock."""
        if now_ms is None:
            now = self.fallback.now_ms()
            ok, remote = await self._remote(lambda: self.inner.limited_credentials(provider))
            if ok and isinstance(remote, dict):
                for cred, left in remote.items():
                    if isinstance(left, int) and 0 < left <= MAX_LEFT_MS:
                        self.fallback.mark_credential_limited_at(provider, cred, left, now)
            return self.fallback.limited_credentials_at(provider, now)
        merged = self.fallback.limited_credentials_sync(provider, now_ms)
        ok, remote = await self._remote(lambda: self.inner.limited_credentials(provider, now_ms))
        if ok:
            for cred, until in remote.items():
                if until > merged.get(cred, 0):
                    merged[cred] = until
                    self.fallback.mark_credential_limited_sync(provider, cred, until, now_ms)
        return merged

    async def aclose(self) -> None:
        try:
            await self.inner.aclose()
        except Exception:  # shutting down: nothing the caller could do with the error
            log.debug("coordinator close failed", exc_info=True)
