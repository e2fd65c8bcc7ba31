"""Retry hints: how long a provider asks us to wait, parsed from an error message's text.

Pure functions: no I/O, no clock, no time zone database. An absolute hint (an HTTP date, an
epoch, an RFC 3339 reset time, "try again at Jul 5th, 2026 8:19 PM", "resets 3pm") is resolved
against the ``now_ms`` the host passes (epoch milliseconds from the host's own clock); without
it an absolute hint is no hint. A time without a zone is read in UTC unless the host's zone
resolver names one for it; a named zone ("resets 3pm (Europe/Berlin)") is resolved by the
host's resolver (:data:`ZoneResolver`), and without one it is unknown (no hint rather than a
wrong one). So the same message gives the same hint on any machine, under any ``TZ``.

Formats understood (docs/policy.md §2 "Usage limits", plus what the corpus shows), best first when a
message carries several:

1. ``retry-after-ms: 1500`` / ``retry-after-ms=1500`` (milliseconds; OpenAI and Anthropic SDKs)
2. ``retry-after: 30`` (seconds, RFC 9110 §10.2.3) or an HTTP date
   ``retry-after: Wed, 21 Oct 2015 07:28:00 GMT``; also ``"retry_after": 30`` in JSON bodies
3. Google RetryInfo: ``"retryDelay": "30s"`` (JSON) or ``retry_delay { seconds: 30 }`` (gRPC text)
4. ``"resets_in_seconds": 13872`` (Codex) and ``X-…-Reset-After-Seconds: 13873`` headers
5. ``x-ratelimit-reset-ms: N`` (milliseconds, or epoch milliseconds when > 10^12)
6. ``x-ratelimit-reset[-requests|-tokens]: N`` (seconds, or epoch seconds when > 10^9, or
   epoch milliseconds when > 10^12), an OpenAI duration (``6m0s``) or an RFC 3339 time;
   ``anthropic-ratelimit-*-reset: 2026-06-01T00:00:00Z``
7. ``"estimated_time": 176.7`` (Hugging Face, a model still loading; seconds)
8. phrases: "Please retry in 37.5s", "try again in 2h 13m", "try again in 9m38.016s",
   "reset after 5h8m26s", "Please retry after 86400 seconds", "Please wait 17 seconds",
   "请等待 70 seconds", "try again in 5 days 22 hours 11 minutes". A client narrating its own
   schedule in the progressive ("Retrying in 32 seconds… (attempt 7/10)", "Waiting for 10
   seconds", "Waiting 1000ms before pinging") is not the server's hint and is skipped
9. absolute: "usage limit reached|1749924000" (Claude, epoch seconds), ``"resets_at": N``,
   "reset at 3pm (America/Santiago)", "try again at Jul 5th, 2026 8:19 PM" (no zone: UTC, or
   the zone the host's resolver gives for ``""``), "regain access on 2026-06-01 at 00:00 UTC".
   A time of day already past today is the next one; on a daylight-saving fall-back night the
   earliest of the two readings still ahead is taken (a 10-minute reset stays 10 minutes); a
   time skipped by a spring-forward moves forward by the gap (02:30 in a 02:00→03:00 gap is 03:30)

A value that is negative, not a plain ASCII decimal number (``1e3``, ``1e309``, Arabic-Indic or
fullwidth digits) or in the past is ignored, and the next candidate is tried. A wait longer
than :data:`MAX_HINT_MS` (400 days) is read as 400 days: it is too long, not absent, so a longer
server wait never gives more requests than a shorter one (docs/policy.md §2 "Hints are
monotonic"). Only the first 256 occurrences of each trigger word are looked at, so an
adversarial message cannot make parsing slow.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone, tzinfo
from email.utils import parsedate_to_datetime
from collections.abc import Callable

__all__ = ["HINT_TRIGGERS", "MAX_HINT_MS", "WORD_CHARS", "HeaderHint", "ZoneResolver", "header_hint",
           "should_retry_header", "normalize_text", "padded_normal_form", "parse_hint_at", "parse_normalized_hint_ms", "parse_retry_hint_ms"]

MAX_HINT_MS = 400 * 24 * 3600 * 1000
"""The longest hint, in ms (400 days): a stated wait beyond it is read as this much (too long
for any ``maxHintWaitMs``), never ignored (docs/policy.md §2 "Hints are monotonic")."""

ZoneResolver = Callable[[str], "tzinfo | None"]
"""The host's time-zone resolver: ``zone(name) -> tzinfo | None``. ``name`` is an IANA zone
name as the message writes it, lower-cased (``"america/santiago"``; resolve it in any case), or
``""`` for a time printed without a zone (return the zone such times are in, or None for UTC).
None: unknown. The core has none of its own: without one, named zones are unknown and zone-less
times are UTC."""


# --------------------------------------------------------------------------------------------
# Normal form shared with the classifier

WORD_CHARS = "a-z0-9_\u00c0-\u02af\u0370-\u052f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af"
"""A regex character-class body of the characters that make up words in the normal form
(Latin, Greek, Cyrillic, kana, CJK, Hangul letters, digits, ``_``). Rules and hint trigger
words match only at word starts, i.e. after any other character."""
_WORD_CHAR = re.compile(f"[{WORD_CHARS}]")
_URL_RE = re.compile(r"https?://[^\s\"'<>\\()\[\]{},|`]*")
_WS_RE = re.compile(r"\s(?:\s+|(?<=[^ ]))")  # runs of 2+, or one that is not a space


def normalize_text(text: str) -> str:
    """The normal form that the classifier's rule patterns and the hint patterns match.

    Lower case; ``’``/``‘`` straightened to ``'``; the two-character escapes ``\\n``, ``\\r``,
    ``\\t`` of doubly encoded JSON turned into spaces; URLs removed (their paths, such as
    ``/docs/rate-limits``, ``/account/billing`` or ``/Status/503``, say nothing about this
    error); every run of whitespace (newlines included: terminals wrap error texts) collapsed
    to one space; leading and trailing space stripped. Linear in the length of ``text``.
    """
    return padded_normal_form(text)[1:]


# ASCII whitespace other than the space itself (str.split()'s set), mapped to spaces.
_ASCII_WS = str.maketrans({c: " " for c in "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f"})


def padded_normal_form(text: str) -> str:
    """" " + :func:`normalize_text`: the classifier scans the normal form with a leading space, so
    that its first word starts after a non-word character too."""
    t = text.lower()
    if "\\" in t:
        t = t.replace("\\n", " ").replace("\\r", " ").replace("\\t", " ")
    if "://" in t:
        t = _URL_RE.sub(" ", t)
    if len(t) < 4096:  # one C pass (split() knows the same whitespace as _ASCII_WS)
        if "’" in t or "‘" in t:
            t = t.replace("’", "'").replace("‘", "'")
        return " " + " ".join(t.split())
    if t.isascii():
        if not t.isprintable():
            t = t.translate(_ASCII_WS)
        while "  " in t:  # each pass shortens the runs: a handful of C-speed passes
            t = t.replace("   ", " ").replace("  ", " ")
        if t[-1:] == " ":
            t = t[:-1]
        return t if t[:1] == " " else " " + t
    if "’" in t or "‘" in t:
        t = t.replace("’", "'").replace("‘", "'")
    # one regex pass instead of a list of a million words
    return " " + _WS_RE.sub(" ", t).strip()


# --------------------------------------------------------------------------------------------
# Grammar pieces (they match the normal form: lower case, single spaces)

# Numbers are plain ASCII decimals (the regexes are compiled with re.ASCII, so \d is [0-9]);
# an exponent ("1e3", "1e309") or more digits after the match void it.
_NUM = r"(\d+(?:\.\d{1,9})?)(?![\de]|\.\d)"
_SEP = r"\\{0,3}[\"']?\s?[:=]\s?\\{0,3}[\"']?"  # `: `, `=`, `": "` and `\": \"` (escaped JSON)
_UNIT = (r"(?:milliseconds?|msecs?|ms|seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h"
         r"|days?|d|weeks?|w|months?|mos?|years?|yrs?)(?![a-z])")
_DURATION = (rf"(?:\d+(?:\.\d{{1,9}})? ?{_UNIT}|(?:an?|one) (?:hour|minute|second|day|week|month)(?![a-z]))"
             rf"(?:(?:,? and |, | )?\d+(?:\.\d{{1,9}})? ?{_UNIT}){{0,5}}")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?) ?([a-z]+)", re.ASCII)
_UNIT_MS = {
    "ms": 1, "msec": 1, "msecs": 1, "millisecond": 1, "milliseconds": 1,
    "s": 1000, "sec": 1000, "secs": 1000, "second": 1000, "seconds": 1000,
    "m": 60_000, "min": 60_000, "mins": 60_000, "minute": 60_000, "minutes": 60_000,
    "h": 3_600_000, "hr": 3_600_000, "hrs": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
    "d": 86_400_000, "day": 86_400_000, "days": 86_400_000,
    "w": 604_800_000, "week": 604_800_000, "weeks": 604_800_000,
    "mo": 2_592_000_000, "mos": 2_592_000_000, "month": 2_592_000_000, "months": 2_592_000_000,
    "y": 31_536_000_000, "yr": 31_536_000_000, "yrs": 31_536_000_000, "year": 31_536_000_000,
    "years": 31_536_000_000,
}
# Durations in the providers' other languages (docs/policy.md §13.6): Spanish, French, German,
# Portuguese words, and the Chinese, Japanese and Korean units that follow a number.
_I18N_UNIT_MS = {
    "segundo": 1000, "segundos": 1000, "seg": 1000, "seconde": 1000, "secondes": 1000,
    "sekunde": 1000, "sekunden": 1000, "sek": 1000,
    "minuto": 60_000, "minutos": 60_000, "minute": 60_000, "minutes": 60_000, "minuten": 60_000,
    "min": 60_000,
    "hora": 3_600_000, "horas": 3_600_000, "heure": 3_600_000, "heures": 3_600_000,
    "stunde": 3_600_000, "stunden": 3_600_000, "std": 3_600_000,
    "día": 86_400_000, "días": 86_400_000, "dia": 86_400_000, "dias": 86_400_000,
    "jour": 86_400_000, "jours": 86_400_000, "tag": 86_400_000, "tage": 86_400_000,
    "tagen": 86_400_000,
    "semana": 604_800_000, "semanas": 604_800_000, "semaine": 604_800_000, "semaines": 604_800_000,
    "woche": 604_800_000, "wochen": 604_800_000,
    "秒": 1000, "秒钟": 1000, "秒鐘": 1000, "초": 1000,
    "分": 60_000, "分钟": 60_000, "分鐘": 60_000, "분": 60_000,
    "小时": 3_600_000, "小時": 3_600_000, "个小时": 3_600_000, "個小時": 3_600_000,
    "時間": 3_600_000, "시간": 3_600_000,
    "天": 86_400_000, "日": 86_400_000, "일": 86_400_000,
}
_I18N_WORD_UNIT = (r"(?:segundos?|seg|secondes?|sekunden?|sek|minutos?|minutes?|minuten?|min|horas?"
                   r"|heures?|stunden?|std|d[íi]as?|jours?|tagen?|tag|semanas?|semaines?|wochen?)(?![a-zà-ÿ])")
_I18N_DURATION = (rf"\d+(?:[.,]\d{{1,3}})? ?{_I18N_WORD_UNIT}"
                  rf"(?:(?:,? (?:y|et|und|e) |, | )\d+(?:[.,]\d{{1,3}})? ?{_I18N_WORD_UNIT}){{0,3}}")
_I18N_DURATION_PART = re.compile(r"(\d+(?:[.,]\d+)?) ?([a-zà-ÿ]+|[^\x00-\x7f]{1,3})")
# Chinese, Japanese, Korean: "30秒后重试", "5分钟后再试", "30秒後に再試行", "30초 후에 다시 시도":
# a number and a unit, followed by "after".
_CJK_UNIT = r"(?:秒钟|秒鐘|秒|分钟|分鐘|分|个小时|個小時|小时|小時|時間|天|日|초|분|시간|일)"
_CJK_RE = re.compile(rf"((?:\d{{1,9}}(?:\.\d{{1,3}})? ?{_CJK_UNIT} ?){{1,4}})(?:之后|以后|以後|后|後|후|뒤)")
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_HTTP_DATE = (r"((?:mon|tue|wed|thu|fri|sat|sun)[a-z]{0,6}, \d{1,2}[ -][a-z]{3}[ -]\d{2,4}"
              r" \d{2}:\d{2}:\d{2} (?:gmt|utc|[+-]\d{4}))")
_ISO = (r"(\d{4}-\d{2}-\d{2}(?:t| |,? at )\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?"
        r"(?: ?(?:z|utc|gmt|[+-]\d{2}:?\d{2}))?)")
_ISO_PARTS = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})(?:t| |,? at )(\d{2}):(\d{2})(?::(\d{2})(\.\d{1,9})?)?"
    r"(?: ?(z|utc|gmt|[+-]\d{2}:?\d{2}))?", re.ASCII)
_ABS_START = (r"(?=(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]{0,6}\.? \d"
              r"|\d{1,2}(?::\d{2})? ?[ap]\.?m\b|\d{1,2}:\d{2}|\d{4}-\d{2}-\d{2}"
              r"|\d{1,2}(?: de)? [a-z]{3})")
# Month abbreviations of day-first dates, English, Portuguese and Spanish ("10 de jul. de 2026").
_DAY_FIRST_MONTHS = {
    "jan": 1, "ene": 1, "feb": 2, "fev": 2, "mar": 3, "apr": 4, "abr": 4, "may": 5, "mai": 5,
    "jun": 6, "jul": 7, "aug": 8, "ago": 8, "sep": 9, "set": 9, "oct": 10, "out": 10, "nov": 11,
    "dec": 12, "dez": 12, "dic": 12}

# One alternative per hint kind, in order of preference (at one position the first that
# matches wins). Each ends with an empty named group, so ``m.lastgroup`` names the kind.
# Every alternative starts with one of :data:`HINT_TRIGGERS`: the regex only runs anchored at
# those words, found by the classifier's scan or by ``str.find`` (C speed).
_KINDS: tuple[tuple[str, str], ...] = (
    ("ms_header", rf"retry[-_]?after[-_]?ms{_SEP}{_NUM}"),
    ("after_header", rf"retry[-_]?after(?:[-_]?s(?:ec(?:ond)?s?)?)?{_SEP}(?:{_NUM}|{_HTTP_DATE})"),
    ("retry_delay_json", rf"retry[-_]?delay\\{{0,3}}\"?\s?:\s?\\{{0,3}}\""
                         rf"(\d+(?:\.\d{{1,9}})?)(m?s)\\{{0,3}}\""),
    ("retry_delay_proto", r"retry_delay \{ seconds: (\d+)(?: nanos: (\d{1,9}))? \}"),
    ("reset_in_seconds", rf"resets?[-_](?:in|after)[-_]s(?:ec(?:ond)?s?)?{_SEP}{_NUM}"),
    ("ratelimit_reset_ms", rf"ratelimit-reset-ms{_SEP}{_NUM}"),
    ("ratelimit_reset", rf"ratelimit-reset(?:-[a-z-]{{1,30}})?{_SEP}(?:{_ISO}|({_DURATION})|{_NUM})"),
    ("ratelimit_reset_iso", rf"ratelimit-[a-z-]{{1,30}}-reset{_SEP}{_ISO}"),
    ("estimated_time", rf"estimated_time{_SEP}{_NUM}"),
    ("phrase", rf"(?:retry|try again|wait|reset|resets|refresh(?:es|ed)?|renew(?:s|ed)?|come back"
               rf"|available again|available|等待)"
               rf"(?: in| after| for)?:? ?(?:about |approximately |approx\. |~)?({_DURATION})"),
    ("epoch_pipe", r"limit reached\|(\d{10,})"),
    ("resets_at", rf"resets?[-_]at{_SEP}(\d{{10,}})(?![\d.])"),
    ("phrase_i18n", rf"(?:r[ée]essay|essayez|int[ée]nt[ae]|vuelv|reint[ée]nt|tente|tentar|aguarde|espere"
                    rf"|versuch|warte|attendez|patientez)"
                    rf"[^.;!?]{{0,40}}?(?:(?:en|dans|em|in|nach|após|apos|después de|despues de|tras"
                    rf"|pendant|durante|por|für) )?({_I18N_DURATION})"),
    ("absolute", rf"(?:try again|retry|resets?|refresh(?:es|ed)?|come back|available again|available"
                 rf"|regain access)"
                 rf"(?: at| on| after)? {_ABS_START}"),
)
_PRIORITY = {name: i for i, (name, _) in enumerate(_KINDS)}
_HINT_RE = re.compile("|".join(f"(?:{pattern})(?P<{name}>)" for name, pattern in _KINDS), re.ASCII)
HINT_TRIGGERS: tuple[str, ...] = (
    "retry", "try again", "wait", "reset", "ratelimit", "estimated_time",
    "available", "等待", "limit reached|", "regain access", "refresh", "renew", "come back",
    "réessay", "reessay", "essayez", "inténta", "inténte", "intenta", "intente", "vuelv",
    "reintént", "reintent", "tente", "tentar", "aguarde", "espere", "versuch", "warte",
    "attendez", "patientez")
"""Every hint starts with one of these words (in the normal form); the classifier finds them
during its own scan and passes their positions to :func:`parse_hint_at`."""
_MAX_PER_TRIGGER = 256

# Dates and times after an "absolute" trigger.
_ABS_RE = re.compile(
    r"(?:(?P<mon>jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]{0,6}\.? (?P<day>\d{1,2})"
    r"(?:st|nd|rd|th)?(?:,? (?P<year>\d{4}))?(?:,? at |,? | at )"
    r"|(?P<iy>\d{4})-(?P<im>\d{2})-(?P<id>\d{2})(?:t| |,? at )"
    r"|(?P<dday>\d{1,2})(?: de)? (?P<dmon>[a-z]{3})[a-z]{0,6}\.?(?:,? (?:de )?(?P<dyear>\d{4}))?"
    r"(?:,? (?:at |às |as |a las )?| at ))?"
    r"(?:(?P<h12>\d{1,2})(?::(?P<m12>\d{2}))? ?(?P<ampm>[ap])\.?m\.?"
    r"|(?P<h24>\d{1,2}):(?P<m24>\d{2})(?::(?P<s24>\d{2})(?:\.\d{1,9})?)?)"
    r"(?: ?\((?P<zone>[a-z][a-z0-9_+\-]{0,30}(?:/[a-z0-9_+\-]{1,30}){0,2})\)"
    r"| ?(?P<zabbr>z|utc|gmt)(?P<zoff>[+-]\d{1,2}(?::?\d{2})?)?(?![a-z])"
    r"| ?(?P<off>[+-]\d{2}:?\d{2}))?",
    re.ASCII,
)


def parse_retry_hint_ms(text: str, *, now_ms: float | None = None,
                        zone: ZoneResolver | None = None) -> int | None:
    """The retry hint carried by an error message, in milliseconds, or ``None``.

    ``text`` is the provider's error text as-is (any case, any whitespace). ``now_ms`` is the
    host's clock in epoch milliseconds, used only for absolute hints (HTTP dates, epochs, times
    of day); None: absolute hints are not resolved (no hint). ``zone``: the host's
    :data:`ZoneResolver` for named zones and zone-less times (None: named zones unknown,
    zone-less times UTC). Relative hints are rounded to the nearest ms.

    Returns an ``int`` between 0 and :data:`MAX_HINT_MS` inclusive (a longer wait is cut to
    it), or ``None`` when the text carries no usable hint (none at all, negative, NaN or in the
    past). Never
    raises for any ``str``. See the module docstring for the formats and their precedence.
    """
    return parse_normalized_hint_ms(normalize_text(text), now_ms=now_ms, zone=zone)


def parse_normalized_hint_ms(t: str, *, now_ms: float | None = None,
                             zone: ZoneResolver | None = None) -> int | None:
    """:func:`parse_retry_hint_ms` for a text already in :func:`normalize_text` form.

    Only the first 256 occurrences of each trigger word (:data:`HINT_TRIGGERS`) are looked
    at: a bounded amount of work however long the text.
    """
    positions: list[int] = []
    for trigger in HINT_TRIGGERS:
        anywhere = trigger > "\x7f"  # words of scripts without spaces have no word start
        i = t.find(trigger)
        seen = 0
        while i >= 0 and seen < _MAX_PER_TRIGGER:
            seen += 1
            if anywhere or i == 0 or _WORD_CHAR.match(t, i - 1) is None:
                positions.append(i)
            i = t.find(trigger, i + 1)
    return parse_hint_at(t, positions, now_ms=now_ms, zone=zone)


def parse_hint_at(t: str, positions: list[int], *, now_ms: float | None = None,
                  zone: ZoneResolver | None = None) -> int | None:
    """The best hint among those starting at ``positions`` (indexes of trigger words in the
    normal form ``t``), in ms, or ``None``. See :func:`parse_retry_hint_ms`."""
    candidates: list[tuple[int, int, str, re.Match[str]]] = []
    for i in positions:
        m = _HINT_RE.match(t, i)
        if m is not None and m.lastgroup is not None:
            kind = m.lastgroup
            candidates.append((_PRIORITY[kind], i, kind, m))
    if not t.isascii():
        for count, m in enumerate(_CJK_RE.finditer(t)):
            if count >= _MAX_PER_TRIGGER:
                break
            candidates.append((_PRIORITY["phrase_i18n"], m.start(), "phrase_cjk", m))
    if not candidates:
        return None
    if len(candidates) > 1:
        candidates.sort(key=lambda c: (c[0], c[1]))
    if now_ms is not None and not _MIN_CLOCK_MS <= now_ms <= _MAX_CLOCK_MS:
        now_ms = None  # a clock outside the calendar (or NaN): absolute hints are not resolved
    when = _When(now_ms, zone)
    for _, _, kind, m in candidates:
        value = _value(kind, m, t, when)
        if value is not None:
            return value
    return None


_MIN_CLOCK_MS = -62_135_596_800_000  # 0001-01-01T00:00Z: datetime's range
_MAX_CLOCK_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z


@dataclass(frozen=True, slots=True)
class _When:
    """The host's clock reading (epoch ms, or None: unknown) and zone resolver."""

    now: float | None
    zone: ZoneResolver | None

    def resolve(self, name: str) -> tzinfo | None:
        """The host's zone named ``name`` (``""``: the zone of zone-less times), or None."""
        if self.zone is None:
            return None
        try:
            found = self.zone(name)
        except Exception:  # noqa: BLE001 - a host's resolver failing is an unknown zone
            return None
        return found if isinstance(found, tzinfo) else None


