"""Classifying the end of a turn: ``retryable``, ``context_overflow``, ``fatal`` or ``none``.

Pure functions, no I/O (docs/policy.md §2). :func:`classify` decides from the text alone, in a
fixed order:

1. stop reason is not ``"error"`` → ``none`` (rule ``stop_reason.not_error``);
2. no error message (``None``, empty or blank) → ``fatal`` (``error.no_message``);
3. context overflow → ``context_overflow``: a rule of :data:`OVERFLOW_RULES`, or the silent
   overflow ``usage.input + usage.cache_read > context_window`` (``overflow.silent_usage``,
   only when ``context_window > 0``). A 429 is rate limiting, never overflow: a message that
   names a 429 status, "too many requests" or throttling skips this step — unless it says that
   this one request is larger than the limit itself (``overflow.request_above_limit``);
4. permanent conditions that only look transient → ``fatal`` (:data:`PERMANENT_RULES`, **D1**):
   billing and credit exhaustion (also in Chinese), quotas whose limit is 0, invalid keys, TLS
   trust failures, a runtime out of memory… even inside a "500"/"Server Error" wrapper;
5. status markers (:data:`STATUS_RULES`): the innermost (last) HTTP status the text names
   decides — a permanent 4xx → ``fatal``, 408/429/5xx/529 → ``retryable`` — so a 400 that wraps
   an upstream 429 is retried and a 502 that wraps a 404 is not;
6. the retryable families → ``retryable`` (:data:`RETRYABLE_RULES`, :data:`USAGE_LIMIT_RULES`,
   then :data:`INWORD_RULES`; **D2** network transients, **D3** standalone status numbers);
7. anything else → ``fatal`` (``fatal.unmatched``).

:func:`classify_facts` / :func:`classify_message` put the structured facts of a failed
response first (HTTP status, error type/code, headers; precedence in their docstring), and fall
back on the same text rules, so both paths agree on what the text says.

The rules are data (:mod:`fsm.core.classify.rules`), compiled by the scanner
(:mod:`fsm.core.classify.scanner`) into one regex that reads the text once, in linear time.
Absolute hints are resolved against the ``now_ms`` the host passes and a reset time without a
zone is read in UTC unless the host passes a zone resolver (docs/policy.md §2 "Usage limits");
nothing here reads a clock or the machine's time zone.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from fsm.core.classify.rules import (
    ERROR_CODES,
    FATAL_STATUSES,
    INWORD_RULES,
    OVERFLOW_RULES,
    PERMANENT_RULES,
    RETRYABLE_RULES,
    RETRYABLE_STATUSES,
    STATUS_RULES,
    USAGE_LIMIT_RULES,
    FAMILIES,
    YIELDS_TO_HINT,
    Rule,
    family_of_rule,
    family_of_status,
)
from fsm.core.classify.scanner import HINT, OVERFLOW, PERMANENT, RETRYABLE, Anywhere, Matcher
from fsm.core.hints import (
    HINT_TRIGGERS,
    ZoneResolver,
    header_hint,
    padded_normal_form,
    parse_hint_at,
    parse_normalized_hint_ms,
    parse_retry_hint_ms,
    should_retry_header,
)
from fsm.core.messages import AssistantMessage, Usage

__all__ = ["FAMILIES", "KINDS", "Classification", "Kind", "capacity_signal_of", "classify", "classify_facts",
           "classify_message", "family_of"]

Kind = Literal["retryable", "context_overflow", "fatal", "none"]
KINDS: tuple[str, ...] = ("retryable", "context_overflow", "fatal", "none")
"""The values of :data:`Kind`."""



@dataclass(frozen=True, slots=True)
class Classification:
    """How a turn ended.

    ``kind``: one of ``"retryable"``, ``"context_overflow"``, ``"fatal"``, ``"none"``.
    ``rule``: the id of the rule that decided — a :class:`Rule` id, a structured fact
    (``"structured.status_529"``, ``"structured.code_insufficient_quota"``,
    ``"structured.type_overloaded_error"``, ``"structured.x_should_retry_false"``…, see
    :func:`classify_facts`), or one of the fixed steps ``"stop_reason.not_error"``,
    ``"error.no_message"``, ``"overflow.silent_usage"``, ``"fatal.unmatched"`` (family
    ``unknown``: no status, no typed code, no rule).
    ``usage_limit``: the message is a usage-limit error (docs/policy.md §2 "Usage limits";
    only ever true for ``retryable``). ``retry_hint_ms``: the provider's retry hint in
    milliseconds (0 … 400 days, :data:`fsm.core.hints.MAX_HINT_MS`), only for ``retryable``;
    ``None`` when the message has none. ``family``: one of the closed set :data:`FAMILIES`
    (``"overloaded"``, ``"rate_limit"``, ``"usage_limit"``, ``"server_error"``…); left out, it
    is derived from ``rule``, ``kind`` and ``usage_limit``. Raises ``ValueError`` naming a
    family outside the set.
    ``capacity_signal``: the failure says the provider has no capacity now — what teaches the
    pacer (docs/classification.md "Capacity signal", docs/fleet.md "Pacing"): a 429 rate limit,
    a 529 or overloaded, a 503 or unavailable, a connection refused or reset. False for a 500,
    a 502/504, a stall, a timeout, a connection dropped any other way, a usage-limit window and
    every verdict that is not ``retryable``. Left out (None), it is derived by
    :func:`~fsm.core.classify.decide.capacity_signal_of` from ``kind``, ``rule``, ``family`` and ``usage_limit``; the
    classifier passes it when the text decides (a ``network`` verdict whose text names a
    refused or reset connection). Always a ``bool`` once built; never true for a verdict that
    is not retryable or for a usage limit; not part of equality. The host adds what the text
    cannot say: nothing had been streamed (a reset mid-stream teaches nothing).
    """

    kind: Kind
    rule: str
    usage_limit: bool = False
    retry_hint_ms: int | None = None
    family: str = ""
    capacity_signal: bool | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.family:
            object.__setattr__(self, "family", family_of(self.kind, self.rule, self.usage_limit))
        elif self.family not in FAMILIES:
            raise ValueError(f"Classification.family: unknown family {self.family!r}; "
                             f"expected one of {', '.join(FAMILIES)}")
        derived = capacity_signal_of(self.kind, self.rule, self.family, self.usage_limit)
        if self.capacity_signal is not None:  # the classifier's word, within the same bounds
            derived = bool(self.capacity_signal) and self.kind == "retryable" and not (
                self.usage_limit or self.family == "usage_limit")
        object.__setattr__(self, "capacity_signal", derived)


_CAPACITY_FAMILIES = frozenset({"overloaded", "rate_limit"})
_UNAVAILABLE_RULES = frozenset({
    "retryable.status_503", "retryable.service_unavailable", "structured.status_503",
    "structured.inner_status_503",
    *(f"structured.{source}_{code}" for source in ("code", "type")
      for code in ("unavailable", "service_unavailable", "serviceunavailableexception")),
})
"""The rules of a retryable ``server_error`` that mean 503 / unavailable (a capacity signal)."""


def capacity_signal_of(kind: str, rule: str, family: str, usage_limit: bool = False) -> bool:
    """Whether a verdict is a capacity signal by its rule alone (docs/classification.md
    "Capacity signal"): a retryable ``overloaded`` or ``rate_limit`` verdict (529, 429,
    ``overloaded_error``, "too many requests"…), or a ``server_error`` whose rule means 503 /
    unavailable (:data:`_UNAVAILABLE_RULES`). False for a usage limit and for anything not
    ``retryable``. A refused or reset connection is told by the text (:func:`_refine`)."""
    if kind != "retryable" or usage_limit or family == "usage_limit":
        return False
    return family in _CAPACITY_FAMILIES or rule in _UNAVAILABLE_RULES


def family_of(kind: str, rule: str, usage_limit: bool = False) -> str:
    """The :data:`FAMILIES` value a verdict means by itself: ``kind``, the deciding ``rule`` id (a
    table rule, a structured fact, a fixed step) and the usage-limit flag, which outranks the
    rule's family (docs/policy.md §13.6)."""
    if kind == "none":
        return "none"
    if kind == "context_overflow":
        return "overflow"
    if usage_limit:
        return "usage_limit"
    if rule == _UNMATCHED_ID:
        return "unknown"
    family = family_of_rule(rule)
    if family is not None:
        return family
    if rule.startswith("structured."):
        name = rule[len("structured."):]
        for prefix in ("status_", "inner_status_"):
            if name.startswith(prefix) and name[len(prefix):].isdigit():
                return family_of_status(int(name[len(prefix):]))
        for prefix in ("code_", "type_"):
            if name.startswith(prefix):
                verdict = ERROR_CODES.get(name[len(prefix):])
                if verdict is not None:
                    return verdict[1]
        if name == "x_should_retry_true":
            return "server_error"
        if name == "x_should_retry_false":
            return "invalid_request"
    return "server_error" if kind == "retryable" else "other"


