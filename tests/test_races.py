"""The SQL core under operator races (issue 10). Each scenario is written as the race it is:
real sessions, the interleaving forced by the row locks that an open transaction holds (a
DBA's in psql, or a tick's), and the invariant of DESIGN.md it protects asserted afterwards.

Every session that stands for the system (a listener, pg_cron's tick) runs with a lock_timeout:
if one of its calls waited on a lock, it would fail instead of passing slowly (invariant 3)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors

from tests.runs_kit import add_schedule, claim, complete, complete_many, make_due, release, scalar

Connect = Callable[..., psycopg.Connection]
System = Callable[[], psycopg.Connection]
NO_WAIT = "SET lock_timeout = '3s'"


@pytest.fixture
def system(connect: Connect) -> System:
    """A session standing for the system: autocommit, and any wait on a lock is an error."""

    def _open() -> psycopg.Connection:
        conn = connect()
        conn.execute(NO_WAIT)
        return conn

    return _open


@pytest.fixture
def background() -> Iterator[Callable[..., Future[Any]]]:
    """Run a call in a thread of its own (a user's statement that will wait on a lock)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield pool.submit


def wait_until_blocked(observer: psycopg.Connection, session: psycopg.Connection) -> None:
    """Until `session` waits on a lock another transaction holds."""
    pid = session.info.backend_pid
    deadline = time.monotonic() + 10
    while not scalar(observer, "SELECT cardinality(pg_blocking_pids(%s)) > 0", (pid,)):
        assert time.monotonic() < deadline, f"session {pid} never waited on a lock"


def wait_lease_passed(db: psycopg.Connection, run_id: int) -> None:
    """Until the run's lease has passed by the database's clock (not ticked yet)."""
    deadline = time.monotonic() + 10
    passed = "SELECT lease_until < clock_timestamp() FROM dispatch.runs WHERE id = %s"
    while not scalar(db, passed, (run_id,)):
        assert time.monotonic() < deadline, "lease did not pass"


def run_state(db: psycopg.Connection, run_id: int) -> tuple[str, int, str | None]:
    row = db.execute("SELECT status, attempt, error FROM dispatch.runs WHERE id = %s", (run_id,)).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def audit_actions(db: psycopg.Connection, run_id: int) -> list[str]:
    return [r[0] for r in db.execute(
        "SELECT action FROM dispatch.audit_log WHERE metadata->>'runId' = %s ORDER BY id", (str(run_id),))]


def due(db: psycopg.Connection, *ids: str) -> None:
    """Put these schedules' slots in the past, as the clock would."""
    db.execute("UPDATE dispatch.schedules SET next_run_at = date_trunc('minute', now())"
               " WHERE id = ANY (%s::uuid[])", (list(ids),))


def due_and_marked(db: psycopg.Connection, *exprs: str) -> list[str]:
    ids = [add_schedule(db, expr) for expr in exprs] or [add_schedule(db)]
    make_due(db)
    assert scalar(db, "SELECT dispatch.tick()") == len(ids)
    return ids


# -- 1. A stopped schedule's run is never handed out again (DESIGN: Delivery) ------------------


def test_disable_mid_flight_then_a_release_ends_the_run_skipped(
    db: psycopg.Connection, system: System
) -> None:
    (sid,) = due_and_marked(db)
    a, b = system(), system()
    (run,) = claim(a, "a")
    db.execute("UPDATE dispatch.schedules SET enabled = false WHERE id = %s", (sid,))
    assert run_state(db, run[0])[0] == "running"  # claimed before the stop: it is a's to finish
    assert release(a, "a", [run]) == 1  # a shuts down without having invoked it
    assert claim(b, "b") == []
    # the attempt stays 1: the fencing token is never handed out again (invariant 7)
    assert run_state(db, run[0]) == ("skipped", 1, "schedule disabled before the run was claimed")
    assert audit_actions(db, run[0]) == ["schedule.run.skipped"]


def test_a_release_behind_the_back_of_the_disabling_transaction_is_caught_by_the_claim(
    db: psycopg.Connection, connect: Connect, system: System
) -> None:
    (sid,) = due_and_marked(db)
    a, b = system(), system()
    (run,) = claim(a, "a")
    user = connect(autocommit=False)
    user.execute("UPDATE dispatch.schedules SET enabled = false WHERE id = %s", (sid,))
    # The disabling transaction saw the run running and left it; the release sees the schedule
    # live (the change is not committed) and cannot end the run either: it is pending again.
    assert release(a, "a", [run]) == 1
    user.commit()
    assert run_state(db, run[0])[0] == "pending"
    assert claim(b, "b") == []  # claim_runs hands out no run of a stopped schedule: it ends it
    # the attempt stays 1: the fencing token is never handed out again (invariant 7)
    assert run_state(db, run[0]) == ("skipped", 1, "schedule disabled before the run was claimed")
    assert audit_actions(db, run[0]) == ["schedule.run.skipped"]


def test_a_tick_that_holds_the_schedule_makes_the_disabling_transaction_wait_then_end_the_run(
    db: psycopg.Connection, connect: Connect, system: System,
    background: Callable[..., Future[Any]],
) -> None:
    sid = add_schedule(db)
    make_due(db)
    ticker, user = connect(autocommit=False), connect(autocommit=False)
    assert scalar(ticker, "SELECT dispatch.tick()") == 1  # open: holds the schedule's row
    stopping = background(user.execute, "UPDATE dispatch.schedules SET enabled = false WHERE id = %s", (sid,))
    wait_until_blocked(db, user)
    ticker.commit()
    stopping.result(timeout=10)
    user.commit()
    run_id = scalar(db, "SELECT id FROM dispatch.runs")
    assert run_state(db, run_id) == ("skipped", 0, "schedule disabled before the run was claimed")
    assert claim(system(), "w") == []


def test_a_tick_leaves_a_schedule_held_by_the_disabling_transaction_without_waiting(
    db: psycopg.Connection, connect: Connect, system: System
) -> None:
    sid = add_schedule(db)
    make_due(db)
    user = connect(autocommit=False)
    user.execute("UPDATE dispatch.schedules SET enabled = false WHERE id = %s", (sid,))
    assert scalar(system(), "SELECT dispatch.tick()") == 0
    user.commit()
    assert scalar(system(), "SELECT dispatch.tick()") == 0
    assert scalar(db, "SELECT count(*) FROM dispatch.runs") == 0


def test_a_lease_expiry_racing_the_disabling_transaction_ends_the_retry_lost(
    db: psycopg.Connection, connect: Connect, system: System,
    background: Callable[..., Future[Any]],
) -> None:
    (sid,) = due_and_marked(db)
    (run,) = claim(system(), "a", lease="10 milliseconds")
    wait_lease_passed(db, run[0])
    ticker, user = connect(autocommit=False), connect(autocommit=False)
    ticker.execute("SELECT dispatch.tick()")  # open: the run is pending again, attempt 1
    stopping = background(user.execute, "UPDATE dispatch.schedules SET enabled = false WHERE id = %s", (sid,))
    wait_until_blocked(db, user)
    ticker.commit()
    stopping.result(timeout=10)
    user.commit()
    # attempt 1 may have run: never retried, and not "skipped" either
    assert run_state(db, run[0]) == (
        "lost", 1, "schedule disabled before the run was retried (an earlier attempt may have run)")
    assert claim(system(), "b") == []
    assert audit_actions(db, run[0]) == ["schedule.run.lost"]


# -- 2. A lease that expires on a stopped schedule ends lost, never skipped ---------------------


def test_a_lease_expiring_while_the_stop_is_uncommitted_waits_for_it_then_ends_lost(
    db: psycopg.Connection, connect: Connect, system: System
) -> None:
    (sid,) = due_and_marked(db)
    (run,) = claim(system(), "a", lease="10 milliseconds")
    user = connect(autocommit=False)
    user.execute("SELECT dispatch.pause(%s, 'deploy')", (sid,))
    wait_lease_passed(db, run[0])
    system().execute("SELECT dispatch.tick()")  # leaves the run to a later tick, without waiting
    assert run_state(db, run[0])[0] == "running"
    user.commit()
    system().execute("SELECT dispatch.tick()")
    assert run_state(db, run[0]) == (
        "lost", 1, "lease of a expired on attempt 1 after the schedule was paused: it may have run")
    assert audit_actions(db, run[0]) == ["schedule.run.lost"]


# -- 3. No write puts a live schedule back onto a finished slot (invariant 2) -------------------


def test_an_edit_from_a_transaction_that_began_before_the_slot_does_not_rewind_the_schedule(
    db: psycopg.Connection, connect: Connect, system: System
) -> None:
    sid = add_schedule(db, "0 * * * *")
    slot = scalar(db, "SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (sid,))
    user = connect(autocommit=False)
    assert scalar(user, "SELECT now()") < slot  # psql BEGIN, before the slot
    # Meanwhile the slot runs and completes (marked ahead of the clock, as the chaos suite does).
    listener = system()
    assert scalar(db, "SELECT dispatch.tick(%s)", (slot,)) == 1
    (run,) = claim(listener, "w")
    assert complete(listener, run, "w", "ok") == (True, True, False)
    user.execute("UPDATE dispatch.schedules SET cron_expression = '0 */1 * * *' WHERE id = %s", (sid,))
    user.commit()

    next_at, last_slot = db.execute(
        "SELECT next_run_at, last_slot FROM dispatch.schedules WHERE id = %s", (sid,)).fetchone()  # type: ignore[misc]
    assert last_slot == slot
    assert next_at == scalar(db, "SELECT %s + interval '1 hour'", (slot,))
    assert scalar(db, "SELECT dispatch.next_due_after(%s)", (slot,)) == next_at  # not silently dead
    assert scalar(db, "SELECT dispatch.tick(%s)", (next_at,)) == 1  # and its next slot fires


def test_no_write_can_stop_a_live_schedule_or_rewind_it_onto_a_finished_slot(db: psycopg.Connection) -> None:
    (sid,) = due_and_marked(db)
    listener = db
    (run,) = claim(listener, "w")
    complete(listener, run, "w", "ok")
    # Even a superuser's direct writes: the constraints hold (dispatch_admin cannot even try).
    with pytest.raises(errors.CheckViolation, match="schedules_next_run_at_after_last_slot_check"):
        db.execute("UPDATE dispatch.schedules SET next_run_at = %s WHERE id = %s", (run[6], sid))
    with pytest.raises(errors.CheckViolation, match="schedules_next_run_at_live_check"):
        db.execute("UPDATE dispatch.schedules SET next_run_at = NULL WHERE id = %s", (sid,))


def test_tick_moves_a_schedule_found_on_a_finished_slot_past_it(
    db: psycopg.Connection, connect: Connect, system: System
) -> None:
    (sid,) = due_and_marked(db)
    (run,) = claim(db, "w")
    listener = connect()
    listener.execute("LISTEN dispatch")
    # A run finished behind the schedule's back (a superuser's UPDATE of the run): the
    # schedule still waits on that slot, which will never be marked again.
    db.execute("UPDATE dispatch.runs SET status = 'ok', finished_at = now() WHERE id = %s", (run[0],))
    assert scalar(system(), "SELECT dispatch.tick()") == 0
    next_at, last_slot, last_status = db.execute(
        "SELECT next_run_at, last_slot, last_status FROM dispatch.schedules WHERE id = %s", (sid,)
    ).fetchone()  # type: ignore[misc]
    assert (last_slot, last_status) == (run[6], "ok")
    assert next_at > scalar(db, "SELECT greatest(%s, now())", (run[6],))
    assert scalar(db, "SELECT count(*) FROM dispatch.runs") == 1
    assert "schedules" in [n.payload for n in listener.notifies(timeout=5, stop_after=1)]


# -- 4. A transaction left open delays only the rows it holds (invariant 3) ---------------------


def test_an_open_transaction_on_one_schedule_delays_only_that_schedule(
    db: psycopg.Connection, connect: Connect, system: System
) -> None:
    a, b = due_and_marked(db, "* * * * *", "* * * * *")
    listener = system()
    runs = {str(r[1]): r for r in claim(listener, "w")}
    dba = connect(autocommit=False)
    dba.execute("UPDATE dispatch.schedules SET args = '{\"v\": 2}' WHERE id = %s", (a,))  # and goes to lunch

    outcomes = complete_many(listener, "w", [(runs[a][0], 1, "ok", None), (runs[b][0], 1, "ok", None)])
    assert outcomes == [(runs[a][0], False, False, True), (runs[b][0], True, True, False)]
    assert run_state(db, runs[a][0])[0] == "running"  # kept for the listener to record later
    # b goes on: its next slot is marked by either of two ticks at once, neither waiting
    b_next = scalar(db, "SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (b,))
    t1, t2 = connect(autocommit=False), system()
    t1.execute(NO_WAIT)
    assert scalar(t1, "SELECT dispatch.tick(%s)", (b_next,)) == 1
    assert scalar(t2, "SELECT dispatch.tick(%s)", (b_next,)) == 0  # t1 holds that one
    t1.commit()
    assert [str(r[1]) for r in claim(listener, "w")] == [b]

    dba.commit()
    assert complete(listener, runs[a], "w", "ok") == (True, True, False)


def test_a_busy_answer_keeps_the_lease_of_an_answered_run_whose_schedule_is_held(
    db: psycopg.Connection, connect: Connect, system: System
) -> None:
    """The outcome is in hand but the schedule is held (a tick looking at its next slot, a
    DBA): busy, and the run's lease lasts at least 5 s more, so that the sweep between two
    ticks does not end it and have the function called again. A run whose own row is held is
    left as it is (the sweep skips it as well), and nothing waits."""
    a, b = due_and_marked(db, "* * * * *", "* * * * *")
    listener = system()
    runs = {str(r[1]): r for r in claim(listener, "w", lease="10 milliseconds")}
    wait_lease_passed(db, runs[b][0])
    holds_a = connect(autocommit=False)
    holds_a.execute("SELECT 1 FROM dispatch.schedules WHERE id = %s FOR NO KEY UPDATE", (a,))
    holds_b = connect(autocommit=False)
    holds_b.execute("SELECT 1 FROM dispatch.runs WHERE id = %s FOR UPDATE", (runs[b][0],))

    outcomes = complete_many(listener, "w", [(runs[a][0], 1, "ok", None), (runs[b][0], 1, "ok", None)])
    assert outcomes == [(runs[a][0], False, False, True), (runs[b][0], False, False, True)]
    left = "SELECT lease_until - clock_timestamp() FROM dispatch.runs WHERE id = %s"
    assert timedelta(seconds=4) < scalar(db, left, (runs[a][0],)) <= timedelta(seconds=5)
    assert scalar(db, left, (runs[b][0],)) < timedelta(0)  # held: not renewed, and not waited for
    holds_a.commit()  # the tick is done with a; the sweep comes before the listener's retry
    holds_b.commit()
    scalar(system(), "SELECT dispatch.tick()")  # the sweep
    assert run_state(db, runs[a][0])[:2] == ("running", 1)
    assert run_state(db, runs[b][0])[0] != "running"  # its lease was over: expired
    assert complete(listener, runs[a], "w", "ok") == (True, True, False)
    assert complete(listener, runs[b], "w", "ok") == (False, False, False)  # fenced


def test_a_tick_left_open_in_psql_stalls_no_one_else(
    db: psycopg.Connection, connect: Connect, system: System
) -> None:
    expiring, *others = (add_schedule(db) for _ in range(3))
    due(db, expiring)
    assert scalar(db, "SELECT dispatch.tick()") == 1
    listener = system()
    (run,) = claim(listener, "w", lease="10 milliseconds")
    due(db, *others)
    wait_lease_passed(db, run[0])
    psql = connect(autocommit=False)
    assert scalar(psql, "SELECT dispatch.tick()") == 2  # and left open: holds what it touched

    # The late outcome of the expired lease: busy (the open tick holds its row), not a wait.
    assert complete(listener, run, "w", "ok") == (False, False, True)
    assert scalar(system(), "SELECT dispatch.tick()") == 0  # what it holds is its own
    assert claim(listener, "w") == []  # nothing visible yet, and no wait
    later = add_schedule(db)  # a schedule the open tick never saw is marked as usual
    due(db, later)
    assert scalar(system(), "SELECT dispatch.tick()") == 1
    psql.commit()
    assert sorted(str(r[1]) for r in claim(listener, "w")) == sorted([expiring, *others, later])
    assert complete(listener, run, "w", "ok") == (False, False, False)  # fenced: attempt 2 holds it now


def test_two_ticks_never_wait_on_each_other(
    db: psycopg.Connection, connect: Connect, system: System
) -> None:
    db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
               " SELECT 'p', 'fn', '* * * * *' FROM generate_series(1, 50)")
    make_due(db)
    first = connect(autocommit=False)
    first.execute(NO_WAIT)
    assert scalar(first, "SELECT dispatch.tick()") == 50
    assert scalar(system(), "SELECT dispatch.tick()") == 0
    first.rollback()  # a psql session that gave up: nothing was marked, the next tick does it
    assert scalar(system(), "SELECT dispatch.tick()") == 50


def test_a_tick_leaves_to_no_policy_the_schedules_a_concurrent_tick_marked(
    db: psycopg.Connection, connect: Connect, system: System, background: Callable[..., Future[Any]],
) -> None:
    """Ticks racing at an instant, as a listener's chunks and pg_cron's tick do: a tick's first
    statement reads what is due from a snapshot taken before the chunks it then finds unlocked
    committed. Their slot's run is open (skip): nothing for the run policies, which would go
    through each one by one, holding it (thousands at the top of a minute). The race is not
    forced but recognised: a round in which the tick took schedules it did not mark (taken >
    marked) is one where it happened."""
    db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
               " SELECT 'p', 'fn', '* * * * *' FROM generate_series(1, 4000)")
    chunks = system()
    ticker = connect(autocommit=False)
    ticker.execute(NO_WAIT)
    ticker.execute("SET track_functions = 'pl'")

    def mark_in_chunks() -> None:
        while scalar(chunks, "SELECT (dispatch.tick_chunk(5)).taken") == 5:
            pass

    raced = 0
    for _ in range(30):
        db.execute("DELETE FROM dispatch.runs")
        make_due(db)
        chunking = background(mark_in_chunks)
        deadline = time.monotonic() + 10
        # the tick starts behind the chunks: it reads the slots they marked before its snapshot
        # on its way to those they commit while it walks
        while scalar(db, "SELECT count(*) < 2000 FROM dispatch.runs"):
            assert time.monotonic() < deadline, "the chunks stalled"
        row = ticker.execute("SELECT * FROM dispatch.tick_chunk(100000)").fetchone()
        to_policies = scalar(ticker, "SELECT pg_stat_get_xact_function_calls("
                                     "'dispatch._tick_schedule(uuid, timestamptz)'::regprocedure)")
        ticker.commit()
        chunking.result(timeout=30)
        assert row is not None
        marked, taken = row
        # each slot marked once, by one or the other
        assert scalar(db, "SELECT count(*) FROM dispatch.runs") == 4000
        assert scalar(db, "SELECT count(DISTINCT schedule_id) FROM dispatch.runs") == 4000
        if taken > marked:
            raced += 1
            assert to_policies in (None, 0), f"{to_policies} of {taken - marked} marked by the chunks"
        if raced == 2:
            break
    assert raced > 0, "the tick never raced the chunks in 30 rounds"


def open_runs(db: psycopg.Connection, sid: str) -> list[tuple[str, str]]:
    return [(kind, status) for kind, status in db.execute(
        "SELECT kind, status FROM dispatch.runs r WHERE schedule_id = %s AND status IN ('pending', 'running')"
        " AND NOT dispatch._waits_its_turn(r) ORDER BY id", (sid,))]


def test_a_tick_at_repeatable_read_is_refused_rather_than_mark_beside_an_open_run(
    db: psycopg.Connection, connect: Connect, system: System
) -> None:
    """Tick A marks slot S1 and commits after tick B's snapshot was taken (B at REPEATABLE READ,
    as default_transaction_isolation can make it): B would see no open run and mark S2 too."""
    sid = add_schedule(db)
    make_due(db, "2 minutes")
    s1 = scalar(db, "SELECT next_run_at FROM dispatch.schedules")
    a = connect(autocommit=False)
    a.execute(NO_WAIT)
    assert scalar(a, "SELECT dispatch.tick(%s)", (s1 + timedelta(seconds=1),)) == 1  # S1, on time
    b = connect(autocommit=False)
    b.execute("SET default_transaction_isolation = 'repeatable read'")
    b.execute(NO_WAIT)
    b.commit()
    b.execute("SELECT 1")  # B's snapshot: A's run is not in it
    a.commit()
    with pytest.raises(errors.InvalidTransactionState, match=r"^dispatch.tick must run at READ COMMITTED"):
        b.execute("SELECT dispatch.tick()")
    b.rollback()
    with pytest.raises(errors.InvalidTransactionState, match=r"^dispatch.run_now must run at READ COMMITTED"):
        b.execute("SELECT dispatch.run_now(%s)", (sid,))
    b.rollback()
    assert open_runs(db, sid) == [("scheduled", "pending")]
    assert scalar(system(), "SELECT dispatch.tick()") == 0  # at READ COMMITTED: S1 is open, nothing more


class Barrier:
    """Holds every insert of a run of one schedule until released: a tick stopped mid-statement,
    after its snapshot was taken."""

    def __init__(self, db: psycopg.Connection) -> None:
        self.db = db
        db.execute("CREATE FUNCTION public.test_barrier() RETURNS trigger LANGUAGE plpgsql AS"
                   " $$ BEGIN PERFORM pg_advisory_xact_lock_shared(4242); RETURN NEW; END $$")
        self.holder = psycopg.connect(**db.info.get_parameters(), autocommit=False)
        self.holder.execute("SELECT pg_advisory_xact_lock(4242)")

    def hold_runs_of(self, sid: str) -> None:
        self.db.execute(f"CREATE TRIGGER _000_test_barrier BEFORE INSERT ON dispatch.runs FOR EACH ROW"
                        f" WHEN (NEW.schedule_id = '{sid}') EXECUTE FUNCTION public.test_barrier()")

    def release(self) -> None:
        self.holder.rollback()


@pytest.fixture
def barrier(db: psycopg.Connection) -> Iterator[Barrier]:
    b = Barrier(db)
    yield b
    b.release()
    b.holder.close()


def x_held_before_t(db: psycopg.Connection, barrier: Barrier) -> tuple[str, str]:
    """Two due schedules, X's slot two minutes before T's so that a tick marks X first, and the
    insert of X's run held at the barrier: a tick stops there with T seen but not yet marked."""
    x = add_schedule(db)
    t = add_schedule(db)
    db.execute("UPDATE dispatch.schedules SET next_run_at = date_trunc('minute', now())"
               " - CASE WHEN id = %s THEN interval '2 minutes' ELSE interval '0' END", (x,))
    barrier.hold_runs_of(x)
    return x, t


def test_a_run_committed_while_a_tick_runs_is_seen_before_it_marks(
    db: psycopg.Connection, connect: Connect, system: System, background: Callable[..., Future[Any]],
    barrier: Barrier,
) -> None:
    """READ COMMITTED: tick B's statement is stopped after its snapshot, marking schedule X,
    before it reaches T; meanwhile run_now(T) commits a manual run. B must not mark T's slot
    beside it (overlap skip): it decides on T under its lock, from what is committed then."""
    _, t = x_held_before_t(db, barrier)
    b, operator = system(), connect()
    ticking = background(scalar, b, "SELECT dispatch.tick()")
    wait_until_blocked(db, b)  # B is inserting X's run
    run_now = background(operator.execute, "SELECT dispatch.run_now(%s)", (t,))
    deadline = time.monotonic() + 10  # run_now commits, or waits for B's lock on T
    while not run_now.done() and not scalar(db, "SELECT cardinality(pg_blocking_pids(%s)) > 0",
                                            (operator.info.backend_pid,)):
        assert time.monotonic() < deadline
    barrier.release()
    ticking.result(timeout=10)
    # run_now waited for B's lock on T, then saw B's run
    with pytest.raises(errors.ObjectNotInPrerequisiteState, match="overlap is skip"):
        run_now.result(timeout=10)
    assert len(open_runs(db, t)) == 1, open_runs(db, t)


def test_a_run_put_on_a_slot_by_hand_while_a_tick_marks_it_is_no_error(
    db: psycopg.Connection, connect: Connect, system: System, background: Callable[..., Future[Any]],
    barrier: Barrier,
) -> None:
    """Tick B has seen T's slot free and is stopped inserting X's run; the schema's owner inserts
    a run on T's slot in psql (no lock on T needed) and commits. B's insert of T's run meets it:
    the tick still ends without an error, with X marked and T's slot holding the one run."""
    x, t = x_held_before_t(db, barrier)
    b, owner = system(), connect()
    ticking = background(scalar, b, "SELECT dispatch.tick()")
    wait_until_blocked(db, b)  # B is inserting X's run, T's slot seen free
    owner.execute("INSERT INTO dispatch.runs (schedule_id, project_id, scheduled_for)"
                  " SELECT id, project_id, next_run_at FROM dispatch.schedules WHERE id = %s", (t,))
    barrier.release()
    assert ticking.result(timeout=10) == 1  # X's run; T's is the one put there by hand
    assert len(open_runs(db, x)) == 1 and len(open_runs(db, t)) == 1, (open_runs(db, x), open_runs(db, t))


# -- 6. An expression that cannot be evaluated is never invoked (invariant 6) -------------------


def drop_zone(db: psycopg.Connection, sid: str, zone: str) -> None:
    """As a tz database upgrade that removed the zone would leave it (the write path refuses it)."""
    db.execute("SET session_replication_role = replica")
    db.execute("UPDATE dispatch.schedules SET timezone = %s WHERE id = %s", (zone, sid))
    db.execute("RESET session_replication_role")


def test_a_zone_dropped_from_tzdata_records_one_skipped_run_per_hour_and_never_invokes(
    db: psycopg.Connection, system: System
) -> None:
    (sid,) = due_and_marked(db, "*/5 * * * *")
    listener = system()
    (run,) = claim(listener, "w")
    drop_zone(db, sid, "Gone/Away")
    assert complete(listener, run, "w", "ok") == (True, True, False)
    reason = ('cannot compute the next slot of "*/5 * * * *" in time zone Gone/Away (see the server log);'
              " trying again every hour")
    backoff_at = scalar(db, "SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (sid,))
    first_wait = scalar(db, "SELECT %s - clock_timestamp()", (backoff_at,))
    assert first_wait.total_seconds() == pytest.approx(3600, abs=10)

    # Each back-off instant (reached here by moving the marking horizon, not by waiting an hour)
    # records one skipped run and backs off again; nothing is ever pending or claimed.
    for period in range(2):
        assert scalar(db, "SELECT dispatch.tick(%s)", (backoff_at,)) == 0
        skipped = db.execute(
            "SELECT id, status, attempt, error FROM dispatch.runs"
            " WHERE schedule_id = %s AND scheduled_for = %s",
            (sid, backoff_at)).fetchone()
        assert skipped is not None and skipped[1:] == ("skipped", 0, reason), period
        assert audit_actions(db, skipped[0]) == ["schedule.run.skipped"]
        assert claim(listener, "w") == []
        following = scalar(db, "SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (sid,))
        assert following - backoff_at == timedelta(hours=1)  # one period after the instant recorded
        backoff_at = following

    drop_zone(db, sid, "UTC")  # the zone is back (tzdata downgraded, or the DBA fixed it)
    assert scalar(db, "SELECT dispatch.tick(%s)", (backoff_at,)) == 0  # the last back-off period
    next_at, backing_off = db.execute(
        "SELECT next_run_at, backoff_reason FROM dispatch.schedules WHERE id = %s", (sid,)).fetchone()  # type: ignore[misc]
    assert backing_off is None
    on_slot = "SELECT dispatch.cron_next('*/5 * * * *', %s - interval '1 minute')"
    assert scalar(db, on_slot, (next_at,)) == next_at
    assert scalar(db, "SELECT dispatch.tick(%s)", (next_at,)) == 1  # a real slot, invoked as usual
    statuses = db.execute(
        "SELECT status, count(*) FROM dispatch.runs GROUP BY 1 ORDER BY 1").fetchall()
    assert statuses == [("ok", 1), ("pending", 1), ("skipped", 3)]


# -- 7, 8. Roles: the listener cannot move time; an administrator writes definitions only -------


@pytest.fixture
def login(db: psycopg.Connection) -> Iterator[Callable[[str], psycopg.Connection]]:
    """A real login role in a dispatch group role (SET ROLE would leave session_user postgres)."""
    made: list[tuple[str, psycopg.Connection]] = []

    def _login(group: str) -> psycopg.Connection:
        name = f"pgdispatch_test_{group}_{len(made)}"
        db.execute(f"DROP ROLE IF EXISTS {name}")
        db.execute(f"CREATE ROLE {name} LOGIN IN ROLE {group}")
        conn = psycopg.connect(**{**db.info.get_parameters(), "user": name}, autocommit=True)
        made.append((name, conn))
        return conn

    yield _login
    for name, conn in made:
        conn.close()
        db.execute(f"DROP OWNED BY {name}")
        db.execute(f"DROP ROLE {name}")


def test_the_listener_role_cannot_mark_ahead_of_the_clock(
    db: psycopg.Connection, login: Callable[[str], psycopg.Connection]
) -> None:
    add_schedule(db, "0 0 1 1 *")
    listener = login("dispatch_listener")
    with pytest.raises(errors.InsufficientPrivilege, match="only dispatch_admin may"):
        listener.execute("SELECT dispatch.tick(now() + interval '400 days')")
    assert scalar(listener, "SELECT dispatch.tick()") == 0
    assert scalar(listener, "SELECT dispatch.tick(now())") == 0
    assert scalar(db, "SELECT count(*) FROM dispatch.runs") == 0
    admin = login("dispatch_admin")
    # an administrator may mark up to an hour ahead; a year ahead would stop the schedule a year
    with pytest.raises(errors.InvalidParameterValue, match="marks more than an hour ahead"):
        admin.execute("SELECT dispatch.tick(now() + interval '400 days')")
    assert scalar(db, "SELECT count(*) FROM dispatch.runs") == 0
    hourly = add_schedule(db, "0 * * * *")
    assert scalar(admin, "SELECT dispatch.tick(now() + interval '59 minutes 59 seconds')") == 1
    assert scalar(db, "SELECT next_run_at <= now() + interval '1 hour' FROM dispatch.schedules WHERE id = %s",
                  (hourly,))


@pytest.mark.parametrize("horizon", ["infinity", "-infinity"])
def test_a_horizon_that_is_not_an_instant_is_refused_and_backs_nothing_off(
    db: psycopg.Connection, horizon: str
) -> None:
    sid = add_schedule(db)
    before = scalar(db, "SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (sid,))
    with pytest.raises(errors.InvalidParameterValue, match=f"^now must be a finite instant, not {horizon}"):
        db.execute("SELECT dispatch.tick(%s::timestamptz)", (horizon,))
    row = db.execute("SELECT next_run_at, backoff_reason FROM dispatch.schedules WHERE id = %s",
                     (sid,)).fetchone()
    assert row == (before, None)


@pytest.mark.parametrize(("from_ts", "to_ts", "message"), [
    ("'-infinity'", "now()", "cannot backfill: from_ts must be a finite instant, not -infinity"),
    ("now() - interval '1 hour'", "'infinity'",
     "cannot backfill: to_ts must be a finite instant, not infinity"),
])
def test_a_backfill_between_non_instants_is_refused_naming_the_argument(
    db: psycopg.Connection, from_ts: str, to_ts: str, message: str
) -> None:
    sid = add_schedule(db)
    with pytest.raises(errors.InvalidParameterValue) as refused:
        db.execute(f"SELECT dispatch.backfill(%s, {from_ts}, {to_ts})", (sid,))
    assert str(refused.value).splitlines()[0] == message
    assert scalar(db, "SELECT count(*) FROM dispatch.runs") == 0


@pytest.mark.parametrize("column_value", [
    "next_run_at = NULL", "next_run_at = now()", "cron_spec = dispatch.cron_parse('0 0 1 1 *')",
    "last_status = 'ok'", "last_slot = now()", "paused_at = now()", "backoff_reason = 'x'",
])
def test_an_administrator_cannot_write_derived_columns(
    db: psycopg.Connection, login: Callable[[str], psycopg.Connection], column_value: str
) -> None:
    sid = add_schedule(db)
    admin = login("dispatch_admin")
    with pytest.raises(errors.InsufficientPrivilege):
        admin.execute(f"UPDATE dispatch.schedules SET {column_value} WHERE id = %s", (sid,))


def test_cron_spec_is_always_the_parsed_expression(db: psycopg.Connection) -> None:
    sid = add_schedule(db, "*/15 * * * *")
    db.execute("UPDATE dispatch.schedules SET cron_spec = dispatch.cron_parse('0 0 1 1 *') WHERE id = %s",
               (sid,))
    assert scalar(db, "SELECT cron_spec = dispatch.cron_parse('*/15 * * * *') FROM dispatch.schedules"
                      " WHERE id = %s", (sid,))


def test_a_hard_delete_by_an_administrator_is_the_audited_soft_delete_and_keeps_the_open_run(
    db: psycopg.Connection, login: Callable[[str], psycopg.Connection], system: System
) -> None:
    (sid,) = due_and_marked(db)
    listener = system()
    (run,) = claim(listener, "w")
    admin = login("dispatch_admin")
    admin.execute("DELETE FROM dispatch.schedules WHERE id = %s", (sid,))
    assert scalar(db, "SELECT deleted_at IS NOT NULL AND next_run_at IS NULL FROM dispatch.schedules"
                      " WHERE id = %s", (sid,))
    assert run_state(db, run[0])[0] == "running"  # not cascaded away: it finishes as usual
    assert complete(listener, run, "w", "ok") == (True, False, False)
    assert db.execute(
        "SELECT action, actor_id FROM dispatch.audit_log WHERE metadata->>'scheduleId' = %s"
        " AND action = 'schedule.delete'", (sid,)).fetchall() == [("schedule.delete", admin.info.user)]
    assert audit_actions(db, run[0]) == ["schedule.run.ok"]
    admin.execute("DELETE FROM dispatch.schedules WHERE id = %s", (sid,))  # again: nothing more
    assert scalar(db, "SELECT count(*) FROM dispatch.audit_log WHERE action = 'schedule.delete'") == 1


def test_the_schedule_audit_trigger_fires_only_for_definition_columns(db: psycopg.Connection) -> None:
    columns = db.execute(
        "SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_trigger t"
        " JOIN pg_attribute a ON a.attrelid = t.tgrelid AND a.attnum = ANY (t.tgattr)"
        " WHERE t.tgrelid = 'dispatch.schedules'::regclass AND t.tgname = '_800_audit_update'").fetchone()
    definition = ["project_id", "function_name", "cron_expression", "timezone", "args", "enabled",
                  "deleted_at", "paused_at", "max_attempts", "retry_backoff", "retry_backoff_max", "timeout",
                  "misfire_grace", "catchup", "overlap", "every", "anchor", "jitter", "run_at", "starts_at",
                  "ends_at", "max_runs", "pause_after_failures", "traceparent", "calendar_id"]
    assert columns == (sorted(definition),)


def test_a_back_off_after_a_slot_marked_ahead_of_the_clock_stays_after_that_slot(
    db: psycopg.Connection, system: System
) -> None:
    """The back-off is an hour after the later of the clock and the last finished slot: an hour
    after the clock alone would land before a slot a backfill marked days ahead (invariant 2)."""
    sid = add_schedule(db, "0 9 1 1 *")  # months ahead, but for one hour a year
    slot = scalar(db, "SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (sid,))
    assert scalar(db, "SELECT dispatch.tick(%s)", (slot,)) == 1
    listener = system()
    (run,) = claim(listener, "w")
    drop_zone(db, sid, "Gone/Away")
    assert complete(listener, run, "w", "ok") == (True, True, False)
    assert scalar(db, "SELECT next_run_at - last_slot FROM dispatch.schedules WHERE id = %s",
                  (sid,)) == timedelta(hours=1)
