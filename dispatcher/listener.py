"""The listener: wake on NOTIFY, on its own timer and on a sweep; claim; invoke; record.

Tasks of one listener:

- listen: one autocommit connection, outside the pool, doing LISTEN dispatch. A notification
  wakes the claimer ("schedules" re-plans the clock instead). It reconnects with capped
  exponential backoff and asks for a sweep after every (re)connect, since a NOTIFY sent while
  it was away is gone.
- clock: sleeps until the earliest next_run_at after the instant its last tick covered
  (dispatch.next_due_after(), by the database's clock) and calls dispatch.tick() at that
  instant; every sweep interval it ticks and wakes the claimer whatever happened.
- claimer: claims in batches and queues the runs. It keeps up to PREFETCH_FACTOR times the
  concurrency claimed (queued, in flight or being recorded) when invocations are fast, only as
  many as the recent invocations drain in about PREFETCH_WAIT_S when they are slow (nothing
  beyond the concurrency until durations are known), and claims at least one concurrency's
  worth at a time once it prefetches, so that a claim's round trip is paid by many runs.
- workers: `concurrency` coroutines that invoke queued runs and hand outcomes to the Completer,
  which records them in batches while the workers go on. A queued run whose lease would end
  before an invocation could finish is handed back instead of invoked.

Shutdown (uvicorn-style: signal handlers only set events): the first SIGTERM/SIGINT stops
claiming, hands claimed-but-unstarted runs back to pending, lets in-flight invocations finish
within the grace period and records them; a second signal cancels what is left (their leases
expire and they are retried with the same request id).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import signal
import time
from datetime import datetime

import psycopg

from dispatcher import __version__
from dispatcher.backoff import Backoff
from dispatcher.completion import Completer
from dispatcher.config import Settings
from dispatcher.database import Database, DatabaseUnavailable
from dispatcher.invoke import Invoker, new_session
from dispatcher.metrics import Metrics, MetricsServer
from dispatcher.runs import Run
from dispatcher.systemd import Notifier

__all__ = ["Listener", "run_listener"]

logger = logging.getLogger(__name__)

CHANNEL = "dispatch"
# A completion that advances a schedule may move the earliest next_run_at; re-read it at most
# this often rather than once per completion.
REPLAN_AFTER_COMPLETION_S = 0.05
# Claimed runs held at most (queued + in flight + being recorded), in multiples of the concurrency.
PREFETCH_FACTOR = 4
# Queue no more beyond the concurrency than the recent invocations drain in about this long.
PREFETCH_WAIT_S = 1.0
# Invocation durations the prefetch depth is estimated from.
DURATION_WINDOW = 256
# Without prefetch, when fewer slots than this share of the concurrency are free, wait this long
# for more to free up, so that a busy listener claims in batches rather than a run per round trip.
CLAIM_BATCH_SHARE = 0.25
CLAIM_BATCH_WAIT_S = 0.005
# A queued run is handed back rather than invoked when less than timeout + this (or half the lease's
# margin over the timeout, if smaller) is left of its lease.
LEASE_SAFETY_S = 5.0
# How long shutdown waits for a claim in progress before cancelling it.
CLAIM_STOP_WAIT_S = 5.0
# How often the systemd STATUS= line is refreshed (when it changed).
SYSTEMD_STATUS_EVERY_S = 5.0


async def _wait(event: asyncio.Event, timeout_s: float | None) -> bool:
    """Wait for `event` at most timeout_s; True if it was set."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True


