"""Recording outcomes: the one place where the listener writes what its invocations did.

An outcome that cannot be written (the database is away) is kept in memory and retried until
the run's lease would have expired; after that the run belongs to whoever claims it next, so
the outcome is dropped. A run is never invoked again to make up for a lost write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import psycopg

from dispatcher.backoff import Backoff
from dispatcher.database import Database, DatabaseUnavailable
from dispatcher.runs import Outcome, Run

__all__ = ["Completer"]

logger = logging.getLogger(__name__)


def _fields(run: Run, outcome: Outcome) -> dict[str, object]:
    return {
        "run_id": run.run_id,
        "schedule_id": run.schedule_id,
        "request_id": run.request_id,
        "project_id": run.project_id,
        "function_name": run.function_name,
        "attempt": run.attempt,
        "status": outcome.status,
        "http_status": outcome.http_status,
        "duration_ms": outcome.duration_ms,
        "error": outcome.error,
    }


class Completer:
    """Writes outcomes with dispatch.complete_run; keeps and retries the ones that fail to write."""

    def __init__(self, db: Database, *, on_advanced: Callable[[], None] = lambda: None) -> None:
        self._db = db
        self._on_advanced = on_advanced
        self._deferred: dict[int, tuple[Run, Outcome]] = {}
        self._retrying: asyncio.Task[None] | None = None
        self._settled = asyncio.Event()
        self._settled.set()

    @property
    def deferred(self) -> int:
        """Outcomes waiting for the database."""
        return len(self._deferred)

    async def complete(self, run: Run, outcome: Outcome) -> None:
        """Record `outcome`, or keep it for later if the database is unavailable. Never raises
        for a database failure."""
        try:
            await self._write(run, outcome)
        except DatabaseUnavailable as exc:
            self._defer(run, outcome, exc)
        except psycopg.Error as exc:  # not transient: retrying would fail the same way
            logger.error(
                "run %s: recording its outcome failed: %s", run.run_id, exc,
                extra={"event": "completion_failed", **_fields(run, outcome), "reason": str(exc)},
            )

    async def _write(self, run: Run, outcome: Outcome) -> None:
        recorded, advanced = await self._db.complete(run, outcome)
        if not recorded:
            logger.warning(
                "run %s: outcome not recorded, this listener no longer holds the run", run.run_id,
                extra={"event": "run_not_recorded", **_fields(run, outcome),
                       "reason": "lease expired and the run was taken over, or already recorded"},
            )
            return
        logger.info(
            "run %s %s in %d ms", run.run_id, outcome.status, outcome.duration_ms,
            extra={"event": "run_finished", **_fields(run, outcome)},
        )
        if advanced:
            self._on_advanced()

    def _defer(self, run: Run, outcome: Outcome, exc: DatabaseUnavailable) -> None:
        self._deferred[run.run_id] = (run, outcome)
        self._settled.clear()
        logger.warning(
            "run %s: cannot record its outcome now, keeping it until its lease ends", run.run_id,
            extra={"event": "completion_deferred", **_fields(run, outcome), "reason": str(exc),
                   "lease_left_s": round(run.lease_deadline - time.monotonic(), 1)},
        )
        if self._retrying is None or self._retrying.done():
            self._retrying = asyncio.create_task(self._retry(), name="pgdispatch-completion-retry")

    async def _retry(self) -> None:
        backoff = Backoff()
        while self._deferred:
            await asyncio.sleep(backoff.next_delay())
            for run_id, (run, outcome) in list(self._deferred.items()):
                if time.monotonic() >= run.lease_deadline:
                    del self._deferred[run_id]
                    logger.error(
                        "run %s: lease ended before its outcome could be recorded", run_id,
                        extra={"event": "completion_abandoned", **_fields(run, outcome)},
                    )
                    continue
                try:
                    await self._write(run, outcome)
                except DatabaseUnavailable:
                    break
                del self._deferred[run_id]
                backoff.reset()
        self._settled.set()

    async def settle(self, timeout_s: float) -> int:
        """Wait up to timeout_s for deferred outcomes to be written; returns how many are left."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._settled.wait(), timeout_s)
        return len(self._deferred)

    async def close(self) -> None:
        """Stop retrying; what is still deferred is dropped (its lease will expire)."""
        if self._retrying is not None:
            self._retrying.cancel()
            await asyncio.gather(self._retrying, return_exceptions=True)
        for run, outcome in self._deferred.values():
            logger.error(
                "run %s: outcome dropped at shutdown, the database was unavailable", run.run_id,
                extra={"event": "completion_abandoned", **_fields(run, outcome)},
            )
        self._deferred.clear()
