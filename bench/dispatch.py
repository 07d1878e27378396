"""Dispatch benchmark: N slots due at once, a fast local sink, one or two real `pgdispatch listen`.

    .venv/bin/python -m bench.dispatch [--runs 10000,50000] [--listeners 1,2] [--concurrency 64]
                                       [--rounds 3] [--single 20] [--projects 1000]

The schedules belong to --projects tenants of skewed sizes, a few large and many with one or
two schedules (bench.common.TENANTS); --projects 1 puts them all in one project, the figure
beside it. Against one nginx sink (bench/sink.py, its own process), --rounds times alternately (medians
printed at the end):
- the limits: a bare aiohttp loop (one ClientSession POSTing a small JSON body with the same
  concurrency, nothing else), the same with pyreqwest (the listener's HTTP client), and a bare
  loop of the listener's own HTTP stack
  (dispatcher.invoke.Invoker: URL template, JSON payload, signature, response classification);
- end to end, for each --listeners count and each --runs size: that many schedules due at the
  same instant, the listeners' timers tick at that instant, claim, POST and record each:
  runs/s from the instant to the last recorded outcome, the latency from the slot's instant to
  the request's arrival at the sink (p50, p99, max), and the CPU each process used per run
  (steadier than rates on a shared machine);
- finally a single due schedule, --single times: latency from its instant to the request.

The private cluster lives in --dir (default .pgdata/bench-dispatch-durable): a durable cluster
with PostgreSQL's defaults (fsync, synchronous_commit and full_page_writes on), what a user runs.
--fsync-off uses one with the test clusters' fast settings instead (.pgdata/bench-dispatch-fsync-off):
the dispatcher's CPU without the disk, labelled as such.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
from pyreqwest.client import ClientBuilder

from bench.common import (
    PROJECTS,
    SPREAD_CRON,
    cluster_cpu_s,
    cluster_dir,
    cluster_kind,
    process_cpu_s,
    record,
    recreate_database,
    start_cluster,
    stop_cluster,
    tenants,
    wait_until,
)
from bench.profile import PySpy, summarize
from bench.sink import NginxSink
from dispatcher.event_loop import loop_factory
from dispatcher.invoke import Invoker, new_session
from dispatcher.runs import Run

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "bench_dispatch"

__all__ = ["end_to_end", "listeners", "measure", "seed_schedules"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- the limits ------------------------------------------------------------------------------

BARE_BODY = b'{"args":{"i":1},"invoker":{"kind":"schedule"}}'
BARE_HEADERS = {"Content-Type": "application/json", "X-Request-Id": "bare"}


async def _rate(request: Callable[[], Awaitable[None]], *, total: int, concurrency: int) -> float:
    """requests/s of `request`, made `total` times by `concurrency` workers."""
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await request()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return total / (time.perf_counter() - started)


async def bare_aiohttp(url: str, *, total: int, concurrency: int) -> float:
    """requests/s of aiohttp alone: one session, `concurrency` workers, a small JSON body."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def post() -> None:
            async with session.post(url, data=BARE_BODY, headers=BARE_HEADERS) as response:
                await response.read()
                assert response.status == 200, response.status

        return await _rate(post, total=total, concurrency=concurrency)


async def bare_pyreqwest(url: str, *, total: int, concurrency: int) -> float:
    """requests/s of the listener's HTTP client (pyreqwest) alone, as bare_aiohttp."""
    async with ClientBuilder().max_connections(concurrency).build() as client:

        async def post() -> None:
            response = await client.post(url).headers(BARE_HEADERS).body_bytes(BARE_BODY).build().send()
            await response.bytes()
            assert response.status == 200, response.status

        return await _rate(post, total=total, concurrency=concurrency)


async def bare_invoker(template: str, *, total: int, concurrency: int) -> float:
    """requests/s of the listener's HTTP stack alone (Invoker on the listener's session)."""
    now = datetime.now(UTC)
    runs = iter([Run(
        run_id=i, schedule_id="00000000-0000-0000-0000-000000000000", project_id="bench",
        function_name="sink", args_json=f'{{"i": {i}}}', request_id=f"bare_{i}", scheduled_for=now,
        attempt=1, lease_until=now, lease_deadline=0.0) for i in range(total)])

    async with new_session(concurrency=concurrency) as session:
        invoker = Invoker(session, url_template=template, timeout_s=30, secret=b"bench-secret")

        async def invoke() -> None:
            outcome = await invoker.invoke(next(runs))
            assert outcome.status == "ok", outcome

        return await _rate(invoke, total=total, concurrency=concurrency)