def _round(ms: float) -> int | None:
    """A wait in ms → an int in 0 … :data:`MAX_HINT_MS`; None for NaN or a negative wait (a
    time in the past). A wait beyond 400 days is cut to 400 days, never dropped: it is "too
    long", and a longer server wait must never read as no hint at all (docs/policy.md §2)."""
    if ms != ms or ms < 0:  # NaN, negative
        return None
    return MAX_HINT_MS if ms >= MAX_HINT_MS else int(ms + 0.5)  # also an infinite one


def _duration_ms(text: str) -> int | None:
    total = 0.0
    if text[:1].isalpha():  # "an hour", "a minute", "one day"
        text = "1 " + text.split(" ", 1)[1]
    for number, unit in _DURATION_PART.findall(text):
        total += float(number) * _UNIT_MS[unit]
    return _round(total)


def _i18n_duration_ms(text: str) -> int | None:
    total = 0.0
    for number, unit in _I18N_DURATION_PART.findall(text):
        size = _I18N_UNIT_MS.get(unit)
        if size is None:
            return None
        total += float(number.replace(",", ".")) * size
    return _round(total)


def _epoch_ms(value: float, when: _When) -> int | None:
    """Epoch seconds (10 digits) or milliseconds (13 digits) → ms from now."""
    if when.now is None:
        return None
    epoch_ms = value if value >= 1e12 else value * 1000
    return _round(epoch_ms - when.now)


