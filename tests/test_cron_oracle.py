"""Differential property tests: dispatch.cron_next against croniter and a brute-force reference.

The dialect (which wall-clock minutes match) comes from croniter 6.0.0 with
``implement_cron_bug=True`` (Vixie's day-of-month/day-of-week rule), evaluated on naive wall-clock
times, or -- where croniter cannot express our dialect or differs from Vixie cron -- from the small
brute-force reference below (``ref_parse``/``ref_walls``), which is itself checked against croniter
on the subset both understand.

Wall-clock matches become instants with zoneinfo by the design's DST rule (Debian cron):

* fixed time (neither minute nor hour field starts with ``*``): each matching wall time fires once,
  a time skipped by a spring-forward at the first instant after the jump, a repeated time at its
  first occurrence only;
* real time (minute or hour field starts with ``*``): the earliest minute-aligned instant whose local
  wall time matches; a skipped wall time never happens, a repeated one happens twice.

Many (expression, instant, zone) cases go to PostgreSQL in one round trip (unnest of arrays), so a
few hundred hypothesis examples cost a few seconds. Every croniter/Vixie difference found is written
down as a named case in ``test_known_croniter_differences``.
"""

from __future__ import annotations

import bisect
import calendar
import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, date, datetime, timedelta
from functools import cache
from typing import TypeVar
from zoneinfo import ZoneInfo

import croniter as croniter_module
import psycopg
import pytest
from croniter import croniter
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

# --------------------------------------------------------------------------------------------
# The zones: whole-hour DST in both hemispheres, a 30-minute DST zone, and DST at midnight.
# --------------------------------------------------------------------------------------------
ZONES = (
    "UTC",
    "Europe/Berlin",  # +1/+2, jumps at 02:00 / 03:00 local
    "America/New_York",  # -5/-4, 02:00 -> 03:00 in March, 02:00 -> 01:00 in November
    "Australia/Lord_Howe",  # +10:30/+11: 02:00 -> 02:30 in October, 02:00 -> 01:30 in April
    "America/Santiago",  # southern hemisphere, transitions at midnight: 00:00-00:59 is skipped
)
DST_ZONES = ZONES[1:]
YEAR_MIN, YEAR_MAX = 2000, 2040
EPOCH_MIN = int(datetime(YEAR_MIN, 1, 1, tzinfo=UTC).timestamp())
EPOCH_MAX = int(datetime(YEAR_MAX, 12, 31, tzinfo=UTC).timestamp())
MINUTE = timedelta(minutes=1)
T = TypeVar("T")

# --------------------------------------------------------------------------------------------
# Brute-force reference of the dialect, written from DESIGN.md "Semantics" (not from the SQL).
# --------------------------------------------------------------------------------------------
FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 7),
)
MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
DOW_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


@dataclasses.dataclass(frozen=True)
class Spec:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday .. 6
    nth: frozenset[tuple[int, int]]  # (weekday, n): the n-th such weekday of the month
    last_weekdays: frozenset[int]  # dL
    last_day: bool  # L in day-of-month
    days_star: bool
    weekdays_star: bool
    real_time: bool


def expand_macro(expr: str) -> str:
    src = expr.strip(" \t\r\n")
    if src.startswith("@"):
        return MACROS[src.lower()]
    return src


def _token(tok: str, field: int) -> int:
    _, lo, hi = FIELDS[field]
    if tok.isascii() and tok.isdigit():
        value = int(tok)
    elif field == 3 and tok.upper() in MONTH_NAMES:
        value = MONTH_NAMES.index(tok.upper()) + 1
    elif field == 4 and tok.upper() in DOW_NAMES:
        value = DOW_NAMES.index(tok.upper())
    else:
        raise ValueError(tok)
    if not lo <= value <= hi:
        raise ValueError(tok)
    return value


def ref_parse(expr: str) -> Spec:
    """Parse the (valid part of the) dialect; raises ValueError or KeyError on what it does not know."""
    fields = expand_macro(expr).split()
    if len(fields) != 5:
        raise ValueError(expr)
    sets: list[frozenset[int]] = []
    nth: set[tuple[int, int]] = set()
    last_weekdays: set[int] = set()
    last_day = False
    for f, text in enumerate(fields):
        _, lo, hi = FIELDS[f]
        end = 6 if f == 4 else hi  # '*' and 'n/s' in day-of-week stop at Saturday
        values: set[int] = set()
        for item in text.split(","):
            if f == 2 and item.upper() == "L":
                last_day = True
                continue
            if f == 4 and "#" in item:
                day, n = item.split("#")
                if n not in {"1", "2", "3", "4", "5"}:
                    raise ValueError(item)
                nth.add((_token(day, 4) % 7, int(n)))
                continue
            if f == 4 and len(item) > 1 and item[-1] in "lL":
                last_weekdays.add(_token(item[:-1], 4) % 7)
                continue
            base, slash, step_text = item.partition("/")
            step = int(step_text) if slash else 1
            if step < 1:
                raise ValueError(item)
            if base == "*":
                a, b = lo, end
            elif "-" in base:
                first, last = base.split("-")
                a, b = _token(first, f), _token(last, f)
                if f == 4 and last.upper() == "SUN" and a > 0:
                    b = 7  # MON-SUN
                if a > b:
                    raise ValueError(item)
            else:
                a = _token(base, f)
                b = max(end, a) if slash else a
            values.update(range(a, b + 1, step))
        if f == 4:
            values = {v % 7 for v in values}
        sets.append(frozenset(values))
    return Spec(
        minutes=sets[0],
        hours=sets[1],
        days=sets[2],
        months=sets[3],
        weekdays=sets[4],
        nth=frozenset(nth),
        last_weekdays=frozenset(last_weekdays),
        last_day=last_day,
        days_star=fields[2].startswith("*"),
        weekdays_star=fields[4].startswith("*"),
        real_time=fields[0].startswith("*") or fields[1].startswith("*"),
    )


