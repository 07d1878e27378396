"""pgdispatch beside its peers, side by side, each installed and run the way its users run it.

    .venv/bin/python -m bench.peers [--quick] [--rounds 3] [--jobs 10000] [--concurrency 64]
                                    [--graphile-pool N] [--graphile-batching]
                                    [--tenants 1000] [--only graphile|dbos|pgdispatch]

All on one durable private cluster (bench.common.start_cluster: PostgreSQL's defaults, fsync,
synchronous_commit and full_page_writes on; .pgdata/bench-peers-durable), one database each, one
nginx sink (bench/sink.py) for every request. The rounds alternate which side goes first; the
machine is shared, so the absolute figures move with its load and the ratios within a round are
what counts.

Queue throughput, against Graphile Worker (npm graphile-worker, the version
bench/peers/graphile/package-lock.json pins, installed there with `npm ci` on first use; Node):
--jobs jobs added at once with graphile_worker.add_jobs (one statement) to one worker whose task
POSTs the payload to the sink (node:http with one keep-alive agent; Node 20's fetch took about six
times as much CPU a request here), concurrency --concurrency; against --jobs slots due at once for
one `pgdispatch listen` with the same concurrency (bench.dispatch.end_to_end). Both: requests/s
from the first to the last request at the sink (the ratio is of these), and from the moment the
work was there (the jobs committed, the slots' instant) to the last; CPU a job of PostgreSQL and of
the worker or listener, from before the jobs are added (or the slots made due) until all of them
are recorded as done. Graphile Worker is given its concurrency and maxPoolSize = concurrency (it
warns below that; --graphile-pool 0 leaves its default, 10), nothing else. --graphile-batching adds
a third side: Graphile Worker with the options its performance page uses (a local queue, batched
completion; off by default).

Schedules stored in the database, against DBOS Transact (PyPI dbos, installed into a virtual
environment of its own, .pgdata/peers-venv-dbos; not a dependency of pgdispatch): --tenants
schedules created with DBOS.create_schedule (rows in its system database's workflow_schedules
table, each fired by DBOS's scheduler), every one '* * * * *' and running a workflow whose step
POSTs to the sink; against as many pgdispatch schedules on '* * * * *' in as many projects, the
real listener on its own clock (no manual tick). Both: when the first, the median and the last
request reached the sink after the minute's instant, and the CPU a call from a second before it
until every call was recorded as done. Each side is set up just after a minute boundary, so that
the minute measured is a whole one away (DBOS's scheduler jitters a slot by up to a tenth of its
wait). --only pgdispatch: pgdispatch's side of it alone (10,000 tenants and more, which DBOS's
thread a schedule would take long to set up).

--quick: 2,000 jobs, 200 tenants, one round: a smoke run, not the docs' figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import psycopg

from bench.common import (
    cluster_cpu_s,
    cluster_dir,
    cluster_kind,
    process_cpu_s,
    recreate_database,
    start_cluster,
    stop_cluster,
)
from bench.dispatch import bare_aiohttp, end_to_end, listeners, seed_schedules
from bench.peers import dbos_side, graphile
from bench.peers.dbos_side import Stampede
from bench.peers.graphile import Result
from bench.sink import NginxSink

__all__ = ["main"]


def empty_database(port: str, name: str) -> str:
    """Drop and recreate database `name`, empty (a peer installs its own schema); its URL."""
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"postgresql://postgres@127.0.0.1:{port}/{name}"


def meters(postmaster: int, name: str, pid: int) -> dict[str, Callable[[], float]]:
    """CPU seconds so far of the whole cluster (bench.common.cluster_cpu_s) and of process `pid`."""
    return {"PostgreSQL": partial(cluster_cpu_s, postmaster), name: partial(process_cpu_s, pid)}


def pgdispatch_round(db: psycopg.Connection, sink: NginxSink, *, runs: int, url: str, concurrency: int,
                     data_dir: Path) -> Result:
    """`runs` slots due at once for one real listener (bench.dispatch.end_to_end)."""
    with listeners(1, url=url, template=sink.template, concurrency=concurrency, log_dir=data_dir,
                   log_level="info") as pids:
        result = end_to_end(db, sink, runs=runs, listener_pids=pids, pg_dir=data_dir / "data")
    seconds = [ms / 1000 for ms in result.latencies]
    cpu = {"PostgreSQL": result.cpu_us["PostgreSQL"], "worker or listener": result.cpu_us["listeners"]}
    return Result(runs / (max(seconds) - min(seconds)), runs / max(seconds), cpu)


GRAPHILE = "Graphile Worker"
BATCHED = "Graphile, batching"


def throughput(port: str, sink: NginxSink, *, jobs: int, rounds: int, concurrency: int, pool: int | None,
               data_dir: Path, batching: bool) -> dict[str, float]:
    """Graphile Worker against pgdispatch: `jobs` at once, `rounds` rounds, alternating."""
    graphile.ensure_installed()
    postmaster = int((data_dir / "data" / "postmaster.pid").read_text().split()[0])
    graphile_url = empty_database(port, "bench_peers_graphile")
    dispatch_url = recreate_database(port, "bench_peers_dispatch")
    with psycopg.connect(dispatch_url, autocommit=True) as db:
        seed_schedules(db, jobs)
    print(f"\nqueue throughput: {jobs:,} at once, concurrency {concurrency}; Graphile Worker "
          f"{graphile.version()} (Node {node_version()}, maxPoolSize "
          f"{pool if pool is not None else '10 (its default)'}) against pgdispatch (1 listener)",
          flush=True)
    sides: dict[str, list[Result]] = {GRAPHILE: [], "pgdispatch": []}
    if batching:
        print(f"  and {BATCHED}: Graphile Worker with its performance page's options (not its defaults):"
              f" localQueue size {concurrency + 1}, completeJobBatchDelay 0, failJobBatchDelay 0")
        sides[BATCHED] = []
    with psycopg.connect(graphile_url, autocommit=True) as gdb, \
            psycopg.connect(dispatch_url, autocommit=True) as ddb:
        for round_no in range(1, rounds + 1):
            bare = asyncio_bare(sink, concurrency)
            print(f"round {round_no}: bare aiohttp loop {bare:,.0f} requests/s (the machine's speed now)",
                  flush=True)
            order = list(sides) if round_no % 2 else list(sides)[::-1]
            for side in order:
                if side != "pgdispatch":
                    with graphile.worker(graphile_url, sink, concurrency=concurrency, pool=pool,
                                         log_dir=data_dir, batching=side == BATCHED) as pid:
                        result = graphile.add_and_wait(
                            gdb, sink, jobs=jobs, first=(round_no * len(sides) + order.index(side)) * jobs,
                            meters=meters(postmaster, "worker or listener", pid))
                else:
                    result = pgdispatch_round(ddb, sink, runs=jobs, url=dispatch_url,
                                              concurrency=concurrency, data_dir=data_dir)
                sides[side].append(result)
                print(f"  {side:>17}: {result.first_to_last:7,.0f} requests/s first to last request, "
                      f"{result.from_start:7,.0f} from the work's arrival; CPU a job: "
                      + ", ".join(f"{name} {us:.0f} us" for name, us in result.cpu_us.items()), flush=True)
    medians = {side: {"first_to_last": statistics.median(r.first_to_last for r in results),
                      "from_start": statistics.median(r.from_start for r in results),
                      **{f"cpu {name}": statistics.median(r.cpu_us[name] for r in results)
                         for name in results[0].cpu_us}}
               for side, results in sides.items()}
    print(f"\nmedians of {rounds} round(s), {jobs:,} at once:")
    for side, figures in medians.items():
        print(f"  {side:>17}: {figures['first_to_last']:7,.0f} requests/s first to last, "
              f"{figures['from_start']:7,.0f} from the work's arrival; CPU a job: PostgreSQL "
              f"{figures['cpu PostgreSQL']:.0f} us, {'worker' if side != 'pgdispatch' else 'listener'} "
              f"{figures['cpu worker or listener']:.0f} us")
    ours = medians["pgdispatch"]
    for side in (s for s in sides if s != "pgdispatch"):
        theirs = medians[side]
        print(f"  pgdispatch / {side}: x {ours['first_to_last'] / theirs['first_to_last']:.2f} first to "
              f"last, x {ours['from_start'] / theirs['from_start']:.2f} from the work's arrival; CPU a "
              f"job: PostgreSQL x {ours['cpu PostgreSQL'] / theirs['cpu PostgreSQL']:.2f}, listener / "
              f"worker x {ours['cpu worker or listener'] / theirs['cpu worker or listener']:.2f}", flush=True)
    return {"peers_graphile_ratio": ours["first_to_last"] / medians[GRAPHILE]["first_to_last"]}


def schedules(port: str, sink: NginxSink, *, tenants: int, rounds: int, concurrency: int,
              data_dir: Path, with_dbos: bool = True) -> dict[str, float]:
    """DBOS Transact against pgdispatch (or pgdispatch alone): `tenants` schedules due at one
    minute, `rounds` rounds."""
    if with_dbos:
        dbos_side.ensure_installed()
    postmaster = int((data_dir / "data" / "postmaster.pid").read_text().split()[0])
    print(f"\nschedules stored in the database: {tenants:,} tenants on '* * * * *', one minute's instant;"
          + (f" DBOS Transact {dbos_side.VERSION} (DBOS.create_schedule: rows in its system database's"
             " workflow_schedules table, fired by its scheduler onto its internal queue; its defaults)"
             " against" if with_dbos else "") + " pgdispatch (1 listener, its own clock)", flush=True)
    meter = partial(meters, postmaster, "app or listener")
    sides: dict[str, list[Stampede]] = {"pgdispatch": []}
    if with_dbos:
        sides = {"DBOS Transact": [], **sides}
    for round_no in range(1, rounds + 1):
        order = list(sides) if round_no % 2 else list(sides)[::-1]
        print(f"round {round_no}: ({time.strftime('%H:%M:%S')})", flush=True)
        for side in order:
            if side == "DBOS Transact":
                url = empty_database(port, "bench_peers_dbos")
                result = dbos_side.dbos_round(url, sink, tenants=tenants, log_dir=data_dir, meters=meter)
            else:
                result = dbos_side.pgdispatch_round(port, sink, tenants=tenants, concurrency=concurrency,
                                                    log_dir=data_dir, meters=meter)
            sides[side].append(result)
            print(f"  {side:>13}: first request {result.first:6.2f} s after the instant, median "
                  f"{result.median:6.2f} s, last {result.last:6.2f} s (ready {result.lead_s:.0f} s before "
                  "it); CPU a call: "
                  + ", ".join(f"{name} {us:,.0f} us" for name, us in result.cpu_us.items()), flush=True)
    print(f"\nmedians of {rounds} round(s), {tenants:,} tenants due at one minute:")
    medians: dict[str, dict[str, float]] = {}
    for side, results in sides.items():
        medians[side] = {key: statistics.median(getattr(r, key) for r in results)
                         for key in ("first", "median", "last")}
        first, median, last = medians[side].values()
        print(f"  {side:>13}: first {first:6.2f} s, median {median:6.2f} s, last {last:6.2f} s"
              " after the instant")
    if not with_dbos:
        return {"peers_pgdispatch_last_s": medians["pgdispatch"]["last"]}
    ratio = medians["DBOS Transact"]["last"] / medians["pgdispatch"]["last"]
    print(f"  DBOS Transact's last request / pgdispatch's: x {ratio:.0f}", flush=True)
    return {"peers_dbos_last_s": medians["DBOS Transact"]["last"],
            "peers_pgdispatch_last_s": medians["pgdispatch"]["last"]}


def asyncio_bare(sink: NginxSink, concurrency: int) -> float:
    """The bare aiohttp loop on the sink (bench.dispatch): the machine's speed this round."""
    rate = asyncio.run(bare_aiohttp(sink.url + "/bare", total=10_000, concurrency=concurrency))
    sink.arrivals(10_000)
    return rate


