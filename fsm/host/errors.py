"""What a retry chain raises to its caller, whatever the host (docs/policy.md §10).

One module for the exceptions of the §14b.14 contract, shared by every host of the one loop
(:mod:`fsm.host.loop`): the runner, :class:`~fsm.host.chain.Chain` and the integrations on it.
They are re-exported where they always were (:mod:`fsm.host.runner`, ``fsm``).
"""

from __future__ import annotations

from contextvars import ContextVar

from fsm.core.classify import Classification
from fsm.core.messages import AssistantMessage

__all__ = ["RetryChainError", "ContextOverflowError", "AttemptTimedOut", "DeadlinePassed",
           "RETRY_OWNER", "PROGRAMMING_ERRORS"]

RETRY_OWNER: ContextVar[object | None] = ContextVar("fsm_retry_owner", default=None)
"""Set while an fsm host (the runner, a transport) owns a call: one retry owner per call — a
transport under it passes requests through instead of retrying them again (docs/integrations.md)."""

PROGRAMMING_ERRORS: tuple[type[BaseException], ...] = (
    LookupError, AttributeError, TypeError, NameError, AssertionError, ArithmeticError,
    NotImplementedError, ImportError, SyntaxError)
"""Exception classes that mean a bug in the caller's code: fatal whatever their text."""


class RetryChainError(Exception):
    """A retry chain that started (attempt ≥ 1) ended without success. A refusal at rest
    (attempt 0) re-raises the caller's own exception instead (docs/policy.md §10).

    Attributes: ``end_reason`` (the ``auto_retry_end`` ``endReason``: ``exhausted``,
    ``fatal``, ``disabled``, ``hint_too_long``, ``deadline``, ``budget``, ``output_streamed``,
    ``cancelled``…), ``attempts`` (the end event's ``attempt``: retries made in the chain, 0 for
    a refusal at rest), ``calls`` (times the callable was called), ``classification`` (the
    :class:`~fsm.core.classify.Classification` of the last failure), ``final_error`` (the end
    event's ``finalError``), ``message`` (the last failure as an assistant message). The last
    exception is ``__cause__``.
    """

    def __init__(self, end_reason: str, attempts: int, calls: int,
                 classification: Classification | None, final_error: str | None,
                 message: AssistantMessage | None) -> None:
        plural = "attempt" if attempts == 1 else "attempts"
        super().__init__(f"retry chain ended ({end_reason}) after {attempts} {plural}, "
                         f"{calls} calls: {final_error or ''}".rstrip(": "))
        self.end_reason = end_reason
        self.attempts = attempts
        self.calls = calls
        self.classification = classification
        self.final_error = final_error
        self.message = message


class DeadlinePassed(Exception):
    """The chain's deadline (``retry.maxElapsedMs``) passed while an attempt was running (or
    while the retry waited at the gate, before it was sent): the attempt was aborted and the
    chain ended ``deadline`` (docs/policy.md §13.2). The ``__cause__`` of the
    :class:`RetryChainError` the caller sees."""


class AttemptTimedOut(TimeoutError):
    """An attempt ran longer than ``retry.attemptTimeoutMs`` (docs/policy.md §13.2): a
    retryable failure (family ``timeout``), the ``__cause__`` of a chain that ends on it."""


class ContextOverflowError(Exception):
    """The request is larger than the model's context: compact and call again (never retried).

    Attributes as :class:`RetryChainError` (``end_reason`` is ``"overflow"`` inside a chain,
    None when the first call overflowed); the SDK's exception is ``__cause__``.
    """

    def __init__(self, end_reason: str | None, attempts: int, calls: int,
                 classification: Classification, message: AssistantMessage) -> None:
        super().__init__(f"context overflow ({classification.rule}): {message.error_message or ''}")
        self.end_reason = end_reason
        self.attempts = attempts
        self.calls = calls
        self.classification = classification
        self.final_error = message.error_message
        self.message = message
