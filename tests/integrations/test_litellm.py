"""The brain as LiteLLM's retry policy, with the real litellm package against the fault server's
OpenAI chat completions (``api_base=`` the fault server, model ``openai/<name>``), sync and
async, streamed and not, and through a ``litellm.Router`` (docs/integrations.md, "LiteLLM").
LiteLLM reads its bundled cost map (tests/conftest.py, SPEC §15.13)."""

from __future__ import annotations

import asyncio

import httpx2
import litellm
import pytest

from fsm.core.settings import SettingsError
from fsm.fleet import InProcessCoordinator
from fsm.host.errors import RetryChainError
from fsm.integrations.httpx2 import RetryTransport
from fsm.integrations.litellm import BrainLiteLLM, BrainRouter, LiteLLMRetriesError, litellm_message
from fsm.testing.fault_server import FaultServer

litellm.suppress_debug_info = True  # its "Give Feedback" banner on every error
FAST = {"baseDelayMs": 1, "maxDelayMs": 5}
HI = [{"role": "user", "content": "hi"}]
KEY = "sk-litellm-test-0123456789abcdef"
OVERLOADED = {"status": 529, "json": {"error": {"type": "overloaded_error", "message": "Overloaded"}}}
LIMITED = {"status": 429, "headers": {"retry-after-ms": "40"},
           "json": {"error": {"type": "rate_limit_error", "message": "slow down"}}}
UNAUTHORIZED = {"status": 401, "json": {"error": {"type": "authentication_error",
                                                  "message": f"Incorrect API key provided: {KEY}"}}}
CUT_BEFORE_OUTPUT = {"stream": [], "drop": True}
ERROR_EVENT = {"stream": [{"error": {"type": "overloaded_error", "message": "Overloaded"}}]}


def recorder():
    events = []
    return events, lambda e: events.append(dict(e))


def call(srv, **kwargs):
    return {"api_base": srv.base_url, "api_key": KEY, **kwargs}


def text_of(chunks):
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def model_list(srv, *groups):
    return [{"model_name": group, "litellm_params": {"model": f"openai/{name}", "api_base": srv.base_url,
                                                     "api_key": KEY}}
            for group, name in groups]


# ------------------------------------------------------------------ completion / acompletion
def test_a_529_then_success_is_retried_and_the_chain_ends_succeeded():
    """litellm.completion under the brain: a 529 is sent again after the brain's backoff, the
    reply is LiteLLM's ModelResponse, the chain ends success: true; LiteLLM's and the OpenAI
    client's own retries are off (one request per attempt, x-stainless-retry-count 0)."""
    events, on_event = recorder()
    brain = BrainLiteLLM(FAST, on_event=on_event)
    with FaultServer([OVERLOADED]) as srv:
        reply = brain.completion("openai/m", HI, **call(srv))
        assert reply.choices[0].message.content == "ok"
        assert [r["body"]["model"] for r in srv.chat_requests] == ["m", "m"]
        assert {r["headers"].get("x-stainless-retry-count") for r in srv.chat_requests} == {"0"}
    assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_end"]
    assert events[0]["rule"] == "structured.type_overloaded_error" and events[-1]["success"] is True


async def test_acompletion_waits_what_the_server_hint_says():
    """retryHints honor: a 429 with retry-after-ms 40 is read from the upstream response
    LiteLLM's RateLimitError carries; the retry waits the hint, not the backoff."""
    events, on_event = recorder()
    brain = BrainLiteLLM({**FAST, "retryHints": "honor"}, on_event=on_event)
    with FaultServer([LIMITED]) as srv:
        reply = await brain.acompletion("openai/m", HI, **call(srv))
        assert reply.choices[0].message.content == "ok"
        assert len(srv.chat_requests) == 2
    assert (events[0]["delayMs"], events[0]["delaySource"], events[0]["retryHintMs"]) == (40, "hint", 40)


def test_a_fatal_error_is_not_retried_and_shows_no_key():
    """A 401 is LiteLLM's own AuthenticationError after one request, no chain; the key the
    error body echoed is scrubbed from its text (docs/integrations.md "Exceptions")."""
    events, on_event = recorder()
    brain = BrainLiteLLM(FAST, on_event=on_event)
    with FaultServer([UNAUTHORIZED]) as srv:
        with pytest.raises(litellm.AuthenticationError) as caught:
            brain.completion("openai/m", HI, **call(srv))
        assert len(srv.chat_requests) == 1
    assert events == []
    assert KEY not in str(caught.value) and KEY not in repr(caught.value.args)
    for error in (caught.value, getattr(caught.value, "original_exception", None)):
        response = getattr(error, "response", None)
        if response is not None:  # the provider's response, its body read
            assert KEY.encode() not in (getattr(response, "_content", None) or b"")
            assert KEY not in response.text


