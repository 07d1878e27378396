"""What each part of finishing a run costs the database: dispatch.complete_runs over --runs
claimed runs in batches of 100, with parts of the finishing tail (sql/code/40_finish.sql:
dispatch._advance_schedules and dispatch._audit_runs) taken out one by one (variants
interleaved, three rounds, the lowest of each: on a shared machine noise only adds).

    .venv/bin/python -m bench.finish_cost [--runs 20000]

The differences between the variants are the parts' costs (a profile by subtraction: the
parts are one SQL statement, which EXPLAIN ANALYZE would show only with the instrumentation
of every nested cron call in it). Schedules use bench.common.SPREAD_CRON: each next slot is
computed on its own. A fresh database per variant, in a private cluster with the test clusters'
fast settings (.pgdata/bench-finish: fsync off), so that the disk does not blur the CPU."""

from __future__ import annotations

import argparse
import re
import time

import psycopg

from bench.common import ROOT, SPREAD_CRON, record, recreate_database, start_cluster, stop_cluster

SOURCE = (ROOT / "sql" / "code" / "40_finish.sql").read_text()
ADVANCE = SOURCE[SOURCE.index("CREATE OR REPLACE FUNCTION dispatch._advance_schedules"):
                 SOURCE.index("CREATE OR REPLACE FUNCTION dispatch._settle_runs")]
NO_AUDIT = """CREATE OR REPLACE FUNCTION dispatch._audit_runs(finished dispatch.runs[]) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$ SELECT $$;"""

NO_CRON = ("ELSE dispatch.cron_spec_next(u.cron_spec, u.after, u.timezone)",
           "ELSE u.after + interval '1 year'")
NO_ADVANCE = re.compile(
    r"moved AS \(\n        UPDATE dispatch.schedules.*?WHERE s.ctid = x.tid\n    \)", re.S)

# Each takes one more part out, so the differences down the list add up to the whole.
VARIANTS = ["as installed", "without the next-slot computation", "without next slot and audit row",
            "without next slot, audit row and schedule update"]


def variant(name: str) -> str:
    """The SQL that turns the installed functions into the variant."""
    source = ADVANCE
    if name != VARIANTS[0]:
        assert NO_CRON[0] in source
        source = source.replace(*NO_CRON)
    if "schedule update" in name:
        source, found = NO_ADVANCE.subn("moved AS (SELECT 1)", source)
        assert found == 1
    if "audit" in name:
        source += "\n" + NO_AUDIT
    return source


CLUSTER = ROOT / ".pgdata" / "bench-finish"


def measure(name: str, runs: int, port: str) -> float:
    """Microseconds of complete_runs a run."""
    with psycopg.connect(recreate_database(port, "bench_finish_cost"), autocommit=True) as db:
        db.execute(variant(name))
        db.execute("SET session_replication_role = replica")  # bulk load: triggers off
        db.execute(
            "INSERT INTO dispatch.schedules"
            " (project_id, function_name, cron_expression, timezone, cron_spec, next_run_at, args)"
            f" SELECT 'bench', 'sink', {SPREAD_CRON}, 'UTC', dispatch.cron_parse({SPREAD_CRON}),"
            "        now() - interval '1 minute', jsonb_build_object('i', i)"
            " FROM generate_series(1, %s) i", (runs,))
        db.execute("RESET session_replication_role")
        db.execute("SELECT dispatch.tick()")
        batches = []
        while ids := [r[0] for r in db.execute("SELECT run_id FROM dispatch.claim_runs('w', 100, '5 min')")]:
            batches.append(ids)
        db.execute("VACUUM ANALYZE")
        started = time.perf_counter()
        for ids in batches:
            db.execute("SELECT count(*) FROM dispatch.complete_runs('w', %s, %s, %s, %s, %s, %s)",
                       (ids, [1] * len(ids), ["ok"] * len(ids), [None] * len(ids), [200] * len(ids),
                        [5] * len(ids)))
        return (time.perf_counter() - started) / runs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20_000)
    args = parser.parse_args()
    print(f"finishing a run: dispatch.complete_runs, {args.runs:,} runs in batches of 100, one session")
    port = start_cluster(CLUSTER, fast=True)
    try:
        samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for _ in range(3):
            for name in VARIANTS:
                samples[name].append(measure(name, args.runs, port))
    finally:
        stop_cluster(CLUSTER, check=False)
    costs = {name: min(values) for name, values in samples.items()}
    for name, us in costs.items():
        print(f"  {name:<50} {us:6.1f} us a run")
    full, bare = costs[VARIANTS[0]], costs[VARIANTS[-1]]
    parts = {
        "next slot": full - costs[VARIANTS[1]],
        "audit row": costs[VARIANTS[1]] - costs[VARIANTS[2]],
        "schedule update": costs[VARIANTS[2]] - bare,
        "the rest (run row update, locks, batch plumbing)": bare,
    }
    print("  by part: " + ", ".join(f"{name} {us:.0f} us" for name, us in parts.items()))
    record(finish_us=full, finish_next_slot_us=parts["next slot"], finish_audit_us=parts["audit row"],
           finish_schedule_us=parts["schedule update"], finish_rest_us=bare)


if __name__ == "__main__":
    main()