def _value(kind: str, m: re.Match[str], t: str, when: _When) -> int | None:
    groups = [g for g in m.groups() if g is not None and g != ""]
    if kind == "ms_header":
        return _round(float(groups[0]))
    if kind == "after_header":
        raw = groups[0]
        if raw[0].isdigit():
            return _round(float(raw) * 1000)
        return _http_date_ms(raw, when)
    if kind == "retry_delay_json":
        number, unit = groups[0], groups[1]
        return _round(float(number) * (1 if unit == "ms" else 1000))
    if kind == "retry_delay_proto":
        nanos = float(groups[1]) if len(groups) > 1 else 0.0
        return _round(float(groups[0]) * 1000 + nanos / 1e6)
    if kind in ("reset_in_seconds", "estimated_time"):
        return _round(float(groups[0]) * 1000)
    if kind == "ratelimit_reset_ms":
        value = float(groups[0])
        return _epoch_ms(value, when) if value >= 1e12 else _round(value)
    if kind == "ratelimit_reset":
        raw = groups[0]
        if "-" in raw[1:5] or ":" in raw:
            return _iso_ms(raw, when)
        if not raw.replace(".", "", 1).isdigit():
            return _duration_ms(raw)
        value = float(raw)
        return _epoch_ms(value, when) if value >= 1e9 else _round(value * 1000)
    if kind == "ratelimit_reset_iso":
        return _iso_ms(groups[0], when)
    if kind == "phrase":
        return _duration_ms(groups[0])
    if kind in ("phrase_i18n", "phrase_cjk"):
        return _i18n_duration_ms(groups[0])
    if kind in ("epoch_pipe", "resets_at"):
        return _epoch_ms(float(groups[0]), when)
    return _absolute_ms(t, m.end(), when)


