import json
import os
import stat

import pytest

from fsm.core.messages import AssistantMessage, Usage, UserMessage
from fsm.host.session_log import SessionLog, TornLineWarning, clean_entry


def test_appends_to_an_existing_log_without_a_second_header(tmp_path):
    """Appends to an existing log without a second header."""
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


def test_read_skips_and_reports_a_malformed_line(tmp_path):
    """Read skips and reports a malformed line."""
    path = tmp_path / "s.jsonl"
    path.write_text('{"type": "session"}\n\nnot json\n5\n{"type": "message"}\n')
    with pytest.warns(TornLineWarning, match=r"s.jsonl:[34]"):
        entries = list(SessionLog.read(path))
    assert entries == [{"type": "session"}, {"type": "message"}]
    assert SessionLog.scan(path).torn_lines == [3, 4]


def test_surrogates_from_the_provider_never_break_a_write(tmp_path):
    """A split surrogate pair in the text and a lone one in the error."""
    path = tmp_path / "s.jsonl"
    log = SessionLog(path, "a")
    split = json.loads('"\\ud83d"') + json.loads('"\\ude00"')
    log.append(AssistantMessage("error", text="hi " + split, error_message="bad \ud800 event", model="m"))
    log.close()
    raw = path.read_bytes().decode("utf-8")  # strict: the file is valid UTF-8
    assert "\U0001F600" in raw and "\ufffd" in raw
    entries = list(SessionLog.read(path))
    assert entries[1]["message"]["errorMessage"].startswith("bad \ufffd event")


def test_error_text_is_clipped_and_scrubbed_before_it_is_written(tmp_path):
    """A 10 MB JSON 529 body is kept as an 8 KB excerpt, keys removed."""
    path = tmp_path / "s.jsonl"
    secret = "my-own-secret-value-123"
    log = SessionLog(path, "a", secrets=[secret])
    body = "529 " + secret + " sk-proj-Abcdef0123456789xyz " + "x" * 10_000_000 + " end"
    log.append(AssistantMessage("error", error_message=body, model="m"))
    log.close()
    assert path.stat().st_size < 10_000
    text = path.read_text()
    assert secret not in text and "sk-proj-Abcdef" not in text
    message = list(SessionLog.read(path))[1]["message"]
    assert message["errorMessage"].startswith("529 [redacted] [redacted] xxx")
    assert message["errorMessage"].endswith(" end")
    assert len(message["errorMessage"].encode()) <= 8192


def test_a_torn_last_line_is_skipped_and_later_entries_are_kept(tmp_path):
    """A kill mid-write; the next session's entries start on a fresh line."""
    path = tmp_path / "s.jsonl"
    log = SessionLog(path, "a")
    log.append(UserMessage("first"))
    log.close()
    with open(path, "a") as fh:
        fh.write('{"type": "message", "message": {"role": "assistant", "content": [{"ty')
    log = SessionLog(path, "a")
    log.append(AssistantMessage("error", error_message="529", model="m"))
    log.append(UserMessage("after"))
    log.close()
    contents = SessionLog.scan(path)
    assert contents.torn_lines == [3]
    assert [e.get("message", {}).get("role") for e in contents.entries] == [None, "user", "assistant", "user"]
    assert contents.entries[-1]["message"]["content"] == [{"type": "text", "text": "after"}]


def test_an_entry_glued_onto_a_torn_line_by_an_older_writer_is_recovered(tmp_path):
    """Logs written before the fix may hold fragment + entry on one line."""
    path = tmp_path / "s.jsonl"
    entry = {"type": "message", "message": {"role": "user", "content": "kept"}}
    path.write_text('{"type": "session"}\n{"type": "mess' + json.dumps(entry) + "\n" + "{" * 1000 + "\n")
    contents = SessionLog.scan(path)
    assert contents.entries == [{"type": "session"}, entry]
    assert contents.torn_lines == [2, 3]