def _day_ok(spec: Spec, day: int, ndays: int, weekday: int) -> bool:
    """weekday: 0 = Sunday."""
    dom = day in spec.days or (spec.last_day and day == ndays)
    dow = (
        weekday in spec.weekdays
        or (weekday, (day - 1) // 7 + 1) in spec.nth
        or (weekday in spec.last_weekdays and day + 7 > ndays)
    )
    if spec.days_star or spec.weekdays_star:
        return dom and dow
    return dom or dow  # both restricted: Vixie's OR


def ref_date_matches(spec: Spec, d: date) -> bool:
    return d.month in spec.months and _day_ok(
        spec, d.day, calendar.monthrange(d.year, d.month)[1], (d.weekday() + 1) % 7
    )


def ref_matches(spec: Spec, wall: datetime) -> bool:
    return wall.minute in spec.minutes and wall.hour in spec.hours and ref_date_matches(spec, wall.date())


def ref_can_fire(spec: Spec) -> bool:
    """Every (month, length, weekday of the 1st) combination occurs in the Gregorian calendar."""
    for month in spec.months:
        lengths = (28, 29) if month == 2 else (calendar.monthrange(2001, month)[1],)
        for ndays in lengths:
            for first in range(7):
                if any(_day_ok(spec, day, ndays, (first + day - 1) % 7) for day in range(1, ndays + 1)):
                    return True
    return False


def ref_walls(spec: Spec, start: datetime) -> Iterator[datetime]:
    """Matching naive wall-clock minutes strictly after start, by walking days, hours, minutes."""
    t = start.replace(second=0, microsecond=0) + MINUTE
    day, first = t.date(), True
    hours, minutes = sorted(spec.hours), sorted(spec.minutes)
    while day.year <= start.year + 60:
        if ref_date_matches(spec, day):
            for h in hours:
                if first and h < t.hour:
                    continue
                for m in minutes:
                    if first and h == t.hour and m < t.minute:
                        continue
                    yield datetime(day.year, day.month, day.day, h, m)
        day += timedelta(days=1)
        first = False


# --------------------------------------------------------------------------------------------
# croniter: what it cannot express, or expresses differently from Vixie cron.
# --------------------------------------------------------------------------------------------
def _items(field: str) -> list[str]:
    return field.split(",")


def _item_values(item: str, f: int) -> set[int]:
    """The values of one plain list item of field f (none for L, d#n, dL)."""
    if item.upper() == "L" or "#" in item or (f == 4 and len(item) > 1 and item[-1] in "lL"):
        return set()
    fields = ["*"] * 5
    fields[f] = item
    spec = ref_parse(" ".join(fields))
    return set((spec.minutes, spec.hours, spec.days, spec.months, spec.weekdays)[f])


def croniter_gap(expr: str) -> str | None:
    """Why croniter cannot serve as the oracle for expr (see test_known_croniter_differences)."""
    fields = expand_macro(expr).split()
    for f, text in enumerate(fields):
        for item in _items(text):
            base = item.partition("/")[0]
            if "-" in base and "#" not in base:
                a, b = (_token(x, f) for x in base.split("-"))
                if f == 4:
                    if {a, b} == {0, 7}:
                        continue  # 0-7: croniter's "whole cycle" is right here
                    a, b = a % 7, b % 7
                if a == b:
                    return "a-a range is the whole field in croniter"
            if "/" in item and base != "*" and "-" not in base:
                v = _token(base, f)
                if f == 4 and v == 7:
                    return "7/s in day-of-week is 0-6/s in croniter"
                if v == (6 if f == 4 else FIELDS[f][2]):
                    return "n/s with n at the field's end is n-n/s, the whole field, in croniter"
    days, dow = _items(fields[2]), _items(fields[4])
    if fields[2] != "*" and any(v > 28 for i in days if i.upper() != "L" for v in _item_values(i, 2)):
        return "croniter steps to a day the month lacks and overshoots into the next month"
    for this, other, f in ((fields[2], fields[4], 4), (fields[4], fields[2], 2)):
        if (
            "*" in this
            and not this.startswith("*")
            and not other.startswith("*")
            and {v for i in _items(other) for v in _item_values(i, f)}
            >= (set(range(7)) if f == 4 else set(range(1, 32)))
        ):
            return "croniter reads a field that lists every value as '*' when the other has a '*'"
    spec = ref_parse(expr)
    if not (spec.days_star or spec.weekdays_star):
        dom_alone = dataclasses.replace(
            spec, weekdays=frozenset(), nth=frozenset(), last_weekdays=frozenset()
        )
        if not ref_can_fire(dom_alone):
            return "croniter raises when the day-of-month alone can never fire, even beside weekdays"
    special = [i for i in dow if "#" in i or (len(i) > 1 and i[-1] in "lL")]
    if special:
        if len(special) != len(dow):
            return "croniter refuses plain weekdays mixed with d#n/dL"
        if not fields[2].startswith("*"):
            return "croniter ignores a restricted day-of-month beside d#n/dL"
    return None


def croniter_spelling(expr: str) -> str:
    """croniter writes the last weekday d of the month as 'Ld' (digits only), not 'dL'."""
    fields = expand_macro(expr).split()
    fields[4] = ",".join(
        f"L{_token(i[:-1], 4) % 7}" if len(i) > 1 and i[-1] in "lL" and "#" not in i else i
        for i in _items(fields[4])
    )
    return " ".join(fields)


def croniter_walls(expr: str, start: datetime) -> Iterator[datetime]:
    it = croniter(croniter_spelling(expr), start, implement_cron_bug=True)
    while True:
        yield it.get_next(datetime)


# --------------------------------------------------------------------------------------------
# From wall-clock matches to instants (the DST rule), with zoneinfo.
# --------------------------------------------------------------------------------------------
@cache
def transitions(zone: str) -> tuple[datetime, ...]:
    """Instants (UTC, minute-aligned) at which zone's UTC offset changes, 1999-2099 (a rare
    expression's next match can lie decades after its start)."""
    z = ZoneInfo(zone)
    found = []
    t = datetime(YEAR_MIN - 1, 1, 1, tzinfo=UTC)
    off = t.astimezone(z).utcoffset()
    while t.year < 2100:
        u = t + timedelta(days=1)
        off_u = u.astimezone(z).utcoffset()
        if off_u != off:
            lo, hi = t, u  # offset(lo) == off, offset(hi) != off
            while hi - lo > MINUTE:
                mid = lo + (hi - lo) // 2
                mid = mid.replace(second=0)
                if mid.astimezone(z).utcoffset() == off:
                    lo = mid
                else:
                    hi = mid
            found.append(hi)
            off = off_u
        t = u
    return tuple(found)


def next_transition(zone: str, after: datetime) -> datetime | None:
    ts = transitions(zone)
    k = bisect.bisect_right(ts, after)
    return ts[k] if k < len(ts) else None


def wall_of(instant: datetime, zone: str) -> datetime:
    return instant.astimezone(ZoneInfo(zone)).replace(tzinfo=None)


def wall_exists(wall: datetime, zone: str) -> bool:
    return wall_of(wall.replace(tzinfo=ZoneInfo(zone)).astimezone(UTC), zone) == wall


def first_instant(wall: datetime, zone: str) -> datetime:
    """The instant a fixed-time schedule fires for this wall time (Debian's rule)."""
    z = ZoneInfo(zone)
    if wall_exists(wall, zone):
        return wall.replace(tzinfo=z, fold=0).astimezone(UTC)  # fold=0: the first occurrence
    # Skipped by a spring-forward: the first instant after the jump. The jump lies between the
    # readings of wall with the offsets before and after it.
    a = wall.replace(tzinfo=z, fold=0).astimezone(UTC)
    b = wall.replace(tzinfo=z, fold=1).astimezone(UTC)
    jump = next_transition(zone, min(a, b))
    assert jump is not None and jump <= max(a, b), (wall, zone)
    return jump


def fixed_time_next(walls: Iterator[datetime], after: datetime, zone: str) -> datetime:
    for wall in walls:
        instant = first_instant(wall, zone)
        if instant > after:
            return instant
    raise AssertionError("no match")


def real_time_next(
    walls_from: Callable[[datetime], Iterator[datetime]], after: datetime, zone: str
) -> datetime:
    """Earliest minute-aligned instant > after whose wall time matches: between two offset changes
    the wall clock is the instant plus a constant, so the first wall match in a stretch is its
    first matching instant."""
    i = after.replace(second=0, microsecond=0) + MINUTE
    while True:
        offset = i.astimezone(ZoneInfo(zone)).utcoffset()
        assert offset is not None
        w = i.replace(tzinfo=None) + offset
        m = next(walls_from(w - MINUTE))  # first match >= w
        candidate = (m - offset).replace(tzinfo=UTC)
        jump = next_transition(zone, i)
        if jump is None or candidate < jump:
            return candidate
        i = jump


def oracle_next(
    expr: str, after: datetime, zone: str, walls_from: Callable[[datetime], Iterator[datetime]]
) -> datetime:
    if ref_parse(expr).real_time:
        return real_time_next(walls_from, after, zone)
    return fixed_time_next(walls_from(wall_of(after, zone)), after, zone)


@dataclasses.dataclass(frozen=True)
class Expected:
    value: datetime | None  # None: the expression is invalid (never fires)
    oracle: str


def expected_next(expr: str, after: datetime, zone: str) -> Expected:
    spec = ref_parse(expr)
    if not ref_can_fire(spec):
        return Expected(None, "reference: never fires")
    gap = croniter_gap(expr)
    if gap is None:
        return Expected(oracle_next(expr, after, zone, lambda s: croniter_walls(expr, s)), "croniter")
    return Expected(oracle_next(expr, after, zone, lambda s: ref_walls(spec, s)), f"reference ({gap})")


# --------------------------------------------------------------------------------------------
# PostgreSQL side: many cases in one round trip.
# --------------------------------------------------------------------------------------------
TRY_CRON_NEXT = """
CREATE OR REPLACE FUNCTION pg_temp.try_cron_next(
    e text, a timestamptz, z text, OUT ts timestamptz, OUT err text)
LANGUAGE plpgsql AS $$
BEGIN
    ts := dispatch.cron_next(e, a, z);
EXCEPTION WHEN OTHERS THEN
    err := SQLSTATE || ': ' || SQLERRM;
END
$$
"""
BATCH = """
SELECT r.ts, r.err, dispatch.cron_is_valid(c.e)
FROM unnest(%s::text[], %s::timestamptz[], %s::text[]) WITH ORDINALITY AS c(e, a, z, n)
CROSS JOIN LATERAL pg_temp.try_cron_next(c.e, c.a, c.z) AS r
ORDER BY c.n
"""

Case = tuple[str, datetime, str]  # (expression, after, zone)


def sql_next(db: psycopg.Connection, cases: Sequence[Case]) -> list[tuple[datetime | None, str | None, bool]]:
    db.execute(TRY_CRON_NEXT)
    rows = db.execute(BATCH, [[c[0] for c in cases], [c[1] for c in cases], [c[2] for c in cases]]).fetchall()
    assert len(rows) == len(cases)
    return [(r[0], r[1], r[2]) for r in rows]


def check_against_oracle(db: psycopg.Connection, cases: Sequence[Case]) -> None:
    got = sql_next(db, cases)
    failures = []
    for (expr, after, zone), (ts, err, valid) in zip(cases, got, strict=True):
        try:
            exp = expected_next(expr, after, zone)
        except Exception as e:  # an oracle failure: report it with its case
            failures.append(f"oracle failed on ({expr!r}, '{after.isoformat()}', {zone!r}): {e!r}")
            continue
        if exp.value is None:
            ok = ts is None and err is not None and err.startswith("22023") and valid is False
        else:
            ok = ts is not None and ts == exp.value and valid is True
        if not ok:
            failures.append(
                f"cron_next({expr!r}, '{after.isoformat()}', {zone!r}): expected "
                f"{exp.value.isoformat() if exp.value else 'invalid'} [{exp.oracle}], got "
                f"{ts.astimezone(UTC).isoformat() if ts else err} (cron_is_valid={valid})"
            )
    assert not failures, f"{len(failures)} of {len(cases)} cases differ:\n" + "\n".join(failures[:20])


# --------------------------------------------------------------------------------------------
# Strategies: expressions over the whole dialect, instants 2000-2040 (many near DST changes).
# --------------------------------------------------------------------------------------------
def weighted(*options: tuple[int, st.SearchStrategy[T]]) -> st.SearchStrategy[T]:
    """One of the strategies, picked with the given weights (shrinks towards the first)."""
    table = [strategy for weight, strategy in options for _ in range(weight)]
    return st.integers(0, len(table) - 1).flatmap(table.__getitem__)


def _names(names: Sequence[str], first: int) -> st.SearchStrategy[tuple[int, str]]:
    return st.sampled_from(
        [(first + k, spelling) for k, n in enumerate(names) for spelling in (n, n.lower(), n.title())]
    )


def _value(f: int, dst_bias: bool) -> st.SearchStrategy[tuple[int, str]]:
    """A (value, spelling) pair for field f."""
    _, lo, hi = FIELDS[f]
    numbers = st.integers(lo, hi)
    if f == 0:
        numbers = weighted((1, numbers), (1, st.sampled_from([0, 15, 29, 30, 31, 45, 59])))
    if f == 1 and dst_bias:
        numbers = weighted((1, numbers), (3, st.sampled_from([0, 1, 2, 3, 22, 23])))
    pairs = numbers.map(lambda v: (v, str(v)))
    if f == 3:
        pairs = weighted((2, pairs), (1, _names(MONTH_NAMES, 1)))
    if f == 4:
        pairs = weighted((2, pairs), (1, _names(DOW_NAMES, 0)))
    return pairs


def _item(f: int, dst_bias: bool) -> st.SearchStrategy[str]:
    _, lo, hi = FIELDS[f]
    steps = st.integers(1, 7 if f == 4 else hi - lo + 1)
    value = _value(f, dst_bias)
    ranges = st.tuples(value, value).map(lambda p: (min(p), max(p)))
    options = [
        (4, value.map(lambda p: p[1])),  # n
        (2, ranges.map(lambda p: f"{p[0][1]}-{p[1][1]}")),  # a-b
        (2, steps.map(lambda s: f"*/{s}")),  # */s
        (2, st.tuples(ranges, steps).map(lambda t: f"{t[0][0][1]}-{t[0][1][1]}/{t[1]}")),  # a-b/s
        (2, st.tuples(value, steps).map(lambda t: f"{t[0][1]}/{t[1]}")),  # n/s
    ]
    if f == 2:
        options.append((2, st.sampled_from(["L", "l"])))
    if f == 4:
        options.append((3, st.tuples(value, st.integers(1, 5)).map(lambda t: f"{t[0][1]}#{t[1]}")))
        options.append((3, st.tuples(value, st.sampled_from("Ll")).map(lambda t: f"{t[0][1]}{t[1]}")))
    return weighted(*options)


def _field(f: int, dst_bias: bool) -> st.SearchStrategy[str]:
    item = _item(f, dst_bias)
    items = st.lists(item, min_size=1, max_size=3).map(",".join)
    star = st.just("*")
    if f in (2, 4):
        star_first = item.map(lambda t: f"*/2,{t}")  # a list that starts with '*'
        return weighted((6 if dst_bias else 2, star), (3, items), (1, star_first))
    if f == 3:
        return weighted((6 if dst_bias else 2, star), (1, items))
    return weighted((1, star), (2, items))


def expressions(dst_bias: bool = False) -> st.SearchStrategy[str]:
    fields = st.tuples(*(_field(f, dst_bias) for f in range(5))).map(" ".join)
    macros = st.sampled_from([m for name in sorted(MACROS) for m in (name, name.upper())])
    return weighted((12, fields), (1, macros))


def instants(zone: str, near_dst: bool) -> st.SearchStrategy[datetime]:
    uniform = st.integers(EPOCH_MIN, EPOCH_MAX).map(lambda s: datetime.fromtimestamp(s, UTC))
    aligned = uniform.map(lambda t: t.replace(second=0))
    ts = [t for t in transitions(zone) if YEAR_MIN <= t.year <= YEAR_MAX]
    if not ts:
        return weighted((1, uniform), (1, aligned))
    near = st.tuples(
        st.sampled_from(ts), st.integers(-36 * 60, 36 * 60), st.sampled_from([0, 0, 0, 1, 30, 59])
    ).map(lambda t: t[0] + timedelta(minutes=t[1], seconds=t[2]))
    return weighted((1, uniform), (1, aligned), (6 if near_dst else 1, near))


def cases(zones: Sequence[str], dst_bias: bool) -> st.SearchStrategy[Case]:
    exprs = expressions(dst_bias)
    return st.one_of(*(st.tuples(exprs, instants(z, dst_bias), st.just(z)) for z in zones))


# No shrinking: a failing batch already lists each failing case on its own line, and shrinking a
# list of 30-60 cases one draw at a time takes minutes.
BATCH_SETTINGS = settings(
    # 30 batches of 30-60 cases a test in the suite; a long run by hand: PGDISPATCH_ORACLE_EXAMPLES=1000
    max_examples=int(os.environ.get("PGDISPATCH_ORACLE_EXAMPLES", "30")),
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
        HealthCheck.filter_too_much,
    ],
)


