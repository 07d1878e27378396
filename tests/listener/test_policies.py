"""Run policies end to end: the real listener, a loopback function that fails on purpose, and what
the database recorded (DESIGN.md, "Scheduling policies")."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from aiohttp import web

from .kit import YEARLY, Call, Running, Sink, mark_all_due, scalar, until

StartListener = Callable[..., Awaitable[Running]]
# How late a retry may reach the function after its back-off: the NOTIFY that re-plans the
# listeners' clocks, their timer, a tick, the NOTIFY that wakes the claimers, a claim.
SLACK_S = 1.0


def add(db: psycopg.Connection, function_name: str, **policies: Any) -> str:
    names = ["project_id", "function_name", "cron_expression", *policies]
    row = db.execute(
        f"INSERT INTO dispatch.schedules ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))})"
        " RETURNING id", ["acme", function_name, YEARLY, *policies.values()]).fetchone()
    assert row is not None
    return str(row[0])


Handler = Callable[[web.Request, Call], Awaitable[web.StreamResponse]]


def failing(times: int, response: Callable[[], web.Response]) -> Handler:
    """A function that answers `response()` `times` times, then 200."""
    calls = 0

    async def handler(_request: web.Request, _call: Call) -> web.StreamResponse:
        nonlocal calls
        calls += 1
        return response() if calls <= times else web.json_response({"ok": True})

    return handler


async def finished(adb: psycopg.AsyncConnection[Any], within: float = 20) -> tuple[Any, ...]:
    done = "SELECT count(*) = 1 FROM dispatch.runs WHERE status NOT IN ('pending', 'running')"
    await until(lambda: scalar(adb, done), within=within, what="the run finished")
    cur = await adb.execute("SELECT status, attempt, error, http_status, request_id, id FROM dispatch.runs")
    row = await cur.fetchone()
    assert row is not None
    return tuple(row)


async def attempts_audited(adb: psycopg.AsyncConnection[Any], run_id: int) -> tuple[str, list[Any]]:
    cur = await adb.execute("SELECT action, metadata->'attempts' FROM dispatch.audit_log"
                            " WHERE metadata->>'runId' = %s", (str(run_id),))
    rows = await cur.fetchall()
    assert len(rows) == 1, rows  # one audit row per finished run, whatever the attempts
    return rows[0][0], [(a["attempt"], a["status"], a.get("httpStatus")) for a in rows[0][1] or []]


async def test_two_failures_then_success(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener
) -> None:
    add(db, "flaky", max_attempts=3, retry_backoff="1 second", retry_backoff_max="2 seconds")
    sink.handlers["flaky"] = failing(2, lambda: web.json_response({"code": "unavailable"}, status=503))
    await start_listener()
    mark_all_due(db)

    status, attempt, error, http_status, request_id, run_id = await finished(adb)
    assert (status, attempt, error, http_status) == ("ok", 3, None, 200)
    assert [c.headers["X-Request-Id"] for c in sink.calls] == [request_id] * 3
    assert [c.json["invoker"]["attempt"] for c in sink.calls] == [1, 2, 3]
    gaps = [b.arrived_wall - a.arrived_wall for a, b in zip(sink.calls, sink.calls[1:], strict=False)]
    assert 0 <= gaps[0] <= 1 + SLACK_S  # full jitter on 1 s
    assert 0 <= gaps[1] <= 2 + SLACK_S  # full jitter on 2 s (1 s x 2, the cap)
    assert await attempts_audited(adb, run_id) == (
        "schedule.run.ok", [(1, "error", 503), (2, "error", 503), (3, "ok", 200)])
    # trace context: one trace (the request id), a span per attempt, as dispatch.run_trace has them
    sent = [c.headers["traceparent"] for c in sink.calls]
    cur = await adb.execute("SELECT traceparent FROM dispatch.run_trace(%s) ORDER BY attempt", (run_id,))
    assert sent == [tp for (tp,) in await cur.fetchall()]
    assert {tp[3:35] for tp in sent} == {request_id.removeprefix("sched_").replace("-", "")}
    assert len({tp[36:52] for tp in sent}) == 3


async def test_429_with_retry_after_is_retried_when_the_function_asked(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener
) -> None:
    add(db, "limited", max_attempts=2, retry_backoff="1 second", retry_backoff_max="1 minute")
    sink.handlers["limited"] = failing(1, lambda: web.Response(status=429, headers={"Retry-After": "2"}))
    await start_listener()
    mark_all_due(db)

    status, attempt, _, _, _, run_id = await finished(adb)
    assert (status, attempt) == ("ok", 2)
    gap = sink.calls[1].arrived_wall - sink.calls[0].arrived_wall
    assert 2 <= gap <= 2 + SLACK_S
    assert await attempts_audited(adb, run_id) == ("schedule.run.ok", [(1, "error", 429), (2, "ok", 200)])


async def test_a_hanging_function_times_out_by_the_schedules_timeout_and_is_retried(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener
) -> None:
    add(db, "hangs", max_attempts=2, timeout="1 second", retry_backoff="100 milliseconds",
        retry_backoff_max="100 milliseconds")
    release = asyncio.Event()

    async def hang(_request: web.Request, _call: Call) -> web.StreamResponse:
        await release.wait()
        return web.json_response({"ok": True})

    sink.handlers["hangs"] = hang
    listener = await start_listener(timeout_s=10.0, lease_s=40.0)
    mark_all_due(db)
    await until(lambda: scalar(adb, "SELECT status = 'running' FROM dispatch.runs"), what="claimed")
    lease = await scalar(adb, "SELECT lease_until - claimed_at FROM dispatch.runs")
    assert lease.total_seconds() == 40 + 1 - 10  # the listener's margin over the schedule's timeout

    try:
        status, attempt, error, _, _, run_id = await finished(adb)
    finally:
        release.set()
    assert (status, attempt, error) == ("error", 2, "timeout: no complete response within 1 s")
    assert len(sink.calls) == 2
    assert all(1 <= entry <= 1 + SLACK_S for entry in await durations(adb, run_id))
    assert (await attempts_audited(adb, run_id))[1] == [(1, "error", None), (2, "error", None)]
    assert listener.listener.ready.is_set()


async def durations(adb: psycopg.AsyncConnection[Any], run_id: int) -> list[float]:
    cur = await adb.execute(
        "SELECT metadata->'attempts' FROM dispatch.audit_log WHERE metadata->>'runId' = %s", (str(run_id),))
    row = await cur.fetchone()
    assert row is not None
    return [a["durationMs"] / 1000 for a in row[0]]


async def test_a_400_is_final(db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink,
                              start_listener: StartListener) -> None:
    add(db, "refuses", max_attempts=3, retry_backoff="1 second")
    sink.handlers["refuses"] = failing(5, lambda: web.json_response(
        {"code": "bad_request", "message": "no such report"}, status=400))
    await start_listener()
    mark_all_due(db)

    status, attempt, error, http_status, _, run_id = await finished(adb)
    assert (status, attempt, error, http_status) == ("error", 1, "bad_request: no such report", 400)
    assert len(sink.calls) == 1
    assert await attempts_audited(adb, run_id) == ("schedule.run.error", [])
