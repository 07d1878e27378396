"""Calendars against a brute-force reference: random exclusions (periods and weekly rules, their
boundaries often on the wall-clock times that daylight saving time skips or repeats) in the
zones of the cron oracle, walked minute by minute over three years.

The reference reads the documented rule without the SQL's arithmetic: a boundary's wall-clock
time W becomes the first minute at which the zone's clock has shown W or later. So a time
skipped by a spring-forward is the instant of the jump and a repeated one its first occurrence,
the fixed-time rule of cron expressions (docs/schedules.md). Checked: every period
dispatch.calendar_periods lists, dispatch.calendar_excludes at every boundary and around it,
and the slot the tick goes on to (the first slot of a rule at or after an excluded one that no
period holds) for each slot of a rule over the three years.
"""

from __future__ import annotations

import bisect
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .test_cron_oracle import ZONES, transitions

MINUTE = timedelta(minutes=1)
YEARS = 3


@dataclass(frozen=True)
class Period:
    starts: datetime  # wall-clock, naive
    ends: datetime


@dataclass(frozen=True)
class Weekly:
    days: tuple[int, ...]
    from_time: time
    until_minutes: int  # minutes after midnight, up to 24 * 60


Exclusion = Period | Weekly


def _walls_near_transitions(zone: str, first: datetime, last: datetime) -> list[datetime]:
    """Wall-clock minutes just before, on and after each offset change of the zone in the range."""
    z = ZoneInfo(zone)
    walls = []
    for jump in transitions(zone):
        if first <= jump <= last:
            for side in (jump - MINUTE, jump):
                wall = side.astimezone(z).replace(tzinfo=None)
                walls += [wall - timedelta(minutes=30), wall, wall + MINUTE, wall + timedelta(minutes=30)]
    return walls


