"""Interval schedules and jitter in SQL (DESIGN.md, "Scheduling policies": every, anchor, jitter;
runs carry fire_at). The listener's side (sub-minute slots on time, fireAt in the body, pause
across a slot) is in tests/listener/test_schedule_kinds.py; pg_cron alone firing an interval
schedule is in tests/test_pg_cron.py."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg import errors

from .runs_kit import claim, scalar


def add_interval(db: psycopg.Connection, every: str, **columns: object) -> str:
    names = ["project_id", "function_name", "every", *columns]
    row = db.execute(
        f"INSERT INTO dispatch.schedules ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))})"
        " RETURNING id", ["proj_1", "fn", every, *columns.values()]).fetchone()
    assert row is not None
    return str(row[0])


def test_interval_slots_are_the_anchor_plus_multiples_in_real_time(db: psycopg.Connection) -> None:
    # 90 minutes from a Berlin midnight, across the spring-forward of 2024-03-31: real time, so
    # the wall clock jumps with it (the DST rules of cron schedules do not apply)
    anchor = datetime(2024, 3, 30, 23, 0, tzinfo=UTC)
    sid = add_interval(db, "90 minutes", anchor=anchor, timezone="Europe/Berlin")
    spec = "(SELECT cron_spec FROM dispatch.schedules WHERE id = %s)"
    slots = []
    after = anchor
    for _ in range(6):
        after = scalar(db, f"SELECT dispatch.cron_spec_next({spec}, %s, 'Europe/Berlin')", (sid, after))
        slots.append(after)
    assert slots == [anchor + timedelta(minutes=90 * k) for k in range(1, 7)]
    # strictly after: a slot instant itself gives the next one; before the anchor counts back
    assert scalar(db, f"SELECT dispatch.cron_spec_next({spec}, %s)", (sid, anchor)) == slots[0]
    before = anchor - timedelta(minutes=1)
    assert scalar(db, f"SELECT dispatch.cron_spec_next({spec}, %s)", (sid, before)) == anchor
    # sub-second precision survives years of slots
    odd = datetime(2020, 1, 1, 0, 0, 0, 123457, tzinfo=UTC)
    step = timedelta(seconds=7, microseconds=500001)
    far = odd + step * 4_000_000 + timedelta(microseconds=3)  # about 347 days of slots
    assert scalar(db, "SELECT dispatch.cron_spec_next(dispatch.every_spec(%s, %s), %s)", (step, odd, far)) \
        == odd + step * 4_000_001
    # the schedule's first slot: the first after now
    now, next_run_at = db.execute("SELECT now(), next_run_at FROM dispatch.schedules").fetchone()  # type: ignore[misc]
    assert now < next_run_at <= now + timedelta(minutes=90)
    assert (next_run_at - anchor) % timedelta(minutes=90) == timedelta(0)


def test_the_anchor_defaults_to_the_creation_time_and_goes_with_every(db: psycopg.Connection) -> None:
    sid = add_interval(db, "30 seconds")
    created, anchor, next_run_at = db.execute(
        "SELECT created_at, anchor, next_run_at FROM dispatch.schedules WHERE id = %s", (sid,)).fetchone()  # type: ignore[misc]
    assert anchor == created and (next_run_at - created) % timedelta(seconds=30) == timedelta(0)

    # to a cron expression and back: the anchor is cleared, then the creation time again
    db.execute("UPDATE dispatch.schedules SET every = NULL, cron_expression = '*/5 * * * *' WHERE id = %s",
               (sid,))
    row = db.execute("SELECT anchor, next_run_at, (cron_spec).every_us FROM dispatch.schedules").fetchone()
    assert row is not None and row[0] is None and row[2] is None and row[1].minute % 5 == 0
    db.execute("UPDATE dispatch.schedules SET cron_expression = NULL, every = '1 hour' WHERE id = %s", (sid,))
    assert scalar(db, "SELECT anchor FROM dispatch.schedules") == created
    changes = [row[0] for row in db.execute(
        "SELECT metadata->'changed' FROM dispatch.audit_log WHERE action = 'schedule.update' ORDER BY id")]
    assert changes[0]["every"] is None and changes[0]["cron_expression"] == "*/5 * * * *"
    assert changes[1]["every"] == "01:00:00" and "anchor" in changes[1]


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"cron_expression": "* * * * *", "every": "1 minute"},
         "cron_expression and every exclude each other: set one of them"),
        ({}, "a schedule needs cron_expression, every or run_at"),
        ({"every": "0 seconds"}, "every must be at least 1 second and at most 366 days, not 00:00:00"),
        ({"every": "999 milliseconds"}, "every must be at least 1 second"),
        ({"every": "1 mon"}, r"every must be a fixed length \(seconds, minutes, hours, days\), not 1 mon"),
        ({"every": "10 seconds", "jitter": "11 seconds"},
         r"jitter \(00:00:11\) must not exceed the shortest time between two slots \(00:00:10\)"),
        # one rule for both kinds: a cron slot never fires after the next one either
        ({"cron_expression": "* * * * *", "jitter": "1 day"},
         r"jitter \(1 day\) must not exceed the shortest time between two slots \(00:01:00\)"),
        ({"cron_expression": "0,10 9-17 * * *", "jitter": "11 minutes"},
         r"jitter \(00:11:00\) must not exceed the shortest time between two slots \(00:10:00\)"),
        ({"cron_expression": "50 9,10 * * *", "jitter": "61 minutes"},
         r"must not exceed the shortest time between two slots \(01:00:00\)"),
        ({"cron_expression": "5,55 * * * *", "jitter": "11 minutes"},
         r"must not exceed the shortest time between two slots \(00:10:00\)"),  # 9:55 -> 10:05
        ({"cron_expression": "0 23,1 * * *", "jitter": "3 hours"},
         r"must not exceed the shortest time between two slots \(02:00:00\)"),  # across midnight
        ({"cron_expression": "0 * * * *", "anchor": "2026-01-01"},
         "anchor applies to an interval schedule \\(every\\), not to cron_expression '0 \\* \\* \\* \\*'"),
        ({"cron_expression": "0 * * * *", "jitter": "-1 second"}, "jitter must be between 0 and 1 day"),
        ({"cron_expression": "0 * * * *", "jitter": "25 hours"}, "jitter must be between 0 and 1 day"),
    ],
)
def test_bad_slot_rules_are_refused_naming_the_fields(
    db: psycopg.Connection, columns: dict[str, str], message: str
) -> None:
    names = ["project_id", "function_name", *columns]
    with pytest.raises(errors.InvalidParameterValue, match=message):
        db.execute(f"INSERT INTO dispatch.schedules ({', '.join(names)})"
                   f" VALUES ({', '.join(['%s'] * len(names))})", ["p", "fn", *columns.values()])


def test_a_jitter_up_to_the_shortest_time_between_slots_is_accepted(db: psycopg.Connection) -> None:
    for expr, jitter in [("0 * * * *", "1 hour"), ("30 9 * * *", "1 day"), ("*/15 * * * *", "15 minutes")]:
        db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, jitter)"
                   " VALUES ('p', 'fn', %s, %s)", (expr, jitter))
    sid = add_interval(db, "10 minutes", jitter="10 minutes")
    # an edit that shortens the slots below the jitter is refused like an insert
    with pytest.raises(errors.InvalidParameterValue, match="must not exceed the shortest time between"):
        db.execute("UPDATE dispatch.schedules SET every = NULL, cron_expression = '*/5 * * * *'"
                   " WHERE id = %s", (sid,))
    # leaving an interval for a cron expression drops the anchor that went with it, without a word
    db.execute("UPDATE dispatch.schedules SET every = NULL, cron_expression = '*/10 * * * *' WHERE id = %s",
               (sid,))
    assert scalar(db, "SELECT anchor FROM dispatch.schedules WHERE id = %s", (sid,)) is None


def test_tick_marks_the_latest_interval_slot_after_a_gap(db: psycopg.Connection) -> None:
    anchor = datetime(2026, 1, 1, tzinfo=UTC)
    sid = add_interval(db, "10 seconds", anchor=anchor)
    first = scalar(db, "SELECT next_run_at FROM dispatch.schedules")
    # on time: the slot itself
    assert scalar(db, "SELECT dispatch.tick(%s)", (first + timedelta(seconds=3),)) == 1
    run = db.execute("SELECT scheduled_for, fire_at, not_before FROM dispatch.runs").fetchone()
    assert run == (first, first, None)
    db.execute("DELETE FROM dispatch.runs")
    # 35 s late (no listener, only pg_cron's minute): the latest slot, the three before coalesced
    horizon = first + timedelta(seconds=35)
    assert scalar(db, "SELECT dispatch.tick(%s)", (horizon,)) == 1
    assert scalar(db, "SELECT scheduled_for FROM dispatch.runs") == first + timedelta(seconds=30)
    assert scalar(db, "SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (sid,)) \
        == first + timedelta(seconds=30)


def test_jitter_offsets_are_fixed_bounded_and_spread(db: psycopg.Connection) -> None:
    """10,000 schedules on 0 * * * * with a jitter of 10 minutes: each slot's fire instant is the
    same on two ticks, within [0, 10 min), and no second holds more than 1 % of them."""
    db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, jitter)"
               " SELECT 'p' || i % 100, 'fn', '0 * * * *', '10 minutes' FROM generate_series(1, 10000) i")
    slot = scalar(db, "SELECT min(next_run_at) FROM dispatch.schedules")
    promised = dict(db.execute("SELECT id, next_fire_at FROM dispatch.schedule_status").fetchall())

    def tick_at(horizon: datetime) -> dict[object, tuple[datetime, datetime | None]]:
        with db.transaction(force_rollback=True):
            assert scalar(db, "SELECT dispatch.tick(%s)", (horizon,)) == 10_000
            return {sid: (fire_at, not_before) for sid, fire_at, not_before in db.execute(
                "SELECT schedule_id, fire_at, not_before FROM dispatch.runs WHERE scheduled_for = %s",
                (slot,))}

    on_the_hour = tick_at(slot)
    five_past = tick_at(slot + timedelta(minutes=5))
    fire = {sid: at for sid, (at, _) in on_the_hour.items()}
    assert fire == {sid: at for sid, (at, _) in five_past.items()} == promised
    offsets = [(at - slot).total_seconds() for at in fire.values()]
    assert min(offsets) >= 0 and max(offsets) < 600
    per_second = Counter(int(offset) for offset in offsets)
    assert max(per_second.values()) <= 100, per_second.most_common(3)
    assert len(per_second) > 590  # and the window is used, not a corner of it
    # a run whose instant is still ahead of the tick waits for it; one whose instant passed does not
    assert all(not_before == at for sid, (at, not_before) in on_the_hour.items() if at > slot)
    assert all((not_before is None) == (at <= slot + timedelta(minutes=5))
               for at, not_before in five_past.values())
    # the next slot's offsets are different ones
    later = dict(db.execute("SELECT id, dispatch.jitter_offset(id, next_run_at + interval '1 hour', jitter)"
                            " FROM dispatch.schedules").fetchall())
    assert sum(later[sid] == fire[sid] - slot for sid in fire) < 100


def test_jitter_offsets_keep_their_formula_and_are_inlined(db: psycopg.Connection) -> None:
    """The offsets of runs marked before an upgrade and after it are one sequence: the function
    still computes the hash of (schedule id, the slot's epoch) it always did, for any slot, zone
    of the session and jitter, NULL for a NULL input; and it is one expression in the plan, not a
    call per row."""
    db.execute("SET TIME ZONE 'America/St_Johns'")
    cases = db.execute("""
        SELECT count(*), count(*) FILTER (WHERE dispatch.jitter_offset(id, slot, jitter) IS DISTINCT FROM
            CASE WHEN id IS NULL OR slot IS NULL OR jitter IS NULL THEN NULL
                 WHEN (extract(epoch FROM jitter) * 1000000)::bigint <= 0 THEN interval '0'
                 ELSE mod(mod(hashtextextended(id::text || ' ' || extract(epoch FROM slot)::text, 0),
                              (extract(epoch FROM jitter) * 1000000)::bigint)
                          + (extract(epoch FROM jitter) * 1000000)::bigint,
                          (extract(epoch FROM jitter) * 1000000)::bigint) * interval '1 microsecond' END)
        FROM (SELECT gen_random_uuid() AS id,
                     timestamptz '2020-01-01' + random() * interval '3000 days' AS slot,
                     (ARRAY[interval '45 seconds', interval '1.5 seconds', interval '1 day', interval '0',
                            interval '0.000001 seconds'])[1 + i % 5] AS jitter
              FROM generate_series(1, 20000) i
              UNION ALL
              SELECT gen_random_uuid(), s, j
              FROM unnest(ARRAY[timestamptz 'infinity', '-infinity', '1900-01-01 00:00:00.5+00', NULL]) s,
                   unnest(ARRAY[interval '30 seconds', interval '0', NULL]) j
              UNION ALL
              SELECT NULL, now(), interval '10 seconds') c (id, slot, jitter)""").fetchone()
    assert cases is not None and cases[0] == 20_013 and cases[1] == 0
    plan = "\n".join(row[0] for row in db.execute(
        "EXPLAIN (VERBOSE, COSTS OFF)"
        " SELECT dispatch.jitter_offset(id, next_run_at, jitter) FROM dispatch.schedules"))
    assert "jitter_offset" not in plan and "hashtextextended" in plan, plan


def test_a_jittered_run_waits_for_its_instant(db: psycopg.Connection) -> None:
    db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, jitter)"
               " VALUES ('p', 'fn', '0 0 1 1 *', '1 hour')")
    slot = scalar(db, "SELECT next_run_at FROM dispatch.schedules")
    assert scalar(db, "SELECT dispatch.tick(%s)", (slot,)) == 1
    fire_at, not_before = db.execute("SELECT fire_at, not_before FROM dispatch.runs").fetchone()  # type: ignore[misc]
    assert slot < fire_at < slot + timedelta(hours=1) and not_before == fire_at
    assert claim(db, "w") == []  # not before its instant
    # the listener's clock is told the instant as well as the slot
    assert scalar(db, "SELECT dispatch.next_due_after(%s)", (slot,)) == fire_at


def test_the_misfire_grace_counts_from_the_fire_instant(db: psycopg.Connection) -> None:
    db.execute("INSERT INTO dispatch.schedules"
               " (project_id, function_name, cron_expression, jitter, misfire_grace)"
               " VALUES ('p', 'fn', '0 0 1 1 *', '10 minutes', '1 minute')")
    sid = scalar(db, "SELECT id FROM dispatch.schedules")
    # both slots 5 minutes ago; one fired 30 s ago (in grace), one 2 minutes ago (beyond)
    db.execute("INSERT INTO dispatch.runs (schedule_id, project_id, scheduled_for, fire_at)"
               " SELECT id, project_id, x.* FROM dispatch.schedules,"
               " (VALUES (now() - interval '5 minutes', now() - interval '30 seconds'),"
               " (now() - interval '5 minutes 1 second', now() - interval '2 minutes')) x"
               " WHERE id = %(s)s", {"s": sid})
    in_grace = scalar(db, "SELECT id FROM dispatch.runs ORDER BY fire_at DESC LIMIT 1")
    assert [row[0] for row in claim(db, "w")] == [in_grace]
    assert db.execute("SELECT status, error FROM dispatch.runs WHERE status = 'skipped'").fetchall() == [
        ("skipped", "missed by 2 min 0 s (misfire_grace 00:01:00)")]
