"""An hour of steady load: does anything drift when runs and audit rows are written and pruned
all day?

    .venv/bin/python -m bench.soak [--minutes 60] [--faults] [--schedules 50000] [--projects 1000]
                                   [--retention 5min] [--plot docs/img/soak.png] [--quick]
                                   [--statements]

A durable cluster with PostgreSQL's defaults (autovacuum on), pg_cron ticking `dispatch.tick()`
every minute and `CALL dispatch.prune()` every 10 minutes (at 7 past) as the install registers
them, two listeners and the chaos suite's sink. The schedules are spread over `--projects`
tenants of skewed sizes (bench.common.TENANTS), in a steady mix:

    40 %  * * * * *                        at the minute
    40 %  * * * * *                        jitter 45 s (spread over the minute)
    15 %  */5 * * * *                      jitter 30 s
     4 %  <m> * * * *                      hourly, m spread over the hour
     1 %  every 10 seconds

50,000 schedules make about 44,500 runs a minute. The retention of runs and audit rows is
`--retention` (the settings' one-hour floor is dropped in this database only), so that pruning
deletes many times within the hour.

Every minute (at the minute's 30th second, away from the burst at its start) it prints and keeps
one row: runs of the minute and how they ended (the runs whose fire_at lies in the minute before
last: they are over by then), dispatch latency p50/p99/max (fire_at to the first claim), size
and dead tuples of runs, audit_log and schedules and the size of each of their indexes,
autovacuum and prune runs, WAL, each listener's RSS and CPU, PostgreSQL's CPU (the postmaster and
all its processes), and the longest claim_runs, complete_runs and tick call (pg_stat_statements'
max_exec_time over the minute: a prune or autovacuum that stalled the hot path shows there).

--faults adds, every 5 minutes, a listener killed with SIGKILL and a new one started 5 s later;
PostgreSQL restarted once `-m fast` (after a third of the run) and once `-m immediate` (after two
thirds), both after the first retention cycle, each 40 s into a minute ending in 3 (away from the
prunes and the five-minute schedules' bursts, after most of the minute's own), the second
followed by the vacuums docs/configuration.md asks for after a crash, 15 s into each of the next
five minutes (--no-vacuum-after-crash: none); and one schedule in a hundred calls the function
`flapping`, which the sink fails for 60 s of every 4 minutes (its breakers open and close; its
runs end error after their retries).

At the end it checks that no run was lost (a run ends `lost` only when its last attempt was out
with a listener the soak killed: the contract's outcome then), nothing is stuck (pending or
running well past its instant) and that every slot of every schedule over the last minutes still
retained is a run or lies in a recorded gap (invariant 8); then the goals, after the first
retention cycle (from the sample after the first prune that began a retention and a prune
interval after the start): table and index sizes within 10 % minute to minute, dead tuples
bounded, p99 within 2x of the first ten minutes', listener RSS within 10 %, no hot-path call
over 1 s. The rows go to <dir>/soak.json and, with --plot, a PNG (matplotlib:
`pip install -e .[bench]`).

--statements: where the database's time goes. pg_stat_statements also tracks the statements
that functions run (track = all), each minute's top statements are kept in its row, and the end
prints those of the last minute: time, calls and shared blocks a run (a function's figures
include those of the statements it runs).

--quick: 2,000 schedules over 50 tenants, one minute sampled every 15 s, one listener killed:
a smoke test of the harness (tests/test_soak.py), not of the figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from bench.common import ROOT, cluster_cpu_s, memory_kb, process_cpu_s, recreate_database, tenants
from chaos.run import Cluster, SinkProcess
from dispatcher.cli.demo import CRON_JOBS

DATABASE = "soak"
PGDISPATCH = Path(sys.executable).parent / "pgdispatch"
TABLES = ("runs", "audit_log", "schedules")
PRUNE_EVERY_S = 600  # dispatch-prune's schedule, 7,17,...,57 * * * *
VACUUM_AFTER_CRASH = "VACUUM (INDEX_CLEANUP ON) dispatch.runs, dispatch.schedules, dispatch.audit_log"

MIX = """
    INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, every, jitter, args)
    SELECT t.project_id,
           CASE WHEN %(flapping)s AND i %% 100 = 7 THEN 'flapping' ELSE 'sink' END,
           CASE WHEN i %% 100 < 80 THEN '* * * * *'
                WHEN i %% 100 < 95 THEN '*/5 * * * *'
                WHEN i %% 100 < 99 THEN (i %% 60) || ' * * * *' END,
           CASE WHEN i %% 100 = 99 THEN interval '10 seconds' END,
           CASE WHEN i %% 100 BETWEEN 40 AND 79 THEN interval '45 seconds'
                WHEN i %% 100 BETWEEN 80 AND 94 THEN interval '30 seconds'
                ELSE interval '0' END,
           jsonb_build_object('i', i)
    FROM {rows}
