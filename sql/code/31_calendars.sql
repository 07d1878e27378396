-- Calendars: the periods in which a schedule's slots do not run (docs/schedules.md,
-- "Calendars"). A period is wall-clock time in its calendar's zone; its boundaries become
-- instants by the fixed-time DST rule of cron expressions, and a slot is excluded when its
-- instant lies in [start, end). The tick applies them when it marks a slot
-- (dispatch._tick_schedule): an edit of a calendar applies to every slot not marked yet.

-- A wall-clock time in tz as an instant, by the fixed-time rule of dispatch.cron_spec_next: a
-- time skipped by a spring-forward is the instant of the jump, a time repeated by a fall-back
-- its first occurrence.
CREATE OR REPLACE FUNCTION dispatch._wall_instant(wall timestamp, tz text)
RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c timestamptz := wall AT TIME ZONE tz;  -- PostgreSQL reads a skipped or repeated time with the standard offset
    k timestamptz;
BEGIN
    IF (c AT TIME ZONE tz) <> wall THEN
        RETURN dispatch._tz_transition(c - interval '24 hours', c + interval '24 hours', tz);
    END IF;
    k := c - interval '24 hours';
    k := (wall - ((k AT TIME ZONE tz) - (k AT TIME ZONE 'UTC'))) AT TIME ZONE 'UTC';
    RETURN CASE WHEN k < c AND (k AT TIME ZONE tz) = wall THEN k ELSE c END;
END
$$;
COMMENT ON FUNCTION dispatch._wall_instant(timestamp, text) IS
    'A wall-clock time in zone tz as an instant, by the fixed-time DST rule of cron expressions: a time that a spring-forward skips is the instant of the jump, one that a fall-back repeats its first occurrence.';

CREATE OR REPLACE FUNCTION dispatch.calendar_periods(calendar_id bigint, from_ts timestamptz, to_ts timestamptz)
RETURNS TABLE (starts_at timestamptz, ends_at timestamptz, exclusion_id bigint, label text)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- PL/pgSQL for its kept plan: the tick asks for every due slot of a calendar schedule, and a SQL
-- function called from another is planned again at each call
AS $$
BEGIN
    RETURN QUERY
    SELECT p.lo, p.hi, e.id, e.label
    FROM dispatch.calendars c
    JOIN dispatch.calendar_exclusions e ON e.calendar_id = c.id
    CROSS JOIN LATERAL (
        SELECT dispatch._wall_instant(e.starts, c.timezone) AS lo, dispatch._wall_instant(e.ends, c.timezone) AS hi
        -- (a day's margin on the wall clock covers any offset change: only the stretches near
        -- the range are placed)
        WHERE e.days IS NULL AND e.ends > (calendar_periods.from_ts AT TIME ZONE c.timezone) - interval '1 day'
          AND e.starts < (calendar_periods.to_ts AT TIME ZONE c.timezone) + interval '1 day'
      UNION ALL
        -- each day of the week's rule, from the local day before from_ts (a period that began
        -- then may still run) to the local day of to_ts
        SELECT dispatch._wall_instant(x.d + e.from_time, c.timezone), dispatch._wall_instant(x.d + e.until_time, c.timezone)
        FROM generate_series(date_trunc('day', calendar_periods.from_ts AT TIME ZONE c.timezone) - interval '1 day',
                             calendar_periods.to_ts AT TIME ZONE c.timezone, interval '1 day') AS x(d)
        WHERE e.days IS NOT NULL AND extract(isodow FROM x.d)::smallint = ANY (e.days)
    ) p
    WHERE c.id = calendar_periods.calendar_id AND p.hi > calendar_periods.from_ts AND p.lo < calendar_periods.to_ts
    ORDER BY p.lo, p.hi, e.id;
END
$$;
COMMENT ON FUNCTION dispatch.calendar_periods(bigint, timestamptz, timestamptz) IS
    'The excluded periods of a calendar that overlap [from_ts, to_ts), as instants [starts_at, ends_at) with the exclusion they come from, earliest first: one row for a period, one for each day of a weekly exclusion. Wall-clock boundaries that daylight saving time skips or repeats are placed by the fixed-time rule of cron expressions.';

-- The period of the calendar that holds an instant (the one that ends last, when several do),
-- with the calendar's name; no row when none does.
CREATE OR REPLACE FUNCTION dispatch._calendar_period(calendar_id bigint, at timestamptz,
                                                     OUT calendar text, OUT starts_at timestamptz,
                                                     OUT ends_at timestamptz, OUT label text)
RETURNS SETOF record
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT c.name, p.starts_at, p.ends_at, p.label
    FROM dispatch.calendar_periods(_calendar_period.calendar_id, _calendar_period.at,
                                   _calendar_period.at + interval '1 microsecond') p
    JOIN dispatch.calendars c ON c.id = _calendar_period.calendar_id
    ORDER BY p.ends_at DESC
    LIMIT 1;
