"""docker/: what can be checked without a Docker engine. The compose file parses and everything it
references exists; the Dockerfiles copy files that exist and that their .dockerignore lets in;
the scripts the images run work under bash here, against this machine's PostgreSQL."""

from __future__ import annotations

import fnmatch
import os
import shlex
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dispatcher.cli.main import _parser
from dispatcher.config import OPTIONS
from tests.conftest import PGBIN

from .conftest import run_cli

yaml = pytest.importorskip("yaml", reason="PyYAML is in the test extra: pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def _dockerfile(service: dict[str, Any]) -> tuple[Path, Path]:
    context = (DOCKER / service["build"]["context"]).resolve()
    return context, context / service["build"].get("dockerfile", "Dockerfile")


def _copies(dockerfile: Path) -> list[str]:
    """Source paths of every COPY instruction (no --from copies)."""
    sources = []
    for line in dockerfile.read_text().splitlines():
        if not line.upper().startswith("COPY "):
            continue
        words = shlex.split(line, comments=True)
        if not any(w.startswith("--from") for w in words):
            sources += [w for w in words[1:-1] if not w.startswith("--")]
    return sources


def _ignored(dockerignore: Path, path: str) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes (a parent pattern covers children)."""
    ignored = False
    for pattern in dockerignore.read_text().splitlines():
        pattern = pattern.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = path.split("/")
        if any(fnmatch.fnmatch("/".join(parts[:i]), pattern) for i in range(1, len(parts) + 1)):
            ignored = not negate
    return ignored


def test_services_and_their_dependencies(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"db", "install", "function", "listener"}
    for name in ("db", "function", "listener"):
        assert services[name]["healthcheck"]["test"], name
    assert services["install"]["depends_on"] == {"db": {"condition": "service_healthy"}}
    assert services["listener"]["depends_on"] == {
        "install": {"condition": "service_completed_successfully"},
        "function": {"condition": "service_healthy"},
    }
    for service in services.values():
        for dependency in service.get("depends_on", {}):
            assert dependency in services
    assert set(compose["volumes"]) == {"pgdata"}


def test_build_files_exist_and_are_in_the_context(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        context, dockerfile = _dockerfile(service)
        assert context.is_dir(), name
        assert dockerfile.is_file(), f"{name}: {dockerfile}"
        ignore = Path(f"{dockerfile}.dockerignore")
        if not ignore.exists():
            ignore = context / ".dockerignore"
        for source in _copies(dockerfile):
            assert (context / source).exists(), f"{dockerfile.name}: COPY {source}"
            if ignore.exists():
                assert not _ignored(ignore, source), f"{ignore.name} leaves out {source}"
    # The package's symlinks (dispatcher/sql → ../sql, dispatcher/pg-cluster → ../scripts/pg-cluster)
    # resolve inside the image because their targets are copied beside the package.
    _, listener = _dockerfile(compose["services"]["listener"])
    copied = set(_copies(listener))
    for link in (ROOT / "dispatcher").iterdir():
        if link.is_symlink():
            target = (link.parent / os.readlink(link)).resolve().relative_to(ROOT)
            assert str(target) in copied, f"{link.name} → {target} is not copied"
    assert _ignored(listener.with_name(listener.name + ".dockerignore"), ".pgdata/test/data/PG_VERSION")
    assert _ignored(listener.with_name(listener.name + ".dockerignore"), ".venv/bin/python")


def test_the_images_run_as_configured(compose: dict[str, Any]) -> None:
    """The listener image runs as a non-root user; the postgres image loads pg_cron."""
    _, listener = _dockerfile(compose["services"]["listener"])
    text = listener.read_text()
    assert "FROM python:3.11-slim" in text
    user = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
    assert user and user[-1] not in ("root", "0")
    _, postgres = _dockerfile(compose["services"]["db"])
    assert "FROM postgres:15" in postgres.read_text()
    assert "postgresql-15-cron" in postgres.read_text()


def test_commands_and_settings_are_pgdispatchs(compose: dict[str, Any]) -> None:
    services = compose["services"]
    parser = _parser()
    for name in ("function", "listener"):
        args = parser.parse_args(services[name]["command"])  # raises SystemExit when unknown
        assert args.command == services[name]["command"][0]
    known = {option.env for option in OPTIONS} | {"PGDISPATCH_DEMO_SCHEDULES"}
    for name in ("install", "function", "listener"):
        unknown = {key for key in services[name]["environment"] if key.startswith("PGDISPATCH_")} - known
        assert not unknown, f"{name}: {unknown}"
    listener = services["listener"]["environment"]
    assert listener["PGDISPATCH_INVOKE_URL"].startswith("http://function:8080/")
    assert "8080" in services["function"]["command"]
    variable = "PGDISPATCH_SIGNING_SECRET"
    assert listener[variable] == services["function"]["environment"][variable]
    assert "9464/metrics" in " ".join(services["listener"]["healthcheck"]["test"])
    assert listener["PGDISPATCH_METRICS_PORT"] == "9464"


def _bash(script: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    environ = {"PATH": f"{VENV_BIN}:/usr/bin:/bin", **env}
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=environ, timeout=timeout,
                          check=False)


def test_init_script_installs_and_adds_the_demo_schedules_once(empty_database: str) -> None:
    env = {"PGDISPATCH_DATABASE_URL": empty_database, "PGDISPATCH_DEMO_SCHEDULES": "1"}
    first = _bash(DOCKER / "init.sh", env)
    assert first.returncode == 0, first.stderr
    assert "applied migration 0001_cron_engine" in first.stdout
    assert "pgdispatch-init: added the demo schedules" in first.stdout
    assert "send-report" in first.stdout and "weekly-digest" in first.stdout
    again = _bash(DOCKER / "init.sh", env)
    assert again.returncode == 0, again.stderr
    assert "applied migration" not in again.stdout and "added the demo" not in again.stdout
    listed = run_cli("schedules", "list", "--json", url=empty_database).json
    assert sorted(row["function_name"] for row in listed) == ["always-fails", "send-report", "weekly-digest"]


def test_init_script_gives_up_on_an_unreachable_database() -> None:
    done = _bash(DOCKER / "init.sh", {"PGDISPATCH_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/x",
                                      "PGDISPATCH_INIT_WAIT": "2"})
    assert done.returncode == 1
    assert "cannot connect to the database" in done.stderr
    assert done.stderr.rstrip().endswith("pgdispatch-init: install failed")


def _as_postgres(*command: str) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else list(command)


@pytest.fixture
def fresh_data_directory() -> Iterator[Path]:
    """An initdb'd data directory, as the official image's entrypoint makes before its init scripts."""
    folder = ROOT / ".pgdata" / f"docker-init-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    if os.geteuid() == 0:
        subprocess.run(["chown", "postgres:postgres", str(folder)], check=True)
    subprocess.run(_as_postgres(str(PGBIN / "initdb"), "-D", str(folder / "data"), "-U", "postgres",
                                "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8"),
                   check=True, capture_output=True)
    try:
        yield folder / "data"
    finally:
        subprocess.run(_as_postgres(str(PGBIN / "pg_ctl"), "-D", str(folder / "data"), "-m", "immediate",
                                    "-w", "stop"), check=False, capture_output=True)
        subprocess.run(["rm", "-rf", str(folder)], check=True)


@pytest.mark.pg_cron
def test_postgres_init_script_loads_pg_cron_for_the_application_database(fresh_data_directory: Path) -> None:
    data = fresh_data_directory
    env = {"PGDATA": str(data), "POSTGRES_DB": "app"}
    script = DOCKER / "postgres" / "10-pg-cron.sh"
    first = _bash(script, env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "10-pg-cron.sh: pg_cron preloaded, its jobs in database app"
    conf = (data / "postgresql.conf").read_text()
    assert _bash(script, env).returncode == 0
    assert (data / "postgresql.conf").read_text() == conf  # a second run changes nothing

    # The server that starts next loads pg_cron, and `pgdispatch install` registers the jobs itself.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    options = f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={data} -c fsync=off"
    subprocess.run(_as_postgres(str(PGBIN / "pg_ctl"), "-D", str(data), "-l", str(data / "server.log"), "-w",
                                "-o", options, "start"), check=True, capture_output=True)
    admin = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        settings = conn.execute("SELECT current_setting('shared_preload_libraries'),"
                                " current_setting('cron.database_name')").fetchone()
        assert settings == ("pg_cron", "app")
        conn.execute("CREATE DATABASE app")
    done = run_cli("install", url=f"postgresql://postgres@127.0.0.1:{port}/app")
    assert done.code == 0, done.err
    last = done.out.splitlines()[-1]
    assert last.startswith("pg_cron jobs dispatch-tick (SELECT dispatch.tick() every minute)")
    assert last.endswith("registered in database app")
    # doctor finds the job in the same database (pg_cron has not run it yet: a warning, no failure
    # but the listener that is missing).
    doctor = run_cli("doctor", "--json", url=f"postgresql://postgres@127.0.0.1:{port}/app").json
    statuses = {check["name"]: (check["status"], check["detail"]) for check in doctor["checks"]}
    assert statuses["pg_cron"] == ("ok", "loaded; its jobs live in this database (cron.database_name)")
    assert statuses["dispatch-tick job"][0] == "ok"
    assert statuses["dispatch-tick job"][1].endswith("in database app: '* * * * *' SELECT dispatch.tick()")
    assert [name for name, (status, _) in statuses.items() if status == "fail"] == ["listeners"]
