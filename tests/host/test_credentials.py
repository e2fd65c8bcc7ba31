import json
import multiprocessing
import os

import pytest

from fsm.host.credentials import DEFAULT_BLOCK_MS, InMemoryCredentialStore, JsonFileCredentialStore

NOW = 1_700_000_000_000


class Clock:
    def __init__(self):
        self.now = NOW

    def __call__(self):
        return self.now


@pytest.fixture(params=["memory", "file"])
def make_store(request, tmp_path):
    def make(credentials, clock):
        if request.param == "memory":
            return InMemoryCredentialStore(credentials, clock=clock)
        return JsonFileCredentialStore(tmp_path / "creds.json", credentials, clock=clock)
    return make


def test_switches_to_the_next_unblocked_key(make_store):
    """Switches to the next unblocked key."""
    clock = Clock()
    store = make_store({"p": ["a", "b", "c"]}, clock)
    assert store.api_key("p", "s") == "a"
    assert store.mark_usage_limit_reached("p", "s", 5000) is True
    assert store.api_key("p", "s") == "b"
    assert store.blocked_until("p") == {"a": NOW + 5000}


def test_without_hint_blocks_for_a_minute(make_store):
    """Without hint blocks for a minute."""
    clock = Clock()
    store = make_store({"p": ["a", "b"]}, clock)
    store.api_key("p", "s")
    store.mark_usage_limit_reached("p", "s", None)
    assert store.blocked_until("p")["a"] == NOW + DEFAULT_BLOCK_MS


def test_all_blocked_answers_false_until_one_unblocks(make_store):
    """All blocked answers false until one unblocks."""
    clock = Clock()
    store = make_store({"p": ["a", "b"]}, clock)
    store.api_key("p", "s")
    assert store.mark_usage_limit_reached("p", "s", 1000) is True      # a blocked, b in use
    assert store.mark_usage_limit_reached("p", "s", 1000) is False     # b blocked, a still blocked
    clock.now += 1000
    assert store.mark_usage_limit_reached("p", "s", 1000) is True      # a is free again


def test_second_session_follows_the_first_switch(make_store):
    """Second session follows the first switch."""
    clock = Clock()
    store = make_store({"p": ["a", "b"]}, clock)
    assert store.api_key("p", "s1") == store.api_key("p", "s2") == "a"
    assert store.mark_usage_limit_reached("p", "s1", 1000) is True
    assert store.mark_usage_limit_reached("p", "s2", 1000) is True    # follows to b, b not blocked
    assert store.api_key("p", "s2") == "b"
    assert "b" not in store.blocked_until("p")


def test_unknown_provider(make_store):
    """Unknown provider."""
    store = make_store({"p": ["a"]}, Clock())
    assert store.api_key("q", "s") is None
    assert store.mark_usage_limit_reached("q", "s", 10) is False


@pytest.mark.parametrize("bad", [{"p": []}, {"p": "abc"}, {"": ["a"]}, {"p": [""]}, ["a"]])
def test_bad_credentials_are_rejected(bad):
    """Bad credentials are rejected."""
    with pytest.raises((ValueError, TypeError)):
        InMemoryCredentialStore(bad)


def test_file_store_survives_a_restart(tmp_path):
    """File store survives a restart."""
    clock = Clock()
    path = tmp_path / "creds.json"
    store = JsonFileCredentialStore(path, {"p": ["a", "b"]}, clock=clock)
    store.api_key("p", "s")
    store.mark_usage_limit_reached("p", "s", 9000)
    again = JsonFileCredentialStore(path, clock=clock)
    assert again.api_key("p", "s") == "b"
    assert again.blocked_until("p") == {"a": NOW + 9000}
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"


def test_file_store_refuses_a_corrupt_file(tmp_path):
    """File store refuses a corrupt file."""
    path = tmp_path / "creds.json"
    path.write_text("{oops")
    with pytest.raises(ValueError, match="creds.json"):
        JsonFileCredentialStore(path, {"p": ["a"]})
    path.write_text(json.dumps({"providers": []}))
    with pytest.raises(ValueError, match="providers"):
        JsonFileCredentialStore(path)


def _hammer(path, session, n):
    store = JsonFileCredentialStore(path)
    for i in range(n):
        store.api_key("p", f"{session}-{i}")


def test_file_store_is_safe_against_concurrent_writers(tmp_path):
    """File store is safe against concurrent writers."""
    path = tmp_path / "creds.json"
    JsonFileCredentialStore(path, {"p": ["a", "b"]})
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_hammer, args=(path, w, 25)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    sessions = json.loads(path.read_text())["providers"]["p"]["sessions"]
    assert len(sessions) == 100, "an update was lost"


# ------------------------------------------------------------------- credentials
import asyncio
import subprocess
import sys
import time

