"""The brain around the Google Gen AI SDK's calls, with the real google-genai package on its
defaults (httpx2 for sync calls, aiohttp for ``client.aio``) against the fault server's Gemini
routes (docs/integrations.md, "Google Gen AI"). The API key is a dummy and every connection the
tests open is checked to stay on the loopback interface (SPEC §15.13 "No traffic off the
machine")."""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from pathlib import Path

import pytest
from google import genai
from google.genai import errors, types

from fsm.core.settings import SettingsError
from fsm.integrations.genai import BrainClient, SDKRetriesError, http_options
from fsm.testing.fault_server import FaultServer

ROOT = Path(__file__).resolve().parents[2]
FAST = {"baseDelayMs": 1, "maxDelayMs": 5}
KEY = "AIzaDummyKeyForTheFaultServer0123456789"


def gemini_error(code, status, message, *details):
    body = {"error": {"code": code, "message": message, "status": status}}
    if details:
        body["error"]["details"] = list(details)
    return {"status": code, "json": body}


def retry_info(delay):
    return {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}


UNAVAILABLE = gemini_error(503, "UNAVAILABLE", "The model is overloaded. Please try again later.")
INTERNAL = gemini_error(500, "INTERNAL", "An internal error has occurred. Please retry or report.")
BAD_KEY = gemini_error(400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid API key.",
                       {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID",
                        "domain": "googleapis.com"})
DROP_BEFORE_OUTPUT = {"stream": [], "drop": True}


def exhausted(delay):
    return gemini_error(429, "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota).",
                        retry_info(delay))


@pytest.fixture(autouse=True)
def no_traffic_off_the_machine(monkeypatch):
    """Every connection attempt and name lookup of a test is recorded; a non-loopback one fails
    the test (SPEC §15.13)."""
    seen = []
    connect, lookup = socket.socket.connect, socket.getaddrinfo

    def loopback(host):
        try:
            return host == "localhost" or ipaddress.ip_address(str(host).split("%")[0]).is_loopback
        except ValueError:
            return False

    def guarded_connect(sock, address):
        seen.append(address)
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not loopback(address[0]):
            raise AssertionError(f"a connection off the machine: {address!r}")
        return connect(sock, address)

    def guarded_lookup(host, *args, **kwargs):
        if not loopback(host if not isinstance(host, bytes) else host.decode()):
            raise AssertionError(f"a name lookup off the machine: {host!r}")
        return lookup(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket, "getaddrinfo", guarded_lookup)
    yield seen
    assert all(loopback(address[0]) for address in seen if isinstance(address, tuple))


class Instant:
    """A host clock whose waits end at once (recorded) and whose time stands still, so a test
    of hinted waits takes no real time and a loaded machine cannot let a cooldown run out."""

    def __init__(self):
        self.waits = []

    def call_later(self, delay_s, callback, *args):
        self.waits.append(round(delay_s * 1000))
        return asyncio.get_running_loop().call_soon(callback, *args)

    def time_ms(self):
        return 1_000_000


def client_for(srv, **fields):
    return genai.Client(api_key=KEY, http_options=http_options(base_url=srv.root_url, **fields))


def brain_for(srv, settings=FAST, events=None, **options):
    on_event = (lambda e: events.append(dict(e))) if events is not None else None
    options.setdefault("sleep", lambda s: None)
    return BrainClient(client_for(srv), settings, on_event=on_event, **options)


def generate_paths(srv):
    return [re.sub(r"^/v1(beta)?", "", r["path"]) for r in srv.chat_requests]


def test_a_503_then_success_is_retried_and_the_chain_ends_succeeded(no_traffic_off_the_machine):
    """models.generate_content: a 503 UNAVAILABLE, then the answer; one retry, the chain ends
    success: true (docs/integrations.md "Google Gen AI")."""
    events = []
    with FaultServer([UNAVAILABLE]) as srv:
        reply = brain_for(srv, events=events).models.generate_content(model="gemini-x", contents="hi")
        assert reply.text == "ok"
        assert generate_paths(srv) == ["/models/gemini-x:generateContent"] * 2
        assert srv.chat_requests[0]["headers"]["x-goog-api-key"] == KEY
    assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_end"]
    assert events[-1]["success"] is True and events[0]["attempt"] == 1
    assert no_traffic_off_the_machine, "the connections were seen"


