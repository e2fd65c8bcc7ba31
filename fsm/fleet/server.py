"""A throw-away ``redis-server`` for tests, benchmarks and demos: a free loopback port, a
temporary folder, no persistence (``--save '' --appendonly no``).

``make setup`` installs the ``redis-server`` binary through the system package manager.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["RedisServer", "free_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1, owned by this object.

    ``start()`` (or ``with RedisServer() as server``) launches it and waits until it answers
    ``PING``; ``url`` is its address. :meth:`kill`, :meth:`pause` (SIGSTOP), :meth:`resume`
    (SIGCONT) and :meth:`restart` (same port, empty data) let tests break it on purpose.
    ``stop()`` ends it and removes its folder. Raises ``FileNotFoundError`` when the binary
    is missing (``make setup`` installs it) and ``RuntimeError`` when it does not start.
    """

    def __init__(self, binary: str | None = None, port: int | None = None) -> None:
        found = binary or shutil.which("redis-server")
        if not found:
            raise FileNotFoundError("redis-server not found: run `make setup` (it installs it)")
        self.binary = found
        self.port = port or free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="retry-fsm-redis-"))
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> "RedisServer":
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.folder), "--save", "", "--appendonly", "no",
                "--daemonize", "no", "--protected-mode", "yes", "--loglevel", "warning",
                "--logfile", str(self.folder / "redis.log")]
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            if self.process.poll() is not None:
                log = (self.folder / "redis.log")
                tail = log.read_text(errors="replace")[-500:] if log.exists() else ""
                raise RuntimeError(f"redis-server exited with {self.process.returncode}: {tail}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server did not answer on port {self.port} in {timeout_s} s")
            time.sleep(0.01)
        return self

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def pause(self) -> None:
        """SIGSTOP: the server keeps its connections but answers nothing."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL and reap (the data is lost; there is no persistence)."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)  # a paused process is killable, but be plain
            self.process.kill()
            self.process.wait(10)

    def restart(self) -> None:
        """Kill, then start again on the same port (empty)."""
        self.kill()
        self.start()

    def stop(self) -> None:
        """End the server (SIGTERM, then SIGKILL) and remove its folder."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
