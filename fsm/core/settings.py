"""Retry settings (docs/policy.md §1): validation, the settings file's JSON shape, backoff.

Spelling: the settings file and RPC use the original's camelCase (``{"retry": {"maxRetries":
5}}``, the shape agent harnesses already use); the Python API uses snake_case
(``RetrySettings(max_retries=5)``). :meth:`RetrySettings.coerce` is the one entry for a host's
``settings=`` argument: a ``RetrySettings``, the file's shape ``{"retry": {...}}`` or the inner
object ``{"maxRetries": 5}``.

Keys (docs/policy.md §1):

- an unknown key raises :class:`SettingsError` naming it and the nearest known key
  (``retry.maxRetry: unknown key; did you mean retry.maxRetries?``); a snake_case key in a
  mapping names its camelCase spelling (``max_retries`` → ``maxRetries``). No silent warnings.
- the original's own keys (:data:`ORIGINAL_RETRY_KEYS`: ``retry.provider``, its HTTP client's
  retry) are accepted and ignored; :attr:`RetrySettings.ignored_keys` lists them and
  :meth:`RetrySettings.from_json` names them once in a :class:`UserWarning`, which the shells
  print as one log line.
- other top-level groups of the file (the original's ``theme``, ``compaction``…) belong to
  other programs and are not read.
- a ``RetrySettings`` tells a key the user set from a default (:meth:`RetrySettings.is_set`),
  so that a layer of lower precedence (a profile) never overrides a value the user wrote.

Reading the file is a shell's job: :func:`fsm.host.settings_file.load_settings` (also the
top-level ``fsm.load_settings``).
"""

from __future__ import annotations

import difflib
import functools
import math
import random as _random
import warnings
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping

__all__ = ["RetrySettings", "BudgetSettings", "PacingSettings", "SettingsError", "BUDGET_MODES", "JITTER_MODES", "RETRY_HINT_MODES",
           "AFTER_OUTPUT_MODES", "UNKNOWN_MODES", "MAX_RETRIES_LIMIT", "MAX_DELAY_LIMIT_MS", "ORIGINAL_RETRY_KEYS",
           "known_keys", "nearest_key"]

JITTER_MODES: tuple[str, ...] = ("none", "full", "equal")
RETRY_HINT_MODES: tuple[str, ...] = ("ignore", "honor")
AFTER_OUTPUT_MODES: tuple[str, ...] = ("retry", "stop")
UNKNOWN_MODES: tuple[str, ...] = ("never", "once")
"""``retry.unknown``: what an error of family ``unknown`` (text with no status, no typed code and
no rule, docs/policy.md §2) gets: ``"never"`` a retry (fatal, the seed) or ``"once"`` one retry
after the base delay (docs/policy.md §1)."""
HINT_JITTER = 0.2
"""Positive-only jitter on a delay that comes from a hint or a cooldown: up to +20 % (§1)."""

# Limits on what is "absurd": one backoff longer than a day, or more than 100 retries in one
# chain, is a typo (a delay written in seconds as ms, an extra zero), not a policy.
MAX_RETRIES_LIMIT = 100
MAX_DELAY_LIMIT_MS = 86_400_000

_KEYS = {
    "enabled": "enabled",
    "maxRetries": "max_retries",
    "baseDelayMs": "base_delay_ms",
    "maxDelayMs": "max_delay_ms",
    "jitter": "jitter",
    "retryHints": "retry_hints",
    "maxHintWaitMs": "max_hint_wait_ms",
    "maxElapsedMs": "max_elapsed_ms",
    "afterOutput": "after_output",
    "unknown": "unknown",
    "budget": "budget",
    "pacing": "pacing",  # the fleet's pacing group (PacingSettings, below)
    # docs/policy.md §13: the failures of 2026 (stall watchdog, attempt timeout, fallback,
    # per-provider policy, usage windows)
    "firstTokenTimeoutMs": "first_token_timeout_ms",
    "idleTimeoutMs": "idle_timeout_ms",
    "attemptTimeoutMs": "attempt_timeout_ms",
    "fallbackModels": "fallback_models",
    "fallbackOn": "fallback_on",
    "fallbackAfter": "fallback_after",
    "fallbackRevertMs": "fallback_revert_ms",
    "waitForUsageReset": "wait_for_usage_reset",
    "providers": "providers",
}
"""camelCase key of the ``retry`` group → the :class:`RetrySettings` field. Every setting is
listed here (failures, sim and fleet add theirs in their own blocks below)."""

_MACHINERY = frozenset({"set_keys", "ignored_keys"})
"""Fields of :class:`RetrySettings` that are not settings."""


def known_keys() -> tuple[str, ...]:
    """The camelCase keys of the ``retry`` group, as the settings file spells them."""
    return tuple(_KEYS)


ORIGINAL_RETRY_KEYS: tuple[str, ...] = ("provider",)
"""Keys of the original's own ``retry`` group that this project does not use (``provider``:
the original's HTTP-client retry, ``{"maxRetries": 0, "maxRetryDelayMs": ...}``): accepted,
ignored and listed once (docs/policy.md §1). Never suggested for a misspelt key."""


IGNORED_GROUPS_WARNING = "ignoring keys this project does not use: "
"""The start of the warning that names a settings file's top-level groups of other programs
(the commands print it after ``<prog>: settings <path>: ``)."""


def _near_retry_group(key: Any) -> bool:
    """Whether the top-level ``key`` is a misspelling of ``retry`` (``rety``, ``retries``,
    ``Retry``, ``retrySettings``), not another program's group."""
    if not isinstance(key, str) or key == "retry" or len(key) > 200:
        return False
    low = key.lower()
    return (low.startswith("retry") or low in ("retries", "retrys")
            or bool(difflib.get_close_matches(low, ["retry"], n=1, cutoff=0.75)))


