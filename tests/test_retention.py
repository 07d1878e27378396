"""Bounded history: dispatch.prune removes old finished runs and audit rows in batches and
never touches work in flight; retention is one UPDATE away."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors

from tests.runs_kit import scalar


def seed(db: psycopg.Connection) -> None:
    sid, stuck, late = (
        r[0]
        for r in db.execute(
            "INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
            " SELECT 'p', 'fn', '* * * * *' FROM generate_series(1, 3) RETURNING id"
        ).fetchall()
    )
    # 250 finished 20 days ago, 30 finished 2 days ago, and one pending and one running run
    # that are 30 days old (a stuck listener, a long outage): those must stay.
    db.execute(
        """
        INSERT INTO dispatch.runs (schedule_id, project_id, scheduled_for, status, created_at, finished_at,
                                   attempt)
        SELECT %(sid)s, (SELECT project_id FROM dispatch.schedules WHERE id = %(sid)s),
               now() - g * interval '1 minute' - age, status, now() - age, now() - age, 1
        FROM generate_series(1, 280) g,
             LATERAL (SELECT CASE WHEN g <= 250 THEN interval '20 days' ELSE interval '2 days' END AS age,
                             CASE WHEN g %% 2 = 0 THEN 'ok' ELSE 'error' END AS status) x
        """,
        {"sid": sid},
    )
    db.execute(
        "INSERT INTO dispatch.runs (schedule_id, project_id, scheduled_for, status, created_at)"
        " SELECT id, project_id, now() - interval '30 days', 'pending', now() - interval '30 days'"
        " FROM dispatch.schedules WHERE id = %s",
        (late,),
    )
    db.execute(
        "INSERT INTO dispatch.runs (schedule_id, project_id, scheduled_for, status, created_at, worker,"
        " claimed_at, lease_until, attempt)"
        " SELECT s.id, s.project_id, t, 'running', t, 'w', t, t + interval '1 minute', 1"
        " FROM (SELECT now() - interval '31 days') x(t), dispatch.schedules s WHERE s.id = %s",
        (stuck,),
    )
    db.execute(
        "INSERT INTO dispatch.audit_log (at, action)"
        " SELECT now() - g * interval '1 day' + interval '12 hours', 'schedule.run.ok'"
        " FROM generate_series(1, 120) g"
    )


def runs_by_status(db: psycopg.Connection) -> dict[str, int]:
    return dict(db.execute("SELECT status, count(*) FROM dispatch.runs GROUP BY 1").fetchall())


def test_prune_keeps_recent_and_in_flight_runs(db: psycopg.Connection) -> None:
    seed(db)
    db.execute("UPDATE dispatch.settings SET prune_batch_size = 100")
    assert db.execute("CALL dispatch.prune()").fetchone() == (250, 30)
    assert runs_by_status(db) == {"ok": 15, "error": 15, "pending": 1, "running": 1}
    # audit: 90 days kept, and the three schedule.create rows
    assert db.execute("SELECT count(*) FROM dispatch.audit_log").fetchone() == (93,)
    assert db.execute("CALL dispatch.prune()").fetchone() == (0, 0)


def test_retention_is_one_statement(db: psycopg.Connection) -> None:
    seed(db)
    db.execute("UPDATE dispatch.settings SET runs_retention = '1 day', audit_retention = '10 days'")
    assert db.execute("CALL dispatch.prune()").fetchone() == (280, 110)
    assert runs_by_status(db) == {"pending": 1, "running": 1}


def test_settings_are_one_checked_row(db: psycopg.Connection) -> None:
    with pytest.raises(errors.UniqueViolation):
        db.execute("INSERT INTO dispatch.settings DEFAULT VALUES")
    with pytest.raises(errors.CheckViolation, match="settings_runs_retention_check"):
        db.execute("UPDATE dispatch.settings SET runs_retention = '1 minute'")


@pytest.mark.parametrize("table", ["runs", "audit_log"])
def test_vacuum_after_a_prune_keeps_the_space_for_the_next_rows(db: psycopg.Connection, table: str) -> None:
    # A prune empties the old end of the table; the next minutes' rows fill it again, so vacuum
    # keeps those pages (no ACCESS EXCLUSIVE lock to truncate them) unless asked to hand them back.
    sid = scalar(db, "INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
                     " VALUES ('p', 'fn', '* * * * *') RETURNING id")
    db.execute("INSERT INTO dispatch.runs (schedule_id, project_id, scheduled_for, status, created_at,"
               " finished_at, attempt) SELECT %s, 'p', now() - g * interval '1 minute', 'ok',"
               " now() - interval '20 days', now() - interval '20 days', 1 FROM generate_series(1, 5000) g",
               (sid,))
    db.execute("INSERT INTO dispatch.audit_log (at, action)"
               " SELECT now() - interval '100 days', 'schedule.run.ok' FROM generate_series(1, 5000)")
    size = f"SELECT pg_relation_size('dispatch.{table}')"
    before = scalar(db, size)
    assert db.execute("CALL dispatch.prune()").fetchone() == (5000, 5000)
    db.execute(f"VACUUM dispatch.{table}")
    assert scalar(db, size) == before
    db.execute(f"VACUUM (TRUNCATE) dispatch.{table}")
    assert scalar(db, size) < before
