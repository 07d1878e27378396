-- Events a tenant's application can act on, one JSON object each on the channel
-- dispatch_events (docs/policies.md, "When a schedule keeps failing"):
--
--   run.failed        a run ended error or lost
--   schedule.paused   a schedule paused itself after pause_after_failures failed runs in a row
--   breaker.opened    a function's circuit breaker opened
--   breaker.closed    ... and closed again
--
-- Every object has event, at and projectId, and the ids of what it is about; that is all a
-- notification carries, since any role that can connect can LISTEN: the rest (function name,
-- error text, request id, the runs that failed) is read from the tables with their privileges,
-- or comes in the POST to the project's events_url (dispatch.event_deliveries), which has all.
-- Sent at commit, like any NOTIFY, to the sessions listening then.

CREATE OR REPLACE FUNCTION dispatch._event(event text, project_id text, body jsonb, detail jsonb)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    head constant jsonb := jsonb_build_object('event', event, 'at', clock_timestamp(), 'projectId', project_id)
                           || jsonb_strip_nulls(body);
BEGIN
    PERFORM pg_notify('dispatch_events', head::text);
    INSERT INTO dispatch.event_deliveries (project_id, url, payload)
    SELECT p.project_id, p.events_url, head || jsonb_strip_nulls(detail)
    FROM dispatch.projects p
    WHERE p.project_id = _event.project_id AND p.events_url IS NOT NULL;
END
$$;
COMMENT ON FUNCTION dispatch._event(text, text, jsonb, jsonb) IS
    'One event: NOTIFY dispatch_events with event, at, projectId and body''s fields (ids only), and, when the project has an events_url, queue its delivery there with detail''s fields too (dispatch.event_deliveries). NULL fields are left out.';

