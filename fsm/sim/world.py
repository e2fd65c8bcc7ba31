"""The simulated world: one provider, its faults, and the traffic of N sessions (docs/simulation.md).

Everything is in virtual milliseconds from the start of the run (``t``), integers; nothing here
reads a clock. The provider:

- has a **capacity** of C = 0.1 × N requests/s, a token bucket with one second of burst (C
  tokens), written as the equivalent GCRA ("virtual scheduling": a request at ``t`` conforms
  when ``t ≥ tat − τ``; ``tat`` then moves by ``T = 1000 / C`` ms; τ = 1000 − T);
- serves an accepted request in 2 s (:data:`SERVICE_MS`) and answers a refused one after
  0.2 s (:data:`REFUSAL_MS`);
- answers with one of the :data:`ANSWERS` kinds below, each a real provider error shape (status,
  error type, headers) that the real classifier reads.

A scenario (:data:`SCENARIOS`) says how much the sessions ask for over time (the demand factor
f: a session's think time between calls is ``(10 / f − 2) s × U(0.5, 1.5)``, so N sessions ask
for f × C requests/s), how many calls each session makes, and what goes wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["SERVICE_MS", "REFUSAL_MS", "THINK_BASE_MS", "RECOVERABLE_MS", "Scenario", "SCENARIOS",
           "STANDARD", "STRESS", "DEFAULT_SCENARIOS", "NOT_BY_DEFAULT", "Answer", "Provider",
           "capacity_per_s", "unit_hash"]

SERVICE_MS = 2_000
"""Time from sending an accepted request to its (successful) answer, ms (a scenario may set
another: :attr:`Scenario.service_ms`)."""
THINK_BASE_MS = 2_000
"""The think time between calls is ``(10 / f) s − THINK_BASE_MS`` × U(0.5, 1.5) in every world
(§14b.16's rule, also where a world's service time is longer)."""
RECOVERABLE_MS = 600_000
"""``failure_rate_recoverable`` counts the calls that started at most this long before the
recovery, or later (the resilient profile's ``maxElapsedMs``: a chain that started earlier
ends before the provider is back whatever it does; SPEC §15.8)."""
REFUSAL_MS = 200
"""Time from sending a refused request to its error answer, ms."""
TRANSIENT_RATE = 0.01
"""Share of accepted requests that fail with a random 500 in ``transient500``."""


def capacity_per_s(sessions: int) -> float:
    """C = 0.1 × N requests per second."""
    return 0.1 * sessions


@dataclass(frozen=True, slots=True)
class Scenario:
    """One standard fault profile.

    - ``name``: the scenario's id (``brownout529``, ...).
    - ``calls``: K, the calls each session makes one after another.
    - ``demand``: ``((until_s, f), ...)``: the demand factor f up to ``until_s`` (the last
      piece lasts for ever: its ``until_s`` is ``math.inf``).
    - ``fault``: ``"brownout529"``, ``"brownout429"``, ``"outage"``, ``"windows"``,
      ``"usage"``, ``"transient"``.
    - ``fault_start_s`` / ``fault_end_s``: the outage's or the usage limit's span (s).
    - ``recovery_s``: when the provider is whole again (drain is measured from it), or None.
    - ``window_share``: for ``windows``, the requests a minute allows, as a share of C × 60.
    - ``text``: one line for the table's title.
    - ``capacity_share``: C = ``capacity_share`` × N requests/s (0.1 in the standard worlds).
    - ``service_ms``: an accepted request's service time (ms).
    - ``processes``: the sessions live in this many processes (session i in process
      i mod ``processes``); only per-process state (a coordinator per process, a quota per
      client) sees it.
    - ``sessions``: a fixed fleet size whatever the run's N (``lone_throttle``), or None.
    - ``down_kinds``: what a request in an outage is answered: ``("unavailable",)`` (a 503),
      or ``("unavailable", "overloaded")`` (a 503 or a 529, half each, by a hash of the
      request).
    - ``flap_s``: in an ``outage`` span, the provider is down for ``flap_s`` s, then up for
      ``flap_s`` s, and so on (0: down for the whole span).
    - ``throttle_at_s``: for ``throttle_once``, the first request sent at or after this time
      gets one 429 with ``retry-after: 1``.
    - ``stress``: one of SPEC §15.8's stress worlds (its targets, docs/simulation.md).
    """

    name: str
    calls: int
    demand: tuple[tuple[float, float], ...]
    fault: str
    text: str
    fault_start_s: float = 0.0
    fault_end_s: float = 0.0
    recovery_s: float | None = None
    window_share: float = 0.0
    capacity_share: float = 0.1
    service_ms: int = SERVICE_MS
    processes: int = 4
    sessions: int | None = None
    down_kinds: tuple[str, ...] = ("unavailable",)
    flap_s: float = 0.0
    throttle_at_s: float = 0.0
    stress: bool = False

    def fleet_size(self, sessions: int) -> int:
        """The N a run of ``sessions`` sessions has in this world (a fixed size wins)."""
        return self.sessions if self.sessions is not None else sessions

    def factor(self, t_ms: int) -> float:
        """The demand factor f at ``t_ms``."""
        s = t_ms / 1000
        for until, f in self.demand:
            if s < until:
                return f
        return self.demand[-1][1]


_INF = math.inf
SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("brownout529", 20, ((60, 2.0), (_INF, 0.5)), "brownout529",
             "brown-out: demand 2× C for 60 s, then 0.5× C; over capacity a 529 without a hint",
             recovery_s=60),
    Scenario("brownout429", 20, ((60, 2.0), (_INF, 0.5)), "brownout429",
             "brown-out: demand 2× C for 60 s, then 0.5× C; over capacity a 429 with retry-after",
             recovery_s=60),
    Scenario("outage30s", 10, ((_INF, 0.5),), "outage",
             "full outage of 30 s from t = 30 s (503), demand 0.5× C",
             fault_start_s=30, fault_end_s=60, recovery_s=60),
    Scenario("outage5min", 25, ((_INF, 0.5),), "outage",
             "full outage of 5 min from t = 30 s (503), demand 0.5× C",
             fault_start_s=30, fault_end_s=330, recovery_s=330),
    Scenario("rpm_windows", 24, ((180, 1.0), (_INF, 0.5)), "windows",
             "per-minute request windows of 0.67 × C × 60 with exact retry-after-ms; demand 1× C "
             "for 180 s, then 0.5× C", recovery_s=180, window_share=0.67),
    Scenario("usage5h", 5, ((_INF, 0.5),), "usage",
             "the one credential's 5-hour usage limit is reached at t = 0 (429 usage_limit_reached "
             "with retry-after)", fault_start_s=0, fault_end_s=5 * 3600, recovery_s=5 * 3600),
    Scenario("transient500", 20, ((_INF, 0.5),), "transient",
             "1 % of accepted requests fail with a random 500; demand 0.5× C"),
)}
STANDARD: tuple[str, ...] = tuple(SCENARIOS)
"""§14's standard worlds (§14b.16), in table order."""

