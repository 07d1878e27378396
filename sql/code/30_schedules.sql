-- The write path of dispatch.schedules: every INSERT, UPDATE and DELETE, psql's included, goes
-- through these triggers. Their names sort in firing order.
--
--   _050_soft_delete      BEFORE DELETE: a hard delete becomes the soft delete (invariant 4)
--   _100_validate_*       BEFORE INSERT/UPDATE: validate the definition, derive cron_spec and
--                         next_run_at (invariant 2)
--   _200_end_pending      AFTER UPDATE that stops the schedule: its pending runs end
--   _800_audit_*          AFTER: one audit row per definition change
--   _900_notify           AFTER, per statement: listeners re-plan their clocks

CREATE OR REPLACE FUNCTION dispatch._schedule_before_write()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    live boolean;
BEGIN
    IF NEW.function_name IS NULL OR NEW.function_name !~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('function_name %s is not a function name',
                             coalesce('"' || left(NEW.function_name, 80) || '"', 'NULL')),
            HINT = 'A letter or digit, then letters, digits, "_", "." or "-", at most 128 characters.';
    END IF;
    IF TG_OP = 'INSERT' OR NEW.args IS DISTINCT FROM OLD.args THEN
        -- args travel in every request body: bound them here rather than in every listener
        IF octet_length(NEW.args::text) > 4194304 THEN
            RAISE EXCEPTION 'args is % bytes of JSON; at most 4194304 (4 MiB) are allowed', octet_length(NEW.args::text)
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass a reference (a key, a URL) that the function fetches instead.';
        END IF;
        IF jsonb_path_exists(NEW.args, 'strict $.**{65}') THEN
            RAISE EXCEPTION 'args nest more than 64 levels deep'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass a reference (a key, a URL) that the function fetches instead.';
        END IF;
    END IF;
    -- cron_spec is derived: whatever a statement wrote there, it is the parsed expression. An
    -- unchanged expression and zone are not validated again, so that a schedule whose zone was
    -- dropped from the tz database can still be edited, disabled or deleted.
    IF TG_OP = 'INSERT' OR NEW.cron_expression IS DISTINCT FROM OLD.cron_expression
       OR NEW.cron_spec IS DISTINCT FROM OLD.cron_spec THEN
        NEW.cron_spec := dispatch.cron_parse(NEW.cron_expression);
        IF NEW.cron_spec IS NULL THEN
            RAISE EXCEPTION 'cron_expression must not be null' USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    IF TG_OP = 'INSERT' OR NEW.timezone IS DISTINCT FROM OLD.timezone THEN
        PERFORM dispatch.check_timezone(NEW.timezone);
    END IF;

    live := NEW.enabled AND NEW.deleted_at IS NULL AND NEW.paused_at IS NULL;
    IF NOT live THEN
        NEW.next_run_at := NULL;
        NEW.backoff_reason := NULL;
    ELSIF TG_OP = 'INSERT'
          OR NOT (OLD.enabled AND OLD.deleted_at IS NULL AND OLD.paused_at IS NULL)
          OR NEW.cron_expression IS DISTINCT FROM OLD.cron_expression
          OR NEW.timezone IS DISTINCT FROM OLD.timezone THEN
        -- The statement's clock, not the transaction's: a transaction that began before a slot
        -- ran must not put the schedule back onto it. And never on or before the last slot
        -- that finished, whatever the clock says (a slot marked ahead of time by tick(horizon)).
        NEW.next_run_at := dispatch.cron_spec_next(NEW.cron_spec, greatest(clock_timestamp(), NEW.last_slot),
                                                   dispatch.check_timezone(NEW.timezone));
        NEW.backoff_reason := NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END
$$;

-- Only definition changes go through validation and audit; the dispatcher's own updates
-- (next_run_at, last_*) do not. cron_spec is listed so that a direct write to it is re-derived.
CREATE OR REPLACE TRIGGER _100_validate_insert BEFORE INSERT ON dispatch.schedules
    FOR EACH ROW EXECUTE FUNCTION dispatch._schedule_before_write();
CREATE OR REPLACE TRIGGER _100_validate_update
    BEFORE UPDATE OF project_id, function_name, cron_expression, timezone, args, enabled, deleted_at,
                     paused_at, cron_spec
    ON dispatch.schedules
    FOR EACH ROW EXECUTE FUNCTION dispatch._schedule_before_write();

-- A hard DELETE would cascade away the schedule's runs, an open one included, with no audit
-- row. It becomes the soft delete instead: the UPDATE below goes through the triggers like any
-- other (pending runs end, audit row with the actor). SECURITY DEFINER so that a role allowed
-- to delete need not also be allowed to write deleted_at.
CREATE OR REPLACE FUNCTION dispatch._schedule_soft_delete()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE dispatch.schedules SET deleted_at = now() WHERE id = OLD.id AND deleted_at IS NULL;
    IF FOUND THEN
        RAISE NOTICE 'schedule % was soft-deleted (deleted_at set) instead: its runs and audit trail are kept', OLD.id;
    END IF;
    RETURN NULL;  -- the row stays
