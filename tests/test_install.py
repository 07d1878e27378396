"""sql/install.sql: installs on an empty database, changes nothing when run again, and its
migrations are numbered, listed and recorded; the Python installer applies the same files; an
upgrade from an earlier release ends with the very schema of a fresh install and its data intact."""

from __future__ import annotations

import io
import os
import re
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dispatcher.migrations import code_files, install, migrations
from tests.conftest import HAS_PG_CRON, PG_MAJOR, PGBIN, PSQL, ROOT, psql

SNAPSHOT = ROOT / "tests" / "schema.sql"
# The major whose pg_dump wrote the snapshot. From 16 on, the same schema prints differently: a
# view over one relation without its alias, and pg_dump 18 (the client there) adds SET lines.
SNAPSHOT_MAJOR = "15"


@pytest.fixture
def empty_db(db: psycopg.Connection) -> Iterator[str]:
    """A database with nothing installed, dropped afterwards."""
    name = f"{db.info.dbname}_empty"
    db.execute(f'DROP DATABASE IF EXISTS "{name}"')
    db.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    yield name
    db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def schema_dump(dbname: str) -> str:
    out = subprocess.run(
        [
            str(PGBIN / "pg_dump"),
            "--schema-only",
            "--no-owner",
            "-h",
            "127.0.0.1",
            "-p",
            os.environ["PGDISPATCH_TEST_PORT"],
            "-U",
            "postgres",
            dbname,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    # Drop what varies between runs and minor releases: versions, \restrict keys.
    volatile = ("-- Dumped ", "\\restrict", "\\unrestrict")
    return "\n".join(line for line in out.splitlines() if not line.startswith(volatile))


def test_install_twice_changes_nothing(empty_db: str) -> None:
    first = psql(empty_db, "-f", str(ROOT / "sql" / "install.sql"))
    assert "applied migration 0001_cron_engine" in first.stdout
    dump_once = schema_dump(empty_db)

    again = psql(empty_db, "-f", str(ROOT / "sql" / "install.sql"))
    assert "applied migration" not in again.stdout
    assert schema_dump(empty_db) == dump_once
    recorded = psql(empty_db, "-Atc", "SELECT count(*) FROM dispatch.migrations").stdout.strip()
    assert int(recorded) == len(migrations())


def pg_cron_said(out: str, dbname: str) -> bool:
    """What an install says about pg_cron in the test cluster: where it lives (database postgres,
    not this one), or, on a major without pg_cron, that nothing calls dispatch.tick()."""
    if HAS_PG_CRON:
        return ("pg_cron lives in database postgres: register the jobs there with psql -d postgres"
                f" -v dispatch_db={dbname} -f sql/pg_cron.sql") in out
    return ("pg_cron is not loaded (shared_preload_libraries): nothing calls dispatch.tick() every minute"
            " nor prunes old runs. Listeners still tick on their own timers; to add the safety net install"
            f" pg_cron (on Debian and Ubuntu: postgresql-{PG_MAJOR}-cron)") in out


def test_install_says_where_pg_cron_is(empty_db: str) -> None:
    out = psql(empty_db, "-f", str(ROOT / "sql" / "install.sql")).stdout
    assert pg_cron_said(out, empty_db), out


def test_a_non_superuser_with_createrole_installs(db: psycopg.Connection) -> None:
    """docs/install.md: the database's owner with CREATEROLE is enough; what it may not see of
    pg_cron (its settings, pg_hba.conf) is found elsewhere or said, never an error."""
    role, name = f"installer_{db.info.backend_pid}", f"{db.info.dbname}_owned"
    db.execute(f"CREATE ROLE {role} LOGIN CREATEROLE")
    db.execute(f'CREATE DATABASE "{name}" OWNER {role}')
    try:
        url = f"postgresql://{role}@127.0.0.1:{os.environ['PGDISPATCH_TEST_PORT']}/{name}"
        done = subprocess.run([PSQL, "-X", "-v", "ON_ERROR_STOP=1", "-d", url, "-f",
                               str(ROOT / "sql" / "install.sql")], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert pg_cron_said(done.stdout, name), done.stdout
        assert "ERROR" not in done.stderr and "WARNING" not in done.stderr
        assert psql(name, "-Atc", "SELECT dispatch.schema_version()").stdout.strip() == str(len(migrations()))
    finally:
        db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        db.execute(f"DROP OWNED BY {role}")
        db.execute(f"DROP ROLE {role}")


def test_migrations_numbered_without_gaps_and_all_listed_in_install_sql() -> None:
    found = migrations()
    assert [m.version for m in found] == list(range(1, len(found) + 1))
    names = [p.name for p in (ROOT / "sql" / "migrations").iterdir()]
    assert len(names) == len(found), f"a file in sql/migrations does not match NNNN_name.sql: {names}"
    install_sql = (ROOT / "sql" / "install.sql").read_text()
    listed = re.findall(
        r"^\\set version (\d+)\n\\set name (\S+)\n\\ir apply_migration.psql$", install_sql, re.M
    )
    assert [(int(v), n) for v, n in listed] == [(m.version, m.name) for m in found]


def test_every_code_file_is_listed_in_install_sql_in_order() -> None:
    names = sorted(p.name for p in (ROOT / "sql" / "code").iterdir())
    assert names == [p.name for p in code_files()], "a file in sql/code does not match NN_name.sql"
    listed = re.findall(r"^\\ir code/(\S+)$", (ROOT / "sql" / "install.sql").read_text(), re.M)
    assert listed == names


def test_migrations_and_code_are_plain_sql() -> None:
    for path in [*(m.path for m in migrations()), *code_files()]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert not line.lstrip().startswith("\\"), f"{path.name}:{number} is a psql meta-command"


def test_functions_live_in_code_and_tables_in_migrations() -> None:
    """One definition per function (sql/code/, re-applied by every install); tables, types and
    indexes only in migrations (add-only)."""
    for migration in migrations():
        text = migration.path.read_text()
        assert not re.search(r"CREATE (OR REPLACE )?(FUNCTION|PROCEDURE|VIEW|TRIGGER)", text), migration.name
    defined: dict[str, str] = {}
    for path in code_files():
        text = path.read_text()
        assert not re.search(r"CREATE (TABLE|TYPE|INDEX|UNIQUE INDEX)|ALTER TABLE", text), path.name
        for name in re.findall(r"CREATE OR REPLACE (?:FUNCTION|PROCEDURE) (dispatch\.\w+)\(", text):
            assert name not in defined, f"{name} is defined in {defined[name]} and in {path.name}"
            defined[name] = path.name


def test_python_installer_matches_psql(empty_db: str, db: psycopg.Connection) -> None:
    params = db.info.get_parameters()
    conninfo = psycopg.conninfo.make_conninfo(**{**params, "dbname": empty_db})
    done = install(conninfo)
    assert done[: len(migrations())] == [f"applied migration {m.name}" for m in migrations()]
    assert schema_dump(empty_db) == schema_dump(db.info.dbname)
    assert install(conninfo)[:-1] == []  # nothing left to apply; the last line is the pg_cron status


def test_concurrent_installs_all_succeed_and_apply_each_migration_once(empty_db: str) -> None:
    results: list[subprocess.CompletedProcess[str]] = []

    def run() -> None:
        results.append(psql(empty_db, "-f", str(ROOT / "sql" / "install.sql"), check=False))

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # One transaction each, serialised by an advisory lock: the later ones find the migrations
    # applied and re-apply the code.
    assert [r.returncode for r in results] == [0, 0, 0], [r.stderr for r in results]
    assert sum("applied migration 0001_cron_engine" in r.stdout for r in results) == 1
    rows = psql(empty_db, "-Atc", "SELECT version FROM dispatch.migrations ORDER BY 1").stdout.split()
    assert [int(v) for v in rows] == [m.version for m in migrations()]
    assert psql(empty_db, "-f", str(ROOT / "sql" / "install.sql")).returncode == 0


@pytest.mark.skipif(PG_MAJOR != SNAPSHOT_MAJOR, reason=f"tests/schema.sql is PostgreSQL {SNAPSHOT_MAJOR}'s"
                    " pg_dump (the other dump tests compare dumps of this major)")
def test_schema_snapshot(db: psycopg.Connection) -> None:
    """The schema built from the migrations is the committed snapshot. After an intended
    change: PGDISPATCH_UPDATE_SNAPSHOT=1 scripts/test tests/test_install.py"""
    dump = schema_dump(db.info.dbname)
    if os.environ.get("PGDISPATCH_UPDATE_SNAPSHOT") == "1":
        SNAPSHOT.write_text(dump)
    assert SNAPSHOT.exists(), "no snapshot yet: run with PGDISPATCH_UPDATE_SNAPSHOT=1"
    assert dump == SNAPSHOT.read_text(), "schema differs from tests/schema.sql (see the docstring)"


def test_every_function_has_a_comment(db: psycopg.Connection) -> None:
    missing = db.execute(
        """
        SELECT p.oid::regprocedure::text
        FROM pg_proc p
        WHERE p.pronamespace = 'dispatch'::regnamespace
          AND p.proname !~ '^_'
          AND obj_description(p.oid, 'pg_proc') IS NULL
        """
    ).fetchall()
    assert missing == []


def test_tables_and_columns_of_the_contract(db: psycopg.Connection) -> None:
    columns = {
        (t, c)
        for t, c in db.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = 'dispatch'"
        ).fetchall()
    }
    contract = {
        "schedules": "id project_id function_name cron_expression timezone args enabled deleted_at "
        "next_run_at last_run_at last_status last_error created_at updated_at",
        "runs": "id schedule_id scheduled_for status request_id attempt worker claimed_at lease_until "
        "finished_at error http_status duration_ms",
        "audit_log": "id at actor_id project_id action ip_hash user_agent metadata",
    }
    for table, names in contract.items():
        for name in names.split():
            assert (table, name) in columns, f"dispatch.{table}.{name} is missing"


def test_pg_cron_sql_requires_the_dispatch_database() -> None:
    out = psql("postgres", "-f", str(ROOT / "sql" / "pg_cron.sql"), check=False)
    assert out.returncode != 0
    assert "-v dispatch_db=NAME" in out.stderr


# The last release before sql/ was split into migrations/ and code/ (issue 10).
UPGRADE_FROM = "3b94f50"


@pytest.fixture
def sql_of_upgrade_from(tmp_path: Path) -> Path:
    """sql/ as of UPGRADE_FROM, from git history."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", UPGRADE_FROM, "sql"],
                             capture_output=True, check=False)
    if archive.returncode != 0:  # a shallow clone: say so rather than fail on something else
        pytest.skip(f"commit {UPGRADE_FROM} is not in this clone: {archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "sql"


def _rows(dbname: str, query: str) -> list[str]:
    return psql(dbname, "-AtXc", query).stdout.splitlines()


def test_upgrade_from_the_previous_release_matches_a_fresh_install_and_keeps_the_data(
    empty_db: str, db: psycopg.Connection, sql_of_upgrade_from: Path
) -> None:
    psql(empty_db, "-q", "-f", str(sql_of_upgrade_from / "install.sql"))
    # The schedules below are on '*/5 * * * *': a boundary passed while their data is written
    # makes all of them due, and the claims take every one. Written after the next boundary when
    # it is close.
    row = db.execute("SELECT 300 - extract(epoch FROM now())::numeric % 300").fetchone()
    assert row is not None
    if row[0] < 10:
        time.sleep(float(row[0]) + 0.5)
    # Data as that release made it, with the API of that release, including the two states it
    # let a write leave behind: a live schedule without a next_run_at, and one stuck on a slot
    # that already finished (issue 10, scenarios 3 and 8).
    due = "UPDATE dispatch.schedules SET next_run_at = date_trunc('minute', now()) - interval '10 minutes'"
    run_of = "(SELECT r.id FROM dispatch.runs r JOIN dispatch.schedules s ON s.id = r.schedule_id WHERE {})"
    statements = f"""
        INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, timezone, args,
                                        max_attempts)
        SELECT 'p' || g, 'fn' || g, '*/5 * * * *', CASE WHEN g % 2 = 0 THEN 'Europe/Berlin' ELSE 'UTC' END,
               jsonb_build_object('n', g), CASE WHEN g = 4 THEN 1 ELSE 3 END
        FROM generate_series(1, 8) g;
        {due} WHERE function_name IN ('fn1', 'fn2', 'fn3');
        SELECT dispatch.tick();
        SELECT count(*) FROM dispatch.claim_runs('old', 10, '1 hour');
        SELECT {run_of.format("s.function_name = 'fn1'")} AS fn1,
               {run_of.format("s.function_name = 'fn2'")} AS fn2 \\gset
        CALL dispatch.complete_run(:fn1, 'old', 'ok');
        CALL dispatch.complete_run(:fn2, 'old', 'error', 'boom', 500, 12);
        {due} WHERE function_name = 'fn4';
        SELECT dispatch.tick();
        SELECT count(*) FROM dispatch.claim_runs('old', 10, '10 milliseconds');
        DO $$ BEGIN  -- until fn4's lease has passed: the next tick ends it lost (its only attempt)
            WHILE EXISTS (SELECT 1 FROM dispatch.runs WHERE lease_until >= clock_timestamp()
                          AND lease_until < now() + interval '1 minute') LOOP
                PERFORM pg_sleep(0.01);
            END LOOP;
        END $$;
        SELECT dispatch.tick();
        {due} WHERE function_name IN ('fn5', 'fn6', 'fn7', 'fn8');
        SELECT dispatch.tick();
        UPDATE dispatch.schedules SET enabled = false WHERE function_name = 'fn5';
        UPDATE dispatch.schedules SET deleted_at = now() WHERE function_name = 'fn6';
        UPDATE dispatch.schedules SET next_run_at = NULL WHERE function_name = 'fn7';
        UPDATE dispatch.schedules s SET next_run_at = r.scheduled_for
        FROM dispatch.runs r WHERE r.schedule_id = s.id AND s.function_name = 'fn1';
    """
    script = sql_of_upgrade_from.parent / "data.sql"
    script.write_text(statements)
    psql(empty_db, "-q", "-f", str(script))  # autocommit: a transaction per statement
    # the columns of that release (later ones add their own, NULL for old rows)
    runs_query = ("SELECT row(id, schedule_id, scheduled_for, status, request_id, attempt, worker,"
                  " claimed_at, lease_until, finished_at, error, http_status, duration_ms, created_at)::text"
                  " FROM dispatch.runs ORDER BY id")
    audit_query = "SELECT a::text FROM dispatch.audit_log a ORDER BY id"
    definitions_query = ("SELECT concat_ws(' ', id, project_id, function_name, cron_expression, timezone,"
                         " args, enabled, deleted_at, last_run_at, last_status, last_error, created_at)"
                         " FROM dispatch.schedules ORDER BY function_name")
    before = [_rows(empty_db, q) for q in (runs_query, audit_query, definitions_query)]
    assert sorted(r.split(",")[3] for r in before[0]) == ["error", "lost", "ok", "pending", "pending",
                                                          "running", "skipped", "skipped"]

    upgraded = psql(empty_db, "-f", str(ROOT / "sql" / "install.sql"))
    assert upgraded.stdout.splitlines()[:3] == ["applied migration 0011_invariants",
                                                "applied migration 0012_run_policies",
                                                "applied migration 0013_run_kinds"]
    assert schema_dump(empty_db) == schema_dump(db.info.dbname)
    assert [_rows(empty_db, q) for q in (runs_query, audit_query, definitions_query)] == before

    # The states no write may leave are repaired: every live schedule has a future past its
    # last finished slot (invariant 2), which the new constraints now hold it to.
    assert _rows(empty_db, """
        SELECT concat_ws(' ', function_name, (next_run_at IS NOT NULL)::text,
                         coalesce((next_run_at > last_slot)::text, '-'))
        FROM dispatch.schedules ORDER BY function_name""") == [
        "fn1 true true", "fn2 true true", "fn3 true -", "fn4 true true", "fn5 false -", "fn6 false -",
        "fn7 true -", "fn8 true -"]
    # And the new API works on the old data: the running run (fn2's was finished; fn3's is
    # claimed on attempt 1) completes fenced by its attempt.
    assert _rows(empty_db, """
        SELECT recorded FROM dispatch.complete_runs(
            'new', ARRAY(SELECT id FROM dispatch.runs WHERE status = 'running'), '{1}', '{ok}', '{NULL}',
            '{200}', '{5}')""") == ["t"]