-- Event deliveries, for the listeners (dispatcher/event_delivery.py): claim those due, then
-- record each attempt's outcome. A claim's lease is next_attempt_at itself, moved past the
-- attempt: a delivery whose listener died goes again when it passes.
CREATE OR REPLACE FUNCTION dispatch.claim_event_deliveries(worker text, max_deliveries integer, lease interval)
RETURNS TABLE (delivery_id bigint, url text, payload text, attempt integer)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF lease IS NULL OR lease <= interval '0' OR lease > interval '1 hour' THEN
        RAISE EXCEPTION 'lease must be more than 0 and at most 1 hour, not %', coalesce(lease::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    UPDATE dispatch.event_deliveries d
    SET attempts = d.attempts + 1, worker = claim_event_deliveries.worker,
        next_attempt_at = now() + claim_event_deliveries.lease
    FROM (SELECT x.id FROM dispatch.event_deliveries x
          WHERE x.delivered_at IS NULL AND x.gave_up_at IS NULL AND x.next_attempt_at <= now()
          ORDER BY x.next_attempt_at
          LIMIT greatest(claim_event_deliveries.max_deliveries, 0)
          FOR UPDATE SKIP LOCKED) due
    WHERE d.id = due.id
    RETURNING d.id, d.url, d.payload::text, d.attempts;
END
$$;
COMMENT ON FUNCTION dispatch.claim_event_deliveries(text, integer, interval) IS
    'For listeners: up to max_deliveries event deliveries whose next attempt has come (SKIP LOCKED), each with its attempt number; each is not handed out again until lease has passed.';

CREATE OR REPLACE FUNCTION dispatch.finish_event_deliveries(worker text, delivery_ids bigint[], attempts integer[],
                                                          errors text[])
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    recorded integer;
BEGIN
    -- An outcome counts for the attempt it was claimed with: a late one from an attempt whose
    -- lease passed changes nothing. A failure waits its back-off (doubled each time, at most an
    -- hour, less up to a quarter at random) or, after the last attempt, is given up.
    UPDATE dispatch.event_deliveries d
    SET delivered_at = CASE WHEN o.error IS NULL THEN now() END,
        gave_up_at = CASE WHEN o.error IS NOT NULL AND d.attempts >= st.event_max_attempts THEN now() END,
        last_error = left(o.error, 500),
        next_attempt_at = CASE WHEN o.error IS NULL OR d.attempts >= st.event_max_attempts THEN d.next_attempt_at
                               ELSE now() + least(st.event_retry_backoff * power(2, d.attempts - 1), interval '1 hour')
                                            * (1 - random() / 4) END
    FROM unnest(finish_event_deliveries.delivery_ids, finish_event_deliveries.attempts,
                finish_event_deliveries.errors) AS o(id, attempt, error)
    CROSS JOIN dispatch.settings st
    WHERE d.id = o.id AND d.attempts = o.attempt AND d.delivered_at IS NULL AND d.gave_up_at IS NULL;
    GET DIAGNOSTICS recorded = ROW_COUNT;
    RETURN recorded;
END
$$;
COMMENT ON FUNCTION dispatch.finish_event_deliveries(text, bigint[], integer[], text[]) IS
    'For listeners: the outcome of each claimed event delivery (error NULL: delivered), for the attempt it was claimed with; a failure is retried after dispatch.settings.event_retry_backoff, doubled each time, or given up after event_max_attempts. Returns how many it recorded.';

CREATE OR REPLACE FUNCTION dispatch.next_event_delivery_at()
RETURNS timestamptz
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT d.next_attempt_at FROM dispatch.event_deliveries d
    WHERE d.delivered_at IS NULL AND d.gave_up_at IS NULL
    ORDER BY d.next_attempt_at LIMIT 1
$$;
COMMENT ON FUNCTION dispatch.next_event_delivery_at() IS
    'For listeners: when the next event delivery is due (NULL: none waits).';

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
    PERFORM dispatch._event('run.failed', f.project_id,
                jsonb_build_object('runId', f.id, 'scheduleId', f.schedule_id, 'status', f.status,
                                   'attempt', f.attempt - f.released, 'kind', f.kind),
                jsonb_build_object('functionName', x.function_name, 'error', f.error, 'requestId', f.request_id,
                                   'scheduledFor', f.scheduled_for))
    FROM unnest(finished) f
    JOIN dispatch.schedules x ON x.id = f.schedule_id
    WHERE f.status IN ('error', 'lost');

    FOR s IN SELECT DISTINCT x.id, x.project_id, x.function_name, x.pause_after_failures, x.updated_at
             FROM unnest(finished) f
             JOIN dispatch.schedules x ON x.id = f.schedule_id
             WHERE f.status IN ('error', 'lost') AND x.pause_after_failures IS NOT NULL
               AND x.enabled AND x.paused_at IS NULL AND x.deleted_at IS NULL AND x.ended_at IS NULL
    LOOP
        SELECT array_agg(r.id ORDER BY r.scheduled_for, r.id), bool_and(r.status <> 'ok')
        INTO last_runs, all_failed
        FROM (SELECT r.id, r.status, r.scheduled_for FROM dispatch.runs r
              WHERE r.schedule_id = s.id AND r.status IN ('ok', 'error', 'lost') AND r.finished_at >= s.updated_at
              ORDER BY r.scheduled_for DESC, r.id DESC
              LIMIT s.pause_after_failures) r;
        IF cardinality(last_runs) = s.pause_after_failures AND all_failed THEN
            -- (the runs named: all of them, or the first three and the last three)
            UPDATE dispatch.schedules
            SET paused_at = now(), paused_by = 'pgdispatch',
                paused_reason = format('paused itself: its last %s runs failed (runs %s); dispatch.resume() starts the count again',
                                       s.pause_after_failures,
                                       CASE WHEN cardinality(last_runs) <= 6 THEN array_to_string(last_runs, ', ')
                                            ELSE array_to_string(last_runs[1:3], ', ') || ', …, '
                                                 || array_to_string(last_runs[cardinality(last_runs) - 2:], ', ') END)
            WHERE id = s.id;
            PERFORM dispatch._event('schedule.paused', s.project_id,
                        jsonb_build_object('scheduleId', s.id, 'pauseAfterFailures', s.pause_after_failures),
                        jsonb_build_object('functionName', s.function_name, 'failedRuns', to_jsonb(last_runs)));
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION dispatch._runs_failed(dispatch.runs[]) IS
    'For runs just finished: a run.failed event (dispatch_events) for each that ended error or lost, and the self-pause of each of their schedules whose last pause_after_failures runs since it was last written all failed.';
