"""``python -m fsm chat``: talk to a model in the terminal, with the retry brain in charge.

The connection flags are the ``rpc`` command's. The screen shows the streamed answer, an input
line and a status line; during a backoff a loader counts down (``Retrying (1/3) in 2s… (esc
to cancel, enter to retry now)``); Esc cancels the retry and Enter on an empty input line
retries at once (``docs/policy.md`` §6). ``/retry on|off``, ``/state``, ``/help`` and
``/quit`` are commands; Ctrl-C or Ctrl-D leave. Needs a terminal: with stdin or stdout not a
TTY it refuses (exit status 2) — use ``python -m fsm rpc`` from programs.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid

from fsm.commands import rpc
from fsm.commands.common import StartupError, load_host_options, open_session, session_path

HELP = "chat with a model in the terminal (retry loader, Esc cancels a backoff)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``rpc`` command's flags, by construction: --base-url, --model, --provider,
    --api-key, --settings, --context-window, --session-dir/--session-file/--no-session,
    --credentials, --redis, --trace, --timeout, --log-level (here the level of the warnings shown on
    screen)."""
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = ("session logs: DIR/<session id>.jsonl, DIR being --session-dir (default "
                ".fsm/sessions under the working folder); the banner names the file.")
    rpc.add_arguments(p)


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
    from fsm.providers.apis import check_api_installed
    try:
        check_api_installed(getattr(args, "api", "openai"))
    except ImportError as exc:  # the SDK of --api is not installed: say which extra
        return _fail(str(exc))
    try:
        settings, credentials, coordinator = load_host_options(args, prog="chat")
    except StartupError as exc:
        return _fail(str(exc))

    import asyncio
    import gc
    status = asyncio.run(_main(args, settings, credentials, coordinator))
    # Leaving now: collecting the openai SDK's objects one by one would add a few hundred ms.
    gc.freeze()
    return status


async def _main(args: argparse.Namespace, settings, credentials, coordinator=None) -> int:
    from fsm.tui.app import ChatApp

    # The openai SDK takes ~0.7 s to import: load it in the background while the screen comes
    # up (a first prompt waits for it).
    provider = rpc.make_provider(args)
    provider.start()
    session_id = uuid.uuid4().hex
    log_path = session_path(args, session_id)
    try:
        parts = open_session(provider, settings=settings, context_window=args.context_window,
                             session_id=session_id, log_path=log_path, trace_file=args.trace,
                             credentials=credentials, coordinator=coordinator)
    except OSError as exc:
        await provider.aclose()
        return _fail(f"cannot open {exc.filename or 'a file'}: {exc.strerror or exc} "
                     "(see --session-dir, --no-session, --trace)")
    from fsm.core.redact import redact_url
    where = redact_url(args.base_url or os.environ.get("OPENAI_BASE_URL") or "OpenAI")
    s = settings
    banner = (
        f"retry-fsm chat · {args.model} at {where}",
        f"auto-retry {'on' if s.enabled else 'off'}: up to {s.max_retries} retries, "
        f"first backoff {s.base_delay_ms} ms (doubling)",
        f"session log: {log_path}" if log_path else "session log: none (--no-session)",
        "Esc interrupts, or cancels a retry · Enter retries now · /help for commands · "
        "Ctrl-D or /quit to leave",
    )
    app = ChatApp(parts.session, banner=banner, log_level=args.log_level)
    try:
        return await app.run()
    finally:
        await parts.aclose()
        await provider.aclose()
