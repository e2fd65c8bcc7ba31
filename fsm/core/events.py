"""The event schema: one typed, frozen class per event type (docs/policy.md §4).

Every event the brain, the session, the runner, the terminal view and the RPC server emit is
one of these classes. ``to_json()`` gives exactly the wire shape (camelCase field names, the
established keys first, ours as additional fields only). An event is also a read-only
``Mapping`` over that shape, so ``event["type"]``, ``event.get("attempt")``, ``dict(event)`` and
``event == {...}`` work for listeners written against plain dicts.

``CANCELLED_TEXT`` is the ``finalError`` of a chain the user (or the host) cancelled; it is
defined here once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator

__all__ = [
    "CANCELLED_TEXT", "END_REASONS", "DELAY_SOURCES", "Event", "AutoRetryStart", "AutoRetryEnd",
    "AgentStart", "TurnStart", "TurnEnd", "MessageStart", "MessageUpdate", "MessageEnd",
    "AgentEnd", "QueueUpdate", "ExtensionError", "CoordinatorUnavailable", "CoordinatorRestored",
    "RetryFallback", "RequestDelayed", "EVENT_TYPES",
]

CANCELLED_TEXT = "Retry cancelled"
"""``finalError`` of a cancelled chain (abort_retry, abort, a cancelled prompt task)."""

END_REASONS: tuple[str, ...] = (
    "succeeded", "exhausted", "cancelled", "fatal", "overflow", "disabled", "continue_failed",
    "hint_too_long", "deadline", "budget", "output_streamed",
)
"""The ``endReason`` codes of ``auto_retry_end`` (docs/policy.md §4)."""

DELAY_SOURCES: tuple[str, ...] = ("backoff", "hint", "cooldown", "switch", "fallback", "budget",
                                  "pacing")
"""The ``delaySource`` values of ``auto_retry_start``: what decided the delay."""


class Event(Mapping[str, Any]):
    """Base class: ``type`` (the wire ``type``), ``to_json()``, and a read-only mapping view."""

    type: ClassVar[str] = ""
    __slots__ = ()

    def to_json(self) -> dict[str, Any]:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        return self.to_json()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_json())

    def __len__(self) -> int:
        return len(self.to_json())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self.to_json() == dict(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_json()!r})"


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class AutoRetryStart(Event):
    """A retry was scheduled: attempt ``attempt`` of ``max_attempts`` after ``delay_ms`` ms.

    ``retry_at_ms`` is the epoch time in ms the retry goes out (None when the host gave no
    time); ``delay_source`` is one of :data:`DELAY_SOURCES`; ``discards_output`` is true when
    the failed attempt had streamed text the retry will replace (a UI clears or marks it).
    ``model`` names the model the retry uses when model fallback is on (docs/policy.md §13.3);
    ``reset_at_ms`` (``resetAt``) is the epoch time in ms a usage limit resets, on a usage-limit
    retry whose provider gave a wait (docs/policy.md §13.5).
    """

    type: ClassVar[str] = "auto_retry_start"
    attempt: int
    max_attempts: int
    delay_ms: int
    error_message: str
    chain_id: int = 0
    rule: str = ""
    retry_hint_ms: int | None = None
    retry_at_ms: int | None = None
    delay_source: str = "backoff"
    discards_output: bool = False
    note: str | None = None
    model: str | None = None
    reset_at_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "attempt": self.attempt,
                               "maxAttempts": self.max_attempts, "delayMs": self.delay_ms,
                               "errorMessage": self.error_message, "chainId": self.chain_id,
                               "rule": self.rule}
        if self.retry_hint_ms is not None:
            out["retryHintMs"] = self.retry_hint_ms
        if self.retry_at_ms is not None:
            out["retryAt"] = self.retry_at_ms
        out["delaySource"] = self.delay_source
        out["discardsOutput"] = self.discards_output
        if self.note:
            out["note"] = self.note
        if self.model is not None:
            out["model"] = self.model
        if self.reset_at_ms is not None:
            out["resetAt"] = self.reset_at_ms
        return out


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class AutoRetryEnd(Event):
    """A chain (or a refusal at rest, ``attempt`` 0) ended; ``end_reason`` in :data:`END_REASONS`.

    ``chain_id`` (``chainId``): the chain's id; a refusal at rest takes an id of its own (the
    next of the brain's chain ids), so every end names a chain (docs/policy.md §13.7).

    ``reset_at_ms`` (``resetAt``): epoch ms a usage limit resets, on a chain refused for a
    usage limit whose provider gave a wait (docs/policy.md §13.5)."""

    type: ClassVar[str] = "auto_retry_end"
    success: bool
    attempt: int
    final_error: str | None = None
    end_reason: str = "succeeded"
    chain_id: int | None = None
    reset_at_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "success": self.success, "attempt": self.attempt}
        if self.final_error is not None:
            out["finalError"] = self.final_error
        out["endReason"] = self.end_reason
        if self.chain_id is not None:
            out["chainId"] = self.chain_id
        if self.reset_at_ms is not None:
            out["resetAt"] = self.reset_at_ms
        return out


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class RequestDelayed(Event):
    """A request waits at the gate before it is sent (docs/fleet.md "First requests",
    "Pacing"): a chain's *first* request under the resilient profile (the session is at rest
    meanwhile, ``isRetrying`` false), or a retry whose backoff is over, with pacing on
    (``isRetrying`` true). ``delay_ms`` (``delayMs``) for a known cooldown or the pacer's slot
    (or, when the pacer had no slot within its horizon, until the gate is asked again),
    ``delay_source`` (``delaySource``) ``"cooldown"`` or ``"pacing"``, ``retry_at_ms``
    (``retryAt``) the epoch ms it goes out (None when the host's clock gives no time).
    ``abort()`` / ``abort_retry()`` end the turn ``aborted`` with no request sent."""

    type: ClassVar[str] = "request_delayed"
    delay_ms: int
    retry_at_ms: int | None = None
    delay_source: str = "cooldown"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "delayMs": self.delay_ms}
        if self.retry_at_ms is not None:
            out["retryAt"] = self.retry_at_ms
        out["delaySource"] = self.delay_source
        return out


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class RetryFallback(Event):
    """The chain switches models (docs/policy.md §13.3): from ``from_model`` to ``to_model``
    because of ``reason`` (the failure's family, e.g. ``"overloaded"``). Comes just before the
    ``auto_retry_start`` it causes."""

    type: ClassVar[str] = "retry_fallback"
    from_model: str | None
    to_model: str
    reason: str
    chain_id: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "from": self.from_model, "to": self.to_model,
                "reason": self.reason, "chainId": self.chain_id}


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class AgentStart(Event):
    """A turn (or a continue) starts."""

    type: ClassVar[str] = "agent_start"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type}


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class TurnStart(Event):
    """The model request of a turn starts (after the user messages were added)."""

    type: ClassVar[str] = "turn_start"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type}


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class TurnEnd(Event):
    """A turn ended with ``message`` (the assistant message, JSON shape)."""

    type: ClassVar[str] = "turn_end"
    message: Mapping[str, Any]
    tool_results: tuple[Any, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "message": dict(self.message), "toolResults": list(self.tool_results)}


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class MessageStart(Event):
    """A message starts: the whole message as it stands (JSON shape)."""

    type: ClassVar[str] = "message_start"
    message: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "message": dict(self.message)}


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class MessageUpdate(Event):
    """Streaming progress: ``assistant_message_event`` is ``{"type": "text_start" | "text_delta"
    | "text_end", "contentIndex": int, "delta"?: str, "content"?: str}``; ``message`` is the
    partial assistant message so far (JSON shape)."""

    type: ClassVar[str] = "message_update"
    message: Mapping[str, Any]
    assistant_message_event: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "message": dict(self.message),
                "assistantMessageEvent": dict(self.assistant_message_event)}


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class MessageEnd(Event):
    """A message is complete (JSON shape)."""

    type: ClassVar[str] = "message_end"
    message: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "message": dict(self.message)}


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class AgentEnd(Event):
    """The turn's run ended; ``messages`` are the messages it added (JSON shapes)."""

    type: ClassVar[str] = "agent_end"
    messages: tuple[Any, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "messages": [dict(m) for m in self.messages]}


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class QueueUpdate(Event):
    """The queued steer / follow-up messages changed; ``queued`` lists their texts."""

    type: ClassVar[str] = "queue_update"
    queued: tuple[str, ...] = ()
    steering: tuple[str, ...] = ()
    follow_up: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "queued": list(self.queued), "steering": list(self.steering),
                "followUp": list(self.follow_up)}


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class ExtensionError(Event):
    """An extension handler raised on an event of type ``event``."""

    type: ClassVar[str] = "extension_error"
    event: str
    error: str

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "event": self.event, "error": self.error}


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class CoordinatorUnavailable(Event):
    """The shared coordinator stopped answering in time; decisions are local (§8b.9)."""

    type: ClassVar[str] = "coordinator_unavailable"
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "reason": self.reason}


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class CoordinatorRestored(Event):
    """The shared coordinator answers again; decisions are shared again (§8b.9)."""

    type: ClassVar[str] = "coordinator_restored"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type}


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls for cls in (AutoRetryStart, AutoRetryEnd, AgentStart, TurnStart, TurnEnd,
                              MessageStart, MessageUpdate, MessageEnd, AgentEnd, QueueUpdate,
                              ExtensionError, CoordinatorUnavailable, CoordinatorRestored,
                              RetryFallback, RequestDelayed)
}
"""Event class by wire ``type``."""
