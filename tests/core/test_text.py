"""fsm.core.text: cleaning, clipping and scrubbing what providers, users and keys send us."""

import json

import pytest

from fsm.core.text import (CLIP_LIMIT_BYTES, REDACTED, ApiKeyError, check_api_key, clean_text, clip_text,
                      scrub_secrets)


def test_clean_text_joins_a_surrogate_pair_split_across_two_deltas():
    """The deltas "\\ud83d" then "\\ude00" (two JSON escapes) make one emoji."""
    first, second = json.loads('"\\ud83d"'), json.loads('"\\ude00"')
    assert clean_text("a" + first + second + "b") == "a\U0001F600b"


def test_clean_text_replaces_a_lone_surrogate():
    """A lone "\\ud800" in an error text becomes U+FFFD and encodes."""
    out = clean_text("err \ud800 x \udfff")
    assert out == "err \ufffd x \ufffd"
    out.encode("utf-8")


def test_clean_text_keeps_good_text_as_is():
    """Clean text keeps good text as is."""
    s = "héllo \U0001F600 \x00 end"
    assert clean_text(s) is s
    with pytest.raises(TypeError, match="bytes"):
        clean_text(b"x")


def test_clip_text_keeps_short_text_whole():
    """Clip text keeps short text whole."""
    assert clip_text("short") == "short"
    assert clip_text("\ud83d\ude00") == "\U0001F600"
    exact = "é" * (CLIP_LIMIT_BYTES // 2)  # exactly 8192 bytes
    assert clip_text(exact) == exact


@pytest.mark.parametrize("unit", ["a", "é", "\u20ac", "\U0001F600", "\ud83d\ude00"])
def test_clip_text_bounds_a_big_error_body_without_splitting_a_character(unit):
    """A 10 MB body is kept as a bounded excerpt (head, marker, tail)."""
    body = "HEAD " + unit * 2_000_000 + " TAIL"
    out = clip_text(body)
    data = out.encode("utf-8")  # never a half character
    assert len(data) <= CLIP_LIMIT_BYTES
    assert len(data) > CLIP_LIMIT_BYTES - 16
    assert out.startswith("HEAD ") and out.endswith(" TAIL")
    assert "characters clipped" in out
    left_out = int(out.split("[… ")[1].split(" characters")[0])
    assert left_out > 1_900_000


def test_clip_text_never_keeps_half_of_a_surrogate_pair_at_a_cut():
    """Clip text never keeps half of a surrogate pair at a cut."""
    pair = "\ud83d\ude00"
    for shift in range(3):
        out = clip_text("x" * shift + pair * 5000, 100)
        assert "\ufffd" not in out
        assert len(out.encode("utf-8")) <= 100


def test_clip_text_refuses_a_limit_with_no_room_for_the_marker():
    """Clip text refuses a limit with no room for the marker."""
    with pytest.raises(ValueError, match="limit_bytes.*63"):
        clip_text("x", 63)
    with pytest.raises(TypeError):
        clip_text(None)


KEY = "sk-proj-Abc123def456GHI789jkl012"


def test_scrub_secrets_replaces_every_listed_secret_and_its_stripped_form():
    """A key with a trailing CR shows up in httpx's error as the key + '\\r'."""
    secret = "k3y-" + "Q" * 30 + "\r"
    text = f"Illegal header value b'Bearer {secret.strip()}\\r' and again {secret.strip()}"
    out = scrub_secrets(text, [secret, None, "x"])
    assert secret.strip() not in out
    assert out.count(REDACTED) == 2
    assert "Illegal header value b'Bearer " in out


def test_scrub_secrets_finds_key_shaped_tokens_without_a_list():
    """Scrub secrets finds key shaped tokens without a list."""
    text = f"Incorrect API key provided: {KEY}. Authorization: Bearer abcDEF123456ghiJKL"
    out = scrub_secrets(text)
    assert KEY not in out and "abcDEF123456ghiJKL" not in out
    assert out == f"Incorrect API key provided: {REDACTED}. Authorization: Bearer {REDACTED}"


@pytest.mark.parametrize("text", [
    "use sk-learn-compatible-interfaces here",
    "the bearer of bad news; Bearer tokens; bearer authentication-scheme",
    "a risk-1234567890123456789 factor",
    "oracle-***-key",
])
def test_scrub_secrets_leaves_normal_text_alone(text):
    """Scrub secrets leaves normal text alone."""
    assert scrub_secrets(text, ["x", "short"]) == text


def test_scrub_secrets_replaces_a_longer_secret_before_one_it_contains():
    """Scrub secrets replaces a longer secret before one it contains."""
    out = scrub_secrets("AAAA-BBBB-CCCC", ["AAAA-BBBB", "AAAA-BBBB-CCCC"])
    assert out == REDACTED
    with pytest.raises(TypeError):
        scrub_secrets(None)


@pytest.mark.parametrize("key, problem", [
    (KEY + "\r", "ends with a carriage return (CR); remove it (was the key read from a file"),
    (KEY + " ", "ends with a space"),
    ("\n" + KEY, "starts with a line feed (LF)"),
    (KEY[:10] + "\n" + KEY[10:], "contains a line feed (LF) at character 11 of"),
    (KEY[:5] + " " + KEY[5:], "contains a space at character 6"),
    (KEY[:5] + "\x07" + KEY[5:], "contains the control character U+0007 at character 6"),
    (KEY[:5] + "é" + KEY[5:], "contains a non-ASCII character (U+00E9) at character 6"),
    ("", "is empty"),
])
def test_check_api_key_names_source_and_problem_never_the_key(key, problem):
    """A malformed key is refused at start-up; the error never echoes it."""
    with pytest.raises(ApiKeyError) as info:
        check_api_key(key, "OPENAI_API_KEY")
    message = str(info.value)
    assert message.startswith("OPENAI_API_KEY: the API key ")
    assert problem in message
    assert "Abc123" not in message and "sk-proj" not in message
    assert info.value.source == "OPENAI_API_KEY"


def test_check_api_key_accepts_a_good_key_and_none():
    """Check API key accepts a good key and none."""
    assert check_api_key(KEY, "--api-key") == KEY
    assert check_api_key(None, "--api-key") is None
    with pytest.raises(ApiKeyError, match="--api-key: the API key must be text, got int"):
        check_api_key(5, "--api-key")


def test_stream_joiner_keeps_an_emoji_split_across_two_deltas():
    """Each shown delta is clean, and no character is lost or broken."""
    from fsm.core.text import StreamJoiner
    joiner = StreamJoiner()
    high, low = json.loads('"\\ud83d"'), json.loads('"\\ude00"')
    shown = [joiner.feed("a" + high), joiner.feed(low + "b"), joiner.feed(high), joiner.flush()]
    assert shown == ["a", "\U0001F600b", "", "\ufffd"]
    assert joiner.feed("\udc00x") == "\ufffdx" and joiner.flush() == ""


def test_safe_error_text_scrubs_and_clips_at_a_cost_bounded_by_the_excerpt():
    """What an error text may look like when kept."""
    from fsm.core.text import safe_error_text
    secret = "my-own-secret-value-123"
    small = f"401 {secret} {KEY}"
    assert safe_error_text(small, [secret]) == f"401 {REDACTED} {REDACTED}"
    body = f"529 {secret} " + ("sk-abcdefghijklmnopq1 " * 400_000) + f" {secret} end"
    out = safe_error_text(body, [secret])
    assert len(out.encode()) <= CLIP_LIMIT_BYTES
    assert out.startswith(f"529 {REDACTED} {REDACTED} ") and out.endswith(f" {REDACTED} end")
    assert secret not in out and "sk-abcdef" not in out
    slow = clip_text(scrub_secrets(body, [secret]))  # what the bounded cost must not change
    assert out.split("\n[… ")[0] == slow.split("\n[… ")[0]
    assert out.split(" …]\n")[1] == slow.split(" …]\n")[1]
    with pytest.raises(ValueError, match="limit_bytes"):
        safe_error_text("x" * 10_000, limit_bytes=10)
    with pytest.raises(TypeError):
        safe_error_text(None)
