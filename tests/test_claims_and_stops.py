"""Claims and stops (issue 20, items 1-3, and issue 26, item 1): every claim gets a fencing token
that no earlier claim of its run had (invariant 7), a claim never holds a run without a finite
lease that outlasts its call, and a schedule stopped while a run waits for its retry ends that
run with what is known of it, never `lost` (invariant 7) and never retried after the stop."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors

from .runs_kit import YEARLY, add_schedule, audit_of, claim, complete, mark_yearly, release, run_row, scalar

# -- fencing tokens ------------------------------------------------------------------------------

def test_a_released_claims_token_is_never_handed_out_again(db: psycopg.Connection) -> None:
    add_schedule(db, YEARLY, max_attempts=2)
    mark_yearly(db)
    [a] = claim(db, "a")
    assert release(db, "a", [a]) == 1  # a shuts down before invoking it
    [b] = claim(db, "b")
    assert (b[0], b[7]) == (a[0], a[7] + 1)  # the same run, a token a never had

    # a's release and outcome arrive again, late (a retried call, a duplicated message): b's
    # claim stands, and a's outcome lands nowhere
    assert release(db, "a", [a]) == 0
    assert claim(db, "c") == []
    assert complete(db, a, "a", status="error", error="late") == (False, False, False)
    assert run_row(db, a[0])["status"] == "running"
    assert complete(db, b, "b") == (True, True, False)

    row = run_row(db, a[0])
    # the released claim invoked nothing: it counts toward no attempt, and the audit lists one
    assert (row["status"], row["attempt"], row["released"]) == ("ok", 2, 1)
    [(action, metadata)] = audit_of(db, a[0])
    assert action == "schedule.run.ok" and "attempts" not in metadata


def test_a_released_claim_uses_up_no_attempt(db: psycopg.Connection) -> None:
    add_schedule(db, YEARLY, max_attempts=2, retry_backoff="1 second", retry_backoff_max="1 second")
    mark_yearly(db)
    for _ in range(3):  # released three times: still two invocations to go
        [run] = claim(db, "w")
        release(db, "w", [run])
    [run] = claim(db, "w")
    complete(db, run, status="error", error="HTTP 503", http_status=503, retryable=True, retry_after_ms=0)
    assert run_row(db, run[0])["status"] == "pending"  # attempt 1 of 2 failed: retried
    [retry] = claim(db, "w")
    assert retry[7] == run[7] + 1
    complete(db, retry, status="error", error="HTTP 503", http_status=503, retryable=True)
    row = run_row(db, run[0])
    assert (row["status"], row["attempt"] - row["released"]) == ("error", 2)  # the second was the last
    [(_, metadata)] = audit_of(db, run[0])
    assert [a["attempt"] for a in metadata["attempts"]] == [run[7], retry[7]]


# -- the lease --------------------------------------------------------------------------------------

BAD_CLAIMS = [
    ("NULL", "NULL", "lease must be longer than default_timeout (NULL) and at most 1 day, not NULL"),
    ("'-5 seconds'", "NULL",
     "lease must be longer than default_timeout (NULL) and at most 1 day, not -00:00:05"),
    ("'10 seconds'", "'30 seconds'",
     "lease must be longer than default_timeout (00:00:30) and at most 1 day, not 00:00:10"),
    ("'30 seconds'", "'30 seconds'",
     "lease must be longer than default_timeout (00:00:30) and at most 1 day, not 00:00:30"),
    ("'2 days'", "NULL", "lease must be longer than default_timeout (NULL) and at most 1 day, not 2 days"),
    ("'60 seconds'", "'-1 second'", "default_timeout must be more than 0 and at most 1 hour, not -00:00:01"),
]


@pytest.mark.parametrize(("lease", "default_timeout", "message"), BAD_CLAIMS)
def test_a_claim_without_a_lease_that_outlasts_the_call_is_refused_naming_it(
    db: psycopg.Connection, lease: str, default_timeout: str, message: str
) -> None:
    add_schedule(db, YEARLY)
    mark_yearly(db)
    with pytest.raises(errors.InvalidParameterValue) as refused:
        db.execute(f"SELECT * FROM dispatch.claim_runs('w', 10, {lease}, {default_timeout})")
    assert str(refused.value).splitlines()[0] == message
    # nothing was claimed: a running run without a finite lease would never expire
    assert scalar(db, "SELECT count(*) FILTER (WHERE status = 'pending') FROM dispatch.runs") == 1


def test_the_other_arguments_of_a_claim_are_refused_naming_them(db: psycopg.Connection) -> None:
    with pytest.raises(errors.InvalidParameterValue, match=r"^worker must name the claimer, not NULL"):
        db.execute("SELECT * FROM dispatch.claim_runs(NULL, 10)")
    with pytest.raises(errors.InvalidParameterValue, match=r"^max_runs must be 0 or more, not -1"):
        db.execute("SELECT * FROM dispatch.claim_runs('w', -1)")


def test_a_schedules_own_timeout_stretches_the_lease_beyond_it(db: psycopg.Connection) -> None:
    add_schedule(db, YEARLY, timeout="10 minutes")
    mark_yearly(db)
    [run] = db.execute("SELECT run_id, timeout FROM dispatch.claim_runs('w', 1, '45 seconds', '15 seconds')")
    assert run[1] == timedelta(minutes=10)
    held = scalar(db, "SELECT lease_until - claimed_at FROM dispatch.runs WHERE id = %s", (run[0],))
    assert held == timedelta(minutes=10, seconds=30)  # its timeout plus the caller's margin


# -- a schedule stopped while a run waits for its retry (or is out on an attempt that fails) -----

STOPS = [("SELECT dispatch.pause(%s, 'vendor down')", "paused"),
         ("UPDATE dispatch.schedules SET enabled = false WHERE id = %s", "disabled"),
         ("DELETE FROM dispatch.schedules WHERE id = %s", "deleted")]


def failed_once(db: psycopg.Connection) -> tuple[str, tuple[Any, ...]]:
    """A run whose first attempt failed retryably: pending, its retry ten minutes away."""
    sid = add_schedule(db, YEARLY, max_attempts=3, retry_backoff="10 minutes", retry_backoff_max="10 minutes")
    mark_yearly(db)
    [run] = claim(db, "w")
    complete(db, run, status="error", error="HTTP 503: vendor down", http_status=503, duration_ms=12,
             retryable=True, retry_after_ms=600_000)
    assert run_row(db, run[0])["status"] == "pending"
    return sid, run


def lost_once(db: psycopg.Connection) -> tuple[str, tuple[Any, ...]]:
    """A run whose first attempt's lease expired (claimed by w): pending again, to be retried."""
    sid = add_schedule(db, YEARLY, max_attempts=3)
    mark_yearly(db)
    [run] = claim(db, "w", lease="1 second")
    db.execute("UPDATE dispatch.runs SET lease_until = now() - interval '1 second',"
               " claimed_at = now() - interval '2 seconds' WHERE id = %s", (run[0],))
    db.execute("SELECT dispatch.tick()")
    assert run_row(db, run[0])["status"] == "pending"
    return sid, run


