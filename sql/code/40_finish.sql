-- Finishing runs: the common tail of every transition that ends a run (complete_runs, lease
-- expiry, a stopped schedule's pending runs, a back-off period), in one place.
--
--   _finish_runs(runs)  = _audit_runs   one audit row per run (invariant 4)
--                       + _settle_runs  the schedule: last_*, and next_run_at moved past the
--                                       finished slot when it is still on it (invariant 2)
--                       + _follow_up    what the run policies start when a run ends: the run
--                                       buffered behind it (overlap buffer_one), the next
--                                       missed slot (catchup all)
--                       + _runs_failed  an event for each failed run, and the schedules that
--                                       pause themselves after failing (pause_after_failures)
--
-- Every caller already holds the row locks of the runs' schedules (taken with SKIP LOCKED, or by
-- the caller's own UPDATE of the schedule), so nothing here waits on another transaction.

-- Where the next slot cannot be computed (its zone vanished from the tz database after an
-- upgrade, say), NULL: the caller backs the schedule off instead of failing the whole batch.
CREATE OR REPLACE FUNCTION dispatch._next_slot(spec dispatch.cron_spec, after timestamptz, tz text)
RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN dispatch.cron_spec_next(spec, after, tz);
EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'cannot compute the next slot of % in %: %', spec, tz, SQLERRM;
    RETURN NULL;
END
$$;

-- PL/pgSQL for its plan cache: an SQL function's statement is planned at every call.
CREATE OR REPLACE FUNCTION dispatch._audit_runs(finished dispatch.runs[])
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- its generic plan (see dispatch._advance_schedules)
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    INSERT INTO dispatch.audit_log (actor_id, project_id, action, metadata)
    SELECT NULL, s.project_id, 'schedule.run.' || f.status,
           -- The run's identity (never NULL), then what only some runs have. The common case, a
           -- first attempt that ended without an error, has none of it: no null to strip, no
           -- attempts to list, which cost twice the rest (about 12 of 18 us a run). The object is
           -- the same as stripping the whole.
           jsonb_build_object(
               'scheduleId', f.schedule_id,
               'requestId', f.request_id,
               'functionName', s.function_name,
               'runId', f.id,
               'scheduledFor', f.scheduled_for,
               'attempt', f.attempt)
           || CASE WHEN f.error IS NULL AND f.earlier_attempts IS NULL THEN '{}'
              ELSE jsonb_strip_nulls(jsonb_build_object(
                  'error', f.error,
                  -- every attempt, when there was more than one; the run's own outcome is one
                  -- more only when an invocation ended it (a run ended while it waited for its
                  -- retry made none: its last attempt is already listed)
                  'attempts', f.earlier_attempts || CASE
                      WHEN f.attempt - f.released > jsonb_array_length(coalesce(f.earlier_attempts, '[]'))
                      THEN jsonb_build_array(jsonb_build_object(
                          'attempt', f.attempt, 'status', f.status, 'error', f.error, 'httpStatus', f.http_status,
                          'durationMs', f.duration_ms, 'at', f.finished_at))
                      ELSE '[]' END))
              END
    FROM unnest(_audit_runs.finished) f
    JOIN dispatch.schedules s ON s.id = f.schedule_id;
END
$$;

-- The schedule side of finished runs, in one statement. `guarded` computes next slots with
-- dispatch._next_slot (a subtransaction per call, about six times the cost): _settle_runs
-- asks for it only when the unguarded statement failed.
CREATE OR REPLACE FUNCTION dispatch._advance_schedules(finished dispatch.runs[], guarded boolean)
RETURNS TABLE (run_id bigint, advanced boolean, follow_up boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Its generic plan, never a custom one per call: the array's size is all a custom plan knows
-- more, planning this statement afresh at each call cost more than running it for a small batch.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    -- the statement's clock: a transaction that began before the slot must not land on it
    clock constant timestamptz := clock_timestamp();
BEGIN
    RETURN QUERY
    WITH done AS (
        SELECT * FROM unnest(_advance_schedules.finished)
    ), latest AS MATERIALIZED (
        -- per schedule, the latest run of this batch (what last_* report) and the latest of its
        -- own slots (what next_run_at must move past; NULL when only manual or backfill runs
        -- ended, which leave the slots alone)
        SELECT DISTINCT ON (d.schedule_id)
               d.schedule_id, d.status, d.error, coalesce(d.claimed_at, d.finished_at) AS ran_at,
               -- when the run was first claimed: from then on it was open and running
               CASE WHEN d.kind = 'scheduled'
                    THEN coalesce((d.earlier_attempts -> 0 ->> 'claimedAt')::timestamptz, d.claimed_at) END AS started,
               max(d.scheduled_for) FILTER (WHERE d.kind = 'scheduled') OVER (PARTITION BY d.schedule_id)
                   AS scheduled_for
        FROM done d
        ORDER BY d.schedule_id, d.scheduled_for DESC
    ), sched AS MATERIALIZED (
        -- behind: next_run_at is on (or, after a slot marked ahead of the clock, before) a
        -- finished slot, so it moves; an edit mid-flight that put it later wins. NULL for a
        -- stopped schedule, which has no next slot. It moves to the first slot after the
        -- clock: the slots that came due while the run was open are the overlap policy's, and
        -- skip drops them. Under catchup all, to the next slot when that came due before the
        -- run started (missed while nothing ran: caught up, one at a time).
        SELECT s.id, s.ctid AS tid, s.cron_expression, s.cron_spec, s.timezone,
               greatest(s.last_slot, l.scheduled_for) AS last_slot,
               s.next_run_at <= greatest(s.last_slot, l.scheduled_for) AS behind,
               CASE WHEN s.catchup = 'all'
                         AND (l.started IS NULL
                              OR CASE WHEN _advance_schedules.guarded
                                      THEN dispatch._next_slot(s.cron_spec, greatest(s.last_slot, l.scheduled_for), s.timezone)
                                      ELSE dispatch.cron_spec_next(s.cron_spec, greatest(s.last_slot, l.scheduled_for), s.timezone)
                                 END <= l.started)
                    THEN greatest(s.last_slot, l.scheduled_for)
                    ELSE greatest(s.last_slot, l.scheduled_for, clock) END AS after,
               s.overlap = 'buffer_one' OR s.catchup = 'all' OR (l.scheduled_for IS NULL AND s.next_run_at <= clock)
               OR EXISTS (SELECT 1 FROM dispatch.runs w
                          WHERE w.schedule_id = s.id AND w.status = 'pending' AND dispatch._waits_its_turn(w))
                   AS follow_up
        FROM dispatch.schedules s
        JOIN latest l ON l.schedule_id = s.id
    ), slots AS MATERIALIZED (
        -- runs finishing together mostly share expression, zone and start: compute each once
        -- (MATERIALIZED, or PostgreSQL would inline the call back into every row)
        SELECT u.cron_spec, u.timezone, u.after,
               CASE WHEN _advance_schedules.guarded
                    THEN dispatch._next_slot(u.cron_spec, u.after, u.timezone)
                    ELSE dispatch.cron_spec_next(u.cron_spec, u.after, u.timezone)
               END AS next_at
        FROM (SELECT DISTINCT x.cron_spec, x.timezone, x.after FROM sched x WHERE x.behind) u
    ), moved AS (
        UPDATE dispatch.schedules s
        -- backing off: an hour after the later of the clock and the last finished slot
        SET next_run_at = CASE WHEN x.behind THEN coalesce(n.next_at, greatest(x.after, clock) + interval '1 hour')
                               ELSE s.next_run_at END,
            backoff_reason = CASE WHEN x.behind IS NOT TRUE THEN s.backoff_reason
                                  WHEN n.next_at IS NULL
                                  THEN format('cannot compute the next slot of "%s" in time zone %s (see the server log); trying again every hour',
                                              x.cron_expression, x.timezone)
                             END,
            last_slot = x.last_slot,
            last_run_at = l.ran_at,
            last_status = l.status,
            last_error = l.error
        FROM sched x
        JOIN latest l ON l.schedule_id = x.id
        LEFT JOIN slots n ON x.behind AND n.cron_spec = x.cron_spec AND n.timezone = x.timezone AND n.after = x.after
        WHERE s.ctid = x.tid
    ), gaps AS (
        -- the slots passed over, when the run finished at least a slot's length after its own:
        -- they came due while it was open (invariant 8). Looked for only past the shortest
        -- spacing the rule can have, read off its fields (a minute when the minute field has
        -- several values, an hour when the hour field has, else 23 hours, a day across DST):
        -- a run that finished within it passed over nothing, and computing its next slot from
        -- its own once more would double what advancing costs.
        SELECT CASE WHEN count(*) > 0
                    THEN dispatch._record_gaps(array_agg(x.id), array_agg(x.last_slot), array_agg(n.next_at), 'overlap')
               END AS n
        FROM sched x
        JOIN slots n ON n.cron_spec = x.cron_spec AND n.timezone = x.timezone AND n.after = x.after
        WHERE x.behind AND n.next_at IS NOT NULL AND x.after > x.last_slot
          AND clock - x.last_slot >= CASE
                WHEN (x.cron_spec).every_us IS NOT NULL THEN (x.cron_spec).every_us * interval '1 microsecond'
                WHEN bit_count((x.cron_spec).minutes::bit(64)) > 1 THEN interval '1 minute'
                WHEN bit_count((x.cron_spec).hours::bit(32)) > 1 THEN interval '1 hour'
                ELSE interval '23 hours' END
    )
    SELECT d.id, coalesce(x.behind, false), x.follow_up
    FROM done d JOIN sched x ON x.id = d.schedule_id
    CROSS JOIN gaps;
END
$$;

CREATE OR REPLACE FUNCTION dispatch._settle_runs(finished dispatch.runs[])
RETURNS TABLE (run_id bigint, advanced boolean, follow_up boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ids bigint[];
    advances boolean[];
    follow_ups boolean[];
BEGIN
    -- Collected into arrays inside the block, returned after it: rows a failed attempt had
    -- already returned would otherwise stay in the result.
    BEGIN
        SELECT array_agg(a.run_id), array_agg(a.advanced), array_agg(a.follow_up) INTO ids, advances, follow_ups
        FROM dispatch._advance_schedules(_settle_runs.finished, false) a;
    EXCEPTION WHEN OTHERS THEN
        SELECT array_agg(a.run_id), array_agg(a.advanced), array_agg(a.follow_up) INTO ids, advances, follow_ups
        FROM dispatch._advance_schedules(_settle_runs.finished, true) a;
    END;
    RETURN QUERY SELECT * FROM unnest(ids, advances, follow_ups);
END
$$;

-- Schedules whose run just ended, under overlap buffer_one or catchup all, with backfill runs
-- waiting, or whose manual run ended while their own slot was due (their rows held by the
-- caller): the run buffered behind the one that ended may start; a schedule that catches up, or
-- whose slot waited, gets it marked now rather than at the next tick, a minute away; then the
-- next backfill run. Returns how many runs became claimable.
CREATE OR REPLACE FUNCTION dispatch._follow_up(schedule_ids uuid[])
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock constant timestamptz := clock_timestamp();
    ready integer;
    sid uuid;
BEGIN
    -- The waiting run starts, at its jittered instant if that is still ahead (a slot never fires
    -- before its fire_at; one marked ahead of the clock by tick(horizon) without a jitter was
    -- made due by whoever marked it). The slots that came due while it waited (the buffer was full) are
    -- dropped under catchup latest: the schedule moves on to the first slot after the clock.
    WITH released AS (
        UPDATE dispatch.runs r
        SET not_before = CASE WHEN r.fire_at > r.scheduled_for AND r.fire_at > clock THEN r.fire_at END
        WHERE r.schedule_id = ANY (_follow_up.schedule_ids) AND r.status = 'pending' AND r.not_before = 'infinity'
          AND r.kind <> 'backfill'
          AND NOT EXISTS (SELECT 1 FROM dispatch.runs o
                          WHERE o.schedule_id = r.schedule_id AND o.status IN ('pending', 'running')
                            AND o.id <> r.id AND o.not_before IS DISTINCT FROM 'infinity')
        RETURNING r.schedule_id, r.scheduled_for
    ), moved AS (
        UPDATE dispatch.schedules s
        SET next_run_at = coalesce(dispatch._next_slot(s.cron_spec,
                                                       CASE WHEN s.catchup = 'all' THEN x.scheduled_for
                                                            ELSE greatest(x.scheduled_for, clock) END,
                                                       s.timezone),
                                   s.next_run_at)
        FROM released x
        WHERE s.id = x.schedule_id AND s.next_run_at <= x.scheduled_for
        -- (a bounded rule past its last slot ended the schedule: the gap goes up to that slot)
        RETURNING s.id, x.scheduled_for,
                  CASE WHEN s.ended_at IS NOT NULL THEN timestamptz 'infinity' ELSE s.next_run_at END AS next_run_at
    ), gaps AS (
        -- the slots dropped while the run waited: a gap (overlap)
        SELECT CASE WHEN count(*) > 0
                    THEN dispatch._record_gaps(array_agg(m.id), array_agg(m.scheduled_for), array_agg(m.next_run_at),
                                               'overlap')
               END AS n
        FROM moved m
    )
    SELECT count(*) INTO ready FROM released CROSS JOIN gaps;
    FOR sid IN
        SELECT s.id FROM dispatch.schedules s
        WHERE s.id = ANY (_follow_up.schedule_ids) AND s.next_run_at <= clock
          AND (s.catchup = 'all'
               OR NOT EXISTS (SELECT 1 FROM dispatch.runs o
                              WHERE o.schedule_id = s.id AND o.status IN ('pending', 'running')
                                AND NOT dispatch._waits_its_turn(o)))
    LOOP
        ready := ready + dispatch._tick_schedule_guarded(sid, clock);
    END LOOP;
    -- Then the oldest backfill run waiting its turn, when nothing of the schedule is open: its
    -- own slots go first, so a backfill delays them by one run at most.
    WITH nominee AS (
        SELECT DISTINCT ON (r.schedule_id) r.id
        FROM dispatch.runs r
        WHERE r.schedule_id = ANY (_follow_up.schedule_ids) AND r.status = 'pending'
          AND dispatch._waits_its_turn(r)
          AND NOT EXISTS (SELECT 1 FROM dispatch.runs o
                          WHERE o.schedule_id = r.schedule_id AND o.status IN ('pending', 'running')
                            AND o.not_before IS DISTINCT FROM 'infinity')
        ORDER BY r.schedule_id, r.scheduled_for
    ), released AS (
        UPDATE dispatch.runs r SET not_before = NULL FROM nominee n WHERE r.id = n.id
        RETURNING 1
    )
    SELECT ready + count(*) INTO ready FROM released;
    IF ready > 0 THEN
        PERFORM pg_notify('dispatch', json_build_object('marked', ready)::text);
    END IF;
    RETURN ready;
END
$$;

CREATE OR REPLACE FUNCTION dispatch._finish_runs(finished dispatch.runs[])
RETURNS TABLE (run_id bigint, advanced boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ids bigint[];
    advances boolean[];
    follow_ups uuid[];
BEGIN
    IF coalesce(cardinality(_finish_runs.finished), 0) = 0 THEN
        RETURN;
    END IF;
    PERFORM dispatch._audit_runs(_finish_runs.finished);
    SELECT array_agg(a.run_id), array_agg(a.advanced),
           array_agg(DISTINCT f.schedule_id) FILTER (WHERE a.follow_up)
    INTO ids, advances, follow_ups
    FROM dispatch._settle_runs(_finish_runs.finished) a
    JOIN unnest(_finish_runs.finished) f ON f.id = a.run_id;
    IF follow_ups IS NOT NULL THEN
        PERFORM dispatch._follow_up(follow_ups);
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(_finish_runs.finished) f WHERE f.status IN ('error', 'lost')) THEN
        PERFORM dispatch._runs_failed(_finish_runs.finished);
    END IF;
    RETURN QUERY SELECT * FROM unnest(ids, advances);
END
$$;

-- A backfill run waiting its turn (dispatch._follow_up lets one go at a time): it holds nothing,
-- so every count of a schedule's open runs leaves it out. Never NULL (not_before is NULL once
-- a run may go). No SET clause, so every operator is qualified: the planner inlines it.
CREATE OR REPLACE FUNCTION dispatch._waits_its_turn(r dispatch.runs)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT r.kind OPERATOR(pg_catalog.=) 'backfill' AND r.not_before IS NOT NULL
       AND r.not_before OPERATOR(pg_catalog.=) CAST('infinity' AS pg_catalog.timestamptz)
$$;
COMMENT ON FUNCTION dispatch._waits_its_turn(dispatch.runs) IS
    'Whether a run is a backfill run waiting its turn (not_before infinity): it holds nothing of its schedule.';

-- What stopped a schedule: deleted, paused or disabled; NULL while it is live. No SET clause, so
-- that the planner inlines it like the two functions around it.
CREATE OR REPLACE FUNCTION dispatch._stopped_as(s dispatch.schedules)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN s.deleted_at IS NOT NULL THEN 'deleted'
                WHEN s.paused_at IS NOT NULL THEN 'paused'
                WHEN NOT s.enabled THEN 'disabled' END
$$;
COMMENT ON FUNCTION dispatch._stopped_as(dispatch.schedules) IS
    'What stopped a schedule (deleted, paused or disabled), or NULL while it is live: the word the run errors name.';

-- A first attempt (no invocation went out yet) of a slot that can no longer start within its schedule's misfire_grace of its
-- fire instant.
-- Retries and attempts after a lost lease are not held to it (the first attempt started in
-- time), nor manual and backfill runs, which an operator asked for.
-- No SET clause, unlike the others, so every operator is qualified: the planner inlines it into
-- the claim's statement. A SET would make it a call per row, with both rows built as composite
-- values for it (0.3 ms on claim_runs(100)).
CREATE OR REPLACE FUNCTION dispatch._missed(r dispatch.runs, s dispatch.schedules)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT r.attempt OPERATOR(pg_catalog.=) r.released AND r.kind OPERATOR(pg_catalog.=) 'scheduled'
       AND s.misfire_grace IS NOT NULL
       AND (pg_catalog.now() OPERATOR(pg_catalog.-) COALESCE(r.fire_at, r.scheduled_for))
           OPERATOR(pg_catalog.>) s.misfire_grace
$$;

-- Pending runs that must not be invoked end here: those whose schedule stopped, and those that
-- could not start within their schedule's misfire_grace (skipped, "missed by"). A stopped
-- schedule's run ends with what is known of it (invariant 7): skipped when no invocation went
-- out; error, its last outcome, when it waited for a retry after a failed attempt; lost only when
-- the last attempt's lease expired, since that one may have run.
-- wait => true is for the transaction that stops the schedule (its trigger): it waits for a
-- claim in progress, so that a run claimed before the stop commits stays claimed. Everyone
-- else passes false and leaves alone what another transaction holds.
-- stopped names the stop for a schedule that is live again (the trigger of a resume or an
-- enable): its runs end as that stop would have ended them.
-- (An install over the version without stopped drops that one: calls with two arguments are
-- this one's.)
DROP FUNCTION IF EXISTS dispatch._end_stale_runs(bigint[], boolean);
CREATE OR REPLACE FUNCTION dispatch._end_stale_runs(run_ids bigint[], wait boolean, stopped text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ids bigint[];
    ended dispatch.runs[];
BEGIN
    IF wait THEN
        SELECT array_agg(l.id) INTO ids
        FROM (SELECT r.id
              FROM dispatch.runs r
              JOIN dispatch.schedules s ON s.id = r.schedule_id
              WHERE r.id = ANY (_end_stale_runs.run_ids) AND r.status = 'pending'
                AND (_end_stale_runs.stopped IS NOT NULL
                     OR NOT (s.enabled AND s.deleted_at IS NULL AND s.paused_at IS NULL)
                     OR dispatch._missed(r, s))
              FOR UPDATE OF r) l;
    ELSE
        SELECT array_agg(l.id) INTO ids
        FROM (SELECT r.id
              FROM dispatch.runs r
              JOIN dispatch.schedules s ON s.id = r.schedule_id
              WHERE r.id = ANY (_end_stale_runs.run_ids) AND r.status = 'pending'
                AND (_end_stale_runs.stopped IS NOT NULL
                     OR NOT (s.enabled AND s.deleted_at IS NULL AND s.paused_at IS NULL)
                     OR dispatch._missed(r, s))
              FOR UPDATE OF r SKIP LOCKED
              FOR NO KEY UPDATE OF s SKIP LOCKED) l;
    END IF;
    IF ids IS NULL THEN
        RETURN 0;
    END IF;

    WITH stale AS (
        UPDATE dispatch.runs r
        SET status = CASE WHEN r.attempt = r.released THEN 'skipped'
                          WHEN r.earlier_attempts -> -1 ->> 'status' = 'lost' THEN 'lost'
                          ELSE 'error' END,
            finished_at = now(),
            not_before = NULL,
            error = left(CASE
                WHEN k.stopped IS NULL
                THEN format('%s (misfire_grace %s)',
                            dispatch._missed_by(now() - coalesce(r.fire_at, r.scheduled_for)), s.misfire_grace)
                WHEN r.attempt = r.released THEN format('schedule %s before the run was claimed', k.stopped)
                WHEN r.earlier_attempts -> -1 ->> 'status' = 'lost'
                THEN format('schedule %s before the run was retried (an earlier attempt may have run)', k.stopped)
                ELSE format('%s; not retried: schedule %s during the back-off', coalesce(r.error, 'failed'), k.stopped)
                END, 500)
        FROM dispatch.schedules s
        CROSS JOIN LATERAL (SELECT coalesce(dispatch._stopped_as(s), _end_stale_runs.stopped) AS stopped) k
        WHERE r.id = ANY (ids) AND s.id = r.schedule_id
        RETURNING r
    )
    SELECT array_agg(k.r) INTO ended FROM stale k;
    PERFORM dispatch._finish_runs(ended);
    RETURN cardinality(ended);
END
$$;
