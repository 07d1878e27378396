"""A random walk over everything listeners, pg_cron and DBAs do to the SQL core: tick, claim,
complete (ok, final errors, retryable ones), release, leases that expire, definition edits,
disable, pause, delete, a zone dropped from tzdata, and transactions left open in psql (an edit,
a tick, a project's row), on schedules with every run policy (overlap, catch-up, misfire grace,
retries), in three projects whose max_concurrency and weight an administrator sets, lowers below
what runs and clears, and between which schedules move. Several real sessions, with the roles a
deployment gives them; the invariants of DESIGN.md are checked after every step (10: no claim
takes a capped project above its cap, and a claim that nothing else holds back takes exactly
min(asked, what the caps allow, what is due)), and dispatch.explain's verdict for every schedule
against what the next tick and claim do at the end of each walk.

CI runs a fixed seed (derandomized). A long walk by hand (explain checked every 3rd step too):

    PGDISPATCH_STATEFUL_EXAMPLES=2000 PGDISPATCH_STATEFUL_EXPLAIN_EVERY=3 \
        scripts/test tests/test_stateful.py -s

It prints how many steps ran."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from psycopg import errors

from tests.explain_check import explain_agrees

# The slot rules: cron expressions, intervals (every) from the creation time, one-shots (on a
# minute: invariant 6 takes any other instant for a back-off's), and bounded rules.
EXPRESSIONS = ["* * * * *", "*/2 * * * *", "*/5 * * * *", "0 * * * *", "30 9 * * *", "every 90 seconds",
               "every 7 minutes", "once in 3 minutes", "*/2 * * * * for 4 slots",
               "every 90 seconds for 1 hour"]


def slot_rule(expr: str) -> tuple[str | None, str | None, str | None, str | None, int | None]:
    """(cron_expression, every, run_at and ends_at as intervals from now, max_runs) for an
    entry of EXPRESSIONS."""
    if expr.startswith("once in "):
        return None, None, expr.removeprefix("once in "), None, None
    rule, _, bound = expr.partition(" for ")
    every = rule.removeprefix("every ") if rule.startswith("every ") else None
    slots = int(bound.removesuffix(" slots")) if bound.endswith(" slots") else None
    return (None if every else rule), every, None, (bound if bound and slots is None else None), slots
ZONES = ["UTC", "Europe/Berlin", "Asia/Kolkata"]
# The tenants. A project has a dispatch.projects row or none (no cap, weight 1); caps of one or
# two, so that a project's few schedules meet them.
PROJECTS = ["pa", "pb", "pc"]
CAPS = [None, 1, 2]
WEIGHTS = [1, 2, 3]
EXAMPLES = int(os.environ.get("PGDISPATCH_STATEFUL_EXAMPLES", "300"))
# The CI walk is always the same (derandomized); a long walk by hand explores new ones.
FIXED_SEED = "PGDISPATCH_STATEFUL_EXAMPLES" not in os.environ
STEPS_PER_EXAMPLE = 50
# A session standing for the system, or the administrator, that waited on a lock would fail
# the walk instead of hanging it: invariant 3.
NO_WAIT = "SET lock_timeout = '5s'"
OUTCOMES = ["ok", "error", "retryable", "retry-after"]  # what a listener hands to complete_run
# dispatch.explain is checked against the next tick and claim at the end of each walk, and with
# PGDISPATCH_STATEFUL_EXPLAIN_EVERY=N after every N-th step too (a long walk by hand: each check
# costs about 13 ms, more than a step, and leaves rolled-back rows behind)
EXPLAIN_EVERY = int(os.environ.get("PGDISPATCH_STATEFUL_EXPLAIN_EVERY", "0"))


@dataclass(frozen=True)
class Claim:
    run_id: int
    schedule_id: str
    attempt: int
    lease_until: datetime


# The open runs, and whatever the runs in `ids` became (a claim ends some): what a claim is
# judged on, read before and after it. A run waiting behind another (not_before 'infinity', which
# Python's datetime cannot hold) is parked.
OPEN_RUNS = """
    SELECT r.id, r.project_id, r.status, nullif(r.not_before, 'infinity'), r.not_before = 'infinity'
    FROM dispatch.runs r
    WHERE r.status IN ('pending', 'running') OR r.id = ANY (%s::bigint[])
