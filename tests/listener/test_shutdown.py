"""Edges of the shutdown (issue 21 item 8), with in-process listeners against the real database
and function sink, faults injected through the TCP proxy."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from aiohttp import web

from dispatcher.config import Settings
from dispatcher.listener import Listener
from dispatcher.runs import Run
from dispatcher.supervisor import TaskFailed

from .kit import Call, Running, Sink, add_schedules, mark_all_due, until
from .proxy import Proxy

StartListener = Callable[..., Awaitable[Running]]


def _events(caplog: Any, name: str) -> list[Any]:
    return [r for r in caplog.records if getattr(r, "event", None) == name]


async def test_runs_the_releaser_was_handing_back_are_handed_back_or_named(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], dsn: str, sink: Sink,
    proxies: list[Proxy], start_listener: StartListener, caplog: Any,
) -> None:
    """The releaser is cut short by the shutdown in the middle of release_runs (its path stalls):
    the runs it held must still be handed back by the shutdown, or named as not handed back."""
    caplog.set_level(logging.INFO)
    pool_proxy, listen_proxy = proxies
    running = await start_listener(database_url=pool_proxy.url(dsn),
                                   listen_database_url=listen_proxy.url(dsn))
    listener = running.listener
    dispatcher = listener._dispatcher
    assert dispatcher is not None
    add_schedules(db, 3, function_name="unstarted")
    claims = listener.metrics.registry.get_sample_value
    claimed_before = claims("pgdispatch_claim_batch_size_count") or 0
    with db.transaction():  # claimed for the listener as its claimer would, before it hears of them
        mark_all_due(db)
        rows = db.execute("SELECT run_id, attempt FROM dispatch.claim_runs(%s, 3, interval '60 seconds')",
                          (listener.settings.worker_id,)).fetchall()
    # The claim the marking's NOTIFY wakes (it finds nothing) is over before the path stalls: one
    # cut short by the stall would reach the server when the path comes back and claim the runs
    # the shutdown has just handed back (a separate defect: see the closing note).
    await until(lambda: (claims("pgdispatch_claim_batch_size_count") or 0) > claimed_before,
                what="the listener's own claim after the marking")
    runs = [Run(run_id=run_id, schedule_id="", project_id="", function_name="", args_json="{}",
                request_id="", scheduled_for=datetime.now(UTC), attempt=attempt,
                lease_until=datetime.now(UTC), lease_deadline=0.0) for run_id, attempt in rows]
    assert len(runs) == 3
    listener._budget.claimed(3)
    pool_proxy.stall()
    for run in runs:
        dispatcher._hand_back(run)  # as a worker does with a run it will not start
    await until(lambda: not dispatcher._unstarted, what="the releaser holding the runs")
    listener.stop("test")
    await until(lambda: not listener._supervisor.running("pgdispatch-release"), what="the releaser cancelled")
    pool_proxy.resume()
    await asyncio.wait_for(running.task, 30)

    ids = {run.run_id for run in runs}
    pending = {row[0] for row in db.execute("SELECT id FROM dispatch.runs WHERE status = 'pending'")}
    named = {run_id for r in _events(caplog, "release_failed") for run_id in getattr(r, "run_ids", [])}
    assert ids <= pending | named, "runs neither handed back nor named"


async def test_a_task_failing_during_a_graceful_drain_does_not_force_it(
    db: psycopg.Connection, sink: Sink, start_listener: StartListener, caplog: Any,
) -> None:
    caplog.set_level(logging.INFO)
    go_first, go_second = asyncio.Event(), asyncio.Event()

    def held(go: asyncio.Event) -> Callable[[web.Request, Call], Awaitable[web.StreamResponse]]:
        async def handler(request: web.Request, call: Call) -> web.StreamResponse:
            await go.wait()
            return web.json_response({"ok": True})
        return handler

    sink.handlers["first"] = held(go_first)
    sink.handlers["second"] = held(go_second)
    add_schedules(db, 1, function_name="first")
    add_schedules(db, 1, function_name="second")
    running = await start_listener(concurrency=2)
    listener = running.listener
    mark_all_due(db)
    await until(lambda: len(sink.calls) == 2, what="two invocations in flight")
    listener.stop("test")  # graceful: the two get the grace period
    await until(lambda: _events(caplog, "draining"), what="the drain")

    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("injected fault")

    listener._completer._report = broken  # type: ignore[method-assign]
    go_first.set()  # its outcome makes the writer fail, mid-drain
    await until(lambda: _events(caplog, "task_failed"), what="the writer failing")
    await asyncio.sleep(0.2)  # a forced shutdown would cancel the second invocation now
    go_second.set()
    with pytest.raises(TaskFailed):
        await asyncio.wait_for(running.task, 30)
    assert not _events(caplog, "shutdown_forced")
    assert not _events(caplog, "invocations_cancelled"), "the drain was cut short by the failure"


async def test_a_stop_during_the_start_up_check_exits_without_starting_the_tasks(
    db: psycopg.Connection, dsn: str, sink: Sink, caplog: Any,
) -> None:
    """Review: a SIGTERM while the start-up check waited (here on a migration that holds
    dispatch.migrations) was seen only after every task had been started, and the shutdown then
    waited CLAIM_STOP_WAIT_S (5 s) for a claimer that nothing woke."""
    caplog.set_level(logging.INFO, logger="dispatcher")
    migration = await psycopg.AsyncConnection.connect(dsn)  # a transaction left open
    await migration.execute("LOCK TABLE dispatch.migrations IN ACCESS EXCLUSIVE MODE")
    listener = Listener(Settings(database_url=dsn, invoke_url=sink.template, worker_id="stop-at-start",
                                 sweep_interval_s=60))
    task = asyncio.create_task(listener.run())
    try:
        await until(lambda: _scalar(db, "SELECT count(*) FROM pg_stat_activity WHERE application_name ="
                                        " 'pgdispatch stop-at-start' AND wait_event_type = 'Lock'"),
                    what="the start-up check waiting on the migration")
        listener.stop("SIGTERM")
    finally:
        await migration.rollback()
        await migration.close()
    released = time.monotonic()
    await asyncio.wait_for(task, 30)
    took = time.monotonic() - released
    assert took < 2.0, f"run() returned {took:.1f} s after the check could go on"
    assert not _events(caplog, "listener_started"), "the listener's tasks were started after the stop"


def _scalar(db: psycopg.Connection, query: str) -> Any:
    row = db.execute(query).fetchone()
    return None if row is None else row[0]
