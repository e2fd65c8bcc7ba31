"""The host kernel (docs/architecture.md, "The host kernel"): one rule for the coordinator's
bound in every host, the world's actions carried out in the brain's order, the loop's handed back.
"""

import asyncio

import pytest

from fsm.core import brain as B
from fsm.core.brain import RetryBrain
from fsm.core.messages import AssistantMessage
from fsm.core.settings import RetrySettings
from fsm.fleet import BudgetSettings, CoordKey, InProcessCoordinator
from fsm.host import kernel as K
from fsm.host.kernel import HostKernel
from fsm.host.runner import RetryRunner
from fsm.host.session import AgentSession
from fsm.testing import FakeClock, ScriptedProvider, error, ok

KEY = CoordKey("p", "m")
RESET = "Connection reset by peer"


class LateCoordinator:
    """Answers ``before_decision`` only when ``release`` is set; records every call."""

    def __init__(self, fallback=None, self_bounded=False):
        self.release = asyncio.Event()
        self.calls = []
        self.self_bounded = self_bounded  # claims to bound itself: the kernel bounds it anyway
        if fallback is not None:
            self.fallback = fallback

    async def before_decision(self, key, now_ms, budget):
        self.calls.append("before_decision")
        await self.release.wait()
        return 0, None if budget is None else True

    async def learn_cooldown(self, key, until_ms, now_ms):
        self.calls.append("learn_cooldown")

    async def return_retry_token(self, key, budget):
        self.calls.append("return_retry_token")

    async def credit_success(self, key, budget):
        self.calls.append("credit_success")


@pytest.fixture(autouse=True)
def short_bound(monkeypatch):
    """The bound of one read, shortened so that a late coordinator costs the test 10 ms."""
    monkeypatch.setattr(K, "COORDINATOR_TIMEOUT_S", 0.01)


def kernel_for(coordinator, settings, emitted=None):
    brain = RetryBrain(settings)
    return HostKernel(brain, emit=(emitted if emitted is not None else []).append,
                      clock=FakeClock(), coordinator=coordinator, key=lambda: KEY)


async def test_a_late_read_is_decided_on_local_state_and_its_token_is_given_back():
    """A read that misses the bound is answered locally; the late answer's token goes back."""
    coord = LateCoordinator()
    kernel = kernel_for(coord, RetrySettings(budget={}))
    cls = kernel.classify(AssistantMessage("error", error_message=RESET, timestamp_ms=0))
    facts = await kernel.gather(cls)
    assert facts.budget_allows is True and facts.budget_taken is True  # the local bucket's answer
    assert coord.calls == ["before_decision"]
    coord.release.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert coord.calls == ["before_decision", "return_retry_token"]


async def test_a_late_read_never_counts_as_allowed_when_the_local_state_refuses():
    """Unknown is not "allowed": a spent local bucket refuses the retry while the remote is late."""
    local = InProcessCoordinator()
    budget = BudgetSettings(max_tokens=2, token_ratio=0.1)
    local.take_retry_token_sync(KEY, budget)  # 1 of 2 left: the next take refuses
    kernel = kernel_for(LateCoordinator(fallback=local),
                        RetrySettings(budget={"maxTokens": 2, "tokenRatio": 0.1}))
    cls = kernel.classify(AssistantMessage("error", error_message=RESET, timestamp_ms=0))
    facts = await kernel.gather(cls)
    assert facts.budget_allows is False


@pytest.mark.parametrize("self_bounded", [False, True])
async def test_the_session_and_the_runner_bound_every_coordinator_alike(self_bounded):
    """A coordinator that never answers stalls neither host, whatever it claims about itself."""
    clock = FakeClock()
    session = AgentSession(ScriptedProvider([error(RESET), ok()]), clock=clock,
                           settings=RetrySettings(budget={}),
                           coordinator=LateCoordinator(self_bounded=self_bounded))
    task = asyncio.ensure_future(session.prompt("hi"))
    for _ in range(40):
        if task.done():
            break
        await asyncio.sleep(0.005)  # the 10 ms bound is real time
        await clock.advance(5)
    await asyncio.wait_for(task, 1)
    assert not session.is_retrying and session.messages[-1].stop_reason == "stop"

    attempts = iter([ConnectionResetError(RESET), None])

    async def call():
        failure = next(attempts)
        if failure is not None:
            raise failure
        return "ok"

    async def no_sleep(_):
        return None

    runner = RetryRunner({"budget": {}}, sleep=no_sleep,
                         coordinator=LateCoordinator(self_bounded=self_bounded))
    assert await asyncio.wait_for(runner.run(call), 1) == "ok"


async def test_actions_of_the_world_are_carried_out_and_the_loops_handed_back_in_order():
    """Emit goes to ``emit``, a write to the coordinator, the rest to the host, in order."""
    coord = LateCoordinator()
    emitted = []
    kernel = kernel_for(coord, RetrySettings(budget={}), emitted)
    seen = []
    kernel.perform([B.EmitTurnEnd("message"), B.Emit("event"), B.CreditRetryBudget(),
                    B.PromptMayReturn(None)], seen.append)
    assert seen == [B.EmitTurnEnd("message"), B.PromptMayReturn(None)] and emitted == ["event"]
    await kernel.aclose()
    assert coord.calls == ["credit_success"]


