"""A budget token taken for a retry that does not go is given back, whatever the order of the
coordinator's answer, the abort and the bound (SPEC §15.6; docs/fleet.md "Retry budget"): one
rule in the one loop (:mod:`fsm.host.loop`), so the session and the runner keep it alike.

The coordinator's answers are held by the test (an :class:`asyncio.Event` each) and released
when it says; the kernel's bound of one read ends when the test says so (:func:`bound_on`, an
event, not 100 ms of wall time): no sleeps, no wall-time margins, 60 s hang guards only."""

from __future__ import annotations

import asyncio
import itertools
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fsm
from fsm.core.settings import BudgetSettings, RetrySettings
from fsm.fleet import CoordKey, InProcessCoordinator
from fsm.host import kernel as K
from fsm.host.session import AgentSession
from fsm.testing import FakeClock, ScriptedProvider, error, ok

KEY = CoordKey("p", "m")
BUDGET = BudgetSettings(max_tokens=10, token_ratio=0.1)
SETTINGS = RetrySettings(budget=BUDGET, base_delay_ms=1000)
HANG_GUARD_S = 60.0


class Held:
    """A coordinator whose retry admissions are held until the test releases them (one
    :class:`asyncio.Event` each). ``takes_first``: the store takes the token before the answer
    is held (a reply in flight), else after the release (a question in flight). Counts every
    token the store handed out and every one given back."""

    answers_at_once = False  # it does I/O: the kernel bounds its reads
    self_bounded = False

    def __init__(self, takes_first: bool) -> None:
        self.store = InProcessCoordinator(clock=lambda: 1_000_000)
        self.takes_first = takes_first
        self.parked: list[asyncio.Event] = []
        self.taken = 0
        self.returned = 0

    async def admit(self, key, *, retry, budget, **kwargs):
        if not retry:
            return await self.store.admit(key, retry=retry, budget=budget, **kwargs)
        release = asyncio.Event()
        if self.takes_first:
            answer = await self.store.admit(key, retry=retry, budget=budget, **kwargs)
            self.taken += answer.token_taken
            self.parked.append(release)
            await release.wait()
            return answer
        self.parked.append(release)
        await release.wait()
        answer = await self.store.admit(key, retry=retry, budget=budget, **kwargs)
        self.taken += answer.token_taken
        return answer

    async def return_retry_token(self, key, budget, **kwargs):
        self.returned += 1
        await self.store.return_retry_token(key, budget)

    def __getattr__(self, name):  # every other write: the store's
        return getattr(self.store, name)

    def release(self) -> None:
        for event in self.parked:
            event.set()


class Counted(InProcessCoordinator):
    """The in-process coordinator a late read falls back to, counting its tokens."""

    def __init__(self) -> None:
        super().__init__(clock=lambda: 1_000_000)
        self.taken = 0
        self.returned = 0

    async def admit(self, key, **kwargs):
        answer = await super().admit(key, **kwargs)
        self.taken += answer.token_taken
        return answer

    async def return_retry_token(self, key, budget, **kwargs):
        self.returned += 1
        await super().return_retry_token(key, budget)


async def until(condition, what: str) -> None:
    """Let the event loop run until ``condition()`` (``what`` it waits for; a hang guard,
    never a margin)."""
    async def poll():
        while not condition():
            await asyncio.sleep(0)
    try:
        await asyncio.wait_for(poll(), HANG_GUARD_S)
    except asyncio.TimeoutError:
        raise AssertionError(f"never happened: {what}") from None


async def quiet() -> None:
    """Let the writes in flight (a token given back in the background) land."""
    for _ in range(5):
        await asyncio.sleep(0)
    while K._IN_FLIGHT:
        await asyncio.wait_for(asyncio.gather(*tuple(K._IN_FLIGHT), return_exceptions=True),
                               HANG_GUARD_S)
        await asyncio.sleep(0)


