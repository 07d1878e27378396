"""The listener's Prometheus metrics, and the /metrics endpoint of --metrics-port.

Each Listener has its own registry (so that listeners in one process, as in tests, do not mix).
The endpoint is served by aiohttp on the listener's event loop: a loop too busy to answer a
scrape is itself worth seeing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

__all__ = ["Metrics", "MetricsServer"]

# Slot instant → request sent: milliseconds when the listener's own clock ticks, up to a minute
# when only pg_cron does, more when runs wait for free slots or a listener.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
BATCH_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class Metrics:
    """What the listener counts. Its methods are cheap enough for the hot path."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.dispatch_latency = Histogram(
            "pgdispatch_dispatch_latency_seconds",
            "From the instant a run was due to fire (fire_at: its slot plus the schedule's jitter "
            "offset; the database's clock) to its first attempt's request being sent (this listener's "
            "clock).",
            buckets=LATENCY_BUCKETS, registry=registry)
        self.invocation_duration = Histogram(
            "pgdispatch_invocation_duration_seconds",
            "How long invocations took, response body included.", buckets=DURATION_BUCKETS,
            registry=registry)
        self.outcomes = Counter(
            "pgdispatch_runs", "Invocations by outcome (ok or error).", ["status"], registry=registry)
        # bound once: labels() looks the child up under a lock on every call
        self._outcome_of = {status: self.outcomes.labels(status) for status in ("ok", "error")}
        self.in_flight = Gauge("pgdispatch_in_flight", "Invocations in flight now.", registry=registry)
        self.claim_batch = Histogram(
            "pgdispatch_claim_batch_size", "Runs returned by each dispatch.claim_runs call.",
            buckets=BATCH_BUCKETS, registry=registry)
        self.lost = Counter(
            "pgdispatch_runs_lost",
            "Runs of any listener that ended lost (a lease expired on the last attempt), counted by this "
            "listener since it started: every listener counts them all, so aggregate with max.",
            registry=registry)
        self.slots_skipped = Counter(
            "pgdispatch_slots_skipped",
            "Slots of any schedule that passed with no run, in recorded gaps (audit schedule.slots.skipped),"
            " by reason (overlap, catch-up, misfire, pause, disabled, calendar), counted by this listener"
            " since it started: every listener counts them all, so aggregate with max.",
            ["reason"], registry=registry)
        self.breaker_open = Gauge(
            "pgdispatch_breaker_open",
            "1 while the circuit breaker of a function is open (its runs wait, one probe at a time goes), 0"
            " once it closed, read from dispatch.breaker_states() at each sweep: every listener reports"
            " them all, so aggregate with max.",
            ["project", "function"], registry=registry)
        self._breakers_seen: set[tuple[str, str]] = set()
        self.event_deliveries = Counter(
            "pgdispatch_event_deliveries",
            "Attempts to POST an event to a project's events_url by this listener, by outcome (delivered or"
            " failed: retried with back-off, or given up after dispatch.settings.event_max_attempts).",
            ["outcome"], registry=registry)
        self.reconnects = Counter(
            "pgdispatch_database_reconnects", "Times the LISTEN session came back after losing the database.",
            registry=registry)
        self.last_tick = Gauge(
            "pgdispatch_last_tick_timestamp_seconds",
            "Unix time of the last successful dispatch.tick() call by this listener.", registry=registry)
        self.tick_age = Gauge(
            "pgdispatch_last_tick_age_seconds",
            "Seconds since the last successful dispatch.tick() call by this listener (NaN before the first).",
            registry=registry)
        self._last_tick_mono: float | None = None
        self.finished_by_status: dict[str, int] = {"ok": 0, "error": 0}  # for systemd's STATUS= line
        self.tick_age.set_function(self._tick_age)

    def _tick_age(self) -> float:
        return float("nan") if self._last_tick_mono is None else time.monotonic() - self._last_tick_mono

    def track_in_flight(self, count: Callable[[], int]) -> None:
        """Read the in-flight gauge from the listener at scrape time."""
        self.in_flight.set_function(lambda: float(count()))

    def sent(self, fire_at: datetime) -> None:
        """A run's request is about to go out: how late after the instant it was due to fire."""
        self.dispatch_latency.observe(max(0.0, time.time() - fire_at.timestamp()))

    def finished(self, status: str, duration_s: float) -> None:
        (self._outcome_of.get(status) or self.outcomes.labels(status)).inc()
        self.finished_by_status[status] = self.finished_by_status.get(status, 0) + 1
        self.invocation_duration.observe(duration_s)

    def claimed(self, count: int) -> None:
        self.claim_batch.observe(count)

    def breakers(self, open_now: set[tuple[str, str]]) -> None:
        """The functions whose breaker is open now (project, function): 1 for them, 0 for those seen
        open before."""
        for key in self._breakers_seen | open_now:
            self.breaker_open.labels(*key).set(1 if key in open_now else 0)
        self._breakers_seen |= open_now

    def event_delivered(self, outcome: str) -> None:
        self.event_deliveries.labels(outcome).inc()

    def reconnected(self) -> None:
        self.reconnects.inc()

    def ticked(self) -> None:
        self._last_tick_mono = time.monotonic()
        self.last_tick.set(time.time())

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class MetricsServer:
    """GET /metrics (and /) on HOST:PORT, in the running event loop."""

    def __init__(self, metrics: Metrics, *, host: str | None, port: int) -> None:
        self._metrics = metrics
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None
        self.port: int | None = None  # the bound port (useful with port 0)

    async def _handle(self, request: web.Request) -> web.Response:
        return web.Response(body=self._metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._handle)
        app.router.add_get("/", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, self._host, self._port).start()
        self.port = self._runner.addresses[0][1]

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
