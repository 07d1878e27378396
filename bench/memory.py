"""Memory benchmark: the listener's RSS with 1,000 invocations in flight at once.

    .venv/bin/python -m bench.memory [--runs 1000] [--samples 5] [--dir .pgdata/bench-memory]

One real `pgdispatch listen` (concurrency = --runs, signing on) against a holding sink in its
own process (this module with `sink`): the sink accepts every POST and answers none until it is
released, so all the runs stay in flight in the listener at the same time. Prints the listener's
RSS idle, RSS while the runs are held (--samples samples), its peak (VmHWM), the growth per
invocation in flight and the verdict against the goal (RSS <= 150 MB); then releases the sink and
checks that every run was recorded 'ok'. Exits non-zero if something fails, not if the goal is
missed.

The private cluster lives in --dir, started with the test clusters' fast settings (fsync off),
and is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psycopg
from aiohttp import web

from bench.common import memory_kb, record, recreate_database, start_cluster, stop_cluster, wait_until

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "bench_memory"
GOAL_MB = 150.0
TIMEOUT_S = 120  # the listener's --timeout: the runs are held well within it
FINISHED = "SELECT count(*) FROM dispatch.runs WHERE finished_at IS NOT NULL"


# -- the holding sink (a separate process) -----------------------------------------------------

def run_sink() -> None:
    """POSTs are counted and held until GET /release; GET /inflight reports the counts."""
    release = asyncio.Event()
    inflight = 0
    received = 0
    answer = b'{"ok":true}'

    async def call(request: web.Request) -> web.Response:
        nonlocal inflight, received
        await request.read()
        received += 1
        inflight += 1
        try:
            await release.wait()
        finally:
            inflight -= 1
        return web.Response(body=answer, content_type="application/json")

    async def report(request: web.Request) -> web.Response:
        return web.json_response({"inflight": inflight, "received": received})

    async def let_go(request: web.Request) -> web.Response:
        release.set()
        return web.json_response({"released": inflight})

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/projects/{project_id}/functions/{function_name}", call)
        app.router.add_get("/inflight", report)
        app.router.add_get("/release", let_go)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        print(runner.addresses[0][1], flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


# -- helpers ---------------------------------------------------------------------------------

def mb(kb: float) -> str:
    return f"{kb / 1024:7.1f} MB"


def sink_get(sink_url: str, path: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{sink_url}{path}", timeout=10) as response:  # noqa: S310 - loopback
        return dict(json.load(response))



def alive(process: subprocess.Popen[bytes], what: str) -> None:
    if process.poll() is not None:
        raise SystemExit(f"bench: {what} exited early with status {process.returncode}")


def raise_fd_limit(wanted: int) -> None:
    """The listener and the sink each hold one socket per run in flight: make room (inherited)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


# -- the benchmark ---------------------------------------------------------------------------

