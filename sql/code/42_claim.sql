-- dispatch.claim_runs: pending -> running, the attempt incremented and returned as the fence.

CREATE OR REPLACE FUNCTION dispatch.claim_runs(worker text, max_runs integer, lease interval DEFAULT interval '60 seconds')
RETURNS TABLE (
    run_id        bigint,
    schedule_id   uuid,
    project_id    text,
    function_name text,
    args          jsonb,
    request_id    text,
    scheduled_for timestamptz,
    attempt       integer,
    lease_until   timestamptz
)
-- PL/pgSQL rather than SQL: PostgreSQL plans a (non-inlined) SQL function on every call, and
-- planning these statements costs more than running them.
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    live_ids bigint[];
    stale_ids bigint[];
BEGIN
    -- Oldest slot first; a run another transaction holds is skipped, so concurrent claims never
    -- get the same run and never wait. A run whose schedule stopped is not handed out: the
    -- transaction that stopped it ended every run it could see, and this ends the ones that
    -- became pending behind its back (a release or a lease expiry racing it).
    SELECT array_agg(p.id) FILTER (WHERE p.live), array_agg(p.id) FILTER (WHERE NOT p.live)
    INTO live_ids, stale_ids
    FROM (SELECT r.id, s.enabled AND s.deleted_at IS NULL AND s.paused_at IS NULL AS live
          FROM dispatch.runs r
          JOIN dispatch.schedules s ON s.id = r.schedule_id
          WHERE r.status = 'pending'
          ORDER BY r.scheduled_for, r.id
          LIMIT claim_runs.max_runs
          FOR UPDATE OF r SKIP LOCKED) p;
    IF stale_ids IS NOT NULL THEN
        PERFORM dispatch._end_stale_runs(stale_ids, wait => false);
        -- fewer runs than asked for although more may be pending: have the claimers come back
        PERFORM pg_notify('dispatch', 'ended');
    END IF;
    IF live_ids IS NULL THEN
        RETURN;
    END IF;

    RETURN QUERY
    UPDATE dispatch.runs r
    SET status = 'running',
        worker = claim_runs.worker,
        claimed_at = now(),
        lease_until = now() + claim_runs.lease,
        attempt = r.attempt + 1
    FROM dispatch.schedules s
    WHERE r.id = ANY (live_ids) AND s.id = r.schedule_id
    RETURNING r.id, r.schedule_id, s.project_id, s.function_name, s.args,
              r.request_id, r.scheduled_for, r.attempt, r.lease_until;
END
$$;
COMMENT ON FUNCTION dispatch.claim_runs(text, integer, interval) IS
    'Move up to max_runs pending runs of live schedules, oldest slot first, to running for worker with a lease (FOR UPDATE SKIP LOCKED: concurrent callers never get the same run, nothing waits) and return what is needed to invoke them. attempt is the fencing token to pass to complete_runs or release_runs. The lease must outlast the invocation timeout.';
