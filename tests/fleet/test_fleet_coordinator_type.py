"""`coordinator_from_url()` is typed with what docs/fleet.md calls on it (`warm_up`, `aclose`);
that the type checkers see it so is checked with the runner's signatures, in one mypy and one
pyright run (tests/host/test_runner_typing.py, tests/typing/runner_signatures.py)."""

from __future__ import annotations

from fsm.fleet import (FleetCoordinator, GuardedCoordinator, InProcessCoordinator, RedisCoordinator,
                       coordinator_from_url)


def test_every_coordinator_the_url_can_name_is_a_fleet_coordinator():
    """docs/fleet.md "When Redis is down": the in-process, guarded and Redis coordinators all
    have `warm_up` and `aclose`, so the return type promises only what each one has."""
    for cls in (InProcessCoordinator, GuardedCoordinator, RedisCoordinator):
        assert callable(getattr(cls, "warm_up")) and callable(getattr(cls, "aclose"))
    assert isinstance(coordinator_from_url(None), FleetCoordinator)


async def test_the_in_process_coordinator_warms_up_at_once():
    """docs/fleet.md: `await coordinator.warm_up()` works whatever the URL named (memory: True)."""
    assert await InProcessCoordinator().warm_up() is True