async def test_an_exhausted_chain_raises_retry_chain_error_from_litellms_exception():
    """maxRetries 1, every attempt overloaded: 2 requests, RetryChainError (the chain started)
    whose cause is LiteLLM's exception, the end event exhausted (SPEC §14b.14)."""
    events, on_event = recorder()
    brain = BrainLiteLLM({**FAST, "maxRetries": 1}, on_event=on_event)
    with FaultServer([OVERLOADED] * 3) as srv:
        with pytest.raises(RetryChainError) as caught:
            await brain.acompletion("openai/m", HI, **call(srv))
        assert len(srv.chat_requests) == 2
    assert caught.value.end_reason == "exhausted" and caught.value.calls == 2
    assert isinstance(caught.value.__cause__, litellm.exceptions.APIError)
    assert events[-1]["endReason"] == "exhausted" and events[-1]["success"] is False


def test_a_refusal_at_rest_reraises_litellms_exception_with_its_end_reason():
    """maxRetries 0: LiteLLM's own exception, the end event emitted (attempt 0) and the
    endReason in its notes (SPEC §14b.14)."""
    events, on_event = recorder()
    brain = BrainLiteLLM({**FAST, "maxRetries": 0}, on_event=on_event)
    with FaultServer([OVERLOADED]) as srv:
        with pytest.raises(litellm.exceptions.APIError) as caught:
            brain.completion("openai/m", HI, **call(srv))
        assert len(srv.chat_requests) == 1
    end = events[-1]
    assert (end["type"], end["attempt"], end["success"]) == ("auto_retry_end", 0, False)
    assert caught.value.__notes__ == [f"retry-fsm: not retried (endReason: {end['endReason']}, attempt 0)"]


def test_a_connection_refused_reads_as_a_network_failure_not_a_500():
    """LiteLLM reports a refused connection as a bodiless 500; the brain reads the connection
    error behind it (family network), as every other host does."""
    with FaultServer([]) as srv:
        port = srv.port
    brain = BrainLiteLLM({**FAST, "maxRetries": 0})
    with pytest.raises(Exception) as caught:
        brain.completion("openai/m", HI, api_base=f"http://127.0.0.1:{port}/v1", api_key=KEY)
    message = litellm_message(caught.value)
    assert message.status is None and message.error_message.startswith("Connection error.")


# ------------------------------------------------------------------ streams
def test_a_stream_cut_or_failed_before_any_output_is_retried():
    """stream=True: a connection cut before the first token, then an error event, then a good
    stream — the caller gets the good stream's chunks only (docs/integrations.md "LiteLLM")."""
    events, on_event = recorder()
    brain = BrainLiteLLM(FAST, on_event=on_event)
    with FaultServer([CUT_BEFORE_OUTPUT, ERROR_EVENT, {"stream": ["Hel", "lo"]}]) as srv:
        stream = brain.completion("openai/m", HI, stream=True, **call(srv))
        assert text_of(list(stream)) == "Hello"
        assert len(srv.chat_requests) == 3
    starts = [e for e in events if e["type"] == "auto_retry_start"]
    assert [s["rule"] for s in starts] == ["retryable.connection", "structured.type_overloaded_error"]
    assert events[-1]["success"] is True


async def test_an_async_stream_answered_529_is_retried():
    """acompletion(stream=True): a 529 to the streamed request and a cut before output are
    retried; the stream handed back is LiteLLM's (its attributes too)."""
    events, on_event = recorder()
    brain = BrainLiteLLM(FAST, on_event=on_event)
    with FaultServer([OVERLOADED, CUT_BEFORE_OUTPUT, {"stream": ["a", "b"]}]) as srv:
        stream = await brain.acompletion("openai/m", HI, stream=True, **call(srv))
        assert text_of([c async for c in stream]) == "ab"
        assert stream.model == "m"
        assert len(srv.chat_requests) == 3
    assert [e["type"] for e in events] == ["auto_retry_start"] * 2 + ["auto_retry_end"]


def test_a_stream_that_fails_after_output_is_not_retried_and_says_so():
    """An error after output reached the caller: raised as LiteLLM raised it, with a note,
    one request (the output cannot be taken back)."""
    brain = BrainLiteLLM(FAST)
    with FaultServer([{"stream": ["partial"], "drop": True}]) as srv:
        stream = brain.completion("openai/m", HI, stream=True, **call(srv))
        seen = []
        with pytest.raises(Exception) as caught:
            for chunk in stream:
                seen.append(chunk)
        assert text_of(seen) == "partial" and len(srv.chat_requests) == 1
    assert any("after its output reached the caller" in n for n in caught.value.__notes__)