def _http_date_ms(raw: str, when: _When) -> int | None:
    if when.now is None:
        return None
    try:
        date_time = parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if date_time.tzinfo is None:
        date_time = date_time.replace(tzinfo=timezone.utc)
    return _round(date_time.timestamp() * 1000 - when.now)


def _iso_ms(raw: str, when: _When) -> int | None:
    if when.now is None:
        return None
    m = _ISO_PARTS.match(raw)
    if m is None:  # pragma: no cover - _ISO and _ISO_PARTS accept the same texts
        return None
    year, month, day, hour, minute, second, fraction, zone = m.groups()
    tz = _offset(zone) if zone and zone[0] in "+-" else timezone.utc  # no zone: UTC (RFC 3339 headers)
    try:
        date_time = datetime(int(year), int(month), int(day), int(hour), int(minute),
                             int(second or 0), tzinfo=tz)
    except ValueError:
        return None
    return _round(date_time.timestamp() * 1000 + float(fraction or 0) * 1000 - when.now)


def _offset(text: str) -> timezone:
    """``+05:30``, ``-0800``, ``+3`` → a fixed offset (clamped to the legal ±23:59)."""
    digits = text[1:].replace(":", "")
    hours, minutes = (int(digits[:-2]), int(digits[-2:])) if len(digits) > 2 else (int(digits), 0)
    delta = timedelta(hours=min(hours, 23), minutes=min(minutes, 59))
    return timezone(-delta if text[0] == "-" else delta)


