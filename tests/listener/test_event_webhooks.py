"""Event webhooks against a real receiver on loopback: a project's events_url gets each event
about it, signed like an invocation; a receiver that fails is retried with back-off and given up
after the last attempt; one that hangs holds up no run; an event sent while no listener runs
waits for one."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from aiohttp import web

from dispatcher.signing import SIGNATURE_HEADER, verify_signature

from .kit import Call, Running, Sink, add_schedules, mark_all_due, scalar, until

StartListener = Callable[..., Awaitable[Running]]
SECRET = b"test-signing-secret"
HOOK = "events-hook"  # the receiver is the sink, under this function name


def with_events_url(db: psycopg.Connection, sink: Sink) -> None:
    db.execute("INSERT INTO dispatch.projects (project_id, events_url) VALUES ('acme', %s)",
               (f"{sink.url}/projects/acme/functions/{HOOK}",))


def broken(db: psycopg.Connection, n: int = 1) -> None:
    """Schedules of a function that answers 400 (a final error), one attempt each."""
    add_schedules(db, n, function_name="broken")
    db.execute("UPDATE dispatch.schedules SET max_attempts = 1 WHERE function_name = 'broken'")


async def answer_400(request: web.Request, call: Call) -> web.StreamResponse:
    return web.json_response({"code": "bad_input", "message": "no"}, status=400)


def hook_calls(sink: Sink) -> list[Call]:
    return [c for c in sink.calls if c.function_name == HOOK]


async def test_a_failed_run_reaches_the_projects_events_url_signed(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener
) -> None:
    with_events_url(db, sink)
    broken(db)
    sink.handlers["broken"] = answer_400
    await start_listener(signing_secret=SECRET)
    mark_all_due(db)
    await until(lambda: len(hook_calls(sink)) == 1, within=15, what="the event at the receiver")
    (call,) = hook_calls(sink)
    event = call.json
    run_id = await scalar(adb, "SELECT id FROM dispatch.runs")
    assert (event["event"], event["runId"], event["status"], event["projectId"]) == (
        "run.failed", run_id, "error", "acme")
    assert event["error"].startswith("bad_input: no")
    assert verify_signature(SECRET, call.body, call.headers.get(SIGNATURE_HEADER))
    await until(lambda: scalar(adb, "SELECT delivered_at IS NOT NULL FROM dispatch.event_deliveries"),
                within=5, what="the delivery recorded")


async def test_a_failing_receiver_is_retried_then_given_up(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener
) -> None:
    db.execute("UPDATE dispatch.settings SET event_retry_backoff = '50 milliseconds', event_max_attempts = 3")
    with_events_url(db, sink)
    broken(db)
    sink.handlers["broken"] = answer_400

    async def down(request: web.Request, call: Call) -> web.StreamResponse:
        return web.Response(status=503, text="receiver down")

    sink.handlers[HOOK] = down
    running = await start_listener()
    mark_all_due(db)
    await until(lambda: scalar(adb, "SELECT gave_up_at IS NOT NULL FROM dispatch.event_deliveries"),
                within=20, what="the delivery given up")
    row = await (await adb.execute("SELECT attempts, last_error, delivered_at FROM dispatch.event_deliveries")
                 ).fetchone()
    assert row == (3, "HTTP 503: receiver down", None)
    assert len(hook_calls(sink)) == 3
    assert running.listener.metrics.event_deliveries.labels("failed")._value.get() == 3


async def test_a_hanging_receiver_holds_up_no_run(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener
) -> None:
    with_events_url(db, sink)
    broken(db, 4)
    sink.handlers["broken"] = answer_400
    released = asyncio.Event()

    async def hang(request: web.Request, call: Call) -> web.StreamResponse:
        await released.wait()
        return web.json_response({})

    sink.handlers[HOOK] = hang
    await start_listener()
    mark_all_due(db)
    await until(lambda: len(hook_calls(sink)) == 4, within=15, what="four events held by the receiver")
    # while the receiver holds every delivery, other runs are dispatched and recorded
    add_schedules(db, 50, function_name="fine")
    mark_all_due(db)
    await until(lambda: scalar(adb, "SELECT count(*) = 50 FROM dispatch.runs WHERE status = 'ok'"),
                within=15, what="50 runs dispatched while the receiver hangs")
    assert await scalar(adb, "SELECT count(*) FROM dispatch.event_deliveries WHERE delivered_at IS NULL") == 4
    released.set()
    await until(lambda: scalar(adb, "SELECT count(*) = 4 FROM dispatch.event_deliveries"
                                    " WHERE delivered_at IS NOT NULL"), within=15, what="the deliveries made")


async def test_an_event_sent_while_no_listener_runs_waits_for_one(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener
) -> None:
    with_events_url(db, sink)
    broken(db)
    mark_all_due(db)
    # a run that fails with no listener up: its lease runs out on its last attempt (lost)
    db.execute("SELECT * FROM dispatch.claim_runs('gone', 1, '1 millisecond')")
    await until(lambda: scalar(adb, "SELECT lease_until < now() FROM dispatch.runs"), within=5,
                what="the lease over")
    db.execute("SELECT dispatch.tick()")
    assert await scalar(adb, "SELECT status FROM dispatch.runs") == "lost"
    assert hook_calls(sink) == []
    await start_listener()
    await until(lambda: len(hook_calls(sink)) == 1, within=40, what="the event delivered by the new listener")
    assert hook_calls(sink)[0].json["status"] == "lost"
