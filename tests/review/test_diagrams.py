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
from fsm.core import lifecycle as L
from fsm.__main__ import main

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


def fallback_rows() -> list[str]:
    """Guarded rows that can never be tried and rejected (whenever their guards fail an
    earlier row of the cell is taken), found by trying every guard value: the oracle the
    diagrams' and the audit's own reasoning is checked against."""
    cells: dict[tuple[str, str], list[L.Row]] = {}
    for r in L.TRANSITIONS:
        cells.setdefault((r.source, r.trigger), []).append(r)

    def holds(row, env):
        return all(env[g.lstrip("!")] != g.startswith("!") for g in row.guards)

    found = set()
    for rows in cells.values():
        names = sorted({g.lstrip("!") for r in rows for g in r.guards})
        envs = [dict(zip(names, v)) for v in itertools.product((True, False), repeat=len(names))]
        for k, row in enumerate(rows):
            if row.guards and not any(not holds(row, env) and not any(holds(e, env) for e in rows[:k])
                                      for env in envs):
                found.add(row.id)
    return [r.id for r in L.TRANSITIONS if r.id in found]


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

TEXT_FILES = ["retry_lifecycle.dot", "retry_lifecycle.json", "retry_lifecycle.md",
              "retry_lifecycle.mmd", "retry_lifecycle_review.dot", "retry_lifecycle_review.mmd"]


def test_committed_diagrams_match_the_declaration(tmp_path):
    D.write_all(tmp_path, svg=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == TEXT_FILES
    for name in TEXT_FILES:
        committed = COMMITTED / name
        assert committed.is_file(), f"{committed} is missing: run 'make diagrams' and commit it"
        assert committed.read_bytes() == (tmp_path / name).read_bytes(), (
            f"{committed} no longer matches fsm/core/lifecycle.py: run 'make diagrams' "
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
    assert sorted(outputs["0"]) == TEXT_FILES
    assert outputs["0"] == outputs["4242"]
    assert outputs["0"] == {k: v.encode() for k, v in D.render_all().items()}


def test_text_outputs_have_unix_endings_and_no_version_or_date():
    for name, text in D.render_all().items():
        assert "\r" not in text, name
        assert text.endswith("\n") and not text.endswith("\n\n"), name
        if not name.endswith(".json"):
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
    assert [p.name for p in written] == [
        "retry_lifecycle.dot", "retry_lifecycle.mmd", "retry_lifecycle.md",
        "retry_lifecycle_review.dot", "retry_lifecycle_review.mmd", "retry_lifecycle.json",
        "retry_lifecycle.svg", "retry_lifecycle_review.svg"]
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
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == TEXT_FILES


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
    assert line == "    a : doc∶ with, no. 1"  # '∶' is a ratio sign, not a colon


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
    assert listed == fallback_rows() and listed


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
    assert sorted(p.name for p in out.iterdir()) == sorted(
        TEXT_FILES + ["retry_lifecycle.svg", "retry_lifecycle_review.svg"])
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


def test_readme_shows_the_generated_review_diagram():
    mermaid = (COMMITTED / "retry_lifecycle_review.mmd").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "```mermaid\n" + mermaid.rstrip("\n") + "\n```" in readme, (
        "README's Mermaid block differs from diagrams/retry_lifecycle_review.mmd: paste the "
        "generated one")
    assert "(diagrams/retry_lifecycle_review.svg)" in readme
    assert "(diagrams/retry_lifecycle.svg)" in readme


# ----------------------------------------------------------------------------- review diagram

def grouped_declaration(rows=None, effects=None) -> dict:
    """A small declaration with a group, in the shape of lifecycle.declaration(): rows as
    declared (``source`` may be the group ``rest``), transitions expanded per member state."""
    groups = {"rest": ["calm", "done"]}
    rows = rows if rows is not None else [
        ("rest", "go", "busy", ["ready"], "start"),
        ("rest", "go", "calm", ["!ready"], "nothing"),
        ("rest", "stop", "calm", [], "nothing"),
        ("busy", "finish", "done", [], "report"),
        ("busy", "fail", "busy", ["ready"], "again"),
        ("busy", "fail", "done", ["!ready"], "report"),
        ("busy", "stop", "calm", [], "report"),
    ]
    def rid(src, trig, guards, dest):
        return f"{src}--{trig}" + (f"[{','.join(guards)}]" if guards else "") + f"->{dest}"
    declared, transitions = [], []
    for src, trig, dest, guards, effect in rows:
        row_id = rid(src, trig, guards, dest)
        declared.append({"id": row_id, "source": src, "trigger": trig, "dest": dest,
                         "guards": list(guards), "effect": effect, "spec": "test"})
        for s in groups.get(src, [src]):
            transitions.append({"id": rid(s, trig, guards, dest), "source": s, "trigger": trig,
                                "dest": dest, "guards": list(guards), "effect": effect,
                                "spec": "test", "row": row_id})
    states = ["calm", "busy", "done"]
    triggers = ["go", "stop", "finish", "fail"]
    cells = {(t["source"], t["trigger"]) for t in transitions}
    ignored = [{"id": f"{s}--{t}->(ignored)", "source": s, "trigger": t, "reason": "n/a"}
               for s in states for t in triggers if (s, t) not in cells]
    return {"states": states, "initial": "calm", "triggers": triggers,
            "guards": {"ready": "the work is ready"}, "transitions": transitions,
            "ignored": ignored, "groups": groups, "rows": declared,
            "effects": effects if effects is not None else {
                "start": "emits started; starts the work", "nothing": "does nothing",
                "report": "emits finished", "again": "emits retry; starts again"}}


def review_dot_edges(source: str) -> list[tuple[str, str, dict[str, str], str]]:
    """(tail, head, attributes, label text) of every edge of a review DOT text."""
    edges = []
    for line in source.splitlines():
        m = re.match(r"\t(\S+) -> (\S+) \[(.*)\]$", line)
        if m:
            body = m.group(3)
            label = re.search(r"label=<(.*)>(?= \w+=)", body)
            text = re.sub(r"<[^>]+>", "\n", label.group(1)) if label else ""
            text = "\n".join(t.strip() for t in text.split("\n") if t.strip())
            rest = re.sub(r"label=<(.*)>(?= \w+=)", "", body)
            attrs = {k: v.strip('"') for k, v in
                     re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s\]]+)', rest)}
            edges.append((m.group(1), m.group(2), attrs, text.replace("&gt;", ">").replace("&lt;", "<").replace("&amp;", "&")))
    return edges


