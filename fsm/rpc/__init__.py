"""RPC mode: one agent session behind JSON lines on stdin/stdout, and an asyncio client.

- :mod:`fsm.rpc.protocol`: framing, command parsing, responses, encoding (pure; both ends);
- :mod:`fsm.rpc.dispatch`: the commands on a session (``get_state`` and ``get_messages`` in
  pi's shapes);
- :mod:`fsm.rpc.transport`: the stdin reader and the stdout writer;
- :mod:`fsm.rpc.server`: :func:`~fsm.rpc.server.serve`, the process behind ``python -m fsm rpc``;
- :class:`RpcClient`: starts that server as a subprocess and offers ``prompt()``, ``steer()``,
  ``follow_up()``, ``abort()``, ``abort_retry()``, ``retry_now()``, ``set_auto_retry()``,
  ``get_state()``, ``get_messages()``, an event stream that never drops an event, and
  ``wait_for_idle()``; it raises :class:`RpcError` on ``success: false``,
  :class:`RpcTimeout` when a response is late and :class:`ServerDied` when the process exits.

The protocol, its commands and the differences from pi's are in ``docs/rpc.md``.

Names are imported on first use, so the server does not load the client's modules.
"""

from __future__ import annotations

from fsm._lazy import lazy_exports

_EXPORTS = {
    "RpcClient": "fsm.rpc.client",
    "RpcError": "fsm.rpc.client",
    "RpcTimeout": "fsm.rpc.client",
    "ServerDied": "fsm.rpc.client",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("fsm.rpc", _EXPORTS)
