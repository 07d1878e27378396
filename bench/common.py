"""Shared by the benchmarks: a private, durable PostgreSQL 15 + pg_cron cluster in
.pgdata/bench (started if needed, left running for the next benchmark) and a fresh database
with sql/ installed."""

from __future__ import annotations

import statistics
import subprocess
from pathlib import Path

import psycopg

from dispatcher.migrations import install

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_DIR = ROOT / ".pgdata" / "bench"

__all__ = ["fresh_database", "median_ms", "stop_cluster"]


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
