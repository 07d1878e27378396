-- dispatch.claim_runs: pending -> running, the attempt incremented and returned as the fence.

-- Both functions' results end with kind (scheduled, manual, backfill), added last so that a
-- caller reading the columns by position is unaffected. A result type cannot be changed in
-- place: an install over the earlier shape drops them first (90_grants.sql grants them again);
-- a re-install finds kind there and drops nothing.
DO $$
DECLARE
    fn regprocedure;
BEGIN
    FOREACH fn IN ARRAY ARRAY[
        pg_catalog.to_regprocedure('dispatch.claim_runs(text, integer, interval, interval)'),
        pg_catalog.to_regprocedure('dispatch._start_runs(bigint[], text, interval, interval)')]
    LOOP
        IF fn IS NOT NULL AND pg_catalog.pg_get_function_result(fn) NOT LIKE '%kind text)' THEN
            EXECUTE pg_catalog.format('DROP FUNCTION %s', fn);
        END IF;
    END LOOP;
END
$$;

-- The claimed runs, which the caller's transaction holds, to running. Found by id through
-- runs_pkey whatever the statistics say: they lag behind this table, and an autovacuum that ran
-- while a tick's chunk of 64,000 runs was being inserted (not yet visible, so not counted) left
-- it at one row. A plan made then scanned all of runs_slot_key for the ids, 65 ms a claim, and a
-- stampede of 100,000 took 65 s instead of 15. Without plain index scans, the only way to the
-- ids is a bitmap scan of the primary key.
CREATE OR REPLACE FUNCTION dispatch._start_runs(ids bigint[], worker text, lease interval,
                                                default_timeout interval)
