"""Acceptance: `pgdispatch demo` starts everything, shows a dispatch, and stops cleanly on SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path

import psycopg

from .kit import PGDISPATCH, until

ROOT = Path(__file__).resolve().parents[2]
TEST_CLUSTER = Path(os.environ.get("PGDISPATCH_TEST_CLUSTER", ROOT / ".pgdata" / "test"))
DEMO_DIR = TEST_CLUSTER.parent / f"{TEST_CLUSTER.name}-demo"


async def _lines(stream: asyncio.StreamReader | None, into: list[str]) -> None:
    assert stream is not None
    async for line in stream:
        into.append(line.decode().rstrip("\n"))


async def test_demo_dispatches_and_stops_cleanly_on_sigint() -> None:
    proc = await asyncio.create_subprocess_exec(
        str(PGDISPATCH), "demo", "--dir", str(DEMO_DIR),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out: list[str] = []
    err: list[str] = []
    readers = [asyncio.create_task(_lines(proc.stdout, out)), asyncio.create_task(_lines(proc.stderr, err))]
    try:
        def database_line() -> str | None:
            assert proc.returncode is None, f"demo exited {proc.returncode}: {out} {err}"
            return next((line.split()[1] for line in out if line.startswith("  database ")), None)

        url = await until(database_line, within=60, what="the demo to start")
        await until(lambda: any(line.startswith("{") and '"listening"' in line for line in err),
                    what="the listener to listen")
        # Rather than wait for the next minute: mark the next slot of every schedule now.
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("SELECT dispatch.tick(now() + interval '1 minute')")

        def calls(function: str) -> list[str]:
            return [line for line in out if line.startswith("[function]") and f" demo/{function} " in line]

        await until(lambda: calls("send-report") and calls("always-fails"), what="the demo functions")
        assert "signature ok" in calls("send-report")[0]
        # always-fails is retried twice, at most 2 s then 4 s later, before it is recorded
        await until(lambda: sum('"run_finished"' in line for line in err) == 2, within=30,
                    what="both recorded")

        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await asyncio.gather(*readers)

    assert out[-1] == "pgdispatch demo: stopped, nothing left running"
    assert not (DEMO_DIR / "data" / "postmaster.pid").exists()
    with contextlib.suppress(psycopg.OperationalError), psycopg.connect(url, connect_timeout=2):
        raise AssertionError("the demo's PostgreSQL still accepts connections")
    logs = [json.loads(line) for line in err]
    finished = {entry["function_name"]: entry for entry in logs if entry["event"] == "run_finished"}
    assert finished["send-report"]["status"] == "ok"
    assert finished["always-fails"]["error"] == "demo_failure: this function fails on purpose"
    assert finished["always-fails"]["attempt"] == 3
    assert len(calls("always-fails")) == 3
    assert [entry["attempt"] for entry in logs if entry["event"] == "run_retry_scheduled"] == [1, 2]
    assert logs[-1]["event"] == "listener_stopped"
