"""Hostile input on the write path: generated cron expressions and time-zone names, 3,600 in the
suite's run (PGDISPATCH_FUZZ_EXAMPLES=2000 gives 120,000, by hand).

Each input is written with a plain INSERT into dispatch.schedules, inside its own subtransaction
of one PL/pgSQL batch (a round trip per few hundred inputs), and must be either accepted with a
valid next_run_at or refused with a clear error of SQLSTATE class 22 (data exception) or 23
(integrity constraint) — never another class, an internal error, or a hang. Inputs travel as
bytes and are decoded by the server inside the subtransaction, so NUL and invalid UTF-8 reach the
write path the only way they can (as a refused conversion) instead of being stopped by the driver.
Afterwards every accepted schedule goes through tick, claim_runs and complete_runs.
"""

from __future__ import annotations

import os
import string
from dataclasses import dataclass, field

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

BATCH = 60
# x BATCH generated strings: cron expressions, and (one in sixteen) zone names. The suite's run
# (3,600); a long run by hand: PGDISPATCH_FUZZ_EXAMPLES=2000.
EXAMPLES = int(os.environ.get("PGDISPATCH_FUZZ_EXAMPLES", "60"))
SLOW_MS = 2000.0

TRY_WRITES = r"""
CREATE FUNCTION pg_temp.try_writes(exprs bytea[], zones bytea[])
RETURNS TABLE (k integer, state text, message text, next_at timestamptz, ms float8,
               expr_valid boolean, zone_valid boolean, decoded boolean)
LANGUAGE plpgsql
AS $$
DECLARE
    e text;
    z text;
    started timestamptz;
BEGIN
    FOR i IN 1 .. cardinality(exprs) LOOP
        k := i; state := '00000'; message := NULL; next_at := NULL;
        expr_valid := NULL; zone_valid := NULL; e := NULL; z := NULL; decoded := false;
        started := clock_timestamp();
        BEGIN
            e := convert_from(exprs[i], 'UTF8');
            z := convert_from(zones[i], 'UTF8');
            decoded := true;
            INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, timezone)
            VALUES ('fuzz', 'f', e, z)
            RETURNING dispatch.schedules.next_run_at INTO next_at;
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT;
        END;
        ms := extract(epoch FROM clock_timestamp() - started) * 1000;
        IF decoded THEN
            expr_valid := dispatch.cron_is_valid(e);
            -- the cached names (check_timezone's fallback reads pg_timezone_names: tens of ms)
            zone_valid := EXISTS (SELECT 1 FROM dispatch.timezones WHERE name = z);
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;
"""

# -- generated cron expressions ----------------------------------------------------------------

NAMES = ["JAN", "feb", "Mar", "DEC", "SUN", "mon", "Fri", "SAT", "sun", "JANUARY", "MONDAY", "XYZ",
         "\uff2d\uff2f\uff2e", "\uff2aan", "MON\u0301", "\uff33\uff35\uff2e"]
HUGE = ["2147483648", "9223372036854775808", "99999999999999999999999999999999", "-1", "-0", "+5",
        "0x10", "1e3", "1.5", "00000000000000000000007", "٣", "\uff15", "¹", "Ⅻ", "1_000", "NaN", "∞"]
SPECIALS = ["*", "?", "L", "W", "H", "LW", "5L", "L-3", "15W", "1#5", "5#0", "5#6", "7L", "0#1",
            "*/0", "*/-1", "*/60", "*/1000000000000", "/", "-", ",", "#", "1-", "-1", "5-1", "0-59/0",
            "1-59/59", "1,,2", "1,", ",1", "**", "*/", "*/*", "1/0", "0/5", "1-5/2/3", "1--2", "1-2-3"]
MACROS = ["@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly", "@reboot",
          "@every", "@every 5m", "@YEARLY", "@", "@@daily", "@daily *", "@ daily", "@minutely"]
SEPARATORS = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2003", " \x00 ", "\x0b", ""]


def _field() -> st.SearchStrategy[str]:
    number = st.one_of(st.integers(-5, 100).map(str), st.sampled_from(HUGE),
                       st.integers(-(10**40), 10**40).map(str))
    atom = st.one_of(number, st.sampled_from(NAMES), st.sampled_from(SPECIALS))
    ranged = st.builds(lambda a, b: f"{a}-{b}", atom, atom)
    stepped = st.builds(lambda a, s: f"{a}/{s}", st.one_of(atom, ranged), number)
    item = st.one_of(atom, ranged, stepped)
    return st.one_of(item, st.lists(item, min_size=2, max_size=6).map(",".join))