_UNMATCHED_ID = "fatal.unmatched"
"""The one rule id of family ``unknown``: text with no status, no typed code and no rule
(docs/policy.md §2 step 6; fatal, one retry under ``retry.unknown: "once"``). With a status or a
typed code that decides nothing, :func:`classify_facts` names the fact instead (family of the
status, or ``other``)."""


_USAGE_WINDOW_ONLY = frozenset({"fatal.payment_required", "fatal.insufficient_quota"})
"""Permanent rules that stand down only for a usage window with a stated reset (a 402 or an
insufficient_quota type whose text is a free or periodic quota that resets at a given time),
never for other retryable text with a hint (OpenAI's billing 429 stays fatal)."""

_RESET_STATED_RE = re.compile(r"(?:resets?|reset|renews?|refreshes) (?:at|on|in|after) \d"
                              r"|(?:come back|try again) (?:at|in|after|on) \d", re.ASCII)


def _states_a_reset(t: str) -> bool:
    """Whether the normal form ``t`` states when a window resets (a time or a duration), even
    one this host cannot resolve (no clock, unknown zone): the kind must not hang on the clock."""
    return _RESET_STATED_RE.search(t) is not None


_WINDOW_CODES = frozenset({"insufficient_quota", "payment_required"})
"""Typed permanent codes that stand down for a usage window with a stated reset."""

