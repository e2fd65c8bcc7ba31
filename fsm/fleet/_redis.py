"""The fleet coordinator on Redis: one atomic Lua script per write, keys that expire.

Strictly private: import these names from :mod:`fsm.fleet`.

Keys (``P`` is the prefix, each part percent-encoded so that ``:`` in a model name cannot
make two keys collide; the two keys of one (provider, model, credential) share a Redis
Cluster hash tag ``{...}``, so that the one script that reads both works on a cluster too):

- ``P:{PROVIDER:MODEL:CRED}:cooldown`` — a string, the cooldown's end (epoch ms); it expires
  at that time (``PX``);
- ``P:{PROVIDER:MODEL:CRED}:budget`` — a string, the bucket's count in thousandths of a
  token; absent means full; it expires after ``bucket_idle_ms`` without use (full again);
- ``P:limited:PROVIDER`` — a sorted set of credential ids scored by the end of their usage
  limit (epoch ms); it expires with its last mark.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import urllib.parse
import weakref
from typing import Any

from fsm._extras import require
from fsm.fleet._local import DEFAULT_BUCKET_IDLE_MS
from fsm.fleet._types import MILLI, BudgetSettings, CoordinatorError, CoordKey, check_ms, max_milli, ratio_milli

DEFAULT_PREFIX = "retry-fsm"

# KEYS[1] cooldown key; ARGV until_ms, now_ms. Keeps the later end; expires at it.
LEARN_COOLDOWN = """
local u = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
local old = tonumber(redis.call('GET', KEYS[1]) or '0')
if old > u then u = old end
if u > now then redis.call('SET', KEYS[1], string.format('%d', u), 'PX', string.format('%d', u - now)) end
return string.format('%d', u)
"""

# KEYS[1] bucket key; ARGV max_milli, idle_ms. gRPC retry throttling: take one token (not
# below 0); allowed while the count left is above half the maximum. Returns {allowed, milli}.
TAKE_TOKEN = """
local max = tonumber(ARGV[1])
local t = tonumber(redis.call('GET', KEYS[1]) or ARGV[1])
if t > max then t = max end
t = t - 1000
if t < 0 then t = 0 end
redis.call('SET', KEYS[1], string.format('%d', t), 'PX', ARGV[2])
if t * 2 > max then return {1, t} end
return {0, t}
"""

# KEYS[1] cooldown key, KEYS[2] bucket key; ARGV now_ms, max_milli (or '' for no budget),
# idle_ms. The reads before a decision in one round trip: the cooldown left, and (with a
# budget) TAKE_TOKEN's step. Returns {cooldown_left_ms, allowed (1/0, or -1: no budget),
# milli-tokens left (-1: no budget)}.
BEFORE_DECISION = """
local now = tonumber(ARGV[1])
local u = tonumber(redis.call('GET', KEYS[1]) or '0')
local left = 0
if u > now then left = u - now end
if ARGV[2] == '' then return {left, -1, -1} end
local max = tonumber(ARGV[2])
local t = tonumber(redis.call('GET', KEYS[2]) or ARGV[2])
if t > max then t = max end
t = t - 1000
if t < 0 then t = 0 end
redis.call('SET', KEYS[2], string.format('%d', t), 'PX', ARGV[3])
if t * 2 > max then return {left, 1, t} end
return {left, 0, t}
"""

# KEYS[1] bucket key; ARGV max_milli, add_milli, idle_ms. A returned token or a success's
# credit, capped at the maximum; a full bucket is deleted (absent = full). Returns milli.
ADD_TOKENS = """
local max = tonumber(ARGV[1])
local t = tonumber(redis.call('GET', KEYS[1]) or ARGV[1]) + tonumber(ARGV[2])
if t >= max then
  redis.call('DEL', KEYS[1])
  return max
end
redis.call('SET', KEYS[1], string.format('%d', t), 'PX', ARGV[3])
return t
"""

# KEYS[1] limited set; ARGV credential id, until_ms, now_ms. Drops ended marks, keeps the
# later end of this one, and lets the set expire with its last mark.
MARK_LIMITED = """
local u = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])
local old = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '0')
if u > old and u > now then redis.call('ZADD', KEYS[1], string.format('%d', u), ARGV[1]) end
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then
  redis.call('PEXPIRE', KEYS[1], string.format('%d', math.max(1, tonumber(last[2]) - now)))