# --------------------------------------------------------------------------------------------
# The tests.
# --------------------------------------------------------------------------------------------
@BATCH_SETTINGS
@given(batch=st.lists(cases(ZONES, dst_bias=False), min_size=30, max_size=60))
def test_cron_next_agrees_with_oracle(db: psycopg.Connection, batch: list[Case]) -> None:
    check_against_oracle(db, batch)


@BATCH_SETTINGS
@given(batch=st.lists(cases(DST_ZONES, dst_bias=True), min_size=30, max_size=60))
def test_cron_next_agrees_with_oracle_across_dst(db: psycopg.Connection, batch: list[Case]) -> None:
    check_against_oracle(db, batch)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expr=expressions(), start=st.integers(EPOCH_MIN, EPOCH_MAX))
def test_reference_agrees_with_croniter(expr: str, start: int) -> None:
    """The brute-force reference is itself checked: on everything croniter expresses the way Vixie
    cron does, both give the same next five wall-clock matches."""
    spec = ref_parse(expr)
    if croniter_gap(expr) is not None:
        return
    t = datetime.fromtimestamp(start, UTC).replace(tzinfo=None)
    if not ref_can_fire(spec):
        with pytest.raises(croniter_module.CroniterBadDateError):
            next(croniter_walls(expr, t))
        return
    ours, theirs = ref_walls(spec, t), croniter_walls(expr, t)
    assert [next(ours) for _ in range(5)] == [next(theirs) for _ in range(5)], expr


