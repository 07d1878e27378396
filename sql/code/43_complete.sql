-- dispatch.complete_runs / dispatch.complete_run: running -> ok | error, or back to pending
-- for a retry; fenced by attempt.

-- The back-off before attempt + 1: exponential from retry_backoff (x2 per attempt) with full
-- jitter, so that the retries of many runs that failed together spread out; a Retry-After the
-- function sent is taken as it is. Both capped by retry_backoff_max.
CREATE OR REPLACE FUNCTION dispatch._retry_delay(s dispatch.schedules, attempt integer, retry_after_ms integer)
RETURNS interval
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT least(CASE WHEN retry_after_ms IS NOT NULL THEN make_interval(secs => greatest(retry_after_ms, 0) / 1000.0)
                      ELSE random() * least(s.retry_backoff * power(2, least(attempt - 1, 30)), s.retry_backoff_max)
                 END,
                 s.retry_backoff_max)
$$;

-- Retries that will not start before their schedule's next slot, claimed too late, or that
-- max_attempts no longer allows (lowered since the last attempt): they end error, or lost when
-- the last attempt's lease expired (a retry never overtakes the next slot, nor the limit an
-- administrator set). Their schedules are locked without waiting.
CREATE OR REPLACE FUNCTION dispatch._end_late_retries(run_ids bigint[])
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ended dispatch.runs[];
BEGIN
    IF run_ids IS NULL THEN
        RETURN 0;
    END IF;
    -- (the claim that calls it holds these runs: each is where this statement's snapshot sees it)
    WITH taken AS (
        SELECT r.ctid AS tid FROM dispatch.runs r JOIN dispatch.schedules s ON s.id = r.schedule_id
        WHERE r.id = ANY (_end_late_retries.run_ids) AND r.status = 'pending'
        FOR UPDATE OF r SKIP LOCKED
        FOR NO KEY UPDATE OF s SKIP LOCKED
    ), late AS (
        UPDATE dispatch.runs r
        -- lost when the last attempt's lease expired: that attempt may have run
        SET status = CASE WHEN r.earlier_attempts -> -1 ->> 'status' = 'lost' THEN 'lost' ELSE 'error' END,
            finished_at = now(), not_before = NULL,
            error = left(coalesce(r.error, 'failed') || CASE
                WHEN r.attempt - r.released >= s.max_attempts
                THEN format('; not retried: max_attempts is now %s', s.max_attempts)
                ELSE '; not retried: the next slot came first' END, 500)
        FROM taken t, dispatch.schedules s WHERE r.ctid = t.tid AND s.id = r.schedule_id
        RETURNING r
    )
    SELECT array_agg(l.r) INTO ended FROM late l;
    PERFORM dispatch._finish_runs(ended);
    RETURN coalesce(cardinality(ended), 0);
END
$$;

-- The fence and the locks of complete_runs: the runs of `run_ids` still running with the attempt
-- given, each with its schedule, locked without waiting (invariant 3), and where they lie (ctid:
-- complete_runs updates them there). Whatever the statistics say, a bitmap scan of the primary
-- key (plain index and sequential scans off); not of the running runs' index (`status || ''`),
-- where a bitmap scan reads the entry of every run finished since the last vacuum. Attempts are
-- matched by position: a join on id lets a plan scan an index of runs whole. PL/pgSQL for its
-- plan cache. (An install over the earlier shape, ids only, drops it first.)
DO $$
DECLARE
    fn regprocedure := pg_catalog.to_regprocedure('dispatch._take_running(bigint[], integer[])');
BEGIN
    IF fn IS NOT NULL AND pg_catalog.pg_get_function_result(fn) = 'bigint[]' THEN
        EXECUTE pg_catalog.format('DROP FUNCTION %s', fn);
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION dispatch._take_running(run_ids bigint[], attempts integer[],
                                                  OUT ids bigint[], OUT tids tid[])
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- its generic plan (see dispatch._advance_schedules)
SET plan_cache_mode = force_generic_plan
SET enable_indexscan = off
SET enable_seqscan = off
AS $$
BEGIN
    SELECT array_agg(l.id), array_agg(l.ctid) INTO _take_running.ids, _take_running.tids
    FROM (SELECT x.id, x.ctid
          FROM dispatch.runs x
          JOIN dispatch.schedules s ON s.id = x.schedule_id
          WHERE x.id = ANY (_take_running.run_ids) AND x.status || '' = 'running'
            AND x.attempt = _take_running.attempts[array_position(_take_running.run_ids, x.id)]
          FOR UPDATE OF x SKIP LOCKED
          FOR NO KEY UPDATE OF s SKIP LOCKED) l;
END
$$;

-- A listener records a batch of outcomes in one round trip and one transaction.
CREATE OR REPLACE FUNCTION dispatch.complete_runs(
    worker        text,
    run_ids       bigint[],
    attempts      integer[],
    statuses      text[],
    errors        text[],
    http_statuses integer[],
    durations_ms  integer[],
    retryable     boolean[] DEFAULT NULL,
    retry_after_ms integer[] DEFAULT NULL
)
RETURNS TABLE (run_id bigint, recorded boolean, advanced boolean, busy boolean, retry_at timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- its generic plans (see dispatch._advance_schedules)
SET plan_cache_mode = force_generic_plan
-- The runs are reached where the fence found them (ctid), never by a scan of runs, whatever the
-- statistics say (a fresh install's runs has none before its first autovacuum);
SET enable_seqscan = off
-- a disabled path's cost would otherwise have the plan JIT-compiled.
SET jit = off
AS $$
DECLARE
    clock constant timestamptz := clock_timestamp();
    -- what a busy run's lease is renewed to: beyond the longest back-off of a listener's busy
    -- retries (2 s), and short, for a caller that stops coming back
    busy_lease constant interval := interval '5 seconds';
    taken bigint[];
    taken_at tid[];
    counted bigint[];
    held bigint[];
    retried_ids bigint[];
    retried_at timestamptz[];
    too_late bigint[];
    stopped_ids bigint[];
    stopped_why text[];
    finished dispatch.runs[];
BEGIN
    IF cardinality(complete_runs.attempts) IS DISTINCT FROM cardinality(complete_runs.run_ids)
       OR cardinality(complete_runs.statuses) IS DISTINCT FROM cardinality(complete_runs.run_ids) THEN
        RAISE EXCEPTION 'run_ids, attempts and statuses must have one element per run'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(complete_runs.statuses) s WHERE s IS NULL OR s NOT IN ('ok', 'error')) THEN
        RAISE EXCEPTION 'statuses must hold ok or error for each run id' USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The fence: a run is recorded only while it is running with the attempt the caller was
    -- given, whatever worker names it; a late outcome from an expired lease never lands on its
    -- successor. Its row and its schedule's are taken without waiting (invariant 3).
    SELECT t.ids, t.tids INTO taken, taken_at FROM dispatch._take_running(complete_runs.run_ids, complete_runs.attempts) t;
    -- the breakers of their functions count the failures, close on an answer (39_breakers.sql),
    -- without waiting either: a run whose breaker another transaction holds is left out, busy
    counted := dispatch._breaker_outcomes(taken, complete_runs.run_ids, complete_runs.statuses,
                                          complete_runs.retryable, complete_runs.errors);
    IF cardinality(counted) IS DISTINCT FROM cardinality(taken) THEN
        SELECT array_agg(t.id), array_agg(t.at) INTO taken, taken_at
        FROM unnest(taken, taken_at) AS t(id, at) WHERE t.id = ANY (counted);
    END IF;

    IF coalesce(cardinality(taken), 0) < cardinality(complete_runs.run_ids) THEN
        -- Still the caller's but held by another transaction (a tick looking at the schedule's
        -- next slot, a user's open one, a tick expiring the lease): busy, try again. Anything
        -- else is fenced out.
        SELECT array_agg(x.id) INTO held
        FROM dispatch.runs x
        WHERE x.id = ANY (complete_runs.run_ids) AND x.id <> ALL (coalesce(taken, '{}'))
          AND x.status || '' = 'running'  -- by the primary key, as dispatch._take_running
          AND x.attempt = complete_runs.attempts[array_position(complete_runs.run_ids, x.id)];
        -- The outcome is in the caller's hands and it is coming back with it, so the lease of a
        -- busy run whose own row is free lasts at least busy_lease more. Ticks that hold the
        -- schedule one after another would otherwise let it end between two of them, and the
        -- function would be called again for a slot it answered. (A held row needs nothing: the
        -- sweep skips it too.)
        IF held IS NOT NULL THEN
            UPDATE dispatch.runs x
            SET lease_until = clock + busy_lease
            FROM (SELECT y.ctid AS tid FROM dispatch.runs y
                  WHERE y.id = ANY (held) AND y.lease_until < clock + busy_lease
                  FOR UPDATE SKIP LOCKED) l
            WHERE x.ctid = l.tid;
        END IF;
    END IF;

    -- Retryable failures with attempts left go back to pending until their back-off is over,
    -- unless the retry would start only after the schedule's next slot, or the schedule stopped
    -- while the attempt was out (a stopped schedule invokes nothing more; the outcome is final,
    -- as it is for a retry that was waiting when the stop committed).
    IF true = ANY (complete_runs.retryable) THEN
        WITH candidate AS (
            SELECT x.id, t.at AS tid, x.attempt, i.error, i.http_status, i.duration_ms,
                   clock + dispatch._retry_delay(s, x.attempt - x.released, i.retry_after_ms) AS at,
                   -- a backfill slot is old by definition: only a scheduled run's retry races
                   -- the next slot
                   CASE WHEN x.kind = 'scheduled'
                        THEN dispatch._next_slot(s.cron_spec, x.scheduled_for, s.timezone) END AS next_slot,
                   dispatch._stopped_as(s) AS stopped
            FROM unnest(taken, taken_at) AS t(id, at)
            JOIN unnest(complete_runs.run_ids, complete_runs.statuses, complete_runs.errors,
                        complete_runs.http_statuses, complete_runs.durations_ms, complete_runs.retryable,
                        complete_runs.retry_after_ms)
                 AS i(id, status, error, http_status, duration_ms, retryable, retry_after_ms) ON i.id = t.id
            JOIN dispatch.runs x ON x.ctid = t.at
            JOIN dispatch.schedules s ON s.id = x.schedule_id
            WHERE i.status = 'error' AND i.retryable AND x.attempt - x.released < s.max_attempts
        ), retried AS (
            UPDATE dispatch.runs x
            SET status = 'pending', worker = NULL, claimed_at = NULL, lease_until = NULL, not_before = c.at,
                error = left(c.error, 500), http_status = c.http_status, duration_ms = c.duration_ms,
                earlier_attempts = coalesce(x.earlier_attempts, '[]') || jsonb_build_object(
                    'attempt', c.attempt, 'status', 'error', 'error', left(c.error, 500),
                    'httpStatus', c.http_status, 'durationMs', c.duration_ms, 'claimedAt', x.claimed_at,
                    'at', clock)
            FROM candidate c
            WHERE x.ctid = c.tid AND (c.next_slot IS NULL OR c.at < c.next_slot) AND c.stopped IS NULL
            RETURNING x.id, x.not_before
        )
        SELECT array_agg(r.id), array_agg(r.not_before),
               (SELECT array_agg(c.id) FROM candidate c WHERE c.at >= c.next_slot AND c.stopped IS NULL),
               (SELECT array_agg(c.id ORDER BY c.id) FROM candidate c WHERE c.stopped IS NOT NULL),
               (SELECT array_agg(c.stopped ORDER BY c.id) FROM candidate c WHERE c.stopped IS NOT NULL)
        INTO retried_ids, retried_at, too_late, stopped_ids, stopped_why FROM retried r;
        IF retried_ids IS NOT NULL THEN
            PERFORM pg_notify('dispatch', 'schedules');  -- listeners' clocks wake for the retry
        END IF;
    END IF;

    WITH done AS (
        UPDATE dispatch.runs x
        SET status = i.status,
            finished_at = now(),
            error = left(CASE WHEN x.id = ANY (too_late) THEN i.error || '; not retried: the next slot comes first'
                              WHEN x.id = ANY (stopped_ids)
                              THEN format('%s; not retried: schedule %s', i.error,
                                          stopped_why[array_position(stopped_ids, x.id)])
                              ELSE i.error END, 500),
            http_status = i.http_status,
            duration_ms = i.duration_ms
        FROM (SELECT t.at, o.status, o.error, o.http_status, o.duration_ms
              FROM unnest(taken, taken_at) AS t(id, at)
              JOIN unnest(complete_runs.run_ids, complete_runs.statuses, complete_runs.errors,
                          complete_runs.http_statuses, complete_runs.durations_ms)
                   AS o(id, status, error, http_status, duration_ms) ON o.id = t.id
              WHERE t.id <> ALL (coalesce(retried_ids, '{}'))) i
        -- where the fence found them (a retried run has moved on from there)
        WHERE x.ctid = i.at
        RETURNING x
    )
    SELECT array_agg(d.x) INTO finished FROM done d;

    RETURN QUERY
    SELECT i.id, f.run_id IS NOT NULL OR r.id IS NOT NULL, coalesce(f.advanced, false),
           coalesce(i.id = ANY (held), false), r.at
    FROM unnest(complete_runs.run_ids) WITH ORDINALITY AS i(id, n)
    LEFT JOIN dispatch._finish_runs(coalesce(finished, '{}')) f ON f.run_id = i.id
    LEFT JOIN unnest(retried_ids, retried_at) AS r(id, at) ON r.id = i.id
    ORDER BY i.n;
END
$$;
COMMENT ON FUNCTION dispatch.complete_runs(text, bigint[], integer[], text[], text[], integer[], integer[], boolean[], integer[]) IS
    'Record the outcomes (ok or error; errors cut to 500 characters) of runs still running with the attempt given (the fence claim_runs returned; worker is informational), advance each schedule still on its run''s slot, and write one audit row per run (with every attempt in its metadata), in one transaction. An error marked retryable, with attempts left (max_attempts), goes back to pending until its back-off is over (retry_backoff doubled per attempt, full jitter, or retry_after_ms; capped by retry_backoff_max), unless that is after the schedule''s next slot. The arrays are parallel (errors, http_statuses, durations_ms, retryable and retry_after_ms may hold NULLs or be NULL). Returns, for each input run: recorded; advanced (its schedule moved on); busy (not recorded because another transaction holds the run or its schedule: call again, within 5 s: a busy run whose own row is free has its lease renewed to at least 5 s from now); retry_at (when it will be retried). Never waits on a row another transaction holds.';

CREATE OR REPLACE PROCEDURE dispatch.complete_run(
    run_id         bigint,
    worker         text,
    attempt        integer,
    status         text,
    error          text DEFAULT NULL,
    http_status    integer DEFAULT NULL,
    duration_ms    integer DEFAULT NULL,
    retryable      boolean DEFAULT false,
    retry_after_ms integer DEFAULT NULL,
    INOUT recorded boolean DEFAULT NULL,
    INOUT advanced boolean DEFAULT NULL,
    INOUT busy     boolean DEFAULT NULL,
    INOUT retry_at timestamptz DEFAULT NULL
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF complete_run.status IS NULL OR complete_run.status NOT IN ('ok', 'error') THEN
        RAISE EXCEPTION 'status must be ok or error, not %', coalesce(quote_literal(complete_run.status), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- One implementation of the transition: complete_runs, with a batch of one.
    SELECT c.recorded, c.advanced, c.busy, c.retry_at
    INTO complete_run.recorded, complete_run.advanced, complete_run.busy, complete_run.retry_at
    FROM dispatch.complete_runs(complete_run.worker, ARRAY[complete_run.run_id], ARRAY[complete_run.attempt],
                                ARRAY[complete_run.status], ARRAY[complete_run.error],
                                ARRAY[complete_run.http_status], ARRAY[complete_run.duration_ms],
                                ARRAY[complete_run.retryable], ARRAY[complete_run.retry_after_ms]) c;
END
$$;
COMMENT ON PROCEDURE dispatch.complete_run(bigint, text, integer, text, text, integer, integer, boolean, integer, boolean, boolean, boolean, timestamptz) IS
    'dispatch.complete_runs for one run: record the outcome of a run still running with this attempt (or, retryable with attempts left, schedule its retry), advance its schedule, write the audit row, in one transaction. Returns recorded, advanced, busy (another transaction holds the run or its schedule: call again) and retry_at.';
