"""Recording outcomes: the one place where the listener writes what its invocations did.

Workers hand outcomes over with `submit` and go on invoking; a few writer tasks (at most one per
pooled connection that claims and ticks leave free) take whatever has queued up, up to BATCH_MAX,
and record it with one dispatch.complete_runs call (a single run goes through
dispatch.complete_run). The more outcomes arrive while a batch is being written, the bigger the
next batch: recording keeps up by batching rather than by making invocations wait. The listener
still never holds more runs than it can record: a run counts against its claim budget until
`on_done` reports it recorded (or kept for later).

An outcome that cannot be written (the database is away) is kept in memory and retried until
the run's lease would have expired; after that the run belongs to whoever claims it next, so
the outcome is dropped. A run is never invoked again to make up for a lost write. An outcome the
database answers `busy` for (another transaction, a DBA's left open, holds the run's schedule)
is retried for as long as it stays busy: the lease cannot expire under that lock either, and
the attempt fences whatever comes after.

Logs: `run_finished` is one record per run with its status and duration, at DEBUG for `ok` runs
and at INFO for the others; every written batch also logs one INFO `runs_finished` record with
the counts by status and the batch's duration figures, so that a busy listener does not spend
its time writing one line per run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import psycopg

from dispatcher.backoff import Backoff
from dispatcher.database import Database, DatabaseUnavailable, Recorded
from dispatcher.runs import Outcome, Run

__all__ = ["BATCH_MAX", "Completer"]

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


# Outcomes recorded by one dispatch.complete_runs call at most (about 80 us of server time each).
BATCH_MAX = 250


class Completer:
    """Writes outcomes with dispatch.complete_runs; keeps and retries the ones that fail to write.

    `on_done(n)` is called once n submitted runs are settled: recorded, refused by the database
    (the run was taken over) or kept for a later retry."""

    def __init__(self, db: Database, *, writers: int = 1,
                 on_advanced: Callable[[], None] = lambda: None,
                 on_done: Callable[[int], None] = lambda n: None) -> None:
        self._db = db
        self._on_advanced = on_advanced
        self._on_done = on_done
        self._writer_count = writers
        self._writers: list[asyncio.Task[None]] = []
        self._queue: list[tuple[Run, Outcome]] = []
        self._has_work = asyncio.Event()
        self._writing = 0  # batches being written
        self._idle = asyncio.Event()  # nothing queued and nothing being written
        self._idle.set()
        self._deferred: dict[int, tuple[Run, Outcome, bool]] = {}  # run id -> (run, outcome, busy)
        self._retrying: asyncio.Task[None] | None = None
        self._settled = asyncio.Event()
        self._settled.set()

    @property
    def deferred(self) -> int:
        """Outcomes waiting for the database."""
        return len(self._deferred)

    def submit(self, run: Run, outcome: Outcome) -> None:
        """Queue `outcome` to be recorded (or kept for later if the database is unavailable)."""
        if not self._writers:
            self._writers = [asyncio.create_task(self._write_loop(), name=f"pgdispatch-completion-{i}")
                             for i in range(self._writer_count)]
        self._queue.append((run, outcome))
        self._idle.clear()
        self._has_work.set()

    async def flush(self, timeout_s: float) -> bool:
        """Wait up to timeout_s until every submitted outcome is written or deferred."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        return self._idle.is_set()

    async def _write_loop(self) -> None:
        while True:
            await self._has_work.wait()
            batch = self._queue[:BATCH_MAX]
            del self._queue[:BATCH_MAX]
            if not self._queue:
                self._has_work.clear()
            if not batch:
                continue
            self._writing += 1
            try:
                await self._write_batch(batch)
            finally:
                self._writing -= 1
                self._on_done(len(batch))
                if not self._queue and not self._writing:
                    self._idle.set()

    async def _write_batch(self, items: list[tuple[Run, Outcome]]) -> None:
        if len(items) == 1:
            await self._complete_one(*items[0])
            return
        try:
            results = await self._db.complete_many(items)
        except DatabaseUnavailable as exc:
            for run, outcome in items:
                self._defer(run, outcome, str(exc))
            return
        except psycopg.Error:
            for run, outcome in items:  # find the one that fails; record the others
                await self._complete_one(run, outcome)
            return
        self._report_batch(items, results)

    async def _complete_one(self, run: Run, outcome: Outcome) -> None:
        try:
            await self._write(run, outcome)
        except DatabaseUnavailable as exc:
            self._defer(run, outcome, str(exc))
        except psycopg.Error as exc:  # not transient: retrying would fail the same way
            logger.error(
                "run %s: recording its outcome failed: %s", run.run_id, exc,
                extra={"event": "completion_failed", **_fields(run, outcome), "reason": str(exc)},
            )

    async def _write(self, run: Run, outcome: Outcome) -> bool:
        """Write one outcome; False when the database answered busy (it is deferred again)."""
        result = await self._db.complete(run, outcome)
        self._report_batch([(run, outcome)], [result])
        return not result.busy

    def _report_batch(self, items: list[tuple[Run, Outcome]], results: list[Recorded]) -> None:
        per_run_debug = logger.isEnabledFor(logging.DEBUG)
        statuses: dict[str, int] = {}
        durations: list[int] = []
        advanced_any = False
        for (run, outcome), (recorded, advanced, busy) in zip(items, results, strict=True):
            if busy:
                self._defer(run, outcome, "another transaction holds the run or its schedule", busy=True)
                continue
            if not recorded:
                logger.warning(
                    "run %s: outcome not recorded, this listener no longer holds the run", run.run_id,
                    extra={"event": "run_not_recorded", **_fields(run, outcome),
                           "reason": "the run is no longer running with this attempt: its lease expired, "
                                     "or it was already recorded"},
                )
                continue
            advanced_any = advanced_any or advanced
            statuses[outcome.status] = statuses.get(outcome.status, 0) + 1
            durations.append(outcome.duration_ms)
            if outcome.status != "ok" or per_run_debug:
                logger.log(
                    logging.DEBUG if outcome.status == "ok" else logging.INFO,
                    "run %s %s in %d ms", run.run_id, outcome.status, outcome.duration_ms,
                    extra={"event": "run_finished", **_fields(run, outcome)},
                )
        if durations:
            durations.sort()
            logger.info(
                "%d runs finished", len(durations),
                extra={"event": "runs_finished", "count": len(durations), **statuses,
                       "duration_ms_p50": durations[len(durations) // 2], "duration_ms_max": durations[-1]},
            )
        if advanced_any:
            self._on_advanced()

    def _defer(self, run: Run, outcome: Outcome, reason: str, *, busy: bool = False) -> None:
        if run.run_id not in self._deferred:
            logger.warning(
                "run %s: cannot record its outcome now, keeping it to retry", run.run_id,
                extra={"event": "completion_deferred", **_fields(run, outcome), "reason": reason,
                       "busy": busy, "lease_left_s": round(run.lease_deadline - time.monotonic(), 1)},
            )
        self._deferred[run.run_id] = (run, outcome, busy)
        self._settled.clear()
        if self._retrying is None or self._retrying.done():
            self._retrying = asyncio.create_task(self._retry(), name="pgdispatch-completion-retry")

    async def _retry(self) -> None:
        # Capped at a second: a write that failed is retried soon after the database (or the
        # row a DBA held) is back, well within the lease margin.
        backoff = Backoff(max_s=1.0)
        while self._deferred:
            await asyncio.sleep(backoff.next_delay())
            for run_id, (run, outcome, busy) in list(self._deferred.items()):
                if not busy and time.monotonic() >= run.lease_deadline:
                    del self._deferred[run_id]
                    logger.error(
                        "run %s: lease ended before its outcome could be recorded", run_id,
                        extra={"event": "completion_abandoned", **_fields(run, outcome)},
                    )
                    continue
                try:
                    written = await self._write(run, outcome)  # busy: stays deferred
                except DatabaseUnavailable:
                    self._deferred[run_id] = (run, outcome, False)
                    break
                if written:
                    del self._deferred[run_id]
                    backoff.reset()
        self._settled.set()

    async def settle(self, timeout_s: float) -> int:
        """Wait up to timeout_s for deferred outcomes to be written; returns how many are left."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._settled.wait(), timeout_s)
        return len(self._deferred)

    async def close(self) -> None:
        """Stop writing and retrying; what is still deferred is dropped (its lease will expire)."""
        tasks = [*self._writers, *([self._retrying] if self._retrying else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for run, outcome, _ in self._deferred.values():
            logger.error(
                "run %s: outcome dropped at shutdown, the database was unavailable", run.run_id,
                extra={"event": "completion_abandoned", **_fields(run, outcome)},
            )
        self._deferred.clear()
