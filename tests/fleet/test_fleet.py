"""The coordinator's semantics, the same tests on the in-process and the Redis implementation
(the Redis one against a real ``redis-server`` of the tests' own and against a real
three-master Redis Cluster, SPEC §15.10): budget, cooldowns, marks, Redis addresses."""

from __future__ import annotations

import os

import pytest

from fsm.fleet import (DEFAULT_CREDENTIAL, BudgetSettings, Coordinator, CoordKey,
                       InProcessCoordinator, RedisCoordinator, coordinator_from_url,
                       credential_id, default_coordinator, redact_url)
from fsm.core.settings import SettingsError
from fleet_support import any_redis, prefix, redis_server  # noqa: F401 (fixtures)

NOW = 1_800_000_000_000
KEY = CoordKey("anthropic", "claude-x", credential_id("sk-secret"))
OTHER = CoordKey("anthropic", "claude-y", credential_id("sk-secret"))


@pytest.fixture(params=["in-process", "redis", "cluster"])
async def coord(request, prefix):  # noqa: F811
    if request.param == "in-process":
        c = InProcessCoordinator()
    else:
        server = request.getfixturevalue("redis_cluster" if request.param == "cluster" else "redis_server")
        c = RedisCoordinator.from_url(server.url, prefix=prefix)
    yield c
    await c.aclose()


async def tokens(c, key, budget) -> float:
    got = c.tokens(key, budget)
    return await got if hasattr(got, "__await__") else got


# -- the values ----------------------------------------------------------------------------

def test_credential_id_is_a_short_hash_never_the_key():
    """A credential is named by 16 hex digits of its SHA-256; no key, no key prefix."""
    cid = credential_id("sk-ant-very-secret-key")
    assert len(cid) == 16 and all(ch in "0123456789abcdef" for ch in cid)
    assert "sk" not in cid and cid == credential_id("sk-ant-very-secret-key")
    assert cid != credential_id("sk-ant-very-secret-kez")
    assert credential_id(None) == credential_id("") == DEFAULT_CREDENTIAL
    with pytest.raises(TypeError, match="api_key"):
        credential_id(42)


def test_coord_key_rejects_empty_parts():
    """An empty provider, model or credential is refused, naming the field."""
    with pytest.raises(ValueError, match="CoordKey.model"):
        CoordKey("p", "")
    assert CoordKey("p", "m").credential == DEFAULT_CREDENTIAL


def test_the_budget_settings_are_the_retry_settings_own():
    """``retry.budget`` is validated where the other settings are (``fsm.core.settings``)."""
    import fsm.core.settings
    assert BudgetSettings is fsm.core.settings.BudgetSettings
    with pytest.raises(SettingsError, match=r"retry\.budget\.maxTokens"):
        BudgetSettings(max_tokens=0)


async def test_a_tiny_ratio_still_gives_back_a_thousandth():
    """A ratio below 0.001 still credits one thousandth of a token."""
    c = InProcessCoordinator()
    budget = BudgetSettings(max_tokens=2, token_ratio=0.0001)
    c.take_retry_token_sync(KEY, budget)
    await c.credit_success(KEY, budget)
    assert c.tokens(KEY, budget) == 1.001


# -- the budget (gRPC retry throttling) ----------------------------------------------------

async def test_budget_starts_full_and_allows_while_above_half(coord):
    """max 10: takes leave 9, 8, 7, 6 (allowed: above 5), then 5, 4, ... (refused)."""
    budget = BudgetSettings(max_tokens=10)
    answers = [await coord.take_retry_token(KEY, budget) for _ in range(7)]
    assert answers == [True, True, True, True, False, False, False]
    assert await tokens(coord, KEY, budget) == 3


async def test_budget_never_goes_below_zero_and_recovers_by_ratio(coord):
    """The count stops at 0, refills by tokenRatio per success, and is capped at maxTokens."""
    budget = BudgetSettings(max_tokens=4, token_ratio=0.5)
    answers = [await coord.take_retry_token(KEY, budget) for _ in range(10)]
    assert answers == [True] + [False] * 9
    assert await tokens(coord, KEY, budget) == 0
    for _ in range(5):
        await coord.credit_success(KEY, budget)
    assert await tokens(coord, KEY, budget) == 2.5
    # count after a take: 1.5, not above 2
    assert await coord.take_retry_token(KEY, budget) is False
    for _ in range(100):
        await coord.credit_success(KEY, budget)
    assert await tokens(coord, KEY, budget) == 4, "capped at max_tokens"
    assert await coord.take_retry_token(KEY, budget) is True  # 3 > 2


