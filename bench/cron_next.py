"""cron_next in SQL against croniter, on the same expressions, zones and instants.

    .venv/bin/python bench/cron_next.py [--calls 20000]

Prints µs per call for dispatch.cron_next (parses the text every call), dispatch.cron_spec_next
(the parsed form stored on each schedule, what tick/complete use), and croniter's get_next."""

from __future__ import annotations

import argparse
import random
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import psycopg
from croniter import croniter

from bench.common import fresh_database, record

MIX = [
    ("* * * * *", "UTC"),
    ("*/5 * * * *", "UTC"),
    ("*/15 * * * *", "Europe/Berlin"),
    ("0 * * * *", "America/New_York"),
    ("30 2 * * *", "Europe/Berlin"),
    ("0 9 * * 1-5", "America/New_York"),
    ("0 0 1 * *", "Asia/Tokyo"),
    ("15 10 * * MON#1", "Australia/Lord_Howe"),
    ("0 18 L * *", "Europe/London"),
    ("0 0 1 1 *", "UTC"),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()

    rng = random.Random(7)
    base = datetime(2024, 1, 1, tzinfo=UTC)
    cases = [
        (*rng.choice(MIX), base + timedelta(seconds=rng.randrange(3 * 365 * 86400)))
        for _ in range(args.calls)
    ]

    conninfo = fresh_database("bench_cron")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(
            "CREATE TEMP TABLE cases AS SELECT * FROM unnest(%s::text[], %s::text[], %s::timestamptz[])"
            " AS c(expr, tz, after)",
            ([c[0] for c in cases], [c[1] for c in cases], [c[2] for c in cases]),
        )
        conn.execute(
            "CREATE TEMP TABLE parsed AS SELECT dispatch.cron_parse(expr) AS spec, tz, after FROM cases"
        )
        conn.execute("ANALYZE cases")
        conn.execute("ANALYZE parsed")
        sql_results: dict[str, float] = {}
        for label, query in [
            ("dispatch.cron_next", "SELECT count(dispatch.cron_next(expr, after, tz)) FROM cases"),
            ("dispatch.cron_spec_next", "SELECT count(dispatch.cron_spec_next(spec, after, tz)) FROM parsed"),
        ]:
            conn.execute(query)  # warm the plan caches
            started = time.perf_counter()
            conn.execute(query)
            sql_results[label] = (time.perf_counter() - started) / len(cases) * 1e6
        ours = conn.execute(
            "SELECT array_agg(dispatch.cron_next(expr, after, tz) ORDER BY ctid) FROM cases"
        ).fetchone()

    zones = {tz: ZoneInfo(tz) for _, tz in MIX}
    started = time.perf_counter()
    theirs = [
        croniter(expr, after.astimezone(zones[tz]), implement_cron_bug=True).get_next(datetime)
        for expr, tz, after in cases
    ]
    croniter_us = (time.perf_counter() - started) / len(cases) * 1e6
    differ = [
        (case, a, b)
        for case, a, b in zip(cases, ours[0] if ours else [], theirs, strict=True)
        if a.timestamp() != b.timestamp()
    ]

    # croniter on aware datetimes keeps the starting UTC offset across a DST change
    def offset(t: datetime, tz: str) -> timedelta | None:
        return t.astimezone(zones[tz]).utcoffset()

    across_dst = sum(
        1 for (_, tz, after), a, b in differ if len({offset(after, tz), offset(a, tz), offset(b, tz)}) > 1
    )

    print(f"cron_next benchmark: {len(cases)} calls, {len(MIX)} expressions x zones, instants 2024-2026")
    for label, us in sql_results.items():
        print(f"  {label:<26} {us:8.1f} us/call   {croniter_us / us:5.2f}x croniter's speed")
    print(
        f"  {'croniter.get_next':<26} {croniter_us:8.1f} us/call   (croniter 6.0.0, implement_cron_bug=True)"
    )
    record(cron_next_us=sql_results["dispatch.cron_next"], croniter_us=croniter_us)
    print(
        f"  results that differ from croniter's: {len(differ)}, of which {across_dst} across a DST change"
        " (croniter keeps the starting offset; tests/test_cron_oracle.py uses it on wall-clock times)"
    )


if __name__ == "__main__":
    main()
