"""AnthropicMessagesProvider on the real ``anthropic`` SDK against the fault server's
``/v1/messages`` (one HTTP request per call; failures are error messages, never exceptions)."""

import asyncio
import json

import pytest

from fsm.providers.anthropic_messages import TRUNCATED_MESSAGE, AnthropicMessagesProvider
from fsm.providers.apis import build_provider
from fsm.testing.fault_server import FaultServer
from fsm.host.session import AgentSession
from fsm.core.settings import RetrySettings

OVERLOADED_BODY = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
ASK = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def provider(srv, **kw):
    return AnthropicMessagesProvider(base_url=srv.base_url.removesuffix("/v1"), model="claude-x",
                                     api_key="sk-ant-test", **kw)


async def test_a_streamed_answer_with_text_deltas_usage_and_the_request_shape():
    """A streamed answer with text deltas usage and the request shape."""
    deltas = []
    with FaultServer([{"stream": ["Hel", "lo"], "usage": {"output_tokens": 7}}]) as srv:
        p = provider(srv, max_tokens=99)
        message = await p.complete(ASK, on_text=deltas.append)
        await p.aclose()
        body = srv.chat_requests[0]["body"]
        headers = srv.chat_requests[0]["headers"]
    assert (message.stop_reason, message.text, deltas) == ("stop", "Hello", ["Hel", "lo"])
    assert message.usage.input == 10 and message.usage.output == 7
    assert body["system"] == "be brief" and body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["max_tokens"] == 99 and body["stream"] is True and body["model"] == "claude-x"
    assert headers["x-stainless-retry-count"] == "0"


@pytest.mark.parametrize("stop,expected", [("max_tokens", "length"), ("tool_use", "toolUse"),
                                           ("end_turn", "stop")])
async def test_stop_reasons_map_to_ours(stop, expected):
    """Stop reasons map to ours."""
    with FaultServer([{"stream": ["x"], "finish_reason": stop}]) as srv:
        p = provider(srv)
        assert (await p.complete(ASK)).stop_reason == expected
        await p.aclose()


async def test_an_unknown_stop_reason_is_an_error_not_a_success():
    """An unknown stop reason is an error not a success."""
    with FaultServer([{"stream": ["partial"], "finish_reason": "network_error"}]) as srv:
        p = provider(srv)
        message = await p.complete(ASK)
        await p.aclose()
    assert message.stop_reason == "error" and message.error_message == "Provider stop_reason: network_error"
    assert message.text == "partial"


async def test_http_529_is_an_error_message_with_the_human_text():
    """HTTP 529 is an error message with the human text."""
    with FaultServer([{"status": 529, "json": OVERLOADED_BODY, "headers": {"retry-after": "3"}}]) as srv:
        p = provider(srv)
        message = await p.complete(ASK)
        await p.aclose()
    assert message.stop_reason == "error"
    assert message.error_message.startswith("529 Overloaded")
    assert "retry-after: 3" in message.error_message


async def test_an_sse_error_event_inside_a_200_stream_is_a_failed_turn_keeping_the_partial_text():
    """An SSE error event inside a 200 stream is a failed turn keeping the partial text."""
    with FaultServer([{"stream": ["Hel", OVERLOADED_BODY]}]) as srv:
        p = provider(srv)
        message = await p.complete(ASK)
        await p.aclose()
    assert message.stop_reason == "error" and message.text == "Hel"
    assert "Overloaded" in message.error_message and "overloaded_error" in message.error_message


@pytest.mark.parametrize("entry,words", [
    ({"stream": ["Hel"], "drop": True}, "connection"),
    ({"stream": ["Hel"], "no_done": True}, TRUNCATED_MESSAGE),
])
async def test_drops_and_truncated_streams_are_error_messages(entry, words):
    """Drops and truncated streams are error messages."""
    with FaultServer([entry]) as srv:
        p = provider(srv)
        message = await p.complete(ASK)
        await p.aclose()
    assert message.stop_reason == "error" and words.lower() in message.error_message.lower()


