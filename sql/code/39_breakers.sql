-- The circuit breaker of each function (project_id, function_name): dispatch.breakers.
--
--   closed --(breaker_threshold retryable failures within breaker_window)--> open
--   open   --(any answer that is not a retryable failure: the probe's, or a run's that was
--             already out)--> closed;  dispatch.reset_breaker() --> closed
--
-- While a breaker is open its runs wait: claim_runs hands them to dispatch._hold_for_breakers,
-- which sets them back to pending with a not_before (held_by_breaker), their attempt not used
-- up, except one probe run at a time, once next_probe_at has come. The probe is chosen under
-- the breaker's row lock (SKIP LOCKED) and is in flight while that run is running, so however
-- many listeners claim, one probe at a time reaches the function. The spacing between probes
-- (from a probe's claim, and from its failure, to the next one's claim) doubles from
-- breaker_probe_spacing up to breaker_probe_spacing_max (dispatch.settings), less up to a quarter
-- at random.
--
-- Outcomes reach the breaker through dispatch._breaker_outcomes, called by complete_runs.
-- Opening and closing are audited (breaker.open, breaker.close); a closing releases the
-- waiting runs at once. What waits is still subject to its policies when it is looked at again
-- (at the latest every breaker_probe_spacing_max): a first attempt beyond misfire_grace ends
-- skipped, a retry past its schedule's next slot ends error (claim_runs decides both before
-- this file is asked). The slots that come due meanwhile are the overlap policy's, recorded as
-- gaps (reason overlap) when the waiting run finishes.

-- The spacing before probe number n + 1 (n probes gone since the breaker opened).
CREATE OR REPLACE FUNCTION dispatch._probe_spacing(probes integer)
RETURNS interval
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT least(st.breaker_probe_spacing * power(2, least(greatest(probes, 0), 30)), st.breaker_probe_spacing_max)
    FROM dispatch.settings st
$$;

-- The wait before probe number n + 1: its spacing less up to a quarter, at random. Without the
-- jitter, probes 10 s apart against a function that is down 5 s of every 10 (one that restarts
-- on a timer) all landed in its down half, and the breaker never closed (the chaos suite's
-- flapping function, in its first version).
CREATE OR REPLACE FUNCTION dispatch._probe_delay(probes integer)
RETURNS interval
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT dispatch._probe_spacing(probes) * (1 - 0.25 * random())
$$;

-- The runs waiting behind an open breaker of a function go now (the breaker closed).
-- Runs another transaction holds are left: they are looked at again by their not_before (at
-- most breaker_probe_spacing_max away) and go then, the breaker being closed.
CREATE OR REPLACE FUNCTION dispatch._release_held(project_id text, function_name text)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    held_at tid[];
    released integer;
BEGIN
    SELECT array_agg(h.ctid) INTO held_at
    FROM (SELECT r.ctid
          FROM dispatch.runs r
          JOIN dispatch.schedules s ON s.id = r.schedule_id
          WHERE r.held_by_breaker AND r.status = 'pending'
            AND s.project_id = _release_held.project_id AND s.function_name = _release_held.function_name
          FOR UPDATE OF r SKIP LOCKED) h;
    -- where the lock found them (a later statement: it sees a version committed since this one began)
    UPDATE dispatch.runs r SET not_before = now(), held_by_breaker = false
    WHERE r.ctid = ANY (held_at);
    GET DIAGNOSTICS released = ROW_COUNT;
    IF released > 0 THEN
        PERFORM pg_notify('dispatch', 'breaker');
    END IF;
    RETURN released;
END
$$;

-- claim_runs' live runs (rows it holds), less those that must wait behind an open breaker:
-- those are held (pending, not_before, held_by_breaker), and one run per open breaker whose
-- next probe is due goes as its probe. Returns the runs to start.
CREATE OR REPLACE FUNCTION dispatch._hold_for_breakers(run_ids bigint[])
RETURNS bigint[]
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_indexscan = off
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    c_ids bigint[];
    c_tids tid[];
    c_projects text[];
    c_functions text[];
    held_ids bigint[];
    probe_ids bigint[];
