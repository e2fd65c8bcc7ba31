"""Credential stores for the usage-limit path (SPEC §3).

When a turn fails with a usage limit, the brain calls
``mark_usage_limit_reached(provider, session_id, retry_after_ms)``. A store blocks the
credential that session was using until ``now + retry_after_ms`` (60 s when the provider gave
no hint) and moves to the next credential that is not blocked. It answers True when another
credential is now in use, which makes the backoff 0.

Two stores are provided: :class:`InMemoryCredentialStore` (one process) and
:class:`JsonFileCredentialStore` (survives a restart; safe against concurrent writers through
an exclusive ``fcntl`` lock and atomic replace).
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

DEFAULT_BLOCK_MS = 60_000


class CredentialStore(Protocol):
    """What a session needs from a credential store."""

    def api_key(self, provider: str, session_id: str) -> str | None:
        """The credential this session should use now for ``provider`` (None: provider default)."""

    def mark_usage_limit_reached(self, provider: str, session_id: str,
                                 retry_after_ms: int | None) -> bool:
        """Block the session's credential; True when another one is now in use."""


def _validate_credentials(credentials: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    if not isinstance(credentials, Mapping):
        raise TypeError(f"credentials must map provider -> list of keys, got {type(credentials).__name__}")
    out: dict[str, list[str]] = {}
    for provider, keys in credentials.items():
        if not isinstance(provider, str) or not provider:
            raise ValueError(f"provider name must be a non-empty string, got {provider!r}")
        if isinstance(keys, str) or not all(isinstance(k, str) and k for k in keys):
            raise ValueError(f"credentials[{provider!r}] must be a list of non-empty strings")
        if not keys:
            raise ValueError(f"credentials[{provider!r}] is empty")
        out[provider] = list(keys)
    return out


def _mark(state: dict[str, Any], keys: list[str], session_id: str, retry_after_ms: int | None,
          now_ms: int) -> bool:
    """The shared policy over one provider's state ``{"active", "blockedUntil", "sessions"}``."""
    blocked: dict[str, int] = state.setdefault("blockedUntil", {})
    sessions: dict[str, str] = state.setdefault("sessions", {})
    active = state.get("active") or keys[0]
    used = sessions.get(session_id, active)
    hold = DEFAULT_BLOCK_MS if retry_after_ms is None or retry_after_ms < 0 else retry_after_ms
    blocked[used] = max(blocked.get(used, 0), now_ms + hold)
    if active != used and blocked.get(active, 0) <= now_ms:
        # Another session already moved on: just follow it.
        sessions[session_id] = active
        return True
    start = keys.index(used) if used in keys else -1
    for step in range(1, len(keys) + 1):
        candidate = keys[(start + step) % len(keys)]
        if candidate != used and blocked.get(candidate, 0) <= now_ms:
            state["active"] = candidate
            sessions[session_id] = candidate
            return True
    return False


def _current(state: dict[str, Any], keys: list[str], session_id: str) -> str:
    active = state.get("active") or keys[0]
    state.setdefault("sessions", {})[session_id] = active
    return active


class InMemoryCredentialStore:
    """Several credentials per provider, in memory, shared by the sessions of one process.

    ``credentials`` maps a provider name to its API keys, tried in order. ``clock`` returns
    wall time in ms (inject it in tests). Thread-safe.
    """

    blocking = False  # answers without I/O: the session calls it on the loop

    def __init__(self, credentials: Mapping[str, Sequence[str]], *,
                 clock: Callable[[], float] = lambda: time.time() * 1000) -> None:
        self._keys = _validate_credentials(credentials)
        self._state: dict[str, dict[str, Any]] = {p: {} for p in self._keys}
        self._clock = clock
        self._lock = threading.Lock()

    def api_key(self, provider: str, session_id: str) -> str | None:
        keys = self._keys.get(provider)
        if not keys:
            return None
        with self._lock:
            return _current(self._state[provider], keys, session_id)

    def mark_usage_limit_reached(self, provider: str, session_id: str,
                                 retry_after_ms: int | None) -> bool:
        keys = self._keys.get(provider)
        if not keys:
            return False
        with self._lock:
            return _mark(self._state[provider], keys, session_id, retry_after_ms, int(self._clock()))

    def credential_count(self, provider: str) -> int:
        """How many credentials the store holds for ``provider`` (D13: each gets a try)."""
        return len(self._keys.get(provider, ()))

    def blocked_until(self, provider: str) -> dict[str, int]:
        """Epoch ms until which each blocked key of ``provider`` is blocked."""
        with self._lock:
            return dict(self._state.get(provider, {}).get("blockedUntil", {}))


class JsonFileCredentialStore:
    """Like :class:`InMemoryCredentialStore`, with its state in a JSON file.

    The file holds ``{"providers": {name: {"keys": [...], "active", "blockedUntil",
    "sessions"}}}`` and is created (mode 0600) from ``credentials`` when missing; keys given
    here are merged with the file's. Every call takes an exclusive lock on ``PATH.lock`` and
    replaces the file atomically, so concurrent processes never lose an update.
    Raises ``ValueError`` naming the path when the file is not valid.
    """

    def __init__(self, path: str | Path, credentials: Mapping[str, Sequence[str]] | None = None, *,
                 clock: Callable[[], float] = lambda: time.time() * 1000) -> None:
        self.path = Path(path)
        self._clock = clock
        given = _validate_credentials(credentials or {})
        with self._locked() as data:
            providers = data.setdefault("providers", {})
            for provider, keys in given.items():
                entry = providers.setdefault(provider, {"keys": []})
                entry["keys"] = list(dict.fromkeys(entry.get("keys", []) + keys))

    @contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        with open(lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                data = self._read()
                before = json.dumps(data, sort_keys=True)
                yield data
                if json.dumps(data, sort_keys=True) != before:
                    self._write(data)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> dict[str, Any]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {"providers": {}}
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{self.path}: not valid JSON ({exc})") from None
        if not isinstance(data, dict) or not isinstance(data.get("providers", {}), dict):
            raise ValueError(f"{self.path}: expected {{\"providers\": {{...}}}}")
        return data

    def _write(self, data: dict[str, Any]) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh, indent=1, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def api_key(self, provider: str, session_id: str) -> str | None:
        with self._locked() as data:
            entry = data["providers"].get(provider)
            if not entry or not entry.get("keys"):
                return None
            return _current(entry, entry["keys"], session_id)

    def mark_usage_limit_reached(self, provider: str, session_id: str,
                                 retry_after_ms: int | None) -> bool:
        with self._locked() as data:
            entry = data["providers"].get(provider)
            if not entry or not entry.get("keys"):
                return False
            return _mark(entry, entry["keys"], session_id, retry_after_ms, int(self._clock()))

    def blocked_until(self, provider: str) -> dict[str, int]:
        with self._locked() as data:
            return dict(data["providers"].get(provider, {}).get("blockedUntil", {}))
