"""One failure script through every host a user can choose (SPEC §15.1; docs/integrations.md,
"What a host cannot act on"): the hosts, the scripts, what each script must give, and the one
table of docs/integrations.md read as data.

Each host runs the script's call against the fault server with the same settings, an injected
virtual clock (no real sleep: every wait is recorded and returns at once) and a recording
in-process coordinator (the retry budget's tokens). An :class:`Observation` is what the host
did: the requests on the wire (their ``model``), the waits (ms), the ``auto_retry_*`` and
``retry_fallback`` events (their stable fields), the outcome (see :func:`outcome_of`) and the
budget's accounting (tokens taken, given back, credits).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from pathlib import Path
from typing import Any, Callable

import openai

from fsm import RetryRunner
from fsm.core.settings import RetrySettings
from fsm.fleet import InProcessCoordinator
from fsm.host.session import AgentSession
from fsm.providers.openai_chat import OpenAIChatProvider
from fsm.testing import FakeClock

DOCS = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
MODEL = "gpt-test"
PROMPT = [{"role": "user", "content": "hi"}]

SETTINGS = {"baseDelayMs": 100, "maxDelayMs": 1000, "jitter": "none", "retryHints": "honor",
            "maxHintWaitMs": 60_000, "budget": {"maxTokens": 20, "tokenRatio": 0.5}}
"""The settings every host runs with (a script adds its own keys)."""


def _status(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> dict:
    return {"status": status, "headers": headers or {},
            "json": {"error": {"type": kind, "message": message}}}


OK = {"stream": ["ok"]}
OVERLOADED = _status(529, "overloaded_error", "Overloaded")
RATE_LIMITED_300MS = _status(429, "rate_limit_error", "Rate limit reached",
                             {"retry-after-ms": "300"})
RATE_LIMITED_2MIN = _status(429, "rate_limit_error", "Rate limit reached", {"retry-after": "120"})
BAD_REQUEST = _status(400, "invalid_request_error", "Invalid value for 'messages'")
DROPPED = {"stream": [], "drop": True}  # the headers, then the connection is reset


@dataclasses.dataclass(frozen=True)
class Script:
    """A failure script: the fault server's answers, settings of its own, what every host must
    observe, and the rows of the one table it depends on (``fields`` a host exempted by a row
    is not held to; it must then differ there, or the table is stale)."""

    answers: list[dict]
    expected: "Observation"
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    rows: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Observation:
    requests: tuple[str, ...]
    waits: tuple[int, ...]
    events: tuple[tuple[Any, ...], ...]
    outcome: tuple[Any, ...]
    tokens: tuple[int, int, int]

    FIELDS = ("requests", "waits", "events", "outcome", "tokens")

    def differences(self, other: "Observation", fields: tuple[str, ...] = FIELDS) -> list[str]:
        return [f"{name}: {getattr(self, name)!r} != {getattr(other, name)!r}"
                for name in fields if getattr(self, name) != getattr(other, name)]


def start(attempt: int, max_attempts: int, delay_ms: int, source: str) -> tuple:
    return ("auto_retry_start", attempt, max_attempts, delay_ms, source)


def end(success: bool, attempt: int, reason: str) -> tuple:
    return ("auto_retry_end", success, attempt, reason)


SCRIPTS: dict[str, Script] = {
    "429 with hint": Script(
        [RATE_LIMITED_300MS, OK],
        Observation((MODEL,) * 2, (300,), (start(1, 3, 300, "hint"), end(True, 1, "succeeded")),
                    ("ok",), (1, 0, 1))),
    "529 burst then success": Script(
        [OVERLOADED, OVERLOADED, OVERLOADED, OK],
        Observation((MODEL,) * 4, (100, 200, 400),
                    (start(1, 3, 100, "backoff"), start(2, 3, 200, "backoff"),
                     start(3, 3, 400, "backoff"), end(True, 3, "succeeded")),
                    ("ok",), (3, 0, 1))),
    "fatal 400": Script(
        [BAD_REQUEST],
        Observation((MODEL,), (), (), ("own", None), (0, 0, 0))),
    "connection drop": Script(
        [DROPPED, OK],
        Observation((MODEL,) * 2, (100,), (start(1, 3, 100, "backoff"), end(True, 1, "succeeded")),
                    ("ok",), (1, 0, 1)),
        rows={"a failure after the response headers": Observation.FIELDS}),
    "hint too long": Script(
        [RATE_LIMITED_2MIN],
        Observation((MODEL,), (), (end(False, 0, "hint_too_long"),), ("own", "hint_too_long"),
                    (1, 1, 0)),
        rows={"the exception of a chain's end": ("outcome",)}),
    "529s then a fallback model": Script(
        [OVERLOADED, OVERLOADED, OK],
        Observation((MODEL, MODEL, "gpt-small"), (100, 0),
                    (start(1, 4, 100, "backoff"), ("retry_fallback", MODEL, "gpt-small"),
                     start(2, 4, 0, "fallback"), end(True, 2, "succeeded")),
                    ("ok",), (2, 0, 1)),
        settings={"fallbackModels": ["gpt-small"]},
        rows={"fallback switch": Observation.FIELDS}),
    "exhausted chain": Script(
        [OVERLOADED] * 3,
        Observation((MODEL,) * 3, (100, 200), (start(1, 2, 100, "backoff"),
                                                start(2, 2, 200, "backoff"),
                                                end(False, 2, "exhausted")),
                    ("RetryChainError", "exhausted"), (3, 1, 0)),
        settings={"maxRetries": 2},
        rows={"the exception of a chain's end": ("outcome",)}),
    "529s under pacing": Script(
        [OVERLOADED] * 3 + [OK],
        # the second 529 within a second engages pacing (a lone throttle does not, SPEC §15.7):
        # the third retry waits for its slot (600 ms) after its backoff
        Observation((MODEL,) * 4, (100, 200, 400, 600),
                    (start(1, 3, 100, "backoff"), start(2, 3, 200, "backoff"),
                     start(3, 3, 400, "backoff"), end(True, 3, "succeeded")),
                    ("ok",), (3, 0, 1)),
        settings={"pacing": {"minRate": 1, "maxRate": 2}}),
    "resilient: budget in wait mode, pacing": Script(
        [OVERLOADED] * 3 + [OK],
        Observation((MODEL,) * 4, (100, 1900, 2000),
                    (start(1, 100, 100, "backoff"), start(2, 100, 1900, "budget"),
                     start(3, 100, 2000, "budget"), end(True, 3, "succeeded")),
                    ("ok",), (0, 0, 1)),
        settings={"profile": "resilient", "jitter": "none", "maxElapsedMs": None,
                  "idleTimeoutMs": None, "pacing": {"minRate": 1, "maxRate": 2},
                  "budget": {"maxTokens": 2, "tokenRatio": 0.5, "mode": "wait",
                             "minRetriesPerSecond": 0.5}}),
}
DEADLINE_IN_ATTEMPT = Script(
    [OVERLOADED, {"hang_ms": 5_000, "stream": ["ok"]}],
    # the chain starts at the 529 (its deadline 1 s away); the retry goes after 100 ms and is
    # still running when the deadline comes 900 ms later: it is aborted, the chain ends
    # ``deadline`` (docs/policy.md §13.2); the retry's token was spent (it went)
    Observation((MODEL,) * 2, (100, 900), (start(1, 3, 100, "backoff"), end(False, 1, "deadline")),
                ("RetryChainError", "deadline"), (1, 0, 0)),
    settings={"maxElapsedMs": 1_000},
    rows={"maxElapsedMs reached during an attempt": ("waits", "events", "outcome", "tokens")})
"""The chain's deadline passes while an attempt runs (not in :data:`SCRIPTS`: a host that
cannot stop its attempt would wait for the fault server's hang; it runs its slow attempt on
the virtual clock instead, tests/integrations/test_deadline_parity.py)."""

"""Under pacing, the waits between the backoffs are the pacer's slots (its rate cut by the
529s, docs/fleet.md "Pacing"); in wait mode the budget's floor slot is waited and asked again
(docs/fleet.md "Budget in wait mode"). The resilient script leaves out ``maxElapsedMs`` and the
stall watchdog (the virtual clock fires every timer at once)."""


# ---------------------------------------------------------------------------- the one table
HOST_COLUMNS = {"session": "session", "runner async": "runner", "runner sync": "runner",
                "httpx2 async": "httpx2 transports", "httpx2 sync": "httpx2 transports",
                "tenacity": "tenacity", "LangChain": "LangChain", "pydantic-ai": "pydantic-ai",
                "LangGraph sync": "LangGraph", "LangGraph async": "LangGraph"}
"""Each host's column in the table."""