def test_the_retry_info_delay_is_honoured():
    """retryHints honor: a 429 RESOURCE_EXHAUSTED whose details carry RetryInfo retryDelay "3s"
    waits 3 s (the hint, not the backoff): delaySource hint, the sleep given 3.0 s."""
    events, slept = [], []
    with FaultServer([exhausted("3s")]) as srv:
        gemini = brain_for(srv, {**FAST, "retryHints": "honor"}, events, sleep=slept.append)
        assert gemini.models.generate_content(model="m", contents="hi").text == "ok"
    assert (events[0]["delayMs"], events[0]["delaySource"]) == (3000, "hint")
    assert slept == [3.0]


def test_a_fatal_error_is_not_retried_and_is_the_sdk_s_own():
    """A 400 INVALID_ARGUMENT (API key not valid): one request, no chain, the SDK's ClientError."""
    events = []
    with FaultServer([BAD_KEY]) as srv:
        with pytest.raises(errors.ClientError) as caught:
            brain_for(srv, events=events).models.generate_content(model="m", contents="hi")
        assert len(srv.chat_requests) == 1
    assert caught.value.code == 400 and events == []


def test_a_context_overflow_is_not_retried_and_says_so():
    """A 400 INVALID_ARGUMENT 'The input token count (N) exceeds the maximum number of tokens
    allowed (M)': one request, the SDK's ClientError noted 'not retried (context overflow)'."""
    overflow = gemini_error(400, "INVALID_ARGUMENT", "The input token count (1200293) exceeds the "
                                                     "maximum number of tokens allowed (1048576).")
    with FaultServer([overflow]) as srv:
        with pytest.raises(errors.ClientError) as caught:
            brain_for(srv).models.generate_content(model="m", contents="hi")
        assert len(srv.chat_requests) == 1
    assert "retry-fsm: not retried (context overflow)" in caught.value.__notes__


def test_an_exhausted_chain_re_raises_the_sdk_error_with_its_end_reason():
    """maxRetries 2, every attempt 503: 3 requests, the SDK's ServerError with
    'retry-fsm: endReason exhausted' in its notes (docs/integrations.md "Google Gen AI")."""
    events = []
    with FaultServer([UNAVAILABLE] * 3) as srv:
        with pytest.raises(errors.ServerError) as caught:
            brain_for(srv, {**FAST, "maxRetries": 2}, events).models.generate_content(model="m", contents="hi")
        assert len(srv.chat_requests) == 3
    assert "retry-fsm: endReason exhausted" in caught.value.__notes__
    assert events[-1]["endReason"] == "exhausted" and events[-1]["success"] is False


def test_a_refusal_at_rest_is_the_sdk_s_error_with_the_loop_s_note():
    """maxRetries 0 (SPEC §14b.14): a 503 is not retried; the SDK's ServerError carries
    'retry-fsm: not retried (endReason: exhausted, attempt 0)', and one end event is emitted."""
    events = []
    with FaultServer([UNAVAILABLE]) as srv:
        with pytest.raises(errors.ServerError) as caught:
            brain_for(srv, {**FAST, "maxRetries": 0}, events).models.generate_content(model="m", contents="hi")
        assert len(srv.chat_requests) == 1
    assert caught.value.__notes__ == ["retry-fsm: not retried (endReason: exhausted, attempt 0)"]
    assert [(e["type"], e["attempt"]) for e in events] == [("auto_retry_end", 0)]


def test_a_stream_dropped_before_output_is_retried():
    """models.generate_content_stream: the connection cut before the first chunk is retried;
    the caller gets only the second attempt's chunks."""
    events = []
    with FaultServer([DROP_BEFORE_OUTPUT, {"stream": ["Hel", "lo"]}]) as srv:
        chunks = brain_for(srv, events=events).models.generate_content_stream(model="m", contents="hi")
        assert [c.text for c in chunks] == ["Hel", "lo"]
        assert generate_paths(srv) == ["/models/m:streamGenerateContent?alt=sse"] * 2
    assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_end"]
    assert events[-1]["success"] is True


def test_a_stream_cut_after_output_follows_after_output_stop():
    """afterOutput "stop": a stream cut after its first chunk reached the caller is not replayed
    (docs/policy.md §3 D12): one request, the chunk given, then the transport's error with the
    end reason in its notes."""
    got = []
    with FaultServer([{"stream": ["Hel"], "drop": True}]) as srv:
        chunks = brain_for(srv, {**FAST, "afterOutput": "stop"}).models.generate_content_stream(
            model="m", contents="hi")
        with pytest.raises(Exception) as caught:
            for chunk in chunks:
                got.append(chunk.text)
        assert len(srv.chat_requests) == 1
    assert got == ["Hel"]
    assert any("output_streamed" in note for note in caught.value.__notes__)


