"""Every benchmark in one run, then one table of the figures against their goals and limits.

    scripts/bench                       # installs what is missing (nginx, py-spy), then:
    .venv/bin/python -m bench [--quick] [--fsync-off]
    .venv/bin/python -m bench --against REV [--rounds 3] [--runs 10000] [--listeners 1]

The end-to-end benchmarks (bench.dispatch, bench.stampede) and the database alone
(bench.complete_pgbench) run on durable clusters with PostgreSQL's defaults (fsync,
synchronous_commit and full_page_writes on), what a user runs; --fsync-off runs them on clusters
with those off instead, and the summary says so. bench.tick and bench.claim always use a durable
cluster; bench.finish_cost, bench.memory and bench.prune the fast one (CPU and memory figures).

--against REV runs no table: the end-to-end benchmark for this tree and for REV side by side,
alternately in one window (bench/against.py), with both figures and their ratio.

Runs, each in its own process and printing its own detail: bench.cron_next, bench.tick
(1,000,000 schedules), bench.claim (100,000 pending, 10,000,000 finished; WAL per run),
bench.complete_pgbench (the database alone, 50,000 runs), bench.finish_cost (what each part of
finishing a run costs the database), bench.dispatch (10,000 and 50,000
due at once over 1,000 tenants of skewed sizes, one and two listeners, against a bare aiohttp
loop and the listener's own HTTP stack, nginx sink, py-spy profile; and 10,000 in one project,
beside), bench.memory (1,000 invocations in flight) and bench.prune
(a backlog of 100,000 and 400,000 old runs: cost per row pruned) and bench.stampede (100,000
schedules of 1,000 tenants due at one instant: first, median and last request, with one and two
listeners).
Last, bench.against: end to end against the last release (LAST_RELEASE), side by side in one
window, so that the table shows a regression of the hot path beside the goals.
--quick shrinks every size for a smoke run (and leaves out the comparison); its figures are not
the README's.

Not in this run (about 10 minutes on its own): `python -m bench.peers [--quick]`, pgdispatch
beside its peers, side by side in one window: queue throughput against Graphile Worker and
schedules stored in the database against DBOS Transact (bench/peers/__main__.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import against
from bench.common import CLUSTER_DIR, PROJECTS, stop_cluster

# The last release, which the hot path is held against: round 1 (issue #22).
LAST_RELEASE = "3b94f50"

FULL = [
    ("bench.cron_next", []),
    ("bench.tick", []),
    ("bench.claim", []),
    ("bench.complete_pgbench", ["--runs", "50000"]),
    ("bench.finish_cost", []),
    # one project, the figure beside the many tenants' of the step after it
    ("bench.dispatch", ["--runs", "10000", "--listeners", "1", "--rounds", "3", "--single", "0",
                        "--projects", "1"]),
    ("bench.dispatch", ["--runs", "10000,50000", "--listeners", "1,2", "--rounds", "3", "--profile"]),
    ("bench.memory", []),
    ("bench.prune", []),
    ("bench.stampede", []),
    # No regression: end to end against the last release, side by side (bench/against.py).
    ("bench.against", [LAST_RELEASE]),
]
QUICK = [
    ("bench.cron_next", ["--calls", "2000"]),
    ("bench.tick", ["--schedules", "20000"]),
    ("bench.claim", ["--pending", "2000", "--finished", "20000"]),
    ("bench.complete_pgbench", ["--runs", "2000"]),
    ("bench.finish_cost", ["--runs", "1000"]),
    ("bench.dispatch",
     ["--runs", "2000", "--listeners", "1,2", "--rounds", "1", "--single", "3", "--profile"]),
    ("bench.memory", ["--runs", "200"]),
    ("bench.prune", ["--backlogs", "5000,20000"]),
    ("bench.stampede", ["--schedules", "5000"]),
]


# Issue #15: end to end against the bare aiohttp loop of the same run.
RATIO_GOALS = {1: 0.65, 2: 0.75}
STAMPEDE_LAST_GOALS_S = {1: 15.0, 2: 12.0}


def verdict(met: bool) -> str:
    return "met" if met else "**not met**"


def table(f: dict[str, Any], sizes: list[int], listener_counts: list[int]) -> list[str]:
    aiohttp, stack, db = f["bare_aiohttp"], f["bare_invoker"], f["pgbench_runs_per_s"]
    rows = [
        "| Figure | Measured | Goal | Against the limits |",
        "|---|---|---|---|",
    ]
    for count in listener_counts:
        for size in sizes:
            key = f"e2e_{count}l_{size}"
            rate = f[key]
            share = RATIO_GOALS.get(count, RATIO_GOALS[2])
            rows.append(
                f"| End to end, {count} listener{'s' if count > 1 else ''}, {size:,} due at once over "
                f"{PROJECTS:,} tenants "
                f"| {rate:,.0f} runs/s | ≥ {share:.2f} x bare aiohttp: {verdict(rate >= share * aiohttp)} "
                f"| {rate / aiohttp:.2f} x bare aiohttp, {rate / stack:.0%} of the listener's HTTP stack, "
                f"{rate / db:.0%} of the database alone; CPU a run: listeners "
                f"{f[key + '_cpu_listeners']:.0f} µs, PostgreSQL {f[key + '_cpu_PostgreSQL']:.0f} µs, "
                f"nginx {f[key + '_cpu_sink']:.0f} µs |")
    if "e2e_1l_10000_1p" in f:
        key = "e2e_1l_10000_1p"
        rows.append(
            f"| The same, 1 listener, 10,000 due at once, all in one project | {f[key]:,.0f} runs/s | "
            f"| CPU a run: listener {f[key + '_cpu_listeners']:.0f} µs, PostgreSQL "
            f"{f[key + '_cpu_PostgreSQL']:.0f} µs |")
    rows += [
        f"| Limit: bare aiohttp loop (same concurrency, same sink) | {aiohttp:,.0f} requests/s | | |",
        f"| Limit: bare pyreqwest loop, the listener's HTTP client (same concurrency, same sink) "
        f"| {f.get('bare_pyreqwest', float('nan')):,.0f} requests/s | | |",
        f"| Limit: bare loop of the listener's HTTP stack | {stack:,.0f} requests/s | "
        f"| {stack / aiohttp:.0%} of bare aiohttp |",
        f"| Limit: the database alone (pgbench: claim_runs + complete_runs, 2 clients) | {db:,.0f} runs/s | "
        f"| PostgreSQL CPU {f['pgbench_cpu_us']:.0f} µs a run |",
        f"| Finishing a run (`complete_runs`, one session, batches of 100) | {f['finish_us']:.0f} µs a run | "
        f"| next slot {f['finish_next_slot_us']:.0f} µs, audit row {f['finish_audit_us']:.0f} µs, schedule "
        f"update {f['finish_schedule_us']:.0f} µs, run row update + locks + batch plumbing "
        f"{f['finish_rest_us']:.0f} µs |",
    ]
    for loop, key in (("asyncio", f"e2e_1l_{max(sizes)}_asyncio"),):
        if key in f:
            rate = f[key]
            rows.append(
                f"| End to end, 1 listener on {loop}'s event loop, {max(sizes):,} due at once "
                f"| {rate:,.0f} runs/s | (uvloop measured above) "
                f"| uvloop {f[f'e2e_1l_{max(sizes)}'] / rate - 1:+.0%}; CPU a run: listener "
                f"{f[key + '_cpu_listeners']:.0f} µs, PostgreSQL {f[key + '_cpu_PostgreSQL']:.0f} µs |")
    rows += stampede_rows(f)
    if "against_ratio" in f:
        rows.append(
            f"| End to end against {f['against_rev']} (the last release), side by side, 1 listener, "
            f"10,000 due | {f['against_this']:,.0f} against {f['against_other']:,.0f} runs/s "
            f"(x {f['against_ratio']:.2f}) | at least as fast: {verdict(f['against_ratio'] >= 1)} "
            f"| x bare aiohttp {f['against_this_bare']:.2f} against {f['against_other_bare']:.2f}; a run: "
            f"blocks hit x {f['against_blocks hit_ratio']:.2f}, WAL x {f['against_WAL bytes_ratio']:.2f}, "
            f"commits x {f['against_commits_ratio']:.2f} |")
    claim_as_fast = ("runs_project_pending_idx" in f["claim_plan_full"]
                     and f["claim_ms_full"] <= 1.5 * f["claim_ms_empty"])
    size = min(sizes)
    key = f"e2e_1l_{size}"
    worst = f[key + "_max"] / 1000
    rows.append(
        f"| {size:,} due in one instant: all requests started within | {worst:.2f} s | ≤ 2 s: "
        f"{verdict(worst <= 2)} | slot → request p50 {f[key + '_p50']:.0f} ms, p99 {f[key + '_p99']:.0f} ms "
        "(1 listener) |")
    if "single_p50" in f:
        rows.append(
            f"| 1 due: slot → request at the sink | p50 {f['single_p50']:.1f} ms, "
            f"p99 {f['single_p99']:.1f} ms | p50 ≤ 20 ms, p99 ≤ 100 ms: "
            f"{verdict(f['single_p50'] <= 20 and f['single_p99'] <= 100)} "
            f"| max {f['single_max']:.1f} ms |")
    rows += [
        f"| `dispatch.tick()`, none due | {f['tick_0_due_ms']:.2f} ms | ≤ 2 ms: "
        f"{verdict(f['tick_0_due_ms'] <= 2)} | |",
        f"| `dispatch.tick()` marking 10,000 | {f['tick_10000_due_ms']:.1f} ms | ≤ 250 ms: "
        f"{verdict(f['tick_10000_due_ms'] <= 250)} | 1,000 due: {f['tick_1000_due_ms']:.1f} ms;"
        f" 10,000 due 7 minutes late (catch-up: each one's latest slot): {f['tick_10000_late_ms']:.1f} ms |",
        f"| `claim_runs(100)`, {f['claim_pending']:,} pending, 0 → {f['claim_finished']:,} finished "
        f"| {f['claim_ms_empty']:.2f} → {f['claim_ms_full']:.2f} ms | as fast: "
        # The plan is the proof (the pending index holds pending runs only); the timing check
        # allows this VM's noise.
        f"{verdict(claim_as_fast)} "
        f"| `{f['claim_plan_full'].lstrip('-> ').split('  (')[0]}` |",
        f"| WAL per dispatched run (audit row included) | {f['wal_bytes_per_run']:,.0f} bytes | ≤ 2 kB: "
        f"{verdict(f['wal_bytes_per_run'] <= 2048)} | table + index growth {f['growth_bytes_per_run']:,.0f} "
        "bytes a run |",
        f"| Listener RSS, {f['rss_in_flight']:,} invocations in flight | {f['rss_in_flight_mb']:.1f} MB "
        f"| ≤ 150 MB: {verdict(f['rss_peak_mb'] <= 150)} | idle {f['rss_idle_mb']:.1f} MB, "
        f"peak {f['rss_peak_mb']:.1f} MB |",
        f"| `dispatch.prune()`, {f['prune_backlog_small']:,} → {f['prune_backlog_large']:,} old runs and"
        f" as many audit rows | {f['prune_us_small']:.1f} → {f['prune_us_large']:.1f} µs a row"
        f" | flat (within 1.5 times): {verdict(f['prune_us_large'] <= 1.5 * f['prune_us_small'])} | |",
        f"| `dispatch.cron_next` | {f['cron_next_us']:.1f} µs a call | within 3 times croniter: "
        f"{verdict(f['cron_next_us'] <= 3 * f['croniter_us'])} "
        f"| {f['croniter_us'] / f['cron_next_us']:.1f} times croniter's speed ({f['croniter_us']:.1f} µs) |",
    ]
    return rows


def stampede_rows(f: dict[str, Any]) -> list[str]:
    """The stampede's figures against issue #15's goals."""
    n = int(f["stampede_schedules"])
    rows = [f"| Stampede: `dispatch.tick()` marking {n:,} due at one instant (alone) | "
            f"{f['stampede_mark_s']:.2f} s | | the listeners mark in chunks instead |"]
    if "stampede_mark_jitter_s" in f:
        rows.append("| The same, each schedule jittered over 45 minutes | "
                    f"{f['stampede_mark_jitter_s']:.2f} s | | |")
    for count, last_goal in STAMPEDE_LAST_GOALS_S.items():
        key = f"stampede_{count}l"
        if f"{key}_first_s" not in f:
            continue
        first, last = f[f"{key}_first_s"], f[f"{key}_last_s"]
        rows.append(
            f"| Stampede, {count} listener{'s' if count > 1 else ''}: first / median / last request after "
            f"the instant | {first:.2f} / {f[f'{key}_median_s']:.2f} / {last:.2f} s | first ≤ 0.5 s: "
            f"{verdict(first <= 0.5)}; last ≤ {last_goal:g} s: {verdict(last <= last_goal)} "
            f"| {f[f'{key}_rate']:,.0f} runs/s |")
        rows.append(
            f"| Stampede, {count} listener{'s' if count > 1 else ''}: peak RSS, leases expired | "
            f"{f[f'{key}_rss_mb']:.0f} MB, {f[f'{key}_retried']:.0f} | ≤ 150 MB: "
            f"{verdict(f[f'{key}_rss_mb'] <= 150)}; none: {verdict(f[f'{key}_retried'] == 0)} | |")
    return rows


# The benchmarks whose cluster follows --fsync-off.
FOLLOW_FSYNC = {"bench.dispatch", "bench.stampede", "bench.complete_pgbench", "bench.against"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="small sizes: a smoke run, not the README's figures")
    parser.add_argument("--fsync-off", action="store_true",
                        help="end to end and the database alone on clusters with fsync, "
                             "synchronous_commit and full_page_writes off (not durable; labelled so)")
    parser.add_argument("--against", metavar="REV",
                        help="only the end-to-end benchmark, this tree and REV side by side "
                             "(bench/against.py)")
    against.add_arguments(parser, fsync_off=False)
    args = parser.parse_args()
    if args.against:
        if shutil.which("git") is None:
            parser.error("--against needs git")
        against.run(args)
        return
    steps = QUICK if args.quick else FULL
    if args.fsync_off:
        steps = [(module, [*argv, "--fsync-off"] if module in FOLLOW_FSYNC else argv)
                 for module, argv in steps]
    started = time.monotonic()
    with tempfile.NamedTemporaryFile(prefix="pgdispatch-bench-", suffix=".jsonl") as results:
        env = {**os.environ, "PGDISPATCH_BENCH_RESULTS": results.name}
        for module, argv in steps:
            print(f"\n=== python -m {module} {' '.join(argv)}", flush=True)
            step_started = time.monotonic()
            subprocess.run([sys.executable, "-m", module, *argv], check=True, env=env)
            # The cluster bench.tick, bench.claim and bench.prune share is left running by them:
            # idle, but a checkpoint of it (after bench.claim's 10,000,000 runs) would write beside
            # the durable benchmarks that follow.
            stop_cluster(CLUSTER_DIR, check=False)
            print(f"=== {module}: {time.monotonic() - step_started:.0f} s", flush=True)
        figures: dict[str, Any] = {}
        for line in Path(results.name).read_text().splitlines():
            figures |= json.loads(line)

    dispatch_argv = dict(steps)["bench.dispatch"]
    sizes = [int(n) for n in dispatch_argv[dispatch_argv.index("--runs") + 1].split(",")]
    counts = [int(n) for n in dispatch_argv[dispatch_argv.index("--listeners") + 1].split(",")]
    cpu = os.cpu_count()
    print(f"\n=== summary ({'QUICK: smoke sizes, ' if args.quick else ''}{cpu} CPUs; PostgreSQL, the "
          f"listeners and nginx share them; all benchmarks took "
          f"{(time.monotonic() - started) / 60:.1f} min)")
    print("end to end, stampede and the database alone on a cluster "
          f"{figures.get('dispatch_cluster', '?')}\n")
    print("\n".join(table(figures, sizes, counts)))


if __name__ == "__main__":
    main()