class SettingsError(ValueError):
    """A setting has a wrong type or an out-of-range value, or a key is unknown.

    ``key`` names it (camelCase, dotted below ``retry``: ``budget.maxTokens``), ``value`` is
    the value given (None for an unknown key) and ``suggestion`` the nearest known key for an
    unknown one (None when nothing is near).
    """

    def __init__(self, key: str, value: Any, expected: str, *, suggestion: str | None = None,
                 unknown: bool = False, top_level: bool = False) -> None:
        prefix = "" if top_level else "retry."
        name = f"{prefix}{key}" if key else "retry settings"
        if unknown:
            text = f"{_clip(name)}: unknown key; " + (f"did you mean {prefix}{suggestion}?" if suggestion
                                                      else expected)
        else:
            text = f"{name}: expected {expected}, got {_shown(value)}"
        super().__init__(text)
        self.key = key
        self.value = value
        self.suggestion = suggestion
        self.expected = expected
        self.unknown = unknown
        """True for an unknown key (``suggestion`` then names the nearest known one, or None)."""
        self.top_level = top_level
        """True when ``key`` is a top-level key of the file (a near-miss of the ``retry`` group,
        ``rety: unknown key; did you mean retry?``), not one below ``retry``."""

    @classmethod
    def unknown_key(cls, key: str, known: "tuple[str, ...] | list[str]", where: str = "") -> "SettingsError":
        """The error for ``key`` (under ``where``, e.g. ``"budget."``) that is none of ``known``."""
        near = nearest_key(key, known)
        shown = ", ".join(known[:12]) + (", ..." if len(known) > 12 else "")
        return cls(where + key, None, f"the known keys are {shown}",
                   suggestion=None if near is None else where + near, unknown=True)


def _shown(value: Any) -> str:
    try:
        shown = repr(value)
    except ValueError:  # an int too long to print (sys.get_int_max_str_digits)
        shown = f"<an integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
    return _clip(shown)


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _camel(key: str) -> str:
    """``max_retries`` → ``maxRetries``."""
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def nearest_key(key: str, known: "tuple[str, ...] | list[str]") -> str | None:
    """The known key ``key`` most likely means, or None.

    A snake_case spelling names its camelCase key (``max_retries`` → ``maxRetries``); a
    different case (``maxretries``) its key; otherwise the closest by
    :func:`difflib.get_close_matches` (ratio ≥ 0.6). The original's keys
    (:data:`ORIGINAL_RETRY_KEYS`) are never suggested.
    """
    if not isinstance(key, str) or len(key) > 200:
        return None
    candidates = [k for k in known if k not in ORIGINAL_RETRY_KEYS]
    camel = _camel(key)
    for k in candidates:
        if k == camel or k.lower() == key.lower() or k.lower() == camel.lower():
            return k
    close = difflib.get_close_matches(camel, candidates, n=1, cutoff=0.6)
    return close[0] if close else None