from fsm.host.credentials import (IDLE_GRACE_MS, CredentialFileError, CredentialLockTimeout)

GOOD = {"p": ["key-aaaaaaaa", "key-bbbbbbbb"]}


def write_store(path, entry):
    path.write_text(json.dumps({"providers": {"p": entry}}))
    os.chmod(path, 0o600)


@pytest.mark.parametrize("entry, words", [
    ({"keys": "abc"}, "providers['p'].keys must be a non-empty list of keys, got str"),
    ({"keys": [1, 2]}, "providers['p'].keys[0]: the API key must be text, got int"),
    ({"keys": ["", ""]}, "providers['p'].keys[0]: the API key is empty"),
    ({"keys": []}, "keys must be a non-empty list of keys, got an empty list"),
    ({"keys": ["good-key-1", "bad key\r"]}, "providers['p'].keys[1]: the API key ends with a carriage return"),
    ({"keys": ["key-aaaaaaaa"], "active": "key-zzzzzzzz"}, "providers['p'].active is not one of"),
    ({"keys": ["key-aaaaaaaa"], "blockedUntil": {"key-aaaaaaaa": 1.5}},
     "blockedUntil of keys[0] must be a whole number of epoch ms, got float"),
    ({"keys": ["key-aaaaaaaa"], "blockedUntil": []}, "providers['p'].blockedUntil must be an object"),
    ({"keys": ["key-aaaaaaaa"], "sessions": {"s": 5}}, "sessions['s'] must be a key (text), got int"),
    ({"keys": ["key-aaaaaaaa"], "seen": {"s": "x"}}, "seen['s'] must be a whole number"),
    ({"keys": ["key-aaaaaaaa"], "longestBlockMs": -1}, "longestBlockMs must be a whole number"),
    ("nope", "providers['p'] must be an object"),
])
def test_file_store_validates_every_field_naming_path_and_field_never_the_key(tmp_path, entry, words):
    """A credentials file with "keys":"abc" used the key 'a'; [1,2] the key 1; ["",""] the default."""
    path = tmp_path / "creds.json"
    write_store(path, entry)
    with pytest.raises(CredentialFileError) as info:
        JsonFileCredentialStore(path)
    message = str(info.value)
    assert str(path) in message and words in message, message
    for secret in ("key-zzzzzzzz", "good-key-1", "bad key"):
        assert secret not in message


def test_file_store_refuses_nan_in_blocked_until(tmp_path):
    """File store refuses nan in blocked until."""
    path = tmp_path / "creds.json"
    path.write_text('{"providers": {"p": {"keys": ["key-aaaaaaaa"], "blockedUntil": {"key-aaaaaaaa": NaN}}}}')
    with pytest.raises(CredentialFileError, match="not valid JSON.*NaN"):
        JsonFileCredentialStore(path)


@pytest.mark.parametrize("hint", [float("nan"), float("inf"), -5, "60", True, None])
def test_an_absurd_hint_blocks_for_the_default_and_persists_a_whole_number(tmp_path, hint):
    """NaN in blockedUntil was persisted."""
    clock = Clock()
    path = tmp_path / "creds.json"
    store = JsonFileCredentialStore(path, GOOD, clock=clock)
    assert store.mark_usage_limit_reached("p", "s", hint) is True
    assert store.blocked_until("p") == {"key-aaaaaaaa": NOW + DEFAULT_BLOCK_MS}
    assert "NaN" not in path.read_text() and "Infinity" not in path.read_text()


def test_a_huge_hint_is_cut_to_a_year(make_store):
    """A huge hint is cut to a year."""
    store = make_store(GOOD, Clock())
    store.mark_usage_limit_reached("p", "s", 10 ** 18)
    assert store.blocked_until("p")["key-aaaaaaaa"] == NOW + 366 * 86_400_000


def test_keys_dropped_from_the_file_take_their_blocks_and_sessions_along(tmp_path):
    """Keys dropped from the file take their blocks and sessions along."""
    path = tmp_path / "creds.json"
    write_store(path, {"keys": ["key-aaaaaaaa"], "blockedUntil": {"key-gone-1234": NOW},
                       "sessions": {"s": "key-gone-1234"}, "seen": {"s": NOW, "t": NOW}})
    store = JsonFileCredentialStore(path, clock=Clock())
    assert store.blocked_until("p") == {}
    assert store.session_count("p") == 0


def test_idle_sessions_are_pruned_after_the_longest_block_plus_a_day(make_store):
    """(docs/policy.md §8b.10) The per-session map stays bounded."""
    clock = Clock()
    store = make_store(GOOD, clock)
    store.mark_usage_limit_reached("p", "old", 7_200_000)  # a 2 h block: longest so far
    for i in range(50):
        store.api_key("p", f"s{i}")
    assert store.session_count("p") == 51
    clock.now += 7_200_000 + IDLE_GRACE_MS - 1
    store.api_key("p", "new")
    assert store.session_count("p") == 52, "idle for less than the longest block + 24 h: kept"
    clock.now += 3_600_000 + 2
    store.api_key("p", "new")
    assert store.session_count("p") == 1
    assert store.blocked_until("p") == {}, "expired blocks are forgotten too"


