"""`pgdispatch demo`: everything on one machine, in the foreground, until Ctrl-C.

A private PostgreSQL with pg_cron in a local folder (dispatcher/pg-cluster), the schema in a
database of its own with the pg_cron jobs registered for it, a demo function on loopback that
prints each call and checks its signature, a few schedules, and the listener. The database and
the port stay from one start to the next (the schedules a user added with them); one demo runs
in a folder at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import psycopg
from aiohttp import web
from psycopg import sql

from dispatcher.config import Settings
from dispatcher.listener import run_listener
from dispatcher.logs import configure_logging
from dispatcher.migrations import install
from dispatcher.signing import SIGNATURE_HEADER, verify_signature

__all__ = ["CRON_JOBS", "DEMO_DATABASE", "DemoError", "run_demo"]

PG_CLUSTER = Path(__file__).parent.parent / "pg-cluster"
DEMO_DATABASE = "pgdispatch_demo"
DEMO_PROJECT = "demo"
# The pg_cron jobs as sql/pg_cron.sql registers them: (name, schedule, command).
CRON_JOBS = (
    ("dispatch-tick", "* * * * *", "SELECT dispatch.tick()"),
    ("dispatch-prune", "7,17,27,37,47,57 * * * *", "CALL dispatch.prune()"),
)
# Back-offs short enough to watch the retries of always-fails (docs/policies.md): the one before
# attempt k + 1 is random, up to min(RETRY_BACKOFF_S * 2^(k-1), RETRY_BACKOFF_MAX_S) (full jitter).
RETRY_BACKOFF_S = 2
RETRY_BACKOFF_MAX_S = 4


class _Schedule(NamedTuple):
    function: str
    cron: str | None  # a cron expression, or None for an interval schedule
    every_s: int | None
    timezone: str
    args: dict[str, str]
    what: str


def _retries() -> str:
    first, second = (min(RETRY_BACKOFF_S * 2 ** attempt, RETRY_BACKOFF_MAX_S) for attempt in (0, 1))
    return (f"a retry after a random back-off of up to {first} s, then another after up to {second} s,"
            " then recorded as error")


DEMO_SCHEDULES: tuple[_Schedule, ...] = (
    # An interval schedule: its first slot a second after it is made, then every 10 s; the
    # listener's own timer fires it, so the first call comes within seconds of the command.
    _Schedule("ping", None, 10, "UTC", {"hello": "world"},
              "an interval schedule, fired by the listener's own timer (pg_cron is the minutely safety net)"),
    _Schedule("send-report", "* * * * *", None, "UTC", {"to": "team@example.com"}, "every minute"),
    _Schedule("always-fails", "* * * * *", None, "UTC", {},
              f"every minute; answers 500 on purpose: {_retries()}"),
    _Schedule("weekly-digest", "0 9 * * MON", None, "Europe/Berlin", {"week": "current"},
              "Mondays 09:00 Berlin time"),
)


class DemoError(Exception):
    """The demo could not start; the message says what failed."""


def _say(text: str = "") -> None:
    print(text, flush=True)


def _cluster(command: str, folder: Path, *args: str) -> str:
    try:
        done = subprocess.run([str(PG_CLUSTER), command, str(folder), *args], check=True, capture_output=True,
                              text=True)
    except subprocess.CalledProcessError as exc:
        raise DemoError(f"pg-cluster {command} {folder} failed: {exc.stderr.strip() or exc}") from None
    except OSError as exc:
        raise DemoError(f"cannot run {PG_CLUSTER}: {exc}") from None
    return done.stdout.strip()


@contextlib.contextmanager
def _one_demo_per_folder(folder: Path) -> Iterator[None]:
    """Hold the folder's lock while the demo runs; refuse when another demo holds it (its cluster
    and database are that demo's). The kernel drops the lock when the process ends, however it ends."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "demo.lock").open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
            raise DemoError(f"a demo is already running in {folder} (pid {holder}); it is left alone. "
                            "Stop it with Ctrl-C where it runs, or give this one another folder: --dir DIR"
                            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        yield


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


def _port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        # as PostgreSQL binds: connections of the last run still in TIME_WAIT do not count
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _start_cluster(folder: Path) -> str:
    """Start the folder's cluster on the port it had last time (folder/port), so that a psql
    command or a PGDISPATCH_DATABASE_URL from an earlier start still works; return the port."""
    saved = folder / "port"
    port = saved.read_text().strip() if saved.exists() else ""
    running = (folder / "data" / "postmaster.pid").exists()
    if port.isdigit() and not running and not _port_is_free(int(port)):
        _say(f"  port       {port}, the demo's until now, is taken by another program: moving to a free one")
        port = ""
    port = _cluster("start", folder, *([port] if port.isdigit() else []))
    saved.write_text(f"{port}\n")
    return port


def _register_cron_jobs(admin: str) -> str:
    """pg_cron lives in the database `postgres` of this cluster (cron.database_name): register
    the jobs there, running in the demo database, as sql/pg_cron.sql does (again: it updates).
    A PostgreSQL major fetched without pg_cron (scripts/bootstrap --pg) has only the listener's
    ticks. Says which."""
    with psycopg.connect(admin, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_cron'").fetchone() is None:
            return "no pg_cron in this PostgreSQL: the listener's own timer ticks"
        for job, cron, command in CRON_JOBS:
            conn.execute(
                "SELECT cron.schedule_in_database(%s, %s, %s, %s)", (job, cron, command, DEMO_DATABASE)
            )
    return (f"pg_cron jobs dispatch-tick and dispatch-prune registered in database postgres"
            f" for {DEMO_DATABASE}")


def _prepare_database(port: str) -> tuple[str, str]:
    """Create the demo database unless an earlier start did, install (or upgrade) the schema,
    register the pg_cron jobs and add the demo schedules that were never added; return its URL and
    what it holds. What a user added to it stays from one start to the next."""
    admin = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    url = f"postgresql://postgres@127.0.0.1:{port}/{DEMO_DATABASE}"
    with psycopg.connect(admin, autocommit=True) as conn:
        kept = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DEMO_DATABASE,)).fetchone()
        if not kept:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DEMO_DATABASE)))
    for line in install(url):
        _say(f"  install    {line}")
    _say(f"  install    {_register_cron_jobs(admin)}")
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        for schedule in DEMO_SCHEDULES:
            # Once per function: one the user deleted (a soft delete keeps the row) stays deleted.
            conn.execute(
                "INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, every, anchor,"
                " timezone, args, retry_backoff, retry_backoff_max)"
                " SELECT %(project)s, %(function)s, %(cron)s::text, %(every)s::interval,"
                "        CASE WHEN %(every)s::interval IS NOT NULL"
                "             THEN date_trunc('second', clock_timestamp()) + interval '1 second' END,"
                "        %(timezone)s, %(args)s::jsonb, %(backoff)s::interval, %(backoff_max)s::interval"
                " WHERE NOT EXISTS (SELECT 1 FROM dispatch.schedules"
                "                   WHERE project_id = %(project)s AND function_name = %(function)s)",
                {"project": DEMO_PROJECT, "function": schedule.function, "cron": schedule.cron,
                 "every": None if schedule.every_s is None else timedelta(seconds=schedule.every_s),
                 "timezone": schedule.timezone, "args": json.dumps(schedule.args),
                 "backoff": timedelta(seconds=RETRY_BACKOFF_S),
                 "backoff_max": timedelta(seconds=RETRY_BACKOFF_MAX_S)},
            )
        row = conn.execute("SELECT (SELECT count(*) FROM dispatch.schedules WHERE deleted_at IS NULL),"
                           " (SELECT count(*) FROM dispatch.runs)").fetchone()
    assert row is not None
    holds = f"{_count(row[0], 'schedule')}, {_count(row[1], 'run')}"
    return url, (f"kept from the last start: {holds}" if kept else f"new: {holds}")


