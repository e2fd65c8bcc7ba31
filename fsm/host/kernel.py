"""The host kernel: gather the facts, call the brain, carry out its actions — written once.

Every host of the retry brain (:class:`~fsm.host.session.AgentSession`, the runner of
:mod:`fsm.host.runner`, the integrations) does the same three things around a
:class:`~fsm.core.brain.RetryBrain` (``docs/architecture.md``, "The host kernel"):

1. **Gather the facts** before the brain decides (``docs/policy.md`` §8b.2): the host's clock
   (:meth:`HostKernel.now_ms`), the credential store's answer on a usage limit, the
   coordinator's cooldown and retry budget. Every coordinator read, whatever the coordinator,
   is bounded by one rule: it has :data:`COORDINATOR_TIMEOUT_S` to answer. A read that does not
   answer in time (or fails) counts as *unknown*: the decision is made on the local state (the
   coordinator's own local fallback when it offers one, else the in-process coordinator this
   host shares with its event loop), never on a blanket "allowed"; a budget token that the late
   answer took is given back when it arrives.
2. **Call the brain** with those facts (:meth:`HostKernel.turn_ended`; the message is classified
   against the host's ``now_ms`` and time-zone resolver, :meth:`HostKernel.classify`).
3. **Carry out the actions** that concern the world outside the host's loop, in the order the
   brain returned them (:meth:`HostKernel.perform`): events to the host's ``emit``, the
   coordinator's writes (a cooldown learned, a token given back, a success credited) as
   background tasks bounded by :data:`WRITE_TIMEOUT_S`. The actions that belong to the host's
   own loop (:data:`HOST_LOOP_ACTIONS`: the backoff timer, continuing the turn, the turn's end
   events, dropping the failed message, the compaction check, "prompt may return") are handed
   to the host's callback at their place in that order.
4. **Pass each request through the gate** right before it goes (:meth:`HostKernel.gate`,
   docs/fleet.md "Pacing", "First requests"): a chain's first request under the resilient
   profile, and every retry once its backoff is over, ask the coordinator for the key's
   cooldown and the fleet pacer's slot, and wait for them (``request_delayed``). The slot is
   taken when the request is about to go, not at the retry's decision.

Every coordinator call is in the adapter section at the end of this module
(``_coord_*``): the coordinator protocol (``docs/fleet.md``) is spoken there and nowhere else.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import random as _random
import time
import weakref
from datetime import tzinfo
from typing import Any, Awaitable, Callable

from fsm.core import brain as B
from fsm.core import events as E
from fsm.core.brain import RetryBrain, TurnFacts
from fsm.core.classify import Classification, classify_message
from fsm.core.messages import AssistantMessage
from fsm.core.text import safe_error_text
from fsm.host.clock import LoopClock

__all__ = ["HostKernel", "COORDINATOR_TIMEOUT_S", "WRITE_TIMEOUT_S", "STORE_TIMEOUT_S",
           "KEY_TIMEOUT_S", "HOST_LOOP_ACTIONS", "ZoneResolver", "default_zone",
           "loop_coordinator", "describe_error", "provider_id", "KNOWN_HOSTS"]

log = logging.getLogger("fsm.host.kernel")

ZoneResolver = Callable[[str], "tzinfo | None"]
"""``zone(name) -> tzinfo | None``: an IANA zone (``"America/Santiago"``) by name; None when
unknown. The host passes one with the facts; the core itself knows no zone but UTC."""

COORDINATOR_TIMEOUT_S = 0.1
"""How long every host waits for one coordinator read before it decides on local state
(``docs/policy.md`` §8b.2). The guarded coordinator answers from its own fallback well within
it (50 ms); the bound only matters for a coordinator that does not bound itself or a loop so
busy that the answer is late."""

WRITE_TIMEOUT_S = 2.0
"""How long a coordinator write (made after the decision, off the host's path) may take before
it is given up and logged: above the guarded coordinator's own write deadline (1 s), so this
bound only stops a coordinator that never answers."""

STORE_TIMEOUT_S = 0.05
"""How long a host waits for the credential store's usage-limit answer before it decides on
local state (``docs/policy.md`` §8b.2)."""

KEY_TIMEOUT_S = 2.0
"""How long a turn waits for the credential store to hand out its API key; after that the turn
fails with an error saying so (the chain decides as for any failure)."""

HOST_LOOP_ACTIONS: tuple[type, ...] = (
    B.StartBackoff, B.CancelBackoff, B.ContinueTurn, B.DropFailedMessage, B.EmitTurnEnd,
    B.CheckCompaction, B.PromptMayReturn)
"""The brain's actions that belong to the host's own loop; :meth:`HostKernel.perform` hands
them to the host, in order. (``AbortAttempt`` joins them when it is declared.)"""

_WRITES = (B.RecordCooldown, B.ReturnRetryToken, B.CreditRetryBudget)
_EMIT = B.Emit


@functools.lru_cache(maxsize=256)
def default_zone(name: str) -> tzinfo | None:
    """The host's zone resolver: ``zoneinfo``'s zone named ``name`` (any case:
    ``america/santiago``), or None when the system's zone database does not know it."""
    from zoneinfo import ZoneInfo, available_timezones  # a shell may read the zone database
    if not isinstance(name, str) or not name:
        return None
    try:
        return ZoneInfo(name)
    except (ValueError, OSError, KeyError):
        pass
    for key in _zone_names():
        if key.lower() == name.lower():
            return ZoneInfo(key)
    return None


@functools.lru_cache(maxsize=1)
def _zone_names() -> tuple[str, ...]:
    from zoneinfo import available_timezones
    return tuple(sorted(available_timezones()))


def describe_error(exc: BaseException) -> str:
    """``Type: text`` of an exception, scrubbed of anything shaped like a credential and clipped
    (it may reach an event, the context or a log)."""
    try:
        text = str(exc)
    except Exception:  # an exception whose __str__ raises: its class name is all we have
        text = ""
    return safe_error_text(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


class HostKernel:
    """What one host does around one :class:`~fsm.core.brain.RetryBrain`.

    Args:
        brain: the brain whose facts this kernel gathers and whose actions it carries out.
        emit: ``emit(event)`` — the host's way to send a :mod:`fsm.core.events` event to its
            listeners (called synchronously, in the brain's order; also hears the
            coordinator's ``coordinator_unavailable`` / ``coordinator_restored``).
        clock: the host's clock (``time_ms() -> int`` epoch ms); None = the wall clock.
            A clock without ``time_ms`` gives no time (``now_ms`` None: no deadline, no
            ``retryAt``).
        coordinator: the shared coordinator (``docs/fleet.md``); None = the in-process one this
            host shares with every host on its event loop and clock (:func:`loop_coordinator`),
            created when first needed (hints honoured or a budget set).
        credentials: a :class:`~fsm.core.protocols.CredentialStore` for the usage-limit path,
            or None.
        key: ``key() -> CoordKey``: the coordinator's key for the request that just failed
            (asked only when the coordinator is used).
        zone: the zone resolver passed to the classifier with the facts (default
            :func:`default_zone`; None = named zones are unknown).
        scrub: makes a text safe for an event (a host that knows its secrets passes its own).
        use_coordinator: False for a host without an event loop (a synchronous run): no
            coordinator is read or written.
        random: floats in [0, 1) for the jitter of the pacer's re-check (pass the source the
            brain was given, so that a test's run is deterministic); None = ``random.random``.
        paces_at_send: True for a host that passes every retry through the gate
            (:meth:`gate`) right before it goes (the session, the runner): the retry's
            decision then reserves no pacing slot. False (a host that only steps the chain,
            :class:`~fsm.host.chain.Chain`): the decision reserves the slot, as its only
            pacing (docs/fleet.md "Pacing").
    """

    __slots__ = ("brain", "emit", "clock", "_coordinator", "credentials", "key", "zone",
                 "scrub", "use_coordinator", "random", "paces_at_send", "_unsubscribe",
                 "_writes", "_token_from", "_floor_booked", "__weakref__")

    def __init__(self, brain: RetryBrain, *, emit: Callable[[E.Event], Any],
                 clock: Any = None, coordinator: Any = None, credentials: Any = None,
                 key: Callable[[], Any] | None = None, zone: ZoneResolver | None = default_zone,
                 scrub: Callable[[str], str] = safe_error_text,
                 use_coordinator: bool = True, random: Callable[[], float] | None = None,
                 paces_at_send: bool = False) -> None:
        self.brain = brain
        self.random = random or _random.random
        self.paces_at_send = paces_at_send
        self._floor_booked = False  # the budget's last answer reserved a floor slot for the retry
        self.emit = emit
        self.clock = clock
        self._coordinator = coordinator
        self.credentials = credentials
        self.key = key
        self.zone = zone
        self.scrub = scrub
        self.use_coordinator = use_coordinator
        self._unsubscribe: Callable[[], None] | None = None
        self._writes: set[asyncio.Task] | None = None  # created with the first write
        self._token_from: Any = None  # the coordinator that gave this decision's budget token
        if coordinator is not None:
            self._subscribe()

    # ------------------------------------------------------------------ the clock
    def now_ms(self) -> int | None:
        """The host's time in epoch ms, or None for a clock that gives none."""
        clock = self.clock
        if clock is None:
            return time.time_ns() // 1_000_000
        time_ms = getattr(clock, "time_ms", None)
        return time_ms() if time_ms is not None else None

    # ------------------------------------------------------------------ 1. the facts
    def classify(self, message: AssistantMessage, context_window: int = 0,
                 now_ms: int | None = None) -> Classification:
        """Classify ``message`` against the host's time (``now_ms``; default :meth:`now_ms`)
        and zone resolver (docs/policy.md §2; absolute hints are measured from that time)."""
        now = self.now_ms() if now_ms is None else now_ms
        return classify_message(message, context_window, now_ms=now, zone=self.zone)

    def needs_world(self, cls: Classification) -> bool:
        """True when the facts for ``cls`` need an await (the credential store or the
        coordinator is asked); False on the common path (a success, a fatal error)."""
        if cls.kind != "retryable":
            return False
        settings = self.brain.settings
        if not settings.enabled:
            return False
        if cls.usage_limit and self.credentials is not None:
            return True
        return self.uses_coordinator()

    def uses_coordinator(self) -> bool:
        """True when the settings need the coordinator: hints honoured, a retry budget, or
        pacing (docs/fleet.md), on a host that has an event loop."""
        s = self.brain.settings
        return self.use_coordinator and (s.honors_hints or s.budget is not None
                                         or (s.pacing is not None and s.pacing.enabled))

    def quick_facts(self, cls: Classification, *, now_ms: int | None = None,
                    output_streamed: bool = False) -> TurnFacts | None:
        """The facts for ``cls`` when they need no await (:meth:`local_facts`), or None when the
        world must be asked (:meth:`gather`): one call on a host's common path."""
        if cls.kind == "retryable" and self.needs_world(cls):
            return None
        return TurnFacts(now_ms=self.now_ms() if now_ms is None else now_ms,
                         output_streamed=output_streamed, zone=self.zone)

    def local_facts(self, *, now_ms: int | None = None, output_streamed: bool = False) -> TurnFacts:
        """The facts that need no await: the time, whether output was streamed, the zone."""
        return TurnFacts(now_ms=self.now_ms() if now_ms is None else now_ms,
                         output_streamed=output_streamed, zone=self.zone)

    async def gather(self, cls: Classification, *, now_ms: int | None = None,
                     output_streamed: bool = False, provider: str = "",
                     session_id: str = "") -> TurnFacts:
        """The facts the brain needs for a turn that ended as ``cls`` (docs/policy.md §8b.2):
        the time, the credential store's answer on a usage limit (``provider`` and
        ``session_id`` name the store's entry), the coordinator's cooldown and budget. Never
        raises for a slow or failing store or coordinator: it decides on local state, says so
        in a log line (and, for the store, in the ``auto_retry_start`` note)."""
        now = self.now_ms() if now_ms is None else now_ms
        self._token_from = None
        if not self.needs_world(cls):
            return TurnFacts(now_ms=now, output_streamed=output_streamed, zone=self.zone)
        switched, count, note = False, 1, None
        if cls.usage_limit and self.credentials is not None:
            try:
                switched = bool(await self.ask_store("mark_usage_limit_reached", provider, session_id,
                                                     cls.retry_hint_ms, timeout=STORE_TIMEOUT_S))
                counter = getattr(self.credentials, "credential_count", None)
                if counter is not None:
                    count = max(1, int(counter(provider)))
            except Exception as exc:  # a broken or slow store: the normal backoff, said so
                note = self.scrub(f"credential store failed: {describe_error(exc)}; normal backoff")
                log.warning("%s", note)
        facts = TurnFacts(now_ms=now, output_streamed=output_streamed, credential_switched=switched,
                          credential_count=count, note=note, zone=self.zone)
        if self.uses_coordinator():
            await self._record_throttle(cls, output_streamed)
            facts = await self._admission_facts(facts, now, floor_slot_due=False)
        return facts

    async def _record_throttle(self, cls: Classification, output_streamed: bool) -> None:
        """Tell the pacer a retryable failure (docs/fleet.md "Pacing"): a capacity signal
        (:attr:`~fsm.core.classify.Classification.capacity_signal`: a 429, 503, 529, a
        connection refused or reset) with nothing streamed is ``throttled``; any other (a
        random 500, a stall, a timeout, a usage limit, a failure after output) is another
        answer, which teaches nothing. A throttle's write is awaited, bounded by
        :data:`COORDINATOR_TIMEOUT_S`, so that it lands before the retry's slot is taken (at
        the gate, or at the decision for a host that does not pace at send), however short the
        backoff: the retry is paced by what its own failure taught. A late or failing write
        only costs sharing."""
        pacing = self.brain.settings.pacing
        if pacing is None or not pacing.enabled:
            return
        coordinator = self.coordinator()
        if not _coord_v3(coordinator):
            return
        throttled = cls.capacity_signal and not output_streamed
        write = self._spawn(_coord_record(coordinator, self.key(), success=False,
                                          throttled=throttled, budget=None, pacing=pacing))
        if throttled:  # another answer changes no slot: nothing to wait for
            await asyncio.wait((write,), timeout=COORDINATOR_TIMEOUT_S)

    async def recheck_budget(self, *, now_ms: int | None = None) -> TurnFacts:
        """The facts for a retry that waited for the retry budget's floor slot (budget in
        wait mode, docs/policy.md §13.7): the coordinator is asked again with the slot due.
        Never raises for a slow or failing coordinator (local state, as :meth:`gather`)."""
        now = self.now_ms() if now_ms is None else now_ms
        self._token_from = None
        facts = TurnFacts(now_ms=now, zone=self.zone)
        if not self.uses_coordinator():
            return facts
        # only a floor slot reserved for this retry is due now; an answer that reserved none
        # (beyond the floor's horizon, or no floor) is asked afresh (docs/fleet.md "Budget in
        # wait mode")
        return await self._admission_facts(facts, now, floor_slot_due=self._floor_booked)

    async def _admission_facts(self, facts: TurnFacts, now: int | None, *,
                               floor_slot_due: bool) -> TurnFacts:
        """``facts`` with the coordinator's answer for a retry: the cooldown (hints honoured),
        the budget's answer, the token taken and the budget's floor slot, in one atomic step
        (cooldown and budget together). A host that paces at send (:attr:`paces_at_send`)
        reserves no pacing slot here (``pacing_ms`` 0): the retry takes its slot at the gate
        after its backoff (:meth:`gate`); a slot reserved now for a retry that goes after a
        jittered backoff of up to ``maxDelayMs`` would be wasted, and booked beyond the
        pacer's horizon. Otherwise the slot is reserved here (``pacing_ms``)."""
        settings = self.brain.settings
        cooldown, ok, taken, pacing_ms, budget_wait, paced, floor_booked = await self._admit(
            now, retry=True, floor_slot_due=floor_slot_due, pacing=not self.paces_at_send,
            max_wait=True)
        if not paced:
            # a host that reserves the slot here (a stepwise Chain, no gate) and the pacer had
            # none within its horizon: nothing was taken (the budget was not even asked). The
            # budget and the cooldown are asked again without pacing — so the retry is still
            # bounded by the budget — and the retry waits at least the pacer's re-check
            # (jittered); it then goes unpaced (a Chain has no gate to ask again at)
            cooldown, ok, taken, _, budget_wait, _, floor_booked = await self._admit(
                now, retry=True, floor_slot_due=floor_slot_due, pacing=False, max_wait=True)
            pacing = settings.pacing
            pacing_ms = max(1, round((pacing.recheck_ms if pacing is not None else 1000)
                                     * (0.5 + self.random())))
        budget = settings.budget
        waits = (ok is False and budget is not None
                 and getattr(budget, "mode", "refuse") == "wait")
        self._floor_booked = waits and floor_booked
        if waits and not floor_booked:  # a re-check, not a slot: jittered ×U(0.5, 1.5)
            budget_wait = max(1, round(budget_wait * (0.5 + self.random())))
        return dataclasses.replace(
            facts, cooldown_ms=cooldown if settings.honors_hints else 0,
            budget_allows=ok is not False, budget_taken=taken,
            budget_slot_ms=budget_wait if waits else None, pacing_ms=pacing_ms)

    # ------------------------------------------------------------------ the gate
    def gates(self, *, first: bool = False) -> bool:
        """True when the request about to go passes the gate (:meth:`gate`): a chain's
        ``first`` request under a profile that admits first requests (the resilient profile,
        docs/fleet.md "First requests"), and any request — first or retry — with pacing on,
        on a host that paces at send (:attr:`paces_at_send`). False under the seed profile
        without pacing: no gate call, no ``request_delayed``."""
        if not self.uses_coordinator():
            return False
        settings = self.brain.settings
        paced = self.paces_at_send and settings.pacing is not None and settings.pacing.enabled
        if first:
            return settings.enabled and (settings.admits_first_requests or paced)
        return paced

    async def pace(self, *, first: bool = False, now_ms: int | None = None) -> tuple[int, int, bool]:
        """Ask the gate once for the request about to go (docs/fleet.md "Pacing", "First
        requests"): one bounded coordinator ``admit`` (no budget token: a retry's was taken at
        its decision) that reads the key's cooldown and reserves the pacer's slot.

        Returns ``(cooldown_ms, delay_ms, booked)``:

        - ``cooldown_ms``: the shared cooldown left (0 when hints are ignored);
        - ``booked`` True: a slot is reserved (or there is nothing to reserve: pacing off, or
          the pacer not pacing) and the request goes ``delay_ms`` from now,
          ``max(cooldown, pacing slot)``, 0 = at once;
        - ``booked`` False: the pacer had no slot within its horizon (``horizonMs``); nothing
          is reserved and the host asks again ``delay_ms`` from now: ``recheckMs`` jittered
          ×U(0.5, 1.5) with :attr:`random` (or the cooldown left, when longer).

        A ``first`` request whose cooldown is beyond ``maxHintWaitMs`` (hints honoured) gets
        ``(cooldown, cooldown, True)`` with nothing reserved: the host refuses it. A retry
        waits out any cooldown learned since its decision (no row of the brain refuses a
        retry once it continues; the chain's deadline, ``maxElapsedMs``, bounds the wait, and
        ``abort_retry()`` ends it). Never raises
        for a slow or failing coordinator: a late one is answered from local state (as
        :meth:`gather`); a failing local state lets the request go at once (logged)."""
        if not self.uses_coordinator():
            return 0, 0, True
        settings = self.brain.settings
        pacing = settings.pacing if settings.pacing is not None and settings.pacing.enabled else None
        now = self.now_ms() if now_ms is None else now_ms
        try:
            cooldown, _, _, pacing_ms, _, booked, _ = await self._admit(
                now, retry=False, floor_slot_due=False, pacing=pacing is not None,
                max_wait=first and settings.admits_first_requests)
        except Exception as exc:  # the local state failed too: the request is not held up
            log.warning("pacing gate: coordinator failed: %s; sending now", describe_error(exc))
            return 0, 0, True
        if not settings.honors_hints or (first and not settings.admits_first_requests):
            cooldown = 0  # under the seed profile a cooldown never touches a first request
        elif first and cooldown > settings.max_hint_wait_ms:
            return cooldown, cooldown, True  # nothing reserved: the request is refused
        if booked or pacing is None:
            return cooldown, max(cooldown, pacing_ms), True
        recheck = max(1, round(pacing.recheck_ms * (0.5 + self.random())))
        return cooldown, max(cooldown, recheck), False

    async def gate(self, wait: Callable[[int], Awaitable[bool]], *,
                   first: bool = False) -> tuple[int, int | None] | None:
        """Pass the request about to go through the gate (:meth:`pace`), waiting as long as
        it says: each wait is told in a ``request_delayed {delayMs, retryAt, delaySource:
        "pacing" | "cooldown"}`` event (``emit``), then waited with the host's ``wait(delay_ms)
        -> bool``; booked, the request goes once the delay has passed; not booked, the gate is
        asked again.

        ``wait`` is the host's cancellable wait: it answers False when the host ended it early
        (an abort, the chain's deadline, ``retry_now``) — the gate stops and the host decides
        from its own state (an abort sends nothing). Returns None when the request may go (or
        the wait was ended), or ``(cooldown_ms, now_ms)`` when a ``first`` request must be
        refused (a cooldown beyond ``maxHintWaitMs``: the host calls the brain's
        ``request_refused``). Raises what ``wait`` raises (a cancellation)."""
        settings = self.brain.settings
        while True:
            now = self.now_ms()
            cooldown, delay, booked = await self.pace(first=first, now_ms=now)
            if (first and settings.honors_hints and settings.admits_first_requests
                    and cooldown > settings.max_hint_wait_ms):
                return cooldown, now
            if booked and delay <= 0:
                return None
            source = "cooldown" if cooldown >= delay else "pacing"
            self.emit(E.RequestDelayed(delay, None if now is None else now + delay, source))
            if not await wait(delay) or booked:
                return None

    def record_outcome(self, cls: Classification, *, output_streamed: bool = False) -> None:
        """An answer came back: tell the coordinator's pacer, off the critical path
        (docs/fleet.md "Pacing"): ``success`` for a success (the rate may grow),
        ``throttled`` for a capacity signal without progress (nothing streamed, and
        :attr:`~fsm.core.classify.Classification.capacity_signal`: a 429, 503, 529, a
        connection refused or reset), neither for any other answer (a random 500, a stall, a
        timeout, a usage limit, a fatal error, a context overflow, a failure after output was
        streamed: nothing learned). An aborted turn tells nothing. The budget's credit stays
        the brain's ``CreditRetryBudget``."""
        pacing = self.brain.settings.pacing
        if pacing is None or not pacing.enabled or not self.use_coordinator:
            return
        if cls.kind == "aborted" or (cls.kind == "retryable" and self.needs_world(cls)):
            return  # a retryable failure is told in gather() (_record_throttle)
        coordinator = self.coordinator()
        if not _coord_v3(coordinator):
            return
        throttled = cls.capacity_signal and not output_streamed
        self._spawn(_coord_record(coordinator, self.key(), success=cls.kind == "none",
                                  throttled=throttled, budget=None, pacing=pacing))

    async def _admit(self, now: int | None, *, retry: bool, floor_slot_due: bool,
                     pacing: bool, max_wait: bool
                     ) -> tuple[int, bool | None, bool, int, int, bool, bool]:
        """``(cooldown_ms, budget answer or None, token taken, pacing_ms, budget_wait_ms,
        pacing booked, floor slot booked)`` from one bounded coordinator call (v3 ``admit``; a coordinator before
        v3 answers the first two through ``before_decision``). ``pacing``: reserve the pacer's
        slot (pacing on); ``max_wait``: pass ``maxHintWaitMs`` (hints honoured), beyond which
        nothing is taken or reserved. Late or failing → the local state; a token a late answer
        took is given back."""
        coordinator = self.coordinator()
        if not _coord_v3(coordinator):
            if not retry:
                return 0, None, False, 0, 0, True, True
            left, ok = await self._read(now)
            return left, ok, ok is not None, 0, 0, True, True
        settings = self.brain.settings
        key = self.key()
        args = _coord_admit_args(settings, retry=retry, floor_slot_due=floor_slot_due,
                                 pacing=pacing, max_wait=max_wait)
        if _coord_at_once(coordinator) is not None or getattr(coordinator, "self_bounded", False):
            # no I/O, or a coordinator that bounds itself and answers locally when late (the
            # guarded one): an extra timeout would only turn its local answer into a default
            # under load (docs/fleet.md "How a session uses it")
            self._token_from = coordinator
            return _coord_admission(await coordinator.admit(key, **args))
        task = asyncio.ensure_future(coordinator.admit(key, **args))
        budget = args["budget"] if retry else None
        try:
            done, _ = await asyncio.wait((task,), timeout=COORDINATOR_TIMEOUT_S)
        except BaseException:  # cancelled while waiting: the late answer's token goes back
            task.add_done_callback(functools.partial(_give_back_late_admission, coordinator, key, budget))
            raise
        if done and not task.cancelled() and task.exception() is None:
            self._token_from = coordinator
            return _coord_admission(task.result())
        if done:
            exc = task.exception() if not task.cancelled() else asyncio.CancelledError()
            log.warning("coordinator failed: %s; deciding on local state", describe_error(exc))
        else:
            log.warning("coordinator did not answer within %g ms: deciding on local state",
                        COORDINATOR_TIMEOUT_S * 1000)
            task.add_done_callback(functools.partial(_give_back_late_admission, coordinator, key, budget))
        local = getattr(coordinator, "fallback", None)
        if local is None or not _coord_v3(local):
            local = self._local_coordinator()
        self._token_from = local
        return _coord_admission(await local.admit(key, **args))

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task:
        """Run a coordinator write in the background, bounded; kept alive until it ends."""
        task = asyncio.get_running_loop().create_task(_bounded_write(coro))
        if self._writes is None:
            self._writes = set()
        self._writes.add(task)
        _IN_FLIGHT.add(task)  # kept alive after the host that asked for it is gone
        task.add_done_callback(self._writes.discard)
        task.add_done_callback(_IN_FLIGHT.discard)
        return task

    async def ask_store(self, name: str, *args: Any, timeout: float) -> Any:
        """Call the credential store's ``name`` (its async ``a<name>`` when it has one; a
        ``blocking`` store's sync call off the loop), bounded by ``timeout`` seconds. Raises
        what the store raises, or ``TimeoutError``."""
        store = self.credentials
        async_fn = getattr(store, "a" + name, None)
        if async_fn is not None and asyncio.iscoroutinefunction(async_fn):
            return await asyncio.wait_for(async_fn(*args), timeout)
        if not getattr(store, "blocking", False):  # a store that does no I/O answers at once
            return getattr(store, name)(*args)
        return await asyncio.wait_for(asyncio.to_thread(getattr(store, name), *args), timeout)

    async def _read(self, now: int | None) -> tuple[int, bool | None]:
        """``(cooldown left ms, budget answer or None)`` from the coordinator, bounded by
        :data:`COORDINATOR_TIMEOUT_S`; unknown (late or failing) → the local state."""
        coordinator = self.coordinator()
        key = self.key()
        budget = self.brain.settings.budget
        when = now if now is not None else time.time_ns() // 1_000_000
        local = _coord_at_once(coordinator)
        if local is not None:  # no I/O: it answers at once, never late
            self._token_from = coordinator
            return _coord_read_local(local, key, when, budget)
        task = asyncio.ensure_future(_coord_read(coordinator, key, when, budget))
        try:
            done, _ = await asyncio.wait((task,), timeout=COORDINATOR_TIMEOUT_S)
        except BaseException:  # the host was cancelled while waiting: the late answer's token
            task.add_done_callback(functools.partial(_give_back_late, coordinator, key, budget))
            raise
        if done and not task.cancelled() and task.exception() is None:
            self._token_from = coordinator
            return task.result()
        if done:
            exc = task.exception() if not task.cancelled() else asyncio.CancelledError()
            log.warning("coordinator failed: %s; deciding on local state", describe_error(exc))
        else:
            log.warning("coordinator did not answer within %g ms: deciding on local state",
                        COORDINATOR_TIMEOUT_S * 1000)
            task.add_done_callback(functools.partial(_give_back_late, coordinator, key, budget))
        local = _coord_local(coordinator, self._local_coordinator)
        if local is None:  # pragma: no cover - the in-process coordinator always answers
            return 0, None
        self._token_from = local
        return _coord_read_local(local, key, when, budget)

    # ------------------------------------------------------------------ the coordinator
    def coordinator(self) -> Any:
        """The host's coordinator: the one given, or the in-process one it shares with the
        hosts on its event loop and clock (created on first use; its events are forwarded)."""
        if self._coordinator is None:
            self._coordinator = self._local_coordinator()
            self._subscribe()
        return self._coordinator

    @property
    def configured_coordinator(self) -> Any:
        """The coordinator given or already created, or None (nothing is created)."""
        return self._coordinator

    def _local_coordinator(self) -> Any:
        return loop_coordinator(self.clock)

    def _subscribe(self) -> None:
        subscribe = getattr(self._coordinator, "subscribe", None)
        if subscribe is None or self._unsubscribe is not None:
            return
        emit = weakref.WeakMethod(self._on_coordinator_event)
        self._unsubscribe = subscribe(lambda event: (emit() or _ignore)(event))

    def _on_coordinator_event(self, event: Any) -> None:
        kind = event.get("type") if isinstance(event, dict) else getattr(event, "type", None)
        if kind == "coordinator_unavailable":
            reason = event.get("reason", "") if isinstance(event, dict) else event.reason
            self.emit(E.CoordinatorUnavailable(str(reason)))
        elif kind == "coordinator_restored":
            self.emit(E.CoordinatorRestored())

    # ------------------------------------------------------------------ 2. the brain
    def turn_ended(self, message: AssistantMessage, context_window: int, cls: Classification,
                   facts: TurnFacts | None, host: Callable[[B.Action], Any]) -> None:
        """Hand the turn's end to the brain and carry out its actions (:meth:`perform`)."""
        self.perform(self.brain.turn_ended(message, context_window, classification=cls,
                                           facts=facts), host)

    # ------------------------------------------------------------------ 3. the actions
    def perform(self, actions: list[B.Action], host: Callable[[B.Action], Any],
                wanted: tuple[type, ...] | None = None) -> None:
        """Carry out ``actions`` in order: ``Emit`` → ``emit``; a coordinator write → a
        background task (none without a coordinator in use); every other action →
        ``host(action)`` at its place in the order (only the types in ``wanted``, when given:
        a host with no use for the others)."""
        emit = self.emit
        for action in actions:
            kind = type(action)
            if kind is _EMIT:
                emit(action.event)
            elif kind in _WRITES:
                if self.use_coordinator:
                    self._write(action)
            elif wanted is None or kind in wanted:
                host(action)

    def _write(self, action: B.Action) -> None:
        """The coordinator's write a decision asked for, off the critical path (§8b.2)."""
        settings = self.brain.settings
        coordinator = self._coordinator
        if coordinator is None:
            if not (settings.honors_hints or settings.budget is not None):
                return
            coordinator = self.coordinator()
        kind = type(action)
        v3 = _coord_v3(coordinator)
        if kind is B.RecordCooldown:
            if v3:  # v3: a duration, counted on the coordinator's clock
                coro = coordinator.learn_cooldown(self.key(), action.wait_ms)
            elif action.until_ms is None:
                return
            else:
                coro = _coord_learn_cooldown(coordinator, self.key(), action.wait_ms, action.until_ms)
        elif settings.budget is None:
            return
        elif kind is B.ReturnRetryToken:
            coro = _coord_return_token(self._token_from or coordinator, self.key(), settings.budget)
        elif v3:
            coro = _coord_record(coordinator, self.key(), success=True, throttled=False,
                                 budget=settings.budget, pacing=None)
        else:
            coro = _coord_credit(coordinator, self.key(), settings.budget)
        self._spawn(coro)

    async def aclose(self) -> None:
        """Finish the coordinator's writes in flight and stop forwarding its events."""
        if self._writes:
            await asyncio.gather(*tuple(self._writes), return_exceptions=True)
        self.close()

    def close(self) -> None:
        """Stop forwarding the coordinator's events (writes in flight go on)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None


def _ignore(event: Any) -> None:
    """A coordinator event for a kernel that is gone."""


async def _bounded_write(coro: Awaitable[Any]) -> None:
    try:
        await asyncio.wait_for(coro, WRITE_TIMEOUT_S)
    except Exception as exc:  # a lost write only costs sharing, never the host
        log.warning("coordinator write failed: %s", describe_error(exc))


def _give_back_late(coordinator: Any, key: Any, budget: Any, task: asyncio.Future) -> None:
    """A read answered after the host stopped waiting: a budget token it took is given back."""
    if budget is None or task.cancelled() or task.exception() is not None:
        return
    _, allowed = task.result()
    if allowed is True:
        _return_token_in_background(coordinator, key, budget)


def _return_token_in_background(coordinator: Any, key: Any, budget: Any) -> None:
    """Give a budget token back through a bounded background write, kept alive until it ends."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # pragma: no cover - a done callback runs on the loop
        return
    write = loop.create_task(_bounded_write(_coord_return_token(coordinator, key, budget)))
    _IN_FLIGHT.add(write)
    write.add_done_callback(_IN_FLIGHT.discard)


_IN_FLIGHT: set[asyncio.Task] = set()  # the coordinator's writes in flight (kept alive)


def _give_back_late_admission(coordinator: Any, key: Any, budget: Any, task: asyncio.Future) -> None:
    """An ``admit`` answered after the host stopped waiting: a token it took is given back."""
    if budget is None or task.cancelled() or task.exception() is not None:
        return
    if getattr(task.result(), "token_taken", False):
        _return_token_in_background(coordinator, key, budget)


# ---------------------------------------------------------------------------- the loop's coordinator

_LOOP_COORDINATORS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Any, Any]]" = (
    weakref.WeakKeyDictionary())


