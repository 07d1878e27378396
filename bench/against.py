"""Side by side: this tree against another git revision, the same end-to-end benchmark for both,
alternately, in one window.

    .venv/bin/python -m bench --against 3b94f50 [--rounds 3] [--runs 10000] [--listeners 1]
    .venv/bin/python -m bench.against 3b94f50 ...        (the same)

The machine's speed moves by 10-20 % from hour to hour, so a change is judged against the
version before it measured in the same window, never against figures from another day.

Each revision is installed the way a user installs it: the other one from a temporary git worktree
of it, this one from the working tree, each into a fresh virtual environment of its own with
`pip install <tree>` (its default dependencies, no extras: uvloop where that revision depends on
it). Each gets its own database, installed by its own installer, in one durable private cluster
(PostgreSQL's defaults: fsync, synchronous_commit and full_page_writes on; --fsync-off for the
test clusters' fast settings, labelled), with the same schedules (bench.common.SPREAD_CRON).

Then --rounds rounds, each: the bare aiohttp loop on the nginx sink (the limit the ratio is
against), then for each revision in turn (the order alternates from round to round), --listeners
real `pgdispatch listen` processes of that revision (concurrency --concurrency) and --runs slots
due at one instant (bench.dispatch.end_to_end). Printed for every round and as medians: runs/s,
its ratio to the bare loop, the CPU a run of the listeners and of PostgreSQL, and, steadier than
any rate, the database's own counts a run (shared blocks hit, commits, WAL bytes; from
pg_stat_database, so autovacuum's work in that database is included), and finally the ratio of
this tree to the other revision.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from bench.buffers import ensure_statements
from bench.common import (
    ROOT,
    checkout,
    cluster_dir,
    cluster_kind,
    install_revision,
    record,
    start_cluster,
    stop_cluster,
)
from bench.dispatch import bare_aiohttp, end_to_end, listeners, seed_schedules
from bench.sink import NginxSink

__all__ = ["measure"]


@dataclass
class Revision:
    """One side: where it is checked out, its environment, its database, and its rounds."""

    label: str
    tree: Path
    venv: Path
    url: str = ""
    event_loop: str | None = None  # what its listeners run on: --event-loop auto, or no such flag
    rates: list[float] = field(default_factory=list)
    statements: dict[str, list[float]] = field(default_factory=dict)  # query -> [calls, blocks hit]
    ratios: list[float] = field(default_factory=list)
    counts: dict[str, list[float]] = field(default_factory=dict)


def make_venv(tree: Path, venv: Path) -> None:
    """A fresh virtual environment with `pip install <tree>`: the revision's default install."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(tree)],
                   check=True, stderr=subprocess.DEVNULL)


def loop_support(revision: Revision) -> str | None:
    """"auto" when this revision's listener has --event-loop (and so uvloop if installed), else None."""
    help_text = subprocess.run([str(revision.venv / "bin" / "pgdispatch"), "listen", "--help"],
                               check=False, capture_output=True, text=True).stdout
    return "auto" if "--event-loop" in help_text else None


def installed(revision: Revision, package: str) -> bool:
    return subprocess.run([str(revision.venv / "bin" / "python"), "-c", f"import {package}"],
                          check=False, capture_output=True).returncode == 0


def fmt(value: float) -> str:
    """Counts a run: commits are a fraction, blocks and bytes are not."""
    return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"


def database_counts(db: psycopg.Connection, name: str) -> dict[str, float]:
    row = db.execute("SELECT blks_hit, xact_commit, pg_current_wal_lsn() - '0/0'::pg_lsn"
                     " FROM pg_stat_database WHERE datname = %s", (name,)).fetchone()
    assert row is not None
    return {"blocks hit": float(row[0]), "commits": float(row[1]), "WAL bytes": float(row[2])}


STATEMENTS = (
    "SELECT s.toplevel, left(regexp_replace(s.query, '\\s+', ' ', 'g'), 100), s.calls, s.shared_blks_hit"
    " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s"
)


