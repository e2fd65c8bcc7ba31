"""The failures of 2026 end to end over RPC against the fault server (docs/policy.md §13).

FaultServer → ``python -m fsm rpc`` → RpcClient: a stream that never starts, one that goes silent
after one delta, a slow drip cut by the attempt timeout, a retried attempt that hangs past the
chain's deadline, 529s that switch models after ``fallbackAfter`` failures, 429s that do not, a
fallback chain that runs out, a usage reset waited out and one refused. Timeouts are a few
hundred ms so each scenario takes about a second; one server per settings profile.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import pytest_asyncio

from fsm.rpc import RpcClient
from fsm.testing.fault_server import FaultServer, validate_script
from support import OVERLOADED, ROOT

pytestmark = [pytest.mark.subprocess, pytest.mark.asyncio(loop_scope="module")]


def err(status: int, message: str, type_: str = "error", code: str | None = None,
        headers: dict | None = None) -> dict:
    body = {"error": {"message": message, "type": type_, **({"code": code} if code else {})}}
    return {"status": status, "json": body, **({"headers": headers} if headers else {})}


RATE_LIMITED = err(429, "Rate limit reached for requests", "rate_limit_error", "rate_limit_exceeded")
USAGE_LIMIT = err(429, "You have reached your usage limit.", "usage_limit_reached",
                  "usage_limit_reached", {"retry-after-ms": "600"})
OK = {"stream": ["Hel", "lo"]}


class Server:
    """One RPC server and fault server for one settings profile."""

    def __init__(self, tmp_path: Path, retry: dict) -> None:
        self.tmp_path = tmp_path
        self.settings = tmp_path / "settings.json"
        self.settings.write_text(json.dumps({"retry": retry}))
        self.fs = FaultServer([]).start()
        self.client: RpcClient | None = None

    async def run(self, script: list[dict]) -> "Run":
        if self.client is None or self.client.returncode is not None:
            env = dict(os.environ)
            env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
            self.client = RpcClient(["--base-url", self.fs.base_url, "--model", "m", "--settings",
                                     str(self.settings), "--no-session"],
                                    env=env, cwd=self.tmp_path, record=True, timeout_s=120)
            await self.client.start()
            # warm up: the first request waits for the SDK's import (~0.7 s), longer than the
            # few hundred ms these scenarios give a first token
            for _ in range(20):
                if self.fs.chat_requests:
                    break
                await self.client.prompt("warm up")
                await self.client.wait_for_idle(timeout_s=120)
        await self.client.wait_for_idle(timeout_s=120)
        self.client.drain_events()
        seen = len(self.fs.chat_requests)
        self.fs.script = (list(self.fs.script) + [{}] * seen)[:seen] + validate_script(script)
        return Run(self.client, self.fs)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
        self.fs.stop()


class Run:
    """One test's view of a shared server: its events and requests only."""

    def __init__(self, client: RpcClient, fs: FaultServer) -> None:
        self.client, self.fs = client, fs
        self._first_event = len(client.received)
        self._first_request = len(fs.chat_requests)

    @property
    def events(self) -> list[dict]:
        return self.client.received[self._first_event:]

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["type"] == kind]

    @property
    def models(self) -> list[str]:
        return [r["body"]["model"] for r in self.fs.chat_requests[self._first_request:]]

    async def prompt(self, text: str) -> dict:
        await self.client.prompt(text)
        return await self.client.wait_for_idle(timeout_s=120)


def server(retry: dict):
    @pytest_asyncio.fixture(scope="module", loop_scope="module")
    async def fixture(tmp_path_factory):
        s = Server(tmp_path_factory.mktemp("rpc13"), retry)
        try:
            yield s
        finally:
            await s.close()
    return fixture


watch = server({"maxRetries": 3, "baseDelayMs": 20, "firstTokenTimeoutMs": 400,
                "idleTimeoutMs": 400, "attemptTimeoutMs": 1500, "retryHints": "honor",
                "maxHintWaitMs": 100})
deadline = server({"maxRetries": 3, "baseDelayMs": 20, "idleTimeoutMs": 400,
                   "attemptTimeoutMs": 5000, "maxElapsedMs": 800})
fallback = server({"maxRetries": 2, "baseDelayMs": 20, "fallbackModels": ["m-small"],
                   "fallbackOn": ["overloaded"], "fallbackAfter": 2, "fallbackRevertMs": 0,
                   "waitForUsageReset": True, "maxHintWaitMs": 100})


