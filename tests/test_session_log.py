import pytest

from fsm.messages import AssistantMessage, Usage, UserMessage
from fsm.session_log import SessionLog


def test_appends_to_an_existing_log_without_a_second_header(tmp_path):
    path = tmp_path / "nested" / "s.jsonl"
    log = SessionLog(path, "a")
    log.append(UserMessage("hi"))
    log.close()
    log.close()  # closing twice is harmless
    log = SessionLog(path, "a")
    log.append(AssistantMessage("error", error_message="529", usage=Usage(1, 2, 3, 4), model="m"))
    log.close()
    entries = list(SessionLog.read(path))
    assert [e["type"] for e in entries] == ["session", "message", "message"]
    assert entries[2]["message"]["usage"] == {"input": 1, "output": 2, "cacheRead": 3, "cacheWrite": 4}


def test_read_names_a_malformed_line(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"type": "session"}\n\nnot json\n')
    with pytest.raises(ValueError, match=r"s.jsonl:3"):
        list(SessionLog.read(path))


def test_usage_from_json_validates():
    assert Usage.from_json(None) is None
    assert Usage.from_json({"input": 5}).input == 5
    with pytest.raises(ValueError, match="usage.cacheRead"):
        Usage.from_json({"cacheRead": -1})
    with pytest.raises(ValueError, match="object"):
        Usage.from_json([1])


def test_rpc_package_exports_lazily():
    import fsm.rpc
    assert fsm.rpc.RpcClient.__name__ == "RpcClient"
    assert "RpcError" in dir(fsm.rpc)
    with pytest.raises(AttributeError, match="nope"):
        fsm.rpc.nope


def test_top_level_names_are_importable_and_lazy():
    import subprocess
    import sys
    code = ("import sys, fsm; assert 'fsm.brain' not in sys.modules; "
            "from fsm import RetryBrain, AgentSession, classify; "
            "assert 'RetryBrain' in dir(fsm); print(RetryBrain.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "fsm.brain"
    import fsm
    with pytest.raises(AttributeError, match="'fsm' has no attribute 'nope'"):
        fsm.nope
