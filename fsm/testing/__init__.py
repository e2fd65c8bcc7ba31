"""Helpers for testing code that embeds the retry brain (used by our own tests too).

- :class:`ScriptedProvider`: an in-process provider that answers each request with the next
  scripted outcome (an error text, a successful text, an abort-able wait), recording every
  request's messages. No network, no real time.
- :class:`~fsm.host.clock.FakeClock` (re-exported): a manual clock for the backoff timer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable

from fsm.host.clock import FakeClock
from fsm.core.messages import AssistantMessage, Usage

__all__ = ["FakeClock", "ScriptedProvider", "ok", "error", "hang", "Outcome"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """One scripted answer: ``stop_reason`` with ``text`` / ``error_message``; ``hang`` waits
    (cancellable) until ``release`` is set or the call is cancelled, after streaming ``text``
    when given (a stream that goes silent); ``raises`` raises it."""

    stop_reason: str = "stop"
    text: str = ""
    error_message: str | None = None
    usage: Usage | None = None
    hang: bool = False
    raises: BaseException | None = None


def ok(text: str = "ok", usage: Usage | None = None) -> Outcome:
    return Outcome("stop", text=text, usage=usage)


def error(message: str, usage: Usage | None = None) -> Outcome:
    return Outcome("error", error_message=message, usage=usage)


def hang() -> Outcome:
    return Outcome(hang=True)


class ScriptedProvider:
    """Answers request *n* with ``script[n]``; after the script, ``default`` (a success).

    ``requests`` holds the messages (OpenAI dicts) of every call; ``api_keys`` the key used.
    """

    def __init__(self, script: list[Outcome] | None = None, *, name: str = "scripted",
                 model: str = "scripted-model", default: Outcome | None = None,
                 on_request: Callable[[int], None] | None = None) -> None:
        self.name = name
        self.model = model
        self.script = list(script or [])
        for i, outcome in enumerate(self.script + ([default] if default is not None else [])):
            if not isinstance(outcome, Outcome):
                where = "default" if i == len(self.script) else f"script[{i}]"
                raise TypeError(f"ScriptedProvider {where} must be an Outcome (use fsm.testing.ok(), "
                                f"error(), hang() or Outcome(...)), got {type(outcome).__name__}: "
                                f"{outcome!r:.80}")
        self.default = default or ok()
        self.requests: list[list[dict[str, Any]]] = []
        self.api_keys: list[str | None] = []
        self.models: list[str] = []  # the model of every call (model fallback switches it)
        self.release = asyncio.Event()
        self._on_request = on_request

    async def complete(self, messages: list[dict[str, Any]], *,
                       on_text: Callable[[str], None] | None = None,
                       api_key: str | None = None) -> AssistantMessage:
        index = len(self.requests)
        self.requests.append([dict(m) for m in messages])
        self.api_keys.append(api_key)
        self.models.append(self.model)
        if self._on_request is not None:
            self._on_request(index)
        outcome = self.script[index] if index < len(self.script) else self.default
        if outcome.raises is not None:
            raise outcome.raises
        if outcome.hang:
            if outcome.text and on_text is not None:
                on_text(outcome.text)
            await self.release.wait()
            return AssistantMessage("stop", text="released", model=self.model)
        if outcome.text and on_text is not None:
            on_text(outcome.text)
        return AssistantMessage(outcome.stop_reason, text=outcome.text,
                                error_message=outcome.error_message, usage=outcome.usage,
                                model=self.model)
