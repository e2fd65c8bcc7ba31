"""The fault server's capacity mode (fsm.testing.capacity): a provider of N requests/s."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from fsm.testing.capacity import Capacity
from fsm.testing.fault_server import FaultServer


class Clock:
    """Seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def post(server: FaultServer) -> tuple[int, dict, dict]:
    req = urllib.request.Request(server.base_url + "/chat/completions", method="POST",
                                 data=json.dumps({"model": "m", "messages": []}).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read() or b"null")


def test_over_capacity_is_answered_529_and_a_token_comes_back_in_time():
    """5 requests/s with one second of burst: 5 pass at once, the 6th gets a 529 overloaded
    error; 0.2 s later one more passes."""
    clock = Clock()
    with FaultServer(capacity=Capacity(5, clock=clock)) as server:
        statuses = [post(server)[0] for _ in range(6)]
        assert statuses == [200] * 5 + [529]
        clock.now += 0.2
        assert post(server)[0] == 200
        assert (server.capacity.accepted, server.capacity.refused) == (6, 1)


def test_the_429_answer_says_when_the_next_token_comes():
    """answer="429": a rate_limit_error with retry-after (whole seconds, at least 1) and the
    exact retry-after-ms."""
    clock = Clock()
    with FaultServer(capacity=Capacity(2, answer="429", clock=clock)) as server:
        assert [post(server)[0] for _ in range(2)] == [200, 200]
        clock.now += 0.1
        status, headers, body = post(server)
        assert status == 429 and body["error"]["type"] == "rate_limit_error"
        headers = {k.lower(): v for k, v in headers.items()}
        assert headers["retry-after"] == "1" and headers["retry-after-ms"] == "400"


def test_bad_capacity_settings_are_refused():
    """A rate that is not a positive number, or an unknown answer, is refused by name."""
    with pytest.raises(ValueError, match="rate_per_s"):
        Capacity(0)
    with pytest.raises(ValueError, match="answer"):
        Capacity(5, answer="503")


def test_the_command_needs_a_script_or_a_capacity(capsys):
    """``fault-server`` without --script or --capacity exits 2 saying which to give; a bad
    --capacity exits 2 naming it."""
    from fsm.__main__ import main

    assert main(["fault-server"]) == 2
    assert "--capacity" in capsys.readouterr().err
    assert main(["fault-server", "--capacity", "0"]) == 2
    assert "rate_per_s" in capsys.readouterr().err
