"""sql/install.sql: installs on an empty database, changes nothing when run again, and its
migrations are numbered, listed and recorded; the Python installer applies the same files."""

from __future__ import annotations

import os
import re
import subprocess
import threading
from collections.abc import Iterator

import psycopg
import pytest

from dispatcher.migrations import install, migrations
from tests.conftest import ROOT, psql

SNAPSHOT = ROOT / "tests" / "schema.sql"


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
            "/usr/lib/postgresql/15/bin/pg_dump",
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


def test_install_says_where_pg_cron_is(empty_db: str) -> None:
    out = psql(empty_db, "-f", str(ROOT / "sql" / "install.sql")).stdout
    # The test cluster runs pg_cron in database postgres, not in this one.
    assert "pg_cron lives in database postgres: register the jobs there with" in out
    assert f"psql -d postgres -v dispatch_db={empty_db} -f sql/pg_cron.sql" in out


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


def test_migrations_are_plain_sql() -> None:
    for migration in migrations():
        for number, line in enumerate(migration.path.read_text().splitlines(), 1):
            assert not line.lstrip().startswith("\\"), (
                f"{migration.path.name}:{number} is a psql meta-command"
            )


def test_python_installer_matches_psql(empty_db: str, db: psycopg.Connection) -> None:
    params = db.info.get_parameters()
    conninfo = psycopg.conninfo.make_conninfo(**{**params, "dbname": empty_db})
    done = install(conninfo)
    assert done[: len(migrations())] == [f"applied migration {m.name}" for m in migrations()]
    assert schema_dump(empty_db) == schema_dump(db.info.dbname)
    assert install(conninfo)[:-1] == []  # nothing left to apply; the last line is the pg_cron status


def test_concurrent_installs_apply_each_migration_once(empty_db: str) -> None:
    results: list[subprocess.CompletedProcess[str]] = []

    def run() -> None:
        results.append(psql(empty_db, "-f", str(ROOT / "sql" / "install.sql"), check=False))

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert any(r.returncode == 0 for r in results)
    for r in results:
        # A loser fails on the bookkeeping row, before changing anything.
        assert r.returncode == 0 or "migrations_pkey" in r.stderr or "already exists" in r.stderr, r.stderr
    rows = psql(empty_db, "-Atc", "SELECT version FROM dispatch.migrations ORDER BY 1").stdout.split()
    assert [int(v) for v in rows] == [m.version for m in migrations()]
    assert psql(empty_db, "-f", str(ROOT / "sql" / "install.sql")).returncode == 0


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
