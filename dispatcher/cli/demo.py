"""`pgdispatch demo`: everything on one machine, in the foreground, until Ctrl-C.

A private PostgreSQL with pg_cron in a local folder (dispatcher/pg-cluster), the schema in a
database of its own with the pg_cron job registered for it, a demo function on loopback that
prints each call and checks its signature, a few schedules, and the listener.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from aiohttp import web
from psycopg import sql

from dispatcher.config import Settings
from dispatcher.listener import run_listener
from dispatcher.logs import configure_logging
from dispatcher.migrations import install
from dispatcher.signing import SIGNATURE_HEADER, verify_signature

__all__ = ["DEMO_DATABASE", "DemoError", "run_demo"]

PG_CLUSTER = Path(__file__).parent.parent / "pg-cluster"
DEMO_DATABASE = "pgdispatch_demo"
DEMO_PROJECT = "demo"
# (function, cron expression, time zone, args, what it shows)
DEMO_SCHEDULES: tuple[tuple[str, str, str, dict[str, str], str], ...] = (
    ("send-report", "* * * * *", "UTC", {"to": "team@example.com"}, "every minute"),
    ("always-fails", "* * * * *", "UTC", {},
     "every minute, fails on purpose: 3 attempts a few seconds apart, then error"),
    ("weekly-digest", "0 9 * * MON", "Europe/Berlin", {"week": "current"}, "Mondays 09:00 Berlin time"),
)
# Back-offs short enough to watch the retries of always-fails (docs/policies.md)
DEMO_RETRY_BACKOFF = ("2 seconds", "4 seconds")


class DemoError(Exception):
    """The demo could not start; the message says what failed."""


def _say(text: str = "") -> None:
    print(text, flush=True)


def _cluster(command: str, folder: Path) -> str:
    try:
        done = subprocess.run([str(PG_CLUSTER), command, str(folder)], check=True, capture_output=True,
                              text=True)
    except subprocess.CalledProcessError as exc:
        raise DemoError(f"pg-cluster {command} {folder} failed: {exc.stderr.strip() or exc}") from None
    except OSError as exc:
        raise DemoError(f"cannot run {PG_CLUSTER}: {exc}") from None
    return done.stdout.strip()


def _prepare_database(port: str) -> str:
    """Create a fresh demo database, install the schema, register the pg_cron jobs; return its
    URL. Each demo starts from scratch: what an earlier run left would only confuse."""
    admin = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    url = f"postgresql://postgres@127.0.0.1:{port}/{DEMO_DATABASE}"
    with psycopg.connect(admin, autocommit=True) as conn:
        name = sql.Identifier(DEMO_DATABASE)
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(name))
    for line in install(url):
        _say(f"  install    {line}")
    # pg_cron lives in the database `postgres` of this cluster (cron.database_name): register
    # the jobs there, running in the demo database, as sql/pg_cron.sql does.
    with psycopg.connect(admin, autocommit=True) as conn:
        for job, cron, command in [
            ("dispatch-tick", "* * * * *", "SELECT dispatch.tick()"),
            ("dispatch-prune", "*/10 * * * *", "CALL dispatch.prune()"),
        ]:
            conn.execute(
                "SELECT cron.schedule_in_database(%s, %s, %s, %s)", (job, cron, command, DEMO_DATABASE)
            )
    _say(f"  install    pg_cron jobs dispatch-tick and dispatch-prune registered in database postgres"
         f" for {DEMO_DATABASE}")
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        for function, cron, tz, args, _ in DEMO_SCHEDULES:
            conn.execute(
                "INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, timezone, args,"
                " retry_backoff, retry_backoff_max) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (DEMO_PROJECT, function, cron, tz, json.dumps(args), *DEMO_RETRY_BACKOFF),
            )
    return url


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


async def _serve(database_url: str, port: str) -> None:
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
        row = conn.execute("SELECT min(next_run_at), now() FROM dispatch.schedules").fetchone()
    first = f"{row[0]:%H:%M:%S %Z} (in {(row[0] - row[1]).total_seconds():.0f} s)" if row and row[0] else "?"
    _say(f"  database   {database_url}")
    _say(f"             psql -h 127.0.0.1 -p {port} -U postgres {DEMO_DATABASE}")
    _say(f"  function   {invoke_url} (signed with a random secret)")
    for function, cron, tz, _, what in DEMO_SCHEDULES:
        _say(f"  schedule   {DEMO_PROJECT}/{function}  '{cron}' {tz}: {what}")
    _say(f"  first run  {first}; the listener logs JSON to stderr, the function prints below")
    _say("  Ctrl-C stops everything")
    _say()
    try:
        await run_listener(settings)
    finally:
        await runner.cleanup()


def run_demo(folder: Path) -> int:
    """Run the demo until SIGINT/SIGTERM; returns the exit status."""
    configure_logging("info")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # A newcomer sees every run: run_finished of an ok run is a DEBUG record (see completion.py).
    logging.getLogger("dispatcher.completion").setLevel(logging.DEBUG)
    started = time.monotonic()
    _say(f"pgdispatch demo: starting PostgreSQL with pg_cron in {folder} ...")
    port = _cluster("start", folder)
    try:
        url = _prepare_database(port)
        _say(f"  ready in {time.monotonic() - started:.1f} s")
        asyncio.run(_serve(url, port))
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
