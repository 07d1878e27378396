"""The claim's walk as a property: for random weights, caps, due and running counts and cursor
positions, one dispatch.claim_runs(n) lists each project once, takes exactly min(n, what the
caps allow), shares by weight within one run per project, never exceeds a cap; takes what it may
past the projects whose due runs another claimer holds; and a project with due runs is served
within ceil(total weight / n) + 1 consecutive claims."""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.runs_kit import scalar

NAMES = [f"p{i}" for i in range(10)]


@dataclass(frozen=True)
class Project:
    name: str
    weight: int
    cap: int | None
    due: int
    running: int

    def allowance(self) -> int:
        """How many of its due runs a claim may take, caps aside from the claim's size."""
        room = self.due if self.cap is None else max(self.cap - self.running, 0)
        return min(self.due, room)


@st.composite
def projects(draw: st.DrawFn, *, capped: bool = True) -> list[Project]:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=8, unique=True))
    out = []
    for name in sorted(names):
        cap = draw(st.one_of(st.none(), st.integers(1, 6))) if capped else None
        out.append(Project(name, draw(st.sampled_from([1, 1, 1, 2, 3, 5, 40])), cap,
                           draw(st.integers(0, 12)), draw(st.integers(0, 4)) if cap else 0))
    return out


def set_up(db: psycopg.Connection, ps: list[Project], cursor: str) -> None:
    db.execute("TRUNCATE dispatch.runs, dispatch.audit_log, dispatch.projects, dispatch.schedules")
    for p in ps:
        db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
                   " SELECT %s, 'fn', '* * * * *' FROM generate_series(1, %s)", (p.name, p.due + p.running))
    db.execute("UPDATE dispatch.schedules"
               " SET next_run_at = date_trunc('minute', now() - interval '1 minute')")
    db.execute("SELECT dispatch.tick()")
    for p in ps:
        db.execute("UPDATE dispatch.runs SET status = 'running', attempt = 1, worker = 'other',"
                   " claimed_at = now(), lease_until = now() + interval '1 hour'"
                   " WHERE id IN (SELECT id FROM dispatch.runs WHERE project_id = %s ORDER BY id LIMIT %s)",
                   (p.name, p.running))
        if p.cap is not None or p.weight != 1:
            db.execute("INSERT INTO dispatch.projects (project_id, max_concurrency, weight)"
                       " VALUES (%s, %s, %s)", (p.name, p.cap, p.weight))
    db.execute("SELECT set_config('dispatch.claim_cursor', %s, false)", (cursor,))


def in_turn(ps: list[Project], cursor: str) -> list[Project]:
    """The projects with due runs in the walk's order: after the cursor, then around to it."""
    due = [p for p in ps if p.due > 0]
    return [p for p in due if p.name > cursor] + [p for p in due if p.name <= cursor]


def water_level(ps: list[Project], n: int) -> float:
    """x such that the sum of min(allowance, x * weight) is min(n, the sum of allowances)."""
    goal = min(n, sum(p.allowance() for p in ps))
    lo, hi = 0.0, float(n)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(min(p.allowance(), mid * p.weight) for p in ps) < goal else (lo, mid)
    return hi


def claim_projects(db: psycopg.Connection, n: int) -> Counter[str]:
    rows = db.execute("SELECT project_id FROM dispatch.claim_runs('w', %s, '1 hour')", (n,)).fetchall()
    return Counter(str(r[0]) for r in rows)


