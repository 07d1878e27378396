"""Shared by the benchmarks: a private, durable PostgreSQL 15 + pg_cron cluster in
.pgdata/bench (started if needed, left running for the next benchmark) and a fresh database
with sql/ installed."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from dispatcher.migrations import install

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_DIR = ROOT / ".pgdata" / "bench"

__all__ = ["SPREAD_CRON", "fresh_database", "median_ms", "record", "stop_cluster", "wait_until"]

# The cron expression of schedule number i in the dispatch benchmarks, as SQL for a query with
# parameters: 1,440 distinct expressions ('m h 1 1 *': one minute of New Year's Day each, so
# none comes due by itself while a benchmark runs). Runs finishing in one batch then rarely
# share one and each next slot is computed on its own: the dearest case (tenants mostly share
# a few expressions, and a batch computes each distinct one once).
SPREAD_CRON = "(i %% 60) || ' ' || (i / 60 %% 24) || ' 1 1 *'"


def fresh_database(name: str) -> str:
    """Drop and recreate database `name` in the bench cluster, install sql/, return its conninfo."""
    port = subprocess.run(
        [str(ROOT / "scripts" / "pg-cluster"), "start", str(CLUSTER_DIR)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    admin = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    conninfo = f"host=127.0.0.1 port={port} user=postgres dbname={name}"
    install(conninfo)
    return conninfo


def stop_cluster() -> None:
    subprocess.run([str(ROOT / "scripts" / "pg-cluster"), "stop", str(CLUSTER_DIR)], check=True)


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
