"""Credential stores for the usage-limit path (``docs/policy.md §3``, D13).

When a turn fails with a usage limit, the session calls
``mark_usage_limit_reached(provider, session_id, retry_after_ms)``. A store blocks the
credential that session was using until ``now + retry_after_ms`` (60 s when the provider gave
no hint) and moves to the next credential that is not blocked. It answers True when another
credential is now in use, which makes the backoff 0. ``credential_count`` and
``limited_count`` tell the credential rotation (D13) how many keys a chain may still try.

Two stores are provided: :class:`InMemoryCredentialStore` (one process) and
:class:`JsonFileCredentialStore` (survives a restart; safe against concurrent writers through
an exclusive ``fcntl`` lock and atomic replace). Both have ``a…`` coroutine twins of their
methods (``aapi_key``, ``amark_usage_limit_reached``, ...) that never block the event loop and
give up after ``timeout_s`` with :class:`CredentialLockTimeout` (``docs/policy.md §8b.2``: the
shell awaits the store with a short timeout, then decides on local state).

Both stores forget a session that has been idle for longer than the longest block the
provider has seen plus 24 h (``docs/policy.md §8b.10``), so the per-session map stays bounded.
No error message of this module ever contains a key.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import json
import math
import os
import stat
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

# the protocol, its default block and the validation of a credentials mapping live in the core;
# re-exported here
from fsm.core.protocols import DEFAULT_BLOCK_MS, CredentialStore, validate_credentials
from fsm.core.text import ApiKeyError, check_api_key

__all__ = ["DEFAULT_BLOCK_MS", "DEFAULT_TIMEOUT_S", "IDLE_GRACE_MS", "KEY_TIMEOUT_S", "CredentialFileError",
           "CredentialLockTimeout", "CredentialStore", "CredentialStoreError",
           "InMemoryCredentialStore", "JsonFileCredentialStore", "validate_credentials"]

MAX_BLOCK_MS = 366 * 86_400_000
"""The longest block recorded (ms); a longer hint (``1e18``) is cut to a year."""

IDLE_GRACE_MS = 86_400_000
"""A session is forgotten after being idle the provider's longest block plus this (24 h)."""

DEFAULT_TIMEOUT_S = 0.05
"""Default ``timeout_s`` of the coroutine methods that feed a decision: the shell's 50 ms
(``docs/policy.md §8b.2``)."""

KEY_TIMEOUT_S = 2.0
"""Default ``timeout_s`` of ``aapi_key``: a request may wait longer for its key than a
decision may wait for a fact."""

_SEEN_RESOLUTION_MS = 3_600_000  # a session's last-seen stamp is refreshed at most hourly
_PRUNE_EVERY_MS = 3_600_000      # and idle sessions are looked for at most hourly
_LOCK_POLL_S = (0.001, 0.002, 0.005, 0.01)
_OLD_TEMP_START = b'{\n "providers":'  # how earlier versions began their temporary files


class CredentialStoreError(Exception):
    """A credential store cannot answer. The message names the path and field, never a key."""


class CredentialFileError(CredentialStoreError, ValueError):
    """The store's file is invalid, or is not one the store may replace (a symbolic link, a
    read-only file, another user's file)."""


class CredentialLockTimeout(CredentialStoreError, TimeoutError):
    """The store did not answer in time (another process holds its lock)."""


# ----------------------------------------------------------------------------- the policy
# One provider's state: {"active": key | None, "blockedUntil": {key: epoch ms},
# "sessions": {session id: key}, "seen": {session id: epoch ms}, "longestBlockMs": ms,
# "prunedAt": epoch ms}. Invariants: "active" and every value of "sessions" and key of
# "blockedUntil" are in the provider's keys; "seen" has an entry for every session.

def _hold_ms(retry_after_ms: Any) -> int:
    if isinstance(retry_after_ms, bool) or not isinstance(retry_after_ms, (int, float)):
        return DEFAULT_BLOCK_MS
    if not math.isfinite(retry_after_ms) or retry_after_ms < 0:
        return DEFAULT_BLOCK_MS
    return min(int(retry_after_ms), MAX_BLOCK_MS)


def _touch(state: dict[str, Any], session_id: str, key: str, now_ms: int) -> bool:
    """Record that the session uses ``key`` now; True when the state changed."""
    sessions: dict[str, str] = state.setdefault("sessions", {})
    seen: dict[str, int] = state.setdefault("seen", {})
    changed = sessions.get(session_id) != key
    sessions[session_id] = key
    if now_ms - seen.get(session_id, -_SEEN_RESOLUTION_MS) >= _SEEN_RESOLUTION_MS:
        seen[session_id] = now_ms
        changed = True
    return changed


