import json
import math
import warnings

import pytest
from hypothesis import given, strategies as st

from fsm.core.settings import RetrySettings, SettingsError
from fsm.host.settings_file import load_settings


def test_defaults_are_the_seeds():
    """Defaults are the seeds."""
    s = RetrySettings()
    assert (s.enabled, s.max_retries, s.base_delay_ms, s.max_delay_ms, s.jitter) == (True, 3, 2000, None, "none")
    assert [s.backoff_ms(n) for n in (1, 2, 3)] == [2000, 4000, 8000]


def test_cap_limits_one_backoff():
    """Cap limits one backoff."""
    s = RetrySettings(base_delay_ms=2000, max_delay_ms=5000)
    assert [s.backoff_ms(n) for n in (1, 2, 3, 4)] == [2000, 4000, 5000, 5000]


def test_huge_attempt_is_capped_not_overflowing():
    """Huge attempt is capped not overflowing."""
    s = RetrySettings(max_retries=100, base_delay_ms=86_400_000)
    assert s.backoff_ms(100) == 86_400_000


def test_attempt_is_one_based():
    """Attempt is one based."""
    with pytest.raises(ValueError, match="1-based"):
        RetrySettings().backoff_ms(0)


def test_full_jitter_spans_zero_to_delay():
    """Full jitter spans zero to delay."""
    s = RetrySettings(jitter="full")
    assert s.backoff_ms(2, random=lambda: 0.0) == 0
    assert s.backoff_ms(2, random=lambda: 0.5) == 2000
    assert s.backoff_ms(2, random=lambda: 0.999999) == 3999


def test_equal_jitter_keeps_half():
    """Equal jitter keeps half."""
    s = RetrySettings(jitter="equal")
    assert s.backoff_ms(1, random=lambda: 0.0) == 1000
    assert s.backoff_ms(1, random=lambda: 0.999999) == 1999


def test_zero_base_delay_has_no_jitter_call():
    """Zero base delay has no jitter call."""
    s = RetrySettings(base_delay_ms=0, jitter="full")
    assert s.backoff_ms(3, random=lambda: 1 / 0) == 0


@pytest.mark.parametrize("key,value", [
    ("enabled", "yes"), ("enabled", 1), ("maxRetries", -1), ("maxRetries", 101), ("maxRetries", "3"),
    ("maxRetries", True), ("maxRetries", 2.5), ("maxRetries", math.nan), ("baseDelayMs", -5),
    ("baseDelayMs", 10**12), ("baseDelayMs", math.inf), ("maxDelayMs", -1), ("jitter", "random"),
    ("jitter", None),
])
def test_bad_values_name_the_key_and_value(key, value):
    """Bad values name the key and value."""
    with pytest.raises(SettingsError) as info:
        RetrySettings.from_json({"retry": {key: value}})
    assert f"retry.{key}" in str(info.value)
    assert repr(value)[:20] in str(info.value)
    assert info.value.key == key


def test_integral_float_is_accepted_as_int():
    """Integral float is accepted as int."""
    assert RetrySettings.from_json({"retry": {"baseDelayMs": 50.0}}).base_delay_ms == 50