END
$$;

CREATE OR REPLACE FUNCTION dispatch.calendar_excludes(calendar_id bigint, at timestamptz)
RETURNS boolean
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM dispatch._calendar_period(calendar_excludes.calendar_id, calendar_excludes.at));
END
$$;
COMMENT ON FUNCTION dispatch.calendar_excludes(bigint, timestamptz) IS
    'Whether the instant lies in one of the calendar''s excluded periods (a slot there does not run).';

-- The first slot of the rule at or after `slot` (itself a slot) that the calendar does not
-- exclude: each excluded one jumps to the first slot after its period. 'infinity' when a
-- bounded rule has none left; after 1,000 periods in a row, the slot reached (still excluded:
-- the next call goes on from there).
CREATE OR REPLACE FUNCTION dispatch._calendar_slot(spec dispatch.cron_spec, tz text, calendar_id bigint,
                                                   slot timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    period_end timestamptz;
BEGIN
    FOR i IN 1..1000 LOOP
        EXIT WHEN slot IS NULL OR NOT isfinite(slot);
        SELECT p.ends_at INTO period_end FROM dispatch._calendar_period(calendar_id, slot) p;
        EXIT WHEN NOT FOUND;
        slot := dispatch.cron_spec_next(spec, greatest(period_end - interval '1 microsecond', slot), tz);
    END LOOP;
    RETURN slot;
END
$$;

-- The latest slot of the rule in (lo, hi] that the calendar does not exclude; NULL when none.
CREATE OR REPLACE FUNCTION dispatch._calendar_latest(spec dispatch.cron_spec, tz text, calendar_id bigint,
                                                     lo timestamptz, hi timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    slot timestamptz;
    period_start timestamptz;
BEGIN
    FOR i IN 1..1000 LOOP
        slot := dispatch._cron_latest(spec, lo, hi, tz);
        EXIT WHEN slot IS NULL;
        SELECT p.starts_at INTO period_start FROM dispatch._calendar_period(calendar_id, slot) p;
        EXIT WHEN NOT FOUND;
        hi := period_start - interval '1 microsecond';
        slot := NULL;
    END LOOP;
    RETURN slot;
END
$$;

-- The (calendar, slot) pairs of the schedules due at the horizon that a period holds: checked
-- once for all the schedules that share one (a stampede's), in two arrays. The pairs are found
-- by a loose scan of schedules_calendar_id_idx, a descent for each calendar in use and each of
-- its due slots, however many schedules share them (each chunk of a stampede asks again).
CREATE OR REPLACE FUNCTION dispatch._calendar_blocked(horizon timestamptz,
                                                      OUT calendar_ids bigint[], OUT slots timestamptz[])
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH RECURSIVE calendar(id) AS (
        (SELECT s.calendar_id FROM dispatch.schedules s WHERE s.calendar_id IS NOT NULL
         ORDER BY s.calendar_id LIMIT 1)
      UNION ALL
        SELECT (SELECT s.calendar_id FROM dispatch.schedules s WHERE s.calendar_id > c.id
                ORDER BY s.calendar_id LIMIT 1)
        FROM calendar c WHERE c.id IS NOT NULL
    ), due(calendar_id, slot) AS (
        SELECT c.id, (SELECT min(s.next_run_at) FROM dispatch.schedules s WHERE s.calendar_id = c.id)
        FROM calendar c WHERE c.id IS NOT NULL
      UNION ALL
        SELECT d.calendar_id, (SELECT min(s.next_run_at) FROM dispatch.schedules s
                               WHERE s.calendar_id = d.calendar_id AND s.next_run_at > d.slot)
        FROM due d WHERE d.slot <= _calendar_blocked.horizon
    )
    SELECT coalesce(array_agg(d.calendar_id), '{}'), coalesce(array_agg(d.slot), '{}')
    FROM due d
    WHERE d.slot <= _calendar_blocked.horizon AND dispatch.calendar_excludes(d.calendar_id, d.slot)
$$;

-- Whether the tick's bulk marking may take a due schedule with a calendar: its slot is on time
-- (the one the bulk marking runs) and not among the blocked pairs (dispatch._calendar_blocked).
-- The others go to the run policies.
DROP FUNCTION IF EXISTS dispatch._calendar_lets_bulk(bigint, timestamptz, bigint, text, timestamptz);
CREATE OR REPLACE FUNCTION dispatch._calendar_lets_bulk(calendar_id bigint, slot timestamptz, every_us bigint,
                                                        catchup text, horizon timestamptz,
                                                        blocked_calendars bigint[], blocked_slots timestamptz[])
RETURNS boolean
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT (catchup = 'all' OR horizon - slot < coalesce(every_us * interval '1 microsecond', interval '1 minute'))
           AND NOT EXISTS (SELECT 1 FROM unnest(blocked_calendars, blocked_slots) AS b(c, t)
                           WHERE b.c = calendar_id AND b.t = slot)
$$;

-- Checked with a message that names the field (the CHECK constraints stay as the last line of
-- defence).
CREATE OR REPLACE FUNCTION dispatch._calendar_before_write()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM dispatch._refuse(CASE
        WHEN NEW.name IS NULL OR NEW.name !~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$'
        THEN format('calendar name must be 1 to 100 letters, digits, _ . or - (starting with a letter or digit), not %s',
                    coalesce(quote_literal(NEW.name), 'NULL'))
        WHEN length(NEW.description) > 1000 THEN 'calendar description must be at most 1000 characters'
        END);
    IF TG_OP = 'INSERT' OR NEW.timezone IS DISTINCT FROM OLD.timezone THEN
        PERFORM dispatch.check_timezone(NEW.timezone);
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.project_id IS DISTINCT FROM OLD.project_id AND NEW.project_id IS NOT NULL
       AND EXISTS (SELECT 1 FROM dispatch.schedules s
                   WHERE s.calendar_id = NEW.id AND s.project_id <> NEW.project_id AND s.deleted_at IS NULL) THEN
        RAISE EXCEPTION 'calendar %: project_id cannot become % while schedules of other projects use it', NEW.name,
                        quote_literal(NEW.project_id)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Point those schedules at another calendar first (schedules.calendar_id).';
    END IF;
    IF TG_OP = 'UPDATE' THEN
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER _100_validate BEFORE INSERT OR UPDATE ON dispatch.calendars
    FOR EACH ROW EXECUTE FUNCTION dispatch._calendar_before_write();

CREATE OR REPLACE FUNCTION dispatch._calendar_exclusion_before_write()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    problem text;
    hint text;
BEGIN
    IF NEW.days IS NULL AND (NEW.starts IS NULL OR NEW.ends IS NULL) THEN
        problem := 'a calendar exclusion needs starts and ends (a period), or days (every week)';
    ELSIF NEW.days IS NOT NULL AND (NEW.starts IS NOT NULL OR NEW.ends IS NOT NULL) THEN
        problem := 'starts and ends exclude days: a calendar exclusion is a period or a weekly rule, not both';
    ELSIF NEW.days IS NULL AND (NEW.from_time IS NOT NULL OR NEW.until_time IS NOT NULL) THEN
        problem := 'from_time and until_time apply to a weekly exclusion (days), not to a period';
    ELSIF NOT isfinite(NEW.starts) OR NOT isfinite(NEW.ends) THEN
        problem := 'starts and ends must be finite wall-clock times';
    ELSIF NEW.ends <= NEW.starts THEN
        problem := format('ends (%s) must be after starts (%s)', NEW.ends, NEW.starts);
        hint := 'A whole day D is starts D, ends D + 1 (midnight to midnight).';
    ELSIF NEW.days IS NOT NULL
          AND (cardinality(NEW.days) NOT BETWEEN 1 AND 7 OR NOT NEW.days <@ '{1,2,3,4,5,6,7}'
               OR array_position(NEW.days, NULL) IS NOT NULL) THEN
        problem := format('days must list ISO days of the week, 1 (Monday) to 7 (Sunday), not %s', NEW.days);
    ELSIF NEW.days IS NOT NULL THEN
        NEW.from_time := coalesce(NEW.from_time, time '00:00');
        NEW.until_time := coalesce(NEW.until_time, time '24:00');
        IF NEW.until_time <= NEW.from_time THEN
            problem := format('until_time (%s) must be after from_time (%s)', NEW.until_time, NEW.from_time);
            hint := 'A period that runs past midnight is two: until 24:00, and from 00:00 on the next day.';
        END IF;
        NEW.days := ARRAY(SELECT DISTINCT d FROM unnest(NEW.days) AS d ORDER BY d);
    END IF;
    IF problem IS NULL AND length(NEW.label) > 200 THEN
        problem := 'label must be at most 200 characters';
    END IF;
    PERFORM dispatch._refuse(problem, hint);
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER _100_validate BEFORE INSERT OR UPDATE ON dispatch.calendar_exclusions
    FOR EACH ROW EXECUTE FUNCTION dispatch._calendar_exclusion_before_write();

-- A deleted schedule keeps its definition, not a hold on its calendar: deleting the calendar
-- detaches the deleted schedules that named it (those not deleted keep it in use).
CREATE OR REPLACE FUNCTION dispatch._calendar_before_delete()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE dispatch.schedules SET calendar_id = NULL WHERE calendar_id = OLD.id AND deleted_at IS NOT NULL;
    RETURN OLD;
END
$$;

CREATE OR REPLACE TRIGGER _100_detach_deleted BEFORE DELETE ON dispatch.calendars
    FOR EACH ROW EXECUTE FUNCTION dispatch._calendar_before_delete();
