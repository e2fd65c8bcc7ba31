"""Retry-hint parsing (fsm.core.hints): every format of docs/policy.md §2, precedence, what is ignored."""

from __future__ import annotations

import functools
import math
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, available_timezones

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsm.commands.classify import zone_resolver
from fsm.core.hints import MAX_HINT_MS, normalize_text, parse_retry_hint_ms

# A fixed clock: 2026-06-14T12:00:00Z, a Sunday.
NOW = datetime(2026, 6, 14, 12, 0, 0, tzinfo=timezone.utc)
NOW_MS = NOW.timestamp() * 1000
DAY_MS = 86_400_000
# The host's zone resolver (the shell's zoneinfo): named zones known, zone-less times UTC.
ZONE = zone_resolver()


def at(**delta: float) -> datetime:
    return NOW + timedelta(**delta)


def parse(text: str) -> int | None:
    return parse_retry_hint_ms(text, now_ms=NOW_MS, zone=ZONE)


# --- one test per format ------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("retry-after-ms: 1500", 1500),
    ("retry-after-ms=250", 250),
    ("Retry-After-Ms: 12.6", 13),
    ('{"retry_after_ms": 800}', 800),
])
def test_retry_after_ms(text, expected):
    """Retry after ms."""
    assert parse(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("retry-after: 30", 30_000),
    ("Retry-After=2", 2_000),
    ("(retry-after: 60)", 60_000),
    ('{"retry_after": 7}', 7_000),
    ('"retryAfter": "1.5"', 1_500),
    ("retry-after: 0", 0),
])
def test_retry_after_seconds(text, expected):
    """Retry after seconds."""
    assert parse(text) == expected


def test_retry_after_http_date():
    """Retry after HTTP date."""
    when = at(seconds=90).strftime("%a, %d %b %Y %H:%M:%S GMT")
    assert parse(f"Retry-After: {when}") == 90_000


def test_retry_after_http_date_in_the_past_is_ignored():
    """Retry after HTTP date in the past is ignored."""
    assert parse("Retry-After: Wed, 21 Oct 2015 07:28:00 GMT") is None


def test_retry_after_http_date_variants():
    """Retry after HTTP date variants."""
    assert parse("Retry-After: Sun, 14 Jun 2026 12:00:10 -0000") == 10_000  # naive: UTC
    assert parse("Retry-After: Sun, 14 Jun 2026 14:00:10 +0200") == 10_000
    assert parse("Retry-After: Sun, 99 Xyz 2026 12:00:10 GMT") is None  # not a date


@pytest.mark.parametrize("text, expected", [
    ("x-ratelimit-reset-ms: 2500", 2500),
    (f"x-ratelimit-reset-ms: {int(NOW_MS) + 4000}", 4000),  # epoch milliseconds
])
def test_x_ratelimit_reset_ms(text, expected):
    """X ratelimit reset ms."""
    assert parse(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("x-ratelimit-reset: 12", 12_000),  # relative seconds
    (f"x-ratelimit-reset: {int(NOW_MS // 1000) + 60}", 60_000),  # epoch seconds
    (f'"X-RateLimit-Reset":"{int(NOW_MS) + 5000}"', 5000),  # epoch ms (OpenRouter)
    ("x-ratelimit-reset-requests: 1s", 1_000),  # OpenAI durations
    ("x-ratelimit-reset-tokens: 6m0s", 360_000),
    ("x-ratelimit-reset-tokens: 20ms", 20),
    ("ratelimit-reset: 45", 45_000),  # IETF draft header
    ("x-ratelimit-reset: 2026-06-14T12:00:30Z", 30_000),
])
def test_x_ratelimit_reset(text, expected):
    """X ratelimit reset."""
    assert parse(text) == expected