"""


@dataclass
class Sessions:
    clock: psycopg.Connection  # superuser: moves the marking horizon, drops zones, observes
    listeners: list[psycopg.Connection]  # role dispatch_listener
    admin: psycopg.Connection  # role dispatch_admin
    dba: psycopg.Connection  # superuser, not autocommit: leaves transactions open


def one(conn: psycopg.Connection, sql: str, params: Any = None) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


class DispatchWalk(RuleBasedStateMachine):
    sessions: ClassVar[Sessions]
    steps: ClassVar[int] = 0
    seen_outcomes: ClassVar[Counter[str]] = Counter()  # what the walks reached, to show they reach it

    def __init__(self) -> None:
        super().__init__()
        s = self.sessions
        s.dba.rollback()
        # each walk from nothing: a breaker an earlier walk opened would hold this one's runs
        # for as long as its probes are spaced in real time
        s.clock.execute("TRUNCATE dispatch.runs, dispatch.audit_log, dispatch.schedules, dispatch.breakers,"
                        " dispatch.calendars, dispatch.calendar_exclusions")
        s.clock.execute("DELETE FROM dispatch.projects")  # (a few rows: cheaper than a truncation)
        for listener in s.listeners:  # round-robin from the first project, as a new session's claims
            listener.execute("SELECT set_config('dispatch.claim_cursor', '', false)")
        self.horizon: datetime = one(s.clock, "SELECT date_trunc('minute', now())")
        # one shared calendar, its periods added and removed by a rule (in a zone half an hour
        # off the hour)
        self.calendar: int = one(s.admin, "INSERT INTO dispatch.calendars (name, timezone)"
                                          " VALUES ('walk', 'Asia/Kolkata') RETURNING id")
        self.schedules: list[str] = []
        self.gone_zone: set[str] = set()
        # schedules whose slot rule changed (an edit starts the slots afresh) or could not be
        # computed for a while (back-off): left out of the slot accounting at the end of a walk
        self.rule_changed: set[str] = set()
        self.claims: list[list[Claim]] = [[] for _ in s.listeners]
        self.retry_at: dict[int, datetime] = {}  # run id -> when complete_runs said it is retried
        self.seen: set[tuple[int, int]] = set()  # every (run, token) handed out: never twice
        self.spent: list[Claim] = []  # claims released or completed, whose calls may come again
        self.runs_count = 0
        self.last_seen_run = 0
        self.last_audit = 0
        self.last_marked = 0
        self.dba_open: str | None = None  # "edit" or "tick"
        self.dba_holds: str | None = None  # the schedule an open edit holds
        # "project": the DBA's open transaction holds that project's row, setting this cap
        self.dba_project: str | None = None
        self.dba_cap: int | None = None
        # Invariant 10. The caps as committed, and the most runs each capped project may have
        # running: its cap, or what ran when the cap came (lowered below it) or when a schedule
        # brought its running runs in, which then only falls as they end.
        self.caps: dict[str, int] = {}
        self.ceiling: dict[str, int] = {}

    def step(self) -> None:
        DispatchWalk.steps += 1

    def pick(self, index: int) -> str:
        return self.schedules[index % len(self.schedules)]

    def pick_claimed(self, index: int) -> str:
        """A schedule with a run some listener holds, if there is one."""
        claimed = [c.schedule_id for claims in self.claims for c in claims]
        return claimed[index % len(claimed)] if claimed else self.pick(index)

    def running(self) -> Counter[str]:
        return Counter(dict(self.sessions.clock.execute(
            "SELECT project_id, count(*) FROM dispatch.runs WHERE status = 'running' GROUP BY project_id")))

    def held_by_others(self, run_ids: list[int]) -> set[int]:
        """Those of the runs that another transaction holds now (a lock the clock cannot take)."""
        if not run_ids:
            return set()
        clock = self.sessions.clock
        with clock.transaction(force_rollback=True):
            free = {run_id for (run_id,) in clock.execute(
                "SELECT id FROM dispatch.runs WHERE id = ANY (%s) FOR UPDATE SKIP LOCKED", (run_ids,))}
        return set(run_ids) - free

    def cap_committed(self, project: str, cap: int | None) -> None:
        """A project's cap as committed now: what runs beyond it may go on, none may join them."""
        self.caps.pop(project, None)
        self.ceiling.pop(project, None)
        if cap is not None:
            running = self.running()[project]
            self.caps[project], self.ceiling[project] = cap, max(cap, running)
            if running > cap:
                DispatchWalk.seen_outcomes["cap below running"] += 1

    def claim_was_right(self, n: int, at: datetime, before: dict[int, tuple[Any, ...]],
                        after: dict[int, tuple[Any, ...]], taken: set[int], held: set[int]) -> None:
        """Invariant 10, for one claim of n at `at` (its now()), from the open runs (OPEN_RUNS)
        before and after it and the runs another transaction held meanwhile (a disable left open
        ends its schedule's runs, so locks them). What the claim used (runs it started, ended
        instead, or left to wait for their breaker's probe) is none of those, and counts against a
        capped project's room: its cap less its running runs, none while the DBA holds its row.
        It used exactly min(n, what each project's room allows of its due runs, the held ones
        aside); or as much or more when it ended runs (an end may let a run waiting behind it go
        in the same claim)."""
        claimable = {run_id for run_id, _, status, not_before, parked in before.values()
                     if status == "pending" and not parked and (not_before is None or not_before <= at)}
        running = Counter(project for _, project, status, *_ in before.values() if status == "running")
        due = Counter(before[run_id][1] for run_id in claimable - held)
        assert all(after[run_id][2] == "running" for run_id in taken), taken
        used = taken | {run_id for run_id in claimable if after[run_id][2:] != before[run_id][2:]}
        used_by = Counter(after[run_id][1] for run_id in used)
        assert len(used) <= n, f"a claim of {n} used {sorted(used)}"
        assert not used & held, f"a claim took {sorted(used & held)}, which another transaction held"
        room: dict[str, int] = {}
        for project, cap in self.caps.items():
            project_held = self.dba_open == "project" and self.dba_project == project
            room[project] = 0 if project_held else max(cap - running[project], 0)
            if project_held and due[project]:
                DispatchWalk.seen_outcomes["claim skips a held project"] += 1
            assert used_by[project] <= room[project], \
                f"a claim took {used_by[project]} runs of {project} (cap {cap}, {running[project]} running," \
                f" its row held: {project_held})"
        expected = min(n, sum(min(k, room.get(project, k)) for project, k in due.items()))
        if held:
            DispatchWalk.seen_outcomes["claim beside held runs"] += 1
        if any(after[run_id][2] not in ("pending", "running") for run_id in before):
            assert len(used) >= expected, f"a claim of {n} that ended runs used {sorted(used)}, < {expected}"
            return
        assert len(used) == expected, \
            f"a claim of {n} used {sorted(used)}, not {expected}: due {dict(due)}, room {room}"
        assert used <= claimable
        DispatchWalk.seen_outcomes["claim exact"] += 1
        if any(k > room.get(project, k) for project, k in due.items()):
            DispatchWalk.seen_outcomes["claim exact at a cap"] += 1

    # Each walk starts with its projects capped or not and weighed as drawn: left to the rules
    # alone, a walk of 50 steps would seldom have a cap meet due runs.
    @initialize(caps=st.lists(st.sampled_from(CAPS), min_size=len(PROJECTS), max_size=len(PROJECTS)),
                weights=st.lists(st.sampled_from(WEIGHTS), min_size=len(PROJECTS), max_size=len(PROJECTS)))
    def projects_are_set_up(self, caps: list[int | None], weights: list[int]) -> None:
        for project, cap, weight in zip(PROJECTS, caps, weights, strict=True):
            if cap is not None or weight != 1:
                self.sessions.admin.execute(
                    "INSERT INTO dispatch.projects (project_id, max_concurrency, weight) VALUES (%s, %s, %s)",
                    (project, cap, weight))
                if cap is not None:  # (nothing runs yet)
                    self.caps[project] = self.ceiling[project] = cap

    # -- the system ---------------------------------------------------------------------------

    @rule()
    def time_passes(self) -> None:
        """The marking horizon moves a minute (leases expire by the real clock meanwhile)."""
        self.step()
        self.horizon += timedelta(minutes=1)
        self.sessions.clock.execute("SELECT dispatch.tick(%s)", (self.horizon,))

    @rule()
    def an_hour_passes(self) -> None:
        self.step()
        self.horizon += timedelta(hours=1)
        self.sessions.clock.execute("SELECT dispatch.tick(%s)", (self.horizon,))

    @rule(i=st.integers(0, 1))
    def listener_ticks(self, i: int) -> None:
        self.step()
        listener = self.sessions.listeners[i]
        listener.execute("SELECT dispatch.tick()")
        # never from a snapshot older than its locks (a REPEATABLE READ default): refused
        listener.execute("SET default_transaction_isolation = 'repeatable read'")
        with pytest.raises(errors.InvalidTransactionState):
            listener.execute("SELECT dispatch.tick()")
        listener.execute("RESET default_transaction_isolation")

    @rule(i=st.integers(0, 1), n=st.integers(1, 4), short_lease=st.booleans())
    def listener_claims(self, i: int, n: int, short_lease: bool) -> None:
        self.step()
        s = self.sessions
        listener = s.listeners[i]
        before = {row[0]: row for row in s.clock.execute(OPEN_RUNS, ([],))}
        # (only the DBA's open transaction can hold runs: the other sessions commit each statement)
        held = set() if self.dba_open is None else self.held_by_others(
            [run_id for run_id, _, status, _, parked in before.values()
             if status == "pending" and not parked])
        # with the claim's now(), which the queue is judged at (a row even when it takes nothing)
        claimed = listener.execute(
            "SELECT now(), c.run_id, c.schedule_id, c.attempt, c.lease_until"
            " FROM (SELECT) AS one_row LEFT JOIN dispatch.claim_runs(%s, %s, %s::interval) c ON true",
            (f"w{i}", n, "1 millisecond" if short_lease else "1 hour")).fetchall()
        at: datetime = claimed[0][0]
        rows = [row[1:] for row in claimed if row[1] is not None]
        after = {row[0]: row for row in s.clock.execute(OPEN_RUNS, (list(before),))}
        self.claim_was_right(n, at, before, after, {row[0] for row in rows}, held)
        now = one(s.clock, "SELECT clock_timestamp()")
        for run_id, schedule_id, attempt, lease_until in rows:
            if run_id in self.retry_at:
                # a retry: not before its back-off, never after its schedule's next slot (a slot
                # of its own: manual and backfill runs are not held to that)
                claimed_at, before_next_slot = s.clock.execute(
                    "SELECT r.claimed_at, r.kind <> 'scheduled'"
                    " OR r.claimed_at < dispatch._next_slot(s.cron_spec, r.scheduled_for, s.timezone)"
                    " FROM dispatch.runs r JOIN dispatch.schedules s ON s.id = r.schedule_id WHERE r.id = %s",
                    (run_id,)).fetchone()  # type: ignore[misc]
                assert claimed_at >= self.retry_at.pop(run_id)
                assert before_next_slot is not False
                DispatchWalk.seen_outcomes["retry claimed"] += 1
            # Invariant 1: each (run, attempt) is handed out once, and only when every earlier
            # holder's lease has passed.
            assert (run_id, attempt) not in self.seen
            self.seen.add((run_id, attempt))
            for held in (c for claims in self.claims for c in claims if c.run_id == run_id):
                assert held.lease_until < now, f"run {run_id} handed out while attempt {held.attempt} has it"
            # Never a run of a stopped schedule (DESIGN, Delivery): live as committed now.
            assert one(s.clock, "SELECT enabled AND deleted_at IS NULL AND paused_at IS NULL"
                                " FROM dispatch.schedules WHERE id = %s", (schedule_id,)), run_id
            self.claims[i].append(Claim(run_id, str(schedule_id), attempt, lease_until))

    # No precondition on what a listener holds: claims depend on the real clock, and hypothesis
    # must see the same rules enabled whenever it replays the same choices.
    @rule(i=st.integers(0, 1), pick=st.integers(0, 99), outcome=st.sampled_from(OUTCOMES))
    def listener_completes(self, i: int, pick: int, outcome: str) -> None:
        if not any(self.claims):
            return
        self.step()
        claims = self.claims[i] or self.claims[1 - i]
        i = i if self.claims[i] else 1 - i
        c = claims.pop(pick % len(claims))
        s = self.sessions
        ok = outcome == "ok"
        recorded, _, busy, retry_at = s.listeners[i].execute(
            "CALL dispatch.complete_run(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (c.run_id, f"w{i}", c.attempt, "ok" if ok else "error", None if ok else "boom", None, 5,
             outcome in ("retryable", "retry-after"), 20 if outcome == "retry-after" else None)).fetchone()  # type: ignore[misc]
        status, attempt, attempts_left = s.clock.execute(
            "SELECT r.status, r.attempt, r.attempt - r.released < s.max_attempts"
            " FROM dispatch.runs r JOIN dispatch.schedules s ON s.id = r.schedule_id WHERE r.id = %s",
            (c.run_id,)).fetchone()  # type: ignore[misc]
        DispatchWalk.seen_outcomes["busy" if busy else "retried" if retry_at else "recorded" if recorded
                                   else "fenced"] += 1
        if busy:
            assert self.dba_open is not None, "busy with no other transaction open"
            assert (status, attempt) == ("running", c.attempt)
            claims.append(c)  # the listener keeps the outcome and tries again
        elif retry_at is not None:
            assert outcome != "ok" and (status, attempt) == ("pending", c.attempt) and attempts_left
            self.retry_at[c.run_id] = retry_at
        elif recorded:
            assert (status, attempt) == ("ok" if ok else "error", c.attempt)
            self.spent.append(c)
        else:  # fenced out: the run moved on without this attempt
            assert (status, attempt) != ("running", c.attempt)

    @rule(i=st.integers(0, 1), outcomes=st.lists(st.sampled_from(OUTCOMES), min_size=1, max_size=4),
          short_lease=st.booleans())
    def listener_works_a_round(self, i: int, outcomes: list[str], short_lease: bool) -> None:
        """What a listener does most: claim what is due and complete what it claimed (the last
        claims first: a short lease may have let the other listener take an earlier one)."""
        self.listener_claims(i, len(outcomes), short_lease)
        for outcome in outcomes:
            if not self.claims[i]:
                break
            self.listener_completes(i, len(self.claims[i]) - 1, outcome)

    @rule(i=st.integers(0, 1))
    def listener_is_killed(self, i: int) -> None:
        """kill -9: what it held is never completed nor released; its leases run out (an hour's
        lease as well: the walk's clock moves it to its end)."""
        self.step()
        # (not a run the DBA's open transaction holds: the clock would wait on it)
        self.sessions.clock.execute(
            "UPDATE dispatch.runs SET lease_until = claimed_at + interval '1 millisecond'"
            " WHERE id IN (SELECT id FROM dispatch.runs WHERE id = ANY (%s) AND status = 'running'"
            "              AND attempt = ANY (%s) FOR UPDATE SKIP LOCKED)",
            ([c.run_id for c in self.claims[i]], [c.attempt for c in self.claims[i]]))
        self.claims[i] = []

    @rule(i=st.integers(0, 1), pick=st.integers(0, 99))
    def listener_releases(self, i: int, pick: int) -> None:
        if not any(self.claims):
            return
        self.step()
        i = i if self.claims[i] else 1 - i
        c = self.claims[i].pop(pick % len(self.claims[i]))
        s = self.sessions
        released = one(s.listeners[i], "SELECT dispatch.release_runs(%s, %s, %s)",
                       (f"w{i}", [c.run_id], [c.attempt]))
        status, attempt = s.clock.execute(
            "SELECT status, attempt FROM dispatch.runs WHERE id = %s", (c.run_id,)).fetchone()  # type: ignore[misc]
        if released:  # handed back uninvoked: the token stays spent (invariant 7)
            assert attempt == c.attempt
            assert status in ("pending", "skipped", "error", "lost")
        self.spent.append(c)

    @rule(i=st.integers(0, 1), pick=st.integers(0, 99), release_it=st.booleans())
    def a_late_call_arrives_again(self, i: int, pick: int, release_it: bool) -> None:
        """A release or outcome of a claim that was already released or completed arrives again
        (a retried call, a duplicated message): it changes nothing, whoever holds the run now."""
        if not self.spent:
            return
        self.step()
        c = self.spent[pick % len(self.spent)]
        s = self.sessions
        before = s.clock.execute("SELECT status, attempt, worker FROM dispatch.runs WHERE id = %s",
                                 (c.run_id,)).fetchone()
        if release_it:
            changed = one(s.listeners[i], "SELECT dispatch.release_runs(%s, %s, %s)",
                          (f"w{i}", [c.run_id], [c.attempt]))
        else:
            changed, *_ = s.listeners[i].execute(
                "CALL dispatch.complete_run(%s, %s, %s, 'error', 'late', NULL, 5, true, NULL)",
                (c.run_id, f"w{i}", c.attempt)).fetchone()  # type: ignore[misc]
        assert not changed
        assert s.clock.execute("SELECT status, attempt, worker FROM dispatch.runs WHERE id = %s",
                               (c.run_id,)).fetchone() == before
        DispatchWalk.seen_outcomes["late call"] += 1
        if not release_it:
            DispatchWalk.seen_outcomes["fenced"] += 1  # an outcome of a spent token: fenced out

    # -- administrators -----------------------------------------------------------------------

    def admin_may_write(self) -> bool:
        return self.dba_open != "tick"

    @precondition(lambda self: len(self.schedules) < 6 and self.admin_may_write())
    @rule(expr=st.sampled_from(EXPRESSIONS), zone=st.sampled_from(ZONES), attempts=st.integers(1, 3),
          overlap=st.sampled_from(["skip", "buffer_one", "allow"]),
          catchup=st.sampled_from(["latest", "all"]),
          grace=st.sampled_from([None, "30 minutes", "3 hours"]), jitter=st.sampled_from(["0", "20 seconds"]),
          project=st.sampled_from(PROJECTS), calendar=st.booleans(), pause_after=st.sampled_from([None, 2]))
    def admin_adds(self, expr: str, zone: str, attempts: int, overlap: str, catchup: str,
                   grace: str | None, jitter: str, project: str, calendar: bool = False,
                   pause_after: int | None = None) -> None:
        self.step()
        # Back-offs of milliseconds: retries come due by the real clock within a few steps.
        self.schedules.append(str(one(
            self.sessions.admin,
            "INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, every, run_at,"
            " ends_at, max_runs, timezone, max_attempts, overlap, catchup, misfire_grace, retry_backoff,"
            " retry_backoff_max, jitter, calendar_id, pause_after_failures) VALUES (%s, 'fn', %s, %s,"
            " date_trunc('minute', now()) + %s::interval, now() + %s::interval, %s, %s, %s, %s, %s, %s,"
            " '5 milliseconds', '40 milliseconds', %s, %s, %s)"
            " RETURNING id",
            (project, *slot_rule(expr), zone, attempts, overlap, catchup if grace else "latest", grace,
             jitter, self.calendar if calendar else None, pause_after))))

    @precondition(lambda self: self.admin_may_write())
    @rule(after=st.integers(1, 90), minutes=st.sampled_from([1, 3, 20, 90]), remove=st.booleans())
    def admin_edits_the_calendar(self, after: int, minutes: int, remove: bool) -> None:
        """A period of the calendar added ahead of the marking horizon (so that no run marked so
        far lies in it), or one removed."""
        self.step()
        if remove:
            self.sessions.admin.execute(
                "DELETE FROM dispatch.calendar_exclusions WHERE id = (SELECT min(id) FROM"
                " dispatch.calendar_exclusions)")
            return
        self.sessions.admin.execute(
            "INSERT INTO dispatch.calendar_exclusions (calendar_id, starts, ends)"
            " SELECT %s, x.starts, x.starts + %s * interval '1 minute'"
            " FROM (SELECT (%s::timestamptz + %s * interval '1 minute') AT TIME ZONE 'Asia/Kolkata'"
            "       AS starts) x",
            (self.calendar, minutes, self.horizon, after))

    @rule(project=st.sampled_from(PROJECTS), cap=st.sampled_from(CAPS), weight=st.sampled_from(WEIGHTS),
          delete=st.sampled_from([False, False, False, True]))
    def admin_sets_a_project(self, project: str, cap: int | None, weight: int, delete: bool) -> None:
        """An administrator caps a project, lifts or lowers its cap, weighs it, or deletes its row
        (the defaults)."""
        self.step()
        if project == self.dba_project:
            return  # the DBA's open transaction holds its row: the administrator would wait on the DBA
        if delete:
            self.sessions.admin.execute("DELETE FROM dispatch.projects WHERE project_id = %s", (project,))
        else:
            self.sessions.admin.execute(
                "INSERT INTO dispatch.projects (project_id, max_concurrency, weight) VALUES (%s, %s, %s)"
                " ON CONFLICT (project_id) DO UPDATE"
                " SET max_concurrency = excluded.max_concurrency, weight = excluded.weight",
                (project, cap, weight))
        self.cap_committed(project, None if delete else cap)

    # (no precondition on what runs: that depends on the real clock, see listener_completes)
    @rule(i=st.integers(0, 1))
    def admin_lowers_a_cap_below_what_runs(self, i: int) -> None:
        """A listener claims what is due (up to 4, an hour's lease), then the cap of the project
        with the most running runs is lowered under them (to one, when one runs): the cap then
        only stops new claims. Few runs run at once in a walk, seldom when admin_sets_a_project
        is drawn."""
        self.listener_claims(i, 4, False)
        running = self.running()
        busiest = max(sorted(set(PROJECTS) - {self.dba_project}), key=lambda project: running[project])
        if not running[busiest]:
            return
        self.step()
        cap = max(running[busiest] - 1, 1)
        self.sessions.admin.execute(
            "INSERT INTO dispatch.projects (project_id, max_concurrency) VALUES (%s, %s)"
            " ON CONFLICT (project_id) DO UPDATE SET max_concurrency = excluded.max_concurrency",
            (busiest, cap))
        self.cap_committed(busiest, cap)

    @precondition(lambda self: self.schedules and self.admin_may_write())
    @rule(pick=st.integers(0, 99), project=st.sampled_from(PROJECTS), of_a_claimed_run=st.booleans())
    def admin_moves_a_schedule(self, pick: int, project: str, of_a_claimed_run: bool) -> None:
        """A schedule moves to another project, its open runs with it: running ones count against
        the new project's cap (they may take it above: the cap then stops new claims)."""
        self.step()
        sid = self.pick_claimed(pick) if of_a_claimed_run else self.pick(pick)
        if sid == self.dba_holds:
            return  # the DBA's open transaction holds it: the administrator would wait on the DBA
        try:
            self.sessions.admin.execute("UPDATE dispatch.schedules SET project_id = %s WHERE id = %s",
                                        (project, sid))
        except errors.InvalidParameterValue:
            assert sid in self.gone_zone
        running = self.running()
        for capped, cap in self.caps.items():
            if running[capped] > max(cap, self.ceiling[capped]):
                DispatchWalk.seen_outcomes["moved above a cap"] += 1
            self.ceiling[capped] = max(self.ceiling[capped], running[capped])

    @precondition(lambda self: self.schedules and self.admin_may_write())
    @rule(pick=st.integers(0, 99), change=st.sampled_from(
        ["cron", "args", "attempts", "disable", "enable", "pause", "resume", "delete"]),
        expr=st.sampled_from(EXPRESSIONS))
    def admin_changes(self, pick: int, change: str, expr: str) -> None:
        self.step()
        sid = self.pick(pick)
        if change in ("disable", "pause", "delete") and self.retry_at:
            # a stop while a run waits for its retry, when there is one: it ends with its last outcome
            waiting = self.sessions.clock.execute(
                "SELECT schedule_id::text FROM dispatch.runs WHERE id = ANY (%s) AND status = 'pending'"
                " ORDER BY id", (list(self.retry_at),)).fetchall()
            sid = waiting[pick % len(waiting)][0] if waiting else sid
        if sid == self.dba_holds:
            return  # the DBA's open transaction holds it: the administrator would wait on the DBA
        update = "UPDATE dispatch.schedules SET {} WHERE id = %s"
        statement, params = {
            "cron": (update.format("cron_expression = %s, every = %s,"
                                   " run_at = date_trunc('minute', now()) + %s::interval,"
                                   " ends_at = now() + %s::interval, max_runs = %s, starts_at = NULL"),
                     (*slot_rule(expr), sid)),
            "args": (update.format("args = jsonb_build_object('n', random())"), (sid,)),
            "attempts": (update.format("max_attempts = 1 + (max_attempts %% 3)"), (sid,)),
            "disable": (update.format("enabled = false"), (sid,)),
            "enable": (update.format("enabled = true"), (sid,)),
            "pause": ("SELECT dispatch.pause(%s, 'walk')", (sid,)),
            "resume": ("SELECT dispatch.resume(%s)", (sid,)),
            "delete": ("DELETE FROM dispatch.schedules WHERE id = %s", (sid,)),
        }[change]
        try:
            self.sessions.admin.execute(statement, params)
            if change == "cron":
                self.rule_changed.add(sid)
        except errors.InvalidParameterValue:
            assert sid in self.gone_zone  # a zone gone from tzdata: refused when it must be read
        except errors.ObjectNotInPrerequisiteState:
            assert change in ("pause", "resume")  # of a deleted schedule
            deleted = "SELECT deleted_at IS NOT NULL FROM dispatch.schedules WHERE id = %s"
            assert one(self.sessions.clock, deleted, (sid,))

    @precondition(lambda self: self.schedules and self.admin_may_write())
    @rule(pick=st.integers(0, 99))
    def admin_runs_now(self, pick: int) -> None:
        self.step()
        sid = self.pick(pick)
        if sid == self.dba_holds:
            return  # the DBA's open transaction holds it: the administrator would wait on the DBA
        try:
            self.sessions.admin.execute("SELECT dispatch.run_now(%s)", (sid,))
            DispatchWalk.seen_outcomes["run now"] += 1
        except errors.ObjectNotInPrerequisiteState as refused:
            reason = str(refused)  # busy (overlap skip, or buffer_one's buffer taken), or stopped
            assert any(why in reason
                       for why in ("overlap is skip", "waiting behind", "paused", "disabled", "deleted"))
        except errors.InvalidParameterValue:
            assert sid in self.gone_zone

    @precondition(lambda self: self.schedules and self.admin_may_write())
    @rule(pick=st.integers(0, 99), hours=st.integers(1, 3))
    def admin_backfills(self, pick: int, hours: int) -> None:
        self.step()
        sid = self.pick(pick)
        if sid == self.dba_holds:
            return  # the DBA's open transaction holds it: the administrator would wait on the DBA
        try:
            marked = one(self.sessions.admin,
                         "SELECT dispatch.backfill(%s, now() - %s * interval '1 hour', now())", (sid, hours))
            DispatchWalk.seen_outcomes["backfill" if marked else "backfill of nothing"] += 1
        except errors.ObjectNotInPrerequisiteState as refused:
            reason = str(refused)
            assert any(why in reason for why in ("paused", "disabled", "deleted"))
        except errors.InvalidParameterValue:
            assert sid in self.gone_zone

    @precondition(lambda self: self.schedules)
    @rule(pick=st.integers(0, 99), column_value=st.sampled_from(
        ["next_run_at = NULL", "next_run_at = now()", "last_slot = NULL", "cron_spec = NULL",
         "paused_at = now()"]))
    def admin_cannot_write_what_the_system_derives(self, pick: int, column_value: str) -> None:
        self.step()
        with pytest.raises(errors.InsufficientPrivilege):  # invariant 5
            self.sessions.admin.execute(f"UPDATE dispatch.schedules SET {column_value} WHERE id = %s",
                                        (self.pick(pick),))

    @rule()
    def listener_cannot_move_time(self) -> None:
        self.step()
        with pytest.raises(errors.InsufficientPrivilege):  # invariant 5
            self.sessions.listeners[0].execute("SELECT dispatch.tick(now() + interval '1 day')")

    # -- a DBA in psql ------------------------------------------------------------------------

    @precondition(lambda self: self.schedules and self.dba_open is None)
    @rule(pick=st.integers(0, 99), disable=st.booleans(), of_a_claimed_run=st.booleans())
    def dba_leaves_an_edit_open(self, pick: int, disable: bool, of_a_claimed_run: bool) -> None:
        self.step()
        # often a schedule with a run in flight: its completion then finds it held (busy)
        sid = self.pick_claimed(pick) if of_a_claimed_run else self.pick(pick)
        self.sessions.dba.execute(
            "UPDATE dispatch.schedules SET args = '{\"dba\": true}', enabled = enabled AND NOT %s"
            " WHERE id = %s",
            (disable, sid))
        self.dba_open, self.dba_holds = "edit", sid
        # the outcome of that run arrives now: busy, kept by the listener, never waited on
        held = [(i, c) for i, claims in enumerate(self.claims) for c in claims if c.schedule_id == sid]
        if of_a_claimed_run and held:
            i, c = held[0]
            running = self.sessions.clock.execute(
                "SELECT status = 'running' AND attempt = %s FROM dispatch.runs WHERE id = %s",
                (c.attempt, c.run_id)).fetchone()
            recorded, _, busy, _ = self.sessions.listeners[i].execute(
                "CALL dispatch.complete_run(%s, %s, %s, 'ok', NULL, 200, 5, false, NULL)",
                (c.run_id, f"w{i}", c.attempt)).fetchone()  # type: ignore[misc]
            assert (recorded, busy) == ((False, True) if running == (True,) else (False, False))
            if busy:
                DispatchWalk.seen_outcomes["busy"] += 1

    @precondition(lambda self: self.dba_open is None)
    @rule(project=st.sampled_from(PROJECTS), cap=st.sampled_from(CAPS))
    def dba_leaves_a_project_open(self, project: str, cap: int | None) -> None:
        """A change of a project's cap left open in psql: while it holds the row, every claim
        skips the project if it is capped, and no one else waits."""
        self.step()
        self.sessions.dba.execute(
            "INSERT INTO dispatch.projects (project_id, max_concurrency) VALUES (%s, %s)"
            " ON CONFLICT (project_id) DO UPDATE SET max_concurrency = excluded.max_concurrency",
            (project, cap))
        self.dba_open, self.dba_project, self.dba_cap = "project", project, cap

    @precondition(lambda self: self.dba_open is None)
    @rule()
    def dba_leaves_a_tick_open(self) -> None:
        self.step()
        self.sessions.dba.execute("SELECT dispatch.tick()")
        self.dba_open = "tick"

    @precondition(lambda self: self.dba_open is not None)
    @rule(commit=st.booleans())
    def dba_ends_the_transaction(self, commit: bool) -> None:
        self.step()
        dba = self.sessions.dba
        dba.commit() if commit else dba.rollback()
        if commit and self.dba_project is not None:
            self.cap_committed(self.dba_project, self.dba_cap)
        self.dba_open = self.dba_holds = self.dba_project = None

    @precondition(lambda self: self.schedules and self.dba_open is None)
    @rule(pick=st.integers(0, 99), gone=st.booleans(), of_a_claimed_run=st.booleans(),
          hours_later=st.integers(0, 2))
    def tzdata_changes(self, pick: int, gone: bool, of_a_claimed_run: bool, hours_later: int) -> None:
        """A tz database upgrade drops the schedule's zone (or a downgrade brings it back), and
        often hours pass before anyone notices: the back-off instants come due."""
        self.step()
        # often a schedule with a run in flight: its completion must then back off
        sid = self.pick_claimed(pick) if of_a_claimed_run else self.pick(pick)
        clock = self.sessions.clock
        clock.execute("SET session_replication_role = replica")  # the write path would refuse it
        clock.execute("UPDATE dispatch.schedules SET timezone = %s WHERE id = %s",
                      ("Gone/Away" if gone else "UTC", sid))
        clock.execute("RESET session_replication_role")
        (self.gone_zone.add if gone else self.gone_zone.discard)(sid)
        self.rule_changed.add(sid)
        for _ in range(hours_later):
            self.an_hour_passes()

    # -- what no step may break -----------------------------------------------------------------

    def teardown(self) -> None:
        """8. Every slot accounted for: from a schedule's creation up to the slot it stands on
        (or stood on when it stopped), each slot of its rule is a run or lies in one recorded gap,
        and no slot with a scheduled run is also in a gap."""
        if self.dba_open is not None:
            self.sessions.dba.rollback()
            self.dba_open = self.dba_holds = self.dba_project = None
        for sid in set(self.schedules) - self.rule_changed:
            row = self.sessions.clock.execute(ACCOUNTING, {"sid": sid}).fetchone()
            assert row is not None
            unaccounted, doubly = row
            assert unaccounted is None, f"schedule {sid}: slots neither run nor in a gap: {unaccounted}"
            assert doubly is None, f"schedule {sid}: slots both run and in a recorded gap: {doubly}"
            DispatchWalk.seen_outcomes["slots accounted for"] += 1

    @invariant()
    def invariants_hold(self) -> None:
        clock = self.sessions.clock
        # 2. live <=> a next slot, always later than every finished slot
        assert clock.execute("""
            SELECT s.id FROM dispatch.schedules s
            WHERE (s.next_run_at IS NOT NULL)
                  <> (s.enabled AND s.deleted_at IS NULL AND s.paused_at IS NULL AND s.ended_at IS NULL)
               OR EXISTS (SELECT 1 FROM dispatch.runs r
                          WHERE r.schedule_id = s.id AND r.kind = 'scheduled'
                            AND r.status IN ('ok', 'error', 'skipped', 'lost')
                            AND r.scheduled_for >= s.next_run_at)""").fetchall() == []
        # 1. a slot is one run; at most one open run per schedule under overlap skip, one and one
        # waiting behind it under buffer_one; backfill runs waiting their turn aside, of which
        # one at most is let go at a time
        assert clock.execute("""
            SELECT r.schedule_id FROM dispatch.runs r JOIN dispatch.schedules s ON s.id = r.schedule_id
            GROUP BY r.schedule_id, s.overlap
            HAVING count(*) <> count(DISTINCT r.scheduled_for)
                OR (s.overlap = 'skip'
                    AND count(*) FILTER (WHERE r.status IN ('pending', 'running')
                                           AND r.not_before IS DISTINCT FROM 'infinity') > 1)
                OR (s.overlap = 'buffer_one'
                    AND (count(*) FILTER (WHERE r.status IN ('pending', 'running')
                                            AND r.not_before IS DISTINCT FROM 'infinity') > 1
                         OR count(*) FILTER (WHERE r.not_before = 'infinity' AND r.kind <> 'backfill') > 1))
                OR count(*) FILTER (WHERE r.kind = 'backfill' AND r.status IN ('pending', 'running')
                                      AND r.not_before IS DISTINCT FROM 'infinity') > 1""").fetchall() == []
        # 4. every finished run has exactly one audit row, an open one none; no run disappears
        assert clock.execute("""
            SELECT r.id FROM dispatch.runs r
            LEFT JOIN dispatch.audit_log a
              ON a.action LIKE 'schedule.run.%' AND a.metadata->>'runId' = r.id::text
            GROUP BY r.id, r.status
            HAVING count(a.id) <> CASE WHEN r.status IN ('pending', 'running') THEN 0 ELSE 1 END
            """).fetchall() == []
        # (with each capped project's cap and running runs: one round trip less a step)
        runs_count, caps = clock.execute(
            "SELECT (SELECT count(*) FROM dispatch.runs),"
            "       (SELECT coalesce(jsonb_object_agg(p.project_id, jsonb_build_array(p.max_concurrency,"
            "                          (SELECT count(*) FROM dispatch.runs r"
            "                           WHERE r.status = 'running' AND r.project_id = p.project_id))), '{}')"
            "        FROM dispatch.projects p WHERE p.max_concurrency IS NOT NULL)").fetchone()  # type: ignore[misc]
        # 10. no capped project runs more than its cap, but for runs that ran before the cap came
        # (or before their schedule moved in), of which none is replaced; the model's caps are
        # the committed ones
        assert {project: cap for project, (cap, _) in caps.items()} == self.caps
        for project, (cap, running) in caps.items():
            assert running <= self.ceiling[project], \
                f"{project}: {running} running, above its cap {cap} and the {self.ceiling[project]} it had"
            self.ceiling[project] = max(cap, running)
        for status, error in clock.execute(
                "SELECT status, CASE WHEN error LIKE 'missed by %%' THEN 'missed by'"
                " WHEN status = 'error' THEN 'stopped in its back-off' ELSE left(error, 20) END"
                " FROM dispatch.runs"
                " WHERE (status IN ('skipped', 'lost') OR error LIKE '%%not retried: schedule%%')"
                " AND id > %s",
                (self.last_seen_run,)):
            DispatchWalk.seen_outcomes[f"{status}: {error}"] += 1
        self.last_seen_run = one(clock, "SELECT coalesce(max(id), 0) FROM dispatch.runs WHERE status NOT IN"
                                        " ('pending', 'running')")
        assert runs_count >= self.runs_count
        self.runs_count = runs_count
        # a slot in a period of its schedule's calendar is never marked (it may be recorded
        # missed, beyond the grace); periods are only ever added ahead of what was marked, so
        # the runs marked since the last step are the ones to check
        assert clock.execute("""
            SELECT r.id FROM dispatch.runs r JOIN dispatch.schedules s ON s.id = r.schedule_id
            WHERE r.id > %s AND s.calendar_id IS NOT NULL AND r.kind IN ('scheduled', 'backfill')
              AND dispatch.calendar_excludes(s.calendar_id, r.scheduled_for)
              AND NOT (r.status = 'skipped' AND r.error LIKE 'missed by %%')""",
            (self.last_marked,)).fetchall() == []
        self.last_marked = one(clock, "SELECT coalesce(max(id), 0) FROM dispatch.runs")
        for gaps, paused in clock.execute(
                "SELECT count(*) FILTER (WHERE metadata->>'reason' = 'calendar'),"
                " count(*) FILTER (WHERE action = 'schedule.pause' AND actor_id IS NULL)"
                " FROM dispatch.audit_log WHERE id > %s", (self.last_audit,)):
            DispatchWalk.seen_outcomes["calendar gap"] += gaps
            DispatchWalk.seen_outcomes["paused itself"] += paused
        self.last_audit = one(clock, "SELECT coalesce(max(id), 0) FROM dispatch.audit_log")
        # 6. a back-off instant (neither on a minute nor on an interval's slot from the creation
        # time) is recorded skipped, never attempted
        assert clock.execute("""
            SELECT r.id FROM dispatch.runs r JOIN dispatch.schedules s ON s.id = r.schedule_id
            WHERE r.scheduled_for <> date_trunc('minute', r.scheduled_for) AND r.kind = 'scheduled'
              AND NOT EXISTS (SELECT 1 FROM unnest(%s::interval[]) e(every)
                              WHERE mod(extract(epoch FROM r.scheduled_for - s.created_at),
                                        extract(epoch FROM e.every)) = 0)
              AND NOT (r.status = 'skipped' AND r.attempt = r.released)""",
            ([every for e in EXPRESSIONS if (every := slot_rule(e)[1])],)).fetchall() == []


