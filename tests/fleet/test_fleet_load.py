"""The guard under load and with a slow store: a slow answer is "unknown" (never
"unavailable"), a failing probe declares the store down once, a succeeding one restores it
once, decisions on "unknown" or while down spend a local share of the budget, and a token
taken for a retry that does not go is given back whatever the order of answer, abort and
bound (docs/fleet.md "When Redis is slow or down"). The store's answers are held and
released by the test: no wall-time margins."""

from __future__ import annotations

import asyncio
import socket

from hypothesis import given, settings
from hypothesis import strategies as st

from fsm.fleet import (BudgetSettings, CoordinatorError, CoordKey, GuardedCoordinator,
                       InProcessCoordinator, RedisCoordinator)

KEY = CoordKey("anthropic", "claude-x")
BUDGET = BudgetSettings(max_tokens=10)
WAITING = BudgetSettings(max_tokens=10, mode="wait")  # a refused retry takes nothing


class Held:
    """A remote coordinator (``store``, shared by several of these: one per process) whose
    ``admit`` answers are held while ``hold`` is set, until the test releases them; counted
    as sent meanwhile. ``fail``: every call raises it. ``probe_fail``: the probe raises it.
    ``processes()`` answers ``fleet``."""

    def __init__(self, store: InProcessCoordinator, fleet: int = 1) -> None:
        self.store = store
        self.fleet = fleet
        self.hold = False
        self.fail: BaseException | None = None
        self.probe_fail: BaseException | None = None
        self.parked: list[asyncio.Future] = []
        self.in_flight: set = set()
        self.probes = 0

    def __getattr__(self, name):
        return getattr(self.store, name)

    async def admit(self, key, **kw):
        if self.fail is not None:
            raise self.fail
        task = asyncio.current_task()
        self.in_flight.add(task)
        try:
            if self.hold:
                gate = asyncio.get_running_loop().create_future()
                self.parked.append(gate)
                await gate
            return await self.store.admit(key, **kw)
        finally:
            self.in_flight.discard(task)

    async def return_retry_token(self, key, budget):
        if self.fail is not None:
            raise self.fail
        await self.store.return_retry_token(key, budget)

    async def probe(self):
        self.probes += 1
        if self.probe_fail is not None:
            raise self.probe_fail

    async def processes(self):
        return self.fleet

    def release(self, index: int = 0) -> None:
        gate = self.parked.pop(index)
        if not gate.done():
            gate.set_result(None)


async def settled(*guards: GuardedCoordinator) -> None:
    """Let the guards' background work (probes, heartbeats, give-backs) finish."""
    for _ in range(3):
        await asyncio.sleep(0)
    for g in guards:
        while g._background:
            await asyncio.gather(*tuple(g._background), return_exceptions=True)


def guard(inner: Held, events: list | None = None, clock: list | None = None) -> GuardedCoordinator:
    now = clock if clock is not None else [0.0]
    return GuardedCoordinator(inner, timeout_s=0.001, probe_timeout_s=5,
                              on_event=None if events is None else events.append,
                              monotonic=lambda: now[0])


async def test_slow_answers_are_unknown_and_never_unavailable():
    """Answers held past the bound are unknown: answered from the local share, the probe
    finds the store answering, no event (docs/fleet.md "When Redis is slow or down")."""
    inner, events = Held(InProcessCoordinator()), []
    g = guard(inner, events)
    inner.hold = True
    answers = await asyncio.gather(*(g.admit(KEY, retry=True, budget=BUDGET, pacing=None)
                                     for _ in range(20)))
    await settled(g)
    assert g.answers == {"remote": 0, "unknown": 20, "down": 0}
    assert sum(a.token_taken for a in answers) == 4, "the local share: 4 of a bucket of 10"
    assert inner.probes == 1 and events == [] and g.available
    while inner.parked:  # the late answers each took a token: each is given back
        inner.release()
        await settled(g)
    assert inner.store.tokens(KEY, BUDGET) == 10


async def test_a_failing_probe_declares_down_once_and_a_succeeding_one_restores_once():
    """A probe that fails is one coordinator_unavailable, however many calls and probes
    follow; the first probe that succeeds is one coordinator_restored (docs/fleet.md)."""
    clock, inner, events = [0.0], Held(InProcessCoordinator()), []
    g = guard(inner, events, clock)
    inner.hold = True
    inner.probe_fail = CoordinatorError("127.0.0.1:1: ConnectionError")
    for step in range(50):
        clock[0] = step * 0.05  # probes fall due, and fail
        await g.admit(KEY, retry=False, budget=None, pacing=None)
        await settled(g)
    assert events == [{"type": "coordinator_unavailable", "reason": "127.0.0.1:1: ConnectionError"}]
    assert 3 <= inner.probes < 20, "probes back off while they fail"
    assert g.answers["down"] > 40, "while down, calls do not wait for the store"
    inner.probe_fail = None
    for step in range(50, 300):
        clock[0] = step * 0.05
        await g.admit(KEY, retry=False, budget=None, pacing=None)
        await settled(g)
    assert events[1:] == [{"type": "coordinator_restored"}]
    for gate in inner.parked:
        gate.set_result(None)


