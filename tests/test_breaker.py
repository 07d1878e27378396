"""The circuit breaker per function (issue 23 §3, issue 26 item 4), in SQL, on real sessions.

A function's breaker opens after breaker_threshold consecutive retryable failures within
breaker_window; its runs then wait (pending, not_before, their attempts kept) while one probe
at a time goes, spaced from breaker_probe_spacing doubling to breaker_probe_spacing_max; the
first answer closes it and lets the waiting runs go. The clock is moved the way runs_kit moves
it (a superuser's write of next_probe_at / not_before), never slept on."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors

from tests.runs_kit import YEARLY, claim, complete, complete_many, make_due, run_row, scalar

Connect = Callable[..., psycopg.Connection]
DOWN = "down"


def add(db: psycopg.Connection, function_name: str = DOWN, expr: str = YEARLY, **columns: Any) -> str:
    """A schedule of `function_name` in project proj_1; yearly by default, so that no retry meets
    its next slot whatever minute the test runs in."""
    names = ["project_id", "function_name", "cron_expression", *columns]
    values = ["proj_1", function_name, expr, *columns.values()]
    return str(scalar(db, f"INSERT INTO dispatch.schedules ({', '.join(names)})"
                          f" VALUES ({', '.join(['%s'] * len(names))}) RETURNING id", values))


def breaker(db: psycopg.Connection, function_name: str = DOWN) -> dict[str, Any]:
    row = db.cursor(row_factory=psycopg.rows.dict_row).execute(
        "SELECT * FROM dispatch.breakers WHERE project_id = 'proj_1' AND function_name = %s",
        (function_name,)).fetchone()
    assert row is not None
    return row


def fail(db: psycopg.Connection, runs: list[tuple[Any, ...]], retryable: bool = True) -> None:
    for run in runs:
        assert complete(db, run, status="error", error="HTTP 503: down", http_status=503,
                        retryable=retryable)[0]


def probe_due(db: psycopg.Connection) -> None:
    """The next probe's instant has come (and every waiting run's not_before with it)."""
    db.execute("UPDATE dispatch.breakers SET next_probe_at = now() - interval '1 millisecond'"
               " WHERE state = 'open'")
    db.execute("UPDATE dispatch.runs SET not_before = now() - interval '1 millisecond'"
               " WHERE status = 'pending' AND not_before IS NOT NULL AND not_before < 'infinity'")


def opened(db: psycopg.Connection, schedules: int = 5, expr: str = YEARLY) -> list[str]:
    """`schedules` schedules of the down function, each run failed once: the breaker is open;
    their retries are due."""
    sids = [add(db, expr=expr) for _ in range(schedules)]
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    fail(db, claim(db, "w", 100))
    probe_due(db)
    db.execute("UPDATE dispatch.breakers SET next_probe_at = now() + interval '1 hour' WHERE state = 'open'")
    return sids


def spacing_of_last_probe(db: psycopg.Connection) -> timedelta:
    """From the last probe's claim to the instant the next one may go."""
    return scalar(db, "SELECT b.next_probe_at - r.claimed_at FROM dispatch.breakers b"
                      " JOIN dispatch.runs r ON r.id = b.probe_run_id WHERE b.function_name = %s", (DOWN,))


def audit(db: psycopg.Connection, action: str) -> list[tuple[str | None, dict[str, Any]]]:
    return [(a, m) for a, m in db.execute(
        "SELECT actor_id, metadata FROM dispatch.audit_log WHERE action = %s ORDER BY id", (action,))]