def _expression() -> st.SearchStrategy[str]:
    fields = st.lists(_field(), min_size=0, max_size=8)
    joined = st.builds(lambda parts, sep: sep.join(parts), fields, st.sampled_from(SEPARATORS))
    padded = st.builds(lambda e, a, b: a + e + b, joined, st.sampled_from(["", " ", "\t", "\x00"]),
                       st.sampled_from(["", " ", "\n", "\x00", "\ufeff"]))
    # 10 kB and longer: a valid list stretched out, or junk repeated
    huge_list = st.builds(lambda n, rest: ",".join(["0"] * n) + rest, st.integers(2_000, 6_000),
                          st.sampled_from([" * * * *", " 0 * * *", "", " * * *", " * * * * *"]))
    repeated = st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=5), st.integers(2_000, 5_000))
    macro = st.builds(lambda m, tail: m + tail, st.sampled_from(MACROS),
                      st.sampled_from(["", " ", "x", "\x00"]))
    valid_ish = st.sampled_from(["* * * * *", "0 0 30 2 *", "0 0 31 4 *", "0 0 29 2 *", "0 0 29 2 1",
                                 "59 23 31 12 *", "0 0 L 2 *", "0 0 * * 5L", "0 0 * * MON#5",
                                 "0 0 31 2,4,6,9,11 *", "0 0 30 2 MON#5", "*/15 2 * * *", "0 0 1 1 *"])
    common = st.one_of(joined, joined, padded, macro, valid_ish, st.text(max_size=40),
                       st.text(alphabet=string.printable, max_size=30))
    return _rarely(st.one_of(huge_list, repeated), common)


def _rarely(rare: st.SearchStrategy[str], common: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """`rare` about 4% of the time: 10 kB inputs cost more to generate and to parse."""
    return st.integers(0, 99).flatmap(lambda n: rare if n < 4 else common)


def _zone(names: list[str]) -> st.SearchStrategy[str]:
    real = st.sampled_from(names)
    mangled = st.one_of(
        real.map(str.lower), real.map(str.upper), real.map(lambda n: f" {n}"), real.map(lambda n: f"{n}\x00"),
        real.map(lambda n: f"posix/{n}"), real.map(lambda n: f"right/{n}"), real.map(lambda n: f"../{n}"),
        real.map(lambda n: n.replace("/", "/../")), real.map(lambda n: n * 500),
    )
    offsets = st.sampled_from([
        "+05", "-05", "UTC+3", "UTC-14", "GMT+0", "<+03>-3", "EST5EDT", "CEST", "CET", "Z", "z", "+00:00",
        "+99", "-99999999999", "localtime", "posixrules", "Factory", "/etc/passwd", "../../../../etc/passwd",
        "", " ", "Europe/", "/UTC", "UTC/", "Etc/GMT+12", "Etc/GMT-14", "Europe/Berlin\n", "Europe\\Berlin",
        "\uff35\uff34\uff23"])
    long = st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=4), st.integers(2_500, 5_000))
    return _rarely(long, st.one_of(real, real, mangled, offsets, st.text(max_size=30)))


@dataclass
class Tally:
    inputs: int = 0
    accepted: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    slowest_ms: float = 0.0
    longest_message: int = 0
    longest_message_input: str = ""


def _check_batch(db: psycopg.Connection, exprs: list[str], zones: list[str], tally: Tally) -> None:
    rows = db.execute(
        "SELECT r.*, r.next_at > now() AND r.next_at = date_trunc('minute', r.next_at)"
        " FROM pg_temp.try_writes(%s::bytea[], %s::bytea[]) r",
        ([e.encode() for e in exprs], [z.encode() for z in zones]),
    ).fetchall()
    assert len(rows) == len(exprs)
    for k, state, message, next_at, ms, expr_valid, zone_valid, decoded, next_ok in rows:
        tally.inputs += 1
        tally.slowest_ms = max(tally.slowest_ms, ms)
        what = f"{exprs[k - 1][:60]!r} in {zones[k - 1][:40]!r}"
        if ms > SLOW_MS:
            tally.problems.append(f"{what}: took {ms:.0f} ms")
        if state == "00000":
            tally.accepted += 1
            if not next_ok or not expr_valid or not zone_valid:
                tally.problems.append(f"{what}: accepted with next_run_at {next_at}"
                                      f" (cron_is_valid {expr_valid}, zone valid {zone_valid})")
            continue
        tally.refused[state] = tally.refused.get(state, 0) + 1
        if len(message or "") > tally.longest_message:
            tally.longest_message = len(message or "")
            tally.longest_message_input = f"{what} -> {state} {message[:300]!r}"
        if state[:2] not in ("22", "23") or not message:
            tally.problems.append(f"{what}: refused with SQLSTATE {state}: {message!r:.200}")
        elif decoded and expr_valid and zone_valid:
            tally.problems.append(f"{what}: expression and zone each valid, yet refused: {state}"
                                  f" {message:.200}")