def one_round(revision: Revision, sink: NginxSink, admin: psycopg.Connection, *, runs: int, count: int,
              concurrency: int, data_dir: Path, bare: float, statements: bool) -> None:
    name = revision.url.rsplit("/", 1)[1]
    if statements:
        admin.execute("SELECT pg_stat_statements_reset(0::oid, oid, 0::bigint) FROM pg_database"
                      " WHERE datname = %s", (name,))
    with psycopg.connect(revision.url, autocommit=True) as db, \
            listeners(count, url=revision.url, template=sink.template, concurrency=concurrency,
                      log_dir=data_dir, log_level="info", event_loop=revision.event_loop,
                      command=revision.venv / "bin" / "pgdispatch") as pids:
        admin.execute("SELECT pg_stat_clear_snapshot()")
        before = database_counts(admin, name)
        result = end_to_end(db, sink, runs=runs, listener_pids=pids, pg_dir=data_dir / "data")
    time.sleep(1.0)  # the listeners' backends have exited and sent their statistics
    admin.execute("SELECT pg_stat_clear_snapshot()")
    after = database_counts(admin, name)
    if statements:
        for toplevel, query, calls, hit in admin.execute(STATEMENTS, (name,)).fetchall():
            key = f"{'top   ' if toplevel else 'nested'} {query}"
            totals = revision.statements.setdefault(key, [0.0, 0.0, 0.0])
            totals[0] += calls
            totals[1] += hit
            totals[2] += runs
    per_run = {key: (after[key] - before[key]) / runs for key in before}
    per_run |= {f"CPU us, {k}": v for k, v in result.cpu_us.items() if k != "sink"}
    revision.rates.append(result.rate)
    revision.ratios.append(result.rate / bare)
    for key, value in per_run.items():
        revision.counts.setdefault(key, []).append(value)
    figures = ", ".join(f"{key} {fmt(value)}" for key, value in per_run.items())
    print(f"  {revision.label:>12}: {result.rate:7,.0f} runs/s = {result.rate / bare:.2f} x bare aiohttp; "
          f"{result.bad} not ok; a run: {figures}", flush=True)


def print_statements(revision: Revision, least: float = 0.2) -> None:
    print(f"\n  {revision.label}: shared blocks hit a run by statement, those over {least}"
          " (pg_stat_statements, track = all; nested ones are in their callers' figures too)")
    ranked = sorted(revision.statements.items(), key=lambda item: -item[1][1] / item[1][2])
    for key, (calls, hit, runs) in ranked:
        if hit / runs >= least:
            print(f"    {hit / runs:7.2f}  {calls / runs:7.4f} calls a run  {key}")


