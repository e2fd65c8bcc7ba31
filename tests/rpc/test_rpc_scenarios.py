"""docs/policy.md §3 retry scenarios end to end over the pipe: FaultServer → real server → RpcClient.

Each test scripts the provider's answers, drives the server through :class:`fsm.rpc.RpcClient`
and checks the retry events (docs/policy.md §4 fields), the HTTP requests the provider saw (one per
attempt, backoffs respected, the failed message dropped from the retried context) and the
chain invariants. Backoffs are 20 ms except where a test needs time to act inside one.

Starting a server (and loading the openai SDK in it) is the main cost, so the tests of one
settings profile share a server: each test first aborts whatever a failed test may have left,
re-enables retry, waits until idle, then loads its own script after the requests already seen,
and looks only at its own events and requests. A dead server is restarted.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import pytest_asyncio

from fsm.testing.fault_server import FaultServer, validate_script
from fsm.rpc import RpcClient, RpcError
from support import OVERLOADED, ROOT

pytestmark = [pytest.mark.subprocess, pytest.mark.asyncio(loop_scope="module")]


def err(status: int, message: str, type_: str = "error", code: str | None = None, headers=None) -> dict:
    body = {"error": {"message": message, "type": type_, **({"code": code} if code else {})}}
    return {"status": status, "json": body, **({"headers": headers} if headers else {})}


UNAVAILABLE = err(503, "Service Unavailable", "server_error", "service_unavailable")
RATE_LIMITED = err(429, "Rate limit reached for requests", "rate_limit_error", "rate_limit_exceeded")
UNAUTHORIZED = err(401, "Incorrect API key provided: oracle-***-key.", "invalid_request_error",
                   "invalid_api_key")
USAGE_LIMIT = err(429, "You have reached your usage limit. Your limit will reset in 2 hours, try again then.",
                  "usage_limit_reached", "usage_limit_reached")
OVERFLOW = err(400, "This model's maximum context length is 32768 tokens. However, your messages "
               "resulted in 40000 tokens.", "invalid_request_error", "context_length_exceeded")
OK = {"stream": ["Hel", "lo"]}


class Run:
    """One test's view of a shared server: its events and requests only."""

    def __init__(self, client: RpcClient, fs: FaultServer, max_retries: int) -> None:
        self.client = client
        self.fs = fs
        self.max_retries = max_retries
        self._first_event = len(client.received)
        self._first_request = len(fs.chat_requests)

    @property
    def events(self) -> list[dict]:
        return self.client.received[self._first_event:]

    @property
    def requests(self) -> list[dict]:
        return self.fs.chat_requests[self._first_request:]

    def sent(self) -> list[list[dict]]:
        """The messages of each request (the shared session's history comes first)."""
        return [r["body"]["messages"] for r in self.requests]

    def retry(self) -> list[tuple]:
        """``("S", attempt, delayMs)`` / ``("E", success, attempt, finalError)``, in order."""
        out = []
        for e in self.events:
            if e["type"] == "auto_retry_start":
                out.append(("S", e["attempt"], e["delayMs"]))
            elif e["type"] == "auto_retry_end":
                out.append(("E", e["success"], e["attempt"], e.get("finalError")))
        return out

    def stop_reasons(self) -> list[str]:
        return [e["message"]["stopReason"] for e in self.events
                if e["type"] == "message_end" and e["message"]["role"] == "assistant"]

    async def idle(self) -> dict:
        state = await self.client.wait_for_idle(timeout_s=120)
        self.check()
        return state

    def check(self) -> None:
        """docs/policy.md §4 field shapes and the §3 chain invariants over this test's events."""
        chain = None  # attempts of the open chain
        for e in self.events:
            if e["type"] == "auto_retry_start":
                assert isinstance(e["attempt"], int) and isinstance(e["delayMs"], int)
                assert isinstance(e["errorMessage"], str) and e["errorMessage"]
                assert e["maxAttempts"] == self.max_retries
                chain = chain or []
                assert e["attempt"] == len(chain) + 1 <= self.max_retries, (chain, e)
                chain.append(e["attempt"])
            elif e["type"] == "auto_retry_end":
                assert isinstance(e["success"], bool)
                if chain is None:  # only the maxRetries = 0 case ends without a start
                    assert self.max_retries == 0 and e["attempt"] == 0 and e["success"] is False
                else:
                    assert e["attempt"] == chain[-1], (chain, e)
                if e["success"]:
                    assert "finalError" not in e
                else:
                    assert isinstance(e["finalError"], str) and e["finalError"]
                chain = None
        assert chain is None, "a chain never ended"

    def backoffs_respected(self, slack_ms: float = 5) -> None:
        """Each retry request comes at least delayMs after its failed request was answered."""
        starts = [e["delayMs"] for e in self.events if e["type"] == "auto_retry_start"]
        reqs = self.requests
        for delay, failed, retried in zip(starts, reqs, reqs[1:]):
            gap = retried["t_ms"] - failed["end_ms"]
            assert gap >= delay - slack_ms, f"retry came {gap:.1f} ms after the failure, delay {delay}"