# dispatch.explain against what the next tick and claim do, added to the walk from outside the
# class body: hypothesis derives the CI walk's fixed seed from the class's source, so an edit in
# it is another walk, which need not reach the rare outcomes the test requires.
def explain_agrees_in(walk: DispatchWalk) -> None:
    """For every schedule, dispatch.explain's verdict (and each open run's) is what the next tick
    and claim do: they run after it in one transaction, which is then rolled back. Not while the
    DBA leaves a tick open (it holds what it ticked); the schedule an open edit holds is left out
    (in a capped project, the others' verdicts give its held run's room to the runs after it, as
    the claim's SKIP LOCKED does)."""
    if walk.dba_open == "tick":
        return
    seen = explain_agrees(walk.sessions.clock, skip=[walk.dba_holds] if walk.dba_holds else [])
    DispatchWalk.seen_outcomes.update({f"explain {verdict}": n for verdict, n in seen.items()})


_teardown = DispatchWalk.teardown


def _explain_then_teardown(walk: DispatchWalk) -> None:
    explain_agrees_in(walk)
    _teardown(walk)


DispatchWalk.teardown = _explain_then_teardown  # type: ignore[method-assign]


class DispatchWalkExplainedEveryFewSteps(DispatchWalk):
    """PGDISPATCH_STATEFUL_EXPLAIN_EVERY=N: the walk, with explain checked after every N-th step."""

    steps_taken = 0

    @invariant()
    def explain_agrees_every_few_steps(self) -> None:
        self.steps_taken += 1
        if self.steps_taken % EXPLAIN_EVERY == 0:
            explain_agrees_in(self)


