"""`pgdispatch doctor`: each check seen ok and seen failing, through the real command."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import psycopg.conninfo
import pytest

from dispatcher.migrations import migrations
from dispatcher.notifications import PROBE_INTERVAL_S
from tests.conftest import CLUSTER_DIR, HAS_PG_CRON, PG_MAJOR, ROOT
from tests.listener.kit import ListenerProcess, Sink, until

from .conftest import Result, run_cli

# A schedule that never comes due during a test: pg_cron must not really tick the test database.
NEVER = "0 0 1 1 *"


def _statuses(result: Result) -> dict[str, str]:
    return {check["name"]: check["status"] for check in result.json["checks"]}


def _check(result: Result, name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(check for check in result.json["checks"] if check["name"] == name)
    return found


@pytest.fixture
def tick_job(db: psycopg.Connection, admin_url: str) -> Iterator[Callable[[str, str], None]]:
    """Register dispatch-tick for the test database in pg_cron's database (as sql/pg_cron.sql does);
    `record(status, message)` adds a run of it to cron.job_run_details."""
    dbname = db.info.dbname
    with psycopg.connect(admin_url, autocommit=True) as cron:
        row = cron.execute(
            "SELECT cron.schedule_in_database('dispatch-tick', %s, 'SELECT dispatch.tick()', %s)",
            (NEVER, dbname)).fetchone()
        assert row is not None
        jobid = row[0]

        def record(status: str, message: str) -> None:
            cron.execute(
                "INSERT INTO cron.job_run_details (jobid, job_pid, database, username, command, status,"
                " return_message, start_time, end_time)"
                " VALUES (%s, 1, %s, 'postgres', 'SELECT dispatch.tick()', %s, %s, now(), now())",
                (jobid, dbname, status, message))

        try:
            yield record
        finally:
            cron.execute("DELETE FROM cron.job_run_details WHERE jobid = %s", (jobid,))
            cron.execute("SELECT cron.unschedule(%s)", (jobid,))


@pytest.fixture
def listening(dsn: str) -> Iterator[None]:
    """A session that looks like a listener's LISTEN connection (application_name 'pgdispatch …')."""
    with psycopg.connect(dsn, autocommit=True, application_name="pgdispatch doctor-test:1") as conn:
        conn.execute("LISTEN dispatch")
        yield


@pytest.mark.pg_cron
def test_fresh_install_without_job_or_listener(cli: Callable[..., Result], db: psycopg.Connection) -> None:
    done = cli("doctor", "--json")
    assert done.code == 1
    assert _statuses(done) == {
        "connection": "ok", "schema": "ok", "pg_cron": "ok", "dispatch-tick job": "fail",
        "dispatch-tick runs": "skip", "listeners": "fail", "overdue schedules": "ok", "stuck runs": "ok",
        "failing schedules": "ok",
    }
    assert done.json["ok"] is False
    assert _check(done, "pg_cron")["detail"] == (
        "loaded; its jobs live in database postgres (cron.database_name)")
    job = _check(done, "dispatch-tick job")
    assert job["fix"] == f"psql -d postgres -v dispatch_db={db.info.dbname} -f sql/pg_cron.sql"
    assert _check(done, "listeners")["fix"].startswith("start one: pgdispatch listen")

    text = cli("doctor")
    assert text.code == 1
    lines = text.out.splitlines()
    assert lines[0].startswith("pgdispatch doctor: ")
    assert lines[1].startswith("ok    connection          PostgreSQL 15")
    name = db.info.dbname
    assert f"fail  dispatch-tick job   no pg_cron job dispatch-tick runs in database {name}" in lines
    assert f"{'':26}fix: psql -d postgres -v dispatch_db={name} -f sql/pg_cron.sql" in lines
    assert lines[-1] == "2 failed"
    # docs/monitoring.md shows this very case, for a database d: line for line after the
    # connection (whose server version and port are the machine's), the schema's version included.
    sample = (ROOT / "docs" / "monitoring.md").read_text().split("$ pgdispatch doctor\n", 1)[1]
    sample_lines = sample.split("```", 1)[0].splitlines()
    assert sample_lines[2:] == [line.replace(name, "d") for line in lines[2:]]