_REFINABLE = frozenset({"server_error", "retry_later", "network", "timeout", "rate_limit"})
_OVERLOADED_WORDS = re.compile(
    r"overload|over capacity|no capacity|at capacity|capacity exhausted|high demand|high traffic"
    r"|heavy (?:load|traffic)|under (?:high|heavy) load|too busy|server busy"
    r"|(?:model|service|server|system|engine|cluster)s? (?:is |are )?(?:currently |temporarily )?busy"
    r"|(?:model|engine) is (?:currently )?loading|surcharg|sobrecarg|überlastet|ausgelastet"
    r"|繁忙|过载|過負荷|混雑|과부하")
"""The overloaded family's words (docs/classification.md "Families"): any retryable 5xx, gateway,
"retry later" or rate-limit verdict whose text says so is ``overloaded``, so that
``retry.fallbackOn: ["overloaded"]`` fires for every wording of an engine at capacity."""
_OVERLOADED_NEEDLES = ("load", "capacity", "demand", "traffic", "busy", "surcharg", "sobrecarg",
                       "überlastet", "ausgelastet", "繁忙", "过载", "過負荷", "混雑", "과부하")
"""Every match of :data:`_OVERLOADED_WORDS` holds one of these (each branch of it names one):
a text without any is not searched (a few substring tests instead of a regex's scan)."""


def _may_say_overloaded(lowered: str) -> bool:
    """Whether the lower-case text holds one of :data:`_OVERLOADED_NEEDLES`."""
    for needle in _OVERLOADED_NEEDLES:
        if needle in lowered:
            return True
    return False


_REFUSED_OR_RESET_RE = re.compile(
    r"refused|conn(?:ection)?[ _-]?reset|connection (?:was |has been )?reset|reset by peer"
    r"|reset before headers|errno (?:104|111|54|61)\b|winerror 100(?:54|61)\b", re.ASCII)
"""A connection refused or reset, in lower-case text (``ECONNREFUSED``, ``[Errno 111]
Connection refused``, ``ConnectionResetError``, "reset by peer", WinError 10054/10061)."""


def _refine(result: Classification, text: str | None) -> Classification:
    """A retryable 5xx, gateway, "retry later" or rate limit whose text says the provider is
    overloaded is ``overloaded`` (OpenAI's "503 … The engine is currently overloaded", Moonshot's
    429 "The engine is currently overloaded", "high traffic"; docs/classification.md); a
    ``network`` failure whose text names a refused or reset connection is a capacity signal
    (``Connection error. (ConnectError: [Errno 111] Connection refused)``; docs/classification.md
    "Capacity signal")."""
    if result.kind != "retryable" or not text:
        return result
    lowered = text.lower()
    if (result.family in _REFINABLE and not result.usage_limit
            and _may_say_overloaded(lowered) and _OVERLOADED_WORDS.search(lowered) is not None):
        return Classification("retryable", result.rule, result.usage_limit, result.retry_hint_ms,
                              "overloaded")
    if (result.family == "network" and not result.capacity_signal
            and _REFUSED_OR_RESET_RE.search(lowered) is not None):
        return Classification("retryable", result.rule, result.usage_limit, result.retry_hint_ms,
                              "network", True)
    return result


_TRIGGER_RULE = Rule("hint.trigger", "hint", "|".join(re.escape(w) for w in HINT_TRIGGERS),
                     "fsm.core.hints.HINT_TRIGGERS: where retry hints start")
_STATUS_IDS = frozenset(rule.id for rule in STATUS_RULES)
_PEEKED_STATUS_IDS = frozenset(rule.id for rule in STATUS_RULES if rule.id.startswith("fatal."))
"""Permanent-tagged status markers: peeked like retryable rules, so they hide no later match."""
_CONDITION_IDS = frozenset(rule.id for rule in PERMANENT_RULES)
"""Permanent conditions (step 4): they outrank every status and family, in any source."""
_TAGGED = ([(OVERFLOW, r) for r in OVERFLOW_RULES] + [(PERMANENT, r) for r in PERMANENT_RULES]
           + [(PERMANENT if r.id.startswith("fatal.") else RETRYABLE, r) for r in STATUS_RULES]
           + [(RETRYABLE, r) for r in RETRYABLE_RULES + USAGE_LIMIT_RULES] + [(HINT, _TRIGGER_RULE)])
_USAGE_IDS = frozenset(rule.id for rule in USAGE_LIMIT_RULES)
# A quota's time window (per minute, per day…, also inside quota ids such as
# "GenerateRequestsPerMinutePerProjectPerModel"): "exceeded your current quota" next to one is a
# window that refills, not billing exhaustion (Gemini's free tier uses the billing wording).
# A generic RESOURCE_EXHAUSTED names no window.
_QUOTA_WINDOW_RE = re.compile(r"per[ _-]?(?:second|minute|min|hour|day)(?![a-z])|per[ _-]?(?:minute|hour|day)"
                              r"|[rt]p[smhd](?![a-z0-9_])")
_INWORD_USAGE = ("perday", "perhour")  # retryable.inword_quota_window
# A message that names a 429 (or throttling) is rate limiting, never overflow (docs/policy.md §2) ...
_GUARD_IDS = frozenset({"retryable.status_429", "retryable.too_many_requests", "retryable.throttled"})
# ... except a single request larger than the limit itself (docs/policy.md §2).
_BEATS_429 = frozenset({"overflow.request_above_limit"})
# Substrings without which no guard rule can match (checked by the tests): `in` is far cheaper
# than a regex scan, and most overflow messages have none of them.
_GUARD_NEEDLES = ("429", "too many", "too_many", "toomany", "throttl")