def test_anthropic_reset_header_rfc3339():
    """Anthropic reset header rfc3339."""
    assert parse("anthropic-ratelimit-tokens-reset: 2026-06-14T12:01:00Z") == 60_000
    assert parse("anthropic-ratelimit-requests-reset: 2026-06-14T14:01:00+02:00") == 60_000


@pytest.mark.parametrize("text, expected", [
    ("Please retry in 37.5s", 37_500),
    ("try again in 2h 13m", (2 * 60 + 13) * 60_000),
    ("reset after 5h8m26s", ((5 * 60 + 8) * 60 + 26) * 1000),
    ("Please try again in 9m38.016s.", 578_016),
    ("Please try again in 114h18m0s.", 411_480_000),
    ("Please try again in 2ms.", 2),
    ("Please retry after 86400 seconds.", 86_400_000),
    ("Please wait 17 seconds before trying again.", 17_000),
    ("Please wait 9 hours 23 minutes and try again!", 33_780_000),
    ("try again in 5 days 22 hours 11 minutes.", 511_860_000),
    ("Retrying in 1 seconds… (attempt 1/10) - but retry in 3s", 3000),  # the echo is skipped
    ("Your limit will reset in 2 hours, try again then.", 7_200_000),
    ("请等待 70 seconds，然后重试。", 70_000),
    ("Try again in 1 minute and 30 seconds", 90_000),
    ("available again in ~45s", 45_000),
])
def test_phrases(text, expected):
    """Phrases."""
    assert parse(text) == expected


@pytest.mark.parametrize("text, expected", [
    ('"retryDelay": "30s"', 30_000),
    ('{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37.581s"}', 37_581),
    ('\\"retryDelay\\": \\"12s\\"', 12_000),  # doubly encoded JSON
    ('"retryDelay": "500ms"', 500),
    ("retry_delay {\n  seconds: 37\n}", 37_000),
    ("retry_delay { seconds: 2 nanos: 500000000 }", 2_500),
])
def test_google_retry_info(text, expected):
    """Google retry info."""
    assert parse(text) == expected


@pytest.mark.parametrize("text, expected", [
    ('"resets_in_seconds":13872', 13_872_000),
    ('"X-Codex-Primary-Reset-After-Seconds":"13873"', 13_873_000),
    ('{"error":"Model X is currently loading","estimated_time":176.7188568}', 176_719),
])
def test_structured_relative_fields(text, expected):
    """Structured relative fields."""
    assert parse(text) == expected


