"""Listener test kit: a real HTTP function sink on 127.0.0.1, the real `pgdispatch` process, and
polling helpers that wait for a condition with a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiohttp import web
from multidict import CIMultiDict

from dispatcher.listener import Listener

PGDISPATCH = Path(sys.executable).parent / "pgdispatch"
YEARLY = "0 0 1 1 *"  # never comes due during a test: runs are marked with tick(now() + 1 year)

async def until(predicate: Callable[[], Any], *, within: float = 10.0, interval: float = 0.01,
                what: str = "condition") -> Any:
    """Poll `predicate` (sync or async) until it returns something truthy; fail after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within} s waiting for {what}")
        await asyncio.sleep(interval)


@dataclass
class Call:
    """One request the sink received."""

    project_id: str
    function_name: str
    headers: CIMultiDict[str]
    body: bytes
    arrived_wall: float
    arrived_mono: float

    @property
    def json(self) -> Any:
        return json.loads(self.body)


Handler = Callable[[web.Request, Call], Awaitable[web.StreamResponse]]


@dataclass
class Sink:
    """A function endpoint: records every call; `handlers[function_name]` decides the answer
    (default 200 {"ok": true})."""

    url: str = ""
    calls: list[Call] = field(default_factory=list)
    handlers: dict[str, Handler] = field(default_factory=dict)

    @property
    def template(self) -> str:
        return self.url + "/projects/{project_id}/functions/{function_name}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        call = Call(request.match_info["project_id"], request.match_info["function_name"],
                    request.headers.copy(), await request.read(), time.time(), time.monotonic())
        self.calls.append(call)
        handler = self.handlers.get(call.function_name)
        if handler is not None:
            return await handler(request, call)
        return web.json_response({"ok": True})

    def by_request_id(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for call in self.calls:
            counts[call.headers["X-Request-Id"]] = counts.get(call.headers["X-Request-Id"], 0) + 1
        return counts


async def scalar(conn: psycopg.AsyncConnection[Any], query: str, params: tuple[Any, ...] = ()) -> Any:
    cursor = await conn.execute(query, params)
    row = await cursor.fetchone()
    return None if row is None else row[0]


def add_schedules(db: psycopg.Connection, n: int, *, function_name: str = "fn", project_id: str = "acme",
                  cron: str = YEARLY) -> None:
    db.execute(
        "INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, args)"
        " SELECT %s, %s, %s, jsonb_build_object('i', i) FROM generate_series(1, %s) i",
        (project_id, function_name, cron, n),
    )


def due_in_a_second(db: psycopg.Connection) -> None:
    """Put every schedule's next slot 1 s ahead, as a definition change would, and tell the
    listeners' clocks (NOTIFY dispatch 'schedules'): they tick it at its instant."""
    with db.transaction():
        db.execute("UPDATE dispatch.schedules"
                   " SET next_run_at = date_trunc('milliseconds', now()) + interval '1 s'")
        db.execute("SELECT pg_notify('dispatch', 'schedules')")


def mark_all_due(db: psycopg.Connection) -> int:
    """Mark every schedule's next slot as a pending run (tick with the horizon a year ahead)."""
    row = db.execute("SELECT dispatch.tick(now() + interval '1 year')").fetchone()
    assert row is not None
    return int(row[0])


@dataclass
class Running:
    listener: Listener
    task: asyncio.Task[None]

    async def stop(self, within: float = 30.0) -> None:
        self.listener.stop("test")
        await asyncio.wait_for(asyncio.shield(self.task), within)


class ListenerProcess:
    """The real `pgdispatch listen`, its JSON log lines collected from stderr."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.logs: list[dict[str, Any]] = []
        self.raw: list[str] = []
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, *args: str, env: dict[str, str] | None = None) -> ListenerProcess:
        proc = await asyncio.create_subprocess_exec(
            str(PGDISPATCH), "listen", *args,
            env={**os.environ, **(env or {})},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        return cls(proc)

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        async for line in self.proc.stderr:
            text = line.decode()
            self.raw.append(text)
            with contextlib.suppress(ValueError):
                self.logs.append(json.loads(text))

    def events(self, name: str) -> list[dict[str, Any]]:
        return [entry for entry in self.logs if entry.get("event") == name]

    async def wait_event(self, name: str, within: float = 10.0) -> dict[str, Any]:
        found = await until(lambda: self.events(name) or self.proc.returncode is not None,
                            within=within, what=f"log event {name}")
        assert isinstance(found, list), f"exited ({self.proc.returncode}) before {name}: {self.raw}"
        return found[0]

    def signal(self, signum: signal.Signals) -> None:
        self.proc.send_signal(signum)

    async def wait(self, within: float = 30.0) -> int:
        code = await asyncio.wait_for(self.proc.wait(), within)
        await self._reader
        return code

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        await self._reader


@pytest.fixture
async def sink() -> AsyncIterator[Sink]:
    """A function endpoint on loopback recording every call."""
    sink = Sink()
    app = web.Application()
    app.router.add_post("/projects/{project_id}/functions/{function_name}", sink.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
    await site.start()
    sink.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield sink
    await runner.cleanup()