# The questions a scan answers, as sets of rules ("categories").
_O, _PS, _PY, _R, _U, _G, _ST = ("overflow", "strict_permanent", "yielding_permanent", "retryable",
                                 "usage", "guard", "status")


def _category_rules(category: str) -> list[tuple[int, Rule]]:
    keep: Callable[[int, Rule], bool] = {
        _O: lambda tag, rule: tag == OVERFLOW,
        _PS: lambda tag, rule: (tag == PERMANENT and rule.id not in YIELDS_TO_HINT
                                and rule.id not in _STATUS_IDS),
        _PY: lambda tag, rule: tag == PERMANENT and rule.id in YIELDS_TO_HINT,
        _R: lambda tag, rule: tag == RETRYABLE,
        _U: lambda tag, rule: tag == RETRYABLE and rule.id in _USAGE_IDS,
        _G: lambda tag, rule: tag == RETRYABLE and rule.id in _GUARD_IDS,
        _ST: lambda tag, rule: rule.id in _STATUS_IDS,
    }[category]
    return [(tag, rule) for tag, rule in _TAGGED if keep(tag, rule)]




_SUBSETS: dict[frozenset[str], Matcher] = {}


def _subset(categories: frozenset[str]) -> Matcher:
    """The matcher for a union of categories, compiled on first use (only texts with very many
    matches, or a 429 next to an overflow, need them)."""
    matcher = _SUBSETS.get(categories)
    if matcher is None:
        entries = [entry for category in sorted(categories) for entry in _category_rules(category)]
        matcher = _SUBSETS[categories] = Matcher(entries, frozenset({RETRYABLE}), _PEEKED_STATUS_IDS)
    return matcher


_ALL = Matcher(list(_TAGGED), frozenset({RETRYABLE, HINT}), _PEEKED_STATUS_IDS)
_ALL_FINDITER = _ALL.regex.finditer
# per marker group: (tag, rule, starts with a hint trigger, is a usage-limit rule, stands down
# for a hint, is a status marker)
_ALL_MARKS = tuple((tag, rule, trigger, rule.id in _USAGE_IDS, rule.id in YIELDS_TO_HINT,
                    rule.id in _STATUS_IDS)
                   for tag, rule, trigger in _ALL.marks)
_ALL_START_CHARS = _ALL.start_chars()
_MAX_MATCHES = 48  # more (adversarial repetitions): one search per open question instead
_STATUS_SCAN_LIMIT = 64  # status markers read one by one before jumping to the text's tail
_STATUS_TAIL = 8192  # characters of a long text's tail where its innermost status is looked for



_ANYWHERE_RETRYABLE = Anywhere(RETRYABLE_RULES + INWORD_RULES)
_ANYWHERE_PERMANENT = Anywhere(PERMANENT_RULES)

_Clock = tuple["float | None", "ZoneResolver | None"]
"""The host's ``(now_ms, zone)``: epoch ms of its clock (None: unknown) and its zone resolver."""

_NOT_ERROR = Classification("none", "stop_reason.not_error")
_NO_MESSAGE = Classification("fatal", "error.no_message")
_SILENT_OVERFLOW = Classification("context_overflow", "overflow.silent_usage")
_UNMATCHED = Classification("fatal", _UNMATCHED_ID)
_MODEL_OUTPUT_RULE = next(r for r in RETRYABLE_RULES if r.family == "model_output")
_MODEL_OUTPUT_RE = re.compile(_MODEL_OUTPUT_RULE.pattern)
_MODEL_OUTPUT = Classification("retryable", _MODEL_OUTPUT_RULE.id)
"""docs/policy.md §2: the provider's own model failed to produce valid output (a tool call, JSON):
retryable, family ``model_output``, even inside a 4xx (Groq's 400 ``tool_use_failed``)."""
_UNMATCHED_FACTS = Classification("fatal", "structured.unmatched")
"""A typed code or type that no table knows, with no status and no rule: family ``other``."""
_RESULT: dict[tuple[str, bool], Classification] = {}
for _tag, _rule in _TAGGED[:-1] + [(RETRYABLE, r) for r in INWORD_RULES]:
    _RESULT[_rule.id, False] = Classification(
        ("context_overflow", "fatal", "retryable")[_tag], _rule.id)
    _RESULT[_rule.id, True] = Classification("retryable", _rule.id, True)


def _names_a_quota_window(t: str) -> bool:
    return (("per" in t or "rp" in t or "tp" in t)  # C substring checks first
            and _QUOTA_WINDOW_RE.search(t) is not None)


def _names_a_429(t: str) -> bool:
    for needle in _GUARD_NEEDLES:
        if needle in t:
            return _subset(frozenset({_G})).regex.search(t) is not None
    return False


