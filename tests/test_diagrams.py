"""Diagrams generated from the declaration (SPEC §7): drift, byte stability, one edge per row."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

from fsm import diagrams as D
from fsm import lifecycle as L
from fsm.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
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

def test_committed_diagrams_match_the_declaration(tmp_path):
    D.write_all(tmp_path, svg=False)
    for name in ("retry_lifecycle.dot", "retry_lifecycle.mmd", "retry_lifecycle.md"):
        committed = COMMITTED / name
        assert committed.is_file(), f"{committed} is missing: run 'make diagrams' and commit it"
        assert committed.read_bytes() == (tmp_path / name).read_bytes(), (
            f"{committed} no longer matches fsm/lifecycle.py: run 'make diagrams' "
            "(python -m fsm diagrams) and commit the result")


@pytest.mark.subprocess
def test_text_outputs_are_byte_stable_across_hash_seeds(tmp_path):
    outputs = {}
    for seed in ("0", "4242"):
        out = tmp_path / seed
        env = dict(os.environ, PYTHONHASHSEED=seed)
        subprocess.run([sys.executable, "-m", "fsm", "diagrams", "--no-svg", "--out", str(out)],
                       check=True, cwd=ROOT, env=env, capture_output=True, timeout=120)
        outputs[seed] = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    assert sorted(outputs["0"]) == ["retry_lifecycle.dot", "retry_lifecycle.md",
                                    "retry_lifecycle.mmd"]
    assert outputs["0"] == outputs["4242"]
    assert outputs["0"] == {k: v.encode() for k, v in D.render_all().items()}


def test_text_outputs_have_unix_endings_and_no_version_or_date():
    for name, text in D.render_all().items():
        assert "\r" not in text, name
        assert text.endswith("\n") and not text.endswith("\n\n"), name
        assert L.VERSION not in text, f"{name} embeds the declaration version"
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), f"{name} embeds a date"


# ----------------------------------------------------------------------------- DOT

def test_dot_has_one_edge_per_transition_labelled_with_its_guards():
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


def test_dot_label_example_from_the_issue():
    source = D.render_dot(D.extract())
    assert ('idle -> exhausted [label="turn_failed_retryable [retry_enabled ∧ ¬has_retries_left]"'
            in source)


def test_ignored_cells_are_not_edges():
    edges = dot_edges(D.render_dot(D.extract()))
    drawn = {(t, attrs["label"].split(" ")[0]) for t, _, attrs in edges if attrs["id"] != "initial"}
    for ig in L.IGNORED:
        assert (ig.source, ig.trigger) not in drawn, ig.id
    assert not any(attrs["id"].endswith("(ignored)") for _, _, attrs in edges)


def test_dot_clusters_chain_states_and_notes_the_twin_states():
    source = D.render_dot(D.extract())
    chain = re.search(r"subgraph cluster_in_chain \{(.*?)\n\t\}", source, re.S).group(1)
    ended = re.search(r"subgraph cluster_ended \{(.*?)\n\t\}", source, re.S).group(1)
    assert re.findall(r"^\t\t(\w+) \[", chain, re.M) == list(L.IN_CHAIN)
    assert re.findall(r"^\t\t(\w+) \[", ended, re.M) == list(L.ENDED)
    assert "succeeded, exhausted, cancelled: the same transitions and ignored cells as idle" in source


def test_real_declaration_twins_are_idle_and_the_ended_states():
    assert D.extract().twins() == ((L.IDLE,) + L.ENDED,)


def test_free_text_cannot_break_dot_or_become_html(tmp_path):
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


def test_svg_parses_and_has_one_edge_per_transition(tmp_path):
    written = D.write_all(tmp_path)
    assert [p.name for p in written] == ["retry_lifecycle.dot", "retry_lifecycle.mmd",
                                        "retry_lifecycle.md", "retry_lifecycle.svg"]
    edges = svg_edges((tmp_path / "retry_lifecycle.svg").read_bytes())
    assert Counter(g.get("id") for g in edges) == Counter([r.id for r in L.TRANSITIONS] + ["initial"])


def test_committed_svg_is_valid_and_current():
    edges = svg_edges((COMMITTED / "retry_lifecycle.svg").read_bytes())
    assert sorted(g.get("id") for g in edges) == sorted([r.id for r in L.TRANSITIONS] + ["initial"]), (
        "diagrams/retry_lifecycle.svg is stale: run 'make diagrams'")


def test_coverage_marks_draw_three_statuses():
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
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(D.DiagramError, match="Graphviz's 'dot' program was not found"):
        D.render_svg(D.extract())
    assert main(["diagrams", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "install Graphviz" in err and "--no-svg" in err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "retry_lifecycle.dot", "retry_lifecycle.md", "retry_lifecycle.mmd"]


def test_dot_failure_is_a_diagram_error(monkeypatch):
    import graphviz

    def fail(*args, **kwargs):
        raise graphviz.CalledProcessError(1, ["dot"], stderr=b"syntax error")

    monkeypatch.setattr(graphviz.Digraph, "pipe", fail)
    with pytest.raises(D.DiagramError, match="'dot' failed"):
        D.render_svg(D.extract())


# ----------------------------------------------------------------------------- Mermaid

def test_mermaid_has_one_transition_line_per_row():
    text = D.render_mermaid(D.extract())
    assert text.startswith("---\ntitle: retry_lifecycle\n---\nstateDiagram-v2\n")
    lines = [l.strip() for l in text.splitlines() if "-->" in l]
    assert lines[0] == f"[*] --> {L.INITIAL}"
    assert lines[1:] == [f"{r.source} --> {r.dest} : {expected_label(r)}" for r in L.TRANSITIONS]
    assert "class backing_off,continuing in_chain" in text
    assert "class succeeded,exhausted,cancelled ended" in text


def test_mermaid_text_never_carries_a_second_colon_or_a_semicolon():
    decl = mini_declaration()
    diagram = D.extract(decl)
    diagram = D.Diagram(diagram.name, (D.State("a", "doc: with; #1", "", True),) + diagram.states[1:],
                        diagram.triggers, diagram.guards, diagram.edges, diagram.ignored)
    line = next(l for l in D.render_mermaid(diagram).splitlines() if l.startswith("    a : "))
    assert line == "    a : doc - with, no. 1"


# ----------------------------------------------------------------------------- Markdown

def test_markdown_has_every_transition_row_in_order():
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
    text = D.render_markdown(D.extract())
    section = text.split("## Rows the audit cannot see rejected", 1)[1]
    listed = re.findall(r"^- `(.*)`$", section, re.M)
    assert listed == [r.id for r in L.TRANSITIONS if r.guards == ("!retry_enabled",)]


# ----------------------------------------------------------------------------- the model

def test_reachability_of_guarded_rows():
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
    decl = mini_declaration()
    decl["transitions"].append(dict(decl["transitions"][0]))
    with pytest.raises(ValueError, match=r"row ids must be unique .*repeated: a--t\[g\]->b"):
        D.extract(decl)


def test_markdown_flags_rows_that_can_never_be_taken():
    text = D.render_markdown(D.extract(mini_declaration()))
    section = text.split("## Rows that can never be taken", 1)[1]
    assert re.findall(r"^- `(.*)`$", section, re.M) == ["b--u[h]->b"]


def test_a_declaration_without_fallbacks_says_so():
    decl = mini_declaration()
    decl["transitions"] = [t for t in decl["transitions"]
                           if t["id"] not in ("a--t[!g]->a", "b--u[h]->b")]
    decl["ignored"] = []
    text = D.render_markdown(D.extract(decl))
    assert "None: every guarded row can be rejected." in text
    assert "Rows that can never be taken" not in text


def test_mini_declaration_renders_without_lifecycle_groups():
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
    edge = next(e for e in D.extract().edges
                if e.id == "continuing--turn_failed_retryable[retry_enabled,!has_retries_left]->exhausted")
    assert edge.guard_text == "retry_enabled ∧ ¬has_retries_left"
    assert edge.label == "turn_failed_retryable [retry_enabled ∧ ¬has_retries_left]"
    plain = next(e for e in D.extract().edges if not e.guards)
    assert plain.guard_text == "" and plain.label == plain.trigger


# ----------------------------------------------------------------------------- command

def test_command_writes_and_checks(tmp_path, capsys):
    out = tmp_path / "d"
    assert main(["diagrams", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "retry_lifecycle.dot", "retry_lifecycle.md", "retry_lifecycle.mmd", "retry_lifecycle.svg"]
    assert "wrote" in capsys.readouterr().out
    assert main(["diagrams", "--check", "--out", str(out)]) == 0
    (out / "retry_lifecycle.mmd").write_text("stale\n")
    (out / "retry_lifecycle.md").unlink()
    assert main(["diagrams", "--check", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "retry_lifecycle.mmd, retry_lifecycle.md" in err and "make diagrams" in err


def test_command_reports_an_unwritable_folder(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert main(["diagrams", "--no-svg", "--out", str(blocker / "sub")]) == 2
    assert "cannot write the diagrams" in capsys.readouterr().err


def test_readme_shows_the_generated_mermaid_diagram():
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    mermaid = (root / "diagrams" / "retry_lifecycle.mmd").read_text(encoding="utf-8")
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert "```mermaid\n" + mermaid.rstrip("\n") + "\n```" in readme, \
        "README's Mermaid block differs from diagrams/retry_lifecycle.mmd: paste the generated one"
    assert "(diagrams/retry_lifecycle.svg)" in readme
