"""The failures of 2026 through the brain and the session (docs/policy.md §13).

Stall watchdog, attempt timeout, a deadline that reaches the attempt in flight, model fallback,
per-provider policy and usage windows: each behaviour is played through the session with the
fake clock (no real time), and the brain's counting rules are checked directly.
"""

import asyncio

import pytest

from fsm.core.brain import RetryBrain, SwitchModel, TurnFacts
from fsm.core.classify import FAMILIES, Classification, classify_message
from fsm.core.messages import AssistantMessage
from fsm.core.settings import RetrySettings, SettingsError
from fsm.host.session import AgentSession
from fsm.testing import FakeClock, Outcome, ScriptedProvider, error, hang, ok
from session_support import of, run

OVERLOADED = "529 Overloaded"
RATE_LIMITED = "429 Too Many Requests"
USAGE_5H = "You have hit your usage limit, try again in 5h"
NOW = FakeClock.EPOCH_MS


def make(script, **settings):
    clock = FakeClock()
    provider = ScriptedProvider(script)
    session = AgentSession(provider, settings=RetrySettings(**settings), clock=clock)
    events = []
    session.subscribe(events.append)
    return session, provider, clock, events



# ------------------------------------------------------------------ families (§13.6)

@pytest.mark.parametrize("text,family", [
    ("stream stalled: no response within 30 s", "stalled"),
    ("stream stalled: no data for 60 s", "stalled"),
    ("attempt timed out after 120 s", "timeout"),
    (OVERLOADED, "overloaded"),
    ("503 The engine is currently overloaded, please try again later", "overloaded"),
    (RATE_LIMITED, "rate_limit"),
    (USAGE_5H, "usage_limit"),
    ("500 Internal server error", "server_error"),
    ("Connection error.", "network"),
    ("401 Incorrect API key provided", "auth"),
])
def test_a_failure_names_its_family(text, family):
    """Each failure text of §13 and the main families classify to the documented family."""
    cls = classify_message(AssistantMessage("error", error_message=text))
    assert cls.family == family and cls.family in FAMILIES
    if family in ("stalled", "timeout"):
        assert cls.kind == "retryable"


def test_an_unknown_family_is_refused():
    """Classification's family is a closed set."""
    with pytest.raises(ValueError, match="unknown family .cosmic_rays."):
        Classification("retryable", "x", family="cosmic_rays")


# ------------------------------------------------------------------ settings (§13)

@pytest.mark.parametrize("key,value,words", [
    ("firstTokenTimeoutMs", 0, "retry.firstTokenTimeoutMs: expected an integer from 1"),
    ("idleTimeoutMs", "60s", "retry.idleTimeoutMs"),
    ("attemptTimeoutMs", -1, "retry.attemptTimeoutMs"),
    ("fallbackModels", "gpt-4o", "retry.fallbackModels: expected a list"),
    ("fallbackModels", ["a", "a"], "each once"),
    ("fallbackOn", ["overload"], "retry.fallbackOn"),
    ("fallbackAfter", 0, "retry.fallbackAfter"),
    ("fallbackRevertMs", None, "retry.fallbackRevertMs"),
    ("waitForUsageReset", "yes", "retry.waitForUsageReset"),
    ("providers", {"openai": {"maxRetries": 500}}, 'retry.providers["openai"].maxRetries'),
    ("providers", {"openai": {"providers": {}}}, "top-level key only"),
    ("providers", {"openai": {"profile": "seed"}}, "top-level key only"),
    ("providers", {"openai": {"maxRetriez": 1}}, 'retry.providers["openai"].maxRetriez'),
])
def test_a_bad_section_13_setting_names_key_and_value(key, value, words):
    """Every new key is validated with an error naming the key and the value."""
    with pytest.raises(SettingsError) as info:
        RetrySettings.from_json({"retry": {key: value}})
    assert words in str(info.value)


def test_the_most_specific_providers_entry_wins():
    """Top level < providers["p"] < providers["p/m"], key by key (§13.4)."""
    s = RetrySettings.from_json({"retry": {"maxRetries": 5, "baseDelayMs": 100, "providers": {
        "anthropic": {"maxRetries": 0, "baseDelayMs": 700},
        "anthropic/claude-opus": {"baseDelayMs": 50}}}})
    opus = s.for_provider("anthropic", "claude-opus")
    assert (opus.max_retries, opus.base_delay_ms) == (0, 50)
    sonnet = s.for_provider("anthropic", "claude-sonnet")
    assert (sonnet.max_retries, sonnet.base_delay_ms) == (0, 700)
    other = s.for_provider("openai", "gpt-5")
    assert (other.max_retries, other.base_delay_ms) == (5, 100)


