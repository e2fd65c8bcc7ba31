"""The machine's diff: rows matched by source, trigger, dest and effect; picture and table."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fsm.review import diagrams as D
from fsm.review import diagrams_diff as DD
from fsm.core import lifecycle as L
from fsm.__main__ import main

from diagram_support import grouped_declaration, review_dot_edges

ROOT = Path(__file__).resolve().parents[2]


def without(decl: dict, row_id: str) -> dict:
    decl = copy.deepcopy(decl)
    decl["rows"] = [r for r in decl["rows"] if r["id"] != row_id]
    decl["transitions"] = [t for t in decl["transitions"] if t["row"] != row_id]
    return decl


def with_guards(decl: dict, row_id: str, guards: list[str]) -> dict:
    decl = copy.deepcopy(decl)
    for r in decl["rows"]:
        if r["id"] == row_id:
            r["guards"] = guards
    for t in decl["transitions"]:
        if t["row"] == row_id:
            t["guards"] = guards
    return decl


def one_removed_one_changed() -> tuple[dict, dict]:
    old = grouped_declaration()
    new = with_guards(without(old, "busy--stop->calm"), "rest--stop->calm", ["ready"])
    return old, new


def test_one_row_removed_and_one_guard_changed_are_exactly_two_changes():
    """A removed row and a changed guard are two changes: picture, table, Mermaid."""
    old, new = one_removed_one_changed()
    result = DD.compare(old, new)
    assert [(c.change, c.row.id, c.what) for c in result.rows] == [
        ("changed", "rest--stop->calm", ("guards",)),
        ("removed", "busy--stop->calm", ()),
    ]
    assert result.summary() == "1 row removed, 1 row changed (guards)"
    assert len(result.unchanged) == len(new["rows"]) - 1
    # the picture: one dashed edge for the removed row, one edge marked changed, nothing else
    diagram = D.extract(new)
    edges = review_dot_edges(DD.build_digraph(result, diagram).source)
    styled = {(t, h): attrs for t, h, attrs, _ in edges if "color" in attrs}
    assert set(styled) == {("busy", "calm"), ("calm", "calm")}  # rest's rows start at calm
    assert styled[("busy", "calm")]["style"] == "dashed"
    assert styled[("busy", "calm")]["id"] == "busy->calm(removed)"
    assert styled[("calm", "calm")]["style"] == "solid"
    assert styled[("calm", "calm")]["id"] == "rest->calm"
    assert styled[("calm", "calm")]["color"] != styled[("busy", "calm")]["color"]
    labels = {(t, h): text.splitlines() for t, h, _, text in edges}
    assert labels[("calm", "calm")] == ["go", "[¬ready]", "/ does nothing",
                                        "~", "stop", "[ready]", "had no guards", "/ does nothing"]
    assert labels[("busy", "calm")] == ["−", "stop", "/ emits finished"]
    # the table: exactly two change rows
    md = DD.render_markdown(result, diagram)
    table = [l for l in md.splitlines() if l.startswith("| ") and "`" in l]
    assert table == [
        "| ✏️ changed (guards) | `rest` | `stop` | ~~none~~ → ready | `calm` | does nothing |",
        "| ➖ removed | `busy` | `stop` |  | `calm` | emits finished |",
    ]
    assert "```mermaid\n" in md
    assert ("    calm --> calm : go [¬ready]<br>/ does nothing<br>~ stop [ready] (had no guards)"
            "<br>/ does nothing\n") in md
    assert "    busy --> calm : − stop<br>/ emits finished\n" in md
    assert "Also changed" not in md


def test_same_declaration_has_no_change():
    """A declaration compared with itself has no change."""
    result = DD.compare(L.declaration(), L.declaration())
    assert result.rows == [] and result.empty
    assert result.summary() == "no change to the rows"


def test_regrouping_rows_is_no_change():
    """An old declaration without rows (one per state) folds into the new one's groups."""
    new = grouped_declaration()
    old = {k: v for k, v in copy.deepcopy(new).items() if k not in ("rows", "groups")}
    for t in old["transitions"]:
        del t["row"]
    result = DD.compare(old, new)
    assert result.rows == [] and len(result.unchanged) == len(new["rows"])


