"""Every Python example in README.md, docs/*.md and the package's docstrings runs as
written, under Sybil (SPEC §15.13 "Docs"): the SDKs' base URLs come from ``OPENAI_BASE_URL`` /
``ANTHROPIC_BASE_URL`` / ``GOOGLE_GEMINI_BASE_URL``, which point at the project's fault server
here, so nothing leaves the machine and an example cannot drift.

An example that is a shape rather than a program (a protocol's signatures) is marked in the
Markdown with ``<!-- skip: next "why" -->``, in a docstring with the ReST comment
``.. skip: next "why"``; :data:`SHAPES` and :data:`DOCSTRING_SHAPES` list every one, so none is
skipped silently. In a docstring, every ``::`` literal block is a Python example (``>>>`` ones
doctests); a block in another language names it (``.. code-block:: console`` / ``text``), and
``.. invisible-code-block: python`` runs checks the reference does not show. The blocks of one
document share one namespace and one event loop, in order; a block with a top-level ``await``
runs on that loop.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
import sys
import textwrap
from pathlib import Path
from unittest import SkipTest

import pytest
from sybil import Document, Lexeme, Region, Sybil
from sybil.document import PythonDocStringDocument
from sybil.evaluators.doctest import DocTestEvaluator
from sybil.parsers.abstract.doctest import DocTestStringParser
from sybil.parsers.markdown import CodeBlockParser, SkipParser
from sybil.parsers.rest import CodeBlockParser as RestCodeBlockParser, SkipParser as RestSkipParser

from fsm.testing.fault_server import FaultServer

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]

SHAPES = {
    ("docs/architecture.md", "a shape of the coordinator protocol, not a program"),
    ("docs/fleet.md", "a shape of the coordinator protocol, not a program"),
}
"""(document, reason) of every example skipped on purpose."""


def _never_called(source: str) -> list[str]:
    """The functions a block defines at its top level and never calls (an example that defines
    ``main()`` and stops there runs nothing when copied)."""
    tree = ast.parse(source)
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
               and n.name == "main"}
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call)
              and isinstance(n.func, ast.Name)}
    return sorted(defined - called)


STANDALONE = {"docs/integrations.md"}
"""Documents whose blocks each run on their own (the page says each runs as written: a reader
copies one block, so nothing a block defines reaches the next); elsewhere a block may use what
the blocks before it on the page defined."""


def _evaluate(example) -> None:
    """Run one block: top-level ``await`` on the document's loop, anything else as is; in a
    document of :data:`STANDALONE`, in a namespace of its own."""
    __tracebackhide__ = True
    source = "\n" * (example.line + example.parsed.line_offset) + example.parsed
    uncalled = _never_called(source)
    assert not uncalled, f"{example.path}, line {example.line}: {uncalled} defined, never called"
    code = compile(source, example.path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
                   dont_inherit=True)
    namespace = example.namespace
    if Path(example.path).relative_to(ROOT).as_posix() in STANDALONE:
        namespace = {"__loop__": namespace["__loop__"], "__name__": "__main__"}
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


FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")


def _unclosed_fences(text: str) -> list[str]:
    """Where a fenced block of ``text`` swallows what follows it: an opening fence with an info
    string (```` ```python ````) met while a block is still open (CommonMark reads it as code),
    or a block still open at the end. Returns one "line N: ..." entry each."""
    problems, open_at, open_fence = [], 0, ""
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if not match:
            continue
        fence, info = match.group(2), match.group(3).strip()
        if not open_fence:
            open_at, open_fence = number, fence
        elif fence[0] == open_fence[0] and len(fence) >= len(open_fence) and not info:
            open_fence = ""
        elif info:
            problems.append(f"line {number}: {line.strip()!r} opens a block inside the block "
                            f"opened on line {open_at}")
    if open_fence:
        problems.append(f"line {open_at}: the block opened here is never closed")
    return problems


def test_fence_check_finds_a_block_left_open():
    """The check below fails for the defect it guards against (a block whose closing fence was
    lost in a merge runs into the next section: docs/integrations.md "Google Gen AI")."""
    text = "```python\nprint(1)\n\n## Next\n\n```python\nprint(2)\n```\n"
    assert _unclosed_fences(text) == [
        "line 6: '```python' opens a block inside the block opened on line 1"]
    assert _unclosed_fences("```python\nprint(1)\n") == [
        "line 1: the block opened here is never closed"]
    assert _unclosed_fences("```python\nprint(1)\n```\n\n```sh\nls\n```\n") == []


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_fenced_block_is_closed(document):
    """README.md and docs/ (SPEC §15.13 "Docs"): every fenced block ends before the next one
    opens, so no section is swallowed into an example (Sybil would then run prose as Python,
    and the site would show a heading as code)."""
    assert _unclosed_fences((ROOT / document).read_text(encoding="utf-8")) == []


# ------------------------------------------------------------------------------------------
# The package's docstrings (SPEC §15.13 "Docs"; issue 35: "every code example in README, docs/ and
# public docstrings runs as a test under Sybil").

MODULES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "fsm").rglob("*.py"))
"""Every module of the package, the private ones too: they hold public names (``fsm.fleet``'s
coordinators live in ``fsm/fleet/_*.py``)."""

