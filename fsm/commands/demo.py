"""``python -m fsm demo``: one session surviving real provider failures, end to end.

A fault-injecting OpenAI-compatible server on 127.0.0.1 answers the first request with an
Anthropic-style 529 ``overloaded_error``, the second with a 503, then streams an answer. One
prompt runs through :class:`fsm.session.AgentSession` with the default settings (so real 2 s
and 4 s backoffs) and the real OpenAI SDK client; every event is printed as it happens. The
session log and the transition trace are written to ``--out``. Nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HELP = "run a session through scripted provider failures (529, 503) and print what happens"

DEMO_SCRIPT = [
    {"status": 529, "json": {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}},
    {"status": 503, "json": {"error": {"message": "Service Unavailable", "type": "server_error",
                                       "code": "service_unavailable"}}},
    {"stream": ["The retry brain ", "backed off twice ", "and the second retry ", "got through."]},
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="build/demo", help="folder for session.jsonl and trace.jsonl (default: build/demo)")
    p.add_argument("--trace", default=None, help="transition trace file (default: OUT/trace.jsonl)")
    p.add_argument("--settings", default=None, help="settings file in the original's shape ({\"retry\": {...}})")
    p.add_argument("--script", default=None, help="fault-server script (JSON list) instead of the built-in 529, 503, answer")
    p.add_argument("--api", choices=("openai", "anthropic"), default="openai",
                   help="the API the provider speaks to the fault server (default: openai)")
    p.add_argument("--prompt", default="Explain what just happened.", help="the user's message")


def run(args: argparse.Namespace) -> int:
    import asyncio
    return asyncio.run(_main(args))


def _print(line: str) -> None:
    print(line, flush=True)


async def _main(args: argparse.Namespace) -> int:
    import time
    import warnings

    from ..audit import TraceWriter
    from ..providers.fault_server import FaultServer, validate_script
    from ..session import AgentSession
    from ..session_log import SessionLog
    from ..settings import RetrySettings, SettingsError
    from ..ui_text import failure_text, loader_text

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            settings = RetrySettings.load(args.settings) if args.settings else RetrySettings()
        for w in caught:
            print(f"demo: warning: {w.message}", file=sys.stderr)
        script = DEMO_SCRIPT
        if args.script:
            script = validate_script(json.loads(Path(args.script).read_text(encoding="utf-8")))
    except (SettingsError, ValueError, OSError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trace_path = Path(args.trace) if args.trace else out / "trace.jsonl"
    log_path = out / "session.jsonl"
    if log_path.exists():
        log_path.unlink()

    with FaultServer(script) as server:
        _print(f"fault server: {server.base_url} (script: {len(script)} entries, then plain success)")
        from ..providers.apis import build_provider
        provider = build_provider(args.api, base_url=server.base_url, model="demo-model", api_key="demo-key")
        session = AgentSession(provider, settings=settings, session_log=SessionLog(log_path, "demo"),
                               session_id="demo")
        t0 = time.monotonic()

        def stamp() -> str:
            return f"[{time.monotonic() - t0:6.2f}s]"

        def on_event(event: dict) -> None:
            kind = event["type"]
            if kind in ("message_update", "message_start"):
                return
            if kind == "agent_start":
                _print(f"{stamp()} turn starts (HTTP request {len(server.chat_requests) + 1})")
            elif kind == "agent_end":
                stops = [m["stopReason"] for m in event["messages"] if m["role"] == "assistant"]
                _print(f"{stamp()} turn ends, stop reason {', '.join(stops)}")
            elif kind == "message_end":
                m = event["message"]
                if m["role"] == "user":
                    _print(f"{stamp()} user: {m['content'][0]['text']}")
                elif m["stopReason"] == "error":
                    _print(f"{stamp()} assistant error: {m.get('errorMessage')}")
                else:
                    text = "".join(c.get("text", "") for c in m["content"])
                    _print(f"{stamp()} assistant: {text}")
            else:
                _print(f"{stamp()} {json.dumps(dict(event), ensure_ascii=False)}")
            if kind == "auto_retry_start":
                _print(f"{stamp()} {loader_text(event['attempt'], event['maxAttempts'], event['delayMs'])}")
            elif kind == "auto_retry_end" and not event["success"]:
                _print(f"{stamp()} {failure_text(event['attempt'], event.get('finalError', ''))}")

        session.subscribe(on_event)
        with TraceWriter(trace_path, model=session.brain):
            try:
                await session.prompt(args.prompt)
            finally:
                await session.close()
                await provider.aclose()
        requests = len(server.chat_requests)

    answer = session.messages[-1]
    _print("")
    _print(f"answer: {answer.text or answer.error_message}")
    _print(f"HTTP requests: {requests} (one per attempt)")
    _print(f"session log (every message, failed ones included): {log_path}")
    python = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd()) else "python"
    _print(f"transition trace: {trace_path}  ({python} -m fsm audit {trace_path})")
    return 0 if answer.stop_reason == "stop" else 1
