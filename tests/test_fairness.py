"""Fairness between tenants: claims and the tick's chunks take due work project by project
(weighted by dispatch.projects.weight), and max_concurrency caps a project's running runs across
every claimer. Real sessions; concurrent claimers interleave through open transactions."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.runs_kit import YEARLY, claim, expire, make_due, release, scalar

Connect = Callable[..., psycopg.Connection]


def add_many(db: psycopg.Connection, project: str, n: int, expr: str = "* * * * *") -> None:
    db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
               " SELECT %s, 'fn', %s FROM generate_series(1, %s)", (project, expr, n))


def projects_of(runs: list[tuple[Any, ...]]) -> Counter[str]:
    return Counter(str(r[2]) for r in runs)


def burst(db: psycopg.Connection, big: int = 500, small: tuple[str, ...] = ("b", "c", "d")) -> None:
    """Tenant a's `big` schedules and one each of the small tenants, all due at one instant, marked."""
    add_many(db, "a", big)
    for p in small:
        add_many(db, p, 1)
    make_due(db)
    assert scalar(db, "SELECT dispatch.tick()") == big + len(small)


def test_a_claim_takes_each_projects_first_run_before_anyones_second(db: psycopg.Connection) -> None:
    burst(db)
    first = claim(db, "w", 10)
    assert len(first) == 10
    assert projects_of(first) == {"a": 7, "b": 1, "c": 1, "d": 1}
    # one project alone still gets full batches
    assert projects_of(claim(db, "w", 100)) == {"a": 100}


def test_claims_go_round_robin_when_more_projects_are_due_than_a_claim_takes(db: psycopg.Connection) -> None:
    for p in "pqrstu":
        add_many(db, p, 3)
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    seen = [sorted(projects_of(claim(db, "w", 2))) for _ in range(3)]
    assert seen == [["p", "q"], ["r", "s"], ["t", "u"]]  # each project once before any twice
    assert sorted(projects_of(claim(db, "w", 2))) == ["p", "q"]  # and around again


def test_weights_share_a_claim(db: psycopg.Connection) -> None:
    add_many(db, "heavy", 50)
    add_many(db, "light", 50)
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    db.execute("INSERT INTO dispatch.projects (project_id, weight) VALUES ('heavy', 3)")
    assert projects_of(claim(db, "w", 8)) == {"heavy": 6, "light": 2}


def test_max_concurrency_holds_across_concurrent_claimers(db: psycopg.Connection, connect: Connect) -> None:
    burst(db, big=20, small=("b",))
    add_many(db, "b", 5, "0 0 1 1 *")
    db.execute("SELECT dispatch.tick(now() + interval '1 year')")
    db.execute("INSERT INTO dispatch.projects (project_id, max_concurrency) VALUES ('a', 3)")
    one, two = connect(autocommit=False), connect(autocommit=False)
    # the first claimer holds a's row until it commits: the second skips a, takes b's others
    first = claim(one, "one", 8)
    second = claim(two, "two", 8)
    assert projects_of(first) == {"a": 3, "b": 5}  # a: its cap, b: the rest of the batch
    assert projects_of(second) == {"b": 1}
    one.commit()
    two.commit()
    # now a has 3 running: nobody gets a fourth
    assert projects_of(claim(two, "two", 10))["a"] == 0
    two.commit()
    assert scalar(db, "SELECT count(*) FROM dispatch.runs WHERE project_id = 'a' AND status = 'running'") == 3


def test_max_concurrency_holds_across_a_release_and_an_expiry(db: psycopg.Connection) -> None:
    burst(db, big=20, small=())
    db.execute("INSERT INTO dispatch.projects (project_id, max_concurrency) VALUES ('a', 2)")
    held = claim(db, "w", 10, lease="1 second")
    assert len(held) == 2
    assert claim(db, "w", 10) == []
    release(db, "w", held[:1])
    assert len(claim(db, "w", 10)) == 1  # the released slot, and only it
    expire(db, held[1][0])  # its lease runs out: pending again, one slot free
    assert len(claim(db, "w", 10)) == 1
    assert scalar(db, "SELECT count(*) FROM dispatch.runs WHERE status = 'running'") == 2
    db.execute("UPDATE dispatch.projects SET max_concurrency = NULL")
    assert len(claim(db, "w", 30)) == 18