def assert_ended_with_its_last_outcome(db: psycopg.Connection, run: tuple[Any, ...], reason: str,
                                       error: str) -> None:
    row = run_row(db, run[0])
    assert (row["status"], row["error"], row["http_status"], row["not_before"]) == ("error", error, 503, None)
    [(action, metadata)] = audit_of(db, run[0])
    assert action == "schedule.run.error"
    # one attempt went out, and the audit lists it once, as it was
    assert [(a["attempt"], a["status"], a["httpStatus"], a["durationMs"]) for a in metadata["attempts"]] == [
        (1, "error", 503, 12)]
    assert scalar(db, "SELECT lost FROM dispatch.lost_runs_after(0)") == 0  # no runs-lost alert


@pytest.mark.parametrize(("stop", "reason"), STOPS, ids=[r for _, r in STOPS])
def test_a_stop_during_the_back_off_ends_the_retry_with_its_last_outcome_not_lost(
    db: psycopg.Connection, stop: str, reason: str
) -> None:
    sid, run = failed_once(db)
    db.execute(stop, (sid,))
    assert_ended_with_its_last_outcome(
        db, run, reason, f"HTTP 503: vendor down; not retried: schedule {reason} during the back-off")
    if reason == "paused":  # resumed inside the back-off: the retry does not come back
        db.execute("SELECT dispatch.resume(%s)", (sid,))
    db.execute("UPDATE dispatch.runs SET not_before = now() WHERE not_before IS NOT NULL")
    assert claim(db, "w") == []