end
return redis.call('ZCARD', KEYS[1])
"""

SCRIPTS = {"learn": LEARN_COOLDOWN, "take": TAKE_TOKEN, "before": BEFORE_DECISION,
           "add": ADD_TOKENS, "mark": MARK_LIMITED}


def _part(text: str) -> str:
    return urllib.parse.quote(text, safe="")


class KeySpace:
    """The Redis key names under ``prefix`` (a non-empty string without spaces)."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        if not isinstance(prefix, str) or not prefix or any(c.isspace() for c in prefix):
            raise ValueError(f"Redis key prefix must be a non-empty string without spaces, got {prefix!r}")
        self.prefix = prefix

    def _tag(self, key: CoordKey) -> str:
        return f"{self.prefix}:{{{_part(key.provider)}:{_part(key.model)}:{_part(key.credential)}}}"

    def cooldown(self, key: CoordKey) -> str:
        return self._tag(key) + ":cooldown"

    def budget(self, key: CoordKey) -> str:
        return self._tag(key) + ":budget"

    def limited(self, provider: str) -> str:
        return f"{self.prefix}:limited:{_part(provider)}"


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``: safe for errors and logs."""
    return re.sub(r"(//[^:/@]*:)[^@/]*@", r"\1***@", url)


def check_url(url: Any) -> str:
    """A ``redis://``, ``rediss://`` or ``unix://`` URL, or ``ValueError`` naming it."""
    if not isinstance(url, str) or not re.match(r"^(redis|rediss|unix)://", url):
        shown = redact_url(url) if isinstance(url, str) else repr(url)
        raise ValueError(f"Redis address must look like redis://HOST:PORT/DB, got {shown!r}")
    return url


