"""What the listener holds about a run: the claimed row and the outcome of invoking it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

__all__ = ["Outcome", "Run"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """A row returned by dispatch.claim_runs, plus when its lease ends on this listener's clock."""

    run_id: int
    schedule_id: str
    project_id: str
    function_name: str
    args_json: str  # the schedule's args as JSON text, sent in the body as they are
    request_id: str
    scheduled_for: datetime  # the nominal slot
    attempt: int
    lease_until: datetime
    # time.monotonic() until which the lease holds for sure: from the claim, or from the last busy
    # answer of dispatch.complete_runs, which renews it (dispatcher.database.BUSY_LEASE_S)
    lease_deadline: float
    timeout_s: float | None = None  # the invocation timeout (claim_runs: the schedule's, else the listener's)
    fire_at: datetime | None = None  # the slot plus the schedule's jitter offset (None: the slot)
    kind: str | None = None  # scheduled, manual or backfill (None: a schema that does not say)
    traceparent: str | None = None  # the W3C header of this attempt (dispatcher.tracing)
    continues: str | None = None  # the traceparent the run continues (its schedule's or run_now's)


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """How an invocation ended, as dispatch.complete_runs records it."""

    status: Literal["ok", "error"]
    error: str | None = None
    http_status: int | None = None
    duration_ms: int = 0
    # A failure that another attempt may cure (connection, timeout, 5xx, 408, 429): the run is
    # retried while its schedule has attempts left.
    retryable: bool = False
    retry_after_ms: int | None = None  # the function's Retry-After