def one_table(path: Path = DOCS) -> dict[str, dict[str, str]]:
    """docs/integrations.md's table "What a host cannot act on" as ``{row: {column: cell}}``
    (the row named by its first cell without Markdown)."""
    text = path.read_text(encoding="utf-8")
    section = text.split("### What a host cannot act on (one table)", 1)[1]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    table: dict[str, dict[str, str]] = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        table[re.sub(r"[`*]", "", cells[0])] = dict(zip(header[1:], cells[1:]))
    return table


def cell_of(host: str, cell: str) -> str:
    """What a cell says of ``host``: a cell that speaks of a host's sync form apart ("acts
    (...); sync: cannot (...)") says the part after ``sync:`` of a ``… sync`` host."""
    if host.endswith(" sync") and "sync: " in cell:
        return cell.split("sync: ", 1)[1]
    return cell


def exemptions(script: Script, host: str, table: dict[str, dict[str, str]]) -> dict[str, str]:
    """``{field: the table's cell}`` for the fields ``host`` is not held to on ``script``: a
    row the script depends on whose cell for the host (:func:`cell_of`) does not begin with
    "acts"."""
    out: dict[str, str] = {}
    for row, fields in script.rows.items():
        matches = [cells for name, cells in table.items() if name.startswith(row)]
        assert len(matches) == 1, f"docs/integrations.md's one table has no row {row!r}"
        cell = cell_of(host, matches[0][HOST_COLUMNS[host]])
        if not cell.startswith("acts"):
            out.update(dict.fromkeys(fields, cell))
    return out