RETURNS TABLE (
    run_id        bigint,
    schedule_id   uuid,
    project_id    text,
    function_name text,
    args          jsonb,
    request_id    text,
    scheduled_for timestamptz,
    attempt       integer,
    lease_until   timestamptz,
    timeout       interval,
    fire_at       timestamptz,
    kind          text
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_indexscan = off
SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
    -- The lease covers the run's invocation timeout (the schedule's own, else the caller's)
    -- plus the margin the caller gave beyond its timeout.
    RETURN QUERY
    UPDATE dispatch.runs r
    SET status = 'running',
        worker = _start_runs.worker,
        claimed_at = now(),
        lease_until = now() + _start_runs.lease
                      + coalesce(s.timeout - coalesce(_start_runs.default_timeout, interval '0'), interval '0'),
        not_before = NULL,
        held_by_breaker = false,
        attempt = r.attempt + 1
    FROM dispatch.schedules s
    WHERE r.id = ANY (_start_runs.ids) AND s.id = r.schedule_id
    RETURNING r.id, r.schedule_id, s.project_id, s.function_name, s.args,
              r.request_id, r.scheduled_for, r.attempt, r.lease_until,
              coalesce(s.timeout, _start_runs.default_timeout), r.fire_at, r.kind;
END
$$;

CREATE OR REPLACE FUNCTION dispatch.claim_runs(
    worker          text,
    max_runs        integer,
    lease           interval DEFAULT interval '60 seconds',
    default_timeout interval DEFAULT NULL
)
RETURNS TABLE (
    run_id        bigint,
    schedule_id   uuid,
    project_id    text,
    function_name text,
    args          jsonb,
    request_id    text,
    scheduled_for timestamptz,
    attempt       integer,
    lease_until   timestamptz,
    timeout       interval,
    fire_at       timestamptz,
    kind          text
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
    late_ids bigint[];
    more_live bigint[];
    stale_ids bigint[];
    more_stale bigint[];
BEGIN
    -- A running run must hold a finite lease that outlasts its call: with none, no expiry ever
    -- selects it and its schedule is wedged; with one shorter than the call, the lease runs out
    -- while the function is still being called and the run is invoked a second time.
    IF claim_runs.worker IS NULL OR claim_runs.worker = '' THEN
        RAISE EXCEPTION 'worker must name the claimer, not %', coalesce(quote_literal(claim_runs.worker), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF claim_runs.max_runs IS NULL OR claim_runs.max_runs < 0 THEN
        RAISE EXCEPTION 'max_runs must be 0 or more, not %', coalesce(claim_runs.max_runs::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF claim_runs.default_timeout <= interval '0' OR claim_runs.default_timeout > interval '1 hour' THEN
        RAISE EXCEPTION 'default_timeout must be more than 0 and at most 1 hour, not %', claim_runs.default_timeout
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'NULL when the schedules'' own timeouts (or none) apply.';
    ELSIF claim_runs.lease IS NULL OR claim_runs.lease <= coalesce(claim_runs.default_timeout, interval '0')
          OR claim_runs.lease > interval '1 day' THEN
        RAISE EXCEPTION 'lease must be longer than default_timeout (%) and at most 1 day, not %',
                        coalesce(claim_runs.default_timeout::text, 'NULL'), coalesce(claim_runs.lease::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A lease that ends while the function is being called lets another claim invoke the run again: give the timeout plus a margin (the listener uses timeout + 30 s).';
    END IF;

    -- Two queues, each read oldest first: runs whose not_before is over (retries after their
    -- back-off, slots that waited for their jittered instant), then runs marked for their slot. A run another transaction holds is skipped, so concurrent claims never get the
    -- same run and never wait.
    --
    -- Some runs are not handed out. A retry that can no longer start before its schedule's
    -- next slot, or that max_attempts (lowered since) no longer allows, ends error (late_ids). A run whose schedule stopped, or whose first attempt
    -- cannot start within misfire_grace, ends skipped (stale_ids): the transaction that stopped
    -- a schedule ended every run it could see, this ends those that became pending behind its
    -- back (a release or a lease expiry racing it).
    SELECT array_agg(p.id) FILTER (WHERE p.state = 'live'), array_agg(p.id) FILTER (WHERE p.state = 'late'),
           array_agg(p.id) FILTER (WHERE p.state = 'stale')
    INTO live_ids, late_ids, stale_ids
    FROM (SELECT r.id,
                 CASE WHEN NOT (s.enabled AND s.deleted_at IS NULL AND s.paused_at IS NULL) THEN 'stale'
                      WHEN dispatch._missed(r, s) THEN 'stale'
                      -- a retry: max_attempts lowered during its back-off, or past the next slot
                      WHEN r.attempt > r.released AND r.attempt - r.released >= s.max_attempts THEN 'late'
                      WHEN r.kind = 'scheduled' AND r.attempt > r.released
                           AND now() >= dispatch._next_slot(s.cron_spec, r.scheduled_for, s.timezone) THEN 'late'
                      ELSE 'live' END AS state
          FROM dispatch.runs r
          JOIN dispatch.schedules s ON s.id = r.schedule_id
          WHERE r.status = 'pending' AND r.not_before <= now()
          ORDER BY r.not_before, r.id
          LIMIT claim_runs.max_runs
          FOR UPDATE OF r SKIP LOCKED) p;

    IF coalesce(cardinality(live_ids), 0) + coalesce(cardinality(late_ids), 0)
       + coalesce(cardinality(stale_ids), 0) < claim_runs.max_runs THEN
        SELECT array_agg(p.id) FILTER (WHERE p.live), array_agg(p.id) FILTER (WHERE NOT p.live)
        INTO more_live, more_stale
        FROM (SELECT r.id,
                     s.enabled AND s.deleted_at IS NULL AND s.paused_at IS NULL AND NOT dispatch._missed(r, s) AS live
              FROM dispatch.runs r
              JOIN dispatch.schedules s ON s.id = r.schedule_id
              WHERE r.status = 'pending' AND r.not_before IS NULL
              ORDER BY r.scheduled_for, r.id
              LIMIT claim_runs.max_runs - coalesce(cardinality(live_ids), 0) - coalesce(cardinality(late_ids), 0)
                    - coalesce(cardinality(stale_ids), 0)
              FOR UPDATE OF r SKIP LOCKED) p;
        live_ids := live_ids || more_live;
        stale_ids := stale_ids || more_stale;
    END IF;

    IF late_ids IS NOT NULL OR stale_ids IS NOT NULL THEN
        PERFORM dispatch._end_late_retries(late_ids);
        PERFORM dispatch._end_stale_runs(stale_ids, wait => false);
        -- fewer runs than asked for although more may be pending: have the claimers come back
        PERFORM pg_notify('dispatch', 'ended');
    END IF;
    -- runs of a function whose breaker is open wait, but for its probe (39_breakers.sql)
    live_ids := dispatch._hold_for_breakers(live_ids);
    IF live_ids IS NULL OR live_ids = '{}' THEN
        RETURN;
    END IF;

    RETURN QUERY SELECT * FROM dispatch._start_runs(live_ids, claim_runs.worker, claim_runs.lease,
                                                    claim_runs.default_timeout);
END
$$;
COMMENT ON FUNCTION dispatch.claim_runs(text, integer, interval, interval) IS
    'Move up to max_runs pending runs of live schedules to running for worker and return what is needed to invoke them (fire_at: the instant the run fires at, its slot plus the schedule''s jitter offset; kind: scheduled, manual or backfill, last so that callers reading by position are unaffected): runs whose not_before is over first (retries, slots that waited for their jittered instant), then runs in slot order (FOR UPDATE SKIP LOCKED: concurrent callers never get the same run, nothing waits). attempt is the fencing token to pass to complete_runs or release_runs: each claim of a run gets a higher one, a claim handed back included. timeout is the invocation timeout to apply: the schedule''s, else default_timeout (the caller''s). lease_until is now + lease, plus the schedule''s timeout minus default_timeout when the schedule has its own: lease must be longer than default_timeout (at most 1 day; 22023 otherwise): give default_timeout plus a margin. Runs that must not start end instead: a retry past the next slot or beyond max_attempts (error), a first attempt past misfire_grace, a run of a stopped schedule (skipped).';