def _absolute_ms(t: str, pos: int, when: _When) -> int | None:
    """A date and/or time of day starting at ``t[pos]`` → ms from now (next occurrence)."""
    now = when.now
    if now is None:
        return None
    m = _ABS_RE.match(t, pos)
    if m is None:
        return None
    g = m.groupdict()
    if g["h12"] is not None:
        hour, minute, second = int(g["h12"]), int(g["m12"] or 0), 0
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if g["ampm"] == "p" else 0)
    else:
        hour, minute, second = int(g["h24"]), int(g["m24"]), int(g["s24"] or 0)
    zone: tzinfo | None
    if g["zone"]:
        zone = timezone.utc if g["zone"] in ("utc", "gmt", "z") else when.resolve(g["zone"])
        if zone is None:
            return None  # a zone we do not know: better no hint than a wrong one
    elif g["zabbr"]:
        zone = _offset(g["zoff"]) if g["zoff"] else timezone.utc
    elif g["off"]:
        zone = _offset(g["off"])
    else:
        zone = when.resolve("") or timezone.utc  # no zone: UTC unless the host says otherwise
    try:
        now_dt = datetime.fromtimestamp(now / 1000, zone)
    except (OverflowError, OSError, ValueError):  # a clock outside datetime's range
        return None
    try:
        if g["mon"]:
            year = int(g["year"]) if g["year"] else now_dt.year
            day = date(year, _MONTHS.index(g["mon"]) + 1, int(g["day"]))
        elif g["iy"]:
            day = date(int(g["iy"]), int(g["im"]), int(g["id"]))
        elif g["dmon"]:
            month = _DAY_FIRST_MONTHS.get(g["dmon"])
            if month is None:
                return None
            year = int(g["dyear"]) if g["dyear"] else now_dt.year
            day = date(year, month, int(g["dday"]))
        else:
            day = now_dt.date()
    except ValueError:
        return None
    days = [day]
    if not (g["mon"] or g["iy"] or g["dmon"]):
        days.append(day + timedelta(days=1))  # a time of day: today's, else tomorrow's
    elif g["mon"] and not g["year"]:
        try:
            days.append(day.replace(year=day.year + 1))  # "Jul 5": this year's, else next year's
        except ValueError:
            pass
    readings: list[float] = []
    for d in days:
        readings += _wall_instants(d, hour, minute, second, zone)
    ahead = [ms for ms in readings if ms >= now]
    if not ahead:
        return _round(min(readings) - now) if readings else None  # in the past: ignored
    return _round(min(ahead) - now)