_BROWNOUT = ((60, 2.0), (_INF, 0.5))
_STRESS = (
    Scenario("cap005", 20, _BROWNOUT, "brownout529",
             "brownout529's traffic with C = 0.05 × N: demand 4× C for 60 s, then 1× C; 529 over "
             "capacity", recovery_s=60, capacity_share=0.05, stress=True),
    Scenario("cap02", 20, _BROWNOUT, "brownout529",
             "brownout529's traffic with C = 0.2 × N: demand 1× C for 60 s, then 0.25× C; 529 over "
             "capacity", recovery_s=60, capacity_share=0.2, stress=True),
    Scenario("svc10s", 20, _BROWNOUT, "brownout529",
             "brownout529 with a 10 s service time", recovery_s=60, service_ms=10_000, stress=True),
    Scenario("outage30min", 30, ((_INF, 0.5),), "outage",
             "full outage of 30 min from t = 30 s (503 or 529), demand 0.5× C",
             fault_start_s=30, fault_end_s=1830, recovery_s=1830,
             down_kinds=("unavailable", "overloaded"), stress=True),
    Scenario("flapping", 40, ((_INF, 0.5),), "outage",
             "down (503 or 529) 20 s, up 20 s, from t = 30 s to 630 s; demand 0.5× C",
             fault_start_s=30, fault_end_s=630, recovery_s=630,
             down_kinds=("unavailable", "overloaded"), flap_s=20, stress=True),
    Scenario("proc1", 20, _BROWNOUT, "brownout529",
             "brownout529 with the sessions in 1 process", recovery_s=60, processes=1, stress=True),
    Scenario("proc16", 20, _BROWNOUT, "brownout529",
             "brownout529 with the sessions in 16 processes", recovery_s=60, processes=16,
             stress=True),
    Scenario("herd3x", 25, ((60, 0.5), (180, 3.0), (_INF, 0.5)), "brownout529",
             "a herd: demand 0.5× C, then 3× C from 60 s to 180 s (529 over capacity), then 0.5× C",
             recovery_s=180, stress=True),
    Scenario("lone_throttle", 20, ((_INF, 0.2),), "throttle_once",
             "10 sessions whatever N, C = 10/s, demand 0.2 requests/s; one 429 with retry-after: 1 "
             "to the first request after 60 s, otherwise healthy",
             capacity_share=1.0, sessions=10, throttle_at_s=60, stress=True),
)
SCENARIOS.update((s.name, s) for s in _STRESS)
STRESS: tuple[str, ...] = tuple(s.name for s in _STRESS)
"""SPEC §15.8's stress worlds, in table order."""

