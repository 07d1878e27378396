"""Acceptance: `pgdispatch demo` as a newcomer runs it. A first call within seconds of the command,
retries as it says, logs as it says, its database and port kept across starts, one demo per
folder, and nothing left running after Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import pty
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import psycopg

from tests.conftest import CLUSTER_DIR, ROOT

from .kit import PGDISPATCH, until

DEMO_DIR = CLUSTER_DIR.parent / f"{CLUSTER_DIR.name}-demo"
PG_CLUSTER = ROOT / "scripts" / "pg-cluster"
FIRST_CALL_WITHIN_S = 15.0  # from the command, on a fresh folder (initdb included) or a restart


def _read_tty(fd: int, into: list[str]) -> None:
    """Lines written to a pseudo-terminal, until its other side is closed (EIO)."""
    pending = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        into.extend(line.decode().rstrip("\r") for line in lines)


async def _lines(stream: asyncio.StreamReader | None, into: list[str], at: list[float] | None = None) -> None:
    assert stream is not None
    async for line in stream:
        into.append(line.decode().rstrip("\n"))
        if at is not None:
            at.append(time.monotonic())


@dataclass
class Demo:
    """A running `pgdispatch demo`: what it printed (stdout, with when each line came) and logged."""

    proc: asyncio.subprocess.Process
    started: float  # time.monotonic() just before the process started
    out: list[str] = field(default_factory=list)
    out_at: list[float] = field(default_factory=list)
    err: list[str] = field(default_factory=list)
    readers: list[asyncio.Future[None]] = field(default_factory=list)

    def alive(self) -> bool:
        assert self.proc.returncode is None, f"demo exited {self.proc.returncode}: {self.out} {self.err}"
        return True

    def line(self, prefix: str) -> str | None:
        return next((line for line in self.out if line.startswith(prefix)), None)

    async def database_url(self) -> str:
        line = await until(lambda: self.alive() and self.line("  database "), within=60,
                           what="the demo to start")
        return str(line.split()[1])

    async def listening(self) -> None:
        await until(lambda: self.alive() and any('"listening"' in line or " listening: " in line
                                                 for line in self.err),
                    what="the listener to listen")

    def calls(self, function: str | None = None) -> list[tuple[float, str]]:
        return [(at, line) for at, line in zip(self.out_at, self.out, strict=False)
                if line.startswith("[function]") and (function is None or f" demo/{function} " in line)]

    async def first_call(self) -> float:
        """Seconds from the command to the function's first call."""
        await until(lambda: self.alive() and self.calls(), within=FIRST_CALL_WITHIN_S + 15,
                    what="the first call")
        return self.calls()[0][0] - self.started

    async def interrupt(self) -> int:
        """Ctrl-C; the exit status."""
        self.proc.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(self.proc.wait(), 60)
        await asyncio.gather(*self.readers)
        return code


@contextlib.asynccontextmanager
async def demo(*, stderr_tty: bool = False) -> AsyncIterator[Demo]:
    """Start `pgdispatch demo --dir DEMO_DIR`; stdout is a pipe, stderr a pipe or a terminal.
    A demo still running at the end is killed, and its cluster stopped."""
    master = slave = -1
    if stderr_tty:
        master, slave = pty.openpty()
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        str(PGDISPATCH), "demo", "--dir", str(DEMO_DIR),
        stdout=asyncio.subprocess.PIPE, stderr=slave if stderr_tty else asyncio.subprocess.PIPE,
    )
    running = Demo(proc, started)
    running.readers.append(asyncio.ensure_future(_lines(proc.stdout, running.out, running.out_at)))
    if stderr_tty:
        os.close(slave)
        running.readers.append(asyncio.ensure_future(asyncio.to_thread(_read_tty, master, running.err)))
    else:
        running.readers.append(asyncio.ensure_future(_lines(proc.stderr, running.err)))
    try:
        yield running
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
            await asyncio.to_thread(_stop_cluster)
        await asyncio.gather(*running.readers)
        if stderr_tty:
            os.close(master)


