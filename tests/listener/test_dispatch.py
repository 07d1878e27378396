"""Dispatching against a real database and a real HTTP sink, listeners in-process."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from aiohttp import web

from dispatcher import clock, dispatching
from dispatcher.database import Database, _int_array, _text_array

from .kit import Call, Running, Sink, add_schedules, due_in_a_second, mark_all_due, scalar, until

StartListener = Callable[..., Awaitable[Running]]


async def test_500_due_slots_are_each_invoked_once_and_recorded(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener
) -> None:
    add_schedules(db, 500)
    await start_listener()
    assert mark_all_due(db) == 500

    await until(lambda: scalar(adb, "SELECT count(*) = 500 FROM dispatch.runs WHERE status = 'ok'"),
                within=30, what="500 runs recorded ok")

    runs = db.execute("SELECT request_id, id, schedule_id::text, attempt FROM dispatch.runs").fetchall()
    assert len(runs) == 500
    assert sink.by_request_id() == {request_id: 1 for request_id, *_ in runs}
    by_request = {request_id: rest for request_id, *rest in runs}
    for call in sink.calls:
        run_id, schedule_id, attempt = by_request[call.headers["X-Request-Id"]]
        assert call.headers["Idempotency-Key"] == call.headers["X-Request-Id"]
        invoker = call.json["invoker"]
        assert (invoker["kind"], invoker["runId"], invoker["scheduleId"], invoker["attempt"]) == (
            "schedule", run_id, schedule_id, attempt)
        assert call.project_id == "acme" and call.function_name == "fn"
    audit = db.execute(
        "SELECT count(*), count(DISTINCT metadata->>'requestId') FROM dispatch.audit_log"
        " WHERE action = 'schedule.run.ok'"
    ).fetchone()
    assert audit == (500, 500)
    not_advanced = db.execute(
        "SELECT count(*) FROM dispatch.runs r JOIN dispatch.schedules s ON s.id = r.schedule_id"
        " WHERE NOT s.next_run_at > r.scheduled_for OR s.last_status IS DISTINCT FROM 'ok'"
    ).fetchone()
    assert not_advanced == (0,)


async def test_the_listener_ticks_at_read_committed_whatever_the_databases_default(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener
) -> None:
    """dispatch.tick refuses REPEATABLE READ (its decisions need a snapshot newer than its locks): a
    database whose default_transaction_isolation a DBA raised still gets its slots marked by the
    listener's own ticks."""
    db.execute(f"ALTER DATABASE {db.info.dbname} SET default_transaction_isolation = 'repeatable read'")
    add_schedules(db, 20, cron="* * * * *")
    db.execute("UPDATE dispatch.schedules SET next_run_at = date_trunc('minute', now())")  # due, unmarked
    await start_listener()
    await until(lambda: scalar(adb, "SELECT count(*) = 20 FROM dispatch.runs WHERE status = 'ok'"),
                within=30, what="20 runs marked by the listener's tick and recorded ok")
    assert len(sink.calls) == 20


async def test_three_listeners_share_2000_slots_without_duplicates(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener
) -> None:
    add_schedules(db, 2000)
    for _ in range(3):
        await start_listener()
    assert mark_all_due(db) == 2000

    await until(lambda: scalar(adb, "SELECT count(*) = 2000 FROM dispatch.runs WHERE status = 'ok'"),
                within=60, what="2000 runs recorded ok")
    request_ids = {row[0] for row in db.execute("SELECT request_id FROM dispatch.runs")}
    assert len(sink.calls) == 2000
    assert sink.by_request_id() == dict.fromkeys(request_ids, 1)
    workers = dict(db.execute("SELECT worker, count(*) FROM dispatch.runs GROUP BY worker").fetchall())
    assert set(workers) <= {"test-1", "test-2", "test-3"}
    assert db.execute("SELECT max(attempt) FROM dispatch.runs").fetchone() == (1,)