# The slots of a schedule's rule from its creation up to the slot it stands on (live) or stood
# on (stopped), less those with a run (scheduled or backfill) or in a recorded gap.
ACCOUNTING = """
    WITH s AS (
        SELECT s.*, coalesce(s.next_run_at, CASE WHEN s.ended_at IS NOT NULL THEN 'infinity'::timestamptz END,
                             s.stopped_on,
                             (SELECT max(r.scheduled_for) + interval '1 microsecond' FROM dispatch.runs r
                              WHERE r.schedule_id = s.id AND r.kind = 'scheduled'),
                             s.created_at) AS upto
        FROM dispatch.schedules s WHERE s.id = %(sid)s
    ), expected AS (
        SELECT slot FROM s, dispatch._cron_slots(s.cron_spec, s.created_at, s.upto - interval '1 microsecond',
                                                 s.timezone, 50000) AS slot
    ), in_gaps AS (
        SELECT slot
        FROM s
        JOIN dispatch.audit_log a
          ON a.action = 'schedule.slots.skipped' AND a.metadata->>'scheduleId' = s.id::text
        CROSS JOIN LATERAL dispatch._cron_slots(
            s.cron_spec, (a.metadata->>'first')::timestamptz - interval '1 microsecond',
            (a.metadata->>'last')::timestamptz, s.timezone, 50000) AS slot
    )
    SELECT (SELECT array_agg(e.slot ORDER BY e.slot) FROM expected e
            WHERE NOT EXISTS (SELECT 1 FROM dispatch.runs r
                              WHERE r.schedule_id = %(sid)s AND r.scheduled_for = e.slot
                                AND r.kind IN ('scheduled', 'backfill'))
              AND NOT EXISTS (SELECT 1 FROM in_gaps g WHERE g.slot = e.slot)),
           (SELECT array_agg(g.slot) FROM in_gaps g
            JOIN dispatch.runs r
              ON r.schedule_id = %(sid)s AND r.kind = 'scheduled' AND r.scheduled_for = g.slot)
"""


