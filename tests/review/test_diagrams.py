"""Diagrams generated from the declaration (docs/policy.md §7): drift, byte stability, the
review diagram (group rows once, merged edges, labels that never overlap) and the per-state one."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

from fsm.review import diagrams as D
from fsm.review.diagrams import states as S
from fsm.core import lifecycle as L
from fsm.__main__ import main
from diagram_support import fallback_rows, grouped_declaration, review_dot_edges

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "diagrams"
SVG_NS = "{http://www.w3.org/2000/svg}"


def expected_label(row: L.Row) -> str:
    guards = " ∧ ".join("¬" + g[1:] if g.startswith("!") else g for g in row.guards)
    return f"{row.trigger} [{guards}]" if row.guards else row.trigger


def dot_edges(source: str) -> list[tuple[str, str, dict[str, str]]]:
    """(tail, head, attributes) of every edge line of a DOT text written by graphviz."""
    edges = []
    for line in source.splitlines():
        m = re.match(r"\t(\S+) -> (\S+) \[(.*)\]$", line)
        if m:
            attrs = dict(re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', m.group(3)))
            edges.append((m.group(1), m.group(2), {k: v.strip('"') for k, v in attrs.items()}))
    return edges


def mini_declaration(**over) -> dict:
    """A small declaration in the shape of lifecycle.declaration(), for the model's rules."""
    decl = {
        "states": ["a", "b"], "initial": "a", "triggers": ["t", "u"],
        "guards": {"g": "g holds", "h": "h holds"},
        "transitions": [
            {"id": "a--t[g]->b", "source": "a", "trigger": "t", "dest": "b", "guards": ["g"],
             "effect": "go", "spec": "x"},
            {"id": "a--t[!g]->a", "source": "a", "trigger": "t", "dest": "a", "guards": ["!g"],
             "effect": None, "spec": "y"},
            {"id": "b--t[g]->a", "source": "b", "trigger": "t", "dest": "a", "guards": ["g"],
             "effect": None, "spec": ""},
            {"id": "b--t[h]->b", "source": "b", "trigger": "t", "dest": "b", "guards": ["h"],
             "effect": None, "spec": ""},
            {"id": "b--u->a", "source": "b", "trigger": "u", "dest": "a", "guards": [],
             "effect": None, "spec": ""},
            {"id": "b--u[h]->b", "source": "b", "trigger": "u", "dest": "b", "guards": ["h"],
             "effect": None, "spec": ""},
        ],
        "ignored": [{"id": "a--u->(ignored)", "source": "a", "trigger": "u", "reason": "nothing"}],
    }
    decl.update(over)
    return decl


# ----------------------------------------------------------------------------- drift, stability

TEXT_FILES = sorted(["retry_lifecycle.json", "retry_lifecycle.md", "retry_lifecycle_review.dot",
                     "retry_lifecycle_review.mmd"] + [f"states/{s}.dot" for s in L.STATES])
SVG_FILES = sorted(["retry_lifecycle_review.svg"] + [f"states/{s}.svg" for s in L.STATES])


