"""Least privilege: what each group role may and may not do, tried as that role."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from psycopg import errors

from tests.conftest import ROOT


@contextmanager
def as_role(db: psycopg.Connection, role: str) -> Iterator[psycopg.Connection]:
    db.execute(f"SET ROLE {role}")
    try:
        yield db
    finally:
        db.execute("RESET ROLE")


def due_run(db: psycopg.Connection) -> None:
    db.execute(
        "INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
        " VALUES ('p', 'fn', '* * * * *')"
    )
    db.execute("UPDATE dispatch.schedules SET next_run_at = date_trunc('minute', now())")


DIRECT_WRITES = [
    "INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
    " VALUES ('p', 'f', '* * * * *')",
    "UPDATE dispatch.schedules SET enabled = false",
    "DELETE FROM dispatch.schedules",
    "UPDATE dispatch.runs SET status = 'ok'",
    "DELETE FROM dispatch.runs",
    "INSERT INTO dispatch.audit_log (action) VALUES ('forged')",
    "DELETE FROM dispatch.audit_log",
    "UPDATE dispatch.settings SET runs_retention = '1 day'",
    "INSERT INTO dispatch.projects (project_id, max_concurrency) VALUES ('p', 1)",
]


def test_listener_runs_the_dispatch_functions(db: psycopg.Connection) -> None:
    due_run(db)
    with as_role(db, "dispatch_listener"):
        assert db.execute("SELECT dispatch.tick()").fetchone() == (1,)
        (run_id, *_rest) = db.execute("SELECT * FROM dispatch.claim_runs('w', 5, '1 minute')").fetchone()  # type: ignore[misc]
        assert db.execute("CALL dispatch.complete_run(%s, 'w', 1, 'ok')", (run_id,)).fetchone() == (
            True, True, False, None)
        assert db.execute("SELECT dispatch.next_due_at() > now()").fetchone() == (True,)
        assert db.execute("SELECT dispatch.next_due_after(now()) > now()").fetchone() == (True,)
        assert db.execute(
            "SELECT count(*) FROM dispatch.complete_runs('w', '{}', '{}', '{}', '{}', '{}', '{}')"
        ).fetchone() == (0,)
        assert db.execute("SELECT dispatch.release_runs('w', '{}', '{}')").fetchone() == (0,)
    assert db.execute("SELECT status FROM dispatch.runs").fetchone() == ("ok",)
    assert db.execute(
        "SELECT count(*) FROM dispatch.audit_log WHERE action = 'schedule.run.ok'"
    ).fetchone() == (1,)


@pytest.mark.parametrize("statement", DIRECT_WRITES)
def test_listener_cannot_write_tables_directly(db: psycopg.Connection, statement: str) -> None:
    with as_role(db, "dispatch_listener"), pytest.raises(errors.InsufficientPrivilege):
        db.execute(statement)


@pytest.mark.parametrize(
    "statement",
    ["SELECT * FROM dispatch.schedules", "SELECT * FROM dispatch.runs", "CALL dispatch.prune()",
     "SELECT * FROM dispatch.explain(gen_random_uuid())"],
)
def test_listener_reads_nothing_it_does_not_need(db: psycopg.Connection, statement: str) -> None:
    with as_role(db, "dispatch_listener"), pytest.raises(errors.InsufficientPrivilege):
        db.execute(statement)


def test_reader_reads_everything_and_changes_nothing(db: psycopg.Connection) -> None:
    due_run(db)
    with as_role(db, "dispatch_reader"):
        for relation in ["schedules", "runs", "audit_log", "settings", "projects", "migrations", "timezones",
                         "schedule_status", "recent_failures", "listeners"]:  # fmt: skip
            db.execute(f"SELECT * FROM dispatch.{relation}").fetchall()
        assert db.execute(
            "SELECT dispatch.cron_next('0 9 * * *', now(), 'Europe/Berlin') > now()"
        ).fetchone() == (True,)
        # "why didn't it fire?" is a reader's question
        assert db.execute("SELECT e.item FROM dispatch.schedules s, dispatch.explain(s.id) e"
                          " WHERE e.section = 'state'").fetchall() == [("due",)]
        for statement in [
            *DIRECT_WRITES,
            "SELECT dispatch.tick()",
            "SELECT * FROM dispatch.claim_runs('w', 1)",
        ]:
            with pytest.raises(errors.InsufficientPrivilege):
                db.execute(statement)


def test_admin_manages_schedules_and_settings(db: psycopg.Connection) -> None:
    with as_role(db, "dispatch_admin"):
        db.execute(
            "INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
            " VALUES ('p', 'report', '0 9 * * *')"
        )
        db.execute("UPDATE dispatch.schedules SET cron_expression = '0 10 * * *'")
        db.execute("UPDATE dispatch.schedules SET enabled = false")
        db.execute("UPDATE dispatch.settings SET runs_retention = '30 days'")
        db.execute("INSERT INTO dispatch.projects (project_id, max_concurrency) VALUES ('p', 5)")
        db.execute("UPDATE dispatch.projects SET weight = 2, max_concurrency = NULL WHERE project_id = 'p'")
        db.execute("DELETE FROM dispatch.projects WHERE project_id = 'p'")
        assert db.execute("CALL dispatch.prune()").fetchone() == (0, 0)
        actions = [r[0] for r in db.execute("SELECT action FROM dispatch.audit_log ORDER BY id").fetchall()]
        assert actions == ["schedule.create", "schedule.update", "schedule.update"]
        # the actor is the login (session_user), not the group role it acts through
        assert db.execute("SELECT DISTINCT actor_id FROM dispatch.audit_log").fetchall() == [("postgres",)]
        for statement in [*DIRECT_WRITES[3:7], "SELECT * FROM dispatch.claim_runs('w', 1)"]:
            with pytest.raises(errors.InsufficientPrivilege):
                db.execute(statement)


def test_other_roles_cannot_use_the_schema(db: psycopg.Connection) -> None:
    db.execute("DROP ROLE IF EXISTS pgdispatch_test_nobody")
    db.execute("CREATE ROLE pgdispatch_test_nobody NOLOGIN")
    try:
        with as_role(db, "pgdispatch_test_nobody"):
            for statement in ["SELECT * FROM dispatch.schedules", "SELECT dispatch.tick()",
                              "SELECT dispatch.cron_next('* * * * *', now())",
                              "SELECT * FROM dispatch.explain(gen_random_uuid())"]:  # fmt: skip
                with pytest.raises(errors.InsufficientPrivilege):
                    db.execute(statement)
    finally:
        db.execute("DROP ROLE pgdispatch_test_nobody")


def test_security_definer_functions_pin_their_search_path(db: psycopg.Connection) -> None:
    unpinned = db.execute(
        """
        SELECT p.oid::regprocedure::text FROM pg_proc p
        WHERE p.pronamespace = 'dispatch'::regnamespace AND p.prosecdef
          AND NOT coalesce(p.proconfig @> '{"search_path=pg_catalog, pg_temp"}', false)
        """
    ).fetchall()
    assert unpinned == []


def test_pgspot_reports_nothing() -> None:
    # Six functions cannot carry a SET clause (see their comments); they qualify every operator.
    out = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "pgspot"), "-a",
         "--proc-without-search-path", "dispatch._next_bit(mask bigint,k integer)",
         "--proc-without-search-path", "dispatch.prune(INOUT runs_deleted bigint,INOUT audit_deleted bigint)",
         "--proc-without-search-path", "dispatch._missed(r dispatch.runs,s dispatch.schedules)",
         "--proc-without-search-path", "dispatch._claim_verdict(r dispatch.runs,s dispatch.schedules)",
         "--proc-without-search-path", "dispatch._waits_its_turn(r dispatch.runs)",
         "--proc-without-search-path", "dispatch._stopped_as(s dispatch.schedules)",
         str(ROOT / "sql" / "bootstrap.sql"),
         *sorted(str(p) for p in (ROOT / "sql" / "migrations").glob("*.sql")),
         *sorted(str(p) for p in (ROOT / "sql" / "code").glob("*.sql"))],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert "TOTAL: Errors: 0 Warnings: 0 Unknown: 0" in out.stdout, out.stdout