def _fires_debian(spec: Spec, instant: datetime, zone: str) -> bool:
    """Independent statement of the DST rule for one minute-aligned instant (brute force)."""
    wall = wall_of(instant, zone)
    if spec.real_time:
        return ref_matches(spec, wall)
    z = ZoneInfo(zone)
    if ref_matches(spec, wall) and wall.replace(tzinfo=z, fold=0).astimezone(UTC) == instant:
        return True  # the first occurrence of a matching wall time
    before = wall_of(instant - MINUTE, zone)
    skipped = before + MINUTE
    while skipped < wall:  # a forward jump just happened: wall times in [before+1, wall) were skipped
        if ref_matches(spec, skipped):
            return True
        skipped += MINUTE
    return False


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(DST_ZONES, dst_bias=True))
def test_dst_mapping_agrees_with_minute_walk(case: Case) -> None:
    """The wall-clock-to-instant mapping of the oracle, checked minute by minute over one day."""
    expr, after, zone = case
    spec = ref_parse(expr)
    if not ref_can_fire(spec):
        return
    walked = None
    i = after.replace(second=0, microsecond=0) + MINUTE
    for _ in range(26 * 60):
        if _fires_debian(spec, i, zone):
            walked = i
            break
        i += MINUTE
    if walked is None:
        return  # further than a day away
    assert oracle_next(expr, after, zone, lambda s: ref_walls(spec, s)) == walked, case