# ---------------------------------------------------------------------------- the world
class VirtualClock(FakeClock):
    """A host clock on which every wait is recorded (ms) and ends at once: ``call_later``
    (the session, the async hosts), ``sleep`` (sync hosts), ``asleep`` (an async ``sleep=``)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[int] = []

    def _wait(self, seconds: float) -> None:
        self.waits.append(round(seconds * 1000))
        self.now += seconds

    def call_later(self, delay_s: float, callback: Callable[..., Any], *args: Any) -> Any:
        self._wait(delay_s)
        return asyncio.get_running_loop().call_soon(callback, *args)

    def sleep(self, seconds: float) -> None:
        self._wait(seconds)

    async def asleep(self, seconds: float) -> None:
        self._wait(seconds)


class RecordingCoordinator(InProcessCoordinator):
    """The in-process coordinator, counting the retry budget's tokens: taken by a retry's
    admission, given back, credited by a success."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(clock=clock.time_ms)
        self.taken = self.returned = self.credited = 0

    async def admit(self, key: Any, **options: Any) -> Any:
        answer = await super().admit(key, **options)
        if options.get("retry") and answer.token_taken:
            self.taken += 1
        return answer

    async def return_retry_token(self, key: Any, budget: Any, **options: Any) -> None:
        self.returned += 1
        await super().return_retry_token(key, budget)

    async def record_outcome(self, key: Any, **options: Any) -> None:
        if options.get("success") and options.get("budget") is not None:
            self.credited += 1
        await super().record_outcome(key, **options)

    def accounting(self) -> tuple[int, int, int]:
        return self.taken, self.returned, self.credited


def outcome_of(result: Any = None, error: BaseException | None = None) -> tuple[Any, ...]:
    """The outcome as the contract of docs/policy.md §10 (§14b.14) reads it: ``("ok",)``;
    ``("own", reason)``: the caller's own exception (an SDK's or a framework's), ``reason`` the
    ``endReason`` its ``retry-fsm: not retried`` note names (None without one);
    ``("RetryChainError", endReason)``; a session's :class:`~fsm.host.session.TurnOutcome` maps
    onto the same shapes (its chain's end at attempt 0 is a refusal at rest)."""
    from fsm import RetryChainError
    from fsm.host.session import TurnOutcome
    if isinstance(result, TurnOutcome):
        if result.success:
            return ("ok",)
        if result.end_reason is None or result.attempts == 0:
            return ("own", result.end_reason)
        return ("RetryChainError", result.end_reason)
    if error is None:
        return ("ok",)
    if isinstance(error, RetryChainError):
        return ("RetryChainError", error.end_reason)
    notes = " ".join(getattr(error, "__notes__", ()))
    noted = re.search(r"not retried \(endReason: (\w+)", notes)
    return ("own", noted.group(1) if noted else None)


