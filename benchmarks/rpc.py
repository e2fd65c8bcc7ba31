"""RPC mode over real pipes: ``rpc_ready_ms`` and ``rpc_abort_retry_to_end_ms``.

``rpc_ready_ms``: from just before spawning ``python -m fsm rpc …`` to reading the answer of
a ``get_state`` written to its stdin right after the spawn; median of ``starts`` starts
(each process is then closed by EOF). ``python_ready_ms`` is the same for a bare
``python -c`` that answers one line (the interpreter's own floor), measured alternately.
``rpc_unclean_exits`` counts the processes (of ``rpc_exits``: those starts, and
``eof_starts`` more that get ``get_state`` and EOF at once, see :func:`eof_probe`) that did
not exit with status 0 (e.g. -11: a segmentation fault); it should be 0.

``rpc_abort_retry_to_end_ms``: the server talks to a
:class:`~fsm.testing.fault_server.FaultServer` (in this process's threads) that answers
every chat request with a 503, with a one-minute backoff. For each trial: send ``prompt``,
read until ``auto_retry_start``, let the server go idle (20 ms), then time from writing
``{"type":"abort_retry"}`` to reading the ``auto_retry_end`` line (median over trials; p90
and max too). The client side is plain blocking ``os.write``/``os.read`` on the pipes, with
no event loop or thread in between.
``rpc_get_state_roundtrip_ms`` is, in the same trials and after the same idle time, a
``get_state`` request → response: the protocol's own floor (the part of the abort figure that
is not the abort). ``pipe_echo_ms`` is a write→read round trip against a minimal Python echo
process (2 ms apart): the floor that two processes and two pipes impose.
"""

from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time

from ._data import ROOT
from ._timing import now_ns, percentile

_ECHO = ("import os\n"
         "while True:\n"
         "    d = os.read(0, 65536)\n"
         "    if not d: break\n"
         "    os.write(1, d)\n")


class Pipe:
    """A child process with line-oriented blocking I/O on its stdin/stdout."""

    def __init__(self, argv: list[str], *, env: dict | None = None) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, cwd=ROOT, env=env, bufsize=0)
        self.win = self.proc.stdin.fileno()
        self.rout = self.proc.stdout.fileno()
        self.buf = b""

    def send(self, obj_or_bytes) -> None:
        if isinstance(obj_or_bytes, bytes):
            data = obj_or_bytes
        else:
            data = (json.dumps(obj_or_bytes) + "\n").encode()
        os.write(self.win, data)

    def line(self, timeout_s: float = 30.0) -> bytes:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.rout], [], [], left)[0]:
                raise TimeoutError(f"no line from {self.proc.args[:4]} within {timeout_s} s")
            chunk = os.read(self.rout, 65536)
            if not chunk:
                raise EOFError(f"{self.proc.args[:4]} closed its stdout (exit {self.proc.poll()})")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def until(self, predicate, timeout_s: float = 30.0) -> dict:
        while True:
            obj = json.loads(self.line(timeout_s))
            if predicate(obj):
                return obj

    def close(self) -> int:
        """EOF on stdin, then wait for the exit (kill after 10 s); returns the exit status
        (negative: killed by that signal)."""
        try:
            self.proc.stdin.close()
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        return self.proc.returncode


def _rpc_argv(base_url: str, settings: str | None = None) -> list[str]:
    argv = [sys.executable, "-m", "fsm", "rpc", "--model", "bench-model", "--no-session",
            "--base-url", base_url, "--api-key", "bench-key"]
    if settings:
        argv += ["--settings", settings]
    return argv


def _ready_once(argv: list[str], request: bytes) -> tuple[float, int]:
    """(ms from spawn to the answer, exit status after EOF)."""
    t0 = now_ns()
    p = Pipe(argv)
    try:
        p.send(request)
        p.line()
        ms = (now_ns() - t0) / 1e6
    except BaseException:
        p.close()
        raise
    return ms, p.close()


