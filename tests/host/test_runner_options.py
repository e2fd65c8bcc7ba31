"""The runner's options stay with the runner: fsm.retrying / retrying_sync never pass one of
them (sleep, random, key, clock, context_window, to_message...) on to the callable."""

from __future__ import annotations


async def test_runner_options_never_reach_the_callable():
    """fsm.retrying(fn, sleep=..., random=..., key=..., context_window=..., to_message=...)
    keeps every runner option and passes only the call's own keywords on."""
    import fsm
    from fsm.core.messages import AssistantMessage
    from fsm.host.runner import RUNNER_OPTIONS

    seen, waits = [], []

    async def call(**kwargs):
        seen.append(kwargs)
        if len(seen) == 1:
            raise ConnectionResetError("Connection reset by peer")
        return "ok"

    async def sleep(seconds):
        waits.append(seconds)

    def to_message(exc):
        return AssistantMessage("error", error_message=f"read: {exc}")

    result = await fsm.retrying(call, model="m", settings={"baseDelayMs": 5}, sleep=sleep,
                                random=lambda: 0.5, key=None, clock=None, context_window=1000,
                                to_message=to_message, on_event=None, coordinator=None)
    assert result == "ok" and seen == [{"model": "m"}, {"model": "m"}] and waits == [0.005]
    assert set(RUNNER_OPTIONS) >= {"sleep", "random", "key", "clock", "context_window", "to_message"}


def test_sync_runner_options_never_reach_the_callable():
    """fsm.retrying_sync keeps its runner options too (sleep, random, context_window...)."""
    import fsm
    seen, waits = [], []

    def call(**kwargs):
        seen.append(kwargs)
        if len(seen) == 1:
            raise ConnectionResetError("Connection reset by peer")
        return "ok"

    assert fsm.retrying_sync(call, prompt="p", settings={"baseDelayMs": 5}, sleep=waits.append,
                             random=lambda: 0.5, context_window=1000) == "ok"
    assert seen == [{"prompt": "p"}, {"prompt": "p"}] and waits == [0.005]
