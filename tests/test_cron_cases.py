"""Hand-written cron cases: DST (skipped and repeated hours, fixed-time and wildcard, whole-hour and
30-minute zones), every dialect feature once, never-firing expressions, cron_is_valid's
robustness, and the write path's refusals of bad expressions and time zones."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg import errors
from pytest_postgresql.executors import NoopExecutor
from pytest_postgresql.janitor import DatabaseJanitor


@pytest.fixture(scope="module")
def cdb(postgresql_noproc: NoopExecutor) -> Iterator[psycopg.Connection]:
    """One copy of the template database for this module's many cases that leave nothing behind
    (a fresh copy per test, the ``db`` fixture, costs ~0.3 s each). Autocommit, like psql."""
    dbname = f"pgdispatch_cron_cases_{os.getpid()}"
    proc = postgresql_noproc
    janitor = DatabaseJanitor(
        user=proc.user,
        host=proc.host,
        port=proc.port,
        dbname=dbname,
        template_dbname=proc.template_dbname,
        maintenance_dbname=proc.maintenance_dbname,
        password=proc.password,
    )
    janitor.drop()
    with (
        janitor,
        psycopg.connect(
            dbname=dbname,
            user=proc.user,
            host=proc.host,
            port=proc.port,
            password=proc.password,
            autocommit=True,
        ) as conn,
    ):
        yield conn


@pytest.fixture
def clean_cdb(cdb: psycopg.Connection) -> Iterator[psycopg.Connection]:
    """cdb, emptied again after the test should an engine bug have let a write through."""
    yield cdb
    cdb.execute("DELETE FROM dispatch.schedules")
    cdb.execute("DELETE FROM dispatch.audit_log")


def _utc(s: str) -> datetime:
    return datetime.fromisoformat(s).replace(tzinfo=UTC)


def cron_next(db: psycopg.Connection, expr: str, after: str, tz: str = "UTC") -> datetime:
    row = db.execute("SELECT dispatch.cron_next(%s, %s, %s)", [expr, _utc(after), tz]).fetchone()
    assert row is not None and row[0] is not None
    return row[0].astimezone(UTC)


# --------------------------------------------------------------------------------------------
# DST. All instants in UTC; local times in the comments.
#   America/New_York 2024: 03-10 07:00Z 01:59 EST -> 03:00 EDT; 11-03 06:00Z 01:59 EDT -> 01:00 EST
#   Europe/Berlin 2024:    03-31 01:00Z 01:59 CET -> 03:00 CEST; 10-27 01:00Z 02:59 CEST -> 02:00 CET
#   Australia/Lord_Howe 2024 (+10:30 standard, +11 summer):
#                          10-05 15:30Z 10-06 01:59 -> 02:30; 04-06 15:00Z 04-07 01:59 -> 01:30
#   America/Santiago 2024: 09-08 04:00Z 09-07 23:59 -> 09-08 01:00; 04-07 03:00Z 04-06 23:59 -> 23:00
# --------------------------------------------------------------------------------------------
DST_CASES = [
    # name, expression, zone, after, expected
    # -- New York, whole hour --
    (
        "ny fixed skipped fires at the jump",
        "30 2 * * *",
        "America/New_York",
        "2024-03-10 05:00",
        "2024-03-10 07:00",
    ),  # 02:30 does not exist: 03:00 EDT
    (
        "ny fixed skipped, next day as usual",
        "30 2 * * *",
        "America/New_York",
        "2024-03-10 07:00",
        "2024-03-11 06:30",
    ),  # 02:30 EDT
    (
        "ny fixed repeated fires at the first",
        "30 1 * * *",
        "America/New_York",
        "2024-11-03 04:00",
        "2024-11-03 05:30",
    ),  # 01:30 EDT
    (
        "ny fixed repeated fires once",
        "30 1 * * *",
        "America/New_York",
        "2024-11-03 05:30",
        "2024-11-04 06:30",
    ),  # not 01:30 EST (06:30Z) on 11-03
    (
        "ny fixed list in the repeated hour",
        "0-59/30 1 * * *",
        "America/New_York",
        "2024-11-03 05:30",
        "2024-11-04 06:00",
    ),  # 01:00/01:30 EST of 11-03 are repeats
    (
        "ny fixed several skipped times fire once",
        "0,15,30,45 2 * * *",
        "America/New_York",
        "2024-03-10 06:59",
        "2024-03-10 07:00",
    ),
    (
        "ny fixed several skipped times, then the next day",
        "0,15,30,45 2 * * *",
        "America/New_York",
        "2024-03-10 07:00",
        "2024-03-11 06:00",
    ),
    (
        "ny wildcard hour skips the gap",
        "15 * * * *",
        "America/New_York",
        "2024-03-10 06:45",
        "2024-03-10 07:15",
    ),  # 01:45 EST -> 03:15 EDT; 02:15 never happens
    (
        "ny wildcard minute across the gap",
        "*/15 * * * *",
        "America/New_York",
        "2024-03-10 06:45",
        "2024-03-10 07:00",
    ),  # 03:00 EDT
    (
        "ny wildcard minute in the skipped hour",
        "*/30 2 * * *",
        "America/New_York",
        "2024-03-10 05:00",
        "2024-03-11 06:00",
    ),  # no 02:xx on 03-10: 03-11 02:00 EDT
    (
        "ny wildcard hour repeats",
        "30 * * * *",
        "America/New_York",
        "2024-11-03 05:30",
        "2024-11-03 06:30",
    ),  # 01:30 EDT, then 01:30 EST
    (
        "ny wildcard minute repeats",
        "*/30 1 * * *",
        "America/New_York",
        "2024-11-03 05:30",
        "2024-11-03 06:00",
    ),  # 01:30 EDT, then 01:00 EST
    # -- Berlin, whole hour --
    (
        "berlin fixed skipped fires at the jump",
        "30 2 * * *",
        "Europe/Berlin",
        "2024-03-31 00:00",
        "2024-03-31 01:00",
    ),  # 03:00 CEST
    (
        "berlin fixed repeated fires at the first",
        "30 2 * * *",
        "Europe/Berlin",
        "2024-10-27 00:00",
        "2024-10-27 00:30",
    ),  # 02:30 CEST
    (
        "berlin fixed repeated fires once",
        "30 2 * * *",
        "Europe/Berlin",
        "2024-10-27 00:30",
        "2024-10-28 01:30",
    ),  # 10-28 02:30 CET
    (
        "berlin wildcard hour repeats",
        "30 * * * *",
        "Europe/Berlin",
        "2024-10-27 00:30",
        "2024-10-27 01:30",
    ),  # 02:30 CET
    (
        "berlin wildcard minute in the skipped hour",
        "*/20 2 * * *",
        "Europe/Berlin",
        "2024-03-31 00:50",
        "2024-04-01 00:00",
    ),  # 04-01 02:00 CEST
    # -- Lord Howe, 30-minute DST --
    (
        "lord howe fixed skipped fires at the jump",
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2024-10-05 12:00",
        "2024-10-05 15:30",
    ),  # 02:15 does not exist: 02:30 +11
    (
        "lord howe fixed after the gap is normal",
        "45 2 * * *",
        "Australia/Lord_Howe",
        "2024-10-05 12:00",
        "2024-10-05 15:45",
    ),  # 02:45 +11
    (
        "lord howe fixed repeated fires at the first",
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2024-04-06 12:00",
        "2024-04-06 14:45",
    ),  # 04-07 01:45 +11
    (
        "lord howe fixed repeated fires once",
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2024-04-06 14:45",
        "2024-04-07 15:15",
    ),  # 04-08 01:45 +10:30, not 04-06 15:15Z
    (
        "lord howe fixed before the repeat is normal",
        "15 1 * * *",
        "Australia/Lord_Howe",
        "2024-04-06 12:00",
        "2024-04-06 14:15",
    ),  # 01:15 +11 happens once
    (
        "lord howe wildcard skips the half hour",
        "*/20 * * * *",
        "Australia/Lord_Howe",
        "2024-10-05 15:20",
        "2024-10-05 15:40",
    ),  # 01:50 -> 02:40; 02:00 and 02:20 never happen
    (
        "lord howe wildcard lands on the jump",
        "*/15 2 * * *",
        "Australia/Lord_Howe",
        "2024-10-05 15:00",
        "2024-10-05 15:30",
    ),  # 02:30 +11 is the first 02:xx that happens
    (
        "lord howe wildcard repeats the half hour",
        "*/20 * * * *",
        "Australia/Lord_Howe",
        "2024-04-06 14:50",
        "2024-04-06 15:10",
    ),  # 01:50 +11 -> 01:40 +10:30
    (
        "lord howe wildcard hour repeats",
        "40 * * * *",
        "Australia/Lord_Howe",
        "2024-04-06 14:40",
        "2024-04-06 15:10",
    ),  # 01:40 +11, then 01:40 +10:30
    # -- Santiago, southern hemisphere, DST at midnight --
    (
        "santiago skipped midnight fires at the jump",
        "0 0 * * *",
        "America/Santiago",
        "2024-09-07 12:00",
        "2024-09-08 04:00",
    ),  # 09-08 00:00 does not exist: 01:00 -03
    (
        "santiago skipped midnight on its weekday",
        "0 0 * * 0",
        "America/Santiago",
        "2024-09-07 12:00",
        "2024-09-08 04:00",
    ),  # 09-08 is a Sunday
    (
        "santiago fixed repeated fires at the first",
        "30 23 * * *",
        "America/Santiago",
        "2024-04-06 12:00",
        "2024-04-07 02:30",
    ),  # 04-06 23:30 -03
    (
        "santiago fixed repeated fires once",
        "30 23 * * *",
        "America/Santiago",
        "2024-04-07 02:30",
        "2024-04-08 03:30",
    ),  # 04-07 23:30 -04
    (
        "santiago wildcard hour repeats",
        "30 * * * *",
        "America/Santiago",
        "2024-04-07 02:30",
        "2024-04-07 03:30",
    ),  # 04-06 23:30 -04
]


@pytest.mark.parametrize(
    ("expr", "tz", "after", "expected"), [c[1:] for c in DST_CASES], ids=[c[0] for c in DST_CASES]
)
def test_dst(cdb: psycopg.Connection, expr: str, tz: str, after: str, expected: str) -> None:
    assert cron_next(cdb, expr, after, tz) == _utc(expected)


# --------------------------------------------------------------------------------------------
# Every dialect feature once (UTC). 2024-01-01 is a Monday; 2024 is a leap year.
# --------------------------------------------------------------------------------------------
FEATURE_CASES = [
    ("number", "17 * * * *", "2024-01-01 00:00", "2024-01-01 00:17"),
    ("range", "0 9-17 * * *", "2024-01-01 17:30", "2024-01-02 09:00"),
    ("star step", "*/20 * * * *", "2024-01-01 00:41", "2024-01-01 01:00"),
    ("range step", "10-40/15 * * * *", "2024-01-01 00:26", "2024-01-01 00:40"),
    ("start step n/s", "50/4 * * * *", "2024-01-01 00:58", "2024-01-01 01:50"),
    ("list", "5,35 * * * *", "2024-01-01 00:06", "2024-01-01 00:35"),
    ("list of ranges and steps", "0 1-2,*/12,20 * * *", "2024-01-01 12:00", "2024-01-01 20:00"),
    ("month number", "0 0 1 6 *", "2024-01-01 00:00", "2024-06-01 00:00"),
    ("month name", "0 0 1 JUN *", "2024-01-01 00:00", "2024-06-01 00:00"),
    ("month names range step, lower case", "0 0 1 jun-dec/2 *", "2024-06-01 00:00", "2024-08-01 00:00"),
    ("weekday names range", "0 12 * * MON-FRI", "2024-01-05 12:00", "2024-01-08 12:00"),
    ("weekday name lower case", "0 0 * * sun", "2024-01-01 00:00", "2024-01-07 00:00"),
    ("weekday 0 is Sunday", "0 0 * * 0", "2024-01-01 00:00", "2024-01-07 00:00"),
    ("weekday 7 is Sunday", "0 0 * * 7", "2024-01-01 00:00", "2024-01-07 00:00"),
    ("weekday range to 7", "0 0 * * 6-7", "2024-01-01 00:00", "2024-01-06 00:00"),
    ("weekday range ending on SUN", "0 0 * * FRI-SUN", "2024-01-01 00:00", "2024-01-05 00:00"),
    ("SUN ends a range on Sunday", "0 0 * * SAT-SUN", "2024-01-06 00:00", "2024-01-07 00:00"),
    ("MON-SUN is every day", "0 0 * * MON-SUN", "2024-01-01 00:00", "2024-01-02 00:00"),
    ("weekday step", "0 0 * * */3", "2024-01-01 00:00", "2024-01-03 00:00"),  # Sun, Wed, Sat
    ("@yearly", "@yearly", "2024-01-01 00:00", "2025-01-01 00:00"),
    ("@annually", "@annually", "2024-01-01 00:00", "2025-01-01 00:00"),
    ("@monthly", "@monthly", "2024-01-01 00:00", "2024-02-01 00:00"),
    ("@weekly", "@weekly", "2024-01-01 00:00", "2024-01-07 00:00"),
    ("@daily", "@daily", "2024-01-01 00:00", "2024-01-02 00:00"),
    ("@midnight", "@midnight", "2024-01-01 00:00", "2024-01-02 00:00"),
    ("@hourly", "@hourly", "2024-01-01 00:00", "2024-01-01 01:00"),
    ("macro upper case", "@DAILY", "2024-01-01 00:00", "2024-01-02 00:00"),
    ("L leap February", "0 0 L * *", "2024-02-01 00:00", "2024-02-29 00:00"),
    ("L common February", "0 0 L * *", "2023-02-01 00:00", "2023-02-28 00:00"),
    ("L in a list", "0 0 15,L * *", "2024-04-15 00:00", "2024-04-30 00:00"),
    ("L in one month", "0 0 L 2 *", "2024-03-01 00:00", "2025-02-28 00:00"),
    ("d#n", "0 0 * * 1#1", "2024-01-01 00:00", "2024-02-05 00:00"),
    ("d#5 skips months without one", "0 0 * * FRI#5", "2024-01-01 00:00", "2024-03-29 00:00"),
    ("d#n with 7", "0 0 * * 7#2", "2024-01-01 00:00", "2024-01-14 00:00"),
    ("dL", "0 9 * * 5L", "2024-01-01 00:00", "2024-01-26 09:00"),
    ("dL with 7 and lower case", "0 0 * * 7l", "2024-01-01 00:00", "2024-01-28 00:00"),
    ("d#n and dL in one list", "0 0 * * 1#2,1L", "2024-01-08 00:00", "2024-01-29 00:00"),
    ("plain weekdays with d#n", "0 0 * * 1,2#2", "2024-01-08 00:00", "2024-01-09 00:00"),
    ("both restricted: either matches (Vixie)", "0 0 13 * 5", "2024-01-12 00:00", "2024-01-13 00:00"),
    ("both restricted: either matches, d#n", "0 0 1 * 1#2", "2024-01-01 00:00", "2024-01-08 00:00"),
    (
        "day-of-month starting with * is unrestricted: both must match",
        "0 0 */2 * 5",
        "2024-01-05 00:00",
        "2024-01-19 00:00",
    ),
    (
        "day-of-week starting with * is unrestricted: both must match",
        "0 0 13 * */7",
        "2024-01-01 00:00",
        "2024-10-13 00:00",
    ),  # the 13th that is a Sunday
    ("leap day", "0 0 29 2 *", "2024-03-01 00:00", "2028-02-29 00:00"),
    ("rarest: fifth Monday of February", "0 0 * 2 1#5", "2024-01-01 00:00", "2044-02-29 00:00"),
    ("tabs and extra spaces", "  0\t12   * * *\n", "2024-01-01 00:00", "2024-01-01 12:00"),
    ("leading zeros", "05 007 * * *", "2024-01-01 00:00", "2024-01-01 07:05"),
    ("strictly after", "30 * * * *", "2024-01-01 00:30", "2024-01-01 01:30"),
]


@pytest.mark.parametrize(
    ("expr", "after", "expected"), [c[1:] for c in FEATURE_CASES], ids=[c[0] for c in FEATURE_CASES]
)
def test_dialect_feature(cdb: psycopg.Connection, expr: str, after: str, expected: str) -> None:
    assert cron_next(cdb, expr, after) == _utc(expected)


def test_after_with_seconds(cdb: psycopg.Connection) -> None:
    row = cdb.execute(
        "SELECT dispatch.cron_next('30 * * * *', '2024-01-01 00:29:59.5+00'),"
        "       dispatch.cron_next('30 * * * *', '2024-01-01 00:30:00.5+00')"
    ).fetchone()
    assert row == (_utc("2024-01-01 00:30"), _utc("2024-01-01 01:30"))


def test_the_engines_innermost_step_is_inlined(cdb: psycopg.Connection) -> None:
    # dispatch._next_bit runs ten times a slot: called as a function of its own (a STRICT one
    # with a CASE in its body is not inlined) it cost cron_spec_next a third of its time.
    assert cdb.execute("SELECT dispatch._next_bit(40::bigint, 1), dispatch._next_bit(40::bigint, 6),"
                       " dispatch._next_bit(NULL, 1), dispatch._next_bit(40::bigint, NULL)"
                       ).fetchone() == (3, None, None, None)
    plan = "\n".join(row[0] for row in cdb.execute(
        "EXPLAIN (VERBOSE) SELECT dispatch._next_bit(g::bigint, 2) FROM generate_series(1, 64) g"))
    assert "_next_bit" not in plan and "ln(" in plan, plan


def test_named_zone(cdb: psycopg.Connection) -> None:
    assert cron_next(cdb, "0 9 * * *", "2024-01-01 00:00", "Europe/Berlin") == _utc("2024-01-01 08:00")
    assert cron_next(cdb, "0 9 * * *", "2024-07-01 00:00", "Europe/Berlin") == _utc("2024-07-01 07:00")
    assert cron_next(cdb, "0 9 * * *", "2024-01-01 00:00", "America/Argentina/Buenos_Aires") == _utc(
        "2024-01-01 12:00"
    )


# --------------------------------------------------------------------------------------------
# cron_is_valid never raises.
# --------------------------------------------------------------------------------------------
NOT_VALID = [
    None,
    "",
    " ",
    "garbage",
    "* * * * * * * * * *",
    "0 0 30 2 *",
    "\u00a0",
    "\U0001f600 * * * *",
    "x" * 10_000,
    "1," * 5_000 + " * * * *",  # 10 kB, an empty list item at the end
    "* " * 5_000,
    "9" * 10_000 + " * * * *",
    "@" + "daily" * 2_000,
    "0 0 * * " + "1#" * 5_000,
]


@pytest.mark.parametrize("expr", NOT_VALID, ids=lambda e: repr(e)[:30])
def test_cron_is_valid_never_raises(cdb: psycopg.Connection, expr: str | None) -> None:
    row = cdb.execute("SELECT dispatch.cron_is_valid(%s)", [expr]).fetchone()
    assert row == (False,)


def test_cron_is_valid_true_for_long_valid_expression(cdb: psycopg.Connection) -> None:
    long_list = ",".join(str(m % 60) for m in range(3_000))  # ~10 kB
    row = cdb.execute(
        "SELECT dispatch.cron_is_valid(%s), dispatch.cron_is_valid('*/5 * * * *')", [f"{long_list} * * * *"]
    ).fetchone()
    assert row == (True, True)


# --------------------------------------------------------------------------------------------
# The write path refuses bad expressions: SQLSTATE 22023, a message naming the field and the
# offending part, and nothing written.
# --------------------------------------------------------------------------------------------
INSERT = (
    "INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, timezone)"
    " VALUES ('proj', 'fn', %s, %s)"
)

BAD_CRON = [
    # expression, fragments the message must contain (after the cron_expression "<expr>": prefix)
    # -- out of range, every field --
    ("60 * * * *", ["minute", "60"]),
    ("* 24 * * *", ["hour", "24"]),
    ("* * 0 * *", ["day-of-month", "0"]),
    ("* * 32 * *", ["day-of-month", "32"]),
    ("* * * 0 *", ["month", "0"]),
    ("* * * 13 *", ["month", "13"]),
    ("* * * * 8", ["day-of-week", "8"]),
    ("0-60 * * * *", ["minute", "60"]),
    ("* 0-24 * * *", ["hour", "24"]),
    ("* * 1-32 * *", ["day-of-month", "32"]),
    ("* * * 0-12 *", ["month", "0"]),
    ("* * * * 0-8", ["day-of-week", "8"]),
    ("60/5 * * * *", ["minute", "60"]),
    ("-1 * * * *", ["minute", "-1"]),
    # -- steps --
    ("*/0 * * * *", ["minute", "step", "0"]),
    ("*/61 * * * *", ["minute", "step", "61"]),
    ("* */25 * * *", ["hour", "step", "25"]),
    ("0 0 1-5/0 * *", ["day-of-month", "step", "0"]),
    ("0 0 * 1/13 *", ["month", "step", "13"]),
    ("0 0 * * 0/8", ["day-of-week", "step", "8"]),
    ("*/ * * * *", ["minute", "step"]),
    ("*/x * * * *", ["minute", "*/x"]),
    ("*/-5 * * * *", ["minute", "-5"]),
    ("*/1.5 * * * *", ["minute", "*/1.5"]),
    ("*/5/5 * * * *", ["minute", "*/5/5"]),
    ("/5 * * * *", ["minute", "/5"]),
    ("0 0 */2-4 * *", ["day-of-month", "2-4"]),
    # -- ranges --
    ("30-10 * * * *", ["minute", "30-10", "reversed"]),
    ("* 20-5 * * *", ["hour", "20-5", "reversed"]),
    ("* * * DEC-JAN *", ["month", "DEC-JAN", "reversed"]),
    ("* * * * FRI-MON", ["day-of-week", "FRI-MON", "reversed"]),
    ("* * * * 7-0", ["day-of-week", "7-0", "reversed"]),
    ("1-2-3 * * * *", ["minute", "1-2-3"]),
    ("1- * * * *", ["minute", "1-"]),
    # -- field counts --
    ("", ["empty"]),
    ("   ", ["empty"]),
    ("*", ["5 fields", "got 1"]),
    ("* * * *", ["5 fields", "got 4"]),
    ("* * * * * *", ["5 fields", "got 6"]),  # a seconds field (Quartz, Spring)
    ("0 0 0 * * * *", ["5 fields", "got 7"]),  # seconds and year
    ("0 0 * * * 2024", ["5 fields", "got 6"]),  # a year field
    ("0 0 * * * /usr/bin/backup", ["5 fields", "got 6"]),  # a crontab line with its command
    ("every 5 minutes", ["5 fields", "got 3"]),
    ("0\u00a00 * * *", ["5 fields", "got 4"]),  # a no-break space does not separate fields
    ("0 0 * * *\n0 1 * * *", ["5 fields"]),  # two crontab lines
    # -- names --
    ("* * * JANUARY *", ["month", "JANUARY"]),
    ("* * * FOO *", ["month", "FOO"]),
    ("* * * * MONDAY", ["day-of-week", "MONDAY"]),
    ("* * * * MO", ["day-of-week", "MO"]),
    ("JAN * * * *", ["minute", "JAN"]),
    ("* * JAN * *", ["day-of-month", "JAN"]),
    ("* * * MON *", ["month", "MON"]),
    ("* * * * JAN", ["day-of-week", "JAN"]),
    # -- macros --
    ("@reboot", ["macro", "@reboot"]),
    ("@every 5m", ["macro", "@every 5m"]),
    ("@daily 1", ["macro", "@daily 1"]),
    ("@hourly *", ["macro", "@hourly *"]),
    ("@", ["macro"]),
    ("@yearlyy", ["macro", "@yearlyy"]),
    # -- other crons' syntax: Quartz ?, W, LW, L-n; Jenkins H; R --
    ("0 0 ? * MON", ["day-of-month", "?"]),
    ("0 0 15W * *", ["day-of-month", "15W"]),
    ("0 0 LW * *", ["day-of-month", "LW"]),
    ("0 0 L-3 * *", ["day-of-month", "L-3"]),
    ("0 0 1W,L * *", ["day-of-month", "1W"]),
    ("H * * * *", ["minute", "H"]),
    ("R * * * *", ["minute", "R"]),
    # -- d#n, dL, L in the wrong place --
    ("0 0 * * 1#6", ["day-of-week", "1#6"]),
    ("0 0 * * 1#0", ["day-of-week", "1#0"]),
    ("0 0 * * 8#1", ["day-of-week", "8"]),
    ("0 0 * * 1#", ["day-of-week", "1#"]),
    ("0 0 * * #2", ["day-of-week", "#2"]),
    ("0 0 * * 1#2#3", ["day-of-week", "1#2#3"]),
    ("0 0 * * 5#1-3", ["day-of-week", "5#1-3"]),
    ("0 0 * * 8L", ["day-of-week", "8"]),
    ("0 0 * * L", ["day-of-week", "L"]),
    ("0 0 * * L5", ["day-of-week", "L5"]),  # croniter's spelling of 5L
    ("0 0 5L * *", ["day-of-month", "5L"]),
    ("0 0 1#2 * *", ["day-of-month", "1#2"]),
    ("0 L * * *", ["hour", "L"]),
    ("L * * * *", ["minute", "L"]),
    ("0 0 * L *", ["month", "L"]),
    ("0 0 L/2 * *", ["day-of-month", "L/2"]),
    # -- empty list items --
    ("1,,2 * * * *", ["minute", "empty"]),
    (",1 * * * *", ["minute", "empty"]),
    ("1, * * * *", ["minute", "empty"]),
    ("0 0 * * 1,", ["day-of-week", "empty"]),
    # -- huge numbers --
    ("99999999999999999999 * * * *", ["minute", "99999999999999999999"]),
    ("*/99999999999 * * * *", ["minute", "step", "99999999999"]),
    ("0 0 1-99999999999 * *", ["day-of-month", "99999999999"]),
    # -- not ASCII digits, not integers --
    ("\u0663 * * * *", ["minute", "\u0663"]),  # ARABIC-INDIC DIGIT THREE
    ("\uff11 * * * *", ["minute", "\uff11"]),  # FULLWIDTH DIGIT ONE
    ("\u2075 * * * *", ["minute", "\u2075"]),  # SUPERSCRIPT FIVE
    ("0 0 * * \uff15", ["day-of-week", "\uff15"]),
    ("1.5 * * * *", ["minute", "1.5"]),
    ("+5 * * * *", ["minute", "+5"]),
    ("0x10 * * * *", ["minute", "0x10"]),
    ("** * * * *", ["minute", "**"]),
    ("0 0 * * mon-fri;", ["day-of-week", "mon-fri;"]),
    ('"0 0 * * *"', ["minute", '"0']),
    # -- can never fire --
    ("0 0 30 2 *", ["never fire"]),
    ("0 0 31 4 *", ["never fire"]),
    ("0 0 31 4,6,9,11 *", ["never fire"]),
    ("0 0 30-31 2 *", ["never fire"]),
    ("0 0 */30 2 1#5", ["never fire"]),  # days 1 and 31 of February that are its fifth Monday
]


def _counts(db: psycopg.Connection) -> tuple[int, int]:
    row = db.execute(
        "SELECT (SELECT count(*) FROM dispatch.schedules), (SELECT count(*) FROM dispatch.audit_log)"
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def test_enough_kinds_of_bad_cron() -> None:
    assert len({e for e, _ in BAD_CRON}) == len(BAD_CRON) >= 50


@pytest.mark.parametrize(("expr", "fragments"), BAD_CRON, ids=[repr(e)[1:-1] for e, _ in BAD_CRON])
def test_bad_cron_refused_at_insert(clean_cdb: psycopg.Connection, expr: str, fragments: list[str]) -> None:
    before = _counts(clean_cdb)
    with pytest.raises(errors.InvalidParameterValue) as excinfo:
        clean_cdb.execute(INSERT, [expr, "UTC"])
    assert excinfo.value.sqlstate == "22023"
    message = excinfo.value.diag.message_primary or ""
    prefix = f'cron_expression "{expr}": '
    assert message.startswith(prefix), message
    detail = message[len(prefix) :]
    for fragment in fragments:
        assert fragment in detail, f"{fragment!r} not in {message!r}"
    assert _counts(clean_cdb) == before == (0, 0)
    assert clean_cdb.execute("SELECT dispatch.cron_is_valid(%s)", [expr]).fetchone() == (False,)


def test_bad_cron_refused_at_update(db: psycopg.Connection) -> None:
    db.execute(INSERT, ["*/5 * * * *", "UTC"])
    before = db.execute("SELECT cron_expression, next_run_at FROM dispatch.schedules").fetchone()
    audit = _counts(db)[1]
    with pytest.raises(errors.InvalidParameterValue, match=r'^cron_expression "0 0 30 2 \*": '):
        db.execute("UPDATE dispatch.schedules SET cron_expression = '0 0 30 2 *'")
    assert db.execute("SELECT cron_expression, next_run_at FROM dispatch.schedules").fetchone() == before
    assert _counts(db)[1] == audit


def test_long_bad_cron_message_is_cut(clean_cdb: psycopg.Connection) -> None:
    expr = "1," * 5_000 + "61 * * * *"
    with pytest.raises(errors.InvalidParameterValue) as excinfo:
        clean_cdb.execute(INSERT, [expr, "UTC"])
    message = excinfo.value.diag.message_primary or ""
    assert message.startswith(f'cron_expression "{expr[:80]}...": '), message[:200]
    assert "minute" in message and "61" in message
    assert len(message) < 400
    assert _counts(clean_cdb) == (0, 0)


def test_null_cron_refused(clean_cdb: psycopg.Connection) -> None:
    with pytest.raises(errors.InvalidParameterValue, match="cron_expression"):
        clean_cdb.execute(INSERT, [None, "UTC"])
    assert _counts(clean_cdb) == (0, 0)


# --------------------------------------------------------------------------------------------
# Time zones.
# --------------------------------------------------------------------------------------------
BAD_ZONES = [
    "PST",  # abbreviation
    "CEST",  # abbreviation
    "+05",  # POSIX offset (PostgreSQL would read it with the sign inverted)
    "-03:00",
    "UTC+3",  # POSIX TZ string
    "UTC0",
    "Z",
    "garbage",
    "",
    " UTC",
    "Europe/Berlinn",
    "Europe/../Berlin",
    "x" * 1000,
    "localtime",  # whatever the server's clock is set to
    "posixrules",
    "Factory",
    "posix/Europe/Berlin",  # a copy: use Europe/Berlin
]


@pytest.mark.parametrize("tz", BAD_ZONES, ids=lambda z: repr(z)[:20])
def test_bad_timezone_refused_at_insert(clean_cdb: psycopg.Connection, tz: str) -> None:
    with pytest.raises(errors.InvalidParameterValue) as excinfo:
        clean_cdb.execute(INSERT, ["0 9 * * *", tz])
    assert excinfo.value.sqlstate == "22023"
    message = excinfo.value.diag.message_primary or ""
    assert message.startswith("timezone "), message
    assert tz[:80] in message
    assert _counts(clean_cdb) == (0, 0)
    with pytest.raises(errors.InvalidParameterValue, match=r"^timezone "):
        clean_cdb.execute("SELECT dispatch.cron_next('0 9 * * *', now(), %s)", [tz])


def test_null_timezone_refused(clean_cdb: psycopg.Connection) -> None:
    with pytest.raises(errors.InvalidParameterValue, match=r"^timezone"):
        clean_cdb.execute(INSERT, ["0 9 * * *", None])
    assert _counts(clean_cdb) == (0, 0)


@pytest.mark.parametrize(
    "tz", ["UTC", "Europe/Berlin", "Australia/Lord_Howe", "America/Argentina/Buenos_Aires"]
)
def test_good_timezone_accepted(db: psycopg.Connection, tz: str) -> None:
    row = db.execute(
        INSERT + " RETURNING timezone, next_run_at, next_run_at > now()", ["0 9 * * *", tz]
    ).fetchone()
    assert row is not None
    assert row[0] == tz and row[1] is not None and row[2] is True
    expected = db.execute("SELECT dispatch.cron_next('0 9 * * *', now(), %s)", [tz]).fetchone()
    assert expected is not None and row[1] == expected[0]
    assert _counts(db) == (1, 1)