def test_added_rows_and_a_changed_effect():
    """Added rows get edges of their own; a changed effect is a change, not two rows."""
    old = grouped_declaration()
    new = copy.deepcopy(old)
    for r in new["rows"] + new["transitions"]:
        if r.get("row", r["id"]) == "busy--finish->done":
            r["effect"] = "again"
    new["rows"].append({"id": "busy--go->busy", "source": "busy", "trigger": "go",
                        "dest": "busy", "guards": [], "effect": "nothing", "spec": ""})
    new["transitions"].append({"id": "busy--go->busy", "source": "busy", "trigger": "go",
                               "dest": "busy", "guards": [], "effect": "nothing",
                               "spec": "", "row": "busy--go->busy"})
    new["guards"]["late"] = "it is late"
    new["effects"]["nothing"] = "does nothing at all"
    result = DD.compare(old, new, old_name="v1", new_name="v2")
    assert [(c.change, c.row.id, c.what) for c in result.rows] == [
        ("changed", "busy--finish->done", ("effect",)),
        ("added", "busy--go->busy", ()),
    ]
    md = DD.render_markdown(result, D.extract(new))
    assert md.startswith("### Lifecycle changes: `v1` → `v2`\n")
    assert "| ✏️ changed (effect) | `busy` | `finish` |  | `done` | ~~emits finished~~ → emits retry∶" not in md
    assert "~~emits finished~~ → emits retry; starts again" in md
    assert "| ➕ added | `busy` | `go` |  | `busy` | does nothing at all |" in md
    assert "- guards added: `late`" in md
    assert "- effect `nothing` now reads “does nothing at all” (was “does nothing”)" in md


def test_gone_states_get_a_dashed_node():
    """A removed row whose state is gone gets a dashed node."""
    old = grouped_declaration()
    new = copy.deepcopy(old)
    new["states"].append("spare")
    old["states"].append("gone")
    old["rows"].append({"id": "busy--stop->gone", "source": "busy", "trigger": "finish",
                        "dest": "gone", "guards": [], "effect": "report", "spec": ""})
    result = DD.compare(old, new)
    source = DD.build_digraph(result, D.extract(new)).source
    assert re.search(r'\tgone \[label="gone \(gone\)".*style="rounded,dashed"', source)
    assert result.states == (["spare"], ["gone"])


# ----------------------------------------------------------------------------- command

