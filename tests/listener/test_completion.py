"""Outcomes the database cannot take now: how the kept ones are retried. A DBA's transaction
left open in psql holds run rows, so that dispatch.complete_runs answers `busy` for them, while
a real listener goes on dispatching."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
from aiohttp import web

from dispatcher.completion import Completer
from dispatcher.database import Database
from dispatcher.runs import Outcome, Run

from .kit import Call, Running, Sink, add_schedules, mark_all_due, scalar, until
from .proxy import Proxy

StartListener = Callable[..., Awaitable[Running]]


def _held_until(sink: Sink, function_name: str, go: asyncio.Event) -> None:
    async def held(request: web.Request, call: Call) -> web.StreamResponse:
        await go.wait()
        return web.json_response({"ok": True})

    sink.handlers[function_name] = held


async def _lock_runs(dsn: str, function_name: str) -> psycopg.AsyncConnection[Any]:
    """A session that holds the running runs of `function_name` (FOR UPDATE), in a transaction
    left open, as a DBA's psql would."""
    conn = await psycopg.AsyncConnection.connect(dsn)
    await conn.execute("SELECT r.id FROM dispatch.runs r JOIN dispatch.schedules s ON s.id = r.schedule_id"
                       " WHERE s.function_name = %s AND r.status = 'running' FOR UPDATE OF r",
                       (function_name,))
    return conn


async def test_an_outcome_kept_behind_a_full_batch_of_busy_ones_is_retried(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], dsn: str, sink: Sink,
    start_listener: StartListener,
) -> None:
    """Issue 21 item 5: the retry always took the first 250 kept outcomes, so one kept behind 250
    that stayed busy was never retried. Kept outcomes are retried oldest first, in rotation."""
    held_go, late_go = asyncio.Event(), asyncio.Event()
    _held_until(sink, "held", held_go)
    _held_until(sink, "late", late_go)
    add_schedules(db, 250, function_name="held")
    add_schedules(db, 1, function_name="late")
    running = await start_listener(concurrency=260)
    mark_all_due(db)
    await until(lambda: len(sink.calls) == 251, what="all 251 invocations in flight")
    holding_held = await _lock_runs(dsn, "held")
    holding_late = await _lock_runs(dsn, "late")
    try:
        held_go.set()
        await until(lambda: running.listener.status().deferred == 250, what="250 busy outcomes kept")
        late_go.set()
        await until(lambda: running.listener.status().deferred == 251, what="the late one kept behind them")
        await holding_late.commit()  # the late run is free; the 250 ahead of it stay held
        await until(lambda: scalar(adb, "SELECT r.status = 'ok' FROM dispatch.runs r"
                                        " JOIN dispatch.schedules s ON s.id = r.schedule_id"
                                        " WHERE s.function_name = 'late'"),
                    within=5, what="the late outcome recorded while 250 ahead of it stay busy")
    finally:
        await holding_held.close()
        await holding_late.close()
    await until(lambda: scalar(adb, "SELECT count(*) = 251 FROM dispatch.runs WHERE status = 'ok'"),
                within=10, what="every outcome recorded once the DBA's transaction is gone")


async def test_a_busy_outcome_is_not_retried_at_every_other_call(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], dsn: str, sink: Sink,
    start_listener: StartListener, caplog: Any,
) -> None:
    """Issue 21 item 4: a busy outcome was retried after every successful call of the listener's
    (hundreds a second beside other traffic). Busy outcomes keep their own back-off."""
    caplog.set_level(logging.DEBUG, logger="dispatcher.completion")
    go = asyncio.Event()
    _held_until(sink, "held", go)
    add_schedules(db, 1, function_name="held")
    add_schedules(db, 20, function_name="other")
    running = await start_listener(concurrency=30)
    mark_all_due(db)
    await until(lambda: scalar(adb, "SELECT count(*) = 20 FROM dispatch.runs WHERE status = 'ok'"),
                what="the other runs done")
    holding = await _lock_runs(dsn, "held")
    try:
        go.set()
        await until(lambda: running.listener.status().deferred == 1, what="the busy outcome kept")
        caplog.clear()
        # Other traffic for 3 s: manual runs of the other schedules, claimed and recorded.
        started = time.monotonic()
        while time.monotonic() - started < 3.0:
            await adb.execute(
                "SELECT dispatch.run_now(s.id) FROM dispatch.schedules s WHERE s.function_name = 'other'"
                " AND NOT EXISTS (SELECT FROM dispatch.runs r WHERE r.schedule_id = s.id"
                "                 AND r.status IN ('pending', 'running'))")
            await asyncio.sleep(0.05)  # traffic, not synchronisation
        retries = sum(1 for r in caplog.records if getattr(r, "event", None) == "completion_deferred")
        others = await scalar(adb, "SELECT count(*) FROM dispatch.runs WHERE status = 'ok'")
    finally:
        await holding.close()
    assert others > 100, "the test made too little other traffic to tell"
    # Its own back-off (about 0.1 s doubling to 2 s) allows about 6 retries in 3 s.
    assert retries <= 10, f"a busy outcome was retried {retries} times in 3 s beside {others} other runs"
    await until(lambda: scalar(adb, "SELECT r.status = 'ok' FROM dispatch.runs r JOIN dispatch.schedules s"
                                    " ON s.id = r.schedule_id WHERE s.function_name = 'held'"),
                within=5, what="the busy outcome recorded once the transaction is gone")


