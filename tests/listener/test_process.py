"""The real `pgdispatch listen` process: signals, exit codes, logs."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import psycopg.conninfo
from aiohttp import web

from .kit import Call, ListenerProcess, Sink, add_schedules, mark_all_due, until
from .proxy import Proxy

SECRET = "do-not-log-this-secret"  # noqa: S105
PASSWORD = "do-not-log-this-password"  # noqa: S105


def _args(dsn: str, sink: Sink, **extra: str) -> list[str]:
    # A password the test server ignores (trust auth) but a log could leak.
    url = psycopg.conninfo.make_conninfo(dsn, password=PASSWORD)
    args = ["--database-url", url, "--invoke-url", sink.template, "--sweep-interval", "60",
            "--worker-id", "proc"]
    for flag, value in extra.items():
        args += [f"--{flag.replace('_', '-')}", value]
    return args


def _hold(sink: Sink, release: asyncio.Event) -> None:
    async def held(request: web.Request, call: Call) -> web.StreamResponse:
        await release.wait()
        return web.json_response({"ok": True})

    sink.handlers["fn"] = held


async def test_sigterm_finishes_in_flight_and_exits_0(db: psycopg.Connection, dsn: str, sink: Sink) -> None:
    release = asyncio.Event()
    _hold(sink, release)
    add_schedules(db, 5)
    proc = await ListenerProcess.start(*_args(dsn, sink, concurrency="2", grace_period="20"),
                                       env={"PGDISPATCH_SIGNING_SECRET": SECRET})
    try:
        await proc.wait_event("listening")
        mark_all_due(db)
        await until(lambda: len(sink.calls) == 2, what="two invocations in flight")

        proc.signal(signal.SIGTERM)
        await proc.wait_event("draining")
        release.set()
        assert await proc.wait() == 0
    finally:
        await proc.kill()

    rows = db.execute("SELECT status, count(*), max(attempt), count(worker) FROM dispatch.runs"
                      " GROUP BY status ORDER BY status").fetchall()
    assert rows == [("ok", 2, 1, 2), ("pending", 3, 0, 0)]
    assert len(sink.calls) == 2
    events = [entry["event"] for entry in proc.logs]
    assert events[0] == "listener_started"
    assert {"shutdown_requested", "draining", "runs_finished", "listener_stopped"} <= set(events)
    # At info level, ok runs are counted per recorded batch (run_finished is a debug record for them).
    finished = proc.events("runs_finished")
    assert sum(entry["count"] for entry in finished) == sum(entry.get("ok", 0) for entry in finished) == 2
    assert all(isinstance(entry["duration_ms_max"], int) for entry in finished)
    assert not proc.events("run_finished")
    # Every line is one JSON object; neither the secret nor the password is anywhere.
    assert len(proc.logs) == len(proc.raw)
    text = "".join(proc.raw)
    assert SECRET not in text and PASSWORD not in text
    assert json.loads(proc.raw[0])["signing"] is True


async def test_second_signal_cancels_what_is_in_flight(db: psycopg.Connection, dsn: str, sink: Sink) -> None:
    release = asyncio.Event()
    _hold(sink, release)
    add_schedules(db, 2)
    proc = await ListenerProcess.start(*_args(dsn, sink, grace_period="60"))
    try:
        await proc.wait_event("listening")
        mark_all_due(db)
        await until(lambda: len(sink.calls) == 2, what="two invocations in flight")
        proc.signal(signal.SIGINT)
        await proc.wait_event("draining")
        proc.signal(signal.SIGINT)
        forced = time.monotonic()
        assert await proc.wait(within=10) == 0
        took = time.monotonic() - forced
    finally:
        release.set()
        await proc.kill()
    cancelled = proc.events("invocations_cancelled")
    assert cancelled and cancelled[0]["count"] == 2
    assert took < 2.0, f"the second signal took {took:.1f} s to end the listener"
    # Left running under this worker: their leases expire and they are retried, same request id.
    rows: list[Any] = db.execute("SELECT status, worker FROM dispatch.runs").fetchall()
    assert rows == [("running", "proc")] * 2


async def test_the_event_loop_is_uvloop_when_installed_unless_told(dsn: str, sink: Sink,
                                                                  tmp_path: Path) -> None:
    for flag, expected in ((None, "uvloop"), ("asyncio", "asyncio")):
        extra = {} if flag is None else {"event_loop": flag}
        proc = await ListenerProcess.start(*_args(dsn, sink, **extra))
        try:
            started = await proc.wait_event("listener_started")
            assert started["event_loop"] == expected
        finally:
            await proc.kill()
    # uvloop asked for and missing: exit 2 with what to do (a module that fails to import hides it)
    (tmp_path / "uvloop.py").write_text("raise ImportError('not here')\n")
    proc = await ListenerProcess.start(*_args(dsn, sink, event_loop="uvloop"),
                                       env={"PYTHONPATH": str(tmp_path)})
    assert await proc.wait() == 2
    assert "which is not installed: pip install uvloop" in "".join(proc.raw)


async def test_a_second_signal_ends_the_listener_within_2_s_even_with_the_database_gone(
    db: psycopg.Connection, dsn: str, sink: Sink, proxies: list[Proxy],
) -> None:
    """Issue 21 item 8: a second signal that came while the shutdown waited for outcomes kept
    for the database (gone: its path refuses connections) did not cut that wait short."""
    release = asyncio.Event()
    _hold(sink, release)
    add_schedules(db, 2)
    (proxy, _) = proxies
    proc = await ListenerProcess.start(*_args(proxy.url(dsn), sink, grace_period="60", concurrency="2"))
    try:
        await proc.wait_event("listening")
        mark_all_due(db)
        await until(lambda: len(sink.calls) == 2, what="two invocations in flight")
        await proxy.refuse()
        release.set()  # their outcomes cannot be written now: kept for the database
        await proc.wait_event("completions_deferred", within=15)
        proc.signal(signal.SIGINT)
        await proc.wait_event("settling")
        proc.signal(signal.SIGINT)
        forced = time.monotonic()
        assert await proc.wait(within=60) == 0
        took = time.monotonic() - forced
    finally:
        release.set()
        await proc.kill()
    assert took < 2.0, f"the second signal took {took:.1f} s to end the listener"
    assert len(proc.events("completion_abandoned")) == 2  # and said, run by run