async def test_a_connection_refused_is_an_error_message():
    """A connection refused is an error message."""
    with FaultServer([]) as srv:
        url = srv.base_url
    p = AnthropicMessagesProvider(base_url=url.removesuffix("/v1"), model="m", api_key="k")
    message = await p.complete(ASK)
    await p.aclose()
    assert message.stop_reason == "error" and "Connection error" in message.error_message


async def test_cancelling_the_call_propagates_and_closes_the_request():
    """Cancelling the call propagates and closes the request."""
    with FaultServer([{"stream": ["a", "b"], "chunk_delay_ms": 5000}]) as srv:
        p = provider(srv)
        task = asyncio.ensure_future(p.complete(ASK))
        for _ in range(200):
            if srv.chat_requests:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await p.aclose()


async def test_the_session_retries_an_overloaded_error_inside_a_200_stream():
    """The most common real failure: overloaded_error inside the stream, retried by the brain."""
    events = []
    with FaultServer([{"stream": ["Hel", OVERLOADED_BODY]}, {"stream": ["Hello"]}]) as srv:
        p = provider(srv)
        session = AgentSession(p, settings=RetrySettings(base_delay_ms=1))
        session.subscribe(events.append)
        await session.prompt("hi")
        await session.close()
        await p.aclose()
        assert len(srv.chat_requests) == 2
    retry = [e for e in events if e["type"].startswith("auto_retry")]
    assert [e["type"] for e in retry] == ["auto_retry_start", "auto_retry_end"]
    assert retry[0]["discardsOutput"] is True  # "Hel" was streamed before the error event
    assert retry[1]["success"] is True
    assert session.messages[-1].text == "Hello"


def test_bad_arguments_are_refused_with_the_value_named():
    """Bad arguments are refused with the value named."""
    with pytest.raises(ValueError, match="model"):
        AnthropicMessagesProvider(model="")
    with pytest.raises(ValueError, match="timeout_s"):
        AnthropicMessagesProvider(model="m", timeout_s=0)
    with pytest.raises(ValueError, match="max_tokens"):
        AnthropicMessagesProvider(model="m", max_tokens=0)
    with pytest.raises(ValueError, match="unknown api 'gemini'"):
        build_provider("gemini", base_url=None, model="m")


def test_build_provider_picks_the_api_and_takes_a_v1_base_url_as_the_root():
    """Build provider picks the API and takes a v1 base URL as the root."""
    p = build_provider("anthropic", base_url="http://127.0.0.1:9/v1/", model="m", api_key="k")
    assert isinstance(p, AnthropicMessagesProvider) and p.base_url == "http://127.0.0.1:9"
    assert p.name == "127.0.0.1"
    assert AnthropicMessagesProvider(model="m").name == "anthropic"
    assert type(build_provider("openai", base_url=None, model="m")).__name__ == "OpenAIChatProvider"


async def test_the_fault_server_answers_a_non_streaming_message_and_scripted_errors():
    """The /v1/messages route shares the script and the counter with chat completions."""
    import anthropic
    with FaultServer([{"status": 503, "body": "upstream down"}, {}]) as srv:
        client = anthropic.AsyncAnthropic(base_url=srv.base_url.removesuffix("/v1"),
                                          api_key="k", max_retries=0)
        with pytest.raises(anthropic.InternalServerError):
            await client.messages.create(model="m", max_tokens=5, messages=ASK[1:])
        message = await client.messages.create(model="m", max_tokens=5, messages=ASK[1:])
        await client.close()
        assert message.content[0].text == "ok" and message.stop_reason == "end_turn"
        assert [r["index"] for r in srv.chat_requests] == [0, 1]
        assert json.dumps(srv.chat_requests[1]["body"]["messages"]) == json.dumps(ASK[1:])


