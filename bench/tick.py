"""dispatch.tick() with 1,000,000 schedules of which 0 / 1,000 / 10,000 are due (and 10,000 late).

    .venv/bin/python -m bench.tick [--schedules 1000000]

Each measurement is one tick in its own transaction, rolled back so that the next one sees
the same due set; prints the median and the slowest in ms."""

from __future__ import annotations

import argparse
import time

import psycopg

from bench.common import fresh_database, median_ms, record

EXPRESSIONS = [
    ("* * * * *", "UTC"),
    ("*/5 * * * *", "Europe/Berlin"),
    ("0 * * * *", "America/New_York"),
    ("30 2 * * *", "Europe/Berlin"),
    ("0 9 * * 1-5", "Asia/Tokyo"),
    ("0 0 1 * *", "UTC"),
]
GOALS_MS = {0: 2.0, 1000: None, 10000: 250.0}


def load(conn: psycopg.Connection, count: int) -> None:
    """Bulk-load schedules with their triggers off: the write path is not what is measured."""
    conn.execute("SET session_replication_role = replica")
    conn.execute(
        """
        WITH e AS MATERIALIZED (
            SELECT n, expr, tz, dispatch.cron_parse(expr) AS spec
            FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS e(expr, tz, n)
        )
        INSERT INTO dispatch.schedules
            (project_id, function_name, cron_expression, timezone, cron_spec, next_run_at)
        SELECT 'proj_' || g %% 5000, 'fn_' || g %% 97, e.expr, e.tz, e.spec,
               now() + interval '1 hour' + random() * interval '7 days'
        FROM generate_series(1, %s) g
        JOIN e ON e.n = 1 + g %% %s
        """,
        ([e for e, _ in EXPRESSIONS], [z for _, z in EXPRESSIONS], count, len(EXPRESSIONS)),
    )
    conn.execute("RESET session_replication_role")
    conn.execute("VACUUM ANALYZE dispatch.schedules")


def measure(conn: psycopg.Connection, due: int, repeat: int, late: str) -> tuple[float, float, int]:
    """Ticks with `due` schedules whose slot is `late` ago: within the last minute, the tick that
    marks on time; more, the tick that comes back after an outage (catchup latest: each
    schedule's most recent slot is computed)."""
    conn.execute(
        "UPDATE dispatch.schedules SET next_run_at = now() - %s::interval"
        " WHERE id IN (SELECT id FROM dispatch.schedules ORDER BY id LIMIT %s)",
        (late, due),
    )
    conn.execute("VACUUM ANALYZE dispatch.schedules")
    samples = []
    marked = 0
    for _ in range(repeat):
        with conn.transaction(force_rollback=True):
            started = time.perf_counter()
            row = conn.execute("SELECT dispatch.tick()").fetchone()
            samples.append(time.perf_counter() - started)
            marked = row[0] if row else -1
        conn.execute("VACUUM dispatch.runs")
    conn.execute(
        "UPDATE dispatch.schedules SET next_run_at = now() + interval '1 hour' WHERE next_run_at <= now()"
    )
    return median_ms(samples), max(samples) * 1000, marked


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--schedules", type=int, default=1_000_000)
    args = parser.parse_args()

    conninfo = fresh_database("bench_tick")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        started = time.perf_counter()
        load(conn, args.schedules)
        print(f"tick benchmark: {args.schedules:,} schedules loaded in {time.perf_counter() - started:.1f} s")
        rounds = [(0, 200, "30 seconds"), (1_000, 20, "30 seconds"), (10_000, 10, "30 seconds"),
                  (10_000, 10, "7 minutes")]
        for due, repeat, late in rounds:
            median, worst, marked = measure(conn, due, repeat, late)
            assert marked == due, f"tick marked {marked}, expected {due}"
            goal = GOALS_MS[due] if late == "30 seconds" else None
            verdict = f"goal <= {goal:g} ms: {'met' if median <= goal else 'MISSED'}" if goal else ""
            print(
                f"  {due:>6,} due {late} ago: median {median:8.2f} ms  max {worst:8.2f} ms  ({repeat} ticks)"
                f"  {verdict}"
            )
            record(**{f"tick_{due}_due_ms" if late == "30 seconds" else f"tick_{due}_late_ms": median})


if __name__ == "__main__":
    main()
