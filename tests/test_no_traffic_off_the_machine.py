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
