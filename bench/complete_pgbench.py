"""The database side of the dispatch path alone: how many runs/s PostgreSQL can claim and complete.

    .venv/bin/python -m bench.complete_pgbench [--runs 50000] [--batch 100] [--clients 2]

N schedules (project 'bench', function 'sink', 1,440 distinct expressions: bench.common.SPREAD_CRON)
are all due at once and one `dispatch.tick()` marks N pending runs. Then pgbench, with no HTTP
and no Python in the way, does per script execution what a listener does per batch,
in the same two round trips:

    1. SELECT ... FROM dispatch.claim_runs(worker, B, '60 seconds')      -- \\gset the ids
    2. SELECT count(*) FROM dispatch.complete_runs(worker, ids, attempts, 'ok' x B, NULL x B, 200 x B, 5 x B)
    3. only if 2 answered busy for some: the same again, 2 ms later, then (still busy) 20 ms
       and 200 ms later

Busy is what complete_runs answers for a run another transaction holds: with two clients, a
claim that looked at a run a moment before the other client claimed it keeps that row locked
until its statement ends (PostgreSQL keeps row locks taken while following an update chain),
and the listener records such outcomes at its next call; pgbench's figure for step 3 says how
often that happens. A claim can outlast 2 ms on a busy machine (8 ms on average in one run, where
one retry 2 ms later left 17 runs busy and the check failed): hence the later tries, as the
listener backs off.

Each statement is its own (autocommit) transaction, as in the listener (dispatcher/database.py:
every call is one statement in autocommit mode; claims and completions are separate calls,
seconds apart). Claim and complete could share one statement, `WITH c AS (SELECT run_id FROM
dispatch.claim_runs(...)) SELECT ... FROM dispatch.complete_runs(..., (SELECT array_agg(run_id)
FROM c), ...)` — it does work (the PL/pgSQL function's statements take a new snapshot that sees
the claim's update) — but it would save a commit and a round trip per batch that the listener
pays, so the two-transaction script is the faithful one. The claim statement aggregates the ids
instead of returning the rows as the listener does (pgbench's \\gset wants one row), which saves
the server a little output formatting. Worker 'bench-<client>': each pgbench client is a
listener of its own, racing for the same pending runs (FOR UPDATE SKIP LOCKED).

Figures: runs/s from the database (N / (max(finished_at) - min(claimed_at)); now() is the
transaction start, so the last completion's own duration is left out) and from pgbench
(tps x B, without connection time), pgbench's latency per batch and per statement, the WAL
per run (pg_current_wal_lsn() before and after pgbench) and the CPU PostgreSQL used per run:
the postmaster and all of its processes, including the backends that pgbench started and that
have exited since (counted through the postmaster's cutime/cstime once reaped), the WAL writer,
the checkpointer and any autovacuum worker that ran meanwhile. The mark (tick) is reported apart.
Afterwards all N runs must be 'ok' with N 'schedule.run.ok' audit rows, or the script fails.

The private cluster lives in --dir (default .pgdata/bench-pgbench-durable): durable, with
PostgreSQL's defaults, like bench/dispatch.py's, so that the figures are comparable with its
"PostgreSQL CPU a run" (which also holds the mark, reported apart here). --fsync-off uses one
with the test clusters' fast settings (fsync, synchronous_commit and full_page_writes off,
.pgdata/bench-pgbench-fsync-off): the database's CPU, not the disk's, labelled as such (bench.claim
measures the WAL on a durable cluster, full-page images included). It is stopped at the end.
The machine is shared: the CPU per run is steadier than the rates.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.common import (
    SPREAD_CRON,
    children,
    cluster_cpu_s,
    cluster_dir,
    process_cpu_s,
    record,
    recreate_database,
    start_cluster,
    stop_cluster,
)

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "bench_pgbench"
LEASE = "60 seconds"

# One pgbench script execution = one listener batch: claim (transaction 1), complete (transaction 2).
CLAIM = """\
SELECT coalesce(array_agg(run_id), '{}') AS ids, coalesce(array_agg(attempt), '{}') AS attempts, \
count(*) AS n \
FROM dispatch.claim_runs(concat('bench-', :client_id::int), :batch::int, :lease::interval) \\gset
"""
COMPLETE = """\
SELECT count(*) FILTER (WHERE busy) AS busy FROM dispatch.complete_runs(concat('bench-', :client_id::int), \
:ids::bigint[], :attempts::integer[], array_fill('ok'::text, ARRAY[:n::int]), \
array_fill(NULL::text, ARRAY[:n::int]), array_fill(200, ARRAY[:n::int]), array_fill(5, ARRAY[:n::int])) \\gset
"""
BUSY_RETRY_MS = (2, 20, 200)  # pgbench has no loop: one nested \\if a retry
SCRIPT = (CLAIM + COMPLETE + "".join(f"\\if :busy > 0\n\\sleep {ms} ms\n{COMPLETE}" for ms in BUSY_RETRY_MS)
          + "\\endif\n" * len(BUSY_RETRY_MS))


def pgbench_binary() -> str:
    for candidate in ("/usr/lib/postgresql/15/bin/pgbench", "/usr/bin/pgbench"):
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("pgbench")
    if found is None:
        raise SystemExit("bench: pgbench not found (apt-get install postgresql-client-15)")
    return found


def wait_for_backends_gone(postmaster: int, keep: set[int], within: float = 30.0) -> None:
    """Wait until the backends pgbench used have exited and been reaped, so that their CPU time
    has reached the postmaster's cutime/cstime. `keep` are the processes there before pgbench."""
    deadline = time.monotonic() + within
    while True:
        new = [pid for pid in children(postmaster) if pid not in keep and is_client_backend(pid)]
        if not new:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: pgbench's backends {new} did not exit")
        time.sleep(0.02)


