"""The one scrubbing layer (fsm.core.redact): no credential, of any shape, in any output —
events, logs at every level, RPC lines, the session log, RetryChainError, the coordinator's
events. Regressions of the attack on secrets (docs/reliability.md, item 6) and property tests
over keys of every shape."""

from __future__ import annotations

import asyncio
import json
import logging
import string

import anthropic
import httpx2
import openai
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from fsm.core import redact
from fsm.core.redact import (REDACTED, SECRETS, ScrubbingFilter, redact_url, register_secret,
                             request_secrets, scrub_secrets, scrub_value, url_secrets)
from fsm.core.text import safe_message
from fsm.host.runner import RetryChainError, RetryRunner
from fsm.rpc.protocol import encode_line

# Keys that do not start with sk-: a Google key, a Groq key, a hex token, a JWT-like token.
KEYS = ["AIzaSyD-SECRETkey1234567890", "gsk_SECRET0123456789abcdef",
        "0f3a9c1e5b7d2f4a6c8e0b1d3f5a7c9e", "eyJhbGciOi.J9SECRETpayload.sig-nature_42"]


@pytest.fixture(autouse=True)
def fresh_registry():
    """Each test starts and ends with an empty process registry."""
    SECRETS.clear()
    yield
    SECRETS.clear()


def _fast_retries(**more):
    return {"maxRetries": 2, "baseDelayMs": 1, **more}


async def _no_sleep(_seconds):
    return None


# -- regressions -----------------------------------------------------------------------------

@pytest.mark.subprocess
async def test_debug_log_hides_a_key_echoed_in_a_response_header(tmp_path):
    """At --log-level DEBUG httpcore dumps the response headers: a provider echoing the key in
    one printed it to stderr."""
    from fsm.rpc import RpcClient
    from fsm.testing.fault_server import FaultServer
    from support import env
    key = KEYS[0]
    child_env = env()
    child_env["OPENAI_API_KEY"] = key
    script = [{"status": 429, "headers": {"x-echo-key": key}, "json": {"error": {"message": "slow"}}}]
    settings = tmp_path / "settings.json"  # the 429's retry after 20 ms, not the default 2 s
    settings.write_text(json.dumps({"retry": {"baseDelayMs": 20}}))
    with FaultServer(script) as fs:
        client = RpcClient(["--base-url", fs.base_url, "--model", "m", "--log-level", "DEBUG",
                            "--settings", str(settings), "--no-session"], env=child_env,
                           cwd=tmp_path, record=True, timeout_s=120)
        await client.start()
        try:
            await client.prompt("hi")
            await client.wait_for_idle(timeout_s=120)
        finally:
            await client.close()
    assert "receive_response_headers" in client.stderr_tail  # the dump was logged
    assert REDACTED in client.stderr_tail
    assert key not in client.stderr_tail and key not in json.dumps(client.received)


@pytest.mark.subprocess
@pytest.mark.parametrize("shape", ["query", "userinfo"])
async def test_info_log_hides_a_key_in_the_base_url(tmp_path, shape):
    """httpx logs each request's URL at INFO: a key inside --base-url was printed whole."""
    from fsm.rpc import RpcClient
    from fsm.testing.fault_server import FaultServer
    from support import env
    key = KEYS[1]
    with FaultServer([]) as fs:
        base = (fs.base_url + "?api_key=" + key if shape == "query"
                else fs.base_url.replace("http://", f"http://user:{key}@"))
        client = RpcClient(["--base-url", base, "--model", "m", "--log-level", "INFO",
                            "--api-key", "local-placeholder-key", "--no-session"],
                           env=env(), cwd=tmp_path, record=True, timeout_s=120)
        await client.start()
        try:
            await client.prompt("hi")
            await client.wait_for_idle(timeout_s=120)
            state = await client.get_state()
        finally:
            await client.close()
    assert "HTTP Request: POST" in client.stderr_tail
    assert key not in client.stderr_tail
    assert key not in json.dumps(client.received) and key not in json.dumps(state)