async def test_budget_ratio_is_exact_in_thousandths(coord):
    """Ten credits of 0.1 are one token exactly (milli-tokens, as gRPC counts them)."""
    budget = BudgetSettings(max_tokens=10, token_ratio=0.1)
    for _ in range(10):
        await coord.take_retry_token(KEY, budget)
    for _ in range(10):
        await coord.credit_success(KEY, budget)
    assert await tokens(coord, KEY, budget) == 1.0


async def test_returned_token_undoes_a_take_and_is_capped(coord):
    """A returned token undoes its take, never beyond maxTokens."""
    budget = BudgetSettings(max_tokens=2)
    assert await coord.take_retry_token(KEY, budget) is False  # 1 is not above 1
    await coord.return_retry_token(KEY, budget)
    assert await tokens(coord, KEY, budget) == 2
    await coord.return_retry_token(KEY, budget)
    assert await tokens(coord, KEY, budget) == 2


async def test_buckets_are_per_key(coord):
    """Each (provider, model, credential) has its own bucket."""
    budget = BudgetSettings(max_tokens=2)
    await coord.take_retry_token(KEY, budget)
    assert await tokens(coord, OTHER, budget) == 2
    assert await tokens(coord, KEY, budget) == 1


async def test_a_smaller_max_caps_a_bigger_bucket(coord):
    """A bucket read with a smaller maxTokens is capped to it."""
    await coord.take_retry_token(KEY, BudgetSettings(max_tokens=100))
    assert await coord.take_retry_token(KEY, BudgetSettings(max_tokens=4)) is True  # 3 > 2
    assert await tokens(coord, KEY, BudgetSettings(max_tokens=4)) == 3


async def test_idle_bucket_is_full_again():
    """A bucket unused for bucket_idle_ms on the coordinator's clock is full again."""
    clock = [0.0]
    c = InProcessCoordinator(bucket_idle_ms=1000, monotonic_ms=lambda: clock[0])
    budget = BudgetSettings(max_tokens=2)
    await c.take_retry_token(KEY, budget)
    clock[0] = 999
    assert c.tokens(KEY, budget) == 1
    clock[0] = 1999
    assert c.tokens(KEY, budget) == 2


async def test_redis_bucket_is_kept_when_full_and_expires_after_a_week(any_redis, prefix):  # noqa: F811
    """A bucket is never deleted when full (absent would mean "full" to anyone); unused, it
    expires after BUCKET_TTL_MS."""
    from fsm.fleet._redis import BUCKET_TTL_MS
    c = RedisCoordinator.from_url(any_redis.url, prefix=prefix, bucket_idle_ms=60_000)
    budget = BudgetSettings(max_tokens=4)
    await c.admit(KEY, retry=True, budget=budget, pacing=None)
    ttl = await c.client.pttl(c.keys.bucket(KEY))
    assert BUCKET_TTL_MS - 5_000 < ttl <= BUCKET_TTL_MS
    for _ in range(10):
        await c.record_outcome(KEY, success=True, throttled=False, budget=budget, pacing=None)
    assert await c.client.hget(c.keys.bucket(KEY), "m") == b"4000", "a full bucket is kept"
    await c.aclose()


async def test_admit_reads_the_cooldown_and_takes_a_token_in_one_step(coord):
    """One step: the cooldown left, and for a retry the budget's take; a first request takes
    no token."""
    budget = BudgetSettings(max_tokens=4)
    first = await coord.admit(KEY, retry=True, budget=budget, pacing=None)
    assert (first.cooldown_ms, first.budget, first.token_taken) == (0, True, True)  # 3 > 2
    await coord.learn_cooldown(KEY, 7_000)
    second = await coord.admit(KEY, retry=True, budget=budget, pacing=None)
    assert 6_000 < second.cooldown_ms <= 7_000 and second.budget is False  # 2
    assert second.token_taken is False, "a refused retry holds nothing to give back"
    third = await coord.admit(KEY, retry=False, budget=budget, pacing=None)
    assert 6_000 < third.cooldown_ms <= 7_000 and third.budget is None
    assert await tokens(coord, KEY, budget) == 2, "a first request takes no token"