def test_review_draws_group_rows_once_and_merges_parallel_edges():
    diagram = D.extract(grouped_declaration())
    assert [(r.source, len(r.members)) for r in diagram.rows][:3] == [("rest", 2)] * 3
    edges = review_dot_edges(D.render_review_dot(diagram))
    pairs = [(t, h) for t, h, _, _ in edges]
    assert pairs == [("__initial", "calm"), ("rest", "busy"), ("rest", "calm"), ("busy", "done"),
                     ("busy", "busy"), ("busy", "calm")]
    labels = {(t, h): text for t, h, _, text in edges}
    # two rows of rest -> calm, one edge, stacked; one effect run, written once in words
    assert labels[("rest", "calm")].splitlines() == ["go", "[¬ready]", "stop", "/ does nothing"]
    assert labels[("busy", "done")].splitlines() == ["finish", "fail", "[¬ready]", "/ emits finished"]
    assert labels[("rest", "busy")].splitlines() == ["go", "[ready]", "/ emits started; starts the work"]
    # the group is a cluster holding its members and the node the group's rows start from
    source = D.render_review_dot(diagram)
    cluster = re.search(r"subgraph cluster_rest \{(.*?)\n\t\}", source, re.S).group(1)
    assert re.findall(r"^\t\t(\w+) \[", cluster, re.M) == ["rest", "calm", "done"]
    assert 'label="any state rest"' in cluster


def test_every_declared_row_is_in_exactly_one_review_edge():
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
    diagram = D.extract()
    labels = {(t, h): " ".join(text.split()) for t, h, _, text
              in review_dot_edges(D.render_review_dot(diagram))}
    for row in diagram.rows:
        label = labels[(row.source, row.dest)]
        assert row.trigger in label.split(), row.id
        if row.guards:
            assert " ".join(D.guard_text(row.guards).split()) in label, row.id
        if row.effect:
            assert "/ " + " ".join(diagram.effect_text(row.effect).split()) in label, row.id


