"""The listener's clock: tick when a slot comes due, claim when a waiting run may start, and sweep
every interval whatever happened.

It sleeps until the earliest next_run_at after the instant its last tick covered
(dispatch.next_slot_after, by the database's clock) and calls dispatch.tick() then, after
marking in chunks (dispatch.tick_chunk, FIRST_CHUNK runs, then CHUNK_GROWTH times as many each time): with
100,000 schedules due at one instant, claiming starts once the first chunk is committed rather
than after one statement of a few seconds. The chunks go on while each takes as many due
schedules as it may; the
unlimited tick that ends them marks whatever they left (the run policies' cases, rows another
tick held) and is what the instant covered is taken from. Planning
from the instant covered rather than from now, a slot that comes due between a tick and a
re-plan is ticked at once, not skipped. It ticks at least every sweep interval, a slot's tick
counting as the sweep's (where slots come every few seconds, a sweep of its own would scan every
due schedule once more in between), and the claimer claims after every tick, whether or not
anything was marked (a NOTIFY may have been lost). A failed tick is retried after
a back-off with a floor, never in a loop, and said once rather than at every retry.

A run marked earlier that waits for its instant (a jittered slot's fire_at, a retry's back-off:
dispatch.next_start_after) needs a claim then, not a tick: the clock wakes the claimer, at most
once per START_SPACING_S, since jitter spreads a minute's runs over thousands of instants.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import datetime

from dispatcher.backoff import Backoff
from dispatcher.database import Database, DatabaseUnavailable

__all__ = ["FIRST_CHUNK", "REPLAN_AFTER_S", "START_SPACING_S", "Clock"]

logger = logging.getLogger(__name__)

# A completion that advances a schedule may move the earliest next_run_at: re-read it at most
# this often rather than once per completion.
REPLAN_AFTER_S = 0.05
# While ticks keep failing, say so again at most this often.
REPEAT_WARNING_S = 30.0
# Marking in chunks: the first is claimed within tens of milliseconds. Each chunk scans past what
# the earlier ones marked (those schedules stay due until their runs finish), so chunks grow
# fourfold: 100,000 due take 4 chunks, and the listener is still busy with one when the next
# is committed.
FIRST_CHUNK = 2_000
CHUNK_GROWTH = 4
MAX_CHUNK = 64_000
# Waiting runs whose instants are this close together start with one claim.
START_SPACING_S = 0.05


async def _wait(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait for `event` at most timeout_s; True if it was set."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True


class Clock:
    """Calls dispatch.tick() on time. `on_tick(marked, sweep, listened)` follows every successful
    tick: how many runs it marked, whether it was a sweep (the first, the first after
    request_sweep(), then any tick half an interval or more after the last sweep: one at least
    every one and a half intervals), and whether LISTEN was active when it began (a sweep that
    began before could have missed a NOTIFY sent before the LISTEN).
    `on_marked(marked)` follows every chunk that marked runs: the claimer may start on them, but
    a chunk is no tick (it expires no lease), so only on_tick says that ticks succeed.
    `on_start()`: a waiting run's instant came, the claimer may take it."""

    def __init__(self, db: Database, *, sweep_interval_s: float, listening: Callable[[], bool],
                 on_tick: Callable[[int, bool, bool], None],
                 on_marked: Callable[[int], None] = lambda marked: None,
                 on_start: Callable[[], None] = lambda: None) -> None:
        self._db = db
        self._interval_s = sweep_interval_s
        self._listening = listening
        self._on_tick = on_tick
        self._on_marked = on_marked
        self._on_start = on_start
        self._replan = asyncio.Event()
        self._sweep_requested = True
        self._replan_scheduled = False

    def replan(self) -> None:
        """Re-read when the next slot is due (a definition changed)."""
        self._replan.set()

    def replan_soon(self) -> None:
        """replan(), at most once per REPLAN_AFTER_S (completions advance schedules in bursts)."""
        if not self._replan_scheduled:
            self._replan_scheduled = True
            asyncio.get_running_loop().call_later(REPLAN_AFTER_S, self._replan_now)

    def _replan_now(self) -> None:
        self._replan_scheduled = False
        self._replan.set()

    def request_sweep(self) -> None:
        """Sweep now (after a reconnect: a NOTIFY sent meanwhile is gone)."""
        self._sweep_requested = True
        self._replan.set()

    async def run(self) -> None:
        next_sweep = time.monotonic()
        swept = float("-inf")  # time.monotonic() when the last sweep began
        not_before = 0.0  # after a failed tick: no tick before this, whatever is due
        backoff = Backoff(max_s=1.0)  # tick again soon after the database is back
        failing_since: float | None = None
        warned_at = 0.0
        # The instant the last tick marked up to (see the module's docstring).
        covered: datetime | None = None
        # The latest waiting run's instant the claimer was woken for, and when (time.monotonic()).
        started: datetime | None = None
        started_mono = 0.0
        while True:
            self._replan.clear()
            if self._sweep_requested:
                self._sweep_requested = False
                next_sweep = time.monotonic()
            try:
                # a tick notifies the claimers of the runs it found waiting: what it covered is served
                wake = await self._db.next_wake(covered, max((t for t in (covered, started) if t is not None),
                                                             default=None))
            except DatabaseUnavailable:
                wake = None  # the sweep retries; the LISTEN session reports the outage
            now = time.monotonic()
            tick_at = None if wake is None or wake.tick_in_s is None else now + wake.tick_in_s
            start_at = None if wake is None or wake.start_in_s is None else max(
                now + wake.start_in_s, started_mono + START_SPACING_S)
            wait = min(t for t in (next_sweep, tick_at, start_at) if t is not None) - now + 0.001
            wait = max(wait, not_before - now)
            if wait > 0 and await _wait(self._replan, wait):
                continue
            now = time.monotonic()
            if wake is not None and now < next_sweep and (tick_at is None or now < tick_at):
                # only a waiting run's instant: a claim takes it
                started, started_mono = wake.start_at, now
                self._on_start()
                continue
            began = time.monotonic()
            sweep = began >= next_sweep or began - swept >= self._interval_s / 2
            if sweep:
                self._sweep_requested = False  # this sweep answers any request made before it
            listened = self._listening()
            try:
                marked, covered = await self._tick()
            except DatabaseUnavailable as exc:
                delay = min(backoff.next_delay(), self._interval_s)
                not_before = time.monotonic() + delay
                next_sweep = max(next_sweep, not_before)
                if failing_since is None or time.monotonic() - warned_at >= REPEAT_WARNING_S:
                    failing_since = failing_since or time.monotonic()
                    warned_at = time.monotonic()
                    logger.warning("tick failed, retrying every %.1f s or less", delay,
                                   extra={"event": "tick_failed", "reason": str(exc),
                                          "retry_in_s": round(delay, 3),
                                          "failing_for_s": round(time.monotonic() - failing_since, 1)})
                continue
            if failing_since is not None:
                failed_for_s = round(time.monotonic() - failing_since, 1)
                logger.info("ticking again after %.1f s", failed_for_s,
                            extra={"event": "tick_resumed", "failed_for_s": failed_for_s})
                failing_since = None
            backoff.reset()
            not_before = 0.0
            if sweep:
                swept = began
            next_sweep = time.monotonic() + self._interval_s  # whatever woke it, it was a tick
            self._on_tick(marked, sweep, listened)

    async def _tick(self) -> tuple[int, datetime]:
        """Chunks while they come back full, then dispatch.tick(); each chunk that marked is
        reported at once (the claimer starts on it), the tick's count with the final call."""
        chunk = FIRST_CHUNK
        while True:
            # "taken", not "marked": a chunk can take schedules that a concurrent tick marked
            # after this one's snapshot, and comes back short of runs although more are due.
            marked, taken = await self._db.tick_chunk(chunk)
            if marked:
                self._on_marked(marked)
            if taken < chunk:
                return await self._db.tick()
            chunk = min(CHUNK_GROWTH * chunk, MAX_CHUNK)