def _stop_cluster() -> None:
    subprocess.run([str(PG_CLUSTER), "stop", str(DEMO_DIR)], check=False, capture_output=True)


def _fresh_folder() -> None:
    _stop_cluster()
    shutil.rmtree(DEMO_DIR, ignore_errors=True)


def _three_attempts(calls: list[tuple[float, str]]) -> tuple[int, list[datetime]] | None:
    """A run, and when the function saw its attempts 1, 2 and 3 (it prints HH:MM:SS.mmm UTC)."""
    runs: dict[str, dict[str, datetime]] = {}
    for _, line in calls:
        match = re.match(r"\[function\] (\S+) \S+ run (\d+) attempt (\d+) ", line)
        assert match, line
        runs.setdefault(match.group(2), {})[match.group(3)] = datetime.strptime(match.group(1), "%H:%M:%S.%f")
    for run_id, seen in runs.items():
        if len(seen) == 3:
            return int(run_id), [seen["1"], seen["2"], seen["3"]]
    return None


async def test_first_call_within_seconds_of_a_fresh_start_retries_as_said_and_stops_cleanly() -> None:
    _fresh_folder()
    async with demo() as running:
        url = await running.database_url()
        first_call = await running.first_call()
        assert first_call <= FIRST_CALL_WITHIN_S, (first_call, running.out)
        assert "signature ok" in running.calls()[0][1]
        await running.listening()
        logs_line = running.line("  logs ")
        assert logs_line is not None and "as JSON lines" in logs_line, running.out  # stderr is a pipe here

        # always-fails runs every minute: rather than wait for it, run it now (a manual run is
        # retried as a scheduled one is). Refused only while a run of its own is open: then that
        # one shows its attempts.
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            with contextlib.suppress(psycopg.errors.ObjectNotInPrerequisiteState):
                await conn.execute("SELECT dispatch.run_now(id) FROM dispatch.schedules"
                                   " WHERE project_id = 'demo' AND function_name = 'always-fails'")
        run_id, attempts = await until(lambda: _three_attempts(running.calls("always-fails")), within=30,
                                       what="the three attempts of a run of always-fails")
        await until(lambda: any('"run_finished"' in line and f'"run_id": {run_id},' in line
                                for line in running.err), what="the run recorded")
        assert await running.interrupt() == 0

    said = running.line("  schedule   demo/always-fails ")
    assert said is not None, running.out
    bounds = re.search(r"a retry after a random back-off of up to (\d+) s, then another after up to (\d+) s,"
                       r" then recorded as error", said)
    assert bounds is not None, said
    logs = [json.loads(line) for line in running.err]
    # The back-offs are what it said: from when each failure was recorded to the retry.
    retries = [entry for entry in logs
               if entry["event"] == "run_retry_scheduled" and entry["run_id"] == run_id]
    assert [entry["attempt"] for entry in retries] == [1, 2], retries
    for entry, bound in zip(retries, (bounds.group(1), bounds.group(2)), strict=True):
        back_off = datetime.fromisoformat(entry["retry_at"]) - datetime.fromisoformat(entry["ts"])
        assert back_off <= timedelta(seconds=int(bound)), (entry, said)
    # and the function saw them so, give or take the time a failure takes to be recorded and a
    # retry to be claimed on a busy machine
    gaps = [later - earlier for earlier, later in itertools.pairwise(attempts)]
    assert gaps[0] <= timedelta(seconds=int(bounds.group(1)) + 3), (gaps, said)
    assert gaps[1] <= timedelta(seconds=int(bounds.group(2)) + 3), (gaps, said)

    assert running.out[-1] == "pgdispatch demo: stopped, nothing left running"
    assert not (DEMO_DIR / "data" / "postmaster.pid").exists()
    with contextlib.suppress(psycopg.OperationalError), psycopg.connect(url, connect_timeout=2):
        raise AssertionError("the demo's PostgreSQL still accepts connections")
    finished = {entry["run_id"]: entry for entry in logs if entry["event"] == "run_finished"}
    assert any(entry["function_name"] == "ping" and entry["status"] == "ok" for entry in finished.values())
    assert finished[run_id]["error"] == "demo_failure: this function fails on purpose"
    assert finished[run_id]["attempt"] == 3
    assert logs[-1]["event"] == "listener_stopped", logs[-3:]