# The brown-out that ``make bench`` also runs live (benchmarks/live.py, SPEC §15.9): short
# phases and few calls, so a few hundred real sessions finish in about 1.5 minutes.
SCENARIOS["live_brownout"] = Scenario(
    "live_brownout", 4, ((30, 2.0), (_INF, 0.5)), "brownout529",
    "brown-out sized to run live: demand 2× C for 30 s, then 0.5× C; 4 calls per session; over "
    "capacity a 529 without a hint", recovery_s=30)

NOT_BY_DEFAULT: frozenset[str] = frozenset({"live_brownout"})
"""Scenarios run only when named (``simulate --scenario NAME``): ``live_brownout``."""
DEFAULT_SCENARIOS: tuple[str, ...] = tuple(n for n in SCENARIOS if n not in NOT_BY_DEFAULT)
"""The scenarios ``python -m fsm simulate`` runs when none is named, in table order."""


# -- answers ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Answer:
    """What the provider answers to one request.

    ``kind``: ``"ok"`` or one of the error kinds of :data:`ANSWERS`; ``hint_ms``: the retry hint
    the answer carries (``retry-after`` / ``retry-after-ms``), or None; ``wasted``: the provider
    was certain to refuse this request when it was sent (outage, exhausted window or bucket,
    usage limit) — a random 500 is not waste.
    """

    kind: str
    hint_ms: int | None = None
    wasted: bool = False

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


OK = Answer("ok")

ANSWERS: dict[str, dict] = {
    # kind: the failed response as a host sees it (HTTP status, error type/code, headers); the
    # headers' hint is a template: the real hint replaces it per answer.
    "overloaded": {"status": 529, "error_type": "overloaded_error",
                   "error_message": '529 {"type":"error","error":{"type":"overloaded_error",'
                                    '"message":"Overloaded"}}'},
    "rate_limited": {"status": 429, "error_type": "rate_limit_error", "headers": {"retry-after": "1"},
                     "error_message": '429 {"type":"error","error":{"type":"rate_limit_error",'
                                      '"message":"Number of requests has exceeded your rate limit"}}'},
    "window": {"status": 429, "error_code": "rate_limit_exceeded", "headers": {"retry-after-ms": "1000"},
               "error_message": "429 Rate limit reached for requests per minute (RPM): "
                                "Limit reached. Please try again later."},
    "unavailable": {"status": 503, "error_message": "503 Service Unavailable"},
    "usage_limit": {"status": 429, "error_type": "usage_limit_reached", "headers": {"retry-after": "1"},
                    "error_message": '429 {"error":{"type":"usage_limit_reached","message":'
                                     '"The usage limit has been reached"}}'},
    "server_error": {"status": 500, "error_message": "500 Internal Server Error"},
}
"""The error answers of the world, as structured facts and text."""