def is_client_backend(pid: int) -> bool:
    """A backend of a connection to the bench database, or an exited process not yet reaped."""
    try:
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return True
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return f" {DATABASE} " in title and "autovacuum" not in title


def parse_pgbench(output: str) -> tuple[float, float, list[tuple[float, str]]]:
    """tps (without connection time), latency average in ms, and per-statement latencies."""
    tps = re.search(r"^tps = ([\d.]+) \(without initial connection time\)", output, re.M)
    latency = re.search(r"^latency average = ([\d.]+) ms", output, re.M)
    if tps is None or latency is None:
        raise SystemExit(f"bench: cannot read pgbench's output:\n{output}")
    statements = []
    for match in re.finditer(r"^\s+([\d.]+)\s+\d+\s+(SELECT .*)$", output, re.M):
        statements.append((float(match[1]), match[2]))
    return float(tps[1]), float(latency[1]), statements


def one(db: psycopg.Connection, query: str, params: tuple[Any, ...] = ()) -> tuple[Any, ...]:
    row = db.execute(query, params).fetchone()
    assert row is not None
    return row


def mark_due(db: psycopg.Connection, runs: int) -> tuple[float, float]:
    """Load `runs` schedules (SPREAD_CRON), all due at the previous minute, and mark them with one
    dispatch.tick(); returns the tick's seconds and WAL bytes."""
    # bulk load: triggers off, so the spec and the slot are set here rather than by the write trigger
    db.execute("SET session_replication_role = replica")
    db.execute(
        "INSERT INTO dispatch.schedules"
        " (project_id, function_name, cron_expression, timezone, cron_spec, next_run_at, args)"
        f" SELECT 'bench', 'sink', {SPREAD_CRON}, 'UTC', dispatch.cron_parse({SPREAD_CRON}),"
        "        date_trunc('minute', now()) - interval '1 minute', jsonb_build_object('i', i)"
        " FROM generate_series(1, %s) i",
        (runs,),
    )
    db.execute("RESET session_replication_role")
    db.execute("VACUUM ANALYZE dispatch.schedules")
    (lsn,) = one(db, "SELECT pg_current_wal_lsn()")
    started = time.perf_counter()
    (marked,) = one(db, "SELECT dispatch.tick()")
    tick_s = time.perf_counter() - started
    (wal,) = one(db, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn,))
    if marked != runs:
        raise SystemExit(f"bench: dispatch.tick() marked {marked} runs, not {runs}")
    # What autovacuum would soon do on a live system; then a checkpoint, so that none falls
    # inside the measured interval.
    db.execute("VACUUM ANALYZE dispatch.runs")
    db.execute("CHECKPOINT")
    return tick_s, float(wal)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50_000, help="runs due at once (default 50,000)")
    parser.add_argument("--batch", type=int, default=100, help="runs a claim takes (default 100)")
    parser.add_argument("--clients", type=int, default=2,
                        help="pgbench clients (and threads), each a listener of its own (default 2)")
    parser.add_argument("--dir", type=Path, help="the private cluster's folder (default: one per kind)")
    parser.add_argument("--fsync-off", action="store_true",
                        help="a cluster with fsync, synchronous_commit and full_page_writes off "
                             "(not durable)")
    args = parser.parse_args()
    if min(args.runs, args.batch, args.clients) < 1:
        parser.error("--runs, --batch and --clients must be positive")
    runs, batch, clients = args.runs, args.batch, args.clients
    # Every client runs the same number of batches; unless N is a multiple of B x clients, the
    # last ones come back short or empty (and tps x B overstates).
    per_client = math.ceil(runs / (batch * clients))
    exact = per_client * batch * clients == runs
    started = time.perf_counter()

    args.dir = args.dir or cluster_dir("bench-pgbench", args.fsync_off)
    port = start_cluster(args.dir, fast=args.fsync_off)
    try:
        url = recreate_database(port, DATABASE)

        with psycopg.connect(url, autocommit=True) as db:
            settings: dict[str, str] = dict(db.execute(
                "SELECT name, setting FROM pg_settings"
                " WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes', 'server_version')"
            ).fetchall())
            print(f"pgdispatch claim + complete with pgbench: {runs:,} runs due at once, batches of {batch}, "
                  f"{clients} clients x {per_client} batches, {os.cpu_count()} CPUs, PostgreSQL "
                  f"{settings['server_version'].split()[0]} (fsync {settings['fsync']}, synchronous_commit "
                  f"{settings['synchronous_commit']}, full_page_writes {settings['full_page_writes']})")
            load_started = time.perf_counter()
            tick_s, tick_wal = mark_due(db, runs)
            load_s = time.perf_counter() - load_started

            with tempfile.NamedTemporaryFile("w", prefix="complete_pgbench_", suffix=".sql") as script:
                script.write(SCRIPT)
                script.flush()
                command = [
                    pgbench_binary(), "-n", "-M", "prepared", "-r",
                    "-c", str(clients), "-j", str(clients), "-t", str(per_client),
                    "-D", f"batch={batch}", "-D", f"lease={LEASE}", "-f", script.name,
                    "-h", "127.0.0.1", "-p", port, "-U", "postgres", DATABASE,
                ]
                postmaster = int((args.dir / "data" / "postmaster.pid").read_text().split()[0])
                resident = set(children(postmaster))  # background processes and this connection
                (lsn,) = one(db, "SELECT pg_current_wal_lsn()")
                cpu0 = cluster_cpu_s(postmaster)
                resident0 = sum(map(process_cpu_s, resident))
                wall_started = time.perf_counter()
                result = subprocess.run(command, capture_output=True, text=True, check=False)
                wall_s = time.perf_counter() - wall_started
                if result.returncode != 0:
                    raise SystemExit(f"bench: pgbench failed ({result.returncode}):\n"
                                     f"{result.stdout}{result.stderr}")
                wait_for_backends_gone(postmaster, resident)
                cpu_s = cluster_cpu_s(postmaster) - cpu0
                resident_s = sum(map(process_cpu_s, resident)) - resident0
                (wal,) = one(db, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn,))
            tps, latency_ms, statements = parse_pgbench(result.stdout)

            ok, total, open_runs, elapsed = one(
                db,
                "SELECT count(*) FILTER (WHERE status = 'ok'), count(*),"
                "       count(*) FILTER (WHERE status IN ('pending', 'running')),"
                "       extract(epoch FROM max(finished_at) - min(claimed_at))::float8"
                " FROM dispatch.runs",
            )
            (audited,) = one(db, "SELECT count(*) FROM dispatch.audit_log WHERE action = 'schedule.run.ok'")
            if not ok == total == audited == runs:
                raise SystemExit(
                    f"bench: FAILED: of {total:,} runs (expected {runs:,}) {ok:,} are ok and {open_runs:,}"
                    f" still pending or running; {audited:,} 'schedule.run.ok' audit rows (expected {runs:,})"
                    f"\npgbench said:\n{result.stdout}"
                )

        def line(label: str, value: str, note: str) -> None:
            print(f"  {label:<28}{value:>10}  {note}")

        print(f"  loaded and marked in {load_s:.1f} s; the tick: {tick_s * 1000:,.0f} ms "
              f"({tick_s / runs * 1e6:.1f} us a run), WAL {tick_wal / runs:,.0f} bytes a run")
        print(f"claim + complete: {per_client * clients} batches (pgbench -M prepared; a batch is a"
              f" claim_runs transaction and a complete_runs transaction):")
        line("runs/s, database clock", f"{runs / elapsed:,.0f}",
             f"{runs:,} runs from the first claim to the last completion in {elapsed:.2f} s")
        line(f"runs/s, pgbench tps x {batch}", f"{tps * batch:,.0f}",
             f"tps {tps:,.2f} (pgbench ran {wall_s:.2f} s)" + ("" if exact else "; last batches short"))
        line("latency a batch, average", f"{latency_ms:.2f}", f"ms ({clients} clients at once)")
        # In the script's order; pgbench cuts each statement's text short.
        names = ["claim_runs", "complete_runs", "complete_runs again (busy), when it ran",
                 "complete_runs a third time", "complete_runs a fourth time"]
        for (statement_ms, _), name in zip(statements, names, strict=False):
            line(f"  {name}", f"{statement_ms:.2f}", "ms")
        line("WAL a run", f"{wal / runs:,.0f}", "bytes (claim + complete + audit row + schedule advance)")
        line("PostgreSQL CPU a run", f"{cpu_s / runs * 1e6:,.0f}",
             f"us ({cpu_s:.2f} s; background processes {resident_s / runs * 1e6:,.0f} us a run of it)")
        record(pgbench_runs_per_s=runs / elapsed, pgbench_cpu_us=cpu_s / runs * 1e6,
               pgbench_wal_bytes=wal / runs)
        print(f"  check: {ok:,} runs ok, {audited:,} 'schedule.run.ok' audit rows; "
              f"{time.perf_counter() - started:.0f} s in all")
    finally:
        stop_cluster(args.dir, check=False)


if __name__ == "__main__":
    main()
