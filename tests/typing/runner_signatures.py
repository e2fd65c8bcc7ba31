"""Checked by mypy --strict from tests/host/test_runner_typing.py: the runner's entries keep
the wrapped callable's signature (docs/embedding.md "Types")."""

from __future__ import annotations


from typing_extensions import assert_type

import fsm
from fsm.host.runner import RetryRunner


@fsm.retry
async def ask(prompt: str, *, temperature: float = 0.0) -> int:
    return len(prompt)


@fsm.retry(settings={"maxRetries": 2})
def ask_sync(prompt: str) -> str:
    return prompt


async def check() -> None:
    assert_type(await ask("hi", temperature=0.5), int)
    assert_type(ask_sync("hi"), str)
    assert_type(await fsm.retrying(ask, "hi"), int)
    assert_type(fsm.retrying_sync(ask_sync, "hi"), str)
    assert_type(await RetryRunner().run(ask, "hi"), int)
    assert_type(RetryRunner().run_sync(ask_sync, "hi"), str)