def test_epoch_after_usage_limit_pipe():
    """Epoch after usage limit pipe."""
    epoch = int(NOW_MS // 1000) + 3600
    assert parse(f"Claude AI usage limit reached|{epoch}") == 3_600_000
    assert parse(f"Claude AI usage limit reached|{epoch * 1000}") == 3_600_000


def test_resets_at_epoch():
    """Resets at epoch."""
    assert parse(f'"resets_at":{int(NOW_MS // 1000) + 120}') == 120_000


def test_time_of_day_in_a_named_zone_is_the_next_occurrence():
    """Time of day in a named zone is the next occurrence."""
    zone = ZoneInfo("America/Santiago")
    now = datetime(2026, 6, 14, 12, 0, tzinfo=zone)
    text = "Claude usage limit reached. Your limit will reset at 3pm (America/Santiago)."
    assert parse_retry_hint_ms(text, now_ms=now.timestamp() * 1000, zone=ZONE) == 3 * 3_600_000
    later = datetime(2026, 6, 14, 16, 0, tzinfo=zone)  # 3pm has passed: tomorrow's
    assert parse_retry_hint_ms(text, now_ms=later.timestamp() * 1000, zone=ZONE) == 23 * 3_600_000


def test_claude_code_resets_phrasings():
    """Claude code resets phrasings."""
    zone = ZoneInfo("Europe/Rome")
    now = datetime(2026, 10, 8, 9, 0, tzinfo=zone)
    now_ms = now.timestamp() * 1000
    assert parse_retry_hint_ms("5-hour limit reached ∙ resets 10:30am (Europe/Rome)",
                               now_ms=now_ms, zone=ZONE) == 90 * 60_000
    assert parse_retry_hint_ms("Weekly limit reached ∙ resets Oct 9 at 10am (Europe/Rome)",
                               now_ms=now_ms, zone=ZONE) == 25 * 3_600_000


def test_absolute_date_without_zone_is_utc_unless_the_host_names_one():
    """A time printed without a zone is UTC; a host resolver that answers "" names its zone."""
    text = "You've hit your usage limit. ... or try again at Jul 5th, 2026 8:19 PM."
    utc_ms = datetime(2026, 7, 5, 20, 19, tzinfo=timezone.utc).timestamp() * 1000
    assert parse_retry_hint_ms(text, now_ms=utc_ms - 600_000) == 600_000
    assert parse_retry_hint_ms(text, now_ms=utc_ms - 600_000, zone=ZONE) == 600_000
    new_york = ZoneInfo("America/New_York")
    local_ms = datetime(2026, 7, 5, 20, 19, tzinfo=new_york).timestamp() * 1000
    assert parse_retry_hint_ms(text, now_ms=local_ms - 600_000, zone=zone_resolver(new_york)) == 600_000


def test_named_zone_without_a_resolver_is_unknown():
    """A core without the host's zone resolver gives no hint for a named zone rather than a guess."""
    now_ms = datetime(2026, 6, 14, 12, 0, tzinfo=ZoneInfo("America/Santiago")).timestamp() * 1000
    text = "Your limit will reset at 3pm (America/Santiago)."
    assert parse_retry_hint_ms(text, now_ms=now_ms) is None
    assert parse_retry_hint_ms(text, now_ms=now_ms, zone=lambda name: None) is None
    assert parse_retry_hint_ms("resets at 3pm (UTC)", now_ms=now_ms) is not None


def test_a_failing_resolver_is_an_unknown_zone():
    """A host resolver that raises or returns a non-zone is treated as not knowing the zone."""
    def broken(name):
        raise RuntimeError("zone database gone")
    assert parse_retry_hint_ms("resets at 3pm (Europe/Berlin)", now_ms=NOW_MS, zone=broken) is None
    assert parse_retry_hint_ms("resets at 3pm (Europe/Berlin)", now_ms=NOW_MS,
                               zone=lambda name: "Europe/Berlin") is None
    assert parse_retry_hint_ms("resets at 3pm", now_ms=NOW_MS, zone=broken) == 3 * 3_600_000


def test_daylight_saving_fall_back_keeps_a_ten_minute_reset():
    """On a fall-back night a reset 10 minutes ahead in the repeated hour is 10 minutes, not 24 h."""
    new_york = ZoneInfo("America/New_York")
    # 2026-11-01 01:45 EST, the second 01:45 of the night (06:45Z); the reset is 01:55 EST
    now = datetime(2026, 11, 1, 1, 45, tzinfo=new_york, fold=1)
    text = "You've hit your limit · resets 1:55am (America/New_York)"
    assert parse_retry_hint_ms(text, now_ms=now.timestamp() * 1000, zone=ZONE) == 10 * 60_000
    # the first 01:45 (EDT): the first 01:55 is 10 minutes ahead too
    first = datetime(2026, 11, 1, 1, 45, tzinfo=new_york, fold=0)
    assert parse_retry_hint_ms(text, now_ms=first.timestamp() * 1000, zone=ZONE) == 10 * 60_000
    # a zone-less time read in the host's zone behaves the same
    local = zone_resolver(new_york)
    assert parse_retry_hint_ms("limit reached, resets 1:55am", now_ms=now.timestamp() * 1000,
                               zone=local) == 10 * 60_000


def test_daylight_saving_spring_forward_time_is_still_ahead():
    """A reset at a wall time skipped by a spring-forward is read as the instant after the gap."""
    new_york = ZoneInfo("America/New_York")
    now = datetime(2026, 3, 8, 1, 50, tzinfo=new_york)  # 06:50Z; 02:00-03:00 does not exist
    hint = parse_retry_hint_ms("resets 2:30am (America/New_York)", now_ms=now.timestamp() * 1000,
                               zone=ZONE)
    assert hint is not None and hint < 3_600_000


def test_a_wall_time_skipped_by_a_spring_forward_moves_forward_never_back():
    """docs/classification.md "Clock and time zones": at 01:10 before a 02:00→03:00 gap, "resets
    2:20am" is 03:20 (70 min), not 01:20 (the wall time read with the offset after the gap)."""
    new_york = ZoneInfo("America/New_York")
    now = datetime(2026, 3, 8, 1, 10, tzinfo=new_york)
    for text, zone in (("resets 2:20am (America/New_York)", ZONE), ("resets 2:20am", zone_resolver(new_york))):
        assert parse_retry_hint_ms(text, now_ms=now.timestamp() * 1000, zone=zone) == 70 * 60_000


def test_a_fall_back_night_gives_the_first_future_instance_at_01_20():
    """docs/classification.md "Clock and time zones": "resets at 1:30am" read at either 01:20
    of a fall-back night is 10 minutes, for a zone-named and a zone-less text."""
    new_york = ZoneInfo("America/New_York")
    for fold in (0, 1):
        now_ms = datetime(2026, 11, 1, 1, 20, tzinfo=new_york, fold=fold).timestamp() * 1000
        assert parse_retry_hint_ms("resets at 1:30am (America/New_York)", now_ms=now_ms, zone=ZONE) == 600_000
        assert parse_retry_hint_ms("resets at 1:30am", now_ms=now_ms, zone=zone_resolver(new_york)) == 600_000


@functools.lru_cache(maxsize=None)
def _transitions(name: str, year: int) -> tuple[tuple[datetime, timedelta], ...]:
    """``(instant, offset before)`` of each change of ``name``'s UTC offset in ``year``."""
    z = ZoneInfo(name)
    t, end = datetime(year, 1, 1, tzinfo=timezone.utc), datetime(year + 1, 1, 1, tzinfo=timezone.utc)
    prev, out = t.astimezone(z).utcoffset(), []
    while t < end:
        step = t + timedelta(hours=6)
        off = step.astimezone(z).utcoffset()
        if off != prev:
            lo, hi = t, step  # the offset changes in (lo, hi]: bisect to the minute
            while hi - lo > timedelta(minutes=1):
                mid = lo + timedelta(minutes=(hi - lo) // timedelta(minutes=1) // 2)
                lo, hi = (mid, hi) if mid.astimezone(z).utcoffset() == prev else (lo, mid)
            out.append((hi, prev))
            prev = off
        t = step
    return tuple(out)


def _first_future_instance(z: ZoneInfo, now: datetime, hour: int, minute: int) -> datetime:
    """The oracle, by brute force over the zone's offsets near each day: every instant whose wall
    time in ``z`` is hour:minute today or tomorrow; a wall time that no instant has (a gap) is
    read with the smaller (earlier) offset, i.e. moved forward; the first at or after ``now``."""
    found = []
    day = now.astimezone(z).date()
    for d in (day, day + timedelta(days=1)):
        wall = datetime(d.year, d.month, d.day, hour, minute, tzinfo=timezone.utc)
        offsets = {(wall + timedelta(hours=h)).astimezone(z).utcoffset() for h in (-30, -14, -6, -2, 0, 2, 6, 14, 30)}
        real = [wall - o for o in offsets if (wall - o).astimezone(z).replace(tzinfo=None) == wall.replace(tzinfo=None)]
        found += real or [wall - min(offsets)]
    return min(t for t in found if t >= now)


_ZONES = sorted(available_timezones())


@pytest.mark.skipif(not _ZONES, reason="no zone database: tzdata (a test dependency) is missing")
@settings(max_examples=60, deadline=None)
@given(st.sampled_from(_ZONES or ["UTC"]), st.integers(2024, 2030), st.integers(0, 3),
       st.integers(-180, 180), st.integers(0, 59_999), st.integers(-120, 120), st.booleans(), st.booleans())
def test_reset_times_across_zones_and_both_transitions_of_a_year(name, year, which, now_min, now_ms_jitter,
                                                                 wall_min, named, twelve_hour):
    """docs/classification.md "Clock and time zones", for every zone the resolver knows and each
    offset change of a year: a repeated wall time resolves to its first future instance, a
    skipped one moves forward; zone-named and zone-less texts agree with a brute-force oracle."""
    z = ZoneInfo(name)
    changes = _transitions(name, year) or ((datetime(year, 7, 1, tzinfo=timezone.utc), timedelta(0)),)
    when, before = changes[which % len(changes)]
    now = when + timedelta(minutes=now_min, milliseconds=now_ms_jitter)
    wall = (when + before + timedelta(minutes=wall_min)).replace(tzinfo=None)  # near the change, local
    hour, minute = wall.hour, wall.minute
    clock = f"{(hour % 12) or 12}:{minute:02d}{'am' if hour < 12 else 'pm'}" if twelve_hour else f"{hour:02d}:{minute:02d}"
    text, resolver = ((f"Your limit resets at {clock} ({name})", ZONE) if named
                      else (f"Your limit resets at {clock}", zone_resolver(z)))
    now_ms = round(now.timestamp() * 1000)
    expected = round(_first_future_instance(z, now, hour, minute).timestamp() * 1000) - now_ms
    assert parse_retry_hint_ms(text, now_ms=now_ms, zone=resolver) == expected


def test_zone_names_in_any_case_and_offsets():
    """Zone names in any case and offsets."""
    assert parse("Your limit will reset at 12:30pm (us/eastern)") == _minutes_until(
        datetime(2026, 6, 14, 12, 30, tzinfo=ZoneInfo("US/Eastern")))
    assert parse("resets at 2:30 pm +02:00") == 30 * 60_000
    assert parse("resets at 12:45 UTC+1") == (23 * 60 + 45) * 60_000  # 11:45Z: tomorrow's
    assert parse("resets at 12:45 gmt") == 45 * 60_000


def _minutes_until(when: datetime) -> int:
    return int(when.timestamp() * 1000 - NOW_MS)


def test_month_day_without_year_rolls_over_to_next_year():
    """Month day without year rolls over to next year."""
    new_year_eve = datetime(2026, 12, 31, 20, 0, tzinfo=timezone.utc).timestamp() * 1000
    assert parse_retry_hint_ms("resets Jan 1 at 10am (UTC)", now_ms=new_year_eve) == 14 * 3_600_000
    # Feb 29 2028 has passed and 2029 has none: no hint
    march_2028 = datetime(2028, 3, 1, tzinfo=timezone.utc).timestamp() * 1000
    assert parse_retry_hint_ms("resets Feb 29 at 10am (UTC)", now_ms=march_2028) is None


def test_invalid_iso_dates_are_ignored():
    """Invalid iso dates are ignored."""
    assert parse("x-ratelimit-reset: 2026-02-30T10:00:00Z") is None


def test_regain_access_on_utc_date():
    """Regain access on utc date."""
    assert parse("You will regain access on 2026-06-15 at 00:00 UTC.") == 12 * 3_600_000


# --- precedence ---------------------------------------------------------------------------

def test_server_headers_beat_phrases():
    """Server headers beat phrases."""
    text = "Rate limit reached. Please try again in 60s. (retry-after: 65, retry-after-ms: 64500)"
    assert parse(text) == 64_500
    assert parse("Please try again in 60s. (retry-after: 65)") == 65_000


def test_relative_beats_absolute():
    """Relative beats absolute."""
    epoch = int(NOW_MS // 1000) + 7200
    text = f'{{"resets_at":{epoch},"resets_in_seconds":3600}}'
    assert parse(text) == 3_600_000


def test_an_unusable_candidate_falls_back_to_the_next():
    """An unusable candidate (a date in the past) falls back to the next (docs/policy.md §2)."""
    assert parse("retry-after: Wed, 21 Oct 2015 07:28:00 GMT ... please retry in 3s") == 3000


# --- ignored --------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "",
    "Overloaded",
    "try again in a moment",
    "Please try again later.",
    "retry-after: -5",
    "retry-after: NaN",
    "retry-after: soon",
    "Retry your request with the ID or ARN of an inference profile",
    '"totalRetryDelay":274',  # the AWS SDK's own retries, not a hint
    "(reached max retries: 4)",
    "preset 5 minutes",  # trigger words only at word starts
    "Your limit will reset at 3pm (Mars/Olympus_Mons).",  # unknown zone: no guess
    "try again at Feb 30th, 2026 8:19 PM",  # no such day
    "Your limit will reset at 13pm (UTC)",
    "Limit 10000, Used 8554, Requested 3082.",
    "Claude AI usage limit reached|1749924000",  # June 2025: in the past
])
def test_no_usable_hint(text):
    """No usable hint."""
    assert parse(text) is None


def test_four_hundred_days_is_the_limit():
    """docs/policy.md §13.6: a stated wait up to 400 days in any unit is a real hint."""
    assert MAX_HINT_MS == 400 * DAY_MS
    assert parse("retry-after-ms: 34560000000") == MAX_HINT_MS
    assert parse("retry-after: 34560000") == MAX_HINT_MS
    assert parse("retry-after: 34560001") == MAX_HINT_MS
    assert parse("try again in 8 days") == 8 * DAY_MS
    assert parse("Please try again in 3 weeks") == 21 * DAY_MS


@pytest.mark.parametrize("text", [
    "try again in 401 days", "retry-after-ms: 34560000001", "retry-after: 99999999999",
    "retry-after: " + "9" * 400, "Please retry in 10000000000 years", "x-ratelimit-reset: 10000000000000000",
    '"retryDelay": "99999999999s"', "retry_delay { seconds: 99999999999 }", '"resets_at": 99999999999999',
    "usage limit reached|99999999999999", "try again at Jul 5th, 9999 8:19 PM",
])
def test_a_wait_beyond_four_hundred_days_is_too_long_not_absent(text):
    """docs/policy.md §2 "Hints are monotonic": a wait beyond 400 days reads as 400 days."""
    assert parse(text) == MAX_HINT_MS


def _requests(retry_after_s: int, hints: str) -> int:
    """Requests one ``fsm.retrying_sync`` chain sends to a server that always answers 429 with
    ``retry-after: retry_after_s`` (maxRetries 3, maxHintWaitMs 60 s; no real waits)."""
    import fsm

    calls = 0

    def call():
        nonlocal calls
        calls += 1
        raise RuntimeError(f"429 Too Many Requests. retry-after: {retry_after_s}")

    with pytest.raises((RuntimeError, fsm.RetryChainError)):
        fsm.retrying_sync(call, sleep=lambda s: None,
                          settings={"retryHints": hints, "maxRetries": 3})
    return calls


_WAITS = st.one_of(st.integers(0, 120), st.integers(0, 10**9), st.integers(0, 10**40))


@settings(max_examples=40, deadline=None)
@given(_WAITS, _WAITS, st.sampled_from(["honor", "ignore"]))
def test_a_longer_server_wait_never_gets_more_requests(a, b, hints):
    """docs/policy.md §2 "Hints are monotonic": for retry-after a < b, requests(b) <= requests(a);
    under "ignore" (the seed's) hints never change the main path."""
    a, b = min(a, b), max(a, b)
    assert _requests(b, hints) <= _requests(a, hints)
    if hints == "ignore":
        assert _requests(b, hints) == 4


def test_a_wait_beyond_four_hundred_days_ends_the_chain_like_a_year():
    """docs/policy.md §2: under honor a retry-after of 401 days ends the chain at once (one
    request, hint_too_long), as a 365-day one does; it is never retried on plain backoff."""
    assert _requests(365 * 86_400, "honor") == _requests(401 * 86_400, "honor") == 1


def test_without_a_clock_absolute_hints_give_none():
    """The core reads no clock: without the host's now_ms only relative hints are read."""
    assert parse_retry_hint_ms("retry-after: 3") == 3000
    soon = NOW + timedelta(hours=1)
    assert parse_retry_hint_ms(f"x-ratelimit-reset: {int(soon.timestamp())}") is None
    assert parse_retry_hint_ms("retry-after: Sun, 14 Jun 2026 12:00:30 GMT") is None
    assert parse_retry_hint_ms("resets 3pm (UTC)") is None
    assert parse_retry_hint_ms(f"x-ratelimit-reset: {int(soon.timestamp())}", now_ms=NOW_MS) == 3_600_000


def test_only_bounded_work_on_repeated_triggers():
    """Only bounded work on repeated triggers."""
    text = "retry " * 50_000 + "retry-after: 5"
    # the 256-occurrence cap per trigger word drops the late hint: bounded work matters more
    assert parse(text) is None
    assert parse("retry-after: 5 " + "retry " * 50_000) == 5000


# --- the normal form ----------------------------------------------------------------------

@pytest.mark.parametrize("raw, normal", [
    ("Rate  LIMIT\n\t exceeded ", "rate limit exceeded"),
    ("invalid\nx-api-key", "invalid x-api-key"),
    ('{\\"message\\": \\"An internal \\n error\\"}', '{\\"message\\": \\"an internal error\\"}'),
    ("model’s maximum", "model's maximum"),
    ("see https://platform.openai.com/docs/guides/rate-limits. thanks", "see thanks"),
    ("url:'https://x.example/Status/503' code", "url:' ' code"),
    ("", ""),
])
def test_normalize_text(raw, normal):
    """Normalize text."""
    assert normalize_text(raw) == normal


def test_normalize_long_text_matches_short_text_rules():
    """Normalize long text matches short text rules."""
    chunk = "A  b\n c\u2028d\x1fe "
    long = chunk * 2000
    assert normalize_text(long) == " ".join(normalize_text(chunk) for _ in range(2000))


# --- properties ---------------------------------------------------------------------------

@settings(max_examples=400, deadline=None)
@given(st.text(), st.one_of(st.floats(min_value=0, max_value=4e12), st.floats()))
def test_parse_never_raises_and_stays_in_range(text, now_ms):
    """Parse never raises and stays in range."""
    hint = parse_retry_hint_ms(text, now_ms=now_ms)
    assert hint is None or (isinstance(hint, int) and 0 <= hint <= MAX_HINT_MS)


_words = st.sampled_from(["retry", "try again", "in", "after", "wait", "reset", "at", "3pm",
                          "retry-after:", "x-ratelimit-reset:", "-5", "1e9", "NaN", "2h",
                          "13m", "0.5s", "(utc)", "jul", "5th,", "2026", "8:19", "pm", "|",
                          "limit reached|1749924000", "retryDelay", '"', ":", "seconds", "ms"])


@settings(max_examples=400, deadline=None)
@given(st.lists(_words, max_size=12).map(" ".join))
def test_parse_never_raises_on_hint_like_text(text):
    """Parse never raises on hint like text."""
    hint = parse(text)
    assert hint is None or 0 <= hint <= MAX_HINT_MS


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=604_800))
def test_relative_seconds_round_trip(seconds):
    """Relative seconds round trip."""
    assert parse(f"Please retry in {seconds}s") == seconds * 1000
    assert parse(f"retry-after: {seconds}") == seconds * 1000


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=0, max_value=600, allow_nan=False).map(lambda x: round(x, 3)))
def test_fractional_seconds_are_rounded_to_the_ms(seconds):
    """Fractional seconds are rounded to the ms."""
    assert parse(f"Please try again in {seconds}s") == math.floor(seconds * 1000 + 0.5)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_normalize_is_idempotent(text):
    """Normalize is idempotent."""
    once = normalize_text(text)
    assert normalize_text(once) == once


