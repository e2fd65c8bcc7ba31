"""A small terminal and ``python -m fsm chat`` driven in it: the pseudo-terminal driver the chat
tests and the providers' terminal tests share (tests share helpers through support modules,
docs/architecture.md "The layers").

The program runs for real (pexpect, 120x30, TERM=xterm). Its output goes through a small
terminal emulator (:class:`Screen`) so the tests read the screen a person would see:
prompt_toolkit redraws only the cells that change (a countdown from 3s to 2s sends one "2"),
so matching the raw byte stream would be fragile. The emulator also answers the cursor
position requests prompt_toolkit sends, as a real terminal does.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from pathlib import Path

import pytest

pexpect = pytest.importorskip("pexpect")

from support import ROOT  # noqa: E402

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