# -- cooldowns -----------------------------------------------------------------------------

async def test_cooldown_keeps_the_later_end(coord):
    """Durations in, time left out; the later end wins; keys are separate."""
    assert (await coord.admit(KEY, retry=False, budget=None, pacing=None)).cooldown_ms == 0
    await coord.learn_cooldown(KEY, 30_000)
    await coord.learn_cooldown(KEY, 10_000)
    left = (await coord.admit(KEY, retry=False, budget=None, pacing=None)).cooldown_ms
    assert 29_000 < left <= 30_000
    await coord.learn_cooldown(KEY, 45_000)
    left = (await coord.admit(KEY, retry=False, budget=None, pacing=None)).cooldown_ms
    assert 44_000 < left <= 45_000
    assert (await coord.admit(OTHER, retry=False, budget=None, pacing=None)).cooldown_ms == 0


async def test_cooldown_of_zero_or_less_is_not_recorded(coord):
    """A duration of 0 or below records nothing."""
    await coord.learn_cooldown(KEY, 0)
    await coord.learn_cooldown(KEY, -5_000)
    assert (await coord.admit(KEY, retry=False, budget=None, pacing=None)).cooldown_ms == 0


async def test_redis_cooldown_key_expires_with_the_cooldown(any_redis, prefix):  # noqa: F811
    """A cooldown is a key whose PX expiry is the cooldown; a shorter one does not shorten it."""
    c = RedisCoordinator.from_url(any_redis.url, prefix=prefix)
    await c.learn_cooldown(KEY, 20_000)
    ttl = await c.client.pttl(c.keys.cooldown(KEY))
    assert 19_000 < ttl <= 20_000
    await c.learn_cooldown(KEY, 50)  # shorter: keeps 20 s
    assert await c.client.pttl(c.keys.cooldown(KEY)) > 19_000
    await c.learn_cooldown(OTHER, 30)
    import asyncio
    await asyncio.sleep(0.08)
    assert await c.client.exists(c.keys.cooldown(OTHER)) == 0, "expired with the cooldown"
    await c.aclose()


async def test_redis_keys_do_not_collide_on_colons(any_redis, prefix):  # noqa: F811
    """Redis keys do not collide on colons."""
    c = RedisCoordinator.from_url(any_redis.url, prefix=prefix)
    a, b = CoordKey("p:q", "m"), CoordKey("p", "q:m")
    assert c.keys.cooldown(a) != c.keys.cooldown(b)
    await c.learn_cooldown(a, 1000)
    assert await c.cooldown_left(b) == 0 and await c.cooldown_left(a) > 0
    await c.aclose()


def test_prefix_and_url_are_checked():
    """Colons inside names cannot make two keys share a Redis key."""
    with pytest.raises(ValueError, match="prefix"):
        RedisCoordinator.from_url("redis://127.0.0.1:1/0", prefix="a b")
    with pytest.raises(ValueError, match=r"redis\+cluster://HOST:PORT,HOST:PORT \(a Redis Cluster\), "
                                         r"got 'http://u:\*\*\*@h'"):
        coordinator_from_url("http://u:pw@h")
    assert redact_url("redis://user:pw@host:1/0") == "redis://user:***@host:1/0"
    assert "pw" not in repr(RedisCoordinator.from_url("redis://:pw@127.0.0.1:1/0"))
    with pytest.raises(ValueError, match="bucket_idle_ms"):
        InProcessCoordinator(bucket_idle_ms=0)


