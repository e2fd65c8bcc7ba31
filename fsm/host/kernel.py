"""The host kernel: gather the facts, call the brain, carry out its actions — written once.

Every host of the retry brain (:class:`~fsm.host.session.AgentSession`, the runner of
:mod:`fsm.host.runner`, the integrations) does the same three things around a
:class:`~fsm.core.brain.RetryBrain` (``docs/architecture.md``, "The loop"):

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
import threading
import time
import weakref
from datetime import tzinfo
from typing import Any, Awaitable, Callable, Generator, TypeVar

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

_R = TypeVar("_R")

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
                 "scrub", "use_coordinator", "random", "paces_at_send", "_unsubscribe", "tell",
                 "_writes", "_token_from", "_token_id", "_floor_booked", "__weakref__")

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
        self._token_id: int | None = None  # its id (Admission.token), when the coordinator tells one
        self.tell: Callable[[Tell], None] = self._spawn_tell  # where coordinator writes go
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
        coordinator is asked); False on the common path (a success, a fatal error). An
        ``unknown`` failure the brain retries once (``retry.unknown: "once"``) is asked for as a
        retry: its retry takes a budget token like any other."""
        if cls.kind != "retryable" and not self.brain.retries_unknown(cls):
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
        return self.use_coordinator and self.brain.settings.needs_coordinator

    def quick_facts(self, cls: Classification, *, now_ms: int | None = None,
                    output_streamed: bool = False) -> TurnFacts | None:
        """The facts for ``cls`` when they need no await (:meth:`local_facts`), or None when the
        world must be asked (:meth:`gather`): one call on a host's common path."""
        if self.needs_world(cls):
            return None
        return TurnFacts(now_ms=self.now_ms() if now_ms is None else now_ms,
                         output_streamed=output_streamed, zone=self.zone)

    def local_facts(self, *, now_ms: int | None = None, output_streamed: bool = False) -> TurnFacts:
        """The facts that need no await: the time, whether output was streamed, the zone."""
        return TurnFacts(now_ms=self.now_ms() if now_ms is None else now_ms,
                         output_streamed=output_streamed, zone=self.zone)

    # ------------------------------------------------------------------ 1. the facts, sans-IO
    # Every step that asks the world is a generator of commands (:class:`Admit`, :class:`Tell`,
    # :class:`AskStore`) answered by a driver: :func:`drive_async` on asyncio (bounded by
    # COORDINATOR_TIMEOUT_S), :func:`answer_sync` off it (the coordinator's background loop, or
    # at once for a coordinator that does no I/O). The async methods below are those steps
    # driven on asyncio, for the agent session.
    def gather_steps(self, cls: Classification, *, now_ms: int | None = None,
                     output_streamed: bool = False, provider: str = "",
                     session_id: str = "") -> Steps[TurnFacts]:
        """The facts the brain needs for a turn that ended as ``cls`` (docs/policy.md §8b.2):
        the time, the credential store's answer on a usage limit (``provider`` and
        ``session_id`` name the store's entry), the pacer told ``throttled`` when the failure
        is a capacity signal, the coordinator's cooldown and budget. Never fails for a slow or
        failing store or coordinator: it decides on local state, says so in a log line (and,
        for the store, in the ``auto_retry_start`` note)."""
        now = self.now_ms() if now_ms is None else now_ms
        self._token_from = None
        if not self.needs_world(cls):
            return TurnFacts(now_ms=now, output_streamed=output_streamed, zone=self.zone)
        switched, count, note = False, 1, None
        if cls.usage_limit and self.credentials is not None:
            try:
                switched = bool((yield AskStore("mark_usage_limit_reached",
                                                (provider, session_id, cls.retry_hint_ms),
                                                STORE_TIMEOUT_S)))
                counter = getattr(self.credentials, "credential_count", None)
                if counter is not None:
                    count = max(1, int(counter(provider)))
            except Exception as exc:  # a broken or slow store: the normal backoff, said so
                note = self.scrub(f"credential store failed: {describe_error(exc)}; normal backoff")
                log.warning("%s", note)
        facts = TurnFacts(now_ms=now, output_streamed=output_streamed, credential_switched=switched,
                          credential_count=count, note=note, zone=self.zone)
        if self.uses_coordinator():
            yield from self._throttle_steps(cls, output_streamed)
            facts = yield from self._admission_steps(facts, now, floor_slot_due=False)
        return facts

    def _throttle_steps(self, cls: Classification, output_streamed: bool) -> Steps[None]:
        """Tell the pacer a retryable failure (docs/fleet.md "Pacing"): a capacity signal
        (:attr:`~fsm.core.classify.Classification.capacity_signal`: 429, 529, 503, a refused
        connection) with nothing streamed is ``throttled``; any other retryable failure (a
        random 500, a stall, a timeout, output streamed) is neither a success nor a throttle.
        The write lands before the retry's slot is taken (bounded by
        :data:`COORDINATOR_TIMEOUT_S`). A late or failing write only costs sharing."""
        pacing = self.brain.settings.pacing
        if pacing is None or not pacing.enabled:
            return
        coordinator = self.coordinator()
        if not _coord_v3(coordinator):
            return
        throttled = cls.capacity_signal and not output_streamed
        # only a throttle changes the retry's slot: another answer is told, not waited for
        yield Tell(coordinator, "record_outcome", self.key(), {
            "success": False, "throttled": throttled, "budget": None, "pacing": pacing},
            settle=throttled)

    def recheck_steps(self, *, now_ms: int | None = None) -> Steps[TurnFacts]:
        """The facts for a retry that waited for the retry budget's floor slot (budget in
        wait mode, docs/policy.md §13.7): the coordinator is asked again with the slot due.
        Never fails for a slow or failing coordinator (local state, as :meth:`gather_steps`)."""
        now = self.now_ms() if now_ms is None else now_ms
        self._token_from = None
        facts = TurnFacts(now_ms=now, zone=self.zone)
        if not self.uses_coordinator():
            return facts
        # only a floor slot reserved for this retry is due now; an answer that reserved none
        # (beyond the floor's horizon, or no floor) is asked afresh (docs/fleet.md "Budget in
        # wait mode")
        return (yield from self._admission_steps(facts, now, floor_slot_due=self._floor_booked))

    def _admission_steps(self, facts: TurnFacts, now: int | None, *,
                         floor_slot_due: bool) -> Steps[TurnFacts]:
        """``facts`` with the coordinator's answer for a retry: the cooldown (hints honoured),
        the budget's answer, the token taken and the budget's floor slot, in one atomic step
        (cooldown and budget together). A host that paces at send (:attr:`paces_at_send`)
        reserves no pacing slot here (``pacing_ms`` 0): the retry takes its slot at the gate
        after its backoff (:meth:`gate_steps`). Otherwise the slot is reserved here."""
        settings = self.brain.settings
        a = yield from self._admit_steps(retry=True, floor_slot_due=floor_slot_due,
                                         pacing=not self.paces_at_send, max_wait=True)
        pacing_ms = a.pacing_ms
        if not a.pacing_booked:
            # a host that reserves the slot here and the pacer had none within its horizon:
            # nothing was taken (the budget was not even asked). The budget and the cooldown are
            # asked again without pacing — so the retry is still bounded by the budget — and
            # the retry waits at least the pacer's re-check (jittered)
            a = yield from self._admit_steps(retry=True, floor_slot_due=floor_slot_due,
                                             pacing=False, max_wait=True)
            pacing = settings.pacing
            pacing_ms = max(1, round((pacing.recheck_ms if pacing is not None else 1000)
                                     * (0.5 + self.random())))
        budget = settings.budget
        waits = (a.budget is False and budget is not None
                 and getattr(budget, "mode", "refuse") == "wait")
        floor_booked = bool(getattr(a, "budget_slot_booked", True))
        self._floor_booked = waits and floor_booked
        budget_wait = int(a.budget_wait_ms or 0)
        if waits and not floor_booked:  # a re-check, not a slot: jittered ×U(0.5, 1.5)
            budget_wait = max(1, round(budget_wait * (0.5 + self.random())))
        return dataclasses.replace(
            facts, cooldown_ms=int(a.cooldown_ms or 0) if settings.honors_hints else 0,
            budget_allows=a.budget is not False, budget_taken=bool(a.token_taken),
            budget_slot_ms=budget_wait if waits else None, pacing_ms=int(pacing_ms or 0))

    def _admit_steps(self, *, retry: bool, floor_slot_due: bool, pacing: bool,
                     max_wait: bool) -> Steps[Any]:
        """One coordinator admission (v3 ``admit``; a coordinator before v3 answers through
        ``before_decision``): the :class:`~fsm.fleet.Admission` read by name. The driver bounds
        it; late or failing → the local state; a token a late answer took is given back."""
        args = _coord_admit_args(self.brain.settings, retry=retry, floor_slot_due=floor_slot_due,
                                 pacing=pacing, max_wait=max_wait)
        answer: Admitted = yield Admit(self.coordinator(), self.key(), args, self.now_ms(),
                                       self._local_coordinator)
        self._token_from = answer.source
        if retry:  # the token's id (a guarded coordinator's): a give-back returns that one, once
            self._token_id = getattr(answer.admission, "token", None) if getattr(
                answer.admission, "token_taken", False) else None
        return answer.admission

    # ------------------------------------------------------------------ the gate
    def gates(self, *, first: bool = False) -> bool:
        """True when the request about to go passes the gate (:meth:`gate_steps`): a chain's
        ``first`` request under a profile that admits first requests (the resilient profile,
        docs/fleet.md "First requests"), and any request — first or retry — with pacing on,
        on a host that paces at send (:attr:`paces_at_send`). False under the seed profile
        without pacing: no gate call, no ``request_delayed``, no await."""
        if not self.uses_coordinator():
            return False
        settings = self.brain.settings
        paced = self.paces_at_send and settings.pacing is not None and settings.pacing.enabled
        if first:
            return settings.enabled and (settings.admits_first_requests or paced)
        return paced

    def pace_steps(self, *, first: bool = False, now_ms: int | None = None
                   ) -> Steps[tuple[int, int, bool]]:
        """Ask the gate once for the request about to go (docs/fleet.md "Pacing", "First
        requests"): one bounded coordinator ``admit`` (no budget token: a retry's was taken at
        its decision) that reads the key's cooldown and reserves the pacer's slot.

        Returns ``(cooldown_ms, delay_ms, booked)``:

        - ``cooldown_ms``: the shared cooldown left (0 when hints are ignored);
        - ``booked`` True: a slot is reserved (or there is nothing to reserve) and the request
          goes ``delay_ms`` from now, ``max(cooldown, pacing slot)``, 0 = at once;
        - ``booked`` False: the pacer had no slot within its horizon (``horizonMs``); nothing
          is reserved and the host asks again ``delay_ms`` from now: ``recheckMs`` jittered
          ×U(0.5, 1.5) with :attr:`random` (or the cooldown left, when longer).

        A ``first`` request whose cooldown is beyond ``maxHintWaitMs`` (hints honoured) gets
        ``(cooldown, cooldown, True)`` with nothing reserved: the host refuses it. A failing
        local state lets the request go at once (logged)."""
        if not self.uses_coordinator():
            return 0, 0, True
        settings = self.brain.settings
        pacing = settings.pacing if settings.pacing is not None and settings.pacing.enabled else None
        try:
            a = yield from self._admit_steps(retry=False, floor_slot_due=False,
                                             pacing=pacing is not None,
                                             max_wait=first and settings.admits_first_requests)
        except Exception as exc:  # the local state failed too: the request is not held up
            log.warning("pacing gate: coordinator failed: %s; sending now", describe_error(exc))
            return 0, 0, True
        cooldown, pacing_ms = int(a.cooldown_ms or 0), int(a.pacing_ms or 0)
        if not settings.honors_hints or (first and not settings.admits_first_requests):
            cooldown = 0  # under the seed profile a cooldown never touches a first request
        elif first and cooldown > settings.max_hint_wait_ms:
            return cooldown, cooldown, True  # nothing reserved: the request is refused
        if bool(getattr(a, "pacing_booked", True)) or pacing is None:
            return cooldown, max(cooldown, pacing_ms), True
        recheck = max(1, round(pacing.recheck_ms * (0.5 + self.random())))
        return cooldown, max(cooldown, recheck), False

    def gate_steps(self, *, first: bool = False,
                   deadline_ms: Callable[[], int | None] | None = None
                   ) -> Steps[tuple[int, int | None] | None]:
        """Pass the request about to go through the gate (:meth:`pace_steps`), waiting as long
        as it says: each wait is told in a ``request_delayed {attempt, delayMs, retryAt,
        delaySource}`` event, then yielded as a :class:`Wait` (the driver answers False when
        the host ended it early: the gate stops). Booked, the request goes once the delay has
        passed; not booked, the gate is asked again.

        ``deadline_ms()``: the time left (ms) before the chain's deadline, or None; a wait that
        would outlast it waits what is left and returns ``(-1, None)`` (the host ends the
        chain ``deadline``; None when the host ended that wait first). Returns None when the request may go (or the wait was ended), or
        ``(cooldown_ms, now_ms)`` when a ``first`` request must be refused (a cooldown beyond
        ``maxHintWaitMs``: the host calls the brain's ``request_refused``)."""
        settings = self.brain.settings
        while True:
            now = self.now_ms()
            cooldown, delay, booked = yield from self.pace_steps(first=first, now_ms=now)
            if (first and settings.honors_hints and settings.admits_first_requests
                    and cooldown > settings.max_hint_wait_ms):
                return cooldown, now
            if booked and delay <= 0:
                return None
            source = "cooldown" if cooldown >= delay else "pacing"
            left = deadline_ms() if deadline_ms is not None else None
            self.emit(E.RequestDelayed(delay, None if now is None else now + delay, source))
            if left is not None and left < delay:
                if not (yield Wait(left, "deadline")):
                    return None  # the host ended the wait first (an abort): it decides
                return -1, None
            if not (yield Wait(delay, source)) or booked:
                return None

    def record_outcome(self, cls: Classification, *, output_streamed: bool = False) -> None:
        """An answer came back: tell the coordinator's pacer, off the critical path
        (docs/fleet.md "Pacing"): ``success`` for a success (the rate may grow), ``throttled``
        for a capacity signal without progress (``Classification.capacity_signal``), neither for any other answer (a random 500, a fatal error, a
        context overflow, a failure after output was streamed: nothing learned). An aborted
        turn tells nothing. A retryable failure whose facts are gathered is told there
        (:meth:`gather_steps`). The budget's credit stays the brain's ``CreditRetryBudget``."""
        pacing = self.brain.settings.pacing
        if pacing is None or not pacing.enabled or not self.use_coordinator:
            return
        if cls.kind == "aborted" or (cls.kind == "retryable" and self.needs_world(cls)):
            return
        coordinator = self.coordinator()
        if not _coord_v3(coordinator):
            return
        self.tell(Tell(coordinator, "record_outcome", self.key(), {
            "success": cls.kind == "none", "throttled": cls.capacity_signal and not output_streamed,
            "budget": None, "pacing": pacing}))

    # ------------------------------------------------------------------ driven on asyncio
    async def gather(self, cls: Classification, *, now_ms: int | None = None,
                     output_streamed: bool = False, provider: str = "",
                     session_id: str = "") -> TurnFacts:
        """:meth:`gather_steps` driven on asyncio (the agent session)."""
        return await drive_async(self.gather_steps(cls, now_ms=now_ms,
                                                   output_streamed=output_streamed,
                                                   provider=provider, session_id=session_id),
                                 store=self)

    async def recheck_budget(self, *, now_ms: int | None = None) -> TurnFacts:
        """:meth:`recheck_steps` driven on asyncio."""
        return await drive_async(self.recheck_steps(now_ms=now_ms), store=self)

    async def pace(self, *, first: bool = False, now_ms: int | None = None) -> tuple[int, int, bool]:
        """:meth:`pace_steps` driven on asyncio."""
        return await drive_async(self.pace_steps(first=first, now_ms=now_ms), store=self)

    async def gate(self, wait: Callable[[int], Awaitable[bool]], *,
                   first: bool = False) -> tuple[int, int | None] | None:
        """:meth:`gate_steps` driven on asyncio, waiting with the host's cancellable
        ``wait(delay_ms) -> bool`` (False: ended early). Raises what ``wait`` raises."""
        async def on_wait(command: Wait) -> bool:
            return await wait(command.delay_ms)
        return await drive_async(self.gate_steps(first=first), wait=on_wait, store=self)

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
        """The coordinator's write a decision asked for, off the critical path (§8b.2): a
        :class:`Tell` handed to :attr:`tell` (a background task on asyncio; the one loop queues
        it for its driver)."""
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
                self.tell(Tell(coordinator, "learn_cooldown", self.key(), {}, (action.wait_ms,)))
            elif action.until_ms is not None:
                self.tell(Tell(coordinator, "learn_cooldown", self.key(), {},
                               (action.until_ms, action.until_ms - action.wait_ms)))
        elif settings.budget is None:
            return
        elif kind is B.ReturnRetryToken:
            self.give_back(self._token_from or coordinator)
        elif v3:
            self.tell(Tell(coordinator, "record_outcome", self.key(), {
                "success": True, "throttled": False, "budget": settings.budget, "pacing": None}))
        else:
            self.tell(Tell(coordinator, "credit_success", self.key(), {}, (settings.budget,)))

    def give_back(self, coordinator: Any = None) -> None:
        """Give the retry budget's token back (a retry that does not go after all), to the
        coordinator that gave it (``coordinator``; default the one of the last decision)."""
        budget = self.brain.settings.budget
        source = coordinator or self._token_from or self._coordinator
        if budget is not None and source is not None:
            token, self._token_id = self._token_id, None
            self.tell(Tell(source, "return_retry_token", self.key(),
                           {} if token is None else {"token": token}, (budget,)))

    def _spawn_tell(self, command: Tell) -> None:
        """The default :attr:`tell`: the write as a background task on the running loop,
        bounded by :data:`WRITE_TIMEOUT_S`, kept alive until it ends."""
        task = _spawn_write(_tell_coro(command))
        if self._writes is None:
            self._writes = set()
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

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


