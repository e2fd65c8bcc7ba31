"""An error an integration raises or re-raises to its caller shows no credential: a connection
error naming the request's URL (``user:password@``, ``?api_key=``) keeps its type and its
``__cause__``, its text (and the causes' texts, as a traceback prints them) scrubbed."""

from __future__ import annotations

import socket
import traceback
from types import SimpleNamespace

import httpx2
import pytest
import tenacity

import fsm
from fsm.host.chain import RETRY_OWNER
from fsm.integrations.httpx2 import AsyncRetryTransport, RetryTransport
from fsm.integrations.langchain import RetryBrainMiddleware
from fsm.integrations.pydantic_ai import RetryBrainCapability
from fsm.integrations.tenacity import BrainStrategy
from fsm.testing import FakeClock

FAST = {"baseDelayMs": 0, "maxRetries": 1}  # no backoff to wait: no real sleep


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def secret_url(tag: str) -> tuple[str, str, str]:
    """A URL on a free loopback port (nothing listens) with a password and an ``?api_key=``."""
    password, key = f"Pw{tag}9xK2mW7vP4", f"Key{tag}3nB6cJ1qZ8"
    return f"http://user:{password}@127.0.0.1:{free_port()}/v1?api_key={key}", password, key


def shown(exc: BaseException) -> str:
    """Everything a printed traceback shows of ``exc``: its text, notes and causes."""
    return "".join(traceback.format_exception(exc))


class Naming(httpx2.BaseTransport, httpx2.AsyncBaseTransport):
    """A wrapped transport (a proxy layer, a logging one) whose connection error names the URL."""

    def handle_request(self, request):
        try:
            return httpx2.HTTPTransport().handle_request(request)
        except httpx2.ConnectError as exc:
            raise httpx2.ConnectError(f"cannot connect to {request.url}: {exc}") from exc

    async def handle_async_request(self, request):
        try:
            async with httpx2.AsyncHTTPTransport() as inner:
                return await inner.handle_async_request(request)
        except httpx2.ConnectError as exc:
            raise httpx2.ConnectError(f"cannot connect to {request.url}: {exc}") from exc


def test_the_sync_transport_re_raises_a_connection_error_without_the_url_s_credentials():
    """RetryTransport: the exhausted chain's ConnectError keeps type and cause, loses the secrets."""
    url, password, key = secret_url("SyncT")
    events = []
    transport = RetryTransport(Naming(), settings=FAST, sleep=lambda s: None,
                               on_event=lambda e: events.append(dict(e)))
    with httpx2.Client(transport=transport) as client, pytest.raises(httpx2.ConnectError) as caught:
        client.get(url)
    text = shown(caught.value)
    assert "cannot connect to http://user:[redacted]@127.0.0.1:" in str(caught.value)
    assert isinstance(caught.value.__cause__, httpx2.ConnectError)
    assert "endReason exhausted" in text
    assert password not in text and key not in text
    assert events[-1]["endReason"] == "exhausted"
    assert password not in repr(events) and key not in repr(events)


async def test_the_async_transport_re_raises_a_connection_error_without_the_url_s_credentials():
    """AsyncRetryTransport: the same, the event text scrubbed too."""
    url, password, key = secret_url("AsyncT")
    events = []
    transport = AsyncRetryTransport(Naming(), settings=FAST,
                                    on_event=lambda e: events.append(dict(e)))
    async with httpx2.AsyncClient(transport=transport) as client:
        with pytest.raises(httpx2.ConnectError) as caught:
            await client.get(url)
    text = shown(caught.value)
    assert "api_key=[redacted]" in str(caught.value)
    assert caught.value.__cause__ is not None
    assert password not in text and key not in text
    assert events and password not in repr(events) and key not in repr(events)


def failing_call(url: str):
    """A call whose error names ``url`` and carries the request (as the SDKs' errors do)."""
    def call():
        request = httpx2.Request("GET", url)
        raise httpx2.ConnectError(f"cannot connect to {url}", request=request)
    return call


@pytest.mark.parametrize("max_retries", [0, 1])
def test_tenacity_re_raises_the_caller_s_error_scrubbed(max_retries):
    """BrainStrategy: at rest the caller's own error, after a chain RetryChainError from it."""
    url, password, key = secret_url(f"Ten{max_retries}")
    strategy = BrainStrategy({**FAST, "maxRetries": max_retries}, clock=FakeClock())
    expected = fsm.RetryChainError if max_retries else httpx2.ConnectError
    with pytest.raises(expected) as caught:
        tenacity.retry(**strategy.kwargs())(failing_call(url))()
    text = shown(caught.value)
    assert "cannot connect to http://user:[redacted]@" in text
    assert password not in text and key not in text


def test_the_langchain_middleware_re_raises_the_model_s_error_scrubbed():
    """RetryBrainMiddleware: the exhausted chain's RetryChainError and its cause show no secret."""
    url, password, key = secret_url("Lang")
    middleware = RetryBrainMiddleware(FAST, sleep=lambda s: None)
    with pytest.raises(fsm.RetryChainError) as caught:
        middleware.wrap_model_call(SimpleNamespace(model=None), lambda request: failing_call(url)())
    text = shown(caught.value)
    assert isinstance(caught.value.__cause__, httpx2.ConnectError)
    assert password not in text and key not in text


