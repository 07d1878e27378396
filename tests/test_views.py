"""The DBA views: schedule_status, recent_failures, listeners."""

from __future__ import annotations

from collections.abc import Callable

import psycopg


def test_schedule_status_counts_failures_since_the_last_ok(db: psycopg.Connection) -> None:
    sid = db.execute(
        "INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
        " VALUES ('p', 'fn', '* * * * *') RETURNING id"
    ).fetchone()[0]  # type: ignore[index]
    for minutes_ago, status in [(10, "error"), (9, "ok"), (8, "error"), (7, "lost"), (6, "error")]:
        db.execute(
            "INSERT INTO dispatch.runs"
            " (schedule_id, project_id, scheduled_for, status, finished_at, error, attempt)"
            " SELECT s.id, s.project_id, date_trunc('minute', now()) - %s * interval '1 minute', %s, now(),"
            " CASE WHEN %s <> 'ok' THEN 'boom' END, 1 FROM dispatch.schedules s WHERE s.id = %s",
            (minutes_ago, status, status, sid),
        )
    db.execute("UPDATE dispatch.schedules SET next_run_at = now() - interval '5 minutes'")
    overdue = "SELECT overdue_by > interval '4 minutes' FROM dispatch.schedule_status WHERE id = %s"
    assert db.execute(overdue, (sid,)).fetchone() == (True,)
    db.execute("SELECT dispatch.tick()")  # catchup latest: the slot of this minute is marked
    row = db.execute(
        "SELECT consecutive_failures, current_run_status, overdue_by < interval '1 minute', live, open_runs"
        " FROM dispatch.schedule_status WHERE id = %s",
        (sid,),
    ).fetchone()
    assert row == (3, "pending", True, True, 1)
    failures = db.execute("SELECT status, error FROM dispatch.recent_failures").fetchall()
    assert len(failures) == 4
    assert {f[0] for f in failures} == {"error", "lost"}


def test_listeners_view_finds_connections_by_application_name(
    db: psycopg.Connection, connect: Callable[..., psycopg.Connection]
) -> None:
    params = db.info.get_parameters()
    with psycopg.connect(**params, autocommit=True, application_name="pgdispatch host-1:42") as conn:
        conn.execute("LISTEN dispatch")
        rows = db.execute("SELECT worker, listening FROM dispatch.listeners").fetchall()
    assert rows == [("host-1:42", True)]
    assert connect() is not None
    assert db.execute("SELECT count(*) FROM dispatch.listeners").fetchone() == (0,)
