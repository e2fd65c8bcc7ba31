"""Both SDKs, one behaviour: one text for one network failure whichever SDK saw it, and a fault
server both SDKs use with the base URL each takes (rough edges a new user met, each pinned by a
test)."""

from __future__ import annotations

import asyncio

import anthropic
import httpx2
import openai
import pytest

from fsm import __main__ as cli
from fsm.core.classify import classify_message
from fsm.providers.anthropic_messages import AnthropicMessagesProvider
from fsm.providers.openai_chat import OpenAIChatProvider
from fsm.providers.sdk_errors import error_facts
from fsm.testing.fault_server import FaultServer

ASK = [{"role": "user", "content": "hi"}]


# -- one failure, one text ------------------------------------------------------------------

async def _both(entry: dict) -> tuple[str, str]:
    """The error text of the same scripted failure through the OpenAI and the Anthropic provider,
    each given the fault server's base URL for its SDK."""
    with FaultServer([entry, entry]) as srv:
        chat = OpenAIChatProvider(base_url=srv.base_url, model="m", api_key="k")
        messages = AnthropicMessagesProvider(base_url=srv.root_url, model="m", api_key="k")
        try:
            a = await chat.complete(ASK)
            b = await messages.complete(ASK)
        finally:
            await chat.aclose()
            await messages.aclose()
    assert a.stop_reason == b.stop_reason == "error"
    return a.error_message, b.error_message


@pytest.mark.parametrize("mode", ["rst", "fin"])
async def test_a_dropped_stream_reads_the_same_through_either_sdk(mode):
    """A connection dropped mid-stream has one text whichever SDK saw it."""
    via_openai, via_anthropic = await _both({"stream": ["Hel"], "drop": True, "drop_mode": mode})
    assert via_openai == via_anthropic
    assert via_openai.startswith("Connection error. (")


def _raised(exc: BaseException, cause: BaseException | None) -> BaseException:
    try:
        try:
            if cause is not None:
                raise cause
        except BaseException as inner:
            raise exc from inner
        raise exc
    except BaseException as caught:
        return caught


@pytest.mark.parametrize("bare,wrapped", [
    (httpx2.ReadError(""), openai.APIConnectionError),
    (httpx2.RemoteProtocolError("peer closed connection"), anthropic.APIConnectionError),
    (httpx2.ReadTimeout(""), openai.APITimeoutError),
])
def test_a_bare_transport_error_reads_as_the_sdks_wrapped_one(bare, wrapped):
    """httpx2's ReadError / RemoteProtocolError / ReadTimeout, raised bare, read as the SDK's
    APIConnectionError / APITimeoutError around them, and classify the same (retryable)."""
    root = ConnectionResetError(104, "Connection reset by peer")
    request = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")
    bare_exc = _raised(bare, root)
    sdk_exc = _raised(wrapped(request=request), bare_exc)
    assert error_facts(bare_exc).message == error_facts(sdk_exc).message
    assert error_facts(bare_exc).message.startswith(
        "Request timed out. (" if isinstance(bare, httpx2.TimeoutException) else "Connection error. (")
    assert classify_message(error_facts(bare_exc).to_message()).kind == "retryable"


# -- the fault server, for both SDKs --------------------------------------------------------

async def test_each_sdk_takes_its_base_url_the_printed_one_and_the_root():
    """The printed URL (``/v1``) is the OpenAI base, the server's root the Anthropic SDK's, as
    for the real APIs (docs/embedding.md, "The Anthropic Messages API")."""
    with FaultServer([{"stream": ["one"]}, {"stream": ["two"]}]) as srv:
        oa = openai.AsyncOpenAI(base_url=srv.base_url, api_key="k", max_retries=0)
        an = anthropic.AsyncAnthropic(base_url=srv.root_url, api_key="k", max_retries=0)
        chat = await oa.chat.completions.create(model="m", messages=ASK)
        message = await an.messages.create(model="m", max_tokens=10, messages=ASK)
        await oa.close()
        await an.close()
        paths = [r["path"] for r in srv.chat_requests]
    assert srv.base_url == srv.root_url + "/v1"
    assert chat.choices[0].message.content == "one"
    assert [block.text for block in message.content] == ["two"]
    assert paths == ["/v1/chat/completions", "/v1/messages"]


async def test_a_doubled_v1_is_a_404_naming_the_base_url_to_use():
    """The Anthropic SDK given the OpenAI base URL asks ``/v1/v1/messages``: a 404 whose message
    names the root to use, no script entry spent (docs/embedding.md, "The Anthropic Messages
    API")."""
    with FaultServer([{"stream": ["kept"]}]) as srv:
        client = anthropic.AsyncAnthropic(base_url=srv.base_url, api_key="k", max_retries=0)
        with pytest.raises(anthropic.NotFoundError) as info:
            await client.messages.create(model="m", max_tokens=10, messages=ASK)
        await client.close()
        records, chats = srv.requests, srv.chat_requests
    assert f"base_url={srv.root_url} " in str(info.value) and "/v1 twice" in str(info.value)
    assert [(r["path"], r["index"]) for r in records] == [("/v1/v1/messages", None)] and not chats


async def test_a_non_streaming_messages_request_gets_one_message_object():
    """A /v1/messages request that does not stream, against a stream entry, gets a Message
    (text joined, stop reason and usage), not the SSE text; an error event there is the error
    body with the API's status."""
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    with FaultServer([{"stream": ["Hel", "lo"], "finish_reason": "max_tokens",
                       "usage": {"input_tokens": 3, "output_tokens": 2}},
                      {"stream": ["Hel", overloaded]}]) as srv:
        client = anthropic.AsyncAnthropic(base_url=srv.root_url, api_key="k", max_retries=0)
        message = await client.messages.create(model="m", max_tokens=10, messages=ASK)
        with pytest.raises(anthropic.APIStatusError) as info:
            await client.messages.create(model="m", max_tokens=10, messages=ASK)
        await client.close()
    assert message.type == "message" and [b.text for b in message.content] == ["Hello"]
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 2
    assert info.value.status_code == 529 and "Overloaded" in str(info.value)


def test_fault_server_help_names_both_apis_and_each_sdks_base_url(capsys):
    """`fault-server --help` names both APIs and the base URL each SDK takes: the printed one for
    OpenAI, the root without /v1 for Anthropic (docs/embedding.md, "The Anthropic Messages API")."""
    with pytest.raises(SystemExit):
        cli.main(["fault-server", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "/v1/chat/completions" in out and "/v1/messages" in out
    assert "openai.OpenAI(base_url=URL)" in out
    assert 'anthropic.Anthropic(base_url="http://HOST:PORT")' in out
    assert "anthropic.Anthropic(base_url=URL)" not in out
