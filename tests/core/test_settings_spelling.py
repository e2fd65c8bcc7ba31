"""Settings spelling, unknown keys and precedence marks (docs/policy.md §1): camelCase in files
and mappings, snake_case in Python, an unknown key named with the nearest known one."""

from __future__ import annotations

import warnings

import pytest

import fsm
from fsm.core.settings import ORIGINAL_RETRY_KEYS, RetrySettings, SettingsError, known_keys, nearest_key
from fsm.host.settings_file import load_settings


@pytest.mark.parametrize("key,near", [
    ("maxRetry", "maxRetries"), ("max_retries", "maxRetries"), ("base_delay_ms", "baseDelayMs"),
    ("maxretries", "maxRetries"), ("retryHint", "retryHints"), ("jiter", "jitter"),
])
def test_an_unknown_key_names_the_nearest_known_key(key, near):
    """A misspelt or snake_case key in the file's retry group raises, naming the key and its
    nearest known key."""
    with pytest.raises(SettingsError) as info:
        RetrySettings.from_json({"retry": {key: 5}})
    assert info.value.key == key and info.value.suggestion == near
    assert str(info.value) == f"retry.{key}: unknown key; did you mean retry.{near}?"


def test_an_unknown_key_with_nothing_near_lists_the_known_keys():
    """A key like no other lists the known keys instead of guessing."""
    with pytest.raises(SettingsError) as info:
        RetrySettings.from_json({"retry": {"colour": "blue"}})
    assert info.value.suggestion is None and "maxRetries" in str(info.value)


def test_a_nested_unknown_key_is_named_with_its_path():
    """An unknown key of the budget object names its dotted path and the nearest key."""
    with pytest.raises(SettingsError, match=r"retry\.budget\.maxToken: unknown key; did you mean "
                                            r"retry\.budget\.maxTokens\?"):
        RetrySettings.from_json({"retry": {"budget": {"maxToken": 10}}})


def test_the_originals_keys_are_never_suggested():
    """`provider` is the original's key: accepted, and never offered for a near miss."""
    assert nearest_key("providr", list(known_keys()) + list(ORIGINAL_RETRY_KEYS)) != "provider"
    assert nearest_key("providr", list(ORIGINAL_RETRY_KEYS)) is None
    assert "provider" in ORIGINAL_RETRY_KEYS


def test_retry_keys_at_the_top_level_raise():
    """`{"maxRetries": 5}` as a whole file would be silently ignored: it raises instead."""
    with pytest.raises(SettingsError, match=r'inside "retry"') as info:
        RetrySettings.from_json({"maxRetries": 5})
    assert info.value.value == "maxRetries"


def test_the_python_api_is_snake_case():
    """RetrySettings takes snake_case; a camelCase keyword is a TypeError as for any class."""
    assert RetrySettings(max_retries=5).max_retries == 5
    with pytest.raises(TypeError):
        RetrySettings(maxRetries=5)  # type: ignore[call-arg]


def test_set_keys_tell_the_user_s_values_from_defaults():
    """A key named in a mapping counts as set even with the default's value; a key left out
    does not; a Python value other than the default does; from_json over a base keeps both."""
    s = RetrySettings.from_json({"retry": {"maxRetries": 3, "jitter": "full"}})
    assert s.is_set("maxRetries") and s.is_set("max_retries") and s.is_set("jitter")
    assert not s.is_set("baseDelayMs")
    assert RetrySettings(base_delay_ms=500).is_set("baseDelayMs")
    assert not RetrySettings().is_set("enabled")
    assert RetrySettings().with_enabled(True).is_set("enabled")
    over = RetrySettings.from_json({"retry": {"baseDelayMs": 10}}, base=s)
    assert {k for k in known_keys() if over.is_set(k)} == {"maxRetries", "jitter", "baseDelayMs"}
    assert s == RetrySettings(jitter="full")  # set_keys take no part in equality
    with pytest.raises(SettingsError, match="unknown key"):
        s.is_set("maxRetry")