# ------------------------------------------------------------------ one retry owner
@pytest.mark.parametrize("kwargs", [{"num_retries": 3}, {"max_retries": 2}, {"fallbacks": ["openai/x"]},
                                    {"retry_policy": {"RateLimitErrorRetries": 3}},
                                    {"context_window_fallback_dict": {"openai/m": "openai/big"}}])
def test_litellms_own_retries_are_refused_before_any_request(kwargs):
    """num_retries, max_retries, fallbacks, a retry_policy or a context_window_fallback_dict
    (LiteLLM sends the request again to that model on a context-window error) on a call:
    LiteLLMRetriesError naming it, no request (one retry owner)."""
    name = next(iter(kwargs))
    with FaultServer([]) as srv:
        with pytest.raises(LiteLLMRetriesError, match=name):
            BrainLiteLLM(FAST).completion("openai/m", HI, **call(srv), **kwargs)
        assert srv.chat_requests == []


def test_the_process_wide_num_retries_is_refused_for_calls_not_for_a_router(monkeypatch):
    """litellm.num_retries is read even when a call passes num_retries=0: refused for
    completion; a router's own num_retries=0 overrides it, so the router path goes, and the
    brain is its one retry owner (a 529: two requests, not more)."""
    monkeypatch.setattr(litellm, "num_retries", 2)
    brain = BrainLiteLLM(FAST)
    with FaultServer([OVERLOADED]) as srv:
        with pytest.raises(LiteLLMRetriesError, match="litellm.num_retries"):
            brain.completion("openai/m", HI, **call(srv))
        assert srv.chat_requests == []
        router = brain.router(model_list=model_list(srv, ("g", "m")))
        assert router.completion("g", HI).choices[0].message.content == "ok"
        assert len(srv.chat_requests) == 2


@pytest.mark.parametrize("key", ["firstTokenTimeoutMs", "idleTimeoutMs", "attemptTimeoutMs"])
def test_settings_the_integration_cannot_act_on_are_refused(key):
    """The timeouts: SettingsError naming the key (use LiteLLM's timeout=); the resilient
    profile's own watchdog is left out instead, and fallbackModels is kept (docs/integrations.md
    "Settings each integration honours")."""
    with pytest.raises(SettingsError, match=f"retry.{key}"):
        BrainLiteLLM({key: 1000})
    resilient = BrainLiteLLM({"profile": "resilient", "fallbackModels": ["openai/m2"]}).settings
    assert resilient.idle_timeout_ms is None and resilient.fallback_models == ("openai/m2",)


# ------------------------------------------------------------------ the router
async def test_the_router_path_retries_under_the_brain():
    """brain.router(model_list=...): a Router with num_retries=0 and cooldowns off; a 529 on
    the group's deployment is retried by the brain, twice in a row without the router cooling
    the deployment down."""
    events, on_event = recorder()
    brain = BrainLiteLLM(FAST, on_event=on_event)
    with FaultServer([OVERLOADED, OVERLOADED, {}, OVERLOADED]) as srv:
        router = brain.router(model_list=model_list(srv, ("g", "m")))
        assert isinstance(router, BrainRouter)
        assert (await router.acompletion("g", HI)).choices[0].message.content == "ok"
        assert router.completion("g", HI).choices[0].message.content == "ok"
        assert len(srv.chat_requests) == 5
    assert [e["success"] for e in events if e["type"] == "auto_retry_end"] == [True, True]


def test_a_router_that_retries_or_cools_down_on_its_own_is_refused():
    """A Router with its default retries, its cooldowns on, or LiteLLM fallbacks:
    LiteLLMRetriesError naming the setting (one retry owner)."""
    ml = model_list(FaultServer([]), ("g", "m"), ("h", "n"))
    brain = BrainLiteLLM(FAST)
    with pytest.raises(LiteLLMRetriesError, match="num_retries"):
        brain.router(litellm.Router(model_list=ml))
    with pytest.raises(LiteLLMRetriesError, match="disable_cooldowns"):
        brain.router(litellm.Router(model_list=ml, num_retries=0))
    with pytest.raises(LiteLLMRetriesError, match="fallbacks"):
        brain.router(model_list=ml, fallbacks=[{"g": ["h"]}])
    with pytest.raises(LiteLLMRetriesError, match="num_retries"):
        brain.router(model_list=ml, num_retries=3)


