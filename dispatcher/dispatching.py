"""Claiming and invoking: the claimer keeps a queue of claimed runs within the claim budget
(dispatcher.budget), `concurrency` workers invoke them and hand each outcome to the Completer.

A run leaves the listener unstarted, handed back to pending with release_runs (in batches, by
the releaser), when a worker finds too little of its lease left to invoke it, and once the
listener stops: nothing more is claimed, a claim in progress hands back what it returns, and a
worker that takes a queued run hands it back instead of invoking it.
"""

from __future__ import annotations

import asyncio
import logging
import time

from dispatcher.backoff import Backoff
from dispatcher.budget import ClaimBudget
from dispatcher.completion import Completer
from dispatcher.database import Database, DatabaseUnavailable
from dispatcher.invoke import Invoker
from dispatcher.metrics import Metrics
from dispatcher.runs import Run
from dispatcher.span_export import InvocationSpans

__all__ = ["CLAIM_BATCH_WAIT_S", "CLAIM_SPACING_S", "Dispatcher"]

logger = logging.getLogger(__name__)

# Without prefetch, when less than a batch worth a claim is free, wait this long for more to
# free up, so that a busy listener claims in batches rather than a run per round trip.
CLAIM_BATCH_WAIT_S = 0.005
# After a claim that came back short (it took all there was), the next one starts no sooner than
# this: under steady load runs come due a few at a time, and a claim costs the database about as
# much for one run as for ten. A full claim is followed at once.
CLAIM_SPACING_S = 0.05
# A release that got fewer runs back than it asked for is asked again this often, this far apart.
RELEASE_RETRIES = 3
RELEASE_RETRY_S = 0.3


async def _wait(event: asyncio.Event, timeout_s: float) -> bool:
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True