def test_fuzzed_cron_expressions_and_zones_are_accepted_or_refused_cleanly(db: psycopg.Connection) -> None:
    db.execute("SET statement_timeout = '60s'")
    db.execute(TRY_WRITES)
    names = [row[0] for row in db.execute("SELECT name FROM dispatch.timezones ORDER BY name")]
    tally = Tally()

    # The trigger checks the expression first, so a zone is only looked at next to a valid
    # expression; and a refused zone costs a read of pg_timezone_names. Each pair fuzzes one of the two.
    fuzz_expression = st.tuples(_expression(),
                                st.sampled_from(["UTC", "Europe/Berlin", "Australia/Lord_Howe"]))
    fuzz_zone = st.tuples(st.sampled_from(["* * * * *", "30 2 * * *", "0 0 L * *"]), _zone(names))
    pair = st.integers(0, 15).flatmap(lambda n: fuzz_zone if n == 0 else fuzz_expression)

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.large_base_example])
    @given(st.lists(pair, min_size=BATCH, max_size=BATCH))
    def batch(pairs: list[tuple[str, str]]) -> None:
        _check_batch(db, [e for e, _ in pairs], [z for _, z in pairs], tally)

    batch()
    print(f"fuzz: {tally.inputs} inputs, {tally.accepted} accepted, refused by SQLSTATE {tally.refused}, "
          f"slowest {tally.slowest_ms:.0f} ms, longest error message {tally.longest_message} chars"
          f" ({tally.longest_message_input})")
    assert tally.inputs >= EXAMPLES * BATCH
    assert not tally.problems, "\n".join(tally.problems[:30])
    assert tally.accepted > 100 and sum(tally.refused.values()) > 1000  # both sides were exercised

    # The schema still works with whatever was accepted: every schedule is marked, claimed,
    # completed and advanced.
    accepted = db.execute("SELECT count(*) FROM dispatch.schedules").fetchone()
    assert accepted is not None
    marked = db.execute("SELECT dispatch.tick(now() + interval '100 years')").fetchone()
    assert marked == accepted
    claimed = db.execute(
        "SELECT array_agg(run_id) FROM dispatch.claim_runs('fuzz', 1000000, interval '1 hour')").fetchone()
    assert claimed is not None and len(claimed[0]) == accepted[0]
    results = db.execute(
        "SELECT count(*) FILTER (WHERE recorded), count(*) FILTER (WHERE advanced)"
        " FROM dispatch.complete_runs('fuzz', %s, array_fill(1, ARRAY[%s]),"
        " array_fill('ok'::text, ARRAY[%s]), array_fill(NULL::text, ARRAY[%s]),"
        " array_fill(NULL::int, ARRAY[%s]), array_fill(1, ARRAY[%s]))",
        (claimed[0], accepted[0], accepted[0], accepted[0], accepted[0], accepted[0]),
    ).fetchone()
    assert results == (accepted[0], accepted[0])
    stuck = db.execute(
        "SELECT count(*) FROM dispatch.schedules s JOIN dispatch.runs r ON r.schedule_id = s.id"
        " WHERE s.next_run_at IS NULL OR s.next_run_at <= r.scheduled_for").fetchone()
    assert stuck == (0,)
    assert db.execute("SELECT dispatch.tick()").fetchone() == (0,)


def test_nul_cannot_reach_the_write_path_as_text(db: psycopg.Connection) -> None:
    """psycopg refuses a NUL in a text parameter before sending it; PostgreSQL refuses it in SQL."""
    with pytest.raises(psycopg.DataError):
        db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
                   " VALUES ('p', 'f', %s)", ("* * * * *\x00",))
    for sql in ("SELECT chr(0)", "SELECT E'\\x00'::text", "SELECT convert_from('\\x2a00'::bytea, 'UTF8')"):
        with pytest.raises(psycopg.Error) as refused:
            db.execute(sql)
        assert refused.value.sqlstate is not None and refused.value.sqlstate[:2] in ("22", "54"), sql


def test_error_messages_stay_short_whatever_the_input_length(db: psycopg.Connection) -> None:
    """The write path cuts the expression in its messages to 80 characters; the offending part it
    names afterwards must be cut too, or a 10 kB field makes a 10 kB error message."""
    long = "1" * 10_000
    for expression in (f"{long} * * * *", f"0 0 {long} * *", "* * * * " + "x" * 10_000, "@" + "d" * 10_000):
        with pytest.raises(psycopg.Error) as refused:
            db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
                       " VALUES ('p', 'f', %s)", (expression,))
        assert refused.value.sqlstate == "22023"
        message = refused.value.diag.message_primary or ""
        assert len(message) <= 300, f"{len(message)} characters: {message[:160]}..."
