-- Batched completion: dispatch.complete_run's rules for many runs in one statement, so that a
-- listener records a batch of outcomes in one round trip and one transaction.

CREATE FUNCTION dispatch.complete_runs(
    worker        text,
    run_ids       bigint[],
    statuses      text[],
    errors        text[],
    http_statuses integer[],
    durations_ms  integer[]
)
RETURNS TABLE (run_id bigint, recorded boolean, advanced boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(complete_runs.statuses) s WHERE s IS NULL OR s NOT IN ('ok', 'error'))
       OR cardinality(complete_runs.statuses) <> cardinality(complete_runs.run_ids) THEN
        RAISE EXCEPTION 'statuses must hold ok or error for each run id' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH input AS (
        SELECT *
        FROM unnest(complete_runs.run_ids, complete_runs.statuses, complete_runs.errors,
                    complete_runs.http_statuses, complete_runs.durations_ms)
             AS i(id, status, error, http_status, duration_ms)
    ), done AS (
        -- fenced on the worker, as in complete_run
        UPDATE dispatch.runs x
        SET status = i.status,
            finished_at = now(),
            error = left(i.error, 500),
            http_status = i.http_status,
            duration_ms = i.duration_ms
        FROM input i
        WHERE x.id = i.id AND x.status = 'running' AND x.worker = complete_runs.worker
        RETURNING x.*
    ), locked AS MATERIALIZED (
        -- lock the schedules in id order (no deadlock with another batch or a bulk edit), then
        -- compute each next slot once: a CTE that is not MATERIALIZED would be inlined per row
        SELECT s.id, s.project_id, s.function_name, s.next_run_at, s.cron_spec, s.timezone
        FROM dispatch.schedules s
        WHERE s.id IN (SELECT d.schedule_id FROM done d)
        ORDER BY s.id
        FOR NO KEY UPDATE
    ), nexts AS MATERIALIZED (
        SELECT d.id, d.schedule_id, d.status, d.error, d.request_id, d.scheduled_for, d.attempt,
               coalesce(d.claimed_at, d.finished_at) AS ran_at, l.project_id, l.function_name,
               CASE WHEN l.next_run_at = d.scheduled_for
                    THEN dispatch.cron_spec_next(l.cron_spec, greatest(d.scheduled_for, now()), l.timezone)
               END AS next_at
        FROM done d
        JOIN locked l ON l.id = d.schedule_id
    ), advance AS (
        UPDATE dispatch.schedules s
        SET next_run_at = coalesce(n.next_at, s.next_run_at),
            last_run_at = n.ran_at,
            last_status = n.status,
            last_error = n.error
        FROM nexts n
        WHERE s.id = n.schedule_id
    ), audit AS (
        INSERT INTO dispatch.audit_log (actor_id, project_id, action, metadata)
        SELECT NULL, n.project_id, 'schedule.run.' || n.status,
               jsonb_strip_nulls(jsonb_build_object(
                   'scheduleId', n.schedule_id,
                   'requestId', n.request_id,
                   'functionName', n.function_name,
                   'runId', n.id,
                   'scheduledFor', n.scheduled_for,
                   'attempt', n.attempt,
                   'error', n.error))
        FROM nexts n
    )
    SELECT i.id, n.id IS NOT NULL, n.next_at IS NOT NULL
    FROM input i
    LEFT JOIN nexts n ON n.id = i.id;
END
$$;
COMMENT ON FUNCTION dispatch.complete_runs(text, bigint[], text[], text[], integer[], integer[]) IS
    'dispatch.complete_run for many runs of one worker in one statement: record each outcome the worker still holds, advance each schedule still waiting on its slot, write the audit rows. The arrays are parallel (errors, http_statuses and durations_ms may hold NULLs). Returns run_id, recorded, advanced for each input run.';