def test_a_stream_cut_after_output_is_replayed_under_after_output_retry():
    """afterOutput "retry" (the default): a stream cut after its first chunk starts again; the
    caller receives the new attempt's chunks after the one already given (docs/integrations.md
    "Google Gen AI", Streams)."""
    events = []
    with FaultServer([{"stream": ["Hel"], "drop": True}, {"stream": ["Hello"]}]) as srv:
        chunks = brain_for(srv, events=events).models.generate_content_stream(model="m", contents="hi")
        assert [c.text for c in chunks] == ["Hel", "Hello"]
        assert len(srv.chat_requests) == 2
    assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_end"]
    assert events[-1]["success"] is True


async def test_async_generate_content_retries_a_500():
    """client.aio.models.generate_content (aiohttp underneath): a 500 INTERNAL, then the answer."""
    events = []
    with FaultServer([INTERNAL]) as srv:
        gemini = brain_for(srv, events=events, clock=Instant())
        reply = await gemini.aio.models.generate_content(model="m", contents="hi")
        assert reply.text == "ok"
        assert len(srv.chat_requests) == 2
    assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_end"]


async def test_async_stream_retries_a_drop_and_an_error_event_before_output():
    """client.aio.models.generate_content_stream: a cut before any chunk, then an
    {"error": {"code": 503, "status": "UNAVAILABLE"}} event inside a 200 stream before any
    chunk: both retried, the third stream answers; the hint of RetryInfo is the wait."""
    events, clock = [], Instant()
    unavailable_event = {"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE",
                                   "details": [retry_info("0.25s")]}}
    with FaultServer([DROP_BEFORE_OUTPUT, {"stream": [unavailable_event]}, {"stream": ["Hel", "lo"]}]) as srv:
        gemini = brain_for(srv, {**FAST, "retryHints": "honor"}, events, clock=clock)
        chunks = [c.text async for c in await gemini.aio.models.generate_content_stream(model="m", contents="hi")]
        assert chunks == ["Hel", "lo"]
        assert len(srv.chat_requests) == 3
    assert [e["type"] for e in events] == ["auto_retry_start"] * 2 + ["auto_retry_end"]
    assert (events[1]["delayMs"], events[1]["delaySource"]) == (250, "hint")
    assert 250 in clock.waits


async def test_a_call_cancelled_in_its_backoff_ends_its_chain_cancelled():
    """A task cancelled while the brain waits before its retry: the chain ends cancelled (one
    auto_retry_end), the cancellation goes on, no second request (docs/policy.md §10)."""

    class Never(Instant):  # a wait that does not end by itself
        def call_later(self, delay_s, callback, *args):
            return asyncio.get_running_loop().call_later(3600, callback, *args)

    events, started = [], asyncio.Event()

    def on_event(event):
        events.append(dict(event))
        started.set()

    with FaultServer([UNAVAILABLE]) as srv:
        gemini = BrainClient(client_for(srv), FAST, on_event=on_event, clock=Never())
        task = asyncio.create_task(gemini.aio.models.generate_content(model="m", contents="hi"))
        await asyncio.wait_for(started.wait(), 30)  # a hang guard, not a margin
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(srv.chat_requests) == 1
    assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_end"]
    assert events[-1]["endReason"] == "cancelled"


async def test_async_fatal_error_raises_at_the_await():
    """The async stream's errors before output raise at the await, as the SDK's do: a 400 is
    the SDK's ClientError, one request."""
    with FaultServer([BAD_KEY]) as srv:
        with pytest.raises(errors.ClientError):
            await brain_for(srv, clock=Instant()).aio.models.generate_content_stream(model="m", contents="hi")
        assert len(srv.chat_requests) == 1