def _prune(state: dict[str, Any], now_ms: int) -> bool:
    """Forget expired blocks and sessions idle longer than the longest block + 24 h."""
    if now_ms - state.get("prunedAt", 0) < _PRUNE_EVERY_MS:
        return False
    state["prunedAt"] = now_ms
    blocked: dict[str, int] = state.setdefault("blockedUntil", {})
    for key in [k for k, until in blocked.items() if until <= now_ms]:
        del blocked[key]
    horizon = now_ms - state.get("longestBlockMs", DEFAULT_BLOCK_MS) - IDLE_GRACE_MS
    seen: dict[str, int] = state.setdefault("seen", {})
    sessions: dict[str, str] = state.setdefault("sessions", {})
    idle = [sid for sid, t in seen.items() if t < horizon]
    for sid in idle:
        del seen[sid]
        sessions.pop(sid, None)
    return True


def _mark(state: dict[str, Any], keys: list[str], session_id: str, retry_after_ms: Any,
          now_ms: int) -> bool:
    """Block the session's key and move on; True when another key is now in use."""
    _prune(state, now_ms)
    blocked: dict[str, int] = state.setdefault("blockedUntil", {})
    sessions: dict[str, str] = state.setdefault("sessions", {})
    active = state.get("active") or keys[0]
    used = sessions.get(session_id, active)
    hold = _hold_ms(retry_after_ms)
    state["longestBlockMs"] = max(state.get("longestBlockMs", DEFAULT_BLOCK_MS), hold)
    blocked[used] = max(blocked.get(used, 0), now_ms + hold)
    if active != used and blocked.get(active, 0) <= now_ms:
        # Another session already moved on: just follow it.
        _touch(state, session_id, active, now_ms)
        return True
    start = keys.index(used) if used in keys else -1
    for step in range(1, len(keys) + 1):
        candidate = keys[(start + step) % len(keys)]
        if candidate != used and blocked.get(candidate, 0) <= now_ms:
            state["active"] = candidate
            _touch(state, session_id, candidate, now_ms)
            return True
    _touch(state, session_id, used, now_ms)
    return False


def _current(state: dict[str, Any], keys: list[str], session_id: str, now_ms: int) -> tuple[str, bool]:
    """The key the session should use now, and whether the state changed."""
    changed = _prune(state, now_ms)
    active = state.get("active") or keys[0]
    return active, _touch(state, session_id, active, now_ms) or changed


def _limited(state: Mapping[str, Any], now_ms: int) -> int:
    return sum(1 for until in state.get("blockedUntil", {}).values() if until > now_ms)


def _wall_ms() -> float:
    return time.time() * 1000


