"""``python -m fsm chat``: talk to a model in the terminal, with the retry brain in charge.

The connection flags are the ``rpc`` command's. The screen shows the streamed answer, an input
line and a status line; during a backoff a loader counts down (``Retrying (1/3) in 2s… (esc
to cancel)``) and Esc cancels the retry (SPEC §6). ``/retry on|off``, ``/state``, ``/help`` and
``/quit`` are commands; Ctrl-C or Ctrl-D leave. Needs a terminal: with stdin or stdout not a
TTY it refuses (exit status 2) — use ``python -m fsm rpc`` from programs.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from pathlib import Path

from . import rpc

HELP = "chat with a model in the terminal (retry loader, Esc cancels a backoff)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``rpc`` command's flags, by construction: --base-url, --model, --api-key,
    --settings, --context-window, --session-file/--no-session, --trace, --timeout, --log-level
    (here the level of the warnings shown on screen)."""
    rpc.add_arguments(p)


def session_path(args: argparse.Namespace, session_id: str) -> Path | None:
    """Where the session log goes (None with --no-session); ``{id}`` becomes the session id."""
    if args.no_session:
        return None
    template = args.session_file or os.path.join(rpc.DEFAULT_SESSION_DIR, "{id}.jsonl")
    return Path(template.replace("{id}", session_id))


def _fail(message: str) -> int:
    print(f"chat: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        return _fail("needs a terminal (stdin and stdout must be a TTY); "
                     "for programs and pipes use `python -m fsm rpc`")
    if not args.model:
        return _fail("--model must not be empty")
    if not 0 < args.timeout < float("inf"):
        return _fail(f"--timeout must be a positive number of seconds, got {args.timeout}")

    from ..settings import RetrySettings, SettingsError

    import warnings

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            settings = RetrySettings.load(args.settings) if args.settings else RetrySettings()
    except SettingsError as exc:
        return _fail(f"bad settings file {args.settings}: {exc}")
    for w in caught:  # e.g. keys of the original's file this project does not use
        print(f"chat: settings {args.settings}: {w.message}", file=sys.stderr)

    import asyncio
    import gc
    status = asyncio.run(_main(args, settings))
    # Leaving now: collecting the openai SDK's objects one by one would add a few hundred ms.
    gc.freeze()
    return status


async def _main(args: argparse.Namespace, settings) -> int:
    from ..rpc.server import DeferredProvider
    from ..session import AgentSession
    from ..session_log import SessionLog
    from ..tui.app import ChatApp

    def make_provider():
        from ..providers.apis import build_provider
        return build_provider(args.api, base_url=args.base_url, model=args.model,
                              api_key=args.api_key, timeout_s=args.timeout)

    # The openai SDK takes ~0.7 s to import: load it in the background while the screen comes
    # up (a first prompt waits for it).
    provider = DeferredProvider(make_provider, name=rpc._provider_name(args.base_url, args.api),
                                model=args.model)
    provider.start()
    session_id = uuid.uuid4().hex
    log_path = session_path(args, session_id)
    session_log = None
    if log_path is not None:
        try:
            session_log = SessionLog(log_path, session_id)
        except OSError as exc:
            return _fail(f"cannot open the session file {log_path}: {exc} (or pass --no-session)")
    session = AgentSession(provider, settings=settings, context_window=args.context_window,
                           session_log=session_log, session_id=session_id)
    trace = None
    if args.trace:
        from ..audit import TraceWriter
        try:
            trace = TraceWriter(args.trace, model=session.brain)
        except OSError as exc:
            await session.close()
            return _fail(f"cannot write the trace {args.trace}: {exc}")
    where = args.base_url or os.environ.get("OPENAI_BASE_URL") or "OpenAI"
    s = settings
    banner = (
        f"retry-fsm chat · {args.model} at {where}",
        f"auto-retry {'on' if s.enabled else 'off'}: up to {s.max_retries} retries, "
        f"first backoff {s.base_delay_ms} ms (doubling)",
        f"session log: {log_path}" if log_path else "session log: none (--no-session)",
        "Esc interrupts, or cancels a retry · /help for commands · Ctrl-D or /quit to leave",
    )
    app = ChatApp(session, banner=banner, log_level=args.log_level)
    try:
        return await app.run()
    finally:
        await session.close()
        await provider.aclose()
        if trace is not None:
            trace.close()