def test_the_defaults_keep_every_section_13_behaviour_off():
    """The seed profile: no watchdog, no timeout, no fallback, no usage wait."""
    s = RetrySettings()
    assert (s.first_token_timeout_ms, s.idle_timeout_ms, s.attempt_timeout_ms) == (None,) * 3
    assert s.fallback_models == () and s.wait_for_usage_reset is False and s.providers == ()
    assert s.fallback_on == ("overloaded", "usage_limit") and s.fallback_after == 2


# ------------------------------------------------------------------ the brain's fallback count (§13.3)

def fail(brain, text, facts=None, hint=None):
    msg = AssistantMessage("error", error_message=text)
    cls = classify_message(msg)
    if hint is not None:
        cls = Classification(cls.kind, cls.rule, cls.usage_limit, hint, cls.family)
    return brain.turn_ended(msg, classification=cls, facts=facts or TurnFacts(now_ms=NOW))


def elapse(brain):
    brain.backoff_elapsed(brain.timer_id)


def test_another_family_resets_the_count_toward_fallback_after():
    """529, 500, 529 is not two overloads in a row: no switch; a third 529 in a row switches."""
    brain = RetryBrain(RetrySettings(max_retries=5, fallback_models=("backup",)))
    for text in (OVERLOADED, "500 Internal server error", OVERLOADED):
        assert not any(isinstance(a, SwitchModel) for a in fail(brain, text))
        elapse(brain)
    switch = [a for a in fail(brain, OVERLOADED) if isinstance(a, SwitchModel)]
    assert switch and switch[0].to_model == "backup" and switch[0].reason == "overloaded"


def test_a_server_wait_beyond_max_hint_wait_switches_at_once():
    """A 529 asking for 10 min (> maxHintWaitMs) reaches fallbackAfter at once (§13.3)."""
    brain = RetryBrain(RetrySettings(fallback_models=("backup",), fallback_after=3))
    actions = fail(brain, OVERLOADED, hint=600_000)
    assert any(isinstance(a, SwitchModel) for a in actions)
    start = [a.event for a in actions if getattr(a, "event", None) is not None
             and a.event["type"] == "auto_retry_start"][0]
    assert (start["delayMs"], start["delaySource"], start["model"]) == (0, "fallback", "backup")
    assert start["maxAttempts"] == 3 + 1


def test_a_credential_switch_comes_before_fallback_and_does_not_count():
    """Order: credential rotation, then fallback (§13.3)."""
    brain = RetryBrain(RetrySettings(fallback_models=("backup",), fallback_after=1,
                                     fallback_on=("usage_limit",)))
    facts = TurnFacts(now_ms=NOW, credential_switched=True, credential_count=2)
    actions = fail(brain, USAGE_5H, facts)
    assert not any(isinstance(a, SwitchModel) for a in actions)
    start = [a.event for a in actions if getattr(a, "event", None) is not None][0]
    assert start["delaySource"] == "switch" and start["maxAttempts"] == 3 + 1 + 1


def test_a_refused_first_request_is_the_third_end_without_a_start():
    """request_refused at rest: one end, attempt 0, hint_too_long, resetAt for a usage limit."""
    brain = RetryBrain(RetrySettings(retry_hints="honor"))
    actions = brain.request_refused(3_600_000, usage_limit=True, now_ms=NOW)
    ends = [a.event for a in actions if getattr(a, "event", None) is not None]
    assert [(e["attempt"], e["endReason"], e["resetAt"]) for e in ends] == [
        (0, "hint_too_long", NOW + 3_600_000)]
    assert brain.state == "exhausted"


# ------------------------------------------------------------------ the session (fake clock)

async def test_a_stream_that_never_starts_is_a_retryable_stall():
    """firstTokenTimeoutMs: nothing within 30 s ends the attempt as `stream stalled`."""
    session, provider, clock, events = make([hang(), ok()], first_token_timeout_ms=30_000)
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(29.9)
    assert not of(events, "auto_retry_start")
    await clock.advance(0.2)
    start = of(events, "auto_retry_start")[0]
    assert start["errorMessage"] == "stream stalled: no response within 30 s"
    assert start["rule"] == "retryable.stream_stalled"
    await clock.advance(2)
    await asyncio.wait_for(task, 1)
    assert len(provider.requests) == 2 and of(events, "auto_retry_end")[0]["success"] is True
    assert not [e for e in events if e["type"] == "message_end"
                and e["message"].get("stopReason") == "aborted"], "a stall is not an abort"


