"""The Redis-backed credential store: keys stay local, marks are the fleet's (on one Redis and on
a three-master Redis Cluster, SPEC §15.10)."""

from __future__ import annotations

import json

import pytest

from fsm.host.credentials import DEFAULT_BLOCK_MS
from fsm.fleet import (GuardedCoordinator, InProcessCoordinator, RedisCoordinator, RedisCredentialStore,
                       credential_id, load_credentials)
from fleet_support import any_redis, prefix, redis_server  # noqa: F401 (fixtures)

NOW = 1_800_000_000_000
KEYS = {"openai": ["sk-one", "sk-two", "sk-three"], "solo": ["sk-solo"]}


def near(got: dict, want: dict, slack_ms: int = 200) -> bool:
    """Same credentials; each end at most ``slack_ms`` before the one wanted (Redis counts
    the time left on its own clock, which moves on while the test runs)."""
    return got.keys() == want.keys() and all(want[k] - slack_ms <= got[k] <= want[k] for k in want)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def make(any_redis, prefix, clock):  # noqa: F811
    made = []

    def build(**kw):
        store = RedisCredentialStore(KEYS, url=any_redis.url, prefix=prefix, clock=clock, **kw)
        made.append(store)
        return store
    yield build
    for store in made:
        store.close()


def test_rotation_in_order_and_shared_by_stores(make, clock):
    """Rotation in order and shared by stores."""
    a, b = make(), make()  # two processes' stores on the same Redis
    assert a.credential_count("openai") == 3 and a.credential_count("nobody") == 0
    assert a.api_key("openai", "s1") == "sk-one"
    assert b.api_key("openai", "t1") == "sk-one"
    assert a.mark_usage_limit_reached("openai", "s1", 30_000) is True
    assert a.api_key("openai", "s1") == "sk-two"
    assert a.api_key("openai", "s2") == "sk-two", "new sessions follow the switch"
    assert b.api_key("openai", "t1") == "sk-two", "the other store skips the marked key"
    assert near(b.blocked_until("openai"), {credential_id("sk-one"): NOW + 30_000})


def test_a_mark_ends_on_the_servers_clock(make):
    """A mark's end is counted by Redis: it is gone once its time has passed."""
    import time
    a, b = make(), make()
    assert a.blocked_until("openai") == b.blocked_until("openai") == {}  # connected, scripts loaded
    assert a.mark_usage_limit_reached("openai", "s1", 250) is True  # room for a loaded machine
    assert credential_id("sk-one") in b.blocked_until("openai")
    time.sleep(0.3)
    a.coordinator.fallback = InProcessCoordinator()  # forget this process's own copy
    b.coordinator.fallback = InProcessCoordinator()
    assert b.blocked_until("openai") == {}


def test_every_key_limited_answers_false_and_the_soonest_free(make, clock):
    """Every key limited answers false and the soonest free."""
    s = make()
    assert s.mark_usage_limit_reached("openai", "s", 50_000) is True   # one -> two
    assert s.mark_usage_limit_reached("openai", "s", 10_000) is True   # two -> three
    assert s.mark_usage_limit_reached("openai", "s", None) is False    # three: 60 s
    assert near(s.blocked_until("openai"), {credential_id(k): NOW + ms for k, ms in
                                           (("sk-one", 50_000), ("sk-two", 10_000), ("sk-three", DEFAULT_BLOCK_MS))})
    assert s.api_key("openai", "s") == "sk-two", "its limit ends first"
    clock.now += 10_000
    assert s.api_key("openai", "s") == "sk-two"
    assert s.mark_usage_limit_reached("solo", "s", 1000) is False
    assert s.api_key("solo", "s") == "sk-solo"


async def test_async_variants_match(make, clock):
    """Async variants match."""
    s = make()
    assert await s.aapi_key("openai", "s") == "sk-one"
    assert await s.amark_usage_limit_reached("openai", "s", 5_000) is True
    assert await s.aapi_key("openai", "s") == "sk-two"
    assert s.api_key("openai", "x") == "sk-two"
    assert await s.aapi_key("nobody", "s") is None
    assert await s.amark_usage_limit_reached("nobody", "s", 5) is False
    assert s.api_key("nobody", "s") is None
    assert s.mark_usage_limit_reached("nobody", "s", 5) is False
    await s.aclose()


async def test_marks_are_the_coordinators_and_no_key_reaches_redis(make, any_redis, prefix):  # noqa: F811
    """Marks are the coordinators and no key reaches Redis."""
    coord = RedisCoordinator.from_url(any_redis.url, prefix=prefix)
    s = make()
    assert await coord.limited_credentials("openai") == s.blocked_until("openai") == {}  # connected
    s.mark_usage_limit_reached("openai", "s", 60_000)
    assert near(await coord.limited_credentials("openai", NOW), {credential_id("sk-one"): NOW + 60_000})
    await coord.mark_credential_limited("openai", credential_id("sk-two"), NOW + 1000, NOW)
    assert s.api_key("openai", "new") == "sk-three"
    names = await coord.client.keys(f"{prefix}:*", **({"target_nodes": "primaries"} if coord.cluster else {}))
    assert names, "the marks are in Redis"
    for name in names:
        members = await coord.client.zrange(name, 0, -1)
        assert not any(b"sk-" in m for m in members) and b"sk-" not in name
    await coord.aclose()


async def test_a_given_coordinator_is_shared(any_redis, prefix, clock):  # noqa: F811
    """A given coordinator is shared."""
    heard: list = []
    g = GuardedCoordinator(RedisCoordinator.from_url(any_redis.url, prefix=prefix))
    s = RedisCredentialStore(KEYS, coordinator=g, on_event=heard.append, clock=clock)
    assert s.coordinator is g
    assert s.mark_usage_limit_reached("openai", "s", 1000) is True
    assert near(await g.limited_credentials("openai", NOW), {credential_id("sk-one"): NOW + 1000})
    g.breaker.failed("test")
    assert heard == [{"type": "coordinator_unavailable", "reason": "test"}]
    await s.aclose()


def test_store_without_redis_only_local(clock):
    """Store without Redis only local."""
    g = GuardedCoordinator(InProcessCoordinator())
    s = RedisCredentialStore(KEYS, coordinator=g, clock=clock)
    assert s.mark_usage_limit_reached("openai", "s", 1000) is True
    assert s.api_key("openai", "s") == "sk-two"
    with pytest.raises(ValueError, match="url= or coordinator="):
        RedisCredentialStore(KEYS)


def test_load_credentials_file_shapes(tmp_path):
    """Load credentials file shapes."""
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({"p": ["k1", "k2"]}))
    store_shape = tmp_path / "store.json"
    store_shape.write_text(json.dumps({"providers": {"p": {"keys": ["k1"]}}}))
    assert load_credentials(flat) == {"p": ["k1", "k2"]}
    assert load_credentials(store_shape) == {"p": ["k1"]}
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ValueError, match="bad.json: not valid JSON"):
        load_credentials(bad)
    with pytest.raises(ValueError, match="missing.json: cannot read"):
        load_credentials(tmp_path / "missing.json")
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"p": []}))
    with pytest.raises(ValueError, match=r"empty.json: credentials\['p'\] is empty"):
        load_credentials(empty)
    s = RedisCredentialStore(flat, url="redis://127.0.0.1:1/0")
    assert s.credential_count("p") == 2