@pytest.mark.skipif(HAS_PG_CRON, reason="the test cluster has pg_cron")
def test_fresh_install_without_pg_cron(cli: Callable[..., Result]) -> None:
    """A PostgreSQL without pg_cron (the majors tested without it): a warning with the fix, the
    job's checks skipped, no failure for pg_cron's sake."""
    done = cli("doctor", "--json")
    assert _statuses(done) == {
        "connection": "ok", "schema": "ok", "pg_cron": "warn", "dispatch-tick job": "skip",
        "dispatch-tick runs": "skip", "listeners": "fail", "overdue schedules": "ok", "stuck runs": "ok",
        "failing schedules": "ok",
    }
    pg_cron = _check(done, "pg_cron")
    assert pg_cron["detail"].startswith("not loaded")
    assert "postgresql-NN-cron" in pg_cron["fix"]
    assert _check(done, "connection")["detail"].startswith(f"PostgreSQL {PG_MAJOR}.")


@pytest.mark.pg_cron
def test_healthy_then_each_problem(cli: Callable[..., Result], db: psycopg.Connection,
                                   tick_job: Callable[[str, str], None], listening: None) -> None:
    no_runs = cli("doctor", "--json")
    assert _check(no_runs, "dispatch-tick runs")["status"] == "warn"
    assert no_runs.code == 0  # warnings alone do not fail
    assert cli("doctor", "--strict").code == 1
    tick_job("succeeded", "1 row")

    healthy = cli("doctor")
    assert healthy.code == 0, healthy.out
    assert healthy.out.splitlines()[-1] == "all checks passed"
    assert "ok    listeners           1 listening: doctor-test:1" in healthy.out
    assert "ok    dispatch-tick runs  the last 1 runs succeeded" in healthy.out

    # Overdue: due 5 minutes ago and not marked.
    row = db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
                     " VALUES ('acme', 'late', '* * * * *') RETURNING id").fetchone()
    assert row is not None
    sid = str(row[0])
    db.execute("UPDATE dispatch.schedules SET next_run_at = date_trunc('minute', now()) - interval '5 min'"
               " WHERE id = %s", (sid,))
    overdue = cli("doctor", "--json")
    assert overdue.code == 1
    detail = _check(overdue, "overdue schedules")["detail"]
    assert detail.startswith(f"1 due more than 2 minutes ago and not marked as runs: acme/late {sid} (0:0")

    # Marked (at its time: the tick ran then) but nobody claims it: pending and unclaimed.
    db.execute("SELECT dispatch.tick(date_trunc('minute', now()) - interval '5 min' + interval '1 second')")
    waiting = cli("doctor", "--json")
    assert _statuses(waiting)["overdue schedules"] == "ok"
    assert _check(waiting, "stuck runs")["detail"].startswith(
        "1 pending and unclaimed for more than 2 minutes")

    # Claimed with a lease that ends: running past its lease.
    db.execute("SELECT * FROM dispatch.claim_runs('w', 1, '100 milliseconds')")
    time.sleep(0.3)
    stuck = cli("doctor", "--json")
    assert stuck.code == 1
    assert _check(stuck, "stuck runs")["detail"].startswith("1 running past their lease")

    # Recorded as an error: a failing schedule is a warning with the error shown.
    run_id = db.execute("SELECT id FROM dispatch.runs").fetchone()[0]  # type: ignore[index]
    db.execute("CALL dispatch.complete_run(%s, 'w', 1, 'error', 'boom: down', 503, 5)", (run_id,))
    failing = cli("doctor", "--json")
    assert failing.code == 0, failing.json
    check = _check(failing, "failing schedules")
    assert (check["status"], check["detail"]) == (
        "warn", f"1 failing: acme/late {sid} (1 in a row: boom: down)")
    assert check["fix"].startswith("pgdispatch runs list --failed --schedule ID")
    assert cli("doctor", "--strict").code == 1

    # pg_cron's last run of the job failed.
    tick_job("failed", "ERROR:  permission denied for schema dispatch")
    cron_failed = cli("doctor", "--json")
    assert cron_failed.code == 1
    check = _check(cron_failed, "dispatch-tick runs")
    assert check["status"] == "fail"
    assert check["detail"].endswith("failed: ERROR: permission denied for schema dispatch")
    assert "cron.job_run_details WHERE jobid = " in check["fix"]


