"""Fleet mode: what sessions in many processes and machines agree on (``docs/fleet.md``).

A *coordinator* keyed by (provider, model, credential id) holds the shared cooldowns (from
any session's retry hint), the retry budget (gRPC retry throttling, with a floor and a wait
mode), the pacing of the fleet's requests (:mod:`fsm.core.pacing`), the fallback mark and the
credentials' usage-limit marks, in coordinator protocol v3: durations in, time left out. :class:`InProcessCoordinator` is the embedded default (one per process:
:func:`default_coordinator`); :class:`RedisCoordinator` shares them through a Redis server;
:class:`GuardedCoordinator` puts a short deadline and a local fallback around a remote one
so that a slow or stopped Redis never stalls or breaks a session. The shell reads the
coordinator before handing a turn's end to the brain and writes after the decision
(``docs/policy.md`` §9).
"""

from __future__ import annotations

from fsm.fleet._credentials import RedisCredentialStore, load_credentials
from fsm.fleet._guard import (DEFAULT_PROBE_INTERVAL_S, DEFAULT_TIMEOUT_S, DEFAULT_WRITE_TIMEOUT_S, Breaker, EventListener,
                              GuardedCoordinator)
from fsm.fleet._local import (DEFAULT_BUCKET_IDLE_MS, FLOOR_HORIZON_MS, WAIT_RECHECK_MS, InProcessCoordinator,
                              default_coordinator)
from fsm.fleet._redis import DEFAULT_PREFIX, RedisCoordinator, redact_url
from fsm.fleet._types import (DEFAULT_CREDENTIAL, MAX_LEFT_MS, Admission, BudgetSettings, Coordinator, CoordinatorError, CoordinatorKeyError, CoordKey, FleetCoordinator, PacingSettings,
                              credential_id, wall_ms)

__all__ = [
    "Admission", "CoordinatorKeyError", "MAX_LEFT_MS", "PacingSettings", "DEFAULT_BUCKET_IDLE_MS", "DEFAULT_CREDENTIAL", "DEFAULT_PREFIX", "DEFAULT_PROBE_INTERVAL_S",
    "DEFAULT_TIMEOUT_S", "DEFAULT_WRITE_TIMEOUT_S", "FLOOR_HORIZON_MS", "WAIT_RECHECK_MS", "Breaker", "BudgetSettings", "Coordinator", "CoordinatorError", "FleetCoordinator",
    "CoordKey", "GuardedCoordinator", "InProcessCoordinator", "RedisCoordinator",
    "RedisCredentialStore", "coordinator_from_url", "credential_id", "default_coordinator",
    "load_credentials", "redact_url", "wall_ms",
]


def coordinator_from_url(url: str | None, *, prefix: str = DEFAULT_PREFIX,
                         timeout_s: float = DEFAULT_TIMEOUT_S,
                         on_event: EventListener | None = None,
                         probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
                         guarded: bool = True) -> FleetCoordinator:
    """The coordinator a command line's ``--redis URL`` (or the settings file) names.

    ``None``, ``""`` or ``"memory:"``: the process's :func:`default_coordinator`. A
    ``redis://HOST:PORT/DB`` (``rediss://``, ``unix://``) URL for one Redis, or a
    ``redis+cluster://HOST:PORT,HOST:PORT`` (``rediss+cluster://``) URL for a Redis Cluster
    (database 0 only; SPEC §15.13): a :class:`RedisCoordinator` wrapped in a
    :class:`GuardedCoordinator` (``timeout_s``, ``on_event``, ``probe_interval_s``), or bare
    with ``guarded=False``. ``ValueError`` naming the URL (password hidden) and what is wrong
    with it (a cluster database other than 0 by its value) for anything else; docs/fleet.md
    "A Redis Cluster (and Valkey)". Each is a :class:`FleetCoordinator`: it has
    ``warm_up()`` (call it when the host starts) and ``aclose()``.
    """
    if url is None or url in ("", "memory:"):
        return default_coordinator()
    inner = RedisCoordinator.from_url(url, prefix=prefix)
    if not guarded:
        return inner
    return GuardedCoordinator(inner, timeout_s=timeout_s, on_event=on_event,
                              probe_interval_s=probe_interval_s)
