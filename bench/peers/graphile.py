"""Graphile Worker's side of bench.peers: the Node runner in bench/peers/graphile (installed with
`npm ci` on first use, into its own node_modules), started as a process, and one round of N jobs
added at once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench.common import wait_until
from bench.sink import NginxSink

__all__ = ["Result", "add_and_wait", "ensure_installed", "version", "worker"]

RUNNER = Path(__file__).resolve().parent / "graphile"
PACKAGE = RUNNER / "node_modules" / "graphile-worker" / "package.json"


@dataclass(frozen=True)
class Result:
    """One round of one side: requests a second from the first to the last request at the sink,
    and from the moment the work was there (jobs committed, slots due) to the last request; the
    CPU each process used a job (all of them recorded as done)."""

    first_to_last: float
    from_start: float
    cpu_us: dict[str, float]


def ensure_installed() -> None:
    """`npm ci` in bench/peers/graphile the first time (the version package-lock.json pins)."""
    if PACKAGE.exists():
        return
    if shutil.which("npm") is None or shutil.which("node") is None:
        raise SystemExit("bench.peers: Graphile Worker needs node and npm (Node 20 or later)")
    print("peers: npm ci in bench/peers/graphile (Graphile Worker, first use)", flush=True)
    subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=RUNNER, check=True)


def version() -> str:
    return str(json.loads(PACKAGE.read_text())["version"])


@contextmanager
def worker(url: str, sink: NginxSink, *, concurrency: int, pool: int | None, log_dir: Path,
           batching: bool = False) -> Iterator[int]:
    """One Graphile Worker process (bench/peers/graphile/worker.js) on database `url`, its task
    POSTing to the sink; yields its pid once it is listening. It migrates its schema itself the
    first time. `pool`: its maxPoolSize (None: Graphile Worker's default, 10); `batching`: the
    options of Graphile Worker's performance page (local queue, batched completion), off by default."""
    log_path = log_dir / f"graphile-{time.strftime('%H%M%S')}.log"
    env = {**os.environ, "DATABASE_URL": url, "SINK_URL": sink.url, "CONCURRENCY": str(concurrency)}
    if pool is not None:
        env["MAX_POOL_SIZE"] = str(pool)
    if batching:
        env["BATCHING"] = "1"
    with log_path.open("wb") as log:
        process = subprocess.Popen(["node", "worker.js"], cwd=RUNNER, stdout=log, stderr=log, env=env)
    try:
        wait_until(lambda: b"bench-peers: ready" in log_path.read_bytes() or process.poll() is not None,
                   "Graphile Worker", within=120)
        if process.poll() is not None:
            raise SystemExit(f"bench.peers: Graphile Worker exited:\n{log_path.read_text()[-2000:]}")
        time.sleep(0.5)
        yield process.pid
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


ADD_JOBS = (
    # One statement, one transaction: graphile_worker.add_jobs, the bulk form Graphile Worker's
    # docs give (WorkerUtils.addJobs calls the same function).
    "SELECT count(*) FROM graphile_worker.add_jobs(ARRAY("
    " SELECT ROW('post', json_build_object('i', i), NULL, NULL, NULL, NULL, NULL, NULL)"
    "::graphile_worker.job_spec FROM generate_series(%s::int, %s::int) i))"
)


def add_and_wait(db: psycopg.Connection, sink: NginxSink, *, jobs: int, first: int,
                 meters: dict[str, Callable[[], float]]) -> Result:
    """Add `jobs` jobs at once (payloads first .. first + jobs - 1), wait until the sink has had
    all their requests and the worker has recorded them all (Graphile Worker deletes a job when
    it completes)."""
    before = {name: meter() for name, meter in meters.items()}
    (added,) = db.execute(ADD_JOBS, (first, first + jobs - 1)).fetchone() or (0,)
    committed = time.time()  # autocommit: the jobs are visible, and the worker notified
    assert added == jobs, added
    arrivals = sink.arrivals(jobs, within=900)
    if len(arrivals) != jobs:
        raise SystemExit(f"bench.peers: the sink logged {len(arrivals)} requests for {jobs} jobs")
    wait_until(lambda: db.execute("SELECT NOT EXISTS (SELECT FROM graphile_worker._private_jobs)"
                                  ).fetchone() == (True,), "Graphile Worker's jobs done", within=900,
               every=0.1)
    used = {name: (meter() - before[name]) / jobs * 1e6 for name, meter in meters.items()}
    times = arrivals.values()
    return Result(jobs / (max(times) - min(times)), jobs / (max(times) - committed), used)