# ---------------------------------------------------------------------------- the commands
# What a step asks of its driver (sans-IO, docs/architecture.md "The loop"). A step is a
# generator: it yields a command and receives the driver's answer (``Steps[R]`` returns R).

Steps = Generator[Any, Any, _R]


@dataclasses.dataclass(frozen=True, slots=True)
class Send:
    """Send attempt ``attempt`` (0 = the first request) with ``model`` (None = the caller's);
    the driver answers an :class:`Attempt`. ``timeout_ms``: abort it after this long
    (``retry.attemptTimeoutMs``; answer ``Attempt(stopped="timeout")``); ``deadline_ms``: the
    chain's deadline is this far away (``retry.maxElapsedMs``; answer
    ``Attempt(stopped="deadline")`` when it is reached first). None = no bound."""
    attempt: int
    model: str | None = None
    timeout_ms: int | None = None
    deadline_ms: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Attempt:
    """How an attempt ended (the driver's answer to :class:`Send`): ``result`` (it returned),
    ``exc`` (it raised), ``message`` (a returned assistant message: judged by its stop
    reason), ``classification`` (a host that classified it already: the simulation),
    ``output_streamed`` (output reached the caller before it failed), ``stopped``
    (``"timeout"`` / ``"deadline"``: the driver aborted it at its bound), ``secrets``
    (credentials the failed request carried: scrubbed from what events and errors show)."""
    result: Any = None
    exc: BaseException | None = None
    message: AssistantMessage | None = None
    classification: Classification | None = None
    output_streamed: bool = False
    stopped: str | None = None
    secrets: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Wait:
    """Wait ``delay_ms`` (cancellable); the driver answers True (it elapsed) or False (the
    host ended it early). ``source``: ``"backoff"`` (the brain's), ``"budget"`` (a re-check of
    the budget in wait mode), ``"cooldown"`` / ``"pacing"`` (the gate), ``"deadline"`` (the
    time left before the chain's deadline)."""
    delay_ms: int
    source: str = "backoff"


