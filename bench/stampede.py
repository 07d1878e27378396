"""Stampede benchmark: the top of the hour for 100,000 tenants on `0 * * * *`, no jitter.

    .venv/bin/python -m bench.stampede [--schedules 100000] [--listeners 1,2] [--concurrency 64]
                                       [--projects 1000] [--rounds 1]

Every schedule is due at the same instant. First the marking alone: dispatch.tick() at that
instant, called by this process with no listener running, timed and rolled back; then the same
with every schedule jittered over 45 minutes. Then, for each --listeners count, real
`pgdispatch listen` processes whose timers tick at the instant, against one nginx sink
(bench/sink.py): when the first, the median and the last request arrived after the instant, the
listeners' peak RSS, and whether any lease expired (a run claimed twice).

--projects N spreads the schedules over N tenants of skewed sizes, a few large and many with
one or two schedules (bench.common.TENANTS; 'p1'.., none of them in dispatch.projects; 1: the
one project 'bench');
--rounds R repeats each listener count's round R times on the same database. Each round also
prints how long the slowest run waited between its marking and its claim (runs.created_at to
runs.claimed_at).

Goals: first invocation ≤ 0.5 s after the instant; all invoked ≤ 15 s with one
listener, ≤ 12 s with two; RSS ≤ 150 MB; no lease expiring.

--statements profiles the database side: the cluster is restarted with pg_stat_statements
(track = all, so the statements inside dispatch's functions count too), and after each listener
round the statements that took the most time are printed, in microseconds a run. The profiler
costs time of its own: the figures of such a run are not the results table's.

--with-pg-cron puts the instant on a minute boundary and installs pg_cron's dispatch-tick for the
database, as at a user's top of the hour: pg_cron's tick then marks, in one statement, whatever
due schedules the listeners' chunks have not locked, at the same instant (by default the bench
database has no pg_cron job and the instant is a whole second, so the listeners are measured
alone). Its figures are printed, not put in the results table.

The private cluster (--dir, default .pgdata/bench-stampede-durable) is durable, with PostgreSQL's
defaults; --fsync-off uses one with fsync, synchronous_commit and full_page_writes off
(.pgdata/bench-stampede-fsync-off), labelled as such.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import psycopg

from bench.common import (
    PROJECTS,
    cluster_dir,
    cluster_kind,
    memory_kb,
    record,
    recreate_database,
    start_cluster,
    stop_cluster,
    tenants,
)
from bench.dispatch import end_to_end, listeners
from bench.sink import NginxSink

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "bench_stampede"

__all__ = ["measure"]


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set (VmHWM), in MB."""
    return memory_kb(pid).get("VmHWM", 0) / 1024


def marking_s(db: psycopg.Connection, schedules: int, jitter: str | None = None) -> float:
    """How long dispatch.tick() takes to mark `schedules` due at one instant (rolled back), each
    with `jitter` if given (its runs then wait for their instants, not_before)."""
    with db.transaction(force_rollback=True):
        if jitter is not None:
            db.execute("UPDATE dispatch.schedules SET jitter = %s::interval", (jitter,))
        instant = db.execute("UPDATE dispatch.schedules SET next_run_at = date_trunc('second', now())"
                             " + interval '1 hour' RETURNING next_run_at").fetchone()
        assert instant is not None
        started = time.perf_counter()
        marked = db.execute("SELECT dispatch.tick(%s)", instant).fetchone()
        took = time.perf_counter() - started
    assert marked == (schedules,), marked
    return took


# The marking alone again with every schedule jittered (docs/schedules.md, "Interval schedules
# and jitter"): each run's fire instant is then computed as it is marked.
MARKING_JITTER = "45 minutes"

# as SQL (a list, not one quoted name)
STATEMENTS_SETTINGS = {"shared_preload_libraries": "pg_cron, pg_stat_statements",
                       "pg_stat_statements.track": "'all'"}


def set_statements_profile(port: str, on: bool) -> None:
    """pg_stat_statements on (or off) from the cluster's next start. Its own settings are known
    only once the library is loaded: set again after that start, they apply at the reload."""
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True) as conn:
        loaded = conn.execute("SELECT count(*) FROM pg_settings WHERE name = 'pg_stat_statements.track'"
                              ).fetchone() == (1,)
        for name, value in STATEMENTS_SETTINGS.items():
            if name.startswith("pg_stat_statements.") and not loaded:
                continue
            conn.execute(f"ALTER SYSTEM SET {name} = {value}" if on else f"ALTER SYSTEM RESET {name}")
        conn.execute("SELECT pg_reload_conf()")


def print_statements(db: psycopg.Connection, runs: int, top: int = 14) -> None:
    """The statements that took the most time since the last reset, in us a run."""
    print(f"    database time by statement (pg_stat_statements, track = all; nested ones are part of "
          f"their callers' too), us a run of {runs:,}, and of it JIT compilation:")
    for us, jit_us, calls, query in db.execute(
        "SELECT total_exec_time * 1000 / %s, (jit_generation_time + jit_inlining_time + jit_optimization_time"
        " + jit_emission_time) * 1000 / %s, calls, left(regexp_replace(query, '\\s+', ' ', 'g'), 90)"
        " FROM pg_stat_statements"
        " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " ORDER BY total_exec_time DESC LIMIT %s", (runs, runs, top),
    ).fetchall():
        print(f"      {us:8.1f}  JIT {jit_us:6.1f}  {calls:>7,} calls  {query}")


