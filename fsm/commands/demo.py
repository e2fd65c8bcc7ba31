"""``python -m fsm demo``: one session surviving provider failures, end to end, explained.

A local fault server on 127.0.0.1 plays the model provider (no model is called, nothing
leaves the machine): it answers the first request with an Anthropic-style 529
``overloaded_error``, the second with a 503, then streams a canned reply. One prompt runs
through :class:`fsm.host.session.AgentSession` with the default settings (so real 2 s and 4 s
backoffs) and the real OpenAI SDK client. Each step is printed as a plain sentence — which
request failed with what, whether that is retried and by which classification rule, how long
the backoff is — and the session log and the transition trace are written to ``--out``.

A second part (skipped with ``--script``) runs the same kind of session with
``retryHints: "honor"``: a 429 whose ``retry-after-ms`` hint is waited out exactly, then a 429
asking for two hours, refused at once with the reason in plain words. The demo takes no
keyboard input (``python -m fsm chat`` is the interactive front end).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from fsm.commands.common import load_settings, open_session, read_input

HELP = "run one prompt through scripted provider failures (529, 503) and explain each decision"

CANNED_REPLY = ["This reply is canned text from the local fault server: ",
                "the retry brain waited out a 529 and a 503 ", "and the second retry got through."]

DEMO_SCRIPT = [
    {"status": 529, "json": {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}},
    {"status": 503, "json": {"error": {"message": "Service Unavailable", "type": "server_error",
                                       "code": "service_unavailable"}}},
    {"stream": CANNED_REPLY},
]


def honor_script(hint_ms: int) -> list[dict]:
    """Part 2's fault-server answers: a hinted 429, a reply, then a 429 asking for two hours."""
    limited = {"error": {"message": "Rate limit reached for requests", "type": "rate_limit_error"}}
    return [{"status": 429, "headers": {"retry-after-ms": str(hint_ms)}, "json": limited},
            {"stream": ["The retry went out exactly when the server said."]},
            {"status": 429, "headers": {"retry-after": "7200"}, "json": limited}]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="build/demo", help="folder for session.jsonl and trace.jsonl (default: build/demo)")
    p.add_argument("--trace", default=None, help="transition trace file (default: OUT/trace.jsonl)")
    p.add_argument("--settings", default=None, help="settings file ({\"retry\": {...}}; default: the defaults)")
    p.add_argument("--script", default=None,
                   help="what the fault server answers, one entry per request (a JSON list; see "
                        "python -m fsm fault-server --help) instead of 529, 503, a reply")
    p.add_argument("--api", choices=("openai", "anthropic"), default="openai",
                   help="the API the provider speaks to the fault server (default: openai)")
    p.add_argument("--prompt", default="Explain what just happened.", help="the user's message")
    p.add_argument("--hint-ms", type=int, default=3000,
                   help="the retry-after-ms hint of part 2 (retryHints: honor; default 3000, longer "
                        "than the first backoff)")


def run(args: argparse.Namespace) -> int:
    import asyncio
    return asyncio.run(_main(args))


def _print(line: str) -> None:
    print(line, flush=True)


def describe_entry(entry: dict) -> str:
    """One fault-server script entry in words: ``529 Overloaded``, ``a streamed reply``."""
    if "stream" in entry:
        cut = " cut off mid-stream" if entry.get("drop") or entry.get("no_done") else ""
        return f"a streamed reply{cut}"
    status = entry.get("status", 200)
    body = entry.get("json")
    message = ""
    if isinstance(body, dict):
        error = body.get("error")
        message = error.get("message", "") if isinstance(error, dict) else str(error or "")
    elif isinstance(entry.get("body"), str):
        message = entry["body"][:60]
    return f"{status} {message}".strip() if status != 200 else "a reply"


def _seconds(ms: float) -> str:
    return f"{ms / 1000:g} s"


_SOURCE = {"hint": " as the server asked", "cooldown": " (a cooldown another session learned)",
           "switch": " (another credential is now in use)",
           "fallback": " (at once, on a fallback model)",
           "budget": " (the shared retry budget's next slot)"}