def _sdk_error(key: str, message: str) -> BaseException:
    """A real openai RateLimitError whose request carried ``key`` and whose body quotes it."""
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(429, json={"error": {"message": message, "type": "tokens", "code": key}},
                               headers={"x-echo": key})
    client = openai.OpenAI(api_key=key, max_retries=0, base_url="http://provider.test/v1",
                           http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))
    try:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    except openai.OpenAIError as exc:
        return exc
    raise AssertionError("the mock answered 429")


@pytest.mark.parametrize("key", KEYS)
async def test_runner_hides_a_quoted_key_of_any_shape_in_events_and_the_chain_error(key):
    """A key that is not sk-shaped, quoted by the provider, reached the runner's events and
    RetryChainError; a long quoted text was copied whole."""
    errors = [_sdk_error(key, f"Rate limit reached for the key {key}. " + "x" * 200_000) for _ in range(3)]
    seen: list = []
    seen_calls: list = []

    async def counted():
        seen_calls.append(1)
        raise errors[len(seen_calls) - 1]

    runner = RetryRunner(_fast_retries(), on_event=seen.append, sleep=_no_sleep)
    with pytest.raises(RetryChainError) as info:
        await runner.run(counted)
    shown = json.dumps([e.to_json() for e in seen]) + str(info.value) + repr(info.value.message)
    assert [e.type for e in seen] == ["auto_retry_start"] * 2 + ["auto_retry_end"]
    assert key not in shown and key not in (info.value.final_error or "")
    assert REDACTED in info.value.final_error
    for event in seen:
        assert len(json.dumps(event.to_json()).encode()) <= 9000  # clipped to 8 KB
    assert info.value.__cause__ is errors[-1]  # the caller's own exception is untouched


async def test_runner_hides_a_listed_secret_from_a_plain_exception():
    """``secrets=`` covers a callable that is no SDK client (its exception carries no request)."""
    key = KEYS[2]
    seen: list = []

    async def failing():
        raise ConnectionError(f"upstream refused token {key}")

    with pytest.raises(RetryChainError) as info:
        await RetryRunner(_fast_retries(), on_event=seen.append, sleep=_no_sleep,
                          secrets=[key]).run(failing)
    assert key not in json.dumps([e.to_json() for e in seen]) + str(info.value)


async def test_redis_password_in_the_query_is_hidden_from_the_event_and_the_log(caplog):
    """``redis://host/0?password=…``: the password reached coordinator_unavailable and the log."""
    from fsm.fleet import GuardedCoordinator, RedisCoordinator
    password = "Hunter2-query-password"
    events: list = []
    url = f"redis://127.0.0.1:1/0?password={password}"
    g = GuardedCoordinator(RedisCoordinator.from_url(url), on_event=events.append)
    with caplog.at_level(logging.DEBUG):
        assert await g.warm_up() is False
    await g.aclose()
    assert [e["type"] for e in events] == ["coordinator_unavailable"]
    assert "127.0.0.1" in events[0]["reason"]
    assert password not in json.dumps(events) and password not in caplog.text
    assert password not in repr(g.inner)


def test_the_command_line_registers_every_configured_secret():
    """--api-key, the key variables, --base-url's and --redis's credentials are all registered."""
    import argparse

    from fsm.commands.common import register_configured_secrets
    args = argparse.Namespace(api_key=KEYS[0], base_url=f"https://gw.example/v1?key={KEYS[1]}",
                              redis="redis://:Hunter2-userinfo@host:6379/0?password=Hunter3-query")
    register_configured_secrets(args, environ={"ANTHROPIC_API_KEY": KEYS[3]})
    text = f"{KEYS[0]} {KEYS[1]} {KEYS[3]} Hunter2-userinfo Hunter3-query"
    assert scrub_secrets(text) == " ".join([REDACTED] * 5)


