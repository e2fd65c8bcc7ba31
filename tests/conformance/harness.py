"""Runs a conformance scenario through pi's own ``RpcClient`` against an RPC server.

pi (npm package ``@mariozechner/pi-coding-agent``, :data:`PI_VERSION`) is installed from the npm
registry into :data:`CACHE` (outside the checkout) on first use; ``node`` and ``npm`` must be
on the PATH (``make test`` installs them through the system package manager when missing).

Each run starts the project's fault server (:class:`fsm.testing.fault_server.FaultServer`, in
this process) with the scenario's script, then ``node driver.mjs SCENARIO`` with the client
pointed at one of two servers:

- ``"fsm"``: ``shim.mjs`` as the client's ``cliPath``; it ignores the flags the client adds
  (``--mode rpc --provider P --model M``) and runs ``python -m fsm rpc`` with ours;
- ``"pi"``: pi's own ``dist/cli.js --mode rpc``, configured through ``models.json`` and
  ``settings.json`` in its agent folder (``PI_CODING_AGENT_DIR``).

:func:`normalize` reduces what the client saw to what is compared (no timings, ids or
timestamps). ``python tests/conformance/harness.py record`` re-records ``expected/`` from pi.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PI_PACKAGE = "@mariozechner/pi-coding-agent"
PI_VERSION = "0.73.1"
CACHE = Path(os.environ.get("RETRY_FSM_NPM_CACHE",
                            Path.home() / ".cache" / "retry-fsm" / "npm" / PI_VERSION))
PI_DIR = CACHE / "node_modules" / "@mariozechner" / "pi-coding-agent"
RPC_CLIENT = PI_DIR / "dist" / "modes" / "rpc" / "rpc-client.js"
PI_CLI = PI_DIR / "dist" / "cli.js"
PROVIDER = "local"
MODEL = "conformance-model"
API_KEY = "conformance-key"
CONTEXT_WINDOW = 32768

_install_lock = threading.Lock()


def install_pi() -> Path:
    """pi's package in :data:`CACHE` (installed with npm when missing); its ``rpc-client.js``.

    Raises ``RuntimeError`` saying what is missing (node, npm) or how the install failed.
    """
    if RPC_CLIENT.is_file() and PI_CLI.is_file():
        return RPC_CLIENT
    CACHE.mkdir(parents=True, exist_ok=True)
    # One install at a time, across the test workers (each is its own process) too.
    with _install_lock, open(CACHE / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if RPC_CLIENT.is_file() and PI_CLI.is_file():
            return RPC_CLIENT
        for tool in ("node", "npm"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} is not on the PATH: install Node.js (make test does, "
                                   "through the system package manager)")
        proc = subprocess.run(
            ["npm", "install", "--prefix", str(CACHE), "--no-audit", "--no-fund", "--no-save",
             "--loglevel", "error", f"{PI_PACKAGE}@{PI_VERSION}"],
            capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 or not RPC_CLIENT.is_file():
            raise RuntimeError(f"npm install {PI_PACKAGE}@{PI_VERSION} into {CACHE} failed "
                               f"(status {proc.returncode}): {proc.stderr[-2000:]}")
        return RPC_CLIENT


def load_scenario(name: str) -> dict[str, Any]:
    return json.loads((HERE / "scenarios" / f"{name}.json").read_text(encoding="utf-8"))


def scenario_names(*, fsm_only: bool = False) -> list[str]:
    """The scenarios compared with pi (or, with ``fsm_only``, those pi cannot run)."""
    return sorted(p.stem for p in (HERE / "scenarios").glob("*.json")
                  if bool(load_scenario(p.stem).get("fsm_only")) == fsm_only)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


class _FaultServer:
    """The project's fault server (:class:`fsm.testing.fault_server.FaultServer`, in this
    process's threads: what it serves is the subject, not its command line) with a script."""

    def __init__(self, script: list[dict[str, Any]]) -> None:
        from fsm.testing.fault_server import FaultServer

        self.server = FaultServer(script, model=MODEL).start()
        self.base_url = self.server.base_url

    def stop(self) -> list[dict[str, Any]]:
        """Stop it; the requests it answered (one record each, as ``--verbose`` logs them:
        without bodies and headers)."""
        self.server.stop()
        return [{k: v for k, v in rec.items() if k not in ("body", "headers")}
                for rec in self.server.requests if rec["end_ms"] is not None]


