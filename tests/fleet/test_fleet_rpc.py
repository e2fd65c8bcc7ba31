"""Two ``python -m fsm rpc --redis URL`` processes against one fault server share a hint
(docs/policy.md §9): the second process's retry waits out the cooldown the first one learned,
and killing Redis mid-chain leaves every chain ending normally."""

import json
import subprocess
import sys
import time

import pytest

from fsm.testing.fault_server import FaultServer
from fleet_support import own_redis, redis_server  # noqa: F401  (fixtures)
from support import ROOT, env, stop_process

pytestmark = pytest.mark.subprocess

HINTED = {"status": 429, "headers": {"retry-after": "4"},
          "json": {"error": {"message": "Rate limit reached", "type": "rate_limit_error"}}}
OVERLOADED = {"status": 529, "json": {"type": "error", "error": {"type": "overloaded_error",
                                                                  "message": "Overloaded"}}}


def start_rpc(base_url, redis_url, settings_path):
    return subprocess.Popen(
        [sys.executable, "-m", "fsm", "rpc", "--base-url", base_url, "--model", "m",
         "--api-key", "sk-fleet-test", "--settings", str(settings_path), "--no-session",
         "--redis", redis_url],
        cwd=ROOT, env=env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)


def send(proc, obj):
    proc.stdin.write(json.dumps(obj) + "\n")
    proc.stdin.flush()


def read_until(proc, kind, timeout=120):  # a hang guard, not a margin
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        event = json.loads(line)
        seen.append(event)
        if event.get("type") == kind:
            return event, seen
    raise AssertionError(f"no {kind} within {timeout} s; saw {[e.get('type') for e in seen]}")


def test_two_rpc_processes_share_a_hint_through_redis(redis_server, tmp_path):  # noqa: F811
    """Two RPC processes share a hint through Redis."""
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"retry": {"retryHints": "honor", "baseDelayMs": 100}}))
    with FaultServer([HINTED, OVERLOADED]) as server:
        first = start_rpc(server.base_url, redis_server.url, settings)
        second = start_rpc(server.base_url, redis_server.url, settings)
        try:
            send(first, {"type": "prompt", "message": "hi"})
            start_a, _ = read_until(first, "auto_retry_start")
            assert start_a["delaySource"] == "hint" and start_a["delayMs"] >= 4000
            send(second, {"type": "prompt", "message": "hi"})
            start_b, _ = read_until(second, "auto_retry_start")
            assert start_b["delaySource"] == "cooldown", start_b
            # the second process waits out the first one's cooldown: its retry goes when the
            # first one's does (one machine's clock; however long its own start-up took)
            assert start_b["delayMs"] > 0
            assert abs(start_b["retryAt"] - start_a["retryAt"]) < 300, (start_a, start_b)
            end_a, _ = read_until(first, "auto_retry_end")
            end_b, _ = read_until(second, "auto_retry_end")
            assert end_a["success"] and end_b["success"]
        finally:
            stop_process(first)
            stop_process(second)


def test_killing_redis_mid_chain_leaves_the_chain_ending_normally(own_redis, tmp_path):  # noqa: F811
    """Killing Redis mid chain leaves the chain ending normally."""
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"retry": {"retryHints": "honor", "baseDelayMs": 300,
                                              "budget": {"maxTokens": 10}}}))
    with FaultServer([OVERLOADED, OVERLOADED]) as server:
        proc = start_rpc(server.base_url, own_redis.url, settings)
        try:
            send(proc, {"type": "prompt", "message": "hi"})
            read_until(proc, "auto_retry_start")
            own_redis.kill()
            end, seen = read_until(proc, "auto_retry_end")
            assert end["success"] is True and end["attempt"] == 2
            types = [e.get("type") for e in seen]
            assert types.count("coordinator_unavailable") == 1
        finally:
            assert stop_process(proc) == 0
