"""Recording outcomes: the one place where the listener writes what its invocations did.

Workers hand outcomes over with `submit` and go on invoking; the writer lets them gather (for
LINGER_S at most, until a quarter of the listener's concurrency is queued), takes whatever has
queued up, up to BATCH_MAX, and records it with one dispatch.complete_runs call. The more
outcomes arrive while a batch is being written, the bigger the next batch: recording keeps up
by batching rather than by making invocations wait. The listener still never holds more runs
than it can record: a run counts against its claim budget until `on_done` reports it settled.

An outcome that cannot be written now is kept in one of two queues, each with one rule, and
retried in batches from its front (oldest first); an outcome kept again goes to the back, so a
queue rotates and nothing in it starves behind outcomes that keep failing:

- unavailable (the database did not answer): retried at most RETRY_MAX_S apart, and at once
  when any other database call succeeds (the database is back); until the run's lease would
  have expired, then abandoned (logged with its run id): after that the run belongs to
  whoever claims it next. A run is never invoked again to make up for a lost write;
- busy (the database answered that another transaction holds the run or its schedule): retried
  on a back-off of its own, BUSY_RETRY_INITIAL_S doubling to BUSY_RETRY_MAX_S, whatever else
  succeeds meanwhile; for as long as it stays busy (the attempt fences whatever comes after).
  Mostly this is a tick that holds the schedule while it marks the schedule's next slot (a
  schedule that allows overlap is due again while its run is out), or another listener's claim
  that looked at the run a moment before this listener claimed it; the first retry records it.
  A lock on the run's own row keeps its lease from expiring, but one on its schedule does not:
  tick after tick can take the schedule, and between two of them the lease expires and the run
  is claimed and invoked again. So each busy answer renews the run's lease to at least 5 s from
  then (dispatch.complete_runs), the back-off stays under that (BUSY_RETRY_MAX_S), and it never
  waits past a quarter of what is left of the lease of a kept outcome (at least
  BUSY_RETRY_INITIAL_S). An outcome busy for BUSY_WARNING_S is something else (a DBA's
  transaction left open) and is said.

Logs: `run_finished` is one record per run, at DEBUG for `ok` runs and at INFO for the others;
each written batch logs one INFO `runs_finished` with the counts by status. Deferral is one
WARNING `completions_deferred` when it starts (for busy outcomes: once they have been busy for
BUSY_WARNING_S), again every REPEAT_WARNING_S while it lasts, and one INFO `completions_resumed`
when everything it warned of is written; `completion_deferred` is the DEBUG record of each run
kept; `completion_abandoned` is an ERROR per run whose outcome is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psycopg

from dispatcher.backoff import Backoff
from dispatcher.database import Database, DatabaseUnavailable, Recorded
from dispatcher.runs import Outcome, Run
from dispatcher.tracing import trace_and_span

__all__ = ["BATCH_MAX", "Completer"]

logger = logging.getLogger(__name__)

# Outcomes recorded by one dispatch.complete_runs call at most (about 80 us of server time each).
BATCH_MAX = 250
# How long the writer lets outcomes gather, until `gather` are queued: a call costs the database
# about a millisecond of CPU whatever its size, and under steady load outcomes trickle in. Short
# beside a lease, a back-off or the shortest interval a schedule can have (1 s).
LINGER_S = 0.02
RETRY_INITIAL_S = 0.2
RETRY_MAX_S = 1.0
BUSY_RETRY_INITIAL_S = 0.1
BUSY_RETRY_MAX_S = 2.0  # under the 5 s a busy answer renews the lease to (dispatch.complete_runs)
BUSY_REASON = "another transaction holds the run or its schedule"
REPEAT_WARNING_S = 10.0
BUSY_WARNING_S = 5.0


# Refusals of an outcome's text: psycopg's (client side) and the server's (a character its
# encoding does not have).
_UNENCODABLE = (UnicodeError, psycopg.errors.CharacterNotInRepertoire, psycopg.errors.UntranslatableCharacter)


def _escaped(text: str | None) -> str | None:
    """`text` in ASCII, whatever it cannot carry as \\x, \\u or \\U escapes: every server and
    client encoding PostgreSQL has holds it."""
    if text is None:
        return None
    return text.encode("ascii", "backslashreplace").decode("ascii").replace("\x00", "\\x00")


def _fields(run: Run, outcome: Outcome) -> dict[str, object]:
    trace_id, span_id = trace_and_span(run.traceparent) if run.traceparent else (None, None)
    return {
        "run_id": run.run_id,
        "schedule_id": run.schedule_id,
        "request_id": run.request_id,
        "project_id": run.project_id,
        "function_name": run.function_name,
        "attempt": run.attempt,
        "trace_id": trace_id,
        "span_id": span_id,
        "status": outcome.status,
        "http_status": outcome.http_status,
        "duration_ms": outcome.duration_ms,
        "error": outcome.error,
    }


@dataclass(slots=True)
class _Kept:
    run: Run
    outcome: Outcome
    busy: bool  # the database answered busy (else: it was unavailable)
    since: float  # time.monotonic() it was first kept


class _RetryQueue:
    """Kept outcomes of one kind, oldest first, and when the next batch of them is due.

    With `lease_floor_s`, the back-off never waits past a quarter of the lease left to the kept
    outcome whose lease ends first (nor less than lease_floor_s), while that lease lasts."""

    def __init__(self, backoff: Backoff, *, lease_floor_s: float | None = None) -> None:
        self.items: dict[int, _Kept] = {}  # by run id; insertion order is the retry order
        self.backoff = backoff
        self.due_at = 0.0  # time.monotonic() of the next retry
        self._lease_floor_s = lease_floor_s

    def __len__(self) -> int:
        return len(self.items)

    def put(self, kept: _Kept) -> None:
        """At the back (a retried outcome kept again too: the queue rotates)."""
        now = time.monotonic()
        if not self.items:
            self.backoff.reset()
            self.due_at = now + self.backoff.next_delay()
        self.items.pop(kept.run.run_id, None)
        self.items[kept.run.run_id] = kept
        self._keep_within_lease(now, kept.run.lease_deadline)

    def batch(self) -> list[tuple[Run, Outcome]]:
        return [(kept.run, kept.outcome) for kept in itertools.islice(self.items.values(), BATCH_MAX)]

    def retried(self, progress: bool) -> None:
        """A batch was written: the next one at once after progress (some of it was settled),
        else after the back-off."""
        now = time.monotonic()
        if progress:
            self.backoff.reset()
        self.due_at = now + (0.0 if progress else self.backoff.next_delay())
        if self.items:
            self._keep_within_lease(now, min(kept.run.lease_deadline for kept in self.items.values()))

    def _keep_within_lease(self, now: float, lease_deadline: float) -> None:
        left = lease_deadline - now
        if self._lease_floor_s is not None and left > 0:
            self.due_at = min(self.due_at, now + max(self._lease_floor_s, left / 4))


class Completer:
    """Writes outcomes; keeps and retries the ones that cannot be written now.

    `run()` is the writer and `retry()` the retrier: the listener's supervisor runs both.
    `on_done(n)` is called once n submitted runs are settled: recorded, refused by the database
    (the run moved on without this attempt) or kept for a later retry. `on_advanced()` when a
    recorded run moved its schedule on."""

    def __init__(self, db: Database, *, on_advanced: Callable[[], None] = lambda: None,
                 on_done: Callable[[int], None] = lambda n: None, gather: int = 1,
                 linger_s: float = LINGER_S) -> None:
        self._db = db
        self._gather = gather
        self._linger_s = linger_s
        self._gathered = asyncio.Event()  # `gather` outcomes queued
        self._on_advanced = on_advanced
        self._on_done = on_done
        self._queue: list[tuple[Run, Outcome]] = []
        self._has_work = asyncio.Event()
        self._writing = 0
        self._in_write: list[tuple[Run, Outcome]] = []  # the batch being written
        self._idle = asyncio.Event()  # nothing queued and nothing being written
        self._idle.set()
        # The database did not answer: retried at most RETRY_MAX_S apart and at once when another
        # call succeeds, until the run's lease is over.
        self._unavailable = _RetryQueue(Backoff(initial_s=RETRY_INITIAL_S, max_s=RETRY_MAX_S))
        # Another transaction holds the run or its schedule: retried on its own back-off only
        # (closer as the lease runs out), for as long as that lasts.
        self._busy = _RetryQueue(Backoff(initial_s=BUSY_RETRY_INITIAL_S, max_s=BUSY_RETRY_MAX_S),
                                 lease_floor_s=BUSY_RETRY_INITIAL_S)
        self._kept_changed = asyncio.Event()  # an outcome was kept, or the database is back
        self._settled = asyncio.Event()  # nothing kept
        self._settled.set()
        self._deferred_since: float | None = None  # when the warning about kept outcomes was first given
        self._warned_at = 0.0
        self._last_reason = ""

    @property
    def deferred(self) -> int:
        """Outcomes kept for a retry."""
        return len(self._unavailable) + len(self._busy)

    def _kept(self) -> list[_Kept]:
        return [*self._unavailable.items.values(), *self._busy.items.values()]

    def _forget(self, run_id: int) -> _Kept | None:
        """Drop a run's kept outcome, if any, and return it."""
        unavailable = self._unavailable.items.pop(run_id, None)
        busy = self._busy.items.pop(run_id, None)
        return unavailable or busy

    @property
    def queued(self) -> int:
        """Outcomes submitted and not yet written (nor kept)."""
        return len(self._queue)

    def submit(self, run: Run, outcome: Outcome) -> None:
        """Queue `outcome` to be recorded (or kept for later if it cannot be written now)."""
        self._queue.append((run, outcome))
        self._idle.clear()
        self._has_work.set()
        if len(self._queue) >= self._gather:
            self._gathered.set()

    def database_is_back(self) -> None:
        """A database call succeeded: retry the outcomes kept for want of the database now rather
        than after their back-off (busy ones keep theirs: the database was there all along)."""
        if self._unavailable.items:
            self._unavailable.due_at = 0.0
            self._kept_changed.set()

    async def flush(self, timeout_s: float) -> bool:
        """Wait up to timeout_s until every submitted outcome is written or kept."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        return self._idle.is_set()

    async def settle(self, timeout_s: float) -> int:
        """Wait up to timeout_s for kept outcomes to be written; returns how many are left."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._settled.wait()
        return self.deferred

    # -- the writer -------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            await self._has_work.wait()
            if len(self._queue) < self._gather:
                self._gathered.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._linger_s):
                        await self._gathered.wait()
            batch = self._queue[:BATCH_MAX]
            del self._queue[:BATCH_MAX]
            if not self._queue:
                self._has_work.clear()
            if not batch:
                continue
            self._writing += 1
            self._in_write = batch
            try:
                await self._write(batch)
                self._in_write = []
            finally:
                self._writing -= 1
                self._on_done(len(batch))
                if not self._queue and not self._writing:
                    self._idle.set()

    async def _write(self, items: Sequence[tuple[Run, Outcome]]) -> bool:
        """Write a batch, keeping what cannot be written now; True if the database answered."""
        try:
            results = await self._db.complete_many(items)
        except DatabaseUnavailable as exc:
            for run, outcome in items:
                self._keep(run, outcome, busy=False, reason=str(exc))
            return False
        except (psycopg.Error, UnicodeError) as exc:
            # UnicodeError: an outcome's text that the connection's encoding cannot carry (psycopg
            # encodes the statement here, before sending it). A function's answer is the one
            # free-form text in an outcome, so whatever it holds must not stop the writer.
            if len(items) > 1:  # find the one that fails; record the others
                for item in items:
                    await self._write([item])
                return True
            run, outcome = items[0]
            escaped = _escaped(outcome.error)
            if isinstance(exc, _UNENCODABLE) and escaped != outcome.error:
                # The text, in the client's encoding or the database's (invoke.storable_text
                # missed a case, or either is not UTF8): recorded as ASCII escapes rather than not
                # at all, which would have the function called again for this slot; and said.
                logger.error(
                    "run %s: its error text could not be recorded as it was (%s); recording it escaped",
                    run.run_id, exc,
                    extra={"event": "completion_text_escaped", **_fields(run, outcome), "reason": str(exc)},
                )
                return await self._write([(run, dataclasses.replace(outcome, error=escaped))])
            logger.error(  # not transient: retrying would fail the same way
                "run %s: recording its outcome failed: %s", run.run_id, exc,
                extra={"event": "completion_failed", **_fields(run, outcome), "reason": str(exc)},
            )
            self._forget(run.run_id)
            return True
        self._report(items, results)
        return True

    def _report(self, items: Sequence[tuple[Run, Outcome]], results: Sequence[Recorded]) -> None:
        per_run_debug = logger.isEnabledFor(logging.DEBUG)
        statuses: dict[str, int] = {}
        durations: list[int] = []
        advanced_any = False
        for (run, outcome), (recorded, advanced, busy, retry_at, lease_deadline) in zip(
                items, results, strict=True):
            if busy:
                # The answer renewed the lease on the server: counting it from the claim would
                # have an outcome kept past that, and then kept for want of the database,
                # abandoned while the lease held, and the function called again for the slot.
                if lease_deadline is not None and lease_deadline > run.lease_deadline:
                    run = dataclasses.replace(run, lease_deadline=lease_deadline)
                self._keep(run, outcome, busy=True, reason=BUSY_REASON)
                continue
            kept = self._forget(run.run_id)
            if not recorded:
                # How late it came and whether it had waited: a lease overrun by a slow write
                # tells apart from a run taken from a listener that was on time.
                now = time.monotonic()
                logger.warning(
                    "run %s: outcome not recorded, this listener no longer holds the run", run.run_id,
                    extra={"event": "run_not_recorded", **_fields(run, outcome),
                           "reason": "the run is no longer running with this attempt: its lease expired, "
                                     "or it was already recorded",
                           "lease_left_s": round(run.lease_deadline - now, 3),
                           "kept_for_s": None if kept is None else round(now - kept.since, 3),
                           "kept_busy": None if kept is None else kept.busy},
                )
                continue
            if retry_at is not None:
                statuses["retry"] = statuses.get("retry", 0) + 1
                logger.info(
                    "run %s: attempt %d failed, retrying at %s", run.run_id, run.attempt,
                    retry_at.isoformat(),
                    extra={"event": "run_retry_scheduled", **_fields(run, outcome),
                           "retry_at": retry_at.isoformat()},
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
                "%d run%s finished", len(durations), "" if len(durations) == 1 else "s",
                extra={"event": "runs_finished", "count": len(durations), **statuses,
                       "duration_ms_p50": durations[len(durations) // 2], "duration_ms_max": durations[-1]},
            )
        if advanced_any:
            self._on_advanced()
        self._settle_if_empty()

    def _settle_if_empty(self) -> None:
        if self.deferred:
            return
        if self._deferred_since is not None:
            logger.info("outcomes kept for %.1f s are all recorded", time.monotonic() - self._deferred_since,
                        extra={"event": "completions_resumed",
                               "deferred_for_s": round(time.monotonic() - self._deferred_since, 1)})
            self._deferred_since = None
        self._settled.set()

    # -- what cannot be written now ---------------------------------------------------------

    def _keep(self, run: Run, outcome: Outcome, *, busy: bool, reason: str) -> None:
        now = time.monotonic()
        queue, other = (self._busy, self._unavailable) if busy else (self._unavailable, self._busy)
        earlier = queue.items.get(run.run_id) or other.items.pop(run.run_id, None)
        queue.put(_Kept(run, outcome, busy, earlier.since if earlier else now))
        self._settled.clear()
        self._kept_changed.set()
        logger.debug("run %s: outcome kept to retry: %s", run.run_id, reason,
                     extra={"event": "completion_deferred", **_fields(run, outcome), "busy": busy,
                            "reason": reason})
        self._last_reason = reason
        self._warn_if_due()

    def _warn_if_due(self) -> None:
        """One WARNING when outcomes start waiting (busy ones: once they have waited a while), then
        every REPEAT_WARNING_S while they do."""
        now = time.monotonic()
        if not self._unavailable.items and not any(
                now - kept.since >= BUSY_WARNING_S for kept in self._busy.items.values()):
            return
        if self._deferred_since is not None and now - self._warned_at < REPEAT_WARNING_S:
            return
        self._deferred_since = self._deferred_since or now
        self._warned_at = now
        logger.warning("%d outcomes cannot be recorded now, keeping them to retry: %s", self.deferred,
                       self._last_reason, extra={"event": "completions_deferred", "count": self.deferred,
                                                 "busy": len(self._busy), "reason": self._last_reason})

    async def retry(self) -> None:
        """Retry each queue's batch when it is due (see the module's docstring); runs as long as
        the listener does."""
        while True:
            queues = [queue for queue in (self._unavailable, self._busy) if queue.items]
            if not queues:
                self._settle_if_empty()
                self._kept_changed.clear()
                await self._kept_changed.wait()
                continue
            wait_s = min(queue.due_at for queue in queues) - time.monotonic()
            if wait_s > 0:
                self._kept_changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait_s):
                        await self._kept_changed.wait()
                continue
            self._warn_if_due()
            if self._unavailable.items and self._unavailable.due_at <= time.monotonic():
                self._abandon_expired()
                await self._retry(self._unavailable)
            if self._busy.items and self._busy.due_at <= time.monotonic():
                await self._retry(self._busy)

    def _abandon_expired(self) -> None:
        now = time.monotonic()
        for run_id, kept in list(self._unavailable.items.items()):
            if now >= kept.run.lease_deadline:
                del self._unavailable.items[run_id]
                self._abandoned(kept.run, kept.outcome,
                                "its lease ended before the outcome could be recorded")

    async def _retry(self, queue: _RetryQueue) -> None:
        batch = queue.batch()
        if not batch:
            return
        answered = await self._write(batch)
        # progress: some of the batch was recorded or refused (what else was kept meanwhile, by
        # the writer, is no sign either way)
        queue.retried(progress=answered and any(run.run_id not in queue.items for run, _ in batch))

    def _abandoned(self, run: Run, outcome: Outcome, why: str) -> None:
        logger.error("run %s: outcome abandoned: %s", run.run_id, why,
                     extra={"event": "completion_abandoned", **_fields(run, outcome), "reason": why})

    def abandon_all(self, why: str) -> int:
        """At shutdown: log every outcome not written (queued, being written when the writer was
        stopped, or kept) as abandoned; how many."""
        kept = self._kept()
        kept_ids = {item.run.run_id for item in kept}
        items = [*self._queue, *(item for item in self._in_write if item[0].run_id not in kept_ids),
                 *((item.run, item.outcome) for item in kept)]
        self._in_write = []
        for run, outcome in items:
            self._abandoned(run, outcome, why)
        self._queue.clear()
        self._unavailable.items.clear()
        self._busy.items.clear()
        return len(items)
