-- Runs and their state transitions:
--
--   (tick marks a due slot) ──► pending ──claim_runs──► running ──complete_run──► ok | error
--                                  ▲  │                    │
--                 release_runs,    │  └─schedule disabled──┼──► skipped
--                 lease expiry ────┘     or deleted        └─lease expiry, last attempt──► lost
--
-- Every finished run (ok, error, skipped, lost) gets exactly one audit row and the guarded
-- advance of its schedule, both in dispatch._runs_finished.

CREATE TABLE dispatch.runs (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    schedule_id   uuid NOT NULL REFERENCES dispatch.schedules (id) ON DELETE CASCADE,
    scheduled_for timestamptz NOT NULL,
    status        text NOT NULL DEFAULT 'pending',
    request_id    text NOT NULL DEFAULT 'sched_' || gen_random_uuid(),
    attempt       integer NOT NULL DEFAULT 0,
    worker        text,
    claimed_at    timestamptz,
    lease_until   timestamptz,
    finished_at   timestamptz,
    error         text,
    http_status   integer,
    duration_ms   integer,
    created_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT runs_slot_key UNIQUE (schedule_id, scheduled_for),
    CONSTRAINT runs_status_check
        CHECK (status IN ('pending', 'running', 'ok', 'error', 'skipped', 'lost')),
    CONSTRAINT runs_running_has_lease_check
        CHECK (status <> 'running' OR (worker IS NOT NULL AND lease_until > claimed_at)),
    CONSTRAINT runs_finished_at_check
        CHECK ((status IN ('pending', 'running')) = (finished_at IS NULL)),
    CONSTRAINT runs_error_length_check
        CHECK (length(error) <= 500),
    CONSTRAINT runs_attempt_check
        CHECK (attempt >= 0)
);
COMMENT ON TABLE dispatch.runs IS 'One row per fired slot of a schedule.';
COMMENT ON COLUMN dispatch.runs.scheduled_for IS 'The slot: the schedule''s next_run_at when dispatch.tick marked it.';
COMMENT ON COLUMN dispatch.runs.status IS
    'pending: marked by dispatch.tick, or handed back (release_runs, expired lease). '
    'running: claimed by dispatch.claim_runs. ok/error: recorded by dispatch.complete_run. '
    'skipped: its schedule was disabled or deleted before it was invoked. '
    'lost: its lease expired on the last attempt.';
COMMENT ON COLUMN dispatch.runs.request_id IS
    'sched_<uuid>, sent as X-Request-Id and Idempotency-Key; stable across the attempts of this run.';
COMMENT ON COLUMN dispatch.runs.attempt IS 'Claims so far; a claim increments it, release_runs gives one back.';
COMMENT ON COLUMN dispatch.runs.worker IS 'Listener that holds (or last held) the run; only it may complete the run.';
COMMENT ON COLUMN dispatch.runs.lease_until IS 'A running run whose lease passes is retried or lost by dispatch.tick.';
COMMENT ON COLUMN dispatch.runs.error IS 'Why the run failed, was skipped or lost; at most 500 characters.';

-- A queue table: every run leaves the pending and running indexes within seconds, and the
-- dead entries it leaves slow down the next claims until vacuum removes them. Vacuum it after
-- 1 % of its rows changed rather than the default 20 %.
ALTER TABLE dispatch.runs SET (autovacuum_vacuum_scale_factor = 0.01,
                               autovacuum_vacuum_insert_scale_factor = 0.01,
                               autovacuum_analyze_scale_factor = 0.02);

-- Claiming reads pending runs in slot order; expiry reads running runs by lease. Both stay
-- small however much history the table holds.
CREATE INDEX runs_pending_idx ON dispatch.runs (scheduled_for, id) WHERE status = 'pending';
CREATE INDEX runs_running_lease_idx ON dispatch.runs (lease_until) WHERE status = 'running';
-- No overlap: a schedule has at most one run in flight.
CREATE UNIQUE INDEX runs_one_open_per_schedule_key ON dispatch.runs (schedule_id)
    WHERE status IN ('pending', 'running');