async def test_a_restart_keeps_the_database_its_schedules_and_the_port() -> None:
    function = f"added-{uuid.uuid4().hex[:8]}"
    async with demo() as running:
        url = await running.database_url()
        await running.listening()
        # As the README says: from the command line, against the demo's database.
        added = await asyncio.create_subprocess_exec(
            str(PGDISPATCH), "schedules", "add", "--project", "acme", "--function", function,
            "--cron", "0 9 * * MON", "--timezone", "Europe/Berlin",
            env={**os.environ, "PGDISPATCH_DATABASE_URL": url},
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        _, added_err = await added.communicate()
        assert added.returncode == 0, added_err
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT id FROM dispatch.schedules WHERE function_name = %s",
                               (function,)).fetchone()
            assert row is not None
            schedule_id = row[0]
            last_run = conn.execute("SELECT coalesce(max(id), 0) FROM dispatch.runs").fetchone()
        assert await running.interrupt() == 0

    async with demo() as again:
        assert await again.database_url() == url  # the same port, the same database
        first_call = await again.first_call()
        assert first_call <= FIRST_CALL_WITHIN_S, (first_call, again.out)
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT id FROM dispatch.schedules"
                                " WHERE function_name = %s AND deleted_at IS NULL",
                                (function,)).fetchall() == [(schedule_id,)]
            # the demo's own schedules are not added twice, and the runs so far are still there
            assert conn.execute("SELECT function_name FROM dispatch.schedules WHERE project_id = 'demo'"
                                " GROUP BY 1 HAVING count(*) > 1").fetchall() == []
            assert last_run is not None
            assert conn.execute("SELECT count(*) FROM dispatch.runs WHERE id <= %s",
                                (last_run[0],)).fetchone() == (last_run[0],)
        assert "(kept from the last start" in (again.line("  database ") or ""), again.out
        assert await again.interrupt() == 0


async def test_a_second_demo_in_the_same_folder_is_refused_and_the_first_goes_on() -> None:
    async with demo() as first:
        url = await first.database_url()
        await first.listening()
        second = await asyncio.create_subprocess_exec(
            str(PGDISPATCH), "demo", "--dir", str(DEMO_DIR),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(second.communicate(), 30)
        finally:
            if second.returncode is None:
                second.kill()
                await second.wait()
        assert second.returncode == 1, (out, err)
        assert err.decode() == (f"pgdispatch demo: a demo is already running in {DEMO_DIR}"
                                f" (pid {first.proc.pid}); it is left alone. Stop it with Ctrl-C where it"
                                " runs, or give this one another folder: --dir DIR\n")
        assert out == b""

        # The first still serves: a run of its own, asked for now, reaches the function.
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT dispatch.run_now(id) FROM dispatch.schedules"
                               " WHERE project_id = 'demo' AND function_name = 'weekly-digest'").fetchone()
        assert row is not None
        await until(lambda: first.alive() and any(f" run {row[0]} attempt 1 " in line
                                                  for _, line in first.calls("weekly-digest")),
                    what="the first demo to call the function")
        assert await first.interrupt() == 0
    assert not any("Traceback" in line for line in first.err), first.err
    assert first.out[-1] == "pgdispatch demo: stopped, nothing left running"


async def test_on_a_terminal_it_says_the_listener_logs_text_and_it_does() -> None:
    async with demo(stderr_tty=True) as running:
        await running.database_url()
        await running.listening()
        assert await running.interrupt() == 0
    logs_line = running.line("  logs ")
    assert logs_line is not None and "as text" in logs_line, running.out
    assert not any(line.startswith("{") for line in running.err), running.err
    assert any(re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} info +listener_started: ", line)
               for line in running.err), running.err