def test_a_new_log_is_private(tmp_path):
    """Conversation history is created 0600, like the credentials."""
    old = os.umask(0o022)
    try:
        log = SessionLog(tmp_path / "s.jsonl", "a")
        log.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "s.jsonl").stat().st_mode) == 0o600


def test_clean_entry_cleans_keys_and_nested_values():
    """Clean entry cleans keys and nested values."""
    out = clean_entry({"k\ud800": ["\ud83d\ude00", 1, None, {"finalError": "e" * 9000}]})
    assert out == {"k\ufffd": ["\U0001F600", 1, None, {"finalError": out["k\ufffd"][3]["finalError"]}]}
    assert len(out["k\ufffd"][3]["finalError"].encode()) <= 8192


def test_usage_from_json_validates():
    """Usage from JSON validates."""
    assert Usage.from_json(None) is None
    assert Usage.from_json({"input": 5}).input == 5
    with pytest.raises(ValueError, match="usage.cacheRead"):
        Usage.from_json({"cacheRead": -1})
    with pytest.raises(ValueError, match="object"):
        Usage.from_json([1])


def test_rpc_package_exports_lazily():
    """RPC package exports lazily."""
    import fsm.rpc
    assert fsm.rpc.RpcClient.__name__ == "RpcClient"
    assert "RpcError" in dir(fsm.rpc)
    with pytest.raises(AttributeError, match="nope"):
        fsm.rpc.nope


def test_top_level_names_are_importable_and_lazy():
    """``import fsm`` loads no layer; the top-level names import on first use (docs/architecture.md,
    README "Install": ``python -m fsm rpc`` answers before the SDKs load)."""
    import subprocess
    import sys
    code = ("import sys, fsm; assert 'fsm.core.brain' not in sys.modules; "
            "from fsm import RetryBrain, AgentSession, classify_message; "
            "assert 'RetryBrain' in dir(fsm); print(RetryBrain.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "fsm.core.brain"
    import fsm
    with pytest.raises(AttributeError, match="'fsm' has no attribute 'nope'"):
        fsm.nope


def test_a_new_trace_is_private(tmp_path):
    """Traces written by TraceWriter are created 0600 as well."""
    from fsm.review.audit import TraceWriter
    old = os.umask(0o022)
    try:
        with TraceWriter(tmp_path / "t.jsonl"):
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "t.jsonl").stat().st_mode) == 0o600


async def test_a_surrogate_pair_split_across_deltas_over_rpc_is_persisted_whole(tmp_path):
    """The turn ends, is persisted as valid UTF-8, keeps the emoji."""
    import sys
    sys.path.insert(0, str(os.path.dirname(os.path.dirname(__file__))))
    from support import env
    from fsm.testing.fault_server import FaultServer
    from fsm.rpc import RpcClient
    split = [{"stream": ["a\ud83d", "\ude00b"]}, {"status": 529, "json": {"error": {
        "type": "overloaded_error", "message": "lone \ud800 here"}}}, {"stream": ["ok"]}]
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"retry": {"maxRetries": 2, "baseDelayMs": 10}}))
    with FaultServer(split) as fs:
        async with RpcClient(["--base-url", fs.base_url, "--model", "m", "--settings", str(settings),
                              "--session-file", str(tmp_path / "s.jsonl")],
                             env=env(), cwd=tmp_path, record=True, timeout_s=120) as client:
            for text in ("one", "two"):
                await client.prompt(text)
                await client.wait_for_idle(timeout_s=120)
    raw = (tmp_path / "s.jsonl").read_bytes().decode("utf-8")  # strict: valid UTF-8
    assert "a\U0001F600b" in raw and "lone \ufffd here" in raw
    stops = [e["message"]["stopReason"] for e in client.received
             if e["type"] == "message_end" and e["message"]["role"] == "assistant"]
    assert stops == ["stop", "error", "stop"]
    assert [e["success"] for e in client.received if e["type"] == "auto_retry_end"] == [True]
    assert SessionLog.scan(tmp_path / "s.jsonl").torn_lines == []