def loop_coordinator(clock: Any = None) -> Any:
    """The in-process coordinator shared by every host on the running event loop that reads the
    same clock: the loop's own (``LoopClock`` or None) or one given clock (a
    :class:`~fsm.testing.FakeClock`). The coordinator is told that clock."""
    loop = asyncio.get_running_loop()
    shared = None if clock is None or type(clock) is LoopClock else clock
    per_clock = _LOOP_COORDINATORS.get(loop)
    if per_clock is None:
        per_clock = _LOOP_COORDINATORS[loop] = {}
    coordinator = per_clock.get(shared)
    if coordinator is None:
        coordinator = per_clock[shared] = _coord_in_process(shared)
    return coordinator


# ---------------------------------------------------------------------------- the adapter
# Every call into a coordinator is made here, in the coordinator protocol of docs/fleet.md.
# Protocol v3 (a coordinator with ``admit``): ``admit(key, retry=, budget=, pacing=,
# floor_slot_due=, max_wait_ms=) -> Admission`` (cooldown, budget answer, token taken, pacing
# slot, budget floor slot in one atomic step; ``pacing_booked`` False: no slot within the pacer's
# horizon, nothing reserved), ``record_outcome(key, success=, throttled=,
# budget=, pacing=)``, ``learn_cooldown(key, duration_ms)``, ``return_retry_token(key, budget)``.
# Before v3 (still spoken to a coordinator without ``admit``): ``before_decision(key, now_ms,
# budget) -> (cooldown_left_ms, allowed | None)``, ``learn_cooldown(key, until_ms, now_ms)``,
# ``return_retry_token(key, budget)``, ``credit_success(key, budget)``. A change of protocol
# is a change of this section only.

