"""A fleet process for the tests: ``python tests/fleet_worker.py SPEC_JSON``.

SPEC: ``{"url", "prefix", "ops": [[op, args...], ...], "wait_go": bool, "credentials"}``.
Prints one JSON line per op (its answer). Ops: ``learn PROVIDER MODEL UNTIL``, ``left
PROVIDER MODEL``, ``take N MAX_TOKENS`` (how many of N takes were allowed), ``credit N
MAX_TOKENS``, ``mark PROVIDER CRED UNTIL``, ``limited PROVIDER``, ``key PROVIDER SESSION``
(the store's key for the session, as its credential id), ``limit PROVIDER SESSION MS`` (the
store's mark-and-switch).
"""

from __future__ import annotations

import asyncio
import json
import sys

from fsm.fleet import (BudgetSettings, CoordKey, RedisCoordinator, RedisCredentialStore,
                       credential_id, wall_ms)


async def main(spec: dict) -> None:
    coord = RedisCoordinator.from_url(spec["url"], prefix=spec["prefix"])
    store = None
    if spec.get("credentials"):
        store = RedisCredentialStore(spec["credentials"], url=spec["url"], prefix=spec["prefix"])
    if spec.get("wait_go"):
        await coord.ping()
        print(json.dumps("ready"), flush=True)
        import redis.asyncio
        barrier = redis.asyncio.Redis.from_url(spec["url"])  # no socket timeout: may wait long
        await barrier.blpop([f"{spec['prefix']}:test-go"], timeout=30)
        await barrier.aclose()
    for op, *args in spec["ops"]:
        now = wall_ms()
        if op == "learn":
            answer = await coord.learn_cooldown(CoordKey(args[0], args[1]), args[2], now)
        elif op == "left":
            answer = await coord.cooldown_left_ms(CoordKey(args[0], args[1]), now)
        elif op == "take":
            budget = BudgetSettings(max_tokens=args[1])
            answer = 0
            for _ in range(args[0]):
                answer += await coord.take_retry_token(CoordKey("p", "m"), budget)
        elif op == "credit":
            budget = BudgetSettings(max_tokens=args[1])
            for _ in range(args[0]):
                await coord.credit_success(CoordKey("p", "m"), budget)
            answer = None
        elif op == "mark":
            answer = await coord.mark_credential_limited(args[0], args[1], args[2], now)
        elif op == "limited":
            answer = await coord.limited_credentials(args[0], now)
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
