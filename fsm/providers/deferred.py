"""Provider wrappers: a provider loaded in the background, and one that can be closed.

- :class:`DeferredProvider` stands in for a provider whose SDK is slow to import, so a session
  (and the RPC server's ``get_state``) works at once and the first turn waits for the import.
- :class:`ProviderGate` forwards to a provider until it is closed; afterwards each turn ends
  at once as aborted (the RPC server closes it when it stops, so no request leaves for a client
  that has gone).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

__all__ = ["DeferredProvider", "ProviderGate"]

log = logging.getLogger("fsm.providers")


class DeferredProvider:
    """Stands in for a provider whose module is slow to import (the ``openai`` SDK: ~0.7 s).

    ``factory()`` runs in a background thread once :meth:`start` is called; :meth:`complete` waits
    for it, then delegates. ``name`` and ``model`` are known up front, so the session (and
    ``get_state``) works before the import is done. If the factory fails, each turn ends with
    an error message naming the failure (a provider never raises).
    """

    def __init__(self, factory: Callable[[], Any], *, name: str, model: str,
                 api_key: str | None = None, api: str = "openai-completions") -> None:
        import concurrent.futures
        self.name = name
        self.api = api  # pi's Model.api name of what the factory builds
        self.model = model
        self.api_key = api_key  # the configured key: what the session scrubs and keys sharing by
        self._factory = factory
        self._future: concurrent.futures.Future = concurrent.futures.Future()
        self._lock = threading.Lock()
        self._started = False

    def start(self) -> None:
        """Begin loading in the background (idempotent)."""
        with self._lock:
            if self._started:
                return
            self._started = True
        # Not a daemon: a daemon thread still importing when the interpreter shuts down
        # crashes it (SIGSEGV on the freed import lock). Shutdown waits for the import
        # instead, which costs at most its remaining ~0.7 s, and only in the first second.
        threading.Thread(target=self._load, name="fsm-rpc-provider-load", daemon=False).start()

    def _load(self) -> None:
        try:
            provider = self._factory()
        except BaseException as exc:  # reported by complete(), and logged here
            log.error("cannot load the provider: %s: %s", type(exc).__name__, exc)
            self._future.set_exception(exc)
        else:
            self._future.set_result(provider)

    @property
    def loaded(self) -> Any:
        """The real provider, or None while it loads (or when it failed)."""
        if self._future.done() and self._future.exception() is None:
            return self._future.result()
        return None

    async def provider(self) -> Any:
        """The real provider, once loaded (raises what the factory raised)."""
        import asyncio
        self.start()
        if not self._future.done():
            # shield: a cancelled turn must not cancel the shared load.
            await asyncio.shield(asyncio.wrap_future(self._future))
        return self._future.result()

    async def ready(self) -> None:
        """Return once the real provider is loaded, or its load failed (then
        :meth:`complete` answers with the failure): what a host awaits before it starts
        timing an attempt."""
        try:
            await self.provider()
        except Exception:  # noqa: BLE001 - complete() reports it as the turn's error
            pass

    async def complete(self, messages: list[dict], *, on_text: Callable[[str], None] | None = None,
                       api_key: str | None = None) -> Any:
        try:
            provider = await self.provider()
        except Exception as exc:
            from fsm.core.messages import AssistantMessage
            return AssistantMessage("error", error_message=f"cannot load the model client: "
                                    f"{type(exc).__name__}: {exc}", model=self.model)
        if getattr(provider, "model", self.model) != self.model:
            provider.model = self.model  # a model fallback switched it (docs/policy.md §13.3)
        return await provider.complete(messages, on_text=on_text, api_key=api_key)

    async def aclose(self) -> None:
        provider = self.loaded
        if provider is not None and hasattr(provider, "aclose"):
            await provider.aclose()


class ProviderGate:
    """The session's provider inside :func:`serve`: forwards to ``provider`` until :meth:`close`.

    Once the server stops (EOF on stdin, SIGTERM, stdout gone) no new request may leave: a turn
    that starts then (a follow-up the session still had queued when the running turn was
    aborted) ends at once as aborted, with its events, instead of calling the model for a
    client that is gone.
    """

    def __init__(self, provider: Any) -> None:
        self.provider = provider
        self.closed = False

    @property
    def name(self) -> str:
        return self.provider.name

    @property
    def model(self) -> str:
        return self.provider.model

    @model.setter
    def model(self, model: str) -> None:
        """A model fallback switches the wrapped provider's model (docs/policy.md §13.3)."""
        self.provider.model = model

    @property
    def api(self) -> str:
        """The wrapped provider's API, in pi's ``Model.api`` names (``"openai-completions"``
        when it does not say)."""
        return str(getattr(self.provider, "api", "") or "openai-completions")

    @property
    def api_key(self) -> str | None:
        """The wrapped provider's configured key (None when it has none)."""
        return getattr(self.provider, "api_key", None) or getattr(self.provider, "_api_key", None)

    def close(self) -> None:
        self.closed = True

    async def ready(self) -> None:
        """The wrapped provider's :meth:`DeferredProvider.ready` (nothing to wait for when it
        has none)."""
        ready = getattr(self.provider, "ready", None)
        if ready is not None and not self.closed:
            await ready()

    async def complete(self, messages: list[dict], *, on_text: Callable[[str], None] | None = None,
                       api_key: str | None = None) -> Any:
        if self.closed:
            from fsm.core.messages import AssistantMessage
            return AssistantMessage("aborted", error_message="Request was aborted: the RPC server "
                                    "is shutting down", model=self.model)
        return await self.provider.complete(messages, on_text=on_text, api_key=api_key)