def measure(*, schedules: int, listener_counts: list[int], concurrency: int, data_dir: Path,
            log_level: str = "info", statements: bool = False, fast: bool = False,
            with_pg_cron: bool = False, projects: int = PROJECTS, rounds: int = 1) -> dict[str, float]:
    port = start_cluster(data_dir, fast=fast)
    if statements:
        set_statements_profile(port, True)
        stop_cluster(data_dir)
        port = start_cluster(data_dir, fast=fast)
        set_statements_profile(port, True)
    results: dict[str, float] = {}
    admin_url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    try:
        url = recreate_database(port, DATABASE)
        if with_pg_cron:
            with psycopg.connect(admin_url, autocommit=True) as admin:
                admin.execute("SELECT cron.schedule_in_database('dispatch-tick', '* * * * *',"
                              " 'SELECT dispatch.tick()', %s)", (DATABASE,))
        with NginxSink() as sink, psycopg.connect(url, autocommit=True) as db:
            print(f"stampede: {schedules:,} schedules on '0 * * * *' in {projects:,} project(s), no jitter, "
                  f"all due at one instant; "
                  f"nginx sink; {os.cpu_count()} CPUs shared by PostgreSQL, sink and listeners; "
                  f"{'on a minute boundary, with pg_cron ticking then too; ' if with_pg_cron else ''}"
                  f"cluster {cluster_kind(fast)}")
            rows, params = tenants(schedules, projects)
            db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, args)"
                       f" SELECT t.project_id, 'sink', '0 * * * *', jsonb_build_object('i', i) FROM {rows}",
                       params)
            db.execute("VACUUM ANALYZE dispatch.schedules")
            results["stampede_mark_s"] = marking_s(db, schedules)
            results["stampede_mark_jitter_s"] = marking_s(db, schedules, MARKING_JITTER)
            print(f"  marking alone: dispatch.tick() marks {schedules:,} in "
                  f"{results['stampede_mark_s']:.2f} s; each with a jitter of {MARKING_JITTER}: "
                  f"{results['stampede_mark_jitter_s']:.2f} s")
            if statements:
                db.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            for count, round_no in [(c, r) for c in listener_counts for r in range(1, rounds + 1)]:
                if statements:
                    db.execute("SELECT pg_stat_statements_reset()")
                with listeners(count, url=url, template=sink.template, concurrency=concurrency,
                               log_dir=data_dir, log_level=log_level) as pids:
                    result = end_to_end(db, sink, runs=schedules, listener_pids=pids,
                                        pg_dir=data_dir / "data", lead_s=8, on_minute=with_pg_cron)
                    rss = max(peak_rss_mb(pid) for pid in pids)
                instant_runs = db.execute(
                    "SELECT count(*) FILTER (WHERE attempt > 1), count(*) FILTER (WHERE status <> 'ok'),"
                    " extract(epoch FROM max(claimed_at - created_at))::float8"
                    " FROM dispatch.runs WHERE scheduled_for = (SELECT max(scheduled_for) FROM dispatch.runs)"
                ).fetchone()
                assert instant_runs is not None
                seconds = [latency / 1000 for latency in result.latencies]
                first, median, last = min(seconds), statistics.median(seconds), max(seconds)
                key = f"stampede_{count}l"
                results |= {f"{key}_first_s": first, f"{key}_median_s": median, f"{key}_last_s": last,
                            f"{key}_rss_mb": rss, f"{key}_retried": float(instant_runs[0]),
                            f"{key}_rate": result.rate}
                label = f"{count} listener(s)" + (f", round {round_no}" if rounds > 1 else "")
                print(f"  {label}: first request {first:.2f} s after the instant, median "
                      f"{median:.2f} s, last {last:.2f} s ({result.rate:,.0f} runs/s); peak RSS "
                      f"{rss:.0f} MB; runs claimed more than once (a lease expired) {instant_runs[0]}; "
                      f"not ok {instant_runs[1]}; longest wait from marked to claimed "
                      f"{instant_runs[2]:.2f} s")
                if statements:
                    print_statements(db, schedules)
                db.execute("TRUNCATE dispatch.runs, dispatch.audit_log")
    finally:
        if statements:
            set_statements_profile(port, False)
        if with_pg_cron:
            with psycopg.connect(admin_url, autocommit=True) as admin:
                admin.execute("SELECT cron.unschedule(jobid) FROM cron.job WHERE database = %s", (DATABASE,))
        stop_cluster(data_dir, check=False)
    if statements or with_pg_cron:
        return results  # the profiler's figures, or pg_cron's, are not the results table's
    record(stampede_schedules=schedules, stampede_cluster=cluster_kind(fast), **results)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schedules", type=int, default=100_000)
    parser.add_argument("--listeners", default="1,2", help="listener processes, comma-separated counts")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--dir", type=Path, help="the private cluster's folder (default: one per kind)")
    parser.add_argument("--fsync-off", action="store_true",
                        help="a cluster with fsync, synchronous_commit and full_page_writes off "
                             "(not durable)")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--with-pg-cron", action="store_true",
                        help="the instant on a minute boundary, with pg_cron's dispatch-tick installed "
                             "for the database: it fires then too, as at a user's top of the hour")
    parser.add_argument("--statements", action="store_true",
                        help="profile the database's statements with pg_stat_statements (see above)")
    parser.add_argument("--projects", type=int, default=PROJECTS,
                        help=f"tenants the schedules are spread over (default {PROJECTS:,}; 1: one project)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds for each listener count")
    args = parser.parse_args()
    measure(schedules=args.schedules, listener_counts=[int(n) for n in args.listeners.split(",")],
            concurrency=args.concurrency, data_dir=args.dir or cluster_dir("bench-stampede", args.fsync_off),
            log_level=args.log_level, statements=args.statements, fast=args.fsync_off,
            with_pg_cron=args.with_pg_cron, projects=args.projects, rounds=args.rounds)


if __name__ == "__main__":
    main()