@dataclasses.dataclass(frozen=True, slots=True)
class Admit:
    """Ask ``coordinator.admit(key, **args)`` (docs/fleet.md; a coordinator before v3 is asked
    ``before_decision``), bounded by the one rule (:data:`COORDINATOR_TIMEOUT_S`; late or
    failing = unknown → the local state from ``local()``; a token a late answer took is given
    back). ``now_ms``: the host's time (for a coordinator before v3). The driver answers an
    :class:`Admitted`."""
    coordinator: Any
    key: Any
    args: dict[str, Any]
    now_ms: int | None
    local: Callable[[], Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Admitted:
    """The answer to :class:`Admit`: the :class:`~fsm.fleet.Admission` (read by name) and the
    coordinator that gave it (a budget token goes back there)."""
    admission: Any
    source: Any


@dataclasses.dataclass(frozen=True, slots=True)
class Tell:
    """A coordinator write: ``coordinator.<op>(key, *args, **kwargs)`` (``record_outcome``,
    ``learn_cooldown``, ``return_retry_token``, ``credit_success``), bounded by
    :data:`WRITE_TIMEOUT_S`; ``settle`` True: the step waits for it (at most
    :data:`COORDINATOR_TIMEOUT_S`), else it goes in the background. Answered None."""
    coordinator: Any
    op: str
    key: Any
    kwargs: dict[str, Any]
    args: tuple[Any, ...] = ()
    settle: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class AskStore:
    """Ask the credential store ``name(*args)`` within ``timeout`` seconds (answered with its
    value; its failure is thrown into the step)."""
    name: str
    args: tuple[Any, ...]
    timeout: float


_NO_ADMISSION = None  # set below: Admission() once fsm.fleet is importable


async def drive_async(steps: Steps[_R], *, send: Callable[[Send], Awaitable[Attempt]] | None = None,
                      wait: Callable[[Wait], Awaitable[bool]] | None = None,
                      store: "HostKernel | None" = None) -> _R:
    """Run ``steps`` on asyncio: :class:`Send` → ``await send(command)``, :class:`Wait` →
    ``await wait(command)`` (default: ``asyncio.sleep``), coordinator commands bounded by the
    one rule (:func:`answer_async`), :class:`AskStore` → ``store.ask_store``. An exception a
    command raises (a cancellation) is thrown into the steps, which end the chain and let it
    go on. Returns what ``steps`` return; raises what they raise."""
    step: Callable[[Any], Any] = steps.send
    value: Any = None
    while True:
        try:
            command = step(value)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        try:
            kind = type(command)
            if kind is Wait:
                value = await (wait(command) if wait is not None else _sleep(command))
            elif kind is Send:
                assert send is not None, "these steps send no request"
                value = await send(command)
            elif kind is AskStore:
                assert store is not None, "these steps ask no credential store"
                value = await store.ask_store(command.name, *command.args, timeout=command.timeout)
            else:
                value = await answer_async(command)
            step = steps.send
        except BaseException as exc:  # noqa: BLE001 - thrown into the steps, which re-raise
            value, step = exc, steps.throw


async def _sleep(command: Wait) -> bool:
    await asyncio.sleep(command.delay_ms / 1000)
    return True


async def answer_async(command: Any) -> Any:
    """The answer to a coordinator command (:class:`Admit`, :class:`Tell`) on asyncio."""
    if type(command) is Tell:
        if command.settle:
            task = _spawn_write(_tell_coro(command))
            await asyncio.wait((task,), timeout=COORDINATOR_TIMEOUT_S)
        else:
            _spawn_write(_tell_coro(command))
        return None
    if type(command) is Admit:
        return await _admit_bounded(command)
    raise TypeError(f"not a coordinator command: {command!r}")


def answer_at_once(command: Any) -> Any:
    """The answer to a coordinator command from a coordinator that does no I/O
    (``answers_at_once``: the in-process one), called synchronously: no event loop needed
    (a sync host, the simulation on virtual time)."""
    if type(command) is Tell:
        try:
            _run_now(_tell_coro(command))
        except Exception as exc:  # a lost write only costs sharing, never the host
            log.warning("coordinator write failed: %s", describe_error(exc))
        return None
    return _run_now(_admit_bounded(command))


def answer_sync(command: Any) -> Any:
    """The answer to a coordinator command for a host without an event loop: at once for a
    coordinator that does no I/O, else on the process's background coordinator loop
    (:func:`coordinator_loop`), bounded as on asyncio."""
    if _coord_at_once(command.coordinator) is not None:
        return answer_at_once(command)
    future = asyncio.run_coroutine_threadsafe(answer_async(command), coordinator_loop())
    return future.result()


def _run_now(coro: Any) -> Any:
    """Run a coroutine that never suspends (an ``answers_at_once`` coordinator's) to its end."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("a coordinator that answers at once suspended")


_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def coordinator_loop() -> asyncio.AbstractEventLoop:
    """The process's background event loop on which synchronous hosts talk to a coordinator
    that does I/O (one daemon thread, started on first use)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="fsm-coordinator", daemon=True).start()
            _LOOP = loop
    return _LOOP