def unit_hash(*parts: int) -> float:
    """A deterministic number in [0, 1) from integers (splitmix64 over ``parts``): the same
    request of the same session in the same run gets the same draw under every policy."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (p & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 31
        x = x * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 29
    return (x >> 11) / float(1 << 53)


class Provider:
    """The provider of one scenario with N sessions: decides each request's answer.

    :meth:`request` is what a policy's request meets; :meth:`reserve` is the clairvoyant
    ideal's view (the earliest instant a request would be accepted, booked at once). Both
    take and return virtual ms. ``seed`` drives the random 500s through :func:`unit_hash`.
    """

    def __init__(self, scenario: Scenario, sessions: int, seed: int) -> None:
        self.scenario = scenario
        self.capacity = scenario.capacity_share * scenario.fleet_size(sessions)
        self.interval = 1000.0 / self.capacity      # T, ms between tokens
        self.tolerance = max(0.0, 1000.0 - self.interval)  # τ: one second of burst (one token at least)
        self.tat = 0.0                              # the bucket's theoretical arrival time
        self.seed = seed
        f = scenario.fault
        self.outage = ((int(scenario.fault_start_s * 1000), int(scenario.fault_end_s * 1000))
                       if f in ("outage", "usage") else None)
        self.usage = f == "usage"
        self.window_limit = (max(1, round(scenario.window_share * self.capacity * 60))
                             if f == "windows" else 0)
        self.window_counts: dict[int, int] = {}
        self.transient = f == "transient"
        self.over_capacity = "rate_limited" if f == "brownout429" else "overloaded"
        self.down_kinds = scenario.down_kinds
        self.flap_ms = int(scenario.flap_s * 1000)
        self.throttle_at = int(scenario.throttle_at_s * 1000) if f == "throttle_once" else None

    def down_until(self, t: float) -> int | None:
        """When the outage (or the flapping provider's down period) that covers ``t`` ends
        (virtual ms), or None when the provider is up at ``t``."""
        if self.outage is None or not self.outage[0] <= t < self.outage[1]:
            return None
        if not self.flap_ms:
            return self.outage[1]
        into = int(t - self.outage[0])
        if (into // self.flap_ms) % 2:
            return None  # an up period
        return min(self.outage[1], self.outage[0] + (into // self.flap_ms + 1) * self.flap_ms)

    # -- the real provider ----------------------------------------------------------------
    def request(self, t: int, session: int, call: int, n: int) -> Answer:
        """The answer to a request sent at ``t`` (the ``n``-th request, 0-based, of ``call`` of
        ``session``); the caller hears it after :data:`SERVICE_MS` when ok, else
        :data:`REFUSAL_MS`."""
        if self.throttle_at is not None and t >= self.throttle_at:
            self.throttle_at = None
            return Answer("rate_limited", 1000, True)
        if self.outage is not None and self.down_until(t) is not None:
            if self.usage:
                return Answer("usage_limit", self.outage[1] - t, True)
            kinds = self.down_kinds
            if len(kinds) == 1:
                return Answer(kinds[0], None, True)
            pick = int(unit_hash(self.seed, session, call, n, 0xD0) * len(kinds))
            return Answer(kinds[pick], None, True)
        if self.window_limit:
            w = t // 60_000
            if self.window_counts.get(w, 0) >= self.window_limit:
                return Answer("window", (w + 1) * 60_000 - t, True)
        if t < self.tat - self.tolerance:
            if self.over_capacity == "rate_limited":
                wait = self.tat - self.tolerance - t
                return Answer("rate_limited", max(1, math.ceil(wait / 1000)) * 1000, True)
            return Answer("overloaded", None, True)
        self.tat = max(self.tat, t) + self.interval
        if self.window_limit:
            w = t // 60_000
            self.window_counts[w] = self.window_counts.get(w, 0) + 1
        if self.transient and unit_hash(self.seed, session, call, n) < TRANSIENT_RATE:
            return Answer("server_error", None, False)
        return OK

    # -- the clairvoyant view -------------------------------------------------------------
    def reserve(self, t: int) -> int:
        """The earliest instant at or after ``t`` when a request is accepted, booked now (a
        request sent then must go through :meth:`accept_reserved`)."""
        s = float(t)
        while True:
            s = max(s, self.tat - self.tolerance)
            up = self.down_until(s)
            if up is not None:
                s = float(up)
                continue
            if not self.window_limit:
                break
            w = int(s // 60_000)
            if self.window_counts.get(w, 0) < self.window_limit:
                self.window_counts[w] = self.window_counts.get(w, 0) + 1
                break
            s = float((w + 1) * 60_000)
        self.tat = max(self.tat, s) + self.interval
        return math.ceil(s)

    def accept_reserved(self, session: int, call: int, n: int) -> Answer:
        """The answer to a request the ideal booked with :meth:`reserve` (accepted; a random
        500 may still strike)."""
        if self.transient and unit_hash(self.seed, session, call, n) < TRANSIENT_RATE:
            return Answer("server_error", None, False)
        return OK
