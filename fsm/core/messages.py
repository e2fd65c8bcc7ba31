"""Message shapes shared by the brain, the session, the providers and the RPC layer.

JSON field names follow the wire format of the RPC protocol (docs/policy.md §4) (camelCase: ``stopReason``,
``errorMessage``, ``cacheRead``) so that existing clients keep working.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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
    timestamp_ms: int = 0
    """When it was sent, epoch ms, from the host's clock (the core reads none; 0 = not stamped)."""
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
    ``"error"`` (the provider's human text, e.g. ``"529 Overloaded"``) or ``"aborted"``.

    Structured facts of a failed request, when the host has them (all optional; the
    classifier decides from them before the text rules, ``docs/policy.md §2``):

    - ``status``: the HTTP status of the failed response (an ``int`` 100-599);
    - ``error_type``: the provider's error type (``"overloaded_error"``, ``"rate_limit_error"``);
    - ``error_code``: the provider's error code (``"rate_limit_exceeded"``,
      ``"insufficient_quota"``, ``"context_length_exceeded"``);
    - ``headers``: the response headers, keys lower-cased (``{"retry-after": "20"}``).

    Raises ``ValueError`` naming the value for an unknown stop reason or a fact of the wrong
    type.
    """

    stop_reason: str
    text: str = ""
    error_message: str | None = None
    usage: Usage | None = None
    model: str = ""
    timestamp_ms: int = 0
    """When the answer started, epoch ms, from the host's clock (the core reads none; 0 = not
    stamped: the host stamps it)."""
    role: str = "assistant"
    status: int | None = None
    error_type: str | None = None
    error_code: str | None = None
    headers: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if self.stop_reason not in STOP_REASONS:
            raise ValueError(f"stop_reason must be one of {', '.join(STOP_REASONS)}; "
                             f"got {self.stop_reason!r:.80}")
        if self.error_message is not None and not isinstance(self.error_message, str):
            raise ValueError(f"error_message must be a string or None, got {self.error_message!r:.80}")
        if self.status is not None and (isinstance(self.status, bool) or not isinstance(self.status, int)
                                        or not 100 <= self.status <= 599):
            raise ValueError(f"status must be an HTTP status (an int 100-599) or None, "
                             f"got {self.status!r:.80}")
        for name in ("error_type", "error_code"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name} must be a string or None, got {value!r:.80}")
        if self.headers is not None:
            self.headers = normalize_headers(self.headers)

    @property
    def is_error(self) -> bool:
        return self.stop_reason == "error"

    def to_json(self) -> dict[str, Any]:
        """The wire shape: ``role``, ``content``, ``stopReason``, ``timestamp``, and when set
        ``errorMessage``, ``usage``, ``model``, ``status``, ``errorType``, ``errorCode``,
        ``headers``."""
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
        if self.status is not None:
            out["status"] = self.status
        if self.error_type is not None:
            out["errorType"] = self.error_type
        if self.error_code is not None:
            out["errorCode"] = self.error_code
        if self.headers is not None:
            out["headers"] = dict(self.headers)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "AssistantMessage":
        """Read the shape :meth:`to_json` writes (``content`` as a list of text parts or a
        string; unknown keys are ignored). Raises ``ValueError`` naming the field and value
        when a field has the wrong type or the stop reason is unknown."""
        if not isinstance(data, Mapping):
            raise ValueError(f"an assistant message must be an object, got {data!r:.80}")
        content = data.get("content", [])
        if isinstance(content, str):
            text = content
        elif isinstance(content, list):
            text = "".join(part.get("text", "") for part in content
                           if isinstance(part, Mapping) and part.get("type") == "text"
                           and isinstance(part.get("text", ""), str))
        else:
            raise ValueError(f"content must be a list of parts or a string, got {content!r:.80}")
        timestamp = data.get("timestamp")
        kwargs: dict[str, Any] = {}
        if timestamp is not None:
            if isinstance(timestamp, bool) or not isinstance(timestamp, int):
                raise ValueError(f"timestamp must be an integer (epoch ms), got {timestamp!r:.80}")
            kwargs["timestamp_ms"] = timestamp
        model = data.get("model", "")
        if not isinstance(model, str):
            raise ValueError(f"model must be a string, got {model!r:.80}")
        return cls(stop_reason=data.get("stopReason"), text=text,  # type: ignore[arg-type]
                   error_message=data.get("errorMessage"), usage=Usage.from_json(data.get("usage")),
                   model=model, status=data.get("status"), error_type=data.get("errorType"),
                   error_code=data.get("errorCode"), headers=data.get("headers"), **kwargs)

    def to_openai(self) -> dict[str, Any]:
        return {"role": "assistant", "content": self.text}


def normalize_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` as a plain dict with lower-cased keys (HTTP header names are
    case-insensitive, RFC 9110 §5.1). Raises ``ValueError`` naming the entry when a name or a
    value is not a string."""
    if not isinstance(headers, Mapping) and not hasattr(headers, "items"):  # type: ignore[unreachable]
        raise ValueError(f"headers must be a mapping of names to values, got {headers!r:.80}")
    out: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ValueError(f"headers must map strings to strings, got {name!r:.40}: {value!r:.40}")
        out[name.lower()] = value
    return out


Message = UserMessage | AssistantMessage