async def _admit_bounded(command: Admit) -> Admitted:
    """One admission bounded by :data:`COORDINATOR_TIMEOUT_S` (docs/policy.md §8b.2)."""
    coordinator, key, args = command.coordinator, command.key, command.args
    retry = bool(args.get("retry"))
    budget = args.get("budget") if retry else None
    if not _coord_v3(coordinator):
        if not retry:
            return Admitted(_admission(), coordinator)
        return await _read_bounded(command, budget)
    if _coord_at_once(coordinator) is not None or getattr(coordinator, "self_bounded", False):
        # no I/O, or a coordinator that bounds itself and answers locally when late (the
        # guarded one): an extra timeout would only turn its local answer into a default
        # under load (docs/fleet.md "How a session uses it")
        return Admitted(await coordinator.admit(key, **args), coordinator)
    task = asyncio.ensure_future(coordinator.admit(key, **args))
    if await _bounded(task, coordinator, key, budget):
        return Admitted(task.result(), coordinator)
    local = getattr(coordinator, "fallback", None)
    if local is None or not _coord_v3(local):
        local = command.local()
    return Admitted(await local.admit(key, **args), local)


async def _read_bounded(command: Admit, budget: Any) -> Admitted:
    """A coordinator before v3: ``before_decision`` bounded, read as an admission."""
    coordinator, key = command.coordinator, command.key
    when = command.now_ms if command.now_ms is not None else time.time_ns() // 1_000_000
    task = asyncio.ensure_future(_coord_read(coordinator, key, when, budget))
    if await _bounded(task, coordinator, key, budget):
        left, ok = task.result()
        return Admitted(_admission(left, ok), coordinator)
    local = _coord_local(coordinator, command.local)
    if local is None:  # pragma: no cover - the in-process coordinator always answers
        return Admitted(_admission(), coordinator)
    left, ok = _coord_read_local(local, key, when, budget)
    return Admitted(_admission(left, ok), local)