def files_in(folder: Path) -> list[str]:
    """The files under ``folder``, as sorted relative paths with ``/``."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def test_committed_diagrams_match_the_declaration(tmp_path):
    """Every committed text file is what the declaration generates today."""
    D.write_all(tmp_path, svg=False)
    assert files_in(tmp_path) == TEXT_FILES
    for name in TEXT_FILES:
        committed = COMMITTED / name
        assert committed.is_file(), f"{committed} is missing: run 'make diagrams' and commit it"
        assert committed.read_bytes() == (tmp_path / name).read_bytes(), (
            f"{committed} no longer matches fsm/core/lifecycle.py: run 'make diagrams' "
            "(python -m fsm diagrams) and commit the result")


@pytest.mark.subprocess
def test_text_outputs_are_byte_stable_across_hash_seeds(tmp_path):
    """Two runs under different hash seeds write the same bytes, and what render_all returns."""
    outputs = {}
    for seed in ("0", "4242"):
        out = tmp_path / seed
        env = dict(os.environ, PYTHONHASHSEED=seed)
        subprocess.run([sys.executable, "-m", "fsm", "diagrams", "--no-svg", "--out", str(out)],
                       check=True, cwd=ROOT, env=env, capture_output=True, timeout=120)
        outputs[seed] = {name: (out / name).read_bytes() for name in files_in(out)}
    assert sorted(outputs["0"]) == TEXT_FILES
    assert outputs["0"] == outputs["4242"]
    assert outputs["0"] == {k: v.encode() for k, v in sorted(D.render_all().items())}


def test_text_outputs_have_unix_endings_and_no_version_or_date():
    """Text outputs end lines with \n, once at the end, and embed no version or date."""
    for name, text in D.render_all().items():
        assert "\r" not in text, name
        assert text.endswith("\n") and not text.endswith("\n\n"), name
        if not name.endswith(".json"):
            assert L.VERSION not in text, f"{name} embeds the declaration version"
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), f"{name} embeds a date"


# ----------------------------------------------------------------------------- DOT

def test_dot_has_one_edge_per_transition_labelled_with_its_guards():
    """The per-state DOT has one edge per transition, labelled trigger [guards]."""
    edges = dot_edges(D.render_dot(D.extract()))
    by_id = Counter(attrs["id"] for _, _, attrs in edges)
    assert by_id == Counter([r.id for r in L.TRANSITIONS] + ["initial"])
    for tail, head, attrs in edges:
        if attrs["id"] == "initial":
            assert (tail, head) == ("__initial", L.INITIAL)
            continue
        row = next(r for r in L.TRANSITIONS if r.id == attrs["id"])
        assert (tail, head) == (row.source, row.dest)
        assert attrs["label"] == expected_label(row)


def test_diagrams_read_the_machine_the_brain_serves_on():
    """The diagrams draw the ``transitions`` machine's events, transitions and conditions —
    the very object the brain's dispatch is compiled from — and a machine built from another
    table draws that table (docs/policy.md §3, §7)."""
    from fsm.core import brain as B
    assert B._MACHINE is L.MACHINE
    assert D.extract() == D.extract(machine=L.MACHINE)
    old = "at_rest     + turn_succeeded / settle_turn = idle"
    changed = L.build_machine(rows=L.parse_table(L.TABLE.replace(old, old.replace("= idle", "= exhausted"))))
    edges = {e.id: e for e in D.extract(machine=changed).edges}
    assert edges["succeeded--turn_succeeded->exhausted"].dest == L.EXHAUSTED
    assert "succeeded--turn_succeeded->exhausted" not in {e.id for e in D.extract().edges}


def test_dot_label_example_from_the_issue():
    """A refusal at rest reads turn_failed_retryable [retry_enabled ∧ ¬has_retries_left]."""
    source = D.render_dot(D.extract())
    assert ('idle -> exhausted [label="turn_failed_retryable [retry_enabled ∧ ¬has_retries_left]"'
            in source)


def test_ignored_cells_are_not_edges():
    """Ignored cells are never drawn as edges."""
    edges = dot_edges(D.render_dot(D.extract()))
    drawn = {(t, attrs["label"].split(" ")[0]) for t, _, attrs in edges if attrs["id"] != "initial"}
    for ig in L.IGNORED:
        assert (ig.source, ig.trigger) not in drawn, ig.id
    assert not any(attrs["id"].endswith("(ignored)") for _, _, attrs in edges)


def test_dot_clusters_chain_states_and_notes_the_twin_states():
    """The per-state DOT clusters the chain and ended states and names the twin states."""
    source = D.render_dot(D.extract())
    chain = re.search(r"subgraph cluster_in_chain \{(.*?)\n\t\}", source, re.S).group(1)
    ended = re.search(r"subgraph cluster_ended \{(.*?)\n\t\}", source, re.S).group(1)
    assert re.findall(r"^\t\t(\w+) \[", chain, re.M) == list(L.IN_CHAIN)
    assert re.findall(r"^\t\t(\w+) \[", ended, re.M) == list(L.ENDED)
    assert "succeeded, exhausted, cancelled: the same transitions and ignored cells as idle" in source


def test_real_declaration_twins_are_idle_and_the_ended_states():
    """The ended states behave exactly as idle (the at-rest group)."""
    assert D.extract().twins() == ((L.IDLE,) + L.ENDED,)


def test_free_text_cannot_break_dot_or_become_html(tmp_path):
    """Docs with quotes, backslashes or tags stay plain text in DOT."""
    decl = mini_declaration()
    decl["transitions"][0]["spec"] = r'<b>bold</b> "quoted" back\slash'
    diagram = D.extract(decl)
    source = D.render_dot(diagram)
    assert r'back\\slash' in source and '<b>bold</b> \\"quoted\\"' in source
    svg = ET.fromstring(D.render_svg(diagram))
    titles = [a.get("{http://www.w3.org/1999/xlink}title") for a in svg.iter(f"{SVG_NS}a")]
    assert any(t and t.endswith(r'<b>bold</b> "quoted" back\slash') for t in titles)


# ----------------------------------------------------------------------------- SVG

def svg_edges(svg: bytes) -> list[ET.Element]:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG_NS}svg"
    return [g for g in root.iter(f"{SVG_NS}g") if g.get("class") == "edge"]


def label_nodes(svg: bytes) -> dict[str, set[str]]:
    """Label id → the declared row ids its tooltip names. The review diagram and the small
    multiples draw each label as a node on its edge (ids ``SRC->DEST``, ``in0``, ``out1``);
    a loop keeps its label on the edge itself (an edge group with no ``#`` in its id)."""
    root = ET.fromstring(svg)
    out = {}
    for g in root.iter(f"{SVG_NS}g"):
        gid = g.get("id", "")
        node = g.get("class") == "node" and ("->" in gid or re.fullmatch(r"(in|out)\d+", gid))
        loop = g.get("class") == "edge" and "#" not in gid and gid != "initial" and any(
            True for _ in g.iter(f"{SVG_NS}text"))
        if node or loop:
            tips = [a.get("{http://www.w3.org/1999/xlink}title") for a in g.iter(f"{SVG_NS}a")]
            tip = next((t for t in tips if t and "--" in t), "")
            out[gid] = set(tip.split("; ")) if tip else set()
    return out


def test_svg_files_are_the_review_diagram_and_one_per_state(tmp_path):
    """write_all writes the text files, then the review SVG and one small SVG per state."""
    written = D.write_all(tmp_path)
    names = [p.relative_to(tmp_path).as_posix() for p in written]
    assert sorted(names) == sorted(TEXT_FILES + SVG_FILES)
    assert names[-len(SVG_FILES):] == ["retry_lifecycle_review.svg"] + [
        f"states/{s}.svg" for s in L.STATES]


def test_each_small_multiple_shows_exactly_the_rows_into_and_out_of_its_state(tmp_path):
    """Every declared row that starts from a state (or its group) or leads into it from
    elsewhere is on that state's picture, and no other row is."""
    diagram = D.extract()
    groups = dict(diagram.groups)
    for state in L.STATES:
        svg = S.render_state_svg(diagram, state)
        shown = set().union(*label_nodes(svg).values())
        expected = {r.id for r in diagram.rows
                    if state in groups.get(r.source, (r.source,))
                    or r.dest == state and any(m != state for m in groups.get(r.source, (r.source,)))}
        assert shown == expected, state
        ignored = [i.trigger for i in diagram.ignored if i.source == state]
        text = " ".join("".join(t.itertext()) for t in ET.fromstring(svg).iter(f"{SVG_NS}text"))
        assert all(t in text for t in ignored), state


def test_small_multiples_are_small():
    """One picture per state stays under 1300 x 640 px (the per-state diagram they replace was
    6,723 x 2,495)."""
    diagram = D.extract()
    for state in L.STATES:
        width, height = svg_size_px(S.render_state_svg(diagram, state))
        assert width <= 1300 and height <= 640, (state, width, height)


def test_committed_svgs_are_valid_and_current():
    """The committed SVGs parse and draw the rows the declaration has today."""
    diagram = D.extract()
    for state in L.STATES:
        committed = (COMMITTED / "states" / f"{state}.svg").read_bytes()
        assert label_nodes(committed) == label_nodes(S.render_state_svg(diagram, state)), (
            f"diagrams/states/{state}.svg is stale: run 'make diagrams'")


def test_coverage_marks_draw_three_statuses():
    """The per-state coverage view draws covered, partly covered and not covered apart."""
    diagram = D.extract()
    first, second, partly = diagram.edges[0].id, diagram.edges[1].id, diagram.edges[3].id
    marks = {first: D.EdgeMark("covered", "taken 2"), second: D.EdgeMark("not covered", "never taken"),
             partly: D.EdgeMark("partly covered", "1 taken, never rejected")}
    edges = {attrs["id"]: attrs for _, _, attrs in dot_edges(D.render_dot(diagram, marks, "cov 1/2"))}
    assert edges[first]["style"] == "solid" and edges[first]["color"] not in ("#D00000", "#B86E00")
    assert edges[first]["label"].endswith("(taken 2)")
    assert edges[second]["style"] == "dashed" and edges[second]["color"] == "#D00000"
    assert edges[partly]["style"] == "solid" and edges[partly]["color"] == "#B86E00"
    # a row without a mark has no data: it is drawn as not covered
    third = diagram.edges[2].id
    assert edges[third]["style"] == "dashed" and edges[third]["label"].endswith("(no data)")
    svg = svg_edges(D.render_svg(diagram, marks, "cov 1/2"))
    dashed = {g.get("id") for g in svg
              if any(p.get("stroke-dasharray") for p in g.iter(f"{SVG_NS}path"))}
    assert first not in dashed and partly not in dashed and second in dashed and third in dashed


def test_missing_dot_is_a_clear_error(tmp_path, monkeypatch, capsys):
    """Without Graphviz the text files are still written and the error says how to install it."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(D.DiagramError, match="Graphviz's 'dot' program was not found"):
        D.render_svg(D.extract())
    assert main(["diagrams", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "install Graphviz" in err and "--no-svg" in err
    assert files_in(tmp_path / "out") == TEXT_FILES


def test_dot_failure_is_a_diagram_error(monkeypatch):
    """A failing dot run is a DiagramError, not a traceback."""
    import graphviz

    def fail(*args, **kwargs):
        raise graphviz.CalledProcessError(1, ["dot"], stderr=b"syntax error")

    monkeypatch.setattr(graphviz.Digraph, "pipe", fail)
    with pytest.raises(D.DiagramError, match="'dot' failed"):
        D.render_svg(D.extract())


# ----------------------------------------------------------------------------- Mermaid

def test_mermaid_has_one_transition_line_per_row():
    """The per-state Mermaid has one line per transition, classes for the groups."""
    text = D.render_mermaid(D.extract())
    assert text.startswith("---\ntitle: retry_lifecycle\n---\nstateDiagram-v2\n")
    lines = [l.strip() for l in text.splitlines() if "-->" in l]
    assert lines[0] == f"[*] --> {L.INITIAL}"
    assert lines[1:] == [f"{r.source} --> {r.dest} : {expected_label(r)}" for r in L.TRANSITIONS]
    assert "class backing_off,continuing in_chain" in text
    assert "class succeeded,exhausted,cancelled ended" in text


def test_mermaid_text_never_carries_a_second_colon_or_a_semicolon():
    """Free text cannot end a Mermaid statement or label early."""
    decl = mini_declaration()
    diagram = D.extract(decl)
    diagram = D.Diagram(diagram.name, (D.State("a", "doc: with; #1", "", True),) + diagram.states[1:],
                        diagram.triggers, diagram.guards, diagram.edges, diagram.ignored)
    line = next(l for l in D.render_mermaid(diagram).splitlines() if l.startswith("    a : "))
    assert line == "    a : doc∶ with, no. 1"  # '∶' is a ratio sign, not a colon


# ----------------------------------------------------------------------------- Markdown

def test_markdown_has_every_transition_row_in_order():
    """The table lists every transition in declaration order with its citation."""
    text = D.render_markdown(D.extract())
    rows = [l for l in text.splitlines() if re.match(r"\| \d+ \| `", l)]
    transitions = rows[:len(L.TRANSITIONS)]
    for line, row in zip(transitions, L.TRANSITIONS):
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        guards = expected_label(row)[len(row.trigger):].strip(" []")
        assert cells[1:6] == [f"`{row.source}`", f"`{row.trigger}`", guards, f"`{row.dest}`",
                              f"`{row.effect}`"]
        assert cells[6] == row.spec.replace("|", "\\|")


def test_markdown_matrix_marks_ignored_cells_with_their_reasons():
    """The state × trigger matrix holds each cell's rows or its ignored reason."""
    text = D.render_markdown(D.extract())
    header = next(l for l in text.splitlines() if l.startswith("| state \\ trigger |"))
    assert header.count("|") == len(L.TRIGGERS) + 2
    keys = dict(re.findall(r"^- \*\*(I\d+)\*\*: (.*)$", text, re.M))
    assert set(keys.values()) == {i.reason for i in L.IGNORED}
    for state in L.STATES:
        line = next(l for l in text.splitlines()
                    if l.startswith(f"| `{state}` | ") and ("→" in l or "*ignored*" in l))
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")][1:]
        for trigger, cell in zip(L.TRIGGERS, cells):
            ignored = [i for i in L.IGNORED if (i.source, i.trigger) == (state, trigger)]
            rows = [r for r in L.TRANSITIONS if (r.source, r.trigger) == (state, trigger)]
            if ignored:
                key = re.fullmatch(r"\*ignored\* \((I\d+)\)", cell).group(1)
                assert keys[key] == ignored[0].reason
            else:
                assert cell.split("<br>") == [
                    f"→ `{r.dest}`" + (f" [{expected_label(r)[len(r.trigger) + 2:-1]}]" if r.guards else "")
                    for r in rows]


def test_markdown_names_the_fallback_rows():
    """The rows that can never be rejected are listed, as found by brute force."""
    text = D.render_markdown(D.extract())
    section = text.split("## Rows the audit cannot see rejected", 1)[1]
    listed = re.findall(r"^- `(.*)`$", section, re.M)
    assert listed == fallback_rows() and listed


# ----------------------------------------------------------------------------- the model

def test_reachability_of_guarded_rows():
    """Takeable and rejectable follow from the rows tried before, for every guard value."""
    edges = {e.id: e for e in D.extract(mini_declaration()).edges}
    # [g] then [!g]: the fallback can be taken but never rejected
    assert (edges["a--t[g]->b"].takeable, edges["a--t[g]->b"].rejectable) == (True, True)
    assert (edges["a--t[!g]->a"].takeable, edges["a--t[!g]->a"].rejectable) == (True, False)
    # [g] then [h]: both may fail, so the second row can be rejected
    assert (edges["b--t[h]->b"].takeable, edges["b--t[h]->b"].rejectable) == (True, True)
    # an unguarded row first shadows every later row of the cell
    assert (edges["b--u->a"].takeable, edges["b--u->a"].rejectable) == (True, False)
    assert (edges["b--u[h]->b"].takeable, edges["b--u[h]->b"].rejectable) == (False, False)
    assert [e.order for e in edges.values()] == [0, 1, 0, 1, 0, 1]


def test_duplicate_row_ids_are_rejected():
    """Two rows with one id are a ValueError naming the id."""
    decl = mini_declaration()
    decl["transitions"].append(dict(decl["transitions"][0]))
    with pytest.raises(ValueError, match=r"row ids must be unique .*repeated: a--t\[g\]->b"):
        D.extract(decl)


def test_markdown_flags_rows_that_can_never_be_taken():
    """A shadowed row is listed as one that can never be taken."""
    text = D.render_markdown(D.extract(mini_declaration()))
    section = text.split("## Rows that can never be taken", 1)[1]
    assert re.findall(r"^- `(.*)`$", section, re.M) == ["b--u[h]->b"]


def test_a_declaration_without_fallbacks_says_so():
    """With no fallback and no shadowed row the table says so."""
    decl = mini_declaration()
    decl["transitions"] = [t for t in decl["transitions"]
                           if t["id"] not in ("a--t[!g]->a", "b--u[h]->b")]
    decl["ignored"] = []
    text = D.render_markdown(D.extract(decl))
    assert "None: every guarded row can be rejected." in text
    assert "Rows that can never be taken" not in text


def test_mini_declaration_renders_without_lifecycle_groups():
    """A declaration without groups renders with no clusters or classes."""
    diagram = D.extract(mini_declaration())
    assert [s.group for s in diagram.states] == ["", ""]
    assert diagram.twins() == ()
    assert diagram.state("b").name == "b"
    with pytest.raises(KeyError):
        diagram.state("nope")
    edges, ignored = diagram.cell("a", "u")
    assert edges == () and ignored.reason == "nothing"
    source = D.render_dot(diagram)
    assert "cluster_" not in source
    assert re.search(r"^\ta \[", source, re.M) and re.search(r"^\tb \[", source, re.M)
    assert "classDef" not in D.render_mermaid(diagram)


def test_guard_text_and_label():
    """Guards read with ∧ and ¬; an unguarded row is its trigger."""
    edge = next(e for e in D.extract().edges
                if e.id == "continuing--turn_failed_retryable[retry_enabled,!has_retries_left]->exhausted")
    assert edge.guard_text == "retry_enabled ∧ ¬has_retries_left"
    assert edge.label == "turn_failed_retryable [retry_enabled ∧ ¬has_retries_left]"
    plain = next(e for e in D.extract().edges if not e.guards)
    assert plain.guard_text == "" and plain.label == plain.trigger


# ----------------------------------------------------------------------------- command

def test_command_writes_and_checks(tmp_path, capsys):
    """diagrams writes every file; --check exits 1 naming the stale ones."""
    out = tmp_path / "d"
    assert main(["diagrams", "--out", str(out)]) == 0
    assert files_in(out) == sorted(TEXT_FILES + SVG_FILES)
    assert "wrote" in capsys.readouterr().out
    assert main(["diagrams", "--check", "--out", str(out)]) == 0
    (out / "retry_lifecycle_review.mmd").write_text("stale\n")
    (out / "retry_lifecycle.md").unlink()
    assert main(["diagrams", "--check", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "retry_lifecycle.md, retry_lifecycle_review.mmd" in err and "make diagrams" in err


def test_command_draws_a_team_s_settings(tmp_path, capsys):
    """--settings FILE puts that policy on the legend card; a bad file is a clear error."""
    team = tmp_path / "settings.json"
    team.write_text(json.dumps({"retry": {"maxRetries": 5, "baseDelayMs": 500, "maxDelayMs": 4000,
                                          "retryHints": "honor", "afterOutput": "stop"}}))
    out = tmp_path / "team"
    assert main(["diagrams", "--no-svg", "--settings", str(team), "--out", str(out)]) == 0
    dot = " ".join(re.sub(r"<[^>]+>", " ", (out / "retry_lifecycle_review.dot").read_text(
        encoding="utf-8")).split())
    assert f"the policy drawn: settings file {team}" in dot
    assert "5 retries, 0.5 s doubling: 0.5 s, 1 s, 2 s, 4 s, 4 s (capped at 4 s, jitter none)" in dot
    assert "replay_safe (afterOutput stop" in dot and "hint_within_wait (a wait over 60 s" in dot
    default = " ".join(re.sub(r"<[^>]+>", " ", (COMMITTED / "retry_lifecycle_review.dot")
                              .read_text(encoding="utf-8")).split())
    assert "the policy drawn: the defaults" in default
    assert "3 retries, 2 s doubling: 2 s, 4 s, 8 s (no cap, jitter none)" in default
    assert "none of the optional guards" in default
    team.write_text(json.dumps({"retry": {"maxRetries": -1}}))
    capsys.readouterr()
    assert main(["diagrams", "--no-svg", "--settings", str(team), "--out", str(out)]) == 2
    assert "retry.maxRetries" in capsys.readouterr().err
    assert main(["diagrams", "--check", "--settings", str(team)]) == 2


def test_command_reports_an_unwritable_folder(tmp_path, capsys):
    """An unwritable --out is a clear error, exit 2."""
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert main(["diagrams", "--no-svg", "--out", str(blocker / "sub")]) == 2
    assert "cannot write the diagrams" in capsys.readouterr().err


def test_readme_shows_the_generated_review_diagram():
    """README carries the generated review Mermaid and links the pictures."""
    mermaid = (COMMITTED / "retry_lifecycle_review.mmd").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "```mermaid\n" + mermaid.rstrip("\n") + "\n```" in readme, (
        "README's Mermaid block differs from diagrams/retry_lifecycle_review.mmd: paste the "
        "generated one")
    assert "(diagrams/retry_lifecycle_review.svg)" in readme
    assert "(diagrams/states/" in readme


# ----------------------------------------------------------------------------- review diagram

def test_review_draws_group_rows_once_and_merges_parallel_edges():
    """A group's rows are one edge each, drawn from its first member; rows between the same two
    nodes share one edge and its label; no node stands for the group."""
    diagram = D.extract(grouped_declaration())
    assert [(r.source, len(r.members)) for r in diagram.rows][:3] == [("rest", 2)] * 3
    source = D.render_review_dot(diagram)
    edges = review_dot_edges(source)
    pairs = [(t, h) for t, h, _, _ in edges]
    assert pairs == [("__initial", "calm"), ("calm", "busy"), ("calm", "calm"), ("busy", "done"),
                     ("busy", "busy"), ("busy", "calm")]
    labels = {(t, h): text for t, h, _, text in edges}
    # two rows of rest -> calm, one edge, stacked; one effect run, written once in words
    assert labels[("calm", "calm")].splitlines() == ["go", "[¬ready]", "stop", "/ does nothing"]
    assert labels[("busy", "done")].splitlines() == ["finish", "fail", "[¬ready]", "/ emits finished"]
    assert labels[("calm", "busy")].splitlines() == ["go", "[ready]", "/ emits started; starts the work"]
    ids = {(t, h): a["id"] for t, h, a, _ in edges}
    assert ids[("calm", "busy")] == "rest->busy" and ids[("calm", "calm")] == "rest->calm"
    # the group is a cluster holding its members only; a row leaving it starts at its border
    cluster = re.search(r"subgraph cluster_rest \{(.*?)\n\t\}", source, re.S).group(1)
    assert re.findall(r"^\t\t(\w+) \[", cluster, re.M) == ["calm", "done"]
    assert "any state" not in source
    assert re.search(r'calm -> "__label rest->busy" \[[^\]]*ltail=cluster_rest', source)
    assert not re.search(r'calm -> "__label rest->calm" \[[^\]]*ltail', source)


def test_every_declared_row_is_in_exactly_one_review_edge():
    """Each declared row is on one review edge; group rows are drawn once."""
    diagram = D.extract()
    drawn = D.review_edges([D.DrawnRow(r) for r in diagram.rows])
    ids = [d.row.id for e in drawn for d in e.rows]
    assert sorted(ids) == sorted(r.id for r in diagram.rows)
    assert len({(e.source, e.dest) for e in drawn}) == len(drawn)
    # every expanded transition belongs to one declared row, and the group rows are drawn once
    assert sorted(m for r in diagram.rows for m in r.members) == sorted(e.id for e in diagram.edges)
    assert len(drawn) <= len(diagram.edges) / 2
    for group, members in diagram.groups:
        assert any(r.source == group for r in diagram.rows)
        assert not any(r.source in members for r in diagram.rows if len(r.members) == 1
                       and any(o.source == group and (o.trigger, o.guards, o.dest) ==
                               (r.trigger, r.guards, r.dest) for o in diagram.rows))


def test_review_labels_say_what_each_row_does():
    """Each row's trigger, guards and effect words are on its edge; a refusal cascade's rows
    are one line "refused: the first failing guard → endReason"."""
    diagram = D.extract()
    labels = {a["id"]: " ".join(text.split()) for _, _, a, text
              in review_dot_edges(D.render_review_dot(diagram))}
    refused = {r.id: (c.source, r.dest) for c in D.cascades(diagram.rows) for _, r in c.refusals}
    per_edge = {edge: sum(e == edge for e in refused.values()) for edge in refused.values()}
    for row in diagram.rows:
        label = labels[f"{row.source}->{row.dest}"]
        assert row.trigger in label.split(), row.id
        if per_edge.get(refused.get(row.id), 0) >= 2:  # folded into the cascade's one line
            assert "refused: the first failing guard → endReason" in label, row.id
            assert D.guard_text(row.guards) not in label, row.id
            continue
        if row.guards:
            assert " ".join(D.guard_text(row.guards).split()) in label, row.id
        if row.effect:
            assert "/ " + " ".join(diagram.effect_text(row.effect).split()) in label, row.id


def test_refusal_cascades_are_one_line_and_the_guard_order_is_listed_once():
    """The refusals of turn_failed_retryable read as one line per edge; the legend lists the
    guard order once, each guard with the endReason its failure gives."""
    diagram = D.extract()
    found = D.cascades(diagram.rows)
    assert [(c.source, c.trigger) for c in found] == [
        ("at_rest", "turn_failed_retryable"), ("continuing", "turn_failed_retryable")]
    order = list(found[0].order)
    assert order == ["retry_enabled", "has_retries_left", "replay_safe", "!fallback_due",
                     "hint_within_wait", "within_deadline", "budget_allows"]
    source = D.render_review_dot(diagram)
    edges = {a["id"]: text for _, _, a, text in review_dot_edges(source)}
    for edge in ("at_rest->exhausted", "continuing->exhausted"):
        text = " ".join(edges[edge].split())
        assert text.count("refused: the first failing guard → endReason") == 1, edge
        assert "¬has_retries_left" not in text and "¬budget_allows" not in text, edge
        assert "/ turn ends; auto_retry_end (endReason); compaction; prompt done" in text, edge
    legend = source[source.index("<b>guard order"):]
    plain = re.sub(r"<[^>]+>", " ", legend[:legend.index("</table>")]).replace("&#160;", " ")
    positions = [plain.index(f" {g} ") for g in order]
    assert positions == sorted(positions) and all(plain.count(f" {g} ") == 1 for g in order)
    for reason in ("exhausted", "output_streamed", "hint_too_long", "deadline", "budget",
                   "disabled (continuing)"):
        assert f"fails → {reason}" in " ".join(plain.split()) or reason in plain, reason


def test_cascades_need_a_go_row_and_two_refusals():
    """A cell with one refusal row is drawn row by row."""
    rows = [D.DeclaredRow("a--t[g,h]->b", "a", "t", "b", ("g", "h"), None, ""),
            D.DeclaredRow("a--t[!g]->c", "a", "t", "c", ("!g",), None, "")]
    assert D.cascades(rows) == ()
    rows.append(D.DeclaredRow("a--t[g,!h]->c", "a", "t", "c", ("g", "!h"), None, ""))
    (c,) = D.cascades(rows)
    assert c.order == ("g", "h") and [g for g, _ in c.refusals] == ["g", "h"]
    assert c.refused_by("a--t[g,!h]->c") == "h" and c.refused_by("a--t[g,h]->b") is None


def test_legend_card_states_the_classification_families():
    """One line per outcome, naming the trigger it fires and its families."""
    from fsm.review.diagrams.policy import policy_card

    card = policy_card()
    names = [n for n, _ in card.families]
    assert names[:3] == ["retryable → turn_failed_retryable", "context overflow → turn_overflowed",
                         "fatal → turn_failed_fatal"]
    families = dict(card.families)
    assert "rate limit" in families[names[0]] and "overloaded" in families[names[0]]
    assert "billing" in families[names[2]] and families[names[2]].endswith("anything unmatched")
    source = D.render_review_dot(D.extract())
    for name, text in card.families:
        assert D.dot.html_text(name) in source


def test_effect_text_falls_back_to_the_effect_name():
    """An effect without words reads as its name with spaces."""
    diagram = D.extract(grouped_declaration(effects={}))
    assert diagram.effect_text("start") == "start"
    assert diagram.effect_text("end_failed") == "end failed"
    assert diagram.effect_text(None) == ""


def svg_size_px(svg: bytes) -> tuple[float, float]:
    root = ET.fromstring(svg)
    return tuple(float(root.get(k).removesuffix("pt")) * 96 / 72 for k in ("width", "height"))


def label_boxes(svg: bytes) -> dict[str, tuple[float, float, float, float]]:
    """Label node id → its box (x0, y0, x1, y1) in SVG points: each label is a node of its own
    whose box (drawn with a transparent stroke) holds its text."""
    boxes = {}
    for g in ET.fromstring(svg).iter(f"{SVG_NS}g"):
        if g.get("class") != "node":
            continue
        for poly in g.iter(f"{SVG_NS}polygon"):
            if poly.get("stroke") == "transparent":
                xy = [tuple(map(float, p.split(","))) for p in poly.get("points").split()]
                boxes[g.get("id")] = (min(x for x, _ in xy), min(y for _, y in xy),
                                      max(x for x, _ in xy), max(y for _, y in xy))
    return boxes


def edge_points(svg: bytes, steps: int = 32) -> dict[str, list[tuple[float, float]]]:
    """Edge id → points along its path (each cubic Bézier piece sampled ``steps`` times)."""
    out = {}
    for g in svg_edges(svg):
        points = []
        for path in g.iter(f"{SVG_NS}path"):
            xy = [tuple(map(float, p.split(","))) for p in
                  re.findall(r"-?[\d.]+,-?[\d.]+", path.get("d"))]
            for i in range(0, len(xy) - 3, 3):
                p0, p1, p2, p3 = xy[i:i + 4]
                for k in range(steps + 1):
                    u = k / steps
                    w = ((1 - u) ** 3, 3 * (1 - u) ** 2 * u, 3 * (1 - u) * u ** 2, u ** 3)
                    points.append((sum(c * p[0] for c, p in zip(w, (p0, p1, p2, p3))),
                                   sum(c * p[1] for c, p in zip(w, (p0, p1, p2, p3)))))
        out[g.get("id")] = points
    return out


def assert_labels_clear(svg: bytes) -> None:
    """No two label boxes overlap and no edge runs through a label box (an edge's own two
    halves end on its label's border)."""
    boxes = label_boxes(svg)
    assert set(boxes) == set(label_nodes(svg)), "every label is a node with a box"
    for (a, ba), (b, bb) in itertools.combinations(boxes.items(), 2):
        overlap = min(ba[2], bb[2]) - max(ba[0], bb[0]), min(ba[3], bb[3]) - max(ba[1], bb[1])
        assert min(overlap) <= 0, f"the labels of {a} and {b} overlap"
    for edge, points in edge_points(svg).items():
        for label, (x0, y0, x1, y1) in boxes.items():
            if edge.startswith(f"{label}#"):
                continue
            hits = [(x, y) for x, y in points if x0 + 1 < x < x1 - 1 and y0 + 1 < y < y1 - 1]
            assert not hits, f"edge {edge} runs through the label of {label} at {hits[0]}"


def failures_declaration() -> dict:
    """The declaration with what the failures work adds (new triggers, a guard, rows), to check
    the review diagram still reads: labels clear, one picture."""
    decl = json.loads(json.dumps(L.declaration()))
    decl["triggers"] += [t for t in ("deadline_passed", "request_refused", "fallback_due")
                         if t not in decl["triggers"]]
    declared = {r["id"] for r in decl["rows"]}
    decl["guards"]["fallback_allowed"] = "a fallback model is configured and not yet used"
    decl["effects"].update({"end_deadline_passed": "emit auto_retry_end (deadline); the prompt "
                            "may return", "end_refused": "emit auto_retry_end (refused); the "
                            "prompt may return", "switch_model": "switch to the fallback model; "
                            "attempt + 1; start backoff"})
    extra = [("backing_off", "deadline_passed", "exhausted", [], "end_deadline_passed"),
             ("continuing", "deadline_passed", "exhausted", [], "end_deadline_passed"),
             ("at_rest", "request_refused", "exhausted", [], "end_refused"),
             ("continuing", "fallback_due", "backing_off", ["fallback_allowed"], "switch_model"),
             ("continuing", "fallback_due", "exhausted", ["!fallback_allowed"], "end_exhausted"),
             ("backing_off", "backoff_elapsed", "backing_off", ["!budget_allows"], None)]
    groups = decl["groups"]
    for source, trigger, dest, guards, effect in extra:
        rid = f"{source}--{trigger}" + (f"[{','.join(guards)}]" if guards else "") + f"->{dest}"
        if rid in declared:  # the declaration already has it (the failures work landed)
            continue
        decl["rows"].append({"id": rid, "source": source, "trigger": trigger, "dest": dest,
                             "guards": guards, "effect": effect, "spec": "", "ignored": False})
        for member in groups.get(source, [source]):
            decl["transitions"].append({
                "id": f"{member}--{trigger}" + (f"[{','.join(guards)}]" if guards else "")
                      + f"->{dest}", "source": member, "trigger": trigger, "dest": dest,
                "guards": guards, "effect": effect, "spec": "", "row": rid})
    return decl


@pytest.mark.parametrize("decl", [None, "grouped", "failures"])
def test_review_labels_are_clear_of_each_other_and_of_edges(decl):
    """Read from the SVG's geometry: labels never overlap and no edge crosses label text, for
    the machine as declared, a small grouped one, and one with the failure triggers added."""
    decl = {None: None, "grouped": grouped_declaration(), "failures": failures_declaration()}[decl]
    diagram = D.extract(decl)
    svg = D.render_review_svg(diagram)
    assert len(label_boxes(svg)) == len(D.review_edges([D.DrawnRow(r) for r in diagram.rows]))
    assert_labels_clear(svg)


@pytest.mark.parametrize("state", L.STATES)
def test_small_multiple_labels_are_clear(state):
    """The same geometry check on each state's small diagram."""
    assert_labels_clear(S.render_state_svg(D.extract(), state))


def test_review_fits_a_wide_screen():
    """The machine (its fallback, deadline and budget-wait rows included) and its legend card
    fit a 1920 x 1320 px screen at 96 dpi."""
    width, height = svg_size_px(D.render_review_svg(D.extract()))
    assert width <= 1920 and height <= 1320, (width, height)


def test_committed_review_svg_is_current():
    """The committed review SVG draws the edges the declaration has today."""
    committed = (COMMITTED / "retry_lifecycle_review.svg").read_bytes()
    fresh = D.render_review_svg(D.extract())
    ids = lambda svg: sorted(g.get("id") for g in svg_edges(svg))  # noqa: E731
    assert ids(committed) == ids(fresh), "diagrams/retry_lifecycle_review.svg is stale: run 'make diagrams'"


def test_review_mermaid_has_one_line_per_merged_edge():
    """One Mermaid line per merged edge; the group's rows start from its first member."""
    diagram = D.extract(grouped_declaration())
    text = D.render_review_mermaid(diagram)
    assert text.startswith("---\ntitle: retry_lifecycle_review\n---\nstateDiagram-v2\n")
    lines = [l.strip() for l in text.splitlines() if "-->" in l]
    assert lines == [
        "[*] --> calm",
        "calm --> busy : go [ready]<br>/ emits started, starts the work",
        "calm --> calm : go [¬ready]<br>stop<br>/ does nothing",
        "busy --> done : finish<br>fail [¬ready]<br>/ emits finished",
        "busy --> busy : fail [ready]<br>/ emits retry, starts again",
        "busy --> calm : stop<br>/ emits finished",
    ]
    assert "    calm : rest∶ done answer as calm" in text
    assert " rest " not in text.replace("rest∶", "") and "class rest" not in text


def test_declaration_json_is_the_declaration():
    """retry_lifecycle.json is lifecycle.declaration() as JSON."""
    committed = json.loads((COMMITTED / "retry_lifecycle.json").read_text(encoding="utf-8"))
    assert committed == json.loads(json.dumps(L.declaration()))
    assert D.declaration_json().endswith("}\n")


def test_fold_rows_groups_rows_every_member_has_alike():
    """An old declaration's per-state rows fold into its groups' rows."""
    decl = grouped_declaration()
    legacy = {k: v for k, v in decl.items() if k not in ("rows", "groups")}
    legacy["transitions"] = [{k: v for k, v in t.items() if k != "row"} for t in decl["transitions"]]
    folded = D.fold_rows(legacy["transitions"], decl["groups"])
    assert [(r["source"], r["trigger"], r["guards"], r["dest"]) for r in folded] == [
        (r["source"], r["trigger"], r["guards"], r["dest"]) for r in decl["rows"]]
    assert folded[0]["members"] == ["calm--go[ready]->busy", "done--go[ready]->busy"]
    # a row only one member has stays that member's
    only = [t for t in legacy["transitions"] if t["id"] != "done--stop->calm"]
    rows = D.fold_rows(only, decl["groups"])
    assert ("calm", "stop") in [(r["source"], r["trigger"]) for r in rows]
    assert ("rest", "stop") not in [(r["source"], r["trigger"]) for r in rows]


def test_markdown_lists_every_effect_in_words():
    """The Effects section lists every effect in the declaration's words."""
    diagram = D.extract()
    text = D.render_markdown(diagram)
    section = text.split("## Effects", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (.*) \|$", section, re.M)
    assert rows == [(e, doc.replace("|", "\\|")) for e, doc in L.declaration()["effects"].items()]
    assert "## Effects" not in D.render_markdown(D.extract(mini_declaration()))


FALLBACK_SETTINGS = {"maxRetries": 4, "retryHints": "honor", "afterOutput": "stop",
                     "fallbackModels": ["gpt-backup", "openai/gpt-small"], "fallbackAfter": 3}


def test_legend_card_names_the_fallback_models_when_set():
    """fallbackModels set: the legend's settings name the models, when they switch and revert."""
    from fsm.core.settings import RetrySettings
    from fsm.review.diagrams.policy import policy_card

    card = policy_card(RetrySettings.coerce(FALLBACK_SETTINGS), source="team.json")
    line = dict(card.settings)["fallback"]
    assert "gpt-backup, openai/gpt-small" in line and "after 3 failures in a row" in line
    assert "overloaded or usage limit" in line and "after 300 s (fallbackRevertMs)" in line
    source = " ".join(re.sub(r"<[^>]+>", " ", D.render_review_dot(D.extract(), policy=card)).split())
    assert "fallback fallbackModels gpt-backup, openai/gpt-small" in source.replace("&#160;", "")
    assert "fallback" not in dict(policy_card().settings)  # the defaults: none to name


def legend_runs(svg: bytes) -> list[tuple[float, float, float, bool, str]]:
    """The legend card's runs of text: (x, y, font size, bold, text), in SVG points."""
    graph = next(g for g in ET.fromstring(svg).iter(f"{SVG_NS}g") if g.get("class") == "graph")
    return [(float(t.get("x")), float(t.get("y")), float(t.get("font-size")),
             t.get("font-weight") == "bold", t.text or "") for t in graph.findall(f"{SVG_NS}text")]


@pytest.mark.parametrize("settings", [None, FALLBACK_SETTINGS])
def test_legend_rows_do_not_overlap(settings):
    """Read from the SVG: runs on one line leave room for a viewer's wider font (bold
    included); in each column a row's name and text share a line, a line apart from the next."""
    from fsm.core.settings import RetrySettings
    from fsm.review.diagrams.policy import policy_card

    policy = policy_card(RetrySettings.coerce(settings)) if settings else None
    runs = legend_runs(D.dot.svg_of(D.dot.build_review_digraph(D.extract(), policy=policy)))
    assert any("gpt-backup" in r[4] for r in runs) == bool(settings)
    # a viewer's font may be wider than Graphviz's estimate: a run needs this much room (em)
    per_char = {False: 0.55, True: 0.62}
    for y in {r[1] for r in runs}:
        line = sorted(r for r in runs if r[1] == y)
        for (x, _, size, bold, text), nxt in zip(line, line[1:]):
            room = per_char[bold] * size * len(text.rstrip("\xa0 "))
            assert nxt[0] >= x + room, f"{text!r} runs into {nxt[4]!r}"
    split = next(x for x, _, _, _, text in runs if text.startswith("read an edge as"))
    for column in ([r for r in runs if r[0] < split], [r for r in runs if r[0] >= split]):
        baselines = sorted({y for _, y, _, _, _ in column})
        for a, b in zip(baselines, baselines[1:]):
            # one line (a bold run may sit a point off), or a line apart: never half a line
            assert b - a <= 1.5 or b - a >= 0.9 * 9, f"lines at y={a} and y={b} overlap"
