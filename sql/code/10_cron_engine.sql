-- The cron engine: parse an expression once into bit masks (dispatch.cron_spec), then find
-- the next firing instant with bit arithmetic on the wall clock of the schedule's time zone.
-- Everything here is IMMUTABLE: it reads no table, only its arguments and the tz database.

-- Raised for every parse failure, so that all of them share one SQLSTATE and one shape:
--   cron_expression "61 * * * *": minute 61 is outside 0-59
CREATE OR REPLACE FUNCTION dispatch._cron_error(expr text, detail text, hint text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'invalid_parameter_value',
        MESSAGE = format('cron_expression "%s": %s',
                         CASE WHEN length(expr) > 80 THEN left(expr, 80) || '...' ELSE expr END,
                         CASE WHEN length(detail) > 160 THEN left(detail, 160) || '...' ELSE detail END),
        HINT = coalesce(hint, 'Five fields: minute hour day-of-month month day-of-week, e.g. "*/15 * * * *".');
END
$$;

-- One token of a field: a number or a name, range-checked.
CREATE OR REPLACE FUNCTION dispatch._cron_value(expr text, field text, tok text, lo integer, hi integer)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v integer;
BEGIN
    IF tok ~ '^[0-9]+$' THEN
        IF length(tok) <= 4 THEN
            v := tok::integer;
            IF v BETWEEN lo AND hi THEN
                RETURN v;
            END IF;
        END IF;
        PERFORM dispatch._cron_error(expr, format('%s %s is outside %s-%s', field, tok, lo, hi));
    END IF;
    IF field = 'month' THEN
        v := array_position('{JAN,FEB,MAR,APR,MAY,JUN,JUL,AUG,SEP,OCT,NOV,DEC}'::text[], upper(tok));
        IF v IS NOT NULL THEN
            RETURN v;
        END IF;
        PERFORM dispatch._cron_error(expr, format('month "%s" is not a number 1-12 or a name JAN-DEC', tok));
    ELSIF field = 'day-of-week' THEN
        v := array_position('{SUN,MON,TUE,WED,THU,FRI,SAT}'::text[], upper(tok));
        IF v IS NOT NULL THEN
            RETURN v - 1;
        END IF;
        PERFORM dispatch._cron_error(expr, format('day-of-week "%s" is not a number 0-7 or a name SUN-SAT', tok));
    END IF;
    PERFORM dispatch._cron_error(expr, format('%s "%s" is not a number %s-%s', field, tok, lo, hi));
    RETURN NULL;
END
$$;

-- Lowest set bit of mask at position k or above; NULL when there is none (or when mask or k is
-- NULL). k must be 0-63.
-- Schema-qualified operators instead of a pinned search_path: a SET clause would stop
-- PostgreSQL from inlining this into its callers, and it is the engine's innermost loop. Not
-- STRICT either, for the same reason: a strict function whose body holds a CASE is not inlined,
-- and it ran as a statement of its own ten times a slot (cron_spec_next 31 % slower).
CREATE OR REPLACE FUNCTION dispatch._next_bit(mask bigint, k integer)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN (mask OPERATOR(pg_catalog.>>) k) OPERATOR(pg_catalog.=) 0 THEN NULL
                ELSE k OPERATOR(pg_catalog.+) pg_catalog.round(
                         pg_catalog.ln(((mask OPERATOR(pg_catalog.>>) k) OPERATOR(pg_catalog.&)
                                        (OPERATOR(pg_catalog.-) (mask OPERATOR(pg_catalog.>>) k)))::pg_catalog.float8)
                         OPERATOR(pg_catalog./) 0.6931471805599453)::pg_catalog.int4
           END
$$;

CREATE OR REPLACE FUNCTION dispatch.cron_parse(expr text)
RETURNS dispatch.cron_spec
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    names  constant text[] := '{minute,hour,day-of-month,month,day-of-week}';
    mins   constant integer[] := '{0,0,1,1,0}';
    maxs   constant integer[] := '{59,23,31,12,7}';
    src    text := btrim(expr, E' \t\n\r');
    fields text[];
    spec   dispatch.cron_spec;
    f      integer;
    fname  text;
    item   text;
    parts  text[];
    range  text[];
    a      integer;
    b      integer;
    n      integer;
    step   integer;
    bits   bigint;
    top    integer;
    m      integer;
    w      integer;
    feasible boolean;
BEGIN
    IF src = '' THEN
        PERFORM dispatch._cron_error(expr, 'is empty');
    END IF;
    IF left(src, 1) = '@' THEN
        src := CASE lower(src)
                   WHEN '@yearly'   THEN '0 0 1 1 *'
                   WHEN '@annually' THEN '0 0 1 1 *'
                   WHEN '@monthly'  THEN '0 0 1 * *'
                   WHEN '@weekly'   THEN '0 0 * * 0'
                   WHEN '@daily'    THEN '0 0 * * *'
                   WHEN '@midnight' THEN '0 0 * * *'
                   WHEN '@hourly'   THEN '0 * * * *'
               END;
        IF src IS NULL THEN
            PERFORM dispatch._cron_error(expr, format('unknown macro %s', btrim(expr)),
                'Macros: @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly.');
        END IF;
    END IF;
    fields := regexp_split_to_array(src, '[ \t]+');
    IF cardinality(fields) <> 5 THEN
        PERFORM dispatch._cron_error(expr,
            format('expected 5 fields (minute hour day-of-month month day-of-week), got %s', cardinality(fields)));
    END IF;

    spec := ROW(0, 0, 0, 0, 0, 0, 0, false,
                left(fields[3], 1) = '*', left(fields[5], 1) = '*',
                left(fields[1], 1) = '*' OR left(fields[2], 1) = '*', NULL, NULL);

    FOR f IN 1..5 LOOP
        fname := names[f];
        -- day-of-week accepts 7 for Sunday, but '*' and 'n/s' stop at Saturday.
        top := CASE f WHEN 5 THEN 6 ELSE maxs[f] END;
        bits := 0;
        IF fields[f] = '*' THEN
            bits := (1::bigint << (top + 1)) - (1::bigint << mins[f]);
        ELSE
            FOREACH item IN ARRAY string_to_array(fields[f], ',') LOOP
                IF item = '' THEN
                    PERFORM dispatch._cron_error(expr, format('%s has an empty list item', fname));
                END IF;
                IF f = 3 AND upper(item) = 'L' THEN
                    spec.last_day := true;
                    CONTINUE;
                END IF;
                IF f = 5 AND strpos(item, '#') > 0 THEN
                    parts := string_to_array(item, '#');
                    IF parts[1] = '' THEN
                        PERFORM dispatch._cron_error(expr, format('day-of-week "%s" has no weekday before #', item));
                    END IF;
                    IF cardinality(parts) <> 2 OR parts[2] !~ '^[1-5]$' THEN
                        PERFORM dispatch._cron_error(expr,
                            format('day-of-week "%s": the occurrence after # must be 1-5', item));
                    END IF;
                    a := dispatch._cron_value(expr, fname, parts[1], 0, 7) % 7;
                    spec.nth_weekdays := spec.nth_weekdays | (1::bigint << (7 * (parts[2]::integer - 1) + a));
                    CONTINUE;
                END IF;
                IF f = 5 AND length(item) > 1 AND upper(right(item, 1)) = 'L' THEN
                    a := dispatch._cron_value(expr, fname, left(item, -1), 0, 7) % 7;
                    spec.last_weekdays := spec.last_weekdays | (1 << a);
                    CONTINUE;
                END IF;
                IF item ~ '[^0-9A-Za-z*/-]' OR (f <> 4 AND f <> 5 AND item ~ '[A-Za-z]') THEN
                    PERFORM dispatch._cron_error(expr, format('%s "%s" is not supported', fname, item),
                        CASE f WHEN 3 THEN 'day-of-month takes numbers, ranges a-b, steps */s, lists and L.'
                               WHEN 5 THEN 'day-of-week takes 0-7 or SUN-SAT, ranges, steps, lists, d#n and dL.'
                               ELSE format('%s takes numbers, ranges a-b, steps */s and lists.', fname) END);
                END IF;

                parts := string_to_array(item, '/');
                step := 1;
                IF cardinality(parts) > 2 THEN
                    PERFORM dispatch._cron_error(expr, format('%s "%s" has more than one /', fname, item));
                ELSIF cardinality(parts) = 2 THEN
                    IF parts[2] !~ '^[0-9]{1,4}$' OR parts[2]::integer NOT BETWEEN 1 AND top - mins[f] + 1 THEN
                        PERFORM dispatch._cron_error(expr,
                            format('%s step "%s" must be a number 1-%s', fname, parts[2], top - mins[f] + 1));
                    END IF;
                    step := parts[2]::integer;
                END IF;

                IF parts[1] = '*' THEN
                    a := mins[f];
                    b := top;
                ELSIF strpos(parts[1], '-') > 0 THEN
                    range := string_to_array(parts[1], '-');
                    IF cardinality(range) <> 2 OR range[1] = '' OR range[2] = '' THEN
                        PERFORM dispatch._cron_error(expr, format('%s range "%s" must be a-b', fname, parts[1]));
                    END IF;
                    a := dispatch._cron_value(expr, fname, range[1], mins[f], maxs[f]);
                    b := dispatch._cron_value(expr, fname, range[2], mins[f], maxs[f]);
                    IF f = 5 AND upper(range[2]) = 'SUN' AND a > 0 THEN
                        b := 7;  -- MON-SUN: Sunday as the end of the week
                    END IF;
                    IF a > b THEN
                        PERFORM dispatch._cron_error(expr,
                            format('%s range %s is reversed', fname, parts[1]),
                            'Write a wrapping range as two, e.g. "22-23,0-2".');
                    END IF;
                ELSIF parts[1] = '' THEN
                    PERFORM dispatch._cron_error(expr, format('%s "%s" has nothing before /', fname, item));
                ELSE
                    a := dispatch._cron_value(expr, fname, parts[1], mins[f], maxs[f]);
                    -- "n/s" means n, n+s, ... up to the field's end (Vixie cron).
                    b := CASE WHEN cardinality(parts) = 2 THEN greatest(top, a) ELSE a END;
                END IF;

                IF step = 1 THEN
                    bits := bits | ((1::bigint << (b + 1)) - (1::bigint << a));
                ELSE
                    FOR n IN a..b BY step LOOP
                        bits := bits | (1::bigint << n);
                    END LOOP;
                END IF;
            END LOOP;
        END IF;

        CASE f
            WHEN 1 THEN spec.minutes := bits;
            WHEN 2 THEN spec.hours := bits;
            WHEN 3 THEN spec.days := bits;
            WHEN 4 THEN spec.months := bits;
            ELSE spec.weekdays := ((bits | (bits >> 7)) & 127);  -- 7 is Sunday too
        END CASE;
    END LOOP;

    -- An expression that can never fire is refused. Only day-of-month can make it so: with
    -- the Vixie OR rule any weekday item fires somewhere, so only the AND case needs a look.
    IF spec.days_star OR spec.weekdays_star THEN
        feasible := false;
        FOR m IN 1..12 LOOP
            CONTINUE WHEN spec.months & (1 << m) = 0;
            IF spec.weekdays = 127 OR (spec.weekdays <> 0 AND spec.nth_weekdays = 0 AND spec.last_weekdays = 0) THEN
                -- plain weekdays fall on every date sooner or later: the days alone decide
                feasible := spec.last_day OR spec.days & ((1::bigint << (CASE m WHEN 2 THEN 29 WHEN 4 THEN 30
                            WHEN 6 THEN 30 WHEN 9 THEN 30 WHEN 11 THEN 30 ELSE 31 END + 1)) - 2) <> 0;
            ELSE
                -- d#n and dL pin dates: try every weekday the month can start on, leap Februaries too
                FOR w IN 0..6 LOOP
                    feasible := dispatch._cron_days(spec, CASE m WHEN 2 THEN 2000 + w * 4 ELSE 2000 END, m, w) <> 0
                             OR (m = 2 AND dispatch._cron_days(spec, 2001, m, w) <> 0);
                    EXIT WHEN feasible;
                END LOOP;
            END IF;
            EXIT WHEN feasible;
        END LOOP;
        IF NOT feasible THEN
            PERFORM dispatch._cron_error(expr, 'can never fire: no month it allows has a day it allows');
        END IF;
    END IF;
    RETURN spec;
END
$$;
COMMENT ON FUNCTION dispatch.cron_parse(text) IS
    'Parse a 5-field cron expression (or macro) into a dispatch.cron_spec. Raises SQLSTATE 22023 with a message naming the field and the offending part.';

-- Matching days of one month as bits 1..ndays. first_dow overrides the weekday of day 1
-- (the feasibility check asks about hypothetical months); NULL means the real one.
CREATE OR REPLACE FUNCTION dispatch._cron_days(spec dispatch.cron_spec, y integer, mo integer, first_dow integer DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ndays integer := CASE mo
                        WHEN 2 THEN CASE WHEN (y % 4 = 0 AND y % 100 <> 0) OR y % 400 = 0 THEN 29 ELSE 28 END
                        WHEN 4 THEN 30 WHEN 6 THEN 30 WHEN 9 THEN 30 WHEN 11 THEN 30
                        ELSE 31
                     END;
    month_days bigint := (1::bigint << (ndays + 1)) - 2;
    f integer := coalesce(first_dow, date_part('dow', make_date(y, mo, 1))::integer);
    dom bigint := spec.days & month_days;
    dow bigint;
    r bigint;
    n integer;
    g integer;
BEGIN
    IF spec.last_day THEN
        dom := dom | (1::bigint << ndays);
    END IF;
    -- Rotate the weekday bits so that bit j means "day 1+j has an allowed weekday", then
    -- replicate that week over the month (34630287489 has a bit every 7 places).
    r := ((spec.weekdays >> f) | (spec.weekdays << (7 - f))) & 127;
    dow := ((r * 34630287489) << 1) & month_days;
    IF spec.nth_weekdays <> 0 THEN
        FOR n IN 0..4 LOOP
            r := (spec.nth_weekdays >> (7 * n)) & 127;
            CONTINUE WHEN r = 0;
            r := ((r >> f) | (r << (7 - f))) & 127;
            dow := dow | ((r << (1 + 7 * n)) & month_days);
        END LOOP;
    END IF;
    IF spec.last_weekdays <> 0 THEN
        g := (f + ndays - 1) % 7;  -- weekday of the last day
        FOR n IN 0..6 LOOP
            IF (spec.last_weekdays >> ((g - n + 7) % 7)) & 1 = 1 THEN
                dow := dow | (1::bigint << (ndays - n));
            END IF;
        END LOOP;
    END IF;
    IF spec.days_star OR spec.weekdays_star THEN
        RETURN dom & dow;
    END IF;
    RETURN dom | dow;  -- both restricted: a day matches if either does (Vixie cron)
END
$$;

-- Earliest wall-clock minute at or after t that the spec matches, ignoring time zones.
CREATE OR REPLACE FUNCTION dispatch._cron_match_from(spec dispatch.cron_spec, t timestamp)
RETURNS timestamp
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    y  integer := date_part('year', t);
    mo integer := date_part('month', t);
    d  integer := date_part('day', t);
    h  integer := date_part('hour', t);
    mi integer := date_part('minute', t);
    x  integer;
    days bigint;
    guard integer := 0;
BEGIN
    LOOP
        -- A valid spec fires within 40 years (a leap-day Monday is the rarest); this only
        -- stops a spec that was built by hand and never fires.
        guard := guard + 1;
        IF guard > 2000 THEN
            RAISE EXCEPTION 'cron spec % never fires', spec USING ERRCODE = 'invalid_parameter_value';
        END IF;
        x := dispatch._next_bit(spec.months, mo);
        IF x IS NULL THEN
            y := y + 1; mo := dispatch._next_bit(spec.months, 1); d := 1; h := 0; mi := 0;
        ELSIF x > mo THEN
            mo := x; d := 1; h := 0; mi := 0;
        END IF;
        -- (a call as the argument would keep _next_bit from being inlined: it reads mask twice)
        days := dispatch._cron_days(spec, y, mo);
        x := dispatch._next_bit(days, d);
        IF x IS NULL THEN
            mo := mo + 1; d := 1; h := 0; mi := 0;
            IF mo > 12 THEN
                y := y + 1; mo := 1;
            END IF;
            CONTINUE;
        ELSIF x > d THEN
            d := x; h := 0; mi := 0;
        END IF;
        x := dispatch._next_bit(spec.hours, h);
        IF x IS NULL THEN
            d := d + 1; h := 0; mi := 0;
            CONTINUE;
        ELSIF x > h THEN
            h := x; mi := 0;
        END IF;
        x := dispatch._next_bit(spec.minutes, mi);
        IF x IS NULL THEN
            h := h + 1; mi := 0;
            CONTINUE;
        END IF;
        RETURN make_timestamp(y, mo, d, h, x, 0);
    END LOOP;
END
$$;

-- First whole minute in (lo, hi] whose UTC offset in tz differs from lo's; hi when none.
-- Offsets change at most once in the windows callers pass (hours to 14 days).
CREATE OR REPLACE FUNCTION dispatch._tz_transition(lo timestamptz, hi timestamptz, tz text)
RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    a bigint := floor(extract(epoch FROM lo) / 60);
    b bigint := ceil(extract(epoch FROM hi) / 60);
    off0 interval := (lo AT TIME ZONE tz) - (lo AT TIME ZONE 'UTC');
    mid bigint;
    t timestamptz;
BEGIN
    WHILE b - a > 1 LOOP
        mid := (a + b) / 2;
        t := to_timestamp(mid * 60);
        IF (t AT TIME ZONE tz) - (t AT TIME ZONE 'UTC') = off0 THEN
            a := mid;
        ELSE
            b := mid;
        END IF;
    END LOOP;
    RETURN to_timestamp(b * 60);
END
$$;

-- An interval schedule's slot rule: slots at anchor + k * every, in real time. A day is 24 hours
-- here, whatever the session's zone: the interval is turned into microseconds once, and slots
-- are computed by integer arithmetic on them.
CREATE OR REPLACE FUNCTION dispatch.every_spec(every interval, anchor timestamptz)
RETURNS dispatch.cron_spec
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    spec dispatch.cron_spec;
BEGIN
    IF every IS NULL OR every < interval '1 second' OR every > interval '366 days' THEN
        RAISE EXCEPTION 'every must be at least 1 second and at most 366 days, not %', coalesce(every::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'For slots less than a second apart, call the function in a loop of its own.';
    END IF;
    IF extract(month FROM every) <> 0 OR extract(year FROM every) <> 0 THEN
        RAISE EXCEPTION 'every must be a fixed length (seconds, minutes, hours, days), not %', every
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Months have no fixed length: for a calendar rule use a cron expression, e.g. ''0 0 1 * *''.';
    END IF;
    IF anchor IS NULL OR NOT isfinite(anchor) THEN
        RAISE EXCEPTION 'anchor must be a finite instant, not %', coalesce(anchor::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    spec.every_us := (extract(epoch FROM every) * 1000000)::bigint;
    spec.anchor := anchor;
    spec.real_time := true;
    RETURN spec;
END
$$;
COMMENT ON FUNCTION dispatch.every_spec(interval, timestamptz) IS
    'The slot rule of an interval schedule (slots at anchor + k * every, real time) as a dispatch.cron_spec, for dispatch.cron_spec_next and the tick. Raises 22023 for an interval under 1 second or over 366 days, or one with months.';

-- A rule kept within bounds: no slot before starts_at, none after ends_at, and at most max_runs
-- slots (the first ones at or after starts_at, which max_runs then needs). The max_runs-th slot
-- becomes the end, so that the bounds are two instants wherever slots are computed.
CREATE OR REPLACE FUNCTION dispatch.bounded_spec(spec dispatch.cron_spec, starts_at timestamptz, ends_at timestamptz,
                                                 max_runs integer, tz text DEFAULT 'UTC')
RETURNS dispatch.cron_spec
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    last_slot timestamptz;
BEGIN
    IF max_runs IS NOT NULL AND (max_runs NOT BETWEEN 1 AND 10000 OR starts_at IS NULL) THEN
        RAISE EXCEPTION 'max_runs must be between 1 and 10000 and count from starts_at, not %', max_runs
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'For more slots than that, bound the schedule with ends_at.';
    END IF;
    spec.starts_at := starts_at;
    spec.ends_at := ends_at;
    IF max_runs IS NOT NULL THEN
        last_slot := dispatch.cron_spec_next(spec, starts_at - interval '1 microsecond', tz);
        IF spec.every_us IS NOT NULL AND isfinite(last_slot) THEN
            last_slot := last_slot + ((max_runs - 1) * spec.every_us) * interval '1 microsecond';
        ELSE
            FOR i IN 2..max_runs LOOP
                EXIT WHEN NOT isfinite(last_slot);
                last_slot := dispatch.cron_spec_next(spec, last_slot, tz);
            END LOOP;
        END IF;
        IF isfinite(last_slot) THEN
            spec.ends_at := least(ends_at, last_slot);
        END IF;
    END IF;
    RETURN spec;
END
$$;
COMMENT ON FUNCTION dispatch.bounded_spec(dispatch.cron_spec, timestamptz, timestamptz, integer, text) IS
    'The slot rule spec kept within bounds: no slot before starts_at, none after ends_at, and at most its first max_runs slots at or after starts_at (1 to 10,000; max_runs needs starts_at). dispatch.cron_spec_next then answers ''infinity'' past the last slot. Raises 22023 for a max_runs out of range.';

-- A one-shot schedule's rule: one slot, at run_at (an interval rule bounded to that one slot,
-- spaced as far as intervals go, so that jitter may be up to a day as for a daily rule).
CREATE OR REPLACE FUNCTION dispatch.once_spec(run_at timestamptz)
RETURNS dispatch.cron_spec
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT dispatch.bounded_spec(dispatch.every_spec(interval '366 days', run_at), run_at, run_at, NULL) $$;
COMMENT ON FUNCTION dispatch.once_spec(timestamptz) IS
    'The slot rule of a one-shot schedule: its one slot is run_at.';

-- The k-th slot of an interval spec, and the index of the latest slot at or before an instant.
CREATE OR REPLACE FUNCTION dispatch._every_slot(spec dispatch.cron_spec, k numeric)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT spec.anchor + (k * spec.every_us)::bigint * interval '1 microsecond' $$;

CREATE OR REPLACE FUNCTION dispatch._every_index(spec dispatch.cron_spec, at timestamptz)
RETURNS numeric
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT floor(extract(epoch FROM at - spec.anchor) * 1000000 / spec.every_us) $$;

CREATE OR REPLACE FUNCTION dispatch.cron_spec_next(spec dispatch.cron_spec, after timestamptz, tz text DEFAULT 'UTC')
RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    w   timestamp;
    m   timestamp;
    i   timestamptz;
    j   timestamptz;
    c   timestamptz;
    k   timestamptz;
    ahead double precision;
BEGIN
    -- A bounded rule: 'infinity' past its last slot (the schedule then ends), and no slot
    -- before its start (a slot on starts_at itself counts).
    IF spec.ends_at IS NOT NULL AND after >= spec.ends_at THEN
        RETURN 'infinity';
    END IF;
    IF spec.starts_at IS NOT NULL AND after < spec.starts_at THEN
        after := spec.starts_at - interval '1 microsecond';
    END IF;
    IF spec.every_us IS NOT NULL THEN
        c := dispatch._every_slot(spec, dispatch._every_index(spec, after) + 1);
    ELSIF spec.real_time THEN
        -- Follows real time: walk instants; a wall-clock time skipped by DST never happens, a
        -- repeated one happens twice. Between offset changes, wall = instant + constant offset.
        i := to_timestamp((floor(extract(epoch FROM after) / 60) + 1) * 60);
        LOOP
            w := i AT TIME ZONE tz;
            m := dispatch._cron_match_from(spec, w);
            ahead := extract(epoch FROM m - w);
            IF ahead <= 14 * 86400 THEN
                j := to_timestamp(extract(epoch FROM i) + ahead);
                IF (j AT TIME ZONE tz) = m THEN
                    c := j;  -- same offset at both ends: no change in between
                    EXIT;
                END IF;
                i := dispatch._tz_transition(i, j, tz);
            ELSE
                j := to_timestamp(extract(epoch FROM i) + 14 * 86400);
                IF (j AT TIME ZONE tz) - w = interval '14 days' THEN
                    i := j;  -- no offset change and no match in these 14 days
                ELSE
                    i := dispatch._tz_transition(i, j, tz);
                END IF;
            END IF;
        END LOOP;
    ELSE
        -- Fixed time (Debian cron): once per matching wall-clock time; a time skipped by a
        -- spring-forward fires at the jump, a time repeated by a fall-back at its first occurrence.
        -- (dispatch._wall_instant says the same for calendars; inline here, where a call costs a
        -- tenth of cron_spec_next, and both are held to the oracles)
        w := date_trunc('minute', after AT TIME ZONE tz) + interval '1 minute';
        LOOP
            m := dispatch._cron_match_from(spec, w);
            c := m AT TIME ZONE tz;  -- PostgreSQL reads a skipped or repeated time with the standard offset
            IF (c AT TIME ZONE tz) <> m THEN
                c := dispatch._tz_transition(c - interval '24 hours', c + interval '24 hours', tz);
            ELSE
                k := c - interval '24 hours';
                k := (m - ((k AT TIME ZONE tz) - (k AT TIME ZONE 'UTC'))) AT TIME ZONE 'UTC';
                IF k < c AND (k AT TIME ZONE tz) = m THEN
                    c := k;  -- the earlier of two occurrences
                END IF;
            END IF;
            EXIT WHEN c > after;
            w := m + interval '1 minute';
        END LOOP;
    END IF;
    RETURN CASE WHEN c > spec.ends_at THEN 'infinity' ELSE c END;
END
$$;
COMMENT ON FUNCTION dispatch.cron_spec_next(dispatch.cron_spec, timestamptz, text) IS
    'dispatch.cron_next for an already parsed expression: the earliest minute-aligned instant strictly after "after" that the spec matches in time zone tz. For an interval spec (dispatch.every_spec), the first anchor + k * every after "after"; tz does not apply. A bounded spec (dispatch.bounded_spec) gives no slot before its start and ''infinity'' past its last slot.';

-- The latest instant the spec fires at in (lo, hi]; NULL when there is none. What catch-up
-- "latest" runs after downtime, in a few cron_spec_next calls however long the downtime was:
-- it looks back through windows that grow (a minute, an hour, a day, ...) for the first that
-- holds a slot, then walks forward within it.
CREATE OR REPLACE FUNCTION dispatch._cron_latest(spec dispatch.cron_spec, lo timestamptz, hi timestamptz, tz text)
RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    windows constant interval[] := '{1 minute, 1 hour, 1 day, 32 days, 366 days, 3000 days, 15000 days}';
    w interval;
    t timestamptz;
    n timestamptz;
BEGIN
    hi := least(hi, spec.ends_at);
    IF spec.every_us IS NOT NULL THEN
        t := dispatch._every_slot(spec, dispatch._every_index(spec, hi));
        RETURN CASE WHEN t > lo AND t >= coalesce(spec.starts_at, t) THEN t END;
    END IF;
    FOREACH w IN ARRAY windows LOOP
        t := dispatch.cron_spec_next(spec, greatest(lo, hi - w), tz);
        IF t <= hi THEN
            LOOP
                n := dispatch.cron_spec_next(spec, t, tz);
                EXIT WHEN n > hi;
                t := n;
            END LOOP;
            RETURN t;
        END IF;
        EXIT WHEN hi - w <= lo;
    END LOOP;
    RETURN NULL;
END
$$;

-- The instants the spec fires at in (lo, hi], oldest first, at most max_n of them (hi may be
-- 'infinity' for a bounded spec).
CREATE OR REPLACE FUNCTION dispatch._cron_slots(spec dispatch.cron_spec, lo timestamptz, hi timestamptz, tz text,
                                                 max_n integer)
RETURNS SETOF timestamptz
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t timestamptz := lo;
BEGIN
    FOR i IN 1..max_n LOOP
        t := dispatch.cron_spec_next(spec, t, tz);
        EXIT WHEN t > hi OR NOT isfinite(t);
        RETURN NEXT t;
    END LOOP;
END
$$;

-- Jitter: where in [0, jitter) a slot fires, from a hash of the schedule and the slot. The same
-- for every tick, listener and restart, different from slot to slot and from schedule to schedule
-- (hashtextextended is stable across platforms and releases: hash partitioning depends on it).
-- One expression, with no SET clause and every operator qualified, so that the planner inlines
-- it into the marking's statement instead of calling it once a run. The slot's epoch is read
-- through an interval: extract() from a timestamptz is STABLE, which would keep an IMMUTABLE
-- function from being inlined (the text is the same).
CREATE OR REPLACE FUNCTION dispatch.jitter_offset(schedule_id uuid, slot timestamptz, jitter interval)
RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN schedule_id IS NULL OR slot IS NULL OR jitter IS NULL THEN NULL
        WHEN CAST(pg_catalog.extract('epoch', jitter) OPERATOR(pg_catalog.*) 1000000 AS bigint) OPERATOR(pg_catalog.<=) 0
        THEN CAST('0' AS pg_catalog.interval)
        ELSE pg_catalog.mod(
                 pg_catalog.mod(
                     pg_catalog.hashtextextended(
                         CAST(schedule_id AS text) OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||)
                         CASE WHEN pg_catalog.isfinite(slot)
                              THEN CAST(pg_catalog.extract('epoch', slot OPERATOR(pg_catalog.-)
                                                           CAST('1970-01-01 00:00:00+00' AS pg_catalog.timestamptz)) AS text)
                              WHEN slot OPERATOR(pg_catalog.>) CAST('1970-01-01 00:00:00+00' AS pg_catalog.timestamptz)
                              THEN 'Infinity'
                              ELSE '-Infinity' END,
                         0),
                     CAST(pg_catalog.extract('epoch', jitter) OPERATOR(pg_catalog.*) 1000000 AS bigint))
                 OPERATOR(pg_catalog.+) CAST(pg_catalog.extract('epoch', jitter) OPERATOR(pg_catalog.*) 1000000 AS bigint),
                 CAST(pg_catalog.extract('epoch', jitter) OPERATOR(pg_catalog.*) 1000000 AS bigint))
             OPERATOR(pg_catalog.*) CAST('1 microsecond' AS pg_catalog.interval)
    END
$$;
COMMENT ON FUNCTION dispatch.jitter_offset(uuid, timestamptz, interval) IS
    'How long after its slot a schedule with this jitter fires: an offset in [0, jitter) fixed by a hash of the schedule id and the slot, so that schedules sharing a slot spread out, the same way on every tick. 0 when jitter is 0.';