def test_effect_text_falls_back_to_the_effect_name():
    diagram = D.extract(grouped_declaration(effects={}))
    assert diagram.effect_text("start") == "start"
    assert diagram.effect_text("end_failed") == "end failed"
    assert diagram.effect_text(None) == ""


def svg_size_px(svg: bytes) -> tuple[float, float]:
    root = ET.fromstring(svg)
    return tuple(float(root.get(k).removesuffix("pt")) * 96 / 72 for k in ("width", "height"))


def label_boxes(svg: bytes) -> dict[str, tuple[float, float, float, float]]:
    """Edge id → the box around its label's text (estimated from the text anchors)."""
    root = ET.fromstring(svg)
    boxes = {}
    for g in root.iter(f"{SVG_NS}g"):
        if g.get("class") != "edge":
            continue
        xs, ys = [], []
        for t in g.iter(f"{SVG_NS}text"):
            x, y, size = float(t.get("x")), float(t.get("y")), float(t.get("font-size"))
            width = len("".join(t.itertext())) * size * 0.5
            start = {"start": x, "middle": x - width / 2, "end": x - width}[t.get("text-anchor", "start")]
            xs += [start, start + width]
            ys += [y - size * 0.8, y + size * 0.2]
        if xs:
            boxes[g.get("id")] = (min(xs), min(ys), max(xs), max(ys))
    return boxes


@pytest.mark.parametrize("decl", [None, "grouped"])
def test_review_labels_never_overlap(decl):
    diagram = D.extract(grouped_declaration() if decl else None)
    boxes = label_boxes(D.render_review_svg(diagram))
    assert len(boxes) == len(D.review_edges([D.DrawnRow(r) for r in diagram.rows]))
    for (a, ba), (b, bb) in itertools.combinations(boxes.items(), 2):
        overlap = min(ba[2], bb[2]) - max(ba[0], bb[0]), min(ba[3], bb[3]) - max(ba[1], bb[1])
        assert min(overlap) <= 1, f"the labels of {a} and {b} overlap"


def test_review_fits_a_laptop_screen():
    """About 1600 x 1000 px at 96 dpi, for the machine as declared."""
    width, height = svg_size_px(D.render_review_svg(D.extract()))
    assert width <= 1650 and height <= 1050, (width, height)


def test_committed_review_svg_is_current():
    committed = (COMMITTED / "retry_lifecycle_review.svg").read_bytes()
    fresh = D.render_review_svg(D.extract())
    ids = lambda svg: sorted(g.get("id") for g in svg_edges(svg))  # noqa: E731
    assert ids(committed) == ids(fresh), "diagrams/retry_lifecycle_review.svg is stale: run 'make diagrams'"


def test_review_mermaid_has_one_line_per_merged_edge():
    diagram = D.extract(grouped_declaration())
    text = D.render_review_mermaid(diagram)
    assert text.startswith("---\ntitle: retry_lifecycle_review\n---\nstateDiagram-v2\n")
    lines = [l.strip() for l in text.splitlines() if "-->" in l]
    assert lines == [
        "[*] --> calm",
        "rest --> busy : go [ready]<br>/ emits started, starts the work",
        "rest --> calm : go [¬ready]<br>stop<br>/ does nothing",
        "busy --> done : finish<br>fail [¬ready]<br>/ emits finished",
        "busy --> busy : fail [ready]<br>/ emits retry, starts again",
        "busy --> calm : stop<br>/ emits finished",
    ]
    assert 'state "any state rest (calm, done)" as rest' in text
    assert "class rest group" in text


def test_declaration_json_is_the_declaration():
    committed = json.loads((COMMITTED / "retry_lifecycle.json").read_text(encoding="utf-8"))
    assert committed == json.loads(json.dumps(L.declaration()))
    assert D.declaration_json().endswith("}\n")


def test_fold_rows_groups_rows_every_member_has_alike():
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
    diagram = D.extract()
    text = D.render_markdown(diagram)
    section = text.split("## Effects", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (.*) \|$", section, re.M)
    assert rows == [(e, doc.replace("|", "\\|")) for e, doc in L.declaration()["effects"].items()]
    assert "## Effects" not in D.render_markdown(D.extract(mini_declaration()))