def test_the_logging_filter_scrubs_arguments_exceptions_and_clips():
    """ScrubbingFilter: the formatted message (arguments too), the traceback, at most 64 KiB."""
    key = KEYS[3]
    register_secret(key)
    handler = logging.Handler()
    handler.addFilter(ScrubbingFilter())
    lines: list[str] = []
    handler.emit = lambda record: lines.append(handler.format(record))  # type: ignore[method-assign]
    logger = logging.getLogger("test.redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("headers %s", [(b"x-key", key.encode())])
        try:
            raise ValueError(f"bad {key}")
        except ValueError:
            logger.exception("failed with %r", key)
        logger.warning("%s", "y" * 1_000_000)
    finally:
        logger.removeHandler(handler)
    assert len(lines) == 3 and all(key not in line for line in lines)
    assert "ValueError: bad [redacted]" in lines[1]
    assert len(lines[2].encode()) <= 65536


def test_redact_url_hides_passwords_and_credential_parameters():
    """redact_url: user:password@, a lone KEY@ and ?password= / ?key= / ?sig= become ***."""
    assert redact_url("redis://user:pw@host:1/0") == "redis://user:***@host:1/0"
    assert redact_url("redis://:pw@host:1/0?password=x&db=2") == "redis://:***@host:1/0?password=***&db=2"
    assert redact_url("https://KEY@gw.example/v1") == "https://***@gw.example/v1"
    assert redact_url("https://gw/v1?api-key=a&model=m&X-Amz-Signature=s") == (
        "https://gw/v1?api-key=***&model=m&X-Amz-Signature=***")
    assert redact_url("http://127.0.0.1:8080/v1") == "http://127.0.0.1:8080/v1"
    assert url_secrets("redis://u:p%40ss@h/0?token=t%2B1") == ("p%40ss", "p@ss", "t%2B1", "t+1")


# -- property tests: keys of every shape in every output --------------------------------------

# Printable ASCII without space and without the brackets of the marker itself.
_KEY_ALPHABET = "".join(c for c in string.printable if c not in " \t\n\r\x0b\x0c[]")
keys = st.text(_KEY_ALPHABET, min_size=8, max_size=80).filter(lambda k: "redacted" not in k)
filler = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="[]"), max_size=40)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(key=keys, before=filler, after=filler)
def test_a_listed_key_of_any_shape_never_survives_a_scrub(key, before, after):
    """scrub_secrets(text, [key]) leaves no occurrence of the key, raw or JSON-escaped."""
    text = f"{before}{key}{after} and again {json.dumps(key)}"
    out = scrub_secrets(text, [key])
    assert key not in out and json.dumps(key)[1:-1] not in out


@FAST
@given(key=keys, before=filler)
def test_a_registered_key_of_any_shape_never_reaches_an_rpc_line(key, before):
    """encode_line: no registered key in any string of a line, and the line stays JSON."""
    register_secret(key)
    try:
        obj = {"type": "message_end", "errorMessage": f"{before}{key}", "n": 12345678901234,
               "nested": [{"text": key}], key: "as a key name"}
        line = encode_line(obj)
        decoded = json.loads(line)
        assert key not in line.decode() and json.dumps(key)[1:-1] not in line.decode()
        assert decoded["n"] == 12345678901234
    finally:
        SECRETS.clear()


@FAST
@given(key=keys, before=filler)
def test_a_registered_key_of_any_shape_never_reaches_a_log_line(key, before):
    """ScrubbingFilter: neither in the message nor in its arguments."""
    register_secret(key)
    try:
        record = logging.LogRecord("httpcore", logging.DEBUG, __file__, 1, "%s %r", (before + key, key), None)
        ScrubbingFilter().filter(record)
        assert key not in record.getMessage()
    finally:
        SECRETS.clear()


@FAST
@given(key=keys, before=filler)
def test_a_key_of_any_shape_in_a_message_never_reaches_an_event(key, before):
    """safe_message over every field events and RetryChainError read."""
    from fsm.core.messages import AssistantMessage
    message = AssistantMessage("error", error_message=before + key, error_type=key, error_code=key,
                               headers={"x-echo": key})
    kept = safe_message(message, [key])
    assert key not in repr(kept) or len(key.strip()) < 8


