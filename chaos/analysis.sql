-- The chaos suite's verdict, computed in the chaos database once the run has drained.
-- Inputs: dispatch.* (what the dispatcher recorded), chaos.requests (what the sink saw, loaded
-- from its record file), chaos.claims (every claim, written by a trigger on dispatch.runs),
-- chaos.faults (what the harness injected, when), chaos.params (base slot, last slot, lease).
-- Output: one row per figure (name, value).

CREATE TEMP TABLE final_request AS
-- The request that answered a run's last attempt: the outcome recorded must match it.
SELECT DISTINCT ON (r.id) r.id AS rid, q.key, q.worker, q.decision, q.arrived, q.answered,
       EXISTS (SELECT 1 FROM chaos.faults k
               WHERE k.kind = 'sink_down' AND q.arrived BETWEEN k.at - 6 AND k.at + 1) AS sink_killed
FROM dispatch.runs r
JOIN chaos.requests q ON q.request_id = r.request_id AND q.attempt = r.attempt
ORDER BY r.id, q.arrived DESC;
CREATE UNIQUE INDEX ON final_request (rid);
CREATE INDEX ON final_request (key);
ANALYZE final_request;

CREATE TEMP TABLE invoked_request_ids AS SELECT DISTINCT request_id FROM chaos.requests;
CREATE UNIQUE INDEX ON invoked_request_ids (request_id);
ANALYZE invoked_request_ids;

CREATE TEMP TABLE verdict AS
SELECT r.id, r.status, r.error, r.http_status, f.decision, f.answered,
       i.request_id IS NOT NULL AS invoked,
       CASE
           WHEN r.status IN ('pending', 'running') THEN 'unfinished'
           -- every attempt used: failures the sink made on purpose and lost leases (kills)
           WHEN r.status = 'lost'
                AND r.attempt - r.released >= (SELECT s.max_attempts FROM dispatch.schedules s WHERE s.id = r.schedule_id)
           THEN 'exhausted'
           WHEN r.status IN ('skipped', 'lost') THEN r.status
           -- no request reached the sink on the last attempt: only a connection error is right
           WHEN f.rid IS NULL THEN
               CASE WHEN r.status = 'error' AND r.error LIKE 'connection %' THEN 'sink_unreachable'
                    ELSE 'no_invocation' END
           -- a hang is never answered in time: the listener gave up and closed the connection
           WHEN f.decision = 'hang' THEN
               CASE WHEN r.status = 'error' AND r.error LIKE 'timeout:%' THEN 'agrees' ELSE 'disagrees' END
           WHEN f.answered IS NULL OR f.decision = 'reset' THEN
               -- the sink was killed mid-answer, or reset the connection on purpose: a connection
               -- error; or, when the sink was killed right after sending its answer but before
               -- recording that it had, the answer it chose
               CASE WHEN r.status = 'error' AND r.http_status IS NULL AND r.error LIKE 'connection %'
                    THEN 'agrees'
                    WHEN f.decision <> 'reset' AND f.sink_killed
                         AND ((f.decision IN ('ok', 'slow') AND r.status = 'ok' AND r.http_status = 200)
                              OR (f.decision = 'fail' AND r.status = 'error' AND r.http_status = 500))
                    THEN 'agrees'
                    ELSE 'disagrees' END
           WHEN f.decision IN ('ok', 'slow') THEN
               CASE WHEN r.status = 'ok' AND r.http_status = 200 THEN 'agrees' ELSE 'disagrees' END
           WHEN f.decision = 'fail' THEN
               CASE WHEN r.status = 'error' AND r.http_status = 500
                         AND r.error = 'chaos_failure: the sink failed on purpose'
                    THEN 'agrees' ELSE 'disagrees' END
           ELSE 'disagrees'
       END AS fate
FROM dispatch.runs r
LEFT JOIN final_request f ON f.rid = r.id
LEFT JOIN invoked_request_ids i ON i.request_id = r.request_id;

CREATE TEMP TABLE extra_request AS
-- Every request of a run other than the one that answered its recorded attempt.
SELECT q.*, r.id AS rid
FROM chaos.requests q
JOIN dispatch.runs r ON r.request_id = q.request_id
LEFT JOIN final_request f ON f.key = q.key
WHERE f.key IS NULL;