"""

RUNS_OF_WINDOW = """
    SELECT count(*),
           count(*) FILTER (WHERE status = 'ok'), count(*) FILTER (WHERE status = 'error'),
           count(*) FILTER (WHERE status = 'lost'), count(*) FILTER (WHERE status = 'skipped'),
           count(*) FILTER (WHERE status IN ('pending', 'running')),
           percentile_cont(0.5) WITHIN GROUP (ORDER BY lat),
           percentile_cont(0.99) WITHIN GROUP (ORDER BY lat), max(lat),
           -- lost otherwise than by a listener killed with the run's last attempt out
           count(*) FILTER (WHERE status = 'lost'
                              AND coalesce(substring(error FROM '^lease of (.*) expired on attempt')
                                               <> ALL (%(killed)s::text[]), true))
    FROM (SELECT r.status, r.error,
                 extract(epoch FROM coalesce((r.earlier_attempts -> 0 ->> 'claimedAt')::timestamptz,
                                             r.claimed_at) - r.fire_at) AS lat
          FROM dispatch.runs r
          -- created when marked, up to a minute before it fires (jitter, a tick ahead)
          WHERE r.created_at >= %(lo)s - interval '75 seconds'
            AND r.fire_at >= %(lo)s AND r.fire_at < %(hi)s AND r.kind = 'scheduled') x
"""

SIZES = """
    SELECT c.relname, pg_relation_size(c.oid)
    FROM pg_class c
    WHERE c.oid IN ('dispatch.runs'::regclass, 'dispatch.audit_log'::regclass, 'dispatch.schedules'::regclass)
       OR c.oid IN (SELECT i.indexrelid FROM pg_index i
                    WHERE i.indrelid IN ('dispatch.runs'::regclass, 'dispatch.audit_log'::regclass,
                                         'dispatch.schedules'::regclass))
"""

TABLE_STATS = """
    SELECT relname, n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count
    FROM pg_stat_user_tables WHERE schemaname = 'dispatch' AND relname = ANY (%s)
"""

HOT_PATH = """
    SELECT coalesce(max(max_exec_time) FILTER (WHERE query LIKE %s), 0),
           coalesce(max(max_exec_time) FILTER (WHERE query LIKE %s), 0),
           coalesce(max(max_exec_time) FILTER (WHERE query LIKE %s), 0)
    FROM pg_stat_statements
"""

TOP_STATEMENTS = """
    SELECT query, calls, total_exec_time, shared_blks_hit + shared_blks_read
    FROM pg_stat_statements
    WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
    ORDER BY total_exec_time DESC LIMIT 25
"""

# Slots of the last retained minutes that are neither a run nor in a recorded gap (invariant 8).
UNACCOUNTED = """
    WITH slot AS (
        SELECT s.id, t
        FROM dispatch.schedules s
        CROSS JOIN LATERAL dispatch._cron_slots(s.cron_spec, %(lo)s, %(hi)s, s.timezone, 100000) t
        WHERE s.created_at < %(lo)s
    ), no_run AS MATERIALIZED (
        SELECT x.id, x.t FROM slot x
        WHERE NOT EXISTS (SELECT FROM dispatch.runs r WHERE r.schedule_id = x.id AND r.scheduled_for = x.t)
    )
    SELECT (SELECT count(*) FROM slot), count(*)
    FROM no_run x
    WHERE NOT EXISTS (SELECT FROM dispatch.audit_log a
                      WHERE a.action = 'schedule.slots.skipped'
                        AND (a.metadata ->> 'scheduleId')::uuid = x.id
                        AND x.t BETWEEN (a.metadata ->> 'first')::timestamptz
                                    AND (a.metadata ->> 'last')::timestamptz)