class Listener:
    """One listener process's worth of dispatching. `await run()` until `stop()` is called."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.ready = asyncio.Event()  # LISTEN is active and a sweep has run since (first time)
        self._listening = False
        self._stopping = asyncio.Event()
        self._force = asyncio.Event()
        self._wake = asyncio.Event()  # claim now
        self._replan = asyncio.Event()  # re-read next_due_at (and sweep if one is requested)
        self._sweep_requested = True
        self._replan_scheduled = False
        self._slot_freed = asyncio.Event()
        self._outstanding = 0  # runs claimed and not yet recorded: queued, in flight, being recorded
        self._in_flight = 0  # runs being invoked
        self._recording = 0  # runs whose outcome the Completer is writing
        self._durations: collections.deque[float] = collections.deque(maxlen=DURATION_WINDOW)
        self._durations_sum = 0.0
        self._queue: asyncio.Queue[Run | None] = asyncio.Queue()
        self._held: list[Run] = []  # claimed while stopping: never started
        self._expiring: list[Run] = []  # queued too long: handed back, never started
        self._releasing: asyncio.Task[None] | None = None
        self._db = Database(
            settings.database_url,
            application_name=settings.application_name,
            worker_id=settings.worker_id,
            lease_s=settings.lease_s,
            pool_size=settings.pool_size,
        )
        # Claims and ticks keep a connection or two of the pool; outcomes are written on the rest.
        self._completer = Completer(self._db, writers=1,
                                    on_advanced=self._replan_soon, on_done=self._recorded)
        self.metrics = Metrics()
        self.metrics.track_in_flight(lambda: self._in_flight)

    # -- control ---------------------------------------------------------------------------

    def stop(self, reason: str = "stop requested") -> None:
        """First call: graceful shutdown. Second call: cancel what is still running."""
        if not self._stopping.is_set():
            logger.info("shutting down (%s)", reason,
                        extra={"event": "shutdown_requested", "reason": reason,
                               "grace_s": self.settings.grace_s})
            self._stopping.set()
            # Whatever waits for work wakes up and sees that it is stopping.
            self._wake.set()
            self._slot_freed.set()
        elif not self._force.is_set():
            logger.warning("shutting down now (%s): cancelling in-flight invocations", reason,
                           extra={"event": "shutdown_forced", "reason": reason})
            self._force.set()

    def _replan_soon(self) -> None:
        if not self._replan_scheduled:
            self._replan_scheduled = True
            asyncio.get_running_loop().call_later(REPLAN_AFTER_COMPLETION_S, self._replan_now)

    def _replan_now(self) -> None:
        self._replan_scheduled = False
        self._replan.set()

    def _request_sweep(self) -> None:
        self._sweep_requested = True
        self._replan.set()

    # -- main ------------------------------------------------------------------------------

    async def run(self) -> None:
        settings = self.settings
        session = new_session(concurrency=settings.concurrency)
        invoker = Invoker(session, url_template=settings.invoke_url, timeout_s=settings.timeout_s,
                          secret=settings.signing_secret)
        await self._db.open()
        logger.info("pgdispatch %s listening as %s", __version__, settings.worker_id,
                    extra={"event": "listener_started", "version": __version__, **settings.describe()})
        workers = [
            asyncio.create_task(self._worker(invoker), name=f"pgdispatch-worker-{i}")
            for i in range(settings.concurrency)
        ]
        services = {
            asyncio.create_task(self._listen_loop(), name="pgdispatch-listen"),
            asyncio.create_task(self._clock_loop(), name="pgdispatch-clock"),
        }
        claimer = asyncio.create_task(self._claim_loop(), name="pgdispatch-claim")
        stopping = asyncio.create_task(self._stopping.wait())
        failure: BaseException | None = None
        try:
            done, _ = await asyncio.wait({stopping, claimer, *services}, return_when=asyncio.FIRST_COMPLETED)
            for task in done - {stopping}:
                if task.exception() is None and self._stopping.is_set():
                    continue  # the claimer saw the stop first
                # Otherwise a task only ends by failing: shut down and report it.
                failure = task.exception() or RuntimeError(f"{task.get_name()} stopped unexpectedly")
                logger.error("%s failed: %r", task.get_name(), failure,
                             extra={"event": "listener_failed", "task": task.get_name()}, exc_info=failure)
                self.stop(f"{task.get_name()} failed")
        finally:
            stopping.cancel()
            await self._shutdown(claimer, services, workers)
            await session.close()
            await self._db.close()
        if failure is not None:
            raise failure
        logger.info("stopped", extra={"event": "listener_stopped"})

    async def _shutdown(self, claimer: asyncio.Task[None], services: set[asyncio.Task[None]],
                        workers: list[asyncio.Task[None]]) -> None:
        started = time.monotonic()
        for task in services:
            task.cancel()
        # A claim in progress is let finish: its runs are handed back below. A claimer that
        # failed was reported by run(): shutting down must still release and record.
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(claimer), CLAIM_STOP_WAIT_S)
        claimer.cancel()
        await asyncio.gather(claimer, *services, return_exceptions=True)

        unstarted = self._held
        while not self._queue.empty():
            run = self._queue.get_nowait()
            if run is not None:
                unstarted.append(run)
        if unstarted:
            self._settled(len(unstarted))
            try:
                released = await self._db.release(unstarted)
            except DatabaseUnavailable as exc:
                logger.warning("could not hand back %d unstarted runs: their leases will expire",
                               len(unstarted),
                               extra={"event": "release_failed", "count": len(unstarted), "reason": str(exc)})
            else:
                logger.info("handed %d unstarted runs back to pending", released,
                            extra={"event": "runs_released", "count": released})

        for _ in workers:
            self._queue.put_nowait(None)
        in_flight = self._in_flight
        if in_flight:
            logger.info("waiting up to %g s for %d in-flight invocations", self.settings.grace_s, in_flight,
                        extra={"event": "draining", "in_flight": in_flight, "grace_s": self.settings.grace_s})
        remaining = max(0.0, self.settings.grace_s - (time.monotonic() - started))
        drained = asyncio.create_task(self._all_done(workers))
        forced = asyncio.create_task(self._forced())
        await asyncio.wait([drained, forced], timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        forced.cancel()
        pending = [task for task in workers if not task.done()]
        cancelled = self._in_flight
        for task in pending:
            task.cancel()
        await drained
        if pending:
            logger.warning("cancelled %d in-flight invocations: they are retried when their lease expires",
                           cancelled, extra={"event": "invocations_cancelled", "count": cancelled})

        # What finished is recorded (a second signal leaves it a second at most).
        remaining = max(1.0, self.settings.grace_s - (time.monotonic() - started))
        await self._completer.flush(1.0 if self._force.is_set() else remaining)
        if self._releasing is not None:
            await asyncio.gather(self._releasing, return_exceptions=True)
        if self._completer.deferred and not self._force.is_set():
            remaining = max(1.0, self.settings.grace_s - (time.monotonic() - started))
            await self._completer.settle(remaining)
        await self._completer.close()

    @staticmethod
    async def _all_done(tasks: list[asyncio.Task[None]]) -> None:
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _forced(self) -> None:
        await self._force.wait()

    # -- workers ---------------------------------------------------------------------------

    async def _worker(self, invoker: Invoker) -> None:
        # Invoke only with the timeout plus a safety margin (at most half of what the lease has
        # beyond the timeout, so a freshly claimed run always qualifies) left of the lease.
        margin_s = self.settings.lease_s - self.settings.timeout_s
        must_start_by = self.settings.timeout_s + min(LEASE_SAFETY_S, margin_s / 2)
        while True:
            run = await self._queue.get()
            if run is None:
                return
            if run.lease_deadline - time.monotonic() < must_start_by:
                self._hand_back(run)
                continue
            self._in_flight += 1
            self.metrics.sent(run.scheduled_for)
            try:
                outcome = await invoker.invoke(run)
            except Exception:  # a bug must not take a worker away
                logger.exception("run %s: unexpected error", run.run_id,
                                 extra={"event": "worker_error", "run_id": run.run_id})
                self._settled(1)
                continue
            finally:
                self._in_flight -= 1
            self._note_duration(outcome.duration_ms / 1000)
            self.metrics.finished(outcome.status, outcome.duration_ms / 1000)
            self._recording += 1
            self._completer.submit(run, outcome)

    def _settled(self, count: int) -> None:
        """`count` claimed runs are off this listener's hands (recorded, deferred or handed back)."""
        self._outstanding -= count
        self._slot_freed.set()

    def _recorded(self, count: int) -> None:
        """The Completer is done with `count` outcomes (written, refused or kept for later)."""
        self._recording -= count
        self._settled(count)

    def _note_duration(self, seconds: float) -> None:
        if len(self._durations) == self._durations.maxlen:
            self._durations_sum -= self._durations[0]
        self._durations.append(seconds)
        self._durations_sum += seconds

    def _capacity(self) -> int:
        """How many claimed runs this listener may hold now (see PREFETCH_FACTOR)."""
        concurrency = self.settings.concurrency
        if not self._durations:
            return concurrency
        mean_s = max(self._durations_sum / len(self._durations), 0.001)
        # A short lease margin over the timeout leaves queued runs less time to wait (see _worker).
        wait_s = min(PREFETCH_WAIT_S, (self.settings.lease_s - self.settings.timeout_s) / 4)
        extra = min((PREFETCH_FACTOR - 1) * concurrency, int(concurrency * wait_s / mean_s))
        return concurrency + max(0, extra)

    def _hand_back(self, run: Run) -> None:
        """Release a queued run that waited too long to be invoked within its lease."""
        self._expiring.append(run)
        if self._releasing is None or self._releasing.done():
            self._releasing = asyncio.create_task(self._release_expiring(), name="pgdispatch-release")

    async def _release_expiring(self) -> None:
        while self._expiring:
            runs, self._expiring = self._expiring, []
            try:
                released = await self._db.release(runs)
            except DatabaseUnavailable as exc:
                released = 0
                reason = str(exc)
            else:
                reason = "queued until too little of its lease was left"
            logger.warning("handed %d of %d queued runs back to pending: too little lease left to invoke",
                           released, len(runs),
                           extra={"event": "runs_released", "count": released, "reason": reason})
            self._settled(len(runs))

    # -- claiming --------------------------------------------------------------------------

    def _room(self) -> tuple[int, int]:
        """(runs that may be claimed now, the smallest batch worth a claim's round trip)."""
        concurrency = self.settings.concurrency
        capacity = self._capacity()
        held = self._outstanding - self._recording  # queued + in flight
        # Outcomes waiting to be recorded do not hold up the next claim, up to a point: the
        # listener never holds more than twice its capacity, so it never claims much faster
        # than it records.
        room = min(capacity - held, 2 * capacity - self._outstanding)
        if capacity > concurrency:
            # Prefetching: at least one concurrency's worth (or all the prefetch allows) at a
            # time; the queue still holds work for the workers meanwhile.
            return room, min(concurrency, capacity - concurrency)
        return room, max(1, int(concurrency * CLAIM_BATCH_SHARE))

    async def _free_slots(self) -> int:
        """Wait until a batch worth claiming is free (see PREFETCH_FACTOR); 0 when stopping."""
        while (room := self._room())[0] < 1 and not self._stopping.is_set():
            self._slot_freed.clear()
            await self._slot_freed.wait()
        if self._capacity() > self.settings.concurrency:
            while (room := self._room())[0] < room[1] and not self._stopping.is_set():
                self._slot_freed.clear()
                await self._slot_freed.wait()
        elif room[0] < room[1] and self._outstanding:
            # Without prefetch, wait a few ms for more slots rather than claim a run at a time.
            deadline = time.monotonic() + CLAIM_BATCH_WAIT_S
            while ((room := self._room())[0] < room[1] and not self._stopping.is_set()
                   and (left := deadline - time.monotonic()) > 0):
                self._slot_freed.clear()
                await _wait(self._slot_freed, left)
        if self._stopping.is_set():
            return 0
        return max(1, self._room()[0])

    async def _claim_loop(self) -> None:
        # Retrying a claim is one cheap attempt on the pool: keep it frequent, so that runs are
        # claimed within about a second of the database coming back.
        backoff = Backoff(max_s=1.0)
        while True:
            await self._wake.wait()
            if self._stopping.is_set():
                return
            self._wake.clear()
            while True:
                free = await self._free_slots()
                if not free:
                    return
                try:
                    runs = await self._db.claim(free)
                except DatabaseUnavailable as exc:
                    delay = backoff.next_delay()
                    logger.warning("claim failed, retrying in %.1f s", delay,
                                   extra={"event": "claim_failed", "reason": str(exc), "retry_in_s": delay})
                    await _wait(self._stopping, delay)
                    self._wake.set()
                    break
                backoff.reset()
                self.metrics.claimed(len(runs))
                if runs and self._stopping.is_set():
                    self._outstanding += len(runs)
                    self._held.extend(runs)  # handed back by the shutdown
                    return
                if runs:
                    self._outstanding += len(runs)
                    for run in runs:
                        self._queue.put_nowait(run)
                    logger.info("claimed %d runs", len(runs),
                                extra={"event": "runs_claimed", "count": len(runs)})
                if len(runs) < free:
                    break

    # -- clock -----------------------------------------------------------------------------

    async def _clock_loop(self) -> None:
        interval = self.settings.sweep_interval_s
        next_sweep = time.monotonic()
        backoff = Backoff(max_s=1.0)  # as the claimer: tick again soon after the database is back
        # The instant the last tick marked up to. Planning from it rather than from now, a slot
        # that comes due between that tick and a re-plan is ticked at once, not skipped.
        covered: datetime | None = None
        while True:
            self._replan.clear()
            if self._sweep_requested:
                self._sweep_requested = False
                next_sweep = time.monotonic()
            try:
                due_in = await self._db.seconds_until_due(covered)
            except DatabaseUnavailable:
                due_in = None  # the sweep retries; the listen task reports the outage
            now = time.monotonic()
            wait = next_sweep - now if due_in is None else min(next_sweep - now, due_in + 0.001)
            if wait > 0 and await _wait(self._replan, wait):
                continue
            sweep = time.monotonic() >= next_sweep
            if sweep:
                self._sweep_requested = False  # this sweep answers any request made before it
            # Ready (READY=1 under systemd) after a sweep that began with LISTEN active: one
            # that began before could have missed a NOTIFY sent before the LISTEN.
            listening = self._listening
            try:
                marked, covered = await self._db.tick()
            except DatabaseUnavailable as exc:
                delay = min(backoff.next_delay(), interval)
                logger.warning("tick failed, retrying in %.1f s", delay,
                               extra={"event": "tick_failed", "reason": str(exc), "retry_in_s": delay})
                next_sweep = time.monotonic() + delay
                continue
            backoff.reset()
            self.metrics.ticked()
            if marked:
                logger.debug("tick marked %d runs", marked,
                             extra={"event": "tick", "marked": marked, "sweep": sweep})
            if marked or sweep:
                self._wake.set()
            if sweep:
                next_sweep = time.monotonic() + interval
                if listening:
                    self.ready.set()

    # -- LISTEN ----------------------------------------------------------------------------

    async def _listen_loop(self) -> None:
        settings = self.settings
        backoff = Backoff()
        lost = False
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    settings.listen_database_url, autocommit=True, application_name=settings.application_name
                )
                async with conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    if lost:
                        self.metrics.reconnected()
                        logger.info("database connection is back", extra={"event": "database_reconnected",
                                                                        "attempts": backoff.failures})
                    lost = False
                    backoff.reset()
                    logger.info("listening on channel %s", CHANNEL,
                                extra={"event": "listening", "channel": CHANNEL})
                    self._listening = True
                    self._request_sweep()
                    async for notify in conn.notifies():
                        if notify.payload == "schedules":
                            self._replan.set()
                        else:
                            self._wake.set()
            except psycopg.OperationalError as exc:
                self._listening = False
                if not lost:
                    logger.warning("lost the LISTEN connection: %s", str(exc).strip(),
                                   extra={"event": "database_connection_lost", "reason": str(exc).strip()})
                lost = True
                delay = backoff.next_delay()
                logger.warning("reconnecting in %.1f s", delay,
                               extra={"event": "database_reconnecting", "attempt": backoff.failures,
                                      "retry_in_s": round(delay, 3), "reason": str(exc).strip()})
                await asyncio.sleep(delay)