async def test_an_error_is_down_at_once_and_only_once():
    """An error (not a slow answer) declares the store down at once, one event."""
    inner, events = Held(InProcessCoordinator()), []
    g = guard(inner, events)
    inner.fail = CoordinatorError("refused")
    inner.probe_fail = CoordinatorError("refused")
    for _ in range(30):
        await g.admit(KEY, retry=True, budget=BUDGET, pacing=None)
    await settled(g)
    assert events == [{"type": "coordinator_unavailable", "reason": "refused"}]


async def test_the_local_share_bounds_a_fleet_whose_coordinator_is_down():
    """Four processes, the store down: each decides on its share (10 tokens of 40), so the
    fleet lets through no more retries than the bucket's bound (docs/fleet.md)."""
    store = InProcessCoordinator()
    budget = BudgetSettings(max_tokens=40)
    inners = [Held(store, fleet=4) for _ in range(4)]
    guards = [guard(inner) for inner in inners]
    for g in guards:  # the heartbeat: four processes heard
        await g.admit(KEY, retry=False, budget=None, pacing=None)
    await settled(*guards)
    assert [g.processes for g in guards] == [4] * 4
    for inner in inners:
        inner.fail = CoordinatorError("refused")
        inner.probe_fail = CoordinatorError("refused")
    allowed = 0
    for _ in range(100):
        for g in guards:
            allowed += (await g.admit(KEY, retry=True, budget=budget, pacing=None)).budget is True
    assert allowed == 4 * 4, "each share of 10 lets 4 through: 16, within the bound of 19"


async def test_under_load_and_unknown_the_fleet_stays_within_twice_its_bound():
    """Four processes, every other answer too late: the store's bound plus the shares'
    stays within twice the bucket's bound (docs/fleet.md "When Redis is slow or down")."""
    store = InProcessCoordinator()
    budget = BudgetSettings(max_tokens=40)
    inners = [Held(store, fleet=4) for _ in range(4)]
    guards = [guard(inner) for inner in inners]
    for g in guards:
        await g.admit(KEY, retry=False, budget=None, pacing=None)
    await settled(*guards)
    went = 0
    for n in range(60):
        for inner, g in zip(inners, guards):
            inner.hold = n % 2 == 1
            went += (await g.admit(KEY, retry=True, budget=budget, pacing=None)).budget is True
    for inner in inners:
        while inner.parked:
            inner.release()
    await settled(*guards)
    assert 19 <= went <= 2 * 19, "the bound of a bucket of 40 is 19 retries"
    assert all(g.available for g in guards)


MODES = st.sampled_from(["in_time", "bound", "abort_in_flight"])
FATES = st.sampled_from(["goes", "not_sent", "not_sent_twice"])


@settings(max_examples=40, deadline=None)
@given(calls=st.lists(st.tuples(MODES, FATES, st.integers(0, 3)), min_size=1, max_size=8),
       order=st.randoms(use_true_random=False))
def test_a_token_for_a_retry_that_does_not_go_is_given_back_in_every_order(calls, order):
    """Whatever the order of the answer, the abort and the bound, the store and the local
    share each end with exactly the tokens of the retries that went taken from them; a
    second give-back of one retry returns nothing (docs/fleet.md, SPEC §15.6)."""
    asyncio.run(_interleave(calls, order))