-- Where the next slot cannot be computed (its zone vanished from the tz database after an
-- upgrade, say), NULL: the caller backs the schedule off instead of failing the whole batch.
CREATE FUNCTION dispatch._next_slot(spec dispatch.cron_spec, after timestamptz, tz text)
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

-- The common tail of every finished run (ok, error, skipped, lost), for a batch: advance each
-- schedule still waiting on its run's slot (a user edit mid-flight wins) to the first slot
-- after max(scheduled_for, now()), record last_*, write one audit row per run.
-- Returns each run's id and whether its schedule advanced.
CREATE FUNCTION dispatch._runs_finished(finished dispatch.runs[])
RETURNS TABLE (run_id bigint, advanced boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    WITH done AS (
        SELECT * FROM unnest(_runs_finished.finished)
    ), locked AS MATERIALIZED (
        -- lock the schedules in id order (no deadlock with another batch or a bulk edit), then
        -- compute each next slot once: a CTE that is not MATERIALIZED would be inlined per row
        SELECT s.id, s.project_id, s.function_name, s.next_run_at, s.cron_spec, s.timezone
        FROM dispatch.schedules s
        WHERE s.id IN (SELECT d.schedule_id FROM done d)
        ORDER BY s.id
        FOR NO KEY UPDATE
    ), nexts AS MATERIALIZED (
        SELECT d.id, d.schedule_id, d.status, d.error, d.request_id, d.scheduled_for, d.attempt,
               coalesce(d.claimed_at, d.finished_at) AS ran_at, l.project_id, l.function_name,
               l.next_run_at = d.scheduled_for AS waiting,
               CASE WHEN l.next_run_at = d.scheduled_for
                    THEN dispatch._next_slot(l.cron_spec, greatest(d.scheduled_for, now()), l.timezone)
               END AS next_at
        FROM done d
        JOIN locked l ON l.id = d.schedule_id
    ), advance AS (
        UPDATE dispatch.schedules s
        SET next_run_at = CASE WHEN n.waiting THEN coalesce(n.next_at, now() + interval '1 hour')
                               ELSE s.next_run_at END,
            last_run_at = n.ran_at,
            last_status = n.status,
            last_error = CASE WHEN n.waiting AND n.next_at IS NULL
                              THEN 'cannot compute the next slot (see the server log), retrying in 1 hour'
                              ELSE n.error END
        FROM nexts n
        WHERE s.id = n.schedule_id
    ), audit AS (
        INSERT INTO dispatch.audit_log (actor_id, project_id, action, metadata)
        SELECT NULL, n.project_id, 'schedule.run.' || n.status,
               jsonb_strip_nulls(jsonb_build_object(
                   'scheduleId', n.schedule_id,
                   'requestId', n.request_id,
                   'functionName', n.function_name,
                   'runId', n.id,
                   'scheduledFor', n.scheduled_for,
                   'attempt', n.attempt,
                   'error', n.error))
        FROM nexts n
    )
    SELECT n.id, coalesce(n.waiting, false) FROM nexts n;
END
$$;

CREATE FUNCTION dispatch.expire_leases()
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    finished dispatch.runs[];
    requeued integer;
BEGIN
    -- Attempts left and the schedule still live: retry under the same request id.
    UPDATE dispatch.runs x
    SET status = 'pending', worker = NULL, claimed_at = NULL, lease_until = NULL,
        error = left(format('lease of %s expired on attempt %s', x.worker, x.attempt), 500)
    FROM dispatch.schedules s
    WHERE x.status = 'running' AND x.lease_until < now()
      AND s.id = x.schedule_id AND x.attempt < s.max_attempts AND s.next_run_at IS NOT NULL;
    GET DIAGNOSTICS requeued = ROW_COUNT;

    WITH ended AS (
        UPDATE dispatch.runs x
        SET status = CASE WHEN s.next_run_at IS NULL THEN 'skipped' ELSE 'lost' END,
            finished_at = now(),
            error = left(CASE WHEN s.next_run_at IS NULL
                              THEN format('lease of %s expired and the schedule is no longer enabled', x.worker)
                              ELSE format('lease of %s expired on attempt %s of %s', x.worker, x.attempt, s.max_attempts)
                         END, 500)
        FROM dispatch.schedules s
        WHERE x.status = 'running' AND x.lease_until < now() AND s.id = x.schedule_id
        RETURNING x
    )
    SELECT array_agg(e.x) INTO finished FROM ended e;
    IF finished IS NOT NULL THEN
        PERFORM dispatch._runs_finished(finished);
    END IF;
    RETURN requeued;
END
$$;
COMMENT ON FUNCTION dispatch.expire_leases() IS
    'Hand running runs whose lease passed back to pending (same request_id), or end them lost after the schedule''s max_attempts (skipped if the schedule was disabled meanwhile). Returns how many went back to pending. Called by dispatch.tick.';

CREATE FUNCTION dispatch.tick(now timestamptz DEFAULT now())
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    marked integer;
    requeued integer;
BEGIN
    -- One tick at a time: two marking the same slots in different orders could deadlock
    -- (so no ORDER BY is needed below), and a queued tick is cheap.
    PERFORM pg_advisory_xact_lock(hashtext('dispatch.tick'));
    requeued := dispatch.expire_leases();

    INSERT INTO dispatch.runs (schedule_id, scheduled_for)
    SELECT s.id, s.next_run_at
    FROM dispatch.schedules s
    WHERE s.next_run_at <= tick.now
    ON CONFLICT DO NOTHING;  -- a slot already marked, or a run still open for the schedule
    GET DIAGNOSTICS marked = ROW_COUNT;

    IF marked + requeued > 0 THEN
        PERFORM pg_notify('dispatch', json_build_object('marked', marked, 'requeued', requeued)::text);
    END IF;
    RETURN marked;
END
$$;
COMMENT ON FUNCTION dispatch.tick(timestamptz) IS
    'Mark every live schedule due at or before "now" as a pending run (idempotent per slot), expire leases by the real clock, NOTIFY dispatch when there is work. Returns how many runs it marked. Run every minute by the pg_cron job dispatch-tick and by listeners when a slot comes due.';

CREATE FUNCTION dispatch.claim_runs(worker text, max_runs integer, lease interval DEFAULT interval '60 seconds')
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
-- planning this statement costs more than running it.
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH picked AS (
        SELECT r.id
        FROM dispatch.runs r
        WHERE r.status = 'pending'
        ORDER BY r.scheduled_for, r.id
        LIMIT claim_runs.max_runs
        FOR UPDATE SKIP LOCKED
    )
    UPDATE dispatch.runs r
    SET status = 'running',
        worker = claim_runs.worker,
        claimed_at = now(),
        lease_until = now() + claim_runs.lease,
        attempt = r.attempt + 1
    FROM picked, dispatch.schedules s
    WHERE r.id = picked.id AND s.id = r.schedule_id
    RETURNING r.id, r.schedule_id, s.project_id, s.function_name, s.args,
              r.request_id, r.scheduled_for, r.attempt, r.lease_until;
END
$$;
COMMENT ON FUNCTION dispatch.claim_runs(text, integer, interval) IS
    'Move up to max_runs pending runs, oldest slot first, to running for worker with a lease (FOR UPDATE SKIP LOCKED: concurrent callers never get the same run) and return what is needed to invoke them. The lease must outlast the invocation timeout.';

-- The running -> ok | error transition, for a batch of runs: a listener records a batch of
-- outcomes in one round trip and one transaction.
CREATE FUNCTION dispatch.complete_runs(
    worker        text,
    run_ids       bigint[],
    statuses      text[],
    errors        text[],
    http_statuses integer[],
    durations_ms  integer[]
)
RETURNS TABLE (run_id bigint, recorded boolean, advanced boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    finished dispatch.runs[];
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(complete_runs.statuses) s WHERE s IS NULL OR s NOT IN ('ok', 'error'))
       OR cardinality(complete_runs.statuses) <> cardinality(complete_runs.run_ids) THEN
        RAISE EXCEPTION 'statuses must hold ok or error for each run id' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- fenced on the worker: a listener whose lease expired cannot overwrite its successor
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
        WHERE x.id = i.id AND x.status = 'running' AND x.worker = complete_runs.worker
        RETURNING x
    )
    SELECT array_agg(d.x) INTO finished FROM done d;
    RETURN QUERY
    SELECT i.id, f.run_id IS NOT NULL, coalesce(f.advanced, false)
    FROM unnest(complete_runs.run_ids) WITH ORDINALITY AS i(id, n)
    LEFT JOIN dispatch._runs_finished(coalesce(finished, '{}')) f ON f.run_id = i.id
    ORDER BY i.n;
