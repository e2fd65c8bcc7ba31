"""Command-line options and outputs refused cleanly (docs/reliability.md, "Command line"): a bad
``--base-url`` or ``--redis`` URL, a credential store that must not be created when another
option is refused, and ``simulate --json`` outputs that cannot be written — each one line on
stderr, exit status 2, no traceback, nothing left behind, and checked before the work starts
where it can be."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fsm.commands import common
from support import env

pytestmark = pytest.mark.subprocess


def run_fsm(args: list[str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fsm", *args], cwd=cwd, env=env(),
                          input=json.dumps({"type": "get_state"}) + "\n", capture_output=True,
                          text=True, timeout=timeout)


def one_line_exit_2(proc: subprocess.CompletedProcess) -> str:
    """The one stderr line of a refused command (asserted: status 2, no traceback)."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-800:])
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize("command", ["rpc"])  # chat shares load_host_options (needs a TTY first)
@pytest.mark.parametrize("option, words", [
    (["--base-url", "http://[::1"], "Invalid IPv6 URL"),
    (["--base-url", "http://fleetuser:s3cret-pw@host:99999/v1"], "Port out of range"),
    (["--base-url", "ftp://host/v1"], "http:// or https://"),
    (["--redis", "redis://host/abc"], "database must be a whole number"),
    (["--redis", "redis://fleetuser:s3cret-pw@host:6379/x1"], "database must be a whole number"),
    (["--redis", "redis://host:6379/1?db=two"], "database must be a whole number"),
    (["--redis", "redis://host:70000/0"], "Port out of range"),
], ids=lambda v: v[-1] if isinstance(v, list) else None)
def test_a_bad_url_is_one_line_and_exit_2(tmp_path, command, option, words):
    """`--base-url http://[::1` ended in a ValueError traceback; `--redis redis://host/abc` was
    accepted (redis-py quietly used database 0). The password stays hidden."""
    proc = run_fsm([command, "--model", "m", "--no-session", *option], tmp_path)
    line = one_line_exit_2(proc)
    assert words in line and "s3cret-pw" not in line
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("command", ["rpc"])
@pytest.mark.parametrize("option", [["--redis", "http://x"], ["--redis", "redis://host/abc"],
                                    ["--base-url", "http://[::1"]], ids=lambda v: v[-1])
def test_a_refused_option_creates_no_credential_store(tmp_path, command, option):
    """`--credentials NEW.json --redis http://x` left NEW.json and NEW.json.lock behind: the
    store (which creates its file and lock) now comes after every other option's check."""
    proc = run_fsm([command, "--model", "m", "--no-session", "--credentials", "NEW.json", *option], tmp_path)
    one_line_exit_2(proc)
    assert os.listdir(tmp_path) == []


def test_the_host_options_check_every_url_before_creating_the_store(tmp_path):
    """load_host_options (rpc and chat): a bad --redis or --base-url is a StartupError naming
    it, and the --credentials store is not created."""
    import argparse
    base = dict(api_key=None, settings=None, credentials=str(tmp_path / "NEW.json"), redis=None,
                base_url=None)
    for bad in [{"redis": "http://x"}, {"redis": "redis://h/abc"}, {"base_url": "http://[::1"}]:
        with pytest.raises(common.StartupError, match="--redis|--base-url"):
            common.load_host_options(argparse.Namespace(**{**base, **bad}), prog="chat")
        assert os.listdir(tmp_path) == []


def test_a_good_redis_url_passes_the_check():
    """redis, rediss and unix URLs with a whole-number database (path or ?db=) are accepted."""
    from fsm.fleet._redis import check_url
    for url in ["redis://127.0.0.1:6379/0", "redis://h", "redis://h/", "rediss://u:p@h:1/15",
                "unix:///tmp/r.sock?db=3", "redis://h:6379/2?db=2"]:
        assert check_url(url) == url


SIMULATE = ["simulate", "--sessions", "20", "--scenario", "transient500", "--policy", "seed"]


@pytest.mark.parametrize("target, words", [
    ("/dev/full", "is a character device"), ("{fifo}", "is a FIFO"), ("{dir}", "is a folder"),
    ("{missing}/out.json", "does not exist"),
], ids=["dev_full", "fifo", "folder", "missing_folder"])
def test_simulate_refuses_an_output_it_cannot_write_before_running(tmp_path, target, words):
    """`simulate --json /dev/full` ran the whole simulation and then raised ENOSPC; `--json FIFO`
    without a reader blocked forever. Both are refused before the run (no table printed)."""
    work = tmp_path / "work"
    work.mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "adir").mkdir()
    path = target.format(fifo=tmp_path / "fifo", dir=tmp_path / "adir", missing=tmp_path / "nope")
    proc = run_fsm([*SIMULATE, "--json", path], work, timeout=30)
    assert words in one_line_exit_2(proc) and proc.stdout == ""
    assert os.listdir(work) == [] and sorted(os.listdir(tmp_path / "adir")) == []


def test_simulate_reports_a_write_error_after_the_run_in_one_line_and_leaves_no_file(
        tmp_path, monkeypatch, capsys):
    """A full disk found only when the figures are written (ENOSPC): one line, exit 2, and
    neither the file nor a temporary one is left."""
    from fsm.__main__ import main

    real_fdopen = os.fdopen

    class Full:
        def __init__(self, fd):
            self.fh = real_fdopen(fd, "w")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(common.os, "fdopen", lambda fd, *a, **k: Full(fd))
    out = tmp_path / "out.json"
    assert main([*SIMULATE, "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"fsm simulate: cannot write --json {out}: No space left on device"]
    assert os.listdir(tmp_path) == []


def test_an_output_file_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """write_output_file: the text lands whole (with a new file's mode); a failed write keeps
    the older file as it was and leaves no temporary file."""
    path = tmp_path / "figures.json"
    common.write_output_file(path, "first\n")
    assert path.read_text() == "first\n"
    umask = os.umask(0)
    os.umask(umask)
    assert (path.stat().st_mode & 0o777) == 0o666 & ~umask
    monkeypatch.setattr(common.os, "replace", lambda *a: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(OSError, match="I/O error"):
        common.write_output_file(path, "second\n")
    assert path.read_text() == "first\n" and os.listdir(tmp_path) == ["figures.json"]
