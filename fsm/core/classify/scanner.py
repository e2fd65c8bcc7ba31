"""The scanner: rule tables compiled into one linear-time, word-start regex.

Pure, no I/O. :class:`Matcher` compiles ``(tag, rule)`` entries (tags :data:`OVERFLOW`,
:data:`PERMANENT`, :data:`RETRYABLE`, :data:`HINT`; rules of :mod:`fsm.core.classify.rules`)
into one regex whose ``finditer`` reports, in one pass over the normal form of a message, every
rule that matches at a word start; :class:`Anywhere` looks for the rules that match inside
words or in scripts written without spaces. How and why: the comment "Compiling the tables"
below. Nothing here knows what a rule means; :mod:`fsm.core.classify.decide` does.
"""

from __future__ import annotations

import re

from fsm.core.classify.rules import Rule
from fsm.core.hints import HINT_TRIGGERS, WORD_CHARS

__all__ = ["BOUNDARY", "HINT", "OVERFLOW", "PERMANENT", "RETRYABLE", "Anywhere", "Matcher",
           "alternatives", "compile_rules", "literal_prefix"]

# --------------------------------------------------------------------------------------------
# Compiling the tables
#
# Python's regex engine tries every alternative of a big alternation at every position: ~50 µs
# for a 200-character message and ~1 s for a megabyte. So the tables are compiled into one
# regex of the shape
#
#     [^a-z0-9_…](?=[<1st chars>][<2nd chars>])(?:o(?:verloaded()|…)|r(?:ate(?=[ _-]?limit)()|…)|…)
#
# - every rule matches at a word start, so the regex starts with one non-word character
#   (:data:`BOUNDARY`) and the engine skips letters and digits in C; the lookahead cheaply
#   rejects boundaries followed by a quote or a space, and one-letter words. The text gets a
#   leading space so that position 0 is a word start too; ``^``-anchored alternatives are
#   matched once, at the start, by a separate small regex. Words of scripts written without
#   spaces (Chinese) are searched separately;
# - the alternatives of every rule (a leading ``(?:a|b)`` distributed) form a trie over their
#   literal prefixes, so one character comparison rejects a whole subtree; at every branch,
#   overflow rules come first, then permanent ones, so no later step can hide them;
# - retryable rules and the hint trigger words are *peeks*: they consume their first word only
#   (the rest is a lookahead), so they never hide a match that starts at a later word;
# - each alternative ends with an empty group: ``m.lastindex`` maps back to the rule.
#
# One ``finditer`` over this regex answers every question of :func:`classify` in one pass over
# the text. Past 48 matches (adversarial repetitions) the decision (:mod:`fsm.core.classify.decide`) takes over: one
# ``search`` per question still open, each resuming where the last stopped, with smaller
# regexes built the same way on first use. Either way the text is read about once.

_SPECIAL = frozenset(".^$*+?{}[]\\|()")
# A character that may precede a word: not a letter or digit (Latin, Greek, Cyrillic, CJK,
# kana, Hangul) nor `_`. Spelled out: a class of ranges is checked faster than \W.
BOUNDARY = f"[^{WORD_CHARS}]"
OVERFLOW, PERMANENT, RETRYABLE, HINT = 0, 1, 2, 3
"""Entry tags: a rule's step. At one position of the trie, lower tags are tried first."""


def _scan(pattern: str, i: int, stop_at_bar: bool) -> int:
    """Index of the ``|`` at depth 0 (``stop_at_bar``) or of the ``)`` closing the group that
    opens at ``i``; ``len(pattern)`` when there is none."""
    depth, in_class = 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0 and not stop_at_bar:
                return i
        elif ch == "|" and depth == 0 and stop_at_bar:
            return i
        i += 1
    return i


def alternatives(pattern: str) -> list[str]:
    """Top-level alternatives of ``pattern``; a leading ``(?:a|b)rest`` becomes ``arest``,
    ``brest`` (recursively), unless a quantifier follows the group."""
    parts, start = [], 0
    while True:
        end = _scan(pattern, start, True)
        parts.append(pattern[start:end])
        if end >= len(pattern):
            break
        start = end + 1
    out: list[str] = []
    for alt in parts:
        if alt.startswith("(?:"):
            close = _scan(alt, 0, False)
            if close + 1 >= len(alt) or alt[close + 1] not in "?*+{":
                rest = alt[close + 1:]
                out.extend(a for inner in alternatives(alt[3:close]) for a in alternatives(inner + rest))
                continue
        out.append(alt)
    return out