def test_coerce_takes_the_file_shape_or_the_inner_object():
    """A host's settings= takes RetrySettings, {"retry": {...}} or the inner object."""
    inner = RetrySettings.coerce({"maxRetries": 5, "retryHints": "honor"})
    outer = RetrySettings.coerce({"retry": {"maxRetries": 5, "retryHints": "honor"}})
    assert inner == outer == RetrySettings(max_retries=5, retry_hints="honor")
    assert RetrySettings.coerce(None) is None and RetrySettings.coerce(inner) is inner
    with pytest.raises(TypeError, match="got list"):
        RetrySettings.coerce([("maxRetries", 5)])  # type: ignore[arg-type]


def test_coerce_parses_a_mapping_once_per_content_and_again_when_it_changes():
    """docs/embedding.md "The API": `fsm.retrying(fn, settings={...})` on every call parses the
    mapping once per content — the same settings again — and a dict the caller mutates is
    read afresh (the parse is keyed on the content, never on the dict's identity); 1, 1.0 and
    True are different contents (True is refused as a count)."""
    settings = {"maxRetries": 5, "fallbackModels": ["gpt-a"], "budget": {"maxTokens": 10}}
    first = RetrySettings.coerce(settings)
    assert RetrySettings.coerce(settings) is first  # parsed once
    assert RetrySettings.coerce(dict(settings)) is first  # the same content, another dict
    settings["maxRetries"] = 7
    assert RetrySettings.coerce(settings).max_retries == 7
    settings["fallbackModels"].append("gpt-b")  # a nested change is a new content too
    assert RetrySettings.coerce(settings).fallback_models == ("gpt-a", "gpt-b")
    settings["budget"]["maxTokens"] = 20
    assert RetrySettings.coerce(settings).budget.max_tokens == 20
    assert RetrySettings.coerce({"maxRetries": 1}).max_retries == 1
    assert RetrySettings.coerce({"maxRetries": 1.0}).max_retries == 1
    with pytest.raises(SettingsError, match="maxRetries"):
        RetrySettings.coerce({"maxRetries": True})
    looped: dict = {"maxRetries": 1}
    looped["budget"] = looped  # a self-containing value is not cached: the parse names it
    with pytest.raises(SettingsError, match="budget"):
        RetrySettings.coerce(looped)


def test_coerce_warns_each_time_it_ignores_a_key():
    """A mapping whose parse warns (the original's keys) warns on every call: only a quiet
    parse is remembered."""
    for _ in range(2):
        with pytest.warns(UserWarning, match="retry.provider"):
            RetrySettings.coerce({"maxRetries": 1, "provider": {}})


@pytest.mark.parametrize("settings", [{"max_retries": 5}, {"retry": {"max_retries": 5}}])
def test_the_runner_refuses_a_snake_case_key_suggesting_camel_case(settings):
    """fsm.RetryRunner(settings=...) with a snake_case key raises SettingsError naming
    maxRetries (no warning, no silent default)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(SettingsError, match=r"retry\.max_retries: unknown key; did you mean retry\.maxRetries\?"):
            fsm.RetryRunner(settings=settings)


def test_the_runner_accepts_the_originals_keys_and_lists_them():
    """The original's retry.provider given to the runner is ignored and listed once."""
    with pytest.warns(UserWarning, match="retry.provider") as caught:
        runner = fsm.RetryRunner(settings={"retry": {"maxRetries": 1, "provider": {"maxRetries": 0}}})
    assert len(caught) == 1
    assert runner.settings.max_retries == 1 and runner.settings.ignored_keys == ("retry.provider",)



# ------------------------------------------------- from Python as strict as from a file (§1)
@pytest.mark.parametrize("group", ["rety", "retries", "Retry", "retyr", "retrySettings", "rtry"])
def test_a_near_miss_of_the_retry_group_raises_naming_retry(group):
    """docs/policy.md §1: `{"rety": {...}}` from Python raises "did you mean retry?" instead
    of giving the defaults, whether or not the group is required."""
    for require in (True, False):
        with pytest.raises(SettingsError) as info:
            RetrySettings.from_json({group: {"maxRetries": 5}}, require_retry=require)
        assert str(info.value) == f"{group}: unknown key; did you mean retry?"
        assert info.value.top_level and info.value.unknown and info.value.suggestion == "retry"