async def _held_run_invoked(db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], dsn: str, sink: Sink,
                            start_listener: StartListener, proxy: Proxy) -> tuple[asyncio.Event, Any]:
    """One run of the function "held", invoked by a listener whose pool goes through `proxy`
    (LISTEN does not; timeout 1 s, lease 2.5 s): the event its answer waits for, and the lease
    its claim got."""
    go = asyncio.Event()
    _held_until(sink, "held", go)
    add_schedules(db, 1, function_name="held")
    await start_listener(database_url=proxy.url(dsn), listen_database_url=dsn, concurrency=4,
                         timeout_s=1.0, lease_s=2.5)
    mark_all_due(db)
    await until(lambda: len(sink.calls) == 1, what="the run invoked")
    return go, await scalar(adb, "SELECT lease_until FROM dispatch.runs")


async def _recorded_once(adb: psycopg.AsyncConnection[Any], sink: Sink, *, within: float) -> None:
    """After the sweep (pg_cron's job, or another listener's), the one run finished ok on its
    first attempt, and the function was called once for it."""
    await adb.execute("SELECT dispatch.tick()")
    await until(lambda: scalar(adb, "SELECT status <> 'running' FROM dispatch.runs"), within=within,
                what="the run finished or its lease expired")
    row = await (await adb.execute("SELECT status, attempt, earlier_attempts FROM dispatch.runs")).fetchone()
    assert row == ("ok", 1, None), f"(status, attempt, earlier attempts): {row}"
    assert len(sink.calls) == 1, f"the function was called {len(sink.calls)} times for one answered slot"


async def _lock_schedules(dsn: str, function_name: str) -> psycopg.AsyncConnection[Any]:
    """A session that holds the schedules of `function_name` as a tick does while it marks their
    next slot (FOR NO KEY UPDATE), in a transaction left open."""
    conn = await psycopg.AsyncConnection.connect(dsn)
    await conn.execute("SELECT s.id FROM dispatch.schedules s WHERE s.function_name = %s FOR NO KEY UPDATE",
                       (function_name,))
    return conn


async def test_a_busy_outcome_is_recorded_while_its_lease_lasts(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], dsn: str, sink: Sink,
    start_listener: StartListener, caplog: Any,
) -> None:
    """Round 3 (CI, chaos quick): the schedule of a run that allows overlap was held by tick after
    tick while its outcome waited; the busy back-off had grown to 2 s, the 4 s lease ended in
    between, and the function was called again for a slot it had answered. A lock on the schedule
    does not stop the lease from expiring: the back-off never waits past a quarter of the lease
    left. Here the schedule is held until the fifth busy answer (the writer's, then retries after
    0.1 + 0.2 + 0.4 + 0.8 s of back-off, +-20 %); the back-off of 1.6 s that followed ended after
    the 2.5 s lease."""
    caplog.set_level(logging.DEBUG, logger="dispatcher.completion")
    go = asyncio.Event()
    _held_until(sink, "held", go)
    add_schedules(db, 1, function_name="held")
    await start_listener(concurrency=4, timeout_s=1.0, lease_s=2.5)
    stop_ticking = asyncio.Event()

    async def tick_until_stopped() -> None:  # lease expiry, as pg_cron's job and other listeners do
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            while not stop_ticking.is_set():
                await conn.execute("SELECT dispatch.tick()")
                await asyncio.sleep(0.05)  # a tick's cadence, not synchronisation

    def busy_answers() -> int:
        return sum(1 for r in caplog.records
                   if getattr(r, "event", None) == "completion_deferred" and getattr(r, "busy", False))

    ticking = asyncio.create_task(tick_until_stopped())
    try:
        mark_all_due(db)
        await until(lambda: len(sink.calls) == 1, what="the run invoked")
        holding = await _lock_schedules(dsn, "held")
        try:
            go.set()
            # the writer's, then four retries
            await until(lambda: busy_answers() >= 5, within=5, what="five busy answers")
        finally:
            await holding.close()
        await until(lambda: scalar(adb, "SELECT status <> 'running' FROM dispatch.runs"), within=5,
                    what="the run finished or its lease expired")
        # what the lease's expiry would have caused: the run claimed and invoked again
        await asyncio.sleep(0.5)
    finally:
        stop_ticking.set()
        await ticking
    row = await (await adb.execute(
        "SELECT status, attempt, finished_at <= lease_until FROM dispatch.runs")).fetchone()
    assert row == ("ok", 1, True), f"(status, attempt, recorded within the lease): {row}"
    assert len(sink.calls) == 1, f"the function was called {len(sink.calls)} times for one answered slot"


