"""RPC mode: one agent session behind JSON lines on stdin/stdout, and an asyncio client.

- :mod:`fsm.rpc.server`: the protocol (framing, command parsing, responses) and the server
  behind ``python -m fsm rpc``.
- :class:`RpcClient`: starts that server as a subprocess and offers ``prompt()``, ``abort()``,
  ``abort_retry()``, ``set_auto_retry()``, ``get_state()``, an event stream that never drops an
  event, and ``wait_for_idle()``; it raises :class:`RpcError` on ``success: false``,
  :class:`RpcTimeout` when a response is late and :class:`ServerDied` when the process exits.

Names are imported on first use, so the server does not load the client's modules.
"""

from __future__ import annotations

from .._lazy import lazy_exports

_EXPORTS = {
    "RpcClient": "fsm.rpc.client",
    "RpcError": "fsm.rpc.client",
    "RpcTimeout": "fsm.rpc.client",
    "ServerDied": "fsm.rpc.client",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("fsm.rpc", _EXPORTS)