def _wall_instants(d: date, hour: int, minute: int, second: int, zone: tzinfo) -> list[float]:
    """The instants (epoch ms) at which the wall clock of ``zone`` reads ``d hour:minute:second``
    (docs/classification.md "Clock and time zones"): one on most days; two on a fall-back
    night (the repeated hour: both readings, the caller takes the first still ahead); and for a
    time skipped by a spring-forward, none exists, so the time moves forward by the gap (read
    with the offset before it: 02:30 in a 02:00→03:00 gap is 03:30)."""
    try:
        wall = datetime(d.year, d.month, d.day, hour, minute, second)
        instants = [wall.replace(tzinfo=zone, fold=fold).timestamp() for fold in (0, 1)]
    except (ValueError, OverflowError):
        return []
    real = []
    for ts in instants:
        try:
            if datetime.fromtimestamp(ts, zone).replace(tzinfo=None) == wall:
                real.append(ts * 1000)
        except (ValueError, OverflowError, OSError):
            continue
    return real or [max(instants) * 1000]  # in a gap: the later reading is the one moved forward


# --------------------------------------------------------------------------------------------
# Hints from response headers (structured facts)

_RESET_HEADER = re.compile(r"(?:x-)?ratelimit-reset(?:-[a-z-]{1,30})?|(?:x-|anthropic-)ratelimit-[a-z-]{1,30}-reset",
                           re.ASCII)


