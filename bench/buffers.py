"""Buffer accesses per dispatched run, statement by statement, for this revision and another.

    .venv/bin/python -m bench.buffers [--against 3b94f50] [--runs 10000] [--batch 64] [--explain]
                                        [--cpu-rounds N]

Deterministic where the rates are not: on a durable private cluster (PostgreSQL's defaults,
.pgdata/bench-buffers) with pg_stat_statements (track = all, so the statements inside dispatch's
functions count too), each revision gets a database of its own with its own sql/ installed
(the other revision's from a temporary git worktree), the same --runs schedules
(bench.common.SPREAD_CRON) due at one instant, marked as the listener's clock marks them
(dispatch.tick_chunk from 2,000, four times as many each time, then dispatch.tick()); then, as
the listener does, claim_runs(worker, --batch, lease) and complete_runs for what it returned,
each its own transaction, until nothing is pending. Printed for each revision: shared blocks hit
(and read, dirtied), WAL bytes and execution time (µs) per run by statement, nested ones
included (they are part of their callers' figures too), and the totals of the top-level calls.
Fewer blocks is not less time: a tid scan that saved 3 blocks a run made one statement slower.
--explain also prints the plans of one claim and one completion, nested statements included
(auto_explain, ANALYZE and BUFFERS), and leaves the marking out of the figures. --cpu-rounds N
then times N rounds of the same work for each revision in turn (a fresh set of due schedules
each time): the server process's CPU a run (/proc), for the marking and for claim + complete,
with the medians and the ratio of this tree to REV.
CPU, unlike blocks, carries the machine's noise: read the medians and the rounds' pairs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
from pathlib import Path
from typing import Any

import psycopg

from bench.common import SPREAD_CRON, checkout, install_revision, start_cluster, stop_cluster
from dispatcher.clock import CHUNK_GROWTH, FIRST_CHUNK, MAX_CHUNK

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / ".pgdata" / "bench-buffers"

__all__ = ["ensure_statements", "measure"]


def ensure_statements(port: str, data_dir: Path = DATA_DIR, *, fast: bool = False) -> str:
    """pg_stat_statements loaded with track = all in the cluster of data_dir (restarting it once
    if needed); returns its port."""
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True) as conn:
        loaded = conn.execute("SELECT count(*) FROM pg_settings WHERE name = 'pg_stat_statements.track'"
                              ).fetchone() == (1,)
        if not loaded:
            conn.execute("ALTER SYSTEM SET shared_preload_libraries = pg_cron, pg_stat_statements")
    if not loaded:
        stop_cluster(data_dir)
        port = start_cluster(data_dir, fast=fast)
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'")
        conn.execute("ALTER SYSTEM SET pg_stat_statements.max = 10000")
        conn.execute("SELECT pg_reload_conf()")
    return port


def signature(db: psycopg.Connection) -> int:
    """How many arguments complete_runs takes in this revision (6: no fencing attempts)."""
    row = db.execute("SELECT max(pronargs) FROM pg_proc WHERE proname = 'complete_runs'"
                     " AND pronamespace = 'dispatch'::regnamespace").fetchone()
    assert row is not None
    return int(row[0])


def claim(db: psycopg.Connection, batch: int) -> list[tuple[int, int]]:
    return [(r[0], r[1]) for r in db.execute(
        "SELECT run_id, attempt FROM dispatch.claim_runs('bench-buffers', %s, '60 seconds')", (batch,)
    ).fetchall()]


def complete(db: psycopg.Connection, runs: list[tuple[int, int]], nargs: int) -> None:
    ids = [run_id for run_id, _ in runs]
    n = len(runs)
    if nargs == 6:
        db.execute("SELECT count(*) FROM dispatch.complete_runs('bench-buffers', %s::bigint[], %s::text[],"
                   " %s::text[], %s::integer[], %s::integer[])",
                   (ids, ["ok"] * n, [None] * n, [200] * n, [5] * n))
    else:
        db.execute("SELECT count(*) FROM dispatch.complete_runs('bench-buffers', %s::bigint[], %s::integer[],"
                   " %s::text[], %s::text[], %s::integer[], %s::integer[], NULL, NULL)",
                   (ids, [a for _, a in runs], ["ok"] * n, [None] * n, [200] * n, [5] * n))


def mark(db: psycopg.Connection) -> int:
    """What is due, marked as the listener's clock marks it (dispatcher.clock): chunks from
    FIRST_CHUNK, CHUNK_GROWTH times as many each, while they come back full, then tick(); a
    revision without dispatch.tick_chunk (3b94f50) marks with one tick()."""
    marked = 0
    if db.execute("SELECT to_regproc('dispatch.tick_chunk') IS NOT NULL").fetchone() == (True,):
        chunk = FIRST_CHUNK
        while True:
            row = db.execute("SELECT marked, taken FROM dispatch.tick_chunk(%s)", (chunk,)).fetchone()
            assert row is not None
            marked += row[0]
            if row[1] < chunk:
                break
            chunk = min(CHUNK_GROWTH * chunk, MAX_CHUNK)
    row = db.execute("SELECT dispatch.tick()").fetchone()
    assert row is not None
    return marked + int(row[0])


def explain_one_batch(db: psycopg.Connection, batch: int, nargs: int) -> None:
    """One claim and one completion with every plan (nested ones included) printed."""
    notices: list[str] = []
    db.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    db.execute("LOAD 'auto_explain'")
    for name, value in (("log_min_duration", "0"), ("log_analyze", "on"), ("log_buffers", "on"),
                        ("log_nested_statements", "on"), ("log_timing", "off"), ("log_level", "notice")):
        db.execute(f"SET auto_explain.{name} = {value}")
    runs = claim(db, batch)
    print(f"\n  ---- plans of claim_runs(..., {batch}) ----")
    print("\n".join(notices))
    notices.clear()
    complete(db, runs, nargs)
    print(f"\n  ---- plans of complete_runs({len(runs)} runs) ----")
    print("\n".join(notices))
    db.execute("SET auto_explain.log_min_duration = -1")


def due_at_once(db: psycopg.Connection, runs: int) -> None:
    """runs schedules due at one instant, nothing else in the tables; vacuumed, checkpointed."""
    db.execute("TRUNCATE dispatch.audit_log, dispatch.runs, dispatch.schedules CASCADE")
    db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, args)"
               f" SELECT 'bench', 'sink', {SPREAD_CRON}, jsonb_build_object('i', i)"
               " FROM generate_series(1, %s) i", (runs,))
    db.execute("UPDATE dispatch.schedules"
               " SET next_run_at = date_trunc('minute', now()) - interval '1 minute'")
    db.execute("VACUUM ANALYZE dispatch.schedules")
    db.execute("VACUUM ANALYZE dispatch.runs")
    db.execute("CHECKPOINT")


def backend_cpu_s(pid: int) -> float:
    """User and system CPU seconds of a server process so far (/proc: the cluster is local)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_round(url: str, *, runs: int, batch: int) -> tuple[float, float]:
    """One round: the server's CPU a run, in µs, of the marking and of claim + complete."""
    with psycopg.connect(url, autocommit=True) as db:
        nargs = signature(db)
        due_at_once(db, runs)
        pid = db.info.backend_pid
        start = backend_cpu_s(pid)
        marked = mark(db)
        marking = backend_cpu_s(pid)
        done = 0
        while batch_runs := claim(db, batch):
            complete(db, batch_runs, nargs)
            done += len(batch_runs)
        end = backend_cpu_s(pid)
    return (marking - start) / marked * 1e6, (end - marking) / done * 1e6