# --------------------------------------------------------------------------------------------
# Known croniter differences (croniter 6.0.0, implement_cron_bug=True, naive datetimes).
# Each is a named case: our dialect's (Vixie cron's) expected value, what croniter does instead,
# and the engine's answer, which must be the expected value.
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Difference:
    name: str
    expr: str
    after: str  # UTC
    expected: str  # UTC, per the design (Vixie cron)
    croniter_gives: str | type[Exception]  # croniter's next after the same naive start
    why: str
    croniter_expr: str | None = None  # what croniter is given; default: croniter_spelling(expr)


def _ts(s: str) -> datetime:
    return datetime.fromisoformat(s).replace(tzinfo=UTC)


DIFFERENCES = [
    Difference(
        "a-a range is the whole field",
        "5-5 * * * *",
        "2024-01-01 00:00",
        "2024-01-01 00:05",
        "2024-01-01 00:01",
        "croniter treats a range whose ends are equal as the whole cycle ('Jan-Jan' = every month); "
        "Vixie cron reads 5-5 as minute 5.",
    ),
    Difference(
        "SUN-SUN range is the whole week",
        "0 0 * * SUN-SUN",
        "2024-01-01 00:00",
        "2024-01-07 00:00",
        "2024-01-02 00:00",
        "Same rule with names: croniter fires every day, Vixie only on Sundays.",
    ),
    Difference(
        "7-7 in day-of-week is the whole week",
        "0 0 * * 7-7",
        "2024-01-01 00:00",
        "2024-01-07 00:00",
        "2024-01-02 00:00",
        "croniter maps 7 to 0 and then sees the range 0-0, the whole cycle.",
    ),
    Difference(
        "n/s with n at the field's end",
        "0 23/1 * * *",
        "2024-01-01 00:00",
        "2024-01-01 23:00",
        "2024-01-01 01:00",
        "croniter rewrites n/s as n-<max>/s; for n = max that is the range n-n, which it reads as the whole "
        "field, so 23/1 fires every hour; in our dialect (Vixie) it is hour 23 only.",
    ),
    Difference(
        "SAT/2 in day-of-week",
        "0 0 * * SAT/2",
        "2024-01-01 00:00",
        "2024-01-06 00:00",
        "2024-01-02 00:00",
        "Same rule: SAT/2 becomes 6-6/2, the whole week in steps of 2 (Sun,Tue,Thu,Sat); ours: Saturday.",
    ),
    Difference(
        "impossible day-of-month OR weekday",
        "0 0 30 2 0",
        "2024-01-01 00:00",
        "2024-02-04 00:00",
        croniter_module.CroniterBadDateError,
        "Feb 30 never exists, but with both fields restricted Vixie fires on Sundays in February; "
        "croniter computes the day-of-month pass on its own, finds nothing in 50 years and raises.",
    ),
    Difference(
        "L beside a day the month lacks",
        "0 0 30,L * *",
        "2024-02-01 00:00",
        "2024-02-29 00:00",
        "2024-03-30 00:00",
        "In February (29 days in 2024) croniter steps to day 30, which overshoots into March, so it "
        "misses February's last day and fires on March 30.",
    ),
    Difference(
        "a restricted field that lists every value, beside a '*' that is not first",
        "0 0 1,*/3 * 0-6",
        "2024-01-01 12:00",
        "2024-01-02 00:00",
        "2024-01-04 00:00",
        "Day-of-month '1,*/3' does not start with '*', so both fields are restricted and Vixie ORs "
        "them: 0-6 is every day. croniter turns the full 0-6 into '*' because the other field "
        "contains a '*' somewhere, and then fires only on days 1,4,7,...",
    ),
    Difference(
        "7/s in day-of-week",
        "0 0 * * 7/2",
        "2024-01-01 00:00",
        "2024-01-07 00:00",
        "2024-01-02 00:00",
        "croniter maps 7 to 0 before expanding n/s to n-6/s, so 7/2 is Sun,Tue,Thu,Sat; in our dialect "
        "n/s runs from n to the field's end, and 7 (Sunday) is the end.",
    ),
    Difference(
        "a day the month lacks, at the end of February",
        "0 0 */15 * *",
        "2019-02-26 19:21",
        "2019-03-01 00:00",
        "2019-03-16 00:00",
        "*/15 is days 1, 16 and 31. From February 26 croniter steps to day 31, overshoots into March "
        "and lands past March 1, so it skips the 1st (found by the oracle test on "
        "'0 16/22,0/8,19-23/12 */15,11-24 * *').",
    ),
    Difference(
        "restricted day-of-month OR d#n",
        "0 0 1 * 1#2",
        "2024-01-01 00:00",
        "2024-01-08 00:00",
        croniter_module.CroniterBadDateError,
        "With both fields restricted Vixie fires on either (the 1st, or the 2nd Monday); croniter keeps "
        "the d#n filter on its day-of-month pass, intersects them, finds nothing and raises.",
    ),
    Difference(
        "restricted day-of-month OR d#n when the two meet",
        "0 0 L * 5#5",
        "2024-01-01 00:00",
        "2024-01-31 00:00",
        "2024-03-29 00:00",
        "L OR 5th Friday: 2024-01-31 is the last day; croniter ignores the day-of-month (its "
        "day-of-month pass is L AND 5th Friday) and fires only on 5th Fridays.",
    ),
    Difference(
        "restricted day-of-month OR dL",
        "0 0 1 * 5L",
        "2024-01-02 00:00",
        "2024-01-26 00:00",
        croniter_module.CroniterBadDateError,
        "The 1st OR the last Friday (croniter spelling: L5); croniter intersects them and raises.",
    ),
    Difference(
        "dL spelling",
        "0 9 * * 5L",
        "2024-01-01 00:00",
        "2024-01-26 09:00",
        croniter_module.CroniterNotAlphaError,
        "croniter spells the last Friday 'L5' and rejects '5L'; the oracle translates it.",
        croniter_expr="0 9 * * 5L",
    ),
    Difference(
        "plain weekdays mixed with d#n",
        "0 0 * * 1,2#2",
        "2024-01-08 00:00",
        "2024-01-09 00:00",
        croniter_module.CroniterUnsupportedSyntaxError,
        "Mondays or the 2nd Tuesday; croniter refuses to mix plain weekdays with d#n in one list.",
    ),
    Difference(
        "plain weekdays mixed with dL",
        "0 0 * * 1,5L",
        "2024-01-22 00:00",
        "2024-01-26 00:00",
        croniter_module.CroniterUnsupportedSyntaxError,
        "Mondays or the last Friday; same refusal for croniter's L5 (our 5L).",
    ),
]


