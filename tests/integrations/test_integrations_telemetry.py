"""Every integration's events feed the OpenTelemetry listener: one span per chain, one span event
per attempt (the SDK's in-memory exporter; no collector)."""

from __future__ import annotations

import httpx2
import openai
import pytest
import tenacity
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fsm.integrations.httpx2 import AsyncRetryTransport
from fsm.integrations.otel import ATTEMPT_EVENT, SPAN_NAME, RetryTelemetry
from fsm.integrations.tenacity import BrainStrategy
from fsm.testing.fault_server import FaultServer

FAST = {"baseDelayMs": 1, "maxDelayMs": 5}
OVERLOADED = {"status": 529, "json": {"type": "error", "error": {"type": "overloaded_error",
                                                                 "message": "Overloaded"}}}


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield RetryTelemetry(tracer_provider=provider), exporter
    provider.shutdown()


async def test_a_transport_chain_is_one_span_with_an_event_per_attempt(spans):
    """Two 529s then success through the transport: one retry_chain span, two attempt events."""
    telemetry, exporter = spans
    with FaultServer([OVERLOADED, OVERLOADED]) as srv:
        transport = AsyncRetryTransport(settings=FAST, on_event=telemetry.listener())
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0,
                                    http_client=httpx2.AsyncClient(transport=transport))
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    (span,) = exporter.get_finished_spans()
    assert span.name == SPAN_NAME
    assert [e.name for e in span.events] == [ATTEMPT_EVENT, ATTEMPT_EVENT]
    assert span.attributes["retry.success"] is True


def test_a_tenacity_chain_is_one_span_too(spans):
    """The tenacity strategy's events make the same span."""
    telemetry, exporter = spans
    calls = []

    @tenacity.retry(**BrainStrategy(FAST, on_event=telemetry.listener()).kwargs())
    def call():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("529 Overloaded")
        return "ok"

    assert call() == "ok"
    (span,) = exporter.get_finished_spans()
    assert len(span.events) == 1 and span.attributes["retry.attempts"] == 1