def test_trigger_words_inside_other_words_cost_bounded_work():
    """Trigger words inside other words cost bounded work."""
    import time as _time
    text = "xretry" * 200_000 + " retry-after: 5"
    start = _time.process_time()
    assert parse(text) is None  # past the first 256 occurrences: not looked at
    assert _time.process_time() - start < 1.0


@pytest.mark.parametrize("now_ms", [1e20, -1e15, float("inf"), float("-inf"), float("nan")])
def test_a_clock_outside_datetime_range_gives_no_absolute_hint(now_ms):
    """A clock outside datetime range gives no absolute hint."""
    for text in ["reset at 3pm (UTC)", "try again at Jul 5th, 2026 8:19 PM", "reset at 3pm",
                 "retry-after: Wed, 21 Oct 2015 07:28:00 GMT", '"resets_at": 1749924000']:
        assert parse_retry_hint_ms(text, now_ms=now_ms) is None
    assert parse_retry_hint_ms("retry-after: 3", now_ms=now_ms) == 3000  # relative: no clock


# --- regressions (issue: hint values) ----------------------------------------------------------

@pytest.mark.parametrize("text", [
    "retry-after-ms: 1e309", "retry-after: 1e3", "retry-after-ms: 1E3", "retry-after: 1.5e2",
    "retry-after: ١٢٠", "retry-after: １２０", "retry-after-ms: ٣٠٠٠", "x-ratelimit-reset: ２０",
    "Please retry in ３０s", "try again in ٣٠ seconds",
])
def test_exponents_and_non_ascii_digits_are_never_hints(text):
    """Exponents and non ascii digits are never hints."""
    assert parse(text) is None


