"""Every task of a listener is supervised: one that fails (a fault injected into it here) is
logged with its traceback and its name, makes the listener unhealthy (the systemd watchdog stops
pinging) and stops it; the real process then exits 1, for systemd to restart it."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from dispatcher.listener import Listener
from dispatcher.runs import Outcome, Run
from dispatcher.supervisor import TaskFailed

from .kit import ListenerProcess, Running, Sink, add_schedules, mark_all_due, until

StartListener = Callable[..., Awaitable[Running]]


class Injected(RuntimeError):
    """The fault a test put into a task."""


def boom(*_: Any, **__: Any) -> Any:
    raise Injected("injected fault")


async def aboom(*_: Any, **__: Any) -> Any:
    raise Injected("injected fault")


def a_run() -> Run:
    return Run(run_id=0, schedule_id="s", project_id="p", function_name="f", args_json="{}",
               request_id="sched_x", scheduled_for=datetime.now(UTC), attempt=1,
               lease_until=datetime.now(UTC), lease_deadline=0.0)


def inject_clock(listener: Listener, db: psycopg.Connection) -> None:
    listener._db.next_wake = aboom  # type: ignore[method-assign]
    listener._clock.replan()


def inject_listen(listener: Listener, db: psycopg.Connection) -> None:
    listener._notifications._on_notify = boom
    db.execute("NOTIFY dispatch")


def inject_claim(listener: Listener, db: psycopg.Connection) -> None:
    listener._db.claim = aboom  # type: ignore[method-assign]
    mark_all_due(db)


def inject_worker(listener: Listener, db: psycopg.Connection) -> None:
    listener._completer.submit = boom  # type: ignore[method-assign]
    mark_all_due(db)


def inject_completion(listener: Listener, db: psycopg.Connection) -> None:
    listener._completer._report = boom  # type: ignore[method-assign]
    mark_all_due(db)


def inject_completion_retry(listener: Listener, db: psycopg.Connection) -> None:
    listener._completer._write = aboom  # type: ignore[method-assign]
    listener._completer._keep(a_run(), Outcome(status="ok"), busy=True, reason="test")


def inject_release(listener: Listener, db: psycopg.Connection) -> None:
    assert listener._dispatcher is not None
    listener._dispatcher.release = aboom  # type: ignore[method-assign]
    listener._dispatcher._hand_back(a_run())


@pytest.mark.parametrize(("inject", "task"), [
    (inject_clock, "pgdispatch-clock"),
    (inject_listen, "pgdispatch-listen"),
    (inject_claim, "pgdispatch-claim"),
    (inject_worker, "pgdispatch-worker-"),
    (inject_completion, "pgdispatch-completion-writer"),
    (inject_completion_retry, "pgdispatch-completion-retry"),
    (inject_release, "pgdispatch-release"),
])
async def test_a_task_that_fails_stops_the_listener_and_is_named(
    db: psycopg.Connection, sink: Sink, start_listener: StartListener, caplog: Any,
    inject: Callable[[Listener, psycopg.Connection], None], task: str,
) -> None:
    caplog.set_level(logging.INFO)
    add_schedules(db, 1)
    running = await start_listener()
    assert running.listener.status().healthy
    inject(running.listener, db)

    with pytest.raises(TaskFailed) as failed:
        await asyncio.wait_for(running.task, 15)
    assert failed.value.task.startswith(task)
    assert isinstance(failed.value.error, Injected)
    status = running.listener.status()
    assert (status.state, status.healthy, status.failed_task) == ("failed", False, failed.value.task)
    logged = [r for r in caplog.records if getattr(r, "event", None) == "task_failed"]
    assert logged and getattr(logged[0], "task", "").startswith(task)
    assert logged[0].exc_info and logged[0].exc_info[0] is Injected  # with its traceback
    assert "listener_stopped" not in [getattr(r, "event", None) for r in caplog.records]


async def test_the_real_process_exits_1_naming_the_task_that_failed(
    db: psycopg.Connection, dsn: str, sink: Sink,
) -> None:
    """A real fault: the listener's role loses the right to claim while it runs."""
    db.execute("DROP ROLE IF EXISTS pgdispatch_supervised")
    db.execute("CREATE ROLE pgdispatch_supervised LOGIN IN ROLE dispatch_listener")
    try:
        add_schedules(db, 1)
        url = psycopg.conninfo.make_conninfo(dsn, user="pgdispatch_supervised")
        proc = await ListenerProcess.start("--database-url", url, "--invoke-url", sink.template,
                                           "--worker-id", "supervised", "--sweep-interval", "60")
        try:
            await proc.wait_event("listening")
            db.execute("REVOKE EXECUTE ON FUNCTION dispatch.claim_runs(text, integer, interval, interval)"
                       " FROM dispatch_listener")
            mark_all_due(db)
            assert await proc.wait(within=30) == 1
        finally:
            await proc.kill()
        failed = proc.events("task_failed")
        assert failed and failed[0]["task"] == "pgdispatch-claim"
        assert "InsufficientPrivilege" in failed[0]["exception"]
        assert proc.events("listener_failed")[0]["task"] == "pgdispatch-claim"
    finally:
        db.execute("DROP OWNED BY pgdispatch_supervised")
        db.execute("DROP ROLE pgdispatch_supervised")