@pytest.mark.pg_cron
async def test_a_real_listener_past_its_probe_is_listening(
        cli: Callable[..., Result], db: psycopg.Connection, dsn: str, sink: Sink,
        tick_job: Callable[[str, str], None]) -> None:
    """A quiet listener probes its LISTEN session every PROBE_INTERVAL_S, and other sessions see
    the probe as that session's last statement: the probe must not make the listener look gone
    (it was SELECT 1, and doctor said "no listener connected" within 5 s of a listener's start)."""
    tick_job("succeeded", "1 row")
    proc = await ListenerProcess.start("--database-url", dsn, "--invoke-url", sink.template,
                                       "--worker-id", "doctor-real")
    try:
        await proc.wait_event("listening")
        row = db.execute("SELECT pid, state_change FROM pg_stat_activity WHERE application_name = %s"
                         " AND query LIKE 'LISTEN%%'", ("pgdispatch doctor-real",)).fetchone()
        assert row is not None
        pid, listened_at = row

        def probed() -> bool:  # the session's next statement is its probe: nothing notifies here
            changed = db.execute("SELECT state_change FROM pg_stat_activity WHERE pid = %s",
                                 (pid,)).fetchone()
            return changed is not None and changed[0] > listened_at

        await until(probed, within=PROBE_INTERVAL_S + 10, interval=0.1, what="the LISTEN session's probe")
        assert db.execute("SELECT listening FROM dispatch.listeners WHERE pid = %s",
                          (pid,)).fetchall() == [(True,)]
        done = await asyncio.to_thread(cli, "doctor", "--json")
        assert _check(done, "listeners") == {
            "name": "listeners", "status": "ok", "detail": "1 listening: doctor-real", "fix": ""}
        assert done.code == 0, done.out
    finally:
        await proc.kill()


async def test_a_role_that_may_not_see_the_listeners_statements(
        db: psycopg.Connection, dsn: str, sink: Sink) -> None:
    """pg_stat_activity shows another role's session's statement only to a superuser or a member
    of pg_read_all_stats: a doctor run by an operator's role (dispatch_reader) cannot tell a
    listener's LISTEN session from its pool, and must not say that no listener is connected."""
    role = f"doctor_viewer_{db.info.backend_pid}"
    db.execute(f"CREATE ROLE {role} LOGIN IN ROLE dispatch_reader")
    viewer = psycopg.conninfo.make_conninfo(dsn, user=role)
    proc = await ListenerProcess.start("--database-url", dsn, "--invoke-url", sink.template,
                                       "--worker-id", "doctor-unseen")
    try:
        await proc.wait_event("listening")
        with psycopg.connect(viewer) as conn:
            seen = conn.execute("SELECT DISTINCT worker, listening FROM dispatch.listeners").fetchall()
        assert seen == [("doctor-unseen", None)]  # unknown, not false
        unseen = await asyncio.to_thread(run_cli, "doctor", "--json", url=viewer)
        check = _check(unseen, "listeners")
        assert check["status"] == "warn", check
        assert check["detail"].endswith(
            "of worker doctor-unseen, whose statements this role may not see: whether one listens is unknown")
        assert f"GRANT pg_read_all_stats TO {role}" in check["fix"]

        db.execute(f"GRANT pg_read_all_stats TO {role}")
        seen_all = await asyncio.to_thread(run_cli, "doctor", "--json", url=viewer)
        assert _check(seen_all, "listeners")["detail"] == "1 listening: doctor-unseen"
    finally:
        await proc.kill()
        db.execute(f"DROP ROLE {role}")


