-- Events a tenant's application can act on, one JSON object each on the channel
-- dispatch_events (docs/policies.md, "When a schedule keeps failing"):
--
--   run.failed        a run ended error or lost
--   schedule.paused   a schedule paused itself after pause_after_failures failed runs in a row
--   breaker.opened    a function's circuit breaker opened
--   breaker.closed    ... and closed again
--
-- Every object has event, at and projectId; the rest depends on the event. Sent at commit,
-- like any NOTIFY, and to the sessions listening then: an application that must not miss one
-- reads the audit log too.

CREATE OR REPLACE FUNCTION dispatch._event(event text, project_id text, body jsonb)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_notify('dispatch_events',
                     (jsonb_build_object('event', event, 'at', clock_timestamp(), 'projectId', project_id)
                      || jsonb_strip_nulls(body))::text)
$$;
COMMENT ON FUNCTION dispatch._event(text, text, jsonb) IS
    'NOTIFY dispatch_events with one event as a JSON object: event, at, projectId and body''s fields (those not NULL).';

-- Runs that just finished, some of them failed (error, lost): one run.failed event each, and
-- the schedules among theirs with pause_after_failures whose last that many runs all failed
-- pause themselves. The runs counted are those finished since the schedule was last written (a
-- resume, an edit): a resume starts the count again. The callers hold the schedules' rows.
CREATE OR REPLACE FUNCTION dispatch._runs_failed(finished dispatch.runs[])
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s record;
    last_runs bigint[];
    all_failed boolean;
BEGIN
    PERFORM dispatch._event('run.failed', f.project_id, jsonb_build_object(
                'runId', f.id, 'scheduleId', f.schedule_id, 'functionName', x.function_name,
                'status', f.status, 'error', f.error, 'attempt', f.attempt - f.released,
                'requestId', f.request_id, 'scheduledFor', f.scheduled_for, 'kind', f.kind))
    FROM unnest(finished) f
    JOIN dispatch.schedules x ON x.id = f.schedule_id
    WHERE f.status IN ('error', 'lost');

    FOR s IN SELECT DISTINCT x.id, x.project_id, x.function_name, x.pause_after_failures, x.updated_at
             FROM unnest(finished) f
             JOIN dispatch.schedules x ON x.id = f.schedule_id
             WHERE f.status IN ('error', 'lost') AND x.pause_after_failures IS NOT NULL
               AND x.paused_at IS NULL AND x.deleted_at IS NULL
    LOOP
        SELECT array_agg(r.id ORDER BY r.scheduled_for, r.id), bool_and(r.status <> 'ok')
        INTO last_runs, all_failed
        FROM (SELECT r.id, r.status, r.scheduled_for FROM dispatch.runs r
              WHERE r.schedule_id = s.id AND r.status IN ('ok', 'error', 'lost') AND r.finished_at >= s.updated_at
              ORDER BY r.scheduled_for DESC, r.id DESC
              LIMIT s.pause_after_failures) r;
        IF cardinality(last_runs) = s.pause_after_failures AND all_failed THEN
            UPDATE dispatch.schedules
            SET paused_at = now(), paused_by = 'pgdispatch',
                paused_reason = left(format('paused itself: its last %s runs failed (runs %s); dispatch.resume() starts the count again',
                                            s.pause_after_failures, array_to_string(last_runs, ', ')), 500)
            WHERE id = s.id;
            PERFORM dispatch._event('schedule.paused', s.project_id, jsonb_build_object(
                        'scheduleId', s.id, 'functionName', s.function_name, 'failedRuns', to_jsonb(last_runs),
                        'pauseAfterFailures', s.pause_after_failures));
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION dispatch._runs_failed(dispatch.runs[]) IS
    'For runs just finished: a run.failed event (dispatch_events) for each that ended error or lost, and the self-pause of each of their schedules whose last pause_after_failures runs since it was last written all failed.';