def test_the_brains_fallback_switches_the_router_to_another_group():
    """retry.fallbackModels names a model group of the router: after an overload the retry
    goes to that group (its deployment's model); a name the router cannot route is refused."""
    events, on_event = recorder()
    brain = BrainLiteLLM({**FAST, "fallbackModels": ["backup"], "fallbackAfter": 1}, on_event=on_event)
    with FaultServer([OVERLOADED]) as srv:
        ml = model_list(srv, ("primary", "m"), ("backup", "n"))
        reply = brain.router(model_list=ml).completion("primary", HI)
        assert reply.choices[0].message.content == "ok"
        assert [r["body"]["model"] for r in srv.chat_requests] == ["m", "n"]
        with pytest.raises(SettingsError, match="fallbackModels"):
            BrainLiteLLM({"fallbackModels": ["nowhere"]}).router(model_list=ml)
    assert [e["type"] for e in events] == ["retry_fallback", "auto_retry_start", "auto_retry_end"]


# ------------------------------------------------------------------ budget and the fleet
async def test_the_retry_budget_ends_a_chain():
    """budget maxTokens 4: the first retry passes (3 > 2 left), the second is refused; the
    chain ends budget (docs/policy.md §9)."""
    events, on_event = recorder()
    brain = BrainLiteLLM({**FAST, "budget": {"maxTokens": 4}}, on_event=on_event)
    with FaultServer([OVERLOADED] * 3) as srv:
        with pytest.raises(RetryChainError) as caught:
            await brain.acompletion("openai/m", HI, **call(srv))
        assert len(srv.chat_requests) == 2
    assert caught.value.end_reason == "budget" and events[-1]["endReason"] == "budget"


def test_a_cooldown_learned_by_a_transport_delays_a_litellm_call():
    """One coordinator for every host: a retry hint an httpx2 transport learned from the fault
    server is the cooldown a LiteLLM call to the same endpoint and model waits for (the same
    coordinator key, docs/integrations.md "LiteLLM"). The coordinator's clock stands still."""
    coordinator = InProcessCoordinator(clock=lambda: 1_000_000)
    hinted = {"status": 429, "headers": {"retry-after-ms": "400"},
              "json": {"error": {"type": "rate_limit_error", "message": "Rate limit reached"}}}
    settings = {**FAST, "retryHints": "honor", "maxHintWaitMs": 5000}
    first, second = recorder(), recorder()
    with FaultServer([hinted, {}, OVERLOADED]) as srv:
        transport = RetryTransport(settings=settings, coordinator=coordinator, sleep=lambda s: None,
                                   on_event=first[1])
        with httpx2.Client(transport=transport) as http:
            assert http.post(srv.base_url + "/chat/completions", json={"model": "m"}).status_code == 200
        brain = BrainLiteLLM(settings, coordinator=coordinator, sleep=lambda s: None, on_event=second[1])
        assert brain.completion("openai/m", HI, **call(srv)).choices[0].message.content == "ok"
    assert first[0][0]["delaySource"] == "hint"
    assert second[0][0]["delaySource"] == "cooldown" and second[0][0]["delayMs"] > FAST["maxDelayMs"]


async def test_a_cancelled_call_ends_its_chain_cancelled():
    """A task cancelled during the backoff: the chain ends cancelled, no further request."""
    events, on_event = recorder()
    brain = BrainLiteLLM({"baseDelayMs": 10_000, "maxDelayMs": 10_000}, on_event=on_event)
    with FaultServer([OVERLOADED]) as srv:
        task = asyncio.create_task(brain.acompletion("openai/m", HI, **call(srv)))
        while not events:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(srv.chat_requests) == 1
    assert events[-1]["endReason"] == "cancelled"


def test_the_module_docstring_example_runs_as_written(monkeypatch, capsys):
    """fsm.integrations.litellm's docstring example, run as written with OPENAI_BASE_URL at the
    fault server (a 529 first): one retry event, then the three answers."""
    import textwrap

    import fsm.integrations.litellm as module
    doc = module.__doc__
    start = doc.index("::\n\n") + 4
    block = textwrap.dedent(doc[start:doc.index("\n\n", doc.index("asyncio.run(main())", start))])
    with FaultServer([OVERLOADED]) as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        exec(compile(block, "fsm/integrations/litellm.py (docstring)", "exec"), {})
        assert len(srv.chat_requests) == 4
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("AutoRetryStart(") and lines[-3:] == ["ok", "ok", "ok"]