def node_version() -> str:
    return subprocess.run(["node", "--version"], check=True, capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, one round: a smoke run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=10_000, help="queue throughput: jobs at once")
    parser.add_argument("--concurrency", type=int, default=64,
                        help="the listener's and Graphile Worker's (default 64, the listener's default)")
    parser.add_argument("--graphile-pool", type=int, default=-1,
                        help="Graphile Worker's maxPoolSize (default: the concurrency; 0: its own default)")
    parser.add_argument("--graphile-batching", action="store_true",
                        help="also Graphile Worker with its performance page's batching (not its default)")
    parser.add_argument("--tenants", type=int, default=1000, help="schedules due at one minute")
    parser.add_argument("--only", choices=["graphile", "dbos", "pgdispatch"],
                        help="one peer only; pgdispatch: its side of the schedules alone")
    parser.add_argument("--dir", type=Path, help="the private cluster's folder")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.tenants, args.rounds = 2_000, 200, 1
    pool = {-1: args.concurrency, 0: None}.get(args.graphile_pool, args.graphile_pool)
    data_dir = args.dir or cluster_dir("bench-peers", False)
    port = start_cluster(data_dir)
    try:
        with NginxSink() as sink:
            print(f"peers: {os.cpu_count()} CPUs shared by PostgreSQL, the sink and each side; cluster "
                  f"{cluster_kind(False)}; absolute figures move with the machine's load, the ratios "
                  "within one window are what counts", flush=True)
            started = time.monotonic()
            if args.only in (None, "graphile"):
                throughput(port, sink, jobs=args.jobs, rounds=args.rounds, concurrency=args.concurrency,
                           pool=pool, data_dir=data_dir, batching=args.graphile_batching)
            if args.only in (None, "dbos", "pgdispatch"):
                schedules(port, sink, tenants=args.tenants, rounds=args.rounds, concurrency=args.concurrency,
                          data_dir=data_dir, with_dbos=args.only != "pgdispatch")
            print(f"\npeers: {(time.monotonic() - started) / 60:.1f} min", file=sys.stderr)
    finally:
        stop_cluster(data_dir, check=False)


if __name__ == "__main__":
    main()