def test_a_session_in_use_is_never_pruned(make_store):
    """A session in use is never pruned."""
    clock = Clock()
    store = make_store(GOOD, clock)
    for _ in range(30):
        store.api_key("p", "busy")
        clock.now += 3_600_000
    assert store.session_count("p") == 1


def test_legacy_sessions_without_a_seen_stamp_are_kept_until_idle(tmp_path):
    """Legacy sessions without a seen stamp are kept until idle."""
    clock = Clock()
    path = tmp_path / "creds.json"
    write_store(path, {"keys": ["key-aaaaaaaa"], "sessions": {f"s{i}": "key-aaaaaaaa" for i in range(10)}})
    store = JsonFileCredentialStore(path, clock=clock)
    assert store.session_count("p") == 10
    clock.now += DEFAULT_BLOCK_MS + IDLE_GRACE_MS + 3_600_000
    store.api_key("p", "x")
    assert store.session_count("p") == 1


def test_counts_for_credential_rotation(make_store):
    """D13 (docs/policy.md §8b.6) needs N and how many are limited."""
    clock = Clock()
    store = make_store({"p": ["k1-aaaaaa", "k2-aaaaaa", "k3-aaaaaa"]}, clock)
    assert (store.credential_count("p"), store.limited_count("p")) == (3, 0)
    assert store.credential_count("q") == 0 and store.limited_count("q") == 0
    store.mark_usage_limit_reached("p", "s", 1000)
    store.mark_usage_limit_reached("p", "s", 5000)
    assert store.limited_count("p") == 2
    clock.now += 1000
    assert store.limited_count("p") == 1


async def test_coroutine_methods_of_both_stores(make_store):
    """Coroutine methods of both stores."""
    store = make_store(GOOD, Clock())
    assert await store.aapi_key("p", "s", timeout_s=5) == "key-aaaaaaaa"
    assert await store.amark_usage_limit_reached("p", "s", 100, timeout_s=5) is True
    assert await store.acredential_count("p", timeout_s=5) == 2
    assert await store.alimited_count("p", timeout_s=5) == 1
    assert await store.aapi_key("p", "s") == "key-bbbbbbbb"


def test_file_store_refuses_a_symlink_a_read_only_file_and_a_folder(tmp_path):
    """Such files used to be replaced silently."""
    real = tmp_path / "real.json"
    JsonFileCredentialStore(real, GOOD)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    with pytest.raises(CredentialFileError, match="link.json: is a symbolic link"):
        JsonFileCredentialStore(link)
    assert link.is_symlink()
    os.chmod(real, 0o400)
    with pytest.raises(CredentialFileError, match=r"real.json: is read-only \(mode 0400\)"):
        JsonFileCredentialStore(real).api_key("p", "s")
    assert stat_mode(real) == 0o400
    folder = tmp_path / "folder.json"
    folder.mkdir()
    with pytest.raises(CredentialFileError, match="is not a regular file"):
        JsonFileCredentialStore(folder)


def stat_mode(path):
    return os.stat(path).st_mode & 0o777


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_file_store_refuses_another_users_file(tmp_path):
    """File store refuses another users file."""
    path = tmp_path / "creds.json"
    JsonFileCredentialStore(path, GOOD)
    os.chown(path, 12345, 12345)
    with pytest.raises(CredentialFileError, match=r"owned by another user \(uid 12345"):
        JsonFileCredentialStore(path).api_key("p", "s")
    assert os.stat(path).st_uid == 12345


def test_file_store_keeps_mode_0600_and_leaves_no_temporary_file(tmp_path):
    """File store keeps mode 0600 and leaves no temporary file."""
    path = tmp_path / "creds.json"
    path.write_text(json.dumps({"providers": {"p": {"keys": ["key-aaaaaaaa"]}}}))
    os.chmod(path, 0o644)
    store = JsonFileCredentialStore(path, GOOD)
    store.mark_usage_limit_reached("p", "s", 10)
    assert stat_mode(path) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["creds.json", "creds.json.lock"]


def test_temporary_files_of_killed_writers_are_removed(tmp_path):
    """48 temporary files holding every key were left after 60 kills."""
    path = tmp_path / "creds.json"
    store = JsonFileCredentialStore(path, GOOD)
    (tmp_path / ".creds.json.tmp-abc123").write_text('{"providers": {"p": {"keys": ["key-aaaaaaaa"]')
    (tmp_path / "creds.json.k2j4h5g6").write_text('{\n "providers": {\n  "p": {')  # older version's
    (tmp_path / "creds.json.original").write_text("the user's own file")
    store.api_key("p", "s")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["creds.json", "creds.json.lock",
                                                          "creds.json.original"]


