"""A throw-away ``redis-server`` for tests, benchmarks and demos: a free loopback port, a
temporary folder, no persistence (``--save '' --appendonly no``); and a throw-away Redis
Cluster of three masters beside it (:class:`RedisClusterServer`, SPEC §15.10).

``make setup`` installs the ``redis-server`` and ``redis-cli`` binaries through the system
package manager.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["RedisClusterServer", "RedisServer", "free_port"]


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
    ``folder`` (default: a new temporary one) holds its log; ``extra`` are more
    ``redis-server`` options (a cluster node's: :class:`RedisClusterServer`).
    """

    def __init__(self, binary: str | None = None, port: int | None = None,
                 folder: Path | None = None, extra: tuple[str, ...] = ()) -> None:
        found = binary or shutil.which("redis-server")
        if not found:
            raise FileNotFoundError("redis-server not found: run `make setup` (it installs it)")
        self.binary = found
        self.port = port or free_port()
        self._own_folder = folder is None  # removed by stop() and by a start that fails
        if folder is None:
            folder = Path(tempfile.mkdtemp(prefix="retry-fsm-redis-"))
        self.folder = folder
        self.extra = tuple(extra)  # more redis-server options (a cluster node's)
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> "RedisServer":
        """Launch the server and wait until it answers ``PING``; a start that fails leaves no
        process and no folder of its own behind (``RuntimeError``, ``FileNotFoundError``)."""
        try:
            return self._start(timeout_s)
        except BaseException:
            self.kill()
            if self._own_folder:
                shutil.rmtree(self.folder, ignore_errors=True)
            raise

    def _start(self, timeout_s: float) -> "RedisServer":
        self.folder.mkdir(parents=True, exist_ok=True)  # again after a start that failed
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.folder), "--save", "", "--appendonly", "no",
                "--daemonize", "no", "--protected-mode", "yes", "--loglevel", "warning",
                "--logfile", str(self.folder / "redis.log"), *self.extra]
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


def _bus_port_option(binary: str) -> bool:
    """Whether ``binary`` (a ``redis-server``) takes ``--cluster-port`` (Redis 7 and later;
    before, a node's cluster bus is its port + 10,000)."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return True
    found = re.search(r"v=(\d+)\.", out)
    return found is None or int(found.group(1)) >= 7


def _free_port_with_bus() -> int:
    """A free port P on 127.0.0.1 whose cluster bus port P + 10,000 is free too (Redis < 7)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20_000, 55_000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10_000))
            return port
        except OSError:
            continue
    raise RuntimeError("found no free port P with P + 10000 free for a cluster node")


class RedisClusterServer:
    """A Redis Cluster of ``masters`` (default three) ``redis-server`` processes on 127.0.0.1,
    no replicas, owned by this object (SPEC §15.10: the fleet's tests run against it as well
    as against one Redis).

    ``start()`` (or ``with RedisClusterServer() as cluster``) launches each node with
    ``--cluster-enabled yes`` on a free port (and a free cluster-bus port), joins them with
    ``redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes`` and waits until
    every node answers ``cluster_state:ok`` (about a second); ``url`` is its address,
    ``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3``. ``stop()`` ends every node
    and removes their folder. Raises ``FileNotFoundError`` when ``redis-server`` or
    ``redis-cli`` is missing (``make setup`` installs both) and ``RuntimeError`` when the
    cluster does not form within ``timeout_s``.
    """

    def __init__(self, masters: int = 3, binary: str | None = None, cli: str | None = None) -> None:
        if isinstance(masters, bool) or not isinstance(masters, int) or masters < 1:
            raise ValueError(f"a cluster needs at least one master, got {masters!r}")
        found = cli or shutil.which("redis-cli")
        if not found:
            raise FileNotFoundError("redis-cli not found: run `make setup` (it installs it)")
        self.cli = found
        self.folder = Path(tempfile.mkdtemp(prefix="retry-fsm-cluster-"))
        self.nodes: list[RedisServer] = []
        try:  # a missing redis-server, no free port: the folder is not left behind
            bus_option = _bus_port_option(binary or shutil.which("redis-server") or "redis-server")
            for n in range(masters):
                folder = self.folder / f"node{n}"
                folder.mkdir()
                bus = ("--cluster-port", str(free_port())) if bus_option else ()
                self.nodes.append(RedisServer(binary, port=None if bus_option else _free_port_with_bus(),
                                              folder=folder, extra=(
                    "--cluster-enabled", "yes", "--cluster-config-file", str(folder / "nodes.conf"),
                    *bus, "--cluster-node-timeout", "5000")))
        except BaseException:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def start(self, timeout_s: float = 30.0) -> "RedisClusterServer":
        deadline = time.monotonic() + timeout_s
        try:
            for node in self.nodes:
                node.start(timeout_s)
            made = subprocess.run(
                [self.cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                 "--cluster-replicas", "0", "--cluster-yes"],
                stdin=subprocess.DEVNULL, capture_output=True, text=True,
                timeout=max(1.0, deadline - time.monotonic()))
            if made.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed ({made.returncode}): "
                                   f"{(made.stdout + made.stderr)[-500:]}")
            while not all(self._state_ok(port) for port in self.ports):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the cluster on ports {self.ports} was not ok in {timeout_s} s")
                time.sleep(0.02)
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _state_ok(port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"CLUSTER INFO\r\n")
                data = b""
                while b"cluster_state:" not in data or not data.endswith(b"\r\n"):
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                return b"cluster_state:ok" in data
        except OSError:
            return False

    def stop(self) -> None:
        """End every node (SIGTERM, then SIGKILL) and remove their folder."""
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> "RedisClusterServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
