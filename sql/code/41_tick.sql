-- dispatch.tick: lease expiry, then every live schedule that is due.
--
-- Nothing here waits on another transaction (invariant 3): rows are locked with SKIP LOCKED, so
-- two ticks share the work instead of queueing behind each other, and a row that a user's open
-- transaction holds is left for a later tick. A run is only ever inserted for a schedule whose
-- row this transaction holds and that has no open run, so the unique indexes on runs never
-- make an insert wait on someone else's either.

CREATE OR REPLACE FUNCTION dispatch._expire_leases()
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock constant timestamptz := clock_timestamp();
    ids bigint[];
    requeued integer;
    ended dispatch.runs[];
BEGIN
    -- Leases expire by the database's real clock, whatever horizon tick() was given.
    SELECT array_agg(l.id) INTO ids
    FROM (SELECT r.id
          FROM dispatch.runs r
          JOIN dispatch.schedules s ON s.id = r.schedule_id
          WHERE r.status = 'running' AND r.lease_until < clock
          FOR UPDATE OF r SKIP LOCKED
          FOR NO KEY UPDATE OF s SKIP LOCKED) l;
    IF ids IS NULL THEN
        RETURN 0;
    END IF;

    -- Attempts left and the schedule live: retry under the same request id.
    UPDATE dispatch.runs r
    SET status = 'pending', worker = NULL, claimed_at = NULL, lease_until = NULL,
        error = left(format('lease of %s expired on attempt %s', r.worker, r.attempt), 500)
    FROM dispatch.schedules s
    WHERE r.id = ANY (ids) AND s.id = r.schedule_id
      AND r.attempt < s.max_attempts AND s.enabled AND s.deleted_at IS NULL AND s.paused_at IS NULL;
    GET DIAGNOSTICS requeued = ROW_COUNT;

    -- Otherwise lost: the attempt may have been invoked, so never skipped.
    WITH lost AS (
        UPDATE dispatch.runs r
        SET status = 'lost', finished_at = clock,
            error = left(CASE WHEN s.enabled AND s.deleted_at IS NULL AND s.paused_at IS NULL
                              THEN format('lease of %s expired on attempt %s of %s', r.worker, r.attempt, s.max_attempts)
                              ELSE format('lease of %s expired on attempt %s after the schedule was %s: it may have run',
                                          r.worker, r.attempt,
                                          CASE WHEN s.deleted_at IS NOT NULL THEN 'deleted'
                                               WHEN s.paused_at IS NOT NULL THEN 'paused'
                                               ELSE 'disabled' END)
                         END, 500)
        FROM dispatch.schedules s
        WHERE r.id = ANY (ids) AND s.id = r.schedule_id AND r.status = 'running'
        RETURNING r
    )
    SELECT array_agg(l.r) INTO ended FROM lost l;
    IF ended IS NOT NULL THEN
        PERFORM dispatch._finish_runs(ended);
    END IF;
    RETURN requeued;
END
$$;

CREATE OR REPLACE FUNCTION dispatch.tick(now timestamptz DEFAULT now())
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- What is due changes faster than statistics follow (right after a stampede they still say that
-- most schedules are due and most runs open), and with them the planner would scan both tables
-- whole and hash them: 84 ms after a round of 50,000 runs, for one due slot. The marking is an
-- index scan of the due schedules driving index probes of runs, whatever the estimates say.
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    horizon constant timestamptz := tick.now;
    requeued integer;
    marked integer;
    behind bigint[];
    backing_off uuid[];
    skipped dispatch.runs[];
BEGIN
    -- Marking ahead of the clock fires schedules early: for tests and backfills by an
    -- administrator, never for a listener (invariant 5).
    IF horizon > clock_timestamp()
       AND NOT pg_has_role(session_user, 'dispatch_admin', 'MEMBER')
       AND NOT pg_has_role(session_user, (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'dispatch'),
                           'MEMBER') THEN
        RAISE EXCEPTION 'dispatch.tick(%) marks ahead of the database''s clock, which only dispatch_admin may do', horizon
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Call dispatch.tick() without an argument: it marks what is due now.';
    END IF;

    requeued := dispatch._expire_leases();

    -- Due schedules with no open run, each locked or left to the tick that holds it. Its slot
    -- has no run yet (mark it), or has a finished one (the schedule is behind: a completion
    -- found it locked, or a write put it back), or it is a back-off instant (invariant 6).
    WITH due AS MATERIALIZED (
        SELECT s.id, s.next_run_at, s.backoff_reason, r.id AS slot_run
        FROM dispatch.schedules s
        LEFT JOIN dispatch.runs r ON r.schedule_id = s.id AND r.scheduled_for = s.next_run_at
        WHERE s.next_run_at <= horizon
          AND NOT EXISTS (SELECT 1 FROM dispatch.runs o
                          WHERE o.schedule_id = s.id AND o.status IN ('pending', 'running'))
        FOR NO KEY UPDATE OF s SKIP LOCKED
    ), new_runs AS (
        INSERT INTO dispatch.runs (schedule_id, scheduled_for)
        SELECT d.id, d.next_run_at FROM due d
        WHERE d.slot_run IS NULL AND d.backoff_reason IS NULL
        ON CONFLICT DO NOTHING  -- cannot happen given the above; never an error if it did
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM new_runs),
           array_agg(d.slot_run) FILTER (WHERE d.slot_run IS NOT NULL),
           array_agg(d.id) FILTER (WHERE d.slot_run IS NULL AND d.backoff_reason IS NOT NULL)
    INTO marked, behind, backing_off
    FROM due d;

    IF behind IS NOT NULL THEN
        PERFORM dispatch._settle_runs(ARRAY(SELECT r FROM dispatch.runs r WHERE r.id = ANY (behind)));
    END IF;
    IF backing_off IS NOT NULL THEN
        WITH k AS (
            INSERT INTO dispatch.runs AS r (schedule_id, scheduled_for, status, finished_at, error)
            SELECT s.id, s.next_run_at, 'skipped', now(), left(s.backoff_reason, 500)
            FROM dispatch.schedules s
            WHERE s.id = ANY (backing_off)
            RETURNING r
        )
        SELECT array_agg(k.r) INTO skipped FROM k;
        PERFORM dispatch._finish_runs(skipped);
    END IF;

    IF marked + requeued > 0 THEN
        PERFORM pg_notify('dispatch', json_build_object('marked', marked, 'requeued', requeued)::text);
    END IF;
    IF behind IS NOT NULL OR backing_off IS NOT NULL THEN
        PERFORM pg_notify('dispatch', 'schedules');  -- next_run_at moved: listeners re-plan
    END IF;
    RETURN marked;
END
$$;
COMMENT ON FUNCTION dispatch.tick(timestamptz) IS
    'Expire leases by the real clock, then mark every live schedule due at or before "now" as a pending run (idempotent per slot), move schedules still on a finished slot past it, record a skipped run for each back-off instant reached, and NOTIFY dispatch when there is work. Returns how many runs it marked. Never waits on a row another transaction holds. A "now" ahead of the clock needs dispatch_admin. Run every minute by the pg_cron job dispatch-tick and by listeners when a slot comes due.';
