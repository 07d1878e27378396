"""Capped exponential backoff with jitter, for reconnecting to the database."""

from __future__ import annotations

import random

__all__ = ["Backoff"]


class Backoff:
    """Delays of initial_s, then factor times more after each failure up to max_s, each randomised by ±jitter.

    The jitter keeps many listeners that lost the same database from reconnecting in step.
    """

    def __init__(self, *, initial_s: float = 0.5, factor: float = 2.0, max_s: float = 30.0,
                 jitter: float = 0.2) -> None:
        self._initial_s = initial_s
        self._factor = factor
        self._max_s = max_s
        self._jitter = jitter
        self._next_s = initial_s
        self.failures = 0

    def next_delay(self) -> float:
        """The delay before the next attempt; each call counts one more failure."""
        delay = self._next_s * random.uniform(1 - self._jitter, 1 + self._jitter)
        self._next_s = min(self._next_s * self._factor, self._max_s)
        self.failures += 1
        return min(delay, self._max_s)

    def reset(self) -> None:
        """After a success: start again from initial_s."""
        self._next_s = self._initial_s
        self.failures = 0
