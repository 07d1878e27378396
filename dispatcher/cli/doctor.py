"""`pgdispatch doctor`: check a dispatch database and say, one line a check, what to fix.

Checks, in order: the connection; the schema version against this package's migrations;
pg_cron (loaded, its database, the dispatch-tick job and its last runs); listeners connected
now; overdue schedules; runs stuck past their lease or waiting unclaimed; failing schedules.
A check is ok, warn (worth a look, exit 0), fail (exit 1) or skip (could not apply).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, Literal

import psycopg
import psycopg.conninfo
from psycopg.rows import dict_row

from dispatcher import __version__
from dispatcher.cli.console import (
    APPLICATION_NAME,
    CONNECT_TIMEOUT_S,
    InterruptibleConnection,
    add_connection_arguments,
    format_value,
    print_json,
)
from dispatcher.config import redact_conninfo, resolve_database_url
from dispatcher.migrations import migrations

__all__ = ["Check", "add_commands", "run_checks"]

Status = Literal["ok", "warn", "fail", "skip"]
Conn = psycopg.Connection[dict[str, Any]]

OVERDUE_AFTER = timedelta(minutes=2)
# A pg_cron job that ticks every minute and has not run for this long is not being run.
CRON_SILENT_AFTER = timedelta(minutes=3)
JOB_RUNS_CHECKED = 5
SHOWN = 3  # schedules or runs named in a line


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    name: str
    status: Status
    detail: str
    fix: str = ""


def _connect(url: str) -> Conn:
    conn = InterruptibleConnection.connect(url, autocommit=True, row_factory=dict_row,
                                           application_name=APPLICATION_NAME,
                                           connect_timeout=CONNECT_TIMEOUT_S)
    conn.execute("SET TimeZone = 'UTC'")
    return conn


def _one(conn: Conn, query: str, params: Any = None) -> dict[str, Any]:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row


def _age(delta: timedelta) -> str:
    return format_value(timedelta(seconds=int(delta.total_seconds())))


def _connection(conn: Conn) -> Check:
    row = _one(conn, "SELECT current_setting('server_version') AS version, current_user AS role,"
                     " current_database() AS db")
    return Check("connection", "ok", f"PostgreSQL {row['version']}, database {row['db']} as {row['role']}")


def _schema(conn: Conn) -> Check:
    if _one(conn, "SELECT to_regclass('dispatch.migrations') IS NULL AS missing")["missing"]:
        return Check("schema", "fail", "no dispatch schema in this database",
                     "pgdispatch install --database-url ... (or psql -f sql/install.sql)")
    known = {migration.version: migration.name for migration in migrations()}
    if not _may_read(conn, "dispatch.migrations"):
        # dispatch.schema_version() is granted to every dispatch role: the version, not the names
        version = _one(conn, "SELECT dispatch.schema_version() AS v")["v"]
        latest = max(known)
        if version is None or version < latest:
            return Check("schema", "fail",
                         f"version {version} of the {latest} pgdispatch {__version__} needs",
                         "pgdispatch install --database-url ... (applies only what is missing)")
        return Check("schema", "ok", f"version {version}, what pgdispatch {__version__} expects (names not "
                                     "checked: this role may not read dispatch.migrations)")
    applied = {row["version"]: row["name"]
               for row in conn.execute("SELECT version, name FROM dispatch.migrations").fetchall()}
    missing = sorted(set(known) - set(applied))
    unknown = sorted(set(applied) - set(known))
    if missing:
        return Check("schema", "fail",
                     f"{len(missing)} migration{'' if len(missing) == 1 else 's'} of pgdispatch "
                     f"{__version__} not applied: " + ", ".join(known[version] for version in missing),
                     "pgdispatch install --database-url ... (applies only what is missing)")
    if unknown:
        return Check("schema", "warn",
                     f"the database has migrations this pgdispatch {__version__} does not know: "
                     + ", ".join(applied[version] for version in unknown),
                     "upgrade pgdispatch here to the version that installed the schema")
    latest = max(known)
    return Check("schema", "ok", f"version {latest} ({known[latest]}), what pgdispatch {__version__} expects")


class _CronState:
    """What the pg_cron checks learn from each other."""

    def __init__(self) -> None:
        self.database: str | None = None
        self.jobid: int | None = None
        self.conn: Conn | None = None  # a session to pg_cron's database, when that is another one


def _pg_cron_loaded(conn: Conn, state: _CronState) -> Check:
    here = _one(conn, "SELECT current_database() AS db")["db"]
    # pg_settings hides what this role may not read (pg_read_all_settings), where current_setting()
    # would raise an error into the server log.
    row = conn.execute("SELECT setting FROM pg_settings WHERE name = 'shared_preload_libraries'").fetchone()
    libraries = None if row is None else row["setting"]
    if libraries is None:
        # pg_cron's scheduler shows in pg_stat_activity to anyone.
        seen = conn.execute("SELECT datname FROM pg_stat_activity"
                            " WHERE application_name = 'pg_cron scheduler'").fetchone()
        if seen is None:
            return Check("pg_cron", "warn",
                         "cannot tell: this role may not read shared_preload_libraries, and no pg_cron "
                         "scheduler shows in pg_stat_activity",
                         "run doctor as a superuser or a role granted pg_read_all_settings")
        state.database = seen["datname"] or "postgres"
        where = "this database" if state.database == here else f"database {state.database}"
        return Check("pg_cron", "ok", f"running; its jobs live in {where} (its scheduler's database)")
    if "pg_cron" not in [name.strip().strip('"') for name in libraries.split(",")]:
        return Check("pg_cron", "warn",
                     "not loaded (not in shared_preload_libraries): nothing ticks every minute but the "
                     "listeners' own timers, and nothing prunes old runs",
                     "install pg_cron (Debian and Ubuntu: postgresql-NN-cron for PostgreSQL NN), add "
                     "pg_cron to shared_preload_libraries, set cron.database_name, restart PostgreSQL, "
                     "then pgdispatch install")
    row = conn.execute("SELECT setting FROM pg_settings WHERE name = 'cron.database_name'").fetchone()
    state.database = (row["setting"] if row else None) or "postgres"
    where = "this database" if state.database == here else f"database {state.database}"
    return Check("pg_cron", "ok", f"loaded; its jobs live in {where} (cron.database_name)")


def _cron_session(conn: Conn, url: str, state: _CronState) -> tuple[Conn | None, str]:
    """A session to pg_cron's database, or None and why not."""
    here = _one(conn, "SELECT current_database() AS db")["db"]
    if state.database == here:
        return conn, ""
    if state.conn is None:
        try:
            state.conn = _connect(psycopg.conninfo.make_conninfo(url, dbname=state.database))
        except psycopg.OperationalError as exc:
            return None, " ".join(str(exc).split())
    return state.conn, ""