def cpu_side_by_side(urls: dict[str, str], *, rounds: int, runs: int, batch: int) -> None:
    """Rounds of both revisions in turn (the order alternates): CPU a run and the medians."""
    print(f"\nserver CPU a run, {rounds} rounds, each revision in turn (one session; a shared machine's"
          " noise is in each figure: compare the medians and the rounds' own pairs)")
    marking: dict[str, list[float]] = {label: [] for label in urls}
    dispatch: dict[str, list[float]] = {label: [] for label in urls}
    labels = list(urls)
    for n in range(rounds):
        for label in labels if n % 2 == 0 else labels[::-1]:
            m, d = cpu_round(urls[label], runs=runs, batch=batch)
            marking[label].append(m)
            dispatch[label].append(d)
            print(f"  round {n + 1} {label:>24}: marking {m:6.1f} µs, claim + complete {d:6.1f} µs a run")
    for label in labels:
        print(f"  median {label:>25}: marking {statistics.median(marking[label]):6.1f} µs,"
              f" claim + complete {statistics.median(dispatch[label]):6.1f} µs a run")
    if len(labels) == 2:
        first, second = labels
        pairs = sorted(dispatch[second][n] / dispatch[first][n] for n in range(rounds))
        print(f"  claim + complete, {second} / {first}: medians x "
              f"{statistics.median(dispatch[second]) / statistics.median(dispatch[first]):.3f};"
              f" the rounds' pairs x {pairs[0]:.2f} to x {pairs[-1]:.2f}")