@pytest.mark.parametrize("diff", DIFFERENCES, ids=[d.name for d in DIFFERENCES])
def test_known_croniter_differences(db: psycopg.Connection, diff: Difference) -> None:
    after, expected = _ts(diff.after), _ts(diff.expected)
    # What croniter really does (if a croniter upgrade changes it, revisit the oracle's rules).
    raw = diff.croniter_expr or croniter_spelling(diff.expr)
    try:
        got_croniter: str | type[Exception] = (
            croniter(raw, after.replace(tzinfo=None), implement_cron_bug=True)
            .get_next(datetime)
            .strftime("%Y-%m-%d %H:%M")
        )
    except croniter_module.CroniterError as e:
        got_croniter = type(e)
    assert got_croniter == diff.croniter_gives, diff.why
    # The oracle does not use croniter for it, and the reference gives the expected value.
    assert croniter_gap(diff.expr) is not None or diff.croniter_expr is not None
    spec = ref_parse(diff.expr)
    assert oracle_next(diff.expr, after, "UTC", lambda s: ref_walls(spec, s)) == expected
    # The engine follows the design, not croniter.
    assert sql_next(db, [(diff.expr, after, "UTC")])[0][0] == expected, diff.why


def test_dL_translation_matches_reference() -> None:
    """The oracle feeds croniter 'L5' for our '5L': both give the same last Fridays."""
    start = datetime(2023, 12, 31, 12, 0)
    spec = ref_parse("0 9 * * 5L")
    ours, theirs = ref_walls(spec, start), croniter_walls("0 9 * * 5L", start)
    assert [next(ours) for _ in range(24)] == [next(theirs) for _ in range(24)]


