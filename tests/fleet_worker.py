"""A fleet process for the tests: ``python tests/fleet_worker.py SPEC_JSON``.

SPEC: ``{"url", "prefix", "ops": [[op, args...], ...], "wait_go": bool, "credentials"}``.
Prints one JSON line per op (its answer). Ops (coordinator protocol v3: durations in, time
left out): ``learn PROVIDER MODEL DURATION_MS``, ``left PROVIDER MODEL`` (ms left), ``take N
MAX_TOKENS`` (how many of N retries were admitted), ``credit N MAX_TOKENS``, ``mark PROVIDER
CRED DURATION_MS``, ``limited PROVIDER`` (id -> ms left), ``key PROVIDER SESSION``
(the store's key for the session, as its credential id), ``limit PROVIDER SESSION MS`` (the
store's mark-and-switch).
"""

from __future__ import annotations

import asyncio
import json
import sys

from fsm.fleet import BudgetSettings, CoordKey, RedisCoordinator, RedisCredentialStore, credential_id


async def main(spec: dict) -> None:
    coord = RedisCoordinator.from_url(spec["url"], prefix=spec["prefix"])
    store = None
    if spec.get("credentials"):
        store = RedisCredentialStore(spec["credentials"], url=spec["url"], prefix=spec["prefix"])
    if spec.get("wait_go"):
        await coord.ping()
        print(json.dumps("ready"), flush=True)
        import redis.asyncio
        from fsm.fleet._redis import cluster_client, is_cluster_url
        if is_cluster_url(spec["url"]):  # a Redis Cluster (SPEC §15.10)
            barrier = cluster_client(spec["url"], 60)
        else:
            barrier = redis.asyncio.Redis.from_url(spec["url"], socket_timeout=60)  # may wait long
        await barrier.blpop([f"{spec['prefix']}:test-go"], timeout=30)
        await barrier.aclose()
    for op, *args in spec["ops"]:
        if op == "learn":
            answer = await coord.learn_cooldown(CoordKey(args[0], args[1]), args[2])
        elif op == "left":
            answer = await coord.cooldown_left(CoordKey(args[0], args[1]))
        elif op == "take":
            budget = BudgetSettings(max_tokens=args[1])
            answer = 0
            for _ in range(args[0]):
                admitted = await coord.admit(CoordKey("p", "m"), retry=True, budget=budget, pacing=None)
                answer += bool(admitted.budget)
        elif op == "credit":
            budget = BudgetSettings(max_tokens=args[1])
            for _ in range(args[0]):
                await coord.record_outcome(CoordKey("p", "m"), success=True, throttled=False,
                                           budget=budget, pacing=None)
            answer = None
        elif op == "mark":
            answer = await coord.mark_credential_limited(args[0], args[1], args[2])
        elif op == "limited":
            answer = await coord.limited_credentials(args[0])
        elif op == "key":
            answer = credential_id(await store.aapi_key(args[0], args[1]))
        elif op == "skey":
            answer = credential_id(store.api_key(args[0], args[1]))
        elif op == "limit":
            answer = await store.amark_usage_limit_reached(args[0], args[1], args[2])
        else:
            raise SystemExit(f"unknown op {op!r}")
        print(json.dumps(answer), flush=True)
    if store is not None:
        await store.aclose()
    await coord.aclose()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
