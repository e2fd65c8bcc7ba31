"""SPEC §15.13 "No traffic off the machine": the suite's guard (tests/conftest.py) refuses a
connection to an address that is not loopback and a lookup of a name that is not this
machine's, and fails the test that tried; loopback traffic goes through untouched."""

from __future__ import annotations

import os
import socket

import pytest

from fsm.testing.fault_server import FaultServer


def test_a_connection_to_another_machine_is_refused_and_recorded(off_machine_attempts):
    """192.0.2.1 (TEST-NET-1) is refused before any packet leaves, and recorded for the
    test's teardown to fail it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        with pytest.raises(ConnectionRefusedError, match="SPEC §15.13"):
            sock.connect(("192.0.2.1", 443))
    finally:
        sock.close()
    assert off_machine_attempts == ["connect to ('192.0.2.1', 443)"]
    off_machine_attempts.clear()  # checked: this test tried on purpose


def test_a_lookup_of_another_machines_name_is_refused_and_recorded(off_machine_attempts):
    """A DNS lookup (``getaddrinfo``) of a public name is refused and recorded."""
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo("api.openai.com", 443)
    assert off_machine_attempts == ["name lookup of 'api.openai.com'"]
    off_machine_attempts.clear()


@pytest.mark.parametrize("family, address", [
    (socket.AF_INET, ("192.0.2.1", 53)), (socket.AF_INET6, ("2001:db8::1", 53, 0, 0))],
    ids=["ipv4", "ipv6"])
def test_a_datagram_to_another_machine_is_refused_and_recorded(off_machine_attempts, family, address):
    """A UDP ``sendto`` announces no connect: it is refused before the datagram leaves
    (TEST-NET-1, the IPv6 documentation prefix), and recorded."""
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        with pytest.raises(ConnectionRefusedError, match="SPEC §15.13"):
            sock.sendto(b"x", address)
    finally:
        sock.close()
    assert off_machine_attempts == [f"datagram to {address!r}"]
    off_machine_attempts.clear()


@pytest.mark.parametrize("lookup", [lambda: socket.gethostbyaddr("192.0.2.1"),
                                    lambda: socket.getnameinfo(("192.0.2.1", 443), 0)],
                         ids=["gethostbyaddr", "getnameinfo"])
def test_a_reverse_lookup_of_another_machine_is_refused_and_recorded(off_machine_attempts, lookup):
    """A reverse lookup of an address that is not loopback asks a name server: refused."""
    with pytest.raises(socket.herror, match="SPEC §15.13"):
        lookup()
    assert off_machine_attempts == ["reverse lookup of '192.0.2.1'"]
    off_machine_attempts.clear()


def test_loopback_over_ipv6_as_an_ipv4_mapped_address_and_by_name_goes_through(off_machine_attempts):
    """``::1``, ``::ffff:127.0.0.1`` and ``localhost`` handed to a socket's own connect are
    this machine: a datagram to each goes, nothing is recorded (the mapped form and the name
    were refused as another machine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as v4, \
            socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as v6:
        v4.bind(("127.0.0.1", 0))
        v6.bind(("::1", 0))
        port4, port6 = v4.getsockname()[1], v6.getsockname()[1]
        for family, address in ((socket.AF_INET6, ("::1", port6)),
                                (socket.AF_INET6, ("::ffff:127.0.0.1", port4)),
                                (socket.AF_INET, ("127.0.0.1", port4)), (socket.AF_INET, ("localhost", port4))):
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.connect(address)
                sock.send(b"x")
                sock.sendto(b"x", address)
    assert socket.getnameinfo(("127.0.0.1", 9), socket.NI_NUMERICHOST)[0] == "127.0.0.1"
    assert off_machine_attempts == []


def test_loopback_traffic_and_local_names_go_through(off_machine_attempts):
    """The fault server on 127.0.0.1 and ``localhost`` are this machine: nothing recorded."""
    import urllib.request
    with FaultServer([]) as srv:
        with urllib.request.urlopen(f"http://localhost:{srv.port}/v1/models", timeout=10) as reply:
            assert reply.status == 200
    assert off_machine_attempts == []


def test_the_suite_reads_litellms_bundled_cost_map():
    """LiteLLM fetches its model cost map at import unless told to read the bundled copy."""
    assert os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert os.environ["OPENAI_AGENTS_DISABLE_TRACING"] == "1"
