"""Run policies in SQL (DESIGN.md, "Scheduling policies"): their validation on every write path,
retries with back-off, the per-schedule timeout, misfire grace, catch-up and overlap. The
listener's side (what it sends, how it waits) is in tests/listener/test_policies.py."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors

from .runs_kit import YEARLY, add_schedule, audit_of, claim, complete, make_due, mark_yearly, run_row, scalar

# -- validation ------------------------------------------------------------------------------

REFUSED = [
    ({"catchup": "all"}, "catchup = 'all' needs a misfire_grace"),
    ({"catchup": "every"}, "catchup must be latest or all"),
    ({"overlap": "forbid"}, "overlap must be skip, buffer_one or allow"),
    ({"retry_backoff": "10 minutes"},
     "retry_backoff (00:10:00) must not exceed retry_backoff_max (00:05:00)"),
    ({"retry_backoff": "0"}, "retry_backoff must be more than 0"),
    ({"retry_backoff_max": "2 days", "retry_backoff": "1 day"}, "retry_backoff_max must be at most 1 day"),
    ({"timeout": "0"}, "timeout must be more than 0 and at most 1 hour"),
    ({"timeout": "61 minutes"}, "timeout must be more than 0 and at most 1 hour"),
    ({"misfire_grace": "-1 minute"}, "misfire_grace must be more than 0"),
    ({"max_attempts": 0}, "max_attempts must be between 1 and 10"),
]


@pytest.mark.parametrize(("columns", "message"), REFUSED,
                         ids=[next(iter(c)) + "-" + m[:12] for c, m in REFUSED])
def test_a_policy_out_of_range_is_refused_naming_the_field(
    db: psycopg.Connection, columns: dict[str, Any], message: str
) -> None:
    with pytest.raises(errors.InvalidParameterValue) as refused:
        add_schedule(db, **columns)
    assert message in str(refused.value)

    sid = add_schedule(db)
    assignments = ", ".join(f"{name} = %s" for name in columns)
    with pytest.raises(errors.InvalidParameterValue) as refused:
        db.execute(f"UPDATE dispatch.schedules SET {assignments} WHERE id = %s", (*columns.values(), sid))
    assert message in str(refused.value)
    assert scalar(db, "SELECT count(*) FROM dispatch.audit_log WHERE action = 'schedule.update'") == 0


def test_policies_that_go_together_are_accepted_and_audited(db: psycopg.Connection) -> None:
    sid = add_schedule(db, misfire_grace="6 hours", catchup="all", overlap="buffer_one", timeout="90 seconds",
                       retry_backoff="1 minute", retry_backoff_max="1 hour", max_attempts=5)
    db.execute("UPDATE dispatch.schedules SET overlap = 'allow', timeout = NULL WHERE id = %s", (sid,))
    changed = scalar(db, "SELECT metadata->'changed' FROM dispatch.audit_log"
                         " WHERE action = 'schedule.update'")
    assert changed == {"overlap": "allow", "timeout": None}
    status = db.execute("SELECT catchup, overlap, misfire_grace, max_attempts FROM dispatch.schedule_status"
                        " WHERE id = %s", (sid,)).fetchone()
    assert status == ("all", "allow", timedelta(hours=6), 5)


# -- retries -------------------------------------------------------------------------------------

def test_a_retryable_failure_is_retried_after_its_backoff_with_the_same_request_id(
    db: psycopg.Connection,
) -> None:
    sid = add_schedule(db, YEARLY, max_attempts=3, retry_backoff="2 seconds", retry_backoff_max="1 minute")
    mark_yearly(db)
    [first] = claim(db, "w")
    request_id = first[5]

    # Retry-After: 1.5 s, honoured exactly
    recorded, advanced, busy = complete(db, first, status="error", error="HTTP 503", http_status=503,
                                        retryable=True, retry_after_ms=1500)
    assert (recorded, advanced, busy) == (True, False, False)
    run = run_row(db, first[0])
    assert (run["status"], run["attempt"], run["request_id"], run["worker"]) == (
        "pending", 1, request_id, None)
    waits = scalar(db, "SELECT not_before - now() FROM dispatch.runs WHERE id = %s", (first[0],))
    assert timedelta(seconds=1.4) < waits <= timedelta(seconds=1.5)
    assert claim(db, "w") == []  # not before its back-off
    assert scalar(db, "SELECT next_retry_at = %s FROM dispatch.schedule_status WHERE id = %s",
                  (run["not_before"], sid))
    assert scalar(db, "SELECT dispatch.next_due_after(now()) = %s", (run["not_before"],))  # the clocks wake

    while not (second := claim(db, "w")):
        pass  # the back-off passes by the database's clock
    [second] = second
    assert (second[0], second[5], second[7]) == (first[0], request_id, 2)
    assert scalar(db, "SELECT claimed_at >= %s FROM dispatch.runs WHERE id = %s",
                  (run["not_before"], first[0]))

    # attempt 2 fails: full jitter on 2 s x 2
    at_fail = scalar(db, "SELECT clock_timestamp()")
    complete(db, second, status="error", error="timeout: no complete response within 5 s", retryable=True)
    not_before = scalar(db, "SELECT not_before FROM dispatch.runs WHERE id = %s", (first[0],))
    assert timedelta(0) <= not_before - at_fail <= timedelta(seconds=4.1)
    db.execute("UPDATE dispatch.runs SET not_before = now() WHERE id = %s", (first[0],))  # skip the wait
    [third] = claim(db, "w")
    assert third[7] == 3

    # the last attempt's failure is final, retryable or not
    last = complete(db, third, status="error", error="HTTP 500", http_status=500, retryable=True)
    assert last[:2] == (True, True)
    run = run_row(db, first[0])
    assert (run["status"], run["attempt"], run["error"], run["not_before"]) == ("error", 3, "HTTP 500", None)
    [(action, metadata)] = audit_of(db, first[0])
    assert action == "schedule.run.error"
    attempts = metadata["attempts"]
    assert [(a["attempt"], a["status"], a.get("error"), a.get("httpStatus")) for a in attempts] == [
        (1, "error", "HTTP 503", 503),
        (2, "error", "timeout: no complete response within 5 s", None),
        (3, "error", "HTTP 500", 500)]


def test_full_jitter_spreads_retries_and_the_cap_bounds_them(db: psycopg.Connection) -> None:
    # 200 failures of one function would open its circuit breaker and hold the retries
    # (tests/test_breaker.py): here the subject is the retries' own back-off
    db.execute("UPDATE dispatch.settings SET breaker_threshold = 0")
    for _ in range(200):
        add_schedule(db, YEARLY, max_attempts=10, retry_backoff="10 seconds", retry_backoff_max="15 seconds")
    mark_yearly(db)
    runs = claim(db, "w", 200)
    for run in runs:
        complete(db, run, status="error", error="HTTP 502", retryable=True)
    # from the instant each failure was recorded (however long 200 completions took)
    delays = [d.total_seconds() for (d,) in db.execute(
        "SELECT not_before - (earlier_attempts -> -1 ->> 'at')::timestamptz FROM dispatch.runs")]
    assert all(0 <= d < 10 for d in delays)  # attempt 1: [0, 10 s)
    assert min(delays) < 3 and max(delays) > 7  # spread over it, not bunched

    # attempts 2 and 3 answered Retry-After: 0; attempt 4 waits [0, min(10 s x 8, 15 s))
    for _ in range(3):
        db.execute("UPDATE dispatch.runs SET not_before = now()")
        for run in claim(db, "w", 200):
            complete(db, run, status="error", error="HTTP 502", retryable=True,
                     retry_after_ms=None if run[7] == 4 else 0)
    delays = [d.total_seconds() for (d,) in db.execute("SELECT not_before - now() FROM dispatch.runs")]
    assert max(delays) <= 15 and max(delays) > 10  # capped by retry_backoff_max, beyond the first window
    # a Retry-After beyond the cap is capped too
    db.execute("UPDATE dispatch.runs SET not_before = now()")
    run = claim(db, "w", 1)[0]
    at = scalar(db, "SELECT clock_timestamp()")
    complete(db, run, status="error", error="HTTP 429", http_status=429, retryable=True,
             retry_after_ms=3_600_000)
    waits = scalar(db, "SELECT not_before - %s FROM dispatch.runs WHERE id = %s", (at, run[0]))
    assert timedelta(seconds=14.9) < waits <= timedelta(seconds=15.1)


def test_a_failure_that_is_not_retryable_is_final(db: psycopg.Connection) -> None:
    add_schedule(db, YEARLY, max_attempts=3)
    mark_yearly(db)
    [run] = claim(db, "w")
    complete(db, run, status="error", error="bad_request: no such report", http_status=400)
    row = run_row(db, run[0])
    assert (row["status"], row["attempt"], row["earlier_attempts"]) == ("error", 1, None)
    [(action, metadata)] = audit_of(db, run[0])
    assert action == "schedule.run.error" and "attempts" not in metadata  # one attempt: no list


def test_no_retry_starts_after_the_next_slot(db: psycopg.Connection) -> None:
    sid = add_schedule(db, "* * * * *", max_attempts=3, retry_backoff_max="10 minutes")
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    [run] = claim(db, "w")
    # The function asks for two minutes: the next slot comes first, so the run ends here.
    outcome = complete(db, run, status="error", error="HTTP 503", retryable=True, retry_after_ms=120_000)
    assert outcome[:2] == (True, True)
    row = run_row(db, run[0])
    assert row["status"] == "error"
    assert row["error"] == "HTTP 503; not retried: the next slot comes first"
    assert scalar(db, "SELECT next_run_at > now() FROM dispatch.schedules WHERE id = %s", (sid,))


def test_a_retry_claimed_only_after_the_next_slot_ends_error(db: psycopg.Connection) -> None:
    add_schedule(db, "* * * * *", max_attempts=3)
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    [run] = claim(db, "w")
    complete(db, run, status="error", error="HTTP 503", retryable=True, retry_after_ms=0)
    assert run_row(db, run[0])["status"] == "pending"
    # Listeners were busy for two minutes: the retry's slot is now two slots back.
    db.execute("UPDATE dispatch.runs SET scheduled_for = scheduled_for - interval '2 minutes' WHERE id = %s",
               (run[0],))
    assert claim(db, "w") == []
    row = run_row(db, run[0])
    assert (row["status"], row["attempt"], row["not_before"]) == ("error", 1, None)
    assert row["error"] == "HTTP 503; not retried: the next slot came first"
    assert [action for action, _ in audit_of(db, run[0])] == ["schedule.run.error"]


def test_a_lost_lease_and_failures_share_max_attempts(db: psycopg.Connection) -> None:
    add_schedule(db, YEARLY, max_attempts=2)
    mark_yearly(db)
    [run] = claim(db, "w", lease="1 millisecond")
    while scalar(db, "SELECT lease_until >= clock_timestamp() FROM dispatch.runs WHERE id = %s", (run[0],)):
        pass
    db.execute("SELECT dispatch.tick()")  # the lease expires: attempt 1 lost, retried
    [again] = claim(db, "w")
    assert again[7] == 2
    complete(db, again, status="error", error="HTTP 500", retryable=True)
    row = run_row(db, run[0])
    assert (row["status"], row["attempt"]) == ("error", 2)  # no attempts left
    [(_, metadata)] = audit_of(db, run[0])
    assert [(a["attempt"], a["status"]) for a in metadata["attempts"]] == [(1, "lost"), (2, "error")]


# -- timeout ---------------------------------------------------------------------------------------

def test_the_schedules_timeout_is_handed_out_and_the_lease_follows_it(db: psycopg.Connection) -> None:
    own = add_schedule(db, YEARLY, timeout="90 seconds")
    add_schedule(db, YEARLY)
    mark_yearly(db)
    rows = db.execute(
        "SELECT schedule_id::text, timeout, lease_until - now()"
        " FROM dispatch.claim_runs('w', 10, '40 seconds', '10 seconds')").fetchall()
    by_schedule = {sid: (timeout, lease) for sid, timeout, lease in rows}
    assert by_schedule.pop(own) == (timedelta(seconds=90), timedelta(seconds=120))  # 90 s + the 30 s margin
    assert list(by_schedule.values()) == [(timedelta(seconds=10), timedelta(seconds=40))]


# -- misfire grace ---------------------------------------------------------------------------------

def test_a_run_that_cannot_start_within_the_grace_is_skipped_not_invoked(db: psycopg.Connection) -> None:
    sid = add_schedule(db, misfire_grace="1 hour")
    make_due(db, "1 minute")
    db.execute("SELECT dispatch.tick()")
    run_id = scalar(db, "SELECT id FROM dispatch.runs")
    # no listener claimed it in time (a DBA shortened the grace to show it without waiting)
    db.execute("UPDATE dispatch.schedules SET misfire_grace = '1 millisecond' WHERE id = %s", (sid,))
    assert claim(db, "w") == []
    row = run_row(db, run_id)
    assert (row["status"], row["attempt"]) == ("skipped", 0)
    assert row["error"].startswith("missed by ") and row["error"].endswith(" s (misfire_grace 00:00:00.001)")
    assert [action for action, _ in audit_of(db, run_id)] == ["schedule.run.skipped"]
    assert scalar(db, "SELECT next_run_at > now() FROM dispatch.schedules WHERE id = %s", (sid,))


def test_a_long_outage_of_a_frequent_schedule_is_summed_up_in_one_recorded_gap(
    db: psycopg.Connection,
) -> None:
    sid = add_schedule(db, "* * * * *", misfire_grace="10 minutes", catchup="all")
    make_due(db, "5 hours")
    due = scalar(db, "SELECT next_run_at FROM dispatch.schedules")
    db.execute("SELECT dispatch.tick()")
    [(metadata,)] = db.execute("SELECT metadata FROM dispatch.audit_log"
                               " WHERE action = 'schedule.slots.skipped'")
    assert metadata["scheduleId"] == sid and metadata["reason"] == "misfire"
    assert 285 <= metadata["count"] <= 291 and not metadata["countIsAtLeast"]
    first, last = (datetime.fromisoformat(metadata[k]) for k in ("first", "last"))
    assert first == due and (last - first) / timedelta(minutes=1) == metadata["count"] - 1
    assert scalar(db, "SELECT count(*) FROM dispatch.runs WHERE status = 'skipped'") == 0  # no row each
    # the slots within the grace are caught up, the oldest first
    first = scalar(db, "SELECT min(scheduled_for) FROM dispatch.runs WHERE status = 'pending'")
    assert timedelta(minutes=9) <= scalar(db, "SELECT now()") - first <= timedelta(minutes=10)


def test_a_few_missed_slots_each_get_a_skipped_run(db: psycopg.Connection) -> None:
    add_schedule(db, "*/10 * * * *", misfire_grace="25 minutes")
    db.execute("UPDATE dispatch.schedules SET next_run_at = date_bin('10 minutes', now() - interval '1 hour',"
               " timestamptz '2000-01-01')")
    db.execute("SELECT dispatch.tick()")
    skipped = db.execute("SELECT scheduled_for, error FROM dispatch.runs WHERE status = 'skipped'"
                         " ORDER BY scheduled_for").fetchall()
    start, now = db.execute(
        "SELECT date_bin('10 minutes', now() - interval '1 hour', timestamptz '2000-01-01'), now()"
    ).fetchone()  # type: ignore[misc]
    beyond = [start + timedelta(minutes=10 * k) for k in range(8)
              if now - (start + timedelta(minutes=10 * k)) > timedelta(minutes=25)]
    assert [slot for slot, _ in skipped] == beyond and len(beyond) >= 3
    assert all(error.startswith("missed by ") for _, error in skipped)
    assert scalar(db, "SELECT count(*) FROM dispatch.audit_log WHERE action = 'schedule.run.skipped'") == len(
        skipped)


def test_a_short_outage_marks_the_latest_slot_of_each_and_a_zone_gone_backs_off_alone(
    db: psycopg.Connection,
) -> None:
    """After minutes down (no slot beyond a grace), one statement marks every due schedule: the
    latest slot under catchup latest, the oldest under all. A schedule whose zone vanished from
    the tz database fails that statement; the others are still marked, and it alone backs off."""
    latest = [add_schedule(db, "* * * * *"), add_schedule(db, "*/2 * * * *", misfire_grace="1 hour")]
    oldest = add_schedule(db, "* * * * *", misfire_grace="1 hour", catchup="all")
    gone = add_schedule(db, "* * * * *")
    make_due(db, "7 minutes")
    start = scalar(db, "SELECT date_trunc('minute', now() - interval '7 minutes')")

    def marked() -> dict[str, datetime]:
        return {str(sid): slot for sid, slot in db.execute(
            "SELECT schedule_id, scheduled_for FROM dispatch.runs WHERE status = 'pending'")}

    now = scalar(db, "SELECT now()")  # one horizon for both ticks, whatever minute the test runs in
    db.execute("SELECT dispatch.tick(%s)", (now,))
    want = {latest[0]: now.replace(second=0, microsecond=0),
            latest[1]: scalar(db, "SELECT date_bin('2 minutes', %s, timestamptz '2000-01-01')", (now,)),
            oldest: start, gone: now.replace(second=0, microsecond=0)}
    assert marked() == want
    # the schedules stay on the slot they run (overlap skip) until it finishes
    assert {str(sid): at for sid, at in db.execute("SELECT id, next_run_at FROM dispatch.schedules")} == want

    db.execute("TRUNCATE dispatch.runs")
    make_due(db, "7 minutes")
    db.execute("SET session_replication_role = replica")  # the write path would refuse the zone
    db.execute("UPDATE dispatch.schedules SET timezone = 'Gone/Away' WHERE id = %s", (gone,))
    db.execute("RESET session_replication_role")
    want[oldest] = scalar(db, "SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (oldest,))
    db.execute("SELECT dispatch.tick(%s)", (now,))
    assert marked() == {sid: slot for sid, slot in want.items() if sid != gone}
    reason, next_run_at = db.execute("SELECT backoff_reason, next_run_at - now() FROM dispatch.schedules"
                                     " WHERE id = %s", (gone,)).fetchone()  # type: ignore[misc]
    assert "Gone/Away" in reason and timedelta(minutes=59) < next_run_at <= timedelta(hours=1)


# -- catch-up x overlap ------------------------------------------------------------------------------

HOUR = timedelta(hours=1)


class Driver:
    """Plays the listeners: claims whatever is claimable, remembers the order, completes on demand."""

    def __init__(self, db: psycopg.Connection, horizon: datetime) -> None:
        self.db = db
        self.horizon = horizon
        self.open: list[tuple[Any, ...]] = []
        self.started: list[datetime] = []
        self.most_running = 0

    def tick(self, horizon: datetime | None = None) -> None:
        self.db.execute("SELECT dispatch.tick(%s)", (horizon or self.horizon,))

    def claim(self) -> None:
        for run in sorted(claim(self.db, "w", 100), key=lambda r: r[6]):  # a batch in no particular order
            self.open.append(run)
            self.started.append(run[6])
        self.most_running = max(self.most_running, len(self.open))

    def complete_all(self) -> None:
        done, self.open = self.open, []
        for run in done:
            complete(self.db, run)

    def buffered(self) -> list[datetime]:
        return [slot for (slot,) in self.db.execute(
            "SELECT scheduled_for FROM dispatch.runs WHERE not_before = 'infinity' ORDER BY 1")]

    def drain(self) -> None:
        while True:
            self.tick()
            self.claim()
            if not self.open:
                return
            self.complete_all()


@pytest.mark.parametrize("catchup", ["latest", "all"])
@pytest.mark.parametrize("overlap", ["skip", "buffer_one", "allow"])
def test_after_a_three_hour_outage(db: psycopg.Connection, catchup: str, overlap: str) -> None:
    """Hourly slots, misfire_grace 2 h; the database comes back 3 h after the slot it was on (the
    marking horizon moved to now + 3 h: slots H-3 .. H0 missed, H0 the latest). While the first
    catch-up run is open the next slot H+1 comes due (horizon + 1 h)."""
    add_schedule(db, "0 * * * *", misfire_grace="2 hours", catchup=catchup, overlap=overlap)
    h1 = scalar(db, "SELECT next_run_at FROM dispatch.schedules")  # the next slot when it went down
    back = h1 + 3 * HOUR + timedelta(minutes=20)  # the database comes back
    slot = {k: h1 + (3 + k) * HOUR for k in range(-3, 2)}  # H-3 = h1 .. H+1
    drive = Driver(db, back)

    drive.tick()
    skipped = db.execute("SELECT scheduled_for, error FROM dispatch.runs WHERE status = 'skipped'"
                         " ORDER BY 1").fetchall()
    assert [s for s, _ in skipped] == [slot[-3], slot[-2]]  # beyond the grace: recorded, never invoked
    assert [e for _, e in skipped] == ["missed by 3 h 20 min", "missed by 2 h 20 min"]
    assert scalar(db, "SELECT count(*) FROM dispatch.audit_log WHERE action = 'schedule.run.skipped'") == 2

    drive.claim()
    first_claim = list(drive.started)
    drive.tick()  # a tick while the first run is open
    buffered_while_open = drive.buffered()
    drive.tick(back + HOUR)  # H+1 comes due while it is open
    drive.claim()
    running_with_h1 = len(drive.open)
    buffered_with_h1 = drive.buffered()
    drive.horizon = back + HOUR
    drive.complete_all()
    drive.drain()

    expected_first = {("latest", "allow"): [slot[0]], ("all", "allow"): [slot[-1], slot[0]]}
    default_first = [slot[0] if catchup == "latest" else slot[-1]]
    assert first_claim == expected_first.get((catchup, overlap), default_first)
    if overlap == "buffer_one" and catchup == "all":
        assert buffered_while_open == [slot[0]]  # the next missed slot waits behind the open run
    else:
        assert buffered_while_open == []
    if overlap == "allow":
        assert running_with_h1 == len(first_claim) + 1  # H+1 runs at its time, beside the others
        assert buffered_with_h1 == []
    elif overlap == "buffer_one":
        assert running_with_h1 == 1
        assert buffered_with_h1 == ([slot[0]] if catchup == "all" else [slot[1]])
    else:
        assert running_with_h1 == 1 and buffered_with_h1 == []
    ran = [slot[-1], slot[0], slot[1]] if catchup == "all" else [slot[0], slot[1]]
    assert drive.started == ran  # H-1 coalesced into H0 under latest; oldest first under all
    assert drive.most_running == (len(first_claim) + 1 if overlap == "allow" else 1)
    # every slot is one run at most, every finished run one audit row
    assert scalar(db, "SELECT count(*) = count(DISTINCT scheduled_for) FROM dispatch.runs")
    assert scalar(db, "SELECT count(*) FROM dispatch.runs WHERE status = 'ok'") == len(ran)
    audited = scalar(db, "SELECT count(*) FROM dispatch.audit_log WHERE action LIKE 'schedule.run.%'")
    assert audited == len(ran) + 2


@pytest.mark.parametrize("overlap", ["skip", "buffer_one", "allow"])
def test_slots_that_pass_while_a_run_is_open_by_the_real_clock(db: psycopg.Connection, overlap: str) -> None:
    """A minutely schedule whose run of slot S is still open 3 minutes later (S+1 .. S+3 passed):
    skip drops them, buffer_one runs S+1 right after S, allow (with catchup latest) runs the
    latest of them beside S."""
    sid = add_schedule(db, "* * * * *", overlap=overlap)
    make_due(db, "3 minutes")
    s0 = scalar(db, "SELECT next_run_at FROM dispatch.schedules")
    db.execute("SELECT dispatch.tick(%s)", (s0 + timedelta(seconds=1),))  # marked at S, on time
    [first] = claim(db, "w")
    db.execute("SELECT dispatch.tick()")  # now: S+1 .. S+3 are due
    more = claim(db, "w")
    complete(db, first)
    for run in more:
        complete(db, run)
    db.execute("SELECT dispatch.tick()")
    after = claim(db, "w")
    for run in after:
        complete(db, run)
    minute = timedelta(minutes=1)
    slots = [r[6] for r in [first, *more, *after]]
    assert slots == {"skip": [s0], "buffer_one": [s0, s0 + minute], "allow": [s0, s0 + 3 * minute]}[overlap]
    assert scalar(db, "SELECT next_run_at > now() FROM dispatch.schedules WHERE id = %s", (sid,))


def test_leaving_buffer_one_releases_or_ends_the_buffered_run(db: psycopg.Connection) -> None:
    sids = [add_schedule(db, "* * * * *", overlap="buffer_one") for _ in range(2)]
    make_due(db, "2 minutes")
    s0 = scalar(db, "SELECT min(next_run_at) FROM dispatch.schedules")
    db.execute("SELECT dispatch.tick(%s)", (s0 + timedelta(seconds=1),))
    claim(db, "w")
    db.execute("SELECT dispatch.tick()")
    assert scalar(db, "SELECT count(*) FROM dispatch.runs WHERE not_before = 'infinity'") == 2
    db.execute("UPDATE dispatch.schedules SET overlap = 'allow' WHERE id = %s", (sids[0],))
    db.execute("UPDATE dispatch.schedules SET overlap = 'skip' WHERE id = %s", (sids[1],))
    rows = dict(db.execute("SELECT schedule_id::text, status FROM dispatch.runs WHERE scheduled_for > %s",
                           (s0,)).fetchall())
    assert rows == {sids[0]: "pending", sids[1]: "skipped"}
    assert scalar(db, "SELECT count(*) FROM dispatch.runs WHERE not_before IS NOT NULL") == 0
    assert [r[6] for r in claim(db, "w")] == [s0 + timedelta(minutes=1)]


@pytest.mark.parametrize("released_by", ["the open run ending", "leaving buffer_one"])
def test_a_buffered_run_fires_no_earlier_than_its_jittered_instant(
    db: psycopg.Connection, released_by: str
) -> None:
    """buffer_one with jitter: the run waiting behind the open one is let go at its fire_at, not
    at once (it was claimed up to a jitter early)."""
    sid = add_schedule(db, "0 * * * *", overlap="buffer_one", jitter="30 minutes")
    s1 = scalar(db, "SELECT next_run_at FROM dispatch.schedules")
    db.execute("SELECT dispatch.tick(%s)", (s1 + timedelta(minutes=31),))
    [first] = claim(db, "w")
    db.execute("SELECT dispatch.tick(%s)", (s1 + timedelta(minutes=91),))  # s2 comes due: it waits
    s2, fire_at = db.execute("SELECT scheduled_for, fire_at FROM dispatch.runs"
                             " WHERE not_before = 'infinity'").fetchone()  # type: ignore[misc]
    assert s2 == s1 + HOUR and fire_at > s2
    if released_by == "the open run ending":
        complete(db, first)
    else:
        db.execute("UPDATE dispatch.schedules SET overlap = 'allow' WHERE id = %s", (sid,))
    assert scalar(db, "SELECT not_before FROM dispatch.runs WHERE scheduled_for = %s", (s2,)) == fire_at
    assert [r[6] for r in claim(db, "w")] == []  # not before its instant


def test_catchup_all_runs_what_was_missed_before_a_run_but_not_what_came_due_while_it_ran(
    db: psycopg.Connection,
) -> None:
    """Overlap decides the slots that come due while a run is open; catch-up the ones missed while
    nothing ran. every 1 s, catchup all, overlap skip."""
    sid = add_schedule(db, None, every="1 second", misfire_grace="1 hour", catchup="all")
    # missed while nothing ran: the slot 3 s back runs, then the next one at once (caught up)
    db.execute("UPDATE dispatch.schedules SET next_run_at = next_run_at - interval '3 seconds' WHERE id = %s",
               (sid,))
    s0 = scalar(db, "SELECT next_run_at FROM dispatch.schedules")
    db.execute("SELECT dispatch.tick()")
    [run] = claim(db, "w")
    complete(db, run)
    [run] = claim(db, "w")
    assert (run[6] - s0).total_seconds() == 1
    complete(db, run)
    while claim_and_complete(db):
        pass  # the rest of the missed slots, one at a time, until the schedule is on time

    # on time: its slot comes due, is claimed at once, and stays open for two and a half slots
    slot = scalar(db, "SELECT next_run_at FROM dispatch.schedules")
    while scalar(db, "SELECT clock_timestamp() < %s", (slot,)):
        pass
    db.execute("SELECT dispatch.tick()")
    [run] = claim(db, "w")
    assert run[6] == slot
    while scalar(db, "SELECT clock_timestamp() < %s + interval '2.5 seconds'", (slot,)):
        pass
    complete(db, run)
    # the slots that came due while it ran are dropped, as overlap skip drops them: none is
    # caught up, and the schedule is on its first slot after the clock
    assert claim(db, "w") == []
    assert scalar(db, "SELECT next_run_at > clock_timestamp() - interval '0.5 seconds'"
                      " FROM dispatch.schedules WHERE id = %s", (sid,))


def claim_and_complete(db: psycopg.Connection) -> bool:
    runs = claim(db, "w")
    for run in runs:
        complete(db, run)
    return bool(runs)
