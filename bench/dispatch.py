"""Dispatch benchmark: N slots due at once, a fast local sink, one real `pgdispatch listen`.

    .venv/bin/python bench/dispatch.py [--runs 10000] [--concurrency 64] [--rounds 3] [--single 20]

Prints, against the same sink in the same run, --rounds times alternately (then the medians):
- the bare loop: the listener's own HTTP stack (dispatcher.invoke.Invoker on one shared aiohttp
  session) POSTing as fast as it can with the same concurrency: the stack's physical limit;
- end to end: N schedules due at the same instant, the listener's timer ticks at that instant,
  claims, POSTs and records each (runs/s from the instant to the last recorded outcome), and
  the latency from the slot's instant to the request's arrival at the sink (p50, p99, max);
  and the CPU time the listener, PostgreSQL and the sink used per run (steadier than rates on a
  shared machine);
- a single due schedule, --single times: latency from its instant to the request's arrival.

The private cluster lives in --dir (default .pgdata/bench-dispatch), started with the test
clusters' fast settings (fsync off): the figures are the dispatcher's, not the disk's.
The sink runs in its own process (this script with `sink`), the listener in its own process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dispatcher.invoke import Invoker, new_session  # noqa: E402
from dispatcher.migrations import install  # noqa: E402
from dispatcher.runs import Run  # noqa: E402

DATABASE = "bench_dispatch"
FINISHED = "SELECT count(*) FROM dispatch.runs WHERE finished_at IS NOT NULL"


# -- the sink (a separate process) ---------------------------------------------------------

def run_sink() -> None:
    arrivals: list[tuple[str, float]] = []
    answer = b'{"ok":true}'

    async def call(request: web.Request) -> web.Response:
        arrivals.append((request.headers.get("X-Request-Id", ""), time.time()))
        await request.read()
        return web.Response(body=answer, content_type="application/json")

    async def stats(request: web.Request) -> web.Response:
        data = json.dumps(arrivals)
        arrivals.clear()
        return web.Response(text=data, content_type="application/json")

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/projects/{project_id}/functions/{function_name}", call)
        app.router.add_get("/stats", stats)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=2048)
        await site.start()
        print(runner.addresses[0][1], flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


# -- helpers ---------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) used so far by these processes; 0 for any that is gone."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def cluster_pids(data_dir: Path) -> list[int]:
    """The postmaster and every backend of the bench cluster."""
    postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
    children = Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()
    return [postmaster, *map(int, children)]


def fetch_arrivals(sink_url: str) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(f"{sink_url}/stats") as response:  # noqa: S310 - loopback
        return dict(json.load(response))


def wait_until(predicate: object, what: str, within: float = 120.0, every: float = 0.01) -> None:
    deadline = time.monotonic() + within
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: timed out waiting for {what}")
        time.sleep(every)


async def bare_loop(template: str, *, total: int, concurrency: int) -> float:
    """requests/s of the listener's HTTP stack alone."""
    now = datetime.now(UTC)
    runs = [
        Run(run_id=i, schedule_id="00000000-0000-0000-0000-000000000000", project_id="bench",
            function_name="sink", args={"i": i}, request_id=f"bare_{i}", scheduled_for=now, attempt=1,
            lease_until=now, lease_deadline=0.0)
        for i in range(total)
    ]
    queue: asyncio.Queue[Run] = asyncio.Queue()
    for run in runs:
        queue.put_nowait(run)

    async with new_session(concurrency=concurrency) as session:
        invoker = Invoker(session, url_template=template, timeout_s=30, secret=b"bench-secret")

        async def worker() -> None:
            while not queue.empty():
                outcome = await invoker.invoke(queue.get_nowait())
                assert outcome.status == "ok", outcome

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return total / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", default="bench", choices=["bench", "sink"])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--single", type=int, default=20, help="single-schedule latency trials")
    parser.add_argument("--rounds", type=int, default=3,
                        help="bare loop and end to end alternately this many times (medians printed)")
    parser.add_argument("--dir", type=Path, default=ROOT / ".pgdata" / "bench-dispatch")
    parser.add_argument("--log-level", default="info", help="the listener's log level (default info)")
    args = parser.parse_args()
    if args.mode == "sink":
        run_sink()
        return

    env = {**os.environ, "PGDISPATCH_CLUSTER_FAST": "1"}
    port = subprocess.run([str(ROOT / "scripts" / "pg-cluster"), "start", str(args.dir)], check=True,
                          capture_output=True, text=True, env=env).stdout.strip()
    admin = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    url = f"postgresql://postgres@127.0.0.1:{port}/{DATABASE}"
    sink = subprocess.Popen([sys.executable, __file__, "sink"], stdout=subprocess.PIPE, text=True)
    listener: subprocess.Popen[bytes] | None = None
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
            conn.execute(f"CREATE DATABASE {DATABASE}")
        install(url)
        assert sink.stdout is not None
        sink_url = f"http://127.0.0.1:{sink.stdout.readline().strip()}"
        template = sink_url + "/projects/{project_id}/functions/{function_name}"
        print(f"pgdispatch dispatch benchmark: {args.runs} runs, concurrency {args.concurrency}, "
              f"{os.cpu_count()} CPUs, PostgreSQL + sink + listener on this machine")

        asyncio.run(bare_loop(template, total=2000, concurrency=args.concurrency))  # warm-up
        fetch_arrivals(sink_url)

        db = psycopg.connect(url, autocommit=True)
        db.execute(
            "INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, args)"
            " SELECT 'bench', 'sink', '0 0 1 1 *', jsonb_build_object('i', i) FROM generate_series(1, %s) i",
            (args.runs,),
        )
        log_path = args.dir / "listener.log"
        with log_path.open("wb") as log:
            listener = subprocess.Popen(
                [str(Path(sys.executable).parent / "pgdispatch"), "listen", "--database-url", url,
                 "--invoke-url", template, "--concurrency", str(args.concurrency), "--sweep-interval", "60",
                 "--worker-id", "bench", "--log-level", args.log_level],
                stderr=log, env={**os.environ, "PGDISPATCH_SIGNING_SECRET": "bench-secret"},
            )
        wait_until(lambda: b'"listening"' in log_path.read_bytes(), "the listener")
        time.sleep(0.5)  # let its first sweep pass

        # The machine is shared: the bare loop and the end-to-end run alternate, and the CPU
        # each process used per run is printed too, which other load disturbs much less.
        bares: list[float] = []
        rates: list[float] = []
        for round_no in range(1, args.rounds + 1):
            bare_cpu = time.process_time()
            bare = asyncio.run(bare_loop(template, total=args.runs, concurrency=args.concurrency))
            bare_cpu = time.process_time() - bare_cpu
            fetch_arrivals(sink_url)
            bares.append(bare)
            print(f"round {round_no}: bare HTTP loop (Invoker, aiohttp): {bare:,.0f} requests/s "
                  f"({bare_cpu / args.runs * 1e6:.0f} us of client CPU a request)")

            # All N due at one instant, 2 s ahead: the listener's timer ticks then.
            finished_before = db.execute(FINISHED).fetchone()
            assert finished_before is not None
            pg = cluster_pids(args.dir / "data")
            cpu_before = [cpu_s([listener.pid]), cpu_s(pg), cpu_s([sink.pid])]
            with db.transaction():
                row = db.execute(
                    "UPDATE dispatch.schedules SET next_run_at = date_trunc('second', now()) + interval '2 s'"
                    " RETURNING extract(epoch FROM next_run_at)::float8"
                ).fetchone()
                db.execute("SELECT pg_notify('dispatch', 'schedules')")
            assert row is not None
            instant = row[0]
            target = (finished_before[0] + args.runs,)
            # Polled every 0.25 s: the count scans the runs table, and polling it every 10 ms took
            # CPU from PostgreSQL and the listener. The rate comes from max(finished_at), not the poll.
            wait_until(lambda: db.execute(FINISHED).fetchone() == target,  # noqa: B023
                       "all runs recorded", within=600, every=0.25)
            cpu_after = [cpu_s([listener.pid]), cpu_s(pg), cpu_s([sink.pid])]
            last, bad = db.execute(
                "SELECT extract(epoch FROM max(finished_at))::float8, count(*) FILTER (WHERE status <> 'ok')"
                " FROM dispatch.runs WHERE scheduled_for = to_timestamp(%s)", (instant,),
            ).fetchone() or (0.0, 0)
            arrivals = fetch_arrivals(sink_url)
            latencies = [(at - instant) * 1000 for at in arrivals.values()]
            rate = args.runs / (last - instant)
            rates.append(rate)
            used = [(after - before) / args.runs * 1e6
                    for before, after in zip(cpu_before, cpu_after, strict=True)]
            print(f"round {round_no}: end to end ({args.runs} due at once): {rate:,.0f} runs/s "
                  f"= {rate / bare:.0%} of the bare loop; {bad} not ok; {len(arrivals)} requests")
            print(f"  instant -> request arrival: p50 {percentile(latencies, 0.5):.0f} ms, "
                  f"p99 {percentile(latencies, 0.99):.0f} ms, max {max(latencies):.0f} ms "
                  f"(all {len(latencies)} started within {max(latencies) / 1000:.2f} s; "
                  f"last recorded {last - instant:.2f} s after the instant)")
            print(f"  CPU a run: listener {used[0]:.0f} us, PostgreSQL {used[1]:.0f} us, "
                  f"sink {used[2]:.0f} us")
        bare, rate = statistics.median(bares), statistics.median(rates)
        print(f"median of {args.rounds}: bare loop {bare:,.0f} requests/s, end to end {rate:,.0f} runs/s"
              f" = {rate / bare:.0%} of the bare loop (per round: "
              f"{', '.join(f'{r / b:.0%}' for r, b in zip(rates, bares, strict=True))})")

        # One schedule due at a time.
        single: list[float] = []
        parts: list[tuple[float, float, float]] = []
        schedule_id = db.execute("SELECT id FROM dispatch.schedules LIMIT 1").fetchone()
        assert schedule_id is not None
        for _ in range(args.single):
            with db.transaction():
                row = db.execute(
                    "UPDATE dispatch.schedules SET next_run_at = date_trunc('milliseconds', now())"
                    " + interval '300 ms' WHERE id = %s RETURNING extract(epoch FROM next_run_at)::float8",
                    schedule_id,
                ).fetchone()
                db.execute("SELECT pg_notify('dispatch', 'schedules')")
            assert row is not None
            # Polls this run by its unique key (a count over the whole table would load the
            # server while the latency is measured).
            timing = (
                "SELECT extract(epoch FROM created_at)::float8, extract(epoch FROM claimed_at)::float8"
                " FROM dispatch.runs WHERE schedule_id = %s AND scheduled_for = to_timestamp(%s)"
                " AND finished_at IS NOT NULL"
            )
            wait_until(lambda: db.execute(timing, (schedule_id[0], row[0])).fetchone(),  # noqa: B023
                       "the single run")
            marked, claimed = db.execute(timing, (schedule_id[0], row[0])).fetchone() or (0.0, 0.0)
            (arrived,) = fetch_arrivals(sink_url).values()
            single.append((arrived - row[0]) * 1000)
            parts.append(((marked - row[0]) * 1000, (claimed - marked) * 1000, (arrived - claimed) * 1000))
        if single:
            print(f"single due schedule ({len(single)} trials), instant -> request arrival: "
                  f"p50 {statistics.median(single):.1f} ms, p99 {percentile(single, 0.99):.1f} ms, "
                  f"max {max(single):.1f} ms")
            timer, claim, invoke = (statistics.median(part) for part in zip(*parts, strict=True))
            print(f"  medians: instant -> tick's transaction {timer:.1f} ms, -> claimed {claim:.1f} ms, "
                  f"-> request arrival {invoke:.1f} ms")
        db.close()
    finally:
        if listener is not None:
            listener.send_signal(signal.SIGTERM)
            listener.wait(60)
        sink.terminate()
        sink.wait(10)
        subprocess.run([str(ROOT / "scripts" / "pg-cluster"), "stop", str(args.dir)], check=False)


if __name__ == "__main__":
    main()
