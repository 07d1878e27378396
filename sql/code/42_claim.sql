-- dispatch.claim_runs: pending -> running, the attempt incremented and returned as the fence.

-- Its result ends with kind and traceparent, added last for callers that read by position. A
-- result type cannot change in place: an install over an earlier shape drops the function first
-- (90_grants.sql grants it again).
DO $$
DECLARE
    fn regprocedure;
BEGIN
    FOREACH fn IN ARRAY ARRAY[pg_catalog.to_regprocedure('dispatch.claim_runs(text, integer, interval, interval)'),
                              pg_catalog.to_regprocedure('dispatch._start_runs(tid[], text, interval, interval)')] LOOP
        IF fn IS NOT NULL AND pg_catalog.pg_get_function_result(fn) NOT LIKE '%traceparent text)' THEN
            EXECUTE pg_catalog.format('DROP FUNCTION %s', fn);
        END IF;
    END LOOP;
END
$$;

-- The claimed runs to running, found where the claim's pick locked them (their ctids: a locked
-- row stays put). Plain index and sequential scans off: whatever the statistics of runs say (an
-- autovacuum amid a big marking leaves them at one row), no plan can read an index of runs whole.
DROP FUNCTION IF EXISTS dispatch._start_runs(bigint[], text, interval, interval);  -- the earlier one, by id
CREATE OR REPLACE FUNCTION dispatch._start_runs(tids tid[], worker text, lease interval,
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
    kind          text,
    traceparent   text
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
        attempt = r.attempt + 1,
        traceparent = coalesce(r.traceparent, s.traceparent)  -- the schedule's, from the first claim on
    FROM dispatch.schedules s
    WHERE r.ctid = ANY (_start_runs.tids) AND s.id = r.schedule_id
      -- still live as this statement sees it: a stop that committed since the claim's pick
      -- judged the run wins (claim_runs then ends the run)
      AND s.enabled AND s.deleted_at IS NULL AND s.paused_at IS NULL
    RETURNING r.id, r.schedule_id, s.project_id, s.function_name, s.args,
              r.request_id, r.scheduled_for, r.attempt, r.lease_until,
              coalesce(s.timeout, _start_runs.default_timeout), r.fire_at, r.kind, r.traceparent;
END
$$;

-- The projects of the waiting runs that may start now (not_before over), read off the front of
-- runs_not_before_idx, and whether that was the whole front (at most `front` entries).
DROP FUNCTION IF EXISTS dispatch._claimable_front();
CREATE OR REPLACE FUNCTION dispatch._claimable_front(OUT waiting text[], OUT whole boolean)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    front constant integer := 5000;
BEGIN
    SELECT array_agg(DISTINCT f.project_id), count(*) <= front INTO waiting, whole
    FROM (SELECT r.project_id FROM dispatch.runs r
          WHERE r.status = 'pending' AND r.not_before IS NOT NULL AND r.not_before <= now()
          ORDER BY r.not_before, r.id
          LIMIT front + 1) f;
END
$$;
COMMENT ON FUNCTION dispatch._claimable_front() IS
    'The projects of the pending runs whose not_before is over, from the first 5,000 entries of runs_not_before_idx in not_before order, and whether those were all of them (false: there may be more).';

-- The projects with runs to claim now (pending, not_before NULL or over) after `after` and up to
-- `upto` (NULL: no bound), in project_id order, at most n. A loose index scan of the projects'
-- queues of runs due in their slot order (runs_project_pending_idx): one descent a project. The
-- projects with waiting runs whose instant is over (retries, jittered slots) are read off the
-- front of runs_not_before_idx first: such runs are claimed as they come due, so the front is
-- short, while the per-project index of waiting runs holds every run still waiting for its
-- instant, which a walk of it steps over one by one. A front longer than _claimable_front reads
-- (a storm of retries) is walked project by project. The caller reads the front once for both
-- ranges of a listing that wraps around.
DROP FUNCTION IF EXISTS dispatch._claimable_between(text, text, integer);
DROP FUNCTION IF EXISTS dispatch._claimable_between(text, text, integer, text[], integer);
CREATE OR REPLACE FUNCTION dispatch._claimable_between(after text, upto text, n integer, waiting text[],
                                                       whole boolean)
RETURNS text[]
-- PL/pgSQL for its cached plan (a SQL function with a SET clause is planned on every call)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
-- Each step descends a per-project index, never sorts the pending runs, whatever the statistics say.
SET enable_sort = off
-- (a disabled path's cost would otherwise have the plan JIT-compiled)
SET jit = off
AS $$
BEGIN
    RETURN (WITH RECURSIVE walk(project_id, step) AS (
        SELECT after, 0
        UNION ALL
        SELECT nx.project_id, w.step + 1
        FROM walk w
        CROSS JOIN LATERAL (
            SELECT least((SELECT r.project_id FROM dispatch.runs r
                          WHERE r.status = 'pending' AND r.not_before IS NULL AND r.project_id > w.project_id
                          ORDER BY r.project_id LIMIT 1),
                         CASE WHEN whole  -- the whole front: its projects are all there are
                              THEN (SELECT min(p.project_id) FROM unnest(waiting) AS p(project_id)
                                    WHERE p.project_id > w.project_id)
                              ELSE (SELECT r.project_id FROM dispatch.runs r
                                    WHERE r.status = 'pending' AND r.not_before IS NOT NULL
                                      AND r.not_before <= now() AND r.project_id > w.project_id
                                    ORDER BY r.project_id LIMIT 1)
                         END) AS project_id
            OFFSET 0  -- once a step, not once for each place that reads it
        ) nx
        WHERE w.step < n AND nx.project_id <= coalesce(upto, nx.project_id)
    )
    SELECT array_agg(w.project_id ORDER BY w.step) FROM walk w WHERE w.step > 0);
END
$$;
COMMENT ON FUNCTION dispatch._claimable_between(text, text, integer, text[], boolean) IS
    'The projects with runs a claim may take now (pending, not_before NULL or over) after "after" and up to "upto" (NULL: no bound), at most n, in project_id order (a loose index scan: an index descent a project), given the front of the waiting runs that may start (dispatch._claimable_front).';

-- Round-robin: the claimable projects after `after`, then from the first up to `after` itself,
-- each once; at most n.
CREATE OR REPLACE FUNCTION dispatch._claimable_projects(after text, n integer)
RETURNS text[]
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    front record := dispatch._claimable_front();
    tail text[] := dispatch._claimable_between(coalesce(after, ''), NULL, n, front.waiting, front.whole);
BEGIN
    IF coalesce(after, '') = '' OR coalesce(cardinality(tail), 0) >= n THEN
        RETURN tail;
    END IF;
    RETURN tail || dispatch._claimable_between('', after, n - coalesce(cardinality(tail), 0), front.waiting,
                                               front.whole);
END
$$;
COMMENT ON FUNCTION dispatch._claimable_projects(text, integer) IS
    'The projects with runs a claim may take now, at most n, each once: in project_id order from the first after "after", wrapping around to "after" itself.';

-- The running runs of each of `projects` that have any, in one pass over runs_running_lease_idx.
-- A plain index scan, which marks the entries of runs finished since the last vacuum dead as it
-- passes them: a bitmap scan, which wrong statistics lead to, reads them all again at each claim.
CREATE OR REPLACE FUNCTION dispatch._running_counts(projects text[], OUT project_ids text[], OUT counts integer[])
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
SET enable_bitmapscan = off
AS $$
BEGIN
    SELECT coalesce(array_agg(c.project_id), '{}'), coalesce(array_agg(c.n), '{}') INTO project_ids, counts
    FROM (SELECT x.project_id, count(*)::integer AS n FROM dispatch.runs x
          WHERE x.status = 'running' AND x.project_id = ANY (_running_counts.projects)
          GROUP BY x.project_id) c;
END
$$;
COMMENT ON FUNCTION dispatch._running_counts(text[]) IS
    'How many runs of each of the projects given are running (projects with none are left out): what dispatch.claim_runs counts against max_concurrency, and dispatch.explain shows.';

-- How many runs of each project a claim of n takes before the remainder: n shared by weight,
-- water-filled (a project allowed fewer than its share takes its allowance, and the others share
-- the rest again), each share rounded down. Pure arithmetic.
DROP FUNCTION IF EXISTS dispatch._claim_quotas(integer, integer[], integer[], boolean[]);
DROP FUNCTION IF EXISTS dispatch._claim_shares(integer, integer[], integer[], integer[]);
CREATE OR REPLACE FUNCTION dispatch._claim_shares(n integer, weights integer[], allow integer[])
RETURNS integer[]
LANGUAGE plpgsql
IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    k integer := cardinality(weights);
    shares integer[] := array_fill(0, ARRAY[k]);
    fixed boolean[] := array_fill(false, ARRAY[k]);
    rest bigint := n;
    total bigint;
    changed boolean := true;
    i integer;
BEGIN
    WHILE changed LOOP
        changed := false;
        total := 0;
        FOR i IN 1..k LOOP
            IF NOT fixed[i] THEN total := total + weights[i]; END IF;
        END LOOP;
        EXIT WHEN total = 0;
        -- (the rest only grows for the others as a project is fixed: a stale total errs low)
        FOR i IN 1..k LOOP
            IF NOT fixed[i] AND allow[i]::bigint * total < rest * weights[i] THEN
                fixed[i] := true;
                shares[i] := allow[i];
                rest := rest - allow[i];
                changed := true;
            END IF;
        END LOOP;
    END LOOP;
    FOR i IN 1..k LOOP
        IF NOT fixed[i] THEN
            shares[i] := rest * weights[i] / total;
        END IF;
    END LOOP;
    RETURN shares;
END
$$;
COMMENT ON FUNCTION dispatch._claim_shares(integer, integer[], integer[]) IS
    'Arithmetic of dispatch.claim_runs: how many runs of each project a claim of n takes before the remainder, by weight, water-filled (a project allowed fewer than its share takes its allowance), each share rounded down.';

-- What a claim does with a pending run it locked: 'live', it starts; 'stale', it ends skipped
-- (its schedule stopped, or its first attempt can no longer start within misfire_grace);
-- 'late', it ends error, or lost after a lost lease (an attempt went out and max_attempts,
-- lowered since, allows no more; or a retry of a failed attempt that would start after its
-- schedule's next slot). A run is a retry by its attempts (attempt > released: one went out),
-- not by its not_before, which a claim handed back or a lease that expired leaves NULL. A run
-- whose last attempt's lease expired may never have reached the function: it goes out again
-- however late (at least once). No SET clause, so every operator is qualified: the planner
-- inlines it into the claim's statement (see dispatch._missed).
CREATE OR REPLACE FUNCTION dispatch._claim_verdict(r dispatch.runs, s dispatch.schedules)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN NOT (s.enabled AND s.deleted_at IS NULL AND s.paused_at IS NULL) THEN 'stale'
                WHEN dispatch._missed(r, s) THEN 'stale'
                WHEN r.attempt OPERATOR(pg_catalog.=) r.released THEN 'live'
                WHEN r.attempt OPERATOR(pg_catalog.-) r.released OPERATOR(pg_catalog.>=) s.max_attempts THEN 'late'
                WHEN r.kind OPERATOR(pg_catalog.=) 'scheduled'
                     AND COALESCE(r.earlier_attempts OPERATOR(pg_catalog.->) -1 OPERATOR(pg_catalog.->>) 'status', '')
                         OPERATOR(pg_catalog.<>) 'lost'
                     AND pg_catalog.now() OPERATOR(pg_catalog.>=) dispatch._next_slot(s.cron_spec, r.scheduled_for, s.timezone)
                THEN 'late'
                ELSE 'live' END
$$;
COMMENT ON FUNCTION dispatch._claim_verdict(dispatch.runs, dispatch.schedules) IS
    'What dispatch.claim_runs does with a pending run it locked: live (starts it), stale (ends it skipped: its schedule stopped, or its first attempt missed misfire_grace) or late (ends it error, lost after a lost lease: an attempt beyond max_attempts, or a retry of a failed attempt past the next slot), however the run came back to pending (a back-off, a claim handed back, a lease that expired).';

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
    kind          text,
    traceparent   text
)
-- PL/pgSQL rather than SQL: PostgreSQL plans a (non-inlined) SQL function on every call, and
-- planning these statements costs more than running them.
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Whatever the statistics of runs say (tests/test_runs.py): each picked run's schedule through
-- schedules_pkey, each project's queue from its own index, never a join or sort over all runs;
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_sort = off
-- a disabled path's cost would otherwise have the plan JIT-compiled.
SET jit = off
-- Planned once a session: planning these statements at each call costs more than running them.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    cursor_at text := nullif(current_setting('dispatch.claim_cursor', true), '');
    room integer := claim_runs.max_runs;
    want integer;
    seen text[] := '{}';
    listing text[];
    listed integer;
    projects text[];
    capped text[];
    held text[];
    counted text[];
    running integer[];
    barred text[];
    got integer;
    cursor_to text;
    cut boolean;
    floors_pass boolean;
    weights integer[];
    allow integer[];
    was_allowed integer[];
    taken integer[];
    shares integer[];
    quotas integer[];
    picked_ids bigint[];
    picked_of integer[];
    picked_verdicts text[];
    picked_tids tid[];
    spare integer;
    walk integer[];
    walked integer;
    extra_ids bigint[];
    locked bigint[];
    extra_of integer[];
    extra_verdicts text[];
    extra_tids tid[];
    live_tids tid[];
    live_ids bigint[];
    late_ids bigint[];
    stale_ids bigint[];
    need integer;
    i integer;
    started integer;
    last_served integer;
    ended boolean := false;
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

    IF claim_runs.max_runs = 0 THEN
        RETURN;
    END IF;
    -- The lock a claim takes on runs (what FOR UPDATE takes), before it looks: behind a
    -- transaction that holds the table (a migration, LOCK TABLE … EXCLUSIVE), the claim waits,
    -- then sees what that transaction committed, as one statement claiming with FOR UPDATE did.
    LOCK TABLE dispatch.runs IN ROW SHARE MODE;

    -- Fair between projects. The projects with runs to claim, round-robin from the one after
    -- where this session's last claim stopped (a session setting: no shared row, nothing to
    -- contend on), at most as many as runs are still wanted, of those that may run more now. A
    -- capped project's row is locked (SKIP LOCKED) while its running runs are counted and its runs
    -- claimed, so claimers take turns on it without waiting; one that another claimer holds, or
    -- that is at its cap, leaves its place to the next project. The count is read after the lock,
    -- by a later statement (READ COMMITTED: a snapshot that sees the runs the previous holder
    -- claimed). A round that comes back short (the listed projects' due runs held by other
    -- claimers) lists the projects after them in the next round, until the claim is full or
    -- every claimable project has been listed.
    <<rounds>>
    LOOP
        want := cardinality(seen) + room;
        LOOP
            listing := dispatch._claimable_projects(cursor_at, want);
            EXIT rounds WHEN listing IS NULL;
            listed := cardinality(listing);
            projects := ARRAY(SELECT u.p FROM unnest(listing) WITH ORDINALITY AS u(p, n)
                              WHERE u.p <> ALL (seen) ORDER BY u.n);
            SELECT array_agg(p.project_id) INTO capped
            FROM dispatch.projects p WHERE p.project_id = ANY (projects) AND p.max_concurrency IS NOT NULL;
            IF capped IS NULL THEN
                IF cardinality(projects) = 1 THEN  -- one project, uncapped: its weight is moot
                    weights := ARRAY[1];
                    allow := ARRAY[room];
                ELSE
                    SELECT array_agg(coalesce(pr.weight, 1) ORDER BY u.n), array_agg(room)
                    INTO weights, allow
                    FROM unnest(projects) WITH ORDINALITY AS u(project_id, n)
                    LEFT JOIN dispatch.projects pr ON pr.project_id = u.project_id;
                END IF;
            ELSE
                PERFORM dispatch._require_read_committed('dispatch.claim_runs for a project with max_concurrency');
                SELECT array_agg(l.project_id) INTO held
                FROM (SELECT p.project_id FROM dispatch.projects p WHERE p.project_id = ANY (capped)
                      ORDER BY p.project_id FOR NO KEY UPDATE SKIP LOCKED) l;
                SELECT c.project_ids, c.counts INTO counted, running FROM dispatch._running_counts(held) c;
                SELECT array_agg(x.project_id ORDER BY x.n) FILTER (WHERE x.a > 0),
                       array_agg(x.w ORDER BY x.n) FILTER (WHERE x.a > 0),
                       array_agg(x.a ORDER BY x.n) FILTER (WHERE x.a > 0),
                       coalesce(array_agg(x.project_id) FILTER (WHERE x.a = 0), '{}')
                INTO projects, weights, allow, barred
                FROM (SELECT u.project_id, u.n, coalesce(pr.weight, 1) AS w,
                             CASE WHEN pr.max_concurrency IS NULL THEN room
                                  WHEN u.project_id = ANY (held)
                                  THEN least(room, greatest(pr.max_concurrency
                                                            - coalesce(running[array_position(counted, u.project_id)], 0),
                                                            0))
                                  ELSE 0 END AS a
                      FROM unnest(projects) WITH ORDINALITY AS u(project_id, n)
                      LEFT JOIN dispatch.projects pr ON pr.project_id = u.project_id) x;
                -- (never listed again by this claim: held by another claimer, or at their cap)
                seen := seen || barred;
            END IF;
            -- enough projects that may run more, or every claimable project seen
            EXIT WHEN coalesce(cardinality(projects), 0) >= room OR listed < want;
            want := want * 2;
        END LOOP;
        EXIT rounds WHEN coalesce(cardinality(projects), 0) = 0;
        cut := cardinality(projects) > room;
        projects := projects[1:room];
        weights := weights[1:room];
        allow := allow[1:room];
        seen := seen || projects;
        taken := array_fill(0, ARRAY[cardinality(projects)]);
        last_served := NULL;
        floors_pass := false;

        -- Each pass shares the claim by weight (dispatch._claim_shares) and locks each project's
        -- next runs up to its share rounded down, runs whose not_before is over first (retries,
        -- slots that waited for their jittered instant), then runs in slot order, each from the
        -- project's own index; a run another claim holds is skipped (concurrent claims never get
        -- the same run, nothing waits). The remainder of the shares goes one run each to the
        -- projects next in turn that still have one, in one statement. A project that had fewer
        -- runs to give than asked is held to what it gave, and the next pass shares the rest among
        -- the others: one project alone still gets full batches.
        LOOP
            need := room - (SELECT sum(t) FROM unnest(taken) t);
            EXIT WHEN need <= 0;
            walk := '{}';
            IF cardinality(projects) = 1 THEN  -- one project: no arithmetic to share
                quotas := ARRAY[least(allow[1] - taken[1], need)];
            ELSE
                shares := dispatch._claim_shares(room, weights, allow);
                -- With unequal weights, passes first take each share rounded down and learn which
                -- projects they emptied, until the shares rounded down are taken; the remainder,
                -- handed out one run each in order, then goes to the projects that still have runs
                -- (a project emptied by exactly its share would not show it, and the rest of its
                -- share would not go to the others).
                floors_pass := weights <> array_fill(weights[1], ARRAY[cardinality(weights)])
                               AND EXISTS (SELECT FROM unnest(shares, taken) AS f(f, t) WHERE f.f > f.t);
                -- what is still wanted of each up to its share rounded down, at most `need` in
                -- all, in order
                quotas := array_fill(0, ARRAY[cardinality(projects)]);
                FOR i IN 1..cardinality(projects) LOOP
                    quotas[i] := least(greatest(shares[i] - taken[i], 0), need);
                    need := need - quotas[i];
                END LOOP;
                IF NOT floors_pass THEN
                    -- Who may take one run of the remainder, in turn: the projects that have not
                    -- had one yet and may hold more, those whose share is under one run first (each
                    -- is then served within total weight / n claims, however heavy the others).
                    walk := ARRAY(SELECT i FROM generate_subscripts(projects, 1) AS g(i)
                                  WHERE taken[i] <= shares[i] AND shares[i] < allow[i]
                                  ORDER BY shares[i] > 0, i);
                END IF;
            END IF;
            spare := CASE WHEN walk = '{}' THEN 0 ELSE need END;
            EXIT WHEN (SELECT coalesce(sum(q), 0) FROM unnest(quotas) q) = 0 AND spare = 0;

            -- Each project's runs up to its quota: its waiting runs whose instant is over first,
            -- then its runs in slot order (the LIMIT stops the second scan: nothing past the quota
            -- is locked). Each run is locked, then judged with its schedule in the same statement
            -- (a schedule's row is read for the runs this claim holds, not for those it skipped).
            -- A project's waiting runs are its range of runs_project_not_before_idx, bounded by
            -- row comparisons that no other index can take (runs_not_before_idx, given the project
            -- as an equality, offers the same order over every project's waiting runs).
            SELECT array_agg((x.r).id), array_agg(x.tid), array_agg(u.n::integer), array_agg(dispatch._claim_verdict(x.r, s))
            INTO picked_ids, picked_tids, picked_of, picked_verdicts
            FROM unnest(projects, quotas) WITH ORDINALITY AS u(project_id, quota, n)
            CROSS JOIN LATERAL (
                SELECT * FROM (SELECT r, r.ctid AS tid FROM dispatch.runs r
                               WHERE (r.project_id, r.not_before) BETWEEN (u.project_id, '-infinity') AND (u.project_id, now())
                                 AND r.status = 'pending' AND r.not_before IS NOT NULL
                               ORDER BY r.project_id, r.not_before, r.id
                               LIMIT u.quota
                               FOR UPDATE SKIP LOCKED) waited
                UNION ALL
                SELECT * FROM (SELECT r, r.ctid AS tid FROM dispatch.runs r
                               WHERE r.project_id = u.project_id AND r.status = 'pending' AND r.not_before IS NULL
                               ORDER BY r.project_id, r.scheduled_for, r.id
                               LIMIT u.quota
                               FOR UPDATE SKIP LOCKED) in_slot_order
                LIMIT u.quota) x
            JOIN dispatch.schedules s ON s.id = (x.r).schedule_id
            WHERE u.quota > 0;
            -- The remainder: one run from each project in `walk` order until there is none left
            -- to give (the outer LIMIT stops the walk: no project after it is locked or read).
            IF spare > 0 THEN
                -- (a run this transaction locked is not skipped: the ones just taken are passed over)
                locked := coalesce(picked_ids, '{}');
                SELECT array_agg((x.r).id ORDER BY x.k), array_agg(x.tid ORDER BY x.k), array_agg(x.n ORDER BY x.k),
                       array_agg(dispatch._claim_verdict(x.r, s) ORDER BY x.k), max(x.k)
                INTO extra_ids, extra_tids, extra_of, extra_verdicts, walked
                FROM (SELECT y.r, y.tid, w.n, w.k::integer AS k
                      FROM unnest(walk) WITH ORDINALITY AS w(n, k)
                      CROSS JOIN LATERAL (
                          SELECT * FROM (SELECT r, r.ctid AS tid FROM dispatch.runs r
                                         WHERE (r.project_id, r.not_before)
                                               BETWEEN (projects[w.n], '-infinity') AND (projects[w.n], now())
                                           AND r.status = 'pending' AND r.not_before IS NOT NULL
                                           AND r.id <> ALL (locked)
                                         ORDER BY r.project_id, r.not_before, r.id
                                         LIMIT 1
                                         FOR UPDATE SKIP LOCKED) waited
                          UNION ALL
                          SELECT * FROM (SELECT r, r.ctid AS tid FROM dispatch.runs r
                                         WHERE r.project_id = projects[w.n] AND r.status = 'pending'
                                           AND r.not_before IS NULL AND r.id <> ALL (locked)
                                         ORDER BY r.project_id, r.scheduled_for, r.id
                                         LIMIT 1
                                         FOR UPDATE SKIP LOCKED) in_slot_order
                          LIMIT 1) y
                      LIMIT spare) x
                JOIN dispatch.schedules s ON s.id = (x.r).schedule_id;
                -- every project up to the last one that gave a run was asked for one (all of them
                -- when the remainder was not found)
                walked := CASE WHEN coalesce(cardinality(extra_ids), 0) < spare THEN cardinality(walk) ELSE walked END;
                FOR i IN 1..walked LOOP
                    quotas[walk[i]] := quotas[walk[i]] + 1;
                END LOOP;
                IF last_served IS NULL AND extra_of IS NOT NULL THEN
                    -- the next claim starts after the last project whose share was under one run
                    -- that got one, else after the last that got one: those after it come first then
                    last_served := coalesce((SELECT max(e.n) FILTER (WHERE shares[e.n] = 0) FROM unnest(extra_of) AS e(n)),
                                            extra_of[cardinality(extra_of)]);
                END IF;
                picked_ids := picked_ids || extra_ids;
                picked_tids := picked_tids || extra_tids;
                picked_of := picked_of || extra_of;
                picked_verdicts := picked_verdicts || extra_verdicts;
            ELSIF last_served IS NULL AND NOT floors_pass THEN
                last_served := cardinality(projects);  -- no remainder: the next claim starts after them all
            END IF;
            -- a pass that found nothing goes on to share what the projects that had nothing left
            -- could not give among the others
            IF picked_ids IS NOT NULL THEN
                -- Some runs are not handed out (dispatch._claim_verdict): late ones end error,
                -- stale ones end skipped. The transaction that stopped a schedule ended every run
                -- it could see; this ends those that became pending behind its back (a release
                -- racing it).
                SELECT array_agg(c.id) FILTER (WHERE c.verdict = 'live'), array_agg(c.id) FILTER (WHERE c.verdict = 'late'),
                       array_agg(c.id) FILTER (WHERE c.verdict = 'stale')
                INTO live_ids, late_ids, stale_ids
                FROM unnest(picked_ids, picked_verdicts) AS c(id, verdict);

                IF late_ids IS NOT NULL OR stale_ids IS NOT NULL THEN
                    PERFORM dispatch._end_late_retries(late_ids);
                    PERFORM dispatch._end_stale_runs(stale_ids, wait => false);
                    ended := true;
                END IF;
                -- runs of a function whose breaker is open wait, but for its probe (39_breakers.sql)
                live_ids := dispatch._hold_for_breakers(live_ids);
                IF live_ids IS NOT NULL AND live_ids <> '{}' THEN
                    -- started where the pick found them: locked since, and moved by nothing above
                    SELECT array_agg(c.tid) INTO live_tids
                    FROM unnest(picked_ids, picked_tids) AS c(id, tid)
                    WHERE c.id = ANY (live_ids);
                    RETURN QUERY SELECT * FROM dispatch._start_runs(live_tids, claim_runs.worker, claim_runs.lease,
                                                                    claim_runs.default_timeout);
                    GET DIAGNOSTICS started = ROW_COUNT;
                    IF started < cardinality(live_tids) THEN
                        -- A stop that committed after the pick's snapshot: _start_runs, which reads
                        -- the schedules afresh, left those runs pending; they end like any stale run.
                        PERFORM dispatch._end_stale_runs(
                            ARRAY(SELECT r.id FROM dispatch.runs r WHERE r.id = ANY (live_ids) AND r.status = 'pending'),
                            wait => false);
                        ended := true;
                    END IF;
                END IF;
            END IF;

            -- What each project gave counts against the claim (runs ended or held by a breaker
            -- included); one that gave fewer than asked has no more to give: it is held to that,
            -- and so is one that the floors pass emptied.
            was_allowed := allow;
            SELECT array_agg(x.took + x.got ORDER BY x.n),
                   array_agg(CASE WHEN x.got < x.q THEN x.took + x.got
                                  WHEN floors_pass AND x.got > 0
                                       AND NOT EXISTS (SELECT FROM dispatch.runs r
                                                       WHERE r.project_id = x.project_id AND r.status = 'pending'
                                                         AND r.not_before IS NULL)
                                       AND NOT EXISTS (SELECT FROM dispatch.runs r
                                                       WHERE (r.project_id, r.not_before)
                                                             BETWEEN (x.project_id, '-infinity') AND (x.project_id, now())
                                                         AND r.status = 'pending' AND r.not_before IS NOT NULL)
                                  THEN x.took + x.got
                                  ELSE x.a END ORDER BY x.n)
            INTO taken, allow
            FROM (SELECT u.n, u.a, u.q, u.took, u.project_id,
                         coalesce(cardinality(array_positions(picked_of, u.n::integer)), 0) AS got
                  FROM unnest(allow, quotas, taken, projects) WITH ORDINALITY AS u(a, q, took, project_id, n)) x;
            -- (each pass takes runs or learns of a project that has no more: never the same pass twice)
            EXIT WHEN picked_ids IS NULL AND allow = was_allowed;
        END LOOP;

        got := (SELECT sum(t) FROM unnest(taken) t);
        IF got > 0 THEN
            -- where the next claim of this session starts
            cursor_to := projects[coalesce(last_served, cardinality(projects))];
            room := room - got;
        END IF;
        -- full, or every claimable project listed and tried (each round tries at least one more)
        EXIT rounds WHEN room <= 0 OR (listed < want AND NOT cut);
    END LOOP;

    IF cursor_to IS NOT NULL THEN
        PERFORM set_config('dispatch.claim_cursor', cursor_to, false);
    END IF;
    IF ended THEN
        -- fewer runs than asked for although more may be pending: have the claimers come back
        PERFORM pg_notify('dispatch', 'ended');
    END IF;
END
$$;
COMMENT ON FUNCTION dispatch.claim_runs(text, integer, interval, interval) IS
    'Move up to max_runs pending runs of live schedules to running for worker and return what is needed to invoke them (fire_at: the instant the run fires at, its slot plus the schedule''s jitter offset; kind: scheduled, manual or backfill, last so that callers reading by position are unaffected): runs whose not_before is over first (retries, slots that waited for their jittered instant), then runs in slot order (FOR UPDATE SKIP LOCKED: concurrent callers never get the same run, nothing waits). attempt is the fencing token to pass to complete_runs or release_runs: each claim of a run gets a higher one, a claim handed back included. timeout is the invocation timeout to apply: the schedule''s, else default_timeout (the caller''s). lease_until is now + lease, plus the schedule''s timeout minus default_timeout when the schedule has its own: lease must be longer than default_timeout (at most 1 day; 22023 otherwise): give default_timeout plus a margin. Runs that must not start end instead: a retry past the next slot or beyond max_attempts (error), a first attempt past misfire_grace, a run of a stopped schedule (skipped).';
