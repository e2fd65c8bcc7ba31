"""Every Python example in README.md and docs/*.md runs as written, under Sybil (SPEC §15.13
"Docs"): the SDKs' base URLs come from ``OPENAI_BASE_URL`` / ``ANTHROPIC_BASE_URL`` /
``GOOGLE_GEMINI_BASE_URL``, which point at the project's fault server here, so nothing leaves
the machine and an example cannot drift.

An example that is a shape rather than a program (a protocol's signatures) is marked in the
Markdown with ``<!-- skip: next "why" -->``; :data:`SHAPES` lists every one, so none is skipped
silently. The blocks of one document share one namespace and one event loop, in order; a block
with a top-level ``await`` runs on that loop.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
from pathlib import Path
from unittest import SkipTest

import pytest
from sybil import Sybil
from sybil.parsers.markdown import CodeBlockParser, SkipParser

from fsm.testing.fault_server import FaultServer

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]

SHAPES = {
    ("docs/architecture.md", "a shape of the coordinator protocol, not a program"),
    ("docs/fleet.md", "a shape of the coordinator protocol, not a program"),
}
"""(document, reason) of every example skipped on purpose."""


def _evaluate(example) -> None:
    """Run one block: top-level ``await`` on the document's loop, anything else as is."""
    __tracebackhide__ = True
    source = "\n" * (example.line + example.parsed.line_offset) + example.parsed
    code = compile(source, example.path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
                   dont_inherit=True)
    namespace = example.namespace
    result = eval(code, namespace)
    if inspect.CO_COROUTINE & code.co_flags:
        namespace["__loop__"].run_until_complete(result)
    namespace.pop("__builtins__", None)


SYBIL = Sybil(parsers=[CodeBlockParser(language="python", evaluator=_evaluate), SkipParser()],
              path=str(ROOT))


@pytest.mark.subprocess
@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_python_example_runs_as_written(document, monkeypatch):
    """README.md and docs/ (SPEC §15.13 "Docs"): each Python block of the document runs, in
    order, against the fault server; the only blocks not run are the shapes of SHAPES."""
    parsed = SYBIL.parse(ROOT / document)
    skipped = set()
    loop = asyncio.new_event_loop()
    with FaultServer([]) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url.removesuffix("/v1"))
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
        monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", server.root_url)  # Gemini's generateContent
        monkeypatch.setenv("GEMINI_API_KEY", "gemini-test-key")
        monkeypatch.delenv("GOOGLE_API_KEY", raising=False)  # the SDK would prefer it
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        parsed.namespace["__loop__"] = loop
        try:
            for example in parsed:
                try:
                    example.evaluate()
                except SkipTest as skip:
                    skipped.add((document, str(skip)))
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
    assert skipped == {s for s in SHAPES if s[0] == document}
