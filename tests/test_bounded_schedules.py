"""One-shot and bounded schedules in SQL: run_at (one slot, then the schedule ends), starts_at,
ends_at and max_runs (slots only within them); a schedule past its last slot ends, says why
(ended_at, ended_reason, dispatch.schedule_status, dispatch.explain, a schedule.ended audit row)
and keeps its history; an edit that leaves it slots to come brings it back. The run policies
apply to the slots as to any others, and every slot is a run or lies in a recorded gap
(invariant 8). The slots themselves against the cron oracle: tests/test_cron_oracle.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors

from .runs_kit import add_schedule, claim, complete, run_due, scalar, slots_run

MINUTE = timedelta(minutes=1)


def add(db: psycopg.Connection, **columns: Any) -> str:
    names = ["project_id", "function_name", *columns]
    row = db.execute(
        f"INSERT INTO dispatch.schedules ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))})"
        " RETURNING id", ["proj_1", "fn", *columns.values()]).fetchone()
    assert row is not None
    return str(row[0])


def state(db: psycopg.Connection, sid: str) -> dict[str, Any]:
    row = db.execute(
        "SELECT s.next_run_at, s.ended_at, s.ended_reason, st.live FROM dispatch.schedules s"
        " JOIN dispatch.schedule_status st USING (id) WHERE s.id = %s", (sid,)).fetchone()
    assert row is not None
    return dict(zip(("next_run_at", "ended_at", "ended_reason", "live"), row, strict=True))


def explained(db: psycopg.Connection, sid: str, section: str) -> list[tuple[str, str]]:
    return [(item, detail) for item, detail in db.execute(
        "SELECT item, detail FROM dispatch.explain(%s) WHERE section = %s", (sid, section))]


def gap_slots(db: psycopg.Connection, sid: str) -> int:
    return int(scalar(db, "SELECT coalesce(sum((metadata->>'count')::int), 0) FROM dispatch.audit_log WHERE"
                          " action = 'schedule.slots.skipped' AND metadata->>'scheduleId' = %s", (sid,)))


def test_a_one_shot_fires_once_then_ends_and_keeps_its_history(db: psycopg.Connection) -> None:
    at = scalar(db, "SELECT date_trunc('second', now()) + interval '3 hours 17 seconds'")
    sid = add(db, run_at=at, timezone="Europe/Berlin")
    assert state(db, sid) == {"next_run_at": at, "ended_at": None, "ended_reason": None, "live": True}
    assert [i for i, _ in explained(db, sid, "next")] == ["slot", "end"]

    assert run_due(db, at - timedelta(seconds=1)) == []  # not before its instant
    (run,) = run_due(db, at)
    assert run[6] == at
    ended = state(db, sid)
    assert ended["next_run_at"] is None and ended["ended_at"] is not None and ended["live"] is False
    assert ended["ended_reason"].startswith("a one-shot: its slot (run_at ")
    assert run_due(db, at + timedelta(days=400)) == []  # nothing after it, however far the clock goes
    assert slots_run(db, sid) == [at] and gap_slots(db, sid) == 0
    (row,) = db.execute("SELECT actor_id, metadata FROM dispatch.audit_log WHERE action = 'schedule.ended'"
                        " AND metadata->>'scheduleId' = %s", (sid,)).fetchall()
    assert row[0] is None and row[1]["reason"] == ended["ended_reason"]
    (verdict,) = explained(db, sid, "state")
    assert verdict[0] == "ended" and ended["ended_reason"] in verdict[1]
    assert [i for i, _ in explained(db, sid, "next")] == ["end"]
    assert [i for i, _ in explained(db, sid, "run")] == ["ok"]  # its history stays
    # an ended schedule stays a row a DBA finds, with its runs and audit trail
    assert scalar(db, "SELECT count(*) FROM dispatch.schedule_status WHERE ended_at IS NOT NULL") == 1


def test_a_one_shot_at_now_fires_at_once(db: psycopg.Connection) -> None:
    with db.transaction():
        now = scalar(db, "SELECT now()")
        sid = add(db, run_at=now)
    assert state(db, sid)["next_run_at"] == now
    assert len(run_due(db, now + timedelta(seconds=1))) == 1
    assert state(db, sid)["ended_at"] is not None


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"run_at": "2020-01-01 00:00+00"}, r"run_at 2020-01-01 00:00:00\+00 is in the past"),
        ({"run_at": "infinity"}, "run_at must be an instant, not infinity"),
        ({"run_at": "2099-01-01", "cron_expression": "* * * * *"},
         "cron_expression and run_at exclude each other: set one of them"),
        ({"run_at": "2099-01-01", "every": "1 hour"}, "every and run_at exclude each other"),
        ({"run_at": "2099-01-01", "max_runs": 2},
         r"starts_at, ends_at and max_runs bound a repeating schedule, not a one-shot \(run_at\)"),
        ({"run_at": "2099-01-01", "anchor": "2099-01-01"},
         r"anchor applies to an interval schedule \(every\), not to a one-shot \(run_at\)"),
        ({"cron_expression": "* * * * *", "ends_at": "2099-01-01", "starts_at": "2099-02-01"},
         r"ends_at \(2099-01-01 00:00:00\+00\) must not be before starts_at \(2099-02-01 00:00:00\+00\)"),
        ({"cron_expression": "* * * * *", "ends_at": "infinity"}, "ends_at must be an instant, not infinity"),
        ({"cron_expression": "* * * * *", "starts_at": "-infinity"}, "starts_at must be an instant"),
        ({"cron_expression": "* * * * *", "max_runs": 0}, "max_runs must be between 1 and 10000, not 0"),
        ({"every": "1 minute", "max_runs": 10001}, "max_runs must be between 1 and 10000, not 10001"),
        ({"cron_expression": "* * * * *", "ends_at": "2020-01-01"},
         r"the schedule has no slot after now: its slots up to ends_at 2020-01-01 00:00:00\+00 are past"),
        ({"cron_expression": "0 0 1 1 *", "starts_at": "2020-01-01", "max_runs": 3},
         r"the schedule has no slot after now: its 3 slots from 2020-01-01 00:00:00\+00"
         r" \(max_runs, starts_at\) are past"),
    ],
)
def test_bad_bounds_are_refused_naming_the_field(
    db: psycopg.Connection, columns: dict[str, Any], message: str
) -> None:
    db.execute("SET TIME ZONE 'UTC'")
    with pytest.raises(errors.InvalidParameterValue, match=message):
        add(db, **columns)
    assert scalar(db, "SELECT count(*) FROM dispatch.schedules") == 0


def test_slots_before_starts_at_do_not_run_and_one_on_it_does(db: psycopg.Connection) -> None:
    start = scalar(db, "SELECT date_trunc('hour', now()) + interval '2 days'")
    sid = add_schedule(db, "*/15 * * * *", starts_at=start)
    assert state(db, sid)["next_run_at"] == start
    sid2 = add_schedule(db, "*/15 * * * *", starts_at=start + timedelta(seconds=1))
    assert state(db, sid2)["next_run_at"] == start + timedelta(minutes=15)
    every = add(db, every="1 hour", anchor=start - timedelta(minutes=30), starts_at=start)
    assert state(db, every)["next_run_at"] == start + timedelta(minutes=30)


@pytest.mark.parametrize("overlap", ["skip", "allow"])
def test_the_slots_up_to_ends_at_run_then_the_schedule_ends(db: psycopg.Connection, overlap: str) -> None:
    first = scalar(db, "SELECT date_trunc('minute', now()) + interval '1 minute'")
    sid = add_schedule(db, "* * * * *", ends_at=first + 2 * MINUTE, overlap=overlap)
    for k in range(3):
        assert len(run_due(db, first + k * MINUTE)) == 1
    assert slots_run(db, sid) == [first, first + MINUTE, first + 2 * MINUTE]  # ends_at itself is a slot
    assert state(db, sid)["ended_reason"].startswith("its slots up to ends_at ")


def test_a_last_run_still_open_runs_after_its_schedule_ended(db: psycopg.Connection) -> None:
    """Under overlap allow the schedule moves on when a slot is marked: past the last one it
    ends there, and that slot's run is still claimed and recorded like any other."""
    first = scalar(db, "SELECT date_trunc('minute', now()) + interval '1 minute'")
    sid = add_schedule(db, "* * * * *", ends_at=first, overlap="allow")
    db.execute("SELECT dispatch.tick(%s)", (first,))
    assert state(db, sid)["ended_at"] is not None
    (verdict,) = explained(db, sid, "state")
    assert verdict[0] == "ended"
    (run,) = claim(db, "w")
    assert complete(db, run)[0] is True
    assert scalar(db, "SELECT status FROM dispatch.runs WHERE id = %s", (run[0],)) == "ok"