BEGIN
    IF run_ids IS NULL OR NOT EXISTS (SELECT 1 FROM dispatch.breakers b WHERE b.state = 'open') THEN
        RETURN run_ids;
    END IF;
    -- the runs of open breakers, the probe's candidates first: the fewest invocations (a probe
    -- uses up an attempt of its run: they take turns), then the oldest
    SELECT array_agg(r.id ORDER BY r.attempt - r.released, r.fire_at, r.id),
           array_agg(r.ctid ORDER BY r.attempt - r.released, r.fire_at, r.id),
           array_agg(b.project_id ORDER BY r.attempt - r.released, r.fire_at, r.id),
           array_agg(b.function_name ORDER BY r.attempt - r.released, r.fire_at, r.id)
    INTO c_ids, c_tids, c_projects, c_functions
    FROM dispatch.runs r
    JOIN dispatch.schedules s ON s.id = r.schedule_id
    JOIN dispatch.breakers b ON b.project_id = s.project_id AND b.function_name = s.function_name
    WHERE r.id = ANY (_hold_for_breakers.run_ids) AND b.state = 'open';
    IF c_ids IS NULL THEN
        RETURN run_ids;
    END IF;

    -- The probes: one per open breaker whose next probe is due and whose last probe is no longer
    -- out, taken under the breaker's row lock (a claimer that cannot have it holds its runs).
    WITH cand AS (
        SELECT c.id, c.project_id, c.function_name, c.n
        FROM unnest(c_ids, c_projects, c_functions) WITH ORDINALITY AS c(id, project_id, function_name, n)
    ), free AS (
        SELECT b.project_id, b.function_name
        FROM dispatch.breakers b
        WHERE (b.project_id, b.function_name) IN (SELECT c.project_id, c.function_name FROM cand c)
          AND b.state = 'open' AND b.next_probe_at <= now()
          AND NOT EXISTS (SELECT 1 FROM dispatch.runs p WHERE p.id = b.probe_run_id AND p.status = 'running')
        FOR NO KEY UPDATE OF b SKIP LOCKED
    ), probing AS (
        UPDATE dispatch.breakers b
        SET probe_run_id = p.id, probes = b.probes + 1,
            next_probe_at = now() + dispatch._probe_delay(b.probes + 1), updated_at = now()
        FROM free f
        CROSS JOIN LATERAL (SELECT c.id FROM cand c
                            WHERE c.project_id = f.project_id AND c.function_name = f.function_name
                            ORDER BY c.n LIMIT 1) p
        WHERE b.project_id = f.project_id AND b.function_name = f.function_name
        RETURNING p.id
    )
    SELECT array_agg(p.id) INTO probe_ids FROM probing p;

    -- The others wait: for the next probe when none is out, else until that one's outcome pulls
    -- one of them forward (dispatch._breaker_outcomes), or for the longest spacing.
    WITH held AS (
        UPDATE dispatch.runs r
        SET not_before = CASE
                WHEN b.probe_run_id IS NOT NULL
                     AND EXISTS (SELECT 1 FROM dispatch.runs p WHERE p.id = b.probe_run_id
                                 AND (p.status = 'running' OR p.id = ANY (coalesce(probe_ids, '{}'))))
                THEN now() + st.breaker_probe_spacing_max
                WHEN b.next_probe_at > now() THEN b.next_probe_at
                -- due, but another claimer holds the breaker: look again a spacing later
                ELSE now() + st.breaker_probe_spacing END,
            held_by_breaker = true
        FROM unnest(c_ids, c_tids, c_projects, c_functions) AS c(id, tid, project_id, function_name)
        JOIN dispatch.breakers b ON b.project_id = c.project_id AND b.function_name = c.function_name
        CROSS JOIN dispatch.settings st
        WHERE r.ctid = c.tid AND c.id <> ALL (coalesce(probe_ids, '{}'))  -- locked by the claim: still there
        RETURNING r.id
    )
    SELECT array_agg(h.id) INTO held_ids FROM held h;

    IF held_ids IS NOT NULL THEN
        -- fewer runs than asked for although more may be pending: have the claimers come back;
        -- and the listeners' clocks wake for the new not_before (the next probe)
        PERFORM pg_notify('dispatch', 'held');
        PERFORM pg_notify('dispatch', 'schedules');
    END IF;
    RETURN ARRAY(SELECT x FROM unnest(run_ids) x WHERE x <> ALL (coalesce(held_ids, '{}')));
END
$$;

-- Both find their runs by id, a bitmap scan of the primary key whatever the statistics say (as
-- dispatch._take_running), and each run's outcome by its position in the arrays, not by a join
-- on id that a plan could answer by reading an index of runs whole. Without JIT: a disabled
-- scan's cost (the one-row settings table has no other) would have the plan compiled.

