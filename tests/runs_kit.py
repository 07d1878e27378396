"""Helpers for tests that drive the SQL API the way a listener or a DBA does, on real sessions."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import psycopg

__all__ = ["YEARLY", "add_schedule", "audit_of", "claim", "complete", "complete_many", "expire", "make_due",
           "mark_yearly", "release", "run_due", "run_row", "scalar", "slots_run"]

YEARLY = "0 0 1 1 *"  # marked with tick(now() + 1 year): its next slot is a year after the run's


def add_schedule(db: psycopg.Connection, expr: str = "* * * * *", **columns: Any) -> str:
    names = ["project_id", "function_name", "cron_expression", *columns]
    values = ["proj_1", "fn", expr, *columns.values()]
    row = db.execute(
        f"INSERT INTO dispatch.schedules ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))})"
        " RETURNING id",
        values,
    ).fetchone()
    assert row is not None
    return str(row[0])


def make_due(db: psycopg.Connection, ago: str = "1 second") -> None:
    """Put every live schedule's slot in the past, as the clock would (a superuser's write)."""
    db.execute(
        "UPDATE dispatch.schedules SET next_run_at = date_trunc('minute', now() - %s::interval)"
        " WHERE next_run_at IS NOT NULL",
        (ago,),
    )


def scalar(db: psycopg.Connection, sql: str, params: Any = None) -> Any:
    row = db.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def claim(
    db: psycopg.Connection, worker: str, n: int = 10, lease: str = "60 seconds"
) -> list[tuple[Any, ...]]:
    """dispatch.claim_runs: rows of (run_id, schedule_id, project_id, function_name, args,
    request_id, scheduled_for, attempt, lease_until)."""
    return db.execute(
        "SELECT * FROM dispatch.claim_runs(%s, %s, %s::interval)", (worker, n, lease)
    ).fetchall()


def complete(
    db: psycopg.Connection, run: tuple[Any, ...], worker: str = "w", status: str = "ok", *,
    attempt: int | None = None, **kw: Any,
) -> tuple[bool, bool, bool]:
    """CALL dispatch.complete_run for a claimed row (its attempt, unless `attempt` overrides it);
    returns (recorded, advanced, busy)."""
    row = db.execute(
        "CALL dispatch.complete_run(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (run[0], worker, run[7] if attempt is None else attempt, status, kw.get("error"),
         kw.get("http_status"), kw.get("duration_ms"), kw.get("retryable", False), kw.get("retry_after_ms")),
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def complete_many(
    db: psycopg.Connection, worker: str, outcomes: list[tuple[int, int, str, str | None]]
) -> list[tuple[int, bool, bool, bool]]:
    """dispatch.complete_runs for (run_id, attempt, status, error) tuples."""
    return [
        tuple(r)
        for r in db.execute(
            "SELECT run_id, recorded, advanced, busy FROM dispatch.complete_runs(%s, %s, %s, %s, %s, %s, %s)",
            (
                worker,
                [o[0] for o in outcomes],
                [o[1] for o in outcomes],
                [o[2] for o in outcomes],
                [o[3] for o in outcomes],
                [200 if o[2] == "ok" else 500 for o in outcomes],
                [7 for _ in outcomes],
            ),
        ).fetchall()
    ]


def release(db: psycopg.Connection, worker: str, runs: list[tuple[Any, ...]]) -> int:
    """dispatch.release_runs for claimed rows."""
    return int(scalar(db, "SELECT dispatch.release_runs(%s, %s::bigint[], %s::integer[])",
                      (worker, [r[0] for r in runs], [r[7] for r in runs])))


def expire(db: psycopg.Connection, run_id: int) -> None:
    """Let a lease run out: wait (on the database's clock) until it has, then tick."""
    deadline = time.monotonic() + 10
    while not scalar(db, "SELECT lease_until < now() FROM dispatch.runs WHERE id = %s", (run_id,)):
        assert time.monotonic() < deadline, "lease did not expire"
    db.execute("SELECT dispatch.tick()")


def mark_yearly(db: psycopg.Connection) -> None:
    db.execute("SELECT dispatch.tick(now() + interval '1 year')")


def run_row(db: psycopg.Connection, run_id: int) -> dict[str, Any]:
    row = db.cursor(row_factory=psycopg.rows.dict_row).execute(
        "SELECT * FROM dispatch.runs WHERE id = %s", (run_id,)).fetchone()
    assert row is not None
    return row


def audit_of(db: psycopg.Connection, run_id: int) -> list[tuple[str, dict[str, Any]]]:
    """The audit rows of a run, oldest first: (action, metadata)."""
    return [(action, metadata) for action, metadata in db.execute(
        "SELECT action, metadata FROM dispatch.audit_log WHERE metadata->>'runId' = %s ORDER BY id",
        (str(run_id),))]


def run_due(db: psycopg.Connection, horizon: datetime) -> list[tuple[Any, ...]]:
    """Mark up to `horizon`, then claim and complete ok whatever is due: one round of a listener."""
    db.execute("SELECT dispatch.tick(%s)", (horizon,))
    runs = claim(db, "w", 100)
    for run in runs:
        complete(db, run)
    return runs


def slots_run(db: psycopg.Connection, sid: str) -> list[datetime]:
    """The slots of a schedule that have a run of its own (kind scheduled), oldest first."""
    return [slot for (slot,) in db.execute(
        "SELECT scheduled_for FROM dispatch.runs WHERE schedule_id = %s AND kind = 'scheduled' ORDER BY 1",
        (sid,))]