def _tick_job(conn: Conn, url: str, state: _CronState) -> Check:
    here = _one(conn, "SELECT current_database() AS db, current_user AS role")
    lookup = (f"psql -d {state.database} -c \"SELECT jobid, active, database, command FROM cron.job"
              " WHERE jobname = 'dispatch-tick'\"")
    if state.database == here["db"]:
        register = "pgdispatch install (registers it in this database)"
    else:
        register = f"psql -d {state.database} -v dispatch_db={here['db']} -f sql/pg_cron.sql"
    cron, why = _cron_session(conn, url, state)
    if cron is None:
        return Check("dispatch-tick job", "warn",
                     f"cannot connect to database {state.database} to look: {why}",
                     f"check by hand: {lookup}")
    usage = cron.execute("SELECT has_schema_privilege(oid, 'USAGE') AS ok FROM pg_namespace"
                         " WHERE nspname = 'cron'").fetchone()
    if usage is not None and not usage["ok"]:
        return Check("dispatch-tick job", "warn",
                     f"cannot check as this role: it may not use schema cron in database {state.database}",
                     "run doctor as a superuser or the installing role to check this too")
    if _one(cron, "SELECT to_regclass('cron.job') IS NULL AS missing")["missing"]:
        return Check("dispatch-tick job", "fail",
                     f"extension pg_cron is not created in database {state.database}",
                     f"as a superuser: psql -d {state.database} -c 'CREATE EXTENSION pg_cron', "
                     f"then {register}")
    jobs = cron.execute("SELECT jobid, schedule, command, active, username, nodename FROM cron.job"
                        " WHERE jobname = 'dispatch-tick' AND database = %s ORDER BY jobid",
                        (here["db"],)).fetchall()
    if not jobs:
        superuser = _one(cron, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user")["rolsuper"]
        if not superuser:
            return Check("dispatch-tick job", "warn",
                         f"no job dispatch-tick for database {here['db']} visible to role {here['role']} "
                         "(pg_cron shows a role only its own jobs)",
                         f"check as the installing role or a superuser: {lookup}")
        return Check("dispatch-tick job", "fail",
                     f"no pg_cron job dispatch-tick runs in database {here['db']}", register)
    job = jobs[0]
    state.jobid = job["jobid"]
    if not job["active"]:
        return Check("dispatch-tick job", "fail", f"job {job['jobid']} is inactive",
                     f"psql -d {state.database} -c \"SELECT cron.alter_job({job['jobid']}, active => true)\"")
    if "dispatch.tick" not in job["command"]:
        return Check("dispatch-tick job", "fail",
                     f"job {job['jobid']} runs {job['command']!r}, not dispatch.tick()", register)
    # Whether pg_cron can log in to run it: the cause of every "connection failed" run.
    problem = _one(conn, "SELECT dispatch.cron_login_problem(%s, %s, %s) AS v",
                   (here["db"], job["username"], job["nodename"]))["v"]
    if problem is not None:
        cause, _, fix = problem.partition(": ")
        unknown = problem.startswith("cannot tell")
        return Check("dispatch-tick job", "warn" if unknown else "fail", cause, fix)
    return Check("dispatch-tick job", "ok",
                 f"job {job['jobid']} in database {state.database}: '{job['schedule']}' {job['command']}")


def _tick_runs(conn: Conn, url: str, state: _CronState) -> Check:
    cron, _ = _cron_session(conn, url, state)
    assert cron is not None and state.jobid is not None
    rows = cron.execute(
        # a run that could not connect has no start_time: when it ended is the next best thing
        "SELECT runid, status, return_message, coalesce(start_time, end_time) AS start_time,"
        " now() - coalesce(start_time, end_time) AS ago"
        " FROM cron.job_run_details WHERE jobid = %s ORDER BY runid DESC LIMIT %s",
        (state.jobid, JOB_RUNS_CHECKED)).fetchall()
    details = (f"psql -d {state.database} -c \"SELECT start_time, status, return_message"
               f" FROM cron.job_run_details WHERE jobid = {state.jobid} ORDER BY runid DESC LIMIT 10\"")
    if not rows:
        return Check("dispatch-tick runs", "warn",
                     "no runs recorded yet (registered less than a minute ago, or cron.log_run is off)",
                     f"look again in a minute: {details}")
    latest = rows[0]
    failed = [row for row in rows if row["status"] == "failed"]
    if latest["status"] == "failed":
        message = " ".join((latest["return_message"] or "").split())
        return Check("dispatch-tick runs", "fail",
                     f"the last run ({format_value(latest['start_time'])}) failed: {message}", details)
    if latest["ago"] is not None and latest["ago"] > CRON_SILENT_AFTER:
        return Check("dispatch-tick runs", "warn",
                     f"the last run started {_age(latest['ago'])} ago, though the job runs every minute",
                     "is pg_cron's background worker running? See the PostgreSQL log (pg_cron scheduler)")
    if failed:
        return Check("dispatch-tick runs", "warn",
                     f"{len(failed)} of the last {len(rows)} runs failed; the latest succeeded", details)
    return Check("dispatch-tick runs", "ok",
                 f"the last {len(rows)} runs succeeded, the latest {_age(latest['ago'] or timedelta())} ago")


def _listeners(conn: Conn) -> Check:
    row = _one(conn, "SELECT count(*) FILTER (WHERE listening) AS listening, count(*) AS sessions,"
                     " array_agg(DISTINCT worker ORDER BY worker) FILTER (WHERE listening) AS workers,"
                     " count(*) FILTER (WHERE listening IS NULL) AS unseen,"
                     " array_agg(DISTINCT worker ORDER BY worker) FILTER (WHERE listening IS NULL)"
                     "  AS unseen_workers,"
                     " quote_ident(current_user) AS role"
                     " FROM dispatch.listeners")
    if row["listening"]:
        return Check("listeners", "ok", f"{row['listening']} listening: {_some(row['workers'] or [])}")
    if row["unseen"]:
        # Another role's sessions show their statements only to a superuser or pg_read_all_stats:
        # sessions of a listener are there, whether one of them listens cannot be told.
        workers = [worker or "-" for worker in row["unseen_workers"] or []]
        sessions = f"{row['unseen']} pgdispatch session" + ("s" if row["unseen"] > 1 else "")
        of = "worker" if len(workers) == 1 else "workers"
        return Check("listeners", "warn",
                     f"{sessions} of {of} {_some(workers)}, whose statements this role may not see: "
                     "whether one listens is unknown",
                     f"run doctor as a superuser or as the listeners' login role, or GRANT "
                     f"pg_read_all_stats TO {row['role']}")
    extra = f" ({row['sessions']} pgdispatch sessions, none doing LISTEN)" if row["sessions"] else ""
    return Check("listeners", "fail", f"no listener connected to this database{extra}: due runs wait",
                 "start one: pgdispatch listen (or systemctl start pgdispatch; journalctl -u pgdispatch)")


def _some(names: list[str]) -> str:
    """The first SHOWN names, and how many more."""
    return ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def _overdue(conn: Conn) -> Check:
    rows = conn.execute(
        "SELECT s.id, s.project_id, s.function_name, now() - s.next_run_at AS late, count(*) OVER () AS total"
        " FROM dispatch.schedules s"
        " WHERE s.next_run_at < now() - %s"
        "   AND NOT EXISTS (SELECT 1 FROM dispatch.runs r"
        "                   WHERE r.schedule_id = s.id AND r.scheduled_for = s.next_run_at)"
        " ORDER BY s.next_run_at LIMIT %s", (OVERDUE_AFTER, SHOWN)).fetchall()
    if not rows:
        return Check("overdue schedules", "ok", "none due more than 2 minutes ago and not marked")
    named = ", ".join(f"{row['project_id']}/{row['function_name']} {row['id']} ({_age(row['late'])} late)"
                      for row in rows)
    return Check("overdue schedules", "fail",
                 f"{rows[0]['total']} due more than 2 minutes ago and not marked as runs: {named}",
                 "nothing ticks: start a listener or fix the dispatch-tick job; SELECT dispatch.tick() "
                 "marks them now")


def _stuck(conn: Conn) -> Check:
    row = _one(conn,
               "SELECT count(*) FILTER (WHERE status = 'running' AND lease_until < now()) AS expired,"
               " min(lease_until) FILTER (WHERE status = 'running' AND lease_until < now()) AS oldest_lease,"
               # a pending run waits from its slot, or a retry from its back-off's end; one that
               # waits behind the open run (overlap buffer_one) is not stuck
               " count(*) FILTER (WHERE status = 'pending'"
               "                    AND coalesce(not_before, scheduled_for) < now() - %s) AS waiting,"
               " min(scheduled_for) FILTER (WHERE status = 'pending'"
               "                              AND coalesce(not_before, scheduled_for) < now() - %s)"
               "   AS oldest,"
               " now() AS now"
               " FROM dispatch.runs WHERE status IN ('pending', 'running')", (OVERDUE_AFTER, OVERDUE_AFTER))
    problems = []
    if row["expired"]:
        problems.append(f"{row['expired']} running past their lease "
                        f"(the oldest lease ended {_age(row['now'] - row['oldest_lease'])} ago)")
    if row["waiting"]:
        problems.append(f"{row['waiting']} pending and unclaimed for more than 2 minutes "
                        f"(the oldest slot {_age(row['now'] - row['oldest'])} ago)")
    if not problems:
        return Check("stuck runs", "ok", "none running past their lease or waiting unclaimed")
    return Check("stuck runs", "fail", "; ".join(problems),
                 "tick expires leases and listeners claim pending runs: is a listener up and ticking? "
                 "SELECT dispatch.tick() returns expired runs to pending now")


def _failing(conn: Conn) -> Check:
    rows = conn.execute(
        "SELECT id, project_id, function_name, consecutive_failures, last_error, count(*) OVER () AS total"
        " FROM dispatch.schedule_status WHERE consecutive_failures > 0"
        " ORDER BY consecutive_failures DESC, id LIMIT %s", (SHOWN,)).fetchall()
    if not rows:
        return Check("failing schedules", "ok", "none: every schedule's latest finished run is ok")
    named = "; ".join(
        f"{row['project_id']}/{row['function_name']} {row['id']} ({row['consecutive_failures']} in a row: "
        f"{format_value(row['last_error'])[:80]})" for row in rows)
    return Check("failing schedules", "warn", f"{rows[0]['total']} failing: {named}",
                 "pgdispatch runs list --failed --schedule ID (the function answers with these errors)")


def _may_read(conn: Conn, relation: str) -> bool:
    return bool(_one(conn, "SELECT has_table_privilege(%s, 'SELECT') AS ok", (relation,))["ok"])


def _guarded(name: str, check: Callable[[], Check], conn: Conn | None = None, reads: tuple[str, ...] = ()
             ) -> Check:
    """Run `check`, unless this role may not read what it reads: then say so rather than leave
    permission errors in the server log."""
    try:
        if conn is not None:
            for relation in reads:
                if not _may_read(conn, relation):
                    return Check(name, "warn", f"cannot check as this role: it may not read {relation}",
                                 "run doctor as a superuser or a role granted dispatch_reader to check "
                                 "this too")
        return check()
    except psycopg.errors.InsufficientPrivilege as exc:
        return Check(name, "warn", f"cannot check as this role: {exc.diag.message_primary}",
                     "run doctor as a superuser or the installing role to check this too")
    except psycopg.Error as exc:
        return Check(name, "fail", f"the check failed: {' '.join(str(exc).split())}")


def run_checks(url: str) -> list[Check]:
    """Every check against the database at `url`, in order."""
    try:
        conn = _connect(url)
    except psycopg.OperationalError as exc:
        why = " ".join(str(exc).split())
        return [Check("connection", "fail", f"cannot connect to {redact_conninfo(url)}: {why}",
                      "check --database-url / PGDISPATCH_DATABASE_URL, that PostgreSQL runs and that "
                      "pg_hba.conf lets this host and role in")]
    state = _CronState()
    with conn:
        try:
            checks = [_guarded("connection", lambda: _connection(conn)),
                      _guarded("schema", lambda: _schema(conn))]
            if checks[-1].status == "fail" and "no dispatch schema" in checks[-1].detail:
                return checks
            checks.append(_guarded("pg_cron", lambda: _pg_cron_loaded(conn, state)))
            if state.database is None:
                checks += [Check("dispatch-tick job", "skip", "pg_cron is not loaded"),
                           Check("dispatch-tick runs", "skip", "pg_cron is not loaded")]
            else:
                checks.append(_guarded("dispatch-tick job", lambda: _tick_job(conn, url, state)))
                if state.jobid is None:
                    checks.append(Check("dispatch-tick runs", "skip", "no dispatch-tick job to look at"))
                else:
                    checks.append(_guarded("dispatch-tick runs", lambda: _tick_runs(conn, url, state)))
            checks += [_guarded("listeners", lambda: _listeners(conn), conn, ("dispatch.listeners",)),
                       _guarded("overdue schedules", lambda: _overdue(conn), conn,
                                ("dispatch.schedules", "dispatch.runs")),
                       _guarded("stuck runs", lambda: _stuck(conn), conn, ("dispatch.runs",)),
                       _guarded("failing schedules", lambda: _failing(conn), conn,
                                ("dispatch.schedule_status",))]
        finally:
            if state.conn is not None:
                state.conn.close()
    return checks


def _doctor(args: argparse.Namespace) -> int:
    url = resolve_database_url(args.database_url)
    checks = run_checks(url)
    failed = [check for check in checks if check.status == "fail"]
    warned = [check for check in checks if check.status == "warn"]
    healthy = not failed and not (args.strict and warned)
    if args.json:
        print_json({"ok": healthy, "database": redact_conninfo(url), "checks": [asdict(c) for c in checks]})
    else:
        print(f"pgdispatch doctor: {redact_conninfo(url)}")
        width = max(len(check.name) for check in checks)
        for check in checks:
            print(f"{check.status:<5} {check.name:<{width}}  {check.detail}")
            if check.fix and check.status != "ok":
                print(f"{'':<6}{'':<{width}}  fix: {check.fix}")
        summary = ", ".join(part for part in (f"{len(failed)} failed" if failed else "",
                                              f"{len(warned)} to look at" if warned else "") if part)
        print(summary or "all checks passed")
    return 0 if healthy else 1


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    doctor = commands.add_parser(
        "doctor", help="check the database, pg_cron and listeners, and say what to fix",
        description="Check a dispatch database: connection, schema version, pg_cron (loaded, its "
                    "database, the dispatch-tick job and its last runs), listeners connected now, "
                    "overdue schedules, runs stuck past their lease, failing schedules. One line a "
                    "check, with a fix. Exit status: 0 when nothing failed (warnings allowed), 1 when "
                    "a check failed, 2 for a configuration error.")
    doctor.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    add_connection_arguments(doctor)
    doctor.set_defaults(handler=_doctor)