@pytest.mark.parametrize(("stop", "reason"), STOPS, ids=[r for _, r in STOPS])
def test_an_attempt_that_fails_after_the_stop_is_not_retried_either(
    db: psycopg.Connection, stop: str, reason: str
) -> None:
    sid = add_schedule(db, YEARLY, max_attempts=3, retry_backoff="10 minutes", retry_backoff_max="10 minutes")
    mark_yearly(db)
    [run] = claim(db, "w")
    db.execute(stop, (sid,))  # the attempt is out when the stop commits
    recorded = complete(db, run, status="error", error="HTTP 503: vendor down", http_status=503,
                        duration_ms=12, retryable=True)
    assert recorded[0]
    row = run_row(db, run[0])
    assert (row["status"], row["error"], row["not_before"]) == (
        "error", f"HTTP 503: vendor down; not retried: schedule {reason}", None)
    [(action, metadata)] = audit_of(db, run[0])
    assert action == "schedule.run.error" and "attempts" not in metadata
    if reason == "paused":
        db.execute("SELECT dispatch.resume(%s)", (sid,))
    assert claim(db, "w") == []


def test_a_stop_after_a_lost_lease_still_ends_the_retry_lost(db: psycopg.Connection) -> None:
    """lost keeps its meaning: the last attempt may have run, its outcome unknown."""
    sid, run = lost_once(db)
    db.execute("SELECT dispatch.pause(%s)", (sid,))
    row = run_row(db, run[0])
    assert (row["status"], row["error"]) == (
        "lost", "schedule paused before the run was retried (an earlier attempt may have run)")


def test_lowering_max_attempts_during_the_back_off_ends_the_retry(db: psycopg.Connection) -> None:
    sid, run = failed_once(db)
    db.execute("UPDATE dispatch.schedules SET max_attempts = 1 WHERE id = %s", (sid,))
    db.execute("UPDATE dispatch.runs SET not_before = now() WHERE id = %s", (run[0],))  # the back-off passes
    assert claim(db, "w") == []
    row = run_row(db, run[0])
    assert (row["status"], row["error"]) == (
        "error", "HTTP 503: vendor down; not retried: max_attempts is now 1")
    [(action, metadata)] = audit_of(db, run[0])
    assert action == "schedule.run.error" and len(metadata["attempts"]) == 1


# A retry's limits hold however it came back to pending: a claim of it handed back by
# release_runs (a listener that shut down) or a lease that expired leaves no not_before, and
# the limits once looked only at runs with one.

