"""A pg_auto_failover formation on this machine, for the failover drills: a monitor, a primary and
a standby, each a ``pg_autoctl run`` process of its own (its own process group: killing the group
is a host's death), pg_cron on both data nodes.

    formation = Formation(folder, synchronous=True)
    formation.start()           # monitor, node1 (primary), node2 (standby), all reporting
    formation.url("app")        # both hosts, target_session_attrs=read-write
    formation.failover()        # kill -9 the primary's host, wait for the monitor's promotion,
                                # bring the old primary back as a standby
    formation.stop()

Everything lives in ``folder``: the three data directories, pg_autoctl's configuration and state
(XDG_CONFIG_HOME, XDG_DATA_HOME), the sockets (PGHOST) and the logs, so the formation touches
nothing of the machine's and two can run side by side. As root every command runs as the
``postgres`` user (pg_autoctl and PostgreSQL refuse root), as anyone else as that user, like
scripts/pg-cluster. Needs the Debian packages ``postgresql-NN-auto-failover`` (the monitor's
extension) and ``pg-auto-failover-cli`` (``pg_autoctl``): ``scripts/bootstrap --failover``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

__all__ = ["KEEPER_TUNED", "MONITOR_TUNED", "Formation", "as_owner", "free_port"]

ROOT = Path(__file__).resolve().parent.parent
_BINDIR = subprocess.run([str(ROOT / "scripts" / "pg-cluster"), "bindir"], check=True, capture_output=True,
                         text=True).stdout.strip()
PGBIN = Path(os.environ.get("PGBIN") or _BINDIR)

# The monitor's health checks, tuned (docs/deployment.md, "The timing, and what
# to tune"). With the defaults the monitor gives up on a silent primary after 20 s
# (node_considered_unhealthy_timeout) and then waits primary_demote_timeout (30 s) for it to
# demote itself before the standby may take writes: 51 s from a host's death to the first
# outcome. These make it 5 s + 10 s. What they trade away: a primary whose keeper misses 5 s of
# reports (a stall, a network blip) is failed over, and it must stop taking writes on its own
# within the demote timeout, so the keepers' network_partition_timeout (KEEPER_TUNED) comes down
# with it and a partitioned primary demotes itself after 5 s instead of 20 s.
MONITOR_TUNED = {
    "pgautofailover.health_check_period": "1000",  # ms between checks (5000)
    "pgautofailover.health_check_timeout": "1000",  # ms to connect (5000)
    "pgautofailover.health_check_max_retries": "1",  # (2)
    "pgautofailover.health_check_retry_delay": "500",  # ms (2000)
    "pgautofailover.node_considered_unhealthy_timeout": "5000",  # ms without a keeper report (20000)
    "pgautofailover.primary_demote_timeout": "10000",  # ms the standby stays read-only (30000)
}
# Must stay below primary_demote_timeout: a primary cut off from the monitor and its standby
# demotes itself after this long, before the monitor lets the standby take writes.
KEEPER_TUNED = {"timeout.network_partition_timeout": "5"}  # s (20)

# What every data node runs besides pg_autoctl's own settings. pg_autoctl writes its settings to
# postgresql-auto-failover.conf, included at the top of postgresql.conf, so these, later in the
# file, win; the standby gets them with its base backup.
NODE_CONF = """
# pgdispatch failover drill (chaos/formation.py)
unix_socket_directories = '{sockets}'
# pg_autoctl preloads pg_stat_statements; pg_cron on every node, its jobs in cron.database_name.
shared_preload_libraries = 'pg_stat_statements,pg_cron'
cron.database_name = 'postgres'
# The job row stores the port of the node it was scheduled on (cron.job.nodeport): two nodes on
# one host differ by port, so a libpq-run job on the new primary would connect to the dead one.
# In background workers pg_cron runs jobs inside the server, wherever the job was scheduled.
cron.use_background_workers = on
max_worker_processes = 32
max_connections = 200
# pg_autoctl sizes shared_buffers to a quarter of the machine's memory, per node.
shared_buffers = '128MB'
effective_cache_size = '1GB'
maintenance_work_mem = '64MB'
# As the test cluster: a kill -9 keeps the page cache, only the machine's crash would not.
# full_page_writes stays on: pg_rewind needs it to make the old primary a standby (without it
# pg_autoctl falls back to a whole new base backup).
fsync = off
# The standby's base backup starts with a checkpoint: let it finish at once.
checkpoint_completion_target = 0.01
"""

_CRON_SCHEDULER_STARTED = re.compile(r"^(\S+ \S+) UTC .*LOG:  pg_cron scheduler started")
_CRON_STARTING = re.compile(r"^(\S+ \S+) UTC .*cron job \d+ starting: SELECT dispatch\.tick\(\)")
_CRON_LAUNCHER_ERROR = re.compile(r"^(\S+ \S+) UTC .*ERROR:  cannot execute UPDATE in a read-only")


def as_owner(*cmd: str) -> list[str]:
    """PostgreSQL and pg_autoctl refuse to run as root: as root, run `cmd` as `postgres`."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else list(cmd)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _until(what: str, check: Callable[[], bool], timeout_s: float, every_s: float = 0.1) -> float:
    """Poll `check` until it holds; the time it did (Unix seconds). RuntimeError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(psycopg.Error):
            if check():
                return time.time()
        if time.monotonic() > deadline:
            raise RuntimeError(f"pg_auto_failover formation: {what} within {timeout_s:g} s")
        time.sleep(every_s)


class Formation:
    """A pg_auto_failover monitor, a primary and a standby (module docstring). Same interface as
    chaos.run.HACluster: `start`, `stop`, `url`, `psql`, `failover`, `port` (the primary's),
    `failovers` [(killed, promoted)]."""

    NAMES = ("node1", "node2")

    def __init__(self, folder: Path, *, synchronous: bool = True, tuned: bool = True) -> None:
        self.folder = folder
        self.synchronous = synchronous
        self.tuned = tuned
        self.monitor_port = free_port()
        self.ports = [free_port(), free_port()]
        self.primary = 0
        self.port = self.ports[0]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.failovers: list[tuple[float, float]] = []  # (host killed, new primary writable)
        self.rejoined: list[float] = []  # when the old primary was streaming as a standby again

    # -- commands ----------------------------------------------------------------------------

    def _env(self) -> list[str]:
        return ["env", f"XDG_CONFIG_HOME={self.folder / 'config'}", f"XDG_DATA_HOME={self.folder / 'share'}",
                f"XDG_RUNTIME_DIR={self.folder / 'run'}", f"PGHOST={self.folder}",
                f"PATH={PGBIN}:/usr/bin:/bin"]

    def _autoctl(self, *args: str) -> None:
        cmd = as_owner(*self._env(), "pg_autoctl", *args)
        done = subprocess.run(cmd, cwd=self.folder, capture_output=True, text=True, timeout=180, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed ({done.returncode}):\n{done.stderr[-3000:]}")

    def _run(self, name: str) -> None:
        """`pg_autoctl run` for one node, in a process group of its own: its keeper and its
        PostgreSQL are one 'host' that failover() kills at once."""
        with (self.folder / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(
                as_owner(*self._env(), "pg_autoctl", "run", "--pgdata", str(self.folder / name)),
                cwd=self.folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _initdb(self, name: str, conf: str) -> None:
        subprocess.run(as_owner(str(PGBIN / "initdb"), "-D", str(self.folder / name), "-U", "postgres",
                                "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8"),
                       check=True, capture_output=True)
        with (self.folder / name / "postgresql.conf").open("a") as out:
            out.write(conf)

    def _direct(self, i: int, dbname: str = "postgres", **params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"connect_timeout": "2", **params}.items())
        return f"postgresql://postgres@127.0.0.1:{self.ports[i]}/{dbname}?{query}"

    def monitor(self) -> psycopg.Connection[Any]:
        return psycopg.connect(host="127.0.0.1", port=self.monitor_port, user="postgres",
                               dbname="pg_auto_failover", autocommit=True, connect_timeout=2)

    def _monitor_up(self) -> bool:
        with self.monitor():
            return True

    def states(self) -> dict[str, tuple[str, str]]:
        """{node name: (reported state, goal state)} as the monitor sees them."""
        with self.monitor() as conn:
            rows = conn.execute("SELECT nodename, reportedstate::text, goalstate::text"
                                " FROM pgautofailover.node").fetchall()
        return {name: (reported, goal) for name, reported, goal in rows}

    def _settled(self, primary: int) -> bool:
        states = self.states()
        return (states.get(self.NAMES[primary]) == ("primary", "primary")
                and states.get(self.NAMES[1 - primary]) == ("secondary", "secondary"))

    def _writable(self, i: int) -> bool:
        with psycopg.connect(self._direct(i, target_session_attrs="read-write", connect_timeout="1")):
            return True

    # -- life cycle --------------------------------------------------------------------------

    def start(self) -> None:
        # A run that was killed leaves its formation running: stop it before its folder goes.
        for name in ("monitor", *self.NAMES):
            if (self.folder / name / "postmaster.pid").exists():
                with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                    self._autoctl("stop", "--immediate", "--pgdata", str(self.folder / name))
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
            if subprocess.run(as_owner("test", "-w", str(self.folder)), check=False).returncode != 0:
                raise RuntimeError(f"the postgres user cannot write {self.folder} (a parent folder is closed "
                                   "to it); choose a folder it can reach")
        if shutil.which("pg_autoctl") is None:
            raise RuntimeError("pg_autoctl is not installed: run scripts/bootstrap --failover")
        sockets = f"unix_socket_directories = '{self.folder}'\n"
        # The monitor. Its own data directory made first, so that its socket is in the folder:
        # pg_autoctl would start it on the system's socket directory, which only root may use.
        self._initdb("monitor", sockets + "shared_buffers = '32MB'\n")
        self._autoctl("create", "monitor", "--pgdata", str(self.folder / "monitor"), "--pgport",
                      str(self.monitor_port), "--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl",
                      "--pgctl", str(PGBIN / "pg_ctl"))
        if self.tuned:
            with (self.folder / "monitor" / "postgresql.conf").open("a") as out:
                out.writelines(f"{name} = {value}\n" for name, value in MONITOR_TUNED.items())
        self._run("monitor")
        _until("the monitor did not start", self._monitor_up, 60)
        monitor_url = f"postgres://autoctl_node@127.0.0.1:{self.monitor_port}/pg_auto_failover?sslmode=disable"
        for i, name in enumerate(self.NAMES):
            if i == 0:
                self._initdb(name, NODE_CONF.format(sockets=self.folder))
            # The second node's create takes a base backup of the first (its postgresql.conf too).
            # replication-quorum false: the primary's commits do not wait for this standby.
            self._autoctl("create", "postgres", "--pgdata", str(self.folder / name), "--pgport",
                          str(self.ports[i]), "--hostname", "127.0.0.1", "--listen", "127.0.0.1",
                          "--name", name, "--auth", "trust", "--no-ssl", "--pgctl", str(PGBIN / "pg_ctl"),
                          "--monitor", monitor_url,
                          "--replication-quorum", "true" if self.synchronous else "false")
            if self.tuned:
                for key, value in KEEPER_TUNED.items():
                    self._autoctl("config", "set", "--pgdata", str(self.folder / name), key, value)
            self._run(name)
            if i == 0:
                _until("node1 did not become a writable single node", lambda: self._writable(0), 60)
                with psycopg.connect(self._direct(0), autocommit=True) as conn:
                    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_cron")
        _until("the formation did not settle (node1 primary, node2 secondary)", lambda: self._settled(0), 120)
        with psycopg.connect(self._direct(0), autocommit=True) as conn:
            names = conn.execute("SHOW synchronous_standby_names").fetchone()
        if bool(names and names[0]) != self.synchronous:
            raise RuntimeError(f"synchronous_standby_names is {names!r} on a formation that should "
                               f"{'' if self.synchronous else 'not '}replicate synchronously")

    def _kill(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop(self) -> None:
        for name, proc in list(self.procs.items()):
            # An immediate stop: the formation is thrown away, but its servers release their
            # shared memory and sockets.
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self._autoctl("stop", "--immediate", "--pgdata", str(self.folder / name))
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                self._kill(name)
        self.procs.clear()

    def failover(self) -> tuple[float, float]:
        """The primary's host dies (kill -9 of its keeper, its PostgreSQL and every backend);
        the monitor promotes the standby on its own; then the old primary's host comes back and
        its keeper makes it a standby of the new primary (pg_rewind when it must). Returns (host
        killed, new primary writable), Unix seconds."""
        old, new = self.primary, 1 - self.primary
        killed = time.time()
        self._kill(self.NAMES[old])
        promoted = _until("the standby was not promoted", lambda: self._writable(new), 180, every_s=0.05)
        self.primary, self.port = new, self.ports[new]
        self.failovers.append((killed, promoted))
        self._run(self.NAMES[old])
        self.rejoined.append(_until("the old primary did not rejoin as a standby",
                                    lambda: self._settled(new), 180))
        return killed, promoted

    def restart(self, mode: str) -> None:
        raise NotImplementedError("the failover drill restarts nothing: it fails over")

    def url(self, dbname: str = "chaos") -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"postgresql://postgres@{hosts}/{dbname}?target_session_attrs=read-write"

    def psql(self, *args: str) -> None:
        subprocess.run([str(PGBIN / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", self.url("chaos"),
                        *args], check=True, capture_output=True, text=True)

    # -- pg_cron -----------------------------------------------------------------------------

    def register_pg_cron(self, dbname: str) -> str:
        """Register dispatch-tick for `dbname` in pg_cron's database (postgres), on the primary:
        the job row replicates, so every node has it and whichever is the primary runs it."""
        done = subprocess.run([str(PGBIN / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v",
                               f"dispatch_db={dbname}", "-d", self.url("postgres"), "-f",
                               str(ROOT / "sql" / "pg_cron.sql")], check=True, capture_output=True, text=True)
        return done.stdout + done.stderr

    def _log_times(self, name: str, pattern: re.Pattern[str]) -> list[float]:
        """Unix seconds of the server log lines of node `name` that match `pattern`. The log
        folder is in the data directory, so a base backup or pg_rewind copies the other node's
        files into it: only what is logged after the node took its role is its own."""
        found = []
        for path in sorted((self.folder / name / "log").glob("*.log")):
            with path.open(errors="replace") as log:
                for line in log:
                    match = pattern.match(line)
                    if match:
                        found.append(datetime.fromisoformat(match.group(1) + "+00:00").timestamp())
        return found

    def pg_cron_figures(self, *, wait_s: float = 75) -> tuple[dict[str, str], list[str]]:
        """After a failover: dispatch-tick ran once a minute on the new primary, from the first
        minute after it took writes (waits up to `wait_s` for its first tick), and never on the
        node that is a standby now, since it rejoined. Also how many ERRORs the new primary's
        pg_cron launcher logged while it was read-only (harmless: it restarts each second until
        writes are allowed). Figures, and failures."""
        killed, promoted = self.failovers[-1]
        primary, standby = self.NAMES[self.primary], self.NAMES[1 - self.primary]
        url = self._direct(self.primary)

        # pg_cron's scheduler starts within a second of the node taking writes (its launcher is
        # restarted each second until then): from the first minute after that, exactly one tick.
        started = [t for t in self._log_times(primary, _CRON_SCHEDULER_STARTED) if t > killed]
        first_minute = (int(min(started, default=promoted + 1)) // 60 + 1) * 60

        def ticks() -> dict[int, tuple[int, int, int]]:
            """{minute (Unix seconds): (dispatch-tick runs, succeeded, still running)}."""
            with psycopg.connect(url, autocommit=True) as conn:
                rows = conn.execute(
                    "SELECT extract(epoch FROM date_trunc('minute', d.start_time))::bigint, count(*),"
                    "       count(*) FILTER (WHERE d.status = 'succeeded'),"
                    "       count(*) FILTER (WHERE d.status IN ('starting', 'running'))"
                    " FROM cron.job_run_details d JOIN cron.job j ON j.jobid = d.jobid"
                    " WHERE j.jobname = 'dispatch-tick' AND d.start_time > to_timestamp(%s)"
                    " GROUP BY 1", (promoted,)).fetchall()
            return {minute: (count, ok, running) for minute, count, ok, running in rows}

        def settled() -> bool:
            found = ticks()
            return any(m >= first_minute for m in found) and not any(r for _, _, r in found.values())

        _until("no dispatch-tick finished on the new primary", settled, wait_s, every_s=0.5)
        per_minute = ticks()
        # Every minute from the first to the last one seen, and the current one too once its
        # tick should have finished.
        now = time.time()
        last = max(max(per_minute), int(now - 5) // 60 * 60)
        minutes = range(first_minute, last + 1, 60)
        failures = [f"dispatch-tick ran {per_minute.get(m, (0, 0, 0))[0]} times "
                    f"({per_minute.get(m, (0, 0, 0))[1]} succeeded) on the new primary in the minute "
                    f"{time.strftime('%H:%M', time.gmtime(m))}"
                    for m in minutes if per_minute.get(m, (0, 0, 0))[:2] != (1, 1)]
        failures += [f"dispatch-tick ran {count} times in the minute {time.strftime('%H:%M', time.gmtime(m))}"
                     for m, (count, _, _) in per_minute.items() if count > 1 and m not in minutes]
        on_primary = [t for t in self._log_times(primary, _CRON_STARTING) if t > promoted]
        on_standby = [t for t in self._log_times(standby, _CRON_STARTING) if t > self.rejoined[-1]]
        if not on_primary:
            failures.append("the new primary's log shows no dispatch-tick starting (cron.log_statement)")
        if on_standby:
            failures.append(f"the standby's pg_cron started dispatch-tick {len(on_standby)} times")
        errors = [t for t in self._log_times(primary, _CRON_LAUNCHER_ERROR) if killed <= t <= promoted + 1]
        figures = {
            "pg_cron: its scheduler started on the new primary, seconds after writes":
                f"{min(started) - promoted:.2f}" if started else "not logged",
            "pg_cron: minutes judged on the new primary / with exactly one successful dispatch-tick":
                f"{len(minutes)} / {sum(1 for m in minutes if per_minute.get(m, (0, 0, 0))[:2] == (1, 1))}",
            "pg_cron: dispatch-tick started on the new primary (its log) / on the standby since it rejoined":
                f"{len(on_primary)} / {len(on_standby)}",
            "pg_cron: launcher ERRORs on the new primary while it was read-only (harmless)": str(len(errors)),
        }
        return figures, failures