class SharedServer:
    """One RPC server (and FaultServer) for the tests of one settings profile."""

    def __init__(self, tmp_path: Path, max_retries: int, base_delay_ms: int) -> None:
        self.tmp_path = tmp_path
        self.max_retries = max_retries
        self.settings = tmp_path / "settings.json"
        self.settings.write_text(json.dumps({"retry": {"maxRetries": max_retries,
                                                       "baseDelayMs": base_delay_ms,
                                                       "provider": {"maxRetries": 0}}}))
        self.fs = FaultServer([]).start()
        self.client: RpcClient | None = None

    async def start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.client = RpcClient(["--base-url", self.fs.base_url, "--model", "m", "--settings",
                                 str(self.settings), "--context-window", "32768", "--no-session"],
                                env=env, cwd=self.tmp_path, record=True, timeout_s=120)
        await self.client.start()

    async def run(self, script: list[dict]) -> Run:
        """Reset what a previous test may have left, then serve ``script`` to this test."""
        if self.client is None or self.client.returncode is not None:
            await self.start()
        client = self.client
        await client.abort()
        await client.set_auto_retry(True)
        await client.wait_for_idle(timeout_s=120)
        client.drain_events()
        seen = len(self.fs.chat_requests)
        self.fs.script = (list(self.fs.script) + [{}] * seen)[:seen] + validate_script(script)
        return Run(client, self.fs, self.max_retries)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
        self.fs.stop()


def shared_server(max_retries: int, base_delay_ms: int):
    @pytest_asyncio.fixture(scope="module", loop_scope="module")
    async def fixture(tmp_path_factory):
        server = SharedServer(tmp_path_factory.mktemp("rpc"), max_retries, base_delay_ms)
        try:
            yield server
        finally:
            await server.close()
    return fixture


fast = shared_server(3, 20)
slow = shared_server(3, 300)
stuck = shared_server(3, 5000)
no_retries = shared_server(0, 20)


async def test_overloaded_then_ok(fast):
    """Overloaded then ok."""
    run = await fast.run([OVERLOADED, OVERLOADED, OK])
    await run.client.prompt("overloaded then ok")
    await run.idle()
    assert run.retry() == [("S", 1, 20), ("S", 2, 40), ("E", True, 2, None)]
    assert len(run.requests) == 3
    run.backoffs_respected()
    # The failed messages left the runtime context: every attempt sends the same messages.
    sent = run.sent()
    assert sent[0] == sent[1] == sent[2]
    assert sent[0][-1] == {"role": "user", "content": "overloaded then ok"}
    assert run.stop_reasons() == ["error", "error", "stop"]
    # The failed turn's agent_end comes before the retry start it causes (docs/policy.md §4).
    types = [e["type"] for e in run.events]
    assert types.index("agent_end") < types.index("auto_retry_start")


async def test_exhaust(fast):
    """Exhaust."""
    run = await fast.run([UNAVAILABLE] * 5)
    await run.client.prompt("exhaust")
    await run.idle()
    retry = run.retry()
    assert retry[:3] == [("S", 1, 20), ("S", 2, 40), ("S", 3, 80)]
    assert retry[3][:3] == ("E", False, 3) and "503" in retry[3][3] and len(retry) == 4
    assert len(run.requests) == 4
    run.backoffs_respected()
    state = await run.client.get_state()
    assert state["retryAttempt"] == 0 and state["isRetrying"] is False


