-- dispatch.release_runs: running -> pending for runs a listener claimed and never invoked.

CREATE OR REPLACE FUNCTION dispatch.release_runs(worker text, run_ids bigint[], attempts integer[])
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    taken bigint[];
    taken_at tid[];
    released integer;
BEGIN
    IF cardinality(release_runs.attempts) IS DISTINCT FROM cardinality(release_runs.run_ids) THEN
        RAISE EXCEPTION 'run_ids and attempts must have one element per run'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Fenced like complete_runs: only while the run is running with the attempt given.
    -- (by the primary key, the attempts matched by position: see dispatch._take_running)
    SELECT array_agg(l.id), array_agg(l.ctid) INTO taken, taken_at
    FROM (SELECT x.id, x.ctid
          FROM dispatch.runs x
          WHERE x.id = ANY (release_runs.run_ids) AND x.status || '' = 'running'
            AND x.attempt = release_runs.attempts[array_position(release_runs.run_ids, x.id)]
          FOR UPDATE OF x SKIP LOCKED) l;

    UPDATE dispatch.runs x
    -- The attempt stays: it is the fencing token, and the next claim must get a higher one than
    -- this claim had (invariant 7). released says that this claim invoked nothing, so it counts
    -- toward neither max_attempts nor misfire_grace's "first attempt".
    SET status = 'pending', worker = NULL, claimed_at = NULL, lease_until = NULL,
        released = x.released + 1
    WHERE x.ctid = ANY (taken_at);
    GET DIAGNOSTICS released = ROW_COUNT;
    IF released > 0 THEN
        -- A run whose schedule stopped meanwhile goes no further than pending.
        PERFORM dispatch._end_stale_runs(taken, wait => false);
        PERFORM pg_notify('dispatch', 'released');
    END IF;
    RETURN released;
END
$$;
COMMENT ON FUNCTION dispatch.release_runs(text, bigint[], integer[]) IS
    'Hand runs that were claimed but never invoked back to pending (counted in released: the claim uses up no attempt of max_attempts, and the next claim gets a higher attempt, a fencing token no earlier claim had); only runs still running with the attempt given (worker is informational). A run whose schedule has stopped ends skipped instead. Returns how many were handed back. Used by a listener that shuts down.';
