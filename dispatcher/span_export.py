"""One OpenTelemetry span per invocation, exported when the listener runs with
`--span-export otlp` (the optional extra pgdispatch[otel]; off by default).

A span stands for the attempt the function saw: a CLIENT span "invoke <function>" whose trace
id and span id are those of the traceparent header the request carried (dispatcher.tracing), so
that the spans a function records under that header are its children; its parent is the span
of the traceparent the run continues, if any, and a continued traceparent that is not sampled
is not exported. The SDK's BatchSpanProcessor queues the spans (bounded: a collector that is
down costs spans, never runs) and sends them from its own thread to the OTLP/HTTP endpoint of
the standard variables (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
OTEL_EXPORTER_OTLP_HEADERS, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_BSP_*).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import TYPE_CHECKING

from dispatcher import __version__
from dispatcher.config import ConfigError
from dispatcher.runs import Outcome, Run
from dispatcher.tracing import trace_and_span

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = ["InvocationSpans"]

INSTALL = "pip install 'pgdispatch[otel]'"


class InvocationSpans:
    """Spans of this listener's invocations, handed to a batch processor as each one ends."""

    def __init__(self, worker_id: str, exporter: SpanExporter | None = None) -> None:
        """`exporter`: the OTLP/HTTP exporter of the standard variables unless given. Raises
        ConfigError when the extra is not installed."""
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import (
                SERVICE_INSTANCE_ID,
                SERVICE_NAME,
                OTELResourceDetector,
                Resource,
            )
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            raise ConfigError("--span-export otlp / PGDISPATCH_SPAN_EXPORT needs the OpenTelemetry SDK: "
                              + INSTALL) from None
        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over these defaults
        defaults = {SERVICE_NAME: "pgdispatch-listener", SERVICE_INSTANCE_ID: worker_id,
                    "service.version": __version__}
        self._resource = Resource.create(defaults).merge(OTELResourceDetector().detect())
        self._processor = BatchSpanProcessor(exporter or OTLPSpanExporter())

    def record(self, run: Run, outcome: Outcome) -> None:
        """The span of an attempt that just ended (`outcome`, which says how long it took)."""
        if run.traceparent is None:
            return
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        trace_id, span_id = trace_and_span(run.traceparent)
        flags = TraceFlags(int(run.traceparent[-2:], 16))
        if not flags.sampled:
            return
        parent = None
        if run.continues is not None:
            parent = SpanContext(int(trace_id, 16), int(trace_and_span(run.continues)[1], 16), is_remote=True,
                                 trace_flags=flags)
        end = time.time_ns()
        attributes: dict[str, str | int] = {
            "http.request.method": "POST",
            "pgdispatch.run_id": run.run_id,
            "pgdispatch.schedule_id": run.schedule_id,
            "pgdispatch.project_id": run.project_id,
            "pgdispatch.function_name": run.function_name,
            "pgdispatch.request_id": run.request_id,
            "pgdispatch.attempt": run.attempt,
            "pgdispatch.scheduled_for": run.scheduled_for.isoformat(),
            "pgdispatch.outcome": outcome.status,
        }
        if run.kind is not None:
            attributes["pgdispatch.kind"] = run.kind
        if outcome.http_status is not None:
            attributes["http.response.status_code"] = outcome.http_status
        if outcome.status == "error":
            attributes["error.type"] = "retryable" if outcome.retryable else "final"
        self._processor.on_end(ReadableSpan(
            name=f"invoke {run.function_name}",
            context=SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=False, trace_flags=flags),
            parent=parent,
            resource=self._resource,
            attributes=attributes,
            kind=SpanKind.CLIENT,
            status=(Status(StatusCode.ERROR, outcome.error) if outcome.status == "error"
                    else Status(StatusCode.UNSET)),
            start_time=end - outcome.duration_ms * 1_000_000,
            end_time=end,
            instrumentation_scope=InstrumentationScope("pgdispatch", __version__),
        ))

    async def close(self, within_s: float) -> None:
        """Send what is queued and stop, waiting at most `within_s`: from a daemon thread of its
        own, so that a collector that does not answer delays no exit beyond that."""
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def shut_down() -> None:
            try:
                self._processor.shutdown()  # type: ignore[no-untyped-call]
            finally:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(done.set)

        threading.Thread(target=shut_down, name="pgdispatch-span-flush", daemon=True).start()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), within_s)
