"""Command-line inputs that must be refused at once and cleanly (docs/reliability.md, item 9):
a FIFO or a device for any file a command reads, a refused start that prints one line and
leaves nothing behind, and the credential store's lock file when root runs it on a user's
store."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from support import env

pytestmark = pytest.mark.subprocess


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def run_fsm(args: list[str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fsm", *args], cwd=cwd, env=env(), input="",
                          capture_output=True, text=True, timeout=timeout)


def leftovers(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


READERS = [
    ["fault-server", "--script", "{p}"],
    ["demo", "--script", "{p}"],
    ["demo", "--settings", "{p}"],
    ["rpc", "--model", "m", "--settings", "{p}"],
    ["rpc", "--model", "m", "--credentials", "{p}"],
    ["classify", "--jsonl", "{p}"],
    ["audit", "{p}"],
    ["diagrams", "--diff", "{p}", "--no-svg"],
]


@pytest.mark.parametrize("source", ["fifo", "/dev/zero"])
@pytest.mark.parametrize("argv", READERS, ids=lambda a: " ".join(a[:2]))
def test_every_file_reader_refuses_a_fifo_or_a_device_at_once(tmp_path, fifo, source, argv):
    """A FIFO blocked fault-server, demo, classify, audit and diagrams; /dev/zero filled memory."""
    path = str(fifo) if source == "fifo" else source
    work = tmp_path / "work"
    work.mkdir()
    proc = run_fsm([a.replace("{p}", path) for a in argv], work)
    assert proc.returncode in (1, 2), proc.stderr[-500:]
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert leftovers(work) == []


@pytest.mark.parametrize("argv", [
    ["rpc", "--model", "m", "--trace", "{dir}"],
    ["rpc", "--model", "m", "--trace", "{fifo}"],
    ["rpc", "--model", "m", "--session-file", "/dev/zero"],
    ["demo", "--trace", "{dir}"],
    ["demo", "--out", "{fifo}"],
    ["demo", "--out", "/dev/zero"],
], ids=lambda a: " ".join(a[-2:]).replace("/", "_"))
def test_a_refused_start_prints_one_line_and_leaves_no_file(tmp_path, fifo, argv):
    """A bad --trace left the session log behind (rpc, demo); demo printed a traceback."""
    work = tmp_path / "work"
    (tmp_path / "adir").mkdir()
    work.mkdir()
    args = [a.replace("{dir}", str(tmp_path / "adir")).replace("{fifo}", str(fifo)) for a in argv]
    if args[0] == "rpc":
        proc = subprocess.run([sys.executable, "-m", "fsm", *args], cwd=work, env=env(),
                              input=json.dumps({"type": "get_state"}) + "\n",
                              capture_output=True, text=True, timeout=60)
    else:
        proc = run_fsm(args, work)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-800:])
    assert "Traceback" not in proc.stderr
    assert [line for line in proc.stderr.splitlines() if "cannot" in line or "not a" in line], proc.stderr
    assert leftovers(work) == [], proc.stderr


def test_the_readers_refuse_a_folder_a_fifo_and_a_file_over_the_bound(tmp_path, fifo):
    """open_input / read_input: InputFileError naming the file and what it is."""
    from fsm.commands.common import InputFileError, open_input, read_input
    with pytest.raises(InputFileError, match="is a FIFO"):
        open_input(fifo, what="script")
    with pytest.raises(InputFileError, match="is a character device"):
        read_input("/dev/zero", what="script")
    with pytest.raises(InputFileError, match="is a folder"):
        read_input(tmp_path, what="script")
    big = tmp_path / "big"
    big.write_bytes(b"x" * 2000)
    with pytest.raises(InputFileError, match="larger than 1000 bytes"):
        read_input(big, limit_bytes=1000)
    assert read_input(big) == b"x" * 2000


def test_root_on_a_users_store_leaves_a_lock_file_the_user_can_open(tmp_path):
    """The lock file root created was root's, mode 0600: the store's user could never lock it
    again. Its owner (as root) and its permission bits (always) now follow the store file."""
    from fsm.host.credentials import CredentialFileError, JsonFileCredentialStore
    folder = tmp_path / "home"
    folder.mkdir()
    store = folder / "credentials.json"
    store.write_text(json.dumps({"providers": {"openai": {"keys": ["sk-user-key-0123456789abcdef"]}}}))
    os.chmod(store, 0o660)  # shared with the user's group
    if os.geteuid() == 0:
        os.chown(folder, 4242, 4242)
        os.chown(store, 4242, 4242)
        with pytest.raises(CredentialFileError, match="owned by another user"):
            JsonFileCredentialStore(store).api_key("openai", "s1")
        owner = (4242, 4242)
    else:
        JsonFileCredentialStore(store).api_key("openai", "s1")
        owner = (os.geteuid(), os.getegid())
    lock = os.stat(folder / "credentials.json.lock")
    assert (lock.st_uid, lock.st_gid) == owner
    assert stat.S_IMODE(lock.st_mode) == 0o660