async def test_a_budget_wait_without_a_floor_slot_is_re_checked_afresh_and_jittered():
    """Budget in wait mode: an answer that reserved a floor slot is re-checked with the slot
    due; one that reserved none (beyond the floor's horizon) waits the re-check × (0.5 +
    random()) and asks afresh (``floor_slot_due`` False), so it does not go without a token."""
    from fsm.fleet import Admission, WAIT_RECHECK_MS

    class Floor:
        def __init__(self, answers):
            self.answers, self.due = list(answers), []

        async def admit(self, key, *, retry, budget, pacing, earliest_ms=0, floor_slot_due=False,
                        max_wait_ms=None):
            self.due.append(floor_slot_due)
            return self.answers.pop(0)

    coord = Floor([Admission(budget=False, budget_wait_ms=800),
                   Admission(budget=False, budget_wait_ms=WAIT_RECHECK_MS, budget_slot_booked=False),
                   Admission(budget=False, budget_wait_ms=WAIT_RECHECK_MS, budget_slot_booked=False)])
    kernel = HostKernel(RetryBrain(RetrySettings(budget={"mode": "wait", "minRetriesPerSecond": 1})),
                        emit=lambda e: None, clock=FakeClock(), coordinator=coord,
                        key=lambda: KEY, random=lambda: 0.25)
    cls = kernel.classify(AssistantMessage("error", error_message=RESET, timestamp_ms=0))
    first = await kernel.gather(cls)
    assert first.budget_slot_ms == 800                      # a reserved slot: waited exactly
    second = await kernel.recheck_budget()
    assert second.budget_slot_ms == round(WAIT_RECHECK_MS * 0.75)   # none reserved: jittered
    await kernel.recheck_budget()
    assert coord.due == [False, True, False]                # only the reserved slot is "due"


async def test_an_unknown_failure_retried_once_takes_a_budget_token():
    """docs/policy.md §1 ``retry.unknown: "once"``: the one retry of an unknown failure is a
    retry like any other — it asks the retry budget (an empty bucket refuses it: endReason
    ``budget``), so text no rule knows cannot bypass the fleet's bound (docs/fleet.md)."""
    import fsm
    from fsm.core.settings import BudgetSettings, RetrySettings
    from fsm.fleet import CoordKey, InProcessCoordinator
    coordinator = InProcessCoordinator(clock=lambda: 1_000_000)
    budget = BudgetSettings(max_tokens=2, token_ratio=0.1)
    key = CoordKey("p", "m")
    # two retries elsewhere have spent the bucket down to its half: no retry is allowed
    for _ in range(2):
        await coordinator.admit(key, retry=True, budget=budget, pacing=None)
    calls, events = [], []

    async def call():
        calls.append(1)
        raise RuntimeError("the assistant could not finish")  # family unknown

    settings = RetrySettings(unknown="once", budget=budget, base_delay_ms=1)
    with pytest.raises(RuntimeError):
        await fsm.retrying(call, settings=settings, coordinator=coordinator, key=key,
                           on_event=lambda e: events.append(dict(e)))
    assert len(calls) == 1
    assert [e["endReason"] for e in events if e["type"] == "auto_retry_end"] == ["budget"]


async def test_a_session_retry_cancelled_during_its_backoff_gives_its_token_back():
    """docs/fleet.md "Retry budget": a token taken for a retry that does not go is given back —
    also when the chain ends during the backoff (``abort_retry``), not only when the brain
    decides against the retry; a retry that goes spends its token."""
    from fsm.core.settings import BudgetSettings, RetrySettings
    from fsm.fleet import InProcessCoordinator
    from fsm.host.session import AgentSession
    from fsm.testing import FakeClock, ScriptedProvider, error, ok
    budget = BudgetSettings(max_tokens=10, token_ratio=0.1)
    settings = RetrySettings(budget=budget)

    async def tokens_after(abort: bool) -> tuple[float, float]:
        clock = FakeClock()
        coordinator = InProcessCoordinator(clock=lambda: 1_000_000)
        provider = ScriptedProvider([error("529 Overloaded"), ok("hello")])
        session = AgentSession(provider, settings=settings, clock=clock, coordinator=coordinator)
        key = session._coord_key()
        task = asyncio.ensure_future(session.prompt("hi"))
        for _ in range(20):  # the first answer, its decision and the backoff's start
            await asyncio.sleep(0)
        during = coordinator.tokens(key, budget)
        if abort:
            session.abort_retry()
        await clock.advance(5)
        await asyncio.wait_for(task, 1)
        await session.close()
        return during, coordinator.tokens(key, budget)

    during, after = await tokens_after(abort=True)
    assert during == 9 and after == 10
    during, after = await tokens_after(abort=False)
    assert during == 9 and after == 9.1  # spent, then a success's credit of 0.1
