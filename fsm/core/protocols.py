"""The host protocols: what a provider and a credential store must offer (no SDK imported).

A *provider* runs one model request; a *credential store* hands out API keys and takes the
usage-limit marks of docs/policy.md §3. The session, the RPC server and the runner are typed
with these protocols; :mod:`fsm.providers` and :mod:`fsm.host.credentials` hold implementations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Callable, Protocol, runtime_checkable

from fsm.core.messages import AssistantMessage
from fsm.core.text import check_api_key

__all__ = ["Provider", "CredentialStore", "TextCallback", "DEFAULT_BLOCK_MS", "validate_credentials"]

TextCallback = Callable[[str], None]
"""``on_text(delta)``: called with each streamed text delta, in order."""


@runtime_checkable
class Provider(Protocol):
    """One model endpoint.

    - ``name``: the provider's name (keys credentials and the shared coordinator), e.g. ``openai``.
    - ``model``: the model id.
    - ``complete(messages, *, on_text=None, api_key=None)``: run one request with ``messages``
      (OpenAI-style dicts ``{"role", "content"}``), streaming text deltas to ``on_text``, with
      ``api_key`` when a credential store chose one. Returns the final
      :class:`~fsm.core.messages.AssistantMessage`; a failure is a message with stop reason
      ``error`` (and the structured facts the provider knows), never an exception.
    """

    name: str
    model: str

    async def complete(self, messages: list[dict[str, Any]], *, on_text: TextCallback | None = None,
                       api_key: str | None = None) -> AssistantMessage: ...


@runtime_checkable
class CredentialStore(Protocol):
    """Where API keys live and where a usage limit is recorded (docs/policy.md §3, D13).

    - ``api_key(provider, session_id)``: the key this session should use now (None = the
      provider's own default).
    - ``mark_usage_limit_reached(provider, session_id, retry_after_ms)``: the current key hit
      its usage limit (``retry_after_ms`` is the hint, None when unknown); returns True when
      another credential is now in use for the session.

    A store may also offer ``credential_count(provider) -> int`` (how many keys it holds) and
    ``async`` variants ``aapi_key`` / ``amark_usage_limit_reached``, which the session prefers.
    A store whose sync calls do I/O sets ``blocking = True``: the session then runs them off
    the event loop with a timeout; otherwise it calls them directly.
    """

    def api_key(self, provider: str, session_id: str) -> str | None: ...

    def mark_usage_limit_reached(self, provider: str, session_id: str,
                                 retry_after_ms: int | None) -> bool: ...


DEFAULT_BLOCK_MS = 60_000
"""How long a credential is blocked when the provider gave no hint (ms)."""


def validate_credentials(credentials: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """``{provider: [key, ...]}`` checked and copied (a key listed twice counts once). Raises
    ``TypeError`` / ``ValueError`` naming the provider or the entry (never a key's text)."""
    if not isinstance(credentials, Mapping):
        raise TypeError(f"credentials must map provider -> list of keys, got {type(credentials).__name__}")
    out: dict[str, list[str]] = {}
    for provider, keys in credentials.items():
        if not isinstance(provider, str) or not provider:
            raise ValueError(f"provider name must be a non-empty string, got {provider!r:.60}")
        if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
            raise ValueError(f"credentials[{provider!r}] must be a list of keys, got {type(keys).__name__}")
        if not keys:
            raise ValueError(f"credentials[{provider!r}] is empty")
        for i, key in enumerate(keys):
            check_api_key(key, f"credentials[{provider!r}][{i}]")
        out[provider] = list(dict.fromkeys(keys))
    return out