def _check_int(key: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        else:
            raise SettingsError(key, value, f"an integer from {lo} to {hi}")
    if not lo <= value <= hi:
        raise SettingsError(key, value, f"an integer from {lo} to {hi}")
    return int(value)


# --- fleet: retry budget and pacing (owned by the fleet work; docs/fleet.md) ----------------

BUDGET_MODES: tuple[str, ...] = ("refuse", "wait")
"""``retry.budget.mode``: what a retry the bucket cannot afford does (docs/fleet.md)."""

_BUDGET_KEYS = ("maxTokens", "tokenRatio", "mode", "minRetriesPerSecond")


def _check_number(key: str, value: Any, lo: float, hi: float, *, lo_open: bool = False) -> float:
    """A finite int or float within [lo, hi] (or (lo, hi] with ``lo_open``), as a float."""
    ok = (not isinstance(value, bool) and isinstance(value, (int, float))
          and math.isfinite(value) and (lo < value if lo_open else lo <= value) and value <= hi)
    if not ok:
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise SettingsError(key, value, f"a number in {interval}")
    return float(value)


@dataclass(frozen=True, slots=True)
class BudgetSettings:
    """The shared retry budget (docs/policy.md §9, §8b.3): gRPC retry throttling.

    - ``max_tokens``: the bucket's size, 1..1000 (default 100); it starts full.
    - ``token_ratio``: tokens a success gives back, 0 < r <= 1 (default 0.1).
    - ``mode``: ``"refuse"`` (default: a retry the bucket cannot afford ends the chain, the
      original's behaviour) or ``"wait"`` (it waits, holding no token, and is re-checked at
      the floor's slots; docs/fleet.md "Budget in wait mode").
    - ``min_retries_per_second``: the fleet-wide floor of retries per second the budget
      always lets through, 0..1000 (default 0: none), as Linkerd's retry budget's
      ``minRetriesPerSecond`` (https://linkerd.io/2/reference/service-profiles/).

    Each failed attempt takes one token; a retry is allowed only while the count after the
    take is above ``max_tokens / 2`` (or when a floor slot is free). Raises
    :class:`SettingsError` naming ``retry.budget.KEY`` and the value.
    """

    max_tokens: int = 100
    token_ratio: float = 0.1
    mode: str = "refuse"
    min_retries_per_second: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_tokens", _check_int("budget.maxTokens", self.max_tokens, 1, 1000))
        r = self.token_ratio
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or not 0 < r <= 1:
            raise SettingsError("budget.tokenRatio", r, "a number with 0 < r <= 1")
        object.__setattr__(self, "token_ratio", float(r))
        if self.mode not in BUDGET_MODES:
            raise SettingsError("budget.mode", self.mode, 'one of "refuse", "wait"')
        object.__setattr__(self, "min_retries_per_second", _check_number(
            "budget.minRetriesPerSecond", self.min_retries_per_second, 0, 1000))

    @property
    def threshold(self) -> float:
        """Retries are allowed while the count after the take is above this (``max_tokens / 2``)."""
        return self.max_tokens / 2

    @property
    def waits(self) -> bool:
        """``mode`` is ``"wait"``."""
        return self.mode == "wait"

    def to_json(self) -> dict[str, Any]:
        return {"maxTokens": self.max_tokens, "tokenRatio": self.token_ratio, "mode": self.mode,
                "minRetriesPerSecond": self.min_retries_per_second}

    @classmethod
    def from_json(cls, data: Any) -> "BudgetSettings | None":
        """``null`` -> None (off); ``{}`` -> the defaults; a key other than maxTokens,
        tokenRatio, mode, minRetriesPerSecond raises :class:`SettingsError` naming it."""
        if data is None:
            return None
        if isinstance(data, BudgetSettings):
            return data
        if not isinstance(data, Mapping):
            raise SettingsError("budget", data, "null or an object {maxTokens, tokenRatio, mode, "
                                                "minRetriesPerSecond}")
        unknown = sorted(str(k) for k in data if k not in _BUDGET_KEYS)
        if unknown:
            raise SettingsError.unknown_key(unknown[0], list(_BUDGET_KEYS), "budget.")
        return cls(data.get("maxTokens", 100), data.get("tokenRatio", 0.1),
                   data.get("mode", "refuse"), data.get("minRetriesPerSecond", 0.0))


_PACING_KEYS = {"enabled": "enabled", "minRate": "min_rate", "maxRate": "max_rate",
                "beta": "beta", "growthPerS": "growth_per_s", "fastGrowthPerS": "fast_growth_per_s",
                "cutIntervalMs": "cut_interval_ms", "horizonMs": "horizon_ms",
                "recheckMs": "recheck_ms", "forgetAfterMs": "forget_after_ms", "memoryS": "memory_s"}


@dataclass(frozen=True, slots=True)
class PacingSettings:
    """``retry.pacing``: the fleet's client-side rate limiter (docs/fleet.md "Pacing"): every
    request takes the next slot of a pacer shared by the fleet, whose rate is learned from
    throttling answers (AWS SDK adaptive retry mode's idea), with a floor of probes that
    detects recovery (Linkerd's ``minRetriesPerSecond`` idea). Rates in requests per second
    shared by the fleet, times in ms.

    - ``enabled``: pacing on (default ``True`` once the group is given; ``retry.pacing: null``,
      the seed profile's default, is off).
    - ``min_rate`` (``minRate``): the floor of the rate, so probes keep detecting recovery; a
      number in [0.001, 1e6] (one probe per 1,000 s at the least), default 1.
    - ``max_rate`` (``maxRate``): a ceiling of the rate, or ``None`` (default: none); a number
      in (0, 1e6], at least ``minRate``.
    - ``beta``: a throttle cuts the rate to ``beta`` × the send rate measured over the last
      second; in (0, 1), default 0.7 (botocore's and CUBIC's β).
    - ``growth_per_s`` (``growthPerS``): each second with successes grows the rate by this
      share, in (0, 10], default 0.03;
    - ``fast_growth_per_s`` (``fastGrowthPerS``): the share while the rate is below 0.9 × the
      rate last throttled (CUBIC's ``W_max``: capacity known to exist), in (0, 10], default 0.5.
    - ``cut_interval_ms`` (``cutIntervalMs``): at most one cut per this many ms (the throttles
      of one round of requests cut once), an integer 0..600 000, default 1 000.
    - ``horizon_ms`` (``horizonMs``): a slot is reserved at most this far ahead; a request that
      finds none reserves nothing and asks again after ``recheck_ms`` (jittered ×U(0.5, 1.5) by
      the host), so a rate that recovers is used at once; an integer 0..86 400 000, default 2 000.
    - ``recheck_ms`` (``recheckMs``): see ``horizon_ms``; an integer 100..86 400 000 (a waiting
      request asks the coordinator at most about ten times a second), default 3 000.
    - ``forget_after_ms`` (``forgetAfterMs``): no throttle for this long and the pacer lets go
      (unpaced until the next throttle), an integer 1000..604 800 000, default 30 000.
    - ``memory_s`` (``memoryS``): the half-life in seconds of the best throughput seen, to which
      the rate jumps back (half of it) after a fault (fast recovery); in (0, 1e6], default 600.

    Raises :class:`SettingsError` naming ``retry.pacing.KEY`` and the value.
    """

    enabled: bool = True
    min_rate: float = 1.0
    max_rate: float | None = None
    beta: float = 0.7
    growth_per_s: float = 0.03
    fast_growth_per_s: float = 0.5
    cut_interval_ms: int = 1_000
    horizon_ms: int = 2_000
    recheck_ms: int = 3_000
    forget_after_ms: int = 30_000
    memory_s: float = 600.0

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise SettingsError("pacing.enabled", self.enabled, "true or false")
        object.__setattr__(self, "min_rate", _check_number("pacing.minRate", self.min_rate, 0.001, 1e6))
        if self.max_rate is not None:
            object.__setattr__(self, "max_rate", _check_number("pacing.maxRate", self.max_rate, 0, 1e6, lo_open=True))
            if self.max_rate < self.min_rate:
                raise SettingsError("pacing.maxRate", self.max_rate,
                                    f"null or a number at least pacing.minRate ({self.min_rate:g})")
        object.__setattr__(self, "beta", _check_number("pacing.beta", self.beta, 0, 1, lo_open=True))
        if self.beta >= 1:
            raise SettingsError("pacing.beta", self.beta, "a number in (0, 1)")
        object.__setattr__(self, "growth_per_s", _check_number("pacing.growthPerS", self.growth_per_s, 0, 10, lo_open=True))
        object.__setattr__(self, "fast_growth_per_s", _check_number("pacing.fastGrowthPerS", self.fast_growth_per_s, 0, 10, lo_open=True))
        object.__setattr__(self, "cut_interval_ms", _check_int("pacing.cutIntervalMs", self.cut_interval_ms, 0, 600_000))
        object.__setattr__(self, "horizon_ms", _check_int("pacing.horizonMs", self.horizon_ms, 0, MAX_DELAY_LIMIT_MS))
        object.__setattr__(self, "recheck_ms", _check_int("pacing.recheckMs", self.recheck_ms, 100, MAX_DELAY_LIMIT_MS))
        object.__setattr__(self, "forget_after_ms", _check_int("pacing.forgetAfterMs", self.forget_after_ms,
                                                               1000, 7 * MAX_DELAY_LIMIT_MS))
        object.__setattr__(self, "memory_s", _check_number("pacing.memoryS", self.memory_s, 0, 1e6, lo_open=True))

    def to_json(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "minRate": self.min_rate, "maxRate": self.max_rate,
                "beta": self.beta, "growthPerS": self.growth_per_s,
                "fastGrowthPerS": self.fast_growth_per_s, "cutIntervalMs": self.cut_interval_ms,
                "horizonMs": self.horizon_ms, "recheckMs": self.recheck_ms,
                "forgetAfterMs": self.forget_after_ms, "memoryS": self.memory_s}

    @classmethod
    def from_json(cls, data: Any) -> "PacingSettings | None":
        """``null`` -> None (off); ``{}`` -> the defaults (on); a key not in
        ``enabled, minRate, maxRate, beta, growthPerS, fastGrowthPerS, cutIntervalMs, horizonMs,
        recheckMs, forgetAfterMs, memoryS`` raises
        :class:`SettingsError` naming it."""
        if data is None:
            return None
        if isinstance(data, PacingSettings):
            return data
        if not isinstance(data, Mapping):
            raise SettingsError("pacing", data, "null or an object {" + ", ".join(_PACING_KEYS) + "}")
        unknown = sorted(str(k) for k in data if k not in _PACING_KEYS)
        if unknown:
            raise SettingsError.unknown_key(unknown[0], list(_PACING_KEYS), "pacing.")
        return cls(**{_PACING_KEYS[k]: v for k, v in data.items()})

# --- end of the fleet block -------------------------------------------------------------------


DEFAULT_FALLBACK_ON: tuple[str, ...] = ("overloaded", "usage_limit")
"""``retry.fallbackOn`` by default: overloads and usage limits switch models; a plain 429 rate
limit does only when listed (docs/policy.md §13.3)."""


@dataclass(frozen=True, slots=True)
class RetrySettings:
    """The retry settings of docs/policy.md §1.

    - ``enabled``: automatic retry on or off (default ``True``).
    - ``max_retries``: retries per chain, 0..100 (default 3).
    - ``base_delay_ms``: first backoff in ms, doubled each attempt, 0..86 400 000 (default 2000).
    - ``max_delay_ms``: cap on one backoff in ms, or ``None`` for no cap (default: the reference behaviour).
    - ``jitter``: ``"none"`` (the reference behaviour), ``"full"`` (uniform 0..d) or ``"equal"`` (d/2 + uniform
      0..d/2), to spread concurrent sessions (AWS architecture blog, "Exponential Backoff And
      Jitter").
    - ``retry_hints``: ``"ignore"`` (default) or ``"honor"`` (D10: never retry before the
      server's retry hint; a hint above ``max_hint_wait_ms`` ends the chain at once).
    - ``max_hint_wait_ms``: the longest server-requested wait that is waited out, in ms
      (default 60 000).
    - ``max_elapsed_ms``: deadline of a chain in ms from the failure that started it, or
      ``None`` (default; D11).
    - ``after_output``: ``"retry"`` (default) or ``"stop"`` (D12: never replay a turn that
      streamed text).
    - ``unknown``: ``"never"`` (default) or ``"once"``: an error whose text has no status, no
      typed code and matches no rule (family ``unknown``) is fatal, or gets one retry after the
      base delay (docs/policy.md §1; the ``resilient`` profile's value).
    - ``budget``: a :class:`BudgetSettings` (the shared retry budget, §9), or ``None`` (off).
    - ``pacing``: a :class:`PacingSettings` (the fleet's pacing, docs/fleet.md), or ``None``
      (off, the default).

    Construction validates every field and raises :class:`SettingsError` naming the key and
    the value; a ``RetrySettings`` that exists is always valid.
    """

    enabled: bool = True
    max_retries: int = 3
    base_delay_ms: int = 2000
    max_delay_ms: int | None = None
    jitter: str = "none"
    retry_hints: str = "ignore"
    max_hint_wait_ms: int = 60_000
    max_elapsed_ms: int | None = None
    after_output: str = "retry"
    unknown: str = "never"
    budget: BudgetSettings | None = None
    pacing: PacingSettings | None = None
    profile: str = "seed"  # the profile these settings started from (``retry.profile``)
    # docs/policy.md §13 (validated by _check_section_13)
    first_token_timeout_ms: int | None = None
    idle_timeout_ms: int | None = None
    attempt_timeout_ms: int | None = None
    fallback_models: tuple[str, ...] = ()
    fallback_on: tuple[str, ...] = DEFAULT_FALLBACK_ON
    fallback_after: int = 2
    fallback_revert_ms: int = 300_000
    wait_for_usage_reset: bool = False
    providers: "tuple[tuple[str, Mapping[str, Any]], ...]" = ()

    # ---- the settings machinery (not a setting): keep these two last -----------------------
    set_keys: frozenset[str] = field(default=frozenset(), compare=False, repr=False)
    """snake_case names of the fields the user set (see :meth:`is_set`)."""
    ignored_keys: tuple[str, ...] = field(default=(), compare=False, repr=False)
    """The original's keys that were given and ignored, dotted (``("retry.provider",)``)."""

    def __post_init__(self) -> None:
        _check_section_13(self)
        if not isinstance(self.enabled, bool):
            raise SettingsError("enabled", self.enabled, "true or false")
        object.__setattr__(self, "max_retries",
                           _check_int("maxRetries", self.max_retries, 0, MAX_RETRIES_LIMIT))
        object.__setattr__(self, "base_delay_ms",
                           _check_int("baseDelayMs", self.base_delay_ms, 0, MAX_DELAY_LIMIT_MS))
        if self.max_delay_ms is not None:
            object.__setattr__(self, "max_delay_ms",
                               _check_int("maxDelayMs", self.max_delay_ms, 0, MAX_DELAY_LIMIT_MS))
        if self.jitter not in JITTER_MODES:
            raise SettingsError("jitter", self.jitter, 'one of "none", "full", "equal"')
        if self.retry_hints not in RETRY_HINT_MODES:
            raise SettingsError("retryHints", self.retry_hints, 'one of "ignore", "honor"')
        object.__setattr__(self, "max_hint_wait_ms",
                           _check_int("maxHintWaitMs", self.max_hint_wait_ms, 0, MAX_DELAY_LIMIT_MS))
        if self.max_elapsed_ms is not None:
            object.__setattr__(self, "max_elapsed_ms",
                               _check_int("maxElapsedMs", self.max_elapsed_ms, 0, 7 * MAX_DELAY_LIMIT_MS))
        if self.after_output not in AFTER_OUTPUT_MODES:
            raise SettingsError("afterOutput", self.after_output, 'one of "retry", "stop"')
        if not isinstance(self.unknown, str) or self.unknown not in UNKNOWN_MODES:
            raise SettingsError("unknown", self.unknown, 'one of "never", "once"')
        object.__setattr__(self, "budget", BudgetSettings.from_json(
            self.budget.to_json() if isinstance(self.budget, BudgetSettings) else self.budget))
        if self.profile not in PROFILES:
            raise SettingsError("profile", self.profile,
                                "one of " + ", ".join(f'"{p}"' for p in PROFILES))
        object.__setattr__(self, "pacing", PacingSettings.from_json(
            self.pacing.to_json() if isinstance(self.pacing, PacingSettings) else self.pacing))
        self._apply_profile()
        # A field counts as set when the caller named it (set_keys, a mapping's keys) or when it
        # differs from its default (a Python caller's RetrySettings(max_retries=5)).
        names = {f.name for f in fields(self) if f.name not in _MACHINERY}
        given = frozenset(self.set_keys)
        strange = sorted(given - names)
        if strange:
            raise SettingsError.unknown_key(strange[0], sorted(_KEYS), "set_keys:")
        differs = {f.name for f in fields(self) if f.name in names and getattr(self, f.name) != f.default}
        object.__setattr__(self, "set_keys", given | differs)
        object.__setattr__(self, "ignored_keys", tuple(self.ignored_keys))

    def _apply_profile(self) -> None:
        """``RetrySettings(profile="resilient", ...)`` from Python gets the profile's values
        too (as ``retry.profile`` in a file does): each key the caller did not name in
        ``set_keys`` and left at its default takes the profile's value (profile < the keys
        the caller gives, docs/policy.md §1)."""
        values = PROFILES.get(self.profile) or {}
        if not values:
            return
        defaults = {f.name: f.default for f in fields(self)}
        given = frozenset(self.set_keys)
        for key, value in values.items():
            name = _KEYS[key]
            if name in given or getattr(self, name) != defaults[name]:
                continue
            if name == "budget":
                value = BudgetSettings.from_json(value)
            elif name == "pacing":
                value = PacingSettings.from_json(value)
            object.__setattr__(self, name, value)

    def is_set(self, key: str) -> bool:
        """Whether the user set ``key`` (snake_case ``max_retries`` or camelCase ``maxRetries``)
        rather than leaving it to its default: named in a mapping or file (even with the
        default's value), or given a value other than the default. ``SettingsError`` for a key
        that is no setting."""
        name = _KEYS.get(key, key)
        if name not in {f.name for f in fields(self)} or name in _MACHINERY:
            raise SettingsError.unknown_key(key, sorted(_KEYS))
        return name in self.set_keys

    @property
    def has_stall_watchdog(self) -> bool:
        """``firstTokenTimeoutMs`` or ``idleTimeoutMs`` is set (docs/policy.md §13.1)."""
        return self.first_token_timeout_ms is not None or self.idle_timeout_ms is not None

    def for_provider(self, provider: str | None, model: str | None = None) -> "RetrySettings":
        """The settings for one request to ``provider`` / ``model`` (docs/policy.md §13.4).

        Precedence: these settings < ``providers["provider"]`` < ``providers["provider/model"]``
        (the most specific entry wins, key by key). The result keeps ``providers``, so it can be
        resolved again. ``provider`` None (unknown) gives these settings unchanged.
        """
        if not self.providers or not provider:
            return self
        entries = dict(self.providers)
        fields: dict[str, Any] = {}
        for key in (provider, f"{provider}/{model}" if model else None):
            if key is not None and key in entries:
                fields.update((_KEYS[k], v) for k, v in entries[key].items())
        return replace(self, **fields) if fields else self

    @property
    def admits_first_requests(self) -> bool:
        """A chain's first request is admitted through the coordinator (a known cooldown
        delays it or refuses it, the pacer gives it a slot): the ``resilient`` profile
        (docs/fleet.md "First requests"). Under ``seed`` cooldowns never touch a first
        request (docs/policy.md §8b)."""
        return self.profile == "resilient"

    @property
    def honors_hints(self) -> bool:
        """``retryHints`` is ``"honor"`` (D10)."""
        return self.retry_hints == "honor"

    @property
    def needs_coordinator(self) -> bool:
        """Hints honoured, a retry budget, or pacing on: the settings a host asks the fleet's
        coordinator for (docs/fleet.md); without them a call that succeeds at once has nothing
        to ask before it nor to tell after it."""
        return (self.retry_hints == "honor" or self.budget is not None
                or (self.pacing is not None and self.pacing.enabled))

    def with_enabled(self, enabled: bool) -> "RetrySettings":
        """A copy with ``enabled`` changed (validated) and counted as set."""
        return replace(self, enabled=enabled, set_keys=self.set_keys | {"enabled"})

    def nominal_delay_ms(self, attempt: int) -> int:
        """``base_delay_ms × 2^(attempt−1)``, capped by ``max_delay_ms`` (ms, no jitter).

        ``attempt`` is 1-based; raises ``ValueError`` for ``attempt < 1``.
        """
        if attempt < 1:
            raise ValueError(f"attempt is 1-based, got {attempt}")
        delay = self.base_delay_ms << (attempt - 1)
        cap = MAX_DELAY_LIMIT_MS if self.max_delay_ms is None else self.max_delay_ms
        return delay if delay < cap else cap

    def hinted_delay_ms(self, wait_ms: int, random: Callable[[], float] = _random.random) -> int:
        """A delay that comes from a server hint or a shared cooldown of ``wait_ms`` ms.

        With jitter on, positive-only jitter (up to +20 %) is added, so no retry goes out
        before the server's time (docs/policy.md §1); with ``jitter: "none"`` it is ``wait_ms``.
        """
        if self.jitter == "none" or wait_ms <= 0:
            return max(0, wait_ms)
        return wait_ms + int(wait_ms * HINT_JITTER * random())

    def backoff_ms(self, attempt: int, random: Callable[[], float] = _random.random) -> int:
        """The backoff before retry ``attempt`` in ms, with the jitter mode applied.

        ``random`` returns a float in [0, 1); inject it for deterministic tests.
        """
        delay = self.nominal_delay_ms(attempt)
        if self.jitter == "none" or delay == 0:
            return delay
        if self.jitter == "full":
            return int(delay * random())
        half = delay / 2
        return int(half + half * random())

    def to_json(self) -> dict[str, Any]:
        """The ``retry`` object of the settings file (camelCase keys)."""
        return {"enabled": self.enabled, "maxRetries": self.max_retries,
                "baseDelayMs": self.base_delay_ms, "maxDelayMs": self.max_delay_ms,
                "jitter": self.jitter, "retryHints": self.retry_hints,
                "maxHintWaitMs": self.max_hint_wait_ms, "maxElapsedMs": self.max_elapsed_ms,
                "afterOutput": self.after_output,
                "unknown": self.unknown,
                "budget": self.budget.to_json() if self.budget is not None else None,
                "pacing": self.pacing.to_json() if self.pacing is not None else None,
                "profile": self.profile,
                "firstTokenTimeoutMs": self.first_token_timeout_ms,
                "idleTimeoutMs": self.idle_timeout_ms,
                "attemptTimeoutMs": self.attempt_timeout_ms,
                "fallbackModels": list(self.fallback_models),
                "fallbackOn": list(self.fallback_on),
                "fallbackAfter": self.fallback_after,
                "fallbackRevertMs": self.fallback_revert_ms,
                "waitForUsageReset": self.wait_for_usage_reset,
                "providers": {key: dict(entry) for key, entry in self.providers}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, base: "RetrySettings | None" = None,
                  require_retry: bool = True) -> "RetrySettings":
        """Load from the settings-file shape ``{"retry": {...}}`` (camelCase keys).

        Missing keys keep the value of ``base`` (the defaults when ``base`` is None); the keys
        given count as set (:meth:`is_set`). Raises :class:`SettingsError` for a bad value or an
        unknown key at any depth (naming the nearest known key: ``retry.maxRetires: unknown key;
        did you mean retry.maxRetries?``, ``retry.providers["openai"].maxRetires: unknown key;
        did you mean retry.providers["openai"].maxRetries?``); nothing is half-applied.

        The top level (docs/policy.md §1):

        - a near-miss of the ``retry`` group holding an object (``rety``, ``retries``,
          ``Retry``…) raises (``rety: unknown key; did you mean retry?``), and so does a retry
          key written at the top level;
        - an object with no ``retry`` group raises, unless ``require_retry`` is False (the
          commands read a settings file shared with other programs, where a missing group
          means the defaults);
        - other top-level groups belong to other programs: not read, and named once in a
          :class:`UserWarning` (``ignoring keys this project does not use: theme``, the line
          the commands print).

        The original's own keys (:data:`ORIGINAL_RETRY_KEYS`) are ignored, listed in
        :attr:`ignored_keys` and named once in a :class:`UserWarning`.
        """
        return cls._from_file(data, base=base, require_retry=require_retry, stacklevel=4)

    @classmethod
    def _from_file(cls, data: Any, *, base: "RetrySettings | None", require_retry: bool,
                   stacklevel: int) -> "RetrySettings":
        """:meth:`from_json`, with the ``stacklevel`` of its warnings."""
        if not isinstance(data, Mapping):
            raise SettingsError("", data, "a JSON object at the top level")
        flat = sorted(str(k) for k in data if k in _KEYS or k in ORIGINAL_RETRY_KEYS)
        if flat:
            raise SettingsError("", flat[0], 'the retry keys inside "retry" ({"retry": {"'
                                + _clip(flat[0], 40) + '": ...}}), not at the top level')
        near = sorted(str(k) for k, v in data.items()
                      if k != "retry" and _near_retry_group(k) and (v is None or isinstance(v, Mapping)))
        if near:
            raise SettingsError(near[0], None, "", suggestion="retry", unknown=True, top_level=True)
        if "retry" not in data and require_retry:
            raise SettingsError("", data, 'an object with a "retry" group ({"retry": {"maxRetries": '
                                '5}}, or RetrySettings() for the defaults)')
        retry = data.get("retry", {})
        if retry is None:
            retry = {}
        result = cls._from_retry(retry, base=base, stacklevel=stacklevel)
        unused = [str(k) for k in data if k != "retry"]
        if unused:  # after the retry group is known good: nothing is said about a refused file
            warnings.warn(IGNORED_GROUPS_WARNING + _clip(", ".join(_clip(k, 60) for k in sorted(unused)), 300),
                          UserWarning, stacklevel=stacklevel - 1)
        return result

    @classmethod
    def _from_retry(cls, retry: Any, *, base: "RetrySettings | None", stacklevel: int) -> "RetrySettings":
        """The inner ``retry`` object (camelCase keys) over ``base``; see :meth:`from_json`."""
        if not isinstance(retry, Mapping):
            raise SettingsError("", retry, "an object under \"retry\"")
        for key in retry:
            if key not in _KEYS and key not in ORIGINAL_RETRY_KEYS and key != "profile":
                raise SettingsError.unknown_key(str(key), [*_KEYS, "profile"])
        ignored = tuple(f"retry.{k}" for k in ORIGINAL_RETRY_KEYS if k in retry)
        given = {_KEYS[k]: v for k, v in retry.items() if k in _KEYS}
        start = base or (_default_settings() if cls is RetrySettings else cls())
        if "profile" in retry:  # profile < top-level keys (docs/policy.md §1, "Profiles")
            start = profile_settings(retry["profile"], base=start)
        result = replace(start, **given, set_keys=start.set_keys | given.keys(),
                         ignored_keys=tuple(dict.fromkeys(start.ignored_keys + ignored)))
        if ignored:
            warnings.warn(f"retry settings: ignoring the original's own keys {', '.join(ignored)} "
                          "(this project is the only retry layer)", UserWarning, stacklevel=stacklevel)
        return result

    @classmethod
    def coerce(cls, settings: "RetrySettings | Mapping[str, Any] | None") -> "RetrySettings | None":
        """A host's ``settings=`` argument as settings: a ``RetrySettings`` as is, None as None
        (the host's defaults), a mapping in the file's shape ``{"retry": {...}}`` or the inner
        object ``{"maxRetries": 5, "retryHints": "honor"}`` (camelCase: a snake_case key raises
        :class:`SettingsError` suggesting the camelCase one). ``TypeError`` for anything else."""
        if settings is None or isinstance(settings, RetrySettings):
            return settings
        if isinstance(settings, Mapping):
            # A plain dict of JSON values is parsed once per content (a host that is given the
            # same dict on every call: ``fsm.retrying(fn, settings={...})``); the cache is keyed
            # on a frozen copy of the content, never on the dict's identity, so a dict the
            # caller mutates afterwards is parsed again (:func:`_content_key`).
            key = _content_key(settings) if type(settings) is dict else None
            if key is not None:
                parsed = _PARSED.get(key)
                if parsed is not None and parsed.__class__ is cls:
                    return parsed
            if "retry" in settings or any(_near_retry_group(k) and (v is None or isinstance(v, Mapping))
                                          for k, v in settings.items() if k not in _KEYS):
                result = cls._from_file(settings, base=None, require_retry=True, stacklevel=4)
                quiet = len(settings) == 1  # only the retry group: no group of another program
            else:
                result = cls._from_retry(settings, base=None, stacklevel=3)
                quiet = True
            if key is not None and quiet and not result.ignored_keys:
                # only a parse that warned about nothing is remembered (a warning is said each time)
                if len(_PARSED) >= _PARSED_LIMIT:
                    _PARSED.clear()
                _PARSED[key] = result
            return result
        raise TypeError(f"settings must be RetrySettings or a mapping of retry keys such as "
                        f"{{'maxRetries': 5}} (or {{'retry': {{...}}}}), got {type(settings).__name__}")


@functools.cache
def _default_settings() -> "RetrySettings":
    """``RetrySettings()``, built once: it is immutable, and a mapping's keys are applied over
    it (:meth:`RetrySettings._from_retry`)."""
    return RetrySettings()


_PARSED: "dict[Any, RetrySettings]" = {}
""":meth:`RetrySettings.coerce`'s parsed mappings, keyed by :func:`_content_key` (at most
:data:`_PARSED_LIMIT`; emptied when full). The values are immutable, so they are shared."""
_PARSED_LIMIT = 256
_ATOMS = frozenset({str, int, bool, type(None)})
_KEY_DEPTH = 8  # the deepest settings: {"retry": {"providers": {"openai": {"budget": {...}}}}}


def _content_key(value: Any, depth: int = 0) -> Any:
    """A hashable key that equals another's only for the same content, types included
    (``1``, ``1.0`` and ``True`` differ; a float by its exact bits), of a value made of dicts,
    lists, tuples, str, int, float, bool and None, at most :data:`_KEY_DEPTH` deep; None for
    anything else (a value that is not cached: another mapping, an object whose equality is
    its own, a deeper or self-containing value)."""
    kind = type(value)
    if kind in _ATOMS:
        return (kind, value)
    if kind is float:
        return (kind, value.hex())
    if depth >= _KEY_DEPTH:
        return None
    if kind is dict:
        items = []
        for k, v in value.items():
            fk, fv = _content_key(k, depth + 1), _content_key(v, depth + 1)
            if fk is None or fv is None:
                return None
            items.append((fk, fv))
        return (kind, tuple(items))
    if kind is list or kind is tuple:
        out = []
        for v in value:
            fv = _content_key(v, depth + 1)
            if fv is None:
                return None
            out.append(fv)
        return (kind, tuple(out))
    return None


# ---------------------------------------------------------------------------- docs/policy.md §13
# The failures of 2026: stall watchdog, attempt timeout, model fallback, per-provider policy,
# usage windows. All off (or empty) by default: the seed's behaviour.

MAX_FALLBACK_MODELS = 10
_TOP_LEVEL_ONLY = ("providers", "profile")


def _check_timeout(key: str, value: Any) -> int | None:
    if value is None:
        return None
    return _check_int(key, value, 1, MAX_DELAY_LIMIT_MS)


def _check_names(key: str, value: Any, what: str) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise SettingsError(key, value, f"a list of {what}")
    for item in value:
        if not isinstance(item, str) or not item.strip() or item != item.strip():
            raise SettingsError(key, item, f"a list of {what} (non-empty strings without "
                                           "surrounding spaces)")
    if len(set(value)) != len(value):
        twice = next(v for i, v in enumerate(value) if v in value[:i])
        raise SettingsError(key, twice, f"a list of {what}, each once")
    return tuple(value)


def _check_section_13(s: "RetrySettings") -> None:
    """Validate the §13 fields of ``s`` in place (normalising lists to tuples)."""
    from fsm.core.classify import FAMILIES  # the closed set of families (docs/policy.md §13.6)

    set_ = object.__setattr__
    set_(s, "first_token_timeout_ms", _check_timeout("firstTokenTimeoutMs", s.first_token_timeout_ms))
    set_(s, "idle_timeout_ms", _check_timeout("idleTimeoutMs", s.idle_timeout_ms))
    set_(s, "attempt_timeout_ms", _check_timeout("attemptTimeoutMs", s.attempt_timeout_ms))
    models = _check_names("fallbackModels", s.fallback_models, 'models ("model" or "provider/model")')
    if len(models) > MAX_FALLBACK_MODELS:
        raise SettingsError("fallbackModels", list(models),
                            f"at most {MAX_FALLBACK_MODELS} fallback models")
    set_(s, "fallback_models", models)
    on = _check_names("fallbackOn", s.fallback_on, "failure families")
    for family in on:
        if family not in FAMILIES or family in ("none", "other"):
            raise SettingsError("fallbackOn", family, "failure families, each one of "
                                + ", ".join(f for f in FAMILIES if f not in ("none", "other")))
    set_(s, "fallback_on", on)
    set_(s, "fallback_after", _check_int("fallbackAfter", s.fallback_after, 1, MAX_RETRIES_LIMIT))
    set_(s, "fallback_revert_ms", _check_int("fallbackRevertMs", s.fallback_revert_ms, 0,
                                             7 * MAX_DELAY_LIMIT_MS))
    if not isinstance(s.wait_for_usage_reset, bool):
        raise SettingsError("waitForUsageReset", s.wait_for_usage_reset, "true or false")
    set_(s, "providers", _check_providers(s.providers))


def _check_providers(value: Any) -> "tuple[tuple[str, Mapping[str, Any]], ...]":
    """``retry.providers``: ``{"provider" or "provider/model": {retry keys}}`` -> sorted pairs.

    Each entry is validated by applying it to the defaults, so a bad value is named as
    ``retry.providers["openai"].maxRetries``; ``providers`` and ``profile`` are refused inside
    an entry (they are top-level keys only, docs/policy.md §13.4).
    """
    if value is None:
        return ()
    if isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in value):
        value = dict(value)
    if not isinstance(value, Mapping):
        raise SettingsError("providers", value, 'an object {"provider" or "provider/model": {...}}')
    out = []
    for key, entry in value.items():
        where = f'providers["{key}"]'
        if not isinstance(key, str) or not key.strip() or key.startswith("/") or key.endswith("/"):
            raise SettingsError("providers", key, 'keys "provider" or "provider/model"')
        if not isinstance(entry, Mapping):
            raise SettingsError(where, entry, "an object of retry settings")
        fields = {}
        for k, v in entry.items():
            if k in _TOP_LEVEL_ONLY:
                raise SettingsError(f"{where}.{k}", v, f"no {k} here: {k} is a top-level key only")
            if k not in _KEYS:
                raise SettingsError.unknown_key(str(k), [key for key in _KEYS if key not in _TOP_LEVEL_ONLY],
                                                where + ".")
            fields[_KEYS[k]] = v
        try:
            applied = RetrySettings(**fields)
        except SettingsError as exc:
            raise SettingsError(f"{where}.{exc.key}", exc.value, exc.expected, unknown=exc.unknown,
                                suggestion=None if exc.suggestion is None else f"{where}.{exc.suggestion}"
                                ) from None
        normal = {k: getattr(applied, _KEYS[k]) for k in entry}
        out.append((key, _FrozenEntry(normal)))
    return tuple(sorted(out))


