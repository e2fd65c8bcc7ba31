"""fsm.integrations.otel: retry chains as spans and metrics, checked with the OpenTelemetry SDK's in-memory
exporter and reader (no collector, no network)."""

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from fsm.integrations.otel import ATTEMPT_EVENT, SPAN_NAME, RetryTelemetry
from fsm.host.runner import RetryChainError, RetryRunner
from fsm.testing import FakeClock


@pytest.fixture
def otel():
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry = RetryTelemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)
    yield telemetry, exporter, reader
    tracer_provider.shutdown()
    meter_provider.shutdown()


def flaky(*errors):
    calls = []

    async def call():
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "ok"
    return call


async def no_sleep(seconds):
    pass


def points(reader):
    out = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for p in metric.data.data_points:
                    value = getattr(p, "value", None)
                    if value is None:
                        value = p.count
                    out.setdefault(metric.name, []).append((dict(p.attributes), value))
    return out


async def test_a_chain_is_one_span_with_one_event_per_attempt(otel):
    """A chain is one span with one event per attempt."""
    telemetry, exporter, reader = otel
    clock = FakeClock()
    runner = RetryRunner({"baseDelayMs": 10}, sleep=no_sleep, clock=clock,
                         on_event=telemetry.listener())
    await runner.run(flaky(ConnectionResetError("reset by peer"), RuntimeError("503 Service Unavailable")))
    (span,) = exporter.get_finished_spans()
    assert span.name == SPAN_NAME and span.status.status_code == StatusCode.OK
    assert span.attributes["retry.end_reason"] == "succeeded"
    assert span.attributes["retry.attempts"] == 2 and span.attributes["retry.max_attempts"] == 3
    assert span.attributes["retry.rule"] == "retryable.connection"
    assert [e.name for e in span.events] == [ATTEMPT_EVENT, ATTEMPT_EVENT]
    first, second = (dict(e.attributes) for e in span.events)
    assert first == {"attempt": 1, "rule": "retryable.connection", "delayMs": 10,
                     "delaySource": "backoff", "discardsOutput": False,
                     "retryAt": FakeClock.EPOCH_MS + 10}
    assert second["attempt"] == 2 and second["delayMs"] == 20
    assert not any("reset by peer" in str(v) for e in span.events for v in e.attributes.values())
    metrics = points(reader)
    assert sum(v for _, v in metrics["retry_fsm.retries"]) == 2
    assert metrics["retry_fsm.chains"] == [({"end_reason": "succeeded", "success": True}, 1)]
    assert sum(v for _, v in metrics["retry_fsm.retry_delay"]) == 2


async def test_an_exhausted_chain_and_a_refusal_at_rest_are_error_spans(otel):
    """An exhausted chain and a refusal at rest are error spans."""
    telemetry, exporter, reader = otel
    with pytest.raises(RetryChainError):
        await RetryRunner({"maxRetries": 1, "baseDelayMs": 0}, sleep=no_sleep,
                          on_event=telemetry.listener()).run(
            flaky(*[ConnectionResetError("reset by peer")] * 2))
    with pytest.raises(ConnectionResetError):  # a refusal at rest: the caller's exception
        await RetryRunner({"maxRetries": 0}, on_event=telemetry).run(
            flaky(ConnectionResetError("reset by peer")))
    exhausted, refused = exporter.get_finished_spans()
    assert exhausted.status.status_code == StatusCode.ERROR
    assert exhausted.status.description == "exhausted" and len(exhausted.events) == 1
    assert refused.attributes["retry.attempts"] == 0 and refused.events == ()
    reasons = sorted(v for a, v in points(reader)["retry_fsm.chains"])
    assert reasons == [2]  # both chains ended "exhausted", counted under one attribute set


async def test_one_listener_per_host_keeps_chains_apart(otel):
    """One listener per host keeps chains apart."""
    telemetry, exporter, _ = otel
    a, b = telemetry.listener(), telemetry.listener()
    start = {"type": "auto_retry_start", "attempt": 1, "maxAttempts": 3, "delayMs": 5,
             "chainId": 1, "rule": "retryable.status_529", "delaySource": "backoff"}
    a(start)
    b(start)
    b({"type": "auto_retry_end", "success": False, "attempt": 1, "endReason": "cancelled",
       "chainId": 1})
    a({"type": "auto_retry_end", "success": True, "attempt": 1, "endReason": "succeeded",
       "chainId": 1})
    a({"type": "agent_start"})  # other events are not the listener's business
    spans = exporter.get_finished_spans()
    assert [s.attributes["retry.end_reason"] for s in spans] == ["cancelled", "succeeded"]


async def test_concurrent_chains_through_one_transport_are_one_span_each(otel):
    """Five concurrent chains through one shared transport and one listener: five spans, each
    with its own attempts (docs/integrations.md, OpenTelemetry)."""
    import asyncio

    import httpx2
    import openai

    from fsm.integrations.httpx2 import AsyncRetryTransport
    from fsm.testing.fault_server import FaultServer
    telemetry, exporter, _ = otel
    overloaded = {"status": 529, "json": {"type": "error", "error": {"type": "overloaded_error",
                                                                     "message": "Overloaded"}}}
    transport = AsyncRetryTransport(settings={"baseDelayMs": 1, "maxDelayMs": 5, "maxRetries": 10},
                                    on_event=telemetry.listener())
    with FaultServer([overloaded] * 10) as srv:
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0,
                                    http_client=httpx2.AsyncClient(transport=transport))
        await asyncio.gather(*(client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]) for _ in range(5)))
    spans = exporter.get_finished_spans()
    assert len(spans) == 5
    assert len({s.attributes["retry.chain_id"] for s in spans}) == 5
    for span in spans:
        assert [dict(e.attributes)["attempt"] for e in span.events] == list(range(1, len(span.events) + 1))
    assert sum(len(s.events) for s in spans) == 10
