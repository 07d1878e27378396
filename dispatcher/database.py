"""The listener's calls into the dispatch schema, over a psycopg_pool connection pool."""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from dispatcher.runs import Outcome, Run

__all__ = ["Database", "DatabaseUnavailable", "Recorded"]

_COMPLETE = "CALL dispatch.complete_run(%s, %s, %s, %s, %s, %s, %s)"
# How long a call waits for a pooled connection before the database counts as unavailable.
CONNECTION_WAIT_S = 5.0
# A pooled connection is checked (an empty query, one round trip) before use only when it has
# been idle for longer than this: a busy listener would otherwise pay a round trip per call. A
# connection that broke meanwhile fails its call, which the callers already retry.
CHECK_AFTER_IDLE_S = 1.0


def _int_array(values: Sequence[int | None]) -> str:
    """A PostgreSQL array literal, sent as one text parameter: psycopg's list adaptation checks
    every element in Python and cost more client CPU than the statement itself."""
    return "{" + ",".join("NULL" if value is None else str(int(value)) for value in values) + "}"


def _text_array(values: Sequence[str | None]) -> str:
    """See _int_array; every element is quoted, backslashes and double quotes escaped."""
    return "{" + ",".join(
        "NULL" if value is None else '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        for value in values
    ) + "}"


class Recorded(NamedTuple):
    """What dispatch.complete_runs answered for one outcome."""

    recorded: bool  # written: the run was still running with the attempt this listener claimed
    advanced: bool  # its schedule moved on to its next slot
    busy: bool  # not written because another transaction holds the run or its schedule: retry


class DatabaseUnavailable(Exception):
    """The database cannot be reached right now; the call may be retried later."""


class Database:
    """Claims, completions, releases and ticks. Every call is one statement in autocommit mode,
    and any connection-level failure surfaces as DatabaseUnavailable."""

    def __init__(self, conninfo: str, *, application_name: str, worker_id: str, lease_s: float,
                 pool_size: int) -> None:
        self._worker_id = worker_id
        self._lease_s = lease_s
        self._lease = timedelta(seconds=lease_s)
        self._last_used: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], float] = (
            weakref.WeakKeyDictionary())
        self.pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
            conninfo,
            kwargs={"autocommit": True, "application_name": application_name},
            min_size=pool_size,
            max_size=pool_size,
            open=False,
            check=self._check_connection,
            name="pgdispatch",
            reconnect_timeout=float("inf"),  # never give up: the listener waits for the database
        )

    async def _check_connection(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if time.monotonic() - self._last_used.get(conn, float("-inf")) > CHECK_AFTER_IDLE_S:
            await AsyncConnectionPool.check_connection(conn)

    async def open(self) -> None:
        """Start the pool without waiting for it: calls wait for connections as they come up."""
        await self.pool.open(wait=False)

    async def close(self) -> None:
        await self.pool.close()

    async def _fetch(self, query: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        try:
            async with self.pool.connection(timeout=CONNECTION_WAIT_S) as conn:
                cursor = conn.cursor(row_factory=dict_row)
                await cursor.execute(query, params)
                rows = await cursor.fetchall()
                self._last_used[conn] = time.monotonic()
                return rows
        except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as exc:
            raise DatabaseUnavailable(str(exc).strip() or type(exc).__name__) from exc

    async def claim(self, max_runs: int) -> list[Run]:
        """Claim up to max_runs pending runs for this worker."""
        # The lease counts from the server's clock at claim time; counting it from just before
        # the request makes the local deadline err on the early side.
        deadline = time.monotonic() + self._lease_s
        rows = await self._fetch(
            "SELECT * FROM dispatch.claim_runs(%s, %s, %s)", (self._worker_id, max_runs, self._lease)
        )
        return [Run.from_row(row, lease_deadline=deadline) for row in rows]

    def _complete_params(self, run: Run, outcome: Outcome) -> tuple[Any, ...]:
        return (run.run_id, self._worker_id, run.attempt, outcome.status, outcome.error, outcome.http_status,
                outcome.duration_ms)

    async def complete(self, run: Run, outcome: Outcome) -> Recorded:
        """Record an outcome. Not recorded when the run is no longer running with the attempt
        this listener claimed (its lease expired and the run was retried or lost, or an earlier
        call whose answer was lost recorded it already)."""
        rows = await self._fetch(_COMPLETE, self._complete_params(run, outcome))
        return Recorded(bool(rows[0]["recorded"]), bool(rows[0]["advanced"]), bool(rows[0]["busy"]))

    async def complete_many(self, items: list[tuple[Run, Outcome]]) -> list[Recorded]:
        """complete() for several runs with dispatch.complete_runs: one statement, one round trip,
        one transaction."""
        outcomes = [outcome for _, outcome in items]
        rows = await self._fetch(
            "SELECT run_id, recorded, advanced, busy FROM dispatch.complete_runs("
            "%s, %s::bigint[], %s::integer[], %s::text[], %s::text[], %s::integer[], %s::integer[])",
            (
                self._worker_id,
                _int_array([run.run_id for run, _ in items]),
                _int_array([run.attempt for run, _ in items]),
                _text_array([o.status for o in outcomes]),
                _text_array([o.error for o in outcomes]),
                _int_array([o.http_status for o in outcomes]),
                _int_array([o.duration_ms for o in outcomes]),
            ),
        )
        by_id = {row["run_id"]: Recorded(bool(row["recorded"]), bool(row["advanced"]), bool(row["busy"]))
                 for row in rows}
        return [by_id[run.run_id] for run, _ in items]

    async def release(self, runs: Sequence[Run]) -> int:
        """Hand claimed runs that were never invoked back to pending."""
        rows = await self._fetch(
            "SELECT dispatch.release_runs(%s, %s::bigint[], %s::integer[]) AS n",
            (self._worker_id, _int_array([run.run_id for run in runs]),
             _int_array([run.attempt for run in runs])),
        )
        return int(rows[0]["n"])

    async def tick(self) -> tuple[int, datetime]:
        """Mark due runs (and expire leases); returns how many runs were marked and the instant
        the tick marked up to (its now(): every slot at or before it is marked or still open)."""
        rows = await self._fetch("SELECT dispatch.tick() AS marked, now() AS covered")
        return int(rows[0]["marked"]), rows[0]["covered"]

    async def seconds_until_due(self, covered: datetime | None) -> float | None:
        """Seconds, by the database's clock, until the earliest next_run_at after `covered` (see
        tick; now when None); negative when a slot came due since. None when there is none."""
        rows = await self._fetch(
            "SELECT extract(epoch FROM dispatch.next_due_after(coalesce(%s, now()))"
            " - clock_timestamp())::float8 AS s",
            (covered,),
        )
        seconds = rows[0]["s"]
        return None if seconds is None else float(seconds)