async def test_two_listeners_mark_a_big_instant_in_chunks_and_claim_from_the_first(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue #15's stampede in small: both clocks mark the instant in chunks (dispatch.tick_chunk)
    # at the same time. A chunk that comes back short because the other listener's chunk holds
    # rows must not end the marking early: with the sweep an hour away, a run left unmarked
    # would never be invoked within the test.
    monkeypatch.setattr(clock, "FIRST_CHUNK", 50)
    monkeypatch.setattr(clock, "MAX_CHUNK", 100)
    monkeypatch.setattr(clock, "CHUNK_GROWTH", 2)
    add_schedules(db, 2000)
    for _ in range(2):
        await start_listener(sweep_interval_s=3600)
    due_in_a_second(db)

    await until(lambda: scalar(adb, "SELECT count(*) = 2000 FROM dispatch.runs WHERE status = 'ok'"),
                within=60, what="2000 runs recorded ok")
    request_ids = {row[0] for row in db.execute("SELECT request_id FROM dispatch.runs")}
    assert sink.by_request_id() == dict.fromkeys(request_ids, 1)
    # created_at is the marking transaction's start, claimed_at the claim's: both the database's clock
    chunks, first_claimed, last_marked = db.execute(
        "SELECT count(DISTINCT created_at), min(claimed_at), max(created_at) FROM dispatch.runs"
    ).fetchone() or (0, None, None)
    assert chunks >= 20, f"the instant was marked in {chunks} transactions"
    assert first_claimed < last_marked, "claiming waited for the whole instant to be marked"


async def test_notify_wakes_the_listener_within_a_second(
    db: psycopg.Connection, sink: Sink, start_listener: StartListener
) -> None:
    add_schedules(db, 1)
    await start_listener(sweep_interval_s=60)  # the sweep cannot be what picks it up

    started = time.monotonic()
    assert mark_all_due(db) == 1
    await until(lambda: sink.calls, within=5, what="the invocation")
    assert sink.calls[0].arrived_mono - started < 1.0


async def test_timer_ticks_at_the_due_instant_without_pg_cron(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener
) -> None:
    add_schedules(db, 1, function_name="soon")
    await start_listener(sweep_interval_s=60)
    # pg_cron does not tick this database (it lives in `postgres`), and nothing here calls tick:
    # move the slot 2 s ahead the way a definition change would, with the schedules NOTIFY.
    with db.transaction():
        due = db.execute(
            "UPDATE dispatch.schedules SET next_run_at = date_trunc('milliseconds', now()) + interval '2 s'"
            " RETURNING extract(epoch FROM next_run_at)::float8"
        ).fetchone()
        db.execute("SELECT pg_notify('dispatch', 'schedules')")
    assert due is not None

    await until(lambda: sink.calls, within=5, what="the invocation")
    late = sink.calls[0].arrived_wall - due[0]
    assert 0 <= late < 0.3, f"invoked {late * 1000:.0f} ms after its instant"
    await until(lambda: scalar(adb, "SELECT count(*) FROM dispatch.runs WHERE status = 'ok'"),
                what="the run recorded")


async def test_a_slots_tick_is_the_sweeps_when_slots_come_as_often_as_sweeps(
    db: psycopg.Connection, dsn: str
) -> None:
    # Slots every 2 s under overlap allow, each instant's tick marking a run, and a sweep every
    # 2 s. A sweep is a tick too (it scans every due schedule): a sweep of its own would be a
    # tick between two slots that marks nothing. The slots come half a second after the clock's
    # first sweep, so that sweeps on a timer of their own would fall between slots at every turn.
    db.execute("INSERT INTO dispatch.schedules (project_id, function_name, every, anchor, overlap)"
               " VALUES ('acme', 'fn', interval '2 seconds', clock_timestamp() + interval '0.5 s', 'allow')")
    database = Database(dsn, application_name="clock-test", worker_id="clock-test", pool_size=2)
    await database.open()
    ticks: list[tuple[float, int, bool]] = []
    ticker = clock.Clock(database, sweep_interval_s=2, listening=lambda: True,
                         on_tick=lambda marked, sweep, _: ticks.append((time.monotonic(), marked, sweep)))
    task = asyncio.create_task(ticker.run())
    try:
        await until(lambda: len(ticks) >= 5, within=20, what="5 ticks")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await database.close()
    assert all(marked >= 1 for _, marked, _ in ticks[1:]), ticks  # the first is the clock's start
    assert max(later - earlier for earlier, later in itertools.pairwise(at for at, *_ in ticks)) < 2.5, ticks
    sweeps = [at for at, _, sweep in ticks if sweep]
    assert max(later - earlier for earlier, later in itertools.pairwise(sweeps)) < 3.5, ticks


async def test_a_slot_that_came_due_since_the_last_tick_is_not_skipped_by_a_replan(
    db: psycopg.Connection, sink: Sink, start_listener: StartListener
) -> None:
    # The clock re-plans on a NOTIFY or after recording outcomes. A re-plan that happened just
    # after a slot's instant, before the timer's tick, asked for the earliest slot after *now*
    # and skipped that one until the sweep. Staged without a race: the slot is the UPDATE's own
    # now(), already past when anyone can see it, and the re-plan (NOTIFY) comes after.
    add_schedules(db, 1, function_name="late")
    await start_listener(sweep_interval_s=3600)  # only its clock can tick the slot
    db.execute("UPDATE dispatch.schedules SET next_run_at = now()")
    db.execute("SELECT pg_notify('dispatch', 'schedules')")
    await until(lambda: sink.calls, within=5, what="the invocation of the slot that came due")


async def test_claims_after_a_short_one_are_spaced_while_runs_trickle_in(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener
) -> None:
    # A jitter spreads 60 runs over 2 s: each comes due at an instant of its own and each recorded
    # outcome wakes a claim too, so every claim is short. A claim's runs share its claimed_at (the
    # transaction's now()): no two claims that took runs start closer than CLAIM_SPACING_S.
    add_schedules(db, 60, cron="* * * * *")
    db.execute("UPDATE dispatch.schedules SET jitter = interval '2 seconds'")
    await start_listener(sweep_interval_s=3600)
    due_in_a_second(db)
    await until(lambda: scalar(adb, "SELECT count(*) = 60 FROM dispatch.runs WHERE status = 'ok'"),
                within=30, what="60 runs recorded ok")
    starts = [row[0] for row in db.execute("SELECT DISTINCT claimed_at FROM dispatch.runs ORDER BY 1")]
    gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(starts)]
    assert len(starts) >= 10, starts  # the runs did trickle in
    assert min(gaps) >= dispatching.CLAIM_SPACING_S, sorted(gaps)[:5]