def classify(stop_reason: str, error_message: str | None, usage: Usage | None = None,
             context_window: int = 0, *, now_ms: float | None = None,
             zone: ZoneResolver | None = None) -> Classification:
    """Classify how a turn ended from its text alone (``docs/policy.md §2``; the order is in
    the module docstring). For a message that also carries structured facts (HTTP status,
    error type/code, headers) use :func:`classify_facts` or :func:`classify_message`.

    ``stop_reason``: ``"stop"``, ``"length"``, ``"toolUse"``, ``"error"`` or ``"aborted"``
    (anything but ``"error"`` gives ``none``). ``error_message``: the provider's error text as
    the SDK reported it, or ``None``; read whole, before any clipping. ``usage``: token counts
    of the failed message (for silent overflow). ``context_window``: the model's context window
    in tokens; 0 (or less) disables the silent-overflow check. ``now_ms``: the host's clock in
    epoch ms, against which absolute retry hints (an HTTP date, an epoch, "resets 3pm") are
    resolved; None: absolute hints give no hint (the classifier reads no clock). ``zone``: the
    host's :data:`fsm.core.hints.ZoneResolver` (None: named zones are unknown and a time without
    a zone is UTC).

    Returns a :class:`Classification`; never raises for a ``str`` message of any size (linear
    time: a few µs for a provider's message, tens of ms for a megabyte).
    """
    return _refine(_classify_text(stop_reason, error_message, usage, context_window, now_ms, zone),
                   error_message)


def _classify_text(stop_reason: str, error_message: str | None, usage: Usage | None,
                   context_window: int, now_ms: float | None, zone: ZoneResolver | None) -> Classification:
    """:func:`classify` before the family is refined by the text."""
    if stop_reason != "error":
        return _NOT_ERROR
    if not error_message or error_message.isspace():
        return _NO_MESSAGE
    clock: _Clock = (now_ms, zone)
    t = padded_normal_form(error_message)  # " " + the normal form
    silent = (usage is not None and context_window > 0
              and usage.input + usage.cache_read > context_window)

    permanent = retryable = status = None
    usage_limit = yielding = False
    triggers: list[int] | None = []
    if t[1:2] in _ALL_START_CHARS:
        start = _ALL.at_start(t)
        if start is not None:
            if start[0] == OVERFLOW:
                return _overflow(t, start[1], silent, clock)
            if start[1].id in _STATUS_IDS:
                status = start[1]
            else:  # pragma: no cover - the anchored permanent rules are status markers
                permanent = start[1]
    count = 0
    for m in _ALL_FINDITER(t):
        tag, rule, trigger, is_usage, yields, is_status = _ALL_MARKS[m.lastindex - 1]  # type: ignore[operator]
        if tag == RETRYABLE:
            if retryable is None:
                retryable = rule
            if is_usage:
                usage_limit = True
            elif is_status:
                status = rule
        elif tag == OVERFLOW:
            return _overflow(t, rule, silent, clock, m.start() + 1, permanent, retryable,
                             usage_limit, status)
        elif is_status:
            status = rule
        elif tag == PERMANENT and (permanent is None or (yielding and not yields)):
            permanent, yielding = rule, yields
        count += 1
        if count > _MAX_MATCHES:
            return _continue(t, m.start() + 1, silent, permanent, retryable, usage_limit, clock,
                             status=status)
        if trigger:
            triggers.append(m.start() + 1)  # type: ignore[union-attr]
    if silent:
        return _overflow(t, None, silent, clock, len(t), permanent, retryable, usage_limit, status)
    if (permanent is None and retryable is not None and not triggers and t.isascii()
            and (status is None or status.id[0] == "r")):
        # the common case, without a hint
        return _RESULT[retryable.id, usage_limit or _INWORD_USAGE[0] in t or _INWORD_USAGE[1] in t]
    if not t.isascii():
        triggers = None  # trigger words inside such scripts have no word start: search all
    return _decide(t, permanent, retryable, usage_limit, triggers, clock, status)


def _overflow(t: str, rule: Rule | None, silent: bool, clock: _Clock, pos: int = 1,
              permanent: Rule | None = None, retryable: Rule | None = None,
              usage_limit: bool = False, status: Rule | None = None) -> Classification:
    """Step 3 found an overflow rule (``rule``, at ``pos``) or a silent overflow: it decides
    unless the message names a 429 (and the rule is not one of a request larger than the limit
    itself); then steps 4-6 go on from ``pos``."""
    if (rule is not None and rule.id in _BEATS_429) or not _names_a_429(t):
        return _SILENT_OVERFLOW if rule is None else _RESULT[rule.id, False]
    if rule is None:  # a silent overflow voided: the text was scanned to the end already
        return _continue(t, len(t), False, permanent, retryable, usage_limit, clock, status=status)
    return _continue(t, pos, False, permanent, retryable, usage_limit, clock,
                     overflow_done=True, status=status)


