# pyright: strict
"""Checked by mypy --strict and by pyright from tests/host/test_runner_typing.py: the runner's
decorators and entries keep the wrapped callable's signature (ParamSpec), and the coordinator a
URL names has what docs/fleet.md calls on it (docs/embedding.md "Types"; SPEC §15.13).

Each ``reveal_type`` line is read back by the test: the revealed signature must name the
wrapped function's parameters, never ``Any`` in their place.
"""

from __future__ import annotations

import asyncio

from typing_extensions import assert_type, reveal_type

import fsm
from fsm.fleet import FleetCoordinator, coordinator_from_url
from fsm.host.runner import RetryRunner


@fsm.retry
async def ask(prompt: str, *, temperature: float = 0.0) -> int:
    return len(prompt)


@fsm.retry
def ask_blocking(prompt: str, *, temperature: float = 0.0) -> bytes:
    return prompt.encode()


@fsm.retry(settings={"maxRetries": 2})
def ask_sync(prompt: str) -> str:
    return prompt


@fsm.retry(settings=fsm.RetrySettings(max_retries=3), on_event=print)
async def ask_async(prompt: str, count: int) -> list[str]:
    return [prompt] * count


runner = fsm.RetryRunner({"maxRetries": 1})


@runner
async def ask_with_runner(prompt: str) -> float:
    return float(len(prompt))


@runner
def ask_sync_with_runner(prompt: str) -> tuple[str, int]:
    return prompt, len(prompt)


reveal_type(ask)
reveal_type(ask_blocking)
reveal_type(ask_sync)
reveal_type(ask_async)
reveal_type(ask_with_runner)
reveal_type(ask_sync_with_runner)


async def check() -> None:
    assert_type(await ask("hi", temperature=0.5), int)
    assert_type(await asyncio.create_task(ask_async("hi", 1)), list[str])
    assert_type(asyncio.run(ask_with_runner("hi")), float)
    assert_type(ask_blocking("hi", temperature=0.5), bytes)
    assert_type(ask_sync("hi"), str)
    assert_type(await ask_async("hi", 2), list[str])
    assert_type(await ask_with_runner("hi"), float)
    assert_type(ask_sync_with_runner("hi"), tuple[str, int])
    assert_type(fsm.retry(settings={"maxRetries": 2}), RetryRunner)
    assert_type(fsm.retry(), RetryRunner)
    assert_type(await fsm.retrying(ask, "hi"), int)
    assert_type(await fsm.retrying(ask, "hi", settings={"maxRetries": 1}), int)
    assert_type(fsm.retrying_sync(ask_sync, "hi"), str)
    assert_type(fsm.retrying_sync(ask_sync, "hi", settings={"maxRetries": 1}), str)
    assert_type(await RetryRunner().run(ask, "hi"), int)
    assert_type(await RetryRunner().run(ask, "hi", temperature=1.0), int)
    assert_type(RetryRunner().run_sync(ask_sync, "hi"), str)
    assert_type(RetryRunner().run_sync(ask_blocking, "hi", temperature=1.0), bytes)


async def check_coordinator() -> None:
    coordinator = coordinator_from_url("redis://localhost:6379/0")
    assert_type(coordinator, FleetCoordinator)
    assert_type(await coordinator.warm_up(), bool | None)
    assert_type(await coordinator.aclose(), None)
    assert_type(await coordinator_from_url(None).warm_up(), bool | None)