def seed_schedules(db: psycopg.Connection, count: int, projects: int = PROJECTS) -> None:
    """`count` schedules (bench.common.SPREAD_CRON: none comes due by itself) over `projects`
    tenants of skewed sizes (bench.common.TENANTS), for end_to_end to make due; analysed."""
    rows, params = tenants(count, projects)
    db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, args)"
               f" SELECT t.project_id, 'sink', {SPREAD_CRON}, jsonb_build_object('i', i)"
               f" FROM {rows}", params)
    db.execute("VACUUM ANALYZE dispatch.schedules")


# -- end to end ------------------------------------------------------------------------------

@contextmanager
def listeners(count: int, *, url: str, template: str, concurrency: int, log_dir: Path,
              log_level: str, event_loop: str | None = "auto",
              command: Path | None = None) -> Iterator[list[int]]:
    """`count` real listener processes, each with --concurrency (and --event-loop, unless None: a
    revision older than that flag); yields their pids. `command`: the pgdispatch to run (default
    the one beside this Python)."""
    program = str(command or Path(sys.executable).parent / "pgdispatch")
    loop_flag = [] if event_loop is None else ["--event-loop", event_loop]
    processes: list[subprocess.Popen[bytes]] = []
    started = time.strftime("%H%M%S")
    logs = [log_dir / f"listener-{started}-{n + 1}-of-{count}.log" for n in range(count)]
    try:
        for n, log_path in enumerate(logs):
            with log_path.open("wb") as log:
                processes.append(subprocess.Popen(
                    [program, "listen", "--database-url", url,
                     "--invoke-url", template, "--concurrency", str(concurrency), "--sweep-interval", "60",
                     "--worker-id", f"bench-{n}", "--log-level", log_level, *loop_flag],
                    stderr=log, env={**os.environ, "PGDISPATCH_SIGNING_SECRET": "bench-secret"},
                ))
        for log_path in logs:
            wait_until(lambda: b'"listening"' in log_path.read_bytes(), "the listener")  # noqa: B023
        time.sleep(0.5)  # let their first sweeps pass
        yield [p.pid for p in processes]
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            process.wait(60)


@dataclass(frozen=True)
class Round:
    """One end-to-end round's figures."""

    rate: float
    latencies: list[float]
    cpu_us: dict[str, float]
    bad: int


class _Late(Exception):
    """The UPDATE that sets the instant ended after it."""


def set_instant(db: psycopg.Connection, *, runs: int, lead_s: int, on_minute: bool = False) -> float:
    """Make `runs` schedules due at one instant, lead_s ahead (on_minute: the first minute boundary
    at least lead_s ahead); its epoch. The lead must outlast the UPDATE that sets it, or the
    instant passes before anyone can see it and the bench's own lateness is counted as the
    listeners': an UPDATE that outlasts it is rolled back and made again with twice the lead (a
    slow host took over 2 s for 50,000 rows)."""
    for _ in range(4):
        lead = lead_s
        if on_minute:
            row = db.execute("SELECT extract(epoch FROM date_trunc('second', now()))::float8").fetchone()
            assert row is not None
            lead += -int(row[0] + lead) % 60
        try:
            with db.transaction():
                row = db.execute(
                    "UPDATE dispatch.schedules"
                    " SET next_run_at = date_trunc('second', now()) + %s * interval '1 s'"
                    " WHERE id IN (SELECT id FROM dispatch.schedules ORDER BY id LIMIT %s)"
                    " RETURNING extract(epoch FROM next_run_at)::float8", (lead, runs),
                ).fetchone()
                assert row is not None
                if db.execute("SELECT clock_timestamp() >= to_timestamp(%s)", row).fetchone() != (False,):
                    raise _Late
                db.execute("SELECT pg_notify('dispatch', 'schedules')")
            return float(row[0])
        except _Late:
            print(f"bench: setting the instant took longer than its {lead_s} s lead;"
                  f" again with {lead_s * 2} s")
            lead_s *= 2
    raise SystemExit(f"bench: setting the instant took longer than its {lead_s // 2} s lead, four times")


