"""``python -m fsm rpc``: serve one agent session over JSON lines on stdin/stdout.

Protocol: :mod:`fsm.rpc.server` (compatible with the original's ``--mode rpc`` framing).
stdout carries protocol lines only: the real stdout descriptor is kept for them and descriptor
1 is pointed at stderr, so nothing else (a library's ``print``, a warning, a C extension) can
ever write there. Logs and warnings go to stderr. Exit status 0 after EOF on stdin, SIGTERM or
SIGINT; 2 for bad arguments or settings.

The ``openai`` SDK takes ~0.7 s to import; it is loaded in a background thread after the first
commands are served, so ``get_state`` is answered long before it is ready (a turn waits for it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HELP = "serve an agent session with auto-retry over JSON lines on stdin/stdout (RPC mode)"

DEFAULT_SESSION_DIR = os.path.join(".fsm", "sessions")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default=None, metavar="URL",
                   help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8080/v1 "
                        "(default: OPENAI_BASE_URL, else the OpenAI API)")
    p.add_argument("--api", choices=("openai", "anthropic"), default="openai",
                   help="the endpoint's API: OpenAI Chat Completions (default) or Anthropic Messages")
    p.add_argument("--model", required=True, metavar="M", help="model id sent to the endpoint")
    p.add_argument("--api-key", default=None, metavar="K",
                   help="API key (default: OPENAI_API_KEY, else a placeholder for local servers)")
    p.add_argument("--settings", default=None, metavar="FILE",
                   help="settings file in the original's shape ({\"retry\": {...}}); keys this "
                        "project does not use are ignored with a warning on stderr")
    p.add_argument("--context-window", type=_non_negative_int, default=0, metavar="N",
                   help="the model's context window in tokens, for the silent-overflow rule "
                        "(default 0: unknown)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--session-file", default=None, metavar="PATH",
                       help="append the session log here ('{id}' is replaced by the session id; "
                            f"default: {os.path.join(DEFAULT_SESSION_DIR, '{id}.jsonl')})")
    where.add_argument("--no-session", action="store_true", help="do not write a session log")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="write the retry machine's transition trace here (python -m fsm audit FILE)")
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


def _load_settings(path: str):  # -> RetrySettings
    """Load the retry settings; report ignored keys as one stderr line each (not as tracebacks)."""
    import warnings

    from ..settings import RetrySettings, SettingsError

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            settings = RetrySettings.load(path)
        except RecursionError:  # RetrySettings.load lets json's RecursionError through
            raise SettingsError("", path, "a settings file, not JSON nested this deeply") from None
    for w in caught:
        print(f"fsm rpc: settings {path}: {_clip(str(w.message), 300)}", file=sys.stderr)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        unused = sorted(k for k in data if k != "retry") if isinstance(data, dict) else []
    except (OSError, ValueError, RecursionError):
        unused = []
    if unused:
        print(f"fsm rpc: settings {path}: ignoring keys this project does not use: "
              f"{_clip(', '.join(_clip(k, 60) for k in unused), 300)}", file=sys.stderr)
    return settings


def _clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters (a 50 MB key is named, not copied to stderr)."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _provider_name(base_url: str | None, api: str = "openai") -> str:
    # The name the provider would pick, known without importing the SDK.
    from urllib.parse import urlsplit
    return (urlsplit(base_url).hostname or base_url) if base_url else api


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
        logging.basicConfig(stream=sys.stderr, level=getattr(logging, args.log_level),
                            format="fsm rpc: %(levelname)s %(name)s: %(message)s")
        if not args.model:
            return _error("--model must not be empty")
        if not (args.timeout > 0 and args.timeout < float("inf")):
            return _error(f"--timeout must be a positive number of seconds, got {args.timeout}")
        from ..settings import RetrySettings, SettingsError
        try:
            settings = _load_settings(args.settings) if args.settings else RetrySettings()
        except SettingsError as exc:
            return _error(f"bad settings file {args.settings}: {exc}")

        session_file = None
        if not args.no_session:
            session_file = args.session_file or os.path.join(DEFAULT_SESSION_DIR, "{id}.jsonl")

        import asyncio

        from ..rpc.server import DeferredProvider, ServeConfig, serve

        def make_provider():
            from ..providers.apis import build_provider
            return build_provider(args.api, base_url=args.base_url, model=args.model,
                                  api_key=args.api_key, timeout_s=args.timeout)

        provider = DeferredProvider(make_provider, name=_provider_name(args.base_url, args.api),
                                    model=args.model)
        config = ServeConfig(provider=provider, settings=settings, context_window=args.context_window,
                             session_file=session_file, trace_file=args.trace, stdout_fd=proto_fd)
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
