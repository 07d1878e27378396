"""The chaos suite: real PostgreSQL, real listeners, a counting sink, and faults at random moments.

    .venv/bin/python -m chaos.run --profile quick|full|failover|autofailover... [--seed N] [--keep]

What it runs (all of it its own, in ``.pgdata/chaos`` unless ``--dir`` says otherwise):

- a private PostgreSQL cluster (``scripts/pg-cluster``), a database ``chaos`` with ``sql/install.sql``
  and a harness-only schema ``chaos`` (a trigger on dispatch.runs that records every claim);
- the counting sink (``chaos.sink``) in its own process, recording every request;
- several ``pgdispatch listen`` processes, each with its own URL prefix (``/w/<worker id>/...``) so
  the sink knows who called;
- a driver that moves simulated time forward.

How simulated time is driven. Every schedule is ``* * * * *`` in UTC and its ``next_run_at`` is set
to ``base`` = the next whole minute plus one day, so every slot lies in the real future. The driver
calls ``dispatch.tick(horizon)`` a few times a second, the horizon moving one minute every
``minute_s`` seconds from ``base`` to ``last_slot = base + minutes``. Since each slot is later
than the real ``now()``, complete_run advances a schedule to ``cron_next(max(slot, now())) =
slot + 1 minute``: no slot is ever skipped, and a schedule is marked again at the first tick after
its run finished. So the expected fate of every slot is known: each schedule must end with exactly
the runs ``base, base + 1 min, ..., last_slot``, each finished, and ``next_run_at = last_slot + 1
min``. The listeners' own ticks (real clock) mark nothing and only expire leases. After the last
minute the driver keeps ticking until every run is finished (the drain), then the listeners are
stopped with SIGTERM and the verdict is computed (chaos/analysis.sql).

Faults, at random moments (seeded): kill -9 of a listener that has a request in flight at the
sink (a new listener is started at once), pg_terminate_backend of a listener's sessions (found by
application_name 'pgdispatch <worker id>'; the LISTEN session included every other time),
``pg_ctl restart -m fast`` and once ``-m immediate``, and sink windows: answers 500, hangs past the
timeout, connection resets, slow answers, and the sink process killed and restarted a few
seconds later (down).

The failover profile runs a primary and a synchronous streaming standby (``HACluster``) instead,
with listeners given both hosts and ``target_session_attrs=read-write``, and its only faults are
failovers: the primary stopped with ``-m immediate``, the standby promoted, a new standby built
from it; it also reports how soon outcomes are recorded on the new primary (goal 10 s).

The autofailover profiles (``autofailover``, ``-async``, ``-default``) run a pg_auto_failover
formation instead (``chaos.formation.Formation``): the primary's host is killed -9, the monitor
promotes the standby on its own, the old primary comes back as a standby; besides the
invariants they report the time from the kill to the first outcome on the new primary, the
slots called again although answered, and whether pg_cron ticked once a minute on the new
primary and never on the standby (tests/chaos/test_auto_failover.py, ``-m failover``).

Exit status: 0 when every invariant holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from chaos.formation import PGBIN, Formation, as_owner, free_port

__all__ = ["PROFILES", "Profile", "Result", "run_chaos"]

ROOT = Path(__file__).resolve().parent.parent
PGDISPATCH = Path(sys.executable).parent / "pgdispatch"
DBNAME = "chaos"
BASELINE_MODE = {"fail": 0.02, "slow": 0.03}
# Every capped project's running runs, in one snapshot; those above their cap are kept.
_CAP_SAMPLE = ("INSERT INTO chaos.cap_excess (at, project_id, running, cap)"
               " SELECT now(), p.project_id, count(*), p.max_concurrency FROM dispatch.projects p"
               " JOIN dispatch.runs r ON r.project_id = p.project_id AND r.status = 'running'"
               " WHERE p.max_concurrency IS NOT NULL GROUP BY p.project_id, p.max_concurrency"
               " HAVING count(*) > p.max_concurrency")
WINDOW_MODES = {"sink_fail": {"fail": 0.6}, "sink_hang": {"hang": 0.25}, "sink_reset": {"reset": 0.3},
                "sink_slow": {"slow": 0.7}}


@dataclass(frozen=True, kw_only=True)
class Profile:
    schedules: int
    minutes: int  # slots per schedule = minutes + 1
    minute_s: float  # wall seconds per simulated minute
    listeners: int = 3
    concurrency: int = 32
    timeout_s: float = 2.0
    lease_s: float = 4.0
    kills: int = 3
    terminates: int = 2
    restarts_fast: int = 1
    restarts_immediate: int = 1
    sink_windows: int = 1  # of each kind: fail, hang, reset, slow
    sink_downs: int = 1
    window_s: float = 4.0
    down_s: float = 3.0
    drain_s: float = 120.0
    resume_goal_s: float = 5.0
    failovers: int = 0  # a primary with a synchronous standby, the primary killed, the standby promoted
    # Who promotes: "" the harness itself (HACluster: pg_ctl promote), "pg_auto_failover" its
    # monitor (chaos.formation.Formation: the primary's host killed, the old primary brought back).
    manager: str = ""
    synchronous: bool = True  # pg_auto_failover: the standby in the write quorum
    tuned: bool = True  # pg_auto_failover: the monitor's health checks tuned (chaos.formation)
    # A tenant burst beside the small tenants p0..p9: project 'burst' with this many schedules
    # more, capped at burst_cap running runs (dispatch.projects.max_concurrency; 0: no row).
    burst: int = 0
    burst_cap: int = 0


_AUTO = Profile(schedules=100, minutes=30, minute_s=2.0, listeners=2, timeout_s=30.0, lease_s=60.0,
                kills=0, terminates=0, restarts_fast=0, restarts_immediate=0, sink_windows=0, sink_downs=0,
                failovers=1, resume_goal_s=10.0, manager="pg_auto_failover")

PROFILES = {
    "quick": Profile(schedules=300, minutes=40, minute_s=1.0, burst=150, burst_cap=24),
    "full": Profile(schedules=2000, minutes=120, minute_s=6.0, kills=24, terminates=12, restarts_fast=3,
                    restarts_immediate=1, sink_windows=4, sink_downs=3, drain_s=300.0, burst=2000,
                    burst_cap=64),
    # The failover drill: nothing but two failovers under load; the figure that matters is how
    # soon outcomes are recorded on the new primary (goal 10 s), besides the invariants.
    "failover": Profile(schedules=600, minutes=40, minute_s=3.0, kills=0, terminates=0, restarts_fast=0,
                        restarts_immediate=0, sink_windows=0, sink_downs=0, failovers=2, resume_goal_s=10.0),
    # The drills under pg_auto_failover (tests/chaos/test_auto_failover.py, -m failover): 3,100
    # slots, two listeners with the listener's default timeout and lease (30 s, 60 s: outcomes
    # kept across the failover still land), the primary's host killed once mid-round.
    "autofailover": _AUTO,
    "autofailover-async": dataclasses.replace(_AUTO, synchronous=False),
    # The same with pg_auto_failover's default timing: about 50 s from the kill to writes.
    "autofailover-default": dataclasses.replace(_AUTO, tuned=False),
}


@dataclass
class Result:
    figures: dict[str, str]
    failures: list[str]
    wall_s: float
    resume_s: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


# What a listener may log about one run's outcome (chaos.run's report on unexplained extras).
_OUTCOME_EVENTS = ("run_not_recorded", "completion_abandoned", "completion_failed", "worker_error",
                   "release_failed")


def _log(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Cluster:
    """The harness's own PostgreSQL cluster, via scripts/pg-cluster."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = 0

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        out = subprocess.run([str(ROOT / "scripts" / "pg-cluster"), "start", str(self.folder)],
                             check=True, capture_output=True, text=True)
        self.port = int(out.stdout.strip())

    def stop(self) -> None:
        subprocess.run([str(ROOT / "scripts" / "pg-cluster"), "stop", str(self.folder)], check=False,
                       capture_output=True)

    def restart(self, mode: str) -> None:
        subprocess.run(as_owner(str(PGBIN / "pg_ctl"), "-D", str(self.folder / "data"), "-l",
                                str(self.folder / "server.log"), "-w", "-t", "60", "-m", mode, "restart"),
                       check=True, capture_output=True)

    def url(self, dbname: str = DBNAME) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def psql(self, *args: str) -> None:
        subprocess.run([str(PGBIN / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", self.url(), *args],
                       check=True, capture_output=True, text=True)


class HACluster:
    """A primary and a synchronous streaming standby (pg_basebackup) on this machine, for the
    failover drill. Clients get both hosts and target_session_attrs=read-write, so libpq finds
    whichever is the primary. `failover()` kills the primary (-m immediate), promotes the standby
    and builds a new standby from it in the old primary's place."""

    def __init__(self, folder: Path) -> None:
        self.folders = [folder / "a", folder / "b"]
        self.ports = [free_port(), free_port()]
        self.primary = 0
        self.port = self.ports[0]
        self.failovers: list[tuple[float, float]] = []  # (primary killed, standby promoted)

    def _pg_ctl(self, i: int, *args: str) -> None:
        subprocess.run(as_owner(str(PGBIN / "pg_ctl"), "-D", str(self.folders[i] / "data"), "-l",
                                str(self.folders[i] / "server.log"), "-w", "-t", "60", *args),
                       check=True, capture_output=True)

    def _direct(self, i: int, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.ports[i]}/{dbname}"

    def start(self) -> None:
        for folder in self.folders:
            self._stop(folder)
            shutil.rmtree(folder, ignore_errors=True)
        self.folders[0].mkdir(parents=True)
        subprocess.run([str(ROOT / "scripts" / "pg-cluster"), "start", str(self.folders[0]),
                        str(self.ports[0])], check=True, capture_output=True, text=True)
        with psycopg.connect(self._direct(0), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            conn.execute("SELECT pg_reload_conf()")
        self._build_standby(1)

    def _build_standby(self, i: int) -> None:
        """A new standby in slot i, from the primary, streaming synchronously."""
        folder = self.folders[i]
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        if os.geteuid() == 0:
            shutil.chown(folder, "postgres", "postgres")
        subprocess.run(as_owner(str(PGBIN / "pg_basebackup"), "-h", "127.0.0.1", "-p",
                                str(self.ports[self.primary]), "-U", "postgres", "-D", str(folder / "data"),
                                "-R", "-X", "stream", "-c", "fast"), check=True, capture_output=True)
        self._pg_ctl(i, "-o", f"-p {self.ports[i]}", "start")
        with psycopg.connect(self._direct(self.primary), autocommit=True) as conn:
            def until(query: str, what: str) -> None:
                deadline = time.monotonic() + 60
                while conn.execute(query).fetchone() != (1,):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the new standby did not {what}")
                    time.sleep(0.05)

            until("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'", "stream")
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")  # commits wait for it again
            conn.execute("SELECT pg_reload_conf()")
            until("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'", "become synchronous")

    def failover(self) -> tuple[float, float]:
        old, new = self.primary, 1 - self.primary
        # The standby will be a primary without a standby for a while: it must not wait for one.
        with psycopg.connect(self._direct(new), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = ''")
            conn.execute("SELECT pg_reload_conf()")
        killed = time.time()
        self._pg_ctl(old, "-m", "immediate", "stop")
        self._pg_ctl(new, "promote")
        promoted = time.time()
        self.primary = new
        self.port = self.ports[new]
        self.failovers.append((killed, promoted))
        self._build_standby(old)
        return killed, promoted

    @staticmethod
    def _stop(folder: Path) -> None:
        if (folder / "data" / "postmaster.pid").exists():
            subprocess.run(as_owner(str(PGBIN / "pg_ctl"), "-D", str(folder / "data"), "-m", "immediate",
                                    "-w", "stop"), check=False, capture_output=True)

    def stop(self) -> None:
        for folder in self.folders:
            self._stop(folder)

    def restart(self, mode: str) -> None:
        raise NotImplementedError("the failover drill restarts nothing: it fails over")

    def url(self, dbname: str = DBNAME) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"postgresql://postgres@{hosts}/{dbname}?target_session_attrs=read-write"

    def psql(self, *args: str) -> None:
        subprocess.run([str(PGBIN / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", self.url(), *args],
                       check=True, capture_output=True, text=True)


class SinkProcess:
    def __init__(self, workdir: Path, hang_s: float, flap_s: tuple[float, float] = (3.0, 9.0)) -> None:
        self.port = free_port()
        self.control_port = free_port()
        self.record = workdir / "sink-requests.tsv"
        self.record.unlink(missing_ok=True)
        self.log = workdir / "sink.log"
        self.hang_s = hang_s
        self.flap_s = flap_s  # the function `flapping`: down for [0] seconds, then up for [1]
        self.proc: subprocess.Popen[bytes] | None = None
        self.mode: dict[str, float] = dict(BASELINE_MODE)

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "chaos.sink", "--port", str(self.port), "--control-port",
                 str(self.control_port), "--record", str(self.record), "--hang", str(self.hang_s),
                 "--flap-down", str(self.flap_s[0]), "--flap-up", str(self.flap_s[1])],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=log,
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        self.proc.stdout.close()  # the sink writes nothing more there
        if line.strip() != b"ready":
            raise RuntimeError(f"the sink did not start (see {self.log})")
        self.set_mode(self.mode)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def _call(self, path: str, data: bytes | None = None) -> Any:
        request = urllib.request.Request(f"http://127.0.0.1:{self.control_port}{path}", data=data,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
            return json.loads(response.read())

    def set_mode(self, mode: dict[str, float]) -> None:
        self.mode = mode
        if self.proc is not None and self.proc.poll() is None:
            self._call("/mode", json.dumps(mode).encode())

    def inflight(self) -> dict[str, int]:
        try:
            result: dict[str, int] = self._call("/inflight")
        except OSError:
            return {}
        return result


@dataclass
class ListenerProcess:
    worker: str
    proc: subprocess.Popen[bytes]
    log: Path
    started: float
    killed: bool = False


class Harness:
    def __init__(self, profile: Profile, folder: Path, seed: int) -> None:
        self.profile = profile
        self.folder = folder
        self.rng = random.Random(seed)
        self.cluster: Cluster | HACluster | Formation
        if profile.manager == "pg_auto_failover":
            self.cluster = Formation(folder / "formation", synchronous=profile.synchronous,
                                     tuned=profile.tuned)
        elif profile.failovers:
            self.cluster = HACluster(folder)
        else:
            self.cluster = Cluster(folder)
        self.workdir = folder / "run"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.sink = SinkProcess(self.workdir, hang_s=profile.timeout_s + 3)
        self.listeners: list[ListenerProcess] = []
        self.next_worker = 1
        self.cap_samples = 0  # the driver's samples of the capped projects (_CAP_SAMPLE)
        self.faults: list[tuple[str, str, float, float | None]] = []
        self.restarts: list[tuple[float, float]] = []  # (began, up again)
        self.crashed: list[str] = []
        self.lock = threading.Lock()
        self.windows: dict[str, dict[str, float]] = {}
        self.stop_faults = threading.Event()
        self.first_outcomes: list[float] = []  # failovers: promotion to the first outcome recorded

    # -- set-up ----------------------------------------------------------------------------

    def setup(self) -> None:
        self.cluster.start()
        with psycopg.connect(self.cluster.url("postgres"), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {DBNAME} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {DBNAME}")
        self.cluster.psql("-f", str(ROOT / "sql" / "install.sql"))
        self.cluster.psql("-f", str(Path(__file__).with_name("schema.sql")))
        if isinstance(self.cluster, Formation):
            # pg_cron lives in database postgres on every node: the tick job goes there.
            self.cluster.register_pg_cron(DBNAME)
        p = self.profile
        with psycopg.connect(self.cluster.url(), autocommit=True) as conn:
            # A mix of run policies: a quarter call "flaky" (20 % of its requests fail), three in
            # twenty "flapping" (down 3 s of every 12: its breakers open and close), a quarter
            # overlap allow, a quarter buffer_one. Every failure the sink makes is retryable, with
            # back-offs of a fraction of a simulated minute. Every slot must run: catchup all,
            # within a day (the slots are a day ahead of the real clock).
            conn.execute(
                "INSERT INTO dispatch.schedules"
                " (project_id, function_name, cron_expression, args, max_attempts, catchup, misfire_grace,"
                "  overlap, retry_backoff, retry_backoff_max)"
                " SELECT 'p' || (i %% 10),"
                "        CASE WHEN i %% 4 = 1 THEN 'flaky' WHEN i %% 20 IN (3, 4, 6) THEN 'flapping'"
                "             ELSE 'f' END,"
                "        '* * * * *',"
                "        jsonb_build_object('i', i), 10, 'all', '1 day',"
                "        (ARRAY['skip', 'skip', 'allow', 'buffer_one'])[i %% 4 + 1],"
                "        '200 milliseconds', '2 seconds'"
                " FROM generate_series(1, %s) i", (p.schedules,))
            # the tenant burst: one project with as many schedules again, the same policies
            conn.execute(
                "INSERT INTO dispatch.schedules"
                " (project_id, function_name, cron_expression, args, max_attempts, catchup, misfire_grace,"
                "  overlap, retry_backoff, retry_backoff_max)"
                " SELECT 'burst', CASE WHEN i %% 4 = 1 THEN 'flaky' ELSE 'f' END, '* * * * *',"
                "        jsonb_build_object('i', -i), 10, 'all', '1 day',"
                "        (ARRAY['skip', 'skip', 'allow', 'buffer_one'])[i %% 4 + 1],"
                "        '200 milliseconds', '2 seconds'"
                " FROM generate_series(1, %s) i", (p.burst,))
            if p.burst_cap:
                conn.execute("INSERT INTO dispatch.projects (project_id, max_concurrency)"
                             " VALUES ('burst', %s)", (p.burst_cap,))
            # weights and a second cap among the small tenants: claims share by weight and keep
            # every cap while listeners are killed and the database restarts
            conn.execute("INSERT INTO dispatch.projects (project_id, weight, max_concurrency)"
                         " VALUES ('p1', 3, NULL), ('p2', 2, 8)")
            conn.execute(
                "INSERT INTO chaos.params (base, last_slot, minutes, lease_s)"
                " SELECT b, b + make_interval(mins => %s), %s, %s"
                " FROM (SELECT date_trunc('minute', now()) + interval '1 day 1 minute' AS b) x",
                (p.minutes, p.minutes, p.lease_s))
            conn.execute("UPDATE dispatch.schedules SET next_run_at = (SELECT base FROM chaos.params)")
            row = conn.execute("SELECT base, last_slot FROM chaos.params").fetchone()
            assert row is not None
            self.base: datetime = row[0]
        self.sink.start()

    # -- listeners -------------------------------------------------------------------------

    def start_listener(self) -> ListenerProcess:
        p = self.profile
        worker = f"chaos-{self.next_worker}"
        self.next_worker += 1
        log = self.workdir / f"{worker}.log"
        template = f"http://127.0.0.1:{self.sink.port}/w/{worker}/projects/{{project_id}}/functions/{{function_name}}"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(PGDISPATCH), "listen", "--database-url", self.cluster.url(), "--invoke-url", template,
                 "--worker-id", worker, "--concurrency", str(p.concurrency), "--timeout", str(p.timeout_s),
                 "--lease", str(p.lease_s), "--sweep-interval", "1", "--grace-period", "5"],
                stdout=out, stderr=subprocess.STDOUT,
            )
        listener = ListenerProcess(worker, proc, log, time.time())
        with self.lock:
            self.listeners.append(listener)
        return listener

    def alive(self) -> list[ListenerProcess]:
        return [item for item in self.listeners if not item.killed and item.proc.poll() is None]

    def watch_listeners(self) -> None:
        """A listener that exits on its own is a failure; it is replaced so the run goes on."""
        with self.lock:
            gone = [item for item in self.listeners if not item.killed and item.proc.poll() is not None]
            for item in gone:
                item.killed = True
                self.crashed.append(f"{item.worker} exited with {item.proc.returncode}")
        for item in gone:
            _log(f"listener {item.worker} exited on its own ({item.proc.returncode}); starting another")
            self.start_listener()

    # -- faults ----------------------------------------------------------------------------

    def _record(self, kind: str, target: str, at: float, until: float | None = None) -> None:
        with self.lock:
            self.faults.append((kind, target, at, until))

    def fault_plan(self, duration_s: float) -> list[tuple[float, str]]:
        p = self.profile
        kinds = (["kill"] * p.kills + ["terminate"] * p.terminates + ["restart_fast"] * p.restarts_fast
                 + ["restart_immediate"] * p.restarts_immediate + ["sink_down"] * p.sink_downs
                 + [kind for kind in WINDOW_MODES for _ in range(p.sink_windows)]
                 + ["failover"] * p.failovers)
        # Spread over 10%..85% of the run: a stratified draw, so faults do not all bunch up.
        self.rng.shuffle(kinds)
        span = 0.75 * duration_s / max(1, len(kinds))
        return [(0.1 * duration_s + (i + self.rng.random()) * span, kind) for i, kind in enumerate(kinds)]

    def inject(self, kind: str) -> None:
        if kind == "failover":
            assert isinstance(self.cluster, HACluster | Formation)
            # Mid-round: while the sink is answering requests (wait a little for some).
            deadline = time.monotonic() + 3
            while not any(self.sink.inflight().values()) and time.monotonic() < deadline:
                time.sleep(0.02)
            killed, promoted = self.cluster.failover()
            # For the analysis a failover is a database restart: from the kill to the promotion.
            self.restarts.append((killed, promoted))
            self._record("restart_failover", f"127.0.0.1:{self.cluster.port}", killed, promoted)
            _log(f"failover: primary killed, standby on port {self.cluster.port} promoted in "
                 f"{promoted - killed:.1f} s; new standby streaming {time.time() - promoted:.1f} s later")
        elif kind == "kill":
            self.kill_one()
        elif kind == "terminate":
            self.terminate_one()
        elif kind.startswith("restart_"):
            mode = kind.removeprefix("restart_")
            began = time.time()
            self.cluster.restart(mode)
            up = time.time()
            self.restarts.append((began, up))
            self._record(kind, "", began, up)
            _log(f"PostgreSQL restarted -m {mode} in {up - began:.1f} s")
        elif kind == "sink_down":
            began = time.time()
            self.sink.kill()
            _log(f"sink down for {self.profile.down_s:g} s")
            time.sleep(self.profile.down_s)
            self.sink.start()
            self._record(kind, "", began, time.time())
        else:
            began = time.time()
            self.windows[kind] = WINDOW_MODES[kind]
            self._apply_mode()
            _log(f"{kind} for {self.profile.window_s:g} s")
            threading.Timer(self.profile.window_s, self._end_window, (kind, began)).start()

    def _end_window(self, kind: str, began: float) -> None:
        self.windows.pop(kind, None)
        self._apply_mode()
        self._record(kind, "", began, time.time())

    def _apply_mode(self) -> None:
        mode = dict(BASELINE_MODE)
        for window in self.windows.values():
            mode.update(window)
        with contextlib.suppress(OSError):
            self.sink.set_mode(mode)

    def kill_one(self) -> None:
        # Mid-invocation: pick a listener the sink is answering right now (wait a little for one).
        deadline = time.monotonic() + 3
        victim: ListenerProcess | None = None
        busy = False
        while victim is None and time.monotonic() < deadline:
            inflight = self.sink.inflight()
            candidates = [item for item in self.alive() if inflight.get(item.worker)]
            if candidates:
                victim, busy = self.rng.choice(candidates), True
            else:
                time.sleep(0.02)
        if victim is None:
            candidates = self.alive()
            if not candidates:
                return
            victim = self.rng.choice(candidates)
        victim.killed = True
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        self._record("kill", victim.worker, time.time())
        if busy:
            self._record("kill_in_flight", victim.worker, time.time())
        replacement = self.start_listener()
        note = " (requests in flight)" if busy else ""
        _log(f"kill -9 {victim.worker}{note}; started {replacement.worker}")

    def terminate_one(self) -> None:
        candidates = self.alive()
        if not candidates:
            return
        victim = self.rng.choice(candidates)
        with_listen = sum(1 for kind, *_ in self.faults if kind == "terminate") % 2 == 0
        try:
            with psycopg.connect(self.cluster.url(), autocommit=True, connect_timeout=5) as conn:
                rows = conn.execute(
                    "SELECT pid, query = 'LISTEN dispatch' FROM pg_stat_activity WHERE application_name = %s",
                    (f"pgdispatch {victim.worker}",)).fetchall()
                chosen = [pid for pid, listening in rows if listening and with_listen]
                others = [pid for pid, listening in rows if not listening]
                chosen += self.rng.sample(others, k=max(1, len(others) // 2)) if others else []
                for pid in chosen:
                    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        except psycopg.OperationalError as exc:
            _log(f"terminate skipped: {exc}")
            return
        self._record("terminate", victim.worker, time.time())
        _log(f"pg_terminate_backend: {len(chosen)} of {len(rows)} sessions of {victim.worker}"
             f"{' (LISTEN included)' if with_listen else ''}")

    def fault_loop(self, plan: list[tuple[float, str]], started: float) -> None:
        for at, kind in plan:
            while not self.stop_faults.is_set() and time.monotonic() - started < at:
                time.sleep(0.05)
            if self.stop_faults.is_set():
                return
            try:
                self.inject(kind)
            except Exception as exc:  # a fault that could not be injected is reported, not fatal
                _log(f"fault {kind} failed: {exc!r}")
                self._record(f"{kind}_failed", "", time.time())

    # -- driving time ----------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        while True:
            try:
                return psycopg.connect(self.cluster.url(), autocommit=True, connect_timeout=3)
            except psycopg.OperationalError:
                time.sleep(0.1)

    def drive(self) -> None:
        p = self.profile
        duration_s = (p.minutes + 1) * p.minute_s
        plan = self.fault_plan(duration_s)
        for _ in range(p.listeners):
            self.start_listener()
        conn = self._connect()
        started = time.monotonic()
        faults = threading.Thread(target=self.fault_loop, args=(plan, started), daemon=True)
        faults.start()
        last_report = started
        drain_deadline: float | None = None
        try:
            while True:
                elapsed = time.monotonic() - started
                minute = min(p.minutes, int(elapsed / p.minute_s))
                try:
                    conn.execute("SELECT dispatch.tick(%s::timestamptz + make_interval(mins => %s))",
                                 (self.base, minute))
                    conn.execute(_CAP_SAMPLE)
                    self.cap_samples += 1
                    # A loaded machine injects late (a kill waits for requests in flight, a
                    # restart for the server): the whole plan is carried out before the drain.
                    if elapsed >= duration_s and not faults.is_alive():
                        if drain_deadline is None:
                            drain_deadline = time.monotonic() + p.drain_s
                            _log("last minute marked, every fault injected: draining")
                        row = conn.execute(
                            "SELECT (SELECT count(*) FROM dispatch.runs"
                            "   WHERE status IN ('pending', 'running')),"
                            " (SELECT count(*) FROM dispatch.schedules s, chaos.params p"
                            "   WHERE s.next_run_at <= p.last_slot)").fetchone()
                        assert row is not None
                        if row == (0, 0):
                            _log("drained")
                            return
                        if time.monotonic() > drain_deadline:
                            _log(f"drain timed out: {row[0]} runs open, {row[1]} schedules not past the end")
                            return
                except psycopg.OperationalError:
                    with contextlib.suppress(Exception):
                        conn.close()
                    conn = self._connect()
                    continue
                self.watch_listeners()
                if time.monotonic() - last_report > 15:
                    last_report = time.monotonic()
                    with contextlib.suppress(psycopg.Error):
                        counts = dict(conn.execute(
                            "SELECT status, count(*) FROM dispatch.runs GROUP BY status").fetchall())
                        _log(f"minute {minute}/{p.minutes}: {counts}")
                time.sleep(0.2)
        finally:
            self.stop_faults.set()
            conn.close()

    # -- ending ----------------------------------------------------------------------------

    def stop_listeners(self) -> list[str]:
        problems = []
        alive = self.alive()
        for item in alive:
            item.proc.send_signal(signal.SIGTERM)
        for item in alive:
            try:
                code = item.proc.wait(30)
            except subprocess.TimeoutExpired:
                item.proc.kill()
                item.proc.wait()
                code = -9
            if code != 0:
                problems.append(f"{item.worker} exited with {code} after SIGTERM")
        return problems

    def kill_everything(self) -> None:
        for item in self.listeners:
            if item.proc.poll() is None:
                item.proc.kill()
                item.proc.wait()
        self.sink.stop()

    def load_records(self, conn: psycopg.Connection[Any]) -> None:
        arrived: dict[str, list[str]] = {}
        answered: dict[str, str] = {}
        with self.sink.record.open() as records:
            for line in records:
                fields = line.rstrip("\n").split("\t")
                if fields[0] == "A" and len(fields) == 10:
                    arrived[fields[1]] = fields[1:]
                elif fields[0] == "D" and len(fields) == 3:
                    answered[fields[1]] = fields[2]
        with conn.cursor().copy(
            "COPY chaos.requests (key, worker, request_id, schedule_id, slot, run_id, attempt, decision,"
            " arrived, answered) FROM STDIN"
        ) as copy:
            for key, fields in arrived.items():
                worker, request_id, schedule_id, slot, run_id, attempt, decision, at = fields[1:]
                copy.write_row((key, worker, request_id, schedule_id or None, slot or None, run_id or None,
                                attempt or None, decision, at, answered.get(key)))
        with conn.cursor().copy("COPY chaos.faults (kind, target, at, until) FROM STDIN") as copy:
            for fault in self.faults:
                copy.write_row(fault)
        with conn.cursor().copy("COPY chaos.listeners (worker, started) FROM STDIN") as copy:
            for item in self.listeners:
                copy.write_row((item.worker, item.started))
        conn.execute("ANALYZE chaos.requests")

    def resume_times(self, conn: psycopg.Connection[Any]
                     ) -> tuple[list[float], list[float], list[float]]:
        """Per restart (or failover): seconds from the database being up again to the first claim of
        a run that was waiting then (dispatching resumed; nothing when no run was waiting); per
        restart and per listener that lived through it, seconds to its LISTEN session being back
        (from its own log: `listening`), and to the first run it claimed itself. The last one also
        counts the wait for runs to claim (a listener back in time can find that the others took
        everything due until the next simulated minute), so it is printed, not judged."""
        dispatching, back, own_claim = [], [], []
        self.faults = [tuple(row) for row in conn.execute("SELECT kind, target, at, until FROM chaos.faults")]
        kills = {target: at for kind, target, at, _ in self.faults if kind == "kill"}
        restarts = [(at, until) for kind, _, at, until in self.faults
                    if kind.startswith("restart_") and until is not None]
        listeners = conn.execute("SELECT worker, started FROM chaos.listeners").fetchall()
        first_claim = ("SELECT min(extract(epoch FROM at)) FROM chaos.claims"
                       " WHERE at >= to_timestamp(%s) AND (worker = %s OR %s::text IS NULL)")
        for began, up in restarts:
            # Runs that were waiting when the database came back (marked before), claimed after.
            row = conn.execute(
                "SELECT min(extract(epoch FROM c.at))"
                " FROM chaos.claims c JOIN dispatch.runs r ON r.id = c.run_id"
                " WHERE c.at >= to_timestamp(%s) AND r.created_at < to_timestamp(%s)", (up, up)).fetchone()
            if row and row[0] is not None:
                dispatching.append(float(row[0]) - up)
            for worker, started in listeners:
                if started > began or kills.get(worker, float("inf")) < up + 30:
                    continue
                # From the restart's start: a listener can be back before pg_ctl -w has noticed
                # that the server accepts connections again (then it counts as 0).
                listening = [entry["ts"] for entry in self._log_events(worker, "listening")
                             if entry["ts"] > began]
                back.append(max(0.0, min(listening) - up) if listening else float("inf"))
                row = conn.execute(first_claim, (up, worker, worker)).fetchone()
                own_claim.append(float("inf") if not row or row[0] is None else float(row[0]) - up)
        return dispatching, back, own_claim

    def _log_events(self, worker: str, *events: str) -> list[dict[str, Any]]:
        """A listener's log lines of the events named, their ts as Unix seconds."""
        found = []
        with contextlib.suppress(OSError), (self.workdir / f"{worker}.log").open() as log:
            for line in log:
                with contextlib.suppress(ValueError):
                    entry = json.loads(line)
                    if entry.get("event") in events:
                        entry["ts"] = datetime.fromisoformat(entry["ts"]).timestamp()
                        found.append(entry)
        return found

    def verdict(self, stop_problems: list[str], wall_s: float) -> Result:
        with psycopg.connect(self.cluster.url(), autocommit=True) as conn:
            if conn.execute("SELECT count(*) FROM chaos.requests").fetchone() == (0,):
                self.load_records(conn)
            statements = [part for part in Path(__file__).with_name("analysis.sql").read_text().split(";\n")
                          if part.strip() and not all(line.startswith("--") or not line.strip()
                                                      for line in part.splitlines())]
            for statement in statements[:-1]:
                conn.execute(statement)
            rows = conn.execute(statements[-1]).fetchall()
            examples = conn.execute(
                "SELECT v.fate, coalesce(v.decision, '-'), coalesce(v.answered IS NOT NULL, false), v.status,"
                " coalesce(v.http_status::text, '-'), left(coalesce(v.error, '-'), 70), count(*)"
                " FROM verdict v WHERE v.fate NOT IN ('agrees', 'sink_unreachable')"
                " GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY 7 DESC LIMIT 10").fetchall()
            # Each unexplained extra invocation, with what the run and its listener did around
            # it: a failure on a loaded CI machine leaves no database to look at afterwards.
            unexplained = conn.execute(
                "SELECT e.rid, e.worker, e.attempt, e.decision, e.arrived,"
                "       e.answered - e.arrived, extract(epoch FROM c.at), r.status, r.attempt,"
                "       ended.status, extract(epoch FROM ended.at)"
                " FROM unexplained_extra e JOIN dispatch.runs r ON r.id = e.rid"
                " LEFT JOIN LATERAL (SELECT a->>'status' AS status, (a->>'at')::timestamptz AS at"
                "                    FROM jsonb_array_elements(r.earlier_attempts) a"
                "                    WHERE (a->>'attempt')::int = e.attempt) ended ON true"
                " LEFT JOIN chaos.claims c"
                "        ON c.run_id = e.rid AND c.attempt = e.attempt AND c.worker = e.worker"
                " ORDER BY e.arrived LIMIT 5").fetchall()
            dispatching, back, own_claim = self.resume_times(conn)
            resume = dispatching + back
        figures = {name: value for name, value in rows}
        for fate, decision, answered, status, http_status, error, count in examples:
            label = f"  {fate}: sink {decision} (answered: {answered}) -> {status} {http_status} {error}"
            figures[label] = str(count)
        for extra in unexplained:
            rid, worker, attempt, decision, arrived, answer_s, claimed, status, last, recorded, ended = extra
            # Times counted from the claim (from the arrival if the claim is unknown): when the
            # request arrived, when the attempt was ended (its lease expired), when its listener
            # said what became of it, and the fault nearest to it of any kind or listener.
            origin = arrived if claimed is None else float(claimed)
            answer = "none" if answer_s is None else f"{answer_s:.2f} s"
            said = sorted({f"{entry['event']} at {entry['ts'] - origin:+.2f} s"
                           for entry in self._log_events(worker, *_OUTCOME_EVENTS)
                           if entry.get("run_id") == rid or rid in entry.get("run_ids", ())})
            ended_at = "" if ended is None else f" at {float(ended) - origin:+.2f} s"
            nearest = min(self.faults, key=lambda f: abs(float(f[2]) - arrived), default=None)
            fault = ("none" if nearest is None
                     else f"{nearest[0]} {nearest[1] or '-'} at {float(nearest[2]) - origin:+.1f} s")
            label = (f"  unexplained: run {rid} attempt {attempt} by {worker} ({decision}), "
                     f"{'?' if claimed is None else f'{arrived - origin:.2f}'} s after its claim, "
                     f"answer {answer}; recorded as {recorded or '-'}{ended_at}, run {status} at attempt "
                     f"{last}; {worker} logged {', '.join(said) or 'nothing about it'}; "
                     f"nearest fault: {fault}")
            figures[label] = time.strftime("%H:%M:%S", time.localtime(arrived))
        figures["listener kills (kill -9)"] = str(sum(1 for f in self.faults if f[0] == "kill"))
        figures["kills with requests in flight at the sink"] = str(
            sum(1 for f in self.faults if f[0] == "kill_in_flight"))
        figures["pg_terminate_backend rounds"] = str(sum(1 for f in self.faults if f[0] == "terminate"))
        figures["PostgreSQL restarts (fast / immediate)"] = (
            f"{sum(1 for f in self.faults if f[0] == 'restart_fast')} / "
            f"{sum(1 for f in self.faults if f[0] == 'restart_immediate')}")
        figures["sink windows (fail / hang / reset / slow / down)"] = " / ".join(
            str(sum(1 for f in self.faults if f[0] == kind))
            for kind in ("sink_fail", "sink_hang", "sink_reset", "sink_slow", "sink_down"))
        ha_failures: list[str] = []
        if isinstance(self.cluster, HACluster | Formation):
            first_outcomes, from_kill, again, again_answered = [], [], [], []
            for killed, promoted in self.cluster.failovers:
                with psycopg.connect(self.cluster.url(), autocommit=True) as conn:
                    first_after = ("SELECT extract(epoch FROM min(finished_at)) FROM dispatch.runs"
                                   " WHERE finished_at > to_timestamp(%s)")
                    row = conn.execute(first_after, (promoted,)).fetchone()
                    first_outcomes.append(float(row[0]) - promoted if row and row[0] is not None
                                          else float("inf"))
                    # Counted from the promotion, not as the first finished_at after the kill: the
                    # old primary may commit for a few milliseconds after `killed` was read.
                    from_kill.append(promoted - killed + first_outcomes[-1])
                    # Slots called before the kill and called again after it although the sink
                    # had not failed them (a retry of a failure is no repeat): always under one
                    # request id (checked above). Of those, the ones answered before the kill:
                    # outcomes that died with the old primary (asynchronous replication), or
                    # that the listener kept until the run's lease ended.
                    row = conn.execute(
                        "SELECT count(DISTINCT b.request_id),"
                        "       count(DISTINCT b.request_id) FILTER (WHERE b.answered < %s)"
                        " FROM chaos.requests b JOIN chaos.requests a ON a.request_id = b.request_id"
                        " WHERE b.arrived < %s AND b.decision IN ('ok', 'slow') AND a.arrived > %s",
                        (killed, killed, killed)).fetchone()
                    assert row is not None
                    again.append(row[0])
                    again_answered.append(row[1])
                at = time.strftime("%H:%M:%S", time.localtime(killed))
                figures[f"failover at {at}: primary killed to standby promoted (s)"] = (
                    f"{promoted - killed:.2f}")
            figures["failovers"] = str(len(self.cluster.failovers))
            figures["seconds to the first outcome on the new primary, per failover"] = ", ".join(
                f"{t:.2f}" for t in first_outcomes)
            figures["seconds from the kill to the first outcome on the new primary, per failover"] = (
                ", ".join(f"{t:.2f}" for t in from_kill))
            figures["slots called again after a failover although answered (same request id)"] = ", ".join(
                str(n) for n in again)
            figures["  of which answered before the kill (outcome not on the new primary)"] = ", ".join(
                str(n) for n in again_answered)
            self.first_outcomes = first_outcomes
        if isinstance(self.cluster, Formation):
            figures["pg_auto_failover: replication / monitor timing"] = (
                f"{'synchronous' if self.cluster.synchronous else 'asynchronous'} / "
                f"{'tuned' if self.cluster.tuned else 'default'}")
            rejoins = zip(self.cluster.failovers, self.cluster.rejoined, strict=False)
            figures["seconds from the kill to the old primary streaming as a standby, per failover"] = (
                ", ".join(f"{rejoined - killed:.2f}" for (killed, _), rejoined in rejoins))
            cron_figures, ha_failures = self.cluster.pg_cron_figures()
            figures.update(cron_figures)
        figures["faults that could not be injected"] = str(
            sum(1 for f in self.faults if f[0].endswith("_failed")))
        figures["listeners that exited on their own"] = str(len(self.crashed))
        finite = [t for t in resume if t != float("inf")]
        figures["longest resume after a database restart: dispatching or a listener back (s)"] = (
            "n/a" if not resume else ("never" if len(finite) < len(resume) else f"{max(finite):.2f}"))
        figures["dispatching resumed after each restart: first waiting run claimed (s)"] = (
            ", ".join(f"{t:.2f}" for t in dispatching) or "n/a")
        figures["each listener back after each restart: LISTEN again (s)"] = (
            ", ".join(f"{t:.2f}" for t in back) or "n/a")
        figures["each listener's own first claimed run after each restart (s, not judged)"] = (
            ", ".join(f"{t:.2f}" for t in own_claim) or "n/a")
        figures["samples of the capped projects' running runs"] = str(self.cap_samples)
        figures["wall time (s)"] = f"{wall_s:.0f}"

        failures = []

        def must_be(name: str, expected: str) -> None:
            if figures.get(name) != expected:
                failures.append(f"{name}: {figures.get(name)} (expected {expected})")

        must_be("slots marked", figures["slots expected"])
        must_be("slots missing or extra (gaps in a schedule's minutes)", "0")
        must_be("slots lost (unfinished, or finished with no invocation)", "0")
        must_be("runs given up with attempts left, or skipped", "0")
        must_be("runs whose status disagrees with the sink", "0")
        must_be("extra invocations with no kill, terminate or restart to explain them", "0")
        must_be("retried attempts whose recorded error disagrees with the sink", "0")
        if self.profile.synchronous:
            # With asynchronous replication a claim the old primary made and never sent is made
            # again on the new one with the same attempt number (counted, not judged).
            must_be("same attempt invoked twice", "0")
        must_be("slots invoked under more than one request id", "0")
        must_be("requests whose request id, slot or schedule is not their run's", "0")
        must_be("run audit rows", figures["finished runs"])
        must_be("finished runs without exactly one matching audit row", "0")
        must_be("schedules left stuck (next_run_at not one minute past the last slot, or a run open)", "0")
        must_be("listeners that exited on their own", "0")
        must_be("samples with a project above its max_concurrency", "0")
        for first in self.first_outcomes:
            if first > self.profile.resume_goal_s:
                failures.append(f"the first outcome on a new primary came {first:.2f} s after the promotion "
                                f"(goal {self.profile.resume_goal_s:g} s)")
        failures += ha_failures
        if (isinstance(self.cluster, HACluster | Formation)
                and len(self.cluster.failovers) < self.profile.failovers):
            failures.append("fewer failovers than planned")
        if not resume or len(finite) < len(resume):
            failures.append("a listener never resumed dispatching after a database restart")
        elif max(finite) > self.profile.resume_goal_s:
            failures.append(f"resume after a restart took {max(finite):.2f} s "
                            f"(goal {self.profile.resume_goal_s:g} s)")
        failures += stop_problems
        return Result(figures, failures, wall_s, resume)


def run_chaos(profile: Profile, *, folder: Path, seed: int, keep: bool = False) -> Result:
    """Run the chaos suite once; everything it starts is stopped before it returns."""
    started = time.monotonic()
    harness = Harness(profile, folder, seed)
    try:
        harness.setup()
        _log(f"cluster on port {harness.cluster.port}, sink on {harness.sink.port}, seed {seed}, "
             f"{profile.schedules} schedules and a tenant burst of {profile.burst} (capped at"
             f" {profile.burst_cap or 'none'}) x {profile.minutes + 1} minutes")
        harness.drive()
        problems = harness.stop_listeners()
        harness.sink.stop()
        return harness.verdict(problems, time.monotonic() - started)
    finally:
        harness.kill_everything()
        if not keep:
            harness.cluster.stop()


def analyze_only(profile: Profile, *, folder: Path) -> Result:
    """Compute the verdict of a finished run again from its kept database (e.g. after a change
    to chaos/analysis.sql)."""
    started = time.monotonic()
    harness = Harness(profile, folder, 0)
    harness.cluster.start()
    try:
        return harness.verdict([], time.monotonic() - started)
    finally:
        harness.cluster.stop()


def print_result(result: Result, out: Any = sys.stdout) -> None:
    width = max(len(name) for name in result.figures)
    print("CHAOS FIGURES", file=out)
    for name, value in result.figures.items():
        print(f"  {name.ljust(width)}  {value}", file=out)
    if result.ok:
        print("CHAOS OK: every invariant holds", file=out)
    else:
        print("CHAOS FAILED:", file=out)
        for failure in result.failures:
            print(f"  - {failure}", file=out)
    out.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--dir", type=Path, default=ROOT / ".pgdata" / "chaos",
                        help="folder of the harness's cluster and records (default .pgdata/chaos)")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    parser.add_argument("--analyze-only", action="store_true",
                        help="do not run: compute the verdict of the last run kept in --dir again")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    if args.analyze_only:
        result = analyze_only(PROFILES[args.profile], folder=args.dir.resolve())
        print_result(result)
        return 0 if result.ok else 1
    result = run_chaos(PROFILES[args.profile], folder=args.dir.resolve(), seed=seed, keep=args.keep)
    print(f"profile {args.profile}, seed {seed}")
    print_result(result)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