def test_a_failed_write_removes_its_temporary_file(tmp_path, monkeypatch):
    """A failed write removes its temporary file."""
    path = tmp_path / "creds.json"
    store = JsonFileCredentialStore(path, GOOD)

    def boom(*args, **kwargs):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        store.mark_usage_limit_reached("p", "s", 10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["creds.json", "creds.json.lock"]


def test_a_writer_killed_mid_write_leaves_the_store_valid(tmp_path):
    """A writer killed mid write leaves the store valid."""
    path = tmp_path / "creds.json"
    JsonFileCredentialStore(path, GOOD)
    code = ("import os, sys; from fsm.host.credentials import JsonFileCredentialStore as S; s = S(sys.argv[1]);"
            "os.replace = lambda *a: os._exit(9); s.mark_usage_limit_reached('p', 'x', 10)")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], env=child_env(), timeout=60)
    assert proc.returncode == 9
    assert len(list(tmp_path.iterdir())) == 3  # the killed writer's temporary file is there
    store = JsonFileCredentialStore(path)
    assert store.api_key("p", "x") == "key-aaaaaaaa"  # the kill lost only its own update
    assert sorted(p.name for p in tmp_path.iterdir()) == ["creds.json", "creds.json.lock"]


def child_env():
    from support import env
    return env()


HOLD_LOCK = """
import fcntl, sys, time
fh = open(sys.argv[1], "a+")
fcntl.flock(fh, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""


async def test_a_lock_held_by_another_process_never_blocks_the_event_loop(tmp_path, monkeypatch):
    """200 concurrent marks while another process holds the lock: every wait for the lock (each
    flock try and each poll's sleep) happens off the event loop's thread, every mark gives up
    with CredentialLockTimeout, and none is half-applied."""
    import threading

    import fsm.host.credentials as credentials

    path = tmp_path / "creds.json"
    store = JsonFileCredentialStore(path, GOOD, lock_timeout_s=0.2)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(path) + ".lock"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    waits = []  # (what, thread id) of every blocking step of the lock
    real_flock, real_sleep = credentials.fcntl.flock, credentials.time.sleep

    def flock(fd, op):
        waits.append(("flock", threading.get_ident()))
        return real_flock(fd, op)

    def sleep(seconds):
        waits.append(("sleep", threading.get_ident()))
        return real_sleep(seconds)

    try:
        assert holder.stdout.readline() == b"locked\n"
        monkeypatch.setattr(credentials.fcntl, "flock", flock)
        monkeypatch.setattr(credentials.time, "sleep", sleep)
        loop_thread = threading.get_ident()
        results = await asyncio.gather(
            *(store.amark_usage_limit_reached("p", f"s{i}", 1000, timeout_s=0.15) for i in range(200)),
            return_exceptions=True)
        monkeypatch.undo()
        assert all(isinstance(r, CredentialLockTimeout) for r in results), results[:3]
        assert "creds.json" in str(results[0])
        assert {what for what, _ in waits} >= {"flock"}
        assert all(thread != loop_thread for _, thread in waits), "the loop's own thread waited for the lock"
        with pytest.raises(CredentialLockTimeout, match="lock creds.json.lock is held by another process"):
            store.api_key("p", "s")  # the sync call gives up after lock_timeout_s
    finally:
        monkeypatch.undo()
        holder.stdin.close()
        holder.wait(10)
    assert await store.amark_usage_limit_reached("p", "s", 1000, timeout_s=5) is True
    assert store.limited_count("p") == 1, "no timed-out mark was applied"


async def test_coroutine_methods_refuse_a_bad_timeout(tmp_path):
    """Coroutine methods refuse a bad timeout."""
    store = JsonFileCredentialStore(tmp_path / "c.json", GOOD)
    with pytest.raises(ValueError, match="timeout_s must be a positive number"):
        await store.aapi_key("p", "s", timeout_s=0)


def test_a_key_listed_twice_counts_once_for_rotation(tmp_path):
    """Attack report: ["sk-a", "sk-a"] counted twice in maxAttempts (one extra retry)."""
    from fsm.host.credentials import InMemoryCredentialStore, JsonFileCredentialStore
    assert InMemoryCredentialStore({"p": ["sk-aaaa1111", "sk-aaaa1111"]}).credential_count("p") == 1
    store = JsonFileCredentialStore(tmp_path / "c.json", {"p": ["sk-aaaa1111", "sk-aaaa1111", "sk-bbbb2222"]})
    assert store.credential_count("p") == 2
