"""The declaration tells the truth (docs/policy.md §7): it is fully validated when
``fsm.core.lifecycle`` is imported, and each effect's words name exactly the actions it returns.
"""

import itertools
import os
import re
import subprocess
import sys
import textwrap

import pytest

import support

from fsm.core import brain as B
from fsm.core import lifecycle as L
from fsm.core.brain import RetryBrain, TurnFacts
from fsm.core.classify import Classification
from fsm.core.events import AutoRetryEnd, AutoRetryStart
from fsm.core.messages import AssistantMessage
from fsm.core.settings import BudgetSettings, RetrySettings

PATCH = textwrap.dedent(r'''
    import importlib.abc, importlib.machinery, importlib.util, runpy, sys
    ROW = "at_rest     + turn_failed_fatal / settle_turn = idle"
    EXTRA = "\nat_rest     + turn_failed_fatal / end_fatal = exhausted  ; an overlapping row"

    class Patched(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        """Loads fsm.core.lifecycle with one overlapping row added to its table."""
        def find_spec(self, name, path, target=None):
            if name != "fsm.core.lifecycle":
                return None
            origin = importlib.machinery.PathFinder.find_spec(name, path).origin
            return importlib.util.spec_from_loader(name, self, origin=origin)
        def exec_module(self, module):
            source = open(module.__spec__.origin, encoding="utf-8").read()
            assert ROW in source
            exec(compile(source.replace(ROW, ROW + EXTRA, 1), module.__spec__.origin, "exec"),
                 module.__dict__)

    sys.meta_path.insert(0, Patched())
    sys.argv = ["fsm", "diagrams", "--out", sys.argv[1], "--no-svg"]
    runpy.run_module("fsm", run_name="__main__", alter_sys=True)
''')


def test_an_overlapping_row_is_refused_at_import_so_diagrams_cannot_draw_it(tmp_path):
    """``python -m fsm diagrams`` over a table with an overlapping row fails and draws nothing."""
    out = tmp_path / "drawn"
    env = support.env()
    done = subprocess.run([sys.executable, "-c", PATCH, str(out)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0
    assert "overlap" in done.stderr and "turn_failed_fatal" in done.stderr
    assert not out.exists() or not any(out.iterdir())


# ----------------------------------------------------------------------------- effects' words

ACTION_WORDS = {
    B.EmitTurnEnd: "turn ends",
    B.DropFailedMessage: "drop message",
    B.StartBackoff: "backoff",
    B.CancelBackoff: "cancel timer",
    B.ContinueTurn: "continue",
    B.CreditRetryBudget: "budget credit",
    B.CheckCompaction: "compaction",
    B.PromptMayReturn: "prompt done",
    B.SwitchModel: "switch model",
    B.AbortAttempt: "abort the attempt",
    B.ArmDeadline: "arm deadline",
}
KIND = {"turn_failed_retryable": Classification("retryable", "retryable.overloaded", False, 3000),
        "turn_failed_fatal": Classification("fatal", "fatal.unmatched"),
        "turn_overflowed": Classification("context_overflow", "overflow.prompt_too_long"),
        "turn_succeeded": Classification("none", "stop_reason.not_error"),
        "turn_aborted": Classification("none", "stop_reason.not_error")}


def words_of(action):
    """The phrase of :data:`fsm.core.lifecycle.EFFECTS` that names ``action``."""
    if isinstance(action, B.Emit):
        if isinstance(action.event, AutoRetryStart):
            return "auto_retry_start"
        if isinstance(action.event, AutoRetryEnd):
            return f"auto_retry_end ({action.event.end_reason})"
        return action.event.type
    return ACTION_WORDS[type(action)]


def words_in(description):
    """The phrases of a description, in order: its ``label: `` and ``(note)`` dropped, except
    ``auto_retry_end``'s end reason. Raises ``AssertionError`` for a phrase not in the words."""
    phrases = []
    for item in description.split("; "):
        item = item.split(": ", 1)[-1]
        if not item.startswith("auto_retry_end "):
            item = re.sub(r" \(.*\)$", "", item)
        assert item.split(" (")[0] in L.EFFECT_WORDS, f"{item!r} is not in EFFECT_WORDS"
        phrases.append(item)
    return phrases


def unique(words):
    return list(dict.fromkeys(words))


def forced(row):
    """A policy class whose guards pass exactly as ``row`` needs (others: true)."""
    env = {g: True for g in L.GUARDS}
    env.update({g.lstrip("!"): not g.startswith("!") for g in row.guards})
    return type("Forced", (B._Policy,), {"__slots__": (),
                                         **{g: (lambda v: lambda self: v)(v) for g, v in env.items()}})


def run_row(row):
    """The actions ``row``'s effect returns when its cell fires with a message and a budget."""
    brain = RetryBrain.in_state(row.source, settings=RetrySettings(budget=BudgetSettings(), max_elapsed_ms=60_000),
                                attempt=1, timer_id=1)
    p = brain._p
    p.__class__ = forced(row)
    if row.trigger in KIND:
        stop = ("stop" if row.trigger == "turn_succeeded" else
                "aborted" if row.trigger == "turn_aborted" else "error")
        p.message = AssistantMessage(stop, error_message=None if stop == "stop" else "boom",
                                     timestamp_ms=0)
        p.cls = KIND[row.trigger]
        p.facts = TurnFacts(now_ms=0)
    p.reason = "continue failed"
    p.fact_timer = p.timer
    p.source = p.state
    p.actions = []
    B._fire_compiled(p, row.trigger)
    assert p.state == row.dest, row.id
    return p.actions


@pytest.mark.parametrize("effect", sorted(L.EFFECTS))
def test_each_effect_s_words_name_exactly_the_actions_it_returns(effect):
    """The diagram's words cannot drift from the code: every action an effect returns (over
    every row that runs it) is named in its description, and nothing else is."""
    rows = [r for r in L.TRANSITIONS if r.effect == effect]
    assert rows, f"{effect} is declared but no row runs it"
    described = words_in(L.EFFECTS[effect])
    runs = [unique(words_of(a) for a in run_row(r)) for r in rows]
    assert set(described) == set(itertools.chain.from_iterable(runs)), (effect, runs)
    for run in runs:  # and in the order the actions come
        assert [w for w in described if w in run] == run, (effect, run)