class Dispatcher:
    """The claimer (`claim_loop`), the workers (`worker`) and the releaser (`releaser`)."""

    def __init__(self, db: Database, invoker: Invoker, completer: Completer, budget: ClaimBudget,
                 metrics: Metrics, *, lease_s: float, stopping: asyncio.Event,
                 spans: InvocationSpans | None = None) -> None:
        self._db = db
        self._spans = spans
        self._invoker = invoker
        self._completer = completer
        self._budget = budget
        self._metrics = metrics
        self._lease_s = lease_s
        self._stopping = stopping
        self._queue: asyncio.Queue[Run] = asyncio.Queue()
        self._wake = asyncio.Event()  # claim now
        self._short = False  # the last claim took fewer runs than there was room for
        self._short_at = -CLAIM_SPACING_S  # when the last short claim returned (time.monotonic())
        self._slot_freed = asyncio.Event()
        self._unstarted: list[Run] = []  # to hand back
        self._release = asyncio.Event()
        self.invocation_ended = asyncio.Event()  # set after each invocation (for the shutdown)

    def wake(self) -> None:
        """There may be runs to claim (a NOTIFY, a tick that marked, a sweep, a stop)."""
        self._wake.set()

    def slot_freed(self) -> None:
        self._slot_freed.set()

    def outcome_recorded(self) -> None:
        """One of this listener's runs left running: after a short claim, claim again (the place
        it held under its project's cap is free, and nothing else would say so)."""
        if self._short:
            self._short = False
            self.wake()

    # -- claiming -----------------------------------------------------------------------------

    async def _free_slots(self) -> int:
        """Wait until a batch worth claiming is free; 0 when stopping."""
        budget = self._budget
        while budget.room().may_claim < 1 and not self._stopping.is_set():
            self._slot_freed.clear()
            await self._slot_freed.wait()
        if budget.prefetching:
            while (room := budget.room()).may_claim < room.worth_claiming and not self._stopping.is_set():
                self._slot_freed.clear()
                await self._slot_freed.wait()
        elif (room := budget.room()).may_claim < room.worth_claiming and budget.outstanding:
            deadline = time.monotonic() + CLAIM_BATCH_WAIT_S
            while ((room := budget.room()).may_claim < room.worth_claiming and not self._stopping.is_set()
                   and (left := deadline - time.monotonic()) > 0):
                self._slot_freed.clear()
                await _wait(self._slot_freed, left)
        if self._stopping.is_set():
            return 0
        return max(1, budget.room().may_claim)

    async def claim_loop(self) -> None:
        """Claim whenever woken, as long as there is room; returns once the listener stops."""
        # Retrying a claim is one cheap attempt on the pool: keep it frequent, so that runs are
        # claimed within about a second of the database coming back.
        backoff = Backoff(max_s=1.0)
        while True:
            await self._wake.wait()
            if (left := self._short_at + CLAIM_SPACING_S - time.monotonic()) > 0:
                await _wait(self._stopping, left)
            if self._stopping.is_set():
                return
            self._wake.clear()
            while True:
                free = await self._free_slots()
                if not free:
                    return
                try:
                    runs = await self._db.claim(free, self._lease_s, self._budget.timeout_s)
                except DatabaseUnavailable as exc:
                    delay = backoff.next_delay()
                    logger.warning("claim failed, retrying in %.1f s", delay,
                                   extra={"event": "claim_failed", "reason": str(exc), "retry_in_s": delay})
                    await _wait(self._stopping, delay)
                    self._wake.set()
                    break
                backoff.reset()
                self._metrics.claimed(len(runs))
                self._budget.claimed(len(runs))
                if self._stopping.is_set():
                    self._unstarted.extend(runs)  # handed back by the shutdown
                    return
                for run in runs:
                    self._queue.put_nowait(run)
                if runs:
                    logger.debug("claimed %d run%s", len(runs), "" if len(runs) == 1 else "s",
                                 extra={"event": "runs_claimed", "count": len(runs)})
                if len(runs) < free:
                    # A claim comes back short at a project's max_concurrency or at a row another
                    # claimer held: this listener's next outcome, which frees a place, claims again.
                    self._short = True
                    self._short_at = time.monotonic()
                    break
                self._short = False

    # -- invoking -----------------------------------------------------------------------------

    async def worker(self) -> None:
        """Invoke queued runs, one at a time, for as long as the listener runs."""
        # The lease a queued run needs left to be started: its own timeout plus the safety margin.
        safety_s = self._budget.start_margin_s - self._budget.timeout_s
        while True:
            run = await self._queue.get()
            if self._stopping.is_set():
                self._hand_back(run)
                continue
            if run.lease_deadline - time.monotonic() < (run.timeout_s or self._budget.timeout_s) + safety_s:
                self._hand_back(run)
                continue
            self._budget.started()
            # A retry is late by its back-off, and a backfill or manual run has no instant it was
            # due at (a backfill's fire_at is a slot of the past), on purpose: neither is latency.
            if run.attempt == 1 and run.kind in ("scheduled", None):
                self._metrics.sent(run.fire_at or run.scheduled_for)
            submitted = False
            try:
                try:
                    outcome = await self._invoker.invoke(run)
                except Exception:  # a bug in invoking one run must not take a worker away
                    logger.exception("run %s: unexpected error", run.run_id,
                                     extra={"event": "worker_error", "run_id": run.run_id})
                    continue
                self._metrics.finished(outcome.status, outcome.duration_ms / 1000)
                self._completer.submit(run, outcome)
                submitted = True
                if self._spans is not None:
                    self._spans.record(run, outcome)
            finally:
                # However the invocation ended (cancelled, a bug, a leaked CancelledError), its
                # share of the budget comes back, and the claimer, which may be waiting for it,
                # hears so.
                if submitted:
                    self._budget.invoked(outcome.duration_ms / 1000)
                else:
                    self._budget.abandoned()
                    self._slot_freed.set()
                self.invocation_ended.set()

    # -- handing back ---------------------------------------------------------------------------

    def _hand_back(self, run: Run) -> None:
        self._unstarted.append(run)
        self._release.set()

    def take_unstarted(self) -> list[Run]:
        """Every claimed run not started: what workers handed back, and what is still queued."""
        runs, self._unstarted = self._unstarted, []
        while not self._queue.empty():
            runs.append(self._queue.get_nowait())
        return runs

    async def releaser(self) -> None:
        """Hand back, in batches, the runs workers did not start; as long as the listener runs."""
        while True:
            await self._release.wait()
            self._release.clear()
            runs, self._unstarted = self._unstarted, []
            if runs:
                await self.release(runs, reason="queued until too little of its lease was left")

    async def release(self, runs: list[Run], *, reason: str) -> int:
        """release_runs; any failure is logged (the runs' leases expire), never raised. Cut short
        (cancelled: the listener is stopping), the runs go back among the unstarted, for the
        shutdown to hand back or name (`name_unreleased`): whether this call got through is
        unknown, and handing a run back twice changes nothing (the attempt fences it)."""
        try:
            released = await self._db.release(runs)
            # Fewer than asked: another transaction holds some of them (release_runs skips what is
            # locked). Often an earlier call of ours that was cut short and reached the server
            # late: it aborts once it finds its client gone. Asked again a few times; what is
            # still not confirmed is named (it may already be pending; its lease expires if not).
            for _ in range(RELEASE_RETRIES):
                if released >= len(runs):
                    break
                await asyncio.sleep(RELEASE_RETRY_S)
                released += await self._db.release(runs)
        except asyncio.CancelledError:
            self._unstarted[:0] = runs
            raise
        except Exception as exc:
            self.name_unreleased(runs, str(exc))
            released = 0
        else:
            logger.info("handed %d unstarted runs back to pending", released,
                        extra={"event": "runs_released", "count": released, "reason": reason})
            if released < len(runs):
                self.name_unreleased(runs, f"{len(runs) - released} of {len(runs)} not confirmed handed back:"
                                           " held by another transaction, or already moved on")
        self._budget.settled(len(runs))
        self._slot_freed.set()
        return released

    def name_unreleased(self, runs: list[Run], reason: str) -> None:
        logger.warning("could not hand back %d unstarted runs: their leases will expire (%s)",
                       len(runs), reason,
                       extra={"event": "release_failed", "count": len(runs), "reason": reason,
                              "run_ids": [run.run_id for run in runs]})