def test_diff_command_writes_picture_and_table(tmp_path, capsys):
    """diagrams --diff writes the picture, its DOT and the Markdown table."""
    old = copy.deepcopy(L.declaration())
    victim = next(t for t in old["transitions"] if t["source"] == "continuing")
    extra = victim["id"] + "-extra"
    old["transitions"].append({**victim, "id": extra, "trigger": "late_fact", "row": extra})
    old["rows"].append({**next(r for r in old["rows"] if r["id"] == victim["row"]),
                        "id": extra, "trigger": "late_fact"})
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old), encoding="utf-8")
    out = tmp_path / "diff"
    assert main(["diagrams", "--diff", str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"changes from {path} to the working tree: 1 row removed" in printed
    assert sorted(p.name for p in out.iterdir()) == [
        "retry_lifecycle_diff.dot", "retry_lifecycle_diff.md", "retry_lifecycle_diff.svg"]
    md = (out / "retry_lifecycle_diff.md").read_text(encoding="utf-8")
    assert "| ➖ removed |" in md and "`late_fact`" in md
    svg = (out / "retry_lifecycle_diff.svg").read_text(encoding="utf-8")
    assert "removed)" in svg and "stroke-dasharray" in svg


@pytest.mark.parametrize("content, message", [
    ("{", "not JSON"),
    ("[]", "expected a JSON object"),
    ('{"states": []}', "not a lifecycle declaration (missing initial"),
])
def test_diff_of_a_bad_file_is_a_clear_error(tmp_path, capsys, content, message):
    """A --diff file that is not a declaration is a clear error."""
    path = tmp_path / "old.json"
    path.write_text(content, encoding="utf-8")
    assert main(["diagrams", "--diff", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and message in err
    assert main(["diagrams", "--diff", str(tmp_path / "missing.json")]) == 2
    assert "cannot read the declaration" in capsys.readouterr().err


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
                               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
                               "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(cwd)},
                          timeout=60).stdout


@pytest.fixture
def repo(tmp_path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    return root


def test_diff_ref_reads_the_json_at_that_revision(repo):
    """--diff-ref reads diagrams/retry_lifecycle.json at that revision."""
    old, new = one_removed_one_changed()
    (repo / "diagrams").mkdir()
    (repo / "diagrams" / "retry_lifecycle.json").write_text(json.dumps(old), encoding="utf-8")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "old")
    (repo / "diagrams" / "retry_lifecycle.json").write_text(json.dumps(new), encoding="utf-8")
    assert DD.load_ref("main", repo) == old
    assert DD.load_ref("HEAD", repo / "diagrams") == old
    with pytest.raises(DD.DiffError, match="no such revision"):
        DD.load_ref("nope", repo)
    with pytest.raises(DD.DiffError, match="not a git revision"):
        DD.load_ref("--output=x", repo)


def test_diff_ref_before_the_json_asks_that_revision_s_code(repo):
    """A revision without the JSON is asked for its declaration by its own code."""
    (repo / "fsm").mkdir()
    (repo / "fsm" / "__init__.py").write_text("")
    decl = grouped_declaration()
    (repo / "fsm" / "lifecycle.py").write_text(f"def declaration():\n    return {decl!r}\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "code only")
    assert DD.load_ref("main", repo) == decl


def test_diff_ref_outside_a_repository(tmp_path):
    """--diff-ref outside a git repository is a clear error."""
    with pytest.raises(DD.DiffError, match="not inside a git repository"):
        DD.load_ref("main", tmp_path)


@pytest.mark.subprocess
def test_diff_ref_of_this_repository_head(tmp_path):
    """The command on this repository: HEAD against the working tree."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run([sys.executable, "-m", "fsm", "diagrams", "--diff-ref", "HEAD",
                           "--no-svg", "--out", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "changes from HEAD to the working tree" in done.stdout
    assert (tmp_path / "retry_lifecycle_diff.md").is_file()


def test_diff_ref_with_a_broken_json_or_no_declaration(repo):
    """A broken JSON or a revision with no declaration is a clear error."""
    (repo / "diagrams").mkdir()
    (repo / "diagrams" / "retry_lifecycle.json").write_text("{not json", encoding="utf-8")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "broken")
    with pytest.raises(DD.DiffError, match=r"main:diagrams/retry_lifecycle.json: not JSON"):
        DD.load_ref("main", repo)
    git(repo, "rm", "-q", "diagrams/retry_lifecycle.json")
    (repo / "README").write_text("nothing here\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "no declaration")
    with pytest.raises(DD.DiffError, match="neither diagrams/retry_lifecycle.json nor an fsm package"):
        DD.load_ref("main", repo)
    (repo / "fsm").mkdir()
    (repo / "fsm" / "__init__.py").write_text("")
    (repo / "fsm" / "lifecycle.py").write_text("raise ImportError('broken on purpose')\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "broken code")
    with pytest.raises(DD.DiffError, match="did not give a declaration.*broken on purpose"):
        DD.load_ref("main", repo)


def test_diff_command_errors(tmp_path, monkeypatch, capsys):
    """The diff command's bad inputs exit 2 with a message."""
    path = tmp_path / "old.json"
    path.write_text(D.declaration_json(), encoding="utf-8")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert main(["diagrams", "--diff", str(path), "--no-svg", "--out", str(blocker / "x")]) == 2
    assert "cannot write the diff" in capsys.readouterr().err
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(["diagrams", "--diff", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "Graphviz's 'dot' program was not found" in err and "--no-svg" in err
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [
        "retry_lifecycle_diff.dot", "retry_lifecycle_diff.md"]
    assert main(["diagrams", "--diff-ref", "HEAD", "--out", str(tmp_path / "g")]) == 2
    assert "--diff-ref needs git on PATH" in capsys.readouterr().err