def _coord_v3(coordinator: Any) -> bool:
    """The coordinator speaks protocol v3 (it has ``admit``)."""
    return callable(getattr(coordinator, "admit", None))


def _coord_admit_args(settings: Any, *, retry: bool, floor_slot_due: bool, pacing: bool,
                      max_wait: bool) -> dict[str, Any]:
    paced = settings.pacing if pacing and settings.pacing is not None and settings.pacing.enabled else None
    return {"retry": retry, "budget": settings.budget if retry else None, "pacing": paced,
            "floor_slot_due": floor_slot_due,
            "max_wait_ms": settings.max_hint_wait_ms if max_wait and settings.honors_hints else None}


def _coord_admission(answer: Any) -> tuple[int, bool | None, bool, int, int, bool, bool]:
    # ``pacing_booked`` (False: no slot within the pacer's horizon, nothing reserved) and
    # ``budget_slot_booked`` (False: no floor slot reserved, the wait is a re-check) are read
    # with a default so that a coordinator that does not tell them counts as booked
    return (int(answer.cooldown_ms or 0), answer.budget, bool(answer.token_taken),
            int(answer.pacing_ms or 0), int(answer.budget_wait_ms or 0),
            bool(getattr(answer, "pacing_booked", True)),
            bool(getattr(answer, "budget_slot_booked", True)))