@st.composite
def calendars(draw: st.DrawFn) -> tuple[str, int, list[Exclusion], str]:
    zone = draw(st.sampled_from(ZONES))
    year = draw(st.integers(2001, 2036))
    first = datetime(year, 1, 1, tzinfo=UTC)
    near = _walls_near_transitions(zone, first, first.replace(year=year + YEARS))
    minute_of = st.integers(0, YEARS * 365 * 24 * 60)
    some_wall = (st.sampled_from(near) if near else st.nothing()) | minute_of.map(
        lambda m: datetime(year, 1, 1) + m * MINUTE)
    exclusions: list[Exclusion] = []
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            start = draw(some_wall)
            length = draw(st.sampled_from([MINUTE, 30 * MINUTE, timedelta(hours=1), timedelta(days=1)])
                          | st.integers(1, 14 * 24 * 60).map(lambda m: m * MINUTE))
            exclusions.append(Period(start, start + length))
        else:
            days = tuple(sorted(draw(st.sets(st.integers(1, 7), min_size=1, max_size=3))))
            edges = [0, 60, 90, 120, 150, 180, 24 * 60, *range(0, 24 * 60, 15)]
            ends = st.sampled_from(edges) | st.integers(0, 24 * 60)
            a, b = sorted(draw(st.lists(ends, min_size=2, max_size=2, unique=True)))
            exclusions.append(Weekly(days, time(a // 60, a % 60), b))
    rule = draw(st.sampled_from(["*/15 * * * *", "0 * * * *", "30 2 * * *", "0 3 * * 0", "45 1 * * *"]))
    return zone, year, exclusions, rule


def _reference_instants(walls: Sequence[datetime], zone: str) -> dict[datetime, datetime]:
    """Each wall-clock time as the first minute at which the zone's clock has shown it or later:
    a walk over every minute from a day before the first, in whole minutes since the epoch."""
    z = ZoneInfo(zone)
    pending = sorted({int((w - datetime(1970, 1, 1)).total_seconds()) // 60 for w in walls})
    found: dict[int, int] = {}
    shown = -(10**12)
    k = 0
    q = (pending[0] - 36 * 60) // 15 if pending else 0
    while k < len(pending):
        # these zones change their offset on a quarter hour: read it once for each
        offset = datetime.fromtimestamp(q * 15 * 60, UTC).astimezone(z).utcoffset()
        assert offset is not None
        off = int(offset.total_seconds()) // 60
        for t in range(q * 15, q * 15 + 15):
            shown = max(shown, t + off)
            while k < len(pending) and pending[k] <= shown:
                found[pending[k]] = t
                k += 1
        q += 1
    return {datetime(1970, 1, 1) + w * MINUTE: datetime.fromtimestamp(i * 60, UTC) for w, i in found.items()}


def _reference_periods(exclusions: list[Exclusion], zone: str, lo: datetime,
                       hi: datetime) -> list[tuple[datetime, datetime, int]]:
    walls: list[tuple[datetime, datetime, int]] = []
    first_day = (lo - timedelta(days=2)).astimezone(ZoneInfo(zone)).date()
    last_day = (hi + timedelta(days=2)).astimezone(ZoneInfo(zone)).date()
    for k, e in enumerate(exclusions):
        if isinstance(e, Period):
            walls.append((e.starts, e.ends, k))
            continue
        d = first_day
        while d <= last_day:
            if d.isoweekday() in e.days:
                midnight = datetime.combine(d, time(0))
                walls.append((midnight + timedelta(hours=e.from_time.hour, minutes=e.from_time.minute),
                              midnight + timedelta(minutes=e.until_minutes), k))
            d += timedelta(days=1)
    instants = _reference_instants([w for a, b, _ in walls for w in (a, b)], zone)
    return sorted((instants[a], instants[b], k) for a, b, k in walls
                  if instants[b] > lo and instants[a] < hi)


class Excluded:
    """Whether an instant lies in one of the periods: the periods merged, then a bisection."""

    def __init__(self, periods: list[tuple[datetime, datetime, int]]) -> None:
        merged: list[list[datetime]] = []
        for a, b, _ in sorted(periods):
            if a >= b:
                continue
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self.starts = [a for a, _ in merged]
        self.ends = [b for _, b in merged]

    def __call__(self, at: datetime) -> bool:
        k = bisect.bisect_right(self.starts, at) - 1
        return k >= 0 and at < self.ends[k]


@settings(max_examples=int(os.environ.get("PGDISPATCH_CALENDAR_EXAMPLES", "4")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(case=calendars())
def test_calendars_agree_with_a_minute_by_minute_reference(
        db: psycopg.Connection, case: tuple[str, int, list[Exclusion], str]) -> None:
    zone, year, exclusions, rule = case
    lo = datetime(year, 1, 1, tzinfo=UTC)
    hi = lo.replace(year=year + YEARS)
    cid = db.execute("INSERT INTO dispatch.calendars (name, timezone) VALUES (%s, %s) RETURNING id",
                     (f"oracle-{uuid.uuid4().hex[:12]}", zone)).fetchone()[0]  # type: ignore[index]
    ids = []
    for e in exclusions:
        if isinstance(e, Period):
            row = db.execute("INSERT INTO dispatch.calendar_exclusions (calendar_id, starts, ends)"
                             " VALUES (%s, %s, %s) RETURNING id", (cid, e.starts, e.ends)).fetchone()
        else:
            until = f"{e.until_minutes // 60:02d}:{e.until_minutes % 60:02d}"
            row = db.execute("INSERT INTO dispatch.calendar_exclusions"
                             " (calendar_id, days, from_time, until_time)"
                             " VALUES (%s, %s, %s, %s) RETURNING id",
                             (cid, list(e.days), e.from_time, until)).fetchone()
        assert row is not None
        ids.append(row[0])
    try:
        expected = _reference_periods(exclusions, zone, lo, hi)
        got = sorted((a, b, ids.index(x)) for a, b, x in db.execute(
            "SELECT starts_at, ends_at, exclusion_id FROM dispatch.calendar_periods(%s, %s, %s)",
            (cid, lo, hi)))
        assert got == expected, (zone, exclusions)

        # membership on and around every boundary, in one round trip
        probes = sorted({t + d for a, b, _ in expected for t in (a, b)
                         for d in (-MINUTE, timedelta(0), MINUTE) if lo <= t + d < hi})[:5000]
        answers = db.execute("SELECT array_agg(dispatch.calendar_excludes(%s, t) ORDER BY k)"
                             " FROM unnest(%s::timestamptz[]) WITH ORDINALITY AS x(t, k)",
                             (cid, probes)).fetchone()
        assert answers is not None
        excluded = Excluded(expected)
        wrong = [(p, a) for p, a in zip(probes, answers[0] or [], strict=True) if a != excluded(p)]
        assert not wrong, wrong[:5]

        # where the tick goes on from slots of a rule (in another zone than the calendar's): those
        # within two hours of a boundary, and every 50th
        every = [x for (x,) in db.execute(
            "SELECT dispatch._cron_slots(dispatch.cron_parse(%s), %s, %s, 'Europe/Berlin', 200000)",
            (rule, lo, hi - timedelta(days=30)))]
        chosen = set(every[::50])
        for a, b, _ in expected:
            for t in (a, b):
                chosen.update(every[bisect.bisect_left(every, t - timedelta(hours=2)):
                                    bisect.bisect_right(every, t + timedelta(hours=2))])
        slots = sorted(chosen)
        on_to = db.execute(
            "SELECT array_agg(dispatch._calendar_slot(dispatch.cron_parse(%s), 'Europe/Berlin', %s, s)"
            "                 ORDER BY k)"
            " FROM unnest(%s::timestamptz[]) WITH ORDINALITY AS x(s, k)", (rule, cid, slots)).fetchone()
        assert on_to is not None
        allowed = [x for x in every if not excluded(x)]
        for slot, went in zip(slots, on_to[0] or [], strict=True):
            k = bisect.bisect_left(allowed, slot)
            if k < len(allowed):  # (past the last slot listed, the next lies beyond the walk)
                assert went == allowed[k], (slot, went, allowed[k], zone, exclusions)
    finally:
        db.execute("DELETE FROM dispatch.calendars WHERE id = %s", (cid,))


def test_the_reference_places_dst_boundaries_by_the_fixed_time_rule() -> None:
    """The reference itself, on the two nights of docs/schedules.md's DST examples."""
    found = _reference_instants([datetime(2024, 3, 31, 2, 30), datetime(2024, 10, 27, 2, 30),
                                 datetime(2024, 10, 27, 3, 0)], "Europe/Berlin")
    assert found == {datetime(2024, 3, 31, 2, 30): datetime(2024, 3, 31, 1, 0, tzinfo=UTC),  # the jump
                     datetime(2024, 10, 27, 2, 30): datetime(2024, 10, 27, 0, 30, tzinfo=UTC),  # the first
                     datetime(2024, 10, 27, 3, 0): datetime(2024, 10, 27, 2, 0, tzinfo=UTC)}