async def test_outcomes_are_recorded_with_their_error(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener
) -> None:
    async def fails(request: web.Request, call: Call) -> web.StreamResponse:
        return web.json_response({"ok": False, "code": "quota", "message": "monthly quota used up"},
                                 status=500)

    async def html_404(request: web.Request, call: Call) -> web.StreamResponse:
        return web.Response(status=404, text="<html><body><h1>Not   Found</h1></body></html>",
                            content_type="text/html")

    sink.handlers.update({"fails": fails, "missing": html_404})
    add_schedules(db, 1, function_name="fails")
    add_schedules(db, 1, function_name="missing")
    add_schedules(db, 1, function_name="fine")
    db.execute("UPDATE dispatch.schedules SET max_attempts = 1")  # the 500 is final (retries: test_policies)
    await start_listener()
    mark_all_due(db)

    await until(lambda: scalar(adb, "SELECT count(*) = 3 FROM dispatch.runs WHERE finished_at IS NOT NULL"),
                what="3 runs recorded")
    rows = db.execute(
        "SELECT s.function_name, r.status, r.error, r.http_status, s.last_status,"
        " s.next_run_at > r.scheduled_for"
        " FROM dispatch.runs r JOIN dispatch.schedules s ON s.id = r.schedule_id ORDER BY 1"
    ).fetchall()
    assert rows == [
        ("fails", "error", "quota: monthly quota used up", 500, "error", True),
        ("fine", "ok", None, 200, "ok", True),
        ("missing", "error", "HTTP 404: <html><body><h1>Not Found</h1></body></html>", 404, "error", True),
    ]
    audit = db.execute(
        "SELECT metadata->>'functionName', metadata->>'error' FROM dispatch.audit_log"
        " WHERE action = 'schedule.run.error' ORDER BY 1"
    ).fetchall()
    assert audit == [("fails", "quota: monthly quota used up"),
                     ("missing", "HTTP 404: <html><body><h1>Not Found</h1></body></html>")]


async def test_an_outcome_whose_schedule_a_dba_holds_is_kept_and_recorded_once_it_is_free(
    db: psycopg.Connection, connect: Callable[..., psycopg.Connection], adb: psycopg.AsyncConnection[Any],
    sink: Sink, start_listener: StartListener, caplog: Any,
) -> None:
    """Invariant 3 seen from the listener: a transaction left open on one schedule delays the
    recording of that schedule's run only; the function is not called again."""
    caplog.set_level(logging.DEBUG, logger="dispatcher.completion")
    add_schedules(db, 2)
    held, free = (str(r[0]) for r in db.execute("SELECT id FROM dispatch.schedules ORDER BY id"))
    assert mark_all_due(db) == 2
    dba = connect(autocommit=False)
    dba.execute("UPDATE dispatch.schedules SET args = '{\"edited\": true}' WHERE id = %s", (held,))
    await start_listener()

    status = "SELECT status FROM dispatch.runs WHERE schedule_id = %s"
    await until(lambda: scalar(adb, status, (free,)), what="the free schedule's run to be recorded")
    await until(lambda: [r for r in caplog.records if getattr(r, "event", None) == "completion_deferred"
                         and getattr(r, "busy", False)], what="the held one's outcome kept")
    assert await scalar(adb, status, (held,)) == "running"
    dba.commit()
    recorded = "SELECT status = 'ok' FROM dispatch.runs WHERE schedule_id = %s"
    await until(lambda: scalar(adb, recorded, (held,)), what="the held outcome recorded once it was free")
    assert len(sink.calls) == 2
    assert await scalar(adb, "SELECT count(*) FROM dispatch.audit_log WHERE action = 'schedule.run.ok'") == 2


