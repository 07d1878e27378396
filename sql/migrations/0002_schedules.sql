-- Time zone names, schedules and the audit log. The write path that validates schedules (its
-- triggers) is in sql/code/.

-- pg_timezone_names reads the whole tz database (tens of ms a query), far too slow to
-- consult on every write; its names are copied here and refreshed on demand
-- (dispatch.refresh_timezones). Left out: localtime (whatever the server's clock is set to),
-- posixrules and Factory (not places), and the posix/ and right/ copies of the canonical names.
CREATE TABLE dispatch.timezones (
    name text PRIMARY KEY
);

COMMENT ON TABLE dispatch.timezones IS
    'Cache of pg_timezone_names.name, the only zone names schedules accept. Refresh with dispatch.refresh_timezones() after a tzdata upgrade.';

INSERT INTO dispatch.timezones (name)
SELECT name FROM pg_catalog.pg_timezone_names
WHERE name !~ '^(posix|right)/' AND name NOT IN ('localtime', 'posixrules', 'Factory');

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
