"""Issue 22's design lever, measured on the database alone: claiming straight from the due slots.

    .venv/bin/python -m bench.lever [--runs 10000] [--rounds 3] [--batch 64]

Today a run's row is written three times: marked `pending` (the tick), moved to `running` (the
claim), finished (complete_runs, with the schedule's advance and the audit row). A listener
that claimed straight from the due schedules, inserting each run as `running` under its lease,
would save the middle version and its index entries. This measures what that saves, with a
prototype of such a claim that this module installs in its own database only
(`dispatch._bench_claim_due`, never part of sql/): the due schedules no run policy has to decide,
locked SKIP LOCKED in slot order, their runs inserted `running`, the claim's columns returned.
It is a lower bound on the real thing's cost: it leaves out what a real one would need (the
policies' cases, jitter, misfire grace, the marking's second look under READ COMMITTED).

Both paths run in one session on the durable bench cluster, alternately, `--rounds` each, over
`--runs` schedules all due: (a) today: dispatch.tick() marks them, then claim_runs and
complete_runs in batches; (b) the lever: _bench_claim_due and complete_runs in batches. Per run:
the session's backend CPU (from /proc: the database's own work, whatever else the machine
does), WAL bytes, and runs/s of the session."""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg

from bench.common import fresh_database, process_cpu_s

PROTOTYPE = """
CREATE OR REPLACE FUNCTION dispatch._bench_claim_due(worker text, max_runs integer, lease interval)
RETURNS TABLE (run_id bigint, schedule_id uuid, project_id text, function_name text, args jsonb,
               request_id text, scheduled_for timestamptz, attempt integer, lease_until timestamptz,
               fire_at timestamptz)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
    WITH due AS MATERIALIZED (
        SELECT s.id, s.next_run_at, s.project_id, s.function_name, s.args
        FROM dispatch.schedules s
        WHERE s.next_run_at <= now() AND s.overlap <> 'allow' AND s.backoff_reason IS NULL
          AND NOT EXISTS (SELECT 1 FROM dispatch.runs x
                          WHERE x.schedule_id = s.id AND x.status IN ('pending', 'running'))
        ORDER BY s.next_run_at
        LIMIT _bench_claim_due.max_runs
        FOR NO KEY UPDATE OF s SKIP LOCKED
    ), started AS (
        INSERT INTO dispatch.runs (schedule_id, project_id, scheduled_for, fire_at, status, worker,
                                   claimed_at, lease_until, attempt)
        SELECT d.id, d.project_id, d.next_run_at, d.next_run_at, 'running', worker, now(), now() + lease, 1
        FROM due d
        RETURNING id, schedule_id, request_id, scheduled_for, attempt, lease_until, fire_at
    )
    SELECT r.id, r.schedule_id, d.project_id, d.function_name, d.args, r.request_id, r.scheduled_for,
           r.attempt, r.lease_until, r.fire_at
    FROM started r JOIN due d ON d.id = r.schedule_id
$$;
"""

CLAIM = "SELECT run_id, attempt FROM dispatch.claim_runs('bench', %s, '60 seconds')"
CLAIM_DUE = "SELECT run_id, attempt FROM dispatch._bench_claim_due('bench', %s, '60 seconds')"
COMPLETE = "SELECT count(*) FROM dispatch.complete_runs('bench', %s, %s, %s, %s, %s, %s)"


def one_round(conn: psycopg.Connection, runs: int, batch: int, lever: bool) -> tuple[float, float, float]:
    """(backend CPU µs a run, WAL bytes a run, runs/s) for one round of `runs` due schedules."""
    conn.execute("UPDATE dispatch.schedules SET next_run_at = clock_timestamp() - interval '10 seconds'")
    conn.execute("VACUUM ANALYZE dispatch.runs")
    conn.execute("VACUUM ANALYZE dispatch.schedules")
    (pid,) = conn.execute("SELECT pg_backend_pid()").fetchone()  # type: ignore[misc]
    (lsn0,) = conn.execute("SELECT pg_current_wal_lsn()").fetchone()  # type: ignore[misc]
    cpu0, started = process_cpu_s(pid), time.perf_counter()
    if not lever:
        assert conn.execute("SELECT dispatch.tick()").fetchone() == (runs,)
    done = 0
    while rows := conn.execute(CLAIM_DUE if lever else CLAIM, (batch,)).fetchall():
        ids = [r[0] for r in rows]
        conn.execute(COMPLETE, (ids, [r[1] for r in rows], ["ok"] * len(ids), [None] * len(ids),
                                [200] * len(ids), [12] * len(ids)))
        done += len(ids)
    elapsed, cpu = time.perf_counter() - started, process_cpu_s(pid) - cpu0
    (wal,) = conn.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", (lsn0,)).fetchone()  # type: ignore[misc]
    assert done == runs, (done, runs)
    return cpu / runs * 1e6, int(wal) / runs, runs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64, help="runs a claim, as a listener's concurrency")
    args = parser.parse_args()

    with psycopg.connect(fresh_database("bench_lever"), autocommit=True) as conn:
        conn.execute(PROTOTYPE)
        conn.execute(
            "INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
            " SELECT 'bench', 'sink', '0 0 1 1 *' FROM generate_series(1, %s)", (args.runs,))
        one_round(conn, args.runs, args.batch, lever=False)  # warm-up: caches, first page images
        figures: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
        for _ in range(args.rounds):
            for lever in (False, True):
                figures[lever].append(one_round(conn, args.runs, args.batch, lever))
    print(f"claiming straight from due slots: {args.runs:,} due, batches of {args.batch}, one session,"
          f" {args.rounds} rounds each, alternately; durable cluster")
    for lever, label in ((False, "today: tick, claim_runs, complete_runs"),
                         (True, "lever: _bench_claim_due, complete_runs")):
        cpu, wal, rate = (statistics.median(f[k] for f in figures[lever]) for k in range(3))
        print(f"  {label:<40} backend CPU {cpu:6.1f} us a run   WAL {wal:6,.0f} bytes a run"
              f"   {rate:7,.0f} runs/s")
    base = [statistics.median(f[k] for f in figures[False]) for k in range(3)]
    lever_ = [statistics.median(f[k] for f in figures[True]) for k in range(3)]
    print(f"  lever / today: CPU x{lever_[0] / base[0]:.2f}, WAL x{lever_[1] / base[1]:.2f},"
          f" runs/s x{lever_[2] / base[2]:.2f}")


if __name__ == "__main__":
    main()
