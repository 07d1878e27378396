-- Operator functions: what a DBA does to one schedule, audited with session_user as the actor.
-- Each is a plain UPDATE of the schedule, so the write path's triggers do the rest (derived
-- columns, pending runs, the audit row, the NOTIFY).

-- The schedule a function acts on, locked, or a clear error when it is missing or deleted.
CREATE OR REPLACE FUNCTION dispatch._operable_schedule(schedule_id uuid, verb text)
RETURNS dispatch.schedules
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s dispatch.schedules;
BEGIN
    SELECT * INTO s FROM dispatch.schedules WHERE id = _operable_schedule.schedule_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'cannot %: schedule % does not exist', verb, schedule_id
            USING ERRCODE = 'no_data_found';
    END IF;
    IF s.deleted_at IS NOT NULL THEN
        RAISE EXCEPTION 'cannot %: schedule % was deleted at %', verb, schedule_id, s.deleted_at
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    RETURN s;
END
$$;

CREATE OR REPLACE FUNCTION dispatch.pause(schedule_id uuid, reason text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s dispatch.schedules := dispatch._operable_schedule(pause.schedule_id, 'pause');
BEGIN
    IF length(pause.reason) > 500 THEN
        RAISE EXCEPTION 'reason is % characters; at most 500 are allowed', length(pause.reason)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF s.paused_at IS NOT NULL THEN
        RAISE NOTICE 'schedule % is already paused (since % by %)', s.id, s.paused_at, s.paused_by;
        RETURN;
    END IF;
    UPDATE dispatch.schedules
    SET paused_at = now(), paused_by = session_user, paused_reason = pause.reason
    WHERE id = s.id;
END
$$;
COMMENT ON FUNCTION dispatch.pause(uuid, text) IS
    'Pause a schedule: it keeps its definition, has no next_run_at and invokes nothing until dispatch.resume(); its pending runs end skipped. Records paused_at, paused_by (session_user) and the reason; audited as schedule.pause. A schedule already paused is left as it is.';

CREATE OR REPLACE FUNCTION dispatch.resume(schedule_id uuid)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s dispatch.schedules := dispatch._operable_schedule(resume.schedule_id, 'resume');
BEGIN
    IF s.paused_at IS NULL THEN
        RAISE NOTICE 'schedule % is not paused', s.id;
        RETURN;
    END IF;
    UPDATE dispatch.schedules
    SET paused_at = NULL, paused_by = NULL, paused_reason = NULL
    WHERE id = s.id;
END
$$;
COMMENT ON FUNCTION dispatch.resume(uuid) IS
    'Resume a paused schedule from the first slot after now (the slots of the pause are not caught up); audited as schedule.resume. A schedule that is not paused is left as it is.';

CREATE OR REPLACE FUNCTION dispatch.run_now(schedule_id uuid, traceparent text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s dispatch.schedules := dispatch._operable_schedule(run_now.schedule_id, 'run now');
    open_run dispatch.runs;
    run dispatch.runs;
BEGIN
    -- it decides from the runs it sees once it holds the schedule (the tick's marking may have
    -- committed a run just before)
    PERFORM dispatch._require_read_committed('dispatch.run_now');
    PERFORM dispatch._check_traceparent(run_now.traceparent, 'traceparent');
    -- A stopped schedule's runs are ended at the claim, never invoked: refuse rather than
    -- hand back a run id that can only end skipped.
    IF s.paused_at IS NOT NULL THEN
        RAISE EXCEPTION 'cannot run now: schedule % is paused (since % by %)', s.id, s.paused_at, s.paused_by
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'dispatch.resume() it first.';
    END IF;
    IF NOT s.enabled THEN
        RAISE EXCEPTION 'cannot run now: schedule % is disabled', s.id
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Enable it first.';
    END IF;
    SELECT * INTO open_run FROM dispatch.runs r
    WHERE r.schedule_id = s.id AND r.status IN ('pending', 'running')
      AND NOT dispatch._waits_its_turn(r)
    ORDER BY r.id LIMIT 1;
    IF s.overlap = 'skip' AND open_run.id IS NOT NULL THEN
        RAISE EXCEPTION 'cannot run now: schedule % has run % open (%, slot %) and its overlap is skip',
                        s.id, open_run.id, open_run.status, open_run.scheduled_for
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Wait for that run to finish, or set overlap to buffer_one or allow.';
    END IF;
    -- buffer_one keeps one run in flight: the manual run waits behind the open one, in the
    -- place of the slot that would have.
    IF s.overlap = 'buffer_one' AND open_run.id IS NOT NULL
       AND EXISTS (SELECT 1 FROM dispatch.runs r
                   WHERE r.schedule_id = s.id AND r.status = 'pending' AND r.not_before = 'infinity'
                     AND r.kind <> 'backfill') THEN
        RAISE EXCEPTION 'cannot run now: schedule % has run % open and a run waiting behind it (overlap buffer_one)',
                        s.id, open_run.id
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Wait for the open run to finish, or set overlap to allow.';
    END IF;

    -- Due at the instant of the call, with its own request id; the schedule's slots stay as
    -- they are (dispatch._advance_schedules leaves them to scheduled runs).
    INSERT INTO dispatch.runs AS r (schedule_id, project_id, scheduled_for, fire_at, kind, not_before, traceparent)
    SELECT s.id, s.project_id, due.at, due.at, 'manual',
           CASE WHEN s.overlap = 'buffer_one' AND open_run.id IS NOT NULL THEN timestamptz 'infinity' END,
           run_now.traceparent
    FROM (SELECT clock_timestamp() AS at) due  -- one instant: a later fire_at would read as jitter
    RETURNING r.* INTO run;
    INSERT INTO dispatch.audit_log (actor_id, project_id, action, metadata)
    VALUES (session_user, s.project_id, 'schedule.run_now', jsonb_build_object(
        'scheduleId', s.id, 'functionName', s.function_name, 'runId', run.id, 'requestId', run.request_id));
    PERFORM pg_notify('dispatch', json_build_object('marked', 1)::text);
    RETURN run.id;
END
$$;
COMMENT ON FUNCTION dispatch.run_now(uuid, text) IS
    'Invoke a schedule''s function now, outside its slots: inserts a pending run of kind manual, due at the instant of the call, with its own request_id, and NOTIFYs the listeners (dispatched within a second). next_run_at does not move; a slot that comes due while the manual run is open waits for it (overlap skip) and is marked as soon as it ends. Under overlap buffer_one with a run open, it waits behind that run (refused if a run already waits there). Refused (55000) for a deleted, paused or disabled schedule, and while a run is open under overlap skip; P0002 for an unknown id. Audited as schedule.run_now with the actor (session_user). Returns the run id. traceparent: a W3C traceparent the run''s invocations continue (22023 when it is not one).';

CREATE OR REPLACE FUNCTION dispatch.backfill(schedule_id uuid, from_ts timestamptz, to_ts timestamptz)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s dispatch.schedules := dispatch._operable_schedule(backfill.schedule_id, 'backfill');
    upto timestamptz;
    slots timestamptz[];
    marked integer;
BEGIN
    IF from_ts IS NULL OR NOT isfinite(from_ts) THEN
        RAISE EXCEPTION 'cannot backfill: from_ts must be a finite instant, not %', coalesce(from_ts::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF to_ts IS NULL OR NOT isfinite(to_ts) THEN
        RAISE EXCEPTION 'cannot backfill: to_ts must be a finite instant, not %', coalesce(to_ts::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'now() backfills up to the schedule''s next slot.';
    ELSIF from_ts >= to_ts THEN
        RAISE EXCEPTION 'cannot backfill: from_ts (%) must be before to_ts (%)', from_ts, to_ts
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF s.paused_at IS NOT NULL OR NOT s.enabled THEN
        RAISE EXCEPTION 'cannot backfill: schedule % is %', s.id,
                        CASE WHEN s.paused_at IS NOT NULL THEN 'paused' ELSE 'disabled' END
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Its runs would end skipped at the claim; resume or enable it first.';
    END IF;
    -- The past only, and never the schedule's own slots: from next_run_at on they are its own.
    upto := least(to_ts, s.next_run_at, clock_timestamp());
    slots := ARRAY(SELECT dispatch._cron_slots(s.cron_spec, from_ts - interval '1 microsecond',
                                               upto - interval '1 microsecond', s.timezone, 10000));
    -- Each waits its turn (not_before infinity): dispatch._follow_up lets one go at a time,
    -- oldest first, whenever nothing else of the schedule is open.
    INSERT INTO dispatch.runs AS r (schedule_id, project_id, scheduled_for, fire_at, kind, not_before)
    SELECT s.id, s.project_id, slot, slot, 'backfill', 'infinity'
    FROM unnest(slots) AS slot
    WHERE NOT EXISTS (SELECT 1 FROM dispatch.runs x WHERE x.schedule_id = s.id AND x.scheduled_for = slot)
      AND (s.calendar_id IS NULL OR NOT dispatch.calendar_excludes(s.calendar_id, slot))  -- never to run
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS marked = ROW_COUNT;
    IF cardinality(slots) = 10000 THEN
        RAISE NOTICE 'backfill stops at 10,000 slots a call: call it again from %', slots[10000];
    END IF;
    INSERT INTO dispatch.audit_log (actor_id, project_id, action, metadata)
    VALUES (session_user, s.project_id, 'schedule.backfill', jsonb_build_object(
        'scheduleId', s.id, 'functionName', s.function_name, 'from', from_ts, 'to', to_ts,
        'slots', cardinality(slots), 'marked', marked));
    PERFORM dispatch._follow_up(ARRAY[s.id]);
    RETURN marked;
END
$$;
COMMENT ON FUNCTION dispatch.backfill(uuid, timestamptz, timestamptz) IS
    'Mark each slot of the schedule in [from_ts, to_ts) that has no run yet and that its calendar does not exclude as a run of kind backfill (at most 10,000 a call, a NOTICE says where to go on), before the schedule''s next slot and now; returns how many. They are dispatched one at a time, oldest first, whenever nothing else of the schedule is open: its own slots go first and wait for one backfill run at most. Refused: 22023 when from_ts or to_ts is not a finite instant or from_ts is not before to_ts, 55000 for a deleted, paused or disabled schedule, P0002 for an unknown id. Audited as schedule.backfill with the actor (session_user).';