def test_a_cluster_url_selects_a_cluster_client_with_its_nodes_and_credentials():
    """docs/fleet.md "A Redis Cluster", SPEC §15.13: ``redis+cluster://`` with several nodes is
    a redis-py ``RedisCluster`` over those nodes (``USER:PASSWORD@`` for each, ``rediss+`` for
    TLS, database 0 allowed); ``redis://`` stays one Redis. Nothing connects here."""
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster
    from fsm.fleet._redis import cluster_address
    c = RedisCoordinator.from_url("redis+cluster://127.0.0.1:7000,127.0.0.1:7001/0", prefix="p")
    assert isinstance(c.client, RedisCluster) and c.cluster
    assert sorted(n.name for n in c.client.nodes_manager.startup_nodes.values()) == [
        "127.0.0.1:7000", "127.0.0.1:7001"]
    one = RedisCoordinator.from_url("redis://127.0.0.1:7000/3", prefix="p")
    assert isinstance(one.client, Redis) and not one.cluster
    assert cluster_address("rediss+cluster://me:s%40cret@h1:1,[::1]:2,h3?db=0") == {
        "nodes": [("h1", 1), ("::1", 2), ("h3", 6379)], "username": "me", "password": "s@cret",
        "ssl": True}
    guarded = coordinator_from_url("redis+cluster://:pw@127.0.0.1:7000,127.0.0.1:7001")
    assert "pw" not in repr(guarded.inner) and guarded.inner.cluster


@pytest.mark.parametrize("url, words", [
    ("redis+cluster://h1:7000,h2:7001/3", "only database 0, got database '3'"),
    ("redis+cluster://h1:7000?db=1", "only database 0, got database '1'"),
    ("redis+cluster://h1:7000/x", "whole number, got 'x'"),
    ("redis+cluster://h1:7000,,h2:7001", "a cluster node must be HOST:PORT, got ''"),
    ("redis+cluster://h1:7000,h2:seven", "1..65535, got 'seven'"),
    ("redis+cluster://h1:0", "1..65535, got '0'"),
    ("redis+cluster://h1:7000?ssl=yes", "no parameter but db, got 'ssl'"),
    ("redis+cluster://u:pw@", "a cluster node must be HOST:PORT, got ''"),
    ("redis+cluster://h1:7000,my host:7001", "a cluster node must be HOST:PORT, got 'my host:7001'"),
    ("redis://my host:6379/0", "a host name holds no space, got 'my host'"),
], ids=["db3", "db_param", "db_word", "empty_node", "port_word", "port_0", "param", "no_node",
        "space_in_host", "space_in_one_host"])
def test_a_bad_cluster_url_is_refused_naming_the_value(url, words):
    """SPEC §15.13: a cluster has only database 0, so any other is refused (not quietly
    ignored), as is a node that is not HOST:PORT; the error names the value and hides the
    password."""
    with pytest.raises(ValueError, match="Redis address") as info:
        coordinator_from_url(url)
    assert words in str(info.value) and "pw" not in str(info.value)


@pytest.mark.parametrize("url", [
    "redis+cluster://:Xq7/Lm9+Zp@h1:7000,h2:7001",   # a base64 password: "/" not encoded
    "redis+cluster://u:Xq7?Lm9Zp@h1:7000",
    "redis+cluster://u:Xq7#Lm9Zp@h1:7000/1",
    "redis://:Xq7/Lm9+Zp@h1:6379/0",
    "redis://u:Xq7?Lm9Zp@h1:6379",
    "rediss://:Xq7#Lm9Zp@h1:6379",
    "redis+clustr://:Xq7/Lm9+Zp@h1:7000",            # a misspelt scheme
    ":Xq7/Lm9+Zp@h1:6379",                           # no scheme
], ids=["cluster_slash", "cluster_query", "cluster_hash", "one_slash", "one_query", "tls_hash",
        "bad_scheme", "no_scheme"])
def test_a_password_with_a_reserved_character_is_never_shown(url):
    """SPEC §15.13 "Redis URLs", STYLE "no secret in an error": a password holding a ``/``,
    ``?`` or ``#`` that is not percent-encoded ends the host for a URL's parser, so the
    address is refused; the error shows no piece of the password (it showed the parts the
    parser took for a node, a path or a query) and says to percent-encode them."""
    with pytest.raises(ValueError, match="Redis address") as info:
        coordinator_from_url(url)
    text = str(info.value)
    assert not any(piece in text for piece in ("Xq7", "Lm9", "Zp")), text
    assert "h1" in text


