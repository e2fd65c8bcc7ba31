"""``python -m fsm chat`` driven in a pseudo-terminal, against the fault server.

The program runs for real (pexpect, 120x30, TERM=xterm). Its output goes through a small
terminal emulator (:class:`Screen`) so the tests read the screen a person would see:
prompt_toolkit redraws only the cells that change (a countdown from 3s to 2s sends one "2"),
so matching the raw byte stream would be fragile. The emulator also answers the cursor
position requests prompt_toolkit sends, as a real terminal does.

Timing: backoffs of 2–3 s; every wait has a generous timeout for a loaded 2-core machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pexpect = pytest.importorskip("pexpect")

from fsm.testing.fault_server import FaultServer  # noqa: E402
from support import OVERLOADED, ROOT

pytestmark = pytest.mark.pty

ROWS, COLS = 30, 120
WAIT_S = 30.0  # generous: a loaded CI machine may take seconds to start Python


# ---------------------------------------------------------------------- a small terminal
class Screen:
    """Enough of a VT100/xterm for prompt_toolkit's output: cursor moves, erases, wrapping,
    scrolling into :attr:`history`, and replies to cursor position requests (``ESC[6n``).
    Colours and modes are ignored; every character is one column wide."""

    _ESC = re.compile(
        r"\x1b\[([?>=!]?)([0-9;]*)([ -/]*)([@-~])"   # CSI
        r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"        # OSC (window title…)
        r"|\x1b[()*+][0-9A-Za-z]"                    # charset selection
        r"|\x1b[^\[\]()*+]")                         # other two-byte escapes
    _PARTIAL = re.compile(r"\x1b(?:\[[?>=!]?[0-9;]*[ -/]*|\][^\x07\x1b]*\x1b?|[()*+])?\Z")
    _TEXT = re.compile(r"[^\x00-\x1f\x1b]+")

    def __init__(self, rows: int, cols: int) -> None:
        self.rows, self.cols = rows, cols
        self.lines = [[" "] * cols for _ in range(rows)]
        self.history: list[str] = []
        self.row = self.col = 0
        self.wrap_pending = False
        self.autowrap = True
        self.saved = (0, 0)
        self._rest = ""

    def feed(self, data: str) -> list[str]:
        """Apply output; returns the replies the terminal sends back (CPR)."""
        data = self._rest + data
        self._rest = ""
        replies: list[str] = []
        pos = 0
        while pos < len(data):
            ch = data[pos]
            if ch == "\x1b":
                m = self._ESC.match(data, pos)
                if m is None:
                    if self._PARTIAL.match(data, pos):  # cut by the read: finish it next time
                        self._rest = data[pos:]
                        break
                    pos += 1
                    continue
                pos = m.end()
                if m.group(4) is not None:
                    reply = self._csi(m.group(1), m.group(2), m.group(3), m.group(4))
                    if reply:
                        replies.append(reply)
                elif m.group(0) == "\x1b7":
                    self.saved = (self.row, self.col)
                elif m.group(0) == "\x1b8":
                    self.row, self.col = self.saved
            elif ch < " ":
                self._control(ch)
                pos += 1
            else:
                m = self._TEXT.match(data, pos)
                for c in m.group(0):
                    self._put(c)
                pos = m.end()
        return replies

    def _control(self, ch: str) -> None:
        if ch == "\r":
            self.col, self.wrap_pending = 0, False
        elif ch == "\n":
            self._line_feed()
        elif ch == "\b":
            self.col, self.wrap_pending = max(0, self.col - 1), False
        elif ch == "\t":
            self.col = min(self.cols - 1, (self.col // 8 + 1) * 8)

    def _line_feed(self) -> None:
        self.wrap_pending = False
        if self.row == self.rows - 1:
            self.history.append("".join(self.lines.pop(0)).rstrip())
            self.lines.append([" "] * self.cols)
        else:
            self.row += 1

    def _put(self, ch: str) -> None:
        if self.wrap_pending and self.autowrap:
            self.col = 0
            self._line_feed()
        self.lines[self.row][self.col] = ch
        if self.col == self.cols - 1:
            self.wrap_pending = True
        else:
            self.col += 1

    def _csi(self, private: str, params: str, inter: str, final: str) -> str | None:
        if inter:
            return None  # e.g. cursor shape (CSI n SP q)
        if private:
            if private == "?" and params == "7" and final in "hl":
                self.autowrap = final == "h"
            return None
        nums = [int(p) if p else 0 for p in params.split(";")] if params else []
        n = nums[0] if nums and nums[0] else 1
        self.wrap_pending = False
        if final == "A":
            self.row = max(0, self.row - n)
        elif final == "B":
            self.row = min(self.rows - 1, self.row + n)
        elif final == "C":
            self.col = min(self.cols - 1, self.col + n)
        elif final == "D":
            self.col = max(0, self.col - n)
        elif final in "Hf":
            r = nums[0] if nums and nums[0] else 1
            c = nums[1] if len(nums) > 1 and nums[1] else 1
            self.row, self.col = min(self.rows, r) - 1, min(self.cols, c) - 1
        elif final == "G":
            self.col = min(self.cols, n) - 1
        elif final == "d":
            self.row = min(self.rows, n) - 1
        elif final == "K":
            mode = nums[0] if nums else 0
            line = self.lines[self.row]
            lo, hi = {0: (self.col, self.cols), 1: (0, self.col + 1)}.get(mode, (0, self.cols))
            line[lo:hi] = [" "] * (hi - lo)
        elif final == "J":
            mode = nums[0] if nums else 0
            if mode == 0:
                self.lines[self.row][self.col:] = [" "] * (self.cols - self.col)
                for r in range(self.row + 1, self.rows):
                    self.lines[r] = [" "] * self.cols
            elif mode == 1:
                for r in range(self.row):
                    self.lines[r] = [" "] * self.cols
                self.lines[self.row][:self.col + 1] = [" "] * (self.col + 1)
            else:
                self.lines = [[" "] * self.cols for _ in range(self.rows)]
        elif final == "X":
            self.lines[self.row][self.col:self.col + n] = [" "] * min(n, self.cols - self.col)
        elif final == "n" and nums and nums[0] == 6:
            return f"\x1b[{self.row + 1};{self.col + 1}R"
        return None

    def display(self) -> list[str]:
        return ["".join(line).rstrip() for line in self.lines]

    def text(self) -> str:
        """Everything that scrolled off, then the screen."""
        return "\n".join(self.history + self.display())


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b.")


class Chat:
    """``python -m fsm chat`` in a pseudo-terminal, read through :class:`Screen`."""

    def __init__(self, base_url: str, settings: dict | None, tmp_path: Path, *extra: str) -> None:
        args = ["-m", "fsm", "chat", "--base-url", base_url, "--model", "fault-model",
                "--api-key", "test-key", *extra]
        if "--session-file" not in extra and "--session-dir" not in extra:
            args.append("--no-session")
        if settings is not None:
            path = tmp_path / "settings.json"
            path.write_text(json.dumps({"retry": settings}), encoding="utf-8")
            args += ["--settings", str(path)]
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OPENAI_", "PROMPT_TOOLKIT_"))}
        env.update(TERM="xterm", LANG="C.UTF-8", LC_ALL="C.UTF-8", PYTHONUNBUFFERED="1")
        env.pop("COLUMNS", None)
        env.pop("LINES", None)
        self.screen = Screen(ROWS, COLS)
        self.raw: list[str] = []
        self._lock = threading.Lock()
        self.child = pexpect.spawn(sys.executable, args, cwd=str(ROOT), env=env, encoding="utf-8",
                                   codec_errors="replace", dimensions=(ROWS, COLS), timeout=WAIT_S)
        self._eof = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = self.child.read_nonblocking(65536, timeout=0.05)
            except pexpect.TIMEOUT:
                continue
            except (pexpect.EOF, OSError, ValueError):
                self._eof.set()
                return
            with self._lock:
                self.raw.append(data)
                replies = self.screen.feed(data)
            for reply in replies:
                try:
                    self.child.send(reply)
                except OSError:
                    pass

    # -- reading
    def display(self) -> str:
        with self._lock:
            return "\n".join(self.screen.display())

    def transcript(self) -> str:
        with self._lock:
            return self.screen.text()

    def raw_text(self) -> str:
        """All output so far with escape sequences removed (what was ever drawn)."""
        with self._lock:
            return _ANSI.sub("", "".join(self.raw))

    def wait_for(self, pattern: str, *, where: str = "display", timeout: float = WAIT_S) -> re.Match:
        """Wait until ``pattern`` (a regex) matches the screen (``display``) or the
        ``transcript`` (scrollback + screen); fails with the screen in the message."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            text = self.display() if where == "display" else self.transcript()
            m = regex.search(text)
            if m:
                return m
            if time.monotonic() > deadline or (self._eof.is_set() and not regex.search(
                    self.display() if where == "display" else self.transcript())):
                why = "the program exited" if self._eof.is_set() else f"{timeout:.0f} s passed"
                pytest.fail(f"{why} without {pattern!r} on the {where}; screen:\n"
                            f"{self.transcript()}")
            time.sleep(0.02)

    def status(self) -> str:
        """The status line (the last non-blank line of the screen)."""
        lines = [line for line in self.display().splitlines() if line.strip()]
        return lines[-1] if lines else ""

    # -- writing
    def send(self, text: str) -> None:
        self.child.send(text)

    def line(self, text: str) -> None:
        self.child.send(text)
        time.sleep(0.05)  # let the line be read before Enter, like a typist
        self.child.send("\r")

    def ready(self) -> None:
        self.wait_for(r"(?m)^>( |$)")
        self.wait_for(r"fault-model · retry (on|off) · idle")

    def wait_exit(self, timeout: float = WAIT_S) -> int:
        if not self._eof.wait(timeout):
            pytest.fail(f"chat did not exit; screen:\n{self.transcript()}")
        self.child.close()
        return self.child.exitstatus if self.child.exitstatus is not None else -(self.child.signalstatus or 0)

    def kill(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)
        self.child.close()


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
    chat.wait_for(r"Retry cancelled after 1 attempt", where="transcript")
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
    assert "Retry cancelled after 1 attempt" in text
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