END
$$;

CREATE OR REPLACE TRIGGER _050_soft_delete BEFORE DELETE ON dispatch.schedules
    FOR EACH ROW EXECUTE FUNCTION dispatch._schedule_soft_delete();

-- A schedule that stops (disabled, paused or deleted) invokes nothing it had pending.
CREATE OR REPLACE FUNCTION dispatch._schedule_end_pending()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Waits for a claim in progress on one of them: a run claimed before this change commits
    -- stays claimed (and is invoked); every other pending run ends here.
    PERFORM dispatch._end_stale_runs(
        ARRAY(SELECT r.id FROM dispatch.runs r WHERE r.schedule_id = NEW.id AND r.status = 'pending'),
        wait => true);
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER _200_end_pending AFTER UPDATE OF enabled, deleted_at, paused_at ON dispatch.schedules
    FOR EACH ROW
    WHEN (NEW.next_run_at IS NULL AND OLD.next_run_at IS NOT NULL)
    EXECUTE FUNCTION dispatch._schedule_end_pending();

CREATE OR REPLACE FUNCTION dispatch._schedule_audit()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    action text;
    changed jsonb;
BEGIN
    IF TG_OP = 'INSERT' THEN
        action := 'schedule.create';
    ELSIF NEW.deleted_at IS NOT NULL AND OLD.deleted_at IS NULL THEN
        action := 'schedule.delete';
    ELSIF NEW.paused_at IS NOT NULL AND OLD.paused_at IS NULL THEN
        action := 'schedule.pause';
    ELSIF NEW.paused_at IS NULL AND OLD.paused_at IS NOT NULL THEN
        action := 'schedule.resume';
    ELSE
        action := 'schedule.update';
        SELECT jsonb_object_agg(n.key, n.value) INTO changed
        FROM jsonb_each(to_jsonb(NEW)) n
        JOIN jsonb_each(to_jsonb(OLD)) o USING (key)
        WHERE n.key IN ('project_id', 'function_name', 'cron_expression', 'timezone', 'args', 'enabled',
                        'deleted_at', 'max_attempts')
          AND n.value IS DISTINCT FROM o.value;
    END IF;
    INSERT INTO dispatch.audit_log (actor_id, project_id, action, metadata)
    VALUES (session_user, NEW.project_id, action,
            jsonb_strip_nulls(jsonb_build_object(
                'scheduleId', NEW.id,
                'functionName', NEW.function_name,
                'cronExpression', NEW.cron_expression,
                'timezone', NEW.timezone,
                'reason', CASE WHEN action = 'schedule.pause' THEN NEW.paused_reason END,
                'changed', changed)));
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER _800_audit_insert AFTER INSERT ON dispatch.schedules
    FOR EACH ROW EXECUTE FUNCTION dispatch._schedule_audit();
-- UPDATE OF: the dispatcher's own updates (next_run_at, last_*) do not fire it at all, so its
-- WHEN (which compares args, up to 4 MiB) is evaluated only when a definition was written.
CREATE OR REPLACE TRIGGER _800_audit_update
    AFTER UPDATE OF project_id, function_name, cron_expression, timezone, args, enabled, deleted_at,
                    paused_at, max_attempts
    ON dispatch.schedules
    FOR EACH ROW
    WHEN (OLD.project_id IS DISTINCT FROM NEW.project_id
          OR OLD.function_name IS DISTINCT FROM NEW.function_name
          OR OLD.cron_expression IS DISTINCT FROM NEW.cron_expression
          OR OLD.timezone IS DISTINCT FROM NEW.timezone
          OR OLD.args IS DISTINCT FROM NEW.args
          OR OLD.enabled IS DISTINCT FROM NEW.enabled
          OR OLD.deleted_at IS DISTINCT FROM NEW.deleted_at
          OR OLD.paused_at IS DISTINCT FROM NEW.paused_at
          OR OLD.max_attempts IS DISTINCT FROM NEW.max_attempts)
    EXECUTE FUNCTION dispatch._schedule_audit();

-- Listeners keep a timer on the earliest next_run_at: a definition change may move it.
-- (Finishing a run moves it too, but the listener that finished it knows that already.)
CREATE OR REPLACE FUNCTION dispatch._schedule_notify()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_notify('dispatch', 'schedules');
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER _900_notify
    AFTER INSERT OR UPDATE OF enabled, deleted_at, paused_at, cron_expression, timezone
    ON dispatch.schedules
    FOR EACH STATEMENT EXECUTE FUNCTION dispatch._schedule_notify();