def retry_sentence(event: dict) -> str:
    """``529 Overloaded is retryable (rule retryable.status_529): waiting 2 s, attempt 1 of 3``."""
    error = event.get("errorMessage") or "the error"
    if len(error) > 100:
        error = error[:99] + "…"
    rule = f" (rule {event['rule']})" if event.get("rule") else ""
    source = _SOURCE.get(event.get("delaySource", ""), "")
    model = f", model {event['model']}" if event.get("model") else ""
    return (f"{error} is retryable{rule}: waiting {_seconds(event['delayMs'])}{source}, "
            f"attempt {event['attempt']} of {event['maxAttempts']}{model}")


def settings_sentences(s) -> list[str]:
    """The docs/policy.md §13 settings in a reader's words (none with the defaults)."""
    out = []
    if s.first_token_timeout_ms is not None or s.idle_timeout_ms is not None:
        parts = [f"no first token within {_seconds(s.first_token_timeout_ms)}"
                 if s.first_token_timeout_ms is not None else "",
                 f"no data for {_seconds(s.idle_timeout_ms)}" if s.idle_timeout_ms is not None else ""]
        out.append("A stalled stream (" + " or ".join(p for p in parts if p)
                   + ") is stopped and retried.")
    if s.attempt_timeout_ms is not None:
        out.append(f"Each attempt is stopped after {_seconds(s.attempt_timeout_ms)} and retried.")
    if s.max_elapsed_ms is not None:
        out.append(f"A chain ends at its deadline of {_seconds(s.max_elapsed_ms)}, even mid-attempt.")
    if s.fallback_models:
        out.append(f"After {s.fallback_after} failures in a row ({', '.join(s.fallback_on)}) the "
                   f"retry moves to {', then '.join(s.fallback_models)}.")
    if s.wait_for_usage_reset:
        out.append("A usage limit is waited out until it resets.")
    return out