def ready(starts: int) -> dict[str, float]:
    argv = _rpc_argv("http://127.0.0.1:9/v1")  # never called: get_state needs no model
    get_state = b'{"type":"get_state","id":"ready"}\n'
    _ready_once(argv, get_state)  # warm the OS file cache
    rpc_runs, py_runs, statuses = [], [], []
    for _ in range(starts):
        ms, status = _ready_once(argv, get_state)
        rpc_runs.append(ms)
        statuses.append(status)
        py_runs.append(_ready_once([sys.executable, "-c", _ECHO], get_state)[0])
    return {
        "rpc_ready_ms": statistics.median(rpc_runs),
        "rpc_ready_max_ms": max(rpc_runs),
        "python_ready_ms": statistics.median(py_runs),
        "rpc_unclean_exits": float(sum(1 for s in statuses if s != 0)),
        "rpc_exits": float(len(statuses)),
    }


def eof_probe(count: int) -> list[int]:
    """Exit statuses of ``count`` servers sent one ``get_state`` and EOF at once (what
    ``echo '{"type":"get_state"}' | python -m fsm rpc …`` does): the server must answer and
    exit 0 even though its model client is still loading in the background."""
    argv = _rpc_argv("http://127.0.0.1:9/v1")
    statuses = []
    for _ in range(count):
        proc = subprocess.run(argv, input=b'{"type":"get_state"}\n', stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, cwd=ROOT, timeout=30)
        statuses.append(proc.returncode)
    return statuses


def abort_to_end(trials: int) -> dict[str, float]:
    from fsm.testing.fault_server import FaultServer

    error_body = {"error": {"message": "The service is temporarily unavailable.",
                            "type": "server_error", "code": "service_unavailable"}}
    script = [{"status": 503, "json": error_body} for _ in range(trials + 2)]
    with tempfile.TemporaryDirectory() as tmp, FaultServer(script) as server:
        settings = os.path.join(tmp, "settings.json")
        with open(settings, "w") as fh:
            json.dump({"retry": {"enabled": True, "maxRetries": 3, "baseDelayMs": 60_000}}, fh)
        p = Pipe(_rpc_argv(server.base_url, settings))
        try:
            p.send({"type": "get_state", "id": "ready"})
            p.until(lambda o: o.get("type") == "response")
            runs, state_runs = [], []
            for k in range(trials + 1):
                p.send({"type": "prompt", "message": f"trial {k}", "id": f"p{k}"})
                p.until(lambda o: o.get("type") == "auto_retry_start", 60)
                time.sleep(0.02)
                t0 = now_ns()
                os.write(p.win, b'{"type":"get_state","id":"s"}\n')
                p.until(lambda o: o.get("command") == "get_state", 10)
                if k:
                    state_runs.append((now_ns() - t0) / 1e6)
                time.sleep(0.02)
                t0 = now_ns()
                os.write(p.win, b'{"type":"abort_retry"}\n')
                end = p.until(lambda o: o.get("type") == "auto_retry_end", 10)
                t1 = now_ns()
                if end.get("success") is not False:
                    raise AssertionError(f"abort_retry ended the chain with {end}")
                if k:  # the first trial also pays for the SDK's first request: a warm-up
                    runs.append((t1 - t0) / 1e6)
                p.until(lambda o: o.get("type") == "response" and o.get("command") == "abort_retry")
        finally:
            p.close()

    echo = Pipe([sys.executable, "-c", _ECHO])
    try:
        echo_runs = []
        for _ in range(max(trials, 20)):
            time.sleep(0.002)
            t0 = now_ns()
            os.write(echo.win, b'{"type":"abort_retry"}\n')
            echo.line()
            echo_runs.append((now_ns() - t0) / 1e6)
    finally:
        echo.close()
    return {
        "rpc_abort_retry_to_end_ms": statistics.median(runs),
        "rpc_abort_retry_to_end_p90_ms": percentile(runs, 90),
        "rpc_abort_retry_to_end_max_ms": max(runs),
        "rpc_get_state_roundtrip_ms": statistics.median(state_runs),
        "pipe_echo_ms": statistics.median(echo_runs),
    }


def measure(*, starts: int = 7, trials: int = 30, eof_starts: int = 20) -> dict[str, float]:
    """The figures of this group (ms, and counts of process exits)."""
    out = ready(starts)
    statuses = eof_probe(eof_starts)
    out["rpc_unclean_exits"] += sum(1 for s in statuses if s != 0)
    out["rpc_exits"] += len(statuses)
    out.update(abort_to_end(trials))
    return out