async def test_the_pydantic_ai_capability_re_raises_the_model_s_error_scrubbed():
    """RetryBrainCapability: a refusal at rest (maxRetries 0) re-raises the model's own error,
    scrubbed, its end reason noted, as the runner does (docs/policy.md §10)."""
    url, password, key = secret_url("Pyd")
    capability = RetryBrainCapability({**FAST, "maxRetries": 0})
    context = SimpleNamespace(model=None)
    token = RETRY_OWNER.set(capability._chain(context))
    try:
        with pytest.raises(httpx2.ConnectError) as caught:
            try:
                failing_call(url)()
            except httpx2.ConnectError as error:
                await capability.on_model_request_error(None, request_context=context, error=error)
    finally:
        RETRY_OWNER.reset(token)
    text = shown(caught.value)
    assert "api_key=[redacted]" in str(caught.value)
    assert caught.value.__notes__ == ["retry-fsm: not retried (endReason: exhausted, attempt 0)"]
    assert password not in text and key not in text


async def test_the_runner_re_raises_the_caller_s_error_and_chains_its_end_without_credentials():
    """fsm.retrying: the caller's own connection error (no chain: retry disabled) and the
    RetryChainError's cause (a chain that ran out) show no password or key."""
    url, password, key = secret_url("run")

    async def call(**kwargs):
        raise ConnectionError(f"cannot connect to {url}")

    async def no_sleep(seconds):
        """No backoff to wait."""

    for settings, expected in (({"enabled": False}, ConnectionError), (FAST, fsm.RetryChainError)):
        runner = fsm.RetryRunner(settings, sleep=no_sleep)
        with pytest.raises(expected) as info:
            await runner.run(call)
        text = shown(info.value)
        assert "cannot connect to http://user:" in text
        assert password not in text and key not in text, text


# ------------------------------------------------------------------------------------------
# A key the provider echoes in its error body (issue 33: "after an exhausted chain the SDK's
# own exception text carries a key the provider echoed"): every integration, with the real
# SDK and framework against the fault server. The key is not of the ``sk-`` shape, so only the
# request's own credentials (its ``authorization`` header) can name it; each test has its own.

def echoed_key(tag: str) -> str:
    return f"gwkey-{tag}-Zq9xK2mW7vP4rT8yL3nB6cJ1"


def echoing(key: str, count: int = 2) -> list[dict]:
    """``count`` 529 answers whose error body echoes ``key`` (as some gateways do)."""
    body = {"type": "error", "error": {"type": "overloaded_error",
                                       "message": f"Overloaded for API key {key}; try again"}}
    return [{"status": 529, "json": body}] * count


def response_text(response: object) -> str:
    """What ``exc.response`` shows of its body (an httpx/httpx2 response read or not, or
    another SDK's response object: its ``text``), "" when it has none."""
    if response is None:
        return ""
    content = getattr(response, "_content", None)
    if isinstance(content, bytes):
        return content.decode("utf-8", "replace")
    text = getattr(response, "text", None)
    return text if isinstance(text, str) else ""


def assert_scrubbed(exc: BaseException, key: str) -> None:
    """Nothing a traceback prints (text, notes, causes) nor the SDK error's body holds the key;
    the text still says what happened."""
    text = shown(exc)
    assert key not in text, text
    assert "Overloaded for API key [redacted]" in text, text
    cause: BaseException | None = exc
    while cause is not None:
        assert key not in repr(getattr(cause, "body", None))
        assert key not in response_text(getattr(cause, "response", None)), cause
        cause = cause.__cause__ or cause.__context__


def openai_client(srv, key: str, **options):
    import openai
    return openai.OpenAI(base_url=srv.base_url, api_key=key, max_retries=0, **options)


def async_openai_client(srv, key: str, **options):
    import openai
    return openai.AsyncOpenAI(base_url=srv.base_url, api_key=key, max_retries=0, **options)


MESSAGES = [{"role": "user", "content": "hi"}]


def test_the_sync_transport_hands_the_sdk_a_scrubbed_body():
    """RetryTransport: the exhausted chain's last response goes back to the SDK with the echoed
    key scrubbed from its body, so the SDK's own InternalServerError (status 529) shows none."""
    import openai
    from fsm.testing.fault_server import FaultServer
    key = echoed_key("tsync")
    with FaultServer(echoing(key)) as srv:
        transport = RetryTransport(settings=FAST, sleep=lambda s: None)
        client = openai_client(srv, key, http_client=httpx2.Client(transport=transport))
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model="m", messages=MESSAGES)
        assert caught.value.status_code == 529 and len(srv.chat_requests) == 2
    assert_scrubbed(caught.value, key)


