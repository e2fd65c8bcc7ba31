"""A randomized race over RPC: prompt, abort, abort_retry, set_auto_retry and retry_now
interleaved (in a reproducible random order) with scripted 529s and slow streams, checking the lifecycle invariants
of docs/policy.md §3 on every run.

One ``python -m fsm rpc`` process serves every round of a run. Each round waits until the
session is idle, sends a prompt, then a random sequence of controls with random short pauses,
and waits until idle again (``prompt()`` must never hang after a chain ends). Checked:

- every ``auto_retry_start`` is followed by exactly one ``auto_retry_end`` of its chain, and an
  end without a start is a refusal at rest (attempt 0, success false);
- ``1 ≤ attempt ≤ maxAttempts`` inside a chain, attempts count up by one, ``maxAttempts`` fixed;
- after an ``abort`` has returned, no turn starts and no request reaches the provider until
  the next prompt;
- the process keeps serving: it is alive, wrote nothing but protocol lines, and answers a
  last prompt with a success.

Reproduce a failure, or try other random orders, with ``FSM_RACE_RNG=<n> pytest tests/rpc/test_race_rpc.py``
(the default run uses one random sequence to stay within a few seconds).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time

import pytest

from fsm.testing.fault_server import FaultServer
from fsm.rpc import RpcClient, RpcError
from support import OVERLOADED, env

pytestmark = [pytest.mark.subprocess]

MAX_RETRIES = 3
BASE_DELAY_MS = 40
ROUNDS = 24
RNG_SEEDS = [int(os.environ["FSM_RACE_RNG"])] if os.environ.get("FSM_RACE_RNG") else [2]


def random_entry(rng: random.Random) -> dict:
    roll = rng.random()
    if roll < 0.45:
        return dict(OVERLOADED)
    if roll < 0.6:
        return {**OVERLOADED, "delay_ms": rng.choice([5, 20, 40])}
    if roll < 0.8:
        return {"stream": ["sl", "ow", " ok"], "chunk_delay_ms": rng.choice([10, 25])}
    if roll < 0.9:
        return {"stream": ["partial"], "chunk_delay_ms": 15, "drop": True}
    return {"stream": ["ok"]}


def check_chains(events: list[dict], rng_seed: int) -> int:
    """The §3 chain invariants over the whole event stream; returns the number of chains."""
    open_chain: list[int] | None = None
    max_attempts = None
    chains = 0
    for i, e in enumerate(events):
        where = f"rng_seed {rng_seed}, event {i}: {json.dumps(e)[:300]}"
        if e["type"] == "auto_retry_start":
            if open_chain is None:
                open_chain, max_attempts = [], e["maxAttempts"]
                chains += 1
            assert e["maxAttempts"] == max_attempts == MAX_RETRIES, where
            assert 1 <= e["attempt"] <= e["maxAttempts"], where
            assert e["attempt"] == len(open_chain) + 1, f"{where} after attempts {open_chain}"
            open_chain.append(e["attempt"])
        elif e["type"] == "auto_retry_end":
            if open_chain is None:
                assert e["attempt"] == 0 and e["success"] is False, f"{where}: an end without a start"
            else:
                assert e["attempt"] == open_chain[-1], f"{where} after attempts {open_chain}"
            open_chain = None
    assert open_chain is None, f"rng_seed {rng_seed}: a chain never ended (attempts {open_chain})"
    return chains


def summary(events: list[dict]) -> str:
    out = []
    for e in events:
        text = e["type"]
        if e["type"] in ("auto_retry_start", "auto_retry_end"):
            text += f"({e['attempt']}{', ok' if e.get('success') else ''})"
        elif e["type"] == "message_end" and e["message"].get("role") == "assistant":
            text += f"({e['message'].get('stopReason')})"
        out.append(text)
    return " ".join(out)


async def control(client: RpcClient, action: str, rng: random.Random) -> bool:
    """Send one control; False when the server refused it (``success: false``)."""
    if action == "abort":
        await client.abort()
    elif action == "abort_retry":
        await client.abort_retry()
    elif action == "set_auto_retry":
        await client.set_auto_retry(rng.random() < 0.6)
    elif action == "retry_now":
        try:
            await client.request({"type": "retry_now"})
        except RpcError:
            return False  # no chain backing off, or a server without retry_now: refused
    else:
        await client.get_state()
    return True


@pytest.mark.parametrize("rng_seed", RNG_SEEDS)
async def test_random_controls_keep_the_lifecycle_invariants(tmp_path, rng_seed):
    """A bounded randomized race over RPC, invariants on every run."""
    rng = random.Random(rng_seed)
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"retry": {"maxRetries": MAX_RETRIES, "baseDelayMs": BASE_DELAY_MS}}))
    script = [random_entry(rng) for _ in range(ROUNDS * (MAX_RETRIES + 1))]
    with FaultServer(script) as fs:
        client = RpcClient(["--base-url", fs.base_url, "--model", "m", "--settings", str(settings),
                            "--no-session"], env=env(), cwd=tmp_path, record=True, timeout_s=120)
        await client.start()
        try:
            quiet_windows: list[tuple[float, float]] = []  # (abort returned, next prompt sent), ms
            abort_marks: list[int] = []  # len(client.received) when each abort returned
            prompt_marks: list[int] = []  # len(client.received) when the next prompt went out
            accepted: dict[str, int] = {}  # action -> how many the server accepted
            for round_no in range(ROUNDS):
                if rng.random() < 0.8:
                    await client.set_auto_retry(True)
                await client.wait_for_idle(timeout_s=120)
                prompt_ms = time.monotonic() * 1000
                if quiet_windows and quiet_windows[-1][1] is None:
                    quiet_windows[-1] = (quiet_windows[-1][0], prompt_ms)
                    prompt_marks.append(len(client.received))
                await client.prompt(f"round {round_no}")
                for _ in range(rng.randint(1, 5)):
                    await asyncio.sleep(rng.choice([0, 0.005, 0.02, 0.05, 0.09]))
                    action = rng.choice(["abort", "abort_retry", "abort_retry", "set_auto_retry",
                                         "retry_now", "retry_now", "get_state"])
                    accepted[action] = accepted.get(action, 0) + await control(client, action, rng)
                    if action == "abort":
                        quiet_windows.append((time.monotonic() * 1000, None))
                        abort_marks.append(len(client.received))
                        break  # the next round's prompt closes the quiet window
                await client.wait_for_idle(timeout_s=120)
            await client.set_auto_retry(True)
            await client.wait_for_idle(timeout_s=120)
            if quiet_windows and quiet_windows[-1][1] is None:
                quiet_windows[-1] = (quiet_windows[-1][0], time.monotonic() * 1000)
                prompt_marks.append(len(client.received))

            # The process keeps serving: a last prompt, past the script, succeeds.
            fs.script = fs.script[:fs.chat_count]
            mark = len(client.received)
            await client.prompt("last")
            await client.wait_for_idle(timeout_s=120)
            ends = [e for e in client.received[mark:] if e["type"] == "message_end"
                    and e["message"]["role"] == "assistant"]
            assert [e["message"]["stopReason"] for e in ends] == ["stop"], f"rng_seed {rng_seed}"
            assert client.returncode is None and client.noise == []
        finally:
            await client.close()
        requests = fs.chat_requests
    chains = check_chains(client.received, rng_seed)
    for mark, until in zip(abort_marks, prompt_marks):
        # Events come in stream order: a turn that starts after abort()'s answer is a request
        # the aborted chain sent after abort returned.
        after = client.received[mark:until]
        assert not any(e["type"] == "agent_start" for e in after), (
            f"rng_seed {rng_seed}: a turn started after abort() returned: {summary(after)}")
    for (returned, next_prompt), mark in zip(quiet_windows, abort_marks):
        # No request is sent after abort() returned: each request follows its turn's assistant
        # message_start, so the requests the server saw before the next prompt are at most the
        # message_starts before abort's answer (a request already on the wire may be recorded
        # late, by any amount on a loaded machine: a count, not a time, SPEC §15.13).
        sent = sum(1 for e in client.received[:mark] if e["type"] == "message_start"
                   and e["message"]["role"] == "assistant")
        seen = sum(1 for r in requests if r["t_ms"] < next_prompt)
        assert seen <= sent, (f"rng_seed {rng_seed}: {seen - sent} request(s) reached the provider "
                              f"after abort() returned; events before and after it: "
                              f"{summary(client.received[mark - 8:mark])} | "
                              f"{summary(client.received[mark:mark + 12])}")
    # The run really raced: chains started and aborts landed (else the test proves nothing).
    assert chains >= 3 and len(quiet_windows) >= 3, (chains, len(quiet_windows))
    print(f"rng_seed {rng_seed}: {chains} chains, controls accepted {accepted}")