def _systemd_status(listener: Listener) -> str:
    worker = listener.settings.worker_id
    in_flight = listener._in_flight
    if listener._stopping.is_set():
        return f"stopping: {in_flight} invocations in flight"
    if not listener._listening:
        return f"worker {worker}: database connection lost, reconnecting; {in_flight} invocations in flight"
    done = listener.metrics.finished_by_status
    return f"listening as {worker}: {in_flight} in flight, {done['ok']} ok, {done['error']} error since start"


async def _tell_systemd(listener: Listener, notifier: Notifier) -> None:
    """READY=1 once LISTEN is active (and a first sweep ran), then STATUS= whenever it changes."""
    notifier.status("starting: connecting to the database")
    await listener.ready.wait()
    last = _systemd_status(listener)
    notifier.ready(last)
    while True:
        await asyncio.sleep(SYSTEMD_STATUS_EVERY_S)
        status = _systemd_status(listener)
        if status != last:
            notifier.status(status)
            last = status


async def run_listener(settings: Settings) -> None:
    """Run a Listener until SIGTERM/SIGINT (twice to cancel what is in flight). Under systemd
    (Type=notify) it says READY=1, STATUS=…, WATCHDOG=1 and STOPPING=1 (dispatcher/systemd.py)."""
    listener = Listener(settings)
    notifier = Notifier()
    metrics_server = None
    if settings.metrics_port is not None:
        metrics_server = MetricsServer(listener.metrics, host=settings.metrics_host,
                                       port=settings.metrics_port)
        await metrics_server.start()
        logger.info("serving metrics on port %s", metrics_server.port,
                    extra={"event": "metrics_serving", "host": settings.metrics_host or "*",
                           "port": metrics_server.port})

    def on_signal(name: str) -> None:
        notifier.stopping(f"stopping ({name}): {listener._in_flight} invocations in flight")
        listener.stop(name)

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signal.Signals(signum).name)
    helpers = [asyncio.create_task(_tell_systemd(listener, notifier), name="pgdispatch-systemd-status"),
               asyncio.create_task(notifier.watchdog(), name="pgdispatch-systemd-watchdog")]
    try:
        await listener.run()
    finally:
        notifier.stopping("stopped")
        for task in helpers:
            task.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        notifier.close()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        if metrics_server is not None:
            await metrics_server.close()