def literal_prefix(alt: str) -> list[str]:
    """The leading literal characters of ``alt`` as regex source units (``a``, ``\\(``)."""
    units, i = [], 0
    while i < len(alt):
        if alt[i] == "\\":
            if i + 1 >= len(alt) or alt[i + 1].isalnum():
                break
            unit = alt[i:i + 2]
        elif alt[i] in _SPECIAL:
            break
        else:
            unit = alt[i]
        nxt = i + len(unit)
        if nxt < len(alt) and alt[nxt] in "?*+{":
            break  # the quantifier applies to this character
        units.append(unit)
        i = nxt
    return units


class _Trie:
    """Alternatives keyed by their literal prefix; ``rank`` orders siblings (lowest first)."""

    __slots__ = ("children", "ends", "rank")

    def __init__(self) -> None:
        self.children: dict[str, _Trie] = {}
        self.ends: list[tuple[int, str, int]] = []  # (rank, rest, owner)
        self.rank = 99

    def add(self, units: list[str], rest: str, owner: int, rank: int) -> None:
        node = self
        node.rank = min(node.rank, rank)
        for unit in units:
            node = node.children.setdefault(unit, _Trie())
            node.rank = min(node.rank, rank)
        node.ends.append((rank, rest, owner))

    def emit(self, owners: list[int]) -> str:
        parts: list[tuple[int, int, tuple[str, _Trie] | tuple[str, int]]] = []
        for order, (unit, child) in enumerate(self.children.items()):
            parts.append((child.rank, order, (unit, child)))
        for order, (rank, rest, owner) in enumerate(self.ends, len(parts)):
            parts.append((rank, order, (rest, owner)))
        parts.sort(key=lambda p: (p[0], p[1]))  # stable: by rank, then insertion order
        texts = []
        for _, _, (head, item) in parts:
            if isinstance(item, _Trie):
                texts.append(head + item.emit(owners))
            else:
                texts.append(head + "()")
                owners.append(item)
        return texts[0] if len(texts) == 1 else "(?:" + "|".join(texts) + ")"


def _char_filter(trie: _Trie) -> str:
    """A lookahead for the first two characters a match can start with: it rejects, before any
    alternative is tried, boundaries followed by a quote or a space and one-letter words.
    Conservative where an alternative's second character is not a literal."""
    if trie.ends:  # pragma: no cover - every table alternative starts with a literal
        return ""
    firsts: set[str] = set()
    seconds: set[str] = set()
    for unit, child in trie.children.items():
        firsts.add(unit[-1])
        seconds.update(u[-1] for u in child.children)
        if child.ends:
            seconds.update("0123456789" if unit[-1].isdigit() else "abcdefghijklmnopqrstuvwxyz0123456789")
    def cls(chars: set[str]) -> str:
        return "[" + "".join(re.escape(c) for c in sorted(chars)) + "]"
    return f"(?={cls(firsts)}{cls(seconds)})"


def _peek(alt: str) -> str:
    """``alt`` consuming only its first word (up to the first space of its literal prefix), the
    rest as a lookahead."""
    units = literal_prefix(alt)
    if " " in units:
        units = units[:units.index(" ")]
    head = "".join(units)
    rest = alt[len(head):]
    return head + (f"(?={rest})" if rest else "")


def _may_hide_a_trigger(literal: str) -> bool:
    """Whether an alternative whose literal prefix is ``literal`` can match where a hint
    trigger word (:data:`fsm.core.hints.HINT_TRIGGERS`) starts."""
    return any(literal.startswith(w) or w.startswith(literal) for w in HINT_TRIGGERS)