async def test_cancel_during_backoff(stuck):
    """Cancel during backoff."""
    run = await stuck.run([RATE_LIMITED, OK])
    await run.client.prompt("cancel me")
    await run.client.wait_for_event("auto_retry_start")
    t0 = time.perf_counter()
    await run.client.abort_retry()
    end = await run.client.wait_for_event("auto_retry_end", timeout_s=1)
    latency_ms = (time.perf_counter() - t0) * 1000
    assert {"success": False, "attempt": 1, "finalError": "Retry cancelled"}.items() <= end.items()
    assert latency_ms < 500, latency_ms
    state = await run.idle()
    assert state["retryAttempt"] == 0
    assert len(run.requests) == 1


async def test_global_abort_during_backoff(stuck):
    """Global abort during backoff."""
    run = await stuck.run([RATE_LIMITED, OK])
    await run.client.prompt("abort me")
    await run.client.wait_for_event("auto_retry_start")
    t0 = time.perf_counter()
    await run.client.abort()
    assert time.perf_counter() - t0 < 1
    assert run.retry() == [("S", 1, 5000), ("E", False, 1, "Retry cancelled")]
    await run.idle()
    assert len(run.requests) == 1


async def test_disable_during_backoff_lets_the_pending_retry_run_then_ends(slow):
    """Disable during backoff lets the pending retry run then ends."""
    run = await slow.run([OVERLOADED, OVERLOADED, OK])
    await run.client.prompt("disable during backoff")
    await run.client.wait_for_event("auto_retry_start")
    await run.client.set_auto_retry(False)
    await run.idle()
    retry = run.retry()
    assert retry[0] == ("S", 1, 300) and retry[1][:3] == ("E", False, 1) and len(retry) == 2
    assert "529" in retry[1][3]
    assert len(run.requests) == 2
    assert (await run.client.get_state())["autoRetryEnabled"] is False


async def test_disabled_never_retries(fast):
    """Disabled never retries."""
    run = await fast.run([OVERLOADED])
    await run.client.set_auto_retry(False)
    await run.client.prompt("disabled")
    await run.idle()
    assert run.retry() == [] and len(run.requests) == 1 and run.stop_reasons() == ["error"]


async def test_fatal_after_retry_ends_the_chain(fast):
    """Fatal after retry ends the chain."""
    run = await fast.run([OVERLOADED, UNAUTHORIZED])
    await run.client.prompt("fatal after retry")
    await run.idle()
    retry = run.retry()
    assert retry[0] == ("S", 1, 20) and retry[1][:3] == ("E", False, 1) and "401" in retry[1][3]
    assert len(retry) == 2 and len(run.requests) == 2


async def test_fatal_first_is_not_retried(fast):
    """Fatal first is not retried."""
    run = await fast.run([UNAUTHORIZED])
    await run.client.prompt("fatal")
    await run.idle()
    assert run.retry() == [] and len(run.requests) == 1


async def test_overflow_is_not_retried(fast):
    """Overflow is not retried."""
    run = await fast.run([OVERFLOW])
    await run.client.prompt("overflow")
    await run.idle()
    assert run.retry() == [] and len(run.requests) == 1 and run.stop_reasons() == ["error"]


async def test_max_retries_zero_emits_a_lone_end(no_retries):
    """Max retries zero emits a lone end."""
    run = await no_retries.run([OVERLOADED])
    await run.client.prompt("no retries")
    await run.idle()
    retry = run.retry()
    assert len(retry) == 1 and retry[0][:3] == ("E", False, 0) and retry[0][3]
    assert len(run.requests) == 1


async def test_mid_stream_drop_is_retried_without_the_partial_message(fast):
    """Mid stream drop is retried without the partial message."""
    run = await fast.run([{"stream": ["partial"], "drop": True}, OK])
    await run.client.prompt("drop")
    await run.idle()
    assert run.retry() == [("S", 1, 20), ("E", True, 1, None)]
    assert len(run.requests) == 2
    first, retried = run.sent()
    assert retried == first and retried[-1] == {"role": "user", "content": "drop"}
    assert run.stop_reasons() == ["error", "stop"]


