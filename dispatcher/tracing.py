"""The W3C traceparent header of an invocation, computed as dispatch.traceparent computes it in
SQL (the tests hold the two to each other): the trace id is the run's request id (its UUID's 32
hex digits), or the trace id of the traceparent the run continues; the span id is the first 16
hex digits of sha256("<request id>/<attempt>"); the flags are the continued traceparent's, or
01 (sampled). Computed here rather than by the claim: the listeners scale out, the database
does not."""

from __future__ import annotations

import hashlib
import re

__all__ = ["trace_and_span", "traceparent"]

_REQUEST_ID = re.compile(r"sched_([0-9a-f]{8})-([0-9a-f]{4})-([0-9a-f]{4})-([0-9a-f]{4})-([0-9a-f]{12})")


def traceparent(request_id: str, attempt: int, parent: str | None = None) -> str:
    """The header of attempt `attempt` (the claim's fencing token) of the run `request_id`."""
    if parent is not None:
        trace_id, flags = parent[3:35], parent[-2:]
    else:
        match = _REQUEST_ID.fullmatch(request_id)
        trace_id = ("".join(match.groups()) if match
                    else hashlib.sha256(request_id.encode()).hexdigest()[:32])
        flags = "01"
    span_id = hashlib.sha256(f"{request_id}/{attempt}".encode()).hexdigest()[:16]
    return f"00-{trace_id}-{span_id}-{flags}"


def trace_and_span(header: str) -> tuple[str, str]:
    """(trace id, span id) of a traceparent header."""
    return header[3:35], header[36:52]
