"""How many runs a listener may claim, and when a claimed run may still be started: pure
arithmetic over a few counters, no I/O.

A listener holds at most `capacity` claimed runs (queued, in flight, or being recorded). The
capacity is the concurrency, raised to up to PREFETCH_FACTOR times it when invocations are fast:
only as many extra as the recent invocations drain in about PREFETCH_WAIT_S, so that a queued
run never waits long for a worker (nothing beyond the concurrency until durations are known).
Outcomes being recorded do not hold up the next claim, up to a point: the listener never holds
more than twice its capacity, so it never claims much faster than it records.

A claim's round trip is worth paying for many runs: when prefetching, claims take at least one
concurrency's worth (or all the prefetch allows); otherwise at least CLAIM_BATCH_SHARE of it.
"""

from __future__ import annotations

import collections
from typing import NamedTuple

__all__ = ["CLAIM_BATCH_SHARE", "DURATION_WINDOW", "LEASE_SAFETY_S", "PREFETCH_FACTOR", "PREFETCH_WAIT_S",
           "ClaimBudget", "Room"]

PREFETCH_FACTOR = 4
PREFETCH_WAIT_S = 1.0
DURATION_WINDOW = 256  # invocation durations the prefetch depth is estimated from
CLAIM_BATCH_SHARE = 0.25
# A queued run is handed back rather than invoked when less than timeout + this (or half the
# lease's margin over the timeout, if smaller) is left of its lease.
LEASE_SAFETY_S = 5.0


class Room(NamedTuple):
    may_claim: int  # runs that may be claimed now (may be 0 or less: none)
    worth_claiming: int  # the smallest batch worth a claim's round trip


class ClaimBudget:
    """The counters of claimed runs and the arithmetic over them."""

    def __init__(self, *, concurrency: int, timeout_s: float, lease_s: float) -> None:
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.lease_s = lease_s
        self.outstanding = 0  # claimed and not yet settled: queued, in flight, being recorded
        self.in_flight = 0  # being invoked
        self.recording = 0  # outcomes the Completer is writing
        self._durations: collections.deque[float] = collections.deque(maxlen=DURATION_WINDOW)
        self._durations_sum = 0.0

    # -- what happens to claimed runs -----------------------------------------------------------

    def claimed(self, count: int) -> None:
        self.outstanding += count

    def started(self) -> None:
        self.in_flight += 1

    def invoked(self, duration_s: float) -> None:
        """An invocation ended; its outcome goes to the Completer."""
        self.in_flight -= 1
        self.recording += 1
        if len(self._durations) == self._durations.maxlen:
            self._durations_sum -= self._durations[0]
        self._durations.append(duration_s)
        self._durations_sum += duration_s

    def abandoned(self) -> None:
        """An invocation ended without an outcome to record (cancelled, or a bug in a worker)."""
        self.in_flight -= 1
        self.outstanding -= 1

    def recorded(self, count: int) -> None:
        """The Completer is done with `count` outcomes (written, refused, or kept for later)."""
        self.recording -= count
        self.outstanding -= count

    def settled(self, count: int) -> None:
        """`count` claimed runs left this listener unstarted (handed back)."""
        self.outstanding -= count

    # -- the arithmetic -------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """How many claimed runs this listener may hold now (see the module's docstring)."""
        if not self._durations:
            return self.concurrency
        mean_s = max(self._durations_sum / len(self._durations), 0.001)
        # A short lease margin over the timeout leaves queued runs less time to wait.
        wait_s = min(PREFETCH_WAIT_S, (self.lease_s - self.timeout_s) / 4)
        extra = min((PREFETCH_FACTOR - 1) * self.concurrency, int(self.concurrency * wait_s / mean_s))
        return self.concurrency + max(0, extra)

    @property
    def prefetching(self) -> bool:
        return self.capacity > self.concurrency

    def room(self) -> Room:
        capacity = self.capacity
        held = self.outstanding - self.recording  # queued + in flight
        may_claim = min(capacity - held, 2 * capacity - self.outstanding)
        if capacity > self.concurrency:
            return Room(may_claim, min(self.concurrency, capacity - self.concurrency))
        return Room(may_claim, max(1, int(self.concurrency * CLAIM_BATCH_SHARE)))

    @property
    def start_margin_s(self) -> float:
        """Lease a queued run must have left to be started: the timeout plus a safety margin (at
        most half of what the lease has beyond the timeout, so a freshly claimed run qualifies)."""
        return self.timeout_s + min(LEASE_SAFETY_S, (self.lease_s - self.timeout_s) / 2)