def run(name: str, impl: str, *, timeout_s: float = 300.0) -> dict[str, Any]:
    """Play scenario ``name`` against ``impl`` (``"fsm"`` or ``"pi"``).

    Returns ``{"records": [driver lines], "requests": [the fault server's records of the
    requests it answered], "stderr": str, "status": the driver's exit status}``.
    """
    client_js = install_pi()
    scenario = load_scenario(name)
    with tempfile.TemporaryDirectory(prefix=f"conformance-{name}-{impl}-") as tmp:
        work = Path(tmp)
        (work / "cwd").mkdir()
        settings = work / "settings.json"
        settings.write_text(json.dumps(scenario["settings"]), encoding="utf-8")
        server = _FaultServer(scenario["script"])
        try:
            if impl == "fsm":
                options = {
                    "cliPath": str(HERE / "shim.mjs"), "provider": PROVIDER, "model": MODEL,
                    "cwd": str(work / "cwd"),
                    "env": {"FSM_PYTHON": sys.executable, "FSM_RPC_ARGS": json.dumps([
                        "--base-url", server.base_url, "--model", MODEL, "--provider", PROVIDER,
                        "--api-key", API_KEY, "--settings", str(settings),
                        "--context-window", str(CONTEXT_WINDOW), "--no-session"])},
                }
            elif impl == "pi":
                agent = work / "agent"
                agent.mkdir()
                model = {"id": MODEL, "name": MODEL, "contextWindow": CONTEXT_WINDOW,
                         "maxTokens": 1024, "reasoning": False, "input": ["text"]}
                (agent / "models.json").write_text(json.dumps({"providers": {PROVIDER: {
                    "baseUrl": server.base_url, "api": "openai-completions", "apiKey": API_KEY,
                    "models": [model]}}}), encoding="utf-8")
                shutil.copy(settings, agent / "settings.json")
                options = {
                    "cliPath": str(PI_CLI), "provider": PROVIDER, "model": MODEL,
                    "cwd": str(work / "cwd"), "env": {"PI_CODING_AGENT_DIR": str(agent)},
                    "args": ["--no-session", "--offline", "--no-tools", "--no-extensions",
                             "--no-skills", "--no-prompt-templates", "--no-themes",
                             "--no-context-files"],
                }
            else:
                raise ValueError(f"impl must be 'fsm' or 'pi', got {impl!r}")
            env = _child_env()
            env.update(PI_RPC_CLIENT=str(client_js), DRIVER_CLIENT=json.dumps(options))
            proc = subprocess.run(["node", str(HERE / "driver.mjs"), str(HERE / "scenarios" / f"{name}.json")],
                                  capture_output=True, text=True, env=env, cwd=work,
                                  timeout=timeout_s)
        finally:
            requests = server.stop()
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {"records": records, "requests": requests, "stderr": proc.stderr,
            "status": proc.returncode}


# ---------------------------------------------------------------------------------- compare
def _text(message: dict[str, Any]) -> str:
    return "".join(c.get("text", "") for c in message.get("content") or () if isinstance(c, dict))


def _message(message: dict[str, Any]) -> dict[str, Any]:
    out = {"role": message.get("role")}
    if message.get("role") == "assistant":
        out["stopReason"] = message.get("stopReason")
        if "errorMessage" in message:
            out["errorMessage"] = message["errorMessage"]
    out["text"] = _text(message)
    return out


def _type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object", type(None): "null"}[type(value)]


RETRY_START_KEYS = ("attempt", "maxAttempts", "delayMs", "errorMessage")
RETRY_END_KEYS = ("success", "attempt", "finalError")
STATE_VALUES = ("isStreaming", "isCompacting", "messageCount", "pendingMessageCount",
                "thinkingLevel")


