"""The discrete-event loop: N sessions, one provider, one policy, virtual milliseconds.

Each session makes its scenario's K calls one after another. A call is carried by a
*retrier* (one per session, made by the policy: :mod:`fsm.sim.policies`) that answers three
facts with one *step*:

- ``start(t)``: a call begins;
- ``answered(t, answer)``: the provider answered the call's last request;
- ``timer(t, token)``: a wait the retrier asked for is over.

A step is ``(what, at, token)``: :data:`SEND` (a request goes out at ``at``), :data:`SEND_BOOKED`
(the ideal's request, booked at the provider), :data:`WAIT` (call ``timer(at, token)``),
:data:`DONE_OK` / :data:`DONE_FAIL` (the call ends at ``at``). Nothing reads a clock: time is
the heap's. Ties are broken by the order in which events were scheduled, so a run is
bit-for-bit reproducible.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from fsm.sim.world import REFUSAL_MS, SERVICE_MS, THINK_BASE_MS, Answer, Provider, Scenario

__all__ = ["SEND", "SEND_BOOKED", "WAIT", "DONE_OK", "DONE_FAIL", "PROCESSES", "Retrier",
           "Run", "VirtualClock", "run_world", "session_rng"]

SEND, SEND_BOOKED, WAIT, DONE_OK, DONE_FAIL = 0, 1, 2, 3, 4
PROCESSES = 4
"""Sessions live in this many processes (session i in process i % 4) unless the scenario says
otherwise (:attr:`fsm.sim.world.Scenario.processes`); only coordinators that a policy shares
across processes (as Redis does) see the whole fleet."""

_START, _SEND, _ANSWER, _TIMER = 0, 1, 2, 3


class Retrier(Protocol):
    """One session's retry policy (see the module docstring)."""

    def start(self, t: int) -> tuple[int, int, int]: ...

    def answered(self, t: int, answer: Answer) -> tuple[int, int, int]: ...

    def timer(self, t: int, token: int) -> tuple[int, int, int]: ...


@dataclass(slots=True)
class Run:
    """What one (scenario, policy) run observed.

    - ``calls``: ``[(start_ms, end_ms, ok), ...]`` in the order the calls ended;
    - ``requests``: requests sent; ``wasted``: of them, sent while the provider was certain
      to refuse them (:attr:`fsm.sim.world.Answer.wasted`);
    - ``sent_per_s`` / ``accepted_per_s``: requests sent (accepted) in each 1-s bin, by the
      second of sending;
    - ``recovery_ms``: when the provider was whole again (None: no recovery in the scenario);
    - ``waiting_at_recovery_end_ms``: when the last call in progress at recovery ended;
    - ``service_ms``: the world's service time (added latency is counted beyond it).
    """

    scenario: Scenario
    sessions: int
    capacity: float
    calls: list[tuple[int, int, bool]] = field(default_factory=list)
    requests: int = 0
    wasted: int = 0
    sent_per_s: dict[int, int] = field(default_factory=dict)
    accepted_per_s: dict[int, int] = field(default_factory=dict)
    recovery_ms: int | None = None
    waiting_at_recovery_end_ms: int | None = None
    service_ms: int = SERVICE_MS


def session_rng(seed: int, session: int, stream: int) -> random.Random:
    """The random stream ``stream`` of ``session`` (0: its traffic, 1: its policy's jitter),
    independent of every other session's and of the policy's draws."""
    return random.Random((seed * 1_000_003 + session) * 4 + stream)


class VirtualClock:
    """The run's time in virtual ms (``now``), for what a policy shares that needs a clock
    (a coordinator's idle buckets); call it to read it."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> float:
        return float(self.now)


def run_world(scenario: Scenario, sessions: int, seed: int,
              make_retrier: Callable[[int, Provider, Any], Retrier], *,
              context: Any = None, clock: VirtualClock | None = None) -> Run:
    """Run ``scenario`` with ``sessions`` sessions; ``make_retrier(session, provider, context)``
    builds each session's retrier (``context`` is the policy's shared state, if any);
    ``clock`` is moved to each event's time. A scenario with a fixed fleet size
    (:attr:`fsm.sim.world.Scenario.sessions`) runs that many sessions whatever ``sessions``
    says. Raises ``ValueError`` for ``sessions < 1``."""
    if sessions < 1:
        raise ValueError(f"sessions must be at least 1, got {sessions}")
    sessions = scenario.fleet_size(sessions)
    provider = Provider(scenario, sessions, seed)
    service = scenario.service_ms
    run = Run(scenario, sessions, provider.capacity, service_ms=service)
    recovery = None if scenario.recovery_s is None else int(scenario.recovery_s * 1000)
    run.recovery_ms = recovery
    K = scenario.calls
    traffic = [session_rng(seed, i, 0) for i in range(sessions)]
    retriers = [make_retrier(i, provider, context) for i in range(sessions)]
    call_no = [0] * sessions          # the call in progress (0-based)
    call_start = [0] * sessions
    sent_n = [0] * sessions           # requests sent so far in the current call
    heap: list[tuple[int, int, int, int, Any]] = []
    seq = 0
    push = heapq.heappush
    pop = heapq.heappop
    f0 = scenario.factor(0)
    for i in range(sessions):
        push(heap, (int(traffic[i].random() * 10_000 / f0), seq, _START, i, None))
        seq += 1
    sent_per_s = run.sent_per_s
    accepted_per_s = run.accepted_per_s
    calls = run.calls
    last_waiting_end = None
    if clock is None:
        clock = VirtualClock()

    while heap:
        t, _, kind, i, arg = pop(heap)
        clock.now = t
        r = retriers[i]
        if kind != _SEND:
            if kind == _START:
                call_start[i] = t
                sent_n[i] = 0
                what, at, token = r.start(t)
            elif kind == _ANSWER:
                what, at, token = r.answered(t, arg)
            else:
                what, at, token = r.timer(t, arg)
            if what == SEND or what == SEND_BOOKED:
                if at > t:
                    push(heap, (at, seq, _SEND, i, what == SEND_BOOKED))
                    seq += 1
                    continue
                arg = what == SEND_BOOKED   # a request that goes now goes in this event's turn
            elif what == WAIT:
                push(heap, (at, seq, _TIMER, i, token))
                seq += 1
                continue
            else:
                start = call_start[i]
                calls.append((start, at, what == DONE_OK))
                if recovery is not None and start < recovery < at:
                    last_waiting_end = at if last_waiting_end is None else max(last_waiting_end, at)
                c = call_no[i] + 1
                call_no[i] = c
                if c < K:
                    f = scenario.factor(at)
                    think = (10_000 / f - THINK_BASE_MS) * (0.5 + traffic[i].random())
                    push(heap, (at + int(think), seq, _START, i, None))
                    seq += 1
                continue
        booked = arg  # a request goes out now
        n = sent_n[i]
        sent_n[i] = n + 1
        if booked:
            answer = provider.accept_reserved(i, call_no[i], n)
        else:
            answer = provider.request(t, i, call_no[i], n)
        second = t // 1000
        sent_per_s[second] = sent_per_s.get(second, 0) + 1
        run.requests += 1
        if answer.wasted:
            run.wasted += 1
        if answer.ok:
            accepted_per_s[second] = accepted_per_s.get(second, 0) + 1
            push(heap, (t + service, seq, _ANSWER, i, answer))
        else:
            push(heap, (t + REFUSAL_MS, seq, _ANSWER, i, answer))
        seq += 1
    run.waiting_at_recovery_end_ms = last_waiting_end
    return run
