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


def get_stats(server: FaultServer, path: str = "/fault/stats") -> dict:
    with urllib.request.urlopen(server.root_url + path, timeout=5) as resp:
        return json.loads(resp.read())


def test_service_and_refusal_times_delay_the_answers():
    """``service_ms``: an accepted request is answered no sooner than its service time;
    ``refusal_ms``: a refusal no sooner than its own (the simulation's provider, 2 s and 0.2 s:
    docs/simulation.md "The world"). Only lower bounds: a busy machine may answer later."""
    clock = Clock()
    with FaultServer(capacity=Capacity(1, clock=clock, service_ms=150, refusal_ms=100)) as server:
        assert [post(server)[0] for _ in range(2)] == [200, 529]
        accepted, refused = server.chat_requests
        assert accepted["end_ms"] - accepted["t_ms"] >= 150
        assert refused["end_ms"] - refused["t_ms"] >= 100


def test_stats_count_accepted_and_refused_requests_per_wall_second():
    """``GET /fault/stats`` (also under ``/v1``) is the provider's view: the requests accepted
    and refused in each second of the wall clock, and the totals."""
    clock, wall = Clock(), Clock()
    wall.now = 1_000.5
    with FaultServer(capacity=Capacity(2, clock=clock, wall=wall)) as server:
        assert [post(server)[0] for _ in range(3)] == [200, 200, 529]
        wall.now, clock.now = 1_001.2, clock.now + 0.5
        assert post(server)[0] == 200
        stats = get_stats(server)
        assert stats["chat_requests"] == 4
        cap = stats["capacity"]
        assert (cap["accepted"], cap["refused"], cap["rate_per_s"]) == (3, 1, 2.0)
        assert cap["per_second"] == [[1000, 2, 1], [1001, 1, 0]]
        assert get_stats(server, "/v1/fault/stats") == stats
    with FaultServer() as server:  # no capacity mode: the count only
        assert get_stats(server) == {"chat_requests": 0, "capacity": None}


def test_bad_service_times_are_refused():
    """A negative or infinite service or refusal time is refused by name."""
    with pytest.raises(ValueError, match="service_ms"):
        Capacity(5, service_ms=-1)
    with pytest.raises(ValueError, match="refusal_ms"):
        Capacity(5, refusal_ms=float("inf"))


def test_the_command_takes_service_times_in_capacity_mode_only(capsys):
    """``--service-ms`` / ``--refusal-ms`` without ``--capacity`` exit 2 saying so; a negative
    one exits 2 naming the option."""
    from fsm.__main__ import main

    assert main(["fault-server", "--script", "-", "--service-ms", "100"]) == 2
    assert "--capacity" in capsys.readouterr().err
    assert main(["fault-server", "--capacity", "5", "--service-ms", "-1"]) == 2
    assert "--service-ms" in capsys.readouterr().err
    assert main(["fault-server", "--capacity", "5", "--refusal-ms", "-1"]) == 2
    assert "--refusal-ms" in capsys.readouterr().err
