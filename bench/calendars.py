"""Calendars at a stampede: what a calendar adds to the marking of many schedules due at once.

    .venv/bin/python -m bench.calendars [--schedules 100000] [--projects 1000] [--rounds 3]

The schedules (over --projects tenants of skewed sizes, bench.common.TENANTS) are all due at one
instant, and marked as a listener marks them: dispatch.tick_chunk in chunks of 2,000, each
committed, until a chunk takes fewer, then dispatch.tick(); timed, then the runs removed. Three
cases, each the median of --rounds: no calendar; every schedule on one calendar (a holiday a
month for five years and every weekend night) whose periods leave the instant alone; the same
with a period over the instant, so that every schedule passes over the rest of the day as one
recorded gap. On the durable cluster .pgdata/bench-calendars-durable, PostgreSQL's defaults.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import psycopg

from bench.common import PROJECTS, cluster_dir, recreate_database, start_cluster, stop_cluster, tenants

DATABASE = "bench_calendars"
CHUNK = 2000

HOLIDAYS = """
INSERT INTO dispatch.calendars (name, timezone) VALUES ('holidays', 'Europe/Berlin') RETURNING id
"""
PERIODS = """
INSERT INTO dispatch.calendar_exclusions (calendar_id, label, starts, ends)
SELECT %(id)s, 'holiday ' || i, d, d + interval '1 day'
FROM generate_series(0, 59) i,
     LATERAL (SELECT date_trunc('year', localtimestamp) + i * interval '30 days' AS d) x
WHERE NOT (localtimestamp >= d AND localtimestamp < d + interval '2 days')
"""
WEEKEND_NIGHTS = """
INSERT INTO dispatch.calendar_exclusions (calendar_id, label, days, from_time, until_time)
VALUES (%(id)s, 'weekend nights', '{6,7}', '00:00', '06:00')
"""
# the instant's own day, in the calendar's zone: a holiday over the stampede
TODAY = """
INSERT INTO dispatch.calendar_exclusions (calendar_id, label, starts, ends)
VALUES (%(id)s, 'today', date_trunc('day', now() AT TIME ZONE 'Europe/Berlin'),
        date_trunc('day', now() AT TIME ZONE 'Europe/Berlin') + interval '1 day')
"""


def mark_s(db: psycopg.Connection) -> tuple[float, int, int]:
    """(seconds, runs marked, gaps recorded) to mark every schedule due now as a listener does,
    each chunk committed; then the runs and gaps are removed again."""
    db.execute("UPDATE dispatch.schedules SET next_run_at = date_trunc('second', now())")
    db.execute("VACUUM ANALYZE dispatch.schedules")
    started = time.perf_counter()
    while True:
        row = db.execute("SELECT * FROM dispatch.tick_chunk(%s)", (CHUNK,)).fetchone()
        assert row is not None
        if row[1] < CHUNK:
            break
    db.execute("SELECT dispatch.tick()")
    took = time.perf_counter() - started
    marked = db.execute("SELECT count(*) FROM dispatch.runs").fetchone()
    gaps = db.execute("SELECT count(*) FROM dispatch.audit_log"
                      " WHERE action = 'schedule.slots.skipped'").fetchone()
    assert marked is not None and gaps is not None
    db.execute("TRUNCATE dispatch.runs, dispatch.audit_log")
    return took, marked[0], gaps[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schedules", type=int, default=100_000)
    parser.add_argument("--projects", type=int, default=PROJECTS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path)
    args = parser.parse_args()
    data_dir = args.dir or cluster_dir("bench-calendars", False)
    port = start_cluster(data_dir)
    try:
        url = recreate_database(port, DATABASE)
        with psycopg.connect(url, autocommit=True) as db:
            rows, params = tenants(args.schedules, args.projects)
            db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, args)"
                       f" SELECT t.project_id, 'sink', '* * * * *', jsonb_build_object('i', i) FROM {rows}",
                       params)
            calendar = db.execute(HOLIDAYS).fetchone()
            assert calendar is not None
            db.execute(PERIODS, {"id": calendar[0]})
            db.execute(WEEKEND_NIGHTS, {"id": calendar[0]})
            print(f"calendars: {args.schedules:,} schedules on '* * * * *' over {args.projects:,} tenants,"
                  f" all due at one instant, marked in chunks of {CHUNK:,} then by dispatch.tick(); median"
                  f" of {args.rounds} rounds, durable cluster")
            cases = [("no calendar", "UPDATE dispatch.schedules SET calendar_id = NULL"),
                     ("a calendar, the instant outside its periods",
                      "UPDATE dispatch.schedules SET calendar_id = %s"),
                     ("a calendar with a period over the instant", TODAY)]
            for label, setup in cases:
                db.execute(setup, (calendar[0],) if "%s" in setup else {"id": calendar[0]})
                measured = [mark_s(db) for _ in range(args.rounds)]
                took = statistics.median(m[0] for m in measured)
                spread = f"{min(m[0] for m in measured):.2f}-{max(m[0] for m in measured):.2f}"
                print(f"  {label}: {took:.2f} s ({spread}); {measured[0][1]:,} runs marked,"
                      f" {measured[0][2]:,} gaps recorded")
    finally:
        stop_cluster(data_dir, check=False)


if __name__ == "__main__":
    main()