@pytest.mark.subprocess
def test_rpc_api_anthropic_retries_an_overloaded_stream_end_to_end(tmp_path):
    """``python -m fsm rpc --api anthropic``: the command line selects the provider; the
    retry events reach the client as JSON lines (what the terminal's countdown reads)."""
    import subprocess
    import sys

    from support import ROOT, env, stop_process

    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"retry": {"baseDelayMs": 1}}))
    with FaultServer([{"stream": ["Hel", OVERLOADED_BODY]}, {"stream": ["Hello"]}]) as srv:
        proc = subprocess.Popen([sys.executable, "-m", "fsm", "rpc", "--api", "anthropic",
                                 "--base-url", srv.base_url, "--model", "claude-x", "--api-key",
                                 "sk-ant-test", "--no-session", "--settings", str(settings)],
                                cwd=ROOT, env=env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            proc.stdin.write(json.dumps({"type": "prompt", "message": "hi"}) + "\n")
            proc.stdin.flush()
            seen = []
            for line in proc.stdout:
                event = json.loads(line)
                seen.append(event)
                if event.get("type") == "agent_end" and any(
                        e.get("type") == "auto_retry_end" for e in seen) or len(seen) > 200:
                    break
            for request in ({"id": "s", "type": "get_state"}, {"id": "m", "type": "get_messages"}):
                proc.stdin.write(json.dumps(request) + "\n")
                proc.stdin.flush()
                for line in proc.stdout:
                    seen.append(json.loads(line))
                    if seen[-1].get("id") == request["id"]:
                        break
        finally:
            stop_process(proc)
        assert [r["path"] for r in srv.chat_requests] == ["/v1/messages"] * 2
    state = next(e for e in seen if e.get("id") == "s")["data"]
    assert state["model"]["api"] == "anthropic-messages"  # pi's Model.api, not the OpenAI one
    answers = [m for m in next(e for e in seen if e.get("id") == "m")["data"]["messages"]
               if m["role"] == "assistant"]
    assert answers and {m["api"] for m in answers} == {"anthropic-messages"}
    retry = [e for e in seen if e.get("type", "").startswith("auto_retry")]
    assert retry[0]["type"] == "auto_retry_start" and "Overloaded" in retry[0]["errorMessage"]
    assert retry[-1]["success"] is True


@pytest.mark.parametrize("entry,expect", [
    ({"status": 503}, "503"),
    ({"stream": ["Hel"], "drop": True, "drop_mode": "fin"}, "error"),
    ({"delay_ms": 5}, "stop"),
])
async def test_more_fault_shapes_on_the_messages_route(entry, expect):
    """An empty error body, a plain close mid-stream, a delayed default success."""
    with FaultServer([entry]) as srv:
        p = provider(srv)
        message = await p.complete(ASK)
        await p.aclose()
    if expect == "stop":
        assert message.stop_reason == "stop" and message.text == "ok"
    elif expect == "503":
        assert message.stop_reason == "error" and message.error_message.startswith("503")
    else:
        assert message.stop_reason == "error" and message.text == "Hel"


@pytest.mark.pty
def test_chat_api_anthropic_shows_the_live_countdown(tmp_path):
    """``python -m fsm chat --api anthropic``: an overloaded_error inside the stream brings up
    the loader, whose seconds count down live (2s, then 1s; D9), then the answer."""
    pytest.importorskip("pexpect")
    from pty_support import Chat

    with FaultServer([{"stream": ["Hel", OVERLOADED_BODY]}, {"stream": ["Hello there"]}]) as srv:
        chat = Chat(srv.base_url, {"baseDelayMs": 1600}, tmp_path, "--api", "anthropic")
        try:
            chat.ready()
            chat.line("hi")
            chat.wait_for(r"Retrying \(1/3\) in 2s… \(esc to cancel")
            chat.wait_for(r"Retrying \(1/3\) in 1s… \(esc to cancel")
            chat.wait_for(r"Hello there", where="transcript")
        finally:
            chat.kill()
        assert [r["path"] for r in srv.chat_requests] == ["/v1/messages"] * 2
