"""Fixtures of the listener tests: a function sink, async sessions, in-process listeners."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import psycopg
import psycopg.conninfo
import pytest

from dispatcher.config import Settings
from dispatcher.listener import Listener

from .kit import Running, Sink
from .proxy import proxies

__all__ = ["adb", "dsn", "proxies", "start_listener"]


@pytest.fixture
def dsn(db: psycopg.Connection) -> str:
    return psycopg.conninfo.make_conninfo(**db.info.get_parameters())


@pytest.fixture
async def adb(dsn: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """An async autocommit session for polling while in-process listeners run."""
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    yield conn
    await conn.close()


@pytest.fixture
async def start_listener(dsn: str, sink: Sink) -> AsyncIterator[Callable[..., Awaitable[Running]]]:
    """Start an in-process listener (settings overridable) and wait until it is ready."""
    running: list[Running] = []

    async def _start(**overrides: Any) -> Running:
        settings = Settings(database_url=dsn, invoke_url=sink.template, worker_id=f"test-{len(running) + 1}",
                            sweep_interval_s=60)
        listener = Listener(replace(settings, **overrides))
        task = asyncio.create_task(listener.run())
        running.append(Running(listener, task))
        ready = asyncio.create_task(listener.ready.wait())
        await asyncio.wait({ready, task}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if task.done():
            task.result()
        assert listener.ready.is_set(), "listener not ready within 10 s"
        return running[-1]

    yield _start
    for item in running:
        if not item.task.done():
            item.listener.stop("test teardown")
            item.listener.stop("test teardown")
        with contextlib.suppress(Exception):
            await asyncio.wait_for(item.task, 30)