def safe_reason(exc: BaseException, url: str | None = None) -> str:
    """A short description of ``exc`` for an event: the server's URL, the error's class and
    message, clipped, with the URL's password (if any) removed."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if url:
        password = urllib.parse.urlsplit(url).password
        if password:
            text = text.replace(password, "***")
        text = f"{redact_url(url)}: {text}"
    return text[:300]


def client_options(socket_timeout_s: float, *, asyncio: bool = True) -> dict[str, Any]:
    """Connection options for a coordinator's client: short socket timeouts and one immediate
    retry on a broken connection only (a pooled connection the server closed by restarting);
    never a retry on a timeout, since the guard answers from local state instead."""
    require("redis", extra="redis", feature="the Redis coordinator (fsm.fleet)")
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    if asyncio:
        from redis.asyncio.retry import Retry
    else:
        from redis.retry import Retry
    return {"socket_timeout": socket_timeout_s, "socket_connect_timeout": socket_timeout_s,
            "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            "decode_responses": False, "driver_info": None}


class RedisCoordinator:
    """The :class:`~fsm.fleet.Coordinator` protocol on a Redis server (redis-py's asyncio
    client), for sessions in several processes and machines.

    ``client`` is a ``redis.asyncio.Redis``; build one from a URL with :meth:`from_url`.
    ``prefix`` separates fleets sharing a server. Every failure to get an answer raises
    :class:`~fsm.fleet.CoordinatorError` (wrap this in :class:`~fsm.fleet.GuardedCoordinator`
    so that sessions never see one). A client belongs to the event loop it first ran in.
    """

    def __init__(self, client: Any, *, prefix: str = DEFAULT_PREFIX,
                 bucket_idle_ms: int = DEFAULT_BUCKET_IDLE_MS, url: str | None = None,
                 max_connections: int = 32) -> None:
        if isinstance(bucket_idle_ms, bool) or not isinstance(bucket_idle_ms, int) or bucket_idle_ms < 1:
            raise ValueError(f"bucket_idle_ms must be a positive integer, got {bucket_idle_ms!r}")
        self.client = client
        self.keys = KeySpace(prefix)
        self.bucket_idle_ms = bucket_idle_ms
        self._url = url
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
            raise ValueError(f"max_connections must be a positive integer, got {max_connections!r}")
        # At most max_connections commands at once; a call waiting here has sent nothing, so a
        # guard may cancel it, while the tasks in in_flight are mid-command (leave them be).
        self.max_connections = max_connections
        self._slots = asyncio.Semaphore(max_connections)
        self.in_flight: "weakref.WeakSet[asyncio.Task]" = weakref.WeakSet()
        # key -> the bucket's count (milli-tokens) in Redis's last answer: what a guard's local
        # fallback continues from when Redis stops answering.
        self.observed_milli: dict[CoordKey, int] = {}
        self._scripts = {name: client.register_script(text) for name, text in SCRIPTS.items()}

    @classmethod
    def from_url(cls, url: str, *, prefix: str = DEFAULT_PREFIX,
                 bucket_idle_ms: int = DEFAULT_BUCKET_IDLE_MS,
                 socket_timeout_s: float = 1.0, max_connections: int = 32) -> "RedisCoordinator":
        """A coordinator on the server at ``url`` (``redis://HOST:PORT/DB``, ``rediss://`` for
        TLS, ``unix:///path.sock``). Connects lazily; at most ``max_connections`` commands
        (and so connections) at once, more wait their turn, so that hundreds of sessions in a
        process do not open hundreds of connections. ``ValueError`` for a bad URL."""
        redis_asyncio = require("redis.asyncio", extra="redis", feature="the Redis coordinator (fsm.fleet)")
        pool = redis_asyncio.ConnectionPool.from_url(
            check_url(url), max_connections=max_connections, **client_options(socket_timeout_s))
        client = redis_asyncio.Redis.from_pool(pool)
        return cls(client, prefix=prefix, bucket_idle_ms=bucket_idle_ms, url=url,
                   max_connections=max_connections)

    @property
    def url(self) -> str | None:
        """The server's URL as given (it may hold a password: show :func:`redact_url` of it)."""
        return self._url

    def __repr__(self) -> str:
        where = redact_url(self._url) if self._url else "client"
        return f"RedisCoordinator({where!r}, prefix={self.keys.prefix!r})"

    async def _run(self, awaitable: Any) -> Any:
        import redis.exceptions
        try:
            await self._slots.acquire()
        except BaseException:
            if inspect.iscoroutine(awaitable):
                awaitable.close()  # never sent: nothing to clean up
            raise
        task = asyncio.current_task()
        if task is not None:
            self.in_flight.add(task)
        try:
            return await awaitable
        except (redis.exceptions.RedisError, OSError) as exc:
            raise CoordinatorError(safe_reason(exc, self._url)) from None
        finally:
            if task is not None:
                self.in_flight.discard(task)
            self._slots.release()

    async def ping(self) -> None:
        """One round trip (``PING``); raises :class:`~fsm.fleet.CoordinatorError` when none."""
        await self._run(self.client.ping())

    async def warm_up(self, connections: int | None = None) -> None:
        """Open ``connections`` pooled connections (default: ``max_connections``) and load the
        scripts into the server, so
        that the first burst of decisions does not pay for connecting and ``NOSCRIPT``
        round trips (call it when the host starts). Raises
        :class:`~fsm.fleet.CoordinatorError` when the server does not answer."""
        count = self.max_connections if connections is None else max(1, connections)
        await asyncio.gather(*(self._run(self.client.ping()) for _ in range(count)))
        for script in self._scripts.values():
            await self._run(self.client.script_load(script.script))

    async def cooldown_left_ms(self, key: CoordKey, now_ms: int) -> int:
        raw = await self._run(self.client.get(self.keys.cooldown(key)))
        until = int(raw) if raw else 0
        return until - now_ms if until > now_ms else 0

    async def learn_cooldown(self, key: CoordKey, until_ms: int, now_ms: int) -> None:
        until_ms = check_ms("until_ms", until_ms)
        await self._run(self._scripts["learn"](keys=[self.keys.cooldown(key)],
                                               args=[until_ms, check_ms("now_ms", now_ms)]))

    def _observe(self, key: CoordKey, milli: int) -> None:
        """Keep the last count Redis gave for ``key`` (see :attr:`observed_milli`)."""
        if len(self.observed_milli) > 1024:
            self.observed_milli.clear()
        self.observed_milli[key] = int(milli)

    async def take_retry_token(self, key: CoordKey, budget: BudgetSettings) -> bool:
        allowed, milli = await self._run(self._scripts["take"](
            keys=[self.keys.budget(key)], args=[max_milli(budget), self.bucket_idle_ms]))
        self._observe(key, milli)
        return bool(allowed)

    async def before_decision(self, key: CoordKey, now_ms: int,
                              budget: BudgetSettings | None) -> tuple[int, bool | None]:
        left, allowed, milli = await self._run(self._scripts["before"](
            keys=[self.keys.cooldown(key), self.keys.budget(key)],
            args=[check_ms("now_ms", now_ms), max_milli(budget) if budget else "",
                  self.bucket_idle_ms]))
        if budget is None:
            return int(left), None
        self._observe(key, milli)
        return int(left), bool(allowed)

    async def _add(self, key: CoordKey, budget: BudgetSettings, milli: int) -> None:
        self._observe(key, await self._run(self._scripts["add"](
            keys=[self.keys.budget(key)], args=[max_milli(budget), milli, self.bucket_idle_ms])))

    async def return_retry_token(self, key: CoordKey, budget: BudgetSettings) -> None:
        await self._add(key, budget, MILLI)

    async def credit_success(self, key: CoordKey, budget: BudgetSettings) -> None:
        await self._add(key, budget, ratio_milli(budget))

    async def tokens(self, key: CoordKey, budget: BudgetSettings) -> float:
        """The bucket's count now, in tokens (for tests and diagnostics)."""
        raw = await self._run(self.client.get(self.keys.budget(key)))
        return min(int(raw), max_milli(budget)) / MILLI if raw else float(budget.max_tokens)

    async def mark_credential_limited(self, provider: str, credential: str, until_ms: int,
                                      now_ms: int) -> None:
        until_ms = check_ms("until_ms", until_ms)
        await self._run(self._scripts["mark"](keys=[self.keys.limited(provider)],
                                              args=[credential, until_ms, check_ms("now_ms", now_ms)]))

    async def limited_credentials(self, provider: str, now_ms: int) -> dict[str, int]:
        rows = await self._run(self.client.zrangebyscore(
            self.keys.limited(provider), f"({check_ms('now_ms', now_ms)}", "+inf", withscores=True))
        return {member.decode() if isinstance(member, bytes) else member: int(score)
                for member, score in rows}

    async def aclose(self) -> None:
        try:
            await self.client.aclose()
        except Exception:  # closing a dead connection must not fail the caller's shutdown
            pass
