-- Recorded gaps: the slots of a schedule that no run stands for, one audit row per gap
-- (invariant 8). A DBA asking why 10:01-10:03 did not run finds the answer in SQL:
--
--   SELECT metadata FROM dispatch.audit_log
--   WHERE action = 'schedule.slots.skipped' AND metadata->>'scheduleId' = '...';
--
-- with the first and last slot, how many, and the reason:
--   overlap   they came due while a run was open (overlap skip; buffer_one's buffer was full)
--   catch-up  missed while nothing ran, passed over for the latest one (catchup latest)
--   misfire   beyond misfire_grace, too many to record a skipped run for each
--   pause     the schedule was paused (recorded when it resumes)
--   disabled  the schedule was disabled (recorded when it is enabled again)
--   calendar  they fell in a period of the schedule's calendar (metadata calendar: its name)
-- A slot that got a run, of whatever status, is never in a gap.

-- The slots of a rule in (lo, hi) (hi 'infinity': up to a bounded rule's last): the first, the
-- last, and how many (counted up to 10,000; at_least when there are more). NULLs when there is
-- none.
CREATE OR REPLACE FUNCTION dispatch._slots_between(spec dispatch.cron_spec, lo timestamptz, hi timestamptz, tz text,
                                                   OUT first_slot timestamptz, OUT last_slot timestamptz,
                                                   OUT slots integer, OUT at_least boolean)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    first_slot := dispatch.cron_spec_next(spec, lo, tz);
    IF first_slot IS NULL OR first_slot >= hi THEN
        first_slot := NULL;
        RETURN;
    END IF;
    last_slot := coalesce(dispatch._cron_latest(spec, first_slot, hi - interval '1 microsecond', tz), first_slot);
    IF (spec).every_us IS NOT NULL THEN
        slots := 1 + round(extract(epoch FROM last_slot - first_slot) * 1000000 / (spec).every_us)::integer;
        at_least := false;
    ELSE
        SELECT 1 + count(*) INTO slots FROM dispatch._cron_slots(spec, first_slot, last_slot, tz, 10000);
        at_least := slots > 10000;
        slots := least(slots, 10000);
    END IF;
END
$$;

-- One audit row schedule.slots.skipped for each schedule whose slots in (los[i], his[i]) are a
-- gap. Schedules that share a rule, a zone and the bounds (a stampede, an outage) share the
-- arithmetic. Returns how many gaps it recorded. PL/pgSQL so that its plan is kept: a SQL
-- function's statement would be planned at each call.
DROP FUNCTION IF EXISTS dispatch._record_gaps(uuid[], timestamptz[], timestamptz[], text, jsonb);
CREATE OR REPLACE FUNCTION dispatch._record_gaps(schedule_ids uuid[], los timestamptz[], his timestamptz[],
                                                 reason text)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    recorded integer;
BEGIN
    WITH gap AS (
        SELECT s.id, s.project_id, s.function_name, s.cron_spec, s.timezone, s.calendar_id, x.lo, x.hi
        FROM unnest(_record_gaps.schedule_ids, _record_gaps.los, _record_gaps.his) AS x(id, lo, hi)
        JOIN dispatch.schedules s ON s.id = x.id
        WHERE x.hi > x.lo
    ), span AS MATERIALIZED (
        SELECT u.cron_spec, u.timezone, u.lo, u.hi, b.*
        FROM (SELECT DISTINCT g.cron_spec, g.timezone, g.lo, g.hi FROM gap g) u
        CROSS JOIN LATERAL dispatch._slots_between(u.cron_spec, u.lo, u.hi, u.timezone) b
    ), written AS (
        INSERT INTO dispatch.audit_log (actor_id, project_id, action, metadata)
        SELECT NULL, g.project_id, 'schedule.slots.skipped', jsonb_build_object(
                   'scheduleId', g.id, 'functionName', g.function_name, 'first', p.first_slot,
                   'last', p.last_slot, 'count', p.slots, 'countIsAtLeast', p.at_least,
                   'reason', _record_gaps.reason)
               || CASE WHEN _record_gaps.reason = 'calendar'
                       THEN jsonb_build_object('calendar', (SELECT c.name FROM dispatch.calendars c
                                                            WHERE c.id = g.calendar_id))
                       ELSE '{}' END
        FROM gap g
        JOIN span p ON p.cron_spec = g.cron_spec AND p.timezone = g.timezone AND p.lo = g.lo AND p.hi = g.hi
        WHERE p.first_slot IS NOT NULL
        RETURNING 1
    )
    SELECT count(*)::integer INTO recorded FROM written;
    RETURN recorded;
END
$$;

-- A schedule that runs again after a pause or while disabled: the slots it passed over.
CREATE OR REPLACE FUNCTION dispatch._schedule_record_stop_gap()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- from the slot it stood on when it stopped (those it has a run for excluded: a pending run
    -- ended skipped at the stop), up to the slot it goes on from (or its last, if it ended)
    PERFORM dispatch._record_gaps(
        ARRAY[NEW.id],
        ARRAY[greatest(OLD.stopped_on - interval '1 microsecond',
                       (SELECT max(r.scheduled_for) FROM dispatch.runs r
                        WHERE r.schedule_id = NEW.id AND r.kind = 'scheduled'))],
        ARRAY[coalesce(NEW.next_run_at, 'infinity')],
        CASE WHEN OLD.paused_at IS NOT NULL THEN 'pause' ELSE 'disabled' END);
    RETURN NULL;
END
$$;

-- Only when the rule stays the same: an edit of the expression, interval or zone starts the
-- slots afresh.
CREATE OR REPLACE TRIGGER _220_record_stop_gap AFTER UPDATE OF enabled, paused_at ON dispatch.schedules
    FOR EACH ROW
    WHEN (OLD.next_run_at IS NULL AND (NEW.next_run_at IS NOT NULL OR NEW.ended_at IS NOT NULL)
          AND OLD.stopped_on IS NOT NULL
          AND OLD.cron_spec IS NOT DISTINCT FROM NEW.cron_spec AND OLD.timezone = NEW.timezone)
    EXECUTE FUNCTION dispatch._schedule_record_stop_gap();

-- What listeners export as pgdispatch_slots_skipped_total{reason}: the slots in gaps recorded
-- after audit row after_id, by reason (NULL: none counted, only where to start).
CREATE OR REPLACE FUNCTION dispatch.skipped_slots_after(after_id bigint)
RETURNS TABLE (reason text, slots bigint, gaps bigint, last_id bigint)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH since AS (
        SELECT a.id, a.metadata
        FROM dispatch.audit_log a
        WHERE a.action = 'schedule.slots.skipped' AND a.id > coalesce(after_id, 0)
    ), last AS (
        SELECT coalesce(max(s.id), after_id, 0) AS id FROM since s
    )
    SELECT r.reason, coalesce(sum((s.metadata->>'count')::bigint), 0), count(s.id), (SELECT l.id FROM last l)
    FROM unnest(ARRAY['overlap', 'catch-up', 'misfire', 'pause', 'disabled', 'calendar']) AS r(reason)
    LEFT JOIN since s ON s.metadata->>'reason' = r.reason AND after_id IS NOT NULL
    GROUP BY r.reason
$$;
COMMENT ON FUNCTION dispatch.skipped_slots_after(bigint) IS
    'The slots in gaps recorded (audit action schedule.slots.skipped) after audit row after_id, by reason (overlap, catch-up, misfire, pause, disabled, calendar): how many slots, how many gaps, and the id to pass next time; with NULL, zeros and where to start. What listeners export as pgdispatch_slots_skipped_total{reason}.';
