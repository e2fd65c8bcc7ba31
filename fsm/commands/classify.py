"""``python -m fsm classify``: classify error messages from the command line.

One message (``-`` reads it from standard input):

.. code-block:: console

    $ python -m fsm classify "Error: 429 {...rate_limit_error...} (retry-after: 30)"
    kind:        retryable
    rule:        retryable.status_429
    family:      rate_limit
    usage limit: no
    retry hint:  30000 ms (30s)

Many messages, one JSON object per line (``-`` reads standard input):

.. code-block:: console

    $ python -m fsm classify --jsonl errors.jsonl

Each input line is an object with ``message`` (a string, or null for an error without text;
``errorMessage`` is accepted too, so ``AssistantMessage.to_json()`` lines work), and optional
``stopReason`` (default ``"error"``), ``usage`` (``{"input", "output", "cacheRead",
"cacheWrite"}``), ``contextWindow`` (tokens) and the structured facts of the failed response,
decided before the text: ``status`` (HTTP status, an integer), ``errorType`` and
``errorCode`` (the provider's error type and code, strings) and ``headers`` (an object of
response headers, e.g. ``{"retry-after": "20"}``). It is written back on one line with
``kind``, ``rule``, ``family``, ``usageLimit`` and ``retryHintMs`` added. Empty lines are skipped. A line that is not
valid UTF-8 or JSON, not an object, or has a field of the wrong type is reported on standard
error with its line number, and the other lines are still processed; the exit status is then 1.

Absolute retry hints ("resets 3pm (Europe/Berlin)", an HTTP date) are resolved against this
machine's clock (or ``--now-ms``) and its zone database; a time printed without a zone is read
in UTC, or in ``--zone``. This command is a shell: the classifier itself reads no clock and no
zone (docs/classification.md "Clock and time zones").
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from datetime import tzinfo
from typing import Any, BinaryIO

HELP = "classify provider error messages: kind, deciding rule, family, usage limit, retry hint"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    # the module docstring without its summary and its ReST directive lines (.. code-block::)
    parser.epilog = re.sub(r"^\.\. [\w-]+::? ?.*\n\n?", "", __doc__.split("\n", 2)[2],
                           flags=re.M).replace("``", "").replace("::", ":")
    parser.add_argument("message", nargs="?",
                        help="the error message to classify ('-' reads it from standard input)")
    parser.add_argument("--jsonl", metavar="FILE",
                        help="classify one JSON object per line of FILE ('-' for standard input)")
    parser.add_argument("--stop-reason", default="error", metavar="REASON",
                        help="stop reason of the turn (default: error)")
    parser.add_argument("--context-window", type=int, default=0, metavar="TOKENS",
                        help="the model's context window, for silent overflow (default: 0, off)")
    parser.add_argument("--input-tokens", type=int, default=0, metavar="N",
                        help="input tokens of the failed message (usage.input)")
    parser.add_argument("--cache-read-tokens", type=int, default=0, metavar="N",
                        help="cache-read tokens of the failed message (usage.cacheRead)")
    parser.add_argument("--now-ms", type=float, default=None, metavar="EPOCH_MS",
                        help="the clock for absolute retry hints, in epoch ms (default: now)")
    parser.add_argument("--zone", default=None, metavar="IANA_ZONE",
                        help="the zone of reset times printed without one, e.g. Europe/Berlin "
                             "(default: UTC)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of readable lines")


def run(args: argparse.Namespace) -> int:
    if (args.message is None) == (args.jsonl is None):
        print("fsm classify: give either a MESSAGE or --jsonl FILE (one of them, not both)",
              file=sys.stderr)
        return 2
    for name in ("context_window", "input_tokens", "cache_read_tokens"):
        if getattr(args, name) < 0:
            print(f"fsm classify: --{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}",
                  file=sys.stderr)
            return 2
    local = None
    if args.zone is not None:
        local = zoneinfo_zone(args.zone)
        if local is None:
            print(f"fsm classify: --zone: unknown time zone {args.zone!r}", file=sys.stderr)
            return 2
    args.zone_resolver = zone_resolver(local)
    if args.now_ms is None:
        import time

        args.now_ms = time.time() * 1000
    if args.jsonl is not None:
        return _run_jsonl(args)

    from fsm.core.classify import classify
    from fsm.core.messages import Usage

    message = args.message
    if message == "-":
        message = sys.stdin.buffer.read().decode("utf-8", errors="replace").rstrip("\n")
    usage = Usage(input=args.input_tokens, cache_read=args.cache_read_tokens)
    result = classify(args.stop_reason, message, usage, args.context_window, now_ms=args.now_ms,
                      zone=args.zone_resolver)
    if args.json:
        print(json.dumps(_fields(result)))
        return 0
    hint = "none" if result.retry_hint_ms is None else (
        f"{result.retry_hint_ms} ms ({_human(result.retry_hint_ms)})")
    print(f"kind:        {result.kind}")
    print(f"rule:        {result.rule}")
    print(f"family:      {result.family}")
    print(f"usage limit: {'yes' if result.usage_limit else 'no'}")
    print(f"retry hint:  {hint}")
    return 0


def zoneinfo_zone(name: str) -> tzinfo | None:
    """The IANA zone named ``name`` in any case (``america/santiago``) from this machine's zone
    database, or None when unknown or empty: the host kernel's resolver
    (:func:`fsm.host.kernel.default_zone`)."""
    from fsm.host.kernel import default_zone

    return default_zone(name)


def zone_resolver(local: tzinfo | None = None) -> Callable[[str], tzinfo | None]:
    """A :data:`fsm.core.hints.ZoneResolver` for a shell: named zones from :func:`zoneinfo_zone`
    (the kernel's resolver), and ``local`` (None: UTC) for times printed without a zone (the
    name ``""``)."""
    def resolve(name: str) -> tzinfo | None:
        return local if name == "" else zoneinfo_zone(name)
    return resolve


def _fields(result: Any) -> dict[str, Any]:
    return {"kind": result.kind, "rule": result.rule, "family": result.family, "usageLimit": result.usage_limit,
            "retryHintMs": result.retry_hint_ms}


def _human(ms: int) -> str:
    """``90061000`` → ``1d1h1m1s``; below a second, ``250ms``."""
    if ms < 1000:
        return f"{ms}ms"
    seconds, out = ms // 1000, ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            out += f"{seconds // size}{unit}"
            seconds %= size
    return out + (f"{seconds}s" if seconds or not out else "")


def _open(path: str) -> BinaryIO:
    from fsm.commands.common import open_input
    return sys.stdin.buffer if path == "-" else open_input(path, what="--jsonl")  # FIFO, /dev/zero refused


def _run_jsonl(args: argparse.Namespace) -> int:
    from fsm.core.classify import classify_facts
    from fsm.core.messages import Usage

    try:
        stream = _open(args.jsonl)
    except OSError as exc:
        print(f"fsm classify: cannot read {args.jsonl}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # not a regular file
        print(f"fsm classify: {exc}", file=sys.stderr)
        return 1
    out = sys.stdout.buffer
    failed = 0
    try:
        for number, raw in enumerate(stream, 1):
            line = raw.rstrip(b"\n").rstrip(b"\r")
            if not line.strip():
                continue
            try:
                obj = _parse_line(line)
                usage = Usage.from_json(obj.get("usage"))
                result = classify_facts(obj["stopReason"], obj["message"], usage, obj["contextWindow"],
                                        now_ms=args.now_ms, zone=args.zone_resolver, **obj["facts"])
            except ValueError as exc:
                failed += 1
                print(f"fsm classify: line {number}: {exc}", file=sys.stderr)
                continue
            record = obj["_original"]
            record.update(_fields(result))
            out.write(_dump(record) + b"\n")
            out.flush()
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    return 1 if failed else 0


def _parse_line(line: bytes) -> dict[str, Any]:
    """Decode one line; raises ``ValueError`` saying what is wrong with it."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not valid UTF-8 (byte 0x{line[exc.start]:02x} at offset {exc.start})") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise ValueError("invalid JSON: nested too deeply") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    key = "message" if "message" in obj else "errorMessage" if "errorMessage" in obj else None
    if key is None:
        raise ValueError('missing "message" (a string, or null for an error without text)')
    message = obj[key]
    if message is not None and not isinstance(message, str):
        raise ValueError(f'"{key}" must be a string or null, got {type(message).__name__}')
    stop_reason = obj.get("stopReason", "error")
    if not isinstance(stop_reason, str):
        raise ValueError(f'"stopReason" must be a string, got {type(stop_reason).__name__}')
    window = obj.get("contextWindow", 0)
    if window is None:
        window = 0
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f'"contextWindow" must be a non-negative integer, got {json.dumps(window)[:40]}')
    return {"_original": obj, "message": message, "stopReason": stop_reason,
            "contextWindow": window, "usage": obj.get("usage"), "facts": _facts(obj)}


def _facts(obj: dict[str, Any]) -> dict[str, Any]:
    """The optional structured facts of a line; raises ``ValueError`` naming a bad one."""
    status = obj.get("status")
    if status is not None and (isinstance(status, bool) or not isinstance(status, int)
                               or not 100 <= status <= 599):
        raise ValueError(f'"status" must be an HTTP status (an integer 100-599), got {json.dumps(status)[:40]}')
    out: dict[str, Any] = {"status": status}
    for key, name in (("errorType", "error_type"), ("errorCode", "error_code")):
        value = obj.get(key)
        if value is not None and not isinstance(value, str):
            raise ValueError(f'"{key}" must be a string, got {json.dumps(value)[:40]}')
        out[name] = value
    headers = obj.get("headers")
    if headers is not None:
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise ValueError(f'"headers" must be an object of strings, got {json.dumps(headers)[:60]}')
        headers = {name.lower(): value for name, value in headers.items()}
    out["headers"] = headers
    return out


def _dump(record: dict[str, Any]) -> bytes:
    text = json.dumps(record, ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from "\ud800" escapes: keep them escaped
        return json.dumps(record).encode("ascii")
