"""The fault server's capacity mode: a provider that serves at most N requests per second.

:class:`Capacity` is a token bucket of ``rate_per_s`` tokens per second holding ``burst_s``
seconds of them (one second by default, the provider of ``docs/simulation.md``). A chat request
that finds a token is answered by the script as usual; one that finds none is refused at once
with ``529 overloaded_error`` (``answer="529"``) or ``429 rate_limit_error`` with
``retry-after`` / ``retry-after-ms`` saying when the next token comes (``answer="429"``). With
it a user can watch a real fleet hold a provider at its capacity::

    from fsm.testing.fault_server import FaultServer
    from fsm.testing.capacity import Capacity
    with FaultServer(capacity=Capacity(50, answer="429")) as server:
        ...   # point the fleet at server.base_url; server.capacity.refused counts refusals

``service_ms`` and ``refusal_ms`` make it the simulation's provider (docs/simulation.md "The
world"): an accepted request is answered after ``service_ms`` (2,000 there), a refusal after
``refusal_ms`` (200 there). The provider counts what it sees (:meth:`Capacity.stats`, served as
``GET /fault/stats``): requests accepted and refused per second of the wall clock, so the load a
fleet put on it is measured where the simulation measures it.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable

__all__ = ["Capacity", "ANSWERS"]

ANSWERS = ("529", "429")

_EPSILON_S = 1e-9

_OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
_RATE_LIMITED = {"type": "error", "error": {"type": "rate_limit_error",
                                            "message": "Number of requests has exceeded your rate limit"}}


class Capacity:
    """A token bucket for the fault server (see the module docstring); thread-safe.

    ``rate_per_s`` > 0 and ``burst_s`` > 0 are numbers, ``service_ms`` and ``refusal_ms``
    numbers ≥ 0 (ms; ``ValueError`` naming them otherwise), ``answer`` one of :data:`ANSWERS`;
    ``clock`` returns seconds (monotonic; inject it in tests) and ``wall`` the epoch time in
    seconds that :meth:`stats` bins requests by. :attr:`accepted` and :attr:`refused` count the
    decisions.
    """

    def __init__(self, rate_per_s: float, *, answer: str = "529", burst_s: float = 1.0,
                 service_ms: float = 0, refusal_ms: float = 0,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        for name, value in (("rate_per_s", rate_per_s), ("burst_s", burst_s)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        for name, value in (("service_ms", service_ms), ("refusal_ms", refusal_ms)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
                raise ValueError(f"{name} must be a number of ms ≥ 0, got {value!r}")
        if answer not in ANSWERS:
            raise ValueError(f"answer must be one of {', '.join(ANSWERS)}, got {answer!r}")
        self.rate_per_s = float(rate_per_s)
        self.burst_s = float(burst_s)
        self.service_ms = float(service_ms)
        self.refusal_ms = float(refusal_ms)
        self.answer = answer
        self._interval = 1.0 / self.rate_per_s
        # GCRA, the token bucket's equivalent: a request at t conforms when t >= tat - tolerance.
        self._tolerance = max(0.0, self.rate_per_s * burst_s - 1.0) * self._interval
        self._clock = clock
        self._wall = wall
        self._tat = -math.inf
        self._lock = threading.Lock()
        self.accepted = 0
        self.refused = 0
        self._per_second: dict[int, list[int]] = {}  # epoch second -> [accepted, refused]

    def admit(self) -> dict[str, Any] | None:
        """Take a token now: None when the request may be served (after :attr:`service_ms`),
        else the script entry of the refusal (``status``, ``json``, for ``429`` the
        ``retry-after`` headers, and ``delay_ms`` when :attr:`refusal_ms` is set)."""
        with self._lock:
            now = self._clock()
            counts = self._per_second.setdefault(math.floor(self._wall()), [0, 0])
            earliest = self._tat - self._tolerance
            if now >= earliest - _EPSILON_S:  # float sums must not cost a token
                self._tat = max(self._tat, now) + self._interval
                self.accepted += 1
                counts[0] += 1
                return None
            self.refused += 1
            counts[1] += 1
            wait_s = earliest - now
        if self.answer == "529":
            refusal: dict[str, Any] = {"status": 529, "json": _OVERLOADED}
        else:
            refusal = {"status": 429, "json": _RATE_LIMITED,
                       "headers": {"retry-after": str(max(1, math.ceil(round(wait_s, 6)))),
                                   "retry-after-ms": str(max(1, math.ceil(round(wait_s * 1000, 3))))}}
        if self.refusal_ms:
            refusal["delay_ms"] = self.refusal_ms
        return refusal

    def stats(self) -> dict[str, Any]:
        """What the provider saw, as JSON-able data: ``rate_per_s``, ``burst_s``, ``answer``,
        ``service_ms``, ``refusal_ms``, ``accepted`` and ``refused`` (counts), and
        ``per_second``: ``[[epoch second, accepted, refused], ...]`` ascending, one row per
        second in which a request arrived (the second of the wall clock ``wall``)."""
        with self._lock:
            rows = [[second, a, r] for second, (a, r) in sorted(self._per_second.items())]
            return {"rate_per_s": self.rate_per_s, "burst_s": self.burst_s, "answer": self.answer,
                    "service_ms": self.service_ms, "refusal_ms": self.refusal_ms,
                    "accepted": self.accepted, "refused": self.refused, "per_second": rows}
