"""The fault server's Gemini routes on the wire (fsm.testing.fault_gemini; SPEC §15.13 "New
SDKs' protocols"): ``:generateContent`` answers one ``GenerateContentResponse``,
``:streamGenerateContent?alt=sse`` one SSE event per text item, with the same script entries as
the other APIs."""

from __future__ import annotations

import json

import httpx2
import pytest

from fsm.testing.fault_server import FaultServer

BODY = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}


def post(srv, path, **kwargs):
    return httpx2.post(srv.root_url + path, json=BODY, timeout=10, **kwargs)


def events(response):
    return [json.loads(line[len("data: "):]) for line in response.text.splitlines() if line.startswith("data: ")]


def test_generate_content_answers_one_response_and_counts_as_a_chat_request():
    """A plain success: candidates[0] holds the text, finishReason STOP, usageMetadata; the
    model is the path's; the request is a scripted chat request."""
    with FaultServer([{"stream": ["Hel", "lo"]}]) as srv:
        reply = post(srv, "/v1beta/models/gemini-x:generateContent")
        assert reply.status_code == 200
        body = reply.json()
        candidate = body["candidates"][0]
        assert candidate["content"] == {"role": "model", "parts": [{"text": "Hello"}]}
        assert candidate["finishReason"] == "STOP" and body["modelVersion"] == "gemini-x"
        assert body["usageMetadata"]["promptTokenCount"] == 10
        assert [(r["index"], r["scripted"], r["outcome"]) for r in srv.chat_requests] == [(0, True, "completion")]


def test_stream_generate_content_sends_one_event_per_text_item():
    """SSE: one GenerateContentResponse per text item; only the last carries finishReason and
    usageMetadata; no [DONE] (Gemini sends none)."""
    with FaultServer([{"stream": ["Hel", "lo"], "finish_reason": "MAX_TOKENS"}]) as srv:
        reply = post(srv, "/v1beta/models/m:streamGenerateContent?alt=sse")
        assert reply.headers["content-type"] == "text/event-stream"
        sent = events(reply)
        assert [e["candidates"][0]["content"]["parts"][0]["text"] for e in sent] == ["Hel", "lo"]
        assert "finishReason" not in sent[0]["candidates"][0] and "usageMetadata" not in sent[0]
        assert sent[1]["candidates"][0]["finishReason"] == "MAX_TOKENS" and "usageMetadata" in sent[1]
        assert "[DONE]" not in reply.text
        assert srv.chat_requests[0]["outcome"] == "stream"


def test_an_error_body_is_sent_with_its_status_and_headers():
    """A json entry is the error body as given (RESOURCE_EXHAUSTED with RetryInfo)."""
    error = {"error": {"code": 429, "message": "Resource has been exhausted (e.g. check quota).",
                       "status": "RESOURCE_EXHAUSTED",
                       "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "20s"}]}}
    with FaultServer([{"status": 429, "json": error, "headers": {"x-test": "1"}}]) as srv:
        reply = post(srv, "/v1beta/models/m:generateContent")
        assert (reply.status_code, reply.json(), reply.headers["x-test"]) == (429, error, "1")


def test_an_error_event_is_sent_inside_the_stream_or_as_the_error_status():
    """An {"error": {...}} item: inside a 200 stream (which ends after it), and for
    :generateContent the same body with the status its code names."""
    error = {"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}
    with FaultServer([{"stream": ["a", error]}, {"stream": ["a", error]}]) as srv:
        streamed = post(srv, "/v1beta/models/m:streamGenerateContent?alt=sse")
        assert streamed.status_code == 200 and events(streamed)[-1] == error
        plain = post(srv, "/v1beta/models/m:generateContent")
        assert (plain.status_code, plain.json()) == (503, error)
        assert [r["outcome"] for r in srv.chat_requests] == ["stream_error", "json"]


def test_a_drop_before_any_event_cuts_the_stream():
    """drop with an empty stream: the 200 headers, then the connection reset before any event."""
    with FaultServer([{"stream": [], "drop": True}]) as srv:
        with pytest.raises(httpx2.TransportError):
            post(srv, "/v1beta/models/m:streamGenerateContent?alt=sse")
        assert srv.chat_requests[0]["outcome"] == "dropped_rst"


def test_other_gemini_paths_are_not_chat_requests():
    """countTokens and a path without /models/ are 404s, not script entries."""
    with FaultServer([]) as srv:
        assert post(srv, "/v1beta/models/m:countTokens").status_code == 404
        assert post(srv, "/v1beta/m:generateContent").status_code == 404
        assert srv.chat_requests == []