CREATE TEMP TABLE retried_request AS
-- An earlier attempt recorded as a failure and retried (complete_runs kept it in the run's
-- earlier_attempts): its request is explained, and the error recorded must be what the sink did.
SELECT e.key, e.rid,
       CASE WHEN e.decision = 'fail' THEN (a->>'httpStatus') = '500'
            WHEN e.decision = 'hang' THEN a->>'error' LIKE 'timeout:%'
            -- a slow answer (at most 0.6 s) to a request that reached the sink late (a loaded
            -- machine): the listener's timeout, counted from its start (no earlier than the
            -- claim), may come first; never for one that arrived in time for its answer
            WHEN e.decision = 'slow' AND e.answered IS NULL AND a->>'error' LIKE 'timeout:%'
            THEN e.arrived + 0.6 > extract(epoch FROM (a->>'claimedAt')::timestamptz)
                                   + (a->>'durationMs')::float8 / 1000
            ELSE a->>'error' LIKE 'connection %'  -- a reset, or the sink killed mid-answer
       END AS agrees
FROM extra_request e
JOIN dispatch.runs r ON r.id = e.rid
CROSS JOIN LATERAL jsonb_array_elements(r.earlier_attempts) a
WHERE (a->>'attempt')::int = e.attempt AND a->>'status' = 'error';

CREATE TEMP TABLE unexplained_extra AS
-- An earlier invocation whose outcome was not recorded must have met a fault that can stop a
-- record: its listener killed, its sessions terminated, or a database restart, between its claim
-- (at most a lease before it arrived) and its lease's end (at most a lease after).
SELECT e.*
FROM extra_request e, chaos.params p
WHERE NOT EXISTS (SELECT 1 FROM retried_request rr WHERE rr.key = e.key)
  AND NOT EXISTS (
    SELECT 1 FROM chaos.faults f
    WHERE (f.kind LIKE 'restart%' OR (f.kind IN ('kill', 'terminate') AND f.target = e.worker))
      AND f.at <= e.arrived + p.lease_s + 1
      AND coalesce(f.until, f.at) >= e.arrived - p.lease_s - 1
);