def test_open_runs_follow_their_schedule_to_another_project(db: psycopg.Connection) -> None:
    burst(db, big=3, small=())
    sid = scalar(db, "SELECT schedule_id FROM dispatch.runs ORDER BY id LIMIT 1")
    db.execute("UPDATE dispatch.schedules SET project_id = 'z' WHERE id = %s", (sid,))
    assert scalar(db, "SELECT project_id FROM dispatch.runs WHERE schedule_id = %s", (sid,)) == "z"
    assert projects_of(claim(db, "w", 10)) == {"a": 2, "z": 1}


def test_a_chunk_marks_every_projects_first_due_schedules_first(db: psycopg.Connection) -> None:
    add_many(db, "a", 300)
    for p in "bcdefghijk":
        add_many(db, p, 1)
    make_due(db)
    marked, taken = db.execute("SELECT marked, taken FROM dispatch.tick_chunk(40)").fetchone()  # type: ignore[misc]
    assert (marked, taken) == (40, 40)
    by_project = dict(db.execute("SELECT project_id, count(*) FROM dispatch.runs GROUP BY 1").fetchall())
    assert by_project == {"a": 30, **{p: 1 for p in "bcdefghijk"}}
    # the rest as before, all of it
    assert scalar(db, "SELECT dispatch.tick()") == 270


def claim_cursor_at(db: psycopg.Connection, project: str) -> None:
    """Leave the session's claim cursor on `project`, as a claim of its only run does."""
    add_many(db, project, 1, YEARLY)
    db.execute("SELECT dispatch.tick(now() + interval '1 year')")
    assert projects_of(claim(db, "w", 1)) == {project: 1}
    assert scalar(db, "SELECT current_setting('dispatch.claim_cursor')") == project


def test_a_claim_from_a_cursor_on_a_drained_project_lists_each_project_once(db: psycopg.Connection) -> None:
    claim_cursor_at(db, "m")
    add_many(db, "a", 50)
    add_many(db, "z", 50)
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    assert projects_of(claim(db, "w", 10)) == {"a": 5, "z": 5}


def test_one_claim_never_takes_a_project_beyond_its_cap(db: psycopg.Connection) -> None:
    claim_cursor_at(db, "m")
    add_many(db, "z", 50)
    add_many(db, "a", 1)
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    db.execute("INSERT INTO dispatch.projects (project_id, max_concurrency) VALUES ('z', 4)")
    assert projects_of(claim(db, "w", 10)) == {"a": 1, "z": 4}
    assert scalar(db, "SELECT count(*) FROM dispatch.runs WHERE project_id = 'z' AND status = 'running'") == 4


def test_a_heavy_project_does_not_hold_light_ones_behind_its_burst(db: psycopg.Connection) -> None:
    add_many(db, "zeta", 600)
    for n in range(1, 11):
        add_many(db, f"p{n:02}", 100 if n <= 6 else 1)
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    db.execute("INSERT INTO dispatch.projects (project_id, weight) VALUES ('zeta', 100)")
    # total weight 110, 64 a claim: every project is served within ceil(110 / 64) + 1 claims
    served: Counter[str] = Counter()
    for _ in range(3):
        served.update(projects_of(claim(db, "w", 64)))
    assert all(served[f"p{n:02}"] for n in range(1, 11)), served
    assert 3 * 58 <= served["zeta"] <= 3 * 59


def test_a_capped_project_at_its_cap_leaves_its_place_in_a_claim_to_others(db: psycopg.Connection) -> None:
    for p in "abc":
        add_many(db, p, 5)
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    db.execute("INSERT INTO dispatch.projects (project_id, max_concurrency) VALUES ('a', 1)")
    assert projects_of(claim(db, "w", 1)) == {"a": 1}
    # from the start again, a first: at its cap, it leaves its place to c
    db.execute("SELECT set_config('dispatch.claim_cursor', '', false)")
    assert projects_of(claim(db, "w", 2)) == {"b": 1, "c": 1}