def test_max_runs_counts_slots_run_or_passed_over(db: psycopg.Connection) -> None:
    """max_runs bounds the slots, the first ones from starts_at (the time of the write when not
    given): a slot passed over (catch-up, overlap) counts as one, in its recorded gap."""
    sid = add(db, every="1 minute", max_runs=5)
    created, start, next_run_at = db.execute(
        "SELECT created_at, starts_at, next_run_at FROM dispatch.schedules").fetchone()  # type: ignore[misc]
    assert created < start < created + timedelta(seconds=5) and next_run_at == created + MINUTE
    run_due(db, next_run_at)
    # the listeners were away for ten minutes: catch-up latest runs the last slot, the others are a gap
    run_due(db, next_run_at + 10 * MINUTE)
    assert slots_run(db, sid) == [next_run_at, next_run_at + 4 * MINUTE]
    assert gap_slots(db, sid) == 3
    assert state(db, sid)["ended_reason"].startswith("its 5 slots from ")


def test_an_edit_that_leaves_slots_to_come_brings_an_ended_schedule_back(db: psycopg.Connection) -> None:
    first = scalar(db, "SELECT date_trunc('minute', now()) + interval '1 minute'")
    sid = add_schedule(db, "* * * * *", ends_at=first)
    run_due(db, first)
    assert state(db, sid)["ended_at"] is not None
    # an edit of something else leaves it ended
    db.execute("UPDATE dispatch.schedules SET args = '{\"a\": 1}' WHERE id = %s", (sid,))
    assert state(db, sid)["ended_at"] is not None
    db.execute("UPDATE dispatch.schedules SET ends_at = ends_at + interval '1 day' WHERE id = %s", (sid,))
    back = state(db, sid)
    assert back["ended_at"] is None and back["ended_reason"] is None and back["next_run_at"] > first
    # a DBA ends it by hand the same way: its end at now
    db.execute("UPDATE dispatch.schedules SET ends_at = now() WHERE id = %s", (sid,))
    gone = state(db, sid)
    assert gone["ended_at"] is not None and gone["next_run_at"] is None
    actors = [a for (a,) in db.execute(
        "SELECT actor_id FROM dispatch.audit_log WHERE action = 'schedule.ended' ORDER BY id")]
    assert actors == [None, db.info.user]


