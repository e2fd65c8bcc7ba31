"""``rpc`` and ``chat`` with ``--api X`` whose SDK is not installed refuse at start (exit 2),
naming the extra and the install line, instead of starting and failing every turn."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support import env

pytestmark = pytest.mark.subprocess

# Run ``python -m fsm ARGS`` with the package PACKAGE made unimportable, as when its extra is
# not installed (``sys.modules[name] = None`` makes ``import name`` raise ImportError).
WITHOUT = ("import sys; sys.modules[sys.argv[1]] = None; from fsm.__main__ import main; "
           "sys.exit(main(sys.argv[2:]))")


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_rpc_refuses_an_api_whose_sdk_is_not_installed(api, tmp_path):
    """rpc --api X without X's SDK: exit 2 before serving, the extra's install line on stderr."""
    proc = subprocess.run(
        [sys.executable, "-c", WITHOUT, api, "rpc", "--api", api, "--model", "m", "--no-session"],
        input='{"type": "get_state", "id": "1"}\n', capture_output=True, text=True,
        env=env(), cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""  # nothing served
    assert f"--api {api} needs the package '{api}', which is not installed" in proc.stderr
    assert f"pip install 'retry-fsm[{api}]'" in proc.stderr


def test_chat_refuses_an_api_whose_sdk_is_not_installed(monkeypatch, capsys, tmp_path):
    """chat --api anthropic without anthropic: exit 2 with the install line, no screen."""
    from fsm.__main__ import main
    monkeypatch.setitem(sys.modules, "anthropic", None)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["chat", "--api", "anthropic", "--model", "m", "--no-session"]) == 2
    err = capsys.readouterr().err
    assert "--api anthropic needs the package 'anthropic'" in err
    assert "pip install 'retry-fsm[anthropic]'" in err


def test_rpc_starts_when_the_sdk_is_installed(tmp_path):
    """The check refuses only a missing SDK: with anthropic installed, get_state is served."""
    proc = subprocess.run(
        [sys.executable, "-m", "fsm", "rpc", "--api", "anthropic", "--model", "m", "--no-session"],
        input='{"type": "get_state", "id": "1"}\n', capture_output=True, text=True,
        env=env(), cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert '"command":"get_state","success":true' in proc.stdout


def test_a_redis_password_with_an_unencoded_hash_is_not_printed_even_in_part():
    """``--redis redis://default:s3cr3t#Passw0rd@host``: the URL parser splits the password at
    '#' and names a fragment in its error; the start-up error shows no piece of it, and says
    to percent-encode (exit 2)."""
    import subprocess
    import sys

    from support import ROOT, env

    done = subprocess.run(
        [sys.executable, "-m", "fsm", "rpc", "--model", "m", "--base-url", "http://127.0.0.1:9",
         "--api-key", "sk-test", "--no-session",
         "--redis", "redis://default:s3cr3t#Passw0rd@127.0.0.1:6391/0"],
        cwd=ROOT, env=env(), input="", capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "bad --redis" in done.stderr and "percent-encoded" in done.stderr
    assert "s3cr3t" not in done.stderr and "Passw0rd" not in done.stderr