@pytest.fixture
def sessions(db: psycopg.Connection, connect: Callable[..., psycopg.Connection]) -> Iterator[Sessions]:
    roles = {"listener": "dispatch_listener", "admin": "dispatch_admin"}
    for name, group in roles.items():
        db.execute(f"DROP ROLE IF EXISTS pgdispatch_walk_{name}")
        db.execute(f"CREATE ROLE pgdispatch_walk_{name} LOGIN IN ROLE {group}")
    params = db.info.get_parameters()
    opened: list[psycopg.Connection] = []

    def as_role(name: str) -> psycopg.Connection:
        conn = psycopg.connect(**{**params, "user": f"pgdispatch_walk_{name}"}, autocommit=True)
        conn.execute(NO_WAIT)
        opened.append(conn)
        return conn

    # Breakers that open within a walk (three retryable failures in a row of its one function)
    # and probe within a few steps, as back-offs do: an open breaker's held runs and probes meet
    # the other rules' stops, edits and late calls.
    db.execute("UPDATE dispatch.settings SET breaker_threshold = 3,"
               " breaker_probe_spacing = '10 milliseconds', breaker_probe_spacing_max = '40 milliseconds'")
    clock, dba = connect(), connect(autocommit=False)
    dba.execute(NO_WAIT)
    dba.commit()
    try:
        yield Sessions(clock=clock, listeners=[as_role("listener"), as_role("listener")],
                       admin=as_role("admin"), dba=dba)
    finally:
        dba.rollback()
        for conn in opened:
            conn.close()
        for name in roles:
            db.execute(f"DROP ROLE pgdispatch_walk_{name}")