async def test_the_async_transport_hands_the_sdk_a_scrubbed_body():
    """AsyncRetryTransport: the same."""
    import openai
    from fsm.testing.fault_server import FaultServer
    key = echoed_key("tasync")
    with FaultServer(echoing(key)) as srv:
        client = async_openai_client(srv, key, http_client=httpx2.AsyncClient(
            transport=AsyncRetryTransport(settings=FAST)))
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model="m", messages=MESSAGES)
        assert caught.value.status_code == 529 and len(srv.chat_requests) == 2
    assert_scrubbed(caught.value, key)


async def test_the_runner_s_chain_error_and_its_sdk_cause_show_no_echoed_key():
    """fsm.retrying: RetryChainError from the SDK's own error, neither showing the key."""
    from fsm.testing.fault_server import FaultServer
    key = echoed_key("runner")
    with FaultServer(echoing(key)) as srv:
        client = async_openai_client(srv, key)
        with pytest.raises(fsm.RetryChainError) as caught:
            await fsm.retrying(client.chat.completions.create, model="m", messages=MESSAGES,
                               settings=FAST)
    assert_scrubbed(caught.value, key)


def test_tenacity_s_chain_error_and_its_sdk_cause_show_no_echoed_key():
    """BrainStrategy around the sync SDK client."""
    from fsm.testing.fault_server import FaultServer
    key = echoed_key("tenacity")
    with FaultServer(echoing(key)) as srv:
        client = openai_client(srv, key)
        strategy = BrainStrategy(FAST, clock=FakeClock())
        with pytest.raises(fsm.RetryChainError) as caught:
            tenacity.retry(**strategy.kwargs())(client.chat.completions.create)(model="m", messages=MESSAGES)
    assert_scrubbed(caught.value, key)


def test_the_langchain_middleware_s_error_shows_no_echoed_key():
    """RetryBrainMiddleware in a LangChain agent over ChatOpenAI."""
    from langchain.agents import create_agent
    from langchain_openai import ChatOpenAI
    from fsm.testing.fault_server import FaultServer
    key = echoed_key("langchain")
    with FaultServer(echoing(key)) as srv:
        model = ChatOpenAI(model="m", base_url=srv.base_url, api_key=key, max_retries=0)
        agent = create_agent(model, tools=[], middleware=[RetryBrainMiddleware(FAST, sleep=lambda s: None)])
        with pytest.raises(fsm.RetryChainError) as caught:
            agent.invoke({"messages": MESSAGES})
    assert_scrubbed(caught.value, key)


def test_the_langgraph_node_wrapper_s_error_shows_no_echoed_key():
    """retry_node over a node calling the sync SDK client."""
    from typing import TypedDict
    from langgraph.graph import END, START, StateGraph
    from fsm.integrations.langgraph import retry_node
    from fsm.testing.fault_server import FaultServer

    class State(TypedDict):
        answer: str

    key = echoed_key("langgraph")
    with FaultServer(echoing(key)) as srv:
        client = openai_client(srv, key)

        @retry_node(FAST, sleep=lambda s: None)
        def ask(state: State) -> dict:
            reply = client.chat.completions.create(model="m", messages=MESSAGES)
            return {"answer": reply.choices[0].message.content}

        graph = StateGraph(State)
        graph.add_node("ask", ask)
        graph.add_edge(START, "ask")
        graph.add_edge("ask", END)
        with pytest.raises(fsm.RetryChainError) as caught:
            graph.compile().invoke({"answer": ""})
    assert_scrubbed(caught.value, key)


async def test_the_agents_sdk_re_raises_its_own_error_without_the_echoed_key():
    """BrainRetryPolicy: the Agents SDK raises its own error when the policy ends the chain;
    the policy scrubbed it first (Responses API, the SDK's default)."""
    import openai
    from agents import Agent, OpenAIProvider, RunConfig, Runner, set_tracing_disabled
    from fsm.integrations.openai_agents import BrainRetryPolicy
    from fsm.testing.fault_server import FaultServer
    set_tracing_disabled(True)
    key = echoed_key("agents")
    with FaultServer(echoing(key)) as srv:
        client = async_openai_client(srv, key)
        brain = BrainRetryPolicy(FAST)
        agent = Agent(name="a", model="m", model_settings=brain.model_settings())
        with pytest.raises(openai.APIStatusError) as caught:
            await Runner.run(agent, "hi", hooks=brain.hooks(), run_config=RunConfig(
                model_provider=OpenAIProvider(openai_client=client), tracing_disabled=True))
        assert len(srv.chat_requests) == 2
    assert_scrubbed(caught.value, key)


async def test_the_pydantic_ai_capability_s_error_shows_no_echoed_key():
    """RetryBrainCapability: RetryChainError from pydantic-ai's ModelHTTPError (whose body and
    text carry the SDK error's), neither showing the key."""
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from fsm.testing.fault_server import FaultServer
    key = echoed_key("pydantic")
    with FaultServer(echoing(key)) as srv:
        model = OpenAIChatModel("m", provider=OpenAIProvider(openai_client=async_openai_client(srv, key)))
        agent = Agent(model, capabilities=[RetryBrainCapability(FAST)])
        with pytest.raises(fsm.RetryChainError) as caught:
            await agent.run("hi")
    assert_scrubbed(caught.value, key)
