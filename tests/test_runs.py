"""Runs: tick marks, claim_runs hands out, complete_run records and advances; leases expire
to a retry or to lost. Concurrency is exercised with real concurrent sessions."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import psycopg
import pytest
from psycopg import errors

from tests.runs_kit import add_schedule, claim, complete, complete_many, expire, make_due, release, scalar

Connect = Callable[..., psycopg.Connection]


def test_tick_marks_due_slots_once(db: psycopg.Connection) -> None:
    sid = add_schedule(db)
    add_schedule(db, enabled=False)
    assert scalar(db, "SELECT dispatch.tick()") == 0  # nothing due yet
    make_due(db)
    assert scalar(db, "SELECT dispatch.tick()") == 1
    assert scalar(db, "SELECT dispatch.tick()") == 0
    assert scalar(db, "SELECT dispatch.tick(now() + interval '1 hour')") == 0  # slot held while open
    row = db.execute(
        "SELECT schedule_id, status, attempt, request_id, scheduled_for FROM dispatch.runs"
    ).fetchall()
    assert len(row) == 1
    assert str(row[0][0]) == sid
    assert row[0][1:3] == ("pending", 0)
    assert row[0][3].startswith("sched_")
    assert len(row[0][3]) == len("sched_") + 36
    assert scalar(db, "SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (sid,)) == row[0][4]


def test_tick_horizon_marks_future_slots(db: psycopg.Connection) -> None:
    add_schedule(db, "0 0 1 1 *")
    assert scalar(db, "SELECT dispatch.tick(now() + interval '400 days')") == 1


def test_tick_notifies_when_it_marks(db: psycopg.Connection, connect: Connect) -> None:
    listener = connect()
    listener.execute("LISTEN dispatch")
    add_schedule(db)
    assert next(listener.notifies(timeout=5, stop_after=1)).payload == "schedules"
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    note = next(listener.notifies(timeout=5, stop_after=1))
    assert note.payload == '{"marked" : 1, "requeued" : 0}'


def test_concurrent_ticks_never_mark_a_slot_twice(db: psycopg.Connection, connect: Connect) -> None:
    db.execute(
        "INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
        " SELECT 'p' || g % 7, 'fn', '* * * * *' FROM generate_series(1, 300) g"
    )
    make_due(db)
    sessions = [connect(autocommit=False) for _ in range(4)]
    barrier = threading.Barrier(len(sessions))
    marked: list[int] = []
    failures: list[BaseException] = []

    def tick(conn: psycopg.Connection) -> None:
        try:
            barrier.wait()
            marked.append(scalar(conn, "SELECT dispatch.tick()"))
            conn.commit()
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=tick, args=(c,)) for c in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert sum(marked) == 300
    assert scalar(db, "SELECT count(*) FROM dispatch.runs") == 300


def test_tick_chunk_marks_at_most_its_size_and_leaves_policies_to_tick(db: psycopg.Connection) -> None:
    for _ in range(10):
        add_schedule(db)
    allow = add_schedule(db, overlap="allow")  # run policies decide: only tick() marks it
    make_due(db)
    chunks = [db.execute("SELECT marked, taken FROM dispatch.tick_chunk(4)").fetchone() for _ in range(4)]
    assert chunks == [(4, 4), (4, 4), (2, 2), (0, 0)]
    assert scalar(db, "SELECT count(*) FROM dispatch.runs WHERE schedule_id = %s", (allow,)) == 0
    assert scalar(db, "SELECT dispatch.tick()") == 1
    assert scalar(db, "SELECT count(*) FROM dispatch.runs") == 11
    with pytest.raises(errors.InvalidParameterValue, match="max_runs must be 1 or more"):
        db.execute("SELECT dispatch.tick_chunk(0)")


def test_a_chunk_moves_a_schedule_past_a_slot_that_already_finished(db: psycopg.Connection) -> None:
    # A run that finished on the slot while the schedule stayed on it (here a skipped one, as a
    # back-off instant writes): the chunk's first statement only counts open runs, so it takes
    # the schedule, and the second sees the run on the slot and hands it to the policies, which
    # move it on. The next chunk finds nothing: no schedule is taken twice.
    sid = add_schedule(db)
    make_due(db)
    slot = scalar(db, "SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (sid,))
    db.execute("INSERT INTO dispatch.runs (schedule_id, project_id, scheduled_for, fire_at, status,"
               " finished_at, error) SELECT id, project_id, next_run_at, next_run_at, 'skipped', now(),"
               " 'finished already' FROM dispatch.schedules WHERE id = %s", (sid,))
    assert db.execute("SELECT marked, taken FROM dispatch.tick_chunk(10)").fetchone() == (0, 1)
    assert scalar(db, "SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (sid,)) > slot
    assert db.execute("SELECT marked, taken FROM dispatch.tick_chunk(10)").fetchone() == (0, 0)
    assert scalar(db, "SELECT count(*) FROM dispatch.runs WHERE schedule_id = %s", (sid,)) == 1


def test_a_chunk_held_open_is_skipped_not_waited_for(db: psycopg.Connection, connect: Connect) -> None:
    # Invariant 3: another tick's chunk (or a user's transaction) holding due schedules delays
    # only those; the rest are marked at once, and nothing is marked twice.
    for _ in range(10):
        add_schedule(db)
    make_due(db)
    holder = connect(autocommit=False)
    assert holder.execute("SELECT * FROM dispatch.tick_chunk(4)").fetchone() == (4, 4)
    other = connect()
    other.execute("SET statement_timeout = '5s'")  # waiting would fail the test, not hang it
    assert other.execute("SELECT * FROM dispatch.tick_chunk(100)").fetchone() == (6, 6)
    assert scalar(other, "SELECT dispatch.tick()") == 0
    holder.commit()
    assert scalar(db, "SELECT count(*), count(DISTINCT schedule_id) FROM dispatch.runs") == 10
    assert scalar(db, "SELECT count(DISTINCT schedule_id) FROM dispatch.runs") == 10


def test_concurrent_claims_never_return_the_same_run(db: psycopg.Connection, connect: Connect) -> None:
    db.execute(
        "INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
        " SELECT 'p', 'fn', '* * * * *' FROM generate_series(1, 400)"
    )
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    # Two open transactions claim at once: the first holds its rows, the second skips them.
    a, b = connect(autocommit=False), connect(autocommit=False)
    first = {r[0] for r in claim(a, "a", 150)}
    second = {r[0] for r in claim(b, "b", 150)}
    assert len(first) == len(second) == 150
    assert first.isdisjoint(second)
    a.commit()
    b.commit()
    # Then many sessions race until nothing is left.
    sessions = [connect() for _ in range(4)]
    got: list[list[int]] = [[] for _ in sessions]

    def drain(i: int) -> None:
        while rows := claim(sessions[i], f"w{i}", 7):
            got[i].extend(r[0] for r in rows)

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(len(sessions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [*first, *second, *(r for g in got for r in g)]
    assert len(everything) == len(set(everything)) == 400


def test_claim_returns_what_an_invocation_needs_oldest_first(db: psycopg.Connection) -> None:
    old = add_schedule(db, args='{"k": [1, 2]}')
    new = add_schedule(db)
    db.execute(
        "UPDATE dispatch.schedules SET next_run_at = now() - interval '5 minutes' WHERE id = %s", (old,)
    )
    db.execute(
        "UPDATE dispatch.schedules SET next_run_at = now() - interval '1 minute' WHERE id = %s", (new,)
    )
    db.execute("SELECT dispatch.tick()")
    cur = db.execute("SELECT * FROM dispatch.claim_runs('w', 1, '45 seconds')")
    assert [c.name for c in cur.description or []] == [
        "run_id", "schedule_id", "project_id", "function_name", "args",
        "request_id", "scheduled_for", "attempt", "lease_until", "timeout", "fire_at", "kind", "traceparent",
    ]  # fmt: skip
    (run,) = cur.fetchall()
    assert str(run[1]) == old
    assert run[2:5] == ("proj_1", "fn", {"k": [1, 2]})
    assert run[7] == 1
    lease = scalar(db, "SELECT lease_until - claimed_at FROM dispatch.runs WHERE id = %s", (run[0],))
    assert lease.total_seconds() == 45
    with pytest.raises(errors.InvalidParameterValue, match=r"^lease must be longer than default_timeout"):
        claim(db, "w", 1, "0 seconds")


def test_complete_records_advances_and_audits(db: psycopg.Connection) -> None:
    sid = add_schedule(db, "*/10 * * * *")
    make_due(db, "25 minutes")  # two slots were missed meanwhile: they are skipped, not piled up
    db.execute("SELECT dispatch.tick()")
    (run,) = claim(db, "w1")
    assert complete(db, run, "w1", "error", error="E" * 600, http_status=500, duration_ms=42) == (
        True,
        True,
        False,
    )
    status, error, http_status, duration = db.execute(
        "SELECT status, error, http_status, duration_ms FROM dispatch.runs WHERE id = %s", (run[0],)
    ).fetchone()  # type: ignore[misc]
    assert (status, len(error), http_status, duration) == ("error", 500, 500, 42)
    assert scalar(
        db,
        "SELECT next_run_at = dispatch.cron_next('*/10 * * * *', now(), 'UTC') AND last_status = 'error'"
        " AND length(last_error) = 500 FROM dispatch.schedules WHERE id = %s",
        (sid,),
    )
    action, metadata = db.execute(
        "SELECT action, metadata FROM dispatch.audit_log WHERE action LIKE 'schedule.run.%'"
    ).fetchone()  # type: ignore[misc]
    assert action == "schedule.run.error"
    assert metadata["scheduleId"] == sid
    assert metadata["requestId"] == run[5]
    assert metadata["functionName"] == "fn"
    assert metadata["error"] == "E" * 500
    # completing again changes nothing
    assert complete(db, run, "w1", "ok") == (False, False, False)
    assert scalar(db, "SELECT count(*) FROM dispatch.audit_log WHERE action LIKE 'schedule.run.%'") == 1


def test_ok_audit_has_no_error_key(db: psycopg.Connection) -> None:
    # A first attempt that ended ok is the audit's common case, built apart from the others
    # (nothing to strip, no attempts to list): the same keys as they would give, no more.
    sid = add_schedule(db)
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    (run,) = claim(db, "w")
    assert complete(db, run, "w", "ok", http_status=200) == (True, True, False)
    metadata = scalar(db, "SELECT metadata FROM dispatch.audit_log WHERE action = 'schedule.run.ok'")
    assert metadata == {
        "scheduleId": sid, "requestId": run[5], "functionName": "fn", "runId": run[0],
        "scheduledFor": scalar(db, "SELECT to_jsonb(%s::timestamptz)", (run[6],)), "attempt": 1,
    }


def test_complete_refuses_a_status_it_does_not_know(db: psycopg.Connection) -> None:
    with pytest.raises(errors.InvalidParameterValue, match="status must be ok or error"):
        complete(db, (1, None, None, None, None, None, None, 1), "w", "lost")


def test_a_late_outcome_is_fenced_by_its_attempt_whatever_the_worker(db: psycopg.Connection) -> None:
    """Fencing: the attempt claim_runs returned, not the worker's name, decides (two replicas
    configured with the same worker id, as docker/compose.yaml once did)."""
    add_schedule(db)
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    (run,) = claim(db, "same-name", lease="10 milliseconds")
    expire(db, run[0])
    (again,) = claim(db, "same-name")
    assert again[0] == run[0]
    assert again[5] == run[5]  # same request id: the idempotency key
    assert again[7] == run[7] + 1 == 2
    assert complete(db, run, "same-name", "error") == (False, False, False)
    assert release(db, "same-name", [run]) == 0
    assert (
        scalar(db, "SELECT status || ' ' || attempt FROM dispatch.runs WHERE id = %s", (run[0],))
        == "running 2"
    )
    assert complete(db, again, "another-name", "ok") == (True, True, False)
    assert scalar(db, "SELECT status FROM dispatch.runs WHERE id = %s", (run[0],)) == "ok"


def test_edit_mid_flight_wins_but_the_run_is_recorded(db: psycopg.Connection) -> None:
    sid = add_schedule(db)
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    (run,) = claim(db, "w")
    db.execute("UPDATE dispatch.schedules SET cron_expression = '0 12 * * *' WHERE id = %s", (sid,))
    edited = scalar(db, "SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (sid,))
    # the new slot is not marked while the old run is open: no overlap
    assert scalar(db, "SELECT dispatch.tick(%s)", (edited,)) == 0
    assert complete(db, run, "w", "ok") == (True, False, False)
    assert db.execute(
        "SELECT next_run_at, last_status FROM dispatch.schedules WHERE id = %s", (sid,)
    ).fetchone() == (edited, "ok")
    assert scalar(db, "SELECT status FROM dispatch.runs WHERE id = %s", (run[0],)) == "ok"


def test_expired_lease_retries_then_ends_lost(db: psycopg.Connection, connect: Connect) -> None:
    sid = add_schedule(db, max_attempts=2)
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    listener = connect()
    listener.execute("LISTEN dispatch")
    (run,) = claim(db, "w1", lease="10 milliseconds")
    expire(db, run[0])
    status, attempt, request_id, error = db.execute(
        "SELECT status, attempt, request_id, error FROM dispatch.runs WHERE id = %s", (run[0],)
    ).fetchone()  # type: ignore[misc]
    assert (status, attempt, request_id) == ("pending", 1, run[5])
    assert error == "lease of w1 expired on attempt 1"
    assert next(listener.notifies(timeout=5, stop_after=1)).payload == '{"marked" : 0, "requeued" : 1}'

    (run2,) = claim(db, "w2", lease="10 milliseconds")
    assert run2[7] == 2
    expire(db, run[0])
    assert db.execute("SELECT status, error FROM dispatch.runs WHERE id = %s", (run[0],)).fetchone() == (
        "lost",
        "lease of w2 expired on attempt 2 of 2",
    )
    assert scalar(
        db,
        "SELECT last_status = 'lost' AND next_run_at > now() FROM dispatch.schedules WHERE id = %s",
        (sid,),
    )
    metadata = scalar(db, "SELECT metadata FROM dispatch.audit_log WHERE action = 'schedule.run.lost'")
    assert metadata["requestId"] == run[5]
    assert metadata["error"] == "lease of w2 expired on attempt 2 of 2"
    # the schedule moved on: its next slot (another one than the lost one) gets marked normally
    assert scalar(db, "SELECT dispatch.tick(next_run_at) FROM dispatch.schedules WHERE id = %s", (sid,)) == 1


def test_release_hands_the_run_back_and_counts_the_claim_as_released(db: psycopg.Connection) -> None:
    add_schedule(db)
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    (run,) = claim(db, "w")
    assert release(db, "w", [(*run[:7], run[7] + 1)]) == 0  # not the attempt it holds
    assert release(db, "other", [run]) == 1  # the worker's name is informational
    assert db.execute(
        "SELECT status, attempt, released, worker FROM dispatch.runs WHERE id = %s", (run[0],)
    ).fetchone() == ("pending", 1, 1, None)


STOPS = [("UPDATE dispatch.schedules SET enabled = false WHERE id = %s", "disabled"),
         ("UPDATE dispatch.schedules SET deleted_at = now() WHERE id = %s", "deleted"),
         ("DELETE FROM dispatch.schedules WHERE id = %s", "deleted"),
         ("SELECT dispatch.pause(%s, 'maintenance')", "paused")]


@pytest.mark.parametrize(("stop", "reason"), STOPS)
def test_stopping_a_schedule_skips_what_it_had_pending(
    db: psycopg.Connection, stop: str, reason: str
) -> None:
    sid = add_schedule(db)
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    db.execute(stop, (sid,))
    assert db.execute("SELECT status, error FROM dispatch.runs").fetchone() == (
        "skipped",
        f"schedule {reason} before the run was claimed",
    )
    assert claim(db, "w") == []
    assert scalar(db, "SELECT count(*) FROM dispatch.audit_log WHERE action = 'schedule.run.skipped'") == 1


@pytest.mark.parametrize(("stop", "reason"), STOPS)
def test_a_lease_expiring_on_a_stopped_schedule_ends_lost_not_skipped(
    db: psycopg.Connection, stop: str, reason: str
) -> None:
    """Issue scenario 2: the run may have been invoked, so its outcome is unknown: lost, with
    the reason, and never retried (DESIGN, Delivery)."""
    sid = add_schedule(db)
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    (run,) = claim(db, "w", lease="10 milliseconds")
    db.execute(stop, (sid,))
    expire(db, run[0])
    assert db.execute("SELECT status, error FROM dispatch.runs WHERE id = %s", (run[0],)).fetchone() == (
        "lost", f"lease of w expired on attempt 1 after the schedule was {reason}: it may have run")
    assert claim(db, "w") == []
    audited = "SELECT action FROM dispatch.audit_log WHERE metadata->>'runId' = %s"
    assert scalar(db, audited, (str(run[0]),)) == "schedule.run.lost"
    assert scalar(db, "SELECT last_status || ' ' || (next_run_at IS NULL) FROM dispatch.schedules"
                      " WHERE id = %s", (sid,)) == "lost true"


def test_every_finished_run_has_exactly_one_audit_row(db: psycopg.Connection) -> None:
    db.execute(
        "INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, max_attempts)"
        " SELECT 'p', 'fn', '* * * * *', 1 FROM generate_series(1, 40)"
    )
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    runs = claim(db, "w", 30, lease="10 milliseconds")
    for i, run in enumerate(runs[:20]):
        complete(db, run, "w", "ok" if i % 2 else "error", error=None if i % 2 else "boom")
    expire(db, runs[-1][0])  # the 10 not completed end lost
    db.execute("UPDATE dispatch.schedules SET enabled = false")  # the 10 unclaimed end skipped
    by_status = dict(db.execute("SELECT status, count(*) FROM dispatch.runs GROUP BY 1").fetchall())
    assert by_status == {"ok": 10, "error": 10, "lost": 10, "skipped": 10}
    assert (
        scalar(
            db,
            "SELECT count(*) FROM dispatch.runs r JOIN dispatch.audit_log a"
            " ON a.metadata->>'runId' = r.id::text AND a.action = 'schedule.run.' || r.status",
        )
        == 40
    )
    assert scalar(db, "SELECT count(*) FROM dispatch.audit_log WHERE action LIKE 'schedule.run.%'") == 40


def test_claiming_pending_runs_uses_the_pending_index(db: psycopg.Connection) -> None:
    db.execute("SET enable_seqscan = off")  # the table is tiny here; ask which index the plan would use
    plan = "\n".join(
        r[0]
        for r in db.execute(
            "EXPLAIN SELECT r.id FROM dispatch.runs r WHERE r.project_id = 'p' AND r.status = 'pending'"
            " AND r.not_before IS NULL ORDER BY r.project_id, r.scheduled_for, r.id LIMIT 10"
            " FOR UPDATE SKIP LOCKED"
        ).fetchall()
    )
    assert "runs_project_pending_idx" in plan
    due = "\n".join(
        r[0]
        for r in db.execute("EXPLAIN SELECT id FROM dispatch.schedules WHERE next_run_at <= now()").fetchall()
    )
    assert "schedules_next_run_at_idx" in due


def _schedules_with_history(db: psycopg.Connection) -> None:
    """3,000 schedules that are not due, with 15,000 finished runs."""
    db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
               " SELECT 'p', 'f', '0 0 1 1 *' FROM generate_series(1, 3000)")
    db.execute("INSERT INTO dispatch.runs"
               " (schedule_id, project_id, scheduled_for, status, attempt, finished_at)"
               " SELECT s.id, s.project_id, now() - k * interval '1 day', 'ok', 1, now()"
               " FROM dispatch.schedules s CROSS JOIN generate_series(1, 5) k")


def _statistics_as_the_autovacuum_left_them(db: psycopg.Connection, rows: int = 1) -> None:
    """What an autovacuum that ran while a chunk was being inserted leaves: the table's pages, and
    a row (or none) in them."""
    db.execute("UPDATE pg_class SET relpages = pg_relation_size(oid) / 8192, reltuples = %s"
               " WHERE oid = 'dispatch.runs'::regclass", (rows,))


def _index_entries_read(db: psycopg.Connection, index: str | None = None) -> int:
    """Entries read so far from an index of dispatch.runs (None: from all of them)."""
    db.execute("SELECT pg_stat_force_next_flush()")
    return int(scalar(db, "SELECT sum(idx_tup_read) FROM pg_stat_user_indexes WHERE schemaname = 'dispatch'"
                          " AND relname = 'runs' AND indexrelname = coalesce(%s, indexrelname)", (index,)))


def test_claim_and_completion_find_runs_by_id_whatever_the_statistics_say(db: psycopg.Connection) -> None:
    """An autovacuum that runs while a big chunk of runs is being inserted counts none of them,
    and leaves the planner sure that runs is empty: a plan made then scanned the whole of
    runs_slot_key for every claim (65 ms each in a stampede). Claims and completions go by id."""
    _schedules_with_history(db)
    make_due(db)
    assert scalar(db, "SELECT dispatch.tick()") == 3000
    _statistics_as_the_autovacuum_left_them(db)

    before = _index_entries_read(db, "runs_slot_key")
    for _ in range(8):  # past the five custom plans PL/pgSQL makes before it may keep a generic one
        runs = claim(db, "w", 100)
        assert len(runs) == 100
        results = complete_many(db, "w", [(run[0], run[7], "ok", None) for run in runs])
        assert all(recorded for _, recorded, *_ in results)
    read = _index_entries_read(db, "runs_slot_key") - before
    assert read < 3000, "a claim or a completion scanned runs_slot_key"


def test_completions_never_scan_runs_whatever_the_statistics_say(db: psycopg.Connection) -> None:
    """complete_runs finds its runs where its fence found them (their ctids). With statistics
    that say runs is all but empty, which claims that insert a stampede's runs in small batches
    leave behind them, a plan made then scanned the whole table for each batch instead: 6.3
    against 1.6 ms a batch of 64 with 6,000 runs, and more as the table grew. (A small table: for
    a big one, the ctids are cheaper than a scan whatever the statistics say.)"""
    db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
               " SELECT 'p', 'f', '0 0 1 1 *' FROM generate_series(1, 3000)")
    make_due(db)
    assert scalar(db, "SELECT dispatch.tick()") == 3000
    # as a fresh install's runs stands before its first autovacuum
    db.execute("UPDATE pg_class SET relpages = 0, reltuples = -1 WHERE oid = 'dispatch.runs'::regclass")
    scans = 0
    for _ in range(8):  # past the five custom plans PL/pgSQL makes before it may keep a generic one
        runs = claim(db, "w", 100)
        assert len(runs) == 100
        before = _scans_of_runs(db)
        results = complete_many(db, "w", [(run[0], run[7], "ok", None) for run in runs])
        scans += _scans_of_runs(db) - before
        assert all(recorded for _, recorded, *_ in results)
    assert scans == 0


@pytest.mark.parametrize("statistics", ["autovacuum mid-chunk", "never analyzed", "analyzed empty",
                                        "analyzed with none pending", "right"])
def test_claims_and_completions_over_many_projects_read_what_they_take_whatever_the_statistics_say(
    db: psycopg.Connection, statistics: str
) -> None:
    """Each claim's walk and picks read an entry or a few of runs' indexes per project and per
    run, and each completion or hand-back a few per run, over hundreds of projects (some capped,
    weighted) and with failures to retry, however wrong the statistics of runs are. A plan that
    scans an index of runs whole reads every run at each call."""
    db.execute("INSERT INTO dispatch.projects (project_id, weight, max_concurrency)"
               " SELECT 'p' || lpad(k::text, 3, '0'), 1 + k % 3, CASE WHEN k % 10 = 0 THEN 50 END"
               " FROM generate_series(0, 199) k")
    if statistics == "analyzed empty":
        db.execute("VACUUM ANALYZE dispatch.runs")
    db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, max_attempts)"
               " SELECT 'p' || lpad((CASE WHEN g <= 2000 THEN g % 4 ELSE g % 200 END)::text, 3, '0'), 'f',"
               " '0 0 1 1 *', 3 FROM generate_series(1, 4000) g")
    if statistics == "analyzed with none pending":  # the history of five earlier slots
        db.execute("INSERT INTO dispatch.runs"
                   " (schedule_id, project_id, scheduled_for, status, attempt, finished_at)"
                   " SELECT s.id, s.project_id, now() - k * interval '1 day', 'ok', 1, now()"
                   " FROM dispatch.schedules s CROSS JOIN generate_series(1, 5) k")
        db.execute("VACUUM ANALYZE dispatch.runs")
    make_due(db)
    assert scalar(db, "SELECT dispatch.tick()") == 4000
    if statistics == "autovacuum mid-chunk":
        _statistics_as_the_autovacuum_left_them(db)
    elif statistics == "never analyzed":
        db.execute("UPDATE pg_class SET relpages = 0, reltuples = -1 WHERE oid = 'dispatch.runs'::regclass")
    elif statistics == "right":
        db.execute("VACUUM ANALYZE dispatch.runs")

    before = _tuples_read(db)
    taken = 0
    for _ in range(10):
        runs = claim(db, "w", 64)
        assert len(runs) == 64
        taken += len(runs)
        failed = [k % 8 == 0 for k in range(64)]  # retryably: back to pending
        results = db.execute(
            "SELECT recorded, retry_at IS NOT NULL"
            " FROM dispatch.complete_runs('w', %s, %s, %s, %s, NULL, NULL, %s)",
            ([r[0] for r in runs], [r[7] for r in runs], ["error" if f else "ok" for f in failed],
             ["boom" if f else None for f in failed], failed),
        ).fetchall()
        assert results == [(True, f) for f in failed]
    runs = claim(db, "w", 64)  # and handed back, as a listener that stops does
    assert release(db, "w", runs) == 64
    taken += len(runs)
    # 10-15 a run with plans that descend the indexes, hundreds with one that reads one whole
    assert (_tuples_read(db) - before) / taken < 40


def _tuples_read(db: psycopg.Connection) -> int:
    """Rows read so far from dispatch.runs by sequential scans, and entries from its indexes."""
    db.execute("SELECT pg_stat_force_next_flush()")
    return int(scalar(db, "SELECT coalesce(seq_tup_read, 0)"
                          " + (SELECT sum(idx_tup_read) FROM pg_stat_user_indexes i WHERE i.relid = t.relid)"
                          " FROM pg_stat_user_tables t WHERE t.relid = 'dispatch.runs'::regclass"))


def _scans_of_runs(db: psycopg.Connection) -> int:
    """Sequential scans of dispatch.runs so far."""
    db.execute("SELECT pg_stat_force_next_flush()")
    return int(scalar(db, "SELECT seq_scan FROM pg_stat_user_tables WHERE relid = 'dispatch.runs'::regclass"))


def test_completions_do_not_rescan_the_runs_that_finished_before(db: psycopg.Connection) -> None:
    """The fence of complete_runs finds its runs by id. A bitmap scan of the running runs' index
    read every entry that the runs finished since the last vacuum had left there (a bitmap scan
    never marks one dead): each completion cost more than the one before."""
    db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
               " SELECT 'p', 'f', '0 0 1 1 *' FROM generate_series(1, 2000)")
    make_due(db)
    assert scalar(db, "SELECT dispatch.tick()") == 2000
    db.execute("VACUUM ANALYZE dispatch.runs")

    before = _index_entries_read(db, "runs_running_lease_idx")
    for _ in range(20):
        runs = claim(db, "w", 100)
        assert len(runs) == 100
        results = complete_many(db, "w", [(run[0], run[7], "ok", None) for run in runs])
        assert all(recorded for _, recorded, *_ in results)
    # 21,000 entries when each completion read the 100 x k its predecessors left
    assert _index_entries_read(db, "runs_running_lease_idx") - before < 2000


def test_a_tick_mends_statistics_that_say_runs_is_empty(db: psycopg.Connection, connect: Connect) -> None:
    """The same statistics made the marking's probes of runs full index scans (a chunk ran for
    minutes): a tick analyzes runs first, and never waits for the lock to do so."""
    _schedules_with_history(db)
    db.execute("SELECT pg_stat_force_next_flush()")

    def planner_rows() -> float:
        return float(scalar(db, "SELECT reltuples FROM pg_class WHERE oid = 'dispatch.runs'::regclass"))

    # an autovacuum holds the table's ShareUpdateExclusiveLock: the tick goes on without analyzing
    _statistics_as_the_autovacuum_left_them(db)
    holder = connect(autocommit=False)
    holder.execute("LOCK TABLE dispatch.runs IN SHARE UPDATE EXCLUSIVE MODE")
    ticker = connect()
    ticker.execute("SET lock_timeout = '3s'")
    assert scalar(ticker, "SELECT dispatch.tick()") == 0
    assert planner_rows() == 1
    holder.rollback()

    assert scalar(ticker, "SELECT dispatch.tick()") == 0
    assert planner_rows() == 15000
    assert scalar(ticker, "SELECT taken FROM dispatch.tick_chunk(100)") == 0  # nothing left to mend


def test_a_chunk_mends_statistics_not_counted_yet(db: psycopg.Connection) -> None:
    """The same statistics, in the first seconds of a big instant: an autovacuum has just set runs
    at no rows, and the statistics system does not count the runs the first chunk committed yet
    (a backend reports them at most once a second). The next chunk's probes of runs were full
    index scans for each due schedule, and a stampede of 100,000 took 80 s instead of 17 (a
    chunk ran into its 30 s timeout). A chunk that finds more open runs than the
    statistics say the table holds analyzes it first."""
    db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
               " SELECT 'p', 'f', '0 0 1 1 *' FROM generate_series(1, 40000)")
    db.execute("VACUUM ANALYZE dispatch.schedules")
    make_due(db)
    assert scalar(db, "SELECT marked FROM dispatch.tick_chunk(2000)") == 2000
    assert scalar(db, "SELECT marked FROM dispatch.tick_chunk(8000)") == 8000
    _statistics_as_the_autovacuum_left_them(db, rows=0)
    db.execute("SELECT pg_stat_reset_single_table_counters('dispatch.runs'::regclass)")

    before = _index_entries_read(db)
    db.execute("SET statement_timeout = '20s'")  # the full scans took a minute here
    assert scalar(db, "SELECT marked FROM dispatch.tick_chunk(8000)") == 8000
    # each due schedule probes its slot and its open runs: a few entries, not the whole index
    assert _index_entries_read(db) - before < 10 * 8000
    assert float(scalar(db, "SELECT reltuples FROM pg_class WHERE oid = 'dispatch.runs'::regclass")) >= 10000


def test_complete_runs_applies_complete_runs_rules_to_a_batch(db: psycopg.Connection) -> None:
    ids = [
        add_schedule(db, expr)
        for expr in ["* * * * *", "*/5 * * * *", "0 * * * *", "30 2 * * *", "* * * * *", "* * * * *"]
    ]
    make_due(db, "3 minutes")
    db.execute("SELECT dispatch.tick()")
    runs = {str(r[1]): r for r in claim(db, "w")}
    taken = runs[ids[4]][0]
    db.execute("UPDATE dispatch.runs SET attempt = attempt + 1 WHERE id = %s", (taken,))  # claimed again
    db.execute("UPDATE dispatch.schedules SET cron_expression = '0 12 * * *' WHERE id = %s", (ids[5],))
    edited = scalar(db, "SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (ids[5],))

    results = complete_many(
        db,
        "w",
        [
            (runs[ids[0]][0], 1, "ok", None),
            (runs[ids[1]][0], 1, "error", "x" * 900),
            (runs[ids[2]][0], 1, "ok", None),
            (runs[ids[3]][0], 1, "error", "boom"),
            (taken, 1, "ok", None),
            (runs[ids[5]][0], 1, "ok", None),
            (999_999, 1, "ok", None),
        ],
    )
    assert results == [
        (runs[ids[0]][0], True, True, False),
        (runs[ids[1]][0], True, True, False),
        (runs[ids[2]][0], True, True, False),
        (runs[ids[3]][0], True, True, False),
        (taken, False, False, False),
        (runs[ids[5]][0], True, False, False),
        (999_999, False, False, False),
    ]
    # the same end state complete_run gives: slots advanced from now, error cut, audit per run
    for sid, expr in zip(ids[:4], ["* * * * *", "*/5 * * * *", "0 * * * *", "30 2 * * *"], strict=True):
        assert scalar(
            db,
            "SELECT next_run_at = dispatch.cron_next(%s, now(), 'UTC') FROM dispatch.schedules WHERE id = %s",
            (expr, sid),
        ), expr
    assert scalar(db, "SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (ids[5],)) == edited
    assert scalar(db, "SELECT length(error) FROM dispatch.runs WHERE id = %s", (runs[ids[1]][0],)) == 500
    assert scalar(db, "SELECT status FROM dispatch.runs WHERE id = %s", (taken,)) == "running"
    audit = dict(
        db.execute(
            "SELECT (metadata->>'runId')::bigint, action FROM dispatch.audit_log"
            " WHERE action LIKE 'schedule.run.%'"
        ).fetchall()
    )
    assert audit == {
        runs[ids[0]][0]: "schedule.run.ok",
        runs[ids[1]][0]: "schedule.run.error",
        runs[ids[2]][0]: "schedule.run.ok",
        runs[ids[3]][0]: "schedule.run.error",
        runs[ids[5]][0]: "schedule.run.ok",
    }
    assert (
        scalar(db, "SELECT last_status || ':' || last_error FROM dispatch.schedules WHERE id = %s", (ids[3],))
        == "error:boom"
    )


def test_complete_runs_refuses_unknown_statuses(db: psycopg.Connection) -> None:
    with pytest.raises(errors.InvalidParameterValue, match="statuses must hold ok or error"):
        complete_many(db, "w", [(1, 1, "lost", None)])


def test_a_batch_computes_each_schedules_own_next_slot(db: psycopg.Connection) -> None:
    # Same expression, different zones; different expressions, same zone: runs finishing
    # together share a computation only when expression, zone and start all match.
    cases = [("0 9 * * *", "UTC"), ("0 9 * * *", "Asia/Tokyo"), ("0 9 * * *", "America/New_York"),
             ("30 9 * * *", "UTC"), ("0 9 * * *", "UTC")]
    ids = [add_schedule(db, expr, timezone=tz) for expr, tz in cases]
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    complete_many(db, "w", [(r[0], r[7], "ok", None) for r in claim(db, "w")])
    for sid, (expr, tz) in zip(ids, cases, strict=True):
        assert scalar(
            db, "SELECT next_run_at = dispatch.cron_next(%s, now(), %s) FROM dispatch.schedules"
            " WHERE id = %s", (expr, tz, sid),
        ), (expr, tz)


def test_a_zone_gone_from_the_tz_database_backs_off_without_failing_the_batch(db: psycopg.Connection) -> None:
    good, gone = add_schedule(db, "*/5 * * * *"), add_schedule(db, "*/5 * * * *")
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    runs = claim(db, "w")
    # As after a tz database upgrade that dropped the zone: the write path would refuse it.
    db.execute("SET session_replication_role = replica")
    db.execute("UPDATE dispatch.schedules SET timezone = 'Gone/Away' WHERE id = %s", (gone,))
    db.execute("RESET session_replication_role")

    results = complete_many(db, "w", [(r[0], r[7], "ok", None) for r in runs])
    assert [r[1:] for r in results] == [(True, True, False), (True, True, False)]
    assert scalar(
        db, "SELECT next_run_at = dispatch.cron_next('*/5 * * * *', now(), 'UTC') FROM dispatch.schedules"
        " WHERE id = %s", (good,),
    )
    backed_off = db.execute(
        "SELECT next_run_at - now(), last_status, last_error, backoff_reason FROM dispatch.schedules"
        " WHERE id = %s", (gone,),
    ).fetchone()
    assert backed_off is not None
    assert backed_off[0].total_seconds() == pytest.approx(3600, abs=5)
    assert backed_off[1:] == ("ok", None, 'cannot compute the next slot of "*/5 * * * *" in time zone'
                              " Gone/Away (see the server log); trying again every hour")
    assert scalar(db, "SELECT count(*) FROM dispatch.audit_log WHERE action = 'schedule.run.ok'") == 2


def test_next_due_after_answers_what_came_due_since_the_instant_covered(db: psycopg.Connection) -> None:
    a, b = add_schedule(db, "0 0 1 1 *"), add_schedule(db, "0 0 1 1 *")
    now = scalar(db, "SELECT now()")
    past, future = now - timedelta(seconds=10), now + timedelta(hours=1)
    db.execute("UPDATE dispatch.schedules SET next_run_at = %s WHERE id = %s", (past, a))
    db.execute("UPDATE dispatch.schedules SET next_run_at = %s WHERE id = %s", (future, b))
    # covered before a's slot: a, in the past; covered after it: b; next_due_at() never says a
    assert scalar(db, "SELECT dispatch.next_due_after(%s)", (now - timedelta(minutes=1),)) == past
    assert scalar(db, "SELECT dispatch.next_due_after(%s)", (now - timedelta(seconds=5),)) == future
    assert scalar(db, "SELECT dispatch.next_due_at()") == future


def test_the_next_start_is_the_first_waiting_run_read(db: psycopg.Connection) -> None:
    """dispatch.next_start_after reads the first entry of the waiting runs after the instant, not
    all of them: with 3,000 jittered runs waiting, a few blocks (it read every waiting run when
    planned as min(), called by each listener's clock many times a second)."""
    db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
               " SELECT 'acme', 'f', '* * * * *' FROM generate_series(1, 3000)")
    db.execute("UPDATE dispatch.schedules"
               " SET next_run_at = date_trunc('minute', now() - interval '1 minute')")
    db.execute("SELECT dispatch.tick()")
    # statistics taken before the runs wait, as right after a tick marked them
    db.execute("ANALYZE dispatch.runs")
    db.execute("UPDATE dispatch.runs"
               " SET not_before = now() + interval '1 hour' + id * interval '1 millisecond'")
    first = scalar(db, "SELECT min(not_before) FROM dispatch.runs")
    assert scalar(db, "SELECT dispatch.next_start_after(now())") == first
    plan = db.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)"
                      " SELECT dispatch.next_start_after(now())").fetchone()
    assert plan is not None
    blocks = plan[0][0]["Plan"]["Shared Hit Blocks"] + plan[0][0]["Plan"]["Shared Read Blocks"]
    assert blocks < 50, blocks