async def test_a_stream_that_goes_silent_after_one_delta_is_stopped_by_the_idle_timeout():
    """idleTimeoutMs: a delta, then 60 s of silence: a failure that discards the output."""
    session, provider, clock, events = make([Outcome(hang=True, text="Hel"), ok("Hello")],
                                            idle_timeout_ms=60_000)
    await run(session, clock)
    start = of(events, "auto_retry_start")[0]
    assert start["errorMessage"] == "stream stalled: no data for 60 s"
    assert start["discardsOutput"] is True
    assert session.messages[-1].text == "Hello"


async def test_a_stall_after_output_goes_through_replay_safe():
    """afterOutput "stop": a stall after a delta ends output_streamed, not retried."""
    session, provider, clock, events = make([Outcome(hang=True, text="Hel")],
                                            idle_timeout_ms=60_000, after_output="stop")
    await run(session, clock)
    assert of(events, "auto_retry_end")[0]["endReason"] == "output_streamed"
    assert len(provider.requests) == 1


async def test_the_attempt_timeout_bounds_the_first_attempt_too():
    """attemptTimeoutMs: a hanging first attempt fails after 120 s and is retried."""
    session, provider, clock, events = make([hang(), ok()], attempt_timeout_ms=120_000)
    await run(session, clock, step=1)
    assert of(events, "auto_retry_start")[0]["errorMessage"] == "attempt timed out after 120 s"
    assert len(provider.requests) == 2


async def test_a_retried_attempt_that_hangs_past_the_deadline_is_aborted():
    """maxElapsedMs reaches the attempt in flight: the chain ends `deadline` at the deadline."""
    session, provider, clock, events = make([error(OVERLOADED), hang()], max_elapsed_ms=10_000)
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(9.9)
    assert len(provider.requests) == 2 and not of(events, "auto_retry_end")
    await clock.advance(0.2)
    await asyncio.wait_for(task, 1)
    end = of(events, "auto_retry_end")[0]
    assert (end["attempt"], end["endReason"], end["success"]) == (1, "deadline", False)
    assert "retry.maxElapsedMs = 10 s" in end["finalError"] and OVERLOADED in end["finalError"]
    kinds = [e["type"] for e in events]
    assert kinds[-4:] == ["auto_retry_end", "message_end", "turn_end", "agent_end"]
    assert events[-3]["message"]["stopReason"] == "error"
    assert not session.is_busy and session.brain.state == "exhausted"


async def test_529s_switch_models_after_fallback_after_failures():
    """Two 529s on the primary, then the fallback at once; auto_retry_start names the model."""
    session, provider, clock, events = make([error(OVERLOADED), error(OVERLOADED), ok()],
                                            fallback_models=["backup"])
    await run(session, clock)
    assert provider.models == ["scripted-model", "scripted-model", "backup"]
    fallback = of(events, "retry_fallback")
    starts = of(events, "auto_retry_start")
    # the chain's id is the process's (SPEC §15.1: unique per chain across every host)
    assert fallback == [{"type": "retry_fallback", "from": "scripted-model", "to": "backup",
                         "reason": "overloaded", "chainId": starts[0]["chainId"]}]
    assert [(s["attempt"], s["maxAttempts"], s["delaySource"], s["model"]) for s in starts] == [
        (1, 4, "backoff", "scripted-model"), (2, 4, "fallback", "backup")]
    kinds = [e["type"] for e in events]
    assert kinds.index("retry_fallback") == kinds.index("auto_retry_start", kinds.index("auto_retry_start") + 1) - 1
    assert session.state()["model"] == "backup"


async def test_429s_do_not_switch_models():
    """A plain 429 rate limit is not in fallbackOn by default: same-model retries only."""
    session, provider, clock, events = make([error(RATE_LIMITED)] * 3 + [ok()],
                                            fallback_models=["backup"])
    await run(session, clock)
    assert set(provider.models) == {"scripted-model"} and not of(events, "retry_fallback")


async def test_a_fallback_chain_that_runs_out_stays_on_the_last_model():
    """Two fallbacks used up: retries stay on the last one until maxAttempts."""
    session, provider, clock, events = make([error(OVERLOADED)] * 10, max_retries=1,
                                            fallback_models=["b1", "b2"], fallback_after=1)
    await run(session, clock)
    assert provider.models == ["scripted-model", "b1", "b2", "b2"]
    end = of(events, "auto_retry_end")[0]
    assert (end["attempt"], end["endReason"]) == (3, "exhausted")