async def test_a_claim_in_progress_at_shutdown_is_handed_back_unstarted(
    db: psycopg.Connection, connect: Callable[..., psycopg.Connection], adb: psycopg.AsyncConnection[Any],
    sink: Sink, start_listener: StartListener, caplog: Any,
) -> None:
    caplog.set_level(logging.INFO)
    add_schedules(db, 3)
    running = await start_listener(sweep_interval_s=60)
    # The runs are marked inside the blocker's transaction: no claim can see them before the
    # lock is taken, however fast the listener's first sweep is (marking them before the
    # listener starts let that sweep claim and invoke them whenever it beat the lock).
    blocker = connect(autocommit=False)
    assert mark_all_due(blocker) == 3
    blocker.execute("LOCK TABLE dispatch.runs IN EXCLUSIVE MODE")  # claim_runs must wait behind this
    db.execute("NOTIFY dispatch")
    await until(lambda: scalar(adb, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                    " AND datname = current_database() AND application_name = %s"
                                    " AND query LIKE '%%claim_runs%%'", ("pgdispatch test-1",)),
                what="the listener's claim to wait on the lock")

    running.listener.stop("test")
    blocker.commit()  # the claim now returns three runs to a listener that is stopping
    await asyncio.wait_for(running.task, 10)

    assert sink.calls == []
    released = [getattr(record, "count", None) for record in caplog.records
                if getattr(record, "event", None) == "runs_released"]
    assert released == [3], "the claim that waited on the lock got the three runs and handed them back"
    # handed back uninvoked: no attempt used up, and the claim's token is never handed out again
    rows = db.execute("SELECT status, attempt, released, worker FROM dispatch.runs").fetchall()
    assert rows == [("pending", 1, 1, None)] * 3


async def test_reconnects_after_pg_terminate_backend_and_sweeps(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener,
    caplog: Any,
) -> None:
    caplog.set_level(logging.INFO)
    add_schedules(db, 5)
    await start_listener(worker_id="doomed", sweep_interval_s=60)
    apps = lambda: db.execute(  # noqa: E731
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgdispatch doomed'").fetchone()
    await until(lambda: apps() == (5,), what="LISTEN and a pool of 4 connected")

    terminated = db.execute(
        "WITH doomed AS MATERIALIZED ("
        "  SELECT pid FROM pg_stat_activity WHERE application_name = 'pgdispatch doomed')"
        " SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) FROM doomed"
    ).fetchone()
    assert terminated == (5,)
    # Marked while the listener is away: the NOTIFY reaches nobody, only the sweep after the
    # reconnect can find these runs (the periodic sweep is a minute away).
    assert mark_all_due(db) == 5

    await until(lambda: scalar(adb, "SELECT count(*) = 5 FROM dispatch.runs WHERE status = 'ok'"),
                within=15, what="runs marked during the outage to be dispatched")
    assert sink.by_request_id() == {row[0]: 1 for row in db.execute("SELECT request_id FROM dispatch.runs")}
    events = lambda: [getattr(record, "event", None) for record in caplog.records]  # noqa: E731
    await until(lambda: "database_reconnected" in events(), what="the LISTEN session to come back")
    assert "database_reconnecting" in events()
    await until(lambda: apps() == (5,), what="the pool to reconnect")


def test_array_literals_round_trip(db: psycopg.Connection) -> None:
    """complete_many sends its arrays as literals (cheaper than psycopg's list adaptation)."""
    texts = ["ok", None, 'x"y\\z', "NULL", "", "é{,}", " padded ", "it's", "\\", "a\nb"]
    ints = [1, None, -3, 2**40]
    row = db.execute("SELECT %s::text[] = %s, %s::bigint[] = %s",
                     (_text_array(texts), texts, _int_array(ints), ints)).fetchone()
    assert row == (True, True)