def test_croniter_with_time_zones_is_not_debian_cron() -> None:
    """Why the oracle runs croniter on naive wall-clock times and applies the DST rule itself:
    croniter's own tz-aware mode neither fires a skipped time at the jump nor repeats a repeated
    hour for a real-time schedule (and around a fall-back it even returns a wrong hour)."""
    ny = ZoneInfo("America/New_York")
    # '30 2 * * *' on 2024-03-10: 02:30 does not exist; Debian fires at the jump, 03:00 EDT (07:00Z).
    got = croniter("30 2 * * *", datetime(2024, 3, 10, 0, 0, tzinfo=ny)).get_next(datetime)
    assert got.astimezone(UTC) != datetime(2024, 3, 10, 7, 0, tzinfo=UTC)
    assert fixed_time_next(
        croniter_walls("30 2 * * *", datetime(2024, 3, 10)),
        datetime(2024, 3, 10, 5, 0, tzinfo=UTC),
        "America/New_York",
    ) == datetime(2024, 3, 10, 7, 0, tzinfo=UTC)
    # '30 * * * *' on 2024-11-03: 01:30 happens twice (05:30Z EDT and 06:30Z EST); croniter skips the second.
    it = croniter("30 * * * *", datetime(2024, 11, 3, 1, 30, tzinfo=ny))
    assert it.get_next(datetime).astimezone(UTC) != datetime(2024, 11, 3, 6, 30, tzinfo=UTC)
    # '30 1 * * *' after the first 01:30 of 2024-11-03: the next is 01:30 on 2024-11-04; croniter says 02:30.
    got = croniter("30 1 * * *", datetime(2024, 11, 3, 1, 30, tzinfo=ny)).get_next(datetime)
    assert got.replace(tzinfo=None) == datetime(2024, 11, 4, 2, 30)