async def test_two_chains_each_start_at_attempt_one(fast):
    """Two chains each start at attempt one."""
    run = await fast.run([OVERLOADED, OK, OVERLOADED, OK])
    await run.client.prompt("one")
    await run.idle()
    await run.client.prompt("two")
    await run.idle()
    assert run.retry() == [("S", 1, 20), ("E", True, 1, None)] * 2
    assert len(run.requests) == 4


async def test_usage_limit_uses_the_normal_backoff(fast):
    """Usage limit uses the normal backoff."""
    run = await fast.run([USAGE_LIMIT] * 5)
    await run.client.prompt("usage limit")
    await run.idle()
    retry = run.retry()
    assert retry[:3] == [("S", 1, 20), ("S", 2, 40), ("S", 3, 80)] and retry[3][:3] == ("E", False, 3)
    assert len(run.requests) == 4


async def test_long_retry_after_hint_does_not_lengthen_the_backoff(fast):
    """Long retry after hint does not lengthen the backoff."""
    hinted = err(429, "Rate limit reached. Please try again in 60s.", "rate_limit_error",
                 "rate_limit_exceeded", headers={"retry-after": "60"})
    run = await fast.run([hinted, OK])
    t0 = time.monotonic()
    await run.client.prompt("hint")
    await run.idle()
    assert time.monotonic() - t0 < 10
    assert run.retry() == [("S", 1, 20), ("E", True, 1, None)]
    assert len(run.requests) == 2  # one HTTP request per attempt: no hidden SDK retry


async def test_get_state_during_a_backoff(stuck):
    """Get state during a backoff."""
    run = await stuck.run([OVERLOADED, OK])
    before = await run.client.get_state()
    assert before["isRetrying"] is False and before["autoRetryEnabled"] is True
    await run.client.prompt("state")
    await run.client.wait_for_event("auto_retry_start")
    during = await run.client.get_state()
    assert during["isRetrying"] is True and during["retryAttempt"] == 1
    await run.client.abort_retry()
    after = await run.idle()
    assert after["isRetrying"] is False and after["retryAttempt"] == 0


async def test_get_state_during_a_retried_attempt_is_retrying(fast):
    """isRetrying holds for the whole chain, as the original's: during the retried attempt too
    (retryState continuing), false once the chain ended; docs/rpc.md says so."""
    run = await fast.run([OVERLOADED, {"hang_ms": 30_000, "stream": ["late"]}])
    await run.client.prompt("retried attempt")
    await run.client.wait_for_event("auto_retry_start")
    await run.client.wait_for_event("agent_start")  # the retried attempt is running
    during = await run.client.get_state()
    assert during["isRetrying"] is True and during["retryState"] == "continuing"
    assert during["retryAttempt"] == 1 and during["isStreaming"] is True
    await run.client.abort()
    after = await run.idle()
    assert after["isRetrying"] is False and after["retryState"] in ("cancelled", "idle")
    doc = " ".join((ROOT / "docs" / "rpc.md").read_text(encoding="utf-8").split())
    said = doc[doc.index("`isRetrying` ("):][:200]
    assert "retried attempt" in said and "exactly while a backoff waits" not in said, said


async def test_prompt_during_a_backoff_never_bypasses_it(slow):
    # docs/policy.md §8 item 7: a message sent during the backoff must not bypass the delay.
    """Prompt during a backoff never bypasses it."""
    run = await slow.run([OVERLOADED, OK])
    await run.client.prompt("first")
    await run.client.wait_for_event("auto_retry_start")
    with pytest.raises(RpcError, match="retry chain is active"):
        await run.client.prompt("now")
    await run.client.prompt("also this", streaming_behavior="followUp")
    await run.idle()
    assert len(run.requests) == 2
    run.backoffs_respected()
    assert run.sent()[1][-2:] == [{"role": "user", "content": "first"},
                                  {"role": "user", "content": "also this"}]
    assert run.retry() == [("S", 1, 300), ("E", True, 1, None)]


async def test_a_dead_shared_server_is_replaced(fast):
    # Keeps the sharing honest: a test that kills the server does not break the next one.
    """A dead shared server is replaced."""
    run = await fast.run([])
    os.kill(run.client.pid, 9)
    with pytest.raises(Exception):
        await run.client.get_state()
    run = await fast.run([OK])
    await run.client.prompt("after restart")
    await run.idle()
    assert run.stop_reasons() == ["stop"]
