"""A Redis that evicts (docs/fleet.md "Starting Redis"): each process keeps the cooldowns it has
seen, as it keeps buckets, and writes an evicted one back; at start the coordinator says when
the server's eviction policy can drop the fleet's keys, or that it could not check. Against
real ``redis-server`` processes of the tests' own, at ``maxmemory`` with ``allkeys-lru``."""

from __future__ import annotations

import logging

import pytest

from fsm.fleet import BudgetSettings, CoordKey, RedisCoordinator
from fleet_support import own_redis, prefix  # noqa: F401 (fixtures)

KEY = CoordKey("anthropic", "claude-x", "c0ffee")
MINUTE = 60_000


def squeeze(url: str, policy: str, room: int = 2 << 20):
    """A sync client on ``url`` after setting ``maxmemory`` to what is used now plus ``room``
    bytes and ``maxmemory-policy`` to ``policy``."""
    import redis
    sync = redis.Redis.from_url(url)
    used = int(sync.info("memory")["used_memory"])
    sync.config_set("maxmemory", str(used + room))
    sync.config_set("maxmemory-policy", policy)
    return sync


def evict(sync, *names: str) -> None:
    """Write junk until every key of ``names`` is evicted (asserted: a real eviction, not a
    delete)."""
    junk = b"x" * 4096
    for i in range(40_000):
        sync.set(f"junk:{i}", junk)
        if i % 64 == 0 and not sync.exists(*names):
            break
    assert not sync.exists(*names), "the keys were not evicted"
    assert int(sync.info("stats")["evicted_keys"]) > 0


async def test_an_evicted_cooldown_is_not_forgotten_and_is_written_back(own_redis, prefix):  # noqa: F811
    """docs/fleet.md "Starting Redis": a 60 s cooldown whose key an allkeys-lru Redis at
    maxmemory evicts is still a cooldown for the process that learned it; its next admission
    writes it back, so a process that never saw it sees it too. A spent bucket stays spent."""
    budget = BudgetSettings(max_tokens=2)
    seen = RedisCoordinator.from_url(own_redis.url, prefix=prefix)
    other = RedisCoordinator.from_url(own_redis.url, prefix=prefix)
    sync = squeeze(own_redis.url, "allkeys-lru")
    await seen.learn_cooldown(KEY, MINUTE)
    for _ in range(2):
        await seen.admit(KEY, retry=True, budget=budget, pacing=None)
    evict(sync, seen.keys.cooldown(KEY), seen.keys.bucket(KEY))
    answer = await seen.admit(KEY, retry=True, budget=budget, pacing=None)
    assert 50_000 < answer.cooldown_ms <= MINUTE and answer.budget is False
    assert 50_000 < await seen.cooldown_left(KEY) <= MINUTE
    assert 50_000 < (await other.admit(KEY, retry=False, budget=None, pacing=None)).cooldown_ms <= MINUTE
    sync.close()
    await seen.aclose()
    await other.aclose()


async def test_a_process_that_saw_no_cooldown_is_not_given_one(own_redis, prefix):  # noqa: F811
    """docs/fleet.md "Starting Redis": only a cooldown this process learned or read is kept; a
    coordinator that never saw one has none to write back."""
    c = RedisCoordinator.from_url(own_redis.url, prefix=prefix)
    assert (await c.admit(KEY, retry=False, budget=None, pacing=None)).cooldown_ms == 0
    assert await c.cooldown_left(KEY) == 0
    await c.aclose()


@pytest.mark.parametrize("policy, maxmemory, warns", [
    ("allkeys-lru", True, True), ("volatile-lru", True, True), ("allkeys-random", True, True),
    ("noeviction", True, False), ("allkeys-lru", False, False),
])
async def test_the_coordinator_says_at_start_when_redis_can_evict_the_fleets_keys(
        own_redis, prefix, caplog, policy, maxmemory, warns):  # noqa: F811
    """docs/fleet.md "Starting Redis": every key of the fleet has an expiry, so with a maxmemory
    limit any policy but noeviction can evict them: one warning at the first script, naming the
    policy; none for noeviction or without a limit."""
    import redis
    sync = squeeze(own_redis.url, policy) if maxmemory else redis.Redis.from_url(own_redis.url)
    sync.config_set("maxmemory-policy", policy)
    c = RedisCoordinator.from_url(own_redis.url, prefix=prefix)
    with caplog.at_level(logging.WARNING, logger="fsm.fleet"):
        await c.admit(KEY, retry=False, budget=None, pacing=None)
        await c.admit(KEY, retry=False, budget=None, pacing=None)
    said = [r.getMessage() for r in caplog.records if r.name == "fsm.fleet"]
    if warns:
        assert len(said) == 1 and f"maxmemory-policy {policy}" in said[0] and "noeviction" in said[0]
        assert c.eviction_warning == said[0]
    else:
        assert said == [] and c.eviction_warning is None
    sync.close()
    await c.aclose()


async def test_a_refused_config_get_is_said_without_the_password(own_redis, prefix, caplog):  # noqa: F811
    """docs/fleet.md "Starting Redis": a user whose ACL refuses CONFIG is told the policy could
    not be checked (once, at warm-up), the URL's password hidden; the fleet still works."""
    import redis
    sync = redis.Redis.from_url(own_redis.url)
    sync.execute_command("ACL", "SETUSER", "fleet", "on", ">s3cret-pw", "~*", "&*", "+@all", "-config")
    url = own_redis.url.replace("redis://", "redis://fleet:s3cret-pw@")
    c = RedisCoordinator.from_url(url, prefix=prefix)
    with caplog.at_level(logging.WARNING, logger="fsm.fleet"):
        await c.warm_up(connections=1)
        await c.learn_cooldown(KEY, MINUTE)
    said = [r.getMessage() for r in caplog.records if r.name == "fsm.fleet"]
    assert len(said) == 1 and "could not check" in said[0] and "CONFIG GET refused" in said[0]
    assert "s3cret-pw" not in said[0]
    assert (await c.admit(KEY, retry=False, budget=None, pacing=None)).cooldown_ms > 50_000
    sync.close()
    await c.aclose()


async def test_every_master_of_a_cluster_is_checked_and_the_one_that_evicts_is_named(redis_cluster, prefix):  # noqa: F811
    """docs/fleet.md "A Redis Cluster (and Valkey)": the eviction check asks every master, and
    the warning names the master whose policy can drop the fleet's keys (a cluster whose other
    masters are fine is not enough)."""
    import redis
    port = redis_cluster.ports[-1]
    node = redis.Redis(host="127.0.0.1", port=port)
    node.config_set("maxmemory", str(512 << 20))
    node.config_set("maxmemory-policy", "volatile-lru")
    try:
        c = RedisCoordinator.from_url(redis_cluster.url, prefix=prefix)
        warning = await c.check_eviction()
        assert warning is not None and f"(node 127.0.0.1:{port})" in warning
        assert "volatile-lru" in warning and warning.count("maxmemory-policy volatile-lru") == 1
        await c.aclose()
    finally:
        node.config_set("maxmemory", "0")
        node.config_set("maxmemory-policy", "noeviction")
        node.close()
    clean = RedisCoordinator.from_url(redis_cluster.url, prefix=prefix)
    assert await clean.check_eviction() is None, "every master at noeviction: nothing to say"
    await clean.aclose()
