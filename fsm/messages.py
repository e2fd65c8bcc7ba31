"""Message shapes shared by the brain, the session, the providers and the RPC layer.

JSON field names follow the original's wire format (camelCase: ``stopReason``,
``errorMessage``, ``cacheRead``) so that existing clients keep working.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

StopReason = Literal["stop", "length", "toolUse", "error", "aborted"]
STOP_REASONS: tuple[str, ...] = ("stop", "length", "toolUse", "error", "aborted")


@dataclass(slots=True)
class Usage:
    """Token usage of one assistant message (counts of tokens, not bytes)."""

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0

    def to_json(self) -> dict[str, int]:
        return {
            "input": self.input,
            "output": self.output,
            "cacheRead": self.cache_read,
            "cacheWrite": self.cache_write,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> "Usage | None":
        """Read ``{"input", "output", "cacheRead", "cacheWrite"}``; missing keys count 0.

        Raises ``ValueError`` naming the key when a count is not a non-negative integer.
        """
        if data is None:
            return None
        if not isinstance(data, dict):
            raise ValueError(f"usage must be an object, got {data!r:.80}")
        out = cls()
        for key, attr in (("input", "input"), ("output", "output"),
                          ("cacheRead", "cache_read"), ("cacheWrite", "cache_write")):
            value = data.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"usage.{key} must be a non-negative integer, got {value!r:.80}")
            setattr(out, attr, value)
        return out


@dataclass(slots=True)
class UserMessage:
    """A message typed by the user (or queued as a steer / follow-up)."""

    text: str
    timestamp_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    role: str = "user"

    def to_json(self) -> dict[str, Any]:
        return {"role": "user", "content": [{"type": "text", "text": self.text}],
                "timestamp": self.timestamp_ms}

    def to_openai(self) -> dict[str, Any]:
        return {"role": "user", "content": self.text}


@dataclass(slots=True)
class AssistantMessage:
    """The final assistant message of a turn.

    ``stop_reason`` is one of :data:`STOP_REASONS`; ``error_message`` is set when it is
    ``"error"`` (the provider's text, as its SDK reports it) or ``"aborted"``.
    """

    stop_reason: str
    text: str = ""
    error_message: str | None = None
    usage: Usage | None = None
    model: str = ""
    timestamp_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    role: str = "assistant"

    @property
    def is_error(self) -> bool:
        return self.stop_reason == "error"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "role": "assistant",
            "content": [{"type": "text", "text": self.text}] if self.text else [],
            "stopReason": self.stop_reason,
            "timestamp": self.timestamp_ms,
        }
        if self.error_message is not None:
            out["errorMessage"] = self.error_message
        if self.usage is not None:
            out["usage"] = self.usage.to_json()
        if self.model:
            out["model"] = self.model
        return out

    def to_openai(self) -> dict[str, Any]:
        return {"role": "assistant", "content": self.text}


Message = UserMessage | AssistantMessage