@pytest.mark.parametrize("text", [
    "Retrying in 32 seconds… (attempt 7/10)", "Rate limit exceeded. Waiting for 10 seconds.",
    "Info: Waiting 1000ms before pinging CAPI to check network connectivity...",
    "retrying in 5 seconds...",
])
def test_a_client_narrating_its_own_schedule_is_not_a_hint(text):
    """A client narrating its own schedule is not a hint."""
    assert parse(text) is None


def test_day_first_dates_in_other_languages():
    """Day first dates in other languages."""
    now = datetime(2026, 7, 10, 10, 52).astimezone().timestamp() * 1000  # local, as the text
    assert parse_retry_hint_ms("try again at 10 de jul. de 2026, 11:52.", now_ms=now) == 3_600_000
    assert parse_retry_hint_ms("try again at 10 jul 2026 11:52", now_ms=now) == 3_600_000
    # not a month: no guess
    assert parse_retry_hint_ms("try again at 10 xyz 2026 11:52", now_ms=now) is None


def test_retry_after_values_that_are_not_plain_numbers_or_dates_are_ignored():
    """Attack report: "1_000" gave 1000 ms, "0x10" 0, "3,4" 3000 ms (read by prefix)."""
    from fsm.core.hints import header_hint
    for bad in ("1_000", "0x10", "3,4", "+5", "5e3"):
        assert header_hint({"retry-after": bad}, rate_limited=True) is None, bad
        assert header_hint({"retry-after-ms": bad}, rate_limited=True) is None, bad
    assert header_hint({"retry-after": "2.5"}, rate_limited=True).ms == 2500
