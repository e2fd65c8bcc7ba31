"""OpenTelemetry for retry chains: one span per chain, one span event per attempt, metrics.

Needs ``opentelemetry-api`` (the optional extra ``retry-fsm[otel]``); without an SDK
configured every call is the API's no-op. Use it as an event listener of any host::

    import openai
    import fsm
    from fsm.integrations.otel import RetryTelemetry
    from fsm.testing import ScriptedProvider

    telemetry = RetryTelemetry()                       # global tracer / meter providers
    session = fsm.AgentSession(ScriptedProvider())
    session.subscribe(telemetry.listener())            # one listener per session
    client = openai.AsyncOpenAI(max_retries=0)
    reply = await fsm.retrying(client.chat.completions.create, model="gpt-5",  # or per runner call
                               messages=[{"role": "user", "content": "hi"}],
                               on_event=telemetry.listener())

What it records (the names of docs/policy.md §4 events):

- a span ``retry_chain`` per chain, started at its first ``auto_retry_start`` and ended at its
  ``auto_retry_end`` (a refusal at rest, ``attempt`` 0, is a span of its own that starts and
  ends at once). Attributes: ``retry.chain_id``, ``retry.rule`` (of the failure that started
  it), ``retry.max_attempts``, and at the end ``retry.end_reason``, ``retry.success``,
  ``retry.attempts``. Status ``ERROR`` (description: the end reason) unless it succeeded.
- a span event ``retry_attempt`` per ``auto_retry_start``: ``attempt``, ``rule``, ``delayMs``,
  ``delaySource``, ``retryAt`` (when known), ``discardsOutput``.
- counters ``retry_fsm.retries`` (one per scheduled retry; attributes ``rule``,
  ``delay_source``) and ``retry_fsm.chains`` (one per ended chain; ``end_reason``,
  ``success``), and a histogram ``retry_fsm.retry_delay`` (ms, ``delay_source``).

Error texts are not recorded (they may quote a credential); the rule id says what failed.
A listener keys its open spans by ``chainId``, which counts per brain: give each session (and
each concurrent runner call) its own :meth:`RetryTelemetry.listener`.
"""

from __future__ import annotations

from typing import Any, Mapping

from fsm._extras import require

trace = require("opentelemetry.trace", extra="otel", feature="fsm.integrations.otel")
metrics = require("opentelemetry.metrics", extra="otel", feature="fsm.integrations.otel")
Status, StatusCode = trace.Status, trace.StatusCode

__all__ = ["RetryTelemetry", "SPAN_NAME", "ATTEMPT_EVENT"]

SPAN_NAME = "retry_chain"
ATTEMPT_EVENT = "retry_attempt"
_SCOPE = "retry-fsm"


class RetryTelemetry:
    """The tracer and the instruments; :meth:`listener` makes one event listener per host.

    ``tracer_provider`` / ``meter_provider``: OpenTelemetry providers (None: the global ones).
    Calling the object itself is the listener of one default host.
    """

    def __init__(self, *, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        self.tracer = trace.get_tracer(_SCOPE, tracer_provider=tracer_provider)
        meter = metrics.get_meter(_SCOPE, meter_provider=meter_provider)
        self.retries = meter.create_counter("retry_fsm.retries", unit="{retry}",
                                            description="retries scheduled (auto_retry_start)")
        self.chains = meter.create_counter("retry_fsm.chains", unit="{chain}",
                                           description="retry chains ended, by end reason")
        self.delay = meter.create_histogram("retry_fsm.retry_delay", unit="ms",
                                            description="backoff before each retry")
        self._default: _Listener | None = None

    def listener(self) -> "_Listener":
        """A new listener for one host (a session, a runner call)."""
        return _Listener(self)

    def __call__(self, event: Mapping[str, Any]) -> None:
        if self._default is None:
            self._default = _Listener(self)
        self._default(event)


class _Listener:
    """Turns one host's events into spans; strictly private."""

    __slots__ = ("t", "spans")

    def __init__(self, telemetry: RetryTelemetry) -> None:
        self.t = telemetry
        self.spans: dict[Any, Any] = {}

    def __call__(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind == "auto_retry_start":
            self._start(event)
        elif kind == "auto_retry_end":
            self._end(event)

    def _start(self, event: Mapping[str, Any]) -> None:
        chain = event.get("chainId")
        rule = event.get("rule") or ""
        source = event.get("delaySource") or "backoff"
        span = self.spans.get(chain)
        if span is None:
            span = self.spans[chain] = self.t.tracer.start_span(SPAN_NAME, attributes={
                "retry.chain_id": chain if isinstance(chain, int) else 0, "retry.rule": rule,
                "retry.max_attempts": event.get("maxAttempts") or 0})
        attrs: dict[str, Any] = {"attempt": event.get("attempt") or 0, "rule": rule,
                                 "delayMs": event.get("delayMs") or 0, "delaySource": source,
                                 "discardsOutput": bool(event.get("discardsOutput"))}
        if event.get("retryAt") is not None:
            attrs["retryAt"] = event["retryAt"]
        span.add_event(ATTEMPT_EVENT, attributes=attrs)
        self.t.retries.add(1, {"rule": rule, "delay_source": source})
        self.t.delay.record(event.get("delayMs") or 0, {"delay_source": source})

    def _end(self, event: Mapping[str, Any]) -> None:
        chain = event.get("chainId")
        span = self.spans.pop(chain, None)
        if span is None:  # a refusal at rest: no start, a span of its own (with its own id)
            span = self.t.tracer.start_span(SPAN_NAME, attributes={
                "retry.chain_id": chain if isinstance(chain, int) else 0})
        reason = event.get("endReason") or ("succeeded" if event.get("success") else "exhausted")
        success = bool(event.get("success"))
        span.set_attributes({"retry.end_reason": reason, "retry.success": success,
                             "retry.attempts": event.get("attempt") or 0})
        span.set_status(Status(StatusCode.OK) if success else Status(StatusCode.ERROR, reason))
        span.end()
        self.t.chains.add(1, {"end_reason": reason, "success": success})
