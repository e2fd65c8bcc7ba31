"""`coordinator_from_url()` is typed with what docs/fleet.md calls on it (`warm_up`, `aclose`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fsm.fleet import (FleetCoordinator, GuardedCoordinator, InProcessCoordinator, RedisCoordinator,
                       coordinator_from_url)

ROOT = Path(__file__).resolve().parents[2]

SNIPPET = '''
from typing import assert_type
from fsm.fleet import FleetCoordinator, coordinator_from_url


async def start(url: str | None) -> None:
    coordinator = coordinator_from_url(url)
    assert_type(coordinator, FleetCoordinator)
    assert_type(await coordinator.warm_up(), bool | None)
    await coordinator.aclose()
'''


def test_every_coordinator_the_url_can_name_is_a_fleet_coordinator():
    """docs/fleet.md "When Redis is down": the in-process, guarded and Redis coordinators all
    have `warm_up` and `aclose`, so the return type promises only what each one has."""
    for cls in (InProcessCoordinator, GuardedCoordinator, RedisCoordinator):
        assert callable(getattr(cls, "warm_up")) and callable(getattr(cls, "aclose"))
    assert isinstance(coordinator_from_url(None), FleetCoordinator)


async def test_the_in_process_coordinator_warms_up_at_once():
    """docs/fleet.md: `await coordinator.warm_up()` works whatever the URL named (memory: True)."""
    assert await InProcessCoordinator().warm_up() is True


@pytest.mark.subprocess
def test_mypy_strict_sees_warm_up_on_what_coordinator_from_url_returns(tmp_path):
    """docs/fleet.md: under `mypy --strict` a host's `await coordinator_from_url(url).warm_up()`
    type-checks (it was typed `Coordinator`, which has no `warm_up`)."""
    (tmp_path / "host.py").write_text(SNIPPET)
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                           "--no-incremental", "--config-file", os.devnull, str(tmp_path / "host.py")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
