"""Event webhooks beside dispatch: does a receiver that hangs, fails or answers slowly hold up
the runs of other functions? One real `pgdispatch listen`, the nginx sink, a durable cluster.

    .venv/bin/python -m bench.event_webhooks [--runs 1000] [--failing 1000] [--rounds 3]

Each round makes --runs schedules of a function that answers 200 and --failing schedules of one
that answers 400 (each run a run.failed event) due at one instant, over 100 tenants whose
projects have an events_url, and measures when the good runs' requests reached the sink (first,
median, p99, last after the instant), for each receiver: none (no events_url), one that never
answers, one that answers 500, one that answers after a second. Medians of the rounds.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg

from bench.common import fresh_database, record, wait_until
from bench.dispatch import listeners, percentile, set_instant
from bench.sink import NginxSink

__all__ = ["measure"]

PROJECTS = 100
RECEIVER = """
import asyncio, sys
from aiohttp import web
mode, port = sys.argv[1], int(sys.argv[2])
async def hook(request):
    await request.read()
    if mode == "hang":
        await asyncio.sleep(3600)
    if mode == "slow":
        await asyncio.sleep(1)
    return web.Response(status=500 if mode == "fail" else 200)
app = web.Application()
app.router.add_post("/hook", hook)
web.run_app(app, host="127.0.0.1", port=port, print=None)
"""
MODES = ("none", "hang", "fail", "slow")


def seed(db: psycopg.Connection, runs: int, failing: int) -> None:
    db.execute("TRUNCATE dispatch.runs, dispatch.audit_log, dispatch.event_deliveries, dispatch.schedules,"
               " dispatch.projects")
    for function, count in (("sink", runs), ("broken", failing)):
        db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, max_attempts)"
                   " SELECT 'tenant-' || (i %% %s), %s, '0 0 1 1 *', 1 FROM generate_series(1, %s) i",
                   (PROJECTS, function, count))
    db.execute("VACUUM ANALYZE dispatch.schedules")


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def one_round(db: psycopg.Connection, sink: NginxSink, *, runs: int, failing: int,
              url: str | None) -> list[float]:
    """Latencies (ms) of the good runs' requests after the instant."""
    seed(db, runs, failing)
    if url is not None:
        db.execute("INSERT INTO dispatch.projects (project_id, events_url)"
                   " SELECT 'tenant-' || i, %s FROM generate_series(0, %s) i", (url, PROJECTS - 1))
    sink.arrivals(0, within=0)  # what came before is not this round's
    instant = set_instant(db, runs=runs + failing, lead_s=2)
    finished = "SELECT count(*) FROM dispatch.runs WHERE status IN ('ok', 'error')"
    wait_until(lambda: db.execute(finished).fetchone() == (runs + failing,), "all runs recorded",
               within=300, every=0.1)
    good = {r for (r,) in db.execute("SELECT r.request_id FROM dispatch.runs r"
                                     " JOIN dispatch.schedules s ON s.id = r.schedule_id"
                                     " WHERE s.function_name = 'sink'")}
    arrivals = sink.arrivals(runs + failing)
    latencies = [(at - instant) * 1000 for request_id, at in arrivals.items() if request_id in good]
    if len(latencies) != runs:
        raise SystemExit(f"bench: the sink logged {len(latencies)} of the {runs} good runs")
    if url is not None:
        events = db.execute("SELECT count(*) FROM dispatch.event_deliveries").fetchone()
        print(f"    {events[0] if events else 0} event deliveries queued")
    return latencies


def measure(*, runs: int, failing: int, rounds: int) -> dict[str, list[list[float]]]:
    url = fresh_database("bench_events")
    results: dict[str, list[list[float]]] = {mode: [] for mode in MODES}
    with NginxSink() as sink, psycopg.connect(url, autocommit=True) as db, \
            tempfile.TemporaryDirectory(prefix="pgdispatch-events-") as tmp:
        for _ in range(rounds):
            for mode in MODES:
                receiver = None
                hook_url = None
                if mode != "none":
                    port = 20000 + MODES.index(mode)
                    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER, mode, str(port)])
                    hook_url = f"http://127.0.0.1:{port}/hook"
                    wait_until(lambda: _listening(port), "the receiver")  # noqa: B023
                try:
                    with listeners(1, url=url, template=sink.template, concurrency=64, log_dir=Path(tmp),
                                   log_level="info"):
                        latencies = one_round(db, sink, runs=runs, failing=failing, url=hook_url)
                finally:
                    if receiver is not None:
                        receiver.kill()  # (aiohttp would wait for the requests it holds)
                        receiver.wait(10)
                results[mode].append(latencies)
                print(f"  {mode:5}: first {min(latencies):7.0f} ms, median"
                      f" {statistics.median(latencies):7.0f} ms, p99 {percentile(latencies, 0.99):7.0f} ms,"
                      f" last {max(latencies):7.0f} ms")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.event_webhooks",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--runs", type=int, default=1000, help="runs of the function that answers 200")
    parser.add_argument("--failing", type=int, default=1000, help="runs of the one that answers 400")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"event webhooks: {args.runs} good and {args.failing} failing runs due at one instant over"
          f" {PROJECTS} tenants, one listener, durable cluster, {args.rounds} rounds")
    results = measure(runs=args.runs, failing=args.failing, rounds=args.rounds)
    print("\nmedians of the rounds (the good runs' requests, after the instant):")
    print("| receiver | first | median | p99 | last |\n|---|---|---|---|---|")
    for mode, rounds in results.items():
        figures = [statistics.median(f(r) for r in rounds) for f in
                   (min, statistics.median, lambda r: percentile(r, 0.99), max)]
        print(f"| {mode} | " + " | ".join(f"{x:,.0f} ms" for x in figures) + " |")
        record(**{f"events_{mode}_p99_ms": figures[2], f"events_{mode}_last_ms": figures[3]})


if __name__ == "__main__":
    main()