async def test_a_cooldown_learned_by_one_call_delays_the_next_call_s_retry():
    """Two calls on one coordinator: the RetryInfo hint the first learned is the fleet's
    cooldown, so the second call's retry of a 503 waits for it (delaySource cooldown), as every
    host's does (docs/fleet.md). The coordinator's clock stands still."""
    from fsm.fleet import InProcessCoordinator
    coordinator = InProcessCoordinator(clock=lambda: 1_000_000)
    settings = {**FAST, "retryHints": "honor", "maxHintWaitMs": 5000}
    first, second = [], []
    with FaultServer([exhausted("0.4s"), {}, UNAVAILABLE]) as srv:
        for events in (first, second):
            gemini = brain_for(srv, settings, events, clock=Instant(), coordinator=coordinator)
            assert (await gemini.aio.models.generate_content(model="m", contents="hi")).text == "ok"
    assert first[0]["delaySource"] == "hint"
    assert second[0]["delaySource"] == "cooldown" and second[0]["delayMs"] > FAST["maxDelayMs"]


async def test_the_fleet_s_retry_budget_ends_a_chain():
    """budget maxTokens 4 on the coordinator: the first 503 takes a token and is retried, the
    second leaves 2 (not above half) and the chain ends budget, the SDK's ServerError noted so
    (docs/policy.md §9)."""
    from fsm.fleet import InProcessCoordinator
    events = []
    settings = {**FAST, "maxRetries": 5, "budget": {"maxTokens": 4}}
    with FaultServer([UNAVAILABLE] * 3) as srv:
        gemini = brain_for(srv, settings, events, clock=Instant(),
                           coordinator=InProcessCoordinator(clock=lambda: 1_000_000))
        with pytest.raises(errors.ServerError) as caught:
            await gemini.aio.models.generate_content(model="m", contents="hi")
        assert len(srv.chat_requests) == 2
    assert "retry-fsm: endReason budget" in caught.value.__notes__
    assert events[-1]["endReason"] == "budget"


def test_a_client_that_retries_on_its_own_is_refused():
    """One retry owner: a client with HttpRetryOptions(attempts=3), or with attempts unset (the
    SDK's 5), raises SDKRetriesError naming the fix; so does a call whose config asks for
    retries — before any request."""
    with FaultServer([]) as srv:
        for retry in (types.HttpRetryOptions(attempts=3), types.HttpRetryOptions()):
            client = genai.Client(api_key=KEY, http_options=types.HttpOptions(base_url=srv.root_url,
                                                                              retry_options=retry))
            with pytest.raises(SDKRetriesError, match=r"HttpRetryOptions\(attempts=1\)"):
                BrainClient(client, FAST)
        gemini = brain_for(srv)
        config = types.GenerateContentConfig(
            http_options=types.HttpOptions(retry_options=types.HttpRetryOptions(attempts=4)))
        with pytest.raises(SDKRetriesError, match="4 attempts"):
            gemini.models.generate_content(model="m", contents="hi", config=config)
        with pytest.raises(SDKRetriesError):
            gemini.models.generate_content_stream(model="m", contents="hi", config={
                "http_options": {"retry_options": {"attempts": 2}}})
        assert srv.chat_requests == []


def test_the_call_s_config_is_kept_and_the_sdk_retries_off():
    """A call's own config (a temperature, its own headers) goes out as given; a default client
    (no retry_options) is accepted, and its calls carry one attempt."""
    with FaultServer([]) as srv:
        client = genai.Client(api_key=KEY, http_options=types.HttpOptions(base_url=srv.root_url))
        gemini = BrainClient(client, FAST, sleep=lambda s: None)
        config = {"temperature": 0.25, "http_options": {"headers": {"x-test": "1"}}}
        assert gemini.models.generate_content(model="m", contents="hi", config=config).text == "ok"
        request = srv.chat_requests[0]
        assert request["body"]["generationConfig"]["temperature"] == 0.25
        assert request["headers"]["x-test"] == "1"
    assert config == {"temperature": 0.25, "http_options": {"headers": {"x-test": "1"}}}


async def test_a_default_client_s_async_calls_go_with_one_attempt(monkeypatch):
    """A client built without retry_options (the SDK's default, whose async client retries an
    aiohttp connection error on its own): each async call's config carries
    HttpRetryOptions(attempts=1), the call's own fields kept; sync calls go as given."""
    from google.genai.models import AsyncModels
    seen = []
    original = AsyncModels.generate_content

    async def spy(self, **kwargs):
        seen.append(kwargs["config"])
        return await original(self, **kwargs)

    monkeypatch.setattr(AsyncModels, "generate_content", spy)
    with FaultServer([]) as srv:
        client = genai.Client(api_key=KEY, http_options=types.HttpOptions(base_url=srv.root_url))
        gemini = BrainClient(client, FAST, clock=Instant())
        await gemini.aio.models.generate_content(model="m", contents="hi", config={"temperature": 0.5})
        assert srv.chat_requests[0]["body"]["generationConfig"]["temperature"] == 0.5
    assert seen[0]["temperature"] == 0.5
    assert seen[0]["http_options"].retry_options.attempts == 1


