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
