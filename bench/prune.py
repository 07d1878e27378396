"""dispatch.prune() on a backlog of old finished runs and audit rows: what a deleted row costs
as the backlog grows. Each batch starts after the last id the previous one saw, so the cost per
row should stay flat; a prune that rescans what its earlier batches deleted (dead until vacuum)
grows with the backlog.

    .venv/bin/python -m bench.prune [--backlogs 100000,400000] [--sql-from REV]

--sql-from installs sql/ as of a git revision instead of the working tree (3b94f50 gives the
figures from before paging by id). Autovacuum is off on the two tables while it runs: the rows
earlier batches deleted stay dead, as they do within one prune on a busy table."""

from __future__ import annotations

import argparse
import io
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import psycopg

from bench.common import ROOT, record, recreate_database, start_cluster

PSQL = "/usr/lib/postgresql/15/bin/psql"


def database(port: str, sql_from: str | None) -> str:
    name = "bench_prune"
    if sql_from is None:
        return recreate_database(port, name)
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", sql_from, "sql"],
                             capture_output=True, check=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        subprocess.run([PSQL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", port,
                        "-U", "postgres", "-d", name, "-f", str(Path(tmp) / "sql" / "install.sql")],
                       check=True, capture_output=True)
    return f"postgresql://postgres@127.0.0.1:{port}/{name}"


def load(conn: psycopg.Connection, backlog: int) -> None:
    conn.execute("TRUNCATE dispatch.runs, dispatch.audit_log")
    sid = conn.execute("SELECT id FROM dispatch.schedules").fetchone()
    if sid is None:
        sid = conn.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
                           " VALUES ('p', 'fn', '0 0 1 1 *') RETURNING id").fetchone()
    assert sid is not None
    conn.execute(
        "INSERT INTO dispatch.runs"
        " (schedule_id, project_id, scheduled_for, status, created_at, finished_at, attempt)"
        " SELECT s.id, s.project_id, now() - interval '30 days' + g * interval '1 second', 'ok',"
        "        now() - interval '20 days', now() - interval '20 days', 1"
        " FROM generate_series(1, %s) g, dispatch.schedules s WHERE s.id = %s", (backlog, sid[0]))
    conn.execute(
        "INSERT INTO dispatch.audit_log (at, action) SELECT now() - interval '100 days', 'schedule.run.ok'"
        " FROM generate_series(1, %s)", (backlog,))
    for table in ("runs", "audit_log"):
        conn.execute(f"ALTER TABLE dispatch.{table} SET (autovacuum_enabled = false)")
        conn.execute(f"VACUUM ANALYZE dispatch.{table}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backlogs", default="100000,400000")
    parser.add_argument("--sql-from", default=None,
                        help="git revision of sql/ to install (default: the working tree)")
    args = parser.parse_args()
    url = database(start_cluster(), args.sql_from)
    label = args.sql_from or "working tree"
    print(f"dispatch.prune(), sql/ of {label}, prune_batch_size 5000, autovacuum off on runs and audit_log")
    print(f"{'backlog':>9} {'runs+audit deleted':>19} {'seconds':>8} {'us per row':>11}")
    backlogs = [int(n) for n in args.backlogs.split(",")]
    costs = []
    with psycopg.connect(url, autocommit=True) as conn:
        for backlog in backlogs:
            load(conn, backlog)
            started = time.perf_counter()
            row = conn.execute("CALL dispatch.prune()").fetchone()
            elapsed = time.perf_counter() - started
            assert row is not None
            deleted = int(row[0]) + int(row[1])
            assert deleted == 2 * backlog, f"pruned {deleted} of {2 * backlog}"
            print(f"{backlog:>9,} {deleted:>19,} {elapsed:>8.2f} {elapsed / deleted * 1e6:>11.1f}")
            costs.append(elapsed / deleted * 1e6)
    record(prune_backlog_small=backlogs[0], prune_backlog_large=backlogs[-1], prune_us_small=costs[0],
           prune_us_large=costs[-1])


if __name__ == "__main__":
    main()