def test_opens_at_the_threshold_and_its_runs_wait_without_using_attempts(db: psycopg.Connection) -> None:
    # the documented defaults
    settings = db.execute("SELECT breaker_threshold, breaker_window, breaker_probe_spacing,"
                          " breaker_probe_spacing_max FROM dispatch.settings").fetchone()
    assert settings == (5, timedelta(minutes=5), timedelta(seconds=1), timedelta(seconds=10))
    # spacing doubles from 1 s, capped at 10 s
    assert [scalar(db, "SELECT extract(epoch FROM dispatch._probe_spacing(%s))::float8", (n,))
            for n in range(6)] == [1, 2, 4, 8, 10, 10]
    sids = [add(db) for _ in range(5)]
    healthy = add(db, "healthy")
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    runs = claim(db, "w", 100)
    down = [r for r in runs if r[3] == DOWN]
    fail(db, down[:4])
    assert breaker(db)["state"] == "closed" and breaker(db)["failures"] == 4
    assert audit(db, "breaker.open") == []
    fail(db, down[4:])
    b = breaker(db)
    assert b["state"] == "open" and b["failures"] == 5 and b["probes"] == 0
    [(actor, meta)] = audit(db, "breaker.open")
    assert actor is None and meta["functionName"] == DOWN and meta["failures"] == 5 and meta["threshold"] == 5
    assert "503" in meta["error"]
    # the first probe goes a spacing after it opened
    first = scalar(db, "SELECT next_probe_at - opened_at FROM dispatch.breakers WHERE function_name = %s",
                   (DOWN,))
    assert timedelta(seconds=0.75) <= first <= timedelta(seconds=1)  # less up to a quarter, at random

    # their retries come due before the probe: they wait, their attempts kept, not failed
    db.execute("UPDATE dispatch.runs SET not_before = now() - interval '1 millisecond'"
               " WHERE status = 'pending'")
    assert claim(db, "w", 100) == []
    for run in down:
        row = run_row(db, run[0])
        assert row["status"] == "pending" and row["held_by_breaker"] and row["attempt"] == 1
        assert row["not_before"] >= b["next_probe_at"]
    # a healthy function of the same project goes as usual
    [h] = [r for r in runs if r[3] == "healthy"]
    assert complete(db, h)[0]
    assert scalar(db, "SELECT last_status FROM dispatch.schedules WHERE id = %s", (healthy,)) == "ok"
    states = db.execute("SELECT function_name, state, failures, probe_out, waiting"
                        " FROM dispatch.breaker_states()").fetchall()
    assert states == [(DOWN, "open", 5, False, 5)]
    assert len(sids) == 5


def test_one_probe_at_a_time_spaced_doubling_then_an_answer_closes_it(db: psycopg.Connection) -> None:
    opened(db)
    probe_due(db)
    [probe] = claim(db, "w", 100)  # one run goes: the probe; the others wait for its outcome
    assert probe[7] == 2
    b = breaker(db)
    assert b["probes"] == 1 and b["probe_run_id"] == probe[0]
    assert timedelta(seconds=1.5) <= spacing_of_last_probe(db) <= timedelta(seconds=2)
    assert scalar(db, "SELECT count(*) FROM dispatch.runs WHERE held_by_breaker AND status = 'pending'") == 4
    # however late, nothing else goes while the probe is out
    probe_due(db)
    assert claim(db, "w", 100) == []

    # the probe fails: the next one goes at next_probe_at, taken from the waiting runs
    fail(db, [probe])
    b = breaker(db)
    assert b["state"] == "open" and b["probes"] == 1
    assert scalar(db, "SELECT count(*) FROM dispatch.runs WHERE held_by_breaker AND status = 'pending'"
                      " AND not_before = %s", (b["next_probe_at"],)) == 1
    probe_due(db)
    [second] = claim(db, "w", 100)
    assert timedelta(seconds=3) <= spacing_of_last_probe(db) <= timedelta(seconds=4)

    # it answers: closed, audited, and every waiting run goes at once, its attempts kept
    assert complete(db, second)[0]
    b = breaker(db)
    assert b["state"] == "closed" and b["failures"] == 0 and b["next_probe_at"] is None
    [(actor, meta)] = audit(db, "breaker.close")
    assert actor is None and meta["reason"] == "answered" and meta["probes"] == 2
    assert meta["runId"] == second[0]
    rest = claim(db, "w", 100)
    assert len(rest) == 4
    # the runs that waited: one attempt before the breaker opened, none while they waited
    waited = [r for r in rest if r[0] not in (probe[0], second[0])]
    assert len(waited) >= 3 and all(r[7] - run_row(db, r[0])["released"] == 2 for r in waited)
    for run in rest:
        assert complete(db, run)[0]
    # each slot one run, each finished ok, one audit row each
    assert db.execute("SELECT count(*), count(DISTINCT (schedule_id, scheduled_for)), bool_and(status = 'ok')"
                      " FROM dispatch.runs").fetchone() == (5, 5, True)
    assert scalar(db, "SELECT count(*) FROM dispatch.audit_log WHERE action = 'schedule.run.ok'") == 5