async def test_new_prompts_go_to_the_primary_once_the_fallback_mark_expires():
    """fallbackRevertMs: within it the next prompt stays on the fallback; after it, primary."""
    session, provider, clock, events = make([error(OVERLOADED), ok(), ok(), ok()],
                                            fallback_models=["backup"], fallback_after=1,
                                            fallback_revert_ms=60_000)
    await run(session, clock)
    await run(session, clock)
    await clock.advance(61)
    await run(session, clock)
    assert provider.models == ["scripted-model", "backup", "backup", "scripted-model"]


async def test_a_usage_reset_is_waited_out_with_wait_for_usage_reset():
    """waitForUsageReset: a 5 h reset is waited out (resetAt in the event), then retried."""
    session, provider, clock, events = make([error(USAGE_5H), ok()], retry_hints="honor",
                                            wait_for_usage_reset=True)
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.settle()
    start = of(events, "auto_retry_start")[0]
    assert (start["delayMs"], start["delaySource"], start["resetAt"]) == (
        5 * 3_600_000, "hint", NOW + 5 * 3_600_000)
    await clock.advance(5 * 3600 - 1)
    assert len(provider.requests) == 1
    await clock.advance(1)
    await asyncio.wait_for(task, 1)
    assert len(provider.requests) == 2


async def test_a_usage_reset_is_refused_without_wait_for_usage_reset():
    """The default fails fast: hint_too_long at once, with resetAt."""
    session, provider, clock, events = make([error(USAGE_5H)], retry_hints="honor")
    await session.prompt("hi")
    end = of(events, "auto_retry_end")[0]
    assert (end["attempt"], end["endReason"], end["resetAt"]) == (0, "hint_too_long",
                                                                  NOW + 5 * 3_600_000)


async def test_a_usage_wait_is_bounded_by_the_chain_deadline():
    """waitForUsageReset with maxElapsedMs of 1 h: a 5 h reset ends `deadline` at once."""
    session, provider, clock, events = make([error(USAGE_5H)], retry_hints="honor",
                                            wait_for_usage_reset=True, max_elapsed_ms=3_600_000)
    await session.prompt("hi")
    assert of(events, "auto_retry_end")[0]["endReason"] == "deadline"


async def test_a_providers_entry_sets_the_chain_and_the_live_toggle_overrides_it():
    """providers["scripted"] maxRetries 1 applies to this provider; set_auto_retry wins."""
    settings = RetrySettings.from_json({"retry": {"providers": {"scripted": {"maxRetries": 1}}}})
    clock = FakeClock()
    provider = ScriptedProvider([error(OVERLOADED), error(OVERLOADED), error(OVERLOADED)])
    session = AgentSession(provider, settings=settings, clock=clock)
    events = []
    session.subscribe(events.append)
    await run(session, clock)
    assert of(events, "auto_retry_end")[0]["attempt"] == 1 and len(provider.requests) == 2
    session.set_auto_retry_enabled(False)
    await run(session, clock)
    assert len(provider.requests) == 3 and len(of(events, "auto_retry_start")) == 1


# ------------------------------------------------------------------ the runner

async def test_the_runner_bounds_each_attempt_and_retries_a_timed_out_one():
    """attemptTimeoutMs in the runner: a hanging call fails as `attempt timed out` and is retried."""
    from fsm.host.runner import RetryRunner
    clock = FakeClock()
    calls = []

    async def call():
        calls.append(1)
        if len(calls) == 1:
            await asyncio.Event().wait()
        return "done"
    events = []
    runner = RetryRunner({"attemptTimeoutMs": 5000, "baseDelayMs": 100}, clock=clock,
                         on_event=events.append)
    task = asyncio.ensure_future(runner.run(call))
    await clock.advance(5.2)
    assert await asyncio.wait_for(task, 1) == "done"
    start = [dict(e) for e in events if e["type"] == "auto_retry_start"][0]
    assert "attempt timed out after 5 s" in start["errorMessage"]
    assert start["rule"] == "retryable.attempt_timeout"


async def test_the_runner_s_deadline_aborts_the_attempt_in_flight():
    """maxElapsedMs in the runner: a retried attempt still running at the chain's deadline is
    aborted, the chain ends `deadline` and the caller gets RetryChainError."""
    import fsm
    from fsm.host.runner import RetryRunner
    clock = FakeClock()
    calls = []

    async def call():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("529 Overloaded")
        await asyncio.Event().wait()  # the retry hangs
    events = []
    runner = RetryRunner({"maxElapsedMs": 10_000, "baseDelayMs": 1000}, clock=clock,
                         on_event=lambda e: events.append(dict(e)))
    task = asyncio.ensure_future(runner.run(call))
    await clock.advance(1.1)   # the backoff; the retry goes out and hangs
    assert len(calls) == 2 and not task.done()
    await clock.advance(9.5)   # past the chain's deadline
    with pytest.raises(fsm.RetryChainError) as caught:
        await asyncio.wait_for(task, 1)
    assert caught.value.end_reason == "deadline"
    assert [e["type"] for e in events] == ["auto_retry_start", "auto_retry_end"]
    assert events[-1]["endReason"] == "deadline" and len(calls) == 2


