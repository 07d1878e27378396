"""Every slot accounted for (invariant 8, issue 20): a slot that no run stands for lies in a
recorded gap, one audit row schedule.slots.skipped per gap (first and last slot, how many, the
reason), never one per slot; listeners count them by reason (dispatch.skipped_slots_after)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from .runs_kit import add_schedule, claim, complete, make_due, scalar

MINUTE = timedelta(minutes=1)


def gaps(db: psycopg.Connection, sid: str) -> list[tuple[str, datetime, datetime, int]]:
    return [(m["reason"], datetime.fromisoformat(m["first"]), datetime.fromisoformat(m["last"]), m["count"])
            for (m,) in db.execute("SELECT metadata FROM dispatch.audit_log"
                                   " WHERE action = 'schedule.slots.skipped' AND metadata->>'scheduleId' = %s"
                                   " ORDER BY id", (sid,))]


def scheduled_slots(db: psycopg.Connection, sid: str) -> list[datetime]:
    return [slot for (slot,) in db.execute(
        "SELECT scheduled_for FROM dispatch.runs WHERE schedule_id = %s AND kind = 'scheduled' ORDER BY 1",
        (sid,))]


def assert_accounted_for(db: psycopg.Connection, sid: str, since: datetime) -> None:
    """Each minutely slot from `since` up to the schedule's next one is a run or in one gap."""
    next_run_at = scalar(db, "SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (sid,))
    covered: list[datetime] = list(scheduled_slots(db, sid))
    for _, first, last, count in gaps(db, sid):
        assert (last - first) / MINUTE + 1 == count
        covered += [first + k * MINUTE for k in range(count)]
    expected = [since + k * MINUTE for k in range(int((next_run_at - since) / MINUTE))]
    assert sorted(covered) == expected  # each slot once: in a run or in a gap, never both


@pytest.mark.parametrize("overlap", ["skip", "buffer_one", "allow"])
def test_the_slots_that_pass_while_a_run_is_open_are_one_gap(db: psycopg.Connection, overlap: str) -> None:
    sid = add_schedule(db, "* * * * *", overlap=overlap)
    make_due(db, "3 minutes")
    s0 = scalar(db, "SELECT next_run_at FROM dispatch.schedules")
    db.execute("SELECT dispatch.tick(%s)", (s0 + timedelta(seconds=1),))  # marked at S, on time
    [first] = claim(db, "w")
    db.execute("SELECT dispatch.tick()")  # now: S+1 .. S+3 are due
    more = claim(db, "w")
    for run in [first, *more]:
        complete(db, run)
    db.execute("SELECT dispatch.tick()")
    for run in claim(db, "w"):
        complete(db, run)
    recorded = gaps(db, sid)
    assert len(recorded) == 1
    reason, start, end, _ = recorded[0]
    # skip drops S+1 ..; buffer_one ran S+1 and drops the rest; allow ran the latest (catch-up)
    assert (reason, start) == {"skip": ("overlap", s0 + MINUTE), "buffer_one": ("overlap", s0 + 2 * MINUTE),
                               "allow": ("catch-up", s0 + MINUTE)}[overlap]
    assert end >= start
    assert_accounted_for(db, sid, s0)


def test_the_slots_passed_over_after_downtime_are_one_gap(db: psycopg.Connection) -> None:
    sid = add_schedule(db, "* * * * *")
    make_due(db, "5 minutes")
    s0 = scalar(db, "SELECT next_run_at FROM dispatch.schedules")
    db.execute("SELECT dispatch.tick()")
    [run] = claim(db, "w")
    assert gaps(db, sid) == [("catch-up", s0, run[6] - MINUTE, int((run[6] - s0) / MINUTE))]
    complete(db, run)
    assert_accounted_for(db, sid, s0)


@pytest.mark.parametrize(("stop", "restart", "reason"), [
    ("SELECT dispatch.pause(%s)", "SELECT dispatch.resume(%s)", "pause"),
    ("UPDATE dispatch.schedules SET enabled = false WHERE id = %s",
     "UPDATE dispatch.schedules SET enabled = true WHERE id = %s", "disabled"),
])
def test_the_slots_of_a_pause_are_one_gap_recorded_when_it_resumes(
    db: psycopg.Connection, stop: str, restart: str, reason: str
) -> None:
    sid = add_schedule(db, "* * * * *")
    stood_on = scalar(db, "SELECT next_run_at FROM dispatch.schedules")
    db.execute(stop, (sid,))
    assert scalar(db, "SELECT stopped_on FROM dispatch.schedules") == stood_on
    # the pause lasted ten minutes: as if the schedule had stopped ten minutes earlier
    db.execute("UPDATE dispatch.schedules SET stopped_on = stopped_on - interval '10 minutes'")
    assert gaps(db, sid) == []  # nothing known to be skipped until it goes on
    db.execute(restart, (sid,))
    [(why, first, _, count)] = gaps(db, sid)
    assert (why, first) == (reason, stood_on - 10 * MINUTE) and count >= 10
    assert_accounted_for(db, sid, first)
    assert scalar(db, "SELECT stopped_on FROM dispatch.schedules") is None
    db.execute(stop, (sid,))
    db.execute(restart, (sid,))  # at once: no slot passed, no gap
    assert len(gaps(db, sid)) == 1


def test_listeners_count_the_skipped_slots_by_reason(db: psycopg.Connection) -> None:
    start: Any = db.execute("SELECT * FROM dispatch.skipped_slots_after(NULL)").fetchall()
    assert {r[0]: r[1:3] for r in start} == {
        r: (0, 0) for r in ("overlap", "catch-up", "misfire", "pause", "disabled", "calendar")}
    last_id = start[0][3]
    sid = add_schedule(db, "* * * * *")
    make_due(db, "5 minutes")
    db.execute("SELECT dispatch.tick()")
    [(_, _, _, count)] = gaps(db, sid)
    counted = {r[0]: r[1:] for r in db.execute("SELECT * FROM dispatch.skipped_slots_after(%s)", (last_id,))}
    assert counted["catch-up"][:2] == (count, 1) and counted["overlap"][:2] == (0, 0)
    assert db.execute("SELECT sum(slots) FROM dispatch.skipped_slots_after(%s)",
                      (counted["catch-up"][2],)).fetchone() == (0,)  # counted once