def bench(args: argparse.Namespace) -> None:
    started = time.monotonic()
    runs: int = args.runs
    raise_fd_limit(runs * 2 + 1024)
    sink: subprocess.Popen[str] | None = None
    listener: subprocess.Popen[bytes] | None = None
    try:
        url = recreate_database(start_cluster(args.dir, fast=True), DATABASE)

        sink = subprocess.Popen([sys.executable, "-m", "bench.memory", "sink"], cwd=ROOT,
                                stdout=subprocess.PIPE, text=True)
        assert sink.stdout is not None
        sink_port = sink.stdout.readline().strip()
        if not sink_port.isdigit():
            raise SystemExit(f"bench: the sink did not start (said {sink_port!r})")
        sink_url = f"http://127.0.0.1:{sink_port}"
        template = sink_url + "/projects/{project_id}/functions/{function_name}"

        db = psycopg.connect(url, autocommit=True)
        db.execute(
            "INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, args)"
            " SELECT 'bench', 'sink', '0 0 1 1 *', jsonb_build_object('i', i) FROM generate_series(1, %s) i",
            (runs,),
        )

        log_path = args.dir / "listener.log"
        with log_path.open("wb") as log:
            listener = subprocess.Popen(
                [str(Path(sys.executable).parent / "pgdispatch"), "listen", "--database-url", url,
                 "--invoke-url", template, "--concurrency", str(runs), "--pool-size", "4",
                 "--worker-id", "bench-memory", "--timeout", str(TIMEOUT_S), "--sweep-interval", "60"],
                stderr=log, env={**os.environ, "PGDISPATCH_SIGNING_SECRET": "bench-secret"},
            )
        lst = listener

        def listening() -> bool:
            alive(lst, "the listener")
            return b'"listening"' in log_path.read_bytes()

        wait_until(listening, "the listener's \"listening\" event", within=60)
        time.sleep(1.0)  # let its first sweep pass
        idle = memory_kb(listener.pid)

        # All due at one instant, 1 s ahead: the listener's timer ticks then.
        with db.transaction():
            db.execute("UPDATE dispatch.schedules SET next_run_at = now() + interval '1 s'")
            db.execute("SELECT pg_notify('dispatch', 'schedules')")
        made_due = time.monotonic()

        def all_held() -> bool:
            alive(lst, "the listener")
            return sink_get(sink_url, "/inflight")["inflight"] >= runs

        wait_until(all_held, f"{runs} requests in flight at the sink", within=90, every=0.1)
        all_in_flight_s = time.monotonic() - made_due
        samples: list[int] = []
        for _ in range(args.samples):
            samples.append(memory_kb(listener.pid)["VmRSS"])
            time.sleep(0.5)
        held = sink_get(sink_url, "/inflight")
        if held["inflight"] != runs or held["received"] != runs:
            raise SystemExit(f"bench: the sink holds {held['inflight']} and received {held['received']} "
                             f"requests, not {runs}")
        peak = memory_kb(listener.pid)["VmHWM"]
        sink_rss = memory_kb(sink.pid)["VmRSS"]

        sink_get(sink_url, "/release")
        wait_until(lambda: (db.execute(FINISHED).fetchone() or (0,))[0] >= runs,
                   f"{runs} finished runs", within=120, every=0.25)
        total, ok = db.execute(
            "SELECT count(*), count(*) FILTER (WHERE status = 'ok') FROM dispatch.runs"
        ).fetchone() or (0, 0)
        db.close()
        if total != runs or ok != runs:
            raise SystemExit(f"bench: {total} runs recorded, {ok} of them ok; expected {runs} ok")

        listener.send_signal(signal.SIGTERM)
        code = listener.wait(60)
        if code != 0:
            raise SystemExit(f"bench: the listener exited with status {code} after SIGTERM (log: {log_path})")

        in_flight_rss = max(samples)
        delta_kb = (in_flight_rss - idle["VmRSS"]) / runs
        verdict = "met" if peak / 1024 <= GOAL_MB and in_flight_rss / 1024 <= GOAL_MB else "not met"
        rows = [
            ("listener RSS idle (after its first sweep)", mb(idle["VmRSS"]), ""),
            (f"listener RSS, {runs:,} in flight (max of {len(samples)})", mb(in_flight_rss),
             f"samples: {', '.join(f'{s / 1024:.1f}' for s in samples)} MB"),
            ("listener peak RSS (VmHWM)", mb(peak), ""),
            ("per invocation in flight", f"{delta_kb:7.1f} kB", f"(in flight - idle) / {runs:,}"),
        ]
        width = max(len(label) for label, _, _ in rows)
        print(f"pgdispatch memory benchmark: {runs:,} invocations held in flight by one listener "
              f"(concurrency {runs}, pool 4, signing on)")
        for label, figure, note in rows:
            print(f"  {label:<{width}}  {figure}  {note}".rstrip())
        print(f"  goal RSS <= {GOAL_MB:.0f} MB (in flight and peak): {verdict}")
        record(rss_idle_mb=idle["VmRSS"] / 1024, rss_in_flight_mb=in_flight_rss / 1024,
               rss_peak_mb=peak / 1024, rss_in_flight=runs)
        print(f"  all {runs:,} in flight {all_in_flight_s:.1f} s after being made due; after release "
              f"{ok:,} runs recorded ok; sink RSS {sink_rss / 1024:.1f} MB; "
              f"took {time.monotonic() - started:.1f} s")
    finally:
        if listener is not None and listener.poll() is None:
            listener.send_signal(signal.SIGTERM)
            try:
                listener.wait(60)
            except subprocess.TimeoutExpired:
                listener.kill()
                listener.wait()
        if sink is not None:
            sink.terminate()
            sink.wait(10)
        stop_cluster(args.dir, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", default="bench", choices=["bench", "sink"])
    parser.add_argument("--runs", type=int, default=1000, help="invocations held in flight (default 1000)")
    parser.add_argument("--samples", type=int, default=5, help="RSS samples while they are held (default 5)")
    parser.add_argument("--dir", type=Path, default=ROOT / ".pgdata" / "bench-memory")
    args = parser.parse_args()
    if args.mode == "sink":
        run_sink()
    else:
        bench(args)


if __name__ == "__main__":
    main()