def _continue(t: str, pos: int, silent: bool, permanent: Rule | None, retryable: Rule | None,
              usage_limit: bool, clock: _Clock, *, overflow_done: bool = False,
              status: Rule | None = None) -> Classification:
    """The rest of :func:`classify` from ``t[pos:]``, for texts with very many matches (or an
    overflow voided by a 429): one search per open question, each resuming where the last one
    stopped and each answering a question, so the text is still read about once; the
    innermost status marker is then looked for from ``pos`` (:func:`_last_status`)."""
    start_pos = pos
    open_ = set() if overflow_done else {_O}
    if permanent is None or permanent.id in YIELDS_TO_HINT:
        open_.add(_PS)
        if permanent is None:
            open_.add(_PY)
        if retryable is None:
            open_.add(_R)
        if not usage_limit:
            open_.add(_U)
    while open_:
        matcher = _subset(frozenset(open_))
        m = matcher.regex.search(t, pos)
        if m is None:
            break
        tag, rule, _ = matcher.marks[m.lastindex - 1]  # type: ignore[operator]
        pos = m.start() + 1
        if tag == OVERFLOW:
            if rule.id in _BEATS_429 or not _names_a_429(t):
                return _RESULT[rule.id, False]
            open_.discard(_O)
            silent = False
        elif tag == PERMANENT:
            if rule.id in YIELDS_TO_HINT:
                permanent = permanent or rule
                open_.discard(_PY)
            else:
                permanent = rule
                open_ -= {_PS, _PY, _R, _U}
        else:
            retryable = retryable or rule
            open_.discard(_R)
            if rule.id in _USAGE_IDS:
                usage_limit = True
                open_.discard(_U)
    if silent and not _names_a_429(t):
        return _SILENT_OVERFLOW
    status = _last_status(t, start_pos, status)
    return _decide(t, permanent, retryable, usage_limit, None, clock, status)


def _last_status(t: str, pos: int, status: Rule | None) -> Rule | None:
    """The innermost (last) status marker after ``pos``, else ``status``, for texts with very
    many matches: only their last :data:`_STATUS_TAIL` characters are read again (an error
    text kept anywhere is clipped to 8 KB, ``docs/policy.md §8b``), so the work stays bounded."""
    matcher = _subset(frozenset({_ST}))
    marks = matcher.marks
    for m in matcher.regex.finditer(t, max(pos, len(t) - _STATUS_TAIL)):
        status = marks[m.lastindex - 1][1]  # type: ignore[operator]
    return status


def _decide(t: str, permanent: Rule | None, retryable: Rule | None, usage_limit: bool,
            triggers: list[int] | None, clock: _Clock, status: Rule | None = None
            ) -> Classification:
    """Steps 4-6 once no overflow applies. ``status``: the innermost status marker;
    ``triggers``: hint trigger positions, or ``None`` to look for them in the whole text."""
    if (permanent is None or permanent.id in YIELDS_TO_HINT) and not t.isascii():
        permanent = _ANYWHERE_PERMANENT.search(t) or permanent
    hint = None
    if permanent is not None and permanent.id in _USAGE_WINDOW_ONLY:
        # a 402 / insufficient_quota that is a free or periodic quota with a stated reset
        # ("Free quota used (30 requests / 5h). Resets at 10:00 UTC") is a usage window
        if not (usage_limit and retryable is not None):
            return _RESULT[permanent.id, False]
        hint = parse_normalized_hint_ms(t, now_ms=clock[0], zone=clock[1])
        if hint is None and not _states_a_reset(t):
            return _RESULT[permanent.id, False]
        return Classification("retryable", retryable.id, True, hint)
    if permanent is not None and permanent.id not in YIELDS_TO_HINT:
        return _RESULT[permanent.id, False]
    if status is not None and status.id[0] == "f":
        if _MODEL_OUTPUT_RE.search(t) is not None:  # the model's own invalid output outranks a 4xx
            return _MODEL_OUTPUT
        return _RESULT[status.id, False]
    if retryable is None:
        retryable = _ANYWHERE_RETRYABLE.search(t)
        if retryable is not None:
            triggers = None
    if permanent is not None:  # it stands down for a retry hint or a quota window
        hint = parse_normalized_hint_ms(t, now_ms=clock[0], zone=clock[1])
        if retryable is None or (hint is None and not _names_a_quota_window(t)):
            return _RESULT[permanent.id, False]
    if retryable is None:
        return _UNMATCHED
    if not usage_limit and (_INWORD_USAGE[0] in t or _INWORD_USAGE[1] in t):
        usage_limit = True
    if hint is None:
        if triggers is None:
            hint = parse_normalized_hint_ms(t, now_ms=clock[0], zone=clock[1])
        elif triggers:
            hint = parse_hint_at(t, triggers, now_ms=clock[0], zone=clock[1])
        if hint is None:
            return _RESULT[retryable.id, usage_limit]
    return Classification("retryable", retryable.id, usage_limit, hint)


# --------------------------------------------------------------------------------------------
# Structured facts first (docs/policy.md §2 "Structured facts first", precedence §8b.8):
# overflow markers (any source) > permanent-condition markers (any source; x-should-retry: false
# among them) > x-should-retry: true >
# the innermost structured status/type (the body's code/type, then the innermost status named
# in the text) > the outer HTTP status > the text families.

_STATUS_VERDICT = {**{n: "retryable" for n in RETRYABLE_STATUSES}, **{n: "fatal" for n in FATAL_STATUSES},
                   402: "permanent", 413: "context_overflow"}
_RATE_FAMILIES = frozenset({"rate_limit", "usage_limit"})
_SIZE_REFUSALS = frozenset({"fatal.request_entity_too_large"})
"""Text rules that make an HTTP 413 a fatal request-size refusal rather than an overflow."""
_CAPACITY_STATUSES = frozenset({429, 503, 529})
"""Statuses that are a capacity signal by themselves (docs/classification.md "Capacity signal")."""
_STATUS_DIGITS = re.compile(r"[1-5][0-9][0-9]")


