"""pi's own RPC client (``@mariozechner/pi-coding-agent`` 0.73.1, ``dist/modes/rpc/rpc-client.js``)
drives ``python -m fsm rpc`` against the project's fault server, and sees what it sees from pi.

Each scenario (``scenarios/*.json``: settings, fault-server script, client calls) is played by
``driver.mjs`` through the real ``RpcClient``; the client starts ``shim.mjs`` as its
``cliPath``, which runs our server. What the client saw — the events (agent, turn, message,
message_update with ``text_start``/``text_delta``/``text_end`` and ``contentIndex``, the retry
events) and each call's outcome — is compared with ``expected/<scenario>.json``, recorded from
pi itself through the same driver and fault server (``python tests/conformance/harness.py
record``); pi is also run live on some scenarios, so the recordings are checked too.

The deliberate differences (``docs/policy.md``), applied to pi's recording before comparing:

- D6 (policy §8 item 3): a retry that fails while auto-retry is off ends its chain with
  ``auto_retry_end {success: false}``; pi leaves the chain without an end.
- D7: retry events carry extra fields (``chainId``, ``rule``, ``retryAt``, ...); only pi's
  fields are compared.
- D8: ``get_state`` adds ``autoRetryEnabled``, ``isRetrying`` (true exactly during a backoff)
  and more; every key of pi's is there with pi's type. ``autoCompactionEnabled`` is false (no
  compactor is configured), ``steeringMode``/``followUpMode`` are ``"all"``.
- Queued messages: pi delivers a steer and a follow-up one turn each inside the running agent
  run; this session delivers every queued message with the next turn (one request), so for
  ``steer_and_follow_up`` the calls, the queue count and the conversation are compared, not
  the event sequence.
- Commands pi has and this server does not (``get_session_stats``, ``compact``, ...) answer
  ``success: false`` saying so, and the client throws at once; pi answers them.

Timings are not compared; the backoffs are 20 ms (400 ms where a call must land inside one).
"""

from __future__ import annotations

import copy
import difflib
import json

import pytest

import harness

pytestmark = pytest.mark.subprocess

SCENARIOS = harness.scenario_names()
LIVE_PI = ("overloaded_then_ok", "abort_retry_during_long_backoff", "disable_during_backoff")
"""Scenarios pi itself is run on in every test run (the rest are checked when re-recorded)."""


@pytest.fixture(scope="module", autouse=True)
def pi_client():
    """pi's client, installed from the npm registry into the cache on first use (never skipped:
    a missing node or npm is an error)."""
    return harness.install_pi()


def expected(name: str) -> dict:
    return json.loads((harness.HERE / "expected" / f"{name}.json").read_text(encoding="utf-8"))["pi"]


# ---------------------------------------------------------------------------------- differences
def _d6_end_after_disabled_retry(pi: dict) -> dict:
    """D6: the retry that failed while auto-retry was off ends the chain, with its error."""
    ours = copy.deepcopy(pi)
    last_error = [e for e in ours["events"] if e["type"] == "message_end"][-1]["errorMessage"]
    ours["events"].append({"type": "auto_retry_end", "success": False, "attempt": 1,
                           "finalError": last_error})
    return ours


DIFFERENCES = {"disable_during_backoff": _d6_end_after_disabled_retry}


def assert_same_events(seen: list, want: list) -> None:
    """Equal, or fail with a line diff of the two sequences (pi's recording on the left)."""
    if seen != want:
        diff = difflib.unified_diff([json.dumps(e) for e in want], [json.dumps(e) for e in seen],
                                    "pi (after the documented differences)", "fsm", lineterm="", n=2)
        pytest.fail("the events differ:\n" + "\n".join(diff), pytrace=False)


def check_state(seen: dict, pi: dict, label: str, *, ours: bool = True) -> None:
    """Every key of pi's state with pi's type (the model object too), and the same values;
    ``ours``: also the retry fields this server adds (D8)."""
    for key, kind in pi["types"].items():
        assert seen["types"].get(key) == kind, f"{label}: get_state {key}: {seen['types'].get(key)} != {kind}"
    for key, kind in pi["model"]["types"].items():
        assert seen["model"]["types"].get(key) == kind, f"{label}: model.{key}"
    assert (seen["model"]["id"], seen["model"]["provider"]) == (pi["model"]["id"], pi["model"]["provider"])
    assert seen["values"] == pi["values"], label
    if ours:
        assert seen["types"]["autoRetryEnabled"] == "boolean" and seen["types"]["isRetrying"] == "boolean"


def compare_calls(seen: list, pi: list, *, ours: bool = True) -> None:
    assert [(c.get("call"), c.get("label"), c.get("ok")) for c in seen] == \
        [(c.get("call"), c.get("label"), c.get("ok")) for c in pi], seen
    for mine, theirs in zip(seen, pi):
        if "state" in theirs:
            check_state(mine["state"], theirs["state"], mine["label"], ours=ours)
        if "messages" in theirs:
            assert mine["messages"] == theirs["messages"]


