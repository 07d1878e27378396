"""Metrics that must not lie (issue 21 item 7): dispatch latency of scheduled runs only, lost runs
counted once however sweeps overlap, and the last-tick gauge moved only by a tick that expires
leases, not by the chunks of one that then fails."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest

from dispatcher import database

from .kit import Running, Sink, add_schedules, mark_all_due, scalar, until

StartListener = Callable[..., Awaitable[Running]]


def _sample(running: Running, name: str) -> float:
    value = running.listener.metrics.registry.get_sample_value(name)
    return 0.0 if value is None else value


async def test_backfill_runs_are_no_dispatch_latency(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener,
) -> None:
    """A backfill run's fire_at is a slot of the past: counted, it said the listener was days late."""
    add_schedules(db, 1, cron="0 * * * *")
    running = await start_listener()
    row = db.execute("SELECT dispatch.backfill(id, now() - interval '2 days', now() - interval '44 hours')"
                     " FROM dispatch.schedules").fetchone()
    assert row is not None and row[0] == 4
    await until(lambda: scalar(adb, "SELECT count(*) = 4 FROM dispatch.runs WHERE status = 'ok'"),
                what="the four backfill runs dispatched")
    assert _sample(running, "pgdispatch_dispatch_latency_seconds_count") == 0
    mark_all_due(db)  # the schedule's own next slot: that one is latency
    await until(lambda: scalar(adb, "SELECT count(*) = 5 FROM dispatch.runs WHERE status = 'ok'"),
                what="the scheduled run dispatched")
    assert _sample(running, "pgdispatch_dispatch_latency_seconds_count") == 1
    assert _sample(running, "pgdispatch_dispatch_latency_seconds_sum") < 60


async def test_lost_runs_are_counted_once_when_sweeps_overlap(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener,
) -> None:
    running = await start_listener()
    listener = running.listener
    await until(lambda: listener._lost_seen is not None, what="the first sweep's count")
    # Three runs another worker claimed and lost: one attempt each, leases of a millisecond.
    add_schedules(db, 3, function_name="ghostly")
    db.execute("UPDATE dispatch.schedules SET max_attempts = 1 WHERE function_name = 'ghostly'")
    with db.transaction():
        mark_all_due(db)
        db.execute("SELECT count(*) FROM dispatch.claim_runs('ghost', 10, interval '1 millisecond')")
    async def expired() -> bool:
        await adb.execute("SELECT dispatch.tick()")
        return bool(await scalar(adb, "SELECT count(*) = 3 FROM dispatch.runs WHERE status = 'lost'"))

    await until(expired, what="the three leases expired")
    # Two sweeps' counts under way at once.
    await asyncio.gather(listener._count_audited(), listener._count_audited())
    await listener._count_audited()
    assert _sample(running, "pgdispatch_runs_lost_total") == 3


async def test_skipped_slots_are_counted_by_reason(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener,
) -> None:
    """The slots a catch-up passed over (a minutely schedule five minutes behind: its latest runs,
    the others are one recorded gap) show in pgdispatch_slots_skipped_total{reason}, once."""
    running = await start_listener()
    listener = running.listener
    await until(lambda: listener._skipped_seen is not None, what="the first sweep's count")
    add_schedules(db, 1, cron="* * * * *")
    db.execute("UPDATE dispatch.schedules"
               " SET next_run_at = date_trunc('minute', now()) - interval '5 minutes'")
    await adb.execute("SELECT dispatch.tick()")
    gap = await scalar(adb, "SELECT (metadata->>'count')::int FROM dispatch.audit_log"
                            " WHERE action = 'schedule.slots.skipped'")
    assert gap >= 5
    await asyncio.gather(listener._count_audited(), listener._count_audited())
    await listener._count_audited()
    sample = listener.metrics.registry.get_sample_value
    assert sample("pgdispatch_slots_skipped_total", {"reason": "catch-up"}) == gap
    assert sample("pgdispatch_slots_skipped_total", {"reason": "overlap"}) in (None, 0)


async def test_the_last_tick_gauge_waits_for_a_tick_that_expires_leases(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], dsn: str, sink: Sink,
    start_listener: StartListener, caplog: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """dispatch.tick() keeps failing (the lease it expires needs an audit row, and a DBA holds
    dispatch.audit_log) while its chunks mark runs: the gauge must stay where the last whole
    tick left it."""
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(database, "TICK_TIMEOUT_S", 2.0)  # a tick's bound, short for the test
    running = await start_listener()
    before = _sample(running, "pgdispatch_last_tick_timestamp_seconds")
    assert before > 0
    # A run another worker claimed and lost (its last attempt): expiring its lease writes an audit row.
    add_schedules(db, 1, function_name="ghostly")
    db.execute("UPDATE dispatch.schedules SET max_attempts = 1")
    with db.transaction():
        mark_all_due(db)
        db.execute("SELECT count(*) FROM dispatch.claim_runs('ghost', 10, interval '1 millisecond')")
    # Slots from 3 s on: the listener plans a tick for then (writing a schedule is audited, so
    # they are written before the lock).
    db.execute("INSERT INTO dispatch.schedules (project_id, function_name, every, anchor, args)"
               " SELECT 'acme', 'often', interval '1 second', now() + interval '3 seconds', '{}'"
               " FROM generate_series(1, 3)")
    holder = await psycopg.AsyncConnection.connect(dsn)
    try:
        await holder.execute("LOCK TABLE dispatch.audit_log IN EXCLUSIVE MODE")
        await until(lambda: scalar(adb, "SELECT count(*) > 0 FROM dispatch.runs r JOIN dispatch.schedules s"
                                        " ON s.id = r.schedule_id WHERE s.function_name = 'often'"),
                    what="a chunk marking the interval schedules' slots")
        await until(lambda: [r for r in caplog.records if getattr(r, "event", None) == "tick_failed"],
                    within=15, what="the tick failing on the lock")
        assert _sample(running, "pgdispatch_last_tick_timestamp_seconds") == before
    finally:
        await holder.close()
