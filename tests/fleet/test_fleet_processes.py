"""Separate processes sharing one real Redis, or a three-master Redis Cluster: cooldowns, the
budget and credential marks are the fleet's (each worker is ``tests/fleet_worker.py`` in its own
interpreter)."""

from __future__ import annotations

import pytest

from fsm.fleet import credential_id, wall_ms
from fleet_support import Worker, prefix, redis_server, run_all  # noqa: F401 (fixtures)

pytestmark = pytest.mark.subprocess


@pytest.mark.parametrize("readers", [1, 3])
def test_a_cooldown_learned_by_one_process_is_seen_by_the_others(redis_server, prefix, readers):  # noqa: F811
    """Two and four processes: one learns a 30 s hint; every other one sees it (other models
    and providers do not)."""
    import time
    started = time.monotonic()
    assert Worker(redis_server.url, prefix, [["learn", "openai", "gpt", 30_000]]).results() == [None]
    answers = run_all(redis_server.url, prefix,
                      [[["left", "openai", "gpt"], ["left", "openai", "other"]]] * readers)
    elapsed_ms = (time.monotonic() - started) * 1000
    for left, other in answers:
        assert 30_000 - elapsed_ms - 50 < left <= 30_000, "time left on the server's clock"
        assert other == 0


@pytest.mark.parametrize("workers", [2, 4])
def test_the_budget_holds_across_processes(redis_server, prefix, workers):  # noqa: F811
    """max 100: whatever the interleaving, exactly 49 takes leave more than 50 tokens, so the
    fleet as a whole is allowed 49 retries out of 160 failures."""
    takes = 160 // workers
    answers = run_all(redis_server.url, prefix, [[["take", takes, 100]]] * workers)
    assert sum(a[0] for a in answers) == 49
    assert all(0 <= a[0] <= 49 for a in answers)


def test_successes_in_one_process_refill_the_budget_of_another(redis_server, prefix):  # noqa: F811
    """Successes in one process refill the budget of another."""
    assert Worker(redis_server.url, prefix, [["take", 10, 10]]).results() == [4]  # 10 -> 0
    Worker(redis_server.url, prefix, [["credit", 80, 10]]).results()  # 80 x 0.1: 8 tokens
    assert Worker(redis_server.url, prefix, [["take", 3, 10]]).results() == [2]  # 7, 6, then 5


def test_a_credential_marked_by_one_process_is_skipped_by_all(redis_server, prefix):  # noqa: F811
    """Three processes hold the same two keys; one hits the usage limit on the first key: the
    others' sessions (new and old) get the second key, and Redis never sees a key in clear."""
    creds = {"anthropic": ["sk-first-key", "sk-second-key"]}
    first, second = credential_id("sk-first-key"), credential_id("sk-second-key")
    limiter = Worker(redis_server.url, prefix,
                     [["key", "anthropic", "s1"], ["limit", "anthropic", "s1", 60_000],
                      ["key", "anthropic", "s1"]], credentials=creds)
    assert limiter.results() == [first, True, second]
    answers = run_all(redis_server.url, prefix,
                      [[["key", "anthropic", "a"], ["skey", "anthropic", "b"]]] * 2,
                      credentials=creds)
    assert answers == [[second, second]] * 2
    import redis
    client = redis.Redis.from_url(redis_server.url)
    try:
        for name in client.keys(f"{prefix}:*"):
            dump = repr(name) + repr(client.zrange(name, 0, -1, withscores=True)
                                     if client.type(name) == b"zset" else client.get(name))
            assert b"sk-" not in name and "sk-" not in dump
    finally:
        client.close()


def test_processes_share_cooldowns_the_budget_and_marks_on_a_redis_cluster(redis_cluster, prefix):  # noqa: F811
    """SPEC §15.10, docs/fleet.md "A Redis Cluster (and Valkey)": on a three-master cluster,
    a process's cooldowns (keys on two different masters), its credential mark and the
    budget (on a third master) are every process's: two processes taking 40 retries each
    against a bucket of 100 are allowed 49 in all, as on one Redis."""
    from redis.crc import key_slot
    from fsm.fleet import CoordKey
    from fsm.fleet._redis import KeySpace
    space = KeySpace(prefix)
    thirds = {key_slot(space.cooldown(CoordKey(p, m)).encode()) * 3 // 16384
              for p, m in [("openai", "gpt"), ("anthropic", "claude"), ("p", "m")]}
    assert thirds == {0, 1, 2}, "the keys live on the three masters"
    url = redis_cluster.url
    learner = Worker(url, prefix, [["learn", "openai", "gpt", 30_000],
                                   ["learn", "anthropic", "claude", 30_000],
                                   ["mark", "openai", "c1", 30_000], ["take", 40, 100]])
    *_, learner_took = learner.results()
    reader = Worker(url, prefix, [["left", "openai", "gpt"], ["left", "anthropic", "claude"],
                                  ["limited", "openai"], ["take", 40, 100]])
    gpt, claude, limited, reader_took = reader.results()
    assert 0 < gpt <= 30_000 and 0 < claude <= 30_000 and 0 < limited["c1"] <= 30_000
    assert (learner_took, reader_took) == (40, 9), "49 retries for the fleet, as on one Redis"
