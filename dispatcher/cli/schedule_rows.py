"""Reading one schedule for the operator commands, and saying why the database refused a write."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from dispatcher.cli.console import CommandError, UsageError

__all__ = ["SCHEDULE", "database_error", "load", "parse_schedule_id"]

SCHEDULE = """
SELECT s.id, s.project_id, s.function_name, s.cron_expression, s.every, s.anchor, s.jitter, s.timezone,
       s.args,
       CASE WHEN s.deleted_at IS NOT NULL THEN 'deleted' WHEN s.paused_at IS NOT NULL THEN 'paused'
            WHEN NOT s.enabled THEN 'disabled' WHEN s.ended_at IS NOT NULL THEN 'ended' ELSE 'enabled' END
           AS state,
       s.next_run_at, st.next_fire_at, s.last_run_at, s.last_status, s.last_error, s.max_attempts,
       s.retry_backoff, s.retry_backoff_max, s.timeout, s.misfire_grace, s.catchup, s.overlap,
       coalesce(st.consecutive_failures, 0) AS consecutive_failures, st.current_run_status,
       st.current_attempt, coalesce(st.open_runs, 0) AS open_runs, st.next_retry_at,
       st.overdue_by, s.paused_at, s.paused_by, s.paused_reason, s.created_at, s.updated_at, s.deleted_at,
       s.run_at, s.starts_at, s.ends_at, s.max_runs, s.ended_at, s.ended_reason, s.pause_after_failures,
       s.traceparent, s.calendar_id, c.name AS calendar
FROM dispatch.schedules s
LEFT JOIN dispatch.schedule_status st ON st.id = s.id
LEFT JOIN dispatch.calendars c ON c.id = s.calendar_id
"""

# SQLSTATE classes and codes that mean the request itself is wrong, whoever makes it: data
# exceptions (22: a value refused by the write trigger, an unreadable interval or timestamp),
# integrity constraints (23), no such row (P0002). Anything else (a busy or paused schedule,
# a lost connection) may succeed later.
_BAD_INPUT_CLASSES = ("22", "23")
_BAD_INPUT_CODES = ("P0002",)


def parse_schedule_id(text: str) -> str:
    """`text` as a schedule id, or a usage error."""
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise UsageError(f"{text!r} is not a schedule id (a UUID, as `pgdispatch schedules list` shows)") \
            from None


def database_error(exc: psycopg.Error) -> CommandError:
    """One line from the server's message, detail and hint: a UsageError for bad input."""
    diag = exc.diag
    message = diag.message_primary or " ".join(str(exc).split())
    for extra in (diag.message_detail, diag.message_hint):
        if extra:
            message += f" ({extra})"
    state = exc.sqlstate or ""
    if state[:2] in _BAD_INPUT_CLASSES or state in _BAD_INPUT_CODES:
        return UsageError(message)
    return CommandError(message)


def load(conn: psycopg.Connection[dict[str, Any]], sid: str) -> dict[str, Any]:
    """The schedule as SCHEDULE reads it, or a usage error naming the id."""
    row = conn.execute(SCHEDULE + " WHERE s.id = %s", (sid,)).fetchone()
    if row is None:
        raise UsageError(f"no schedule {sid}")
    return row