async def test_an_answered_run_outlives_its_lease_while_its_schedule_is_held(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], dsn: str, sink: Sink,
    start_listener: StartListener, caplog: Any,
) -> None:
    """CI, chaos quick (round 3, again): an outcome answered 0.3 s into a 4 s lease was not
    recorded, the lease expired and the function was called again, with no fault near. Retrying
    within the lease (the test above) cannot be enough when the schedule is held at every retry:
    a tick holds it while it looks at the schedule's next slot, and the sweep that expires the
    lease needs only a moment between two of them. A busy answer renews the lease of a run whose
    own row is free: the outcome is in hand, and the caller is coming back with it. Here the
    schedule is held past the whole lease, and the sweep runs the moment it is let go."""
    caplog.set_level(logging.DEBUG, logger="dispatcher.completion")
    go = asyncio.Event()
    _held_until(sink, "held", go)
    add_schedules(db, 1, function_name="held")
    await start_listener(concurrency=4, timeout_s=1.0, lease_s=2.5)
    mark_all_due(db)
    await until(lambda: len(sink.calls) == 1, what="the run invoked")
    lease_until = await scalar(adb, "SELECT lease_until FROM dispatch.runs")
    holding = await _lock_schedules(dsn, "held")
    try:
        go.set()
        await until(lambda: any(getattr(r, "event", None) == "completion_deferred" for r in caplog.records),
                    what="the outcome kept busy")
        # past the lease the run was claimed under, and past the retry after it
        await until(lambda: scalar(adb, "SELECT clock_timestamp() > %s + interval '2.5 seconds'",
                                   (lease_until,)),
                    within=10, interval=0.1, what="the end of the lease, and more")
    finally:
        await holding.close()
    await _recorded_once(adb, sink, within=5)


async def test_a_busy_outcome_is_not_given_up_at_a_blip_that_resets_every_pooled_connection(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], dsn: str, sink: Sink,
    start_listener: StartListener, proxies: list[Proxy], caplog: Any,
) -> None:
    """Review: with its schedule held past its claim's lease (each busy answer renewing it on the
    server), an outcome was abandoned ("its lease ended") at the first blip, and the function was
    called again for a slot it had answered. The blip, a reset of every pooled connection, cost
    the retry its whole 5 s bound: psycopg_pool backs off 1 s, 2 s, ... between a connection
    that failed its check and the next, fresh ones included. A failed check costs a round trip."""
    caplog.set_level(logging.DEBUG, logger="dispatcher.completion")
    proxy = proxies[0]
    go, lease_until = await _held_run_invoked(db, adb, dsn, sink, start_listener, proxy)

    def seen(event: str, after: float = 0.0, **fields: Any) -> list[Any]:
        return [r for r in caplog.records if getattr(r, "event", None) == event and r.created > after
                and all(getattr(r, k, None) == v for k, v in fields.items())]

    holding = await _lock_schedules(dsn, "held")
    try:
        go.set()
        await until(lambda: seen("completion_deferred", busy=True), what="the outcome kept busy")
        await until(lambda: scalar(adb, "SELECT clock_timestamp() > %s + interval '1 second'",
                                   (lease_until,)),
                    within=10, interval=0.1, what="the end of the claim's lease, and more")
        reset_at = time.time()
        assert proxy.reset() >= 1
        await until(lambda: seen("completion_deferred", reset_at, busy=True) or seen("completion_abandoned"),
                    within=10, what="an answer after the reset")
        assert not seen("completion_abandoned"), "the outcome was abandoned at the blip"
    finally:
        await holding.close()
    await _recorded_once(adb, sink, within=10)


