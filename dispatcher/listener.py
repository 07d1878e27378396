"""The listener: one process's worth of dispatching, and its life from start to exit.

Its parts, each a module: the LISTEN session (dispatcher.notifications), the clock
(dispatcher.clock), the claimer, workers and releaser (dispatcher.dispatching) within the claim
budget (dispatcher.budget), and the Completer (dispatcher.completion). Every task is owned by
a Supervisor (dispatcher.supervisor): one that fails stops the listener, which then exits 1.

Start: the database is waited for while it is down or unreachable; a configuration error it
reveals (authentication, no such database or role, the dispatch schema missing or too old)
stops the listener at once with DatabaseMisconfigured (exit 2). READY once LISTEN is active
and a first sweep has run since.

Shutdown (uvicorn-style: signal handlers only set events). The first SIGTERM/SIGINT: stop
claiming (a claim in progress is let finish), hand every claimed run not started back to
pending, let in-flight invocations finish within the grace period, record their outcomes, log
any outcome that could not be written as abandoned, close the sessions. A second signal cuts
this short: in-flight invocations are cancelled (their leases expire and they are retried with
the same request id), what can be handed back and recorded within a second or two is, and the
listener exits.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from dispatcher import __version__
from dispatcher.backoff import Backoff
from dispatcher.budget import ClaimBudget
from dispatcher.clock import Clock
from dispatcher.completion import Completer
from dispatcher.config import Settings
from dispatcher.database import Database, DatabaseMisconfigured, DatabaseUnavailable
from dispatcher.dispatching import Dispatcher
from dispatcher.event_delivery import EventDelivery
from dispatcher.event_loop import running_loop_name
from dispatcher.invoke import Invoker, new_session
from dispatcher.metrics import Metrics, MetricsServer
from dispatcher.notifications import RECONNECT_BACKOFF, Notifications
from dispatcher.span_export import InvocationSpans
from dispatcher.supervisor import Supervisor, TaskFailed
from dispatcher.systemd import Notifier

__all__ = ["Listener", "ListenerStatus", "run_listener"]

logger = logging.getLogger(__name__)

# How long the shutdown waits for the spans still queued to reach the collector.
SPAN_FLUSH_S = 5.0
# How long shutdown waits for a claim in progress before cancelling it.
CLAIM_STOP_WAIT_S = 5.0
# After a second signal: how long handing back and recording still get.
FORCED_WAIT_S = 1.0
# How often the systemd STATUS= line is refreshed (when it changed).
SYSTEMD_STATUS_EVERY_S = 5.0
# While the database is waited for at start: systemd's start timeout is extended by
# START_EXTEND_S every START_EXTEND_EVERY_S (always ahead of it, with room for a late loop).
START_EXTEND_S = 30.0
START_EXTEND_EVERY_S = 10.0


@dataclass(frozen=True, slots=True)
class ListenerStatus:
    state: str  # starting, running, stopping, stopped or failed
    healthy: bool  # no task failed
    listening: bool  # the LISTEN session is up
    in_flight: int  # invocations under way
    claimed: int  # runs claimed and not yet settled (queued, in flight, being recorded)
    deferred: int  # outcomes kept for a retry
    failed_task: str | None


async def _first(*events: asyncio.Event, task: asyncio.Task[Any] | None = None, timeout_s: float) -> None:
    """Wait until any of `events` is set (or `task` is done), at most timeout_s."""
    waiters = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait([*waiters, *([task] if task else [])], timeout=max(0.0, timeout_s),
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


class Listener:
    """`await run()` until `stop()` is called (or a task fails: TaskFailed)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.ready = asyncio.Event()  # LISTEN is active and a sweep has run since
        self.waiting_for_database = asyncio.Event()  # a first attempt at start failed
        self.metrics = Metrics()
        self._lost_seen: int | None = None  # the audit row of the last lost run counted
        self._skipped_seen: int | None = None  # and of the last gap of skipped slots
        self._counting_lost = False
        self._stopping = asyncio.Event()
        self._force = asyncio.Event()
        self._stopped = False
        self._supervisor = Supervisor(on_failure=self._task_failed)
        self._budget = ClaimBudget(concurrency=settings.concurrency, timeout_s=settings.timeout_s,
                                   lease_s=settings.lease_s)
        self._db = Database(settings.database_url, application_name=settings.application_name,
                            worker_id=settings.worker_id, pool_size=settings.pool_size,
                            on_success=self._database_answered)
        self._clock = Clock(self._db, sweep_interval_s=settings.sweep_interval_s,
                            listening=lambda: self._notifications.listening, on_tick=self._ticked,
                            on_marked=self._marked, on_start=self._start_due)
        self._events = EventDelivery(self._db, self.metrics, secret=settings.signing_secret,
                                     second_secret=settings.second_signing_secret)
        self._notifications = Notifications(
            settings.listen_database_url, application_name=settings.application_name,
            on_notify=self._notified, on_connected=self._clock.request_sweep,
            on_reconnected=self._reconnected, on_event=self._events.wake)
        self._completer = Completer(self._db, on_advanced=self._clock.replan_soon, on_done=self._recorded,
                                    gather=max(1, settings.concurrency // 4))
        # (raises ConfigError when the extra is not installed)
        self._spans = InvocationSpans(settings.worker_id) if settings.span_export == "otlp" else None
        self._dispatcher: Dispatcher | None = None
        self.metrics.track_in_flight(lambda: self._budget.in_flight)

    # -- control ---------------------------------------------------------------------------

    def stop(self, reason: str = "stop requested") -> None:
        """First call: graceful shutdown. Second call: cut it short."""
        if not self._stopping.is_set():
            logger.info("shutting down (%s)", reason,
                        extra={"event": "shutdown_requested", "reason": reason,
                               "grace_s": self.settings.grace_s})
            self._supervisor.stopping()
            self._stopping.set()
            if self._dispatcher is not None:  # whatever waits for work wakes up and sees it
                self._dispatcher.wake()
                self._dispatcher.slot_freed()
        elif not self._force.is_set():
            logger.warning("shutting down now (%s): cancelling in-flight invocations", reason,
                           extra={"event": "shutdown_forced", "reason": reason})
            self._force.set()

    def _task_failed(self, failure: TaskFailed) -> None:
        # A shutdown under way goes on as it was asked for: a failure during a graceful drain
        # is no second signal (the listener still exits 1).
        if not self._stopping.is_set():
            self.stop(f"{failure.task} failed")

    def status(self) -> ListenerStatus:
        failure = self._supervisor.failure
        if failure is not None:
            state = "failed"
        elif self._stopped:
            state = "stopped"
        elif self._stopping.is_set():
            state = "stopping"
        else:
            state = "running" if self.ready.is_set() else "starting"
        return ListenerStatus(state=state, healthy=failure is None, listening=self._notifications.listening,
                              in_flight=self._budget.in_flight, claimed=self._budget.outstanding,
                              deferred=self._completer.deferred,
                              failed_task=failure.task if failure else None)

    # -- callbacks of the parts ------------------------------------------------------------------

    def _notified(self, payload: str) -> None:
        if payload == "schedules":
            self._clock.replan()
        elif self._dispatcher is not None:
            self._dispatcher.wake()

    def _marked(self, marked: int) -> None:
        """A chunk of a tick marked runs: claim them now, before the tick is over."""
        if self._dispatcher is not None:
            self._dispatcher.wake()

    def _start_due(self) -> None:
        """A run that waited for its instant (jitter, a retry's back-off) may start: claim it."""
        if self._dispatcher is not None:
            self._dispatcher.wake()

    def _ticked(self, marked: int, sweep: bool, listened: bool) -> None:
        self.metrics.ticked()  # only a whole tick, the one that expires leases, counts
        if marked:
            logger.debug("tick marked %d run%s", marked, "" if marked == 1 else "s",
                         extra={"event": "tick", "marked": marked, "sweep": sweep})
        if self._dispatcher is not None:
            self._dispatcher.wake()  # marked or not: what a lost NOTIFY announced is claimed
        if sweep and listened:
            self.ready.set()
        if sweep:
            self._supervisor.spawn(self._count_audited(), "pgdispatch-lost-runs", until_stopped=False)

    async def _count_audited(self) -> None:
        """pgdispatch_runs_lost_total and pgdispatch_slots_skipped_total: the runs that ended lost
        and the slots recorded as skipped since the last sweep (the first sweep only learns where to
        start). One count at a time: two that overlapped would both read from the same audit row
        and count the same rows twice; a sweep that finds one under way leaves it to the next."""
        if self._counting_lost:
            return
        self._counting_lost = True
        try:
            lost, lost_id = await self._db.lost_runs_after(self._lost_seen)
            skipped, skipped_id = await self._db.skipped_slots_after(self._skipped_seen)
            open_breakers = await self._db.open_breakers()
        except DatabaseUnavailable:
            return  # the next sweep looks again; the outage is reported elsewhere
        finally:
            self._counting_lost = False
        if self._lost_seen is not None and lost:
            self.metrics.lost.inc(lost)
        if self._skipped_seen is not None:
            for reason, slots in skipped.items():
                if slots:
                    self.metrics.slots_skipped.labels(reason).inc(slots)
        self._lost_seen, self._skipped_seen = lost_id, skipped_id
        self.metrics.breakers(open_breakers)

    def _recorded(self, count: int) -> None:
        self._budget.recorded(count)
        if self._dispatcher is not None:
            self._dispatcher.slot_freed()
            self._dispatcher.outcome_recorded()

    def _database_answered(self) -> None:
        self._completer.database_is_back()

    def _reconnected(self) -> None:
        """The LISTEN session is back after an outage: so is the database, for the pool too."""
        self.metrics.reconnected()
        self._supervisor.spawn(self._db.reopen_if_failing(), "pgdispatch-pool-reopen", until_stopped=False)

    # -- life --------------------------------------------------------------------------------

    async def _wait_for_database(self) -> bool:
        """Until the database answers with the schema this listener needs; False if stopped first.
        Raises DatabaseMisconfigured when waiting will not help."""
        backoff = Backoff(**RECONNECT_BACKOFF)
        while not self._stopping.is_set():
            try:
                await self._db.verify()
            except DatabaseUnavailable as exc:
                self.waiting_for_database.set()
                delay = backoff.next_delay()
                logger.warning("database unavailable, retrying in %.1f s", delay,
                               extra={"event": "database_reconnecting", "attempt": backoff.failures,
                                      "retry_in_s": round(delay, 3), "reason": str(exc)})
                await _first(self._stopping, timeout_s=delay)
            else:
                return True
        return False

    async def run(self) -> None:
        settings = self.settings
        spawn = self._supervisor.spawn
        # A stop asked for while the check was under way (it can wait: a migration's lock, a slow
        # path) ends it here, before anything starts: none of the tasks would be woken by it, and
        # the shutdown would wait out CLAIM_STOP_WAIT_S for the claimer.
        if not await self._wait_for_database() or self._stopping.is_set():
            self._stopped = True
            return
        session = new_session(concurrency=settings.concurrency)
        invoker = Invoker(session, url_template=settings.invoke_url, timeout_s=settings.timeout_s,
                          secret=settings.signing_secret, second_secret=settings.second_signing_secret)
        dispatcher = self._dispatcher = Dispatcher(
            self._db, invoker, self._completer, self._budget, self.metrics, lease_s=settings.lease_s,
            stopping=self._stopping, spans=self._spans)
        try:
            await self._db.open()
            logger.info("pgdispatch %s listening as %s", __version__, settings.worker_id,
                        extra={"event": "listener_started", "version": __version__, **settings.describe(),
                               "event_loop": running_loop_name()})
            spawn(self._completer.run(), "pgdispatch-completion-writer")
            spawn(self._completer.retry(), "pgdispatch-completion-retry")
            spawn(dispatcher.releaser(), "pgdispatch-release")
            spawn(self._db.heal(), "pgdispatch-pool-heal")
            for i in range(settings.concurrency):
                spawn(dispatcher.worker(), f"pgdispatch-worker-{i}")
            claimer = spawn(dispatcher.claim_loop(), "pgdispatch-claim")
            services = [spawn(self._notifications.run(), "pgdispatch-listen"),
                        spawn(self._clock.run(), "pgdispatch-clock"),
                        spawn(self._events.run(), "pgdispatch-events")]
            await self._stopping.wait()
            await self._shutdown(dispatcher, claimer, services)
        finally:
            await self._supervisor.cancel()
            await session.close()
            await self._db.close()
            if self._spans is not None:  # what is queued goes to the collector, within a bound
                await self._spans.close(SPAN_FLUSH_S)
            self._stopped = True
        failure = self._supervisor.failure
        if failure is not None:
            if isinstance(failure.error, DatabaseMisconfigured) and not self._notifications.ever_listened:
                raise failure.error  # the database never accepted it: a configuration error (exit 2)
            raise failure
        logger.info("stopped", extra={"event": "listener_stopped"})

    async def _shutdown(self, dispatcher: Dispatcher, claimer: asyncio.Task[Any],
                        services: list[asyncio.Task[Any]]) -> None:
        settings, force = self.settings, self._force
        started = time.monotonic()

        def left() -> float:
            if force.is_set():
                return FORCED_WAIT_S
            return max(FORCED_WAIT_S, settings.grace_s - (time.monotonic() - started))

        async def step(name: str, call: Coroutine[Any, Any, Any]) -> None:
            """Await `call` (which logs its own failures) while the grace period lasts; a second
            signal cuts it to FORCED_WAIT_S from then, even in the middle of the step."""
            task = asyncio.ensure_future(call)
            step_started = time.monotonic()
            await _first(force, task=task, timeout_s=left())
            if not task.done() and force.is_set():
                await asyncio.wait([task], timeout=FORCED_WAIT_S)
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                waited_s = round(time.monotonic() - step_started, 1)
                logger.warning("gave up %s after %.1f s", name, waited_s,
                               extra={"event": "shutdown_step_timed_out", "step": name,
                                      "timeout_s": waited_s})

        await self._supervisor.cancel(services)
        # A claim in progress is let finish: what it returns is handed back below.
        await _first(force, task=claimer, timeout_s=CLAIM_STOP_WAIT_S)
        await self._supervisor.cancel([claimer, *self._supervisor.running("pgdispatch-release")])
        unstarted = dispatcher.take_unstarted()
        if unstarted:
            await step("handing back", dispatcher.release(unstarted, reason="the listener is stopping"))

        in_flight = self._budget.in_flight
        if in_flight:
            logger.info("waiting up to %g s for %d in-flight invocations", settings.grace_s, in_flight,
                        extra={"event": "draining", "in_flight": in_flight, "grace_s": settings.grace_s})
            while (self._budget.in_flight and not force.is_set()
                   and time.monotonic() - started < settings.grace_s):
                dispatcher.invocation_ended.clear()
                await _first(force, dispatcher.invocation_ended,
                             timeout_s=settings.grace_s - (time.monotonic() - started))
        cancelled = self._budget.in_flight
        await self._supervisor.cancel(self._supervisor.running("pgdispatch-worker-"))
        if cancelled:
            logger.warning("cancelled %d in-flight invocations: they are retried when their lease expires",
                           cancelled, extra={"event": "invocations_cancelled", "count": cancelled})
        late = dispatcher.take_unstarted()  # taken by a worker after the release above, or put
        if late:                              # back by a release that was cut short
            await step("handing back", dispatcher.release(late, reason="the listener is stopping"))
        unreleased = dispatcher.take_unstarted()  # cut short again: said, run by run
        if unreleased:
            dispatcher.name_unreleased(unreleased, "the listener stopped before they could be handed back")

        # What finished is recorded (if the parts that record are alive); what cannot be is
        # said, run by run.
        if self._supervisor.running("pgdispatch-completion-writer"):
            await step("recording", self._completer.flush(settings.grace_s))
        if self._completer.deferred and self._supervisor.running("pgdispatch-completion-retry"):
            logger.info("waiting up to %.1f s for %d kept outcomes to be recorded", left(),
                        self._completer.deferred,
                        extra={"event": "settling", "deferred": self._completer.deferred,
                               "timeout_s": round(left(), 1)})
            await step("settling", self._completer.settle(settings.grace_s))
        await self._supervisor.cancel(self._supervisor.running("pgdispatch-completion"))
        self._completer.abandon_all("the listener stopped before the outcome could be recorded")


def _systemd_status(listener: Listener) -> str:
    worker = listener.settings.worker_id
    status = listener.status()
    if status.state == "failed":
        return f"failed: {status.failed_task}"
    if status.state in ("stopping", "stopped"):
        return f"stopping: {status.in_flight} invocations in flight"
    if not status.listening:
        return (f"worker {worker}: database connection lost, reconnecting; "
                f"{status.in_flight} invocations in flight")
    done = listener.metrics.finished_by_status
    waiting = f", {status.deferred} outcomes waiting for the database" if status.deferred else ""
    return (f"listening as {worker}: {status.in_flight} in flight, {done['ok']} ok, {done['error']} error"
            f" since start{waiting}")


async def _tell_systemd(listener: Listener, notifier: Notifier) -> None:
    """READY=1 once LISTEN is active (and a first sweep ran), then STATUS= whenever it changes."""
    notifier.status("starting: connecting to the database")
    await _first(listener.ready, listener.waiting_for_database, timeout_s=float("inf"))
    # READY=1 waits for the database, however long it is down; systemd's start timeout is there
    # for a listener that hangs, so it is extended for as long as the listener is waiting.
    while not listener.ready.is_set():
        notifier.extend_timeout(START_EXTEND_S, "starting: waiting for the database")
        await _first(listener.ready, timeout_s=START_EXTEND_EVERY_S)
    last = _systemd_status(listener)
    notifier.ready(last)
    while True:
        await asyncio.sleep(SYSTEMD_STATUS_EVERY_S)
        status = _systemd_status(listener)
        if status != last:
            notifier.status(status)
            last = status


async def run_listener(settings: Settings) -> None:
    """Run a Listener until SIGTERM/SIGINT (twice to cut the shutdown short). Under systemd
    (Type=notify) it says READY=1, STATUS=…, WATCHDOG=1 (while every task is healthy and the event
    loop keeps time) and STOPPING=1 (dispatcher/systemd.py). Raises DatabaseMisconfigured when the
    database refuses it at start, TaskFailed when a task failed."""
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
        notifier.stopping(f"stopping ({name}): {listener.status().in_flight} invocations in flight")
        listener.stop(name)

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signal.Signals(signum).name)
    helpers = [asyncio.create_task(_tell_systemd(listener, notifier), name="pgdispatch-systemd-status"),
               asyncio.create_task(notifier.watchdog(lambda: listener.status().healthy),
                                   name="pgdispatch-systemd-watchdog")]
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