DOCSTRING_SHAPES = {
    ("fsm/host/loop.py", "a shape of a driver of one's own: the scheduler, its clock and its coordinator answers are the reader's"),
    ("fsm/commands/common.py", "a shape of a front end's start: args and provider are the front end's"),
    ("fsm/rpc/client.py", "a shape of a client session: it starts a server subprocess and reads an endless event stream"),
}
"""(module, reason) of every docstring example skipped on purpose: each is marked in its
docstring with ``.. skip: next "reason"`` (a ReST comment: not shown in the reference)."""

_LITERAL = re.compile(r"^(?P<indent>[ \t]*)(?!\.\.[ \t])(?:\S[^\n]*)?::[ \t]*\n", re.M)


class _Docstrings(PythonDocStringDocument):
    """The docstrings of a module, read as ReST. Unlike Sybil's own document type, the
    module's names are not put in the examples' namespace: an example imports what it uses,
    as its reader must."""

    def __init__(self, text: str, path: str) -> None:
        Document.__init__(self, text, path)


def _literal_blocks(document: Document):
    """Every ``::`` literal block of a docstring is a Python example (a block in another
    language says so: ``.. code-block:: text`` / ``console``); one that starts with ``>>>`` is
    a doctest."""
    text = document.text
    for match in _LITERAL.finditer(text):
        lines = text[match.end():].split("\n")
        indent = len(match["indent"].expandtabs())
        skipped = 0
        while skipped < len(lines) and not lines[skipped].strip():
            skipped += 1
        block = []
        for line in lines[skipped:]:
            if line.strip() and len(line) - len(line.lstrip()) <= indent:
                break
            block.append(line)
        while block and not block[-1].strip():
            block.pop()
        if not block:
            continue
        start = match.end() + sum(len(line) + 1 for line in lines[:skipped])
        end = start + len("\n".join(block))
        source = textwrap.dedent("\n".join(block)) + "\n"
        if source.startswith(">>>"):
            for region in DocTestStringParser(DocTestEvaluator())(source, document.path):
                region.start += start
                region.end += start
                yield region
            continue
        lexeme = Lexeme(source, offset=start - match.start(), line_offset=text.count("\n", match.start(), start) - 1)
        yield Region(match.start(), end, lexeme, _evaluate)


def _docstring_examples(document: Document):
    yield from _literal_blocks(document)
    yield from RestCodeBlockParser(language="python", evaluator=_evaluate)(document)


DOCSTRINGS = Sybil(parsers=[_docstring_examples, RestSkipParser()], path=str(ROOT),
                   document_types={".py": _Docstrings})


def _fault_environment(monkeypatch, server) -> None:
    """The SDKs' base URLs and keys point at the fault server; nothing leaves the machine."""
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url.removesuffix("/v1"))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", server.root_url)  # Gemini's generateContent
    monkeypatch.setenv("GEMINI_API_KEY", "gemini-test-key")
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")  # read at the SDK's first trace
    if "agents" in sys.modules:  # the SDK already read it: its own switch
        sys.modules["agents"].set_tracing_disabled(True)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def _examples(path: str) -> list:
    return list(DOCSTRINGS.parse(ROOT / path))


@pytest.mark.parametrize("module", [m for m in MODULES if _examples(m)])
def test_every_docstring_example_runs_as_written(module, monkeypatch, tmp_path):
    """Public docstrings (SPEC §15.13 "Docs"): each Python example of the module's docstrings
    runs, in order, in one namespace, against the fault server (``OPENAI_BASE_URL`` /
    ``ANTHROPIC_BASE_URL`` / ``GOOGLE_GEMINI_BASE_URL``), in a scratch folder; the only ones not run are the shapes of
    DOCSTRING_SHAPES."""
    parsed = DOCSTRINGS.parse(ROOT / module)
    skipped = set()
    loop = asyncio.new_event_loop()
    monkeypatch.chdir(tmp_path)
    with FaultServer([]) as server:
        _fault_environment(monkeypatch, server)
        parsed.namespace["__loop__"] = loop
        parsed.namespace["__name__"] = "__docstring_example__"
        try:
            for example in parsed:
                try:
                    example.evaluate()
                except SkipTest as skip:
                    skipped.add((module, str(skip)))
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
    assert skipped == {s for s in DOCSTRING_SHAPES if s[0] == module}


def test_every_docstring_shape_is_marked_and_every_marked_module_has_examples():
    """DOCSTRING_SHAPES names only modules of the package whose docstrings have examples: a
    shape that was made a program, or a module renamed, does not leave a stale entry behind."""
    with_examples = {m for m in MODULES if _examples(m)}
    assert {m for m, _ in DOCSTRING_SHAPES} <= with_examples
    assert len(with_examples) >= 10
