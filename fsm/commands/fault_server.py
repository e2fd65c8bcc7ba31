"""``python -m fsm fault-server --script FILE``: serve a scripted, fault-injecting model API —
OpenAI Chat Completions (``POST /v1/chat/completions``), Anthropic Messages (``POST
/v1/messages``), the OpenAI Responses API and Gemini's ``generateContent`` /
``streamGenerateContent`` from the same script (see :mod:`fsm.testing.fault_server` for the
format).

The first stdout line is the OpenAI base URL (``http://127.0.0.1:PORT/v1``:
``openai.OpenAI(base_url=URL)``); the Anthropic SDK takes the same URL without ``/v1``
(``anthropic.Anthropic(base_url="http://127.0.0.1:PORT")``: it adds ``/v1/messages`` itself; a
doubled ``/v1/v1/messages`` is answered 404 naming the URL to use), and so does the Google
Gen AI SDK (``HttpOptions(base_url="http://127.0.0.1:PORT")``). The server then runs
until SIGINT or SIGTERM (exit status 0). A bad script is refused before anything is bound:
the error names the entry's index, and the exit status is 2. So is a ``--host`` that other
machines can reach (``''``, ``0.0.0.0``, ``::``), unless ``--allow-remote`` is given; then a
warning is printed to stderr.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

HELP = ("serve a scripted fault-injecting model API: OpenAI /v1/chat/completions and Anthropic "
        "/v1/messages (for testing clients)")


EPILOG = """APIs: POST /v1/chat/completions (OpenAI Chat Completions), POST /v1/messages (Anthropic
Messages), GET /v1/models, GET /fault/stats (what the server saw: chat requests, and in
capacity mode the requests accepted and refused per second). The first line printed is the OpenAI base URL, http://HOST:PORT/v1:
openai.OpenAI(base_url=URL). The Anthropic SDK takes it without /v1 (it adds /v1/messages):
anthropic.Anthropic(base_url="http://HOST:PORT"); a doubled /v1/v1/messages gets a 404 naming
the URL to use. POST /v1/responses (OpenAI Responses), and POST /v1beta/models/M:generateContent
and :streamGenerateContent?alt=sse (Gemini): google-genai takes http://HOST:PORT
(HttpOptions(base_url=...)). A request that does not ask to stream gets one JSON answer (a
chat.completion, a Message, a GenerateContentResponse) even for a stream entry.

script: a JSON list, one entry per request (every API counts together); after the list, plain successes.
entry keys (all optional):
  status, json, headers      an HTTP answer, e.g. {"status": 529, "json": {...}, "headers": {"retry-after": "2"}}
  body                       a raw text body instead of json
  stream                     text deltas sent as an SSE stream, e.g. {"stream": ["Hel", "lo"]}
  drop, drop_mode            reset ("rst", default) or close ("fin") the connection after the deltas
  no_done                    end the stream without finish_reason or [DONE] (truncated)
  delay_ms, chunk_delay_ms   wait before answering / between stream chunks
  finish_reason, usage       of the final stream chunk
the full description is in the fsm.testing.fault_server module."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("--script", metavar="FILE",
                        help="JSON list of entries, one per chat request (or '-' for stdin); "
                             "a scenario file with the list under server.script also works "
                             "(required unless --capacity is given)")
    parser.add_argument("--capacity", type=float, metavar="N",
                        help="capacity mode: serve at most N requests/s (a token bucket with one "
                             "second of burst); the others are refused at once (see --over)")
    parser.add_argument("--over", choices=("529", "429"), default="529",
                        help="the answer over capacity: 529 overloaded (default), or 429 with "
                             "retry-after")
    parser.add_argument("--service-ms", type=float, default=0.0, metavar="MS",
                        help="capacity mode: answer an accepted request after MS ms (the "
                             "service time; default 0)")
    parser.add_argument("--refusal-ms", type=float, default=0.0, metavar="MS",
                        help="capacity mode: answer a refused request after MS ms (default 0: "
                             "at once)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1); an address other machines can "
                             "reach ('', 0.0.0.0, ::, a LAN address) needs --allow-remote")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow a --host that other machines can reach (anyone there can use "
                             "the server)")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="S",
                        help="close a connection that sends or takes nothing for S seconds (default 30)")
    parser.add_argument("--port", type=int, default=0, help="port (default 0: a free port)")
    parser.add_argument("--model", default="fault-model", help="model id listed by GET /models")
    parser.add_argument("--verbose", action="store_true",
                        help="log one JSON line per answered request to stderr (API keys in "
                             "headers and query strings redacted)")


def _load(path: str) -> object:
    from fsm.commands.common import read_input
    data = json.loads(read_input(path, what="script"))  # a FIFO or /dev/zero is refused at once
    # A scenario file ({"server": {"script": [...]}}) carries its script inside.
    if isinstance(data, dict) and isinstance(data.get("server"), dict) and "script" in data["server"]:
        return data["server"]["script"]
    return data


def run(args: argparse.Namespace) -> int:
    from fsm.testing.fault_server import FaultServer, is_loopback, validate_script

    capacity = None
    if args.capacity is not None:
        from fsm.testing.capacity import Capacity
        try:
            capacity = Capacity(args.capacity, answer=args.over, service_ms=args.service_ms,
                                refusal_ms=args.refusal_ms)
        except ValueError as exc:
            option = {"service_ms": "--service-ms", "refusal_ms": "--refusal-ms"}.get(
                str(exc).split(" ", 1)[0], "--capacity")
            print(f"fault-server: {option}: {exc}", file=sys.stderr)
            return 2
    elif args.service_ms or args.refusal_ms:
        given = "--service-ms" if args.service_ms else "--refusal-ms"
        print(f"fault-server: {given} belongs to the capacity mode: give --capacity N too "
              "(a script's entries take delay_ms)", file=sys.stderr)
        return 2
    elif args.script is None:
        print("fault-server: give --script FILE, or --capacity N for the capacity mode", file=sys.stderr)
        return 2
    try:
        script = validate_script(_load(args.script) if args.script is not None else [])
    except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        print(f"fault-server: bad script {args.script}: {exc}", file=sys.stderr)
        return 2
    except RecursionError:
        print(f"fault-server: bad script {args.script}: JSON nested too deeply", file=sys.stderr)
        return 2
    if not 0 <= args.port <= 65535:
        print(f"fault-server: --port must be in 0–65535, got {args.port}", file=sys.stderr)
        return 2
    if not (args.timeout > 0 and args.timeout < float("inf")):
        print(f"fault-server: --timeout must be a positive number of seconds, got {args.timeout}",
              file=sys.stderr)
        return 2
    if not is_loopback(args.host):
        if not args.allow_remote:
            shown = repr(args.host) if args.host else "'' (every interface)"
            print(f"fault-server: --host {shown} can be reached from other machines and the "
                  "server answers anyone; add --allow-remote if that is meant, or use 127.0.0.1",
                  file=sys.stderr)
            return 2
        print(f"fault-server: WARNING: listening on {args.host or 'every interface'}: anyone who "
              "can reach this machine can use this server", file=sys.stderr, flush=True)
    try:
        server = FaultServer(script, host=args.host, port=args.port, model=args.model,
                             verbose=args.verbose, allow_remote=args.allow_remote,
                             timeout_s=args.timeout, capacity=capacity)
    except OSError as exc:
        print(f"fault-server: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start()
        print(server.base_url, flush=True)
        while not stop.wait(0.5):  # a timed wait lets the signal handler run promptly
            pass
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