def _function_app(secret: bytes) -> web.Application:
    """The demo function: prints each call, checks its signature, fails when asked to."""

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        signed = verify_signature(secret, body, request.headers.get(SIGNATURE_HEADER))
        payload = json.loads(body) if body else {}
        invoker = payload.get("invoker", {})
        function = request.match_info["function_name"]
        now = datetime.now(UTC).strftime("%H:%M:%S.%f")[:-3]
        _say(
            f"[function] {now} {request.match_info['project_id']}/{function}"
            f" run {invoker.get('runId')} attempt {invoker.get('attempt')}"
            f" slot {invoker.get('scheduledFor')} request {request.headers.get('X-Request-Id')}"
            f" signature {'ok' if signed else 'INVALID'} args {json.dumps(payload.get('args'))}"
        )
        if not signed:
            return web.json_response({"ok": False, "code": "bad_signature", "message": "signature mismatch"},
                                     status=401)
        if function == "always-fails":
            return web.json_response(
                {"ok": False, "code": "demo_failure", "message": "this function fails on purpose"}, status=500
            )
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/projects/{project_id}/functions/{function_name}", handle)
    return app


async def _serve(database_url: str, port: str, held: str, log_format: str) -> None:
    secret = secrets.token_bytes(32)
    runner = web.AppRunner(_function_app(secret), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    function_port = runner.addresses[0][1]
    invoke_url = f"http://127.0.0.1:{function_port}/projects/{{project_id}}/functions/{{function_name}}"
    settings = Settings(database_url=database_url, invoke_url=invoke_url, concurrency=8, timeout_s=10,
                        signing_secret=secret, grace_s=5, worker_id=f"demo:{os.getpid()}")
    with psycopg.connect(database_url) as conn:
        schedules = conn.execute(
            "SELECT project_id, function_name, cron_expression, timezone,"
            " extract(epoch FROM every)::integer, next_run_at IS NOT NULL"
            " FROM dispatch.schedules WHERE deleted_at IS NULL ORDER BY created_at, id"
        ).fetchall()
        row = conn.execute("SELECT project_id || '/' || function_name, next_run_at, now()"
                           " FROM dispatch.schedules WHERE next_run_at IS NOT NULL"
                           " ORDER BY next_run_at LIMIT 1").fetchone()
    _say(f"  database   {database_url} ({held})")
    _say(f"             psql -h 127.0.0.1 -p {port} -U postgres {DEMO_DATABASE}")
    _say(f"  function   {invoke_url} (signed with a random secret)")
    # The demo's schedules as the database has them (a user may have changed, stopped or deleted
    # them since an earlier start), then how many others it holds.
    by_function = {function: rest for project, function, *rest in schedules if project == DEMO_PROJECT}
    for mine in DEMO_SCHEDULES:
        if mine.function not in by_function:
            continue
        cron, timezone, every_s, live = by_function[mine.function]
        rule = f"every '{every_s} seconds'" if every_s else f"'{cron}' {timezone}"
        what = (mine.what if (cron, every_s, timezone) == (mine.cron, mine.every_s, mine.timezone)
                else "changed since the demo added it")
        _say(f"  schedule   {DEMO_PROJECT}/{mine.function}  {rule}: {what}{'' if live else ' (stopped)'}")
    ours = {mine.function for mine in DEMO_SCHEDULES}
    others = sum(1 for project, function, *_ in schedules if project != DEMO_PROJECT or function not in ours)
    if others:
        _say(f"  schedules  and {others} more in this database (pgdispatch schedules list)")
    first = "none: no schedule is live"
    if row:
        wait = (row[1] - row[2]).total_seconds()
        first = (f"{row[0]} at {row[1]:%H:%M:%S %Z} (in {wait:.0f} s)" if wait > 0
                 else f"{row[0]} now (due since {row[1]:%H:%M:%S %Z})")
    _say(f"  first call {first}")
    _say(f"  logs       the listener logs to stderr as {'text' if log_format == 'text' else 'JSON lines'};"
         " each call of the function prints below")
    _say("  Ctrl-C stops everything; the database and its port stay for the next start")
    _say()
    try:
        await run_listener(settings)
    finally:
        await runner.cleanup()


def run_demo(folder: Path) -> int:
    """Run the demo until SIGINT/SIGTERM; returns the exit status. Raises DemoError when another
    demo runs in `folder`, leaving that one alone."""
    # What it says it logs is what it logs: text on a terminal, JSON lines otherwise.
    log_format = "text" if sys.stderr.isatty() else "json"
    configure_logging("info", log_format=log_format)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # A newcomer sees every run: run_finished of an ok run is a DEBUG record (see completion.py).
    logging.getLogger("dispatcher.completion").setLevel(logging.DEBUG)
    started = time.monotonic()
    with _one_demo_per_folder(folder):
        _say(f"pgdispatch demo: starting PostgreSQL in {folder} ...")
        try:
            port = _start_cluster(folder)
            url, held = _prepare_database(port)
            _say(f"  ready in {time.monotonic() - started:.1f} s")
            asyncio.run(_serve(url, port, held, log_format))
        except psycopg.Error as exc:
            raise DemoError(str(exc).strip()) from exc
        except KeyboardInterrupt:
            pass
        finally:
            _say("pgdispatch demo: stopping PostgreSQL ...")
            _cluster("stop", folder)
            _say("pgdispatch demo: stopped, nothing left running")
    return 0


if __name__ == "__main__":
    sys.exit(run_demo(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".pgdata/demo")))