"""


@dataclass
class Listener:
    worker: str
    proc: subprocess.Popen[bytes]
    cpu_s: float = 0.0  # CPU used up to the last sample


@dataclass
class Soak:
    folder: Path
    schedules: int
    projects: int
    retention: str
    minutes: float
    sample_s: float
    faults: bool
    statements: bool = False
    vacuum_after_crash: bool = True
    concurrency: int = 64
    cluster: Cluster = field(init=False)
    sink: SinkProcess = field(init=False)
    listeners: list[Listener] = field(default_factory=list)
    next_worker: int = 1
    killed: list[str] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    slots_checked: int = 0
    t0: float = 0.0
    retention_s: float = 0.0

    # -- set-up --------------------------------------------------------------------------------

    def start(self) -> str:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.cluster = Cluster(self.folder / "cluster")
        self.cluster.start()
        admin = f"postgresql://postgres@127.0.0.1:{self.cluster.port}/postgres"
        with psycopg.connect(admin, autocommit=True) as conn:
            row = conn.execute("SELECT current_setting('shared_preload_libraries')").fetchone()
            if row is None or "pg_stat_statements" not in row[0]:
                conn.execute("ALTER SYSTEM SET shared_preload_libraries = pg_cron, pg_stat_statements")
                restart = True
            else:
                restart = False
        if restart:
            self.cluster.restart("fast")
        url = recreate_database(str(self.cluster.port), DATABASE)
        with psycopg.connect(url, autocommit=True) as db:
            db.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            db.execute("ALTER TABLE dispatch.settings DROP CONSTRAINT settings_runs_retention_check,"
                       " DROP CONSTRAINT settings_audit_retention_check")
            db.execute("UPDATE dispatch.settings SET runs_retention = %s, audit_retention = %s",
                       (self.retention, self.retention))
            retention = db.execute("SELECT extract(epoch FROM runs_retention)::float8"
                                   " FROM dispatch.settings").fetchone()
            assert retention is not None
            self.retention_s = retention[0]
            rows, params = tenants(self.schedules, self.projects)
            db.execute(MIX.format(rows=rows), {**params, "flapping": self.faults})
            db.execute("VACUUM ANALYZE dispatch.schedules")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("SELECT cron.unschedule(jobid) FROM cron.job WHERE database = %s", (DATABASE,))
            for job, every, command in CRON_JOBS:
                conn.execute("SELECT cron.schedule_in_database(%s, %s, %s, %s)",
                             (job, every, command, DATABASE))
            # (ALTER SYSTEM outlives the run: a run without --statements sets it back)
            conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'" if self.statements
                         else "ALTER SYSTEM RESET pg_stat_statements.track")
            conn.execute("SELECT pg_reload_conf()")
        # the function `flapping` is down 60 s of every 4 minutes; nothing else ever fails
        self.sink = SinkProcess(self.folder, hang_s=5.0, flap_s=(60.0, 180.0))
        self.sink.mode = {}
        self.sink.start()
        for _ in range(2):
            self.start_listener()
        return url

    def start_listener(self) -> None:
        worker = f"soak-{self.next_worker}"
        self.next_worker += 1
        template = f"http://127.0.0.1:{self.sink.port}/w/{worker}/projects/{{project_id}}/functions/{{function_name}}"
        with (self.folder / f"{worker}.log").open("wb") as log:
            proc = subprocess.Popen(
                [str(PGDISPATCH), "listen", "--database-url", self.cluster.url(DATABASE),
                 "--invoke-url", template, "--worker-id", worker, "--concurrency", str(self.concurrency),
                 "--log-level", "warning"],
                stdout=log, stderr=subprocess.STDOUT)
        self.listeners.append(Listener(worker, proc))

    def stop(self) -> None:
        for listener in self.listeners:
            if listener.proc.poll() is None:
                listener.proc.send_signal(signal.SIGTERM)
        for listener in self.listeners:
            try:
                listener.proc.wait(60)
            except subprocess.TimeoutExpired:
                listener.proc.kill()
        self.sink.stop()
        admin = f"postgresql://postgres@127.0.0.1:{self.cluster.port}/postgres"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("SELECT cron.unschedule(jobid) FROM cron.job WHERE database = %s", (DATABASE,))
        self.cluster.stop()

    # -- faults --------------------------------------------------------------------------------

    def live(self) -> list[Listener]:
        return [item for item in self.listeners if item.proc.poll() is None]

    def kill_listener(self) -> None:
        victim = self.live()[0]
        victim.proc.kill()
        victim.proc.wait()
        self.killed.append(victim.worker)
        self.event(f"kill -9 {victim.worker}")
        time.sleep(5)
        self.start_listener()

    def restart_postgres(self, mode: str) -> None:
        self.event(f"PostgreSQL restart -m {mode}")
        self.cluster.restart(mode)
        if mode == "immediate" and self.vacuum_after_crash:
            threading.Thread(target=self.vacuum_after_restart, daemon=True).start()

    def vacuum_after_restart(self) -> None:
        """What docs/configuration.md asks of an operator after a crash: crash recovery forgets the
        free pages recorded in the indexes and the statistics autovacuum decides by, so vacuum
        once a minute for five minutes, 15 s into the minute: once the tick has marked the
        minute's runs, while they are open."""
        with psycopg.connect(self.cluster.url(DATABASE), autocommit=True) as db:
            for _ in range(5):
                time.sleep((time.time() // 60 + 1) * 60 + 15 - time.time())
                began = time.time()
                db.execute(VACUUM_AFTER_CRASH)
                self.event(f"{VACUUM_AFTER_CRASH} ({time.time() - began:.1f} s)")

    def event(self, what: str) -> None:
        self.events.append((time.time(), what))
        print(f"  {time.strftime('%H:%M:%S')} {what}", flush=True)

    # -- sampling ------------------------------------------------------------------------------

    def postmaster(self) -> int:
        return int((self.folder / "cluster" / "data" / "postmaster.pid").read_text().split()[0])

    def sample(self, db: psycopg.Connection[Any], admin: psycopg.Connection[Any], at: float,
               since: dict[str, Any]) -> dict[str, Any]:
        lag = self.sample_s * 1.5  # the window: [at - lag - sample_s, at - lag), over by now
        lo, hi = at - lag - self.sample_s, at - lag
        row: dict[str, Any] = {"t_min": round((at - since["t0"]) / 60, 2)}
        runs = db.execute(RUNS_OF_WINDOW, {"lo": _ts(lo), "hi": _ts(hi), "killed": self.killed}).fetchone()
        assert runs is not None
        row |= dict(zip(("runs", "ok", "error", "lost", "skipped", "open"), runs[:6], strict=True))
        row["lost_unexplained"] = runs[9]
        row["runs_per_s"] = runs[0] / self.sample_s
        row |= {"p50_s": runs[6], "p99_s": runs[7], "max_s": runs[8]}
        row["sizes_mb"] = {name: size / 2**20 for name, size in db.execute(SIZES).fetchall()}
        row["tables"] = {name: {"live": live, "dead": dead, "autovacuums": av, "autoanalyzes": aa}
                         for name, live, dead, av, aa in db.execute(TABLE_STATS, (list(TABLES),)).fetchall()}
        lsn = db.execute("SELECT pg_current_wal_lsn()").fetchone()
        assert lsn is not None
        if "lsn" in since:
            wal = db.execute("SELECT pg_wal_lsn_diff(%s, %s)", (lsn[0], since["lsn"])).fetchone()
            assert wal is not None
            row["wal_mb"] = float(wal[0]) / 2**20
        since["lsn"] = lsn[0]
        hot = db.execute(HOT_PATH, ("%claim_runs%", "%complete_runs%", "%dispatch.tick%")).fetchone()
        assert hot is not None
        row |= {"claim_max_ms": hot[0], "complete_max_ms": hot[1], "tick_max_ms": hot[2]}
        if self.statements:
            row["statements"] = [
                {"query": " ".join(query.split())[:150], "calls": calls, "ms": ms, "blocks": blocks}
                for query, calls, ms, blocks in db.execute(TOP_STATEMENTS).fetchall()]
        db.execute("SELECT pg_stat_statements_reset()")
        row["prunes"] = [
            {"at": s.timestamp(), "s": d} for s, d in admin.execute(
                "SELECT d.start_time, extract(epoch FROM d.end_time - d.start_time)::float8"
                " FROM cron.job_run_details d JOIN cron.job j USING (jobid)"
                " WHERE j.jobname = 'dispatch-prune' AND j.database = %s AND d.start_time >= to_timestamp(%s)"
                "   AND d.end_time IS NOT NULL ORDER BY d.start_time",
                (DATABASE, since["prune_after"])).fetchall()]
        if row["prunes"]:
            since["prune_after"] = row["prunes"][-1]["at"] + 0.001
        listeners = []
        for item in self.live():
            cpu = process_cpu_s(item.proc.pid)
            listeners.append({"worker": item.worker, "rss_mb": _rss_mb(item.proc.pid),
                              "cpu_s": cpu - item.cpu_s})
            item.cpu_s = cpu
        row["listeners"] = listeners
        postmaster = self.postmaster()
        cpu = cluster_cpu_s(postmaster)
        if since.get("postmaster") == postmaster:
            row["pg_cpu_s"] = cpu - since["pg_cpu"]
        since |= {"postmaster": postmaster, "pg_cpu": cpu}
        return row

    def run(self) -> None:
        url = self.start()
        faults_at: list[tuple[float, Any]] = []
        t0 = self.t0 = time.time()
        if self.faults:
            every = min(300.0, self.minutes * 60 / 2)
            faults_at += [(t0 + k * every + 20, self.kill_listener)
                          for k in range(1, int(self.minutes * 60 / every) + 1)
                          if k * every + 20 < self.minutes * 60]
            if self.minutes >= 6:
                # both after the first retention cycle, when the goals begin to be judged
                judged = _first_full_prune(t0, self.retention_s) + 60
                fast = _quiet_second(max(t0 + self.minutes * 20, judged))
                immediate = _quiet_second(max(t0 + self.minutes * 40, fast + 60))
                faults_at += [(fast, lambda: self.restart_postgres("fast")),
                              (immediate, lambda: self.restart_postgres("immediate"))]
            faults_at.sort(key=lambda item: item[0])
        print(f"soak: {self.schedules:,} schedules over {self.projects:,} tenants, retention "
              f"{self.retention}, {self.minutes:g} min, sampled every {self.sample_s:g} s"
              f"{', with faults' if self.faults else ''}; durable cluster in {self.folder}", flush=True)
        since: dict[str, Any] = {"t0": t0, "prune_after": t0}
        # samples at the 30th second of each minute (or every sample_s from the start)
        first = (t0 // 60 + 1) * 60 + 30 if self.sample_s == 60 else t0 + self.sample_s
        end = t0 + self.minutes * 60
        at = first
        try:
            while at <= end + self.sample_s * 1.5:
                while time.time() < at:
                    if faults_at and time.time() >= faults_at[0][0]:
                        faults_at.pop(0)[1]()
                        continue
                    time.sleep(min(0.5, max(0.0, at - time.time())))
                row = self._sample_retrying(url, at, since)
                self.rows.append(row)
                print(_line(row), flush=True)
                at += self.sample_s
            self.check(url, end)
        finally:
            self.stop()

    def _sample_retrying(self, url: str, at: float, since: dict[str, Any]) -> dict[str, Any]:
        """A sample taken right after a restart may meet a database still starting."""
        for attempt in range(30):
            try:
                with psycopg.connect(url, autocommit=True) as db, \
                        psycopg.connect(self.cluster.url("postgres"), autocommit=True) as admin:
                    return self.sample(db, admin, at, since)
            except psycopg.OperationalError:
                if attempt == 29:
                    raise
                time.sleep(1)
        raise AssertionError("unreachable")

    # -- the end -------------------------------------------------------------------------------

    def check(self, url: str, end: float) -> None:
        for item in self.listeners:
            if item.proc.poll() not in (None, -signal.SIGKILL):
                self.failures.append(f"{item.worker} exited with {item.proc.returncode}")
        with psycopg.connect(url, autocommit=True) as db:
            # A run whose last attempt (max_attempts) was out with a listener killed -9 ends lost, as
            # the contract says: the attempt may have reached the function. Any other is a failure.
            lost = sum(row["lost"] for row in self.rows)
            unexplained = sum(row["lost_unexplained"] for row in self.rows)
            if unexplained:
                self.failures.append(f"{unexplained} runs lost otherwise than with a killed listener")
            stuck = db.execute(
                "SELECT count(*) FROM dispatch.runs WHERE status IN ('pending', 'running')"
                " AND fire_at < now() - interval '3 minutes' AND coalesce(not_before, '-infinity') < now()"
            ).fetchone()
            assert stuck is not None
            if stuck[0]:
                self.failures.append(f"{stuck[0]} runs stuck (open 3 minutes past their instant)")
            retention = db.execute("SELECT extract(epoch FROM runs_retention)::float8 FROM dispatch.settings"
                                   ).fetchone()
            assert retention is not None
            # slots whose runs the ticks have marked by now, of schedules created before, still retained
            hi = time.time() - self.sample_s * 1.5
            lo = max(hi - retention[0] + self.sample_s, self.t0 + 10)
            slots = db.execute(UNACCOUNTED, {"lo": _ts(lo), "hi": _ts(hi)}).fetchone()
            assert slots is not None
            self.slots_checked = slots[0]
            if slots[1]:
                self.failures.append(f"{slots[1]} of {slots[0]} slots neither a run nor in a recorded gap")
            if not slots[0]:
                self.failures.append("no slot to check: the window was empty")
        print(f"checks: {sum(r['runs'] for r in self.rows):,} runs sampled, {lost} ended lost"
              f" ({lost - unexplained} with their last attempt out when its listener was killed); "
              f"{self.slots_checked:,} slots of the last {(hi - lo) / 60:.1f} min each a run or in a gap; "
              + ("OK" if not self.failures else "FAILED: " + "; ".join(self.failures)), flush=True)


def retention_cycle_end(rows: list[dict[str, Any]], t0: float, retention_s: float) -> float:
    """The minute of the first sample after the first prune that began a retention and a prune
    interval after the start: from then on each prune deletes a whole interval of history, whose
    space the next interval's rows reuse. 15 if the run saw no such prune."""
    full = t0 + retention_s + PRUNE_EVERY_S
    return next((r["t_min"] for r in rows if any(p["at"] >= full for p in r["prunes"])), 15.0)


def goals(rows: list[dict[str, Any]], warm_min: float) -> tuple[list[str], list[str] | None]:
    """The long-horizon goals over the rows from `warm_min` minutes on (the end of the first
    retention cycle): (what was found, the goals missed; None: too short to judge)."""
    steady = [r for r in rows if r["t_min"] >= warm_min]
    if len(steady) < 2:
        return [], None
    found, missed = [f"judged from minute {warm_min:g}, the end of the first retention cycle"], []
    worst = max(((abs(b["sizes_mb"][k] - a["sizes_mb"][k]) / a["sizes_mb"][k], k)
                 for a, b in itertools.pairwise(steady) for k in b["sizes_mb"]
                 if a["sizes_mb"].get(k, 0) > 1), default=(0.0, "-"))
    found.append(f"largest minute-to-minute size change {worst[0]:.1%} ({worst[1]})")
    if worst[0] > 0.10:
        missed.append("sizes within 10 % minute to minute")
    dead = {t: max(r["tables"][t]["dead"] for r in steady) for t in TABLES}
    found.append("dead tuples at most " + ", ".join(f"{t} {n:,}" for t, n in dead.items()))
    first = [r["p99_s"] for r in rows if r["p99_s"] is not None and r["t_min"] <= 10]
    later = [r["p99_s"] for r in steady if r["p99_s"] is not None]
    if first and later:
        base = statistics.median(first)
        found.append(f"p99 {base:.2f} s in the first ten minutes (median), at most {max(later):.2f} s after")
        if max(later) > 2 * base:
            missed.append("p99 within 2x of the first ten minutes")
    # Each listener process against itself once it has run five minutes (a listener started
    # after a kill -9 fills its caches again): flat means within 10 % of that.
    first_seen: dict[str, float] = {}
    rss: dict[str, list[float]] = {}
    for r in rows:
        for item in r["listeners"]:
            first_seen.setdefault(item["worker"], r["t_min"])
            if r["t_min"] >= max(warm_min, first_seen[item["worker"]] + 5):
                rss.setdefault(item["worker"], []).append(item["rss_mb"])
    sizes = [mb for samples in rss.values() for mb in samples]
    growth = max((max(samples) / samples[0] for samples in rss.values()), default=1.0)
    if sizes:
        found.append(f"listener RSS {min(sizes):.0f}-{max(sizes):.0f} MB, each listener at most"
                     f" {growth - 1:+.1%} from its size five minutes after its start ({len(rss)} listeners)")
    if growth > 1.10:
        missed.append("listener RSS within 10 %")
    pause = max(max(r["claim_max_ms"], r["complete_max_ms"]) for r in steady)
    found.append(f"longest claim or completion call {pause:.0f} ms")
    if pause > 1000:
        missed.append("no hot-path call over 1 s")
    return found, missed


def table(rows: list[dict[str, Any]], block_min: int = 10) -> str:
    """The rows as a Markdown table, one line per `block_min` minutes: medians of the rates,
    worst of the latencies, sizes and pauses, sums of the maintenance."""
    lines = ["| minutes | runs/s | latency p50 / p99 / max | runs + audit_log + their indexes"
             " | dead tuples, runs (max) | autovacuums runs / audit_log / schedules | prunes (longest)"
             " | WAL a minute | CPU a minute: PostgreSQL / listeners | listener RSS"
             " | longest claim / completion |",
             "|---" * 11 + "|"]
    for start in range(0, int(max(r["t_min"] for r in rows)) + 1, block_min):
        block = [r for r in rows if start <= r["t_min"] < start + block_min]
        timed = [r for r in block if r["p99_s"] is not None]
        if not timed:
            continue
        sizes = block[-1]["sizes_mb"]
        # (counted minute by minute: a crash restart sets the statistics back to zero)
        vacuums = "/".join(str(sum(b["tables"][t]["autovacuums"] - a["tables"][t]["autovacuums"]
                                   if b["tables"][t]["autovacuums"] >= a["tables"][t]["autovacuums"]
                                   else b["tables"][t]["autovacuums"]
                                   for a, b in itertools.pairwise(block)))
                           for t in TABLES)
        prunes = [p["s"] for r in block for p in r["prunes"]]
        cpu = [r for r in block if "pg_cpu_s" in r]
        lines.append(
            f"| {start}-{start + block_min} | {statistics.median(r['runs_per_s'] for r in timed):,.0f}"
            f" | {statistics.median(r['p50_s'] for r in timed):.2f} / {max(r['p99_s'] for r in timed):.2f} /"
            f" {max(r['max_s'] for r in timed):.2f} s"
            f" | {sizes.get('runs', 0):.0f} + {sizes.get('audit_log', 0):.0f} +"
            f" {sum(v for k, v in sizes.items() if k not in TABLES):.0f} MB"
            f" | {max(r['tables']['runs']['dead'] for r in block):,} | {vacuums}"
            f" | {len(prunes)}{f' ({max(prunes):.1f} s)' if prunes else ''}"
            f" | {statistics.median(r.get('wal_mb', 0) for r in block):.0f} MB"
            f" | {statistics.median(r['pg_cpu_s'] for r in cpu) if cpu else 0:.0f} /"
            f" {statistics.median(sum(i['cpu_s'] for i in r['listeners']) for r in block):.0f} s"
            f" | {max(max((i['rss_mb'] for i in r['listeners']), default=0) for r in block):.0f} MB"
            f" | {max(r['claim_max_ms'] for r in block):.0f} /"
            f" {max(r['complete_max_ms'] for r in block):.0f} ms |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], events: list[tuple[float, str]], t0: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t_min"] for r in rows]
    fig, axes = plt.subplots(3, 2, figsize=(12, 10), sharex=True)
    panels: list[tuple[str, list[tuple[str, list[float | None]]]]] = [
        ("runs/s", [("runs/s", [r["runs_per_s"] for r in rows])]),
        ("dispatch latency (s)", [(k, [r[f"{k}_s"] for r in rows]) for k in ("p50", "p99", "max")]),
        ("size (MB)", [(k, [r["sizes_mb"].get(k) for r in rows]) for k in TABLES]
         + [("their indexes", [sum(v for n, v in r["sizes_mb"].items() if n not in TABLES) for r in rows])]),
        ("dead tuples", [(k, [r["tables"][k]["dead"] for r in rows]) for k in TABLES]),
        ("CPU (% of one core) and WAL (MB/min)",
         [("PostgreSQL CPU", [_pct(r.get("pg_cpu_s"), rows) for r in rows]),
          ("listeners CPU", [_pct(sum(i["cpu_s"] for i in r["listeners"]), rows) for r in rows]),
          ("WAL", [r.get("wal_mb") for r in rows])]),
        ("listener RSS (MB) and longest call (ms)",
         [("RSS", [max((i["rss_mb"] for i in r["listeners"]), default=None) for r in rows]),
          ("claim_runs", [r["claim_max_ms"] for r in rows]),
          ("complete_runs", [r["complete_max_ms"] for r in rows])]),
    ]
    for ax, (title, series) in zip(axes.flat, panels, strict=True):
        for label, values in series:
            ax.plot(t, [float("nan") if v is None else v for v in values], label=label)
        for at, what in events:
            ax.axvline((at - t0) / 60, color="grey", linewidth=0.6, linestyle=":" if "kill" in what else "--")
        ax.set_title(title)
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def _first_full_prune(t0: float, retention_s: float) -> float:
    """The instant of the first prune that begins a retention and a prune interval after t0: the
    next minute past t0 + retention + interval whose number ends in 7."""
    minute = math.ceil((t0 + retention_s + PRUNE_EVERY_S) / 60)
    return (minute + (7 - minute) % 10) * 60.0


def _quiet_second(after: float) -> float:
    """The 40th second of the first minute from `after` whose number ends in 3: away from the
    prunes (at 7 past every ten minutes) and the five-minute schedules' bursts, after most of the
    minute's own burst. A fixed phase keeps hours with faults comparable."""
    minute = math.ceil(after / 60)
    return (minute + (3 - minute) % 10) * 60 + 40.0


def _pct(cpu_s: float | None, rows: list[dict[str, Any]]) -> float | None:
    if cpu_s is None or len(rows) < 2:
        return None
    return 100 * cpu_s / ((rows[1]["t_min"] - rows[0]["t_min"]) * 60)


def _ts(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def _rss_mb(pid: int) -> float:
    try:
        return memory_kb(pid).get("VmRSS", 0) / 1024
    except OSError:  # it exited since
        return 0.0


def _line(row: dict[str, Any]) -> str:
    sizes = row["sizes_mb"]
    indexes = sum(v for k, v in sizes.items() if k not in TABLES)
    latency = "-" if row["p99_s"] is None else f"{row['p50_s']:.2f}/{row['p99_s']:.2f}/{row['max_s']:.2f} s"
    prunes = ", ".join(f"{p['s']:.1f} s" for p in row["prunes"])
    rss = "/".join(f"{i['rss_mb']:.0f}" for i in row["listeners"])
    return (f"  {row['t_min']:5.1f} min  {row['runs_per_s']:6.0f} runs/s  ok {row['ok']:,}"
            f" error {row['error']:,} lost {row['lost']} open {row['open']}  latency {latency}"
            f"  runs {sizes.get('runs', 0):.0f} MB"
            f" audit {sizes.get('audit_log', 0):.0f} MB indexes {indexes:.0f} MB  dead"
            f" {row['tables']['runs']['dead']:,}/{row['tables']['audit_log']['dead']:,}"
            f"  WAL {row.get('wal_mb', 0):.0f} MB  PG CPU {row.get('pg_cpu_s', 0):.0f} s"
            f"  RSS {rss} MB"
            f"  longest claim/complete {row['claim_max_ms']:.0f}/{row['complete_max_ms']:.0f} ms"
            + (f"  prune {prunes}" if prunes else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--schedules", type=int, default=50_000)
    parser.add_argument("--projects", type=int, default=1000)
    parser.add_argument("--retention", default="5 minutes")
    parser.add_argument("--faults", action="store_true")
    parser.add_argument("--no-vacuum-after-crash", dest="vacuum_after_crash", action="store_false",
                        help="with --faults: leave the immediate restart to autovacuum alone")
    parser.add_argument("--quick", action="store_true", help="a one-minute smoke test of the harness")
    parser.add_argument("--statements", action="store_true",
                        help="track the statements that functions run too, and print where the time went")
    parser.add_argument("--dir", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--report", action="store_true",
                        help="no run: the table, the goals and the plot of the last run's soak.json in --dir")
    args = parser.parse_args()
    if args.quick:
        args.minutes, args.schedules, args.projects, args.retention = 1, 2000, 50, "2 minutes"
    name = "soak-quick" if args.quick else ("soak-faults" if args.faults else "soak")
    folder = args.dir or ROOT / ".pgdata" / f"{name}-durable"
    if args.report:
        report(folder, args.plot)
        return
    soak = Soak(folder=folder, schedules=args.schedules, projects=args.projects, retention=args.retention,
                minutes=args.minutes, sample_s=15 if args.quick else 60, faults=args.faults or args.quick,
                statements=args.statements, vacuum_after_crash=args.vacuum_after_crash)
    soak.run()
    # (--quick is a smoke test of the harness: its figures judge nothing)
    warm_min = retention_cycle_end(soak.rows, soak.t0, soak.retention_s)
    found, missed = goals(soak.rows, warm_min) if not args.quick else ([], None)
    print_goals(found, missed)
    (folder / "soak.json").write_text(json.dumps({"rows": soak.rows, "events": soak.events, "t0": soak.t0,
                                                  "warm_min": warm_min, "failures": soak.failures,
                                                  "goals_missed": missed}, default=float))
    if not args.quick:
        print(table(soak.rows))
    if args.statements:
        print(statements(soak.rows))
    if args.plot:
        plot(soak.rows, soak.events, soak.t0, args.plot)
    if soak.failures:
        raise SystemExit(1)


def statements(rows: list[dict[str, Any]]) -> str:
    """The last sampled minute's top statements, a run being one of that minute's runs."""
    row = next((r for r in reversed(rows) if r.get("statements") and r["runs"]), None)
    if row is None:
        return "statements: no minute with runs sampled"
    runs = row["runs"]
    lines = [f"statements of the minute at {row['t_min']:g} min ({runs:,} runs; nested ones included):",
             f"{'ms':>8} {'calls':>7} {'us/run':>7} {'blocks/run':>10}  statement"]
    for item in row["statements"]:
        lines.append(f"{item['ms']:8.0f} {item['calls']:7,} {item['ms'] * 1000 / runs:7.1f}"
                     f" {item['blocks'] / runs:10.1f}  {item['query'][:100]}")
    return "\n".join(lines)


def print_goals(found: list[str], missed: list[str] | None) -> None:
    for line in found:
        print(f"  {line}")
    if missed is None:
        print("goals: not judged (the run is shorter than its first retention cycle)")
    else:
        print("goals: " + ("met" if not missed else "missed: " + "; ".join(missed)))


def report(folder: Path, plot_to: Path | None) -> None:
    """What a finished run recorded in folder/soak.json: its table, its goals, its plot."""
    recorded = json.loads((folder / "soak.json").read_text())
    rows = recorded["rows"]
    print(table(rows))
    print_goals(*goals(rows, recorded.get("warm_min", 15.0)))
    if plot_to:
        plot(rows, [tuple(e) for e in recorded["events"]], recorded.get("t0", 0.0), plot_to)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # the listeners, the sink and the cluster are stopped on the way out


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupt)
    main()
