"""Shared by the fleet tests: a real ``redis-server`` of the tests' own, a real three-master
Redis Cluster, and worker processes.

The server is :class:`fsm.fleet.server.RedisServer`: a free loopback port, a temporary
folder, no persistence, stopped at the end. The cluster is the ``redis_cluster`` fixture of
``tests/fleet/conftest.py`` (a conftest's, so that one cluster serves the whole session).
Neither is ever skipped: ``make test`` installs the binaries (``make setup``'s ``.redis``
step). The fleet's behaviour tests take :func:`any_redis`, so they run against both (SPEC
§15.10).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from fsm.fleet.server import RedisServer
from support import ROOT, env

WORKER = Path(__file__).with_name("fleet_worker.py")


@pytest.fixture(scope="module")
def redis_server():
    """One server for a test module (tests keep apart through their own key prefix)."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module", params=["redis", "cluster"])
def any_redis(request):
    """One Redis, then the three-master cluster: a test taking this runs on both (SPEC §15.10).
    Either has ``url`` (``redis://...`` or ``redis+cluster://...``)."""
    return request.getfixturevalue("redis_cluster" if request.param == "cluster" else "redis_server")


@pytest.fixture
def own_redis():
    """A server for one test, which may kill, pause or restart it."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test's own."""
    return f"t-{uuid.uuid4().hex[:12]}"


class Worker:
    """``tests/fleet_worker.py`` in its own process: it runs ``ops`` (a list of
    ``[op, args...]``) against ``url`` and prints one JSON answer per op.

    With ``wait_go=True`` it first prints ``"ready"`` and blocks until the test calls
    :meth:`go` (a Redis list pop), so that several workers start their ops together.
    """

    def __init__(self, url: str, prefix: str, ops: list, *, wait_go: bool = False,
                 credentials: dict | None = None) -> None:
        spec = {"url": url, "prefix": prefix, "ops": ops, "wait_go": wait_go,
                "credentials": credentials}
        self.proc = subprocess.Popen([sys.executable, str(WORKER), json.dumps(spec)],
                                     cwd=ROOT, env=env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        if wait_go:
            line = self.proc.stdout.readline().strip()
            assert line == '"ready"', (line, self.proc.stderr.read())

    def results(self, timeout: float = 30) -> list:
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err
        return [json.loads(line) for line in out.splitlines() if line.strip()]


def sync_client(url: str):
    """A blocking redis-py client on ``url``: one Redis, or a Redis Cluster's
    ``redis.cluster.RedisCluster`` for a ``redis+cluster://`` URL."""
    import redis
    from fsm.fleet._redis import cluster_client, is_cluster_url
    return cluster_client(url, 60, asyncio=False) if is_cluster_url(url) else redis.Redis.from_url(url)


def release(url: str, prefix: str, workers: int) -> None:
    """Let ``workers`` waiting workers go at once."""
    client = sync_client(url)
    try:
        client.rpush(f"{prefix}:test-go", *["go"] * workers)
    finally:
        client.close()


def run_all(url: str, prefix: str, ops_per_worker: list[list], *, together: bool = True,
            credentials: dict | None = None) -> list[list]:
    """Start one worker per ops list (all waiting), release them together, collect answers."""
    workers = [Worker(url, prefix, ops, wait_go=together, credentials=credentials)
               for ops in ops_per_worker]
    if together:
        release(url, prefix, len(workers))
    return [w.results() for w in workers]