_PLAYED: dict[tuple[str, str], tuple[dict, dict]] = {}
"""The runs of this module, by (scenario, impl): a scenario two tests read is played once."""


def play(name: str, impl: str = "fsm") -> tuple[dict, dict]:
    """What the client saw (:func:`harness.normalize`, with the request count) and the raw
    run; each (scenario, impl) runs once per test process, each caller gets its own copy."""
    if (name, impl) not in _PLAYED:
        result = harness.run(name, impl)
        seen = harness.normalize(result["records"])
        seen["requests"] = len(result["requests"])
        assert result["records"] and result["records"][-1]["kind"] == "done", (
            f"the driver did not finish: {seen['calls'][-1:]}\n{result['stderr'][-3000:]}")
        _PLAYED[name, impl] = seen, result
    return copy.deepcopy(_PLAYED[name, impl])


# ---------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("name", [n for n in SCENARIOS if n != "steer_and_follow_up"])
def test_pi_client_sees_what_it_sees_from_pi(name):
    """The events, the calls' outcomes and the request count match pi's recording (after the
    documented differences)."""
    want = DIFFERENCES.get(name, lambda pi: pi)(expected(name))
    seen, _ = play(name)
    assert_same_events(seen["events"], want["events"])
    compare_calls(seen["calls"], want["calls"])
    assert seen["requests"] == want["requests"]


def test_get_state_reports_the_backoff_through_pi_client():
    """D8: isRetrying is true 30 ms into the backoff, false before and after; isStreaming is
    false during the backoff, as in pi."""
    seen, result = play("get_state_during_backoff")
    states = {r["label"]: r["value"] for r in result["records"]
              if r["kind"] == "call" and r["method"] == "getState"}
    assert [states[k]["isRetrying"] for k in ("before", "backoff", "after")] == [False, True, False]
    assert states["backoff"]["isStreaming"] is False and states["backoff"]["retryAttempt"] == 1
    assert states["after"]["messageCount"] == 2 and states["after"]["model"]["id"] == harness.MODEL


def test_steer_and_follow_up_are_queued_and_answered_through_pi_client():
    """steer and followUp succeed while the answer streams, count as pending (2, as in pi),
    and the conversation ends with both messages and an answer to them."""
    pi = expected("steer_and_follow_up")
    seen, _ = play("steer_and_follow_up")
    assert [(c["call"], c["ok"]) for c in seen["calls"]] == [(c["call"], c["ok"]) for c in pi["calls"]]
    queued = next(c for c in seen["calls"] if c["label"] == "queued")["state"]
    assert queued["values"]["pendingMessageCount"] == 2 == \
        next(c for c in pi["calls"] if c["label"] == "queued")["state"]["values"]["pendingMessageCount"]
    assert queued["values"]["isStreaming"] is True
    messages = next(c for c in seen["calls"] if c["call"] == "getMessages")["messages"]
    assert [m["text"] for m in messages if m["role"] == "user"] == ["hi", "steered", "followed"]
    assert messages[1] == {"role": "assistant", "stopReason": "stop", "text": "Hello"}
    assert messages[-1]["role"] == "assistant" and messages[-1]["stopReason"] == "stop"
    assert seen["requests"] == 2  # the queued messages go out together with the next turn


@pytest.mark.parametrize("name", LIVE_PI)
def test_pi_itself_still_matches_its_recording(name):
    """pi run live through the same driver and fault server gives the recorded sequence."""
    seen, _ = play(name, "pi")
    pi = expected(name)
    assert_same_events(seen["events"], pi["events"])
    compare_calls(seen["calls"], pi["calls"], ours=False)
    assert seen["requests"] == pi["requests"]


def test_commands_pi_has_and_retry_now_through_pi_client():
    """pi's other commands fail at once, saying so; retry_now ends a 60 s backoff at once (the
    chain succeeds well within the backoff, whatever the load) and is ignored, with success,
    when no backoff runs."""
    seen, result = play("fsm_only_commands")
    calls = {c["label"]: c for c in seen["calls"]}
    for label in ("getSessionStats", "compact", "getCommands"):
        assert calls[label]["ok"] is False and "not implemented" in calls[label]["error"], calls[label]
    values = {r["label"]: r.get("value") for r in result["records"] if r["kind"] == "call"}
    assert values["text_before"] is None and values["text_after"] == "Hello"
    assert values["retry_now"]["success"] is True and values["retry_now_idle"]["success"] is True
    retry = [e for e in seen["events"] if e["type"].startswith("auto_retry")]
    assert retry == [{"type": "auto_retry_start", "attempt": 1, "maxAttempts": 3, "delayMs": 60000,
                      "errorMessage": retry[0]["errorMessage"]},
                     {"type": "auto_retry_end", "success": True, "attempt": 1}]
    ends = [r["t"] for r in result["records"] if r["kind"] == "event"
            and r["event"]["type"] in ("auto_retry_start", "auto_retry_end")]
    assert ends[1] - ends[0] < 30000  # far less than the 60 s backoff, whatever the load
    assert seen["requests"] == 2
