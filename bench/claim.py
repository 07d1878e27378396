"""Claiming stays fast however much history dispatch.runs holds, and what a run costs on disk.

    .venv/bin/python -m bench.claim [--pending 100000] [--finished 10000000] [--write-cost-only]

1. claim_runs(worker, 100, lease) with --pending pending runs, before and after loading
   --finished finished runs: median ms per claim (each rolled back), and the plan's index.
2. Write cost of one dispatched run (mark + claim + complete_runs, audit row included): WAL
   bytes from pg_current_wal_lsn() and table + index growth, per run, over 10,000 runs, and
   each step's share (WAL bytes and statement time a run)."""

from __future__ import annotations

import argparse
import re
import subprocess
import time
from typing import Any

import psycopg

from bench.common import CLUSTER_DIR, fresh_database, median_ms, record

PGBIN = "/usr/lib/postgresql/15/bin"
RECORD = re.compile(r"rmgr: (?P<rmgr>\S+)\s+len \(rec/tot\):\s*\d+/\s*(?P<total>\d+),")
BLOCK = re.compile(r"blkref #0: rel \d+/\d+/(\d+)")


def load_schedules(conn: psycopg.Connection, count: int) -> None:
    conn.execute("SET session_replication_role = replica")  # bulk load: triggers off
    conn.execute(
        """
        INSERT INTO dispatch.schedules
            (project_id, function_name, cron_expression, timezone, cron_spec, next_run_at)
        SELECT 'proj_' || g %% 1000, 'fn', '*/5 * * * *', 'UTC', dispatch.cron_parse('*/5 * * * *'),
               now() + interval '1 day'
        FROM generate_series(1, %s) g
        """,
        (count,),
    )
    conn.execute("RESET session_replication_role")


def claim_ms(conn: psycopg.Connection, repeat: int = 200) -> float:
    samples = []
    for _ in range(repeat):
        with conn.transaction(force_rollback=True):
            started = time.perf_counter()
            rows = conn.execute("SELECT * FROM dispatch.claim_runs('bench', 100, '1 minute')").fetchall()
            samples.append(time.perf_counter() - started)
            assert len(rows) == 100
    return median_ms(samples)


def claim_plan(conn: psycopg.Connection) -> str:
    plan = conn.execute(
        "EXPLAIN SELECT r.id FROM dispatch.runs r WHERE r.project_id = 'bench' AND r.status = 'pending'"
        " AND r.not_before IS NULL ORDER BY r.project_id, r.scheduled_for, r.id LIMIT 100"
        " FOR UPDATE SKIP LOCKED"
    ).fetchall()
    return next((line for (line,) in plan if "Index" in line), "no index used").strip()


def wal_by_relation(conn: psycopg.Connection, since: str, runs: int) -> list[tuple[str, float]]:
    """WAL bytes per run since `since`, by the relation each record changed (its first block
    reference; commits and other records without one under their resource manager)."""
    (until,) = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()  # type: ignore[misc]
    dump = subprocess.run(
        [f"{PGBIN}/pg_waldump", "--path", str(CLUSTER_DIR / "data" / "pg_wal"), "--start", str(since),
         "--end", str(until)],
        check=True, capture_output=True, text=True,
    ).stdout
    names: dict[str, str] = dict(
        conn.execute("SELECT pg_relation_filenode(oid)::text, relname::text FROM pg_class").fetchall()
    )
    sizes: dict[str, int] = {}
    for line in dump.splitlines():
        found = RECORD.match(line)
        if found is None:
            continue
        block = BLOCK.search(line)
        key = names.get(block[1], f"relation {block[1]}") if block else f"({found['rmgr']} records)"
        sizes[key] = sizes.get(key, 0) + int(found["total"])
    ranked = sorted(sizes.items(), key=lambda item: -item[1])
    return [(name, size / runs) for name, size in ranked if size / runs >= 10]


def _step(conn: psycopg.Connection, tally: list[float], sql: str, params: tuple[object, ...] = ()
          ) -> list[tuple[Any, ...]]:
    """Run `sql`, adding its WAL bytes and seconds to tally."""
    (before,) = conn.execute("SELECT pg_current_wal_lsn()").fetchone()  # type: ignore[misc]
    started = time.perf_counter()
    rows = conn.execute(sql, params).fetchall()  # type: ignore[arg-type]
    tally[1] += time.perf_counter() - started
    (wal,) = conn.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", (before,)).fetchone()  # type: ignore[misc]
    tally[0] += int(wal)
    return rows


