"""``python -m fsm rpc``: serve one agent session over JSON lines on stdin/stdout.

Protocol: :mod:`fsm.rpc.protocol` (pi's ``--mode rpc`` framing and
commands; :mod:`fsm.rpc.dispatch` lists what is answered how).
stdout carries protocol lines only: the real stdout descriptor is kept for them and descriptor
1 is pointed at stderr, so nothing else (a library's ``print``, a warning, a C extension) can
ever write there. Logs and warnings go to stderr. Exit status 0 after EOF on stdin, SIGTERM or
SIGINT; 2 for bad arguments or settings, or when the SDK of ``--api`` is not installed
(the message names the extra: ``pip install 'retry-fsm[anthropic]'``).

The ``openai`` SDK takes ~0.7 s to import; it is loaded in a background thread after the first
commands are served, so ``get_state`` is answered long before it is ready. A prompt sent within
the first second waits for the rest of the import (``rpc --help`` says so too).

Closing stdin ends the server: a backoff in progress is cancelled (its chain ends with
``auto_retry_end {success: false, finalError: "Retry cancelled"}``, still written), a running
turn is aborted, the session log is closed.
"""

from __future__ import annotations

import argparse
import os
import sys

from fsm.commands.common import (DEFAULT_SESSION_DIR, StartupError, add_session_arguments, configure_logging,
                                 load_host_options, session_path)

HELP = "serve an agent session with auto-retry over JSON lines on stdin/stdout (RPC mode)"

__all__ = ["DEFAULT_SESSION_DIR", "add_arguments", "provider_name", "run"]

EPILOG = """session logs: DIR/<session id>.jsonl, DIR being --session-dir (default .fsm/sessions
under the working folder); get_state reports the file as sessionFile. Closing stdin during a
backoff cancels the retry chain (auto_retry_end "Retry cancelled" is still written). The first
request waits for the model client's import (about 0.5 s after start)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The connection, settings and session flags (``chat`` takes the same)."""
    if p.epilog is None:
        p.formatter_class = argparse.RawDescriptionHelpFormatter
        p.epilog = EPILOG
    p.add_argument("--base-url", default=None, metavar="URL",
                   help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8080/v1 "
                        "(default: OPENAI_BASE_URL, else the OpenAI API)")
    p.add_argument("--api", choices=("openai", "anthropic"), default="openai",
                   help="the endpoint's API: OpenAI Chat Completions (default) or Anthropic Messages")
    p.add_argument("--model", required=True, metavar="M", help="model id sent to the endpoint")
    p.add_argument("--provider", default=None, metavar="NAME",
                   help="provider name (get_state's model.provider, the credential store's key; "
                        "default: the endpoint's host name, or 'openai')")
    p.add_argument("--api-key", default=None, metavar="K",
                   help="API key (default: OPENAI_API_KEY, else a placeholder for local servers)")
    p.add_argument("--settings", default=None, metavar="FILE",
                   help="settings file in pi's shape ({\"retry\": {...}}); other top-level "
                        "groups and the original's own retry keys are ignored with a warning on "
                        "stderr; an unknown key inside \"retry\" is refused (docs/policy.md §1)")
    p.add_argument("--context-window", type=_non_negative_int, default=0, metavar="N",
                   help="the model's context window in tokens, for the silent-overflow rule "
                        "(default 0: unknown)")
    add_session_arguments(p)
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="HTTP timeout in seconds (connect, and each read of the stream; default 600)")
    p.add_argument("--log-level", default="WARNING",
                   choices=("DEBUG", "INFO", "WARNING", "ERROR"), help="stderr log level (default WARNING)")


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of tokens, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number ≥ 0, got {value}")
    return value


def _error(message: str) -> int:
    print(f"fsm rpc: {message}", file=sys.stderr, flush=True)
    return 2


def provider_name(args: argparse.Namespace) -> str:
    """``--provider``, else the name the OpenAI-compatible client would pick (the endpoint's
    host name), known without importing the SDK."""
    if getattr(args, "provider", None):
        return args.provider
    from urllib.parse import urlsplit
    base_url = args.base_url
    return (urlsplit(base_url).hostname or base_url) if base_url else getattr(args, "api", "openai")


def make_provider(args: argparse.Namespace):  # -> DeferredProvider
    """The model client of the connection flags, imported in the background once started."""
    from fsm.providers.deferred import DeferredProvider

    name = provider_name(args)

    def build():
        from fsm.providers.apis import build_provider
        return build_provider(getattr(args, "api", "openai"), base_url=args.base_url,
                              model=args.model, api_key=args.api_key, timeout_s=args.timeout,
                              name=name)

    env = "ANTHROPIC_API_KEY" if getattr(args, "api", "openai") == "anthropic" else "OPENAI_API_KEY"
    api = "anthropic-messages" if getattr(args, "api", "openai") == "anthropic" else "openai-completions"
    return DeferredProvider(build, name=name, model=args.model,
                            api_key=args.api_key or os.environ.get(env) or None, api=api)


def run(args: argparse.Namespace) -> int:
    import logging

    # Keep the real stdout for protocol lines; anything else writing to descriptor 1 lands on
    # stderr (restored on return, for in-process callers).
    sys.stdout.flush()
    proto_fd = os.dup(1)
    saved_fd = os.dup(1)
    try:
        os.dup2(2, 1)
    except OSError:  # no stderr at all: stray output goes nowhere rather than into the protocol
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
    try:
        configure_logging(getattr(logging, args.log_level),
                          "fsm rpc: %(levelname)s %(name)s: %(message)s")
        if not args.model:
            return _error("--model must not be empty")
        if not (args.timeout > 0 and args.timeout < float("inf")):
            return _error(f"--timeout must be a positive number of seconds, got {args.timeout}")
        from fsm.providers.apis import check_api_installed
        try:
            check_api_installed(getattr(args, "api", "openai"))
        except ImportError as exc:  # the SDK of --api is not installed: say which extra
            return _error(str(exc))
        try:
            settings, credentials, coordinator = load_host_options(args, prog="fsm rpc")
        except StartupError as exc:
            return _error(str(exc))

        path = session_path(args, "{id}")
        session_file = None if path is None else str(path)
        if not (args.no_session or args.session_file or args.session_dir):
            # The default folder is relative to wherever the server runs: say so once.
            print(f"fsm rpc: writing the session log to {session_file.replace('{id}', '<session id>')} "
                  "(--session-dir DIR chooses the folder, --no-session writes none)",
                  file=sys.stderr, flush=True)

        import asyncio

        from fsm.rpc.server import ServeConfig, serve

        config = ServeConfig(provider=make_provider(args), settings=settings,
                             context_window=args.context_window, session_file=session_file,
                             trace_file=args.trace, stdout_fd=proto_fd, credentials=credentials,
                             session_kwargs={"coordinator": coordinator} if coordinator else None,
                             base_url=args.base_url or os.environ.get("OPENAI_BASE_URL"))
        try:
            status = asyncio.run(serve(config))
        except OSError as exc:  # the session log or the trace file could not be opened
            return _error(f"cannot start: {exc}")
        # The process is about to exit: tearing down the openai SDK's objects one by one takes
        # 150-300 ms of garbage collection; frozen objects are skipped (exit in ~10 ms).
        import gc
        gc.freeze()
        return status
    finally:
        sys.stdout.flush()
        os.dup2(saved_fd, 1)
        os.close(saved_fd)
        os.close(proto_fd)
