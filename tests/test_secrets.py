"""No credential appears in any file, event or log after a run with a
malformed key (a trailing CR, a space, an embedded LF from --api-key or OPENAI_API_KEY)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fsm.commands.common import check_configured_api_key
from fsm.core.text import ApiKeyError
from support import env

pytestmark = pytest.mark.subprocess

KEY = "sk-proj-Leak0123456789abcdefGHIJ"


def files_containing(folder: Path, needle: bytes) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.mark.parametrize("bad", [KEY + "\r", KEY + " ", KEY[:12] + "\n" + KEY[12:]])
@pytest.mark.parametrize("via", ["--api-key", "OPENAI_API_KEY"])
def test_rpc_refuses_a_malformed_key_without_echoing_it(tmp_path, bad, via):
    """The process refuses to start (status 2), names the source, and leaves no trace of the key."""
    child_env = env()
    child_env.pop("OPENAI_API_KEY", None)
    args = [sys.executable, "-m", "fsm", "rpc", "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
            "--trace", str(tmp_path / "trace.jsonl")]
    if via == "--api-key":
        args += ["--api-key", bad]
    else:
        child_env["OPENAI_API_KEY"] = bad
    proc = subprocess.run(args, cwd=tmp_path, env=child_env, input=b'{"type": "prompt", "message": "hi"}\n',
                          capture_output=True, timeout=60)
    assert proc.returncode == 2, proc.stderr[-500:]
    assert proc.stdout == b""
    assert proc.stderr.startswith(f"fsm rpc: {via}: the API key ".encode()), proc.stderr[-500:]
    for fragment in (KEY[:12].encode(), KEY[12:].encode()):
        assert fragment not in proc.stderr
        assert files_containing(tmp_path, fragment) == []


def test_a_good_key_and_an_empty_variable_pass_the_start_up_check():
    """A good key and an empty variable pass the start up check."""
    check_configured_api_key(None, environ={"OPENAI_API_KEY": KEY})
    check_configured_api_key(None, environ={"OPENAI_API_KEY": ""})
    check_configured_api_key(KEY, environ={"OPENAI_API_KEY": KEY + "\r"})  # the flag wins
    with pytest.raises(ApiKeyError, match="^MY_KEY: the API key ends with a tab"):
        check_configured_api_key(None, env_name="MY_KEY", environ={"MY_KEY": KEY + "\t"})


async def run_with_an_echoing_provider(tmp_path):
    """A provider that quotes the key in its 401 (OpenAI does, masked; proxies do, whole)."""
    from fsm.testing.fault_server import FaultServer
    from fsm.rpc import RpcClient
    echo = {"status": 401, "json": {"error": {"message": f"Incorrect API key provided: {KEY}.",
                                              "type": "invalid_request_error", "code": "invalid_api_key"}}}
    child_env = env()
    child_env["OPENAI_API_KEY"] = KEY
    with FaultServer([echo]) as fs:
        client = RpcClient(["--base-url", fs.base_url, "--model", "m", "--log-level", "DEBUG",
                            "--session-file", str(tmp_path / "s-{id}.jsonl"),
                            "--trace", str(tmp_path / "trace.jsonl")],
                           env=child_env, cwd=tmp_path, record=True, timeout_s=120)
        await client.start()
        try:
            await client.prompt("hi")
            await client.wait_for_idle(timeout_s=120)
        finally:
            await client.close()
        assert fs.chat_requests[0]["headers"]["authorization"] == f"Bearer {KEY}"  # it was used
    return client


@pytest.fixture(scope="module")
def echoed(tmp_path_factory):
    """One run against the echoing provider, read by the two tests below: (the client, after
    its server exited; the folder of its session log and trace)."""
    import asyncio
    folder = tmp_path_factory.mktemp("echo")
    return asyncio.run(run_with_an_echoing_provider(folder)), folder


def test_a_key_echoed_by_the_provider_reaches_no_file(echoed):
    """A key echoed by the provider reaches no file."""
    _, folder = echoed
    assert list(folder.glob("s-*.jsonl")), "the session log was written"
    assert files_containing(folder, KEY.encode()) == []


def test_a_key_echoed_by_the_provider_reaches_no_event_or_log(echoed):
    """A key echoed by the provider reaches no event or log."""
    import json
    client, _ = echoed
    assert KEY not in json.dumps(client.received)
    assert KEY not in client.stderr_tail


def test_chat_refuses_a_malformed_key_without_echoing_it(monkeypatch, capsys):
    """Chat refuses a malformed key without echoing it."""
    from fsm.__main__ import main
    monkeypatch.setattr("sys.stdin.isatty", lambda: True, raising=False)
    monkeypatch.setattr("sys.stdout.isatty", lambda: True, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", KEY + "\r")
    assert main(["chat", "--model", "m"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("chat: OPENAI_API_KEY: the API key ends with a carriage return") and KEY[8:] not in err


@pytest.mark.subprocess
@pytest.mark.parametrize("key", ["AIzaSyD-SECRETkey1234567890", "gsk_SECRET0123456789abcdef"])
def test_rpc_scrubs_the_configured_key_of_any_shape_from_every_field(tmp_path, key):
    """Attack report: a key not shaped like sk-… echoed in a 401's message and in its error
    type/code reached stdout and the session log over RPC."""
    import json as _json

    from fsm.testing.fault_server import FaultServer
    from support import ROOT
    body = {"error": {"message": f"Incorrect API key provided: {key}.", "type": key, "code": key}}
    with FaultServer([{"status": 401, "json": body}]) as server:
        proc = subprocess.run(
            [sys.executable, "-m", "fsm", "rpc", "--base-url", server.base_url, "--model", "m",
             "--api-key", key, "--session-dir", str(tmp_path / "sessions")],
            input=_json.dumps({"type": "prompt", "message": "hi"}) + "\n"
            + _json.dumps({"type": "get_messages"}) + "\n",
            cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60)
    assert '"message_end"' in proc.stdout
    assert key not in proc.stdout and key not in proc.stderr
    assert files_containing(tmp_path, key.encode()) == []