def measure_revision(label: str, url: str, *, runs: int, batch: int, explain: bool) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        nargs = signature(db)
        due_at_once(db, runs)
        db.execute("SELECT pg_stat_statements_reset()")
        marked = mark(db)
        assert marked == runs, marked
        if explain:
            explain_one_batch(db, batch, nargs)
            db.execute("SELECT pg_stat_statements_reset()")
        done = 0
        while batch_runs := claim(db, batch):
            complete(db, batch_runs, nargs)
            done += len(batch_runs)
        stats = db.execute(
            "SELECT toplevel, calls, shared_blks_hit, shared_blks_read, shared_blks_dirtied, wal_bytes,"
            " total_exec_time,"
            " left(regexp_replace(query, '\\s+', ' ', 'g'), 110)"
            " FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            "  AND query NOT LIKE '%%pg_stat_statements%%'"
            " ORDER BY shared_blks_hit DESC").fetchall()
    print(f"\n{label}: {done:,} runs claimed ({batch} a claim) and completed; blocks a run by statement"
          " (track = all: nested statements are in their callers' figures too)")
    print(f"  {'level':6} {'calls':>7} {'hit/run':>8} {'read/run':>8} {'dirt/run':>8} {'WAL B/run':>9}"
          f" {'µs/run':>7}  query")
    total_hit = 0.0
    for toplevel, calls, hit, read, dirtied, wal, exec_ms, query in stats:
        if toplevel:
            total_hit += hit / done
        if hit / done < 0.05 and exec_ms * 1000 / done < 0.5 and not toplevel:
            continue
        # (the time is the noisy figure: a shared machine's, with the profiler's own cost in it)
        print(f"  {'top' if toplevel else 'nested':6} {calls:>7,} {hit / done:8.2f} {read / done:8.2f}"
              f" {dirtied / done:8.2f} {float(wal) / done:9.0f} {exec_ms * 1000 / done:7.1f}  {query}")
    print(f"  top-level statements: {total_hit:.1f} blocks hit a run")
    return {"runs": done, "hit_per_run": total_hit, "stats": stats}


def measure(*, against: str | None, runs: int, batch: int, explain: bool, cpu_rounds: int) -> None:
    port = ensure_statements(start_cluster(DATA_DIR))
    urls: dict[str, str] = {}
    try:
        with contextlib.ExitStack() as stack:
            if against is not None:
                other = stack.enter_context(checkout(against))
                urls[against] = install_revision(other, port, "bench_buffers_other")
                measure_revision(f"{against}", urls[against], runs=runs, batch=batch, explain=explain)
            head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=True,
                                  capture_output=True, text=True).stdout.strip()
            if subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                              check=True, capture_output=True, text=True).stdout.strip():
                head += "+changes"
            urls[f"this tree ({head})"] = install_revision(ROOT, port, "bench_buffers_this")
            measure_revision(f"this tree ({head})", urls[f"this tree ({head})"], runs=runs, batch=batch,
                             explain=explain)
            if cpu_rounds:
                cpu_side_by_side(urls, rounds=cpu_rounds, runs=runs, batch=batch)
    finally:
        stop_cluster(DATA_DIR, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", metavar="REV", help="measure this git revision too, first")
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=64,
                        help="runs a claim takes (the listener's concurrency)")
    parser.add_argument("--explain", action="store_true",
                        help="print the plans of one claim and one completion (auto_explain)")
    parser.add_argument("--cpu-rounds", type=int, default=0, metavar="N",
                        help="then N rounds of each revision in turn, timed: the server's CPU a run")
    args = parser.parse_args()
    measure(against=args.against, runs=args.runs, batch=args.batch, explain=args.explain,
            cpu_rounds=args.cpu_rounds)


if __name__ == "__main__":
    main()