class _FrozenEntry(dict[str, Any]):
    """A read-only ``providers`` entry (camelCase key -> validated value)."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a providers entry is read-only; build new RetrySettings instead")

    __setitem__ = __delitem__ = __ior__ = update = pop = popitem = clear = setdefault = _refuse  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted((k, repr(v)) for k, v in self.items())))


# -- profiles (sim) ----------------------------------------------------------------------------

__all__ += ["PROFILES", "profile_settings"]

PROFILES: dict[str, dict[str, Any]] = {
    "seed": {},
    "resilient": {
        "retryHints": "honor",
        "maxHintWaitMs": 60_000,
        "jitter": "full",
        "baseDelayMs": 1_000,
        "maxDelayMs": 30_000,
        "maxElapsedMs": 600_000,
        "maxRetries": 100,
        "afterOutput": "retry",
        # unknown text (no status, no typed code, no rule) gets one retry (docs/policy.md §1)
        "unknown": "once",
        # the stall watchdog is on, a usage limit is not waited out (docs/policy.md §1)
        "idleTimeoutMs": 300_000,
        "waitForUsageReset": False,
        # a retry the budget cannot afford waits (gRPC's bucket, Linkerd's floor: §14b.4)
        "budget": {"maxTokens": 100, "tokenRatio": 0.1, "mode": "wait", "minRetriesPerSecond": 10},
        # every request takes the fleet's pacer's slot (§14b.5; docs/fleet.md "Pacing")
        "pacing": {},
    },
}
"""``retry.profile``: named sets of values under the keys the user sets (docs/policy.md §1,
"Profiles"). ``"seed"`` (the default) is the reference behaviour; ``"resilient"`` bounds a chain
by time rather than by count, honours hints with upward jitter and admits first requests through the
coordinator (docs/fleet.md "First requests"), waits for the retry budget instead of ending a
chain, and paces every request through the fleet's pacer; the stall watchdog is on."""


def profile_settings(name: Any, *, base: "RetrySettings | None" = None) -> "RetrySettings":
    """The settings of profile ``name`` on top of ``base`` (the defaults when None).

    Raises :class:`SettingsError` naming ``retry.profile`` for an unknown name.
    """
    if not isinstance(name, str) or name not in PROFILES:
        raise SettingsError("profile", name, "one of " + ", ".join(f'"{p}"' for p in PROFILES))
    fields = {_KEYS[k]: v for k, v in PROFILES[name].items()}
    return replace(base or RetrySettings(), profile=name, **fields)
