"""``<framework>_ratio_vs_bare``: what each framework integration adds to a call that succeeds.

One figure triple per integration of :mod:`fsm.integrations` that wraps a framework (the
transport, Google Gen AI and LiteLLM have groups of their own), named by the keys of
:data:`FRAMEWORKS` (``tenacity_strategy``: the decision group has a ``tenacity_us`` of its
own): ``<name>_us`` (the call through
the integration), ``<name>_bare_us`` (the same call through the bare framework) and
``<name>_ratio_vs_bare``. Each call is one chat completion (the Agents SDK: one Responses API
call) against a loopback fault server in a separate process (``python -m fsm fault-server``)
answering at once, the SDK's own retries off on both sides (``max_retries=0``), so the figures
are the *client* process's CPU time per call (``time.process_time_ns``): what the integration
costs the caller. Blocks of ``number`` calls alternate subject and baseline, the order
swapping every block (:mod:`benchmarks._timing`); each figure is the median over ``repeat``
blocks, in µs. Reported, no target (docs/integrations.md "Cost").

========================  ====================================================  ==========================
figure prefix             subject                                               baseline
========================  ====================================================  ==========================
``tenacity_strategy``     ``tenacity.retry(**BrainStrategy().kwargs())(call)``  ``tenacity.retry(stop=
                                                                                stop_after_attempt(3))``
``langchain``             ``create_agent(..., middleware=[RetryBrainMiddleware  ``create_agent(...)``
                          ()])`` ``.invoke``                                    ``.invoke``
``langgraph``             a one-node graph, the node under ``retry_node()``     the same node bare
``pydantic_ai``           ``Agent(model, capabilities=[RetryBrainCapability()  ``Agent(model).run``
                          ])`` ``.run``
``openai_agents``         ``Runner.run`` with ``BrainRetryPolicy``'s model      ``Runner.run`` bare
                          settings and hooks
========================  ====================================================  ==========================
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, Iterable

from benchmarks._timing import acompare, compare, cpu_us, fault_server, ratio_figures

KEY = "sk-bench-0123456789abcdef"
MESSAGES = [{"role": "user", "content": "hi"}]


def _openai(base: str, asynchronous: bool = False) -> Any:
    import openai
    cls = openai.AsyncOpenAI if asynchronous else openai.OpenAI
    return cls(base_url=base, api_key=KEY, max_retries=0)


def _sync(name: str, ours: Callable[[], Any], bare: Callable[[], Any], sizes: dict) -> dict[str, float]:
    s, b, _, _ = compare(ours, bare, block=cpu_us, **sizes)
    return ratio_figures(name, s, b)


def _async(name: str, ours: Callable[[], Any], bare: Callable[[], Any], sizes: dict) -> dict[str, float]:
    return ratio_figures(name, *asyncio.run(acompare(ours, bare, **sizes)))


def tenacity_figures(base: str, sizes: dict) -> dict[str, float]:
    import tenacity

    from fsm.integrations.tenacity import BrainStrategy
    create = _openai(base).chat.completions.create
    ours = tenacity.retry(**BrainStrategy().kwargs())(create)
    bare = tenacity.retry(stop=tenacity.stop_after_attempt(3), reraise=True)(create)
    return _sync("tenacity_strategy", lambda: ours(model="m", messages=MESSAGES),
                 lambda: bare(model="m", messages=MESSAGES), sizes)


def langchain_figures(base: str, sizes: dict) -> dict[str, float]:
    from langchain.agents import create_agent
    from langchain_openai import ChatOpenAI

    from fsm.integrations.langchain import RetryBrainMiddleware
    model = ChatOpenAI(model="m", base_url=base, api_key=KEY, max_retries=0)
    ours = create_agent(model, tools=[], middleware=[RetryBrainMiddleware()])
    bare = create_agent(model, tools=[])
    return _sync("langchain", lambda: ours.invoke({"messages": MESSAGES}),
                 lambda: bare.invoke({"messages": MESSAGES}), sizes)


def langgraph_figures(base: str, sizes: dict) -> dict[str, float]:
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    from fsm.integrations.langgraph import retry_node
    client = _openai(base)

    class State(TypedDict):
        answer: str

    def ask(state: State) -> dict:
        reply = client.chat.completions.create(model="m", messages=MESSAGES)
        return {"answer": reply.choices[0].message.content}

    def graph(node: Callable[[State], dict]) -> Any:
        builder = StateGraph(State)
        builder.add_node("ask", node)
        builder.add_edge(START, "ask")
        builder.add_edge("ask", END)
        return builder.compile()

    ours, bare = graph(retry_node()(ask)), graph(ask)
    return _sync("langgraph", lambda: ours.invoke({"answer": ""}),
                 lambda: bare.invoke({"answer": ""}), sizes)


def pydantic_ai_figures(base: str, sizes: dict) -> dict[str, float]:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from fsm.integrations.pydantic_ai import RetryBrainCapability
    model = OpenAIChatModel("m", provider=OpenAIProvider(openai_client=_openai(base, True)))
    ours, bare = Agent(model, capabilities=[RetryBrainCapability()]), Agent(model)
    return _async("pydantic_ai", lambda: ours.run("hi"), lambda: bare.run("hi"), sizes)


def openai_agents_figures(base: str, sizes: dict) -> dict[str, float]:
    from agents import Agent, OpenAIProvider, RunConfig, Runner, set_tracing_disabled

    from fsm.integrations.openai_agents import BrainRetryPolicy
    set_tracing_disabled(True)  # nothing leaves the machine (SPEC §15.13)
    config = RunConfig(model_provider=OpenAIProvider(openai_client=_openai(base, True)),
                       tracing_disabled=True)
    brain = BrainRetryPolicy()
    ours = Agent(name="a", model="m", model_settings=brain.model_settings())
    bare = Agent(name="a", model="m")
    hooks = brain.hooks()
    return _async("openai_agents", lambda: Runner.run(ours, "hi", hooks=hooks, run_config=config),
                  lambda: Runner.run(bare, "hi", run_config=config), sizes)


FRAMEWORKS: dict[str, Callable[[str, dict], dict[str, float]]] = {
    "tenacity_strategy": tenacity_figures, "langchain": langchain_figures,
    "langgraph": langgraph_figures, "pydantic_ai": pydantic_ai_figures,
    "openai_agents": openai_agents_figures,
}


def measure(*, number: int = 100, repeat: int = 7, warmup: int = 20,
            only: Iterable[str] = tuple(FRAMEWORKS)) -> dict[str, float]:
    """The figures of this group, for the integrations named in ``only`` (keys of
    :data:`FRAMEWORKS`; ``KeyError`` for another), all against one fault server."""
    chosen = [FRAMEWORKS[name] for name in only]
    sizes = {"number": number, "repeat": repeat, "warmup": warmup}
    figures: dict[str, float] = {}
    with fault_server() as root:
        for figures_of in chosen:
            figures.update(figures_of(root + "/v1", sizes))
    return figures


if __name__ == "__main__":
    print(json.dumps(measure(number=20, repeat=3, warmup=5), indent=1))