def test_what_reaches_the_caller_shows_no_api_key():
    """A server echoing the API key in its error: the re-raised SDK error's text and notes and
    every event show it scrubbed (docs/integrations.md "Exceptions")."""
    events = []
    echo = gemini_error(503, "UNAVAILABLE", f"backend unavailable for key {KEY}")
    with FaultServer([echo, echo]) as srv:
        with pytest.raises(errors.ServerError) as caught:
            brain_for(srv, {**FAST, "maxRetries": 1}, events).models.generate_content(model="m", contents="hi")
    shown = (str(caught.value) + " ".join(caught.value.__notes__) + str(caught.value.message)
             + repr(caught.value.details) + repr(events))
    assert KEY not in shown
    response = caught.value.response  # the SDK's httpx response, its body read
    assert "backend unavailable for key [redacted]" in response.text
    assert KEY not in response.text and KEY.encode() not in response.content
    assert events and events[-1]["endReason"] == "exhausted"


def test_settings_the_wrapper_cannot_act_on_are_refused():
    """The timeouts raise SettingsError naming the key; a client that is not a genai.Client is
    a TypeError."""
    with FaultServer([]) as srv:
        client = client_for(srv)
        with pytest.raises(SettingsError, match="attemptTimeoutMs"):
            BrainClient(client, {"attemptTimeoutMs": 1000})
        with pytest.raises(SettingsError, match="idleTimeoutMs"):
            BrainClient(client, {"idleTimeoutMs": 1000})
    with pytest.raises(TypeError, match="genai.Client"):
        BrainClient(object())


def test_a_fallback_model_is_called_after_the_switch():
    """fallbackModels: after fallbackAfter overloads the retry calls the next model's path."""
    with FaultServer([UNAVAILABLE]) as srv:
        gemini = brain_for(srv, {**FAST, "fallbackModels": ["gemini-lite"], "fallbackAfter": 1})
        assert gemini.models.generate_content(model="gemini-pro", contents="hi").text == "ok"
        assert generate_paths(srv) == ["/models/gemini-pro:generateContent",
                                       "/models/gemini-lite:generateContent"]


def test_other_attributes_are_the_client_s_own():
    """Only the generate calls are wrapped: client.models' other methods and the client's other
    resources are the SDK's, untouched."""
    with FaultServer([]) as srv:
        client = client_for(srv)
        gemini = BrainClient(client, FAST)
        assert gemini.files is client.files and type(gemini.aio.chats) is type(client.aio.chats)
        assert gemini.models.count_tokens == client.models.count_tokens


def test_the_chain_error_is_marked_for_frameworks():
    """An error a brain chain ended with is marked, so a framework's retry hook that asks
    (LangGraph's brain_retry_on) does not retry it again (one retry owner)."""
    from fsm.integrations.langgraph import brain_retry_on
    with FaultServer([UNAVAILABLE] * 2) as srv:
        with pytest.raises(errors.ServerError) as caught:
            brain_for(srv, {**FAST, "maxRetries": 1}).models.generate_content(model="m", contents="hi")
    assert brain_retry_on(FAST)(caught.value) is False


def test_the_documented_example_runs_as_written(monkeypatch):
    """docs/integrations.md's Google Gen AI example, run as written against the fault server
    (its base URL and key from GOOGLE_GEMINI_BASE_URL, GEMINI_API_KEY): the first call retries a
    503 and prints its events, then every call prints its answer."""
    docs = (ROOT / "docs" / "integrations.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n(# Google Gen AI.*?)```", docs, re.S).group(1)
    printed = []
    with FaultServer([UNAVAILABLE]) as srv:
        monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", srv.root_url)
        monkeypatch.setenv("GEMINI_API_KEY", KEY)
        exec(compile(block, "docs/integrations.md", "exec"), {"print": printed.append})
        assert len(srv.chat_requests) == 4
    assert [type(e).__name__ for e in printed[:2]] == ["AutoRetryStart", "AutoRetryEnd"]
    assert printed[0]["delayMs"] == 100  # the example's baseDelayMs
    assert printed[2:] == ["ok", "ok", "ok"]