def test_the_mapping_a_host_takes_refuses_a_near_miss_of_the_group_too():
    """docs/embedding.md "The API": `settings={"rety": {...}}` is no inner object with a key
    `rety`: it raises naming the group."""
    with pytest.raises(SettingsError, match=r"^rety: unknown key; did you mean retry\?$"):
        RetrySettings.coerce({"rety": {"maxRetries": 5}})
    with pytest.raises(SettingsError, match=r"^rety: unknown key; did you mean retry\?$"):
        fsm.RetryRunner(settings={"rety": {"maxRetries": 5}})


def test_load_refuses_a_near_miss_and_a_file_with_no_retry_group(tmp_path):
    """docs/policy.md §1: fsm.load_settings is as strict as from_json."""
    path = tmp_path / "settings.json"
    path.write_text('{"rety": {"maxRetries": 5}}')
    with pytest.raises(SettingsError, match=r"did you mean retry\?"):
        load_settings(path)
    path.write_text('{"theme": "dark"}')
    with pytest.raises(SettingsError, match=r'"retry" group'):
        load_settings(path)


def test_other_programs_groups_are_ignored_with_the_commands_warning():
    """docs/policy.md §1: groups of other programs beside `retry` are not read, and named in
    one UserWarning worded as the commands' line."""
    with pytest.warns(UserWarning) as caught:
        s = RetrySettings.from_json({"retry": {"maxRetries": 1}, "theme": "dark", "compaction": {}})
    assert s == RetrySettings(max_retries=1)
    assert [str(w.message) for w in caught] == ["ignoring keys this project does not use: compaction, theme"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RetrySettings.from_json({"retry": {"maxRetries": 1}})  # nothing to say


def test_a_refused_file_says_nothing_about_other_groups():
    """A settings error is the one thing said: no warning about other groups before it."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(SettingsError):
            RetrySettings.from_json({"retry": {"maxRetries": -1}, "theme": "dark"})


@pytest.mark.parametrize("entry,key,near", [
    ({"maxRetires": 2}, 'providers["openai"].maxRetires', 'providers["openai"].maxRetries'),
    ({"budget": {"maxToken": 2}}, 'providers["openai"].budget.maxToken', 'providers["openai"].budget.maxTokens'),
    ({"pacing": {"minrate": 2}}, 'providers["openai"].pacing.minrate', 'providers["openai"].pacing.minRate'),
])
def test_an_unknown_key_in_a_providers_entry_names_the_nearest_known_key(entry, key, near):
    """docs/policy.md §13.4: a typo inside `providers[...]` gets the same "did you mean" as at
    the top level, at every depth."""
    with pytest.raises(SettingsError) as info:
        RetrySettings.from_json({"retry": {"providers": {"openai": entry}}})
    assert str(info.value) == f"retry.{key}: unknown key; did you mean retry.{near}?"
    assert info.value.unknown and info.value.suggestion == near


def test_the_commands_warn_and_refuse_in_the_same_words(tmp_path):
    """docs/policy.md §1: the commands print the same warning line (prefixed) and refuse a
    near-miss of the group; a file with no retry group gives them the defaults."""
    from fsm.commands.common import load_settings

    path = tmp_path / "settings.json"
    lines: list[str] = []
    path.write_text('{"retry": {"maxRetries": 1}, "theme": "dark"}')
    assert load_settings(str(path), prog="fsm rpc", warn=lines.append).max_retries == 1
    assert lines == [f"fsm rpc: settings {path}: ignoring keys this project does not use: theme"]
    path.write_text('{"theme": "dark"}')
    assert load_settings(str(path), prog="fsm rpc", warn=lines.append) == RetrySettings()
    path.write_text('{"rety": {"maxRetries": 5}}')
    with pytest.raises(SettingsError, match=r"^rety: unknown key; did you mean retry\?$"):
        load_settings(str(path), prog="fsm rpc", warn=lines.append)
