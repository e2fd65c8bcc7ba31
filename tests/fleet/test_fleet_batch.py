"""The Redis coordinator's batches: the calls of one event-loop iteration for one key go to
Redis as one script call (docs/fleet.md "Many callers, one Redis", SPEC §15.6). They are
answered in order as separate steps would be, one key's error reaches that key's callers
only, a caller that stops waiting is left out (before the call is sent) or has its token
given back (after), and on a Redis Cluster every call holds one slot's keys. The script
calls are recorded (and held or failed) by the test: no wall-time margins."""

from __future__ import annotations

import asyncio

import pytest
import redis.exceptions
from redis.crc import key_slot

from fleet_support import any_redis, prefix, redis_server  # noqa: F401 (fixtures)
from fsm.fleet import BudgetSettings, CoordinatorKeyError, CoordKey, InProcessCoordinator, RedisCoordinator
from fsm.fleet import _redis
from fsm.fleet._redis import batch_size

KEY = CoordKey("anthropic", "claude-x")
BUDGET = BudgetSettings(max_tokens=10)
NOW = 1_700_000_000_000.0  # one time for every call: the same shared arguments, one batch


class Recorded:
    """Stands for the coordinator's ADMIT script: records each call (its keys and how many
    requests it holds), holds every call while ``gate`` is not set, and fails the calls for
    the keys in ``fail`` with a ``WRONGTYPE`` error reply."""

    def __init__(self, script) -> None:
        self.script = script
        self.calls: list[tuple[list[str], int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail: set[str] = set()

    async def __call__(self, keys, args, client=None):
        self.calls.append((list(keys), int(args[20])))  # ARGV[21]: the number of requests
        await self.gate.wait()
        if keys[0] in self.fail:
            raise redis.exceptions.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")
        return await self.script(keys=keys, args=args)


def coordinator(url: str, prefix: str, **kw) -> tuple[RedisCoordinator, Recorded]:  # noqa: F811
    c = RedisCoordinator.from_url(url, prefix=prefix, **kw)
    recorded = c._scripts["admit"] = Recorded(c._scripts["admit"])
    return c, recorded


def admit(c: RedisCoordinator, key: CoordKey = KEY):
    return c.admit(key, retry=True, budget=BUDGET, pacing=None, _now=NOW)


def in_order(n: int) -> list:
    """What ``n`` separate steps at one time answer, in order (the in-process coordinator)."""
    local = InProcessCoordinator(clock=lambda: NOW)
    return [local.admit_at(KEY, NOW, retry=True, budget=BUDGET, pacing=None) for _ in range(n)]


async def settled(c: RedisCoordinator) -> None:
    """Let the coordinator's batches and give-backs finish."""
    await asyncio.sleep(0)
    while c._batches:
        await asyncio.gather(*tuple(c._batches), return_exceptions=True)


def test_a_batch_holds_256_requests_or_more_when_they_would_outnumber_the_connections():
    assert batch_size(1, 32) == batch_size(8_192, 32) == 256
    assert batch_size(8_193, 32) == 257
    assert batch_size(10_000, 32) == 313, "32 calls: one per connection, none waits"
    assert batch_size(10_000, 0) == 10_000


async def test_the_calls_of_one_iteration_are_one_script_call_answered_in_order(any_redis, prefix):  # noqa: F811
    c, recorded = coordinator(any_redis.url, prefix)
    answers = await asyncio.gather(*(admit(c) for _ in range(12)))
    assert recorded.calls == [([c.keys.cooldown(KEY), c.keys.bucket(KEY), c.keys.floor(KEY),
                                c.keys.pacer(KEY)], 12)]
    assert answers == in_order(12), "as twelve separate steps, in the callers' order"
    assert [a.token_taken for a in answers].count(True) == 4
    await c.aclose()


async def test_more_calls_than_connections_can_carry_make_bigger_batches_not_waiting_ones(
        redis_server, prefix, monkeypatch):  # noqa: F811
    monkeypatch.setattr(_redis, "BATCH_MAX", 4)
    c, recorded = coordinator(redis_server.url, prefix, max_connections=2)
    answers = await asyncio.gather(*(admit(c) for _ in range(20)))
    assert [n for _, n in recorded.calls] == [10, 10], "two connections: two calls of ten, not five of four"
    assert sum(a.token_taken for a in answers) == 4
    assert sorted(answers, key=repr) == sorted(in_order(20), key=repr)
    await c.aclose()


async def test_one_keys_error_reaches_only_that_keys_callers(any_redis, prefix):  # noqa: F811
    c, recorded = coordinator(any_redis.url, prefix)
    bad = CoordKey("openai", "gpt-bad")
    recorded.fail.add(c.keys.cooldown(bad))
    answers = await asyncio.gather(*(admit(c, k) for k in (KEY, bad, KEY, bad, KEY)),
                                   return_exceptions=True)
    assert len(recorded.calls) == 2, "one call per key"
    assert [type(a).__name__ for a in answers] == ["Admission", "CoordinatorKeyError", "Admission",
                                                   "CoordinatorKeyError", "Admission"]
    assert answers[::2] == in_order(3)
    assert all(isinstance(a, CoordinatorKeyError) and "WRONGTYPE" in str(a) for a in answers[1::2])
    await c.aclose()


async def test_a_caller_cancelled_before_its_batch_is_sent_is_left_out(any_redis, prefix):  # noqa: F811
    c, recorded = coordinator(any_redis.url, prefix)
    tasks = [asyncio.ensure_future(admit(c)) for _ in range(3)]
    await asyncio.sleep(0)  # each has asked; the batch goes at the end of the next iteration
    tasks[1].cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert [n for _, n in recorded.calls] == [2]
    assert isinstance(done[1], asyncio.CancelledError)
    assert [done[0], done[2]] == in_order(2)
    assert await c.tokens(KEY, BUDGET) == 8, "the one left out took nothing"
    await c.aclose()


async def test_a_caller_cancelled_while_its_batch_is_in_flight_gives_its_token_back(any_redis, prefix):  # noqa: F811
    c, recorded = coordinator(any_redis.url, prefix)
    recorded.gate.clear()
    tasks = [asyncio.ensure_future(admit(c)) for _ in range(3)]
    while not recorded.calls:  # the batch is sent and held
        await asyncio.sleep(0)
    assert all(t in c.in_flight for t in tasks), "its callers are mid-command"
    tasks[0].cancel()
    recorded.gate.set()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    await settled(c)
    assert [n for _, n in recorded.calls] == [3], "it was sent with the others"
    assert isinstance(done[0], asyncio.CancelledError)
    assert done[1:] == in_order(3)[1:], "the others keep their answers and their order"
    assert await c.tokens(KEY, BUDGET) == 8, "three taken, the cancelled caller's given back"
    await c.aclose()


async def test_on_a_cluster_each_call_holds_one_slots_keys(request, prefix):  # noqa: F811
    cluster = request.getfixturevalue("redis_cluster")
    c, recorded = coordinator(cluster.url, prefix)
    keys = [CoordKey(provider, model) for provider in ("anthropic", "openai", "google")
            for model in ("m1", "m2")]
    answers = await asyncio.gather(*(admit(c, k) for k in keys for _ in range(5)))
    assert sorted(n for _, n in recorded.calls) == [5] * len(keys), "one call per key"
    slots = [{key_slot(name.encode()) for name in names} for names, _ in recorded.calls]
    assert all(len(s) == 1 for s in slots), "every call's keys in one slot"
    assert len({s.pop() for s in slots}) == len(keys), "each key in a slot of its own here"
    assert answers == in_order(5) * len(keys), "each key's callers answered in order"
    await c.aclose()
