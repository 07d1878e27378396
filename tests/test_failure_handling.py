"""Failure handling a tenant sees, in SQL: a schedule with pause_after_failures pauses itself
after that many runs in a row end error or lost (audited, a reason naming the runs; a resume
starts the count again), and every run failure, self-pause and breaker transition is one JSON
object on the channel dispatch_events, read here by a real LISTEN session."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import errors

from tests.runs_kit import YEARLY, claim, complete, expire, make_due, scalar

Connect = Callable[..., psycopg.Connection]


def add(db: psycopg.Connection, **columns: Any) -> str:
    names = ["project_id", "function_name", "cron_expression", *columns]
    values = ["proj_1", "flaky", YEARLY, *columns.values()]
    return str(scalar(db, f"INSERT INTO dispatch.schedules ({', '.join(names)})"
                          f" VALUES ({', '.join(['%s'] * len(names))}) RETURNING id", values))


def one_run(db: psycopg.Connection, outcome: str, *, lost: bool = False) -> int:
    """Mark the schedule's next yearly slot (ahead of the clock), claim its run and end it: ok,
    error, or lost (a lease expired on the last attempt)."""
    db.execute("SELECT dispatch.tick((SELECT max(next_run_at) FROM dispatch.schedules))")
    (run,) = claim(db, "w", 1, lease="1 millisecond" if lost else "60 seconds")
    if lost:
        expire(db, run[0])
        db.execute("SELECT dispatch.tick()")
    else:
        assert complete(db, run, status=outcome, error=None if outcome == "ok" else "HTTP 500: boom",
                        http_status=200 if outcome == "ok" else 500)[0]
    return int(run[0])


def paused(db: psycopg.Connection, sid: str) -> tuple[Any, ...]:
    row = db.execute("SELECT paused_at IS NOT NULL, paused_by, paused_reason FROM dispatch.schedules"
                     " WHERE id = %s", (sid,)).fetchone()
    assert row is not None
    return tuple(row)


def events(listener: psycopg.Connection, n: int) -> list[dict[str, Any]]:
    got = [json.loads(note.payload) for note in listener.notifies(timeout=5, stop_after=n)]
    assert len(got) == n, got
    return got


def test_a_schedule_pauses_itself_after_its_failures_in_a_row(
    db: psycopg.Connection, connect: Connect
) -> None:
    listener = connect()
    listener.execute("LISTEN dispatch_events")
    sid = add(db, pause_after_failures=3, max_attempts=1)
    first = one_run(db, "error")
    assert one_run(db, "ok")  # an ok run starts the count again
    failed = [one_run(db, "error"), one_run(db, "error", lost=True)]
    assert paused(db, sid)[0] is False
    failed.append(one_run(db, "error"))
    is_paused, by, reason = paused(db, sid)
    assert is_paused and by == "pgdispatch"
    assert reason == (f"paused itself: its last 3 runs failed (runs {', '.join(map(str, failed))});"
                      " dispatch.resume() starts the count again")
    assert scalar(db, "SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (sid,)) is None
    actor, metadata = db.execute("SELECT actor_id, metadata FROM dispatch.audit_log"
                                 " WHERE action = 'schedule.pause'").fetchone()  # type: ignore[misc]
    assert actor is None and metadata["reason"] == reason
    (verdict,) = db.execute("SELECT item, detail FROM dispatch.explain(%s) WHERE section = 'state'", (sid,))
    assert verdict[0] == "paused" and "paused by pgdispatch" in verdict[1] and reason in verdict[1]

    # the events: one per failed run, then the pause
    got = events(listener, 5)
    assert [(e["event"], e.get("runId")) for e in got] == [
        ("run.failed", first), ("run.failed", failed[0]), ("run.failed", failed[1]),
        ("run.failed", failed[2]), ("schedule.paused", None)]
    assert got[2]["status"] == "lost" and got[1]["status"] == "error"
    # ids only: any role that connects may LISTEN (error texts and the rest go to the events_url)
    assert set(got[1]) == {"event", "at", "projectId", "runId", "scheduleId", "status", "attempt", "kind"}
    assert {k: v for k, v in got[4].items() if k != "at"} == {
        "event": "schedule.paused", "projectId": "proj_1", "scheduleId": sid, "pauseAfterFailures": 3}

    # resume starts the count again: the next failure alone does not pause it
    db.execute("SELECT dispatch.resume(%s)", (sid,))
    one_run(db, "error")
    assert paused(db, sid)[0] is False
    assert [e["event"] for e in events(listener, 1)] == ["run.failed"]


def test_ok_runs_send_nothing_and_a_schedule_without_the_policy_never_pauses(
    db: psycopg.Connection, connect: Connect
) -> None:
    listener = connect()
    listener.execute("LISTEN dispatch_events")
    sid = add(db, max_attempts=1)
    one_run(db, "ok")
    assert list(listener.notifies(timeout=0.5)) == []
    for _ in range(4):
        one_run(db, "error")
    assert paused(db, sid)[0] is False
    assert [e["event"] for e in events(listener, 4)] == ["run.failed"] * 4


def test_breaker_transitions_are_events(db: psycopg.Connection, connect: Connect) -> None:
    listener = connect()
    listener.execute("LISTEN dispatch_events")
    add(db, max_attempts=3)
    for _ in range(4):
        add(db, max_attempts=3)
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    for run in claim(db, "w", 100):
        complete(db, run, status="error", error="HTTP 503: down", http_status=503, retryable=True)
    opened = events(listener, 1)  # retried, not failed: no run.failed
    assert opened[0]["event"] == "breaker.opened" and opened[0]["failures"] == 5
    db.execute("SELECT dispatch.reset_breaker('proj_1', 'flaky')")
    (closed,) = events(listener, 1)
    assert (closed["event"], closed["projectId"]) == ("breaker.closed", "proj_1")


@pytest.mark.parametrize("value", [0, 1001])
def test_pause_after_failures_out_of_range_is_refused_naming_it(db: psycopg.Connection, value: int) -> None:
    with pytest.raises(errors.InvalidParameterValue, match=f"pause_after_failures must be between 1 and 1000,"
                                                           f" not {value}"):
        add(db, pause_after_failures=value)


def test_the_reason_of_a_long_streak_names_its_first_and_last_runs(db: psycopg.Connection) -> None:
    sid = add(db, pause_after_failures=8, max_attempts=1)
    failed = [one_run(db, "error") for _ in range(8)]
    reason = paused(db, sid)[2]
    assert f"(runs {failed[0]}, {failed[1]}, {failed[2]}, …, {failed[5]}, {failed[6]}, {failed[7]})" in reason