@pytest.mark.parametrize("others", ["idle", "deleted"])
def test_a_chunk_marks_a_small_project_whatever_other_projects_exist(db: psycopg.Connection,
                                                                      others: str) -> None:
    db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
               " SELECT 'idle-' || lpad(i::text, 4, '0'), 'fn', %s FROM generate_series(1, 2000) i",
               (YEARLY,))
    if others == "deleted":
        db.execute("UPDATE dispatch.schedules SET deleted_at = now()")
    add_many(db, "m-big", 3000)
    add_many(db, "z-small", 1)
    db.execute("UPDATE dispatch.schedules SET next_run_at = date_trunc('minute', now() - interval '1 second')"
               " WHERE project_id IN ('m-big', 'z-small')")
    marked, _ = db.execute("SELECT marked, taken FROM dispatch.tick_chunk(2000)").fetchone()  # type: ignore[misc]
    assert marked == 2000
    assert scalar(db, "SELECT count(*) FROM dispatch.runs WHERE project_id = 'z-small'") == 1


def test_a_claim_goes_past_projects_whose_due_runs_another_claimer_holds(db: psycopg.Connection,
                                                                          connect: Connect) -> None:
    for p in "abcdefgh":
        add_many(db, p, 1)
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    one, two = connect(autocommit=False), connect(autocommit=False)
    assert projects_of(claim(one, "one", 1)) == {"a": 1}  # held until one commits
    assert projects_of(claim(two, "two", 1)) == {"b": 1}
    # both sessions' cursors now sit behind a; one's next claim finds c..f's runs
    assert sorted(projects_of(claim(one, "one", 4))) == ["c", "d", "e", "f"]
    # two lists b..f first: its own b is running, c..f are one's until it commits
    assert sorted(projects_of(claim(two, "two", 4))) == ["g", "h"]
    one.commit()
    two.commit()
    assert scalar(db, "SELECT count(*) FROM dispatch.runs WHERE status = 'running'") == 8


def test_a_claim_finds_the_runs_left_over_its_shares_in_one_pass_whatever_the_projects(
        db: psycopg.Connection) -> None:
    # 200 tenants with one due run each and one with many: a claim of 202 takes everyone's one and
    # one more from the big one, found past the tenants that have nothing more in one statement,
    # not in one pass (and a _claim_shares call) for each project it tried
    for i in range(200):
        add_many(db, f"t{i:03}", 1)
    add_many(db, "t100-big", 50)
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    db.execute("SET track_functions = 'pl'")
    with db.transaction():
        took = projects_of(claim(db, "w", 202))
        passes = scalar(db, "SELECT pg_stat_get_xact_function_calls('dispatch._claim_shares'::regproc)")
    assert sum(took.values()) == 202 and took["t100-big"] == 2 and len(took) == 201
    assert passes <= 3


def test_a_claim_holds_no_pending_run_beyond_those_it_starts(db: psycopg.Connection,
                                                             connect: Connect) -> None:
    # the remainder (one run) is found at the first project in turn: the walk for it stops
    # there, and no other tenant's second run is locked while the claim's transaction lasts
    add_many(db, "a-big", 50)
    for i in range(200):
        add_many(db, f"t{i:03}", 2)
    make_due(db)
    db.execute("SELECT dispatch.tick()")
    other = connect()
    with db.transaction():
        took = projects_of(claim(db, "w", 202))
        pending = scalar(other, "SELECT count(*) FROM dispatch.runs WHERE status = 'pending'")
        free = scalar(other, "SELECT count(*) FROM (SELECT FROM dispatch.runs WHERE status = 'pending'"
                             " FOR UPDATE SKIP LOCKED) f")
    assert took["a-big"] == 2 and sum(took.values()) == 202
    assert free == pending - 202
