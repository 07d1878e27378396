"""Operator functions in SQL (DESIGN.md, "Operator functions"): dispatch.run_now. Its end-to-end
side (a real listener reaching a loopback function within a second) is in
tests/listener/test_operator.py; pause and resume are in tests/test_runs.py and tests/test_races.py."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors

from .runs_kit import YEARLY, add_schedule, claim, complete, make_due, scalar


def run_now(db: psycopg.Connection, sid: str) -> int:
    return int(scalar(db, "SELECT dispatch.run_now(%s)", (sid,)))


def test_run_now_marks_a_manual_run_due_now_and_leaves_the_slots_alone(
    db: psycopg.Connection, connect: Callable[..., psycopg.Connection]
) -> None:
    sid = add_schedule(db, "0 0 1 1 *")
    slot_before = db.execute("SELECT next_run_at, last_slot FROM dispatch.schedules").fetchone()
    listener = connect()
    listener.execute("LISTEN dispatch")

    run_id = run_now(db, sid)

    kind, status, late, request_id = db.execute(
        "SELECT kind, status, clock_timestamp() - scheduled_for, request_id FROM dispatch.runs WHERE id = %s",
        (run_id,)).fetchone()  # type: ignore[misc]
    assert (kind, status) == ("manual", "pending") and timedelta(0) <= late < timedelta(seconds=5)
    assert [n.payload for n in listener.notifies(timeout=2, stop_after=1)] == ['{"marked" : 1}']
    actor, metadata = db.execute(
        "SELECT actor_id, metadata FROM dispatch.audit_log WHERE action = 'schedule.run_now'").fetchone()  # type: ignore[misc]
    assert (actor, metadata["runId"], metadata["requestId"], metadata["scheduleId"]) == (
        scalar(db, "SELECT session_user"), run_id, request_id, sid)

    # claimed and finished like any run: one audit row, last_* updated, the slots untouched
    [run] = claim(db, "w")
    assert run[0] == run_id
    complete(db, run)
    assert db.execute("SELECT next_run_at, last_slot FROM dispatch.schedules").fetchone() == slot_before
    assert db.execute("SELECT last_status FROM dispatch.schedules").fetchone() == ("ok",)
    assert scalar(db, "SELECT count(*) FROM dispatch.audit_log WHERE action = 'schedule.run.ok'"
                      " AND metadata->>'runId' = %s", (str(run_id),)) == 1

    # each call is a run of its own, with its own request id
    second = run_now(db, sid)
    assert second != run_id
    assert scalar(db, "SELECT count(DISTINCT request_id) FROM dispatch.runs") == 2


def test_a_manual_run_fires_at_the_instant_it_is_due(db: psycopg.Connection) -> None:
    # Its fire_at is its scheduled_for, to the microsecond: a later fire_at reads as jitter to
    # the function (invoker.fireAt) and to the buffer_one release.
    sid = add_schedule(db, "0 0 1 1 *", overlap="allow")
    for _ in range(50):
        run_now(db, sid)
    assert scalar(db, "SELECT count(*) FILTER (WHERE fire_at <> scheduled_for) FROM dispatch.runs") == 0


def test_the_slot_that_came_due_behind_a_manual_run_is_marked_when_it_ends(db: psycopg.Connection) -> None:
    sid = add_schedule(db, YEARLY)  # no later slot comes due if the test crosses a minute
    run_id = run_now(db, sid)
    [run] = claim(db, "w")
    make_due(db, "1 second")  # the schedule's own slot comes due while the manual run is open
    db.execute("SELECT dispatch.tick()")
    assert scalar(db, "SELECT count(*) FROM dispatch.runs") == 1  # overlap skip: it waits
    slot = scalar(db, "SELECT next_run_at FROM dispatch.schedules")

    complete(db, run)

    # marked by the completion itself, not a minute later by the next tick
    assert db.execute("SELECT kind, status, scheduled_for FROM dispatch.runs WHERE id <> %s",
                      (run_id,)).fetchall() == [("scheduled", "pending", slot)]
    assert scalar(db, "SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (sid,)) == slot


def test_run_now_refuses_what_it_cannot_do(db: psycopg.Connection) -> None:
    with pytest.raises(errors.NoDataFound, match=r"cannot run now: schedule .* does not exist"):
        run_now(db, str(uuid.uuid4()))

    busy = add_schedule(db, "* * * * *")
    first = run_now(db, busy)
    with pytest.raises(errors.ObjectNotInPrerequisiteState,
                       match=f"has run {first} open \\(pending, .*\\) and its overlap is skip"):
        run_now(db, busy)
    buffered = add_schedule(db, "* * * * *", overlap="buffer_one")
    run_now(db, buffered)
    waiting = run_now(db, buffered)  # buffer_one: it waits behind the open run
    assert scalar(db, "SELECT not_before = 'infinity' FROM dispatch.runs WHERE id = %s", (waiting,))
    with pytest.raises(errors.ObjectNotInPrerequisiteState, match="a run waiting behind it"):
        run_now(db, buffered)

    paused = add_schedule(db)
    db.execute("SELECT dispatch.pause(%s, 'maintenance')", (paused,))
    with pytest.raises(errors.ObjectNotInPrerequisiteState, match="is paused"):
        run_now(db, paused)
    disabled = add_schedule(db, enabled=False)
    with pytest.raises(errors.ObjectNotInPrerequisiteState, match="is disabled"):
        run_now(db, disabled)
    deleted = add_schedule(db)
    db.execute("DELETE FROM dispatch.schedules WHERE id = %s", (deleted,))
    with pytest.raises(errors.ObjectNotInPrerequisiteState, match=r"cannot run now: .* was deleted"):
        run_now(db, deleted)
    # nothing refused left a run or an audit row behind
    assert scalar(db, "SELECT count(*) FROM dispatch.runs WHERE kind = 'manual'") == 3
    assert scalar(db, "SELECT count(*) FROM dispatch.audit_log WHERE action = 'schedule.run_now'") == 3


def test_run_now_is_for_administrators(db: psycopg.Connection) -> None:
    sid = add_schedule(db, overlap="allow")
    for role, allowed in (("dispatch_admin", True), ("dispatch_listener", False), ("dispatch_reader", False)):
        db.execute(f"DROP ROLE IF EXISTS pgdispatch_op_{role}")
        db.execute(f"CREATE ROLE pgdispatch_op_{role} LOGIN IN ROLE {role}")
        params = {**db.info.get_parameters(), "user": f"pgdispatch_op_{role}"}
        conn = psycopg.connect(**params, autocommit=True)
        try:
            if allowed:
                run_id = run_now(conn, sid)
                assert scalar(db, "SELECT actor_id FROM dispatch.audit_log WHERE metadata->>'runId' = %s",
                              (str(run_id),)) == f"pgdispatch_op_{role}"
            else:
                with pytest.raises(errors.InsufficientPrivilege):
                    run_now(conn, sid)
        finally:
            conn.close()
            db.execute(f"DROP ROLE pgdispatch_op_{role}")


# -- backfill ---------------------------------------------------------------------------------

def backfill(db: psycopg.Connection, sid: str, start: Any, end: Any) -> int:
    return int(scalar(db, "SELECT dispatch.backfill(%s, %s, %s)", (sid, start, end)))


def claimed_slots(db: psycopg.Connection) -> list[tuple[str, Any]]:
    """Claim whatever is claimable and complete it ok; (kind, slot) of each, in claim order."""
    got = []
    for run in claim(db, "w", 100):
        got.append((scalar(db, "SELECT kind FROM dispatch.runs WHERE id = %s", (run[0],)), run[6]))
        complete(db, run)
    return got


def test_backfill_runs_each_missing_slot_once_oldest_first_one_at_a_time(db: psycopg.Connection) -> None:
    sid = add_schedule(db, "*/10 * * * *")
    end = scalar(db, "SELECT date_bin('10 minutes', now() - interval '10 minutes', timestamptz '2000-01-01')")
    start = end - timedelta(hours=3)
    # one slot in the range already ran: it is not repeated
    db.execute("INSERT INTO dispatch.runs (schedule_id, project_id, scheduled_for, status, finished_at)"
               " SELECT id, project_id, %s, 'ok', now() FROM dispatch.schedules WHERE id = %s",
               (start + timedelta(minutes=30), sid))

    assert backfill(db, sid, start, end) == 17
    expected = [start + timedelta(minutes=10 * k) for k in range(18) if k != 3]
    order = []
    while batch := claimed_slots(db):
        assert len(batch) == 1  # one at a time, however many a listener asks for
        order += [slot for _, slot in batch]
    assert order == expected  # oldest first, each once
    assert backfill(db, sid, start, end) == 0  # a second identical call marks nothing
    [(metadata,)] = db.execute("SELECT metadata FROM dispatch.audit_log"
                               " WHERE action = 'schedule.backfill' ORDER BY id LIMIT 1").fetchall()
    assert (metadata["slots"], metadata["marked"]) == (18, 17)
    # every backfill run finished with its audit row; the schedule's own slots did not move
    assert scalar(db, "SELECT count(*) FROM dispatch.audit_log WHERE action = 'schedule.run.ok'") == 17
    assert scalar(db, "SELECT next_run_at > now() AND last_slot IS NULL FROM dispatch.schedules")


def test_the_schedules_own_slot_waits_for_one_backfill_run_at_most(db: psycopg.Connection) -> None:
    sid = add_schedule(db, "* * * * *", misfire_grace="1 hour")
    end = scalar(db, "SELECT date_trunc('minute', now()) - interval '10 minutes'")
    assert backfill(db, sid, end - timedelta(minutes=5), end) == 5
    [first] = claim(db, "w", 10)
    make_due(db, "1 second")  # its own slot comes due while the first backfill run is out
    db.execute("SELECT dispatch.tick()")
    complete(db, first)
    # the own slot goes next, before the four backfill runs left; then they resume
    kinds = [kind for kind, _ in claimed_slots(db)]
    assert kinds == ["scheduled"]
    assert [kind for kind, _ in claimed_slots(db)] == ["backfill"]
    # grace and the next-slot rule are for the schedule's own slots: backfill runs are old by
    # definition, and retried like any run
    [retried] = claim(db, "w", 10)
    complete(db, retried, status="error", error="HTTP 503", retryable=True)
    assert scalar(db, "SELECT status FROM dispatch.runs WHERE id = %s", (retried[0],)) == "pending"


def test_backfill_refuses_what_it_cannot_do(db: psycopg.Connection) -> None:
    now = scalar(db, "SELECT now()")
    with pytest.raises(errors.NoDataFound, match=r"cannot backfill: schedule .* does not exist"):
        backfill(db, str(uuid.uuid4()), now - timedelta(hours=1), now)
    sid = add_schedule(db)
    with pytest.raises(errors.InvalidParameterValue, match=r"from_ts \(.*\) must be before to_ts"):
        backfill(db, sid, now, now - timedelta(hours=1))
    db.execute("SELECT dispatch.pause(%s)", (sid,))
    with pytest.raises(errors.ObjectNotInPrerequisiteState, match="is paused"):
        backfill(db, sid, now - timedelta(hours=1), now)
    db.execute("DELETE FROM dispatch.schedules WHERE id = %s", (sid,))
    with pytest.raises(errors.ObjectNotInPrerequisiteState, match="was deleted"):
        backfill(db, sid, now - timedelta(hours=1), now)
    # the future is the schedule's own: nothing after now or its next slot
    live = add_schedule(db)
    assert backfill(db, live, now + timedelta(minutes=5), now + timedelta(hours=1)) == 0
    assert scalar(db, "SELECT count(*) FROM dispatch.runs") == 0
