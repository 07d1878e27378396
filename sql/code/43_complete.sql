-- dispatch.complete_runs / dispatch.complete_run: running -> ok | error, fenced by attempt.

-- A listener records a batch of outcomes in one round trip and one transaction.
CREATE OR REPLACE FUNCTION dispatch.complete_runs(
    worker        text,
    run_ids       bigint[],
    attempts      integer[],
    statuses      text[],
    errors        text[],
    http_statuses integer[],
    durations_ms  integer[]
)
RETURNS TABLE (run_id bigint, recorded boolean, advanced boolean, busy boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    taken bigint[];
    held bigint[];
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
    SELECT array_agg(l.id) INTO taken
    FROM (SELECT x.id
          FROM dispatch.runs x
          JOIN unnest(complete_runs.run_ids, complete_runs.attempts) AS i(id, attempt)
            ON x.id = i.id AND x.attempt = i.attempt
          JOIN dispatch.schedules s ON s.id = x.schedule_id
          WHERE x.status = 'running'
          FOR UPDATE OF x SKIP LOCKED
          FOR NO KEY UPDATE OF s SKIP LOCKED) l;

    IF coalesce(cardinality(taken), 0) < cardinality(complete_runs.run_ids) THEN
        -- Still the caller's but held by another transaction (a user's open one on the
        -- schedule, a tick expiring the lease): busy, try again. Anything else is fenced out.
        SELECT array_agg(x.id) INTO held
        FROM dispatch.runs x
        JOIN unnest(complete_runs.run_ids, complete_runs.attempts) AS i(id, attempt)
          ON x.id = i.id AND x.attempt = i.attempt
        WHERE x.status = 'running' AND x.id <> ALL (coalesce(taken, '{}'));
    END IF;

    WITH done AS (
        UPDATE dispatch.runs x
        SET status = i.status,
            finished_at = now(),
            error = left(i.error, 500),
            http_status = i.http_status,
            duration_ms = i.duration_ms
        FROM unnest(complete_runs.run_ids, complete_runs.statuses, complete_runs.errors,
                    complete_runs.http_statuses, complete_runs.durations_ms)
             AS i(id, status, error, http_status, duration_ms)
        WHERE x.id = i.id AND x.id = ANY (taken)
        RETURNING x
    )
    SELECT array_agg(d.x) INTO finished FROM done d;

    RETURN QUERY
    SELECT i.id, f.run_id IS NOT NULL, coalesce(f.advanced, false), coalesce(i.id = ANY (held), false)
    FROM unnest(complete_runs.run_ids) WITH ORDINALITY AS i(id, n)
    LEFT JOIN dispatch._finish_runs(coalesce(finished, '{}')) f ON f.run_id = i.id
    ORDER BY i.n;
END
$$;
COMMENT ON FUNCTION dispatch.complete_runs(text, bigint[], integer[], text[], text[], integer[], integer[]) IS
    'Record the outcomes (ok or error; errors cut to 500 characters) of runs still running with the attempt given (the fence claim_runs returned; worker is informational), advance each schedule still on its run''s slot to the first slot after max(slot, now), and write one audit row per run, in one transaction. The arrays are parallel (errors, http_statuses and durations_ms may hold NULLs). Returns, for each input run: recorded; advanced (its schedule moved on); busy (not recorded because another transaction holds the run or its schedule: call again). Never waits on a row another transaction holds.';

CREATE OR REPLACE PROCEDURE dispatch.complete_run(
    run_id      bigint,
    worker      text,
    attempt     integer,
    status      text,
    error       text DEFAULT NULL,
    http_status integer DEFAULT NULL,
    duration_ms integer DEFAULT NULL,
    INOUT recorded boolean DEFAULT NULL,
    INOUT advanced boolean DEFAULT NULL,
    INOUT busy boolean DEFAULT NULL
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
    SELECT c.recorded, c.advanced, c.busy INTO complete_run.recorded, complete_run.advanced, complete_run.busy
    FROM dispatch.complete_runs(complete_run.worker, ARRAY[complete_run.run_id], ARRAY[complete_run.attempt],
                                ARRAY[complete_run.status], ARRAY[complete_run.error],
                                ARRAY[complete_run.http_status], ARRAY[complete_run.duration_ms]) c;
END
$$;
COMMENT ON PROCEDURE dispatch.complete_run(bigint, text, integer, text, text, integer, integer, boolean, boolean, boolean) IS
    'dispatch.complete_runs for one run: record the outcome of a run still running with this attempt, advance its schedule, write the audit row, in one transaction. Returns recorded, advanced and busy (another transaction holds the run or its schedule: call again).';