def compile_rules(entries: list[tuple[int, Rule]], peek: frozenset[int],
                  peek_ids: frozenset[str] = frozenset()) -> tuple[
        re.Pattern[str], re.Pattern[str] | None, tuple[tuple[int, Rule, bool], ...]]:
    """The scan regex for ``(tag, rule)`` entries (tags in ``peek`` as peeks), the regex of
    their ``^``-anchored alternatives (matched once, at the start), and per marker group
    (``m.lastindex - 1``, the same numbering for both) ``(tag, rule, starts_with_a_trigger)``."""
    trie = _Trie()
    anchored: list[tuple[str, int]] = []
    info: list[tuple[int, Rule, bool]] = []
    for tag, rule in entries:
        if rule.anywhere:
            continue  # looked for anywhere instead: see Anywhere
        for alt in alternatives(rule.pattern):
            if alt[:1] > "\x7f":
                continue  # a word in a script without spaces: see Anywhere
            units = literal_prefix(alt.lstrip("^"))
            literal = "".join(u[-1] for u in units)
            # where a hint may start: a trigger word, or a retryable alternative (a peek) whose
            # first word could also be the start of a trigger word ("ratelimit" in
            # "x-ratelimit-reset: 20", "retry after 30s"): at one position only one
            # alternative matches, so such a match must report the position itself
            trigger = tag == HINT or (tag == RETRYABLE and _may_hide_a_trigger(literal))
            info.append((tag, rule, trigger))
            if alt.startswith("^"):
                anchored.append((alt[1:], len(info) - 1))
                continue
            if tag in peek or (rule.id in peek_ids and RETRYABLE in peek):
                alt = _peek(alt)
            units = literal_prefix(alt)
            trie.add(units, alt[len("".join(units)):], len(info) - 1, tag)
    owners: list[int] = []
    regex = re.compile(BOUNDARY + _char_filter(trie) + trie.emit(owners))
    start = re.compile(" (?:" + "|".join(f"{alt}()" for alt, _ in anchored) + ")") if anchored else None
    if regex.groups != len(owners) or (start is not None and start.groups != len(anchored)):
        raise ValueError("rule patterns must not contain capturing groups; use (?:...)")
    marks = tuple(info[i] for i in owners)
    start_marks = tuple(info[i] for _, i in anchored)
    return regex, start, marks + start_marks




class Matcher:
    """A compiled set of rules: ``regex`` (``marks[m.lastindex - 1]`` → ``(tag, rule,
    starts_with_a_hint_trigger)``) and the ``^``-anchored alternatives (:meth:`at_start`)."""

    __slots__ = ("regex", "start", "marks", "start_marks")

    def __init__(self, entries: list[tuple[int, Rule]], peek: frozenset[int],
                 peek_ids: frozenset[str] = frozenset()) -> None:
        self.regex, self.start, marks = compile_rules(entries, peek, peek_ids)
        self.marks = marks[:self.regex.groups]
        self.start_marks = marks[self.regex.groups:]

    def at_start(self, t: str) -> tuple[int, Rule, bool] | None:
        """The ``^``-anchored rule matching at the start of ``t`` (padded with a space)."""
        m = None if self.start is None else self.start.match(t)
        return None if m is None else self.start_marks[m.lastindex - 1]  # type: ignore[operator]

    def start_chars(self) -> str:
        """The characters an anchored alternative can start with ("" when unknown)."""
        chars = set()
        for _, rule, _ in self.start_marks:
            for alt in alternatives(rule.pattern):
                if alt.startswith("^"):
                    units = literal_prefix(alt[1:])
                    if not units:  # pragma: no cover - anchored table rules start with a digit
                        return ""
                    chars.add(units[0][-1])
        return "".join(sorted(chars))



class Anywhere:
    """Rules looked for anywhere (no word start): those marked ``anywhere`` and the
    alternatives written in scripts without spaces (Chinese…), as one plain alternation.
    A plain alternation tries every alternative at every position, so it runs only when one
    of the alternatives' literal prefixes (``needles``) occurs in the text (``in`` is a C
    substring search)."""

    __slots__ = ("rules", "regex", "needles")

    def __init__(self, rules: tuple[Rule, ...]) -> None:
        kept, parts, needles = [], [], set()
        for rule in rules:
            alts = [a for a in alternatives(rule.pattern) if rule.anywhere or a[:1] > "\x7f"]
            if alts:
                kept.append(rule)
                parts.append("(?:" + "|".join(alts) + ")()")
                for alt in alts:
                    units = literal_prefix(alt)
                    if not units:  # pragma: no cover - checked by the tests
                        raise ValueError(f"{rule.id}: an anywhere alternative must start with a literal")
                    needles.add(units[0][-1] if alt[:1] > "\x7f" else "".join(u[-1] for u in units))
        self.rules = tuple(kept)
        self.regex = re.compile("|".join(parts))
        self.needles = tuple(sorted(needles))

    def search(self, t: str) -> Rule | None:
        for needle in self.needles:
            if needle in t:
                m = self.regex.search(t)
                return None if m is None else self.rules[m.lastindex - 1]  # type: ignore[operator]
        return None


