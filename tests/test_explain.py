"""dispatch.explain: "why didn't it fire?" for one schedule, in each state it can be in. Every
state built here is also checked against what the next tick and claim actually do
(tests/explain_check.py); tests/test_stateful.py does the same on the states its walk reaches."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors
from psycopg.rows import dict_row

from .explain_check import explain_agrees
from .runs_kit import YEARLY, add_schedule, claim, complete, make_due, scalar
from .test_breaker import opened, probe_due
from .test_fairness import Connect


def explain(db: psycopg.Connection, sid: str, since: str | None = None) -> list[dict[str, Any]]:
    cursor = db.cursor(row_factory=dict_row)
    if since is None:
        return cursor.execute("SELECT * FROM dispatch.explain(%s)", (sid,)).fetchall()
    return cursor.execute("SELECT * FROM dispatch.explain(%s, %s)", (sid, since)).fetchall()


def section(rows: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [row for row in rows if row["section"] == name]


def state(db: psycopg.Connection, sid: str) -> dict[str, Any]:
    [row] = section(explain(db, sid), "state")
    return row


LAST_MINUTE = "date_trunc('minute', now() - interval '1 minute')"


def due(db: psycopg.Connection, sid: str, at: str = LAST_MINUTE) -> None:
    """Put one schedule's next slot in the past, as the clock would (a superuser's write)."""
    db.execute(f"UPDATE dispatch.schedules SET next_run_at = {at} WHERE id = %s", (sid,))


def _live_due_and_jitter_wait(db: psycopg.Connection) -> None:
    # ten schedules every 10 minutes from a second ago, jittered over 10 minutes: the one whose
    # offset is the largest waits for it
    anchor = scalar(db, "SELECT date_trunc('second', now()) - interval '1 second'")
    sids = [add_schedule(db, None, every="10 minutes", anchor=anchor, jitter="10 minutes") for _ in range(10)]
    for other in sids:
        due(db, other, "anchor")
    sid, offset = db.execute(
        "SELECT id::text, dispatch.jitter_offset(id, next_run_at, jitter) FROM dispatch.schedules"
        " ORDER BY 2 DESC LIMIT 1").fetchone()  # type: ignore[misc]
    assert offset > timedelta(minutes=1)
    due_now = state(db, sid)
    assert (due_now["item"], due_now["at"]) == ("due", anchor)
    assert "the next tick marks it" in due_now["detail"] and "fires at" in due_now["detail"]
    explain_agrees(db)

    db.execute("SELECT dispatch.tick()")
    [run_id] = [r for (r,) in db.execute("SELECT id FROM dispatch.runs WHERE schedule_id = %s", (sid,))]
    rows = explain(db, sid)
    [waiting] = section(rows, "state")
    assert (waiting["item"], waiting["at"], waiting["run_id"]) == ("jitter_wait", anchor + offset, run_id)
    assert "waiting for its jitter offset" in waiting["detail"]
    assert [(r["item"], r["run_id"]) for r in section(rows, "open run")] == [("jitter_wait", run_id)]
    # the next three slots after the open one, each with its own offset
    nxt = section(rows, "next")
    expected = db.execute(
        "SELECT k.slot, dispatch.jitter_offset(%s, k.slot, '10 minutes') FROM"
        " (SELECT %s::timestamptz + n * interval '10 minutes' AS slot FROM generate_series(1, 3) n) k",
        (sid, anchor)).fetchall()
    assert [r["at"] for r in nxt] == [s for s, _ in expected]
    for row, (at, jitter) in zip(nxt, expected, strict=True):
        assert f"at {(at + jitter).replace(microsecond=0):%Y-%m-%d %H:%M:%S}" in row["detail"]
        assert f"(if run {run_id} has finished by then)" in row["detail"]
    assert {state(db, other)["item"] for other in sids} <= {"jitter_wait", "pending"}
    assert explain_agrees(db)["open run jitter_wait"] >= 1

    db.execute("DELETE FROM dispatch.runs WHERE schedule_id = %s", (sid,))  # (superuser) nothing open
    due(db, sid, "anchor + interval '10 minutes'")
    live = state(db, sid)
    assert (live["item"], live["at"]) == ("live", nxt[0]["at"] + expected[0][1])
    assert live["detail"].startswith("live: its next slot is ")

    # a cron schedule's slots in its own zone
    berlin = add_schedule(db, "30 2 * * *", timezone="Europe/Berlin")
    assert all(" 02:30 Europe/Berlin" in row["detail"] and "fires on the slot" in row["detail"]
               for row in section(explain(db, berlin), "next"))


def _busy_retry_wait_and_the_last_outcome(db: psycopg.Connection) -> None:
    sid = add_schedule(db, YEARLY, max_attempts=3)
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    pending = state(db, sid)
    assert pending["item"] == "pending" and "the next claim takes it" in pending["detail"]
    assert "no listener is connected" in pending["detail"]
    explain_agrees(db)

    [run] = claim(db, "host-a:1")
    busy = state(db, sid)
    assert (busy["item"], busy["run_id"]) == ("busy", run[0])
    assert f"run {run[0]} (scheduled, slot" in busy["detail"]
    assert "running on host-a:1 since" in busy["detail"]
    assert "attempt 1 of 3" in busy["detail"] and "overlap skip" in busy["detail"]
    explain_agrees(db)

    db.execute("CALL dispatch.complete_run(%s, 'host-a:1', %s, 'error', 'HTTP 503: unavailable', 503, 12,"
               " true, 60000)", (run[0], run[7]))
    retry_at = scalar(db, "SELECT not_before FROM dispatch.runs WHERE id = %s", (run[0],))
    waiting = state(db, sid)
    assert (waiting["item"], waiting["at"], waiting["run_id"]) == ("retry_wait", retry_at, run[0])
    assert "failed on attempt 1 of 3 (HTTP 503: unavailable)" in waiting["detail"]
    assert f"retried at {retry_at.replace(microsecond=0):%Y-%m-%d %H:%M:%S}" in waiting["detail"]
    explain_agrees(db)

    # lowered meanwhile: the retry may no longer go, and the claim ends it
    db.execute("UPDATE dispatch.schedules SET max_attempts = 1 WHERE id = %s", (sid,))
    db.execute("UPDATE dispatch.runs SET not_before = now() WHERE id = %s", (run[0],))
    assert state(db, sid)["item"] == "late"
    assert explain_agrees(db)["open run late"] == 1
    assert claim(db, "host-a:1") == []
    rows = explain(db, sid)
    [last] = section(rows, "run")
    assert (last["item"], last["run_id"]) == ("error", run[0])
    assert "HTTP 503 in 12 ms: HTTP 503: unavailable" in last["detail"]
    assert "max_attempts is now 1" in last["detail"]
    assert section(rows, "state")[0]["item"] == "live"


def _an_expired_lease_and_a_missed_run(db: psycopg.Connection) -> None:
    sid = add_schedule(db, YEARLY)
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    [run] = claim(db, "host-b:7", lease="1 millisecond")
    db.execute("SELECT pg_sleep(0.01)")
    expired = state(db, sid)
    assert (expired["item"], expired["run_id"]) == ("expired", run[0])
    assert "lease ran out" in expired["detail"] and "hands it out again (attempt 2 of 3" in expired["detail"]
    assert explain_agrees(db)["open run expired"] == 1

    # the first attempt of a slot can no longer start within the grace: the claim skips it
    other = add_schedule(db, YEARLY)
    due(db, other, "date_trunc('minute', now()) - interval '2 minutes'")
    db.execute("SELECT dispatch.tick()")
    db.execute("UPDATE dispatch.schedules SET misfire_grace = '10 seconds' WHERE id = %s", (other,))
    missed = state(db, other)
    assert missed["item"] == "missed" and "cannot start within misfire_grace (00:00:10)" in missed["detail"]
    assert explain_agrees(db)["open run missed"] == 1


def _slots_beyond_the_grace_and_the_gaps_since(db: psycopg.Connection) -> None:
    # hourly slots, the latest half an hour ago: three of them beyond a grace of 10 minutes
    anchor = scalar(db, "SELECT date_trunc('second', now()) - interval '30 minutes'")
    sid = add_schedule(db, None, every="1 hour", anchor=anchor, misfire_grace="10 minutes")
    due(db, sid, "anchor - interval '2 hours'")
    first = anchor - timedelta(hours=2)
    missed = state(db, sid)
    assert (missed["item"], missed["at"]) == ("missed", anchor + timedelta(hours=1))
    assert "beyond misfire_grace (00:10:00): the next tick records them skipped" in missed["detail"]
    assert explain_agrees(db)["state missed"] == 1

    db.execute("SELECT dispatch.tick()")
    rows = explain(db, sid)
    assert section(rows, "state")[0]["item"] == "live"
    not_run = section(rows, "not run")
    assert not_run[0]["item"] == "summary" and "3 slots did not run: 3 misfire" in not_run[0]["detail"]
    assert [(r["item"], r["at"]) for r in not_run[1:]] == [
        ("misfire", first + timedelta(hours=k)) for k in range(3)]
    assert all("skipped: missed by" in r["detail"] for r in not_run[1:])
    # since: only what is after it
    later = explain(db, sid, since=str(first + timedelta(minutes=90)))
    assert [r["at"] for r in section(later, "not run")[1:]] == [anchor]


def _paused_disabled_deleted_and_the_gaps_they_leave(db: psycopg.Connection) -> None:
    sid = add_schedule(db, "* * * * *")
    due(db, sid, "date_trunc('minute', now()) - interval '5 minutes'")
    db.execute("SELECT dispatch.pause(%s, 'vendor API down')", (sid,))
    rows = explain(db, sid)
    [paused] = section(rows, "state")
    paused_at = scalar(db, "SELECT paused_at FROM dispatch.schedules WHERE id = %s", (sid,))
    assert (paused["item"], paused["at"]) == ("paused", paused_at)
    assert 'paused by postgres at' in paused["detail"] and 'because "vendor API down"' in paused["detail"]
    assert all("(if resumed now)" in r["detail"] for r in section(rows, "next"))
    # the slots passed over so far (from the slot it stood on), recorded as one gap on resume
    [summary, so_far] = section(rows, "not run")
    assert so_far["item"] == "pause" and "so far, while it is paused" in so_far["detail"]
    slots = so_far["detail"].split()[0]
    assert summary["item"] == "summary" and f"did not run: {slots} pause" in summary["detail"]
    assert "5 slots" in so_far["detail"] or "6 slots" in so_far["detail"]
    assert explain_agrees(db)["state paused"] == 1

    db.execute("SELECT dispatch.resume(%s)", (sid,))
    [_, gap] = section(explain(db, sid), "not run")
    assert gap["item"] == "pause" and "fell in a pause" in gap["detail"] and gap["at"] == so_far["at"]

    db.execute("UPDATE dispatch.schedules SET enabled = false WHERE id = %s", (sid,))
    disabled = state(db, sid)
    assert disabled["item"] == "disabled" and disabled["detail"].startswith("disabled by postgres at ")
    assert explain_agrees(db)["state disabled"] == 1
    db.execute("DELETE FROM dispatch.schedules WHERE id = %s", (sid,))
    rows = explain(db, sid)
    assert section(rows, "state")[0]["detail"].startswith("deleted by postgres at ")
    assert section(rows, "next") == []
    assert explain_agrees(db)["state deleted"] == 1


def _backed_off_buffered_and_waiting_its_turn(db: psycopg.Connection) -> None:
    gone = add_schedule(db, "0 9 * * *")
    db.execute("SET session_replication_role = replica")  # the write path would refuse the zone
    db.execute("UPDATE dispatch.schedules SET timezone = 'Gone/Away' WHERE id = %s", (gone,))
    db.execute("RESET session_replication_role")
    due(db, gone)
    db.execute("SELECT dispatch.tick()")
    rows = explain(db, gone)
    assert section(rows, "state")[0]["item"] == "backed_off"
    assert "Gone/Away" in section(rows, "state")[0]["detail"]
    assert [r["item"] for r in section(rows, "next")] == ["back-off"]

    sid = add_schedule(db, "*/10 * * * *", overlap="buffer_one")
    due(db, sid)
    db.execute("SELECT dispatch.tick()")
    [run] = claim(db, "w")
    db.execute("SELECT dispatch.tick(now() + interval '10 minutes')")  # (the schema's owner may)
    buffered = scalar(db, "SELECT id FROM dispatch.runs WHERE not_before = 'infinity'")
    backfilled = scalar(db, "SELECT dispatch.backfill(%s, now() - interval '1 hour', now())", (sid,))
    assert backfilled >= 5
    rows = explain(db, sid)
    assert (section(rows, "state")[0]["item"], section(rows, "state")[0]["run_id"]) == ("busy", run[0])
    items = [(r["item"], r["run_id"]) for r in section(rows, "open run")]
    assert ("buffered", buffered) in items and ("running", run[0]) in items
    assert sum(item == "waits_turn" for item, _ in items) == backfilled
    seen = explain_agrees(db)
    assert seen["open run buffered"] == 1 and seen["open run waits_turn"] == backfilled


def _unknown_id_and_no_since(db: psycopg.Connection) -> None:
    unknown = "00000000-0000-0000-0000-000000000000"
    with pytest.raises(errors.NoDataFound, match=f"schedule {unknown} does not exist"):
        db.execute("SELECT * FROM dispatch.explain(%s)", (unknown,))
    sid = add_schedule(db)
    with pytest.raises(errors.InvalidParameterValue, match="since must be an instant"):
        db.execute("SELECT * FROM dispatch.explain(%s, NULL)", (sid,))


def _the_last_runs_latest_first(db: psycopg.Connection) -> None:
    sid = add_schedule(db, YEARLY)
    for status in ("ok", "error", "ok"):
        db.execute("SELECT dispatch.run_now(%s)", (sid,))
        [run] = claim(db, "w")
        complete(db, run, status=status, error=None if status == "ok" else "HTTP 400: no", http_status=200)
    ran = section(explain(db, sid), "run")
    assert [r["item"] for r in ran] == ["ok", "error", "ok"]
    assert [r["run_id"] for r in ran] == sorted((r["run_id"] for r in ran), reverse=True)
    assert ran[1]["detail"].startswith("manual run, slot ") and ran[1]["detail"].endswith(": HTTP 400: no")


def _allow_set_while_a_run_stands_on_the_slot(db: psycopg.Connection) -> None:
    sid = add_schedule(db, "0 * * * *")
    due(db, sid, "date_trunc('hour', now())")  # (the latest slot until the hour turns)
    db.execute("SELECT dispatch.tick()")
    run_id = scalar(db, "SELECT id FROM dispatch.runs WHERE schedule_id = %s", (sid,))
    assert state(db, sid)["item"] == "pending"
    db.execute("UPDATE dispatch.schedules SET overlap = 'allow' WHERE id = %s", (sid,))
    settling = state(db, sid)
    assert (settling["item"], settling["run_id"]) == ("settling", run_id)
    assert explain_agrees(db)["state settling"] == 1


def fresh(db: psycopg.Connection) -> None:
    """Nothing left of the part before (a database copied for each test costs half a second)."""
    db.execute("TRUNCATE dispatch.runs, dispatch.audit_log, dispatch.schedules, dispatch.breakers")


def _held_by_an_open_breaker(db: psycopg.Connection) -> None:
    # five schedules of one function, each run failed once: its breaker is open, their retries
    # due, the next probe an hour away
    sids = opened(db)
    for sid in sids:
        row = state(db, sid)
        assert row["item"] == "breaker", row
        assert "held by the circuit breaker of proj_1/down" in row["detail"] and "503" in row["detail"]
    explain_agrees(db)  # the claim holds them all
    claim(db, "w", 100)
    assert {state(db, sid)["item"] for sid in sids} == {"breaker"}
    probe_due(db)
    explain_agrees(db)  # one of them goes, as the probe


def test_waiting_for_a_slot_its_jitter_or_a_listener(db: psycopg.Connection) -> None:
    _live_due_and_jitter_wait(db)
    fresh(db)
    _the_last_runs_latest_first(db)
    fresh(db)
    _unknown_id_and_no_since(db)


def test_a_run_open_busy_retrying_expired_or_missed(db: psycopg.Connection) -> None:
    _busy_retry_wait_and_the_last_outcome(db)
    fresh(db)
    _an_expired_lease_and_a_missed_run(db)
    fresh(db)
    _allow_set_while_a_run_stands_on_the_slot(db)
    fresh(db)
    _backed_off_buffered_and_waiting_its_turn(db)
    fresh(db)
    _held_by_an_open_breaker(db)


def test_stopped_and_the_slots_that_did_not_run(db: psycopg.Connection) -> None:
    _slots_beyond_the_grace_and_the_gaps_since(db)
    fresh(db)
    _paused_disabled_deleted_and_the_gaps_they_leave(db)


def _open_run(db: psycopg.Connection, sid: str) -> dict[str, Any]:
    [row] = section(explain(db, sid), "open run")
    return row


def test_a_project_at_its_max_concurrency(db: psycopg.Connection) -> None:
    # three runs due of a project that runs at most two at once: two run, the third waits
    sids = [add_schedule(db, YEARLY) for _ in range(3)]
    db.execute("INSERT INTO dispatch.projects (project_id, max_concurrency) VALUES ('proj_1', 2)")
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    taken = claim(db, "w", 10)
    assert len(taken) == 2
    [sid] = [s for s in sids if s not in {str(r[1]) for r in taken}]
    run_id = scalar(db, "SELECT id FROM dispatch.runs WHERE schedule_id = %s", (sid,))
    capped = state(db, sid)
    assert (capped["item"], capped["run_id"]) == ("capped", run_id), capped
    assert "project proj_1 is at its max_concurrency: 2 of 2 running" in capped["detail"]
    assert "it goes when one of them ends" in capped["detail"]
    assert _open_run(db, sid)["item"] == "capped"
    assert explain_agrees(db)["open run capped"] == 1  # the claim leaves it

    # room for one more: the claim takes it
    db.execute("UPDATE dispatch.projects SET max_concurrency = 3")
    assert state(db, sid)["item"] == "pending"
    assert explain_agrees(db)["open run pending"] == 1

    # a second run of the same slot, marked after it: the room goes to the first, in the
    # claim's order
    later = add_schedule(db, YEARLY)
    due(db, later, f"(SELECT scheduled_for FROM dispatch.runs WHERE id = {run_id})")
    db.execute("SELECT dispatch.tick()")
    assert (state(db, sid)["item"], state(db, later)["item"]) == ("pending", "capped")
    assert "room for 1 more, which the next claim gives to a run of proj_1 due before this one" \
        in state(db, later)["detail"]
    seen = explain_agrees(db)
    assert (seen["open run pending"], seen["open run capped"]) == (1, 1)

    # a run the claim ends (beyond its misfire_grace) takes the room as well: the claim's
    # allowance counts it, not the cap
    missed = add_schedule(db, YEARLY)
    due(db, missed, "date_trunc('minute', now()) - interval '2 minutes'")
    db.execute("SELECT dispatch.tick()")
    db.execute("UPDATE dispatch.schedules SET misfire_grace = '10 seconds' WHERE id = %s", (missed,))
    assert [state(db, s)["item"] for s in (missed, sid, later)] == ["missed", "capped", "capped"]
    seen = explain_agrees(db)
    assert (seen["open run missed"], seen["open run capped"], seen["open run pending"]) == (1, 2, 0)

    # a slot due before them all, not marked yet: the tick marks it, and its run takes the room
    # (the check lets the run it overtakes wait)
    early = add_schedule(db, YEARLY)
    due(db, early, "date_trunc('minute', now()) - interval '3 minutes'")
    assert state(db, early)["item"] == "due"
    assert explain_agrees(db)["open run missed overtaken"] == 1

    # no cap: every run goes
    db.execute("UPDATE dispatch.projects SET max_concurrency = NULL")
    assert [state(db, s)["item"] for s in (missed, sid, later)] == ["missed", "pending", "pending"]
    explain_agrees(db)


# A run that another transaction holds is skipped by the claim: in a capped project its room goes
# to the run after it.
def test_a_run_behind_one_another_transaction_holds_is_not_capped(db: psycopg.Connection,
                                                                  connect: Connect) -> None:
    first, second = add_schedule(db, YEARLY), add_schedule(db, YEARLY)
    db.execute("INSERT INTO dispatch.projects (project_id, max_concurrency) VALUES ('proj_1', 1)")
    make_due(db)
    due(db, first, "date_trunc('minute', now()) - interval '2 minutes'")  # first in the claim's order
    db.execute("SELECT dispatch.tick()")
    assert state(db, second)["item"] == "capped"  # the room goes to first's run
    # a disable of the first left open in psql: it ends first's run, which its transaction holds
    dba = connect(autocommit=False)
    dba.execute("UPDATE dispatch.schedules SET enabled = false WHERE id = %s", (first,))
    # the next claim skips the held run and gives the room to second's: explain should say so
    assert state(db, second)["item"] == "pending"
    assert explain_agrees(db, skip=[first])["open run pending"] == 1


def test_a_capped_projects_row_held_by_an_open_transaction(db: psycopg.Connection, connect: Connect) -> None:
    sid = add_schedule(db, YEARLY)
    uncapped = add_schedule(db, YEARLY)
    db.execute("UPDATE dispatch.schedules SET project_id = 'proj_2' WHERE id = %s", (uncapped,))
    db.execute("INSERT INTO dispatch.projects (project_id, max_concurrency, weight) VALUES ('proj_1', 2, 1),"
               " ('proj_2', NULL, 1)")
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    assert state(db, sid)["item"] == "pending"

    # an administrator's UPDATE left open in psql: every claim skips the project meanwhile; an
    # uncapped project's row is not locked by claims, so holding it holds nothing
    admin = connect(autocommit=False)
    admin.execute("UPDATE dispatch.projects SET max_concurrency = 5 WHERE project_id = 'proj_1'")
    admin.execute("UPDATE dispatch.projects SET weight = 2 WHERE project_id = 'proj_2'")
    # (and someone else's transaction beside it, with a transaction id of its own)
    bystander = connect(autocommit=False)
    bystander.execute("SELECT pg_current_xact_id()")
    held = state(db, sid)
    assert held["item"] == "capped", held
    assert f"held by pid {admin.info.backend_pid} " in held["detail"]
    assert "every claim skips the project until that transaction ends" in held["detail"]
    assert f"held by pid {admin.info.backend_pid} " in _open_run(db, sid)["detail"]
    # read, not probed with a lock of its own: a reader in a read-only transaction is told as much
    read_only = connect(autocommit=False)
    read_only.execute("SET ROLE dispatch_reader")
    read_only.execute("SET TRANSACTION READ ONLY")
    assert state(read_only, sid)["detail"] == held["detail"]
    assert read_only.execute("SELECT pg_current_xact_id_if_assigned()").fetchone() == (None,)
    read_only.rollback()
    assert state(db, uncapped)["item"] == "pending"
    seen = explain_agrees(db)
    assert (seen["open run capped"], seen["open run pending"]) == (1, 1)
    admin.rollback()
    assert state(db, sid)["item"] == "pending"
    explain_agrees(db)

    # two sessions sharing the row (FOR SHARE: a MultiXactId holds it): held all the same
    readers = [connect(autocommit=False) for _ in range(2)]
    for reader in readers:
        reader.execute("SELECT 1 FROM dispatch.projects WHERE project_id = 'proj_1' FOR SHARE")
    shared = state(db, sid)
    assert shared["item"] == "capped", shared
    assert any(f"held by pid {r.info.backend_pid} " in shared["detail"] for r in readers)
    assert explain_agrees(db)["open run capped"] == 1
    for reader in readers:
        reader.rollback()
    assert state(db, sid)["item"] == "pending"
    assert explain_agrees(db)["open run pending"] == 2
