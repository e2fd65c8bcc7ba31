"""The session tests' shared helpers: events of one type, and driving a prompt on the fake clock
(tests share helpers through support modules, docs/architecture.md "The layers")."""

from __future__ import annotations

import asyncio


def of(events, kind):
    """The events of type ``kind`` (copies), in order."""
    return [dict(e) for e in events if e["type"] == kind]


async def settle(clock, task, step=0.5, limit=600.0):
    """Advance the fake clock by ``step`` seconds until ``task`` is done (at most ``limit``
    seconds), then await it (a second of real time at most)."""
    waited = 0.0
    while not task.done() and waited < limit:
        await clock.advance(step)
        waited += step
    await asyncio.wait_for(task, 1)
    return waited


async def run(session, clock, text="hi", step=0.5, limit=200_000):
    """Prompt ``session`` with ``text`` and advance the fake clock until the prompt returns;
    the fake seconds waited."""
    return await settle(clock, asyncio.ensure_future(session.prompt(text)), step, limit)