def end_to_end(db: psycopg.Connection, sink: NginxSink, *, runs: int, listener_pids: list[int],
               pg_dir: Path, lead_s: int = 2, on_minute: bool = False) -> Round:
    """`runs` schedules due at one instant, lead_s ahead (set_instant): the listeners' timers
    tick then. on_minute: the first minute boundary at least lead_s ahead instead, where pg_cron's
    dispatch-tick fires too (the top of the hour as a user has it)."""
    postmaster = int((pg_dir / "postmaster.pid").read_text().split()[0])
    sink_pids = sink.pids()
    meters: dict[str, Callable[[], float]] = {
        "listeners": lambda: sum(map(process_cpu_s, listener_pids)),
        "PostgreSQL": lambda: cluster_cpu_s(postmaster),  # backends that exit meanwhile included
        "sink": lambda: sum(map(process_cpu_s, sink_pids)),
    }
    instant = set_instant(db, runs=runs, lead_s=lead_s, on_minute=on_minute)
    # from here: setting the instant is the bench's work, not the dispatcher's
    before = {name: meter() for name, meter in meters.items()}
    # A schedule leaves its slot in the transaction that records its run: done when none is
    # left there (an index range that shrinks; counting finished runs would scan the table and
    # take CPU from what is measured). The rate comes from max(finished_at), not from the poll.
    waiting = "SELECT EXISTS (SELECT FROM dispatch.schedules WHERE next_run_at = to_timestamp(%s))"
    wait_until(lambda: db.execute(waiting, (instant,)).fetchone() == (False,), "all runs recorded",
               within=900, every=0.1)
    used = {name: (meter() - before[name]) / runs * 1e6 for name, meter in meters.items()}
    last, bad = db.execute(
        "SELECT extract(epoch FROM max(finished_at))::float8, count(*) FILTER (WHERE status <> 'ok')"
        " FROM dispatch.runs WHERE scheduled_for = to_timestamp(%s)", (instant,),
    ).fetchone() or (0.0, 0)
    arrivals = sink.arrivals(runs)
    if len(arrivals) != runs:
        raise SystemExit(f"bench: the sink logged {len(arrivals)} requests for {runs} runs")
    return Round(runs / (last - instant), [(at - instant) * 1000 for at in arrivals.values()], used, bad)


def single_latency(db: psycopg.Connection, sink: NginxSink, trials: int) -> list[float]:
    """Latency (ms) from one schedule's instant to its request's arrival, `trials` times."""
    latencies: list[float] = []
    schedule_id = db.execute("SELECT id FROM dispatch.schedules ORDER BY id LIMIT 1").fetchone()
    assert schedule_id is not None
    done = ("SELECT 1 FROM dispatch.runs WHERE schedule_id = %s AND scheduled_for = to_timestamp(%s)"
            " AND finished_at IS NOT NULL")
    for _ in range(trials):
        with db.transaction():
            row = db.execute(
                "UPDATE dispatch.schedules SET next_run_at = date_trunc('milliseconds', now())"
                " + interval '300 ms' WHERE id = %s RETURNING extract(epoch FROM next_run_at)::float8",
                schedule_id,
            ).fetchone()
            db.execute("SELECT pg_notify('dispatch', 'schedules')")
        assert row is not None
        # Polls this run by its unique key: a count over the whole table would load the server.
        wait_until(lambda: db.execute(done, (schedule_id[0], row[0])).fetchone(),  # noqa: B023
                   "the single run")
        (arrived,) = sink.arrivals(1).values()
        latencies.append((arrived - row[0]) * 1000)
    return latencies