# --------------------------------------------------------------------------------------------
# Bounded rules (starts_at, ends_at, max_runs): the oracle's slots, kept within the bounds.
# --------------------------------------------------------------------------------------------
BOUNDED_SLOTS = """
CREATE OR REPLACE FUNCTION pg_temp.bounded_slots(
    e text, z text, s timestamptz, en timestamptz, m integer, a timestamptz, OUT slots timestamptz[])
LANGUAGE plpgsql AS $$
DECLARE
    spec dispatch.cron_spec := dispatch.bounded_spec(dispatch.cron_parse(e), s, en, m, z);
    t timestamptz := a;
BEGIN
    slots := '{}';
    FOR i IN 1..6 LOOP
        t := dispatch.cron_spec_next(spec, t, z);
        EXIT WHEN NOT isfinite(t);
        slots := slots || t;
    END LOOP;
END
$$
"""
BoundedCase = tuple[str, str, datetime, datetime | None, int | None, timedelta]


def _bounded_case(expr: str, zone: str, start_s: int, minutes: int | None, max_runs: int | None,
                  before_s: int) -> BoundedCase:
    start = datetime.fromtimestamp(start_s, UTC)
    end = None if minutes is None else start + timedelta(minutes=minutes)
    if end is None and max_runs is None:
        max_runs = 3  # one bound at least
    return expr, zone, start, end, max_runs, timedelta(seconds=before_s)


def bounded_cases() -> st.SearchStrategy[BoundedCase]:
    minutes = st.none() | st.integers(0, 400 * 24 * 60)
    max_runs = st.none() | st.integers(1, 5)
    return st.builds(_bounded_case, expressions(dst_bias=True), st.sampled_from(DST_ZONES),
                     st.integers(EPOCH_MIN, EPOCH_MAX), minutes, max_runs, st.integers(1, 3 * 24 * 60 * 60))


@BATCH_SETTINGS
@given(batch=st.lists(bounded_cases(), min_size=10, max_size=20))
def test_bounded_rules_keep_the_oracles_slots_within_their_bounds(
    db: psycopg.Connection, batch: list[BoundedCase]
) -> None:
    """From an instant before starts_at: the first slots at or after it, none after ends_at, at
    most max_runs of them ('infinity' then), each as the oracle has it, DST included."""
    db.execute(BOUNDED_SLOTS)
    failures = []
    for expr, zone, start, end, max_runs, before in batch:
        if not ref_can_fire(ref_parse(expr)):
            continue  # refused by cron_parse, as test_cron_next_agrees_with_oracle shows
        got = db.execute("SELECT pg_temp.bounded_slots(%s, %s, %s, %s, %s, %s)",
                         (expr, zone, start, end, max_runs, start - before)).fetchone()[0]  # type: ignore[index]
        expected: list[datetime] = []
        t = start - timedelta(microseconds=1)
        while len(expected) < min(max_runs or 6, 6):
            slot = expected_next(expr, t, zone).value
            assert slot is not None
            if end is not None and slot > end:
                break
            expected.append(slot)
            t = slot
        if got != expected:
            failures.append(f"{expr!r} in {zone} from {start.isoformat()} to {end and end.isoformat()},"
                            f" max_runs {max_runs}: expected {[x.isoformat() for x in expected]},"
                            f" got {[x.astimezone(UTC).isoformat() for x in got]}")
    assert not failures, "\n".join(failures)
