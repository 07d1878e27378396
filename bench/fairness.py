"""Fairness between tenants (#23.2, #26.3): one tenant's burst beside ten small tenants, this tree
against another git revision, side by side, alternately, in one window.

    .venv/bin/python -m bench.fairness [--against a2c2689] [--rounds 3] [--big 50000] [--small 10]
                                       [--listeners 1] [--concurrency 64] [--fsync-off]

Tenant A has --big schedules, tenants B..K (--small of them) one each, all due at one instant
(A's written first, so that they come first in next_run_at order, as in #26.3). One real
`pgdispatch listen` of each revision in turn (installed as a user would: bench/against.py), the
nginx sink logging each request's arrival. Printed for every round and as medians: each small
tenant's first request after the instant (the worst of them, and their median), and A's total
time (the instant to A's last recorded outcome). The goal: small tenants within 1 s while A's
burst goes on; A's total time within 5 % of the unfair code.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import string
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from bench.against import Revision, installed, loop_support, make_venv
from bench.common import (
    ROOT,
    checkout,
    cluster_dir,
    cluster_kind,
    install_revision,
    record,
    start_cluster,
    stop_cluster,
    wait_until,
)
from bench.dispatch import listeners, set_instant
from bench.sink import NginxSink

__all__ = ["measure"]


@dataclass
class Figures:
    small_worst_s: list[float] = field(default_factory=list)
    small_median_s: list[float] = field(default_factory=list)
    big_total_s: list[float] = field(default_factory=list)
    big_first_s: list[float] = field(default_factory=list)


def small_projects(count: int) -> list[str]:
    return [f"tenant-{letter}" for letter in string.ascii_lowercase[1:count + 1]]


def load(url: str, big: int, small: list[str]) -> None:
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, args)"
                   " SELECT 'tenant-a', 'sink', '0 0 1 1 *', jsonb_build_object('i', i)"
                   " FROM generate_series(1, %s) i", (big,))
        for project in small:
            db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, args)"
                       " VALUES (%s, 'sink', '0 0 1 1 *', '{}')", (project,))
        db.execute("VACUUM ANALYZE dispatch.schedules")


def one_round(side: Revision, figures: Figures, sink: NginxSink, *, big: int, small: list[str],
              concurrency: int, count: int, log_dir: Path, lead_s: int = 2) -> None:
    total = big + len(small)
    with psycopg.connect(side.url, autocommit=True) as db, \
            listeners(count, url=side.url, template=sink.template, concurrency=concurrency, log_dir=log_dir,
                      log_level="info", event_loop=side.event_loop, command=side.venv / "bin" / "pgdispatch"):
        db.execute("TRUNCATE dispatch.runs, dispatch.audit_log")
        instant = set_instant(db, runs=total, lead_s=lead_s)
        waiting = "SELECT EXISTS (SELECT FROM dispatch.schedules WHERE next_run_at = to_timestamp(%s))"
        wait_until(lambda: db.execute(waiting, (instant,)).fetchone() == (False,), "all runs recorded",
                   within=900, every=0.1)
        requests: dict[str, str] = dict(db.execute(
            "SELECT r.request_id, s.project_id FROM dispatch.runs r"
            " JOIN dispatch.schedules s ON s.id = r.schedule_id"
            " WHERE r.scheduled_for = to_timestamp(%s)", (instant,)).fetchall())
        big_last = db.execute(
            "SELECT extract(epoch FROM max(r.finished_at))::float8 FROM dispatch.runs r"
            " JOIN dispatch.schedules s ON s.id = r.schedule_id"
            " WHERE r.scheduled_for = to_timestamp(%s) AND s.project_id = 'tenant-a'", (instant,)).fetchone()
    arrivals = sink.arrivals(total)
    if len(arrivals) != total:
        raise SystemExit(f"bench: the sink logged {len(arrivals)} requests for {total} runs")
    first: dict[str, float] = {}
    for request_id, at in arrivals.items():
        project = requests[request_id]
        first[project] = min(first.get(project, at), at)
    small_s = [first[p] - instant for p in small]
    figures.big_first_s.append(first["tenant-a"] - instant)
    assert big_last is not None
    figures.small_worst_s.append(max(small_s))
    figures.small_median_s.append(statistics.median(small_s))
    figures.big_total_s.append(big_last[0] - instant)
    print(f"  {side.label:>28}: small tenants' first request {min(small_s):6.3f} to {max(small_s):6.3f} s"
          f" after the instant (median {statistics.median(small_s):.3f}); A's first"
          f" {first['tenant-a'] - instant:6.3f} s, its {big:,} in"
          f" {big_last[0] - instant:6.2f} s", flush=True)


def measure(*, against: str, rounds: int, big: int, small_count: int, listener_count: int, concurrency: int,
            fast: bool, data_dir: Path) -> dict[str, float]:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           check=True, capture_output=True, text=True).stdout.strip()
    small = small_projects(small_count)
    work = Path(tempfile.mkdtemp(prefix="pgdispatch-fairness-"))
    figures: dict[str, Figures] = {}
    try:
        with checkout(against) as other_tree:
            other_rev = subprocess.run(["git", "-C", str(other_tree), "rev-parse", "--short", "HEAD"],
                                       check=True, capture_output=True, text=True).stdout.strip()
            sides = [Revision(other_rev if other_rev == against else f"{against} ({other_rev})",
                              other_tree, work / "other"),
                     Revision(f"{head}{'+changes' if dirty else ''} (this tree)", ROOT, work / "this")]
            for side in sides:
                print(f"fairness: installing {side.label} into a fresh environment (pip install)", flush=True)
                make_venv(side.tree, side.venv)
                side.event_loop = loop_support(side)
                loop = "uvloop" if side.event_loop == "auto" and installed(side, "uvloop") else "asyncio's"
                print(f"  {side.label}: listener on {loop} loop", flush=True)
                figures[side.label] = Figures()
            port = start_cluster(data_dir, fast=fast)
            try:
                for n, side in enumerate(sides):
                    side.url = install_revision(side.tree, port, f"bench_fairness_{n}",
                                                python=str(side.venv / "bin" / "python"))
                    load(side.url, big, small)
                print(f"fairness: tenant A {big:,} schedules and {len(small)} tenants one each, due at one"
                      f" instant; {listener_count} listener(s) with concurrency {concurrency}, nginx sink,"
                      f" {rounds} rounds, each revision in turn; cluster {cluster_kind(fast)};"
                      f" {os.cpu_count()} CPUs shared by PostgreSQL, sink and listeners", flush=True)
                with NginxSink() as sink:
                    for round_no in range(1, rounds + 1):
                        print(f"round {round_no}:", flush=True)
                        for side in (sides if round_no % 2 else sides[::-1]):
                            one_round(side, figures[side.label], sink, big=big, small=small,
                                      concurrency=concurrency, count=listener_count, log_dir=data_dir)
                            time.sleep(1.0)
            finally:
                stop_cluster(data_dir, check=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"\nmedians of {rounds} rounds (A {big:,} + {len(small)} x 1 due at once, {listener_count}"
          f" listener(s); cluster {cluster_kind(fast)}):")
    print(f"  {'':>28} {'small: worst first request':>27} {'small: median':>14} {'A first':>9}"
          f" {'A total':>9}")
    for side in sides:
        f = figures[side.label]
        print(f"  {side.label:>28} {statistics.median(f.small_worst_s):25.3f} s"
              f" {statistics.median(f.small_median_s):12.3f} s {statistics.median(f.big_first_s):7.3f} s"
              f" {statistics.median(f.big_total_s):7.2f} s")
    other, this = (figures[side.label] for side in sides)
    ratio = statistics.median(this.big_total_s) / statistics.median(other.big_total_s)
    print(f"  this tree / {sides[0].label}: A's total time x {ratio:.3f}")
    results = {"fairness_small_worst_s": statistics.median(this.small_worst_s),
               "fairness_small_worst_other_s": statistics.median(other.small_worst_s),
               "fairness_big_total_ratio": ratio}
    record(**results)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", default="a2c2689", metavar="REV",
                        help="the git revision to compare this tree with (default a2c2689)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--big", type=int, default=50_000, help="tenant A's schedules (default 50,000)")
    parser.add_argument("--small", type=int, default=10, help="small tenants, one schedule each (default 10)")
    parser.add_argument("--listeners", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--fsync-off", action="store_true",
                        help="a cluster with fsync, synchronous_commit and full_page_writes off"
                             " (not durable)")
    parser.add_argument("--dir", type=Path, help="the private cluster's folder (default: one per kind)")
    args = parser.parse_args()
    if args.rounds < 3:
        print("fairness: fewer than 3 rounds: medians of so few say little on a shared machine",
              file=sys.stderr)
    measure(against=args.against, rounds=args.rounds, big=args.big, small_count=args.small,
            listener_count=args.listeners, concurrency=args.concurrency, fast=args.fsync_off,
            data_dir=args.dir or cluster_dir("bench-fairness", args.fsync_off))


if __name__ == "__main__":
    main()