def measure(*, runs: list[int], listener_counts: list[int], concurrency: int, rounds: int, single: int,
            data_dir: Path, log_level: str = "info", profile: bool = False,
            fast: bool = False, projects: int = PROJECTS) -> dict[str, float]:
    """Run the benchmark, print its figures, return the medians by name."""
    port = start_cluster(data_dir, fast=fast)
    results: dict[str, float] = {}
    try:
        url = recreate_database(port, DATABASE)
        with NginxSink() as sink, psycopg.connect(url, autocommit=True) as db:
            print(f"dispatch: {'/'.join(map(str, runs))} slots due at once, "
                  f"{'/'.join(map(str, listener_counts))} listener(s) with concurrency {concurrency} each, "
                  f"{projects:,} project(s), nginx sink; {os.cpu_count()} CPUs shared by PostgreSQL, "
                  f"sink and listeners; cluster {cluster_kind(fast)}")
            seed_schedules(db, max(runs), projects)
            asyncio.run(bare_invoker(sink.template, total=2000, concurrency=concurrency))  # warm-up
            sink.arrivals(2000)

            bare: dict[str, list[float]] = {"aiohttp": [], "pyreqwest": [], "invoker": []}
            # CPU a request of this process (all its threads: pyreqwest's own included), µs
            bare_cpu: dict[str, list[float]] = {"aiohttp": [], "pyreqwest": [], "invoker": []}

            bare_total = 10_000

            def timed(name: str, loop: Callable[[], Coroutine[Any, Any, float]]) -> None:
                # on the listener's event loop (uvloop when installed), as the listener runs
                started = time.process_time()
                with asyncio.Runner(loop_factory=loop_factory("auto")) as runner:
                    bare[name].append(runner.run(loop()))
                bare_cpu[name].append((time.process_time() - started) / bare_total * 1e6)

            e2e: dict[tuple[int, int, str], list[Round]] = {}
            # The listeners run on uvloop when it is installed; one listener on asyncio's loop too,
            # in the same rounds, shows what it is worth.
            loops = [("auto", listener_counts, runs)]
            if importlib.util.find_spec("uvloop") is not None:
                loops.append(("asyncio", [1], [max(runs)]))
            for round_no in range(1, rounds + 1):
                timed("aiohttp",
                      lambda: bare_aiohttp(sink.url + "/bare", total=bare_total, concurrency=concurrency))
                timed("pyreqwest",
                      lambda: bare_pyreqwest(sink.url + "/bare", total=bare_total, concurrency=concurrency))
                timed("invoker",
                      lambda: bare_invoker(sink.template, total=bare_total, concurrency=concurrency))
                sink.arrivals(3 * bare_total)
                print(f"round {round_no}: " + ", ".join(
                    f"bare {label} {bare[name][-1]:,.0f} requests/s, {bare_cpu[name][-1]:.0f} us CPU each"
                    for name, label in (("aiohttp", "aiohttp loop"), ("pyreqwest", "pyreqwest loop"),
                                        ("invoker", "listener HTTP stack"))))
                # The order alternates from round to round: what runs first in a round runs on a
                # table the previous round's runs left for autovacuum, and measured slower.
                for loop, counts, sizes in (loops if round_no % 2 else loops[::-1]):
                    for count in counts:
                        with listeners(count, url=url, template=sink.template, concurrency=concurrency,
                                       log_dir=data_dir, log_level=log_level, event_loop=loop) as pids:
                            for size in sizes:
                                result = end_to_end(db, sink, runs=size, listener_pids=pids,
                                                    pg_dir=data_dir / "data")
                                e2e.setdefault((count, size, loop), []).append(result)
                                cpu = ", ".join(f"{name} {us:.0f} us" for name, us in result.cpu_us.items())
                                on = "" if loop == "auto" else f" on {loop}"
                                print(f"  {count} listener(s){on}, {size:,} due: {result.rate:,.0f} runs/s "
                                      f"= {result.rate / bare['aiohttp'][-1]:.2f} x the bare aiohttp loop; "
                                      f"all started within {max(result.latencies) / 1000:.2f} s; "
                                      f"{result.bad} not ok; CPU a run: {cpu}")

            limit = statistics.median(bare["aiohttp"])
            stack = statistics.median(bare["invoker"])
            client = statistics.median(bare["pyreqwest"])
            results |= {"bare_aiohttp": limit, "bare_pyreqwest": client, "bare_invoker": stack}
            print(f"\nmedians of {rounds} rounds:")
            print(f"  bare aiohttp loop:          {limit:8,.0f} requests/s, "
                  f"{statistics.median(bare_cpu['aiohttp']):.0f} us CPU a request")
            print(f"  bare pyreqwest loop:        {client:8,.0f} requests/s, "
                  f"{statistics.median(bare_cpu['pyreqwest']):.0f} us CPU a request")
            print(f"  bare listener HTTP stack:   {stack:8,.0f} requests/s ({stack / limit:.0%} of aiohttp)")
            for (count, size, loop), rounds_ in e2e.items():
                rate = statistics.median(r.rate for r in rounds_)
                latencies = [statistics.median(percentile(r.latencies, q) for r in rounds_)
                             for q in (0.5, 0.99)]
                worst = max(max(r.latencies) for r in rounds_)
                cpu_us = {name: statistics.median(r.cpu_us[name] for r in rounds_)
                          for name in rounds_[0].cpu_us}
                # one project's figures are kept apart from the many tenants' (the default)
                key = (f"e2e_{count}l_{size}" + ("" if loop == "auto" else f"_{loop}")
                       + ("_1p" if projects == 1 else ""))
                results |= {key: rate, f"{key}_p50": latencies[0], f"{key}_p99": latencies[1],
                            f"{key}_max": worst, **{f"{key}_cpu_{n}": us for n, us in cpu_us.items()}}
                on = "" if loop == "auto" else f" on {loop}"
                print(f"  {count} listener(s){on}, {size:>6,} due: {rate:8,.0f} runs/s = "
                      f"{rate / limit:.2f} x aiohttp, {rate / stack:.0%} of the stack; instant -> request "
                      f"p50 {latencies[0]:.0f} ms, "
                      f"p99 {latencies[1]:.0f} ms, max {worst:.0f} ms; CPU a run: "
                      + ", ".join(f"{name} {us:.0f} us" for name, us in cpu_us.items()))

            if profile:
                # One more run, not counted above: py-spy's sampling costs the listener a little.
                size = max(runs)
                with listeners(1, url=url, template=sink.template, concurrency=concurrency,
                               log_dir=data_dir, log_level=log_level) as pids, \
                        PySpy(pids[0], data_dir / "listener-profile.txt") as spy:
                    result = end_to_end(db, sink, runs=size, listener_pids=pids, pg_dir=data_dir / "data")
                print(f"  profile of the listener (py-spy, 1 listener, {size:,} due, "
                      f"{result.rate:,.0f} runs/s; collapsed stacks in {spy.output}):")
                print(summarize(spy.output))

            if single:
                with listeners(1, url=url, template=sink.template, concurrency=concurrency,
                               log_dir=data_dir, log_level=log_level):
                    latencies = single_latency(db, sink, single)
                results |= {"single_p50": statistics.median(latencies),
                            "single_p99": percentile(latencies, 0.99), "single_max": max(latencies)}
                print(f"  single due schedule ({single} trials), instant -> request: "
                      f"p50 {results['single_p50']:.1f} ms, p99 {results['single_p99']:.1f} ms, "
                      f"max {results['single_max']:.1f} ms")
    finally:
        stop_cluster(data_dir, check=False)
    record(dispatch_cluster=cluster_kind(fast), **results)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="10000,50000", help="slots due at once, comma-separated sizes")
    parser.add_argument("--listeners", default="1,2", help="listener processes, comma-separated counts")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--single", type=int, default=20, help="single-schedule latency trials")
    parser.add_argument("--projects", type=int, default=PROJECTS,
                        help=f"tenants the schedules are spread over, a few large and many small "
                             f"(default {PROJECTS:,}; 1: the one project 'bench')")
    parser.add_argument("--dir", type=Path, help="the private cluster's folder (default: one per kind)")
    parser.add_argument("--fsync-off", action="store_true",
                        help="a cluster with fsync, synchronous_commit and full_page_writes off "
                             "(not durable)")
    parser.add_argument("--log-level", default="info", help="the listeners' log level (default info)")
    parser.add_argument("--profile", action="store_true",
                        help="then one more run with py-spy sampling the listener, summarised")
    args = parser.parse_args()
    measure(runs=[int(n) for n in args.runs.split(",")],
            listener_counts=[int(n) for n in args.listeners.split(",")],
            concurrency=args.concurrency, rounds=args.rounds, single=args.single,
            data_dir=args.dir or cluster_dir("bench-dispatch", args.fsync_off), log_level=args.log_level,
            profile=args.profile, fast=args.fsync_off, projects=args.projects)


if __name__ == "__main__":
    main()