def test_a_retry_handed_back_is_still_held_to_the_next_slot(db: psycopg.Connection) -> None:
    sid, run = failed_once(db)
    db.execute("UPDATE dispatch.runs SET not_before = now() WHERE id = %s", (run[0],))  # the back-off passes
    [again] = claim(db, "a")
    assert release(db, "a", [again]) == 1  # a shuts down before invoking it
    # Listeners were down until after the next slot (a year later: the yearly schedule's slot
    # is moved back past it).
    db.execute("UPDATE dispatch.runs SET scheduled_for = scheduled_for - interval '2 years' WHERE id = %s",
               (run[0],))
    assert claim(db, "b") == []
    row = run_row(db, run[0])
    assert (row["status"], row["error"], row["attempt"] - row["released"]) == (
        "error", "HTTP 503: vendor down; not retried: the next slot came first", 1)
    [(action, _)] = audit_of(db, run[0])
    assert action == "schedule.run.error"
    assert scalar(db, "SELECT next_run_at IS NOT NULL FROM dispatch.schedules WHERE id = %s", (sid,))


def test_a_retry_handed_back_is_still_held_to_a_lowered_max_attempts(db: psycopg.Connection) -> None:
    sid, run = failed_once(db)
    db.execute("UPDATE dispatch.runs SET not_before = now() WHERE id = %s", (run[0],))
    [again] = claim(db, "a")
    assert release(db, "a", [again]) == 1
    db.execute("UPDATE dispatch.schedules SET max_attempts = 1 WHERE id = %s", (sid,))
    assert claim(db, "b") == []
    row = run_row(db, run[0])
    assert (row["status"], row["error"]) == (
        "error", "HTTP 503: vendor down; not retried: max_attempts is now 1")


def test_a_run_whose_lease_expired_is_held_to_a_lowered_max_attempts_and_ends_lost(
        db: psycopg.Connection) -> None:
    """max_attempts counts lost leases as attempts: lowered to the attempts gone, no claim
    invokes the run again. It ends lost, as the expiry would have ended it: that attempt may
    have run."""
    sid, run = lost_once(db)
    db.execute("UPDATE dispatch.schedules SET max_attempts = 1 WHERE id = %s", (sid,))
    assert claim(db, "w2") == []
    row = run_row(db, run[0])
    assert (row["status"], row["error"]) == (
        "lost", "lease of w expired on attempt 1; not retried: max_attempts is now 1")
    [(action, metadata)] = audit_of(db, run[0])
    assert action == "schedule.run.lost" and [a["status"] for a in metadata["attempts"]] == ["lost"]


def test_a_run_whose_lease_expired_is_delivered_again_even_after_the_next_slot(
        db: psycopg.Connection) -> None:
    """At least once: the next-slot limit is a retry's after a failed attempt. A run whose lease
    expired may never have reached the function; it goes out again, however late."""
    _, run = lost_once(db)
    db.execute("UPDATE dispatch.runs SET scheduled_for = scheduled_for - interval '2 years' WHERE id = %s",
               (run[0],))
    [again] = claim(db, "w2")
    assert (again[0], again[7]) == (run[0], 2)


def test_a_claim_handed_back_while_a_pause_commits_is_not_invoked_after_the_resume(
        db: psycopg.Connection, connect: Callable[..., psycopg.Connection]) -> None:
    """A listener that shuts down hands its claim back while a pause is committing: the pause saw
    the run running, the release (which waits on nobody) saw the schedule live. The run is left
    pending under the paused schedule; the resume ends it as the pause would have, rather than
    let the next claim invoke a slot from before the pause."""
    sid = add_schedule(db, YEARLY, max_attempts=3)
    mark_yearly(db)
    [run] = claim(db, "w")
    admin = connect(autocommit=False)
    admin.execute("SELECT dispatch.pause(%s, 'maintenance')", (sid,))
    assert release(db, "w", [run]) == 1
    admin.commit()
    assert run_row(db, run[0])["status"] == "pending"
    db.execute("SELECT dispatch.resume(%s)", (sid,))
    assert claim(db, "w2") == []
    row = run_row(db, run[0])
    assert (row["status"], row["error"]) == ("skipped", "schedule paused before the run was claimed")
    [(action, _)] = audit_of(db, run[0])
    assert action == "schedule.run.skipped"
    assert scalar(db, "SELECT next_run_at IS NOT NULL FROM dispatch.schedules WHERE id = %s", (sid,))
