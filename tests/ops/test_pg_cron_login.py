"""pg_cron that cannot log in (issue: Debian's pg_hba.conf asks local TCP connections for a
password): the install and doctor name the cause and the fix, and after the fix running the
install again moves the jobs, which then run. A cluster of its own, since it needs pg_hba.conf
and pg_cron settings that the shared test cluster must not have."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from tests.conftest import PSQL, ROOT

from .conftest import run_cli

pytestmark = pytest.mark.pg_cron

CLUSTER = ROOT / "scripts" / "pg-cluster"
HBA = """\
local all all trust
host all all 127.0.0.1/32 scram-sha-256
host all all ::1/128 scram-sha-256
"""


@dataclass
class Cluster:
    folder: Path
    port: str

    @property
    def url(self) -> str:
        return f"postgresql://postgres@/postgres?host={self.folder}&port={self.port}"

    def execute(self, *statements: str) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)

    def restart(self) -> None:
        subprocess.run([str(CLUSTER), "stop", str(self.folder)], check=True, capture_output=True)
        subprocess.run([str(CLUSTER), "start", str(self.folder), self.port], check=True, capture_output=True)

    def install(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PSQL, "-X", "-d", self.url, "-f", str(ROOT / "sql" / "install.sql")],
                              check=True, capture_output=True, text=True)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """pg_cron without background workers, and host logins that need a password."""
    folder = ROOT / ".pgdata" / f"cron-login-{uuid.uuid4().hex[:8]}"
    port = subprocess.run([str(CLUSTER), "start", str(folder)], check=True, capture_output=True,
                          text=True, env={**os.environ, "PGDISPATCH_CLUSTER_FAST": "1"}).stdout.strip()
    made = Cluster(folder, port)
    try:
        (folder / "data" / "pg_hba.conf").write_text(HBA)
        made.execute("ALTER SYSTEM SET cron.use_background_workers = off")
        made.restart()
        yield made
    finally:
        subprocess.run([str(CLUSTER), "stop", str(folder)], check=False, capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_pg_cron_that_cannot_log_in_is_named_with_its_fix(cluster: Cluster) -> None:
    done = cluster.install()
    # the install registers the jobs, and says loudly that they cannot run, and why
    assert "registered in database postgres" in done.stdout
    for text in (done.stdout, done.stderr):
        assert ("pg_cron logs in to localhost (127.0.0.1) as postgres for database postgres, and pg_hba.conf"
                " line 2 (host all all 127.0.0.1 scram-sha-256) asks for a password it does not have") in text
        assert "set cron.use_background_workers = on in postgresql.conf and restart PostgreSQL" in text
    assert "WARNING:" in done.stderr

    # doctor: one line naming the cause, and the fix
    report = run_cli("doctor", url=cluster.url)
    line = next(line for line in report.out.splitlines() if "dispatch-tick job" in line)
    assert "pg_hba.conf line 2" in line and "asks for a password it does not have" in line, report.out
    assert "cron.use_background_workers = on" in report.out
    assert report.code == 1

    # the fix of the hint: pg_cron through the socket directory, where a local line trusts it;
    # running the install again moves the existing jobs there
    cluster.execute(f"ALTER SYSTEM SET cron.host = '{cluster.folder}'")
    cluster.restart()
    again = cluster.install()
    assert "WARNING" not in again.stderr and "BUT" not in again.stdout, again.stderr
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        hosts = conn.execute(
            "SELECT DISTINCT nodename FROM cron.job WHERE jobname LIKE 'dispatch-%'").fetchall()
        assert hosts == [(str(cluster.folder),)]
        # and pg_cron really runs dispatch-tick now (at the next minute boundary)
        deadline = time.monotonic() + 90
        while True:
            row = conn.execute("SELECT status, return_message FROM cron.job_run_details d JOIN cron.job j"
                               " USING (jobid) WHERE j.jobname = 'dispatch-tick' ORDER BY runid DESC LIMIT 1"
                               ).fetchone()
            if row is not None and row[0] in ("succeeded", "failed"):
                break
            assert time.monotonic() < deadline, "pg_cron ran no dispatch-tick within 90 s"
            time.sleep(0.5)
        assert row == ("succeeded", "1 row")
    line = next(line for line in run_cli("doctor", url=cluster.url).out.splitlines()
                if "dispatch-tick job" in line)
    assert "ok" in line, line