CURSORS = st.sampled_from(["", "p0", "p35", "p5", "p9", "q"])
SETTINGS = settings(max_examples=int(os.environ.get("PGDISPATCH_CLAIM_WALK_EXAMPLES", "80")), deadline=None,
                    database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@SETTINGS
@given(ps=projects(), cursor=CURSORS, n=st.integers(1, 16))
# a project emptied by exactly its share rounded down: its share's remainder goes to the others
@example(ps=[Project("p0", 1, None, 1, 0), Project("p1", 1, None, 1, 0), Project("p2", 40, None, 2, 0),
             Project("p5", 40, None, 4, 0)], cursor="", n=6)
@example(ps=[Project("p0", 40, None, 2, 0), Project("p1", 40, None, 10, 0), Project("p4", 1, None, 1, 0),
             Project("p5", 3, None, 1, 0), Project("p6", 5, None, 1, 0)], cursor="", n=13)
def test_one_claim_takes_what_the_caps_allow_shared_by_weight(db: psycopg.Connection, ps: list[Project],
                                                              cursor: str, n: int) -> None:
    set_up(db, ps, cursor)
    order = in_turn(ps, cursor)
    listed = db.execute("SELECT dispatch._claimable_projects(%s, %s)", (cursor, n)).fetchone()
    assert listed is not None and (listed[0] or []) == [p.name for p in order][:n]

    took = claim_projects(db, n)
    usable = [p for p in order if p.allowance() > 0][:n]
    assert sum(took.values()) == min(n, sum(p.allowance() for p in usable))
    assert set(took) <= {p.name for p in usable}
    level = water_level(usable, n)
    for p in usable:
        if p.allowance() <= level * p.weight:
            assert p.allowance() - 1 <= took[p.name] <= p.allowance(), (p, took, level)
        else:
            assert abs(took[p.name] - level * p.weight) <= 1 + 1e-9, (p, took, level)
    running = dict(db.execute("SELECT project_id, count(*) FROM dispatch.runs"
                              " WHERE status = 'running' GROUP BY 1").fetchall())
    for p in ps:
        if p.cap is not None:
            assert running.get(p.name, 0) <= max(p.cap, p.running)


@SETTINGS
@given(ps=projects(), held=st.lists(st.integers(0, 12), min_size=8, max_size=8), cursor=CURSORS,
       n=st.integers(1, 16))
# the projects listed after the held ones, more than the claim's room, are each tried
@example(ps=[Project("p0", 1, None, 1, 0), Project("p1", 1, 1, 1, 1), Project("p2", 1, None, 1, 0),
             Project("p3", 1, None, 1, 0), Project("p5", 1, None, 1, 0)],
         held=[1, 0, 1, 0, 1, 0, 0, 0], cursor="p35", n=1)
def test_one_claim_takes_what_other_claimers_left(db: psycopg.Connection,
                                                   connect: Callable[..., psycopg.Connection],
                                                   ps: list[Project], held: list[int], cursor: str,
                                                   n: int) -> None:
    set_up(db, ps, cursor)
    with connect(autocommit=False) as other:  # a claimer that locked some runs, not committed yet
        free = {}
        for p, h in zip(ps, held, strict=False):
            locked = other.execute("SELECT id FROM dispatch.runs WHERE project_id = %s AND status = 'pending'"
                                   " ORDER BY random() LIMIT %s FOR UPDATE", (p.name, h)).fetchall()
            free[p.name] = min(p.due - len(locked), p.allowance())
        took = claim_projects(db, n)
    assert sum(took.values()) == min(n, sum(free.values())), (free, took)
    assert all(took[name] <= free[name] for name in took)


@SETTINGS
@given(ps=projects(capped=False), cursor=CURSORS, n=st.integers(1, 16))
@example(ps=[Project("p0", 1, None, 1, 0), Project("p1", 2, None, 4, 0), Project("p2", 2, None, 4, 0),
             Project("p3", 1, None, 0, 0), Project("p4", 1, None, 1, 0)], cursor="", n=3)
def test_every_project_with_due_runs_is_served_within_its_turn(db: psycopg.Connection, ps: list[Project],
                                                               cursor: str, n: int) -> None:
    set_up(db, ps, cursor)
    pending = {p.name: p.due for p in ps}
    weights = {p.name: p.weight for p in ps}
    # consecutive claims that left a project out while it had runs due, and the bound of that
    # wait: from the total weight when it began (the total only falls as projects run out)
    waiting = {p.name: 0 for p in ps}
    bound = {p.name: 0 for p in ps}
    while any(pending.values()):
        total_weight = sum(weights[name] for name, left in pending.items() if left)
        took = claim_projects(db, n)
        for name, left in pending.items():
            if not left:
                continue
            if waiting[name] == 0:
                bound[name] = math.ceil(total_weight / n) + 1
            waiting[name] = 0 if took[name] else waiting[name] + 1
            assert waiting[name] < bound[name], (name, waiting, took, pending)
            pending[name] = left - took[name]
    assert scalar(db, "SELECT count(*) FROM dispatch.runs WHERE status = 'pending'") == 0


@pytest.mark.parametrize("storm", [False, True], ids=["few waiting", "a storm of waiting runs"])
def test_the_walk_lists_the_projects_whose_waiting_runs_may_start(db: psycopg.Connection,
                                                                  storm: bool) -> None:
    """Runs that wait for their instant (retries, jittered slots) are listed by their project
    once the instant is over, never before: read off the front of the waiting runs when it is
    short, walked project by project beyond 5,000 (a storm of retries): the same answer."""
    db.execute("TRUNCATE dispatch.runs, dispatch.audit_log, dispatch.projects, dispatch.schedules")
    # p0, p3: on their slot; p1, p4, p7: waiting, instant over; p2, p5: waiting, instant ahead;
    # p6 both over and ahead; p8, p9 nothing
    counts = {"p0": 2, "p1": 5001 if storm else 3, "p2": 4, "p3": 1, "p4": 2, "p5": 3, "p6": 4, "p7": 1}
    for name, count in counts.items():
        db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
                   " SELECT %s, 'fn', '* * * * *' FROM generate_series(1, %s)", (name, count))
    db.execute("UPDATE dispatch.schedules"
               " SET next_run_at = date_trunc('minute', now() - interval '1 minute')")
    db.execute("SELECT dispatch.tick()")
    db.execute("UPDATE dispatch.runs SET not_before = now() - interval '1 second'"
               " WHERE project_id IN ('p1', 'p4', 'p7')")
    db.execute("UPDATE dispatch.runs SET not_before = now() + interval '1 hour'"
               " WHERE project_id IN ('p2', 'p5')")
    db.execute("UPDATE dispatch.runs SET not_before = now() + CASE WHEN id % 2 = 0 THEN interval '1 hour'"
               " ELSE interval '-1 second' END WHERE project_id = 'p6'")
    waiting_over = scalar(db, "SELECT count(*) FROM dispatch.runs WHERE not_before <= now()")
    assert (waiting_over > 5000) == storm
    claimable = ["p0", "p1", "p3", "p4", "p6", "p7"]
    for after, upto, n in [("", None, 100), ("", None, 3), ("p1", None, 100), ("p3", "p6", 100),
                           ("p7", None, 5)]:
        expected = [p for p in claimable if p > after and (upto is None or p <= upto)][:n]
        got = scalar(db, "SELECT dispatch._claimable_between(%s, %s, %s, f.waiting, f.whole)"
                         " FROM dispatch._claimable_front() f", (after, upto, n))
        assert (got or []) == expected, (after, upto, n)