def _family(rule_id: str) -> str:
    rule = _RULES_BY_ID.get(rule_id)
    return rule.family if rule is not None else ""


_RULES_BY_ID = {rule.id: rule for _, rule in _TAGGED[:-1]} | {rule.id: rule for rule in INWORD_RULES}


def _text_status(t: str) -> tuple[Rule, int | None] | None:
    """The innermost status marker of the normal form ``t`` (leading space) and its number."""
    rule = None
    start = _ALL.at_start(t) if t[1:2] in _ALL_START_CHARS else None
    if start is not None and start[1].id in _STATUS_IDS:
        rule = start[1]
    matcher = _subset(frozenset({_ST}))
    last = None
    count = 0
    for m in matcher.regex.finditer(t):
        last = m
        count += 1
        if count > _STATUS_SCAN_LIMIT:
            for m in matcher.regex.finditer(t, max(m.end(), len(t) - _STATUS_TAIL)):
                last = m
            break
    if last is not None:
        rule = matcher.marks[last.lastindex - 1][1]  # type: ignore[operator]
        digits = _STATUS_DIGITS.search(t, last.start(), last.end() + 4)
        return rule, int(digits.group()) if digits else None
    if rule is not None:
        digits = _STATUS_DIGITS.match(t, 1)
        return rule, int(digits.group()) if digits else None
    return None


def classify_facts(stop_reason: str, error_message: str | None, usage: Usage | None = None,
                   context_window: int = 0, *, status: int | None = None,
                   error_type: str | None = None, error_code: str | None = None,
                   headers: Mapping[str, str] | None = None,
                   now_ms: float | None = None, zone: ZoneResolver | None = None) -> Classification:
    """Classify a turn's end from its structured facts first, then its text.

    ``status``: the HTTP status of the failed response; ``error_type`` / ``error_code``: the
    provider's error type and code (``"overloaded_error"``, ``"rate_limit_exceeded"``…, see
    :data:`ERROR_CODES`); ``headers``: the response headers with lower-case keys (hints from
    ``retry-after-ms``, ``retry-after``, ``x-ratelimit-reset*``, ``anthropic-ratelimit-*-reset``;
    the verdict of ``x-should-retry``). The other arguments are those of :func:`classify`.
    Without any fact this is :func:`classify`.

    Precedence (``docs/policy.md §2``, §8b.8): overflow markers of any source > permanent
    conditions of any source > ``x-should-retry`` > the body's typed code/type > the innermost
    status named in the text > the outer ``status`` > the text families. The rule id says which
    fact decided: ``structured.status_529``, ``structured.code_rate_limit_exceeded``,
    ``structured.type_overloaded_error``, ``structured.x_should_retry_false``, or a text rule id.
    A retryable result's hint comes from the headers (reset headers only for rate and usage
    limits, :func:`fsm.core.hints.header_hint`), else from the text.
    """
    return _refine(_classify_facts(stop_reason, error_message, usage, context_window, status=status, error_type=error_type,
                           error_code=error_code, headers=headers, now_ms=now_ms, zone=zone),
                   error_message)