def state_shape(state: dict[str, Any]) -> dict[str, Any]:
    """A ``get_state`` answer as compared: each key's JSON type (``model``'s keys too) and the
    values that must agree."""
    shape: dict[str, Any] = {"types": {k: _type_of(v) for k, v in state.items()}}
    model = state.get("model")
    if isinstance(model, dict):
        shape["model"] = {"id": model.get("id"), "provider": model.get("provider"),
                          "types": {k: _type_of(v) for k, v in model.items()}}
    shape["values"] = {k: state[k] for k in STATE_VALUES if k in state}
    return shape


def normalize(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """What the client saw, without timings, ids and timestamps: ``{"events": [...], "calls":
    [...]}``, each in order (a call's place among the events depends on timing only).

    Events: the agent/turn/message lifecycle with roles, stop reasons, error text and message
    text; ``message_update`` with its ``assistantMessageEvent`` type, ``contentIndex`` and
    delta, and whether the partial ``message`` came along; the retry events with the fields
    they have in pi (extra fields are left out). Calls: method, ok or the error; ``getState``
    as :func:`state_shape`, ``getMessages`` as role/stopReason/text per message.
    """
    out: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for rec in records:
        if rec["kind"] == "event":
            e = rec["event"]
            kind = e.get("type")
            if kind in ("agent_start", "turn_start"):
                out.append({"type": kind})
            elif kind == "message_start":
                # The whole message as it starts (its stop reason is not settled yet).
                message = e.get("message") or {}
                out.append({"type": kind, "role": message.get("role"),
                            "hasContent": isinstance(message.get("content"), list),
                            "hasTimestamp": isinstance(message.get("timestamp"), (int, float))})
            elif kind == "message_end":
                out.append({"type": kind, **_message(e.get("message") or {})})
            elif kind == "message_update":
                ame = e.get("assistantMessageEvent") or {}
                item = {"type": kind, "event": ame.get("type"), "contentIndex": ame.get("contentIndex"),
                        "hasMessage": isinstance(e.get("message"), dict)}
                if "delta" in ame:
                    item["delta"] = ame["delta"]
                out.append(item)
            elif kind == "turn_end":
                out.append({"type": kind, **_message(e.get("message") or {})})
            elif kind == "agent_end":
                out.append({"type": kind, "messages": [_message(m) for m in e.get("messages") or ()]})
            elif kind == "auto_retry_start":
                out.append({"type": kind, **{k: e[k] for k in RETRY_START_KEYS if k in e}})
            elif kind == "auto_retry_end":
                out.append({"type": kind, **{k: e[k] for k in RETRY_END_KEYS if k in e}})
            # queue_update and other event types differ in shape and are not compared
        elif rec["kind"] == "call":
            item = {"call": rec["method"], "label": rec["label"], "ok": rec["ok"]}
            if not rec["ok"]:
                item["error"] = rec["error"]
            elif rec["method"] == "getState":
                item["state"] = state_shape(rec["value"])
            elif rec["method"] == "getMessages":
                item["messages"] = [_message(m) for m in rec["value"]]
            calls.append(item)
        elif rec["kind"] == "fail":
            calls.append({"fail": rec["error"].splitlines()[0]})
    return {"events": out, "calls": calls}


def record(names: list[str]) -> None:
    """Write ``expected/<name>.json`` from pi's run of each scenario (keeps a ``fsm`` entry)."""
    for name in names:
        result = run(name, "pi")
        path = HERE / "expected" / f"{name}.json"
        old = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        old["pi"] = {"requests": len(result["requests"]), **normalize(result["records"])}
        path.write_text(json.dumps(old, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"recorded {path.relative_to(ROOT)}: {len(result['records'])} lines, "
              f"{len(result['requests'])} requests")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # this checkout's fsm (the fault server runs in this process)
    if sys.argv[1:2] != ["record"]:
        sys.exit("usage: python tests/conformance/harness.py record [SCENARIO ...]")
    record(sys.argv[2:] or scenario_names())
