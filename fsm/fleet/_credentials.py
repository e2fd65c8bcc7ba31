"""A credential store whose usage-limit marks live in Redis, shared by a fleet.

Strictly private: import these names from :mod:`fsm.fleet`.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from fsm._extras import require
from fsm.core.protocols import DEFAULT_BLOCK_MS, validate_credentials
from fsm.fleet._guard import DEFAULT_TIMEOUT_S, EventListener, GuardedCoordinator
from fsm.fleet._redis import (DEFAULT_PREFIX, SCRIPTS, KeySpace, RedisCoordinator, check_url, client_errors,
                              client_options, cluster_client, is_cluster_url, limited_from_replies,
                              limited_script_replies, queue_limited_read, safe_reason)
from fsm.fleet._types import MAX_LEFT_MS, credential_id, wall_ms


def load_credentials(path: str | Path) -> dict[str, list[str]]:
    """The API keys of a local JSON file: ``{"PROVIDER": ["key", ...]}`` or the JSON store's
    ``{"providers": {"PROVIDER": {"keys": [...]}}}``. ``ValueError`` naming the path."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read credentials ({exc.strerror})") from None
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if isinstance(data, dict) and isinstance(data.get("providers"), dict):
        data = {p: (e.get("keys") if isinstance(e, dict) else e) for p, e in data["providers"].items()}
    try:
        return validate_credentials(data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None


class RedisCredentialStore:
    """Several API keys per provider; the usage-limit marks are the fleet's, in Redis.

    The keys come from ``credentials`` (provider -> keys in the order they are tried, or the
    path of a JSON file, see :func:`load_credentials`) and never leave this process: Redis
    holds only :func:`~fsm.fleet.credential_id` hashes and until-times, in the same sorted set
    the coordinator's :meth:`~fsm.fleet.Coordinator.mark_credential_limited` writes. So a
    credential one process marked is skipped by every process. Which key a session uses is
    this process's own state.

    The protocol of ``fsm.host.credentials`` (``api_key``, ``mark_usage_limit_reached``) is
    synchronous (a blocking Redis call of at most ``timeout_s``); ``aapi_key`` and
    ``amark_usage_limit_reached`` are the asyncio variants for a shell. When Redis does not
    answer, both answer from this process's own marks and ``coordinator`` (a
    :class:`~fsm.fleet.GuardedCoordinator` over Redis, built from ``url`` when not given)
    reports the outage once. ``clock`` gives wall time in epoch ms; it only turns the time
    left of a mark into an end for :meth:`blocked_until` (marks are durations, counted by
    Redis's clock and the local fallback's).
    """

    def __init__(self, credentials: Mapping[str, Sequence[str]] | str | Path, *,
                 url: str | None = None, coordinator: GuardedCoordinator | None = None,
                 prefix: str = DEFAULT_PREFIX, timeout_s: float = DEFAULT_TIMEOUT_S,
                 on_event: EventListener | None = None,
                 clock: Callable[[], int] = wall_ms) -> None:
        if isinstance(credentials, str | Path):
            self._keys = load_credentials(credentials)
        else:
            self._keys = validate_credentials(credentials)
        if coordinator is None:
            if url is None:
                raise ValueError("RedisCredentialStore needs url= or coordinator=")
            coordinator = GuardedCoordinator(RedisCoordinator.from_url(url, prefix=prefix),
                                             timeout_s=timeout_s, on_event=on_event)
        elif on_event is not None:
            coordinator.subscribe(on_event)
        self.coordinator = coordinator
        inner = coordinator.inner
        self._url = url if url is not None else getattr(inner, "url", None)
        self._sync_keys = inner.keys if isinstance(inner, RedisCoordinator) else KeySpace(prefix)
        self._timeout_s = timeout_s
        self._sync: Any = None  # the blocking client, made on first sync use
        self._clock = clock
        self._ids = {p: [credential_id(k) for k in keys] for p, keys in self._keys.items()}
        self._active: dict[str, str] = {}               # provider -> key new sessions get
        self._sessions: dict[tuple[str, str], str] = {}  # (provider, session) -> key
        self._lock = threading.Lock()  # guards the two maps above (sync callers may be threads)

    def credential_count(self, provider: str) -> int:
        """How many keys this store holds for ``provider`` (0 when none)."""
        return len(self._keys.get(provider, ()))

    # -- the policy (pure: keys, the session's key, the marks -> the key to use) ----------------
    def _pick(self, provider: str, start: str, limited: Mapping[str, int], *, skip_start: bool) -> str | None:
        keys, ids = self._keys[provider], self._ids[provider]
        i = keys.index(start)
        for step in range(1 if skip_start else 0, len(keys) + 1):
            j = (i + step) % len(keys)
            if not (skip_start and keys[j] == start) and ids[j] not in limited:
                return keys[j]
        return None

    def _current(self, provider: str, session_id: str, limited: Mapping[str, int]) -> str:
        with self._lock:
            return self._current_locked(provider, session_id, limited)

    def _current_locked(self, provider: str, session_id: str, limited: Mapping[str, int]) -> str:
        keys = self._keys[provider]
        used = self._sessions.get((provider, session_id)) or self._active.get(provider) or keys[0]
        chosen = self._pick(provider, used, limited, skip_start=False)
        if chosen is None:  # every key is limited: the one whose limit ends first
            chosen = min(keys, key=lambda k: limited.get(credential_id(k), 0))
        self._sessions[(provider, session_id)] = chosen
        return chosen

    def _switch(self, provider: str, session_id: str, used: str, limited: Mapping[str, int]) -> bool:
        nxt = self._pick(provider, used, limited, skip_start=True)
        if nxt is None:
            return False
        with self._lock:
            self._sessions[(provider, session_id)] = nxt
            self._active[provider] = nxt
        return True

    def _used(self, provider: str, session_id: str) -> str:
        return (self._sessions.get((provider, session_id)) or self._active.get(provider)
                or self._keys[provider][0])

    @staticmethod
    def _hold(retry_after_ms: int | None) -> int:
        """How long a mark holds: ``retry_after_ms``, or DEFAULT_BLOCK_MS when unknown."""
        return DEFAULT_BLOCK_MS if retry_after_ms is None or retry_after_ms < 0 else int(retry_after_ms)

    # -- asyncio ------------------------------------------------------------------------------
    async def aapi_key(self, provider: str, session_id: str) -> str | None:
        """The key this session should use now (None: the provider's default)."""
        if provider not in self._keys:
            return None
        limited = await self.coordinator.limited_credentials(provider)  # id -> ms left
        return self._current(provider, session_id, limited)

    async def amark_usage_limit_reached(self, provider: str, session_id: str,
                                        retry_after_ms: int | None) -> bool:
        """Mark the session's key limited for ``retry_after_ms`` (60 s when None) fleet-wide;
        True when the session now has another key that is not limited."""
        if provider not in self._keys:
            return False
        used = self._used(provider, session_id)
        await self.coordinator.mark_credential_limited(provider, credential_id(used),
                                                       self._hold(retry_after_ms))
        limited = await self.coordinator.limited_credentials(provider)
        return self._switch(provider, session_id, used, limited)

    # -- blocking (the fsm.host.credentials protocol) ----------------------------------------------
    def _sync_client(self) -> Any:
        if self._sync is None and self._url is not None:
            redis = require("redis", extra="redis", feature="the Redis credential store (fsm.fleet)")
            if is_cluster_url(self._url):  # SPEC §15.10: a Redis Cluster
                self._sync = cluster_client(self._url, self._timeout_s, asyncio=False)
            else:
                self._sync = redis.Redis.from_url(check_url(self._url),
                                                  **client_options(self._timeout_s, asyncio=False))
            self._sync_mark = self._sync.register_script(SCRIPTS["mark"])
            self._sync_read = self._sync.register_script(SCRIPTS["limited"])
        return self._sync

    def _sync_remote(self, call: Callable[[Any], Any]) -> tuple[bool, Any]:
        breaker = self.coordinator.breaker
        client = self._sync_client()
        if client is None or not breaker.may_try():
            return False, None
        try:
            answer = call(client)
        except client_errors() as exc:
            breaker.failed(safe_reason(exc, self._url))
            return False, None
        breaker.succeeded()
        return True, answer

    def _sync_limited(self, provider: str) -> dict[str, int]:
        """Credential id -> ms left: this process's own marks and the fleet's (durations only,
        so no clock of this machine is compared with the server's)."""
        fallback = self.coordinator.fallback
        merged = fallback.limited_credentials_at(provider, fallback.now_ms())
        def read(client: Any) -> Any:
            if is_cluster_url(self._url):  # a cluster's pipeline cannot send TIME
                return limited_script_replies(self._sync_read(
                    keys=[self._sync_keys.limited(provider)], args=[MAX_LEFT_MS, ""]))
            pipe = client.pipeline(transaction=False)
            queue_limited_read(pipe, self._sync_keys.limited(provider))
            return pipe.execute(raise_on_error=False)
        ok, replies = self._sync_remote(read)
        if ok:  # the server's answer is time left on its own clock; kept locally as well
            for cred, left in limited_from_replies(replies).items():
                if left > merged.get(cred, 0):
                    merged[cred] = left
                    fallback.mark_credential_limited_at(provider, cred, left, fallback.now_ms())
        return merged

    def api_key(self, provider: str, session_id: str) -> str | None:
        """Blocking :meth:`aapi_key` (at most ``timeout_s`` on Redis)."""
        if provider not in self._keys:
            return None
        return self._current(provider, session_id, self._sync_limited(provider))

    def mark_usage_limit_reached(self, provider: str, session_id: str,
                                 retry_after_ms: int | None) -> bool:
        """Blocking :meth:`amark_usage_limit_reached` (at most ``timeout_s`` per Redis call)."""
        if provider not in self._keys:
            return False
        used = self._used(provider, session_id)
        cred, hold = credential_id(used), self._hold(retry_after_ms)
        fallback = self.coordinator.fallback
        fallback.mark_credential_limited_at(provider, cred, hold, fallback.now_ms())
        self._sync_remote(lambda c: self._sync_mark(keys=[self._sync_keys.limited(provider)],
                                                    args=[MAX_LEFT_MS, "", cred, hold]))
        return self._switch(provider, session_id, used, self._sync_limited(provider))

    def blocked_until(self, provider: str) -> dict[str, int]:
        """Credential id -> until (epoch ms on ``clock``) of ``provider``'s limited keys,
        fleet-wide: the time left each mark has, added to this machine's clock."""
        now = self._clock()
        return {cred: now + left for cred, left in self._sync_limited(provider).items()}

    def close(self) -> None:
        """Close the blocking client (the coordinator is closed with ``aclose``)."""
        if self._sync is not None:
            self._sync.close()
            self._sync = None

    async def aclose(self) -> None:
        self.close()
        await self.coordinator.aclose()
