"""The JSON-file credential store at scale: per-call time with many stale sessions, and the
event loop while another process holds the store's lock.

Figures:

- ``store_call_ms_empty``: one ``api_key`` call (the same session again: a read, no write) on a
  store with one session;
- ``store_prune_ms``: the first call on a store whose file holds ``sessions`` sessions idle for
  two days (it reads the big file, forgets them and writes the small one);
- ``store_call_ms_after_prune``: one call after that;
- ``store_after_prune_ratio``: the two per-call times, after ÷ empty (target ≤ 2: the stale
  sessions cost nothing once forgotten; before pruning existed the file only grew);
- ``store_loop_lag_ms_locked``: the longest delay of a 10 ms event-loop timer while 200
  ``amark_usage_limit_reached`` calls wait (and give up after 150 ms) on a lock held by
  another process (target ≤ 50 ms: the store never blocks the loop).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fsm.host.credentials import CredentialLockTimeout, JsonFileCredentialStore

NOW = 1_700_000_000_000
DAY_MS = 86_400_000
KEYS = ["key-aaaaaaaaaaaaaaaaaaaaaaaa", "key-bbbbbbbbbbbbbbbbbbbbbbbb"]


def _per_call_ms(store: JsonFileCredentialStore, calls: int) -> float:
    store.api_key("p", "same")
    started = time.perf_counter()
    for _ in range(calls):
        store.api_key("p", "same")
    return (time.perf_counter() - started) / calls * 1000


def _write_stale(path: Path, sessions: int) -> None:
    ids = [f"session-{i:07d}" for i in range(sessions)]
    entry = {"keys": KEYS, "sessions": dict.fromkeys(ids, KEYS[0]), "seen": dict.fromkeys(ids, NOW)}
    path.write_text(json.dumps({"providers": {"p": entry}}))
    os.chmod(path, 0o600)


_HOLD = "import fcntl, sys\nfh = open(sys.argv[1], 'a+')\nfcntl.flock(fh, fcntl.LOCK_EX)\nprint('locked', flush=True)\nsys.stdin.read()\n"


async def _loop_lag_ms(store: JsonFileCredentialStore, calls: int) -> float:
    loop = asyncio.get_running_loop()
    lags: list[float] = []

    async def ticker() -> None:
        while True:
            before = loop.time()
            await asyncio.sleep(0.01)
            lags.append(loop.time() - before - 0.01)

    tick = asyncio.create_task(ticker())
    results = await asyncio.gather(*(store.amark_usage_limit_reached("p", f"s{i}", 1000, timeout_s=0.15)
                                     for i in range(calls)), return_exceptions=True)
    tick.cancel()
    if not all(isinstance(r, CredentialLockTimeout) for r in results):
        raise RuntimeError("a mark went through a lock held by another process")
    return max(lags) * 1000


def measure(sessions: int = 300_000, calls: int = 20, marks: int = 200) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        small = JsonFileCredentialStore(Path(folder) / "small.json", {"p": KEYS}, clock=lambda: NOW)
        empty_ms = _per_call_ms(small, calls)

        big = Path(folder) / "big.json"
        _write_stale(big, sessions)
        later = JsonFileCredentialStore(big, clock=lambda: NOW + 2 * DAY_MS)  # reads, validates
        started = time.perf_counter()
        later.api_key("p", "fresh")  # prunes and writes
        prune_ms = (time.perf_counter() - started) * 1000
        after_ms = _per_call_ms(later, calls)

        holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(Path(folder) / "small.json.lock")],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            if holder.stdout.readline() != b"locked\n":
                raise RuntimeError("the lock holder did not start")
            lag_ms = asyncio.run(_loop_lag_ms(small, marks))
        finally:
            holder.stdin.close()
            holder.wait(10)
    return {"store_call_ms_empty": empty_ms, "store_prune_ms": prune_ms,
            "store_call_ms_after_prune": after_ms,
            "store_after_prune_ratio": after_ms / empty_ms,
            "store_loop_lag_ms_locked": lag_ms}


if __name__ == "__main__":
    print(json.dumps(measure(), indent=1))
