"""The claim budget's arithmetic, alone: how many runs a listener may hold and claim, and how
much lease a queued run needs left to be started."""

from __future__ import annotations

import pytest

from dispatcher.budget import PREFETCH_FACTOR, ClaimBudget, Room


def budget(concurrency: int = 10, timeout_s: float = 30.0, lease_s: float = 60.0,
           *durations: float) -> ClaimBudget:
    b = ClaimBudget(concurrency=concurrency, timeout_s=timeout_s, lease_s=lease_s)
    for seconds in durations:
        b.claimed(1)
        b.started()
        b.invoked(seconds)
        b.recorded(1)
    return b


def test_without_durations_it_holds_the_concurrency_and_claims_a_quarter_at_least() -> None:
    b = budget(10)
    assert (b.capacity, b.prefetching) == (10, False)
    assert b.room() == Room(10, 2)
    assert budget(3).room() == Room(3, 1)


@pytest.mark.parametrize(("mean_s", "capacity"), [
    (0.001, 10 * PREFETCH_FACTOR),  # fast: the cap
    (0.1, 10 + 30),  # 10 workers drain 100 a second: all the prefetch allows (30)
    (0.5, 10 + 20),  # 20 drained in about a second
    (20.0, 10),  # slow: nothing beyond the concurrency
])
def test_capacity_follows_how_fast_invocations_drain(mean_s: float, capacity: int) -> None:
    b = budget(10, 30.0, 60.0, *[mean_s] * 5)
    assert b.capacity == capacity
    assert b.prefetching is (capacity > 10)


def test_a_short_lease_margin_shortens_the_prefetch() -> None:
    # lease - timeout = 2 s: a queued run may wait half a second at most, so 10 workers taking
    # 0.5 s each prefetch 10, not 20.
    assert budget(10, 30.0, 32.0, *[0.5] * 5).capacity == 20


def test_room_counts_what_is_held_and_never_exceeds_twice_the_capacity() -> None:
    b = budget(10)
    b.claimed(8)
    assert b.room() == Room(2, 2)
    for _ in range(8):
        b.started()
        b.invoked(20.0)  # slow: capacity stays at the concurrency
    assert (b.in_flight, b.recording, b.outstanding) == (0, 8, 8)
    assert b.room().may_claim == 10  # outcomes being recorded do not hold up the next claim...
    b.claimed(10)
    for _ in range(10):
        b.started()
        b.invoked(20.0)
    assert b.room().may_claim == 2 * 10 - 18  # ...up to twice the capacity held in all
    b.recorded(18)
    assert b.room().may_claim == 10


def test_prefetching_claims_at_least_a_concurrency_worth() -> None:
    b = budget(10, 30.0, 60.0, *[0.001] * 5)
    assert b.room() == Room(40, 10)


def test_settling_and_abandoning_give_the_room_back() -> None:
    b = budget(4)
    b.claimed(4)
    b.started()
    b.abandoned()  # cancelled, or a bug in a worker: nothing to record
    b.settled(3)  # handed back
    assert (b.outstanding, b.in_flight, b.room().may_claim) == (0, 0, 4)


@pytest.mark.parametrize(("timeout_s", "lease_s", "margin_s"), [(30.0, 60.0, 35.0), (30.0, 32.0, 31.0),
                                                                 (5.0, 6.0, 5.5)])
def test_a_queued_run_is_started_only_with_the_timeout_and_a_margin_left(
    timeout_s: float, lease_s: float, margin_s: float
) -> None:
    assert budget(1, timeout_s, lease_s).start_margin_s == margin_s
