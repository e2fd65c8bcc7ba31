"""The policy a review diagram draws, in numbers and words: its legend card.

:func:`policy_card` turns :class:`fsm.core.settings.RetrySettings` (the defaults, or a team's
settings file read by ``python -m fsm diagrams --settings FILE``) and the classifier's rule
tables (:mod:`fsm.core.classify`) into :class:`PolicyCard`, lines of plain text any renderer
can lay out:

- the settings in effect: retries, the backoff (``3 retries, 2 s doubling: 2 s, 4 s, 8 s``),
  the cap and jitter, the retry-hint mode, the fallback models when ``retry.fallbackModels``
  is set (docs/policy.md §13.3), and which optional guards are on (docs/policy.md §1,
  §3 D10–D12, §9);
- the classification families, one line per outcome and the trigger it fires
  (docs/policy.md §2; docs/classification.md lists every rule).

The card is byte-stable: no dates, no versions, declaration order.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PolicyCard", "policy_card", "seconds"]


@dataclass(frozen=True, slots=True)
class PolicyCard:
    """The legend card: ``title`` (one line), ``settings`` and ``families`` as (name, text)
    pairs in reading order."""

    title: str
    settings: tuple[tuple[str, str], ...]
    families: tuple[tuple[str, str], ...]


def seconds(ms: int) -> str:
    """``2000`` → ``2 s``, ``500`` → ``0.5 s``, ``90000`` → ``90 s`` (a reader's unit)."""
    if ms % 1000 == 0:
        return f"{ms // 1000} s"
    return f"{ms / 1000:g} s"


def _settings_lines(s) -> list[tuple[str, str]]:
    retries = s.max_retries
    delays = [seconds(s.nominal_delay_ms(a)) for a in range(1, min(retries, 5) + 1)]
    more = ", …" if retries > 5 else ""
    schedule = f"{seconds(s.base_delay_ms)} doubling" + (f": {', '.join(delays)}{more}"
                                                         if delays else "")
    cap = "no cap" if s.max_delay_ms is None else f"capped at {seconds(s.max_delay_ms)}"
    lines = [
        ("retry", f"{'on' if s.enabled else 'OFF (retry.enabled false)'}; "
                  f"{retries} {'retry' if retries == 1 else 'retries'}, {schedule} "
                  f"({cap}, jitter {s.jitter})"),
        ("hints", f"retryHints {s.retry_hints}: "
                  + ("a server's wait (retry-after, reset time) sets the delay, up to "
                     f"{seconds(s.max_hint_wait_ms)} (maxHintWaitMs)" if s.retry_hints == "honor"
                     else "the server's wait is not read; the schedule above holds")),
    ]
    if s.fallback_models:
        families = " or ".join(f.replace("_", " ") for f in s.fallback_on) or "no family"
        after = s.fallback_after
        lines.append(("fallback", f"fallbackModels {', '.join(s.fallback_models)}: after "
                      f"{after} {'failure' if after == 1 else 'failures'} in a row ({families}) "
                      "on a model, the next retry goes at once to the next model (fallback_due); "
                      f"a new prompt goes back to the first model after "
                      f"{seconds(s.fallback_revert_ms)} (fallbackRevertMs)"))
    optional = [
        ("replay_safe", s.after_output == "stop",
         "afterOutput stop: no retry after streamed output"),
        ("hint_within_wait", s.retry_hints == "honor",
         f"a wait over {seconds(s.max_hint_wait_ms)} refuses the retry"),
        ("within_deadline", s.max_elapsed_ms is not None,
         f"maxElapsedMs {seconds(s.max_elapsed_ms)}" if s.max_elapsed_ms is not None else ""),
        ("budget_allows", s.budget is not None,
         f"a shared retry budget of {s.budget.max_tokens} tokens, "
         f"{s.budget.token_ratio:g} back per success" if s.budget is not None else ""),
    ]
    on = [f"{g} ({why})" for g, flag, why in optional if flag]
    off = [g for g, flag, _ in optional if not flag]
    lines.append(("guards on", "; ".join(on) if on else "none of the optional guards"))
    if off:
        lines.append(("guards off", f"{', '.join(off)} (always true with these settings)"))
    return lines


# Outcome (the prefix of a rule id) → what it is called and the trigger it fires.
_OUTCOMES = (
    ("retryable", "retryable", "turn_failed_retryable"),
    ("overflow", "context overflow", "turn_overflowed"),
    ("fatal", "fatal", "turn_failed_fatal"),
)
_TABLES = ("OVERFLOW_RULES", "PERMANENT_RULES", "STATUS_RULES", "USAGE_LIMIT_RULES",
           "RETRYABLE_RULES", "INWORD_RULES")


def _family_lines() -> list[tuple[str, str]]:
    from fsm.core import classify

    families: dict[str, list[str]] = {prefix: [] for prefix, _, _ in _OUTCOMES}
    for table in _TABLES:
        for rule in getattr(classify, table, ()):
            prefix = rule.id.split(".", 1)[0]
            if prefix in families and rule.family not in families[prefix]:
                families[prefix].append(rule.family)
    lines = []
    for prefix, words, trigger in _OUTCOMES:
        names = [f.replace("_", " ") for f in families[prefix]]
        if prefix == "fatal":
            names.append("anything unmatched")
        lines.append((f"{words} → {trigger}", ", ".join(names)))
    lines.append(("no error → turn_succeeded / turn_aborted", "stop reason stop, length, "
                  "toolUse / aborted"))
    return lines


def policy_card(settings=None, *, source: str = "the defaults") -> PolicyCard:
    """The legend card of ``settings`` (a :class:`fsm.core.settings.RetrySettings`; default:
    the defaults); ``source`` says where they come from (a file name) in the title."""
    from fsm.core.settings import RetrySettings

    settings = RetrySettings() if settings is None else settings
    return PolicyCard(f"the policy drawn: {source}", tuple(_settings_lines(settings)),
                      tuple(_family_lines()))