def test_original_shape_with_the_originals_keys_warns_once_and_ignores():
    """The original's retry.provider is accepted, ignored, listed once; other groups are not read."""
    data = {"retry": {"enabled": True, "maxRetries": 3, "baseDelayMs": 50, "provider": {"maxRetries": 0}},
            "theme": "dark"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = RetrySettings.from_json(data)
    assert s == RetrySettings(base_delay_ms=50)
    assert s.ignored_keys == ("retry.provider",)
    assert [str(w.message) for w in caught] == [
        "retry settings: ignoring the original's own keys retry.provider (this project is the only retry layer)"]


def test_nothing_half_applied_on_error():
    """Nothing half applied on error."""
    base = RetrySettings(max_retries=5)
    with pytest.raises(SettingsError):
        RetrySettings.from_json({"retry": {"maxRetries": 1, "baseDelayMs": -1}}, base=base)
    assert base.max_retries == 5


def test_missing_retry_section_gives_defaults():
    """Missing retry section gives defaults."""
    assert RetrySettings.from_json({}) == RetrySettings()
    assert RetrySettings.from_json({"retry": None}) == RetrySettings()


@pytest.mark.parametrize("data", [[1, 2], {"retry": [1]}, {"retry": "on"}])
def test_wrong_shapes_are_rejected(data):
    """Wrong shapes are rejected."""
    with pytest.raises(SettingsError):
        RetrySettings.from_json(data)


def test_load_file(tmp_path):
    """Load file."""
    p = tmp_path / "settings.json"
    p.write_text(json.dumps({"retry": {"maxRetries": 1, "jitter": "full"}}))
    assert load_settings(p) == RetrySettings(max_retries=1, jitter="full")
    p.write_text("{not json")
    with pytest.raises(SettingsError, match="valid JSON"):
        load_settings(p)
    with pytest.raises(SettingsError, match="readable"):
        load_settings(tmp_path / "missing.json")


def test_round_trip_and_with_enabled():
    """Round trip and with enabled."""
    s = RetrySettings(max_retries=2, max_delay_ms=100, jitter="equal")
    assert RetrySettings.from_json({"retry": s.to_json()}) == s
    assert s.with_enabled(False).enabled is False
    with pytest.raises(SettingsError):
        s.with_enabled("no")  # type: ignore[arg-type]


@given(st.integers(0, 86_400_000), st.integers(1, 100), st.sampled_from(["none", "full", "equal"]),
       st.floats(0, 1, exclude_max=True))
def test_backoff_is_never_negative_nor_above_nominal(base, attempt, jitter, r):
    """Backoff is never negative nor above nominal."""
    s = RetrySettings(base_delay_ms=base, max_retries=100, jitter=jitter)
    d = s.backoff_ms(attempt, random=lambda: r)
    assert 0 <= d <= s.nominal_delay_ms(attempt) <= 86_400_000


def test_duplicate_keys_are_refused_naming_the_key(tmp_path):
    """{"maxRetries": -5, "maxRetries": 1} used to load as 1 (last wins)."""
    p = tmp_path / "s.json"
    p.write_text('{"retry": {"baseDelayMs": 10, "maxRetries": -5, "maxRetries": 1}}')
    with pytest.raises(SettingsError, match=r"'retry\.maxRetries' is given more than once"):
        load_settings(p)
    p.write_text('{"retry": {}, "other": [{"a": 1, "a": 2}], "retry": {}}')
    with pytest.raises(SettingsError, match=r"'retry' is given more than once"):
        load_settings(p)
    p.write_text('{"x": [{"a": 1, "a": 2}]}')
    with pytest.raises(SettingsError, match=r"'x\.a' is given more than once"):
        load_settings(p)


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/urandom", "fifo", "folder"])
def test_only_regular_files_are_read(tmp_path, special):
    """A FIFO or /dev/urandom hung forever; /dev/zero grew without bound."""
    import os
    path = special
    if special == "fifo":
        path = tmp_path / "fifo"
        os.mkfifo(path)
    elif special == "folder":
        path = tmp_path
    with pytest.raises(SettingsError, match="not a regular file"):
        load_settings(path)


def test_a_settings_file_over_one_megabyte_is_refused(tmp_path):
    """(docs/policy.md §8b.10) The size cap is 1 MiB."""
    from fsm.host.settings_file import MAX_SETTINGS_BYTES
    p = tmp_path / "s.json"
    pad = MAX_SETTINGS_BYTES - len('{"retry": {"maxRetries": 2}, "pad": ""}')
    p.write_text('{"retry": {"maxRetries": 2}, "pad": "' + "x" * pad + '"}')
    assert load_settings(p).max_retries == 2  # exactly at the cap
    p.write_text('{"retry": {"maxRetries": 2}, "pad": "' + "x" * (pad + 1) + '"}')
    with pytest.raises(SettingsError, match="larger than 1048576 bytes"):
        load_settings(p)


def test_a_4301_digit_integer_names_its_key(tmp_path):
    """The int-conversion limit used to error without naming the key."""
    p = tmp_path / "s.json"
    p.write_text('{"retry": {"maxRetries": ' + "9" * 4301 + "}}")
    with pytest.raises(SettingsError, match=r"retry\.maxRetries: .*<an integer of 4301 digits>"):
        load_settings(p)
    p.write_text('{"unused": ' + "9" * 4301 + ', "retry": {"maxRetries": ' + "9" * 4300 + "}}")
    with pytest.raises(SettingsError, match=r"retry\.maxRetries: expected an integer from 0 to 100"):
        load_settings(p)
    with pytest.raises(SettingsError, match=r"retry\.maxRetries: .*an integer of about 5000 digits"):
        RetrySettings.from_json({"retry": {"maxRetries": 10 ** 4999}})


def test_load_refuses_bad_utf8_and_deep_nesting(tmp_path):
    """Load refuses bad utf8 and deep nesting."""
    p = tmp_path / "s.json"
    p.write_bytes(b'{"retry": {"jitter": "\xff"}}')
    with pytest.raises(SettingsError, match="UTF-8"):
        load_settings(p)
    p.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(SettingsError, match="nested too deeply"):
        load_settings(p)


def test_rpc_refuses_an_oversized_or_special_settings_file(tmp_path):
    """The command exits 2 at once, naming the reason."""
    import subprocess
    import sys
    from support import env
    big = tmp_path / "big.json"
    big.write_text('{"retry": {}, "pad": "' + "x" * (1 << 20) + '"}')
    for path, words in ((big, b"larger than 1048576 bytes"), ("/dev/zero", b"not a regular file")):
        proc = subprocess.run([sys.executable, "-m", "fsm", "rpc", "--model", "m", "--no-session",
                               "--settings", str(path)], cwd=tmp_path, env=env(),
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr[-400:]


# ------------------------------------------------------------------ v2 settings (docs/policy.md §1)




@pytest.mark.parametrize("retry,key", [
    ({"retryHints": "always"}, "retry.retryHints"),
    ({"maxHintWaitMs": -1}, "retry.maxHintWaitMs"),
    ({"maxHintWaitMs": float("nan")}, "retry.maxHintWaitMs"),
    ({"maxElapsedMs": "10s"}, "retry.maxElapsedMs"),
    ({"afterOutput": "never"}, "retry.afterOutput"),
    ({"unknown": "twice"}, "retry.unknown"),
    ({"unknown": True}, "retry.unknown"),
    ({"unknown": ["once"]}, "retry.unknown"),
    ({"budget": 5}, "retry.budget"),
    ({"budget": {"maxTokens": 0}}, "retry.budget.maxTokens"),
    ({"budget": {"maxTokens": 1001}}, "retry.budget.maxTokens"),
    ({"budget": {"tokenRatio": 0}}, "retry.budget.tokenRatio"),
    ({"budget": {"tokenRatio": 1.5}}, "retry.budget.tokenRatio"),
    ({"budget": {"tokens": 3}}, "retry.budget"),
])
def test_v2_settings_reject_bad_values_naming_the_key(retry, key):
    """V2 settings reject bad values naming the key."""
    with pytest.raises(SettingsError, match=key.replace(".", r"\.")):
        RetrySettings.from_json({"retry": retry})


def test_v2_defaults_keep_the_reference_behaviour_and_round_trip():
    """V2 defaults keep the reference behaviour and round trip."""
    s = RetrySettings()
    assert (s.retry_hints, s.max_hint_wait_ms, s.max_elapsed_ms, s.after_output, s.budget) == \
        ("ignore", 60_000, None, "retry", None)
    assert s.unknown == "never"  # docs/policy.md §1: unknown text stays fatal under the seed
    full = RetrySettings.from_json({"retry": {"retryHints": "honor", "maxElapsedMs": 900_000,
                                              "afterOutput": "stop", "unknown": "once",
                                              "budget": {"maxTokens": 10}}})
    assert RetrySettings.from_json({"retry": full.to_json()}) == full
    assert full.budget.threshold == 5 and full.budget.token_ratio == 0.1


def test_hinted_delay_gets_positive_only_jitter():
    """Hinted delay gets positive only jitter."""
    s = RetrySettings(jitter="full")
    assert s.hinted_delay_ms(10_000, lambda: 0.0) == 10_000
    assert s.hinted_delay_ms(10_000, lambda: 0.999) == 11_998
    assert RetrySettings().hinted_delay_ms(10_000, lambda: 0.999) == 10_000


def test_flat_retry_keys_at_the_top_level_raise():
    """Attack report: RetrySettings.from_json({"baseDelayMs": 20}) silently gave the defaults;
    it is now a SettingsError (no silent warnings, docs/policy.md §1)."""
    with pytest.raises(SettingsError, match=r'retry settings: expected the retry keys inside "retry"'):
        RetrySettings.from_json({"baseDelayMs": 20})


def test_a_python_caller_s_profile_applies_its_values_as_a_file_s_does():
    """RetrySettings(profile="resilient") is the profile (it used to keep the seed's values
    while admitting first requests); a key the caller gives wins over the profile."""
    from fsm.core.settings import profile_settings

    python = RetrySettings(profile="resilient")
    assert python == profile_settings("resilient") == RetrySettings.from_json({"retry": {"profile": "resilient"}})
    assert python.retry_hints == "honor" and python.max_retries == 100
    assert python.budget is not None and python.budget.waits and python.pacing is not None
    mine = RetrySettings(profile="resilient", max_retries=5, jitter="none", set_keys={"jitter"})
    assert (mine.max_retries, mine.jitter, mine.retry_hints) == (5, "none", "honor")
    assert RetrySettings.from_json({"retry": {"profile": "resilient", "pacing": None}}).pacing is None