def test_a_password_holding_an_at_sign_is_masked_whole():
    """fsm.core.redact.redact_url (SPEC §15.13): the user information runs to the last ``@``,
    as the client reads it, so ``u:p@ss@host`` (accepted: the password is ``p@ss``) shows no
    piece of the password in the coordinator's repr; nor do two nodes that each carry it."""
    from fsm.fleet._redis import cluster_address
    assert cluster_address("redis+cluster://u:Xq7@Lm9@h1:7000")["password"] == "Xq7@Lm9"
    for url in ("redis+cluster://u:Xq7@Lm9@h1:7000", "redis://u:Xq7@Lm9@127.0.0.1:6379/0",
                "redis+cluster://:Xq7@h1:7000,:Xq7@h2:7001"):
        shown = repr(coordinator_from_url(url, guarded=False))
        assert "Xq7" not in shown and "Lm9" not in shown, shown


def test_the_cli_refuses_a_bad_cluster_url_in_one_line_with_status_2(tmp_path):
    """docs/fleet.md "A Redis Cluster": ``--redis`` takes a cluster URL; a database other
    than 0 there is a one-line error naming it, status 2, before anything starts."""
    import subprocess
    import sys
    from support import env
    proc = subprocess.run([sys.executable, "-m", "fsm", "rpc", "--model", "m", "--no-session",
                           "--redis", "redis+cluster://:pw@127.0.0.1:7000,127.0.0.1:7001/2"],
                          input="", capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=30)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "bad --redis" in proc.stderr and "only database 0, got database '2'" in proc.stderr
    assert "pw" not in proc.stderr


# -- credential marks ----------------------------------------------------------------------

async def test_marks_keep_the_later_end_and_expire(coord):
    """Credential marks: durations in, ms left out, the later end wins, per provider."""
    await coord.mark_credential_limited("p", "c1", 5_000)
    await coord.mark_credential_limited("p", "c1", 1_000)
    await coord.mark_credential_limited("p", "c2", 2_000)
    await coord.mark_credential_limited("q", "c3", 2_000)
    left = await coord.limited_credentials("p")
    assert set(left) == {"c1", "c2"}
    assert 4_000 < left["c1"] <= 5_000 and 1_000 < left["c2"] <= 2_000
    assert await coord.limited_credentials("nobody") == {}
    await coord.mark_credential_limited("p", "c4", 0)
    assert "c4" not in await coord.limited_credentials("p")


async def test_in_process_marks_expire_on_the_hosts_clock():
    """The in-process coordinator counts on the clock it is given."""
    clock = [0.0]
    c = InProcessCoordinator(clock=lambda: clock[0])
    await c.mark_credential_limited("p", "c1", 5_000)
    await c.mark_credential_limited("p", "c2", 2_000)
    clock[0] = 2_000
    assert await c.limited_credentials("p") == {"c1": 3_000}
    clock[0] = 5_000
    assert await c.limited_credentials("p") == {}


def test_coordinator_protocol_and_the_default():
    """Both coordinators satisfy the protocol; the default is one per process."""
    assert isinstance(InProcessCoordinator(), Coordinator)
    assert isinstance(RedisCoordinator.from_url("redis://127.0.0.1:1/0"), Coordinator)
    assert default_coordinator() is default_coordinator()
    assert coordinator_from_url(None) is default_coordinator()
    assert coordinator_from_url("memory:") is default_coordinator()
    assert isinstance(coordinator_from_url("redis://127.0.0.1:1/0", guarded=False), RedisCoordinator)


async def test_in_process_sweeps_dead_entries():
    """Expired cooldowns and idle buckets are swept once the tables grow."""
    c = InProcessCoordinator()
    for i in range(1100):
        await c.learn_cooldown(CoordKey("p", f"m{i}"), NOW + 1, NOW)
    await c.learn_cooldown(KEY, NOW + 10, NOW + 5)
    assert len(c._cooldowns) < 1100
    clock = [0.0]
    c = InProcessCoordinator(bucket_idle_ms=10, monotonic_ms=lambda: clock[0])
    for i in range(1100):
        await c.take_retry_token(CoordKey("p", f"m{i}"), BudgetSettings())
    clock[0] = 100
    await c.take_retry_token(KEY, BudgetSettings())
    assert len(c._buckets) == 1