@FAST
@given(key=keys, user=st.text(string.ascii_letters, max_size=8))
def test_a_password_of_any_shape_in_a_url_is_found_and_redacted(key, user):
    """url_secrets finds a query or userinfo password; scrubbing with them leaves no trace."""
    from urllib.parse import quote
    assume(key not in user and key not in "redis://host:6379/0?password=" and "***" not in key)
    quoted = quote(key, safe="")
    for url in (f"redis://{user}:{quoted}@host:6379/0", f"redis://host:6379/0?password={quoted}"):
        assert key not in scrub_secrets(f"cannot reach {url}: {key}", url_secrets(url))
        assert quoted not in redact_url(url) or quoted == "***"


def test_scrub_value_keeps_objects_that_hold_no_secret():
    """scrub_value returns the very object when nothing changes (no copy on the common path)."""
    obj = {"a": [1, "two", {"b": None}], "c": ("x",)}
    assert scrub_value(obj) is obj
    register_secret(KEYS[0])
    assert scrub_value({"a": [KEYS[0]]}) == {"a": [REDACTED]}


def test_request_secrets_reads_the_headers_and_url_of_sdk_errors():
    """The Authorization token, x-api-key and URL credentials of an SDK error's request."""
    exc = _sdk_error(KEYS[0], "no")
    assert KEYS[0] in request_secrets(exc)

    def handler(request):
        return httpx2.Response(401, json={"type": "error", "error": {"type": "authentication_error",
                                                                     "message": "bad key"}})
    client = anthropic.Anthropic(api_key=KEYS[1], max_retries=0,
                                 http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))
    with pytest.raises(anthropic.AnthropicError) as info:
        client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert KEYS[1] in request_secrets(info.value)
    assert request_secrets(ValueError("x")) == ()
    assert request_secrets(httpx2.ConnectError("refused")) == ()  # .request raises RuntimeError


def test_the_registry_forgets_the_oldest_past_its_bound():
    """SecretSet keeps at most max_values spellings, so a long-lived process stays bounded."""
    small = redact.SecretSet(max_values=4)
    small.add("first-secret-1", "second-secret-2", "third-secret-3", "fourth-secret-4", "fifth-secret-5")
    assert len(small) == 4 and "first-secret-1" not in small and "fifth-secret-5" in small


def test_scrub_exception_scrubs_text_notes_and_causes_in_place():
    """scrub_exception: args, notes, OSError fields and the cause chain lose the secret; type kept."""
    import traceback

    from fsm.core.redact import scrub_exception
    secret = "Hq7pW2xK9mV4cause"
    root = OSError(111, f"refused by proxy {secret}", f"/tmp/{secret}")
    try:
        try:
            raise root
        except OSError as inner:
            raise RuntimeError(f"cannot reach http://u:{secret}@h/", 42) from inner
    except RuntimeError as exc:
        exc.add_note(f"url was ?key={secret}")
        exc.message = f"see {secret}"
        group = ExceptionGroup("many", [exc])
        assert scrub_exception(group, [secret]) is group
        text = "".join(traceback.format_exception(group))
        assert secret not in text and REDACTED in text
        assert type(exc) is RuntimeError and exc.__cause__ is root and exc.args[1] == 42
        assert exc.message == f"see {REDACTED}" and root.errno == 111


def test_scrub_exception_scrubs_the_body_of_the_response_it_carries():
    """An SDK error's ``response`` (an httpx-shaped response, body read) keeps its identity and
    loses the secret from its content and cached text; an unread body or a non-response is kept."""
    from types import SimpleNamespace

    from fsm.core.redact import scrub_exception
    secret = "Hq7pW2xK9mV4body"
    body = f'{{"message": "key {secret}"}}'
    response = SimpleNamespace(status_code=529, encoding="utf-8", _text=body, _content=body.encode())
    unread = SimpleNamespace(status_code=529)
    error = RuntimeError("overloaded")
    error.response = response
    error.__cause__ = cause = RuntimeError("inner")
    cause.response = unread
    scrub_exception(error, [secret])
    assert error.response is response and cause.response is unread
    assert response._content == body.replace(secret, REDACTED).encode()
    assert response._text == body.replace(secret, REDACTED) and vars(unread) == {"status_code": 529}
