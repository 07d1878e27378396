"""DBOS Transact's side of bench.peers, and pgdispatch's beside it: N tenants' schedules stored in
the database, all '* * * * *', met at one minute's instant; when the first, the median and the
last request reached the sink after it.

DBOS runs in a virtual environment of its own (.pgdata/peers-venv-dbos, `pip install dbos==3.4.0`
on first use), never in pgdispatch's: bench/peers/dbos_app.py is its application."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from bench.common import ROOT, recreate_database, wait_until
from bench.dispatch import listeners
from bench.sink import NginxSink

__all__ = ["VERSION", "Stampede", "dbos_round", "ensure_installed", "pgdispatch_round"]

VERSION = "3.4.0"
VENV = ROOT / ".pgdata" / "peers-venv-dbos"
APP = Path(__file__).resolve().parent / "dbos_app.py"


@dataclass(frozen=True)
class Stampede:
    """Seconds from the minute's instant to the first, the median and the last request at the
    sink; CPU a tenant's call of PostgreSQL and of the DBOS application or the listener, from a
    second before the instant until every call was recorded as done."""

    first: float
    median: float
    last: float
    cpu_us: dict[str, float]
    lead_s: float = 0.0  # from the side being ready (schedules created, listening) to the instant


def ensure_installed() -> None:
    """A virtual environment with dbos==VERSION, made the first time (not pgdispatch's)."""
    python = VENV / "bin" / "python"
    check = [str(python), "-c", "import importlib.metadata as m; print(m.version('dbos'))"]
    if python.exists() and subprocess.run(check, capture_output=True, text=True).stdout.strip() == VERSION:
        return
    print(f"peers: pip install dbos=={VERSION} into {VENV.relative_to(ROOT)} (first use)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                    f"dbos=={VERSION}"], check=True)


def at_minute_start() -> None:
    """Sleep until a second past the next minute boundary: a side set up then has a whole minute
    to its first slot, as a long-running application has between two (DBOS's scheduler jitters
    each slot by up to a tenth of its thread's sleep, at most 10 s)."""
    time.sleep(60 - time.time() % 60 + 1)


def next_instant(margin_s: float) -> float:
    """The first minute boundary at least margin_s away (epoch seconds)."""
    now = time.time()
    instant = (now // 60 + 1) * 60
    return instant + 60 if instant - now < margin_s else instant


Ids = Callable[[dict[str, float]], list[str]]  # the minute's requests among those the sink logged


def sink_arrivals(sink: NginxSink, tenants: int, ids: Ids) -> list[float]:
    found = sink.arrivals(tenants, within=180)
    chosen = ids(found)
    if len(chosen) != tenants:
        raise SystemExit(f"bench.peers: the sink logged {len(chosen)} of the minute's {tenants} requests")
    return [found[i] for i in chosen]


def measured(meters: dict[str, Callable[[], float]], instant: float, tenants: int,
             done: Callable[[], bool], sink: NginxSink, ids: Ids) -> Stampede:
    """Wait for the instant, then for every call recorded as done; the figures."""
    lead = instant - time.time()
    time.sleep(max(0.0, instant - 1 - time.time()))
    sink.arrivals(0, within=0)  # nothing before the instant is counted
    before = {name: meter() for name, meter in meters.items()}
    wait_until(done, "the minute's calls recorded as done", within=instant + 180 - time.time(), every=0.2)
    used = {name: (meter() - before[name]) / tenants * 1e6 for name, meter in meters.items()}
    seconds = sorted(at - instant for at in sink_arrivals(sink, tenants, ids))
    return Stampede(seconds[0], statistics.median(seconds), seconds[-1], used, lead)


@contextmanager
def dbos_app(url: str, sink: NginxSink, *, tenants: int, log_dir: Path) -> Iterator[int]:
    log_path = log_dir / f"dbos-{time.strftime('%H%M%S')}.log"
    env = {**os.environ, "DATABASE_URL": url, "SINK_URL": sink.url, "TENANTS": str(tenants)}
    with log_path.open("wb") as log:
        process = subprocess.Popen([str(VENV / "bin" / "python"), str(APP)], stdout=log, stderr=log, env=env)
    try:
        wait_until(lambda: b"bench-peers: ready" in log_path.read_bytes() or process.poll() is not None,
                   "the DBOS application", within=120)
        if process.poll() is not None:
            raise SystemExit(f"bench.peers: the DBOS application exited:\n{log_path.read_text()[-3000:]}")
        yield process.pid
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def dbos_round(url: str, sink: NginxSink, *, tenants: int, log_dir: Path,
               meters: Callable[[int], dict[str, Callable[[], float]]]) -> Stampede:
    """DBOS's system database created afresh at `url` (by DBOS), `tenants` schedules created,
    the next minute met."""
    at_minute_start()
    with dbos_app(url, sink, tenants=tenants, log_dir=log_dir) as pid, \
            psycopg.connect(url, autocommit=True) as db:
        instant = next_instant(20)
        slot = datetime.fromtimestamp(instant, UTC)
        # The workflow DBOS's scheduler enqueues for a slot is named after it.
        workflows = f"sched-tenant-%-{slot.isoformat()}"
        suffix = f"@{slot.strftime('%Y-%m-%dT%H:%M:%S')}"
        return measured(
            meters(pid), instant, tenants,
            lambda: db.execute("SELECT count(*) FROM dbos.workflow_status WHERE workflow_uuid LIKE %s"
                               " AND status = 'SUCCESS'", (workflows,)).fetchone() == (tenants,),
            sink, lambda found: [i for i in found if i.endswith(suffix)])


def pgdispatch_round(port: str, sink: NginxSink, *, tenants: int, concurrency: int, log_dir: Path,
                     meters: Callable[[int], dict[str, Callable[[], float]]]) -> Stampede:
    """pgdispatch installed afresh in database bench_peers_tenants, `tenants` schedules on
    '* * * * *' in as many projects, one listener on its own clock (no manual tick; pg_cron's
    tick runs as installed), the first minute at least 8 s after it listens; then the database
    is dropped (its pg_cron tick would otherwise go on marking runs during the other side's)."""
    url = recreate_database(port, "bench_peers_tenants")
    try:
        with psycopg.connect(url, autocommit=True) as db:
            db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, args)"
                       " SELECT 'tenant-' || i, 'sink', '* * * * *', jsonb_build_object('tenant', i)"
                       " FROM generate_series(1, %s) i", (tenants,))
            db.execute("VACUUM ANALYZE dispatch.schedules")
            with listeners(1, url=url, template=sink.template, concurrency=concurrency, log_dir=log_dir,
                           log_level="info") as pids:
                instant = next_instant(8)
                finished = ("SELECT count(*) FROM dispatch.runs WHERE scheduled_for = to_timestamp(%s)"
                            " AND finished_at IS NOT NULL")
                result = measured(
                    meters(pids[0]), instant, tenants,
                    lambda: db.execute(finished, (instant,)).fetchone() == (tenants,),
                    sink, lambda found: [i for i in run_ids(db, instant) if i in found])
    finally:
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True) as conn:
            conn.execute('DROP DATABASE IF EXISTS "bench_peers_tenants" WITH (FORCE)')
    return result


def run_ids(db: psycopg.Connection, instant: float) -> list[str]:
    """The X-Request-Id of every run of the instant."""
    return [r for (r,) in db.execute(
        "SELECT request_id FROM dispatch.runs WHERE scheduled_for = to_timestamp(%s)", (instant,))]