async def test_a_healthy_listener_still_stops_with_0(db: psycopg.Connection, dsn: str, sink: Sink) -> None:
    proc = await ListenerProcess.start("--database-url", dsn, "--invoke-url", sink.template,
                                       "--worker-id", "calm")
    try:
        await proc.wait_event("listening")
        await until(lambda: proc.events("listening"), what="listening")
        proc.signal(signal.SIGTERM)
        assert await proc.wait() == 0
    finally:
        await proc.kill()
    assert not proc.events("task_failed")


async def acancelled(*_: Any, **__: Any) -> Any:
    """A CancelledError that leaked from somewhere: nobody asked the task to stop."""
    raise asyncio.CancelledError


def inject_claim_cancelled(listener: Listener, db: psycopg.Connection) -> None:
    listener._db.claim = acancelled  # type: ignore[method-assign]
    mark_all_due(db)


def inject_workers_cancelled(listener: Listener, db: psycopg.Connection) -> None:
    assert listener._dispatcher is not None
    listener._dispatcher._invoker.invoke = acancelled  # type: ignore[method-assign]
    mark_all_due(db)


@pytest.mark.parametrize(("inject", "task"), [
    (inject_claim_cancelled, "pgdispatch-claim"),
    (inject_workers_cancelled, "pgdispatch-worker-"),
])
async def test_a_task_that_ends_cancelled_while_the_listener_runs_is_a_failure(
    db: psycopg.Connection, sink: Sink, start_listener: StartListener, caplog: Any,
    inject: Callable[[Listener, psycopg.Connection], None], task: str,
) -> None:
    """Issue 21 item 3 and issue 26: a leaked CancelledError once killed the claimer (or every
    worker) while status() said healthy and SIGTERM exited 0."""
    caplog.set_level(logging.INFO)
    add_schedules(db, 2)
    running = await start_listener(concurrency=2)
    inject(running.listener, db)

    with pytest.raises(TaskFailed) as failed:
        await asyncio.wait_for(running.task, 15)
    assert failed.value.task.startswith(task)
    status = running.listener.status()
    assert (status.state, status.healthy, status.failed_task) == ("failed", False, failed.value.task)
    logged = [r for r in caplog.records if getattr(r, "event", None) == "task_failed"]
    assert logged and getattr(logged[0], "task", "").startswith(task)
    # However a worker ended, its share of the budget came back.
    budget = running.listener._budget
    assert (budget.in_flight, budget.outstanding) == (0, 0)