async def _main(args: argparse.Namespace) -> int:
    from fsm.testing.fault_server import validate_script
    from fsm.core.settings import SettingsError

    try:
        settings = load_settings(args.settings, prog="demo")
        script = DEMO_SCRIPT
        if args.script:
            script = validate_script(json.loads(read_input(args.script, what="script")))
    except (SettingsError, ValueError, OSError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    trace_path = Path(args.trace) if args.trace else out / "trace.jsonl"
    try:  # refused before anything is written: one line, no traceback, no file left
        for path, what in ((trace_path, "--trace"), (out / "session.jsonl", "--out")):
            if path.exists() and not path.is_file():
                raise OSError(f"{what} {path} is not a file")
        if out.exists() and not out.is_dir():
            raise OSError(f"--out {out} is not a folder")
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"demo: cannot write into {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    log_path = out / "session.jsonl"
    _print("Part 1: the settings given (the defaults unless --settings names a file).")

    status, _ = await _part(script, settings, [args.prompt], log_path, trace_path, api=args.api)
    if not args.script:
        from dataclasses import replace
        _print("")
        _print('Part 2: the same kind of session with retryHints: "honor" (never retry before the '
               "server's hint; a hint longer than retry.maxHintWaitMs ends the chain at once).")
        await _part(honor_script(max(0, args.hint_ms)), replace(settings, retry_hints="honor"),
                    ["Wait as long as the server asks.", "And now?"],
                    out / "session-honor.jsonl", out / "trace-honor.jsonl", api=args.api,
                    refused_on_purpose=True)
    return status


async def _part(script: list, settings, prompts: list[str], log_path: Path,
                trace_path: Path, *, api: str = "openai",
                refused_on_purpose: bool = False) -> tuple[int, object]:
    """Run ``prompts`` through one session against a fault server playing ``script``."""
    import time

    from fsm.core.classify import classify_message
    from fsm.testing.fault_server import FaultServer
    from fsm.core.ui_text import end_reason_text, failure_text

    if log_path.exists():
        log_path.unlink()
    with FaultServer(script) as server:
        plan = ", then ".join(describe_entry(e) for e in script) or "a reply"
        _print(f"A local fault server at {server.base_url} plays the model provider (no model is "
               "called, nothing leaves this machine).")
        _print(f"It answers: {plan}; any later request gets a short reply.")
        s = settings
        _print(f"Retry settings: {'on' if s.enabled else 'off'}, up to {s.max_retries} retries, "
               f"first backoff {_seconds(s.base_delay_ms)}, doubling each time"
               + (f"; server hints honoured up to {_seconds(s.max_hint_wait_ms)}." if s.honors_hints else "."))
        for sentence in settings_sentences(s):
            _print(sentence)
        _print("")
        from fsm.providers.apis import build_provider
        provider = build_provider(api, base_url=server.base_url, model="demo-model",
                                  api_key="demo-key", name="fault-server")
        parts = open_session(provider, settings=settings, session_id="demo", log_path=log_path,
                             trace_file=trace_path)
        session = parts.session
        # The SDK's client and the parts a request uses are loaded before the clock starts:
        # the times printed are the session's (requests, backoffs), not the SDK's imports.
        warm_up = getattr(provider, "warm_up", None)
        if warm_up is not None:
            await warm_up()
        t0 = time.monotonic()

        def say(text: str) -> None:
            _print(f"[{time.monotonic() - t0:6.2f}s] {text}")

        backing_off = False  # a retry is scheduled and not sent yet (the cancel text counts sent ones)

        def on_event(event: dict) -> None:
            nonlocal backing_off
            kind = event["type"]
            if kind in ("auto_retry_start", "auto_retry_end", "agent_start"):
                ended_backing_off, backing_off = backing_off, kind == "auto_retry_start"
            if kind == "message_end":
                m = event["message"]
                if m["role"] == "user":
                    say(f"you: {m['content'][0]['text']}")
                    return
                number = len(server.chat_requests)
                if m["stopReason"] == "error":
                    error = m.get("errorMessage") or "an error"
                    say(f"request {number} failed: {error}")
                    if not session.is_retrying and not session.auto_retry_enabled:
                        say("auto-retry is off: not retrying")
                    elif not session.is_retrying and session.messages:
                        # The failed message is still the last of the conversation here.
                        verdict = classify_message(session.messages[-1])
                        if verdict.kind != "retryable":
                            say(f"that is not retried ({verdict.kind}, rule {verdict.rule}): "
                                "the turn ends with this error")
                else:
                    say(f"request {number} answered (stop reason {m['stopReason']})")
            elif kind == "auto_retry_start":
                say(retry_sentence(event))
            elif kind == "retry_fallback":
                say(f"{event['from']} keeps failing ({event['reason']}): switching to {event['to']}")
            elif kind == "auto_retry_end":
                if event["success"]:
                    say(f"the retry succeeded on attempt {event['attempt']}: the chain is over")
                elif event["attempt"] == 0:
                    say(f"Not retrying: {event.get('finalError', '')}")
                else:
                    say(failure_text(event["attempt"], event.get("finalError", ""), event.get("endReason"),
                                     backing_off=ended_backing_off))
                    why = end_reason_text(event.get("endReason"))
                    if why:
                        say(why)

        session.subscribe(on_event)
        try:
            for prompt in prompts:
                await session.prompt(prompt)
        finally:
            await parts.aclose()
            await provider.aclose()
        requests = len(server.chat_requests)

    answer = session.messages[-1]
    _print("")
    if answer.stop_reason == "stop":
        _print(f"answer (canned text from the local fault server, not a model): {answer.text}")
    elif refused_on_purpose:
        _print("no answer to the last prompt, as intended: the server asked for two hours, so the "
               "chain ended at once instead of sending requests certain to fail")
    else:
        _print(f"no answer: the turn ended with {answer.error_message}")
    _print(f"HTTP requests: {requests} (one per attempt)")
    _print(f"session log (every message, failed ones included): {log_path}")
    python = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd()) else "python"
    _print(f"transition trace: {trace_path}  (see which transitions fired: {python} -m fsm audit {trace_path})")
    return (0 if answer.stop_reason == "stop" else 1), session
