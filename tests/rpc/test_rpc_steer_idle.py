"""``steer`` and ``follow_up`` sent while the session is idle only queue the message for the
next prompt, as the original does: one request carries all three messages, where each
command used to start a turn of its own (docs/reliability.md, item 10)."""

from __future__ import annotations

import pytest

from fsm.host.session import AgentSession
from fsm.testing import ScriptedProvider
from fsm.testing.fault_server import FaultServer
from fsm.rpc import RpcClient
from support import env

pytestmark = pytest.mark.subprocess


async def test_steer_and_follow_up_while_idle_wait_for_the_next_prompt(tmp_path):
    """Three commands, one request: the steer, the follow-up and the prompt, in that order."""
    with FaultServer([]) as server:
        client = RpcClient(["--base-url", server.base_url, "--model", "m", "--api-key", "local-key-0",
                            "--no-session"], env=env(), cwd=tmp_path, record=True, timeout_s=120)
        await client.start()
        try:
            await client.steer("steered")
            await client.follow_up("followed")
            state = await client.get_state()
            assert state["pendingMessageCount"] == 2 and state["isStreaming"] is False
            assert server.chat_count == 0  # nothing was sent yet
            await client.prompt("hi")
            await client.wait_for_idle(timeout_s=120)
            messages = await client.get_messages()
        finally:
            await client.close()
        assert server.chat_count == 1
        sent = [m["content"] for m in server.chat_requests[0]["body"]["messages"] if m["role"] == "user"]
        assert sent == ["steered", "followed", "hi"]
    assert [m["role"] for m in messages] == ["user", "user", "user", "assistant"]


async def test_queue_message_on_an_idle_session_starts_no_turn():
    """AgentSession.queue_message: the message waits; the next prompt sends it first."""
    provider = ScriptedProvider()
    session = AgentSession(provider)
    events: list = []
    session.subscribe(events.append)
    session.queue_message("first", "steer")
    assert provider.requests == [] and session.queued_messages == ["first"]
    await session.prompt("second")
    assert len(provider.requests) == 1
    assert [m.text for m in session.messages if m.role == "user"] == ["first", "second"]
    with pytest.raises(ValueError, match="steer"):
        session.queue_message("x", "later")