# the verdicts of dispatch.explain every CI walk checks (the rarer ones are in tests/test_explain.py)
EXPLAIN_STATES = ("live", "busy", "pending", "paused", "disabled", "deleted", "capped", "ended")


def walk_by_hand(sessions: Sessions) -> None:
    """A walk given step by step, through the same rules, invariants and end-of-walk checks as the
    random ones. It reaches what a fixed seed's walks may miss: an edit of the rules draws other
    walks (hypothesis seeds them from the class's source), and which outcomes those reach depends
    on timing. Here: an outcome the DBA's open edit makes busy, a stop during a retry's back-off,
    and a walk that ends on a paused schedule; then two runs of one project running, its cap
    lowered below them, and claims of its next runs that take none (the DBA holding its row for
    one of them); a claim of one that goes past a project whose due run the DBA's open disable
    holds; and a walk that ends on a schedule whose due run the cap holds. A second walk: a
    zone gone from tzdata under a claimed run, and the back-off instant recorded skipped; a
    lease of a run's last attempt that expires. A third: a slot in a period of the calendar,
    passed over as a gap, a schedule that pauses itself after two failed runs, and a walk that
    ends on a schedule whose next slot a period holds."""
    walk = DispatchWalk()
    steps: list[Callable[[], None]] = [
        lambda: walk.admin_adds("* * * * *", "UTC", 3, "skip", "latest", None, "0", "pa"),
        walk.time_passes,
        walk.time_passes,  # two minutes: its first slot is due even if a minute began since the walk's
        lambda: walk.listener_claims(0, 1, False),
        lambda: walk.dba_leaves_an_edit_open(0, False, True),  # busy
        lambda: walk.dba_ends_the_transaction(True),
        lambda: walk.listener_completes(0, 0, "retryable"),  # retried, its back-off begins
        lambda: walk.admin_changes(0, "pause", "* * * * *"),  # stopped in its back-off
        lambda: walk.admin_adds("* * * * *", "UTC", 3, "allow", "latest", None, "0", "pb"),
        lambda: walk.admin_adds("* * * * *", "UTC", 3, "allow", "latest", None, "0", "pb"),
        walk.time_passes,
        walk.time_passes,
        lambda: walk.listener_claims(1, 4, False),  # both of pb's due runs
        lambda: walk.admin_lowers_a_cap_below_what_runs(1),  # pb capped at 1, 2 running
        lambda: walk.admin_adds("* * * * *", "UTC", 3, "skip", "latest", None, "0", "pb"),
        walk.time_passes,
        walk.time_passes,  # each of pb's schedules has a run due (the first two: overlap allow)
        lambda: walk.dba_leaves_a_project_open("pb", 1),
        lambda: walk.listener_claims(1, 4, False),  # pb's row held: none of its runs
        lambda: walk.dba_ends_the_transaction(False),
        lambda: walk.listener_claims(1, 4, False),  # pb above its cap: none of its runs
        lambda: walk.admin_adds("* * * * *", "UTC", 3, "skip", "latest", None, "0", "pc"),
        lambda: walk.admin_adds("* * * * *", "UTC", 3, "skip", "latest", None, "0", "pa"),
        walk.time_passes,
        walk.time_passes,
        lambda: walk.dba_leaves_an_edit_open(4, True, False),  # pc's due run, which the disable ends
        # a claim of one from after pa (listener 0's last claim): pb is at its cap, pc's run held,
        # so it goes on to pa's new run
        lambda: walk.listener_claims(0, 1, False),
        lambda: walk.dba_ends_the_transaction(False),
    ]
    for step in steps:
        step()
        walk.invariants_hold()
    walk.teardown()

    # A zone that vanishes under a claimed run: its completion backs the schedule off; the zone
    # comes back and, an hour on, the back-off instant is recorded skipped. Meanwhile a lease
    # of a run with one attempt expires: lost.
    walk = DispatchWalk()
    steps = [
        lambda: walk.admin_adds("* * * * *", "UTC", 1, "skip", "latest", None, "0", "pa"),
        lambda: walk.admin_adds("* * * * *", "UTC", 1, "skip", "latest", None, "0", "pb"),
        walk.time_passes,
        walk.time_passes,
        lambda: walk.listener_claims(0, 1, False),  # pa's (the claims go round from the first project)
        lambda: walk.listener_claims(1, 1, True),  # pb's, for a millisecond
        lambda: walk.tzdata_changes(0, True, True, 0),  # pa's zone
        lambda: walk.listener_completes(0, 0, "ok"),  # its next slot cannot be computed
        lambda: walk.tzdata_changes(0, False, False, 1),  # the tick an hour on finds pb's lease over
        walk.time_passes,
        walk.time_passes,
    ]
    for step in steps:
        step()
        walk.invariants_hold()
    walk.teardown()

    walk = DispatchWalk()
    steps = [
        lambda: walk.admin_adds("* * * * *", "UTC", 3, "skip", "latest", None, "0", "pa", True),
        lambda: walk.admin_adds("* * * * *", "UTC", 1, "skip", "latest", None, "0", "pb", False, 2),
        lambda: walk.admin_edits_the_calendar(1, 3, False),  # pa's first three slots
        walk.time_passes,
        walk.time_passes,  # pa's passed over: a gap, calendar; pb's first slot due
        lambda: walk.listener_works_a_round(0, ["error"], False),
        walk.time_passes,
        lambda: walk.listener_works_a_round(0, ["error"], False),  # pb's second failure: it pauses itself
        lambda: walk.admin_edits_the_calendar(1, 3, False),  # pa's next slot, not due yet
    ]
    for step in steps:
        step()
        walk.invariants_hold()
    walk.teardown()


