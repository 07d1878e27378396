"""Test set-up: a private PostgreSQL cluster (15 with pg_cron by default; another major with
PGDISPATCH_PG_MAJOR, which `scripts/test --pg NN` sets) in .pgdata/test (.pgdata/test-NN), started
once per session by scripts/pg-cluster, and a template database with sql/install.sql applied by
psql, copied for each test (pytest-postgresql's no-process fixture)."""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import settings
from pytest_postgresql import factories

# CI draws the same property-test examples every run, so that whether a commit lands does not
# depend on a new random draw; runs by hand explore new ones (every croniter difference written
# down in tests/test_cron_oracle.py was found that way, and one by CI before this profile).
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")

ROOT = Path(__file__).resolve().parent.parent
_PG_CLUSTER = str(ROOT / "scripts" / "pg-cluster")


def _pg_cluster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_PG_CLUSTER, *args], capture_output=True, text=True)


# The PostgreSQL the scripts use (scripts/pg-cluster): apt's major with pg_cron, or the one
# PGDISPATCH_PG_MAJOR names, whose binaries may have no pg_cron.
PG_MAJOR = _pg_cluster("major").stdout.strip()
HAS_PG_CRON = _pg_cluster("has-pg-cron").returncode == 0
# The folders of this major's clusters under .pgdata: test, chaos-quick (test-18, chaos-quick-18
# for PGDISPATCH_PG_MAJOR=18), since a cluster's data directory belongs to one major.
PGDATA_SUFFIX = f"-{PG_MAJOR}" if os.environ.get("PGDISPATCH_PG_MAJOR") else ""
CLUSTER_DIR = Path(os.environ.get("PGDISPATCH_TEST_CLUSTER") or ROOT / ".pgdata" / f"test{PGDATA_SUFFIX}")
PGBIN = Path(os.environ.get("PGBIN") or _pg_cluster("bindir").stdout.strip())
PSQL = str(PGBIN / "psql")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        port = subprocess.run(
            [_PG_CLUSTER, "start", str(CLUSTER_DIR)],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, "PGDISPATCH_CLUSTER_FAST": "1"},
        ).stdout.strip()
        os.environ["PGDISPATCH_TEST_PORT"] = port
        # A run that was killed leaves its databases behind: the template would then exist already.
        with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres",
                             autocommit=True) as conn:
            leftovers = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'pgdispatch_test%'")
            for (name,) in leftovers.fetchall():
                conn.execute(f'ALTER DATABASE "{name}" IS_TEMPLATE false')
                conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
            # Who wrote each line of the server log: tests on other workers (pytest -n) write
            # there too.
            conn.execute("ALTER SYSTEM SET log_line_prefix = '%m [%p] %q%u@%d '")
            conn.execute("SELECT pg_reload_conf()")
            # The group roles belong to the cluster: made here once, by an install of its own,
            # so that the workers' templates (pytest -n) never race to create them.
            conn.execute('CREATE DATABASE "pgdispatch_test_roles"')
            psql("pgdispatch_test_roles", "-q", "-f", str(ROOT / "sql" / "install.sql"))
            conn.execute('DROP DATABASE "pgdispatch_test_roles"')
    config.option.postgresql_host = "127.0.0.1"
    config.option.postgresql_port = os.environ["PGDISPATCH_TEST_PORT"]
    config.option.postgresql_user = "postgres"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # What needs pg_cron (marked pg_cron) cannot run on a major whose binaries have none: there
    # the listeners' own ticks are what calls dispatch.tick().
    if not HAS_PG_CRON:
        no_cron = pytest.mark.skip(reason=f"PostgreSQL {PG_MAJOR} here has no pg_cron "
                                   "(binaries from registry packages; the listeners' own ticks cover)")
        for item in items:
            if item.get_closest_marker("pg_cron") is not None:
                item.add_marker(no_cron)
    # The failover drills build a pg_auto_failover formation of their own and take minutes: they
    # run only when the marker expression names them (scripts/test -m failover).
    if "failover" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="a failover drill: run it with -m failover")
    for item in items:
        if item.get_closest_marker("failover") is not None:
            item.add_marker(skip)


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and os.environ.get("PGDISPATCH_TEST_KEEP_CLUSTER") != "1":
        subprocess.run([_PG_CLUSTER, "stop", str(CLUSTER_DIR)], check=False)


def psql(dbname: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run psql as a DBA would, against the test cluster."""
    return subprocess.run(
        [
            PSQL,
            "-X",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-p",
            os.environ["PGDISPATCH_TEST_PORT"],
            "-U",
            "postgres",
            "-d",
            dbname,
            *args,
        ],
        check=check,
        capture_output=True,
        text=True,
    )


def load_schema(*, dbname: str, **_: object) -> None:
    psql(dbname, "-q", "-f", str(ROOT / "sql" / "install.sql"))


# The loopback function endpoint (fixture `sink`), shared by tests/listener and tests/ops.
pytest_plugins = ["tests.listener.kit"]

postgresql_noproc = factories.postgresql_noproc(dbname="pgdispatch_test", load=[load_schema])
postgresql = factories.postgresql("postgresql_noproc")


@pytest.fixture
def db(postgresql: psycopg.Connection) -> psycopg.Connection:
    """A fresh database with the schema installed, autocommit like psql."""
    postgresql.autocommit = True
    return postgresql


@pytest.fixture
def connect(db: psycopg.Connection) -> Iterator[Callable[..., psycopg.Connection]]:
    """Open more sessions to the same database; they are closed after the test."""
    opened: list[psycopg.Connection] = []

    def _connect(autocommit: bool = True) -> psycopg.Connection:
        conn = psycopg.connect(**db.info.get_parameters(), autocommit=autocommit)
        opened.append(conn)
        return conn

    yield _connect
    for conn in opened:
        conn.close()


# Modules that use what belongs to the whole cluster: pg_cron's jobs in database postgres (a job
# name is a role's across the cluster: dispatch-tick registered for two databases at once clashes).
_CLUSTER_WIDE = {"test_pg_cron.py", "test_install.py", "test_doctor.py"}


@pytest.fixture(autouse=True)
def _one_at_a_time_cluster_wide(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under pytest -n (scripts/test), each module runs on one worker; the modules above also
    wait for each other, across workers, on a lock file."""
    if request.node.path.name not in _CLUSTER_WIDE:
        yield
        return
    with (CLUSTER_DIR / "cluster-wide.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