def _coord_record(coordinator: Any, key: Any, *, success: bool, throttled: bool, budget: Any,
                  pacing: Any) -> Awaitable[Any]:
    return coordinator.record_outcome(key, success=success, throttled=throttled, budget=budget,
                                      pacing=pacing)

def _coord_in_process(clock: Any) -> Any:
    """A new in-process coordinator reading ``clock`` (None = the machine's monotonic clock)."""
    from fsm.fleet import InProcessCoordinator
    if clock is None or getattr(clock, "time_ms", None) is None:
        return InProcessCoordinator()
    return InProcessCoordinator(clock=clock.time_ms)


async def _coord_read(coordinator: Any, key: Any, now_ms: int,
                      budget: Any) -> tuple[int, bool | None]:
    left, allowed = await coordinator.before_decision(key, now_ms, budget)
    return int(left or 0), allowed


def _coord_at_once(coordinator: Any) -> Any:
    """``coordinator`` itself when it answers without I/O (the in-process one), else None."""
    from fsm.fleet import InProcessCoordinator
    return coordinator if type(coordinator) is InProcessCoordinator else None


def _coord_local(coordinator: Any, default: Callable[[], Any]) -> Any:
    """The coordinator that answers when ``coordinator`` is late: its own local fallback when
    it keeps one (the guarded coordinator's mirror of the fleet), else ``default()``."""
    fallback = getattr(coordinator, "fallback", None)
    if fallback is not None and hasattr(fallback, "before_decision_sync"):
        return fallback
    local = default()
    return local if hasattr(local, "before_decision_sync") else None