async def test_a_stream_that_never_starts_is_retried(watch):
    """No headers within firstTokenTimeoutMs: a stall, retried on the same model."""
    run = await watch.run([{"hang_ms": 3000}, OK])
    await run.prompt("never starts")
    start, end = run.of("auto_retry_start"), run.of("auto_retry_end")
    assert [s["errorMessage"] for s in start] == ["stream stalled: no response within 400 ms"]
    assert end[0]["success"] is True and len(run.models) == 2


async def test_a_stream_that_goes_silent_after_one_delta_is_retried(watch):
    """One delta, then silence longer than idleTimeoutMs: a stall that discards the output."""
    run = await watch.run([{"stream": ["Hel", "lo"], "chunk_delay_ms": 3000}, OK])
    await run.prompt("goes silent")
    start = run.of("auto_retry_start")[0]
    assert start["errorMessage"] == "stream stalled: no data for 400 ms"
    assert start["discardsOutput"] is True
    assert run.of("auto_retry_end")[0]["success"] is True


async def test_a_slow_drip_is_cut_by_the_attempt_timeout(watch):
    """Deltas every 200 ms (never idle) for 4 s: the 1.5 s attempt timeout ends the attempt."""
    run = await watch.run([{"stream": ["drip"] * 20, "chunk_delay_ms": 200}, OK])
    await run.prompt("slow drip")
    assert [s["errorMessage"] for s in run.of("auto_retry_start")] == [
        "attempt timed out after 1.5 s"]
    assert run.of("auto_retry_end")[0]["success"] is True


async def test_a_usage_reset_beyond_max_hint_wait_is_refused_by_default(watch):
    """waitForUsageReset false: a usage limit resetting in 600 ms (> 100 ms) ends at once."""
    run = await watch.run([USAGE_LIMIT])
    await run.prompt("usage refused")
    end = run.of("auto_retry_end")[0]
    assert (end["attempt"], end["endReason"]) == (0, "hint_too_long")
    assert isinstance(end["resetAt"], int) and len(run.models) == 1


async def test_a_retried_attempt_that_hangs_past_the_deadline_is_aborted(deadline):
    """maxElapsedMs 800: the retry streams slowly past the deadline and is aborted there."""
    run = await deadline.run([OVERLOADED, {"stream": ["x"] * 30, "chunk_delay_ms": 200}])
    state = await run.prompt("hangs past the deadline")
    end = run.of("auto_retry_end")[0]
    assert (end["success"], end["attempt"], end["endReason"]) == (False, 1, "deadline")
    assert "retry.maxElapsedMs = 800 ms" in end["finalError"]
    assert len(run.models) == 2 and state["isRetrying"] is False
    kinds = [e["type"] for e in run.events]
    assert kinds.index("auto_retry_end") < len(kinds) - 1 - kinds[::-1].index("agent_end")


async def test_529s_switch_models_after_fallback_after_failures(fallback):
    """Two 529s on the primary, then the fallback model at once; get_state shows it."""
    run = await fallback.run([OVERLOADED, OVERLOADED, OK])
    state = await run.prompt("overloaded twice")
    assert run.models == ["m", "m", "m-small"]
    assert [(f["from"], f["to"], f["reason"]) for f in run.of("retry_fallback")] == [
        ("m", "m-small", "overloaded")]
    starts = run.of("auto_retry_start")
    assert [(s["delaySource"], s["model"], s["maxAttempts"]) for s in starts] == [
        ("backoff", "m", 3), ("fallback", "m-small", 3)]
    assert state["model"]["id"] == "m-small"


async def test_429s_do_not_switch_models(fallback):
    """A plain 429 is not in fallbackOn: same-model retries only."""
    run = await fallback.run([RATE_LIMITED, RATE_LIMITED, OK])
    await run.prompt("rate limited")
    assert run.models == ["m", "m", "m"] and not run.of("retry_fallback")


async def test_a_fallback_chain_that_runs_out(fallback):
    """maxRetries 2 + one fallback = 3 attempts; the last ones stay on the fallback."""
    run = await fallback.run([OVERLOADED] * 6)
    await run.prompt("runs out")
    assert run.models == ["m", "m", "m-small", "m-small"]
    end = run.of("auto_retry_end")[0]
    assert (end["attempt"], end["endReason"]) == (3, "exhausted")


async def test_a_usage_reset_is_waited_out(fallback):
    """waitForUsageReset: a 600 ms reset (> maxHintWaitMs) is waited out, with resetAt."""
    run = await fallback.run([USAGE_LIMIT, OK])
    await run.prompt("usage waited")
    start = run.of("auto_retry_start")[0]
    assert (start["delayMs"], start["delaySource"]) == (600, "hint")
    assert start["resetAt"] == start["retryAt"]
    assert run.of("auto_retry_end")[0]["success"] is True
