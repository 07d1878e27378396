"""Fixtures of the operations tests: the real `pgdispatch` command against the test cluster."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import psycopg.conninfo
import pytest
from prometheus_client.parser import text_string_to_metric_families

PGDISPATCH = Path(sys.executable).parent / "pgdispatch"


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def json(self) -> Any:
        return json.loads(self.out)


def run_cli(*args: str, url: str | None = None, env: dict[str, str] | None = None,
            timeout: float = 60) -> Result:
    """Run `pgdispatch ARGS` with only PATH (and the given variables) in its environment."""
    environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(env or {})}
    if url is not None:
        environ["PGDISPATCH_DATABASE_URL"] = url
    done = subprocess.run([str(PGDISPATCH), *args], capture_output=True, text=True, env=environ,
                          timeout=timeout, check=False)
    return Result(done.returncode, done.stdout, done.stderr)


@pytest.fixture
def dsn(db: psycopg.Connection) -> str:
    return psycopg.conninfo.make_conninfo(**db.info.get_parameters())


@pytest.fixture
def cli(dsn: str) -> Callable[..., Result]:
    """`pgdispatch ARGS` against the test database (through PGDISPATCH_DATABASE_URL)."""

    def _cli(*args: str, env: dict[str, str] | None = None) -> Result:
        return run_cli(*args, url=dsn, env=env)

    return _cli


@pytest.fixture
def admin_url(dsn: str) -> str:
    """The cluster's `postgres` database: where pg_cron lives in the test cluster."""
    return psycopg.conninfo.make_conninfo(dsn, dbname="postgres")


@pytest.fixture
def empty_database(admin_url: str) -> Iterator[str]:
    """A database without the dispatch schema; its URL."""
    name = f"ops_empty_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield psycopg.conninfo.make_conninfo(admin_url, dbname=name)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def abstract_socket() -> Iterator[tuple[str, socket.socket]]:
    """A bound datagram socket in the abstract namespace: NOTIFY_SOCKET=@name."""
    name = f"pgdispatch-test-{uuid.uuid4().hex}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind("\0" + name)
    server.setblocking(False)
    yield "@" + name, server
    server.close()


def metric_samples(text: str) -> dict[str, float]:
    """Every sample of a Prometheus exposition by name and labels,
    e.g. 'pgdispatch_runs_total{status="ok"}'."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{key}="{value}"' for key, value in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples
