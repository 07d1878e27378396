"""Failing fast: what only the database can reveal at start (a wrong password, no such database
or role, the dispatch schema missing or older than the listener needs) is said once, clearly,
and the listener exits 2 within seconds instead of retrying forever. After it has been running,
the same errors exit 1, so that systemd's restart policy and back-off apply. A database that is
merely down is waited for (tests/listener/test_hostile.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import psycopg.conninfo
import pytest

from dispatcher.database import SCHEMA_VERSION, DatabaseMisconfigured, DatabaseUnavailable, classify

from .kit import ListenerProcess, Sink

PASSWORD = "right-password"  # noqa: S105
ROLE = "pgdispatch_pw"


@pytest.fixture
def password_role(db: psycopg.Connection) -> Iterator[str]:
    """A login role that must give its password (scram-sha-256), though the test cluster trusts
    every other role: a line put first in pg_hba.conf, then a reload."""
    row = db.execute("SHOW hba_file").fetchone()
    assert row is not None
    hba = Path(row[0])
    original = hba.read_text()
    db.execute(f"DROP ROLE IF EXISTS {ROLE}")
    db.execute(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{PASSWORD}' IN ROLE dispatch_listener")
    hba.write_text(f"host all {ROLE} 127.0.0.1/32 scram-sha-256\n" + original)
    db.execute("SELECT pg_reload_conf()")
    wrong = psycopg.conninfo.make_conninfo(**{**db.info.get_parameters(), "user": ROLE,
                                              "password": "wrong"})
    deadline = time.monotonic() + 10
    while True:  # until the postmaster has read the new file
        try:
            psycopg.connect(wrong).close()
        except psycopg.OperationalError:
            break
        assert time.monotonic() < deadline, "pg_hba.conf was not reloaded"
    try:
        yield ROLE
    finally:
        hba.write_text(original)
        db.execute("SELECT pg_reload_conf()")
        db.execute(f"DROP OWNED BY {ROLE}")
        db.execute(f"DROP ROLE {ROLE}")


async def start_and_expect_2(url: str, sink: Sink) -> tuple[float, ListenerProcess]:
    started = time.monotonic()
    proc = await ListenerProcess.start("--database-url", url, "--invoke-url", sink.template,
                                       "--worker-id", "ff")
    try:
        assert await proc.wait(within=10) == 2, proc.raw
    finally:
        await proc.kill()
    return time.monotonic() - started, proc


def the_line(proc: ListenerProcess) -> str:
    errors = proc.events("configuration_error")
    assert len(errors) == 1, proc.raw  # said once
    assert not proc.events("listener_started") and not proc.events("database_reconnecting")
    return str(errors[0]["message"])


async def test_a_wrong_password_exits_2_at_once(
    db: psycopg.Connection, password_role: str, sink: Sink
) -> None:
    url = psycopg.conninfo.make_conninfo(**{**db.info.get_parameters(), "user": password_role,
                                            "password": "wrong"})
    took, proc = await start_and_expect_2(url, sink)
    assert took < 5
    assert f'password authentication failed for user "{password_role}"' in the_line(proc)
    assert "wrong" not in "".join(proc.raw).replace("wrong-", "")


async def test_an_unknown_database_or_role_exits_2_at_once(db: psycopg.Connection, sink: Sink) -> None:
    params = db.info.get_parameters()
    for changed, expected in [({"dbname": "no_such_db"}, 'database "no_such_db" does not exist'),
                              ({"user": "no_such_role"}, 'role "no_such_role" does not exist')]:
        took, proc = await start_and_expect_2(psycopg.conninfo.make_conninfo(**{**params, **changed}), sink)
        assert took < 5
        assert expected in the_line(proc)


async def test_a_role_that_may_not_log_in_exits_2_at_once(db: psycopg.Connection, sink: Sink) -> None:
    """The group role dispatch_listener may not log in (NOLOGIN, as the install makes it), and a
    URL naming it is a configuration error like a wrong password: it was retried forever."""
    row = db.execute("SELECT rolcanlogin FROM pg_roles WHERE rolname = 'dispatch_listener'").fetchone()
    assert row == (False,)
    url = psycopg.conninfo.make_conninfo(**{**db.info.get_parameters(), "user": "dispatch_listener"})
    took, proc = await start_and_expect_2(url, sink)
    assert took < 5
    line = the_line(proc)
    assert 'role "dispatch_listener" is not permitted to log in' in line
    assert "the URL must name a login role granted dispatch_listener" in line  # what to do instead


def test_an_authorization_error_with_its_sqlstate_is_a_configuration_error() -> None:
    """Class 28 whatever its words (a server's lc_messages may translate them), when the error
    carries its SQLSTATE; a connection failure's message is all libpq gives today."""
    for error in (psycopg.errors.InvalidAuthorizationSpecification("Rolle darf sich nicht anmelden"),
                  psycopg.errors.InvalidPassword("Passwort-Authentifizierung fehlgeschlagen")):
        assert isinstance(classify(error), DatabaseMisconfigured)
    assert isinstance(classify(psycopg.OperationalError("server closed the connection")), DatabaseUnavailable)


async def test_a_missing_or_old_dispatch_schema_exits_2_at_once(db: psycopg.Connection, sink: Sink) -> None:
    name = f"{db.info.dbname}_bare"
    db.execute(f'DROP DATABASE IF EXISTS "{name}"')
    db.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    try:
        bare = psycopg.conninfo.make_conninfo(**{**db.info.get_parameters(), "dbname": name})
        took, proc = await start_and_expect_2(bare, sink)
        assert took < 5
        expected = f"database {name} has no dispatch schema of version {SCHEMA_VERSION} or later"
        assert expected in the_line(proc)
        assert "pgdispatch install" in the_line(proc)
    finally:
        db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    # as if the upgrade to the version this listener needs never ran (nor any after it)
    db.execute("DELETE FROM dispatch.migrations WHERE version >= %s", (SCHEMA_VERSION,))
    took, proc = await start_and_expect_2(psycopg.conninfo.make_conninfo(**db.info.get_parameters()), sink)
    assert took < 5
    old, new = SCHEMA_VERSION - 1, SCHEMA_VERSION
    needs = f"has dispatch schema version {old}; this listener needs {new}: upgrade it"
    assert needs in the_line(proc)


async def test_the_password_changing_under_a_running_listener_exits_1(
    db: psycopg.Connection, password_role: str, sink: Sink,
) -> None:
    url = psycopg.conninfo.make_conninfo(**{**db.info.get_parameters(), "user": password_role,
                                            "password": PASSWORD})
    proc = await ListenerProcess.start("--database-url", url, "--invoke-url", sink.template,
                                       "--worker-id", "pw")
    try:
        await proc.wait_event("listening")
        db.execute(f"ALTER ROLE {password_role} PASSWORD 'rotated'")
        db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                   " WHERE application_name = 'pgdispatch pw'")
        assert await proc.wait(within=30) == 1
    finally:
        await proc.kill()
    failed = proc.events("task_failed")
    assert failed and failed[0]["task"] == "pgdispatch-listen"
    assert "password authentication failed" in failed[0]["message"]
