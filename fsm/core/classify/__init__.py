"""Classifying the end of a turn: ``retryable``, ``context_overflow``, ``fatal`` or ``none``.

Pure, no I/O, no clock (docs/policy.md §2). The package has three parts:

- :mod:`fsm.core.classify.rules`: the rules as data, one row per rule (id, family, pattern,
  source), and the typed error codes of the structured path;
- :mod:`fsm.core.classify.scanner`: the linear-time word-start trie regex compiler that reads a
  message once;
- :mod:`fsm.core.classify.decide`: the decision, structured facts first (HTTP status, error
  type/code, headers), then the text, in the order docs/policy.md §2 gives.

This module re-exports the public names: :func:`classify_message` (what a host calls),
:func:`classify_facts`, :func:`classify`, :class:`Classification`, :data:`FAMILIES`, the rule
tables and :data:`ERROR_CODES`.
"""

from __future__ import annotations

from fsm.core.classify.decide import (
    KINDS,
    Classification,
    Kind,
    capacity_signal_of,
    classify,
    classify_facts,
    classify_message,
    family_of,
)
from fsm.core.classify.rules import (
    ERROR_CODES,
    FAMILIES,
    FATAL_STATUSES,
    INWORD_RULES,
    OVERFLOW_RULES,
    PERMANENT_RULES,
    RETRYABLE_RULES,
    RETRYABLE_STATUSES,
    STATUS_RULES,
    USAGE_LIMIT_RULES,
    Rule,
)

__all__ = [
    "Classification",
    "ERROR_CODES",
    "FAMILIES",
    "FATAL_STATUSES",
    "INWORD_RULES",
    "KINDS",
    "Kind",
    "OVERFLOW_RULES",
    "PERMANENT_RULES",
    "RETRYABLE_RULES",
    "RETRYABLE_STATUSES",
    "Rule",
    "STATUS_RULES",
    "USAGE_LIMIT_RULES",
    "capacity_signal_of",
    "classify",
    "classify_facts",
    "classify_message",
    "family_of",
]