async def _bounded(task: asyncio.Future, coordinator: Any, key: Any, budget: Any) -> bool:
    """Wait for a coordinator read at most :data:`COORDINATOR_TIMEOUT_S`: True when it
    answered; else (late or failing: logged) False, and a token a late answer takes is given
    back, as it is when the host is cancelled while waiting."""
    try:
        done, _ = await asyncio.wait((task,), timeout=COORDINATOR_TIMEOUT_S)
    except BaseException:  # the host was cancelled while waiting: the late answer's token
        task.add_done_callback(functools.partial(_give_back_late, coordinator, key, budget))
        raise
    if done and not task.cancelled() and task.exception() is None:
        return True
    if done:
        exc = task.exception() if not task.cancelled() else asyncio.CancelledError()
        log.warning("coordinator failed: %s; deciding on local state", describe_error(exc))
    else:
        log.warning("coordinator did not answer within %g ms: deciding on local state",
                    COORDINATOR_TIMEOUT_S * 1000)
        task.add_done_callback(functools.partial(_give_back_late, coordinator, key, budget))
    return False


def _admission(cooldown_ms: int = 0, allowed: bool | None = None) -> Any:
    """An :class:`~fsm.fleet.Admission` for a coordinator before v3 (cooldown, budget)."""
    from fsm.fleet import Admission  # the fleet layer sits below the host; deferred for import order
    return Admission(cooldown_ms=cooldown_ms, budget=allowed, token_taken=allowed is not None)


