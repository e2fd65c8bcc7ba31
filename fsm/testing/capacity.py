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

    ``rate_per_s`` > 0 and ``burst_s`` > 0 are numbers (``ValueError`` naming them otherwise),
    ``answer`` one of :data:`ANSWERS`; ``clock`` returns seconds (monotonic; inject it in
    tests). :attr:`accepted` and :attr:`refused` count the decisions.
    """

    def __init__(self, rate_per_s: float, *, answer: str = "529", burst_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        for name, value in (("rate_per_s", rate_per_s), ("burst_s", burst_s)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if answer not in ANSWERS:
            raise ValueError(f"answer must be one of {', '.join(ANSWERS)}, got {answer!r}")
        self.rate_per_s = float(rate_per_s)
        self.answer = answer
        self._interval = 1.0 / self.rate_per_s
        # GCRA, the token bucket's equivalent: a request at t conforms when t >= tat - tolerance.
        self._tolerance = max(0.0, self.rate_per_s * burst_s - 1.0) * self._interval
        self._clock = clock
        self._tat = -math.inf
        self._lock = threading.Lock()
        self.accepted = 0
        self.refused = 0

    def admit(self) -> dict[str, Any] | None:
        """Take a token now: None when the request may be served, else the script entry of
        the refusal (``status``, ``json``, and for ``429`` the ``retry-after`` headers)."""
        with self._lock:
            now = self._clock()
            earliest = self._tat - self._tolerance
            if now >= earliest - _EPSILON_S:  # float sums must not cost a token
                self._tat = max(self._tat, now) + self._interval
                self.accepted += 1
                return None
            self.refused += 1
            wait_s = earliest - now
        if self.answer == "529":
            return {"status": 529, "json": _OVERLOADED}
        return {"status": 429, "json": _RATE_LIMITED,
                "headers": {"retry-after": str(max(1, math.ceil(round(wait_s, 6)))),
                            "retry-after-ms": str(max(1, math.ceil(round(wait_s * 1000, 3))))}}
