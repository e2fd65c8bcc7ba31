"""``retry.providers`` reaches every host that knows the provider a call goes to
(docs/policy.md §13.4; docs/integrations.md, the one table's "``retry.providers`` entries" row):
the httpx2 transports (``provider=``, else the URL's host; the JSON body's ``model``), the runner
(its ``key``, else the callable's top-level module and ``model=``) and the LangGraph node
wrapper resolve the settings of each call with
:meth:`~fsm.core.settings.RetrySettings.for_provider`. One script: a 529, then a success; the
base settings retry it, the ``openai`` entry's ``maxRetries: 0`` refuses it at rest."""

from __future__ import annotations

import asyncio

import httpx2
import openai
import pytest

from fsm import RetryRunner
from fsm.core.settings import SettingsError
from fsm.integrations.httpx2 import AsyncRetryTransport, RetryTransport
from fsm.testing.fault_server import FaultServer

OVERLOADED = {"status": 529, "json": {"type": "error", "error": {"type": "overloaded_error",
                                                                 "message": "Overloaded"}}}
OK = {"stream": ["ok"]}
PROMPT = [{"role": "user", "content": "hi"}]
BASE = {"maxRetries": 3, "baseDelayMs": 1, "maxDelayMs": 1, "jitter": "none"}
KEY = "sk-test"


def _no_wait(seconds: float) -> None:
    return None


async def _no_wait_async(seconds: float) -> None:
    return None


def _transport_sync(srv, settings, events, provider):
    transport = RetryTransport(settings=settings, on_event=events.append, provider=provider,
                               sleep=_no_wait)
    with httpx2.Client(transport=transport) as http:
        client = openai.OpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0,
                               http_client=http)
        return client.chat.completions.create(model="gpt-test", messages=PROMPT)


def _transport_async(srv, settings, events, provider):
    async def run():
        transport = AsyncRetryTransport(settings=settings, on_event=events.append,
                                        provider=provider)
        async with httpx2.AsyncClient(transport=transport) as http:
            client = openai.AsyncOpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0,
                                        http_client=http)
            return await client.chat.completions.create(model="gpt-test", messages=PROMPT)
    return asyncio.run(run())


def _runner_sync(srv, settings, events, provider):
    # no key: the provider is the callable's top-level module ("openai")
    client = openai.OpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0)
    runner = RetryRunner(settings, on_event=events.append, sleep=_no_wait)
    return runner.run_sync(client.chat.completions.create, model="gpt-test", messages=PROMPT)


def _runner_async(srv, settings, events, provider):
    from fsm.fleet import CoordKey

    async def run():
        runner = RetryRunner(settings, on_event=events.append, sleep=_no_wait_async,
                             key=CoordKey(provider, "gpt-test"))
        async with openai.AsyncOpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0) as client:
            return await runner.run(client.chat.completions.create, model="gpt-test",
                                    messages=PROMPT)
    return asyncio.run(run())


def _langgraph_sync(srv, settings, events, provider):
    from fsm.integrations.langgraph import retry_node
    client = openai.OpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0)

    @retry_node(settings, on_event=events.append, sleep=_no_wait, provider=provider,
                model="gpt-test")
    def ask():
        return client.chat.completions.create(model="gpt-test", messages=PROMPT)
    return ask()


HOSTS = {"httpx2 sync": _transport_sync, "httpx2 async": _transport_async,
         "runner sync": _runner_sync, "runner async": _runner_async,
         "LangGraph sync": _langgraph_sync}


def _run(host, entry):
    settings = {**BASE, "providers": {entry: {"maxRetries": 0}}}
    events: list = []
    with FaultServer([OVERLOADED, OK]) as srv:
        try:
            result, error = HOSTS[host](srv, settings, events, "openai"), None
        except openai.APIStatusError as exc:
            result, error = None, exc
        requests = len(srv.chat_requests)
    ends = [(e["success"], e["attempt"], e["endReason"]) for e in events
            if e["type"] == "auto_retry_end"]
    return result, error, requests, ends


@pytest.mark.parametrize("entry", ["openai", "openai/gpt-test"])
@pytest.mark.parametrize("host", sorted(HOSTS))
def test_the_providers_entry_of_the_call_applies(host, entry):
    """The ``openai`` (or ``openai/gpt-test``) entry's ``maxRetries: 0`` refuses the 529 at
    rest: one request, the SDK's own exception, ``auto_retry_end`` at attempt 0 (docs/policy.md
    §10, §13.4)."""
    result, error, requests, ends = _run(host, entry)
    assert (result, requests, ends) == (None, 1, [(False, 0, "exhausted")])
    assert isinstance(error, openai.APIStatusError) and error.status_code == 529


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_another_providers_entry_does_not(host):
    """An entry for another provider leaves the base settings: the 529 is retried."""
    result, error, requests, ends = _run(host, "anthropic")
    assert error is None and requests == 2 and ends == [(True, 1, "succeeded")]


@pytest.mark.parametrize("build", [
    lambda s: RetryTransport(settings=s), lambda s: AsyncRetryTransport(settings=s),
    lambda s: RetryRunner(s)], ids=["httpx2 sync", "httpx2 async", "runner"])
def test_a_stall_watchdog_in_a_providers_entry_is_refused_like_a_top_level_one(build):
    """A host that cannot act on ``idleTimeoutMs`` refuses it inside a ``providers`` entry too,
    naming the entry (docs/integrations.md: "refused"), when it is built."""
    with pytest.raises(SettingsError, match=r'providers\["openai"\]\.idleTimeoutMs'):
        build({"providers": {"openai": {"idleTimeoutMs": 1000}}})
