"""--span-export otlp against a real OTLP/HTTP receiver on loopback: one span per attempt, with
the trace and span ids of the traceparent header the function received, the continued
traceparent as its parent, the outcome as its status; a collector that is down holds up no run.
Off by default: without the setting no span leaves the listener."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from dispatcher.config import ConfigError, Settings
from dispatcher.tracing import trace_and_span

from .kit import Call, Running, Sink, add_schedules, mark_all_due, scalar, until

StartListener = Callable[..., Awaitable[Running]]
PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Collector:
    """An OTLP/HTTP trace receiver: every span it was sent, with its resource's attributes."""

    def __init__(self) -> None:
        self.spans: list[tuple[Span, dict[str, Any]]] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        for resource_spans in message.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend((span, resource) for span in scope_spans.spans)
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")


@pytest.fixture
async def collector(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Collector]:
    collector = Collector()
    app = web.Application()
    app.router.add_post("/v1/traces", collector.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    collector.url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # milliseconds between batches
    yield collector
    await runner.cleanup()


def attributes(span: Span) -> dict[str, Any]:
    return {a.key: (a.value.int_value if a.value.HasField("int_value") else a.value.string_value)
            for a in span.attributes}


async def test_each_attempt_is_a_span_with_the_ids_its_function_saw(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, collector: Collector,
    start_listener: StartListener
) -> None:
    add_schedules(db, 3)
    add_schedules(db, 1, function_name="flaky")
    db.execute("UPDATE dispatch.schedules SET max_attempts = 2, retry_backoff = '10 milliseconds'")
    failed: list[str] = []

    async def fail_once(request: web.Request, call: Call) -> web.StreamResponse:
        if not failed:
            failed.append(call.headers["traceparent"])
            return web.Response(status=503, text="warming up")
        return web.json_response({"ok": True})

    sink.handlers["flaky"] = fail_once
    await start_listener(span_export="otlp", worker_id="span-test")
    mark_all_due(db)
    await until(lambda: len(collector.spans) == 5, within=15, what="five spans at the collector")
    headers = {c.headers["traceparent"] for c in sink.calls}
    assert len(headers) == 5
    for span, resource in collector.spans:
        header = f"00-{span.trace_id.hex()}-{span.span_id.hex()}-01"
        assert header in headers
        assert span.kind == Span.SPAN_KIND_CLIENT and span.parent_span_id == b""
        assert span.end_time_unix_nano >= span.start_time_unix_nano
        assert resource["service.name"] == "pgdispatch-listener"
        assert resource["service.instance.id"] == "span-test"
    by_header = {f"00-{s.trace_id.hex()}-{s.span_id.hex()}-01": s for s, _ in collector.spans}
    first_try = by_header[failed[0]]
    assert first_try.status.code == Status.STATUS_CODE_ERROR
    assert attributes(first_try)["http.response.status_code"] == 503
    assert attributes(first_try)["error.type"] == "retryable"
    retried = [s for s, _ in collector.spans if s.trace_id == first_try.trace_id and s is not first_try]
    assert len(retried) == 1 and retried[0].status.code == Status.STATUS_CODE_UNSET  # one trace, two spans
    run_id = await scalar(adb, "SELECT id FROM dispatch.runs WHERE schedule_id ="
                               " (SELECT id FROM dispatch.schedules WHERE function_name = 'flaky')")
    assert attributes(retried[0])["pgdispatch.run_id"] == run_id
    assert (attributes(retried[0])["pgdispatch.attempt"], retried[0].name) == (2, "invoke flaky")


async def test_a_continued_traceparent_is_the_spans_parent(
    db: psycopg.Connection, sink: Sink, collector: Collector, start_listener: StartListener
) -> None:
    add_schedules(db, 1)
    await start_listener(span_export="otlp")
    db.execute("SELECT dispatch.run_now(id, %s) FROM dispatch.schedules", (PARENT,))
    await until(lambda: len(collector.spans) == 1, within=15, what="the span at the collector")
    (span, _), (call,) = collector.spans[0], sink.calls
    trace_id, span_id = trace_and_span(call.headers["traceparent"])
    assert (span.trace_id.hex(), span.span_id.hex()) == (trace_id, span_id)
    assert trace_id == trace_and_span(PARENT)[0]
    assert span.parent_span_id.hex() == trace_and_span(PARENT)[1]
    assert attributes(span)["pgdispatch.kind"] == "manual"


async def test_a_collector_that_is_down_holds_up_no_run(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener,
    monkeypatch: pytest.MonkeyPatch, unused_tcp_port: int
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://127.0.0.1:{unused_tcp_port}/v1/traces")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
    add_schedules(db, 50)
    running = await start_listener(span_export="otlp")
    mark_all_due(db)
    await until(lambda: scalar(adb, "SELECT count(*) = 50 FROM dispatch.runs WHERE status = 'ok'"),
                within=15, what="every run recorded")
    await asyncio.wait_for(running.stop(), 20)  # the spans it could not send do not hold the shutdown


async def test_no_span_leaves_without_the_setting(
    db: psycopg.Connection, sink: Sink, collector: Collector, start_listener: StartListener
) -> None:
    add_schedules(db, 3)
    running = await start_listener()
    mark_all_due(db)
    await until(lambda: len(sink.calls) == 3, within=15, what="three calls")
    await running.stop()
    assert collector.spans == []


def test_an_unknown_exporter_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match="--span-export / PGDISPATCH_SPAN_EXPORT must be one of none, otlp"):
        Settings(database_url="postgresql:///x", invoke_url="http://f/{project_id}/{function_name}",
                 span_export="zipkin")