def _coord_read_local(local: Any, key: Any, now_ms: int, budget: Any) -> tuple[int, bool | None]:
    left, allowed = local.before_decision_sync(key, now_ms, budget)
    return int(left or 0), allowed


def _coord_learn_cooldown(coordinator: Any, key: Any, wait_ms: int, until_ms: int) -> Awaitable[Any]:
    return coordinator.learn_cooldown(key, until_ms, until_ms - wait_ms)


def _coord_return_token(coordinator: Any, key: Any, budget: Any) -> Awaitable[Any]:
    return coordinator.return_retry_token(key, budget)


def _coord_credit(coordinator: Any, key: Any, budget: Any) -> Awaitable[Any]:
    return coordinator.credit_success(key, budget)


KNOWN_HOSTS: dict[str, str] = {
    "api.openai.com": "openai",
    "api.anthropic.com": "anthropic",
    "generativelanguage.googleapis.com": "google",
    "openrouter.ai": "openrouter",
    "api.mistral.ai": "mistral",
    "api.groq.com": "groq",
    "api.deepseek.com": "deepseek",
    "api.together.xyz": "together",
    "api.fireworks.ai": "fireworks",
    "api.x.ai": "xai",
    "api.cohere.com": "cohere",
    "api.moonshot.ai": "moonshot",
    "api.minimax.io": "minimax",
    "api.siliconflow.cn": "siliconflow",
    "router.huggingface.co": "huggingface",
}
"""Host names of well-known providers → their provider id (``retry.providers`` keys, the
coordinator key)."""


def provider_id(name: str | None, host: str | None = None, port: int | None = None) -> str:
    """The one provider id of a request (docs/policy.md §13, per-provider policy): an explicit
    ``name`` first; then :data:`KNOWN_HOSTS` for ``host``; else ``host`` (with ``:port`` when
    one is given); ``"default"`` when nothing is known."""
    if name:
        return name
    if not host:
        return "default"
    host = host.lower().rstrip(".")
    known = KNOWN_HOSTS.get(host)
    if known is not None:
        return known
    return f"{host}:{port}" if port else host
