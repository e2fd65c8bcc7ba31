"""The fleet tests' Redis Cluster: one for the whole session.

A session-scoped fixture imported into several test modules (as ``fleet_support``'s are)
would be one fixture per module, each starting its own cluster; defined here, it is one.
"""

from __future__ import annotations

import pytest

from fsm.fleet.server import RedisClusterServer


@pytest.fixture(scope="session")
def redis_cluster():
    """A three-master Redis Cluster (:class:`fsm.fleet.server.RedisClusterServer`: free
    loopback ports, no persistence, joined by ``redis-cli --cluster create``), started when a
    test first asks for it (about two seconds) and stopped, its files removed, at the end of
    the session. Tests keep apart by their key prefix (SPEC §15.10)."""
    with RedisClusterServer() as cluster:
        yield cluster