def bound_on(monkeypatch, bound: asyncio.Event) -> None:
    """The kernel's bound of one coordinator read ends when the test sets ``bound`` (not after
    :data:`~fsm.host.kernel.COORDINATOR_TIMEOUT_S` of wall time): the bound as an event."""
    async def wait(fs, *, timeout=None, return_when=asyncio.ALL_COMPLETED):
        if timeout is None:
            return await asyncio.wait(fs, return_when=return_when)
        fs = set(fs)
        ended = asyncio.ensure_future(bound.wait())
        try:
            await asyncio.wait(fs | {ended}, timeout=HANG_GUARD_S,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
        done = {f for f in fs if f.done()}
        return done, fs - done
    shim = types.SimpleNamespace(**{name: getattr(asyncio, name) for name in dir(asyncio)
                                    if not name.startswith("__")})
    shim.wait = wait
    monkeypatch.setattr(K, "asyncio", shim)


def host_session(coordinator, clock):
    provider = ScriptedProvider([error("529 Overloaded"), ok("hello")])
    session = AgentSession(provider, settings=SETTINGS, clock=clock, coordinator=coordinator)

    async def abort() -> None:
        await session.abort()
    return asyncio.ensure_future(session.prompt("hi")), abort, provider.requests, session


def host_runner(coordinator, clock):
    sent: list[int] = []

    async def call():
        sent.append(1)
        if len(sent) == 1:
            raise RuntimeError("529 Overloaded")
        return "hello"
    task = asyncio.ensure_future(fsm.retrying(call, settings=SETTINGS, coordinator=coordinator,
                                              key=KEY, clock=clock))

    async def abort() -> None:
        task.cancel()
    return task, abort, sent, None


HOSTS = {"session": host_session, "runner": host_runner}


async def _run(host: str, order: tuple[str, ...], takes_first: bool, monkeypatch) -> None:
    """Drive ``host`` through a 529 whose admission is held, with ``order`` the order of the
    answer's release, the abort and the kernel's bound; then check the token accounting."""
    bound = asyncio.Event()
    bound_on(monkeypatch, bound)
    local = Counted()
    coordinator = Held(takes_first)
    coordinator.fallback = local  # the local state a read past its bound decides on
    clock = FakeClock()
    task, abort, sent, session = HOSTS[host](coordinator, clock)
    await until(lambda: coordinator.parked, "the retry's admission is with the coordinator")
    for step in order:
        if step == "answer":
            coordinator.release()
        elif step == "bound":
            bound.set()
        else:
            await abort()
        await clock.advance(0)
    await quiet()
    bound.set()
    coordinator.release()
    for _ in range(40):  # a retry that went (the abort came after it) ends with the success
        if task.done():
            break
        await clock.advance(1)
    await asyncio.gather(task, return_exceptions=True)
    await quiet()
    if session is not None:
        await session.close()
    await quiet()
    went = len(sent) - 1  # the retries sent
    assert went in (0, 1)
    assert coordinator.taken + local.taken - went == coordinator.returned + local.returned, (
        f"tokens taken {coordinator.taken}+{local.taken}, retries sent {went}, given back "
        f"{coordinator.returned}+{local.returned}")
    assert coordinator.returned <= coordinator.taken and local.returned <= local.taken


@pytest.mark.parametrize("host", sorted(HOSTS))
@pytest.mark.parametrize("takes_first", [True, False], ids=["reply-in-flight", "question-in-flight"])
async def test_an_abort_while_the_coordinator_answers_gives_the_token_back(host, takes_first,
                                                                          monkeypatch):
    """The abort arrives while the coordinator's answer is in flight, then the answer comes:
    the retry does not go and its token is given back (taken == returned), in the session as
    in the runner (SPEC §15.6)."""
    await _run(host, ("abort", "answer"), takes_first, monkeypatch)


ORDERS = sorted(set(itertools.permutations(("answer", "abort", "bound"))))


@settings(max_examples=60, deadline=None)
@given(host=st.sampled_from(sorted(HOSTS)), order=st.sampled_from(ORDERS),
       takes_first=st.booleans())
def test_every_interleaving_of_answer_abort_and_bound_keeps_the_token_accounting(
        host, order, takes_first):
    """Whatever the order of the coordinator's answer, the host's abort and the kernel's bound
    (SPEC §15.6), every token taken is spent by a retry that went or given back once."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        asyncio.run(_run(host, order, takes_first, monkeypatch))


async def test_a_decision_that_starts_no_retry_gives_back_the_token_its_facts_took(monkeypatch):
    """The settings change while the coordinator answers (``update_settings`` at rest: an
    unknown failure is no longer retried once, docs/policy.md §1): the brain's decision starts
    no retry and returns nothing itself; the loop gives the token back (SPEC §15.6)."""
    bound_on(monkeypatch, asyncio.Event())
    coordinator = Held(takes_first=True)
    coordinator.fallback = Counted()
    clock = FakeClock()
    once = RetrySettings(budget=BUDGET, base_delay_ms=1000, unknown="once")
    provider = ScriptedProvider([error("the assistant could not finish"), ok("hello")])
    session = AgentSession(provider, settings=once, clock=clock, coordinator=coordinator)
    task = asyncio.ensure_future(session.prompt("hi"))
    await until(lambda: coordinator.parked, "the retry's admission is with the coordinator")
    session.update_settings(RetrySettings(budget=BUDGET, base_delay_ms=1000, unknown="never"))
    coordinator.release()
    await asyncio.wait_for(task, HANG_GUARD_S)
    await quiet()
    await session.close()
    assert len(provider.requests) == 1, "no retry"
    assert coordinator.taken == coordinator.returned == 1
