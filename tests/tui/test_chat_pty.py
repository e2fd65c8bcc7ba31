"""``python -m fsm chat`` driven in a pseudo-terminal, against the fault server.

The program runs for real (pexpect, 120x30, TERM=xterm), read through the small terminal
emulator of ``pty_support.py`` (:class:`Chat`, :class:`Screen`).

Timing: backoffs of 2–3 s; every wait has a generous timeout for a loaded 2-core machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

pexpect = pytest.importorskip("pexpect")

from fsm.testing.fault_server import FaultServer  # noqa: E402
from support import OVERLOADED, ROOT
from pty_support import WAIT_S, Chat  # noqa: E402  (the terminal driver)

pytestmark = pytest.mark.pty



@pytest.fixture
def run_chat(tmp_path):
    """``run_chat(script, settings)`` → (Chat, FaultServer); both are stopped afterwards."""
    started: list[tuple[Chat, FaultServer]] = []

    def start(script: list[dict], settings: dict | None = None, *extra: str) -> tuple[Chat, FaultServer]:
        server = FaultServer(script)
        server.start()
        chat = Chat(server.base_url, settings, tmp_path, *extra)
        started.append((chat, server))
        chat.ready()
        return chat, server

    yield start
    for chat, server in started:
        chat.kill()
        server.stop()


def loader_seconds(chat: Chat, attempt: str) -> int:
    m = chat.wait_for(rf"Retrying \({attempt}\) in (\d+)s… \(esc to cancel, enter to retry now\)")
    return int(m.group(1))


# ---------------------------------------------------------------------- tests
def test_loader_counts_down_then_the_retried_answer_clears_it(run_chat, tmp_path):
    """Loader counts down then the retried answer clears it."""
    session_file = tmp_path / "session.jsonl"
    chat, server = run_chat([OVERLOADED, {"stream": ["Recovered ", "after one retry."]}],
                            {"baseDelayMs": 2500, "maxRetries": 2},
                            "--session-file", str(session_file))
    chat.line("hello")
    chat.wait_for(r"Error: 529 Overloaded", where="transcript")
    loader_seconds(chat, "1/2")
    assert "backing off 1/2" in chat.status()
    # Watch the loader until the answer comes: the seconds count down live (2500 ms shows
    # 3s, 2s, 1s, rounded up: never 0s while it waits).
    seen: list[int] = []
    deadline = time.monotonic() + WAIT_S
    while "Recovered after one retry." not in chat.transcript():
        m = re.search(r"Retrying \(1/2\) in (\d+)s… \(esc to cancel, enter to retry now\)", chat.display())
        if m and (not seen or seen[-1] != int(m.group(1))):
            seen.append(int(m.group(1)))
        assert time.monotonic() < deadline, f"no answer; screen:\n{chat.transcript()}"
        time.sleep(0.02)
    assert len(seen) >= 2 and seen == sorted(seen, reverse=True) and seen[0] <= 3, seen
    assert 0 not in seen, seen
    chat.wait_for(r"(?m)^Recovered after one retry\.$", where="transcript")
    chat.wait_for(r"Retry succeeded on attempt 1 of 2", where="transcript")
    chat.wait_for(r"fault-model · retry on · idle \(last chain succeeded\)")
    assert "Retrying" not in chat.display()
    assert "Retry failed" not in chat.transcript()
    assert len(server.chat_requests) == 2
    chat.send("\x04")
    assert chat.wait_exit() == 0
    # The session log keeps the failed message the runtime context dropped (docs/policy.md §3).
    entries = [json.loads(line) for line in session_file.read_text().splitlines()]
    stops = [e["message"].get("stopReason") for e in entries if e["type"] == "message"]
    assert stops == [None, "error", "stop"]


def test_esc_during_the_backoff_cancels_the_retry(run_chat, tmp_path):
    """Esc during the backoff cancels the retry."""
    trace = tmp_path / "trace.jsonl"
    chat, server = run_chat([OVERLOADED], {"baseDelayMs": 2000, "maxRetries": 3},
                            "--trace", str(trace))
    chat.line("hello")
    loader_seconds(chat, "1/3")
    t_loader = time.monotonic()
    chat.send("\x1b")
    chat.wait_for(r"Retry cancelled before any retry was sent", where="transcript")
    esc_s = time.monotonic() - t_loader
    chat.wait_for(r"fault-model · retry on · idle")
    assert "Retrying" not in chat.display()
    # Past the cancelled backoff's deadline: the fault server saw no retry request.
    time.sleep(max(0.0, 2.3 - esc_s))
    assert len(server.chat_requests) == 1
    chat.wait_for(r"fault-model · retry on · idle \(last chain cancelled\)")
    chat.line("/state")
    chat.wait_for(r'"retryState": "cancelled"', where="transcript")
    assert "status: idle (last chain cancelled)" in chat.transcript()
    assert '"isRetrying": false' in chat.transcript()
    chat.send("\x04")
    assert chat.wait_exit() == 0
    records = [json.loads(line) for line in trace.read_text().splitlines()[1:]]
    assert [r["dest"] for r in records if r["outcome"] != "ignored"][-2:] == ["backing_off", "cancelled"]


def test_esc_during_a_retried_turn_aborts_it(run_chat):
    """Esc during a retried turn aborts it."""
    chat, server = run_chat(
        [OVERLOADED, {"stream": ["Slow ", "answer ", "never ", "finished"], "chunk_delay_ms": 700}],
        {"baseDelayMs": 500, "maxRetries": 1})
    chat.line("hello")
    chat.wait_for(r"Retry 1/1 running… \(esc to interrupt\)")
    chat.wait_for(r"Slow")
    chat.send("\x1b")
    chat.wait_for(r"Aborted after 1 retry attempt", where="transcript")
    chat.wait_for(r"fault-model · retry on · idle")
    assert "Retry failed" not in chat.transcript()
    assert len(server.chat_requests) == 2
    chat.send("\x04")
    assert chat.wait_exit() == 0


def test_retry_off_shows_the_error_and_no_loader(run_chat):
    """Retry off shows the error and no loader."""
    chat, server = run_chat([OVERLOADED], {"baseDelayMs": 2000})
    chat.line("/retry off")
    chat.wait_for(r"Auto-retry off", where="transcript")
    chat.wait_for(r"fault-model · retry off · idle")
    chat.line("hello")
    chat.wait_for(r"Error: 529 Overloaded", where="transcript")
    chat.wait_for(r"Not retrying: auto-retry is off", where="transcript")
    chat.wait_for(r"fault-model · retry off · idle")
    time.sleep(0.3)
    assert "Retrying" not in chat.raw_text()
    assert len(server.chat_requests) == 1
    chat.line("/retry on")
    chat.wait_for(r"fault-model · retry on · idle")
    chat.send("\x04")
    assert chat.wait_exit() == 0


def test_enter_on_an_empty_line_during_the_backoff_retries_now(run_chat):
    """Enter on an empty line during the backoff retries now."""
    chat, server = run_chat([OVERLOADED, {"stream": ["Retried at once."]}], {"baseDelayMs": 60000})
    chat.line("hello")
    loader_seconds(chat, "1/3")
    chat.send("\r")
    chat.wait_for(r"(?m)^Retried at once\.$", where="transcript")
    chat.wait_for(r"Retry succeeded on attempt 1 of 3", where="transcript")
    requests = server.chat_requests
    assert len(requests) == 2 and requests[1]["t_ms"] - requests[0]["end_ms"] < 30000
    chat.send("\x04")
    assert chat.wait_exit() == 0


def test_a_message_typed_during_the_backoff_waits_for_it(run_chat):
    """A message typed during the backoff waits for it."""
    chat, server = run_chat([OVERLOADED, {"stream": ["Both answered."]}], {"baseDelayMs": 2000})
    chat.line("first")
    loader_seconds(chat, "1/3")
    chat.line("second")
    chat.wait_for(r"Queued as a follow-up", where="transcript")
    chat.wait_for(r"1 queued")
    chat.wait_for(r"(?m)^Both answered\.$", where="transcript")
    requests = server.chat_requests
    assert len(requests) == 2
    gap_ms = requests[1]["t_ms"] - requests[0]["end_ms"]
    assert gap_ms >= 1900, f"the follow-up bypassed the backoff: retry after {gap_ms:.0f} ms"
    sent = [m["content"] for m in requests[1]["body"]["messages"] if m["role"] == "user"]
    assert sent == ["first", "second"]
    chat.send("\x03")
    assert chat.wait_exit() == 0


def test_session_dir_chooses_where_the_log_goes(run_chat, tmp_path):
    """Session dir chooses where the log goes."""
    logs = tmp_path / "logs"
    chat, server = run_chat([{"stream": ["Logged."]}], None, "--session-dir", str(logs))
    chat.wait_for(r"session log: ", where="transcript")
    chat.line("hello")
    chat.wait_for(r"(?m)^Logged\.$", where="transcript")
    chat.send("\x04")
    assert chat.wait_exit() == 0
    files = list(logs.glob("*.jsonl"))
    banner = chat.transcript().replace("\n", "")  # a long path wraps on screen
    assert len(files) == 1 and f"session log: {files[0]}" in banner
    assert "Logged." in files[0].read_text()


def test_ctrl_c_during_the_backoff_leaves_cleanly(run_chat):
    """Ctrl c during the backoff leaves cleanly."""
    chat, server = run_chat([OVERLOADED], {"baseDelayMs": 2000})
    chat.line("hello")
    loader_seconds(chat, "1/3")
    chat.send("\x03")
    assert chat.wait_exit() == 0
    text = chat.raw_text()
    assert "Traceback" not in text
    assert "Retry cancelled before any retry was sent" in text
    time.sleep(0.5)
    assert len(server.chat_requests) == 1


def test_ctrl_d_on_an_empty_line_exits_0(run_chat):
    """Ctrl d on an empty line exits 0."""
    chat, _ = run_chat([])
    chat.send("\x04")
    assert chat.wait_exit() == 0
    assert "Traceback" not in chat.raw_text()


def test_quit_command_exits_0(run_chat):
    """Quit command exits 0."""
    chat, _ = run_chat([])
    chat.line("/quit")
    assert chat.wait_exit() == 0


@pytest.mark.subprocess
def test_without_a_terminal_it_refuses_with_status_2():
    """Without a terminal it refuses with status 2."""
    cmd = [sys.executable, "-m", "fsm", "chat", "--base-url", "http://127.0.0.1:9/v1",
           "--model", "m", "--no-session"]
    done = subprocess.run(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=WAIT_S)
    assert done.returncode == 2
    assert "needs a terminal" in done.stderr
    assert done.stdout == ""


@pytest.mark.subprocess
def test_stdout_not_a_terminal_refuses_too():
    """Stdout not a terminal refuses too."""
    master, slave = os.openpty()
    try:
        cmd = [sys.executable, "-m", "fsm", "chat", "--base-url", "http://127.0.0.1:9/v1",
               "--model", "m", "--no-session"]
        done = subprocess.run(cmd, cwd=ROOT, stdin=slave, capture_output=True, text=True,
                              timeout=WAIT_S)
    finally:
        os.close(master)
        os.close(slave)
    assert done.returncode == 2
    assert "needs a terminal" in done.stderr