def _classify_facts(stop_reason: str, error_message: str | None, usage: Usage | None = None,
                   context_window: int = 0, *, status: int | None = None,
                   error_type: str | None = None, error_code: str | None = None,
                   headers: Mapping[str, str] | None = None,
                   now_ms: float | None = None, zone: ZoneResolver | None = None) -> Classification:
    """:func:`classify_facts` before the family is refined by the text."""
    if stop_reason != "error":
        return _NOT_ERROR
    if status is None and error_type is None and error_code is None and not headers:
        return _classify_text(stop_reason, error_message, usage, context_window, now_ms, zone)
    clock: _Clock = (now_ms, zone)
    text = error_message if error_message and not error_message.isspace() else ""
    tr = _classify_text(stop_reason, text or None, usage, context_window, now_ms, zone)
    if tr.rule == "error.no_message":
        tr = _UNMATCHED
    codes = [(f"code_{c}", c) for c in (error_code,) if isinstance(c, str) and c]
    codes += [(f"type_{c}", c) for c in (error_type,) if isinstance(c, str) and c]
    typed = [(name.lower(), ERROR_CODES.get(value.lower()), value) for name, value in codes]
    outer = _STATUS_VERDICT.get(status) if status is not None else None

    # 1. overflow, any source (a 429 voids the text's unless the request itself is too large)
    for name, verdict, _ in typed:
        if verdict is not None and verdict[0] == "context_overflow":
            return Classification("context_overflow", f"structured.{name}")
    if outer == "context_overflow":
        if tr.rule in _SIZE_REFUSALS:  # a proxy's 413 page: a request-size refusal, not an overflow
            return tr
        return Classification("context_overflow", f"structured.status_{status}")
    if tr.kind == "context_overflow":
        if status != 429 or tr.rule in _BEATS_429:
            return tr
        tr = _classify_text(stop_reason, "429 " + text, None, 0, now_ms, zone)  # a 429 is rate limiting
    # 2. permanent conditions, any source
    # a 402 or an insufficient_quota type stands down only for a usage window with a stated
    # reset ("Free quota used (30 requests / 5h). Resets at 10:00 UTC"), as its text rule does
    window = (tr.kind == "retryable" and tr.usage_limit
              and (tr.retry_hint_ms is not None or _states_a_reset(padded_normal_form(text))))
    for name, verdict, value in typed:
        if verdict is not None and verdict[0] == "permanent" and not (window and value.lower() in _WINDOW_CODES):
            return Classification("fatal", f"structured.{name}")
    if outer == "permanent" and not window:
        return Classification("fatal", f"structured.status_{status}")
    verdict_header = should_retry_header(headers)
    if verdict_header is False:  # the server's own verdict: not worth retrying
        return Classification("fatal", "structured.x_should_retry_false")
    if tr.kind == "fatal" and tr.rule in _CONDITION_IDS:
        return tr
    if tr.kind == "retryable" and tr.family == "model_output":  # outranks any status (§2)
        return _retryable(tr.rule, False, tr, text, headers, clock)
    # 3. the server's own verdict: worth retrying
    if verdict_header is True:
        # the header names no condition: the status, the typed code or the text still say
        # whether the provider is out of capacity (a 529 with x-should-retry: true is one)
        capacity = (status in _CAPACITY_STATUSES or bool(tr.capacity_signal)
                    or any(v is not None and capacity_signal_of(v[0], f"structured.{n}", v[1])
                           for n, v, _ in typed))
        return _retryable(f"structured.x_should_retry_true", status == 429, tr, text, headers, clock,
                          capacity=capacity)
    # 4. the body's typed code/type (a numeric code is an inner status)
    for name, verdict, value in typed:
        if verdict is None and name.startswith("code_") and _STATUS_DIGITS.fullmatch(value):
            inner = _STATUS_VERDICT.get(int(value))
            if inner in ("retryable", "fatal"):
                verdict = (inner, "rate_limit" if value == "429" else "", "")
                name = f"inner_status_{value}"
        if verdict is None:
            continue
        kind, family, _ = verdict
        if kind == "permanent":  # stood down above for a usage window: the text decides
            continue
        if kind == "fatal":
            return Classification("fatal", f"structured.{name}")
        return _retryable(f"structured.{name}", family in _RATE_FAMILIES, tr, text, headers, clock,
                          usage_limit=kind == "usage_limit")
    # 5. the innermost status the text names (inside a wrapper), 6. the outer status
    found = _text_status(padded_normal_form(text)) if text else None
    if found is not None:
        rule, number = found
        rule_id = f"structured.status_{status}" if number is not None and number == status else rule.id
        if rule.id[0] == "f":
            return Classification("fatal", rule_id)
        return _retryable(rule_id, rule.family == "rate_limit", tr, text, headers, clock)
    # a usage limit the body states is the provider's own verdict on the account, inner to a
    # wrapper's status (LiteLLM maps Anthropic's usage-limit 400 to BadRequestError)
    if tr.kind == "retryable" and tr.usage_limit:
        return _retryable(tr.rule, True, tr, text, headers, clock)
    if outer == "fatal":
        return Classification("fatal", f"structured.status_{status}")
    if outer == "retryable":
        return _retryable(f"structured.status_{status}", status == 429, tr, text, headers, clock)
    # 7. the text families
    if tr.kind == "retryable":
        return _retryable(tr.rule, _family(tr.rule) in _RATE_FAMILIES, tr, text, headers, clock)
    if tr.rule == _UNMATCHED_ID:  # a fact was there: not unknown, the fact names the verdict
        if status is not None:
            return Classification("fatal", f"structured.status_{status}")
        if typed:
            return _UNMATCHED_FACTS
    return tr


def _retryable(rule_id: str, rate_limited: bool, tr: Classification, text: str,
               headers: Mapping[str, str] | None, clock: _Clock, *,
               usage_limit: bool = False, capacity: bool | None = None) -> Classification:
    """A retryable verdict with the usage-limit flag of the facts or the text, and the hint of
    the headers, else of the text; ``capacity``: its capacity signal when the rule id alone
    does not say it (None: derived from the rule)."""
    usage_limit = usage_limit or (tr.kind == "retryable" and tr.usage_limit)
    rate_limited = rate_limited or usage_limit or (tr.kind == "retryable" and _family(tr.rule) in _RATE_FAMILIES)
    found = header_hint(headers, rate_limited=rate_limited, now_ms=clock[0], zone=clock[1])
    if found is not None:
        hint: int | None = found.ms
    elif tr.kind == "retryable":
        hint = tr.retry_hint_ms
    else:
        hint = parse_retry_hint_ms(text, now_ms=clock[0], zone=clock[1]) if text else None
    return Classification("retryable", rule_id, usage_limit, hint, "", capacity)


def classify_message(message: AssistantMessage, context_window: int = 0, *,
                     now_ms: float | None = None, zone: ZoneResolver | None = None) -> Classification:
    """:func:`classify_facts` applied to an assistant message: its stop reason, error message,
    usage and structured facts (``status``, ``error_type``, ``error_code``, ``headers``)."""
    return classify_facts(message.stop_reason, message.error_message, message.usage, context_window,
                          status=message.status, error_type=message.error_type,
                          error_code=message.error_code, headers=message.headers, now_ms=now_ms,
                          zone=zone)
