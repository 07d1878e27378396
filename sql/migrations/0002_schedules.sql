-- Time zone names, schedules and the audit log, with the write path that validates them.

-- pg_timezone_names reads the whole tz database (tens of ms a query), far too slow to
-- consult on every write; its names are copied here and refreshed on demand. Left out:
-- localtime (whatever the server's clock is set to), posixrules and Factory (not places),
-- and the posix/ copies of the canonical names.
CREATE TABLE dispatch.timezones (
    name text PRIMARY KEY
);

CREATE FUNCTION dispatch._timezone_names()
RETURNS SETOF text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT name FROM pg_catalog.pg_timezone_names
    WHERE name !~ '^(posix|right)/' AND name NOT IN ('localtime', 'posixrules', 'Factory')
$$;
COMMENT ON TABLE dispatch.timezones IS
    'Cache of pg_timezone_names.name, the only zone names schedules accept. Refresh with dispatch.refresh_timezones() after a tzdata upgrade.';

CREATE FUNCTION dispatch.refresh_timezones()
RETURNS integer
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH fresh AS (
        INSERT INTO dispatch.timezones (name)
        SELECT dispatch._timezone_names()
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT count(*)::integer FROM fresh
$$;
COMMENT ON FUNCTION dispatch.refresh_timezones() IS
    'Copy new names from pg_timezone_names (less localtime, posixrules, Factory and posix/ copies) into dispatch.timezones; returns how many were added.';

INSERT INTO dispatch.timezones (name) SELECT dispatch._timezone_names();

CREATE FUNCTION dispatch.check_timezone(tz text)
RETURNS text
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF tz IS NULL THEN
        RAISE EXCEPTION 'timezone must not be null' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM dispatch.timezones WHERE name = tz)
       OR (length(tz) <= 64 AND tz IN (SELECT dispatch._timezone_names())) THEN
        RETURN tz;
    END IF;
    RAISE EXCEPTION USING
        ERRCODE = 'invalid_parameter_value',
        MESSAGE = format('timezone "%s" is not a time zone name from the tz database',
                         CASE WHEN length(tz) > 80 THEN left(tz, 80) || '...' ELSE tz END),
        HINT = 'Use an IANA name such as Europe/Berlin or UTC (see pg_timezone_names); abbreviations such as CEST and offsets such as +05 are refused.';
END
$$;
COMMENT ON FUNCTION dispatch.check_timezone(text) IS
    'Return tz when it is a name from the tz database (pg_timezone_names); raise SQLSTATE 22023 otherwise.';

CREATE FUNCTION dispatch.cron_next(expr text, after timestamptz, tz text DEFAULT 'UTC')
RETURNS timestamptz
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN dispatch.cron_spec_next(dispatch.cron_parse(expr), after, dispatch.check_timezone(tz));
END
$$;
COMMENT ON FUNCTION dispatch.cron_next(text, timestamptz, text) IS
    'The earliest minute-aligned instant strictly after "after" whose wall-clock time in tz matches the cron expression. Fixed-time expressions follow Debian cron across DST (a skipped time fires at the jump, a repeated one once); expressions whose minute or hour starts with * follow real time.';

CREATE FUNCTION dispatch.cron_is_valid(expr text)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM dispatch.cron_parse(expr);
    RETURN expr IS NOT NULL;
EXCEPTION WHEN OTHERS THEN
    RETURN false;
END
$$;
COMMENT ON FUNCTION dispatch.cron_is_valid(text) IS
    'True when the expression parses and can fire; never raises.';

CREATE TABLE dispatch.schedules (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id      text NOT NULL,
    function_name   text NOT NULL,
    cron_expression text NOT NULL,
    timezone        text NOT NULL DEFAULT 'UTC',
    args            jsonb NOT NULL DEFAULT '{}',
    enabled         boolean NOT NULL DEFAULT true,
    deleted_at      timestamptz,
    next_run_at     timestamptz,
    last_run_at     timestamptz,
    last_status     text,
    last_error      text,
    max_attempts    integer NOT NULL DEFAULT 3,
    cron_spec       dispatch.cron_spec NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schedules_project_id_check
        CHECK (project_id ~ '^[^[:space:][:cntrl:]/]{1,200}$' AND project_id !~ '^[.]{1,2}$'),
    CONSTRAINT schedules_args_check
        CHECK (jsonb_typeof(args) = 'object'),
    CONSTRAINT schedules_last_status_check
        CHECK (last_status IN ('ok', 'error', 'skipped', 'lost')),
    CONSTRAINT schedules_max_attempts_check
        CHECK (max_attempts BETWEEN 1 AND 10),
    CONSTRAINT schedules_next_run_at_live_check
        CHECK (next_run_at IS NULL OR (enabled AND deleted_at IS NULL))
);
COMMENT ON TABLE dispatch.schedules IS
    'One row per schedule. INSERT/UPDATE from any client validates cron_expression, timezone and function_name and computes next_run_at.';
COMMENT ON COLUMN dispatch.schedules.project_id IS 'Tenant: 1-200 characters, no whitespace, control characters or /, not . or .. (it is one segment of the invoke URL).';
COMMENT ON COLUMN dispatch.schedules.function_name IS
    'Function to call: a letter or digit, then letters, digits, _ . - (at most 128); percent-encoded into the invoke URL.';
COMMENT ON COLUMN dispatch.schedules.timezone IS 'IANA zone name (pg_timezone_names) the expression is read in.';
COMMENT ON COLUMN dispatch.schedules.args IS 'JSON object passed as "args" in the request body; at most 4 MiB of JSON text and 64 levels deep.';
COMMENT ON COLUMN dispatch.schedules.deleted_at IS 'Soft delete: set it to stop the schedule and keep its history.';
COMMENT ON COLUMN dispatch.schedules.next_run_at IS
    'Next slot to fire; NULL when disabled or deleted. Stays on a slot while its run is pending or running; dispatch.complete_run advances it.';
COMMENT ON COLUMN dispatch.schedules.last_status IS 'Status of the latest finished run: ok, error, skipped or lost.';
COMMENT ON COLUMN dispatch.schedules.max_attempts IS 'Claims a run may take before an expired lease makes it lost.';
COMMENT ON COLUMN dispatch.schedules.cron_spec IS 'cron_expression parsed by the write trigger (dispatch.cron_parse).';
COMMENT ON COLUMN dispatch.schedules.updated_at IS 'Last change to the definition (not to next_run_at or last_*).';

-- Due-marking reads only live rows in next_run_at order: its cost follows what is due.
CREATE INDEX schedules_next_run_at_idx ON dispatch.schedules (next_run_at) WHERE next_run_at IS NOT NULL;
CREATE INDEX schedules_project_id_idx ON dispatch.schedules (project_id);

CREATE TABLE dispatch.audit_log (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    actor_id    text,
    project_id  text,
    action      text NOT NULL,
    ip_hash     text,
    user_agent  text,
    metadata    jsonb NOT NULL DEFAULT '{}'
);
COMMENT ON TABLE dispatch.audit_log IS
    'One row per schedule change (schedule.create/update/delete) and per finished run (schedule.run.ok/error/skipped/lost).';
COMMENT ON COLUMN dispatch.audit_log.actor_id IS 'The login (session_user) that changed a schedule; NULL for runs (no user session).';
COMMENT ON COLUMN dispatch.audit_log.metadata IS
    'For runs: scheduleId, requestId, functionName, runId, scheduledFor, attempt, and error when there is one.';
CREATE INDEX audit_log_project_id_at_idx ON dispatch.audit_log (project_id, at);
-- Rows arrive in time order: a BRIN index serves retention for almost no upkeep.
CREATE INDEX audit_log_at_brin_idx ON dispatch.audit_log USING brin (at);

-- The write path. Triggers are named so that they sort in firing order.

CREATE FUNCTION dispatch._schedule_before_write()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
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
    NEW.cron_spec := dispatch.cron_parse(NEW.cron_expression);
    IF NEW.cron_spec IS NULL THEN
        RAISE EXCEPTION 'cron_expression must not be null' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM dispatch.check_timezone(NEW.timezone);

    IF NOT NEW.enabled OR NEW.deleted_at IS NOT NULL THEN
        NEW.next_run_at := NULL;
    ELSIF TG_OP = 'INSERT'
          OR NOT OLD.enabled OR OLD.deleted_at IS NOT NULL
          OR NEW.cron_expression IS DISTINCT FROM OLD.cron_expression
          OR NEW.timezone IS DISTINCT FROM OLD.timezone THEN
        NEW.next_run_at := dispatch.cron_spec_next(NEW.cron_spec, now(), NEW.timezone);
    END IF;
    IF TG_OP = 'UPDATE' THEN
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END
$$;

-- Only definition changes go through validation and audit; the dispatcher's own updates
-- (next_run_at, last_*) do not.
CREATE TRIGGER _100_validate_insert BEFORE INSERT ON dispatch.schedules
    FOR EACH ROW EXECUTE FUNCTION dispatch._schedule_before_write();
CREATE TRIGGER _100_validate_update
    BEFORE UPDATE OF project_id, function_name, cron_expression, timezone, args, enabled, deleted_at
    ON dispatch.schedules
    FOR EACH ROW EXECUTE FUNCTION dispatch._schedule_before_write();

CREATE FUNCTION dispatch._schedule_audit()
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
    ELSE
        action := 'schedule.update';
        SELECT jsonb_object_agg(n.key, n.value) INTO changed
        FROM jsonb_each(to_jsonb(NEW)) n
        JOIN jsonb_each(to_jsonb(OLD)) o USING (key)
        WHERE n.key IN ('project_id', 'function_name', 'cron_expression', 'timezone', 'args', 'enabled', 'deleted_at')
          AND n.value IS DISTINCT FROM o.value;
    END IF;
    INSERT INTO dispatch.audit_log (actor_id, project_id, action, metadata)
    VALUES (session_user, NEW.project_id, action,
            jsonb_strip_nulls(jsonb_build_object(
                'scheduleId', NEW.id,
                'functionName', NEW.function_name,
                'cronExpression', NEW.cron_expression,
                'timezone', NEW.timezone,
                'changed', changed)));
    RETURN NULL;
END
$$;

CREATE TRIGGER _800_audit_insert AFTER INSERT ON dispatch.schedules
    FOR EACH ROW EXECUTE FUNCTION dispatch._schedule_audit();
CREATE TRIGGER _800_audit_update AFTER UPDATE ON dispatch.schedules
    FOR EACH ROW
    WHEN (OLD.project_id IS DISTINCT FROM NEW.project_id
          OR OLD.function_name IS DISTINCT FROM NEW.function_name
          OR OLD.cron_expression IS DISTINCT FROM NEW.cron_expression
          OR OLD.timezone IS DISTINCT FROM NEW.timezone
          OR OLD.args IS DISTINCT FROM NEW.args
          OR OLD.enabled IS DISTINCT FROM NEW.enabled
          OR OLD.deleted_at IS DISTINCT FROM NEW.deleted_at)
    EXECUTE FUNCTION dispatch._schedule_audit();

-- Listeners keep a timer on the earliest next_run_at: a definition change may move it.
-- (dispatch.complete_run moves it too, but the listener that calls it knows that already.)
CREATE FUNCTION dispatch._schedule_notify()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_notify('dispatch', 'schedules');
    RETURN NULL;
END
$$;

CREATE TRIGGER _900_notify AFTER INSERT OR UPDATE OF enabled, deleted_at, cron_expression, timezone
    ON dispatch.schedules
    FOR EACH STATEMENT EXECUTE FUNCTION dispatch._schedule_notify();