END
$$;
COMMENT ON FUNCTION dispatch.complete_runs(text, bigint[], text[], text[], integer[], integer[]) IS
    'dispatch.complete_run for many runs of one worker in one statement: record each outcome the worker still holds, advance each schedule still waiting on its slot, write the audit rows. The arrays are parallel (errors, http_statuses and durations_ms may hold NULLs). Returns run_id, recorded, advanced for each input run.';

CREATE PROCEDURE dispatch.complete_run(
    run_id      bigint,
    worker      text,
    status      text,
    error       text DEFAULT NULL,
    http_status integer DEFAULT NULL,
    duration_ms integer DEFAULT NULL,
    INOUT recorded boolean DEFAULT NULL,
    INOUT advanced boolean DEFAULT NULL
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
    SELECT c.recorded, c.advanced INTO complete_run.recorded, complete_run.advanced
    FROM dispatch.complete_runs(complete_run.worker, ARRAY[complete_run.run_id], ARRAY[complete_run.status],
                                ARRAY[complete_run.error], ARRAY[complete_run.http_status],
                                ARRAY[complete_run.duration_ms]) c;
END
$$;
COMMENT ON PROCEDURE dispatch.complete_run(bigint, text, text, text, integer, integer, boolean, boolean) IS
    'Record the outcome (ok or error; error cut to 500 characters) of a run that worker still holds, advance its schedule to the first slot after max(scheduled_for, now()) if next_run_at still equals scheduled_for, and write the audit row, in one transaction. Returns recorded (false when the worker no longer holds the run) and advanced.';

CREATE FUNCTION dispatch.release_runs(worker text, run_ids bigint[])
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    released integer;
BEGIN
    UPDATE dispatch.runs x
    SET status = 'pending', worker = NULL, claimed_at = NULL, lease_until = NULL,
        attempt = x.attempt - 1
    WHERE x.id = ANY (release_runs.run_ids) AND x.status = 'running' AND x.worker = release_runs.worker;
    GET DIAGNOSTICS released = ROW_COUNT;
    IF released > 0 THEN
        PERFORM pg_notify('dispatch', 'released');
    END IF;
    RETURN released;
END
$$;
COMMENT ON FUNCTION dispatch.release_runs(text, bigint[]) IS
    'Hand runs that worker claimed but never invoked back to pending, giving back the attempt; returns how many. Used by a listener that shuts down.';

CREATE FUNCTION dispatch.next_due_at()
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT min(next_run_at) FROM dispatch.schedules WHERE next_run_at > now());
END
$$;
COMMENT ON FUNCTION dispatch.next_due_at() IS
    'The earliest future next_run_at of a live schedule: when a listener should next call dispatch.tick().';

-- A schedule that stops (disabled or deleted) does not invoke what it had pending.
CREATE FUNCTION dispatch._schedule_skip_pending()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    finished dispatch.runs[];
BEGIN
    WITH skipped AS (
        UPDATE dispatch.runs x
        SET status = 'skipped', finished_at = now(),
            error = CASE WHEN NEW.deleted_at IS NOT NULL THEN 'schedule deleted before the run was claimed'
                         ELSE 'schedule disabled before the run was claimed' END
        WHERE x.schedule_id = NEW.id AND x.status = 'pending'
        RETURNING x
    )
    SELECT array_agg(k.x) INTO finished FROM skipped k;
    IF finished IS NOT NULL THEN
        PERFORM dispatch._runs_finished(finished);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER _200_skip_pending AFTER UPDATE OF enabled, deleted_at ON dispatch.schedules
    FOR EACH ROW
    WHEN (NEW.next_run_at IS NULL AND OLD.next_run_at IS NOT NULL)
    EXECUTE FUNCTION dispatch._schedule_skip_pending();