def write_cost(conninfo: str, runs: int) -> None:
    size_sql = (
        "SELECT pg_total_relation_size('dispatch.runs') + pg_total_relation_size('dispatch.audit_log')"
        " + pg_total_relation_size('dispatch.schedules')"
    )
    claim = "SELECT run_id, attempt FROM dispatch.claim_runs('bench', 500, '5 minutes')"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        load_schedules(conn, runs)
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
        print(f"write cost per dispatched run ({runs:,} runs: mark, claim, complete_runs, audit row):")
        # The first round after a checkpoint pays a full-page image for every page it touches
        # first; the second shows the steady state between checkpoints.
        # Each round's slot is due on time (within the last minute: no catch-up to compute), and
        # the second's comes after the first's: a schedule never goes back to a slot before one
        # it has finished (invariant 2; a constraint refuses it).
        for label in ["first round after a checkpoint", "second round (steady state)"]:
            conn.execute("UPDATE dispatch.schedules"
                         " SET next_run_at = clock_timestamp() - interval '10 seconds'")
            (lsn0,) = conn.execute("SELECT pg_current_wal_lsn()").fetchone()  # type: ignore[misc]
            (size0,) = conn.execute(size_sql).fetchone()  # type: ignore[misc]
            # Each step's WAL and time apart: the claim's (pending -> running) is what a claim
            # straight from the due slots would save at most (issue 22's design lever).
            steps: dict[str, list[float]] = {"mark": [0, 0.0], "claim": [0, 0.0], "complete": [0, 0.0]}
            assert _step(conn, steps["mark"], "SELECT dispatch.tick()") == [(runs,)]
            while rows := _step(conn, steps["claim"], claim):
                ids = [r[0] for r in rows]
                _step(conn, steps["complete"],
                      "SELECT count(*) FROM dispatch.complete_runs('bench', %s, %s, %s, %s, %s, %s)",
                      (ids, [r[1] for r in rows], ["ok"] * len(ids), [None] * len(ids), [200] * len(ids),
                       [12] * len(ids)))
            (wal,) = conn.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", (lsn0,)).fetchone()  # type: ignore[misc]
            (size1,) = conn.execute(size_sql).fetchone()  # type: ignore[misc]
            print(
                f"  {label:<32} WAL {int(wal) / runs:,.0f} bytes/run (goal <= 2 kB)"
                f"   table+index growth {(size1 - size0) / runs:,.0f} bytes/run"
            )
            print("    by step: " + ", ".join(f"{name} {b / runs:,.0f} bytes {t / runs * 1e6:,.1f} us"
                                              for name, (b, t) in steps.items()) + " a run")
        # The steady-state round's WAL, record by record, charged to the relation it changed.
        print("  where the steady state's WAL goes (pg_waldump, bytes/run):")
        for name, size in wal_by_relation(conn, lsn0, runs):
            print(f"    {size:7,.0f}  {name}")
        record(wal_bytes_per_run=int(wal) / runs, growth_bytes_per_run=(size1 - size0) / runs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--finished", type=int, default=10_000_000)
    parser.add_argument("--write-cost-only", action="store_true", help="only part 2")
    args = parser.parse_args()
    if args.write_cost_only:
        write_cost(fresh_database("bench_write_cost"), 10_000)
        return

    conninfo = fresh_database("bench_claim")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        load_schedules(conn, args.pending)
        conn.execute(
            "INSERT INTO dispatch.runs (schedule_id, project_id, scheduled_for)"
            " SELECT id, project_id, now() - interval '1 minute' FROM dispatch.schedules"
        )
        conn.execute("VACUUM ANALYZE")
        before = claim_ms(conn)
        print(f"claim_runs(100) with {args.pending:,} pending runs:")
        print(f"  {0:>12,} finished: median {before:6.2f} ms   plan: {claim_plan(conn)}")
        record(claim_ms_empty=before, claim_plan_empty=claim_plan(conn), claim_pending=args.pending)
        started = time.perf_counter()
        per_schedule = max(1, args.finished // args.pending)
        conn.execute(
            """
            INSERT INTO dispatch.runs (schedule_id, project_id, scheduled_for, status, attempt, worker,
                                       claimed_at, lease_until, finished_at, http_status, duration_ms,
                                       created_at)
            SELECT s.id, s.project_id, t, 'ok', 1, 'old', t, t + interval '1 minute', t + interval '1 second',
                   200, 9, t
            FROM generate_series(1, %s) k
            CROSS JOIN dispatch.schedules s
            CROSS JOIN LATERAL (SELECT now() - interval '1 hour' - k * interval '5 minutes') x(t)
            """,
            (per_schedule,),
        )
        conn.execute("VACUUM ANALYZE dispatch.runs")
        loaded = per_schedule * args.pending
        after = claim_ms(conn)
        print(
            f"  {loaded:>12,} finished: median {after:6.2f} ms   plan: {claim_plan(conn)}"
            f"   (loaded in {time.perf_counter() - started:.0f} s)"
        )
        record(claim_ms_full=after, claim_plan_full=claim_plan(conn), claim_finished=loaded)
    write_cost(fresh_database("bench_write_cost"), 10_000)


if __name__ == "__main__":
    main()