@pytest.mark.alone  # which outcomes the walk reaches depends on timing (leases of 1 ms)
def test_random_walks_keep_the_invariants(sessions: Sessions) -> None:
    DispatchWalk.sessions = sessions
    DispatchWalk.steps = 0
    DispatchWalk.seen_outcomes.clear()
    walk_by_hand(sessions)
    by_hand = dict(DispatchWalk.seen_outcomes)
    by_hand_reaches = {"busy", "retried", "error: stopped in its back-off", "explain state paused",
                       "cap below running", "claim skips a held project", "claim exact at a cap",
                       "claim beside held runs", "skipped: cannot compute the n",
                       "lost: lease of w1 expired ", "explain state capped", "explain open run capped",
                       "calendar gap", "explain state excluded", "paused itself"}
    assert by_hand_reaches <= set(by_hand), by_hand
    DispatchWalk.steps = 0
    machine = DispatchWalkExplainedEveryFewSteps if EXPLAIN_EVERY else DispatchWalk
    run_state_machine_as_test(machine, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=STEPS_PER_EXAMPLE, derandomize=FIXED_SEED,
        # the fixed walk never replays examples an earlier version of the rules saved
        database=None if FIXED_SEED else settings.default.database,
        deadline=None, suppress_health_check=list(HealthCheck)))
    print(f"stateful walk: {DispatchWalk.steps} steps in {EXAMPLES} walks, every invariant held;"
          f" reached (the walk by hand's {by_hand} among them):"
          f" {dict(sorted(DispatchWalk.seen_outcomes.items()))}")
    assert DispatchWalk.steps >= EXAMPLES * STEPS_PER_EXAMPLE // 2
    reached = DispatchWalk.seen_outcomes
    expected = ["backfill", "busy", "fenced", "recorded", "retried", "retry claimed", "run now",
                "skipped: schedule", "skipped: cannot compute", "skipped: missed by", "lost: lease",
                "late call", "slots accounted for", "error: stopped in its back-off", "claim exact",
                *(f"explain state {v}" for v in EXPLAIN_STATES),
                *(f"explain open run {v}" for v in ("pending", "running", "buffered", "waits_turn"))]
    for outcome in expected:
        assert any(seen.startswith(outcome) for seen in reached), f"the walks never reached {outcome!r}"