CREATE TEMP TABLE open_period AS
-- Each time a function's circuit breaker was open: from its breaker.open to the next
-- breaker.close (Unix seconds, like the sink's times).
SELECT o.project_id, o.metadata ->> 'functionName' AS function_name, extract(epoch FROM o.at)::float8 AS opened,
       coalesce((SELECT extract(epoch FROM min(c.at))::float8 FROM dispatch.audit_log c
                 WHERE c.action = 'breaker.close' AND c.project_id = o.project_id
                   AND c.metadata ->> 'functionName' = o.metadata ->> 'functionName' AND c.id > o.id),
                'infinity') AS closed
FROM dispatch.audit_log o
WHERE o.action = 'breaker.open';

CREATE TEMP TABLE open_request AS
-- The requests that reached a function while its breaker was open (but the first 0.2 s, when
-- what was claimed before the opening committed may still arrive): its probes. Each is out until it was
-- answered, or the listener's timeout (2 s) gave up on it.
SELECT q.key, q.arrived, least(coalesce(q.answered, q.arrived + 2), q.arrived + 2) AS done, o.project_id,
       o.function_name, o.opened
FROM chaos.requests q
JOIN dispatch.schedules s ON s.id = q.schedule_id
JOIN open_period o ON o.project_id = s.project_id AND o.function_name = s.function_name
                  AND q.arrived > o.opened + 0.2 AND q.arrived < o.closed;

SELECT 'schedules' AS figure, count(*)::text AS value FROM dispatch.schedules
UNION ALL
SELECT 'slots expected', (SELECT count(*) FROM dispatch.schedules) * (p.minutes + 1) || '' FROM chaos.params p
UNION ALL
SELECT 'slots marked', count(*)::text FROM dispatch.runs
UNION ALL
SELECT 'slots missing or extra (gaps in a schedule''s minutes)', count(*)::text
FROM (
    SELECT s.id
    FROM dispatch.schedules s
    CROSS JOIN chaos.params p
    LEFT JOIN dispatch.runs r ON r.schedule_id = s.id
    GROUP BY s.id, p.minutes, p.base, p.last_slot
    HAVING count(r.id) <> p.minutes + 1 OR min(r.scheduled_for) <> p.base OR max(r.scheduled_for) <> p.last_slot
) x
UNION ALL
SELECT 'slots invoked', count(*) FILTER (WHERE invoked)::text FROM verdict
UNION ALL
SELECT 'requests received by the sink', count(*)::text FROM chaos.requests
UNION ALL
SELECT 'runs ok / error', count(*) FILTER (WHERE status = 'ok') || ' / ' || count(*) FILTER (WHERE status = 'error')
FROM dispatch.runs
UNION ALL
SELECT 'runs that found the sink unreachable (connection error, no request)',
       count(*) FILTER (WHERE fate = 'sink_unreachable')::text FROM verdict
UNION ALL
SELECT 'slots lost (unfinished, or finished with no invocation)',
       count(*) FILTER (WHERE fate IN ('unfinished', 'no_invocation'))::text FROM verdict
UNION ALL
SELECT 'runs given up with attempts left, or skipped',
       count(*) FILTER (WHERE fate IN ('lost', 'skipped'))::text FROM verdict
UNION ALL
SELECT 'runs that used every attempt (failed or lost each time): lost',
       count(*) FILTER (WHERE fate = 'exhausted')::text FROM verdict
UNION ALL
SELECT 'runs whose status disagrees with the sink', count(*) FILTER (WHERE fate = 'disagrees')::text FROM verdict
UNION ALL
SELECT 'slots invoked more than once',
       count(*)::text FROM (SELECT request_id FROM chaos.requests GROUP BY request_id HAVING count(*) > 1) d
UNION ALL
SELECT 'extra invocations (beyond the recorded one)', count(*)::text FROM extra_request
UNION ALL
SELECT 'extra invocations with no kill, terminate or restart to explain them', count(*)::text FROM unexplained_extra
UNION ALL
SELECT 'attempts that failed and were retried', count(*)::text FROM retried_request
UNION ALL
SELECT 'retried attempts whose recorded error disagrees with the sink', count(*)::text
FROM retried_request WHERE NOT agrees
UNION ALL
SELECT 'same attempt invoked twice', count(*)::text
FROM (SELECT 1 FROM chaos.requests GROUP BY request_id, attempt HAVING count(*) > 1) d
UNION ALL
SELECT 'slots invoked under more than one request id', count(*)::text
FROM (SELECT 1 FROM chaos.requests GROUP BY schedule_id, slot HAVING count(DISTINCT request_id) > 1) d
UNION ALL
SELECT 'requests whose request id, slot or schedule is not their run''s', count(*)::text
FROM chaos.requests q
LEFT JOIN dispatch.runs r ON r.request_id = q.request_id AND r.schedule_id = q.schedule_id
                          AND r.scheduled_for = q.slot AND r.id = q.run_id
WHERE r.id IS NULL
UNION ALL
SELECT 'finished runs', count(*)::text FROM dispatch.runs WHERE status NOT IN ('pending', 'running')
UNION ALL
SELECT 'run audit rows', count(*)::text FROM dispatch.audit_log WHERE action LIKE 'schedule.run.%'
UNION ALL
SELECT 'finished runs without exactly one matching audit row', count(*)::text
FROM dispatch.runs r
LEFT JOIN (
    SELECT (metadata ->> 'runId')::bigint AS run_id, action, metadata ->> 'requestId' AS request_id, count(*) AS n
    FROM dispatch.audit_log
    WHERE action LIKE 'schedule.run.%'
    GROUP BY 1, 2, 3
) a ON a.run_id = r.id AND a.action = 'schedule.run.' || r.status AND a.request_id = r.request_id
WHERE r.status NOT IN ('pending', 'running') AND coalesce(a.n, 0) <> 1
UNION ALL
SELECT 'schedules left stuck (next_run_at not one minute past the last slot, or a run open)', count(*)::text
FROM dispatch.schedules s
CROSS JOIN chaos.params p
LEFT JOIN (SELECT DISTINCT schedule_id FROM dispatch.runs WHERE status IN ('pending', 'running')) o
       ON o.schedule_id = s.id
WHERE s.next_run_at IS DISTINCT FROM p.last_slot + interval '1 minute' OR o.schedule_id IS NOT NULL
UNION ALL
SELECT 'breakers opened / closed', count(*) FILTER (WHERE action = 'breaker.open') || ' / '
       || count(*) FILTER (WHERE action = 'breaker.close')
FROM dispatch.audit_log WHERE action IN ('breaker.open', 'breaker.close')
UNION ALL
SELECT 'breakers left open', count(*)::text FROM dispatch.breakers WHERE state = 'open'
UNION ALL
SELECT 'requests to a function while its breaker was open (probes)', count(*)::text FROM open_request
UNION ALL
SELECT 'probes sent while another probe of the same breaker was out', count(*)::text
FROM open_request a
WHERE EXISTS (SELECT 1 FROM open_request b
              WHERE b.project_id = a.project_id AND b.function_name = a.function_name AND b.opened = a.opened
                AND b.key <> a.key AND b.arrived <= a.arrived AND b.done > a.arrived)
UNION ALL
SELECT 'samples with a project above its max_concurrency', count(*)::text FROM chaos.cap_excess
UNION ALL
SELECT 'claims', count(*)::text FROM chaos.claims;