async def _interleave(calls, order) -> None:
    inner = Held(InProcessCoordinator())
    g = guard(inner)
    went = {"remote": 0, "local": 0}
    for mode, fate, releases in calls:
        inner.hold = mode != "in_time"
        g.timeout_s = 60.0 if mode != "bound" else 0.001
        remote_before, parked = g.answers["remote"], len(inner.parked)
        task = asyncio.ensure_future(g.admit(KEY, retry=True, budget=WAITING, pacing=None))
        if mode == "abort_in_flight":
            while len(inner.parked) == parked:  # its question is with the store
                await asyncio.sleep(0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        else:
            answer = await task
            source = "remote" if g.answers["remote"] > remote_before else "local"
            if answer.token_taken:
                if fate == "goes":
                    went[source] += 1
                else:
                    await g.return_retry_token(KEY, WAITING, token=answer.token)
                    if fate == "not_sent_twice":
                        await g.return_retry_token(KEY, WAITING, token=answer.token)
        for _ in range(min(releases, len(inner.parked))):
            inner.release(order.randrange(len(inner.parked)))
            await settled(g)
    while inner.parked:
        inner.release(order.randrange(len(inner.parked)))
        await settled(g)
    await settled(g)
    assert inner.store.tokens(KEY, WAITING) == 10 - went["remote"]
    assert g.fallback.tokens(KEY, WAITING) == 10 - went["local"]


async def test_a_store_that_drops_every_byte_is_down_once_and_never_restored():
    """A Redis address that accepts connections and answers nothing: unknown at first, one
    coordinator_unavailable once the probe finds no answer, no coordinator_restored while it
    stays so, and calls answer locally without waiting for it (docs/fleet.md)."""
    sink = socket.create_server(("127.0.0.1", 0))
    sink.setblocking(False)
    held: list = []

    async def swallow(reader, writer):
        held.append(writer)
        while await reader.read(65536):
            pass
    server = await asyncio.start_server(swallow, sock=sink)
    port = sink.getsockname()[1]
    events: list = []
    g = GuardedCoordinator(RedisCoordinator.from_url(f"redis://127.0.0.1:{port}/0"),
                           timeout_s=0.01, probe_timeout_s=0.05, probe_interval_s=0.01,
                           on_event=events.append)
    while not events:
        await g.admit(KEY, retry=True, budget=BUDGET, pacing=None)
        await asyncio.sleep(0.01)
    for _ in range(40):
        await g.admit(KEY, retry=True, budget=BUDGET, pacing=None)
        await asyncio.sleep(0.01)
    await settled(g)
    assert [e["type"] for e in events] == ["coordinator_unavailable"]
    assert g.answers["down"] >= 40
    for writer in held:
        writer.close()
    server.close()
    await g.aclose()


# ------------------------------------------------ a probe's patience is not spent by load (§15.6)
def test_a_probe_s_patience_counts_only_time_the_loop_was_not_late():
    """SPEC §15.6: the guard declares the coordinator down only on errors or a probe that
    confirms it, never on load alone. A probe's bound (0.5 s) whose every deadline the loop
    reaches a second late is never given up, however long that lasts (the remote's socket
    timeout is the backstop); the first deadline reached on time ends it. A call's bound
    still gives up after MAX_EXTENSIONS late deadlines."""
    from fsm.fleet._guard import LOOP_LAG_TOLERANCE_S, MAX_EXTENSIONS, _Patience

    probe = _Patience(100.0, 0.5, patient=True)
    now = 100.0
    for _ in range(100):  # 150 s of a busy loop: far beyond ten times the bound
        now = probe.deadline + 1.0
        assert probe.reached(now) == now + 0.5  # moved on by the lateness, at most the bound
    assert probe.reached(probe.deadline + LOOP_LAG_TOLERANCE_S / 2) is None  # on time: given up

    quiet = _Patience(100.0, 0.5, patient=True)
    assert quiet.deadline == 100.5 and quiet.reached(100.5) is None  # a quiet loop: 0.5 s

    call = _Patience(100.0, 0.05)
    for _ in range(MAX_EXTENSIONS):
        assert call.reached(call.deadline + 0.02) is not None
    assert call.reached(call.deadline + 0.02) is None


async def test_a_probe_on_a_loop_late_at_every_deadline_waits_for_its_answer():
    """The probe of a guard whose event loop reaches every deadline a second late (the loop's
    clock is the test's: each look at it finds it a second on) gets its answer after 30 such
    seconds (60 times its bound): the remote stays up, no event (SPEC §15.6)."""
    loop = asyncio.get_running_loop()
    answered = asyncio.Event()
    real_time = loop.time
    start = real_time()
    fake = [start]

    def late_clock() -> float:  # each look finds the clock a second on: every deadline is late
        fake[0] += 1.0
        if fake[0] - start > 30:
            answered.set()
        return fake[0]

    class Slow(Held):
        async def probe(self):
            self.probes += 1
            await answered.wait()

    events: list = []
    inner = Slow(InProcessCoordinator())
    g = GuardedCoordinator(inner, timeout_s=0.001, probe_timeout_s=0.5, on_event=events.append)
    g.breaker.probing = True  # the probe below is the one the breaker allowed
    loop.time = late_clock  # type: ignore[method-assign]
    try:
        ok = await g._probe()
    finally:
        del loop.time  # the loop's own clock again
    assert ok and inner.probes == 1 and fake[0] - start > 30
    assert events == [] and g.available