class _AsyncMethods:
    """The coroutine twins of a store's methods; ``_call`` runs one of them by name."""

    async def _acall(self, name: str, *args: Any, timeout_s: float) -> Any:
        raise NotImplementedError

    async def aapi_key(self, provider: str, session_id: str, *,
                       timeout_s: float = KEY_TIMEOUT_S) -> str | None:
        """:meth:`api_key` without blocking the loop; :class:`CredentialLockTimeout` after
        ``timeout_s`` seconds."""
        return await self._acall("api_key", provider, session_id, timeout_s=timeout_s)

    async def amark_usage_limit_reached(self, provider: str, session_id: str,
                                        retry_after_ms: int | None, *,
                                        timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
        """:meth:`mark_usage_limit_reached` without blocking the loop;
        :class:`CredentialLockTimeout` after ``timeout_s`` seconds."""
        return await self._acall("mark_usage_limit_reached", provider, session_id, retry_after_ms,
                                 timeout_s=timeout_s)

    async def acredential_count(self, provider: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
        """:meth:`credential_count` without blocking the loop."""
        return await self._acall("credential_count", provider, timeout_s=timeout_s)

    async def alimited_count(self, provider: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
        """:meth:`limited_count` without blocking the loop."""
        return await self._acall("limited_count", provider, timeout_s=timeout_s)


class InMemoryCredentialStore(_AsyncMethods):
    """Several credentials per provider, in memory, shared by the sessions of one process.

    ``credentials`` maps a provider name to its API keys, tried in order (duplicates
    dropped); a key that cannot be sent in an HTTP header is refused with
    :class:`fsm.core.text.ApiKeyError` naming its position. ``clock`` returns wall time in ms
    (inject it in tests). Thread-safe; the coroutine methods answer at once.
    """

    blocking = False  # answers without I/O: the session calls it on the loop

    def __init__(self, credentials: Mapping[str, Sequence[str]], *,
                 clock: Callable[[], float] = _wall_ms) -> None:
        self._keys = validate_credentials(credentials)
        self._state: dict[str, dict[str, Any]] = {p: {} for p in self._keys}
        self._clock = clock
        self._lock = threading.Lock()

    async def _acall(self, name: str, *args: Any, timeout_s: float) -> Any:
        return getattr(self, name)(*args)

    def api_key(self, provider: str, session_id: str) -> str | None:
        keys = self._keys.get(provider)
        if not keys:
            return None
        with self._lock:
            return _current(self._state[provider], keys, session_id, int(self._clock()))[0]

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

    def limited_count(self, provider: str) -> int:
        """How many of them are blocked by a usage limit right now."""
        with self._lock:
            return _limited(self._state.get(provider, {}), int(self._clock()))

    def blocked_until(self, provider: str) -> dict[str, int]:
        """Epoch ms until which each blocked key of ``provider`` is blocked."""
        with self._lock:
            return dict(self._state.get(provider, {}).get("blockedUntil", {}))

    def session_count(self, provider: str) -> int:
        """How many sessions the store remembers for ``provider``."""
        with self._lock:
            return len(self._state.get(provider, {}).get("sessions", {}))


# ----------------------------------------------------------------------------- the JSON file
_EXECUTOR = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fsm-credentials")
# A dedicated pool: stores waiting on a lock must not starve the loop's default executor
# (getaddrinfo runs there).


class _Tx:
    __slots__ = ("data", "dirty")

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.dirty = False


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


class JsonFileCredentialStore(_AsyncMethods):
    """Like :class:`InMemoryCredentialStore`, with its state in a JSON file.

    The file holds ``{"providers": {name: {"keys": [...], "active", "blockedUntil",
    "sessions", "seen", "longestBlockMs", "prunedAt"}}}`` and is created (mode 0600) from
    ``credentials`` when missing; keys given here are merged with the file's. Every call takes
    an exclusive lock on ``PATH.lock`` (waiting at most ``lock_timeout_s`` seconds, then
    :class:`CredentialLockTimeout`) and, when something changed, replaces the file atomically
    through a temporary file in the same folder (mode 0600; a temporary file left by a killed
    writer is removed by the next call). Concurrent processes never lose an update.

    Raises :class:`CredentialFileError` (a ``ValueError``) naming the path and the field when
    the file is not valid — ``keys`` not a list of sendable keys, ``active`` not one of them,
    a ``blockedUntil`` that is not a whole number of ms, NaN — and when the path is a symbolic
    link, not a regular file, read-only, or owned by another user: such a file is refused, never
    replaced. Messages never contain a key (a key is named by its position).
    """

    blocking = True  # every call reads (and may write) the file under a lock

    def __init__(self, path: str | Path, credentials: Mapping[str, Sequence[str]] | None = None, *,
                 clock: Callable[[], float] = _wall_ms, lock_timeout_s: float = 10.0) -> None:
        self.path = Path(path)
        self._counts: dict[str, int] = {}  # keys per provider, as of the last read of the file
        self._clock = clock
        self.lock_timeout_s = lock_timeout_s
        given = validate_credentials(credentials or {})
        with self._locked() as tx:
            providers = tx.data["providers"]
            for provider, keys in given.items():
                entry = providers.setdefault(provider, {"keys": []})
                merged = list(dict.fromkeys(entry["keys"] + keys))
                if merged != entry["keys"]:
                    entry["keys"] = merged
                    tx.dirty = True
            if not self.path.exists():
                tx.dirty = True

    # -- the file ----------------------------------------------------------------------
    def _error(self, problem: str) -> CredentialFileError:
        return CredentialFileError(f"credential store {self.path}: {problem}")

    def _lock(self, fd: int, deadline: float) -> None:
        polls = iter(_LOCK_POLL_S)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            left = deadline - time.monotonic()
            if left <= 0:
                raise CredentialLockTimeout(
                    f"credential store {self.path}: its lock {self.path.name}.lock is held by "
                    f"another process; gave up waiting") from None
            time.sleep(min(left, next(polls, _LOCK_POLL_S[-1])))

    @contextmanager
    def _locked(self, deadline: float | None = None) -> Iterator[_Tx]:
        if deadline is None:
            deadline = time.monotonic() + self.lock_timeout_s
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise CredentialFileError(f"credential store {self.path}: cannot open its lock "
                                      f"{lock_path.name}: {exc.strerror or exc}") from None
        try:
            self._match_owner(fd)
            self._lock(fd, deadline)
            self._remove_stale_temporaries()
            tx = _Tx({})
            tx.data, tx.dirty = self._read()
            yield tx
            if tx.dirty:
                self._write(tx.data)
            self._counts = {p: len(set(e["keys"])) for p, e in tx.data["providers"].items()}  # a key listed twice counts once
        finally:
            os.close(fd)  # releases the lock

    def _match_owner(self, fd: int) -> None:
        """Give a lock file this process created the owner, group and permission bits of the
        store file (else of its folder): a lock left by a process run as root on a user's
        store would otherwise be root's, mode 0600, and the user could never take it again.
        Only a process that may change owners (root) changes them; never fails the call."""
        try:
            lock = os.fstat(fd)
            if lock.st_uid != os.geteuid():
                return  # not ours: someone else's lock is left as it is
            try:
                ref = os.stat(self.path, follow_symlinks=False)
            except FileNotFoundError:
                ref = os.stat(self.path.parent)
            if os.geteuid() == 0 and (lock.st_uid, lock.st_gid) != (ref.st_uid, ref.st_gid):
                os.fchown(fd, ref.st_uid, ref.st_gid)
            mode = stat.S_IMODE(ref.st_mode) & 0o666 if stat.S_ISREG(ref.st_mode) else 0o600
            if mode and stat.S_IMODE(lock.st_mode) != mode | stat.S_IRUSR | stat.S_IWUSR:
                os.fchmod(fd, mode | stat.S_IRUSR | stat.S_IWUSR)
        except OSError:
            pass

    def _remove_stale_temporaries(self) -> None:
        # Called with the lock held: only a writer holding it creates temporary files, so any
        # found now was left by a writer that was killed.
        folder, name = self.path.parent, self.path.name
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        for entry in entries:
            stale = entry.name.startswith(f".{name}.tmp-")
            if not stale and entry.name.startswith(name + ".") and len(entry.name) == len(name) + 9:
                stale = self._is_old_temporary(entry.path)  # left by an earlier version
            if stale:
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass

    @staticmethod
    def _is_old_temporary(path: str) -> bool:
        try:
            with open(path, "rb") as fh:
                return fh.read(len(_OLD_TEMP_START)) == _OLD_TEMP_START
        except OSError:
            return False

    def _check_replaceable(self) -> os.stat_result | None:
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(info.st_mode):
            raise self._error("is a symbolic link; the store replaces its file, which would "
                              "replace the link: give the store the path of the real file")
        if not stat.S_ISREG(info.st_mode):
            raise self._error("is not a regular file")
        if info.st_uid != os.geteuid():
            raise self._error(f"is owned by another user (uid {info.st_uid}, this process runs as "
                              f"uid {os.geteuid()}); refusing to replace it")
        if not info.st_mode & stat.S_IWUSR or not os.access(self.path, os.W_OK):
            raise self._error(f"is read-only (mode {stat.S_IMODE(info.st_mode):04o}); refusing to "
                              "replace it (chmod 600 it if the store may update it)")
        return info

    def _read(self) -> tuple[dict[str, Any], bool]:
        """The file's checked data, and whether checking changed it (it must be written)."""
        if self._check_replaceable() is None:
            return {"providers": {}}, False
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            raise self._error(f"cannot read it: {exc.strerror or exc}") from None
        try:
            data = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            raise self._error(f"not valid JSON ({str(exc)[:200]})") from None
        return self._validate(data)

    def _validate(self, data: Any) -> tuple[dict[str, Any], bool]:
        """The file's data checked field by field (see the class docstring), and whether
        checking changed it (dropped entries of removed keys, stamped legacy sessions)."""
        if not isinstance(data, dict) or not isinstance(data.get("providers", {}), dict):
            raise self._error('expected {"providers": {...}}')
        data.setdefault("providers", {})
        changed = False
        for provider, entry in data["providers"].items():
            where = f"providers[{provider!r:.60}]"
            if not isinstance(entry, dict):
                raise self._error(f"{where} must be an object")
            keys = entry.get("keys")
            if not isinstance(keys, list) or not keys:
                raise self._error(f"{where}.keys must be a non-empty list of keys, got "
                                  f"{'an empty list' if keys == [] else type(keys).__name__}")
            for i, key in enumerate(keys):
                try:
                    check_api_key(key, f"{where}.keys[{i}]")
                except ApiKeyError as exc:
                    raise self._error(str(exc)) from None
            entry["keys"] = keys = list(dict.fromkeys(keys))
            position = {k: i for i, k in enumerate(keys)}
            active = entry.get("active")
            if active is not None and active not in position:
                raise self._error(f"{where}.active is not one of {where}.keys")
            for field in ("blockedUntil", "sessions", "seen"):
                if not isinstance(entry.setdefault(field, {}), dict):
                    raise self._error(f"{where}.{field} must be an object")
            for key, until in list(entry["blockedUntil"].items()):
                if key not in position:
                    del entry["blockedUntil"][key]  # a key taken out of "keys": its block goes too
                    changed = True
                elif isinstance(until, bool) or not isinstance(until, int):
                    raise self._error(f"{where}.blockedUntil of keys[{position[key]}] must be a "
                                      f"whole number of epoch ms, got {type(until).__name__}")
            # Set operations and all() keep this linear at C speed: the maps may be large.
            sessions, seen = entry["sessions"], entry["seen"]
            if not all(type(key) is str for key in sessions.values()):
                sid = next(s for s, k in sessions.items() if type(k) is not str)
                raise self._error(f"{where}.sessions[{sid!r:.60}] must be a key (text), got "
                                  f"{type(sessions[sid]).__name__}")
            if not position.keys() >= set(sessions.values()):
                for sid in [s for s, k in sessions.items() if k not in position]:
                    del sessions[sid]
                changed = True
            if not all(type(t) is int for t in seen.values()):
                sid = next(s for s, t in seen.items() if type(t) is not int)
                raise self._error(f"{where}.seen[{sid!r:.60}] must be a whole number of epoch ms")
            for sid in seen.keys() - sessions.keys():
                del seen[sid]
                changed = True
            for field in ("longestBlockMs", "prunedAt"):
                value = entry.get(field, 0)
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise self._error(f"{where}.{field} must be a whole number ≥ 0")
            # Sessions written before "seen" existed count as seen now: never dropped unseen.
            missing = sessions.keys() - seen.keys()
            if missing:
                now = int(self._clock())
                for sid in missing:
                    seen[sid] = now
                changed = True
        return data, changed

    def _write(self, data: dict[str, Any]) -> None:
        self._check_replaceable()
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.tmp-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                os.fchmod(fh.fileno(), 0o600)
                # dumps, not dump: json.dump to a file runs the pure-Python encoder (~10x slower).
                fh.write(json.dumps(data, separators=(",", ":")))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        try:  # make the rename itself durable
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError:
            pass

    # -- the calls ---------------------------------------------------------------------
    async def _acall(self, name: str, *args: Any, timeout_s: float) -> Any:
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0 and math.isfinite(timeout_s)):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        deadline = time.monotonic() + timeout_s
        call = functools.partial(getattr(self, name), *args, _deadline=deadline)
        future = asyncio.get_running_loop().run_in_executor(_EXECUTOR, call)
        try:
            return await asyncio.wait_for(future, timeout_s)
        except CredentialLockTimeout:
            raise
        except TimeoutError:
            raise CredentialLockTimeout(f"credential store {self.path}: no answer within "
                                        f"{timeout_s * 1000:g} ms") from None

    def api_key(self, provider: str, session_id: str, *, _deadline: float | None = None) -> str | None:
        with self._locked(_deadline) as tx:
            entry = tx.data["providers"].get(provider)
            if not entry:
                return None
            key, changed = _current(entry, entry["keys"], session_id, int(self._clock()))
            tx.dirty |= changed
            return key

    def mark_usage_limit_reached(self, provider: str, session_id: str, retry_after_ms: int | None,
                                 *, _deadline: float | None = None) -> bool:
        with self._locked(_deadline) as tx:
            entry = tx.data["providers"].get(provider)
            if not entry:
                return False
            tx.dirty = True
            return _mark(entry, entry["keys"], session_id, retry_after_ms, int(self._clock()))

    def credential_count(self, provider: str, *, _deadline: float | None = None) -> int:
        """How many keys the file held for ``provider`` at the last call (it was read when the
        store was made, and by every call since): no I/O, safe on the event loop."""
        return self._counts.get(provider, 0)

    def limited_count(self, provider: str, *, _deadline: float | None = None) -> int:
        with self._locked(_deadline) as tx:
            return _limited(tx.data["providers"].get(provider, {}), int(self._clock()))

    def blocked_until(self, provider: str) -> dict[str, int]:
        """Epoch ms until which each blocked key of ``provider`` is blocked."""
        with self._locked() as tx:
            return dict(tx.data["providers"].get(provider, {}).get("blockedUntil", {}))

    def session_count(self, provider: str) -> int:
        """How many sessions the store remembers for ``provider``."""
        with self._locked() as tx:
            return len(tx.data["providers"].get(provider, {}).get("sessions", {}))
