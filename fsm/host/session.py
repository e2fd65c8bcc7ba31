"""AgentSession: the asyncio shell that embeds the retry brain (docs/policy.md §3–5, §8).

The session runs turns through a provider and drives the one retry loop of
:mod:`fsm.host.loop` (:class:`~fsm.host.loop.RetryLoop`, the same steps the runner, every
integration and the simulation drive) once per prompt: the loop passes each request through the
gate, gathers the facts the brain needs (the session's clock, the credential store's answer, the
shared coordinator's cooldown and budget — each bounded), hands the turn's end to the session's
:class:`~fsm.core.brain.RetryBrain`, carries out its actions (events, the coordinator's writes,
the budget token's give-back), waits the backoff and the budget's re-check, stops an attempt at
the chain's deadline and switches to a fallback model; the session runs each attempt as a turn
and carries out the actions of its turn (its end events, the context, the compaction check), in
the brain's order.
Until the brain has decided, ``prompt()`` cannot return, no listener hears of the turn's end
and ``abort()`` still aborts the turn (§8b.2). Time, cancellation and I/O all happen here;
decisions all happen in the brain.

Events are :mod:`fsm.core.events` objects (read-only mappings over their JSON shape). They go to
``subscribe()`` listeners synchronously, in order, and to extensions (``on(event_type,
handler)``; ``"*"`` for every type), whose handlers are awaited in order on a separate worker
so a slow or failing extension never holds up the retry chain.

Event types, in the order of a turn: ``agent_start``, ``turn_start``, ``message_start`` /
``message_end`` of each user message, ``message_start`` of the assistant message,
``message_update`` (``text_start`` / ``text_delta`` / ``text_end``), ``message_end``,
``turn_end``, ``agent_end``; and ``auto_retry_start`` / ``auto_retry_end`` (§4) where the brain
puts them, ``queue_update``, ``extension_error``, ``coordinator_unavailable`` /
``coordinator_restored``.

The conversation: :attr:`AgentSession.messages` is the runtime context (what the next request
sends; failed messages that a retry replaces are dropped from it); the session log
(:class:`~fsm.host.session_log.SessionLog`) keeps every message, failed ones included.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections import deque
from typing import Any, Awaitable, Callable, Iterable

from fsm.core import brain as B
from fsm.core import events as E
from fsm.core.brain import RetryBrain, seconds_text
from fsm.core.messages import AssistantMessage, UserMessage
from fsm.core.protocols import CredentialStore, Provider
from fsm.core.settings import RetrySettings
from fsm.core.text import StreamJoiner, clean_text, safe_error_text
from fsm.host.clock import Clock, LoopClock
from fsm.host.errors import ContextOverflowError, RetryChainError
from fsm.host.kernel import (COORDINATOR_TIMEOUT_S, KEY_TIMEOUT_S, STORE_TIMEOUT_S, AskStore,
                             Attempt, Send, Steps, Wait, ZoneResolver, answer_async, default_zone)
from fsm.host.kernel import describe_error as _describe
from fsm.host.loop import ABORTED_TEXT, RetryLoop, next_chain_id
from fsm.host.session_log import SessionLog

__all__ = ["AgentSession", "SessionBusyError", "ContinueRejected", "TurnOutcome", "Listener",
           "Extension", "CompactionHook", "STORE_TIMEOUT_S", "ABORTED_TEXT"]

log = logging.getLogger("fsm.host.session")


@dataclasses.dataclass(frozen=True, slots=True)
class TurnOutcome:
    """What :meth:`fsm.AgentSession.prompt` returns: the outcome of the turn it ran, after any retry
    chain the turn started has ended (docs/embedding.md, "The agent session").

    - ``message``: the turn's final :class:`fsm.AssistantMessage` (the successful retry's
      answer, or the last failed one); None when no answer came (a first request refused
      without sending).
    - ``success``: the chain's ``success`` when a chain ended (``auto_retry_end``), else
      whether the answer's stop reason is neither ``error`` nor ``aborted``.
    - ``end_reason``: the chain's ``endReason`` (``fsm.core.events.END_REASONS``; a refusal at
      rest too, ``attempt`` 0); None when no chain ended (a success at once, a fatal error,
      auto-retry off).
    - ``attempts``: the retried turns the chain ran (0: no retry went out)."""

    message: AssistantMessage | None
    success: bool
    end_reason: str | None
    attempts: int

Listener = Callable[[E.Event], Any]
Extension = Callable[[E.Event], Awaitable[Any] | Any]
CompactionHook = Callable[["AgentSession", AssistantMessage, str], Awaitable[Any]]

STREAMING_BEHAVIORS = ("steer", "follow_up", "followUp")


class SessionBusyError(RuntimeError):
    """``prompt()`` while a turn runs or a retry chain is active, without a queue behaviour."""


class ContinueRejected(RuntimeError):
    """The turn cannot be continued (the runtime context does not end with a user message)."""


class AgentSession:
    """One agent session with automatic retry.

    Args:
        provider: a :class:`fsm.core.protocols.Provider` (e.g.
            :class:`fsm.providers.openai_chat.OpenAIChatProvider`).
        settings: :class:`~fsm.core.settings.RetrySettings` (defaults of docs/policy.md §1).
        context_window: the model's context window in tokens (0 = unknown), for the silent
            overflow rule.
        session_log: a :class:`~fsm.host.session_log.SessionLog`, or None for no persistence.
        credentials: a :class:`fsm.core.protocols.CredentialStore` for the usage-limit path.
        coordinator: the shared coordinator of docs/policy.md §9 (cooldowns, retry budget),
            or None for the in-process one shared on the event loop; reached before a
            decision within :data:`fsm.host.kernel.COORDINATOR_TIMEOUT_S`, never inside one.
        compaction_hook: ``async hook(session, message, kind)`` consulted when retry does not
            take a turn (§3 "Boundary with compaction"); None = the error stands.
        clock: where the backoff timer lives and the time is read
            (:class:`~fsm.host.clock.FakeClock` in tests); messages are stamped with it and
            the in-process coordinator reads it.
        random: [0, 1) source for jitter.
        zone: the time-zone resolver for reset times named in a zone
            (:func:`fsm.host.kernel.default_zone`; None = named zones are unknown).
    """

    def __init__(self, provider: Provider, *, settings: RetrySettings | None = None,
                 context_window: int = 0, session_log: SessionLog | None = None,
                 credentials: CredentialStore | None = None, coordinator: Any = None,
                 compaction_hook: CompactionHook | None = None, clock: Clock | None = None,
                 session_id: str | None = None, random: Callable[[], float] | None = None,
                 zone: ZoneResolver | None = default_zone) -> None:
        self.provider = provider
        self.session_id = session_id or uuid.uuid4().hex
        self.context_window = context_window
        self.session_log = session_log
        self.compaction_hook = compaction_hook
        self.clock: Clock = clock or LoopClock()
        # chain ids are the process's (fsm.host.loop.next_chain_id), as every host's
        self.brain = (RetryBrain(settings, chain_ids=next_chain_id) if random is None
                      else RetryBrain(settings, random=random, chain_ids=next_chain_id))
        # docs/policy.md §13: the settings as given (providers resolved per chain), the live
        # set_auto_retry override, the primary model and the fallback in use
        self._given_settings = self.brain.settings
        self._live_enabled: bool | None = None
        self._primary_model: str = getattr(provider, "model", "") or ""
        self._model_in_use: str | None = None  # a fallback model's entry, None = the primary
        self._fallback_until_ms: int | None = None  # the primary's fallback mark (local)
        self._watch: list[Any] = []  # the attempt timeout's timer
        self._stall_timer: Any = None  # the first-token or the idle timer
        self._timed_out: str | None = None  # why the watchdog stopped the attempt
        self._deadline_abort: str | None = None  # the chain's deadline stopped this attempt
        self._deadline_hit = False  # the chain's deadline passed during this attempt
        self._pending_end: tuple[AssistantMessage, list[dict[str, Any]]] | None = None
        self._turn_message: AssistantMessage | None = None  # the turn the brain is deciding
        self._turn_run: list[dict[str, Any]] = []  # its run (agent_end's messages)
        self._compaction: B.CheckCompaction | None = None
        self._chain_new: list[UserMessage] | None = None  # the new turn's user messages
        self._cancelled_in_steps = False  # a cancellation already ended the chain (the loop)
        self._mark_writes: set[asyncio.Task] = set()  # fallback marks being written
        self.messages: list[UserMessage | AssistantMessage] = []
        """The runtime context: what the next request sends (failed messages a retry replaces
        are dropped from it; the session log keeps them)."""
        self._listeners: list[Listener] = []
        self._extensions: dict[str, list[Extension]] = {}
        self._ext_queue: deque[tuple[Extension, E.Event]] = deque()
        self._ext_task: asyncio.Task | None = None
        self._queue: deque[tuple[UserMessage, str]] = deque()
        self._backoff_wait: asyncio.Future | None = None  # the loop's wait for the backoff
        self._backoff_timer: Any = None  # its timer
        self._stream_task: asyncio.Task | None = None
        self._turn_running = False
        self._abort_turn = False
        self._prompt_owner: object | None = None  # the prompt() call that owns the session
        self._last_turn_aborted = False
        # the turn prompt() reports (TurnOutcome): its last answer, the chain's end, its retries
        self._outcome_message: AssistantMessage | None = None
        self._outcome_end: E.AutoRetryEnd | None = None
        self._outcome_retries = 0
        self._gate_wait: asyncio.Future | None = None  # a request's wait at the gate (pacing)
        self._skip_gate = False  # retry_now(): the next retry request bypasses the gate
        self._turn_done = asyncio.Event()
        self._turn_done.set()
        self._partial: dict[str, Any] | None = None  # the assistant message being streamed
        self._streamed = False
        self._started = 0  # when the answer being streamed started (the session clock's ms)
        self._api_key: str | None = None
        configured = [k for k in (getattr(provider, "api_key", None), getattr(provider, "_api_key", None))
                      if isinstance(k, str) and k]
        self._configured_key: str | None = configured[0] if configured else None
        self._secrets: set[str] = set(configured)
        self._joiner = StreamJoiner()
        # the one loop (fsm.host.loop), driven per prompt: the gate, the facts, the decision,
        # the backoff, the budget's re-check, the deadline, the fallback switch, the token
        self._kernel = RetryLoop(self.brain.settings, brain=self.brain, emit=self._emit,
                                 clock=self.clock, coordinator=coordinator,
                                 credentials=credentials, key=self._coord_key, zone=zone,
                                 scrub=self._safe, context_window=context_window,
                                 store_entry=(getattr(provider, "name", None), self.session_id),
                                 on_action=self._host_action, review=self._review,
                                 gate_bypass=self._gate_bypassed,
                                 aborted_message=self._aborted,
                                 **({} if random is None else {"random": random}))

    @property
    def coordinator(self) -> Any:
        """The coordinator given, or the in-process one once a decision needed it (else None)."""
        return self._kernel.configured_coordinator

    @property
    def credentials(self) -> CredentialStore | None:
        return self._kernel.credentials

    # ------------------------------------------------------------------ state
    @property
    def auto_retry_enabled(self) -> bool:
        return self.brain.settings.enabled

    def set_auto_retry_enabled(self, enabled: bool) -> None:
        """Switch auto-retry; a pending backoff still runs (use ``abort_retry`` to cancel it).

        Raises ``TypeError`` unless ``enabled`` is a bool."""
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be true or false, got {enabled!r}")
        self._live_enabled = enabled  # overrides every settings source (docs/policy.md §13.4)
        self.brain.set_enabled(enabled)

    @property
    def settings(self) -> RetrySettings:
        return self.brain.settings

    @property
    def is_retrying(self) -> bool:
        return self.brain.is_retrying

    @property
    def retry_attempt(self) -> int:
        return self.brain.attempt

    @property
    def is_streaming(self) -> bool:
        return self._turn_running

    @property
    def is_busy(self) -> bool:
        """A prompt is being handled: a turn runs, a chain is active, or follow-ups drain."""
        return self._prompt_owner is not None or self._turn_running or self.brain.is_retrying

    @property
    def queued_messages(self) -> list[str]:
        """Texts of the queued steer / follow-up messages, oldest first."""
        return [m.text for m, _ in self._queue]

    def state(self) -> dict[str, Any]:
        """The session's state as JSON data (camelCase keys; the RPC ``get_state`` adds more)."""
        return {
            "sessionId": self.session_id,
            "model": getattr(self.provider, "model", ""),
            "primaryModel": self._primary_model,
            "fallbackModel": self._model_in_use,
            "isStreaming": self.is_streaming,
            "isRetrying": self.is_retrying,
            "retryAttempt": self.retry_attempt,
            "autoRetryEnabled": self.auto_retry_enabled,
            "autoCompactionEnabled": self.compaction_hook is not None,
            "isCompacting": False,
            "messageCount": len(self.messages),
            "queuedMessageCount": len(self._queue),
            "retryState": self.brain.state,
            "retrySettings": self.settings.to_json(),
        }

    # ------------------------------------------------------------------ events
    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(event)`` for every event; returns a function that unsubscribes."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)
        return unsubscribe

    def on(self, event_type: str, handler: Extension) -> None:
        """Register an extension handler for ``event_type`` (``"*"`` for all); awaited in order."""
        self._extensions.setdefault(event_type, []).append(handler)

    def _emit(self, event: E.Event) -> None:
        if isinstance(event, E.AutoRetryEnd):
            self._outcome_end = event
        for listener in tuple(self._listeners):
            try:
                listener(event)
            except Exception:  # a broken listener must not break the chain
                log.exception("listener failed on %s", event.type)
        if not self._extensions:
            return
        handlers = self._extensions.get(event.type, []) + self._extensions.get("*", [])
        if handlers:
            self._ext_queue.extend((h, event) for h in handlers)
            if self._ext_task is None or self._ext_task.done():
                self._ext_task = asyncio.get_running_loop().create_task(self._run_extensions())

    async def _run_extensions(self) -> None:
        while self._ext_queue:
            handler, event = self._ext_queue.popleft()
            try:
                result = handler(event)
                if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                    await result
            except Exception as exc:
                log.warning("extension %r failed on %s: %s", handler, event.type, exc)
                if event.type != "extension_error":
                    self._emit(E.ExtensionError(event.type, f"{type(exc).__name__}: {exc}"))

    async def drain_extensions(self) -> None:
        """Wait until every queued extension handler has run."""
        while self._ext_task is not None and not self._ext_task.done():
            await asyncio.shield(self._ext_task)

    def _queue_event(self) -> E.QueueUpdate:
        return E.QueueUpdate(tuple(self.queued_messages),
                             tuple(m.text for m, b in self._queue if b == "steer"),
                             tuple(m.text for m, b in self._queue if b != "steer"))

    # ------------------------------------------------------------------ controls
    async def prompt(self, text: str, *,
                     streaming_behavior: str | None = None) -> TurnOutcome | None:
        """Send a user message and run the turn; returns when any retry chain it started ends,
        with the turn's :class:`fsm.host.session.TurnOutcome` (of the last turn when queued
        messages went out in turns of their own after it); None when the message was only
        queued.

        While the session is busy, ``streaming_behavior`` ``"steer"`` or ``"follow_up"``
        queues the message (delivered with the next continue or turn, never shortening a
        backoff; after a cancelled chain or an aborted turn it waits for the next prompt) and
        returns at once; without it raises :class:`SessionBusyError`.
        Raises ``TypeError`` / ``ValueError`` for a non-string text, text that is not valid
        Unicode (a lone surrogate) or an unknown behaviour; nothing is applied then.
        Cancelling the task that awaits ``prompt()`` ends its chain (``cancelled``).
        """
        if not isinstance(text, str):
            raise TypeError(f"prompt text must be a string, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"prompt text is not valid Unicode: {exc.object[exc.start:exc.end]!r} "
                             f"at character {exc.start}") from None
        if streaming_behavior is not None and streaming_behavior not in STREAMING_BEHAVIORS:
            raise ValueError(f"streaming_behavior must be 'steer' or 'follow_up', got {streaming_behavior!r}")
        if self.is_busy:
            if streaming_behavior is None:
                what = "a retry chain is active" if self.is_retrying else "a turn is running"
                raise SessionBusyError(f"cannot prompt: {what}; pass streaming_behavior='steer' or "
                                       "'follow_up' to queue the message")
            self.queue_message(text, streaming_behavior)
            return None
        owner = self._prompt_owner = object()
        try:
            self._new_outcome()
            await self._run_chain([UserMessage(text, self._stamp())])
            while self._prompt_owner is owner:
                # After a cancel or an abort the user asked to stop: queued messages wait for
                # the next prompt instead of going out at once.
                if (not self._queue or self.brain.state == "cancelled"
                        or self._last_turn_aborted):
                    break
                self._new_outcome()
                await self._run_chain([])
            return self._outcome()
        except asyncio.CancelledError:
            if self._prompt_owner is owner:
                self._cancel_chain()
            raise
        finally:
            if self._prompt_owner is owner:
                self._prompt_owner = None

    def _new_outcome(self) -> None:
        """A new turn (not a retry) starts: what :meth:`prompt` will report starts over."""
        self._outcome_message, self._outcome_end, self._outcome_retries = None, None, 0

    def _outcome(self) -> TurnOutcome:
        message, end = self._outcome_message, self._outcome_end
        if end is not None:
            return TurnOutcome(message, end.success, end.end_reason, self._outcome_retries)
        ok = message is not None and message.stop_reason not in ("error", "aborted")
        return TurnOutcome(message, ok, None, self._outcome_retries)

    def queue_message(self, text: str, behavior: str = "follow_up") -> None:
        """Queue a user message without starting a turn, as the original's ``steer`` /
        ``followUp`` do: while the session is busy it goes out with the next continue or turn;
        while it is idle it waits for the next :meth:`prompt`, which sends it first (one
        request, not one per message). Emits the queue update. ``behavior`` is ``"steer"`` or
        ``"follow_up"``; ``TypeError`` / ``ValueError`` as :meth:`prompt` (nothing queued)."""
        if not isinstance(text, str):
            raise TypeError(f"message text must be a string, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"message text is not valid Unicode: {exc.object[exc.start:exc.end]!r} "
                             f"at character {exc.start}") from None
        if behavior not in STREAMING_BEHAVIORS:
            raise ValueError(f"behavior must be 'steer' or 'follow_up', got {behavior!r}")
        self._queue.append((UserMessage(text, self._stamp()),
                            "steer" if behavior == "steer" else "follow_up"))
        self._emit(self._queue_event())

    def abort_retry(self) -> None:
        """Cancel a pending backoff (§5), or a request's wait at the gate (a first request's
        or a retry's wait for a cooldown or the fleet pacer's slot, docs/fleet.md "Pacing":
        the turn ends ``aborted``, nothing sent; for a retry, as an abort during its attempt,
        the chain ends ``cancelled``); while a retried turn runs, the turn decides."""
        self._end_gate_wait()
        self._perform(self.brain.abort_retry())

    def retry_now(self) -> None:
        """Retry now (§3): during a backoff the timer is cancelled and the turn continues on
        the next loop tick with the same attempt number; while a retry waits at the gate (a
        cooldown or the fleet pacer's slot) it goes at once. Either way that one request
        bypasses the gate (docs/fleet.md "Pacing"). Ignored at any other time."""
        waiter = self._gate_wait
        if waiter is not None and not waiter.done() and self.brain.is_retrying:
            self._skip_gate = True
            waiter.set_result(False)
            return
        if self._kernel.at_gate and self.brain.is_retrying:  # asking the coordinator: go once answered
            self._skip_gate = True
            return
        actions = self.brain.retry_now()
        if any(isinstance(a, B.ContinueTurn) for a in actions):
            self._skip_gate = True
        self._perform(actions)

    async def abort(self) -> None:
        """``abort_retry()`` first, then stop the running turn; returns when it has ended.

        Once this returns, the chain sends no further request: a turn whose answer arrived
        in the same moment is taken as aborted, and the chain ends ``cancelled``."""
        self._end_gate_wait()
        self._perform(self.brain.abort())
        # a turn that ended while the loop gathers its facts (the coordinator's answer in
        # flight) is taken as aborted, its token given back: the loop's rule (SPEC §15.6)
        self._kernel.abort()
        if self._turn_running:
            self._abort_turn = True
            task = self._stream_task
            if task is not None and not task.done():
                task.cancel()
            await self._turn_done.wait()

    # ------------------------------------------------------------------ turns
    def _add(self, message: UserMessage | AssistantMessage) -> None:
        self.messages.append(message)
        if self.session_log is not None:
            self.session_log.append(message)

    def _kept(self, message: AssistantMessage) -> AssistantMessage:
        """The message as it may be kept in the context, the log and events: a provider's
        broken Unicode repaired, credentials scrubbed, the error text clipped to 8 KB
        (docs/policy.md §8b.10). Classification has already read the original."""
        text = clean_text(message.text) if message.text else message.text
        changes: dict[str, Any] = {}
        if text is not message.text:
            changes["text"] = text
        for name, limit in (("error_message", 8192), ("error_type", 256), ("error_code", 256)):
            value = getattr(message, name, None)
            if isinstance(value, str):
                kept = safe_error_text(value, self._secrets, limit_bytes=limit)
                if kept != value:
                    changes[name] = kept
        headers = getattr(message, "headers", None)
        if headers:
            kept_headers = {k: safe_error_text(v, self._secrets, limit_bytes=256) for k, v in headers.items()}
            if kept_headers != dict(headers):
                changes["headers"] = kept_headers
        return dataclasses.replace(message, **changes) if changes else message

    def _safe(self, text: str) -> str:
        return safe_error_text(text, self._secrets)

    def _unsent(self, message: AssistantMessage) -> AssistantMessage:
        """An answer for a request that was never sent (aborted at the gate, a failing
        credential store): its ``message_start`` is emitted now, so that every assistant
        ``message_end`` has one (README "Events", the order)."""
        self._emit(E.MessageStart({"role": "assistant", "content": [], "model": message.model,
                                   "timestamp": message.timestamp_ms or self._stamp()}))
        return message

    def _aborted(self) -> AssistantMessage:
        return AssistantMessage("aborted", error_message=ABORTED_TEXT, model=self.provider.model,
                                timestamp_ms=self._stamp())

    # ------------------------------------------------------------------ the chain: the one loop
    async def _run_chain(self, new: list[UserMessage]) -> None:
        """Run the chain a new turn starts (``new``: the user's messages; none for queued
        messages going out in a turn of their own) on the one loop (:mod:`fsm.host.loop`),
        until it ends: the loop passes the gate, gathers the facts, asks the brain, carries out
        its actions, waits the backoff and the budget; the session runs each attempt (a turn,
        :meth:`_attempt`) and the actions of its turn (:meth:`_host_action`)."""
        self._turn_running = True  # the first request's wait at the gate counts as the turn
        self._turn_done.clear()
        self._compaction = None
        self._pending_end = None
        self._cancelled_in_steps = False
        loop = self._kernel
        try:
            await self._read_fallback_mark()
            self._settle_model_and_settings()
            loop.begin()
            loop.context_window = self.context_window
            loop.gate_first = bool(new)
            self._chain_new = new
            await self._drive(loop.steps())
        finally:
            if self._turn_running:
                self._end_turn()  # refused at the gate, or the deadline there: no attempt ran
        if self._deadline_abort is not None:
            await self._deadline_turn()
        compaction, self._compaction = self._compaction, None
        if compaction is not None and self.compaction_hook is not None:
            try:
                await self.compaction_hook(self, compaction.message, compaction.kind)
            except Exception as exc:
                log.warning("compaction hook failed: %s", exc)

    async def _drive(self, steps: Steps[Any]) -> None:
        """Drive the loop's steps on asyncio: an attempt is a turn (:meth:`_attempt`), a wait
        is on the session clock and ended early by the user (:meth:`_wait`), coordinator
        commands are bounded by the one rule. The chain's outcome is in its events (and
        :meth:`prompt`'s :class:`TurnOutcome`): the loop's exception for a caller is dropped."""
        step: Callable[[Any], Any] = steps.send
        value: Any = None
        while True:
            try:
                command = step(value)
            except StopIteration:
                return
            except (RetryChainError, ContextOverflowError):
                return
            except Exception:
                raise
            except BaseException:
                self._cancelled_in_steps = True  # the loop ended the chain (cancelled)
                raise
            try:
                kind = type(command)
                if kind is Send:
                    value = await self._attempt(command)
                elif kind is Wait:
                    value = await self._wait(command)
                elif kind is AskStore:
                    value = await self._kernel.ask_store(command.name, *command.args,
                                                         timeout=command.timeout)
                else:
                    value = await answer_async(command)
                step = steps.send
            except BaseException as exc:  # noqa: BLE001 - thrown into the steps, which re-raise
                value, step = exc, steps.throw

    async def _wait(self, command: Wait) -> bool:
        """A wait of the loop on the session clock: at the gate (:meth:`_wait_at_gate`), else
        the backoff or the budget's slot, ended early by ``abort_retry`` / ``retry_now`` /
        ``abort`` (the brain's ``CancelBackoff`` / ``ContinueTurn``: False) or by the
        deadline's share of it."""
        if command.source in ("cooldown", "pacing") or (command.source == "deadline"
                                                        and self._kernel.at_gate):
            return await self._wait_at_gate(command.delay_ms)
        waiter = self._backoff_wait = asyncio.get_running_loop().create_future()
        if command.source == "backoff":  # the brain's timer: its fact at once (§3)
            timer = self.clock.call_later(command.delay_ms / 1000, self._on_backoff_timer,
                                          self.brain.timer_id)
        else:
            timer = self.clock.call_later(command.delay_ms / 1000, _resolve, waiter)
        self._backoff_timer = timer
        try:
            return bool(await waiter)
        finally:
            timer.cancel()
            if self._backoff_wait is waiter:
                self._backoff_wait = self._backoff_timer = None

    async def _attempt(self, command: Send) -> Attempt:
        """One attempt of the chain: a turn (agent_start … the assistant message), its end
        handed back to the loop (the message, classified against the session clock). A
        continue that cannot run (:class:`ContinueRejected`, a failing preparation) ends the
        chain ``continue_failed`` (the brain's ``continue_failed``)."""
        new, self._chain_new = self._chain_new or [], None
        retry = command.attempt >= 1
        try:
            message, run = await self._turn(new, command.deadline_ms)
        except asyncio.CancelledError:
            raise
        except ContinueRejected as exc:
            if not retry:
                raise
            self._perform(self.brain.continue_failed(str(exc)))
            return Attempt(stopped="ended")
        except Exception as exc:
            if not retry:
                raise
            log.exception("continue failed")
            self._perform(self.brain.continue_failed(self._safe(f"continue failed: {_describe(exc)}")))
            return Attempt(stopped="ended")
        if retry:
            self._outcome_retries += 1
        if self._deadline_hit:
            # the chain's deadline passed during the attempt (docs/policy.md §13.2): its end is
            # not a fact for the brain; the loop ends the chain, then the turn's end events
            self._pending_end = (message, run)
            return Attempt(stopped="deadline")
        if not message.timestamp_ms:  # the host stamps the answer with its clock
            message = dataclasses.replace(message, timestamp_ms=self._started or self._stamp())
        self._turn_run = run
        cls = self._kernel.classify(message, self.context_window)  # reads the whole text
        self._turn_message = message = self._kept(message)
        return Attempt(message=message, classification=cls, output_streamed=self._streamed)

    def _review(self, message: AssistantMessage, cls: Any,
                facts: Any) -> tuple[AssistantMessage, Any, Any]:
        """The session's last word before the brain decides (the loop's ``review``; an abort
        that came while the facts did has made the answer aborted there, §8.8): the facts
        name the model the attempt used (docs/policy.md §13.3); the answer joins the context."""
        kernel = self._kernel
        if facts is None:
            facts = kernel.local_facts(output_streamed=self._streamed)
        facts = dataclasses.replace(facts, model=self._model_in_use or self._primary_model or None)
        self._last_turn_aborted = message.stop_reason == "aborted"
        self._add(message)
        self._turn_run.append(message.to_json())
        self._turn_message = message
        self._outcome_message = message
        return message, cls, facts

    async def _turn(self, new: list[UserMessage], deadline_ms: int | None
                    ) -> tuple[AssistantMessage, list[dict[str, Any]]]:
        """Run one turn (the queued messages and ``new`` first) up to its assistant message;
        ``deadline_ms``: the chain's deadline is this far away (the attempt stops there).
        Raises :class:`ContinueRejected`."""
        self._turn_running = True
        self._turn_done.clear()
        self._deadline_hit = False
        deadline = (None if deadline_ms is None
                    else self.clock.call_later(deadline_ms / 1000, self._on_deadline))
        try:
            if self._queue:
                new = [m for m, _ in self._queue] + new  # queued first: they were typed earlier
                self._queue.clear()
                self._emit(self._queue_event())
            if not new and (not self.messages or not isinstance(self.messages[-1], UserMessage)):
                raise ContinueRejected("cannot continue: the runtime context does not end with "
                                       "a user message")
            self._emit(E.AgentStart())
            self._emit(E.TurnStart())
            run: list[dict[str, Any]] = []
            for user in new:
                self._add(user)
                self._emit(E.MessageStart(user.to_json()))
                self._emit(E.MessageEnd(user.to_json()))
                run.append(user.to_json())
            message = await self._complete()
            if self._abort_turn and message.stop_reason != "aborted":
                # abort() came as the answer did (its task already done, nothing to cancel):
                # the answer is not taken (§8.8). Checked here, before _end_turn clears the flag.
                message = self._aborted()
            return message, run
        finally:
            if deadline is not None:
                deadline.cancel()
            self._end_turn()

    def _end_turn(self) -> None:
        self._turn_running = False
        self._abort_turn = False
        self._skip_gate = False
        self._partial = None
        self._turn_done.set()
        self._unwatch()

    async def _deadline_turn(self) -> None:
        """The chain ended ``deadline`` (the loop) while an attempt ran, or while a retry
        waited at the gate: that turn ends as failed with the deadline's text after the chain's
        end (docs/policy.md §13.2; a retry stopped at the gate runs its turn to say so)."""
        pending, self._pending_end = self._pending_end, None
        try:
            if pending is None:
                try:
                    pending = await self._turn([], None)
                except ContinueRejected:
                    return
                self._outcome_retries += 1
            text, run = pending[0].text, pending[1]
            message = self._kept(AssistantMessage("error", text=text,
                                                  error_message=self._deadline_abort,
                                                  model=self.provider.model))
            self._add(message)
            run.append(message.to_json())
            self._outcome_message = message
            self._perform([B.EmitTurnEnd("message"), B.EmitTurnEnd("agent")], message=message,
                          run=run)
        finally:
            self._deadline_abort = None

    async def _wait_at_gate(self, delay_ms: int) -> bool:
        """Wait ``delay_ms`` on the session clock for the gate; False when the wait was ended
        early (an abort, the chain's deadline, ``retry_now()``) or is not to begin."""
        if self._abort_turn or self._deadline_abort is not None or self._skip_gate:
            return False
        waiter = self._gate_wait = asyncio.get_running_loop().create_future()
        timer = self.clock.call_later(delay_ms / 1000, _resolve, waiter)
        try:
            return bool(await waiter)
        finally:
            timer.cancel()
            self._gate_wait = None

    def _end_gate_wait(self, *, abort: bool = True) -> None:
        """End a request's wait at the gate: for ``abort()`` / ``abort_retry()`` (``abort``)
        the turn ends ``aborted`` with no request sent; otherwise (the chain's deadline) the
        turn decides from its own state."""
        waiter = self._gate_wait
        if waiter is not None and not waiter.done():
            if abort:
                self._abort_turn = True
            waiter.set_result(False)
        elif abort and self._kernel.at_gate:
            # the gate is still asking the coordinator: its wait will not begin (and nothing
            # is sent) once the answer is in
            self._abort_turn = True

    async def _complete(self) -> AssistantMessage:
        self._streamed = False
        self._started = 0
        self._joiner = StreamJoiner()
        if self._abort_turn:
            return self._unsent(self._aborted())
        api_key = None
        if self.credentials is not None:
            try:
                api_key = await self._kernel.ask_store("api_key", self.provider.name,
                                                       self.session_id, timeout=KEY_TIMEOUT_S)
            except Exception as exc:  # a broken store fails the turn; it never picks a key for us
                log.warning("credential store failed: %s", _describe(exc))
                return self._unsent(AssistantMessage("error", error_message=f"credential store "
                                                     f"failed: {_describe(exc)}",
                                                     model=self.provider.model))
            if self._abort_turn:
                return self._unsent(self._aborted())
        self._api_key = api_key
        if api_key:
            self._secrets.add(api_key)
        self._partial = {"role": "assistant", "content": [], "model": self.provider.model,
                         "timestamp": self._stamp()}
        self._started = self._partial["timestamp"]
        self._emit(E.MessageStart(dict(self._partial)))
        context = [m.to_openai() for m in self.messages]
        if self._deadline_abort is not None:
            return AssistantMessage("error", error_message=self._deadline_abort,
                                    model=self.provider.model)
        self._timed_out = None
        self._stream_task = task = asyncio.ensure_future(self._send(context, api_key))
        try:
            message = await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                task.cancel()
                raise
            if self._timed_out is not None and not self._abort_turn:
                # A stall or an attempt timeout is a failure, not an abort (docs/policy.md §13.1).
                message = AssistantMessage("error", error_message=self._timed_out,
                                           model=self.provider.model)
            else:
                message = self._aborted()
        except Exception as exc:  # a provider must not raise; if one does, it is a failed turn
            log.warning("provider raised %s", _describe(exc))
            message = AssistantMessage("error", error_message=_describe(exc), model=self.provider.model)
        finally:
            self._stream_task = None
        if not isinstance(message, AssistantMessage):  # a broken provider: a failed turn, said so
            message = AssistantMessage("error", model=self.provider.model, error_message=(
                f"provider returned {type(message).__name__}, not an AssistantMessage"))
        rest = self._joiner.flush()
        if rest and self._partial is not None:
            self._on_text_clean(rest)
        if self._partial is not None and self._partial["content"]:
            text = self._partial["content"][0]["text"]
            self._emit(E.MessageUpdate(self._partial_json(),
                                       {"type": "text_end", "contentIndex": 0, "content": text}))
        return message

    def _partial_json(self) -> dict[str, Any]:
        p = self._partial
        return {"role": "assistant", "content": [dict(c) for c in p["content"]], "model": p["model"],
                "timestamp": p["timestamp"]}

    def _on_text(self, delta: str) -> None:
        p = self._partial
        if not delta or p is None:  # nothing, or a provider calling back after its turn ended
            return
        delta = self._joiner.feed(delta)  # a surrogate pair split across deltas is joined
        if delta:
            self._on_text_clean(delta)

    def _on_text_clean(self, delta: str) -> None:
        p = self._partial
        self._streamed = True
        self._on_data()
        if not p["content"]:
            p["content"].append({"type": "text", "text": ""})
            self._emit(E.MessageUpdate(self._partial_json(), {"type": "text_start", "contentIndex": 0}))
        p["content"][0]["text"] += delta
        self._emit(E.MessageUpdate(self._partial_json(),
                                   {"type": "text_delta", "contentIndex": 0, "delta": delta}))

    # ------------------------------------------------------------------ §13: watchdog, fallback
    def _settle_model_and_settings(self) -> None:
        """At rest, before a new turn: the model (the primary again once its fallback mark
        expired, docs/policy.md §13.3) and the settings resolved for it (most specific
        ``providers`` entry, §13.4; the live ``set_auto_retry`` over everything). A chain keeps
        what was resolved at its start."""
        now = self._kernel.now_ms()
        if self._model_in_use is not None and (self._fallback_until_ms is None or now is None
                                               or now >= self._fallback_until_ms):
            self._use_model(None)
        given = self._given_settings
        resolved = given.for_provider(getattr(self.provider, "name", None),
                                      getattr(self.provider, "model", None))
        if self._live_enabled is not None and resolved.enabled != self._live_enabled:
            resolved = resolved.with_enabled(self._live_enabled)
        if resolved is not self.brain.settings:
            self.brain.update_settings(resolved)

    def _shared_marks(self) -> Any:
        """The configured coordinator when it keeps fallback marks (protocol v3), else None."""
        coordinator = self._kernel.configured_coordinator
        if coordinator is None or not hasattr(coordinator, "mark_fallback"):
            return None
        return coordinator

    def _primary_key(self) -> Any:
        from fsm.fleet import CoordKey, credential_id
        return CoordKey(self.provider.name or "provider", self._primary_model or "model",
                        credential_id(self._api_key or self._configured_key))

    async def _read_fallback_mark(self) -> None:
        """Before a new prompt: the primary's fallback mark another session wrote (docs/policy.md
        §13.3, so the fleet reverts together); bounded like every coordinator read, and on a
        late or failing answer the session keeps its own mark."""
        models = self._given_settings.fallback_models
        coordinator = self._shared_marks()
        if not models or coordinator is None:
            return
        try:
            left = await asyncio.wait_for(coordinator.fallback_left_ms(self._primary_key()),
                                          COORDINATOR_TIMEOUT_S)
        except Exception as exc:  # a late or broken coordinator: the local mark decides
            log.warning("coordinator's fallback mark unknown: %s", _describe(exc))
            return
        now = self._kernel.now_ms()
        if isinstance(left, int) and left > 0 and now is not None:
            self._fallback_until_ms = max(self._fallback_until_ms or 0, now + left)
            if self._model_in_use is None:
                self._use_model(models[0])

    def _write_fallback_mark(self, revert_ms: int) -> None:
        coordinator = self._shared_marks()
        if coordinator is None:
            return

        async def write() -> None:
            try:
                await asyncio.wait_for(coordinator.mark_fallback(self._primary_key(), revert_ms),
                                       2.0)
            except Exception as exc:  # a lost write only costs sharing
                log.warning("coordinator's fallback mark not written: %s", _describe(exc))
        task = asyncio.get_running_loop().create_task(write())
        self._mark_writes.add(task)
        task.add_done_callback(self._mark_writes.discard)

    def update_settings(self, settings: RetrySettings) -> None:
        """Replace the retry settings (taking effect at the next chain; the running one keeps
        its own, docs/policy.md §13.4). Raises ``TypeError`` for anything but RetrySettings."""
        if not isinstance(settings, RetrySettings):
            raise TypeError(f"settings must be RetrySettings, got {type(settings).__name__}")
        self._given_settings = settings
        if not self.brain.is_retrying:
            self._settle_model_and_settings()

    def _use_model(self, entry: str | None) -> None:
        """Send the next requests to fallback ``entry`` (``"model"`` or ``"provider/model"``;
        the provider prefix is dropped when it names this provider), or the primary (None)."""
        self._model_in_use = entry
        model = self._primary_model
        if entry is not None:
            prefix, _, rest = entry.partition("/")
            model = rest if rest and prefix == getattr(self.provider, "name", None) else entry
        try:
            self.provider.model = model
        except AttributeError:  # a provider whose model cannot change: it keeps its own
            log.warning("provider %r cannot switch models; fallback ignored", self.provider)

    async def _send(self, context: list[dict[str, Any]], api_key: str | None) -> AssistantMessage:
        """The attempt: wait until the provider is ready to send (``provider.ready()``, when it
        has one: a model client still being imported), then arm the attempt's timers and call
        it — a stall or an attempt timeout is measured from the send, never from a start-up
        (docs/policy.md §13.1)."""
        ready = getattr(self.provider, "ready", None)
        if ready is not None:
            await ready()
        self._arm_watch()
        return await self.provider.complete(context, on_text=self._on_text, api_key=api_key)

    def _arm_watch(self) -> None:
        """Start the attempt's timers: the attempt timeout and the first-token timer (or, with
        only an idle timeout, the idle timer) (docs/policy.md §13.1, §13.2)."""
        self._unwatch()
        self._timed_out = None
        s = self.brain.settings
        if s.attempt_timeout_ms is not None:
            self._watch.append(self.clock.call_later(
                s.attempt_timeout_ms / 1000, self._stop_attempt,
                f"attempt timed out after {seconds_text(s.attempt_timeout_ms)}"))
        if s.first_token_timeout_ms is not None:
            self._stall_timer = self.clock.call_later(
                s.first_token_timeout_ms / 1000, self._stop_attempt,
                f"stream stalled: no response within {seconds_text(s.first_token_timeout_ms)}")
        elif s.idle_timeout_ms is not None:
            self._on_data()

    def _on_data(self) -> None:
        """A content delta arrived: the first-token timer is done; the idle timer restarts."""
        s = self.brain.settings
        if not s.has_stall_watchdog or self._stream_task is None or self._timed_out is not None:
            return
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        if s.idle_timeout_ms is not None:
            self._stall_timer = self.clock.call_later(
                s.idle_timeout_ms / 1000, self._stop_attempt,
                f"stream stalled: no data for {seconds_text(s.idle_timeout_ms)}")

    def _unwatch(self) -> None:
        for timer in self._watch:
            timer.cancel()
        self._watch = []
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _stop_attempt(self, why: str) -> None:
        """The watchdog fired: the running attempt ends as a failure with ``why``."""
        task = self._stream_task
        if task is None or task.done() or self._timed_out is not None:
            return
        self._timed_out = why
        self._unwatch()
        task.cancel()

    def _on_deadline(self) -> None:
        """The chain's deadline (the loop's ``Send.deadline_ms``) passed during the attempt:
        it stops; the loop then ends the chain ``deadline`` (docs/policy.md §13.2)."""
        self._deadline_hit = True
        task = self._stream_task
        if task is not None and not task.done():
            task.cancel()

    # ------------------------------------------------------------------ the coordinator's key
    def _coord_key(self) -> Any:
        """The coordinator's key of this session's requests: provider, model and the hash of
        the API key in use (docs/fleet.md)."""
        from fsm.fleet import CoordKey, credential_id
        return CoordKey(self.provider.name or "provider", self.provider.model or "model",
                        credential_id(self._api_key or self._configured_key))

    def _stamp(self) -> int:
        """The session clock's time for a message's timestamp (0 when the clock gives none)."""
        now = self._kernel.now_ms()
        return 0 if now is None else now

    # ------------------------------------------------------------------ the chain's actions
    def _cancel_chain(self) -> None:
        """The prompt's task was cancelled from outside: a declared fact (§3); the loop has
        already told the brain when the cancellation reached its steps."""
        if not self._cancelled_in_steps:
            self._perform(self.brain.prompt_cancelled())
        task = self._stream_task
        if task is not None and not task.done():
            task.cancel()
        self._turn_running = False
        self._turn_done.set()

    def _on_backoff_timer(self, timer_id: int) -> None:
        """The backoff timer ``timer_id`` fired: the brain's fact at once, through the loop
        (its ``ContinueTurn`` ends the loop's wait); for a budget in wait mode the loop asks
        the budget again when its wait ends. A stale id continues nothing."""
        if self.brain.waits_for_budget:
            waiter = self._backoff_wait
            if waiter is not None and not waiter.done() and timer_id == self.brain.timer_id:
                waiter.set_result(True)
            return
        self._kernel.elapse(timer_id)

    def _gate_bypassed(self) -> bool:
        """The retry about to go skips the gate: ``retry_now()``, an abort, the deadline."""
        return self._skip_gate or self._abort_turn or self._deadline_abort is not None

    def _end_backoff(self, action: B.Action) -> None:
        """The loop's wait for the backoff ends early: the brain cancelled it or continued."""
        waiter = self._backoff_wait
        if waiter is not None and not waiter.done():
            waiter.set_result(False)
            if isinstance(action, B.PromptMayReturn):
                # The chain ended during its backoff (a cancel): its prompt() has nothing
                # left to do, so the session is free now, not when that task resumes.
                self._prompt_owner = None

    def _perform(self, actions: Iterable[B.Action], *, message: AssistantMessage | None = None,
                 run: list[dict[str, Any]] | None = None) -> None:
        """Carry out the brain's actions in order through the loop (the world's, the loop's,
        then this session's turn: :meth:`_host_action`); ``message`` and ``run``: the turn
        whose end events they emit."""
        if message is not None:
            self._turn_message, self._turn_run = message, run if run is not None else []
        self._kernel.carry_out(list(actions))

    def _host_action(self, action: B.Action) -> None:
        """A host-loop action of the brain that concerns this session's turn (the loop's
        ``on_action``), at its place in the brain's order."""
        if isinstance(action, B.EmitTurnEnd):
            message = self._turn_message
            if message is None:
                return
            if action.part == "message":
                self._emit(E.MessageEnd(message.to_json()))
            else:  # turn_end beside agent_end, as pi orders them
                self._emit(E.TurnEnd(message.to_json()))
                self._emit(E.AgentEnd(tuple(self._turn_run or ())))
        elif isinstance(action, B.DropFailedMessage):
            for i in range(len(self.messages) - 1, -1, -1):
                if self.messages[i] is action.message:
                    del self.messages[i]
                    break
        elif isinstance(action, B.CancelBackoff):
            # the timer goes now; the ContinueTurn or PromptMayReturn after it ends the wait
            if self._backoff_timer is not None:
                self._backoff_timer.cancel()
        elif isinstance(action, B.ContinueTurn):
            # The continue starts on the driver's next tick; from now on the turn counts
            # as running, so an abort() in between aborts it before any request is sent.
            self._turn_running = True
            self._turn_done.clear()
            self._end_backoff(action)
        elif isinstance(action, B.PromptMayReturn):
            self._turn_message = None
            self._end_backoff(action)
        elif isinstance(action, B.AbortAttempt):
            self._deadline_abort = action.error
            self._end_gate_wait(abort=False)  # a retry waiting at the gate sends nothing
            task = self._stream_task
            if task is not None and not task.done():
                task.cancel()
        elif isinstance(action, B.SwitchModel):
            if self._model_in_use is None:  # leaving the primary: its fallback mark
                now = self._kernel.now_ms()
                self._fallback_until_ms = None if now is None else now + action.revert_ms
                self._write_fallback_mark(action.revert_ms)
            self._use_model(action.to_model)
        elif isinstance(action, B.CheckCompaction):
            self._compaction = action

    async def close(self) -> None:
        """Cancel any backoff, finish the coordinator's writes, wait for extensions, close the log."""
        if self.is_retrying:
            self.abort_retry()
        await self._kernel.aclose()
        await self.drain_extensions()
        if self.session_log is not None:
            self.session_log.close()


def _resolve(waiter: asyncio.Future) -> None:
    """A request's wait at the gate is over (its timer fired)."""
    if not waiter.done():
        waiter.set_result(True)
