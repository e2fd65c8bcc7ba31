"""AgentSession: the asyncio shell that embeds the retry brain (SPEC §3–5, §8).

The session runs turns through a provider, hands every final assistant message to its
:class:`~fsm.brain.RetryBrain` *before any await* (SPEC §8.1), and carries out the actions the
brain returns. Time, cancellation and I/O all happen here; decisions all happen in the brain.

Events (dicts, JSON-able) go to ``subscribe()`` listeners synchronously, in order, and to
extensions (``on(event_type, handler)``; ``"*"`` for every type), whose handlers are awaited in
order on a separate worker so a slow or failing extension never holds up the retry chain.

Event types: ``agent_start``, ``message_start``/``message_end`` (``{"message": {...}}``),
``message_update`` (``{"assistantMessageEvent": {"type": "text_delta", "delta"}}``),
``agent_end`` (``{"messages": [...]}``), ``auto_retry_start``, ``auto_retry_end`` (SPEC §4),
``queue_update`` and ``extension_error``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from typing import Any, Awaitable, Callable, Iterable

from . import brain as B
from .brain import RetryBrain
from .clock import Clock, LoopClock
from .credentials import CredentialStore
from .messages import AssistantMessage, UserMessage
from .session_log import SessionLog
from .settings import RetrySettings

log = logging.getLogger("fsm.session")

Listener = Callable[[dict[str, Any]], Any]
Extension = Callable[[dict[str, Any]], Awaitable[Any] | Any]
CompactionHook = Callable[["AgentSession", AssistantMessage, str], Awaitable[Any]]

STREAMING_BEHAVIORS = ("steer", "follow_up", "followUp")
ABORTED_TEXT = "Request was aborted"


class SessionBusyError(RuntimeError):
    """``prompt()`` while a turn runs or a retry chain is active, without a queue behaviour."""


class ContinueRejected(RuntimeError):
    """The turn cannot be continued (the runtime context does not end with a user message)."""


class AgentSession:
    """One agent session with automatic retry.

    Args:
        provider: an object with ``name``, ``model`` and ``async complete(messages, *,
            on_text=None, api_key=None) -> AssistantMessage`` (see
            :class:`fsm.providers.openai_chat.OpenAIChatProvider`).
        settings: :class:`~fsm.settings.RetrySettings` (defaults of SPEC §1).
        context_window: the model's context window in tokens (0 = unknown), for the silent
            overflow rule.
        session_log: a :class:`~fsm.session_log.SessionLog`, or None for no persistence.
        credentials: a :class:`~fsm.credentials.CredentialStore` for the usage-limit path.
        compaction_hook: ``async hook(session, message, kind)`` consulted when retry does not
            take a turn (SPEC §3 "Boundary with compaction"); None = the error stands.
        clock: where the backoff timer lives (:class:`~fsm.clock.FakeClock` in tests).
        random: [0, 1) source for jitter.
    """

    def __init__(self, provider: Any, *, settings: RetrySettings | None = None,
                 context_window: int = 0, session_log: SessionLog | None = None,
                 credentials: CredentialStore | None = None,
                 compaction_hook: CompactionHook | None = None, clock: Clock | None = None,
                 session_id: str | None = None, random: Callable[[], float] | None = None) -> None:
        self.provider = provider
        self.session_id = session_id or uuid.uuid4().hex
        self.context_window = context_window
        self.session_log = session_log
        self.credentials = credentials
        self.compaction_hook = compaction_hook
        self.clock: Clock = clock or LoopClock()
        kwargs: dict[str, Any] = {"usage_limit_reporter": self._report_usage_limit}
        if random is not None:
            kwargs["random"] = random
        self.brain = RetryBrain(settings, **kwargs)
        self.messages: list[UserMessage | AssistantMessage] = []  # the runtime context
        self._listeners: list[Listener] = []
        self._extensions: dict[str, list[Extension]] = {}
        self._ext_queue: deque[tuple[Extension, dict]] = deque()
        self._ext_task: asyncio.Task | None = None
        self._queue: deque[UserMessage] = deque()
        self._timer: Any = None
        self._wake: asyncio.Future | None = None
        self._stream_task: asyncio.Task | None = None
        self._turn_running = False
        self._abort_turn = False
        self._prompt_owner: object | None = None  # the prompt() call that owns the session
        self._last_turn_aborted = False
        self._turn_done = asyncio.Event()
        self._turn_done.set()

    # ------------------------------------------------------------------ state
    @property
    def auto_retry_enabled(self) -> bool:
        return self.brain.settings.enabled

    def set_auto_retry_enabled(self, enabled: bool) -> None:
        """Switch auto-retry; a pending backoff still runs (use ``abort_retry`` to cancel it)."""
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be true or false, got {enabled!r}")
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
        return [m.text for m in self._queue]

    def state(self) -> dict[str, Any]:
        """The RPC ``get_state`` data (camelCase keys)."""
        return {
            "sessionId": self.session_id,
            "model": getattr(self.provider, "model", ""),
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

    def _emit(self, event: dict[str, Any]) -> None:
        for listener in tuple(self._listeners):
            try:
                listener(event)
            except Exception:  # a broken listener must not break the chain
                log.exception("listener failed on %s", event.get("type"))
        if not self._extensions:
            return
        handlers = self._extensions.get(event["type"], []) + self._extensions.get("*", [])
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
                log.warning("extension %r failed on %s: %s", handler, event.get("type"), exc)
                if event.get("type") != "extension_error":
                    self._emit({"type": "extension_error", "event": event.get("type"),
                                "error": f"{type(exc).__name__}: {exc}"})

    async def drain_extensions(self) -> None:
        """Wait until every queued extension handler has run."""
        while self._ext_task is not None and not self._ext_task.done():
            await asyncio.shield(self._ext_task)

    # ------------------------------------------------------------------ controls
    async def prompt(self, text: str, *, streaming_behavior: str | None = None) -> None:
        """Send a user message and run the turn; returns when any retry chain it started ends.

        While the session is busy, ``streaming_behavior`` ``"steer"`` or ``"follow_up"``
        queues the message (delivered with the next continue or turn, never shortening a
        backoff; after a cancelled chain or an aborted turn it waits for the next prompt) and
        returns at once;
        without it raises :class:`SessionBusyError`.
        Raises ``TypeError`` / ``ValueError`` for a non-string text, text that is not valid
        Unicode (a lone surrogate) or an unknown behaviour; nothing is applied then.
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
            self._queue.append(UserMessage(text))
            self._emit({"type": "queue_update", "queued": self.queued_messages})
            return
        owner = self._prompt_owner = object()
        try:
            await self._run_turn([UserMessage(text)])
            while self._prompt_owner is owner:
                await self._drive_chain()
                # After a cancel or an abort the user asked to stop: queued messages wait for
                # the next prompt instead of going out at once.
                if (self._prompt_owner is not owner or not self._queue
                        or self.brain.state == "cancelled" or self._last_turn_aborted):
                    break
                await self._run_turn([])
        except asyncio.CancelledError:
            if self._prompt_owner is owner:
                self._cancel_chain()
            raise
        finally:
            if self._prompt_owner is owner:
                self._prompt_owner = None

    def abort_retry(self) -> None:
        """Cancel a pending backoff (SPEC §5); while a retried turn runs, the turn decides."""
        self._perform(self.brain.abort_retry())

    async def abort(self) -> None:
        """``abort_retry()`` first, then stop the running turn; returns when it has ended."""
        self._perform(self.brain.abort())
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

    async def _run_turn(self, new: list[UserMessage]) -> AssistantMessage:
        """Run one turn and hand its final message to the brain. Raises ContinueRejected."""
        self._turn_running = True
        self._turn_done.clear()
        try:
            if self._queue:
                new = list(self._queue) + new  # queued first: they were typed earlier
                self._queue.clear()
                self._emit({"type": "queue_update", "queued": []})
            if not new and (not self.messages or not isinstance(self.messages[-1], UserMessage)):
                raise ContinueRejected("cannot continue: the runtime context does not end with "
                                       "a user message")
            self._emit({"type": "agent_start"})
            run: list[dict[str, Any]] = []
            for user in new:
                self._add(user)
                self._emit({"type": "message_start", "message": user.to_json()})
                self._emit({"type": "message_end", "message": user.to_json()})
                run.append(user.to_json())
            message = await self._complete()
            self._last_turn_aborted = message.stop_reason == "aborted"
            self._add(message)
            run.append(message.to_json())
        finally:
            self._turn_running = False
            self._abort_turn = False
            self._turn_done.set()
        # The decision is taken before any await and before any listener hears of the turn's
        # end (SPEC §8.1). Event order as the original: a successful retry's auto_retry_end
        # comes before agent_end; auto_retry_start and a failed end come after it (SPEC §4).
        actions = self.brain.turn_ended(message, self.context_window)
        self._emit({"type": "message_end", "message": message.to_json()})
        if actions and isinstance(actions[0], B.Emit) and actions[0].event.get("success") is True:
            self._emit(actions[0].event)
            actions = actions[1:]
        self._emit({"type": "agent_end", "messages": run})
        compaction = self._perform(actions)
        if compaction is not None and self.compaction_hook is not None:
            try:
                await self.compaction_hook(self, compaction.message, compaction.kind)
            except Exception as exc:
                log.warning("compaction hook failed: %s", exc)
        return message

    async def _complete(self) -> AssistantMessage:
        if self._abort_turn:
            return AssistantMessage("aborted", error_message=ABORTED_TEXT, model=self.provider.model)
        api_key = None
        if self.credentials is not None:
            try:
                api_key = self.credentials.api_key(self.provider.name, self.session_id)
            except Exception as exc:  # a broken store fails the turn; it never picks a key for us
                log.warning("credential store failed: %s", exc)
                return AssistantMessage("error", error_message=f"credential store failed: "
                                        f"{type(exc).__name__}: {exc}", model=self.provider.model)
        self._emit({"type": "message_start", "message": {"role": "assistant"}})
        context = [m.to_openai() for m in self.messages]
        self._stream_task = task = asyncio.ensure_future(
            self.provider.complete(context, on_text=self._on_text, api_key=api_key))
        try:
            return await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                task.cancel()
                raise
            return AssistantMessage("aborted", error_message=ABORTED_TEXT, model=self.provider.model)
        except Exception as exc:  # a provider must not raise; if one does, it is a failed turn
            log.warning("provider raised %s", exc, exc_info=True)
            return AssistantMessage("error", error_message=f"{type(exc).__name__}: {exc}",
                                    model=self.provider.model)
        finally:
            self._stream_task = None

    def _on_text(self, delta: str) -> None:
        self._emit({"type": "message_update",
                    "assistantMessageEvent": {"type": "text_delta", "delta": delta}})

    # ------------------------------------------------------------------ the chain
    async def _drive_chain(self) -> None:
        """Wait out the chain this prompt started: backoffs, continues, until it ends."""
        loop = asyncio.get_running_loop()
        while self.brain.is_retrying:
            self._wake = wake = loop.create_future()
            try:
                what = await wake
            finally:
                if self._wake is wake:
                    self._wake = None
            if what == "ended":
                return
            if what == "continue":
                try:
                    await self._run_turn([])
                except ContinueRejected as exc:
                    self._perform(self.brain.continue_failed(str(exc)))
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.exception("continue failed")
                    self._perform(self.brain.continue_failed(f"continue failed: {type(exc).__name__}: {exc}"))

    def _cancel_chain(self) -> None:
        """The prompt's task was cancelled: end the chain so nothing is left pending."""
        self._perform(self.brain.abort())
        if self.brain.state == "continuing":
            self._perform(self.brain.continue_failed(B.CANCELLED_TEXT))
        self._turn_running = False
        self._turn_done.set()

    def _on_backoff_timer(self, timer_id: int) -> None:
        self._timer = None
        self._perform(self.brain.backoff_elapsed(timer_id))

    def _wake_driver(self, what: str) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(what)
            if what == "ended":
                # The chain ended during its backoff (a cancel): its prompt() has nothing
                # left to do, so the session is free now, not when that task resumes.
                self._wake = None
                self._prompt_owner = None

    def _perform(self, actions: Iterable[B.Action]) -> B.CheckCompaction | None:
        """Carry out the brain's actions in order; returns a pending compaction check."""
        compaction = None
        for action in actions:
            if isinstance(action, B.Emit):
                self._emit(action.event)
            elif isinstance(action, B.DropFailedMessage):
                for i in range(len(self.messages) - 1, -1, -1):
                    if self.messages[i] is action.message:
                        del self.messages[i]
                        break
            elif isinstance(action, B.StartBackoff):
                self._cancel_timer()
                self._timer = self.clock.call_later(action.delay_ms / 1000, self._on_backoff_timer,
                                                    action.timer_id)
            elif isinstance(action, B.CancelBackoff):
                self._cancel_timer()
            elif isinstance(action, B.ContinueTurn):
                # The continue starts on the driver's next tick; from now on the turn counts
                # as running, so an abort() in between aborts it before any request is sent.
                self._turn_running = True
                self._turn_done.clear()
                self._wake_driver("continue")
            elif isinstance(action, B.ReleaseWaiters):
                self._wake_driver("ended")
            elif isinstance(action, B.CheckCompaction):
                compaction = action
        return compaction

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _report_usage_limit(self, retry_after_ms: int | None) -> bool:
        if self.credentials is None:
            return False
        try:
            return bool(self.credentials.mark_usage_limit_reached(
                self.provider.name, self.session_id, retry_after_ms))
        except Exception as exc:  # a broken store must not break the chain: normal backoff
            log.warning("credential store failed: %s", exc)
            return False

    async def close(self) -> None:
        """Cancel any backoff, wait for extensions, close the log."""
        if self.is_retrying:
            self.abort_retry()
        await self.drain_extensions()
        if self.session_log is not None:
            self.session_log.close()