async def _bounded_write(coro: Awaitable[Any]) -> None:
    try:
        await asyncio.wait_for(coro, WRITE_TIMEOUT_S)
    except Exception as exc:  # a lost write only costs sharing, never the host
        log.warning("coordinator write failed: %s", describe_error(exc))


def _spawn_write(coro: Awaitable[Any]) -> asyncio.Task:
    """A coordinator write as a bounded background task on the running loop, kept alive."""
    task = asyncio.get_running_loop().create_task(_bounded_write(coro))
    _IN_FLIGHT.add(task)  # kept alive after the host that asked for it is gone
    task.add_done_callback(_IN_FLIGHT.discard)
    return task


def _tell_coro(command: Tell) -> Awaitable[Any]:
    return getattr(command.coordinator, command.op)(command.key, *command.args, **command.kwargs)


def _give_back_late(coordinator: Any, key: Any, budget: Any, task: asyncio.Future) -> None:
    """An answer that came after the host stopped waiting (``admit`` or, before v3,
    ``before_decision``): a budget token it took is given back."""
    if budget is None or task.cancelled() or task.exception() is not None:
        return
    answer = task.result()
    taken = answer[1] is True if isinstance(answer, tuple) else bool(getattr(answer, "token_taken", False))
    if taken:
        _spawn_write(_coord_return_token(coordinator, key, budget))


_IN_FLIGHT: set[asyncio.Task] = set()  # the coordinator's writes in flight (kept alive)


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
    """``coordinator`` itself when it answers without I/O (its ``answers_at_once`` capability
    is True: the in-process one), else None."""
    return coordinator if getattr(coordinator, "answers_at_once", False) is True else None


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
