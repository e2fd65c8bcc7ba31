"""Shared set-up of the test suite.

The tests mirror the package's layers (``tests/core``, ``tests/host``, ``tests/fleet``, ...);
the helpers every layer uses (``support.py``: the repository root and a subprocess environment;
``fleet_support.py``: throw-away Redis servers) sit beside this file, a layer's own shared
helpers in a ``*_support.py`` module of its folder (``host/session_support.py``,
``tui/pty_support.py``, ...); all of them import from any folder. A test module never imports
another test module (docs/architecture.md, "The layers"; tests/test_layers.py checks it).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# The shared helpers (support modules) import from any folder: a terminal test of a provider
# uses the chat tests' pseudo-terminal driver, tui/pty_support.py.
for folder in [TESTS, *sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name.isidentifier())]:
    if str(folder) not in sys.path:
        sys.path.append(str(folder))


# ------------------------------------------------------------------ no traffic off the machine
# SPEC §15.13 "No traffic off the machine": LiteLLM reads its bundled model cost map instead of
# fetching it at import, the Agents SDK exports no traces, and a test that tries to reach
# another machine fails (below). Set before any test module imports those packages.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback",
                          socket.gethostname().lower()})
_OFF_MACHINE: list[str] = []
"""What the running test tried to reach off the machine (read and cleared per test)."""


def _local_address(host: object) -> bool:
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str):
        return True  # an AF_UNIX path, a socket pair: never off the machine
    host = host.strip("[]").split("%", 1)[0]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # connect(("localhost", port)): the socket resolves the name itself
        return _local_name(host)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    return address.is_loopback or address.is_unspecified


def _local_name(host: object) -> bool:
    if host is None:
        return True  # getaddrinfo(None, port): the wildcard or loopback address, no lookup
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str):
        return True
    try:
        ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
        return True  # an address, not a name: no lookup (its connect is checked)
    except ValueError:
        pass
    name = host.lower().rstrip(".")
    return name in _LOCAL_NAMES or name.endswith(".localhost") or name == ""


def _no_traffic_off_the_machine(event: str, args: tuple) -> None:
    """An audit hook (it sees every socket of the process, whichever library or thread opens
    it): a connection or a datagram to an address that is not loopback, a name lookup of a host
    that is not this machine or a reverse lookup of an address that is not loopback, is refused
    here and recorded for the test's teardown to fail."""
    if event in ("socket.connect", "socket.sendto", "socket.sendmsg"):
        # sendto, sendmsg: a datagram (UDP) to an address, which no connect announces
        address = args[1]
        if address is None:
            return  # sendmsg on a connected socket: its connect was checked
        host = address[0] if isinstance(address, tuple) and address else address
        if not _local_address(host):
            what = "connect to" if event == "socket.connect" else "datagram to"
            _OFF_MACHINE.append(f"{what} {address!r}")
            raise ConnectionRefusedError(f"tests reach no other machine (SPEC §15.13): {what} {address!r}")
    elif event in ("socket.gethostbyaddr", "socket.getnameinfo"):
        # a reverse lookup of an address that is not this machine's asks a name server
        address = args[0]
        host = address[0] if isinstance(address, tuple) and address else address
        if not _local_address(host):
            _OFF_MACHINE.append(f"reverse lookup of {host!r}")
            raise socket.herror(1, f"tests reach no other machine (SPEC §15.13): reverse lookup of {host!r}")
    elif event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex"):
        if args and not _local_name(args[0]):
            _OFF_MACHINE.append(f"name lookup of {args[0]!r}")
            raise socket.gaierror(socket.EAI_NONAME, f"tests reach no other machine (SPEC §15.13): "
                                                     f"lookup of {args[0]!r}")


sys.addaudithook(_no_traffic_off_the_machine)


@pytest.fixture(autouse=True)
def _stays_on_the_machine():
    """Every test: no connection attempt to a non-loopback address and no lookup of a
    non-local name (SPEC §15.13 "No traffic off the machine"); the attempt itself was refused."""
    _OFF_MACHINE.clear()
    yield
    tried, _OFF_MACHINE[:] = list(_OFF_MACHINE), []
    if tried:
        pytest.fail("the test tried to reach another machine (SPEC §15.13): " + "; ".join(tried[:5]),
                    pytrace=False)


@pytest.fixture
def off_machine_attempts() -> list[str]:
    """The attempts to reach another machine the running test made so far (a test of the guard
    itself clears it once it has checked it)."""
    return _OFF_MACHINE


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """One ``python -m fsm demo`` with its scripted parts (short backoffs, part 2's hint 150 ms
    instead of 3 s), shared by the tests that read its output and files (the demo's own tests,
    the audit of its trace): ``(process, out folder)``."""
    from support import run_demo

    folder = tmp_path_factory.mktemp("demo")
    return run_demo(folder, "--hint-ms", "150"), folder / "out"