async def test_a_busy_outcome_is_kept_for_want_of_the_database_while_its_renewed_lease_lasts(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], dsn: str, sink: Sink,
    start_listener: StartListener, proxies: list[Proxy], caplog: Any,
) -> None:
    """Review: each busy answer renews the run's lease on the server, but the listener went on
    counting it from the claim. Past that, the first call that failed for want of the database had
    the outcome abandoned ("its lease ended") while the server's lease held, and the function was
    called again for a slot it had answered. Here the schedule is held past the claim's lease,
    then the database takes no writes for a moment (as in a failover; 25006 is quick to come)."""
    caplog.set_level(logging.DEBUG, logger="dispatcher.completion")
    proxy = proxies[0]
    go, lease_until = await _held_run_invoked(db, adb, dsn, sink, start_listener, proxy)

    def seen(event: str, reason: str = "") -> list[Any]:
        return [r for r in caplog.records
                if getattr(r, "event", None) == event and reason in getattr(r, "reason", "")]

    holding = await _lock_schedules(dsn, "held")
    try:
        go.set()
        await until(lambda: seen("completion_deferred"), what="the outcome kept busy")
        await until(lambda: scalar(adb, "SELECT clock_timestamp() > %s + interval '1 second'",
                                   (lease_until,)),
                    within=10, interval=0.1, what="the end of the claim's lease, and more")
        db.execute(f'ALTER DATABASE "{db.info.dbname}" SET default_transaction_read_only = on')
        try:
            proxy.reset()  # the pool's sessions are replaced, by read-only ones
            # kept, then retried: the lease is looked at before each retry
            await until(lambda: len(seen("completion_deferred", "read-only transaction")) >= 2
                        or seen("completion_abandoned"), what="a retry of the outcome kept")
        finally:
            db.execute(f'ALTER DATABASE "{db.info.dbname}" RESET default_transaction_read_only')
            proxy.reset()  # the failover is over: the read-only node's sessions are gone
        assert not seen("completion_abandoned"), "abandoned while its renewed lease held"
    finally:
        await holding.close()
    await _recorded_once(adb, sink, within=10)


@contextlib.asynccontextmanager
async def _writing(db: psycopg.Connection, dsn: str, n: int, *, gather: int,
                   linger_s: float) -> AsyncIterator[tuple[Completer, list[Run]]]:
    """A completion writer of its own (`gather`, `linger_s`) running on a database session, and
    `n` runs it claimed there."""
    database = Database(dsn, application_name="pgdispatch gather", worker_id="gather", pool_size=1)
    await database.open()
    completer = Completer(database, gather=gather, linger_s=linger_s)
    writer = asyncio.create_task(completer.run())
    try:
        add_schedules(db, n)
        mark_all_due(db)
        runs = await database.claim(n, lease_s=60, timeout_s=30)
        assert len(runs) == n
        yield completer, runs
    finally:
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer
        await database.close()


async def test_outcomes_that_trickle_in_are_recorded_together(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], dsn: str,
) -> None:
    """Each complete_runs call costs the database about a millisecond whatever its size: the
    writer lets outcomes gather for a while before it writes, so that two outcomes a moment apart
    are one call (one transaction: one finished_at)."""
    async with _writing(db, dsn, 2, gather=10, linger_s=1.0) as (completer, (first, second)):
        completer.submit(first, Outcome(status="ok", http_status=200))
        await asyncio.sleep(0.2)  # the second outcome comes a moment later, within the linger
        completer.submit(second, Outcome(status="ok", http_status=200))
        assert await completer.flush(10.0)
        finished = await scalar(adb, "SELECT array_agg(DISTINCT finished_at) FROM dispatch.runs"
                                     " WHERE id = ANY (%s)", ([first.run_id, second.run_id],))
        assert len(finished) == 1, finished


async def test_the_writer_waits_no_longer_once_enough_outcomes_gathered(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], dsn: str,
) -> None:
    """The linger ends as soon as `gather` outcomes are queued: a busy listener writes at once."""
    async with _writing(db, dsn, 3, gather=3, linger_s=600.0) as (completer, runs):
        for run in runs:
            completer.submit(run, Outcome(status="ok", http_status=200))
        await until(lambda: scalar(adb, "SELECT count(*) = 3 FROM dispatch.runs WHERE status = 'ok'"),
                    within=10, what="three outcomes recorded well before the linger would end")