def test_schema_missing_or_behind(empty_database: str, cli: Callable[..., Result],
                                  db: psycopg.Connection) -> None:
    missing = run_cli("doctor", "--json", url=empty_database)
    assert missing.code == 1
    assert _statuses(missing) == {"connection": "ok", "schema": "fail"}
    assert _check(missing, "schema")["fix"].startswith("pgdispatch install")

    latest = migrations()[-1]
    db.execute("DELETE FROM dispatch.migrations WHERE version = %s", (latest.version,))
    behind = cli("doctor", "--json")
    assert behind.code == 1
    assert _check(behind, "schema")["detail"].endswith(f"not applied: {latest.name}")
    db.execute("INSERT INTO dispatch.migrations (version, name) VALUES (%s, %s), (9999, '9999_future')",
               (latest.version, latest.name))
    ahead = cli("doctor", "--json")
    assert _check(ahead, "schema")["status"] == "warn"
    assert "9999_future" in _check(ahead, "schema")["detail"]


def test_cannot_connect() -> None:
    done = run_cli("doctor", url="postgresql://postgres:secret@127.0.0.1:1/app")
    assert done.code == 1
    lines = done.out.splitlines()
    assert lines[1].startswith(
        "fail  connection  cannot connect to user=postgres dbname=app host=127.0.0.1 port=1")
    assert "secret" not in done.out
    assert lines[2].strip().startswith("fix: check --database-url / PGDISPATCH_DATABASE_URL")


@pytest.mark.pg_cron
def test_as_a_reader_role(dsn: str, db: psycopg.Connection, tick_job: Callable[[str, str], None]) -> None:
    """dispatch_reader reads every dispatch table and view doctor needs; what it may not see of
    pg_cron (settings, the cron schema) it finds elsewhere or says it could not check."""
    role = f"doctor_reader_{db.info.backend_pid}"
    db.execute(f"CREATE ROLE {role} LOGIN IN ROLE dispatch_reader")
    try:
        done = run_cli("doctor", "--json", url=psycopg.conninfo.make_conninfo(dsn, user=role))
        statuses = _statuses(done)
        assert statuses["schema"] == statuses["overdue schedules"] == statuses["failing schedules"] == "ok"
        assert _check(done, "pg_cron")["detail"] == (
            "running; its jobs live in database postgres (its scheduler's database)")
        job = _check(done, "dispatch-tick job")
        assert job["status"] == "warn"
        assert job["detail"] == "cannot check as this role: it may not use schema cron in database postgres"
    finally:
        db.execute(f"DROP ROLE {role}")


def test_as_the_listener_role_without_errors_in_the_server_log(dsn: str, db: psycopg.Connection) -> None:
    """dispatch_listener may read none of the tables: doctor checks what it can, says what it could
    not, and asks the server nothing it would refuse (no ERROR lines in its log)."""
    role = f"doctor_listener_{db.info.backend_pid}"
    db.execute(f"CREATE ROLE {role} LOGIN IN ROLE dispatch_listener")
    log = CLUSTER_DIR / "server.log"
    before = log.stat().st_size
    try:
        done = run_cli("doctor", "--json", url=psycopg.conninfo.make_conninfo(dsn, user=role))
        statuses = _statuses(done)
        assert statuses["connection"] == statuses["schema"] == "ok"
        # pg_cron's scheduler shows in pg_stat_activity to anyone; without pg_cron, there is none
        # and this role may not read shared_preload_libraries: doctor cannot tell
        assert statuses["pg_cron"] == ("ok" if HAS_PG_CRON else "warn")
        assert _check(done, "schema")["detail"].endswith("(names not checked: this role may not read "
                                                         "dispatch.migrations)")
        for name in ("dispatch-tick job", "listeners", "overdue schedules", "stuck runs",
                     "failing schedules")[0 if HAS_PG_CRON else 1:]:
            check = _check(done, name)
            assert check["status"] == "warn"
            assert check["detail"].startswith("cannot check as this role: it may not")
        with log.open("rb") as lines:
            lines.seek(before)
            written = lines.read().decode(errors="replace")
        # (the lines of this role's sessions: other tests write the same log at the same time)
        assert [line for line in written.splitlines() if f" {role}@" in line and " ERROR: " in line] == []
    finally:
        db.execute(f"DROP ROLE {role}")