def test_a_pause_across_the_end_records_its_slots_and_resumes_ended(db: psycopg.Connection) -> None:
    with db.transaction():
        created = scalar(db, "SELECT now()")
        sid = add(db, every="1 second", ends_at=created + timedelta(seconds=2))
        db.execute("SELECT dispatch.pause(%s, 'maintenance')", (sid,))
    # resumed after its end by the database's clock (nothing ticked meanwhile): no slot left, and
    # its two slots are the pause's gap
    while scalar(db, "SELECT clock_timestamp() <= %s", (created + timedelta(seconds=2),)):
        db.execute("SELECT pg_sleep(0.05)")
    db.execute("SELECT dispatch.resume(%s)", (sid,))
    s = state(db, sid)
    assert s["ended_at"] is not None and s["next_run_at"] is None and s["live"] is False
    assert slots_run(db, sid) == [] and gap_slots(db, sid) == 2


def test_backfill_keeps_within_the_bounds(db: psycopg.Connection) -> None:
    start = scalar(db, "SELECT date_trunc('hour', now()) - interval '3 hours'")
    sid = add_schedule(db, "0 * * * *", starts_at=start + timedelta(hours=1),
                       ends_at=start + timedelta(days=1))
    marked = scalar(db, "SELECT dispatch.backfill(%s, %s, %s)", (sid, start, start + timedelta(hours=3)))
    assert marked == 2  # start+1h and start+2h; start itself is before starts_at


def test_jitter_and_misfire_grace_apply_to_a_one_shot(db: psycopg.Connection) -> None:
    at = scalar(db, "SELECT date_trunc('minute', now()) + interval '10 minutes'")
    sid = add(db, run_at=at, jitter="20 minutes", misfire_grace="1 minute")
    offset = scalar(db, "SELECT dispatch.jitter_offset(%s, %s, '20 minutes')", (sid, at))
    # long after its instant (the listeners were away): missed by more than the grace, skipped, ended
    db.execute("SELECT dispatch.tick(%s)", (at + timedelta(hours=2),))
    claim(db, "w")
    status, error = db.execute(
        "SELECT status, error FROM dispatch.runs WHERE schedule_id = %s", (sid,)).fetchone()  # type: ignore[misc]
    assert status == "skipped" and error.startswith("missed by")
    assert state(db, sid)["ended_at"] is not None
    assert scalar(db, "SELECT fire_at FROM dispatch.runs WHERE schedule_id = %s", (sid,)) == at + offset


def test_pausing_an_ended_schedule_ends_its_pending_run(db: psycopg.Connection) -> None:
    first = scalar(db, "SELECT date_trunc('minute', now()) + interval '1 minute'")
    sid = add_schedule(db, "* * * * *", ends_at=first, overlap="allow")
    db.execute("SELECT dispatch.tick(%s)", (first,))
    assert state(db, sid)["ended_at"] is not None
    db.execute("SELECT dispatch.pause(%s)", (sid,))
    status, error = db.execute(
        "SELECT status, error FROM dispatch.runs WHERE schedule_id = %s", (sid,)).fetchone()  # type: ignore[misc]
    assert status == "skipped" and "paused" in error


def test_the_slots_a_buffered_run_passed_over_at_the_end_are_a_gap(db: psycopg.Connection) -> None:
    """buffer_one: the run that waited goes when the open one ends; the slots that came due
    meanwhile, up to the rule's last, are a gap (the schedule ends there)."""
    with db.transaction():
        created = scalar(db, "SELECT now()")
        sid = add(db, every="1 second", overlap="buffer_one", ends_at=created + timedelta(seconds=3))
    slots = [created + timedelta(seconds=k) for k in (1, 2, 3)]
    db.execute("SELECT dispatch.tick(%s)", (slots[0],))
    (run,) = claim(db, "w")
    db.execute("SELECT dispatch.tick(%s)", (slots[1],))  # the second waits behind the first
    while scalar(db, "SELECT clock_timestamp() <= %s", (slots[2],)):  # the last comes due meanwhile
        db.execute("SELECT pg_sleep(0.05)")
    assert complete(db, run)[0]
    assert slots_run(db, sid) == slots[:2] and gap_slots(db, sid) == 1
    assert state(db, sid)["ended_at"] is not None