-- complete_runs' outcomes, for the breakers of their functions: runs_ids holds the runs taken
-- (still running with the caller's attempt), the other arrays are complete_runs' own, parallel
-- to all_ids. A retryable failure counts; any other outcome (ok, or an error that is final:
-- the function answered) closes the breaker. Returns run_ids less the runs it could not count:
-- the rows it writes (a breaker that is open or counts failures, or the function of a retryable
-- failure in the batch; not a healthy function's, so that two completions of one never make
-- each other busy) are locked first, in key order (two completions never deadlock) and without
-- waiting. A claim that hands out a probe holds the breaker's row until it commits, in psql as
-- long as it stays open, and neither counting nor closing may wait on it (invariant 3): the runs
-- of such a function are left out, and complete_runs answers them busy.
-- (Its result was void before: an install over that version drops it.)
DO $$
DECLARE
    fn regprocedure := pg_catalog.to_regprocedure(
        'dispatch._breaker_outcomes(bigint[], bigint[], text[], boolean[], text[])');
BEGIN
    IF fn IS NOT NULL AND pg_catalog.pg_get_function_result(fn) = 'void' THEN
        EXECUTE pg_catalog.format('DROP FUNCTION %s', fn);
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION dispatch._breaker_outcomes(run_ids bigint[], all_ids bigint[], statuses text[],
                                                      retryable boolean[], errors text[])
RETURNS bigint[]
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_indexscan = off
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    st dispatch.settings;
    f record;
    counted dispatch.breakers;
    opened timestamptz;
    held bigint[];
BEGIN
    -- the common case: no failure in the batch and no breaker counting or open
    IF run_ids IS NULL
       OR (NOT coalesce(true = ANY (retryable), false)
           AND NOT EXISTS (SELECT 1 FROM dispatch.breakers b WHERE b.failures > 0 OR b.state = 'open')) THEN
        RETURN run_ids;
    END IF;
    SELECT * INTO st FROM dispatch.settings;

    WITH batch AS (  -- the batch's functions, and whether each failed retryably now
        SELECT s.project_id, s.function_name,
               bool_or(_breaker_outcomes.statuses[x.n] = 'error' AND coalesce(_breaker_outcomes.retryable[x.n], false))
                   AS failed
        FROM (SELECT y.schedule_id, array_position(_breaker_outcomes.all_ids, y.id) AS n
              FROM dispatch.runs y WHERE y.id = ANY (_breaker_outcomes.run_ids)) x
        JOIN dispatch.schedules s ON s.id = x.schedule_id
        GROUP BY s.project_id, s.function_name
    ), wanted AS (
        SELECT b.project_id, b.function_name
        FROM dispatch.breakers b
        JOIN batch ON batch.project_id = b.project_id AND batch.function_name = b.function_name
        WHERE batch.failed OR b.state = 'open' OR b.failures > 0
    ), locked AS (
        SELECT b.project_id, b.function_name
        FROM dispatch.breakers b
        WHERE (b.project_id, b.function_name) IN (SELECT w.project_id, w.function_name FROM wanted w)
        ORDER BY b.project_id, b.function_name
        FOR NO KEY UPDATE SKIP LOCKED
    )
    SELECT array_agg(x.id) INTO held
    FROM dispatch.runs x
    JOIN dispatch.schedules s ON s.id = x.schedule_id
    WHERE x.id = ANY (_breaker_outcomes.run_ids)
      AND (s.project_id, s.function_name) IN (SELECT w.project_id, w.function_name FROM wanted w)
      AND (s.project_id, s.function_name) NOT IN (SELECT l.project_id, l.function_name FROM locked l);

    FOR f IN
        WITH o AS (
            SELECT s.project_id, s.function_name, x.id,
                   _breaker_outcomes.statuses[x.n] = 'error' AND coalesce(_breaker_outcomes.retryable[x.n], false)
                       AS failed,
                   _breaker_outcomes.errors[x.n] AS error
            FROM (SELECT y.id, y.schedule_id, array_position(_breaker_outcomes.all_ids, y.id) AS n
                  FROM dispatch.runs y
                  WHERE y.id = ANY (_breaker_outcomes.run_ids) AND y.id <> ALL (coalesce(held, '{}'))) x
            JOIN dispatch.schedules s ON s.id = x.schedule_id
        )
        SELECT o.project_id, o.function_name, count(*) FILTER (WHERE o.failed)::integer AS failed,
               bool_or(NOT o.failed) AS answered, array_agg(o.id) AS ids,
               (array_agg(o.error ORDER BY o.id DESC) FILTER (WHERE o.failed))[1] AS error
        FROM o
        GROUP BY o.project_id, o.function_name
        -- only functions that failed now, or whose breaker counts or is open
        HAVING count(*) FILTER (WHERE o.failed) > 0
            OR EXISTS (SELECT 1 FROM dispatch.breakers b
                       WHERE b.project_id = o.project_id AND b.function_name = o.function_name
                         AND (b.state = 'open' OR b.failures > 0))
        ORDER BY o.project_id, o.function_name
    LOOP
        IF f.answered THEN
            PERFORM dispatch._close_breaker(f.project_id, f.function_name, NULL, 'answered', f.ids);
            CONTINUE;
        END IF;
        IF st.breaker_threshold = 0 THEN
            CONTINUE;
        END IF;
        INSERT INTO dispatch.breakers AS b (project_id, function_name)
        VALUES (f.project_id, f.function_name)
        ON CONFLICT DO NOTHING;
        -- counting; opens at the threshold
        UPDATE dispatch.breakers b
        SET failures = CASE WHEN b.failures = 0 OR now() - b.failing_since > st.breaker_window THEN f.failed
                            ELSE b.failures + f.failed END,
            failing_since = CASE WHEN b.failures = 0 OR now() - b.failing_since > st.breaker_window THEN now()
                                 ELSE b.failing_since END,
            last_error = left(f.error, 500), updated_at = now()
        WHERE b.project_id = f.project_id AND b.function_name = f.function_name
        RETURNING b.* INTO counted;
        IF counted.state = 'closed' AND counted.failures >= st.breaker_threshold THEN
            -- when it opened: the statement's clock, the closest to the commit that makes it so (the
            -- transaction may have waited for the breaker's row since it began)
            opened := clock_timestamp();
            UPDATE dispatch.breakers b
            SET state = 'open', opened_at = opened, probes = 0, probe_run_id = NULL,
                next_probe_at = opened + dispatch._probe_delay(0)
            WHERE b.project_id = f.project_id AND b.function_name = f.function_name;
            INSERT INTO dispatch.audit_log (at, actor_id, project_id, action, metadata)
            VALUES (opened, NULL, f.project_id, 'breaker.open', jsonb_build_object(
                       'functionName', f.function_name, 'failures', counted.failures,
                       'failingSince', counted.failing_since, 'threshold', st.breaker_threshold,
                       'window', st.breaker_window, 'error', counted.last_error,
                       'nextProbeAt', (SELECT b.next_probe_at FROM dispatch.breakers b
                                       WHERE b.project_id = f.project_id AND b.function_name = f.function_name)));
            PERFORM dispatch._event('breaker.opened', f.project_id, jsonb_build_object('failures', counted.failures),
                        jsonb_build_object('functionName', f.function_name, 'error', counted.last_error));
        END IF;
        -- an open breaker whose probe failed: the next probe goes a spacing after this failure
        -- at the earliest (so a probe reaches the function a spacing after the previous one's
        -- answer, however long that took), taken from the runs waiting (the oldest is made
        -- claimable then)
        UPDATE dispatch.breakers b
        SET next_probe_at = greatest(b.next_probe_at, now() + dispatch._probe_delay(b.probes)), updated_at = now()
        WHERE b.project_id = f.project_id AND b.function_name = f.function_name AND b.state = 'open'
          AND b.probe_run_id = ANY (f.ids);
        UPDATE dispatch.runs r
        SET not_before = b.next_probe_at
        FROM dispatch.breakers b
        WHERE b.project_id = f.project_id AND b.function_name = f.function_name AND b.state = 'open'
          AND b.probe_run_id = ANY (f.ids)
          AND r.id = (SELECT w.id
                      FROM dispatch.runs w
                      JOIN dispatch.schedules s ON s.id = w.schedule_id
                      WHERE w.held_by_breaker AND w.status = 'pending'
                        AND s.project_id = f.project_id AND s.function_name = f.function_name
                      ORDER BY w.not_before, w.id
                      LIMIT 1
                      FOR UPDATE OF w SKIP LOCKED)
          AND r.not_before > b.next_probe_at;
        IF FOUND THEN
            PERFORM pg_notify('dispatch', 'schedules');  -- listeners' clocks wake for the next probe
        END IF;
    END LOOP;
    RETURN ARRAY(SELECT r FROM unnest(run_ids) r WHERE r <> ALL (coalesce(held, '{}')));
END
$$;

-- Close a breaker (or clear its count of failures), audited when it was open, and let its
-- waiting runs go. actor: the operator (reset), NULL for the system. Returns the breaker's row
-- as it was, NULL when it has none.
CREATE OR REPLACE FUNCTION dispatch._close_breaker(project_id text, function_name text, actor text, reason text,
                                                   run_ids bigint[] DEFAULT NULL)
RETURNS dispatch.breakers
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    was dispatch.breakers;
BEGIN
    SELECT * INTO was FROM dispatch.breakers b
    WHERE b.project_id = _close_breaker.project_id AND b.function_name = _close_breaker.function_name
      AND (b.state = 'open' OR b.failures > 0 OR _close_breaker.actor IS NOT NULL)
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    UPDATE dispatch.breakers b
    SET state = 'closed', failures = 0, failing_since = NULL, opened_at = NULL, probes = 0, next_probe_at = NULL,
        probe_run_id = NULL, updated_at = now()
    WHERE b.project_id = was.project_id AND b.function_name = was.function_name;
    IF was.state = 'open' THEN
        INSERT INTO dispatch.audit_log (actor_id, project_id, action, metadata)
        VALUES (_close_breaker.actor, was.project_id, 'breaker.close', jsonb_strip_nulls(jsonb_build_object(
                    'functionName', was.function_name, 'reason', _close_breaker.reason, 'openedAt', was.opened_at,
                    'openFor', now() - was.opened_at, 'probes', was.probes,
                    'runId', (SELECT min(x) FROM unnest(_close_breaker.run_ids) x))));
        PERFORM dispatch._event('breaker.closed', was.project_id, jsonb_build_object('probes', was.probes),
                    jsonb_build_object('functionName', was.function_name, 'reason', _close_breaker.reason,
                                       'openedAt', was.opened_at));
    END IF;
    -- after a reset or a close, whatever waited goes (held runs of a breaker that only counted
    -- failures are none)
    PERFORM dispatch._release_held(was.project_id, was.function_name);
    RETURN was;
END
$$;

CREATE OR REPLACE FUNCTION dispatch.reset_breaker(project_id text, function_name text)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    was dispatch.breakers;
BEGIN
    was := dispatch._close_breaker(reset_breaker.project_id, reset_breaker.function_name, session_user::text, 'reset');
    IF was.project_id IS NULL THEN
        RAISE EXCEPTION 'function % of project % has no breaker', reset_breaker.function_name, reset_breaker.project_id
            USING ERRCODE = 'no_data_found',
                  HINT = 'SELECT * FROM dispatch.breakers lists them: a function gets one at its first retryable failure.';
    END IF;
    IF was.state = 'closed' THEN
        INSERT INTO dispatch.audit_log (actor_id, project_id, action, metadata)
        VALUES (session_user, was.project_id, 'breaker.reset', jsonb_build_object(
                    'functionName', was.function_name, 'failures', was.failures));
    END IF;
    RETURN was.state;
END
$$;
COMMENT ON FUNCTION dispatch.reset_breaker(text, text) IS
    'Close the circuit breaker of a function (project_id, function_name) and clear its count of failures: its waiting runs go at once. Audited as breaker.close (reason reset) when it was open, else breaker.reset, with the actor (session_user). Returns the state it was in (open or closed); P0002 when the function has no breaker. It holds the breaker''s row until the transaction ends, and completions of that function wait for it: run it on its own.';

-- What listeners export as pgdispatch_breaker_open{project,function}, and what
-- pgdispatch breakers list shows: every breaker that is open or counting failures.
CREATE OR REPLACE FUNCTION dispatch.breaker_states()
RETURNS TABLE (project_id text, function_name text, state text, failures integer, opened_at timestamptz,
               probes integer, next_probe_at timestamptz, probe_out boolean, waiting bigint, last_error text)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT b.project_id, b.function_name, b.state, b.failures, b.opened_at, b.probes, b.next_probe_at,
           EXISTS (SELECT 1 FROM dispatch.runs p WHERE p.id = b.probe_run_id AND p.status = 'running'),
           (SELECT count(*) FROM dispatch.runs r JOIN dispatch.schedules s ON s.id = r.schedule_id
            WHERE r.held_by_breaker AND r.status = 'pending'
              AND s.project_id = b.project_id AND s.function_name = b.function_name),
           b.last_error
    FROM dispatch.breakers b
    WHERE b.state = 'open' OR b.failures > 0
    ORDER BY b.project_id, b.function_name
$$;
COMMENT ON FUNCTION dispatch.breaker_states() IS
    'The circuit breakers that are open or counting failures: state, consecutive retryable failures, when it opened, probes sent since, when the next may go, whether one is out, how many runs wait behind it, the last error. What listeners export as pgdispatch_breaker_open{project,function}.';