def test_a_claim_reads_each_projects_waiting_runs_from_that_project_alone(db: psycopg.Connection) -> None:
    """A claim takes a project's waiting runs whose instant is over (retries, jittered slots) from
    the project's range of runs_project_not_before_idx. With the project as an equality,
    runs_not_before_idx gives the same order, and on statistics taken while every waiting run's
    instant was ahead, long project ids tipped the claim's plan to it: each project read the
    waiting runs of the projects before it (claims of 1-2 s for minutes in the soak)."""
    db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
               " SELECT 'tenant-' || lpad((i % 100)::text, 3, '0') || repeat('x', 50), 'fn', '* * * * *'"
               " FROM generate_series(1, 10000) i")
    make_due(db, "1 minute")
    assert scalar(db, "SELECT dispatch.tick()") == 10000
    db.execute("UPDATE dispatch.runs SET not_before = now() + interval '1 hour'")
    db.execute("ANALYZE dispatch.runs")
    # then every instant is over, the first projects' runs last in not_before order
    db.execute("UPDATE dispatch.runs SET not_before = now() - interval '1 hour'"
               " - substr(project_id, 8, 3)::integer * interval '1 second' - id * interval '1 microsecond'")

    before = _index_entries_read(db, "runs_not_before_idx")
    assert len(claim(db, "w", 64)) == 64
    # the front of the waiting runs (dispatch._claimable_front: at most 5,001 entries), no more;
    # 437,000 when each project walked the others' runs
    assert _index_entries_read(db, "runs_not_before_idx") - before <= 5001
