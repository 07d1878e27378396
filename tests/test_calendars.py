"""Calendars in SQL: a schedule's slots inside a period of its calendar do not run; the tick
passes over them to the first slot after the period and records them as one gap (reason
calendar), so every slot is a run or lies in a recorded gap (invariant 8). Periods are wall-clock
time in the calendar's zone, their boundaries placed by the fixed-time DST rule; an edit of a
calendar applies to slots not passed over yet; explain names the calendar and the next slot that
runs. The periods themselves against a minute-by-minute reference: tests/test_cron_oracle.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors

from .explain_check import explain_agrees
from .runs_kit import claim, complete, run_due, scalar, slots_run
from .test_privileges import as_role

HOUR = timedelta(hours=1)


def next_friday() -> datetime:
    """Midnight UTC of the Friday of next week: far enough ahead that a schedule starting
    there has no slot before it."""
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today - timedelta(days=today.weekday()) + timedelta(days=11)


def calendar(db: psycopg.Connection, name: str, *periods: dict[str, Any], project: str | None = None,
             timezone: str = "UTC") -> int:
    cid = int(scalar(db, "INSERT INTO dispatch.calendars (project_id, name, timezone) VALUES (%s, %s, %s)"
                         " RETURNING id", (project, name, timezone)))
    for period in periods:
        exclude(db, cid, **period)
    return cid


def exclude(db: psycopg.Connection, cid: int, **columns: Any) -> int:
    names = ["calendar_id", *columns]
    return int(scalar(db, f"INSERT INTO dispatch.calendar_exclusions ({', '.join(names)})"
                          f" VALUES ({', '.join(['%s'] * len(names))}) RETURNING id",
                      [cid, *columns.values()]))


WEEKENDS = {"label": "weekend", "days": [6, 7]}


def add(db: psycopg.Connection, **columns: Any) -> str:
    columns.setdefault("cron_expression", "0 * * * *")
    names = ["project_id", "function_name", *columns]
    return str(scalar(db, f"INSERT INTO dispatch.schedules ({', '.join(names)})"
                          f" VALUES ({', '.join(['%s'] * len(names))}) RETURNING id",
                      ["proj_1", "fn", *columns.values()]))


def gaps(db: psycopg.Connection, sid: str) -> list[dict[str, Any]]:
    return [metadata for (metadata,) in db.execute(
        "SELECT metadata FROM dispatch.audit_log WHERE action = 'schedule.slots.skipped'"
        " AND metadata->>'scheduleId' = %s ORDER BY id", (sid,))]


def explained(db: psycopg.Connection, sid: str, section: str) -> list[tuple[str, datetime | None, str]]:
    return list(db.execute("SELECT item, at, detail FROM dispatch.explain(%s, %s) WHERE section = %s",
                           (sid, datetime(2000, 1, 1, tzinfo=UTC), section)))


def test_a_weekend_passes_as_one_calendar_gap_and_every_slot_is_accounted_for(db: psycopg.Connection) -> None:
    friday = next_friday()
    sid = add(db, calendar_id=calendar(db, "weekends", WEEKENDS), starts_at=friday)
    hour = friday
    while hour <= friday + timedelta(days=4):  # Friday to Tuesday, a listener's round each hour
        run_due(db, hour)
        hour += HOUR
    ran = slots_run(db, sid)
    assert all(slot.weekday() < 5 for slot in ran)
    assert len(ran) == 24 + 24 + 1  # Friday, Monday, Tuesday 00:00
    (gap,) = gaps(db, sid)
    assert (gap["reason"], gap["calendar"], gap["count"]) == ("calendar", "weekends", 48)
    assert datetime.fromisoformat(gap["first"]) == friday + timedelta(days=1)
    assert datetime.fromisoformat(gap["last"]) == friday + timedelta(days=2, hours=23)
    counted = {r[0]: r[1] for r in db.execute("SELECT reason, slots FROM dispatch.skipped_slots_after(0)")}
    assert counted["calendar"] == 48


def test_editing_a_calendar_applies_to_the_slots_not_passed_over_yet(db: psycopg.Connection) -> None:
    friday = next_friday()
    cid = calendar(db, "maintenance")
    sid = add(db, calendar_id=cid, starts_at=friday)
    run_due(db, friday)
    window = exclude(db, cid, label="upgrade", starts=friday.replace(tzinfo=None) + 2 * HOUR,
                     ends=friday.replace(tzinfo=None) + 4 * HOUR)
    lifted = exclude(db, cid, starts=friday.replace(tzinfo=None) + 6 * HOUR,
                     ends=friday.replace(tzinfo=None) + 7 * HOUR)
    db.execute("DELETE FROM dispatch.calendar_exclusions WHERE id = %s", (lifted,))
    for h in range(1, 9):
        run_due(db, friday + h * HOUR)
    assert [s - friday for s in slots_run(db, sid)] == [h * HOUR for h in (0, 1, 4, 5, 6, 7, 8)]
    (gap,) = gaps(db, sid)
    assert (gap["count"], gap["first"], gap["last"]) == (2, (friday + 2 * HOUR).isoformat(),
                                                         (friday + 3 * HOUR).isoformat())
    assert window > 0


def test_a_calendar_is_read_in_its_own_zone(db: psycopg.Connection) -> None:
    friday = next_friday()
    # Saturday and Sunday in Tokyo: Friday 15:00 to Sunday 15:00 UTC
    sid = add(db, calendar_id=calendar(db, "jp-weekends", WEEKENDS, timezone="Asia/Tokyo"), starts_at=friday,
              timezone="Europe/Berlin")
    hour = friday
    while hour <= friday + timedelta(days=3):
        run_due(db, hour)
        hour += HOUR
    (gap,) = gaps(db, sid)
    assert (gap["first"], gap["last"]) == ((friday + 15 * HOUR).isoformat(),
                                           (friday + timedelta(days=2, hours=14)).isoformat())


@pytest.mark.parametrize(("zone", "wall", "expected_utc"), [
    # New York springs forward at 02:00 on 2027-03-14: 02:30 does not exist, it is the jump (07:00Z)
    ("America/New_York", "2027-03-14 02:30", "2027-03-14 07:00"),
    # and falls back at 02:00 on 2027-11-07: 01:30 happens twice, the first (EDT, 05:30Z) counts
    ("America/New_York", "2027-11-07 01:30", "2027-11-07 05:30"),
    ("Australia/Lord_Howe", "2027-10-03 02:15", "2027-10-02 15:30"),  # a 30-minute jump at 02:00
    ("Europe/Berlin", "2027-06-01 09:00", "2027-06-01 07:00"),
])
def test_wall_clock_boundaries_follow_the_fixed_time_dst_rule(db: psycopg.Connection, zone: str, wall: str,
                                                               expected_utc: str) -> None:
    cid = calendar(db, "dst", {"starts": wall, "ends": "2028-01-01"}, timezone=zone)
    (start,) = db.execute("SELECT starts_at FROM dispatch.calendar_periods(%s, '2027-01-01', '2028-01-01')",
                          (cid,)).fetchone() or (None,)
    assert start == datetime.fromisoformat(expected_utc).replace(tzinfo=UTC)
    assert scalar(db, "SELECT dispatch.calendar_excludes(%s, %s)", (cid, start))
    before = start - timedelta(microseconds=1)
    assert not scalar(db, "SELECT dispatch.calendar_excludes(%s, %s)", (cid, before))


def test_catchup_latest_runs_the_latest_slot_outside_the_calendar(db: psycopg.Connection) -> None:
    friday = next_friday()
    sid = add(db, calendar_id=calendar(db, "weekends", WEEKENDS), starts_at=friday + 20 * HOUR)
    # an outage from Friday 20:00 to Sunday noon: the latest slot due that may run is Friday 23:00
    (run,) = run_due(db, friday + timedelta(days=2, hours=12))
    assert run[6] == friday + 23 * HOUR
    assert [(g["reason"], g["count"]) for g in gaps(db, sid)] == [("catch-up", 3)]
    assert run_due(db, friday + timedelta(days=2, hours=13)) == []
    assert [(g["reason"], g["count"]) for g in gaps(db, sid)] == [("catch-up", 3), ("calendar", 48)]
    monday = friday + timedelta(days=3)
    assert scalar(db, "SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (sid,)) == monday


def test_overlap_allow_with_catchup_all_stops_at_the_calendar(db: psycopg.Connection) -> None:
    friday = next_friday()
    sid = add(db, calendar_id=calendar(db, "weekends", WEEKENDS), starts_at=friday + 21 * HOUR,
              overlap="allow", catchup="all", misfire_grace="7 days")
    run_due(db, friday + timedelta(days=1, hours=2))
    assert [s - friday for s in slots_run(db, sid)] == [h * HOUR for h in (21, 22, 23)]
    run_due(db, friday + timedelta(days=3))
    assert [(g["reason"], g["count"]) for g in gaps(db, sid)] == [("calendar", 48)]
    assert slots_run(db, sid)[-1] == friday + timedelta(days=3)


def test_a_one_shot_in_an_excluded_period_ends_without_running(db: psycopg.Connection) -> None:
    friday = next_friday()
    at = friday + timedelta(days=1, hours=9)
    sid = add(db, cron_expression=None, run_at=at, calendar_id=calendar(db, "weekends", WEEKENDS))
    assert [i for i, _, _ in explained(db, sid, "state")] == ["excluded"]
    assert [i for i, _, _ in explained(db, sid, "next")] == ["end"]
    assert run_due(db, at) == []
    ended = db.execute("SELECT next_run_at, ended_at IS NOT NULL FROM dispatch.schedules WHERE id = %s",
                       (sid,)).fetchone()
    assert ended == (None, True)
    assert [(g["reason"], g["count"]) for g in gaps(db, sid)] == [("calendar", 1)]


def test_backfill_leaves_out_the_excluded_slots(db: psycopg.Connection) -> None:
    sid = add(db, calendar_id=calendar(db, "weekends", WEEKENDS))
    monday = next_friday() - timedelta(days=11)
    marked = scalar(db, "SELECT dispatch.backfill(%s, %s, %s)",
                    (sid, monday - timedelta(days=7), monday - timedelta(days=7) + timedelta(days=7)))
    assert marked == 24 * 5
    assert scalar(db, "SELECT bool_and(extract(isodow FROM scheduled_for) < 6) FROM dispatch.runs"
                      " WHERE schedule_id = %s", (sid,))


def test_explain_names_the_calendar_and_the_next_slot_that_runs(db: psycopg.Connection) -> None:
    friday = next_friday()
    cid = calendar(db, "weekends", WEEKENDS)
    sid = add(db, cron_expression="0 9 * * *", calendar_id=cid, starts_at=friday)
    nxt = explained(db, sid, "next")
    assert [(i, a) for i, a, _ in nxt] == [
        ("slot", friday + 9 * HOUR),
        ("excluded", friday + timedelta(days=1, hours=9)),
        ("slot", friday + timedelta(days=3, hours=9)),
        ("slot", friday + timedelta(days=4, hours=9))]
    run_due(db, friday + 9 * HOUR)
    ((item, at, detail),) = explained(db, sid, "state")
    assert (item, at) == ("excluded", friday + timedelta(days=1, hours=9))
    assert "calendar weekends ('weekend'" in detail
    assert f"the next slot that runs is {(friday + timedelta(days=3, hours=9)):%Y-%m-%d %H:%M:%S}" in detail
    assert explained(db, sid, "next")[0][:2] == ("slot", friday + timedelta(days=3, hours=9))
    run_due(db, friday + timedelta(days=1, hours=9))
    assert explained(db, sid, "state")[0][0] == "live"
    not_run = [(i, d) for i, _, d in explained(db, sid, "not run")]
    assert not_run[1][0] == "calendar" and "fell in a period of calendar weekends" in not_run[1][1]


def test_a_stampede_marks_the_slots_outside_calendars_in_chunks_and_passes_over_the_others(
        db: psycopg.Connection) -> None:
    now = datetime.now(UTC).replace(tzinfo=None)
    current = calendar(db, "now", {"starts": now - HOUR, "ends": now + HOUR})
    tomorrow = calendar(db, "tomorrow", {"starts": now + timedelta(days=1), "ends": now + timedelta(days=2)})
    for p in range(20):
        for k in range(9):
            db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression,"
                       " calendar_id) VALUES (%s, %s, '* * * * *', %s)",
                       (f"p{p}", f"f{k}", (None, current, tomorrow)[k % 3]))
    db.execute("UPDATE dispatch.schedules SET next_run_at = date_trunc('minute', now())")  # all due at once
    marked = 0
    while True:  # as a listener does at a stampede: chunks, then the tick for the rest
        m, taken = db.execute("SELECT * FROM dispatch.tick_chunk(50)").fetchone() or (0, 0)
        marked += m
        if taken < 50:
            break
    assert marked == 20 * 6
    db.execute("SELECT dispatch.tick()")
    runs = dict(db.execute(
        "SELECT coalesce(c.name, '-'), count(r.id) FROM dispatch.schedules s"
        " LEFT JOIN dispatch.calendars c ON c.id = s.calendar_id"
        " LEFT JOIN dispatch.runs r ON r.schedule_id = s.id GROUP BY 1").fetchall())
    assert runs == {"-": 20 * 3, "now": 0, "tomorrow": 20 * 3}
    calendar_gaps = "SELECT count(*) FROM dispatch.audit_log WHERE metadata->>'reason' = 'calendar'"
    assert scalar(db, calendar_gaps) == 20 * 3
    # they go on at the first slot of the period's end
    assert scalar(db, "SELECT count(*) FROM dispatch.schedules WHERE calendar_id = %s"
                      " AND next_run_at = dispatch.cron_next('* * * * *', %s - interval '1 microsecond',"
                      " 'UTC')",
                  (current, (now + HOUR).replace(tzinfo=UTC))) == 20 * 3


@pytest.mark.parametrize(("sql", "field"), [
    ("INSERT INTO dispatch.calendars (name) VALUES ('no spaces please')", "calendar name"),
    ("INSERT INTO dispatch.calendars (name, timezone) VALUES ('x', 'Mars/Olympus')", "time zone"),
    ("INSERT INTO dispatch.calendar_exclusions (calendar_id, starts, ends)"
     " VALUES ({cid}, '2027-12-25', '2027-12-25')", "ends"),
    ("INSERT INTO dispatch.calendar_exclusions (calendar_id, starts) VALUES ({cid}, '2027-12-25')",
     "starts and ends"),
    ("INSERT INTO dispatch.calendar_exclusions (calendar_id, days) VALUES ({cid}, '{{0,6}}')", "days"),
    ("INSERT INTO dispatch.calendar_exclusions (calendar_id, days, from_time, until_time)"
     " VALUES ({cid}, '{{6}}', '22:00', '02:00')", "until_time"),
    ("INSERT INTO dispatch.calendar_exclusions (calendar_id, starts, ends, days)"
     " VALUES ({cid}, '2027-12-25', '2027-12-26', '{{6}}')", "days"),
    ("INSERT INTO dispatch.calendar_exclusions (calendar_id, starts, ends, from_time)"
     " VALUES ({cid}, '2027-12-25', '2027-12-26', '10:00')", "from_time"),
    ("INSERT INTO dispatch.calendar_exclusions (calendar_id, starts, ends)"
     " VALUES ({cid}, '2027-12-25', 'infinity')", "finite"),
    ("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, calendar_id)"
     " VALUES ('proj_1', 'fn', '* * * * *', {other})", "calendar_id"),
    ("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, calendar_id)"
     " VALUES ('proj_1', 'fn', '* * * * *', 999999)", "calendar_id"),
])
def test_bad_calendars_are_refused_naming_the_field(db: psycopg.Connection, sql: str, field: str) -> None:
    cid = calendar(db, "ours")
    other = calendar(db, "theirs", project="proj_2")
    with pytest.raises(errors.InvalidParameterValue, match=field):
        db.execute(sql.format(cid=cid, other=other))


def test_a_calendar_in_use_is_not_deleted_nor_given_to_another_project(db: psycopg.Connection) -> None:
    cid = calendar(db, "shared-one", WEEKENDS)
    add(db, calendar_id=cid)
    with pytest.raises(errors.ForeignKeyViolation):
        db.execute("DELETE FROM dispatch.calendars WHERE id = %s", (cid,))
    with pytest.raises(errors.InvalidParameterValue, match="schedules of other projects use it"):
        db.execute("UPDATE dispatch.calendars SET project_id = 'proj_2' WHERE id = %s", (cid,))


def test_a_deleted_schedule_does_not_hold_its_calendar(db: psycopg.Connection) -> None:
    cid = calendar(db, "old", WEEKENDS)
    sid = add(db, calendar_id=cid)
    db.execute("DELETE FROM dispatch.schedules WHERE id = %s", (sid,))  # a soft delete
    db.execute("DELETE FROM dispatch.calendars WHERE id = %s", (cid,))
    assert scalar(db, "SELECT calendar_id FROM dispatch.schedules WHERE id = %s", (sid,)) is None
    other = calendar(db, "theirs", project="proj_2")
    gone = add(db)
    db.execute("UPDATE dispatch.schedules SET deleted_at = now() WHERE id = %s", (gone,))
    db.execute("ALTER TABLE dispatch.schedules DISABLE TRIGGER USER")  # as a restore might leave it
    db.execute("UPDATE dispatch.schedules SET calendar_id = %s WHERE id = %s", (other, gone))
    db.execute("ALTER TABLE dispatch.schedules ENABLE TRIGGER USER")
    with pytest.raises(errors.InvalidParameterValue, match="belongs to project 'proj_2'"):
        db.execute("UPDATE dispatch.schedules SET deleted_at = NULL WHERE id = %s", (gone,))


def test_an_administrator_writes_calendars_and_a_reader_reads_them(db: psycopg.Connection) -> None:
    with as_role(db, "dispatch_admin"):
        cid = calendar(db, "holidays", {"label": "Christmas", "starts": "2027-12-25", "ends": "2027-12-27"},
                       timezone="Europe/Berlin")
        sid = add(db, calendar_id=cid)
        db.execute("UPDATE dispatch.calendar_exclusions SET label = 'Christmas Days' WHERE calendar_id = %s",
                   (cid,))
    audit = scalar(db, "SELECT metadata FROM dispatch.audit_log WHERE action = 'schedule.create'"
                       " AND metadata->>'scheduleId' = %s", (sid,))
    assert audit["scheduleId"] == sid
    with as_role(db, "dispatch_reader"):
        periods = db.execute("SELECT starts_at, label FROM dispatch.calendar_periods(%s, '2027-01-01',"
                             " '2028-01-01')", (cid,)).fetchall()
        assert periods == [(datetime(2027, 12, 24, 23, tzinfo=UTC), "Christmas Days")]
        with pytest.raises(errors.InsufficientPrivilege):
            db.execute("DELETE FROM dispatch.calendar_exclusions")
    with as_role(db, "dispatch_admin"):
        cid = calendar(db, "holidays-2")
        sid = add(db)
        db.execute("UPDATE dispatch.schedules SET calendar_id = %s WHERE id = %s", (cid, sid))
    changed = scalar(db, "SELECT metadata->'changed' FROM dispatch.audit_log WHERE action = 'schedule.update'"
                         " AND metadata->>'scheduleId' = %s", (sid,))
    assert changed == {"calendar_id": cid}


def test_a_pause_and_resume_inside_a_passed_period_goes_on_after_it(db: psycopg.Connection) -> None:
    friday = next_friday()
    cid = calendar(db, "weekends", WEEKENDS)
    sid = add(db, calendar_id=cid, starts_at=friday)
    for h in range(25):
        run_due(db, friday + h * HOUR)  # Friday's slots, then the weekend passed over: one gap
    db.execute("SELECT dispatch.pause(%s)", (sid,))
    db.execute("DELETE FROM dispatch.calendar_exclusions")  # nor does lifting the period give it back
    db.execute("SELECT dispatch.resume(%s)", (sid,))
    next_run_at = scalar(db, "SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (sid,))
    assert next_run_at == friday + timedelta(days=3)
    hour = friday + timedelta(days=1)
    while hour <= friday + timedelta(days=3):
        run_due(db, hour)
        hour += HOUR
    assert [(g["reason"], g["count"]) for g in gaps(db, sid)] == [("calendar", 48)]
    assert not [s for s in slots_run(db, sid) if s.weekday() >= 5]


def test_buffer_one_buffers_the_first_slot_after_a_period(db: psycopg.Connection) -> None:
    friday = next_friday()
    wall = friday.replace(tzinfo=None)
    sid = add(db, calendar_id=calendar(db, "maintenance", {"starts": wall + HOUR, "ends": wall + 2 * HOUR}),
              starts_at=friday, overlap="buffer_one")
    db.execute("SELECT dispatch.tick(%s)", (friday,))
    (first,) = claim(db, "w", 10)  # the 00:00 run, running past the period
    db.execute("SELECT dispatch.tick(%s)", (friday + HOUR,))
    assert scalar(db, "SELECT count(*) FROM dispatch.runs WHERE schedule_id = %s", (sid,)) == 1
    db.execute("SELECT dispatch.tick(%s)", (friday + 2 * HOUR,))
    assert [s - friday for s in slots_run(db, sid)] == [timedelta(0), 2 * HOUR]  # 02:00 waits behind it
    assert [(g["reason"], g["count"], g["first"]) for g in gaps(db, sid)] == [
        ("calendar", 1, (friday + HOUR).isoformat())]
    complete(db, first)
    (buffered,) = claim(db, "w", 10)
    assert buffered[6] == friday + 2 * HOUR


def test_a_calendar_that_excludes_every_day_is_passed_over_a_thousand_periods_at_a_time(
        db: psycopg.Connection) -> None:
    friday = next_friday()
    sid = add(db, calendar_id=calendar(db, "never", {"days": [1, 2, 3, 4, 5, 6, 7]}), starts_at=friday,
              overlap="allow", catchup="all", misfire_grace="10000 days")
    assert run_due(db, friday + timedelta(days=1500)) == []
    reached = scalar(db, "SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (sid,))
    assert reached == friday + timedelta(days=1000)  # a day a period: on from there next time
    assert run_due(db, friday + timedelta(days=1500)) == []
    reached = scalar(db, "SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (sid,))
    assert reached == friday + timedelta(days=2000)
    assert [(g["reason"], g["countIsAtLeast"]) for g in gaps(db, sid)] == [("calendar", True)] * 2
    assert scalar(db, "SELECT count(*) FROM dispatch.runs WHERE schedule_id = %s", (sid,)) == 0


def test_explain_agrees_with_the_tick_on_a_due_period(db: psycopg.Connection) -> None:
    """Due now, by the real clock: a period still running (excluded), and one over whose next
    slot is due (due, the period passed over first)."""
    now = datetime.now(UTC).replace(microsecond=0)
    wall = now.replace(tzinfo=None)
    running = add(db, cron_expression="* * * * *",
                  calendar_id=calendar(db, "now", {"starts": wall - 3 * HOUR, "ends": wall + HOUR}))
    over = add(db, cron_expression="* * * * *",
               calendar_id=calendar(db, "before", {"starts": wall - 3 * HOUR, "ends": wall - HOUR}))
    db.execute("UPDATE dispatch.schedules SET next_run_at = date_trunc('minute', now() - interval '2 hours')")
    verdicts = {sid: (item, detail) for sid, item, detail in db.execute(
        "SELECT s.id::text, e.item, e.detail FROM dispatch.schedules s, dispatch.explain(s.id) e"
        " WHERE e.section = 'state'")}
    assert verdicts[running][0] == "excluded"
    assert verdicts[over][0] == "due"
    assert "in a period of calendar before, are passed over" in verdicts[over][1]
    seen = explain_agrees(db)
    assert seen["state excluded"] == 1 and seen["state due"] == 1