def test_stall_keys_given_to_the_runner_raise():
    """The runner sees no stream: firstTokenTimeoutMs / idleTimeoutMs raise SettingsError."""
    from fsm.host.runner import RetryRunner
    with pytest.raises(SettingsError, match="retry.idleTimeoutMs"):
        RetryRunner({"idleTimeoutMs": 1000})
    with pytest.raises(SettingsError, match="retry.firstTokenTimeoutMs"):
        RetryRunner(RetrySettings(first_token_timeout_ms=1000))


async def test_the_runner_calls_with_the_fallback_model():
    """fallbackModels in the runner: after two 529s the callable receives model=<fallback>;
    the next call starts on it until the primary's mark expires."""
    from fsm.host.runner import RetryRunner

    class Overloaded(Exception):
        status_code = 529

    clock = FakeClock()
    seen = []

    async def call(model):
        seen.append(model)
        if model == "big" and len(seen) <= 2:
            raise Overloaded("529 Overloaded")
        return model
    runner = RetryRunner({"fallbackModels": ["small"], "fallbackRevertMs": 60_000,
                          "baseDelayMs": 100}, clock=clock)
    task = asyncio.ensure_future(runner.run(call, model="big"))
    await clock.advance(1)
    assert await asyncio.wait_for(task, 1) == "small"
    assert seen == ["big", "big", "small"]
    assert await runner.run(call, model="big") == "small"
    await clock.advance(61)
    assert await runner.run(call, model="big") == "big"


def test_the_terminal_names_the_model_in_use():
    """The status line follows retry_fallback and the model of the next assistant message."""
    from fsm.tui.view import ChatView
    view = ChatView(model="big")
    lines = view.handle({"type": "retry_fallback", "from": "big", "to": "small",
                       "reason": "overloaded", "chainId": 1})
    assert view.status_text().startswith("small · ")
    assert [l.text for l in lines] == ["Switching to small (overloaded on big)"]
    view.handle({"type": "message_start", "message": {"role": "assistant", "model": "big",
                                                    "content": []}})
    assert view.status_text().startswith("big · ")


class Marks:
    """A coordinator that keeps fallback marks (protocol v3's two calls), in fake time."""

    def __init__(self, clock):
        self.clock, self.until = clock, {}

    async def mark_fallback(self, key, duration_ms):
        self.until[key.model] = self.clock.time_ms() + duration_ms

    async def fallback_left_ms(self, key):
        return max(0, self.until.get(key.model, 0) - self.clock.time_ms())


async def test_sessions_sharing_a_coordinator_fall_back_and_revert_together():
    """One session's switch marks the primary; another session's next prompt starts on the
    fallback until the mark expires (docs/policy.md §13.3)."""
    clock = FakeClock()
    marks = Marks(clock)
    settings = RetrySettings(fallback_models=("backup",), fallback_after=1, fallback_revert_ms=60_000)
    first = ScriptedProvider([error(OVERLOADED), ok()])
    second = ScriptedProvider([ok(), ok()])
    a = AgentSession(first, settings=settings, clock=clock, coordinator=marks)
    b = AgentSession(second, settings=settings, clock=clock, coordinator=marks)
    await run(a, clock)
    assert first.models == ["scripted-model", "backup"]
    await run(b, clock)
    assert second.models == ["backup"]
    await clock.advance(61)
    await run(b, clock)
    assert second.models == ["backup", "scripted-model"]


async def test_the_first_token_timer_starts_when_the_provider_is_ready_not_at_start_up():
    """A provider still loading (``ready()``: a model client being imported) is not a stall:
    the first-token timer starts once it is ready to send, so a start-up longer than
    firstTokenTimeoutMs costs no failed attempt."""
    session, provider, clock, events = make([ok("Hello")], first_token_timeout_ms=500)
    loaded = asyncio.get_running_loop().create_future()

    async def ready():
        await loaded

    provider.ready = ready
    task = asyncio.ensure_future(session.prompt("hi"))
    await clock.advance(5)                       # ten first-token timeouts of start-up
    assert not of(events, "auto_retry_start") and provider.requests == []
    loaded.set_result(None)
    await clock.advance(0.1)
    await asyncio.wait_for(task, 1)
    assert session.messages[-1].text == "Hello" and len(provider.requests) == 1
    assert not of(events, "auto_retry_start")