async def test_many_concurrent_calls_share_a_few_connections(redis_server, prefix):  # noqa: F811
    """250 sessions' decisions at once go through at most ``max_connections`` connections."""
    import asyncio
    c = RedisCoordinator.from_url(redis_server.url, prefix=prefix, max_connections=4)
    answers = await asyncio.gather(*(c.admit(KEY, retry=True, budget=BudgetSettings(max_tokens=1000),
                                             pacing=None) for _ in range(250)))
    assert sorted({a.budget for a in answers}) == [True]
    assert await tokens(c, KEY, BudgetSettings(max_tokens=1000)) == 750
    clients = await c.client.client_list()
    assert len(clients) <= 4, "only the pool's connections (the other tests closed theirs)"
    await c.aclose()


def test_the_keys_of_one_coordinator_key_share_one_cluster_slot():
    """docs/fleet.md "A Redis Cluster (and Valkey)", SPEC §15.10: every script touches one
    slot, so the five keys of one (provider, model, credential) hash to one slot, whatever
    the names hold (colons, braces that would end a hash tag early, spaces); two keys spread."""
    from redis.crc import key_slot
    from fsm.fleet._redis import KeySpace
    space = KeySpace("p")
    for key in [KEY, CoordKey("a}b", "{c}:d", "e f"), CoordKey("x", "}", "{"), CoordKey("o", "m{")]:
        assert len({key_slot(name.encode()) for name in space.of(key)}) == 1, key
    slots = {key_slot(space.cooldown(CoordKey("p", f"model-{i}")).encode()) for i in range(50)}
    assert len(slots) > 40, "different keys spread over the slots"


def test_throwaway_server_reports_a_missing_or_failing_binary(monkeypatch):
    """The test server names a missing or failing redis-server."""
    from fsm.fleet import server
    with pytest.raises(RuntimeError, match="redis-server exited with 1"):
        server.RedisServer(binary="false").start()
    monkeypatch.setattr(server.shutil, "which", lambda name: None)
    with pytest.raises(FileNotFoundError, match="make setup"):
        server.RedisServer()
    with pytest.raises(FileNotFoundError, match="redis-cli not found"):
        server.RedisClusterServer()
    with pytest.raises(ValueError, match="at least one master, got 0"):
        server.RedisClusterServer(masters=0)


def test_a_throwaway_server_that_fails_to_start_leaves_no_folder(monkeypatch):
    """fsm.fleet.server: a redis-server that exits at once, a port already taken and a
    cluster whose redis-server is missing leave no temporary folder behind (each stayed in
    /tmp, one per test run); the server starts again after a failed start."""
    import socket
    import tempfile
    from fsm.fleet import server
    made: list[str] = []
    real = tempfile.mkdtemp

    def mkdtemp(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]
    monkeypatch.setattr(server.tempfile, "mkdtemp", mkdtemp)
    with pytest.raises(RuntimeError, match="redis-server exited with 1"):
        server.RedisServer(binary="false").start()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        again = server.RedisServer(port=taken.getsockname()[1])
        with pytest.raises(RuntimeError, match="redis-server exited"):
            again.start()
    with again.start():  # the port is free now: the same object starts
        assert again.process is not None and again.process.poll() is None
    which = server.shutil.which
    monkeypatch.setattr(server.shutil, "which", lambda name: None if name == "redis-server" else which(name))
    with pytest.raises(FileNotFoundError, match="redis-server not found"):
        server.RedisClusterServer()
    assert len(made) == 3 and not any(os.path.exists(path) for path in made), made


async def test_warm_up_loads_the_scripts_and_opens_connections(any_redis, prefix):  # noqa: F811
    """Warm up loads the scripts and opens connections."""
    c = RedisCoordinator.from_url(any_redis.url, prefix=prefix)
    await c.client.script_flush()
    await c.warm_up(connections=3)
    shas = [s.sha for s in c._scripts.values()]
    assert await c.client.script_exists(*shas) == [True] * len(shas)
    await c.aclose()


def test_max_connections_is_checked():
    """warm_up loads every script into the server."""
    with pytest.raises(ValueError, match="max_connections"):
        RedisCoordinator.from_url("redis://127.0.0.1:1/0", max_connections=0)
