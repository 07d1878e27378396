-- Views for DBAs: what each schedule is doing, what failed, which listeners are connected.

CREATE OR REPLACE VIEW dispatch.schedule_status AS
SELECT s.id,
       s.project_id,
       s.function_name,
       s.cron_expression,
       s.timezone,
       s.enabled AND s.deleted_at IS NULL AND s.paused_at IS NULL AND s.ended_at IS NULL AS live,
       s.next_run_at,
       s.last_run_at,
       s.last_status,
       s.last_error,
       open.status AS current_run_status,
       coalesce(fails.n, 0) AS consecutive_failures,
       CASE WHEN s.next_run_at < now() THEN now() - s.next_run_at END AS overdue_by,
       s.paused_at,
       s.paused_by,
       s.paused_reason,
       s.backoff_reason,
       -- columns are only ever appended: CREATE OR REPLACE VIEW keeps DBAs' dependent views
       s.max_attempts,
       s.retry_backoff,
       s.retry_backoff_max,
       s.timeout,
       s.misfire_grace,
       s.catchup,
       s.overlap,
       coalesce(open.runs, 0) AS open_runs,
       open.attempt AS current_attempt,
       open.next_retry_at,
       s.every,
       s.anchor,
       s.jitter,
       s.next_run_at + dispatch.jitter_offset(s.id, s.next_run_at, s.jitter) AS next_fire_at,
       s.run_at,
       s.starts_at,
       s.ends_at,
       s.max_runs,
       s.ended_at,
       s.ended_reason,
       s.pause_after_failures,
       s.traceparent
FROM dispatch.schedules s
LEFT JOIN LATERAL (
    -- the oldest open run; overlap buffer_one and allow may have more
    SELECT count(*) AS runs,
           (array_agg(r.status ORDER BY r.scheduled_for, r.id))[1] AS status,
           (array_agg(r.attempt ORDER BY r.scheduled_for, r.id))[1] AS attempt,
           min(r.not_before) FILTER (WHERE r.status = 'pending' AND r.not_before < 'infinity') AS next_retry_at
    FROM dispatch.runs r
    WHERE r.schedule_id = s.id AND r.status IN ('pending', 'running')
    HAVING count(*) > 0
) open ON true
LEFT JOIN LATERAL (
    SELECT count(*) AS n FROM dispatch.runs r
    WHERE r.schedule_id = s.id AND r.status IN ('error', 'lost')
      AND r.scheduled_for > coalesce((SELECT max(ok.scheduled_for) FROM dispatch.runs ok
                                      WHERE ok.schedule_id = s.id AND ok.status = 'ok'), '-infinity')
) fails ON true
WHERE s.deleted_at IS NULL;
COMMENT ON VIEW dispatch.schedule_status IS
    'One row per schedule that is not deleted: next and last run, the oldest open run''s status and attempts so far (current_run_status, current_attempt; open_runs counts them all), when a failed attempt is retried (next_retry_at), failures since the last ok run, how long it is overdue (next_run_at in the past: due, and late if more than a minute or so), who paused it and why, why it is backing off (its next slot cannot be computed), its run policies, its interval (every, anchor) when it has no cron_expression, its jitter, the instant its next slot fires at (next_fire_at: next_run_at plus the jitter offset), its bounds (run_at for a one-shot; starts_at, ends_at, max_runs), when and why it ended (ended_at, ended_reason: its last slot is past; live is then false), after how many failed runs in a row it pauses itself (pause_after_failures), and the traceparent its runs continue.';

CREATE OR REPLACE VIEW dispatch.recent_failures AS
SELECT r.finished_at,
       s.project_id,
       s.function_name,
       r.schedule_id,
       r.id AS run_id,
       r.scheduled_for,
       r.status,
       r.attempt,
       r.http_status,
       r.error,
       r.request_id
FROM dispatch.runs r
JOIN dispatch.schedules s ON s.id = r.schedule_id
WHERE r.status IN ('error', 'lost')
  AND r.finished_at > now() - interval '24 hours'
ORDER BY r.finished_at DESC;
COMMENT ON VIEW dispatch.recent_failures IS 'Runs that ended error or lost in the last 24 hours, newest first.';

CREATE OR REPLACE VIEW dispatch.listeners AS
SELECT a.pid,
       a.application_name,
       nullif(substr(a.application_name, length('pgdispatch ') + 1), '') AS worker,
       a.client_addr,
       a.backend_start,
       a.state,
       a.state_change,
       -- A listener's LISTEN session: its last statement was LISTEN (its probe repeats it). NULL
       -- when this role may not see the statement (state is NULL: another role's session,
       -- without pg_read_all_stats) or no one may (track_activities off): unknown, not false.
       CASE WHEN a.state <> 'disabled' THEN a.query LIKE 'LISTEN%' END AS listening
FROM pg_catalog.pg_stat_activity a
WHERE a.datname = current_database()
  AND a.application_name LIKE 'pgdispatch%';
COMMENT ON VIEW dispatch.listeners IS
    'Listener connections to this database, found by application_name ''pgdispatch <worker id>''; listening marks each one''s LISTEN session (its last statement was LISTEN), NULL when this role may not see the session''s statement (another role''s session, without pg_read_all_stats; or track_activities off).';
