"""``serve``: the RPC process shell, one :class:`~fsm.host.session.AgentSession` behind stdin/stdout.

The layers, each its own module:

- :mod:`fsm.rpc.protocol`: framing, command parsing, responses, encoding (pure; also used by
  the client);
- :mod:`fsm.rpc.dispatch`: :class:`~fsm.rpc.dispatch.RpcServer`, the commands on a session;
- :mod:`fsm.rpc.transport`: the stdin reader and the blocking stdout writer;
- this module: :func:`serve`, which wires them with signals and shutdown.

Once the server stops (EOF on stdin, SIGTERM), any backoff is cancelled (closing stdin during a
backoff ends the chain with ``auto_retry_end {success: false, finalError: "Retry cancelled"}``),
prompts still waiting behind an abort are refused and no new model request leaves
(:class:`~fsm.providers.deferred.ProviderGate`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, NamedTuple

from fsm.providers.deferred import ProviderGate
from fsm.rpc.dispatch import RpcServer
from fsm.rpc.transport import Output, StdinReader

__all__ = ["ServeConfig", "serve"]

log = logging.getLogger("fsm.rpc")


class ServeConfig(NamedTuple):
    """What :func:`serve` needs: the session's parts, and where the protocol lines go.

    ``session_file`` may contain ``{id}`` (replaced by the session id); None: no session log.
    ``credentials`` is a credential store (None: none). ``session_kwargs`` go to
    :class:`~fsm.host.session.AgentSession` (e.g. a compaction hook). ``provider_name`` is what
    ``get_state`` reports as ``model.provider`` (default: the provider's ``name``).
    """

    provider: Any
    settings: Any = None
    context_window: int = 0
    session_file: str | None = None
    trace_file: str | None = None
    stdin_fd: int = 0
    stdout_fd: int = 1
    session_kwargs: dict[str, Any] | None = None
    credentials: Any = None
    base_url: str | None = None


async def serve(config: ServeConfig) -> int:
    """Run the RPC server until EOF on stdin, SIGTERM/SIGINT/SIGHUP, or stdout closing. Returns 0.

    Shutdown cancels any backoff (its ``auto_retry_end`` is still written), stops a running
    turn, closes the session log and the trace within about a second.
    """
    import asyncio
    import signal

    from fsm.host.session_files import open_session

    loop = asyncio.get_running_loop()
    gate = ProviderGate(config.provider)
    parts = open_session(gate, settings=config.settings, context_window=config.context_window,
                         log_path=config.session_file, trace_file=config.trace_file,
                         credentials=config.credentials, **(config.session_kwargs or {}))
    session, trace = parts.session, parts.trace

    stopping = asyncio.Event()
    signalled = threading.Event()

    def stop(reason: str) -> None:
        if not stopping.is_set():
            log.info("stopping: %s", reason)
            stopping.set()

    def on_signal(signum: int, frame: Any) -> None:
        # A plain handler rather than loop.add_signal_handler: it also runs while the loop's
        # thread waits in Output.write for a client that does not read, and lets it give up.
        signalled.set()
        loop.call_soon_threadsafe(stop, signal.Signals(signum).name)

    reader = StdinReader(config.stdin_fd, loop)
    output = Output(config.stdout_fd, on_closed=lambda: stop("stdout closed"),
                    should_stop=lambda: signalled.is_set() or reader.hung_up())
    server = RpcServer(session, output, session_file=parts.log_path, base_url=config.base_url,
                       input_ended=reader.hung_up)
    reader.start()
    previous_handlers = {}
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # a closed terminal stops it cleanly too
        try:
            previous_handlers[sig] = signal.signal(sig, on_signal)
        except ValueError:  # not the main thread: the caller handles signals
            pass

    start_provider = getattr(config.provider, "start", None)
    # The SDK import competes for the GIL with the first commands: start it once the input
    # that is already waiting (typically the client's readiness get_state) has been served.
    preload = loop.call_later(0.05, start_provider) if start_provider else None

    async def dispatch() -> None:
        while True:
            frame = await reader.get()
            if frame is None:
                stop("end of input")
                return
            await server.handle(frame)
            if preload is not None and reader.idle:
                start_provider()

    dispatcher = loop.create_task(dispatch())
    stop_wait = loop.create_task(stopping.wait())
    try:
        await asyncio.wait({dispatcher, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (dispatcher, stop_wait):
            task.cancel()
        await asyncio.wait({dispatcher, stop_wait}, timeout=0.2)
        reader.close()
        if preload is not None:
            preload.cancel()
        gate.close()
        await server.shutdown()
        provider_close = getattr(config.provider, "aclose", None)
        if provider_close is not None:
            try:
                await asyncio.wait_for(provider_close(), 0.3)
            except (asyncio.TimeoutError, Exception) as exc:
                log.debug("provider close: %r", exc)
        if trace is not None:
            trace.close()
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
    return 0
