"""Fairness between tenants end to end: one project's burst does not hold another project's slot
behind it (dispatch.tick_chunk marks every project's first due schedules in the first chunk;
dispatch.claim_runs shares each claim between projects)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest

from dispatcher import clock

from .kit import Running, Sink, add_schedules, due_in_a_second, scalar, until

StartListener = Callable[..., Awaitable[Running]]

SMALL = [f"small-{n}" for n in range(5)]


async def test_small_tenants_are_invoked_while_a_big_tenants_burst_goes_on(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # #26.3 in small: the big tenant's schedules were written first, so that on their shared
    # instant they come first in next_run_at order (and in slot order once marked).
    monkeypatch.setattr(clock, "FIRST_CHUNK", 100)
    add_schedules(db, 1500, project_id="big")
    for project in SMALL:
        add_schedules(db, 1, project_id=project)
    await start_listener(sweep_interval_s=3600, concurrency=8)
    due_in_a_second(db)

    await until(lambda: scalar(adb, "SELECT count(*) = 1505 FROM dispatch.runs WHERE status = 'ok'"),
                within=60, what="1505 runs recorded ok")
    order = [call.project_id for call in sink.calls]
    assert len(order) == 1505
    # each small tenant's request among the first of the instant, while the big one's go on
    assert max(order.index(project) for project in SMALL) < 100, order[:100]


async def test_a_capped_projects_runs_go_as_places_free_up_without_a_sweep(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener,
) -> None:
    # Each claim comes back short (the cap leaves 4 of 8 places unused); the cap's runs then go
    # one by one as each of the others ends, with no sweep to fall back on.
    add_schedules(db, 5, project_id="capped")
    add_schedules(db, 3, project_id="free")
    db.execute("INSERT INTO dispatch.projects (project_id, max_concurrency) VALUES ('capped', 1)")
    await start_listener(sweep_interval_s=3600, concurrency=8)
    due_in_a_second(db)
    await until(lambda: scalar(adb, "SELECT count(*) = 8 FROM dispatch.runs WHERE status = 'ok'"),
                within=30, what="8 runs recorded ok")
    assert sorted(call.project_id for call in sink.calls) == ["capped"] * 5 + ["free"] * 3