def shown(event: Any) -> tuple[Any, ...] | None:
    """An event's fields every host must agree on (None: not a retry event)."""
    kind = event["type"]
    if kind == "auto_retry_start":
        return start(event["attempt"], event["maxAttempts"], event["delayMs"],
                     event["delaySource"])
    if kind == "auto_retry_end":
        return end(event["success"], event["attempt"], event["endReason"])
    if kind == "retry_fallback":
        return (kind, event["from"], event["to"])
    return None


# ---------------------------------------------------------------------------- shared hosts
KEY = "sk-test"
"""The API key every host sends to the fault server."""


def run_settled(coro: Any) -> Any:
    """``asyncio.run(coro)``, letting the coordinator's writes the call spawned land first
    (a budget token given back in the background is part of the call's accounting)."""
    async def settled():
        try:
            return await coro
        finally:
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            if others:
                await asyncio.wait(others, timeout=5)
    return asyncio.run(settled())



def session_host(srv, settings, clock, coordinator, events):
    async def run():
        session = AgentSession(OpenAIChatProvider(base_url=srv.base_url, model=MODEL,
                                                  api_key=KEY),
                               settings=RetrySettings.coerce(settings), clock=clock,
                               coordinator=coordinator)
        session.subscribe(events.append)
        try:
            return await session.prompt("hi")
        finally:
            await session.close()
    return run_settled(run())



def runner_async_host(srv, settings, clock, coordinator, events):
    async def run():
        runner = RetryRunner(settings, on_event=events.append, coordinator=coordinator,
                             clock=clock, sleep=clock.asleep)
        async with openai.AsyncOpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0) as client:
            return await runner.run(client.chat.completions.create, model=MODEL, messages=PROMPT)
    return run_settled(run())


def one_node_graph(node: Any) -> Any:
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        answer: str

    graph = StateGraph(State)
    graph.add_node("ask", node)  # no retry_policy: one retry owner
    graph.add_edge(START, "ask")
    graph.add_edge("ask", END)
    return graph.compile()


def langgraph_async_host(srv, settings, clock, coordinator, events):
    from fsm.integrations.langgraph import retry_node

    async def run():
        async with openai.AsyncOpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0) as client:
            @retry_node(settings, on_event=events.append, coordinator=coordinator, clock=clock,
                        provider="openai", model=MODEL)
            async def ask(state):
                reply = await client.chat.completions.create(model=MODEL, messages=PROMPT)
                return {"answer": reply.choices[0].message.content}
            return await one_node_graph(ask).ainvoke({"answer": ""})
    return run_settled(run())


def observe_host(host: Any, answers: list, settings: dict, clock: VirtualClock,
                 on_server: Callable[[Any], None] | None = None) -> Observation:
    """Run one call through ``host(server, settings, clock, coordinator, events)`` against a
    fresh fault server answering ``answers`` (``on_server(server)`` once it is up): the
    requests' models, the clock's waits, the events shown, the outcome and the tokens."""
    from fsm.testing.fault_server import FaultServer

    coordinator = RecordingCoordinator(clock)
    events: list = []
    result, error = None, None
    with FaultServer(answers) as srv:
        if on_server is not None:
            on_server(srv)
        try:
            result = host(srv, settings, clock, coordinator, events)
        except Exception as exc:  # noqa: BLE001 - the outcome observed
            error = exc
        requests = tuple((r["body"] or {}).get("model") for r in srv.chat_requests)
    seen = tuple(s for s in map(shown, events) if s is not None)
    return Observation(requests, tuple(clock.waits), seen, outcome_of(result, error),
                       coordinator.accounting())