def measure(*, against: str, rounds: int, runs: int, listener_count: int, concurrency: int,
            fast: bool, data_dir: Path, statements: bool = False) -> dict[str, float | str]:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           check=True, capture_output=True, text=True).stdout.strip()
    work = Path(tempfile.mkdtemp(prefix="pgdispatch-against-"))
    try:
        with checkout(against) as other_tree:
            other_rev = subprocess.run(["git", "-C", str(other_tree), "rev-parse", "--short", "HEAD"],
                                       check=True, capture_output=True, text=True).stdout.strip()
            sides = [Revision(other_rev if other_rev == against else f"{against} ({other_rev})",
                              other_tree, work / "other"),
                     Revision(f"{head}{'+changes' if dirty else ''} (this tree)", ROOT, work / "this")]
            for side in sides:
                print(f"against: installing {side.label} into a fresh environment (pip install)",
                      flush=True)
                make_venv(side.tree, side.venv)
                side.event_loop = loop_support(side)
                loop = ("uvloop" if side.event_loop == "auto" and installed(side, "uvloop") else "asyncio's")
                print(f"  {side.label}: listener on {loop} loop", flush=True)
            port = start_cluster(data_dir, fast=fast)
            if statements:
                port = ensure_statements(port, data_dir, fast=fast)
            try:
                for n, side in enumerate(sides):
                    side.url = install_revision(side.tree, port, f"bench_against_{n}",
                                                python=str(side.venv / "bin" / "python"))
                    with psycopg.connect(side.url, autocommit=True) as db:
                        if statements:
                            db.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                        seed_schedules(db, runs)
                print(f"against: {runs:,} slots due at once, {listener_count} listener(s) with concurrency "
                      f"{concurrency}, nginx sink, {rounds} rounds, each revision in turn; cluster "
                      f"{cluster_kind(fast)}; {os.cpu_count()} CPUs shared by PostgreSQL, sink and listeners",
                      flush=True)
                bares: list[float] = []
                admin_url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
                with NginxSink() as sink, psycopg.connect(admin_url, autocommit=True) as admin:
                    if statements:
                        admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                    for round_no in range(1, rounds + 1):
                        bares.append(asyncio.run(bare_aiohttp(sink.url + "/bare", total=10_000,
                                                              concurrency=concurrency)))
                        sink.arrivals(10_000)
                        print(f"round {round_no}: bare aiohttp loop {bares[-1]:,.0f} requests/s", flush=True)
                        order = sides if round_no % 2 else sides[::-1]
                        for side in order:
                            one_round(side, sink, admin, runs=runs, count=listener_count,
                                      concurrency=concurrency, data_dir=data_dir, bare=bares[-1],
                                      statements=statements)
            finally:
                stop_cluster(data_dir, check=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    other, this = sides
    print(f"\nmedians of {rounds} rounds ({runs:,} due at once, {listener_count} listener(s); cluster "
          f"{cluster_kind(fast)}; bare aiohttp loop {statistics.median(bares):,.0f} requests/s):")
    keys = list(this.counts)
    print(f"  {'':>28} {'runs/s':>8} {'x bare':>6} " + " ".join(f"{k:>18}" for k in keys))
    for side in sides:
        print(f"  {side.label:>28} {statistics.median(side.rates):8,.0f} "
              f"{statistics.median(side.ratios):6.2f} "
              + " ".join(f"{fmt(statistics.median(side.counts[k])):>18}" for k in keys))
    ratio = statistics.median(this.rates) / statistics.median(other.rates)
    print(f"  this tree / {other.label}: runs/s x {ratio:.3f}; "
          + ", ".join(f"{k} x {statistics.median(this.counts[k]) / statistics.median(other.counts[k]):.3f}"
                      for k in keys))
    if statements:
        for side in sides:
            print_statements(side)
    def median_ratio(values: str) -> float:
        return statistics.median(this.counts[values]) / statistics.median(other.counts[values])

    figures: dict[str, float | str] = {
        "against_rev": other.label, "against_ratio": ratio,
        **{f"against_{key}_ratio": median_ratio(key) for key in ("blocks hit", "WAL bytes", "commits")},
        "against_this": statistics.median(this.rates), "against_other": statistics.median(other.rates),
        "against_this_bare": statistics.median(this.ratios),
        "against_other_bare": statistics.median(other.ratios)}
    record(**figures)
    return figures


def add_arguments(parser: argparse.ArgumentParser, *, fsync_off: bool = True) -> None:
    """Its options (--fsync-off too unless the caller has one)."""
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds, each revision once in each (default 3)")
    parser.add_argument("--runs", type=int, default=10_000, help="slots due at once (default 10,000)")
    parser.add_argument("--listeners", type=int, default=1, help="listener processes (default 1)")
    parser.add_argument("--concurrency", type=int, default=64)
    if fsync_off:
        parser.add_argument("--fsync-off", action="store_true",
                            help="a cluster with fsync, synchronous_commit and full_page_writes off "
                                 "(not durable)")
    parser.add_argument("--dir", type=Path, help="the private cluster's folder (default: one per kind)")
    parser.add_argument("--statements", action="store_true",
                        help="also the database's blocks hit a run by statement (pg_stat_statements, "
                             "track = all, in a cluster of its own; it costs time of its own)")


def run(args: argparse.Namespace) -> None:
    if args.rounds < 3:
        print("against: fewer than 3 rounds: medians of so few say little on a shared machine",
              file=sys.stderr)
    measure(against=args.against, rounds=args.rounds, runs=args.runs, listener_count=args.listeners,
            concurrency=args.concurrency, fast=args.fsync_off,
            data_dir=args.dir or cluster_dir(
                "bench-against-statements" if args.statements else "bench-against", args.fsync_off),
            statements=args.statements)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("against", metavar="REV", help="the git revision to compare this tree with")
    add_arguments(parser)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