def test_a_final_answer_closes_it_too_and_failures_spread_beyond_the_window_do_not_open_it(
        db: psycopg.Connection) -> None:
    db.execute("UPDATE dispatch.settings SET breaker_threshold = 2, breaker_window = '1 hour'")
    [add(db) for _ in range(3)]
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    a, b, c = claim(db, "w", 100)
    fail(db, [a])
    # the streak's first failure is older than the window: it starts again
    db.execute("UPDATE dispatch.breakers SET failing_since = now() - interval '2 hours'")
    fail(db, [b])
    assert breaker(db)["state"] == "closed" and breaker(db)["failures"] == 1
    # a 4xx is an answer: the count starts from nothing
    fail(db, [c], retryable=False)
    assert breaker(db)["failures"] == 0
    assert audit(db, "breaker.open") == []


def test_only_one_probe_across_concurrent_claimers(db: psycopg.Connection, connect: Connect) -> None:
    opened(db, schedules=8)
    probe_due(db)
    # forced: a claimer holds the breaker in an open transaction while it hands out the probe
    first = connect(autocommit=False)
    [probe] = claim(first, "a", 100)
    other = connect()
    other.execute("SET lock_timeout = '3s'")  # a claim never waits on the breaker
    assert claim(other, "b", 100) == []
    first.commit()
    probe_due(db)
    assert claim(other, "b", 100) == []  # the probe is out

    # and raced: eight sessions claim at once when the next probe is due
    fail(db, [probe])
    probe_due(db)
    sessions = [connect() for _ in range(8)]
    barrier = threading.Barrier(len(sessions))
    got: list[int] = []

    def race(conn: psycopg.Connection) -> None:
        barrier.wait()
        got.append(len(claim(conn, f"w{conn.info.backend_pid}", 100)))

    threads = [threading.Thread(target=race, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == [0] * 7 + [1]
    assert breaker(db)["probes"] == 2


def test_an_outcome_whose_breaker_a_claim_holds_is_busy_not_waited_on(
        db: psycopg.Connection, connect: Connect) -> None:
    """Invariant 3: complete_runs never waits on a row another transaction holds. A claim that
    hands out a probe holds its breaker's row until it commits (in psql, as long as it stays
    open); an outcome that must count a failure on it, or close it, is busy meanwhile."""
    db.execute("UPDATE dispatch.settings SET breaker_threshold = 1")
    [add(db) for _ in range(3)]
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    first, second, third = claim(db, "w", 100)
    fail(db, [first])
    assert breaker(db)["state"] == "open"
    probe_due(db)
    user = connect(autocommit=False)
    [probe] = claim(user, "psql", 1)
    assert probe[0] == first[0]
    listener = connect()
    listener.execute("SET lock_timeout = '3s'")
    answered = (second[0], second[7], "ok", None)
    failed = (third[0], third[7], "error", "HTTP 503: down")
    assert complete_many(listener, "w", [answered, failed]) == [
        (second[0], False, False, True), (third[0], False, False, True)]
    assert {run_row(db, r[0])["status"] for r in (second, third)} == {"running"}
    user.commit()
    assert complete_many(listener, "w", [answered]) == [(second[0], True, True, False)]
    assert breaker(db)["state"] == "closed"


def test_completions_of_a_healthy_function_do_not_make_each_other_busy(
        db: psycopg.Connection, connect: Connect) -> None:
    """Only the breakers an outcome writes are locked: while another function's breaker counts a
    failure, two overlapping completions of a function whose breaker is closed and counts
    nothing are both recorded."""
    [add(db, "healthy") for _ in range(2)]
    add(db)
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    runs = claim(db, "w", 100)
    ours = [r for r in runs if r[3] == "healthy"]
    [down] = [r for r in runs if r[3] == DOWN]
    fail(db, [down])
    assert breaker(db)["failures"] == 1
    db.execute("INSERT INTO dispatch.breakers (project_id, function_name) VALUES ('proj_1', 'healthy')")
    first, other = connect(autocommit=False), connect()
    other.execute("SET lock_timeout = '3s'")
    for session, run in zip((first, other), ours, strict=True):  # the first one's stays open
        assert complete_many(session, "w", [(run[0], run[7], "ok", None)]) == [(run[0], True, True, False)]
    first.commit()


def test_misfire_grace_ends_a_waiting_first_attempt_and_a_retry_keeps_its_policy(
        db: psycopg.Connection) -> None:
    opened(db, expr="0 * * * *")
    late = add(db, expr="0 * * * *", misfire_grace="10 minutes")
    db.execute("UPDATE dispatch.schedules SET next_run_at = date_trunc('minute', now())"
               " - interval '2 minutes' WHERE id = %s", (late,))
    db.execute("SELECT dispatch.tick()")
    assert claim(db, "w", 100) == []  # it waits with the others
    [waiting] = db.execute("SELECT id FROM dispatch.runs WHERE schedule_id = %s", (late,)).fetchall()
    assert run_row(db, waiting[0])["held_by_breaker"]
    # its grace runs out while it waits: skipped when next looked at, never invoked
    db.execute("UPDATE dispatch.runs SET fire_at = fire_at - interval '1 hour', scheduled_for = scheduled_for"
               " - interval '1 hour' WHERE id = %s", (waiting[0],))
    probe_due(db)
    db.execute("UPDATE dispatch.breakers SET next_probe_at = now() + interval '1 hour'")
    assert claim(db, "w", 100) == []
    row = run_row(db, waiting[0])
    assert row["status"] == "skipped" and row["error"].startswith("missed by") and row["attempt"] == 0
    # a waiting retry past its schedule's next slot ends error, by its retry policy
    db.execute("UPDATE dispatch.runs SET scheduled_for = scheduled_for - interval '1 hour', fire_at = fire_at"
               " - interval '1 hour' WHERE status = 'pending'")
    probe_due(db)
    db.execute("UPDATE dispatch.breakers SET next_probe_at = now() + interval '1 hour'")
    assert claim(db, "w", 100) == []
    assert db.execute("SELECT count(*), bool_and(error LIKE '%not retried: the next slot came first')"
                      " FROM dispatch.runs WHERE status = 'error'").fetchone() == (5, True)


def test_the_slots_passed_while_a_run_waits_are_an_overlap_gap(db: psycopg.Connection) -> None:
    opened(db)
    sid = add(db, expr="* * * * *")
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    assert claim(db, "w", 100) == []
    # it waited five minutes: its slot is that old
    db.execute("UPDATE dispatch.runs SET scheduled_for = scheduled_for - interval '5 minutes',"
               " fire_at = fire_at - interval '5 minutes' WHERE schedule_id = %s", (sid,))
    db.execute("UPDATE dispatch.schedules SET next_run_at = next_run_at - interval '5 minutes' WHERE id = %s",
               (sid,))
    db.execute("SELECT dispatch.reset_breaker('proj_1', %s)", (DOWN,))
    for run in claim(db, "w", 100):
        assert complete(db, run)[0]
    # Five minutes of slots, or six when a minute began since the tick. (A tick in the first
    # second of a minute finds make_due's slot a minute old, and records that one as catch-up.)
    [gap] = [m for _, m in audit(db, "schedule.slots.skipped")
             if m["scheduleId"] == sid and m["reason"] == "overlap"]
    slot, next_at = db.execute(
        "SELECT r.scheduled_for, s.next_run_at FROM dispatch.runs r"
        " JOIN dispatch.schedules s ON s.id = r.schedule_id WHERE s.id = %s", (sid,)).fetchone()
    assert gap["count"] == (next_at - slot) // timedelta(minutes=1) - 1 >= 5


def test_an_operator_sees_and_resets_it(db: psycopg.Connection) -> None:
    opened(db)
    assert claim(db, "w", 100) == []
    db.execute("DROP ROLE IF EXISTS pgdispatch_op_admin")
    db.execute("CREATE ROLE pgdispatch_op_admin LOGIN IN ROLE dispatch_admin")
    db.execute("DROP ROLE IF EXISTS pgdispatch_op_reader")
    db.execute("CREATE ROLE pgdispatch_op_reader LOGIN IN ROLE dispatch_reader")
    params = db.info.get_parameters()
    try:
        with psycopg.connect(**{**params, "user": "pgdispatch_op_reader"}, autocommit=True) as reader:
            assert reader.execute("SELECT state FROM dispatch.breakers WHERE function_name = %s",
                                  (DOWN,)).fetchone() == ("open",)
            assert reader.execute("SELECT waiting FROM dispatch.breaker_states()").fetchone() == (5,)
            with pytest.raises(errors.InsufficientPrivilege):
                reader.execute("SELECT dispatch.reset_breaker('proj_1', %s)", (DOWN,))
        with psycopg.connect(**{**params, "user": "pgdispatch_op_admin"}, autocommit=True) as admin:
            with pytest.raises(errors.InsufficientPrivilege):
                admin.execute("UPDATE dispatch.breakers SET state = 'closed'")
            assert scalar(admin, "SELECT dispatch.reset_breaker('proj_1', %s)", (DOWN,)) == "open"
            with pytest.raises(errors.NoDataFound, match="function nope of project proj_1 has no breaker"):
                admin.execute("SELECT dispatch.reset_breaker('proj_1', 'nope')")
            assert scalar(admin, "SELECT dispatch.reset_breaker('proj_1', %s)", (DOWN,)) == "closed"
    finally:
        db.execute("DROP ROLE pgdispatch_op_admin")
        db.execute("DROP ROLE pgdispatch_op_reader")
    [(actor, meta)] = audit(db, "breaker.close")
    assert actor == "pgdispatch_op_admin" and meta["reason"] == "reset"
    assert [a for a, _ in audit(db, "breaker.reset")] == ["pgdispatch_op_admin"]
    # the waiting runs went at once
    assert len(claim(db, "w", 100)) == 5
    assert db.execute("SELECT * FROM dispatch.breaker_states()").fetchall() == []


def test_final_errors_count_nothing_and_threshold_zero_turns_breakers_off(db: psycopg.Connection) -> None:
    [add(db) for _ in range(8)]
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    runs = claim(db, "w", 100)
    assert all(r[1] for r in complete_many(db, "w", [(r[0], r[7], "error", "boom") for r in runs]))
    assert scalar(db, "SELECT count(*) FROM dispatch.breakers") == 0
    # breakers off: retryable failures open nothing
    db.execute("UPDATE dispatch.settings SET breaker_threshold = 0")
    [add(db, "other") for _ in range(8)]
    db.execute("UPDATE dispatch.schedules SET next_run_at = date_trunc('minute', now())"
               " WHERE function_name = 'other'")
    db.execute("SELECT dispatch.tick()")
    fail(db, claim(db, "w", 100))
    assert scalar(db, "SELECT count(*) FROM dispatch.breakers") == 0
    probe_due(db)
    assert len(claim(db, "w", 100)) == 8
