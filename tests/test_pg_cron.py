"""pg_cron: the install registers dispatch-tick where pg_cron lives, and pg_cron really fires it.
The test cluster runs pg_cron in database postgres (cron.database_name)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

from dispatcher.cli.demo import CRON_JOBS
from tests.conftest import ROOT, psql

pytestmark = pytest.mark.pg_cron


@pytest.fixture
def cron_db(db: psycopg.Connection) -> Iterator[psycopg.Connection]:
    """A session in pg_cron's database; the dispatch jobs are removed afterwards."""
    params = db.info.get_parameters() | {"dbname": "postgres"}
    with psycopg.connect(**params, autocommit=True) as conn:
        yield conn
        conn.execute("SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname LIKE 'dispatch-%'")


def test_install_in_pg_crons_database_registers_the_job(cron_db: psycopg.Connection) -> None:
    # as an earlier version registered it, at the minutes where schedules bunch: moved on install
    cron_db.execute("SELECT cron.schedule('dispatch-prune', '*/10 * * * *', 'CALL dispatch.prune()')")
    try:
        for _ in range(2):  # idempotent: one job however often it runs
            out = psql("postgres", "-f", str(ROOT / "sql" / "install.sql")).stdout
            assert (
                "pg_cron jobs dispatch-tick (SELECT dispatch.tick() every minute) and dispatch-prune" in out
            )
            assert "registered in database postgres" in out
        jobs = cron_db.execute(
            "SELECT jobname, schedule, command, database FROM cron.job"
            " WHERE jobname LIKE 'dispatch-%' ORDER BY 1"
        ).fetchall()
        assert jobs == [
            ("dispatch-prune", "7,17,27,37,47,57 * * * *", "CALL dispatch.prune()", "postgres"),
            ("dispatch-tick", "* * * * *", "SELECT dispatch.tick()", "postgres"),
        ]
        assert sorted(CRON_JOBS) == [job[:3] for job in jobs]  # the demo's and the soak's
    finally:
        cron_db.execute("DROP SCHEMA IF EXISTS dispatch CASCADE")


def test_the_jobs_of_one_database_are_never_taken_over_for_another(
    db: psycopg.Connection, cron_db: psycopg.Connection
) -> None:
    """pg_cron names a job once per role, and keeps the database of a job scheduled again under
    the same name: registering dispatch-tick for a second database said it had, while the job
    went on ticking the first one only. Both ways of registering refuse and say why."""
    dbname = db.info.dbname
    psql("postgres", "-v", f"dispatch_db={dbname}", "-f", str(ROOT / "sql" / "pg_cron.sql"))
    jobs = "SELECT jobname, database FROM cron.job WHERE jobname LIKE 'dispatch-%' ORDER BY 1"
    before = cron_db.execute(jobs).fetchall()
    assert before == [("dispatch-prune", dbname), ("dispatch-tick", dbname)]

    another = f"{dbname}_another_app"
    cron_db.execute(f'CREATE DATABASE "{another}"')
    try:
        other = psql("postgres", "-v", f"dispatch_db={another}", "-f", str(ROOT / "sql" / "pg_cron.sql"),
                     check=False)
    finally:
        cron_db.execute(f'DROP DATABASE "{another}"')
    assert other.returncode != 0, other.stdout
    assert (f"role postgres already runs pg_cron jobs dispatch-tick and dispatch-prune in database {dbname};"
            f" pg_cron names a job once per role, so they cannot also run in {another}") in other.stderr
    assert "run this as another role (psql -U ROLE)" in other.stderr
    assert "registered" not in other.stdout

    try:  # the install in pg_cron's own database
        out = psql("postgres", "-f", str(ROOT / "sql" / "install.sql"))
        assert (f"pg_cron jobs dispatch-tick and dispatch-prune NOT registered in database postgres: role"
                f" postgres already runs jobs of these names in database {dbname}") in out.stdout
        assert "WARNING:" in out.stderr
    finally:
        cron_db.execute("DROP SCHEMA IF EXISTS dispatch CASCADE")
    assert cron_db.execute(jobs).fetchall() == before


@pytest.mark.slow
def test_pg_cron_ticks_another_database(db: psycopg.Connection, cron_db: psycopg.Connection) -> None:
    dbname = db.info.dbname
    for _ in range(2):
        out = psql("postgres", "-v", f"dispatch_db={dbname}", "-f", str(ROOT / "sql" / "pg_cron.sql"))
        assert f"registered in database postgres for database {dbname}" in out.stdout
    assert cron_db.execute(
        "SELECT jobname, schedule, command, database FROM cron.job WHERE jobname LIKE 'dispatch-%' ORDER BY 1"
    ).fetchall() == [
        ("dispatch-prune", "7,17,27,37,47,57 * * * *", "CALL dispatch.prune()", dbname),
        ("dispatch-tick", "* * * * *", "SELECT dispatch.tick()", dbname),
    ]
    # dispatch.prune commits between batches: check that pg_cron can run it, in the same minute
    cron_db.execute(
        "SELECT cron.schedule_in_database('dispatch-prune-now', '* * * * *', 'CALL dispatch.prune()', %s)",
        (dbname,),
    )

    db.execute("LISTEN dispatch")
    db.execute(
        "INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
        " VALUES ('p', 'fn', '* * * * *')"
    )
    db.execute("UPDATE dispatch.schedules SET next_run_at = date_trunc('minute', now())")
    # An interval schedule with no listener to tick on its slots: pg_cron's minutely tick alone
    # still fires it, at the latest slot (catchup latest).
    interval_id = db.execute(
        "INSERT INTO dispatch.schedules (project_id, function_name, every)"
        " VALUES ('p', 'often', '2 seconds') RETURNING id"
    ).fetchone()[0]
    # Due already, like the cron schedule: its first slot is its anchor plus 2 s, which a pg_cron
    # tick landing within 2 s of the insert would find still ahead (and mark it a minute later).
    db.execute("UPDATE dispatch.schedules SET next_run_at = anchor WHERE id = %s", (interval_id,))
    # pg_cron fires at the next minute boundary: wait for its NOTIFY (at most ~60 s).
    deadline = time.monotonic() + 90
    payloads = []
    for note in db.notifies(timeout=90):
        payloads.append(note.payload)
        if note.payload.startswith('{"marked"'):
            break
    assert '{"marked" : 2, "requeued" : 0}' in payloads
    assert db.execute("SELECT status FROM dispatch.runs").fetchall() == [("pending",), ("pending",)]
    slot, anchor, fire_at, marked_at = db.execute(
        "SELECT r.scheduled_for, s.anchor, r.fire_at, r.created_at FROM dispatch.runs r"
        " JOIN dispatch.schedules s ON s.id = r.schedule_id WHERE s.id = %s", (interval_id,)
    ).fetchone()
    assert (slot - anchor).total_seconds() % 2 == 0 and fire_at == slot
    assert timedelta(0) <= marked_at - slot < timedelta(seconds=2)  # the latest slot, not a stale one
    # pg_cron writes a job's status just after its command commits
    for job in ["dispatch-tick", "dispatch-prune-now"]:
        while (
            status := cron_db.execute(
                "SELECT status, return_message FROM cron.job_run_details d JOIN cron.job j USING (jobid)"
                " WHERE j.jobname = %s ORDER BY runid DESC LIMIT 1",
                (job,),
            ).fetchone()
        ) is None or status[0] != "succeeded":
            assert status is None or status[0] in {"starting", "running"}, (job, status)
            assert time.monotonic() < deadline
