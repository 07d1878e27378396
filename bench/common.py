"""Shared by the benchmarks: private PostgreSQL 15 + pg_cron clusters (the durable one in
.pgdata/bench, started if needed and left running for the next benchmark, or a fast one of a
benchmark's own), fresh databases with sql/ installed, and the CPU time processes used."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from dispatcher.migrations import install

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_DIR = ROOT / ".pgdata" / "bench"
PG_CLUSTER = str(ROOT / "scripts" / "pg-cluster")

__all__ = ["PROJECTS", "SPREAD_CRON", "TENANTS", "checkout", "children", "cluster_cpu_s", "cluster_dir",
           "cluster_kind", "fresh_database", "install_revision",
           "median_ms", "process_cpu_s", "record", "recreate_database", "start_cluster", "stop_cluster",
           "tenants", "wait_until"]

# The cron expression of schedule number i in the dispatch benchmarks, as SQL for a query with
# parameters: 1,440 distinct expressions ('m h 1 1 *': one minute of New Year's Day each, so
# none comes due by itself while a benchmark runs). Runs finishing in one batch then rarely
# share one and each next slot is computed on its own: the dearest case (tenants mostly share
# a few expressions, and a batch computes each distinct one once).
SPREAD_CRON = "(i %% 60) || ' ' || (i / 60 %% 24) || ' 1 1 *'"

# How many tenants the benchmarks' schedules are spread over by default.
PROJECTS = 1000

# Schedules numbered i = 1..count with their project, as SQL rows (i, project_id): a few large
# tenants and many with one or two schedules, as a user's tenants are. Tenant number r
# (1..projects) gets a share of the schedules proportional to 1/r (Zipf): over 1,000 tenants,
# 10,000 schedules give p1 1,336, the first ten 39 % of them, and those past the 500th one to
# three each. One project is 'bench'. Its parameters: tenants().
TENANTS = """(SELECT i, CASE WHEN %(projects)s = 1 THEN 'bench' ELSE 'p' || r END
   FROM (SELECT r, floor(%(count)s * coalesce(lag(c) OVER (ORDER BY r), 0))::integer AS lo,
                CASE WHEN r = %(projects)s THEN %(count)s ELSE floor(%(count)s * c)::integer END AS hi
         FROM (SELECT r, sum(1.0 / r) OVER (ORDER BY r) / sum(1.0 / r) OVER () AS c
               FROM generate_series(1, %(projects)s) r) w) z
   CROSS JOIN LATERAL generate_series(z.lo + 1, z.hi) i) AS t (i, project_id)"""


def tenants(count: int, projects: int) -> tuple[str, dict[str, int]]:
    """The rows (i, project_id) of `count` schedules over `projects` tenants (TENANTS), as an SQL
    FROM item and its named parameters."""
    if not 1 <= projects <= count:
        raise SystemExit(f"bench: {count:,} schedules cannot spread over {projects:,} projects")
    return TENANTS, {"count": count, "projects": projects}


def start_cluster(data_dir: Path = CLUSTER_DIR, *, fast: bool = False) -> str:
    """Start the private cluster in data_dir (initialising it the first time: durable, or with the
    test clusters' fast settings, fsync off, when `fast`); returns its port. A cluster initialised
    the other way is refused: its figures would be labelled wrong."""
    env = {**os.environ, "PGDISPATCH_CLUSTER_FAST": "1"} if fast else None
    port = subprocess.run([PG_CLUSTER, "start", str(data_dir)], check=True, capture_output=True,
                          text=True, env=env).stdout.strip()
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres") as conn:
        row = conn.execute("SELECT current_setting('fsync')::bool").fetchone()
    if row != (not fast,):
        stop_cluster(data_dir, check=False)
        raise SystemExit(f"bench: the cluster in {data_dir} has fsync {'on' if row == (True,) else 'off'}, "
                         f"this benchmark wants it {'off' if fast else 'on'}: remove {data_dir} or choose "
                         "another --dir")
    return port


def cluster_kind(fast: bool) -> str:
    """How a figure's cluster is labelled."""
    return ("fsync, synchronous_commit and full_page_writes off (not durable)" if fast
            else "durable (PostgreSQL's defaults: fsync, synchronous_commit and full_page_writes on)")


def cluster_dir(name: str, fast: bool) -> Path:
    """The default folder of a benchmark's private cluster: one per kind, never shared."""
    return ROOT / ".pgdata" / (f"{name}-fsync-off" if fast else f"{name}-durable")


def stop_cluster(data_dir: Path = CLUSTER_DIR, *, check: bool = True) -> None:
    subprocess.run([PG_CLUSTER, "stop", str(data_dir)], check=check)


def recreate_database(port: str, name: str) -> str:
    """Drop and recreate database `name` in the cluster on `port`, install sql/, return its URL."""
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql://postgres@127.0.0.1:{port}/{name}"
    install(url)
    return url


@contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """A temporary git worktree of `rev` (detached HEAD), removed afterwards."""
    parent = Path(tempfile.mkdtemp(prefix="pgdispatch-rev-"))
    path = parent / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(path), rev],
                   check=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False)
        shutil.rmtree(parent, ignore_errors=True)


def install_revision(root: Path, port: str, name: str, *, python: str = sys.executable) -> str:
    """Recreate database `name` in the cluster on `port` and install the sql/ of the revision
    checked out at `root`, with that revision's own installer (run by `python`, with `root`
    first on its path); no pg_cron job is left ticking in it. Returns its URL."""
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql://postgres@127.0.0.1:{port}/{name}"
    subprocess.run([python, "-c", "import sys; from dispatcher.migrations import install;"
                    " install(sys.argv[1])", url],
                   check=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                   stdout=subprocess.DEVNULL)
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True) as conn:
        conn.execute("SELECT cron.unschedule(jobid) FROM cron.job WHERE database = %s", (name,))
    return url


def fresh_database(name: str) -> str:
    """Drop and recreate database `name` in the durable bench cluster, install sql/, return its URL."""
    return recreate_database(start_cluster(), name)


def process_cpu_s(pid: int, *, reaped_children: bool = False) -> float:
    """CPU seconds (user + system) used so far by a process (plus, with reaped_children, by its
    children that have exited and been waited for); 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def cluster_cpu_s(postmaster: int) -> float:
    """CPU seconds used so far by the whole cluster: the postmaster, its live processes, and
    those that have exited (backends of finished connections, autovacuum workers)."""
    return process_cpu_s(postmaster, reaped_children=True) + sum(map(process_cpu_s, children(postmaster)))


def memory_kb(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process, in kB, from /proc/PID/status."""
    figures: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            figures[key] = int(value.split()[0])
    return figures


def median_ms(samples_s: list[float]) -> float:
    return statistics.median(samples_s) * 1000


def record(**figures: float | str) -> None:
    """Hand figures to `python -m bench` (which sets PGDISPATCH_BENCH_RESULTS) for its summary;
    a benchmark run on its own just prints."""
    path = os.environ.get("PGDISPATCH_BENCH_RESULTS")
    if path:
        with open(path, "a") as results:
            results.write(json.dumps(figures, default=float) + "\n")  # numeric arrives as Decimal


def wait_until(predicate: Callable[[], object], what: str, *, within: float = 120.0,
               every: float = 0.01) -> None:
    """Poll `predicate` every `every` seconds until it is truthy; give up after `within`."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: timed out after {within:g} s waiting for {what}")
        time.sleep(every)
