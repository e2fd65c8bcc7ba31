import json
import multiprocessing
import os

import pytest

from fsm.credentials import DEFAULT_BLOCK_MS, InMemoryCredentialStore, JsonFileCredentialStore

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
    clock = Clock()
    store = make_store({"p": ["a", "b", "c"]}, clock)
    assert store.api_key("p", "s") == "a"
    assert store.mark_usage_limit_reached("p", "s", 5000) is True
    assert store.api_key("p", "s") == "b"
    assert store.blocked_until("p") == {"a": NOW + 5000}


def test_without_hint_blocks_for_a_minute(make_store):
    clock = Clock()
    store = make_store({"p": ["a", "b"]}, clock)
    store.api_key("p", "s")
    store.mark_usage_limit_reached("p", "s", None)
    assert store.blocked_until("p")["a"] == NOW + DEFAULT_BLOCK_MS


def test_all_blocked_answers_false_until_one_unblocks(make_store):
    clock = Clock()
    store = make_store({"p": ["a", "b"]}, clock)
    store.api_key("p", "s")
    assert store.mark_usage_limit_reached("p", "s", 1000) is True      # a blocked, b in use
    assert store.mark_usage_limit_reached("p", "s", 1000) is False     # b blocked, a still blocked
    clock.now += 1000
    assert store.mark_usage_limit_reached("p", "s", 1000) is True      # a is free again


def test_second_session_follows_the_first_switch(make_store):
    clock = Clock()
    store = make_store({"p": ["a", "b"]}, clock)
    assert store.api_key("p", "s1") == store.api_key("p", "s2") == "a"
    assert store.mark_usage_limit_reached("p", "s1", 1000) is True
    assert store.mark_usage_limit_reached("p", "s2", 1000) is True    # follows to b, b not blocked
    assert store.api_key("p", "s2") == "b"
    assert "b" not in store.blocked_until("p")


def test_unknown_provider(make_store):
    store = make_store({"p": ["a"]}, Clock())
    assert store.api_key("q", "s") is None
    assert store.mark_usage_limit_reached("q", "s", 10) is False


@pytest.mark.parametrize("bad", [{"p": []}, {"p": "abc"}, {"": ["a"]}, {"p": [""]}, ["a"]])
def test_bad_credentials_are_rejected(bad):
    with pytest.raises((ValueError, TypeError)):
        InMemoryCredentialStore(bad)


def test_file_store_survives_a_restart(tmp_path):
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