@dataclass(frozen=True, slots=True)
class HeaderHint:
    """A retry hint read from one response header: ``ms`` (0 … :data:`MAX_HINT_MS`), the
    header's lower-case ``name`` and its ``value`` as sent."""

    ms: int
    name: str
    value: str

    def as_text(self) -> str:
        """``"<name>: <value>"``, the form error texts carry (and :func:`parse_retry_hint_ms`
        reads back to the same ``ms``)."""
        return f"{self.name}: {self.value}"


def _remaining_name(reset: str) -> str:
    """The ``*-remaining*`` header paired with a ``*-reset*`` header."""
    if reset.endswith("-reset"):  # anthropic-ratelimit-tokens-reset
        return reset[:-len("-reset")] + "-remaining"
    return reset.replace("ratelimit-reset", "ratelimit-remaining", 1)  # x-ratelimit-reset-requests


_PLAIN_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def header_hint(headers: Mapping[str, str] | None, *, rate_limited: bool,
                now_ms: float | None = None, zone: ZoneResolver | None = None) -> HeaderHint | None:
    """The retry hint carried by response headers (keys lower-cased), or ``None``.

    Best first: ``retry-after-ms`` (milliseconds), ``retry-after`` (seconds or an HTTP date,
    RFC 9110 §10.2.3), then, only when ``rate_limited`` (the failure is a rate or usage limit:
    these headers come with every response and say when a window refills, not when to retry an
    overload), the rate-limit reset headers — ``x-ratelimit-reset*`` and
    ``anthropic-ratelimit-*-reset`` (RFC 3339). Among those, the ones whose paired
    ``*-remaining*`` header is ``0`` (the limit that was hit) are preferred, and of them the
    longest wait. Values are read with the same grammar as texts (:func:`parse_retry_hint_ms`),
    so a negative, non-ASCII or exponent value is ignored and one beyond 400 days is cut to it. ``now_ms``: epoch ms for
    absolute values from the host's clock (None: absolute values give no hint); ``zone``: as
    for :func:`parse_retry_hint_ms`.
    """
    if not headers:
        return None
    for name in ("retry-after-ms", "retry-after"):
        value = headers.get(name)
        if isinstance(value, str) and value.strip():
            plain = value.strip()
            # RFC 9110: a number of seconds (ms for retry-after-ms) or an HTTP date; "1_000",
            # "0x10", "3,4" are neither and are ignored rather than read by their prefix.
            if not (_PLAIN_NUMBER.fullmatch(plain) or (name == "retry-after" and plain[:1].isalpha())):
                continue
            ms = parse_normalized_hint_ms(f"{name}: {normalize_text(value)}", now_ms=now_ms, zone=zone)
            if ms is not None:
                return HeaderHint(ms, name, value)
    if not rate_limited:
        return None
    found: list[tuple[bool, int, HeaderHint]] = []
    for name, value in headers.items():
        if not isinstance(value, str) or not _RESET_HEADER.fullmatch(name):
            continue
        ms = parse_normalized_hint_ms(f"{name}: {normalize_text(value)}", now_ms=now_ms, zone=zone)
        if ms is not None:
            hit = str(headers.get(_remaining_name(name), "")).strip() == "0"
            found.append((hit, ms, HeaderHint(ms, name, value)))
    if not found:
        return None
    return max(found, key=lambda f: (f[0], f[1]))[2]


def should_retry_header(headers: Mapping[str, str] | None) -> bool | None:
    """The server's own verdict from ``x-should-retry`` (``"true"``/``"false"``, as the
    OpenAI and Anthropic APIs send it), or ``None`` when absent or anything else."""
    if not headers:
        return None
    value = headers.get("x-should-retry")
    if not isinstance(value, str):
        return None
    value = value.strip().lower()
    return True if value == "true" else False if value == "false" else None
