"""dispatch.run_now end to end: a real listener and a loopback function (DESIGN.md, "Operator
functions": dispatched within a second, its own request id, kind manual)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg

from .kit import YEARLY, Call, Running, Sink, scalar, until

StartListener = Callable[..., Awaitable[Running]]


async def test_run_now_reaches_the_function_within_a_second(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener
) -> None:
    sid = db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
                     " VALUES ('acme', 'fn', %s) RETURNING id", (YEARLY,)).fetchone()[0]  # type: ignore[index]
    await start_listener()
    slot = db.execute("SELECT next_run_at FROM dispatch.schedules").fetchone()

    called_at = time.time()
    run_id = db.execute("SELECT dispatch.run_now(%s)", (sid,)).fetchone()[0]  # type: ignore[index]
    await until(lambda: sink.calls, within=5, what="the function was called")
    took = sink.calls[0].arrived_wall - called_at
    print(f"run_now -> the function: {took * 1000:.0f} ms")
    assert took < 1.0

    await until(lambda: _finished(adb, run_id), within=5, what="the run recorded ok")
    request_id, kind = db.execute("SELECT request_id, kind FROM dispatch.runs WHERE id = %s",
                                  (run_id,)).fetchone()  # type: ignore[misc]
    assert kind == "manual"
    assert [c.headers["X-Request-Id"] for c in sink.calls] == [request_id]
    assert db.execute("SELECT next_run_at FROM dispatch.schedules").fetchone() == slot


async def _finished(adb: psycopg.AsyncConnection[Any], run_id: int) -> bool:
    return bool(await scalar(adb, "SELECT status = 'ok' FROM dispatch.runs WHERE id = %s", (run_id,)))


def _slot(call: Call) -> datetime:
    return datetime.fromisoformat(call.json["invoker"]["scheduledFor"].replace("Z", "+00:00"))


async def test_backfill_invokes_each_slot_once_in_order(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener
) -> None:
    sid = db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
                     " VALUES ('acme', 'fn', '*/10 * * * *') RETURNING id").fetchone()[0]  # type: ignore[index]
    end = db.execute("SELECT date_bin('10 minutes', now() - interval '10 minutes', timestamptz '2000-01-01')"
                     ).fetchone()[0]  # type: ignore[index]
    start = end - timedelta(hours=3)
    await start_listener()

    assert db.execute("SELECT dispatch.backfill(%s, %s, %s)", (sid, start, end)).fetchone() == (18,)
    # (the schedule's own slot may come due while the test runs: only the backfill's, all before
    # `end`, count)
    def backfilled() -> list[Call]:
        return [c for c in sink.calls if _slot(c) <= end]

    await until(lambda: len(backfilled()) >= 18, within=30, what="18 backfill slots invoked")
    done = "SELECT count(*) = 18 FROM dispatch.runs WHERE kind = 'backfill' AND status = 'ok'"
    await until(lambda: scalar(adb, done), within=10, what="18 backfill runs recorded")
    assert [_slot(c) for c in backfilled()] == [start + timedelta(minutes=10 * k) for k in range(18)]
    assert len({c.headers["X-Request-Id"] for c in backfilled()}) == 18  # each once, in order

    assert db.execute("SELECT dispatch.backfill(%s, %s, %s)", (sid, start, end)).fetchone() == (0,)
    # nothing marked, so nothing to invoke
    assert db.execute("SELECT count(*) FROM dispatch.runs WHERE status IN ('pending', 'running')"
                      " AND kind = 'backfill'").fetchone() == (0,)
