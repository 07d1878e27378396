--
-- PostgreSQL database dump
--



SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: dispatch; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA dispatch;


--
-- Name: SCHEMA dispatch; Type: COMMENT; Schema: -; Owner: -
--

COMMENT ON SCHEMA dispatch IS 'pgdispatch: cron schedules dispatched over HTTP';


--
-- Name: cron_spec; Type: TYPE; Schema: dispatch; Owner: -
--

CREATE TYPE dispatch.cron_spec AS (
	minutes bigint,
	hours integer,
	days bigint,
	months integer,
	weekdays integer,
	nth_weekdays bigint,
	last_weekdays integer,
	last_day boolean,
	days_star boolean,
	weekdays_star boolean,
	real_time boolean,
	every_us bigint,
	anchor timestamp with time zone,
	starts_at timestamp with time zone,
	ends_at timestamp with time zone
);


--
-- Name: TYPE cron_spec; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON TYPE dispatch.cron_spec IS 'A schedule''s slot rule, derived by its write trigger: a parsed cron expression (dispatch.cron_parse), or an interval (every_us, anchor; the cron fields NULL). Stored on each schedule so that evaluation never re-parses.';


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: runs; Type: TABLE; Schema: dispatch; Owner: -
--

CREATE TABLE dispatch.runs (
    id bigint NOT NULL,
    schedule_id uuid NOT NULL,
    scheduled_for timestamp with time zone NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    request_id text DEFAULT ('sched_'::text || gen_random_uuid()) NOT NULL,
    attempt integer DEFAULT 0 NOT NULL,
    worker text,
    claimed_at timestamp with time zone,
    lease_until timestamp with time zone,
    finished_at timestamp with time zone,
    error text,
    http_status integer,
    duration_ms integer,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    not_before timestamp with time zone,
    earlier_attempts jsonb,
    kind text DEFAULT 'scheduled'::text NOT NULL,
    fire_at timestamp with time zone,
    released integer DEFAULT 0 NOT NULL,
    project_id text NOT NULL,
    held_by_breaker boolean DEFAULT false NOT NULL,
    traceparent text,
    CONSTRAINT runs_attempt_check CHECK ((attempt >= 0)),
    CONSTRAINT runs_error_length_check CHECK ((length(error) <= 500)),
    CONSTRAINT runs_finished_at_check CHECK (((status = ANY (ARRAY['pending'::text, 'running'::text])) = (finished_at IS NULL))),
    CONSTRAINT runs_fire_at_check CHECK (((fire_at IS NOT NULL) OR (status <> ALL (ARRAY['pending'::text, 'running'::text])))),
    CONSTRAINT runs_kind_check CHECK ((kind = ANY (ARRAY['scheduled'::text, 'manual'::text, 'backfill'::text]))),
    CONSTRAINT runs_not_before_check CHECK (((not_before IS NULL) OR (status = 'pending'::text))),
    CONSTRAINT runs_released_check CHECK (((released >= 0) AND (released <= attempt))),
    CONSTRAINT runs_running_has_lease_check CHECK (((status <> 'running'::text) OR ((worker IS NOT NULL) AND (lease_until > claimed_at)))),
    CONSTRAINT runs_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'running'::text, 'ok'::text, 'error'::text, 'skipped'::text, 'lost'::text])))
)
WITH (autovacuum_vacuum_scale_factor='0.01', autovacuum_vacuum_insert_scale_factor='0.01', autovacuum_analyze_scale_factor='0.02', fillfactor='50', vacuum_truncate='false');


--
-- Name: TABLE runs; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON TABLE dispatch.runs IS 'One row per fired slot of a schedule.';


--
-- Name: COLUMN runs.scheduled_for; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.runs.scheduled_for IS 'The slot: the schedule''s next_run_at when dispatch.tick marked it.';


--
-- Name: COLUMN runs.status; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.runs.status IS 'pending: marked by dispatch.tick, or handed back (release_runs, expired lease). running: claimed by dispatch.claim_runs (attempt incremented). ok/error: recorded by dispatch.complete_runs for the attempt that holds the run. skipped: never invoked: its schedule stopped before a first claim, or a back-off period of an expression that cannot be evaluated. lost: outcome unknown: its lease expired on the last attempt or after its schedule stopped, or it was handed back after an attempt that may have run.';


--
-- Name: COLUMN runs.request_id; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.runs.request_id IS 'sched_<uuid>, sent as X-Request-Id and Idempotency-Key; stable across the attempts of this run.';


--
-- Name: COLUMN runs.attempt; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.runs.attempt IS 'Claims so far; dispatch.claim_runs increments it and returns it as the fencing token that complete_runs and release_runs must present. release_runs gives one back.';


--
-- Name: COLUMN runs.worker; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.runs.worker IS 'Listener that holds (or last held) the run. Informational: the fence is the attempt.';


--
-- Name: COLUMN runs.lease_until; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.runs.lease_until IS 'A running run whose lease passes is retried or lost by dispatch.tick.';


--
-- Name: COLUMN runs.error; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.runs.error IS 'Why the run failed, was skipped or lost; at most 500 characters.';


--
-- Name: COLUMN runs.not_before; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.runs.not_before IS 'A pending run is not claimed before this: a retry''s back-off, or infinity while it waits behind the run ahead of it (overlap buffer_one).';


--
-- Name: COLUMN runs.earlier_attempts; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.runs.earlier_attempts IS 'The attempts before the last, for the audit row: attempt, status (error or lost), error, http_status, duration_ms, at. NULL while there was only one.';


--
-- Name: COLUMN runs.kind; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.runs.kind IS 'scheduled: one of the schedule''s slots, marked by tick; manual: asked for by dispatch.run_now, due at the instant of the call; backfill: a past slot marked by dispatch.backfill.';


--
-- Name: COLUMN runs.fire_at; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.runs.fire_at IS 'When the run is invoked: scheduled_for plus the schedule''s jitter offset (a run marked before its fire instant waits in not_before until then). NULL only on runs that finished before schema version 14.';


--
-- Name: COLUMN runs.released; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.runs.released IS 'Claims of this run that dispatch.release_runs handed back before invoking it. attempt counts every claim (the fencing token only grows); attempt - released is the number of invocations that went out.';


--
-- Name: COLUMN runs.project_id; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.runs.project_id IS 'The schedule''s project_id when the run was marked; an open run (pending, running) follows a change of the schedule''s project_id.';


--
-- Name: COLUMN runs.held_by_breaker; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.runs.held_by_breaker IS 'Pending because its function''s breaker is open (set by claim_runs, cleared when it is claimed or the breaker closes).';


--
-- Name: COLUMN runs.traceparent; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.runs.traceparent IS 'The W3C traceparent the run continues (given to dispatch.run_now, or the schedule''s when it was first claimed); NULL: a trace of its own. Each attempt''s own: dispatch.run_trace(id).';


--
-- Name: _advance_schedules(dispatch.runs[], boolean); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._advance_schedules(finished dispatch.runs[], guarded boolean) RETURNS TABLE(run_id bigint, advanced boolean, follow_up boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
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


--
-- Name: _audit_runs(dispatch.runs[]); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._audit_runs(finished dispatch.runs[]) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
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


--
-- Name: _breaker_outcomes(bigint[], bigint[], text[], boolean[], text[]); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._breaker_outcomes(run_ids bigint[], all_ids bigint[], statuses text[], retryable boolean[], errors text[]) RETURNS bigint[]
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_indexscan TO 'off'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
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


--
-- Name: _calendar_before_delete(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._calendar_before_delete() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    UPDATE dispatch.schedules SET calendar_id = NULL WHERE calendar_id = OLD.id AND deleted_at IS NOT NULL;
    RETURN OLD;
END
$$;


--
-- Name: _calendar_before_write(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._calendar_before_write() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
BEGIN
    PERFORM dispatch._refuse(CASE
        WHEN NEW.name IS NULL OR NEW.name !~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$'
        THEN format('calendar name must be 1 to 100 letters, digits, _ . or - (starting with a letter or digit), not %s',
                    coalesce(quote_literal(NEW.name), 'NULL'))
        WHEN length(NEW.description) > 1000 THEN 'calendar description must be at most 1000 characters'
        END);
    IF TG_OP = 'INSERT' OR NEW.timezone IS DISTINCT FROM OLD.timezone THEN
        PERFORM dispatch.check_timezone(NEW.timezone);
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.project_id IS DISTINCT FROM OLD.project_id AND NEW.project_id IS NOT NULL
       AND EXISTS (SELECT 1 FROM dispatch.schedules s
                   WHERE s.calendar_id = NEW.id AND s.project_id <> NEW.project_id AND s.deleted_at IS NULL) THEN
        RAISE EXCEPTION 'calendar %: project_id cannot become % while schedules of other projects use it', NEW.name,
                        quote_literal(NEW.project_id)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Point those schedules at another calendar first (schedules.calendar_id).';
    END IF;
    IF TG_OP = 'UPDATE' THEN
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END
$_$;


--
-- Name: _calendar_blocked(timestamp with time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._calendar_blocked(horizon timestamp with time zone, OUT calendar_ids bigint[], OUT slots timestamp with time zone[]) RETURNS record
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    WITH RECURSIVE calendar(id) AS (
        (SELECT s.calendar_id FROM dispatch.schedules s WHERE s.calendar_id IS NOT NULL
         ORDER BY s.calendar_id LIMIT 1)
      UNION ALL
        SELECT (SELECT s.calendar_id FROM dispatch.schedules s WHERE s.calendar_id > c.id
                ORDER BY s.calendar_id LIMIT 1)
        FROM calendar c WHERE c.id IS NOT NULL
    ), due(calendar_id, slot) AS (
        SELECT c.id, (SELECT min(s.next_run_at) FROM dispatch.schedules s WHERE s.calendar_id = c.id)
        FROM calendar c WHERE c.id IS NOT NULL
      UNION ALL
        SELECT d.calendar_id, (SELECT min(s.next_run_at) FROM dispatch.schedules s
                               WHERE s.calendar_id = d.calendar_id AND s.next_run_at > d.slot)
        FROM due d WHERE d.slot <= _calendar_blocked.horizon
    )
    SELECT coalesce(array_agg(d.calendar_id), '{}'), coalesce(array_agg(d.slot), '{}')
    FROM due d
    WHERE d.slot <= _calendar_blocked.horizon AND dispatch.calendar_excludes(d.calendar_id, d.slot)
$$;


--
-- Name: _calendar_exclusion_before_write(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._calendar_exclusion_before_write() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    problem text;
    hint text;
BEGIN
    IF NEW.days IS NULL AND (NEW.starts IS NULL OR NEW.ends IS NULL) THEN
        problem := 'a calendar exclusion needs starts and ends (a period), or days (every week)';
    ELSIF NEW.days IS NOT NULL AND (NEW.starts IS NOT NULL OR NEW.ends IS NOT NULL) THEN
        problem := 'starts and ends exclude days: a calendar exclusion is a period or a weekly rule, not both';
    ELSIF NEW.days IS NULL AND (NEW.from_time IS NOT NULL OR NEW.until_time IS NOT NULL) THEN
        problem := 'from_time and until_time apply to a weekly exclusion (days), not to a period';
    ELSIF NOT isfinite(NEW.starts) OR NOT isfinite(NEW.ends) THEN
        problem := 'starts and ends must be finite wall-clock times';
    ELSIF NEW.ends <= NEW.starts THEN
        problem := format('ends (%s) must be after starts (%s)', NEW.ends, NEW.starts);
        hint := 'A whole day D is starts D, ends D + 1 (midnight to midnight).';
    ELSIF NEW.days IS NOT NULL
          AND (cardinality(NEW.days) NOT BETWEEN 1 AND 7 OR NOT NEW.days <@ '{1,2,3,4,5,6,7}'
               OR array_position(NEW.days, NULL) IS NOT NULL) THEN
        problem := format('days must list ISO days of the week, 1 (Monday) to 7 (Sunday), not %s', NEW.days);
    ELSIF NEW.days IS NOT NULL THEN
        NEW.from_time := coalesce(NEW.from_time, time '00:00');
        NEW.until_time := coalesce(NEW.until_time, time '24:00');
        IF NEW.until_time <= NEW.from_time THEN
            problem := format('until_time (%s) must be after from_time (%s)', NEW.until_time, NEW.from_time);
            hint := 'A period that runs past midnight is two: until 24:00, and from 00:00 on the next day.';
        END IF;
        NEW.days := ARRAY(SELECT DISTINCT d FROM unnest(NEW.days) AS d ORDER BY d);
    END IF;
    IF problem IS NULL AND length(NEW.label) > 200 THEN
        problem := 'label must be at most 200 characters';
    END IF;
    PERFORM dispatch._refuse(problem, hint);
    RETURN NEW;
END
$$;


--
-- Name: _calendar_latest(dispatch.cron_spec, text, bigint, timestamp with time zone, timestamp with time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._calendar_latest(spec dispatch.cron_spec, tz text, calendar_id bigint, lo timestamp with time zone, hi timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    slot timestamptz;
    period_start timestamptz;
BEGIN
    FOR i IN 1..1000 LOOP
        slot := dispatch._cron_latest(spec, lo, hi, tz);
        EXIT WHEN slot IS NULL;
        SELECT p.starts_at INTO period_start FROM dispatch._calendar_period(calendar_id, slot) p;
        EXIT WHEN NOT FOUND;
        hi := period_start - interval '1 microsecond';
        slot := NULL;
    END LOOP;
    RETURN slot;
END
$$;


--
-- Name: _calendar_lets_bulk(bigint, timestamp with time zone, bigint, text, timestamp with time zone, bigint[], timestamp with time zone[]); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._calendar_lets_bulk(calendar_id bigint, slot timestamp with time zone, every_us bigint, catchup text, horizon timestamp with time zone, blocked_calendars bigint[], blocked_slots timestamp with time zone[]) RETURNS boolean
    LANGUAGE sql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT (catchup = 'all' OR horizon - slot < coalesce(every_us * interval '1 microsecond', interval '1 minute'))
           AND NOT EXISTS (SELECT 1 FROM unnest(blocked_calendars, blocked_slots) AS b(c, t)
                           WHERE b.c = calendar_id AND b.t = slot)
$$;


--
-- Name: _calendar_period(bigint, timestamp with time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._calendar_period(calendar_id bigint, at timestamp with time zone, OUT calendar text, OUT starts_at timestamp with time zone, OUT ends_at timestamp with time zone, OUT label text) RETURNS SETOF record
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN QUERY
    SELECT c.name, p.starts_at, p.ends_at, p.label
    FROM dispatch.calendar_periods(_calendar_period.calendar_id, _calendar_period.at,
                                   _calendar_period.at + interval '1 microsecond') p
    JOIN dispatch.calendars c ON c.id = _calendar_period.calendar_id
    ORDER BY p.ends_at DESC
    LIMIT 1;
END
$$;


--
-- Name: _calendar_slot(dispatch.cron_spec, text, bigint, timestamp with time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._calendar_slot(spec dispatch.cron_spec, tz text, calendar_id bigint, slot timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    period_end timestamptz;
BEGIN
    FOR i IN 1..1000 LOOP
        EXIT WHEN slot IS NULL OR NOT isfinite(slot);
        SELECT p.ends_at INTO period_end FROM dispatch._calendar_period(calendar_id, slot) p;
        EXIT WHEN NOT FOUND;
        slot := dispatch.cron_spec_next(spec, greatest(period_end - interval '1 microsecond', slot), tz);
    END LOOP;
    RETURN slot;
END
$$;


--
-- Name: schedules; Type: TABLE; Schema: dispatch; Owner: -
--

CREATE TABLE dispatch.schedules (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    project_id text NOT NULL,
    function_name text NOT NULL,
    cron_expression text,
    timezone text DEFAULT 'UTC'::text NOT NULL,
    args jsonb DEFAULT '{}'::jsonb NOT NULL,
    enabled boolean DEFAULT true NOT NULL,
    deleted_at timestamp with time zone,
    next_run_at timestamp with time zone,
    last_run_at timestamp with time zone,
    last_status text,
    last_error text,
    max_attempts integer DEFAULT 3 NOT NULL,
    cron_spec dispatch.cron_spec NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    paused_at timestamp with time zone,
    paused_by text,
    paused_reason text,
    last_slot timestamp with time zone,
    backoff_reason text,
    retry_backoff interval DEFAULT '00:00:10'::interval NOT NULL,
    retry_backoff_max interval DEFAULT '00:05:00'::interval NOT NULL,
    timeout interval,
    misfire_grace interval,
    catchup text DEFAULT 'latest'::text NOT NULL,
    overlap text DEFAULT 'skip'::text NOT NULL,
    every interval,
    anchor timestamp with time zone,
    jitter interval DEFAULT '00:00:00'::interval NOT NULL,
    stopped_on timestamp with time zone,
    run_at timestamp with time zone,
    starts_at timestamp with time zone,
    ends_at timestamp with time zone,
    max_runs integer,
    ended_at timestamp with time zone,
    ended_reason text,
    pause_after_failures integer,
    traceparent text,
    calendar_id bigint,
    CONSTRAINT schedules_anchor_check CHECK (((anchor IS NULL) = (every IS NULL))),
    CONSTRAINT schedules_args_check CHECK ((jsonb_typeof(args) = 'object'::text)),
    CONSTRAINT schedules_backoff_check CHECK (((backoff_reason IS NULL) OR (next_run_at IS NOT NULL))),
    CONSTRAINT schedules_bounds_check CHECK (((ends_at >= starts_at) AND ((max_runs >= 1) AND (max_runs <= 10000)) AND ((run_at IS NULL) OR (num_nonnulls(starts_at, ends_at, max_runs) = 0)))),
    CONSTRAINT schedules_catchup_check CHECK (((catchup = ANY (ARRAY['latest'::text, 'all'::text])) AND ((catchup = 'latest'::text) OR (misfire_grace IS NOT NULL)))),
    CONSTRAINT schedules_ended_check CHECK (((ended_at IS NULL) = (ended_reason IS NULL))),
    CONSTRAINT schedules_every_check CHECK (((every >= '00:00:01'::interval) AND (every <= '366 days'::interval) AND (EXTRACT(month FROM every) = (0)::numeric) AND (EXTRACT(year FROM every) = (0)::numeric))),
    CONSTRAINT schedules_jitter_check CHECK (((jitter >= '00:00:00'::interval) AND (jitter <= '1 day'::interval) AND ((every IS NULL) OR (jitter <= every)))),
    CONSTRAINT schedules_last_status_check CHECK ((last_status = ANY (ARRAY['ok'::text, 'error'::text, 'skipped'::text, 'lost'::text]))),
    CONSTRAINT schedules_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 10))),
    CONSTRAINT schedules_misfire_grace_check CHECK ((misfire_grace > '00:00:00'::interval)),
    CONSTRAINT schedules_next_run_at_after_last_slot_check CHECK ((next_run_at > last_slot)),
    CONSTRAINT schedules_next_run_at_live_check CHECK (((next_run_at IS NOT NULL) = (enabled AND (deleted_at IS NULL) AND (paused_at IS NULL) AND (ended_at IS NULL)))),
    CONSTRAINT schedules_overlap_check CHECK ((overlap = ANY (ARRAY['skip'::text, 'buffer_one'::text, 'allow'::text]))),
    CONSTRAINT schedules_pause_after_failures_check CHECK (((pause_after_failures >= 1) AND (pause_after_failures <= 1000))),
    CONSTRAINT schedules_paused_check CHECK (((paused_at IS NOT NULL) OR ((paused_by IS NULL) AND (paused_reason IS NULL)))),
    CONSTRAINT schedules_paused_reason_length_check CHECK ((length(paused_reason) <= 500)),
    CONSTRAINT schedules_project_id_check CHECK ((((length(project_id) >= 1) AND (length(project_id) <= 200)) AND (project_id !~ '[[:space:][:cntrl:]/]'::text) AND (project_id <> ALL (ARRAY['.'::text, '..'::text])))),
    CONSTRAINT schedules_retry_backoff_check CHECK (((retry_backoff > '00:00:00'::interval) AND (retry_backoff <= retry_backoff_max))),
    CONSTRAINT schedules_retry_backoff_max_check CHECK ((retry_backoff_max <= '1 day'::interval)),
    CONSTRAINT schedules_slot_rule_check CHECK ((num_nonnulls(cron_expression, every, run_at) = 1)),
    CONSTRAINT schedules_timeout_check CHECK (((timeout > '00:00:00'::interval) AND (timeout <= '01:00:00'::interval))),
    CONSTRAINT schedules_traceparent_check CHECK ((traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'::text))
)
WITH (fillfactor='60');


--
-- Name: TABLE schedules; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON TABLE dispatch.schedules IS 'One row per schedule. INSERT/UPDATE from any client validates cron_expression, timezone and function_name and computes next_run_at.';


--
-- Name: COLUMN schedules.project_id; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.project_id IS 'Tenant: 1-200 characters, no whitespace, control characters or /, not . or .. (it is one segment of the invoke URL).';


--
-- Name: COLUMN schedules.function_name; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.function_name IS 'Function to call: a letter or digit, then letters, digits, _ . - (at most 128); percent-encoded into the invoke URL.';


--
-- Name: COLUMN schedules.cron_expression; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.cron_expression IS 'The cron expression whose matching instants are the slots (NULL for an interval schedule: see every).';


--
-- Name: COLUMN schedules.timezone; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.timezone IS 'IANA zone name (pg_timezone_names) the expression is read in.';


--
-- Name: COLUMN schedules.args; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.args IS 'JSON object passed as "args" in the request body; at most 4 MiB of JSON text and 64 levels deep.';


--
-- Name: COLUMN schedules.deleted_at; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.deleted_at IS 'Soft delete: set it to stop the schedule and keep its history.';


--
-- Name: COLUMN schedules.next_run_at; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.next_run_at IS 'Next slot to fire; NULL exactly when the schedule is stopped (disabled, paused or deleted). Stays on a slot while its run is open; finishing the run advances it past the slot. Written only by the system.';


--
-- Name: COLUMN schedules.last_status; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.last_status IS 'Status of the latest finished run: ok, error, skipped or lost.';


--
-- Name: COLUMN schedules.max_attempts; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.max_attempts IS 'Invocation attempts of one run, failed attempts and lost leases alike. A retryable failure (connection, timeout, HTTP 5xx, 408, 429) is retried while attempts are left.';


--
-- Name: COLUMN schedules.cron_spec; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.cron_spec IS 'The slot rule, derived by the write trigger: cron_expression parsed (dispatch.cron_parse), or every and anchor.';


--
-- Name: COLUMN schedules.updated_at; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.updated_at IS 'Last change to the definition (not to next_run_at or last_*).';


--
-- Name: COLUMN schedules.paused_at; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.paused_at IS 'Set by dispatch.pause(): the schedule keeps its definition and has no next_run_at until dispatch.resume().';


--
-- Name: COLUMN schedules.paused_by; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.paused_by IS 'The login (session_user) that paused it.';


--
-- Name: COLUMN schedules.paused_reason; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.paused_reason IS 'Why it was paused, as given to dispatch.pause(); at most 500 characters.';


--
-- Name: COLUMN schedules.last_slot; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.last_slot IS 'The latest slot whose run has finished (ok, error, skipped or lost). next_run_at is always later (invariant 2).';


--
-- Name: COLUMN schedules.backoff_reason; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.backoff_reason IS 'Set while the next slot cannot be computed (its zone is gone from the tz database): next_run_at is then a back-off instant, one hour on, at which dispatch.tick records a skipped run and tries again. Never invoked at such an instant (invariant 6).';


--
-- Name: COLUMN schedules.retry_backoff; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.retry_backoff IS 'Back-off before the first retry; doubled for each retry, with full jitter (a random share of it), capped at retry_backoff_max.';


--
-- Name: COLUMN schedules.retry_backoff_max; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.retry_backoff_max IS 'The longest back-off between two attempts, Retry-After included.';


--
-- Name: COLUMN schedules.timeout; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.timeout IS 'Invocation timeout of this schedule''s runs (NULL: the listener''s --timeout); the lease follows it.';


--
-- Name: COLUMN schedules.misfire_grace; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.misfire_grace IS 'A slot that cannot start within this long after its instant is not invoked: it ends skipped ("missed by ..."). NULL: no limit.';


--
-- Name: COLUMN schedules.catchup; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.catchup IS 'After downtime: latest runs only the most recent missed slot; all runs every missed slot within misfire_grace, oldest first.';


--
-- Name: COLUMN schedules.overlap; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.overlap IS 'While a run is open: skip the slots that come due; buffer_one lets one wait and run right after; allow runs each slot at its time.';


--
-- Name: COLUMN schedules.every; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.every IS 'An interval schedule (instead of cron_expression): slots at anchor + k * every, at least 1 second apart, in real time (a day is 24 hours; DST does not apply, and timezone is not used).';


--
-- Name: COLUMN schedules.anchor; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.anchor IS 'The instant an interval schedule''s slots are counted from (default: created_at); NULL for a cron schedule.';


--
-- Name: COLUMN schedules.jitter; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.jitter IS 'Each slot fires at scheduled_for + an offset in [0, jitter), fixed by a hash of the schedule id and the slot (dispatch.jitter_offset): spreads schedules that share a slot. 0: on the slot.';


--
-- Name: COLUMN schedules.stopped_on; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.stopped_on IS 'Derived: the slot a paused or disabled schedule was on when it stopped (NULL while live, and after an edit of its rule). The gap recorded when it goes on again starts there.';


--
-- Name: COLUMN schedules.run_at; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.run_at IS 'A one-shot schedule (instead of cron_expression or every): its one slot is this instant; then it ends.';


--
-- Name: COLUMN schedules.starts_at; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.starts_at IS 'No slot before this instant (NULL: from the creation). max_runs counts slots from here.';


--
-- Name: COLUMN schedules.ends_at; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.ends_at IS 'No slot after this instant (NULL: no end); when the last slot is past the schedule ends.';


--
-- Name: COLUMN schedules.max_runs; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.max_runs IS 'At most this many slots, the first ones at or after starts_at (set to the creation time when left NULL), 1 to 10,000; each becomes a run or lies in a recorded gap.';


--
-- Name: COLUMN schedules.ended_at; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.ended_at IS 'When the schedule passed its last slot (run_at, ends_at or max_runs) and ended: it has no next_run_at; an edit that gives it slots again clears this.';


--
-- Name: COLUMN schedules.ended_reason; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.ended_reason IS 'Why the schedule ended: which bound its last slot came from.';


--
-- Name: COLUMN schedules.pause_after_failures; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.pause_after_failures IS 'After this many runs in a row end error or lost (counted since the schedule was last written, a resume included), the schedule pauses itself, paused_by pgdispatch, with a reason naming the runs. NULL: never.';


--
-- Name: COLUMN schedules.traceparent; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.traceparent IS 'A W3C traceparent that the schedule''s runs continue: their trace id is its trace id, and each attempt''s span a child of its span. NULL: each run is a trace of its own.';


--
-- Name: COLUMN schedules.calendar_id; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.calendar_id IS 'An exclusion calendar (dispatch.calendars, the project''s own or a shared one): its slots inside the calendar''s periods do not run and are recorded as a gap (reason calendar). NULL: none.';


--
-- Name: _check_bounds(dispatch.schedules, dispatch.schedules); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._check_bounds(s dispatch.schedules, was dispatch.schedules) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    problem text;
    hint text;
BEGIN
    IF s.run_at IS NOT NULL AND num_nonnulls(s.starts_at, s.ends_at, s.max_runs) > 0 THEN
        problem := 'starts_at, ends_at and max_runs bound a repeating schedule, not a one-shot (run_at)';
        hint := 'A one-shot has one slot, at run_at.';
    ELSIF NOT isfinite(s.run_at) THEN
        problem := format('run_at must be an instant, not %s', s.run_at);
    ELSIF s.run_at < now() AND s.run_at IS DISTINCT FROM was.run_at THEN
        problem := format('run_at %s is in the past', s.run_at);
        hint := 'run_at = now() fires it at once.';
    ELSIF NOT isfinite(s.starts_at) THEN
        problem := format('starts_at must be an instant, not %s', s.starts_at);
        hint := 'NULL: from the creation.';
    ELSIF NOT isfinite(s.ends_at) THEN
        problem := format('ends_at must be an instant, not %s', s.ends_at);
        hint := 'NULL: no end.';
    ELSIF s.ends_at < s.starts_at THEN
        problem := format('ends_at (%s) must not be before starts_at (%s)', s.ends_at, s.starts_at);
    ELSIF s.max_runs NOT BETWEEN 1 AND 10000 THEN
        problem := format('max_runs must be between 1 and 10000, not %s', s.max_runs);
        hint := 'For more slots than that, bound the schedule with ends_at.';
    END IF;
    PERFORM dispatch._refuse(problem, hint);
END
$$;


--
-- Name: _check_calendar(text, bigint); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._check_calendar(project_id text, calendar_id bigint) RETURNS void
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    c dispatch.calendars;
BEGIN
    SELECT * INTO c FROM dispatch.calendars x WHERE x.id = _check_calendar.calendar_id;
    IF NOT FOUND THEN
        PERFORM dispatch._refuse(format('calendar_id %s is not a calendar', calendar_id),
                                 'SELECT id, project_id, name FROM dispatch.calendars lists them.');
    ELSIF c.project_id <> _check_calendar.project_id THEN
        PERFORM dispatch._refuse(
            format('calendar_id %s: calendar %s belongs to project %s, not to %s', calendar_id, quote_literal(c.name),
                   quote_literal(c.project_id), quote_literal(_check_calendar.project_id)),
            'A schedule may use its own project''s calendars and the shared ones (project_id NULL).');
    END IF;
END
$$;


--
-- Name: _check_policies(dispatch.schedules); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._check_policies(s dispatch.schedules) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    problem text;
    hint text;
BEGIN
    IF s.max_attempts IS NULL OR s.max_attempts NOT BETWEEN 1 AND 10 THEN
        problem := format('max_attempts must be between 1 and 10, not %s', coalesce(s.max_attempts::text, 'NULL'));
        hint := 'It counts every attempt of a run: 1 never retries.';
    ELSIF s.retry_backoff IS NULL OR s.retry_backoff <= interval '0' THEN
        problem := format('retry_backoff must be more than 0, not %s', coalesce(s.retry_backoff::text, 'NULL'));
    ELSIF s.retry_backoff_max IS NULL OR s.retry_backoff_max > interval '1 day' THEN
        problem := format('retry_backoff_max must be at most 1 day, not %s', coalesce(s.retry_backoff_max::text, 'NULL'));
    ELSIF s.retry_backoff > s.retry_backoff_max THEN
        problem := format('retry_backoff (%s) must not exceed retry_backoff_max (%s)', s.retry_backoff, s.retry_backoff_max);
        hint := 'retry_backoff is the first back-off, retry_backoff_max the cap of the doubling.';
    ELSIF s.timeout <= interval '0' OR s.timeout > interval '1 hour' THEN
        problem := format('timeout must be more than 0 and at most 1 hour, not %s', s.timeout);
        hint := 'NULL uses the listener''s --timeout.';
    ELSIF s.misfire_grace <= interval '0' THEN
        problem := format('misfire_grace must be more than 0, not %s', s.misfire_grace);
        hint := 'NULL: a late slot is invoked however late.';
    ELSIF s.catchup IS NULL OR s.catchup NOT IN ('latest', 'all') THEN
        problem := format('catchup must be latest or all, not %s', coalesce(quote_literal(s.catchup), 'NULL'));
    ELSIF s.catchup = 'all' AND s.misfire_grace IS NULL THEN
        problem := 'catchup = ''all'' needs a misfire_grace';
        hint := 'Say how far back missed slots are run, e.g. misfire_grace = ''6 hours'': after a long outage every slot would run otherwise.';
    ELSIF s.overlap IS NULL OR s.overlap NOT IN ('skip', 'buffer_one', 'allow') THEN
        problem := format('overlap must be skip, buffer_one or allow, not %s', coalesce(quote_literal(s.overlap), 'NULL'));
    ELSIF s.pause_after_failures NOT BETWEEN 1 AND 1000 THEN
        problem := format('pause_after_failures must be between 1 and 1000, not %s', s.pause_after_failures);
        hint := 'NULL: the schedule never pauses itself.';
    ELSIF s.jitter IS NULL OR s.jitter < interval '0' OR s.jitter > interval '1 day' THEN
        problem := format('jitter must be between 0 and 1 day, not %s', coalesce(s.jitter::text, 'NULL'));
        hint := 'Each slot fires at a fixed offset in [0, jitter) after it; 0 fires on the slot.';
    END IF;
    PERFORM dispatch._refuse(problem, hint);
END
$$;


--
-- Name: _check_traceparent(text, text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._check_traceparent(value text, field text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
BEGIN
    IF value IS NOT NULL AND (value !~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
                              OR substr(value, 4, 32) = repeat('0', 32) OR substr(value, 37, 16) = repeat('0', 16)) THEN
        RAISE EXCEPTION '% % is not a W3C traceparent', field, quote_literal(left(value, 80))
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Version 00, lowercase: 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>, neither id all zeros, e.g. 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01.';
    END IF;
    RETURN value;
END
$_$;


--
-- Name: _claim_shares(integer, integer[], integer[]); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._claim_shares(n integer, weights integer[], allow integer[]) RETURNS integer[]
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
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


--
-- Name: FUNCTION _claim_shares(n integer, weights integer[], allow integer[]); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch._claim_shares(n integer, weights integer[], allow integer[]) IS 'Arithmetic of dispatch.claim_runs: how many runs of each project a claim of n takes before the remainder, by weight, water-filled (a project allowed fewer than its share takes its allowance), each share rounded down.';


--
-- Name: _claim_verdict(dispatch.runs, dispatch.schedules); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._claim_verdict(r dispatch.runs, s dispatch.schedules) RETURNS text
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


--
-- Name: FUNCTION _claim_verdict(r dispatch.runs, s dispatch.schedules); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch._claim_verdict(r dispatch.runs, s dispatch.schedules) IS 'What dispatch.claim_runs does with a pending run it locked: live (starts it), stale (ends it skipped: its schedule stopped, or its first attempt missed misfire_grace) or late (ends it error, lost after a lost lease: an attempt beyond max_attempts, or a retry of a failed attempt past the next slot), however the run came back to pending (a back-off, a claim handed back, a lease that expired).';


--
-- Name: _claimable_between(text, text, integer, text[], boolean); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._claimable_between(after text, upto text, n integer, waiting text[], whole boolean) RETURNS text[]
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_sort TO 'off'
    SET jit TO 'off'
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


--
-- Name: FUNCTION _claimable_between(after text, upto text, n integer, waiting text[], whole boolean); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch._claimable_between(after text, upto text, n integer, waiting text[], whole boolean) IS 'The projects with runs a claim may take now (pending, not_before NULL or over) after "after" and up to "upto" (NULL: no bound), at most n, in project_id order (a loose index scan: an index descent a project), given the front of the waiting runs that may start (dispatch._claimable_front).';


--
-- Name: _claimable_front(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._claimable_front(OUT waiting text[], OUT whole boolean) RETURNS record
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
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


--
-- Name: FUNCTION _claimable_front(OUT waiting text[], OUT whole boolean); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch._claimable_front(OUT waiting text[], OUT whole boolean) IS 'The projects of the pending runs whose not_before is over, from the first 5,000 entries of runs_not_before_idx in not_before order, and whether those were all of them (false: there may be more).';


--
-- Name: _claimable_projects(text, integer); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._claimable_projects(after text, n integer) RETURNS text[]
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
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


--
-- Name: FUNCTION _claimable_projects(after text, n integer); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch._claimable_projects(after text, n integer) IS 'The projects with runs a claim may take now, at most n, each once: in project_id order from the first after "after", wrapping around to "after" itself.';


--
-- Name: breakers; Type: TABLE; Schema: dispatch; Owner: -
--

CREATE TABLE dispatch.breakers (
    project_id text NOT NULL,
    function_name text NOT NULL,
    state text DEFAULT 'closed'::text NOT NULL,
    failures integer DEFAULT 0 NOT NULL,
    failing_since timestamp with time zone,
    last_error text,
    opened_at timestamp with time zone,
    probes integer DEFAULT 0 NOT NULL,
    next_probe_at timestamp with time zone,
    probe_run_id bigint,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT breakers_failures_check CHECK (((failures >= 0) AND (probes >= 0))),
    CONSTRAINT breakers_open_check CHECK (((state = 'open'::text) = ((opened_at IS NOT NULL) AND (next_probe_at IS NOT NULL)))),
    CONSTRAINT breakers_state_check CHECK ((state = ANY (ARRAY['closed'::text, 'open'::text])))
);


--
-- Name: TABLE breakers; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON TABLE dispatch.breakers IS 'The circuit breaker of each function that failed retryably (one row per project_id, function_name; written only by the system and dispatch.reset_breaker). While open, its runs wait (pending with not_before, attempts kept) and one probe run at a time is invoked.';


--
-- Name: COLUMN breakers.state; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.breakers.state IS 'closed: runs go as usual (set by a successful answer, dispatch.reset_breaker); open: runs wait, one probe at a time (set by complete_runs at breaker_threshold failures).';


--
-- Name: COLUMN breakers.failures; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.breakers.failures IS 'Consecutive retryable failures since failing_since (reset by any other outcome).';


--
-- Name: COLUMN breakers.probes; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.breakers.probes IS 'Probe runs handed out since the breaker opened.';


--
-- Name: COLUMN breakers.next_probe_at; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.breakers.next_probe_at IS 'While open: the earliest instant the next probe may go out.';


--
-- Name: COLUMN breakers.probe_run_id; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.breakers.probe_run_id IS 'The run last handed out as a probe: in flight while that run is running.';


--
-- Name: _close_breaker(text, text, text, text, bigint[]); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._close_breaker(project_id text, function_name text, actor text, reason text, run_ids bigint[] DEFAULT NULL::bigint[]) RETURNS dispatch.breakers
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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


--
-- Name: _cron_days(dispatch.cron_spec, integer, integer, integer); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._cron_days(spec dispatch.cron_spec, y integer, mo integer, first_dow integer DEFAULT NULL::integer) RETURNS bigint
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    ndays integer := CASE mo
                        WHEN 2 THEN CASE WHEN (y % 4 = 0 AND y % 100 <> 0) OR y % 400 = 0 THEN 29 ELSE 28 END
                        WHEN 4 THEN 30 WHEN 6 THEN 30 WHEN 9 THEN 30 WHEN 11 THEN 30
                        ELSE 31
                     END;
    month_days bigint := (1::bigint << (ndays + 1)) - 2;
    f integer := coalesce(first_dow, date_part('dow', make_date(y, mo, 1))::integer);
    dom bigint := spec.days & month_days;
    dow bigint;
    r bigint;
    n integer;
    g integer;
BEGIN
    IF spec.last_day THEN
        dom := dom | (1::bigint << ndays);
    END IF;
    -- Rotate the weekday bits so that bit j means "day 1+j has an allowed weekday", then
    -- replicate that week over the month (34630287489 has a bit every 7 places).
    r := ((spec.weekdays >> f) | (spec.weekdays << (7 - f))) & 127;
    dow := ((r * 34630287489) << 1) & month_days;
    IF spec.nth_weekdays <> 0 THEN
        FOR n IN 0..4 LOOP
            r := (spec.nth_weekdays >> (7 * n)) & 127;
            CONTINUE WHEN r = 0;
            r := ((r >> f) | (r << (7 - f))) & 127;
            dow := dow | ((r << (1 + 7 * n)) & month_days);
        END LOOP;
    END IF;
    IF spec.last_weekdays <> 0 THEN
        g := (f + ndays - 1) % 7;  -- weekday of the last day
        FOR n IN 0..6 LOOP
            IF (spec.last_weekdays >> ((g - n + 7) % 7)) & 1 = 1 THEN
                dow := dow | (1::bigint << (ndays - n));
            END IF;
        END LOOP;
    END IF;
    IF spec.days_star OR spec.weekdays_star THEN
        RETURN dom & dow;
    END IF;
    RETURN dom | dow;  -- both restricted: a day matches if either does (Vixie cron)
END
$$;


--
-- Name: _cron_error(text, text, text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._cron_error(expr text, detail text, hint text DEFAULT NULL::text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'invalid_parameter_value',
        MESSAGE = format('cron_expression "%s": %s',
                         CASE WHEN length(expr) > 80 THEN left(expr, 80) || '...' ELSE expr END,
                         CASE WHEN length(detail) > 160 THEN left(detail, 160) || '...' ELSE detail END),
        HINT = coalesce(hint, 'Five fields: minute hour day-of-month month day-of-week, e.g. "*/15 * * * *".');
END
$$;


--
-- Name: _cron_latest(dispatch.cron_spec, timestamp with time zone, timestamp with time zone, text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._cron_latest(spec dispatch.cron_spec, lo timestamp with time zone, hi timestamp with time zone, tz text) RETURNS timestamp with time zone
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    windows constant interval[] := '{1 minute, 1 hour, 1 day, 32 days, 366 days, 3000 days, 15000 days}';
    w interval;
    t timestamptz;
    n timestamptz;
BEGIN
    hi := least(hi, spec.ends_at);
    IF spec.every_us IS NOT NULL THEN
        t := dispatch._every_slot(spec, dispatch._every_index(spec, hi));
        RETURN CASE WHEN t > lo AND t >= coalesce(spec.starts_at, t) THEN t END;
    END IF;
    FOREACH w IN ARRAY windows LOOP
        t := dispatch.cron_spec_next(spec, greatest(lo, hi - w), tz);
        IF t <= hi THEN
            LOOP
                n := dispatch.cron_spec_next(spec, t, tz);
                EXIT WHEN n > hi;
                t := n;
            END LOOP;
            RETURN t;
        END IF;
        EXIT WHEN hi - w <= lo;
    END LOOP;
    RETURN NULL;
END
$$;


--
-- Name: _cron_match_from(dispatch.cron_spec, timestamp without time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._cron_match_from(spec dispatch.cron_spec, t timestamp without time zone) RETURNS timestamp without time zone
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    y  integer := date_part('year', t);
    mo integer := date_part('month', t);
    d  integer := date_part('day', t);
    h  integer := date_part('hour', t);
    mi integer := date_part('minute', t);
    x  integer;
    days bigint;
    guard integer := 0;
BEGIN
    LOOP
        -- A valid spec fires within 40 years (a leap-day Monday is the rarest); this only
        -- stops a spec that was built by hand and never fires.
        guard := guard + 1;
        IF guard > 2000 THEN
            RAISE EXCEPTION 'cron spec % never fires', spec USING ERRCODE = 'invalid_parameter_value';
        END IF;
        x := dispatch._next_bit(spec.months, mo);
        IF x IS NULL THEN
            y := y + 1; mo := dispatch._next_bit(spec.months, 1); d := 1; h := 0; mi := 0;
        ELSIF x > mo THEN
            mo := x; d := 1; h := 0; mi := 0;
        END IF;
        -- (a call as the argument would keep _next_bit from being inlined: it reads mask twice)
        days := dispatch._cron_days(spec, y, mo);
        x := dispatch._next_bit(days, d);
        IF x IS NULL THEN
            mo := mo + 1; d := 1; h := 0; mi := 0;
            IF mo > 12 THEN
                y := y + 1; mo := 1;
            END IF;
            CONTINUE;
        ELSIF x > d THEN
            d := x; h := 0; mi := 0;
        END IF;
        x := dispatch._next_bit(spec.hours, h);
        IF x IS NULL THEN
            d := d + 1; h := 0; mi := 0;
            CONTINUE;
        ELSIF x > h THEN
            h := x; mi := 0;
        END IF;
        x := dispatch._next_bit(spec.minutes, mi);
        IF x IS NULL THEN
            h := h + 1; mi := 0;
            CONTINUE;
        END IF;
        RETURN make_timestamp(y, mo, d, h, x, 0);
    END LOOP;
END
$$;


--
-- Name: _cron_slots(dispatch.cron_spec, timestamp with time zone, timestamp with time zone, text, integer); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._cron_slots(spec dispatch.cron_spec, lo timestamp with time zone, hi timestamp with time zone, tz text, max_n integer) RETURNS SETOF timestamp with time zone
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    t timestamptz := lo;
BEGIN
    FOR i IN 1..max_n LOOP
        t := dispatch.cron_spec_next(spec, t, tz);
        EXIT WHEN t > hi OR NOT isfinite(t);
        RETURN NEXT t;
    END LOOP;
END
$$;


--
-- Name: _cron_value(text, text, text, integer, integer); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._cron_value(expr text, field text, tok text, lo integer, hi integer) RETURNS integer
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
    v integer;
BEGIN
    IF tok ~ '^[0-9]+$' THEN
        IF length(tok) <= 4 THEN
            v := tok::integer;
            IF v BETWEEN lo AND hi THEN
                RETURN v;
            END IF;
        END IF;
        PERFORM dispatch._cron_error(expr, format('%s %s is outside %s-%s', field, tok, lo, hi));
    END IF;
    IF field = 'month' THEN
        v := array_position('{JAN,FEB,MAR,APR,MAY,JUN,JUL,AUG,SEP,OCT,NOV,DEC}'::text[], upper(tok));
        IF v IS NOT NULL THEN
            RETURN v;
        END IF;
        PERFORM dispatch._cron_error(expr, format('month "%s" is not a number 1-12 or a name JAN-DEC', tok));
    ELSIF field = 'day-of-week' THEN
        v := array_position('{SUN,MON,TUE,WED,THU,FRI,SAT}'::text[], upper(tok));
        IF v IS NOT NULL THEN
            RETURN v - 1;
        END IF;
        PERFORM dispatch._cron_error(expr, format('day-of-week "%s" is not a number 0-7 or a name SUN-SAT', tok));
    END IF;
    PERFORM dispatch._cron_error(expr, format('%s "%s" is not a number %s-%s', field, tok, lo, hi));
    RETURN NULL;
END
$_$;


--
-- Name: _due_heads(timestamp with time zone, integer, bigint[], timestamp with time zone[]); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._due_heads(horizon timestamp with time zone, max_runs integer, blocked_calendars bigint[], blocked_slots timestamp with time zone[]) RETURNS uuid[]
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_sort TO 'off'
    SET jit TO 'off'
    AS $$
DECLARE
    projects text[];
    per_project integer;
BEGIN
    -- cheap guard: the chunk takes all that is due (counting due entries, at most max_runs + 1)
    IF (SELECT count(*) FROM (SELECT 1 FROM dispatch.schedules s WHERE s.next_run_at <= horizon
                              LIMIT _due_heads.max_runs + 1) c) <= _due_heads.max_runs THEN
        RETURN NULL;
    END IF;
    -- Each step: the next project's first entry (its earliest next_run_at; a stopped or deleted
    -- schedule's NULL sorts last), one descent whether it is due or not.
    WITH RECURSIVE walk(project_id, next_run_at, id) AS (
        (SELECT s.project_id, s.next_run_at, s.id FROM dispatch.schedules s
         ORDER BY s.project_id, s.next_run_at LIMIT 1)
        UNION ALL
        SELECT nx.project_id, nx.next_run_at, nx.id
        FROM walk w
        CROSS JOIN LATERAL (SELECT s.project_id, s.next_run_at, s.id FROM dispatch.schedules s
                            WHERE s.project_id > w.project_id
                            ORDER BY s.project_id, s.next_run_at LIMIT 1) nx
    )
    SELECT array_agg(d.project_id) INTO projects
    FROM (SELECT w.project_id FROM walk w
          WHERE w.next_run_at <= horizon
            -- A project whose first due schedules a chunk marked already is left to the rest of
            -- the chunk: heads for it would walk past every schedule marked before (its marked
            -- ones are the first of its range: marking leaves a schedule's row where it is), and
            -- it has had its turn.
            AND NOT EXISTS (SELECT 1 FROM dispatch.runs x
                            WHERE x.schedule_id = w.id AND x.scheduled_for = w.next_run_at)
          LIMIT greatest(_due_heads.max_runs / 2, 1)) d;
    IF coalesce(cardinality(projects), 0) < 2 THEN
        RETURN NULL;
    END IF;
    per_project := greatest(max_runs / 2 / cardinality(projects), 1);
    RETURN ARRAY(
        SELECT h.id
        FROM unnest(projects) AS p(project_id)
        CROSS JOIN LATERAL (
            -- The range of the project in schedules_project_next_run_at_idx, said as a row
            -- comparison that only that index can take: statistics taken before the instant say
            -- that nothing is due, and a plan made on them walked every due schedule of every
            -- project in next_run_at order for each project (0.4 s a chunk for 50,000 due).
            SELECT s.id FROM dispatch.schedules s
            WHERE s.project_id = p.project_id
              AND (s.project_id, s.next_run_at) <= (p.project_id, horizon)
              AND s.overlap <> 'allow' AND s.backoff_reason IS NULL
              AND (s.misfire_grace IS NULL OR horizon - s.next_run_at <= s.misfire_grace + s.jitter)
              AND (s.calendar_id IS NULL
                   OR dispatch._calendar_lets_bulk(s.calendar_id, s.next_run_at, (s.cron_spec).every_us, s.catchup,
                                                   horizon, blocked_calendars, blocked_slots))
              AND NOT EXISTS (SELECT 1 FROM dispatch.runs x
                              WHERE x.schedule_id = s.id AND x.status IN ('pending', 'running'))
              AND NOT EXISTS (SELECT 1 FROM dispatch.runs x
                              WHERE x.schedule_id = s.id AND x.scheduled_for = s.next_run_at)
            ORDER BY s.project_id, s.next_run_at
            LIMIT per_project
            FOR NO KEY UPDATE OF s SKIP LOCKED) h);
END
$$;


--
-- Name: FUNCTION _due_heads(horizon timestamp with time zone, max_runs integer, blocked_calendars bigint[], blocked_slots timestamp with time zone[]); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch._due_heads(horizon timestamp with time zone, max_runs integer, blocked_calendars bigint[], blocked_slots timestamp with time zone[]) IS 'For a chunk of the tick (dispatch.tick_chunk) behind which more is due: each project''s first due schedules of the plain kind (no run policy to decide), locked SKIP LOCKED, at most half of max_runs in all, split between the projects with due schedules; NULL when the chunk takes all that is due or only one project is due. The caller marks them first.';


--
-- Name: _end_late_retries(bigint[]); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._end_late_retries(run_ids bigint[]) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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


--
-- Name: _end_schedule(dispatch.schedules); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._end_schedule(s dispatch.schedules) RETURNS dispatch.schedules
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    s.next_run_at := NULL;
    s.backoff_reason := NULL;
    s.ended_at := coalesce(s.ended_at, now());
    s.ended_reason := dispatch._ended_reason(s);
    RETURN s;
END
$$;


--
-- Name: FUNCTION _end_schedule(s dispatch.schedules); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch._end_schedule(s dispatch.schedules) IS 'The schedule row s as ended: no next_run_at, ended_at (kept if set) and ended_reason.';


--
-- Name: _end_stale_runs(bigint[], boolean, text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._end_stale_runs(run_ids bigint[], wait boolean, stopped text DEFAULT NULL::text) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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


--
-- Name: _ended_reason(dispatch.schedules); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._ended_reason(s dispatch.schedules) RETURNS text
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT CASE
        WHEN s.run_at IS NOT NULL THEN format('a one-shot: its slot (run_at %s) is past', s.run_at)
        WHEN s.max_runs IS NOT NULL AND (s.cron_spec).ends_at IS DISTINCT FROM s.ends_at
            THEN format('its %s slots from %s (max_runs, starts_at) are past', s.max_runs, s.starts_at)
        ELSE format('its slots up to ends_at %s are past', s.ends_at) END
$$;


--
-- Name: _event(text, text, jsonb, jsonb); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._event(event text, project_id text, body jsonb, detail jsonb) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    head constant jsonb := jsonb_build_object('event', event, 'at', clock_timestamp(), 'projectId', project_id)
                           || jsonb_strip_nulls(body);
BEGIN
    PERFORM pg_notify('dispatch_events', head::text);
    INSERT INTO dispatch.event_deliveries (project_id, url, payload)
    SELECT p.project_id, p.events_url, head || jsonb_strip_nulls(detail)
    FROM dispatch.projects p
    WHERE p.project_id = _event.project_id AND p.events_url IS NOT NULL;
END
$$;


--
-- Name: FUNCTION _event(event text, project_id text, body jsonb, detail jsonb); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch._event(event text, project_id text, body jsonb, detail jsonb) IS 'One event: NOTIFY dispatch_events with event, at, projectId and body''s fields (ids only), and, when the project has an events_url, queue its delivery there with detail''s fields too (dispatch.event_deliveries). NULL fields are left out.';


--
-- Name: _every_index(dispatch.cron_spec, timestamp with time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._every_index(spec dispatch.cron_spec, at timestamp with time zone) RETURNS numeric
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$ SELECT floor(extract(epoch FROM at - spec.anchor) * 1000000 / spec.every_us) $$;


--
-- Name: _every_slot(dispatch.cron_spec, numeric); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._every_slot(spec dispatch.cron_spec, k numeric) RETURNS timestamp with time zone
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$ SELECT spec.anchor + (k * spec.every_us)::bigint * interval '1 microsecond' $$;


--
-- Name: _excluded_detail(timestamp with time zone, record, timestamp with time zone, text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._excluded_detail(slot timestamp with time zone, period record, after timestamp with time zone, tz text) RETURNS text
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN format('slot %s falls in calendar %s (%s, %s to %s): it does not run (a gap, calendar); %s',
                  dispatch._instant(slot), period.calendar, coalesce(quote_literal(period.label), 'excluded'),
                  dispatch._instant(period.starts_at), dispatch._instant(period.ends_at),
                  CASE WHEN after IS NULL OR NOT isfinite(after) THEN 'no slot after it runs: the schedule ends there'
                       ELSE format('the next slot that runs is %s%s', dispatch._instant(after),
                                   CASE WHEN tz <> 'UTC' THEN format(' (%s %s)', to_char(after AT TIME ZONE tz, 'Dy HH24:MI'), tz)
                                        ELSE '' END) END);
END
$$;


--
-- Name: _expire_leases(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._expire_leases() RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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
        error = left(format('lease of %s expired on attempt %s', r.worker, r.attempt), 500),
        earlier_attempts = coalesce(r.earlier_attempts, '[]') || jsonb_build_object(
            'attempt', r.attempt, 'status', 'lost', 'error', format('lease of %s expired', r.worker),
            'claimedAt', r.claimed_at, 'at', clock)
    FROM dispatch.schedules s
    WHERE r.id = ANY (ids) AND s.id = r.schedule_id
      AND r.attempt - r.released < s.max_attempts AND s.enabled AND s.deleted_at IS NULL AND s.paused_at IS NULL;
    GET DIAGNOSTICS requeued = ROW_COUNT;

    -- Otherwise lost: the attempt may have been invoked, so never skipped.
    WITH lost AS (
        UPDATE dispatch.runs r
        SET status = 'lost', finished_at = clock,
            error = left(CASE WHEN s.enabled AND s.deleted_at IS NULL AND s.paused_at IS NULL
                              THEN format('lease of %s expired on attempt %s of %s', r.worker, r.attempt - r.released,
                                          s.max_attempts)
                              ELSE format('lease of %s expired on attempt %s after the schedule was %s: it may have run',
                                          r.worker, r.attempt, dispatch._stopped_as(s))
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


--
-- Name: _explain_cap(text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._explain_cap(project text, OUT max_concurrency integer, OUT running integer, OUT holder integer, OUT takes bigint[]) RETURNS record
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    room integer;
BEGIN
    SELECT p.max_concurrency INTO _explain_cap.max_concurrency
    FROM dispatch.projects p WHERE p.project_id = _explain_cap.project;
    IF _explain_cap.max_concurrency IS NULL THEN
        RETURN;
    END IF;
    _explain_cap.running := coalesce((SELECT c.counts[1] FROM dispatch._running_counts(ARRAY[_explain_cap.project]) c),
                                     0);  -- as the claim counts them
    _explain_cap.holder := dispatch._project_holder(_explain_cap.project);
    room := CASE WHEN _explain_cap.holder IS NULL
                 THEN greatest(_explain_cap.max_concurrency - _explain_cap.running, 0) ELSE 0 END;
    -- not_before over first, then by slot, each from the project's own queue (its range, as
    -- dispatch.claim_runs says it), past the runs another transaction holds (SKIP LOCKED)
    _explain_cap.takes := ARRAY(
        SELECT q.id FROM (
            (SELECT r.id, 1 AS queue, r.not_before AS k FROM dispatch.runs r
             WHERE (r.project_id, r.not_before)
                   BETWEEN (_explain_cap.project, '-infinity') AND (_explain_cap.project, now())
               AND r.status = 'pending' AND r.not_before IS NOT NULL
               AND dispatch._row_holder(r.xmax, 'dispatch.runs') IS NULL
             ORDER BY r.project_id, r.not_before, r.id LIMIT room)
            UNION ALL
            (SELECT r.id, 2, r.scheduled_for FROM dispatch.runs r
             WHERE r.project_id = _explain_cap.project AND r.status = 'pending' AND r.not_before IS NULL
               AND dispatch._row_holder(r.xmax, 'dispatch.runs') IS NULL
             ORDER BY r.project_id, r.scheduled_for, r.id LIMIT room)) q
        ORDER BY q.queue, q.k, q.id
        LIMIT room);
END
$$;


--
-- Name: _explain_next(dispatch.cron_spec, timestamp with time zone, text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._explain_next(spec dispatch.cron_spec, after timestamp with time zone, tz text) RETURNS timestamp with time zone
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN dispatch.cron_spec_next(spec, after, tz);
EXCEPTION WHEN OTHERS THEN
    RETURN NULL;
END
$$;


--
-- Name: _explain_open(dispatch.schedules); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._explain_open(s dispatch.schedules) RETURNS TABLE(id bigint, kind text, status text, scheduled_for timestamp with time zone, fire_at timestamp with time zone, not_before timestamp with time zone, attempt integer, released integer, worker text, claimed_at timestamp with time zone, lease_until timestamp with time zone, error text, verdict text)
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT r.id, r.kind, r.status, r.scheduled_for, r.fire_at, r.not_before, r.attempt, r.released, r.worker,
           r.claimed_at, r.lease_until, r.error,
           CASE WHEN r.status = 'running' AND r.lease_until < now() THEN 'expired'
                WHEN r.status = 'running' THEN 'running'
                WHEN c.max_concurrency IS NOT NULL AND (r.not_before IS NULL OR r.not_before <= now())
                     AND r.id <> ALL (c.takes) THEN 'capped'
                WHEN dispatch._stopped_as(s) IS NOT NULL THEN 'stale'
                WHEN r.not_before = 'infinity' AND r.kind = 'backfill' THEN 'waits_turn'
                WHEN r.not_before = 'infinity' THEN 'buffered'
                WHEN r.not_before > now() AND r.held_by_breaker THEN 'breaker'
                WHEN r.not_before > now() THEN CASE WHEN r.attempt > r.released THEN 'retry_wait'
                                                    ELSE 'jitter_wait' END
                WHEN dispatch._missed(r, s) THEN 'missed'
                -- dispatch._claim_verdict's 'late', however the run came back to pending
                WHEN r.attempt > r.released AND r.attempt - r.released >= s.max_attempts THEN 'late'
                WHEN r.kind = 'scheduled' AND r.attempt > r.released
                     AND (r.earlier_attempts -> -1 ->> 'status') IS DISTINCT FROM 'lost'
                     AND now() >= dispatch._explain_next(s.cron_spec, r.scheduled_for, s.timezone) THEN 'late'
                -- due, but its function's breaker is open: held, unless it goes as the probe
                WHEN EXISTS (SELECT 1 FROM dispatch.breakers b
                             WHERE b.project_id = s.project_id AND b.function_name = s.function_name
                               AND b.state = 'open') THEN 'breaker'
                ELSE 'pending' END
    FROM dispatch.runs r
    CROSS JOIN dispatch._explain_cap(s.project_id) c
    WHERE r.schedule_id = s.id AND r.status IN ('pending', 'running')
$$;


--
-- Name: _finish_runs(dispatch.runs[]); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._finish_runs(finished dispatch.runs[]) RETURNS TABLE(run_id bigint, advanced boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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


--
-- Name: _follow_up(uuid[]); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._follow_up(schedule_ids uuid[]) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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


--
-- Name: _hold_for_breakers(bigint[]); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._hold_for_breakers(run_ids bigint[]) RETURNS bigint[]
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_indexscan TO 'off'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
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


--
-- Name: _holds_table(integer, regclass); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._holds_table(pid integer, tbl regclass) RETURNS boolean
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks t
                   WHERE t.pid = _holds_table.pid AND t.locktype = 'relation'
                     AND t.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())
                     AND t.relation = _holds_table.tbl AND t.granted AND t.mode <> 'AccessShareLock')
$$;


--
-- Name: _instant(timestamp with time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._instant(t timestamp with time zone) RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT CASE WHEN isfinite(t) THEN date_trunc('second', t)::text ELSE t::text END
$$;


--
-- Name: _mark_due(timestamp with time zone, integer); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._mark_due(horizon timestamp with time zone, max_runs integer, OUT marked integer, OUT taken integer) RETURNS record
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    SET jit TO 'off'
    AS $$
DECLARE
    requeued integer := 0;
    plain_at tid[];
    by_policy uuid[];
    changed_since uuid[];
    sid uuid;
    moved boolean := false;
    heads uuid[];
    more_policy uuid[];
    marked_before integer;
    pass integer;
    got integer;
    found_marked integer;
    blocked_calendars bigint[];
    blocked_slots timestamptz[];
    passed_ids uuid[];
    passed_los timestamptz[];
    passed_his timestamptz[];
    passed_done uuid[];
BEGIN
    PERFORM dispatch._require_read_committed('dispatch.tick');
    -- Statistics that say runs is all but empty while it holds tens of thousands (what an
    -- autovacuum that ran amid a chunk's insert leaves) make every plan take runs for a row or
    -- two. They are mended before the marking is planned, without waiting for a lock another
    -- vacuum or ANALYZE holds (a later tick tries again). Two signs: the statistics system counts
    -- twice the rows the planner assumes; or the planner assumes next to none while a thousand
    -- runs are open (counted here: in a big instant's first second the statistics system does not
    -- count yet what the first chunk committed).
    IF (SELECT (c.reltuples < pg_stat_get_live_tuples(c.oid) / 2 AND pg_stat_get_live_tuples(c.oid) > 10000)
               OR (c.reltuples < 500
                   AND (SELECT count(*) FROM (SELECT FROM dispatch.runs r WHERE r.status IN ('pending', 'running')
                                              LIMIT 1000) o) = 1000)
        FROM pg_class c WHERE c.oid = 'dispatch.runs'::regclass) THEN
        ANALYZE (SKIP_LOCKED) dispatch.runs;
    END IF;
    IF max_runs IS NULL THEN
        requeued := dispatch._expire_leases();
    END IF;

    -- Due schedules, each locked or left to the tick that holds it. A schedule whose run is open
    -- is not even locked when its overlap policy has nothing to add (skip; buffer_one with its
    -- buffer full).
    --
    -- Two statements: the first locks, the second decides. What the first reads of runs comes
    -- from a snapshot taken before it locked, and a tick that held a schedule until it committed
    -- (it marked a run; the schedule row stays as it was) can have released it in between: the
    -- first statement then takes the schedule for one with no open run. The second statement's
    -- snapshot is taken after every lock was granted, so it sees the run of whoever held the
    -- schedule before, and the check and the insert are one decision under the lock. (A tick
    -- at REPEATABLE READ keeps its first snapshot: refused, see _require_read_committed.)
    marked := 0;
    taken := 0;
    -- A chunk behind which more is due takes each project's first due schedules first
    -- (dispatch._due_heads), so that one project's burst does not hold everyone else's slot until
    -- the last chunk; then the rest, in next_run_at order (pass 2). Each pass locks, then decides
    -- (the second statement below, shared).
    BEGIN
      -- the slots due that a period of their calendar holds go to the policies
      SELECT * INTO blocked_calendars, blocked_slots FROM dispatch._calendar_blocked(horizon);
      IF max_runs IS NOT NULL THEN
          heads := dispatch._due_heads(horizon, max_runs, blocked_calendars, blocked_slots);
      END IF;
      FOR pass IN 1..2 LOOP
        IF pass = 1 THEN
            IF heads IS NULL THEN
                CONTINUE;
            END IF;
            -- where the heads lie: _due_heads locked them, so they stay there
            plain_at := ARRAY(SELECT s.ctid FROM dispatch.schedules s WHERE s.id = ANY (heads));
            got := cardinality(heads);
        ELSE
        WITH due AS MATERIALIZED (
            SELECT s.id, s.ctid AS tid, s.next_run_at, s.cron_spec, s.timezone, s.catchup, s.jitter,
                   s.overlap <> 'allow' AND o.open = 0 AND s.backoff_reason IS NULL
                   AND (s.misfire_grace IS NULL OR horizon - s.next_run_at <= s.misfire_grace + s.jitter)
                   AND (s.calendar_id IS NULL
                        OR dispatch._calendar_lets_bulk(s.calendar_id, s.next_run_at, (s.cron_spec).every_us,
                                                        s.catchup, horizon, blocked_calendars,
                                                        blocked_slots)) AS plain
            FROM dispatch.schedules s
            -- Its open runs: one probe of runs_open_idx. Under skip, and for a chunk, any open
            -- run leaves the schedule alone, unlocked: that is how later chunks and the tick
            -- after them pass over the schedules marked before. Whether a run already stands on
            -- the slot (one that finished while the schedule stayed on it) is the second
            -- statement's to see: it sends such a schedule to the policies.
            -- (OFFSET 0: evaluated once a row, not once for each place that reads it.)
            CROSS JOIN LATERAL (SELECT count(*) AS open FROM dispatch.runs x
                                WHERE x.schedule_id = s.id AND x.status IN ('pending', 'running')
                                  AND NOT dispatch._waits_its_turn(x)
                                OFFSET 0) o
            WHERE s.next_run_at <= horizon
              AND (o.open = 0 OR s.overlap = 'allow' OR (s.overlap = 'buffer_one' AND o.open = 1))
              AND (_mark_due.max_runs IS NULL
                   OR (s.overlap <> 'allow' AND o.open = 0 AND s.backoff_reason IS NULL
                       AND (s.misfire_grace IS NULL OR horizon - s.next_run_at <= s.misfire_grace + s.jitter)
                       AND (s.calendar_id IS NULL
                            OR dispatch._calendar_lets_bulk(s.calendar_id, s.next_run_at, (s.cron_spec).every_us,
                                                            s.catchup, horizon, blocked_calendars,
                                                            blocked_slots))))
            LIMIT _mark_due.max_runs - taken  -- NULL: all
            FOR NO KEY UPDATE OF s SKIP LOCKED
        )
        SELECT count(*), array_agg(d.tid) FILTER (WHERE d.plain), array_agg(d.id) FILTER (WHERE NOT d.plain)
        INTO got, plain_at, more_policy
        FROM due d;
        by_policy := by_policy || more_policy;
        END IF;
        taken := taken + got;

        WITH seen AS MATERIALIZED (
            -- as committed now: the schedule's open runs, and the run on its slot
            SELECT s.id, s.project_id, s.next_run_at, s.cron_spec, s.timezone, s.catchup, s.jitter,
                   s.overlap, s.backoff_reason,
                   EXISTS (SELECT 1 FROM dispatch.runs x
                           WHERE x.schedule_id = s.id AND x.status IN ('pending', 'running')
                             AND NOT dispatch._waits_its_turn(x)) AS open,
                   (SELECT x.status FROM dispatch.runs x
                    WHERE x.schedule_id = s.id AND x.scheduled_for = s.next_run_at) AS on_slot
            FROM dispatch.schedules s
            -- where the first statement locked them: no descent of schedules_pkey for each
            WHERE s.ctid = ANY (plain_at)
        ), checked AS (
            SELECT d.*, NOT d.open AND d.on_slot IS NULL AS plain,
                   -- Marked since the first statement's snapshot by a tick that held the schedule
                   -- until then (thousands at the top of a minute when ticks race): under skip,
                   -- its open run on the slot leaves the policies nothing to decide.
                   d.overlap = 'skip' AND d.open AND d.backoff_reason IS NULL
                   AND d.on_slot IN ('pending', 'running') AS settled
            FROM seen d
        ), slot AS (
            -- The slot to run: next_run_at when on time (cron slots are at least a minute apart,
            -- interval slots every_us, so none was missed) or under catchup all (the oldest
            -- first); under catchup latest, the most recent slot due, the missed ones coalesced
            -- into it.
            SELECT d.id, d.project_id, d.next_run_at AS due_at,
                   CASE WHEN horizon - d.next_run_at < coalesce((d.cron_spec).every_us * interval '1 microsecond',
                                                                interval '1 minute')
                             OR d.catchup = 'all' THEN d.next_run_at
                        ELSE coalesce(dispatch._cron_latest(d.cron_spec, d.next_run_at - interval '1 microsecond',
                                                            horizon, d.timezone),
                                      d.next_run_at)
                   END AS scheduled_for,
                   d.jitter
            FROM checked d WHERE d.plain
        ), fire AS (
            SELECT x.id, x.project_id, x.scheduled_for,
                   x.scheduled_for + CASE WHEN x.jitter > interval '0'
                                          THEN dispatch.jitter_offset(x.id, x.scheduled_for, x.jitter)
                                          ELSE interval '0' END AS fire_at
            FROM slot x
        ), new_runs AS (
            -- a slot whose jittered instant is still ahead waits for it (not_before)
            INSERT INTO dispatch.runs (schedule_id, project_id, scheduled_for, fire_at, not_before)
            SELECT f.id, f.project_id, f.scheduled_for, f.fire_at, CASE WHEN f.fire_at > horizon THEN f.fire_at END
            FROM fire f
            -- No ON CONFLICT: each slot was seen free under its schedule's lock, and an arbiter
            -- would check both unique indexes before every insert for nothing. A run put on a
            -- slot by hand meanwhile fails the statement into the one-by-one path below.
            RETURNING 1
        ), coalesced AS (
            -- skip and buffer_one stay on the slot they run until it finishes (a data-modifying
            -- WITH runs whether or not it is read)
            UPDATE dispatch.schedules s SET next_run_at = x.scheduled_for
            FROM slot x WHERE s.id = x.id AND x.scheduled_for <> x.due_at
        ), gaps AS (
            -- the slots coalesced into the latest: a gap (catch-up)
            SELECT CASE WHEN count(*) > 0
                        THEN dispatch._record_gaps(array_agg(x.id), array_agg(x.due_at - interval '1 microsecond'),
                                                   array_agg(x.scheduled_for), 'catch-up')
                   END AS n
            FROM slot x WHERE x.scheduled_for <> x.due_at
        )
        SELECT (SELECT count(*) FROM new_runs), array_agg(d.id) FILTER (WHERE NOT d.plain AND NOT d.settled)
        INTO found_marked, changed_since
        FROM checked d CROSS JOIN gaps;
        marked := marked + found_marked;
        -- what changed between the two statements goes to the policies, which read it afresh
        by_policy := by_policy || changed_since;
      END LOOP;

      -- The schedules on a blocked pair that nothing else sends to the policies pass over their
      -- period together, as dispatch._tick_schedule would one by one (a holiday over a
      -- stampede): the slot after it computed once per rule, zone, calendar and slot, their gaps
      -- recorded by one call that shares the arithmetic too. Those whose next slot is due go on
      -- to the policies, which mark it.
      IF cardinality(blocked_calendars) > 0 AND by_policy IS NOT NULL THEN
          WITH passing AS MATERIALIZED (
              SELECT s.id, s.cron_spec, s.timezone, s.calendar_id, s.next_run_at
              FROM dispatch.schedules s
              JOIN unnest(blocked_calendars, blocked_slots) AS b(calendar_id, slot)
                ON b.calendar_id = s.calendar_id AND b.slot = s.next_run_at
              WHERE s.id = ANY (by_policy) AND s.backoff_reason IS NULL
                AND (s.misfire_grace IS NULL OR horizon - s.next_run_at <= s.misfire_grace + s.jitter)
                AND (s.overlap = 'allow'
                     OR NOT EXISTS (SELECT 1 FROM dispatch.runs x
                                    WHERE x.schedule_id = s.id AND x.status IN ('pending', 'running')
                                      AND NOT dispatch._waits_its_turn(x)))
                AND NOT EXISTS (SELECT 1 FROM dispatch.runs x
                                WHERE x.schedule_id = s.id AND x.scheduled_for = s.next_run_at)
          ), after AS MATERIALIZED (
              SELECT v.*, CASE WHEN v.slot <= horizon THEN NOT dispatch.calendar_excludes(v.calendar_id, v.slot)
                               ELSE false END AS due
              FROM (SELECT u.*, dispatch._calendar_slot(u.cron_spec, u.timezone, u.calendar_id, u.next_run_at) AS slot
                    FROM (SELECT DISTINCT p.cron_spec, p.timezone, p.calendar_id, p.next_run_at FROM passing p) u) v
          ), moved AS (
              UPDATE dispatch.schedules s SET next_run_at = a.slot
              FROM passing p JOIN after a USING (cron_spec, timezone, calendar_id, next_run_at)
              WHERE s.id = p.id
              RETURNING s.id, p.next_run_at AS was, a.slot, a.due
          )
          SELECT array_agg(m.id), array_agg(m.was - interval '1 microsecond'), array_agg(m.slot),
                 array_agg(m.id) FILTER (WHERE NOT m.due)
          INTO passed_ids, passed_los, passed_his, passed_done
          FROM moved m;
          IF passed_ids IS NOT NULL THEN
              PERFORM dispatch._record_gaps(passed_ids, passed_los, passed_his, 'calendar');
              by_policy := ARRAY(SELECT unnest(by_policy) EXCEPT SELECT unnest(passed_done));
              moved := true;
          END IF;
      END IF;
    EXCEPTION WHEN OTHERS THEN
        -- A slot that cannot be computed (a zone gone from the tz database), or a run put on a
        -- slot by hand while the statement ran, fails it for every schedule in it: each due
        -- schedule then goes on its own, and only that one backs off.
        -- A chunk (max_runs) leaves them to the unlimited tick that follows it.
        marked := 0;
        taken := 0;
        IF max_runs IS NULL THEN
            by_policy := ARRAY(SELECT s.id FROM dispatch.schedules s WHERE s.next_run_at <= horizon
                               FOR NO KEY UPDATE SKIP LOCKED);
        END IF;
    END;

    -- One subtransaction for all of them: one each would be thousands at the top of an hour of
    -- schedules with policies, past the 64 a backend keeps in shared memory, and every snapshot
    -- taken meanwhile would look their transaction ids up in pg_subtrans. Only when one fails
    -- (its slots cannot be computed) does each go on its own, that one backing off.
    IF cardinality(by_policy) > 0 THEN
        moved := true;
        marked_before := marked;
        BEGIN
            FOREACH sid IN ARRAY by_policy LOOP
                marked := marked + dispatch._tick_schedule(sid, horizon);
            END LOOP;
        EXCEPTION WHEN OTHERS THEN
            marked := marked_before;
            FOREACH sid IN ARRAY by_policy LOOP
                marked := marked + dispatch._tick_schedule_guarded(sid, horizon);
            END LOOP;
        END;
    END IF;

    -- Retries whose back-off is over wait for a claim like the runs just marked.
    IF marked + requeued > 0
       OR EXISTS (SELECT 1 FROM dispatch.runs r WHERE r.status = 'pending' AND r.not_before <= clock_timestamp()) THEN
        PERFORM pg_notify('dispatch', json_build_object('marked', marked, 'requeued', requeued)::text);
    END IF;
    IF moved THEN
        PERFORM pg_notify('dispatch', 'schedules');  -- next_run_at may have moved: listeners re-plan
    END IF;
END
$$;


--
-- Name: _missed(dispatch.runs, dispatch.schedules); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._missed(r dispatch.runs, s dispatch.schedules) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT r.attempt OPERATOR(pg_catalog.=) r.released AND r.kind OPERATOR(pg_catalog.=) 'scheduled'
       AND s.misfire_grace IS NOT NULL
       AND (pg_catalog.now() OPERATOR(pg_catalog.-) COALESCE(r.fire_at, r.scheduled_for))
           OPERATOR(pg_catalog.>) s.misfire_grace
$$;


--
-- Name: _missed_by(interval); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._missed_by(late interval) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT 'missed by ' || CASE
        WHEN late >= interval '1 day' THEN extract(day FROM late)::int || ' d ' || extract(hour FROM late)::int || ' h'
        WHEN late >= interval '1 hour' THEN extract(hour FROM late)::int || ' h ' || extract(minute FROM late)::int || ' min'
        WHEN late >= interval '1 minute' THEN extract(minute FROM late)::int || ' min ' || floor(extract(second FROM late))::int || ' s'
        ELSE round(extract(epoch FROM late))::int || ' s'
    END
$$;


--
-- Name: _next_bit(bigint, integer); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._next_bit(mask bigint, k integer) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN (mask OPERATOR(pg_catalog.>>) k) OPERATOR(pg_catalog.=) 0 THEN NULL
                ELSE k OPERATOR(pg_catalog.+) pg_catalog.round(
                         pg_catalog.ln(((mask OPERATOR(pg_catalog.>>) k) OPERATOR(pg_catalog.&)
                                        (OPERATOR(pg_catalog.-) (mask OPERATOR(pg_catalog.>>) k)))::pg_catalog.float8)
                         OPERATOR(pg_catalog./) 0.6931471805599453)::pg_catalog.int4
           END
$$;


--
-- Name: _next_slot(dispatch.cron_spec, timestamp with time zone, text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._next_slot(spec dispatch.cron_spec, after timestamp with time zone, tz text) RETURNS timestamp with time zone
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN dispatch.cron_spec_next(spec, after, tz);
EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'cannot compute the next slot of % in %: %', spec, tz, SQLERRM;
    RETURN NULL;
END
$$;


--
-- Name: _operable_schedule(uuid, text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._operable_schedule(schedule_id uuid, verb text) RETURNS dispatch.schedules
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    s dispatch.schedules;
BEGIN
    SELECT * INTO s FROM dispatch.schedules WHERE id = _operable_schedule.schedule_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'cannot %: schedule % does not exist', verb, schedule_id
            USING ERRCODE = 'no_data_found';
    END IF;
    IF s.deleted_at IS NOT NULL THEN
        RAISE EXCEPTION 'cannot %: schedule % was deleted at %', verb, schedule_id, s.deleted_at
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    RETURN s;
END
$$;


--
-- Name: _probe_delay(integer); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._probe_delay(probes integer) RETURNS interval
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT dispatch._probe_spacing(probes) * (1 - 0.25 * random())
$$;


--
-- Name: _probe_spacing(integer); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._probe_spacing(probes integer) RETURNS interval
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT least(st.breaker_probe_spacing * power(2, least(greatest(probes, 0), 30)), st.breaker_probe_spacing_max)
    FROM dispatch.settings st
$$;


--
-- Name: _project_holder(text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._project_holder(project text) RETURNS integer
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT dispatch._row_holder(p.xmax, 'dispatch.projects') FROM dispatch.projects p WHERE p.project_id = project
$$;


--
-- Name: _prune_audit(bigint, bigint); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._prune_audit(after_id bigint, INOUT up_to bigint, OUT last_id bigint, OUT deleted bigint) RETURNS record
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    cutoff constant timestamptz := now() - (SELECT audit_retention FROM dispatch.settings);
BEGIN
    IF up_to IS NULL THEN
        up_to := (SELECT max(a.id) FROM dispatch.audit_log a WHERE a.at < cutoff);
    END IF;
    WITH page AS MATERIALIZED (
        SELECT a.id, a.at
        FROM dispatch.audit_log a
        WHERE a.id > _prune_audit.after_id AND a.id <= up_to
        ORDER BY a.id
        LIMIT (SELECT prune_batch_size FROM dispatch.settings)
    ), gone AS (
        DELETE FROM dispatch.audit_log a USING page p
        WHERE a.id = p.id AND p.at < cutoff
        RETURNING 1
    )
    SELECT max(p.id), (SELECT count(*) FROM gone) INTO last_id, deleted FROM page p;
    IF last_id >= up_to THEN
        last_id := NULL;
    END IF;
END
$$;


--
-- Name: _prune_event_deliveries(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._prune_event_deliveries() RETURNS bigint
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    WITH gone AS (
        DELETE FROM dispatch.event_deliveries d
        WHERE coalesce(d.delivered_at, d.gave_up_at) < now() - (SELECT audit_retention FROM dispatch.settings)
        RETURNING 1
    )
    SELECT count(*) FROM gone
$$;


--
-- Name: FUNCTION _prune_event_deliveries(); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch._prune_event_deliveries() IS 'Delete the event deliveries delivered or given up longer ago than the audit retention; returns how many.';


--
-- Name: _prune_runs(bigint, bigint); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._prune_runs(after_id bigint, INOUT up_to bigint, OUT last_id bigint, OUT deleted bigint) RETURNS record
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    cutoff constant timestamptz := now() - (SELECT runs_retention FROM dispatch.settings);
BEGIN
    IF up_to IS NULL THEN
        up_to := (SELECT max(r.id) FROM dispatch.runs r WHERE r.created_at < cutoff);
    END IF;
    WITH page AS MATERIALIZED (
        SELECT r.id, r.created_at, r.finished_at
        FROM dispatch.runs r
        WHERE r.id > _prune_runs.after_id AND r.id <= up_to
        ORDER BY r.id
        LIMIT (SELECT prune_batch_size FROM dispatch.settings)
    ), gone AS (
        DELETE FROM dispatch.runs r USING page p
        WHERE r.id = p.id AND p.created_at < cutoff AND p.finished_at < cutoff
        RETURNING 1
    )
    SELECT max(p.id), (SELECT count(*) FROM gone) INTO last_id, deleted FROM page p;
    IF last_id >= up_to THEN
        last_id := NULL;
    END IF;
END
$$;


--
-- Name: _record_gaps(uuid[], timestamp with time zone[], timestamp with time zone[], text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._record_gaps(schedule_ids uuid[], los timestamp with time zone[], his timestamp with time zone[], reason text) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    recorded integer;
BEGIN
    WITH gap AS (
        SELECT s.id, s.project_id, s.function_name, s.cron_spec, s.timezone, s.calendar_id, x.lo, x.hi
        FROM unnest(_record_gaps.schedule_ids, _record_gaps.los, _record_gaps.his) AS x(id, lo, hi)
        JOIN dispatch.schedules s ON s.id = x.id
        WHERE x.hi > x.lo
    ), span AS MATERIALIZED (
        SELECT u.cron_spec, u.timezone, u.lo, u.hi, b.*
        FROM (SELECT DISTINCT g.cron_spec, g.timezone, g.lo, g.hi FROM gap g) u
        CROSS JOIN LATERAL dispatch._slots_between(u.cron_spec, u.lo, u.hi, u.timezone) b
    ), written AS (
        INSERT INTO dispatch.audit_log (actor_id, project_id, action, metadata)
        SELECT NULL, g.project_id, 'schedule.slots.skipped', jsonb_build_object(
                   'scheduleId', g.id, 'functionName', g.function_name, 'first', p.first_slot,
                   'last', p.last_slot, 'count', p.slots, 'countIsAtLeast', p.at_least,
                   'reason', _record_gaps.reason)
               || CASE WHEN _record_gaps.reason = 'calendar'
                       THEN jsonb_build_object('calendar', (SELECT c.name FROM dispatch.calendars c
                                                            WHERE c.id = g.calendar_id))
                       ELSE '{}' END
        FROM gap g
        JOIN span p ON p.cron_spec = g.cron_spec AND p.timezone = g.timezone AND p.lo = g.lo AND p.hi = g.hi
        WHERE p.first_slot IS NOT NULL
        RETURNING 1
    )
    SELECT count(*)::integer INTO recorded FROM written;
    RETURN recorded;
END
$$;


--
-- Name: _refuse(text, text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._refuse(problem text, hint text DEFAULT NULL::text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF problem IS NOT NULL AND hint IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = problem, HINT = hint;
    ELSIF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = problem;
    END IF;
END
$$;


--
-- Name: FUNCTION _refuse(problem text, hint text); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch._refuse(problem text, hint text) IS 'Raise 22023 with problem as the message and hint as the hint, when problem is not NULL.';


--
-- Name: _release_held(text, text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._release_held(project_id text, function_name text) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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


--
-- Name: _require_read_committed(text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._require_read_committed(what text) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION '% must run at READ COMMITTED, not %', what, upper(current_setting('transaction_isolation'))
            USING ERRCODE = 'invalid_transaction_state',
                  DETAIL = 'It decides from the runs it sees after locking a schedule; a transaction''s older snapshot would miss a run committed meanwhile.',
                  HINT = 'Run it in its own transaction at READ COMMITTED (BEGIN ISOLATION LEVEL READ COMMITTED), or set default_transaction_isolation to read committed for the role that calls it (ALTER ROLE ... SET).';
    END IF;
END
$$;


--
-- Name: _retry_delay(dispatch.schedules, integer, integer); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._retry_delay(s dispatch.schedules, attempt integer, retry_after_ms integer) RETURNS interval
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT least(CASE WHEN retry_after_ms IS NOT NULL THEN make_interval(secs => greatest(retry_after_ms, 0) / 1000.0)
                      ELSE random() * least(s.retry_backoff * power(2, least(attempt - 1, 30)), s.retry_backoff_max)
                 END,
                 s.retry_backoff_max)
$$;


--
-- Name: _row_holder(xid, regclass); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._row_holder(locker xid, tbl regclass) RETURNS integer
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    holder integer;
BEGIN
    IF locker IS NULL OR locker = '0'::xid THEN
        RETURN NULL;
    END IF;
    -- a transaction that locked or updated it, in progress; else several that share it
    SELECT l.pid INTO holder FROM pg_catalog.pg_locks l
    WHERE l.locktype = 'transactionid' AND l.transactionid = locker AND l.mode = 'ExclusiveLock' AND l.granted
      AND dispatch._holds_table(l.pid, tbl);
    IF holder IS NULL THEN
        BEGIN
            SELECT l.pid INTO holder
            FROM pg_catalog.pg_get_multixact_members(locker) m
            JOIN pg_catalog.pg_locks l
              ON l.locktype = 'transactionid' AND l.transactionid = m.xid AND l.mode = 'ExclusiveLock' AND l.granted
            WHERE m.mode <> 'keysh' AND dispatch._holds_table(l.pid, tbl)
            ORDER BY l.pid LIMIT 1;
        EXCEPTION WHEN OTHERS THEN  -- no MultiXactId of that number (most often: a claim long committed)
            NULL;
        END;
    END IF;
    RETURN holder;
END
$$;


--
-- Name: _run_fire_at(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._run_fire_at() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    NEW.fire_at := NEW.scheduled_for;
    RETURN NEW;
END
$$;


--
-- Name: _running_counts(text[]); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._running_counts(projects text[], OUT project_ids text[], OUT counts integer[]) RETURNS record
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_bitmapscan TO 'off'
    AS $$
BEGIN
    SELECT coalesce(array_agg(c.project_id), '{}'), coalesce(array_agg(c.n), '{}') INTO project_ids, counts
    FROM (SELECT x.project_id, count(*)::integer AS n FROM dispatch.runs x
          WHERE x.status = 'running' AND x.project_id = ANY (_running_counts.projects)
          GROUP BY x.project_id) c;
END
$$;


--
-- Name: FUNCTION _running_counts(projects text[], OUT project_ids text[], OUT counts integer[]); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch._running_counts(projects text[], OUT project_ids text[], OUT counts integer[]) IS 'How many runs of each of the projects given are running (projects with none are left out): what dispatch.claim_runs counts against max_concurrency, and dispatch.explain shows.';


--
-- Name: _runs_failed(dispatch.runs[]); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._runs_failed(finished dispatch.runs[]) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    s record;
    last_runs bigint[];
    all_failed boolean;
BEGIN
    PERFORM dispatch._event('run.failed', f.project_id,
                jsonb_build_object('runId', f.id, 'scheduleId', f.schedule_id, 'status', f.status,
                                   'attempt', f.attempt - f.released, 'kind', f.kind),
                jsonb_build_object('functionName', x.function_name, 'error', f.error, 'requestId', f.request_id,
                                   'scheduledFor', f.scheduled_for))
    FROM unnest(finished) f
    JOIN dispatch.schedules x ON x.id = f.schedule_id
    WHERE f.status IN ('error', 'lost');

    FOR s IN SELECT DISTINCT x.id, x.project_id, x.function_name, x.pause_after_failures, x.updated_at
             FROM unnest(finished) f
             JOIN dispatch.schedules x ON x.id = f.schedule_id
             WHERE f.status IN ('error', 'lost') AND x.pause_after_failures IS NOT NULL
               AND x.enabled AND x.paused_at IS NULL AND x.deleted_at IS NULL AND x.ended_at IS NULL
    LOOP
        SELECT array_agg(r.id ORDER BY r.scheduled_for, r.id), bool_and(r.status <> 'ok')
        INTO last_runs, all_failed
        FROM (SELECT r.id, r.status, r.scheduled_for FROM dispatch.runs r
              WHERE r.schedule_id = s.id AND r.status IN ('ok', 'error', 'lost') AND r.finished_at >= s.updated_at
              ORDER BY r.scheduled_for DESC, r.id DESC
              LIMIT s.pause_after_failures) r;
        IF cardinality(last_runs) = s.pause_after_failures AND all_failed THEN
            -- (the runs named: all of them, or the first three and the last three)
            UPDATE dispatch.schedules
            SET paused_at = now(), paused_by = 'pgdispatch',
                paused_reason = format('paused itself: its last %s runs failed (runs %s); dispatch.resume() starts the count again',
                                       s.pause_after_failures,
                                       CASE WHEN cardinality(last_runs) <= 6 THEN array_to_string(last_runs, ', ')
                                            ELSE array_to_string(last_runs[1:3], ', ') || ', …, '
                                                 || array_to_string(last_runs[cardinality(last_runs) - 2:], ', ') END)
            WHERE id = s.id;
            PERFORM dispatch._event('schedule.paused', s.project_id,
                        jsonb_build_object('scheduleId', s.id, 'pauseAfterFailures', s.pause_after_failures),
                        jsonb_build_object('functionName', s.function_name, 'failedRuns', to_jsonb(last_runs)));
        END IF;
    END LOOP;
END
$$;


--
-- Name: FUNCTION _runs_failed(finished dispatch.runs[]); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch._runs_failed(finished dispatch.runs[]) IS 'For runs just finished: a run.failed event (dispatch_events) for each that ended error or lost, and the self-pause of each of their schedules whose last pause_after_failures runs since it was last written all failed.';


--
-- Name: _schedule_audit(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._schedule_audit() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    action text;
    changed jsonb;
BEGIN
    IF TG_OP = 'INSERT' THEN
        action := 'schedule.create';
    ELSIF NEW.deleted_at IS NOT NULL AND OLD.deleted_at IS NULL THEN
        action := 'schedule.delete';
    ELSIF NEW.paused_at IS NOT NULL AND OLD.paused_at IS NULL THEN
        action := 'schedule.pause';
    ELSIF NEW.paused_at IS NULL AND OLD.paused_at IS NOT NULL THEN
        action := 'schedule.resume';
    ELSE
        action := 'schedule.update';
        SELECT jsonb_object_agg(n.key, n.value) INTO changed
        FROM jsonb_each(to_jsonb(NEW)) n
        JOIN jsonb_each(to_jsonb(OLD)) o USING (key)
        WHERE n.key IN ('project_id', 'function_name', 'cron_expression', 'timezone', 'args', 'enabled',
                        'deleted_at', 'max_attempts', 'retry_backoff', 'retry_backoff_max', 'timeout',
                        'misfire_grace', 'catchup', 'overlap', 'every', 'anchor', 'jitter', 'run_at',
                        'starts_at', 'ends_at', 'max_runs', 'pause_after_failures', 'traceparent',
                        'calendar_id')
          AND n.value IS DISTINCT FROM o.value;
    END IF;
    INSERT INTO dispatch.audit_log (actor_id, project_id, action, metadata)
    -- (a schedule that paused itself: no one's action)
    VALUES (CASE WHEN action = 'schedule.pause' AND NEW.paused_by = 'pgdispatch' THEN NULL ELSE session_user END,
            NEW.project_id, action,
            jsonb_strip_nulls(jsonb_build_object(
                'scheduleId', NEW.id,
                'functionName', NEW.function_name,
                'cronExpression', NEW.cron_expression,
                'every', NEW.every,
                'runAt', NEW.run_at,
                'timezone', NEW.timezone,
                'reason', CASE WHEN action = 'schedule.pause' THEN NEW.paused_reason END))
            -- after the stripping: a column set to NULL shows as null
            || coalesce(jsonb_build_object('changed', changed), '{}'));
    RETURN NULL;
END
$$;


--
-- Name: _schedule_audit_ended(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._schedule_audit_ended() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO dispatch.audit_log (actor_id, project_id, action, metadata)
    VALUES (CASE WHEN NEW.updated_at IS DISTINCT FROM OLD.updated_at THEN session_user END, NEW.project_id,
            'schedule.ended',
            jsonb_strip_nulls(jsonb_build_object('scheduleId', NEW.id, 'functionName', NEW.function_name,
                                                 'reason', NEW.ended_reason, 'lastSlot', NEW.last_slot)));
    RETURN NULL;
END
$$;


--
-- Name: _schedule_before_write(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._schedule_before_write() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
    live boolean;
BEGIN
    -- As the CHECK constraint of 0017_project_id_check.sql says, with a message that names the
    -- field.
    IF NEW.project_id IS NULL OR length(NEW.project_id) NOT BETWEEN 1 AND 200
       OR NEW.project_id ~ '[[:space:][:cntrl:]/]' OR NEW.project_id IN ('.', '..') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('project_id %s is not a project id',
                             coalesce('"' || left(NEW.project_id, 80) || '"', 'NULL')),
            HINT = '1 to 200 characters, none of them whitespace, a control character or "/", and not "." or "..": it becomes one segment of the invoke URL''s path.';
    END IF;
    IF NEW.function_name IS NULL OR NEW.function_name !~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('function_name %s is not a function name',
                             coalesce('"' || left(NEW.function_name, 80) || '"', 'NULL')),
            HINT = 'A letter or digit, then letters, digits, "_", "." or "-", at most 128 characters.';
    END IF;
    IF TG_OP = 'INSERT' OR NEW.args IS DISTINCT FROM OLD.args THEN
        -- args travel in every request body: bound them here rather than in every listener
        IF octet_length(NEW.args::text) > 4194304 THEN
            RAISE EXCEPTION 'args is % bytes of JSON; at most 4194304 (4 MiB) are allowed', octet_length(NEW.args::text)
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass a reference (a key, a URL) that the function fetches instead.';
        END IF;
        IF jsonb_path_exists(NEW.args, 'strict $.**{65}') THEN
            RAISE EXCEPTION 'args nest more than 64 levels deep'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass a reference (a key, a URL) that the function fetches instead.';
        END IF;
    END IF;
    -- A schedule's slots come from a cron expression, an interval or one instant, exactly one.
    IF num_nonnulls(NEW.cron_expression, NEW.every, NEW.run_at) <> 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = CASE WHEN num_nonnulls(NEW.cron_expression, NEW.every, NEW.run_at) = 0
                           THEN 'a schedule needs cron_expression, every or run_at'
                           ELSE concat_ws(' and ', CASE WHEN NEW.cron_expression IS NOT NULL THEN 'cron_expression' END,
                                          CASE WHEN NEW.every IS NOT NULL THEN 'every' END,
                                          CASE WHEN NEW.run_at IS NOT NULL THEN 'run_at' END)
                                || ' exclude each other: set one of them' END,
            HINT = 'cron_expression for wall-clock slots (''*/5 * * * *''), every for slots a fixed time apart (''30 seconds'', from anchor), run_at for one slot at an instant.';
    END IF;
    -- anchor belongs to an interval: it defaults to the creation time, and goes with every. One
    -- given for a cron expression would be dropped without a word: refused.
    IF NEW.every IS NULL AND NEW.anchor IS NOT NULL
       AND (TG_OP = 'INSERT' OR NEW.anchor IS DISTINCT FROM OLD.anchor) THEN
        RAISE EXCEPTION 'anchor applies to an interval schedule (every), not to %',
                        coalesce('cron_expression ' || quote_literal(NEW.cron_expression), 'a one-shot (run_at)')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A cron expression''s slots are wall-clock times, a one-shot''s is run_at; leave anchor NULL.';
    END IF;
    NEW.anchor := CASE WHEN NEW.every IS NOT NULL THEN coalesce(NEW.anchor, NEW.created_at, now()) END;
    IF NEW.max_runs IS NOT NULL AND NEW.starts_at IS NULL THEN
        -- max_runs counts from the write that set it (its statement's clock, from which the
        -- first slot is computed too: no slot is counted that could not run)
        NEW.starts_at := clock_timestamp();
    END IF;
    PERFORM dispatch._check_bounds(NEW, OLD);  -- (OLD: NULL on INSERT)
    IF TG_OP = 'INSERT' OR NEW.timezone IS DISTINCT FROM OLD.timezone THEN
        PERFORM dispatch.check_timezone(NEW.timezone);
    END IF;
    -- cron_spec is derived: whatever a statement wrote there, it is the parsed expression (or
    -- interval, or instant) within its bounds. An unchanged rule and zone are not validated
    -- again, so that a schedule whose zone was dropped from the tz database can still be edited,
    -- disabled or deleted.
    IF TG_OP = 'INSERT' OR NEW.cron_expression IS DISTINCT FROM OLD.cron_expression
       OR NEW.every IS DISTINCT FROM OLD.every OR NEW.anchor IS DISTINCT FROM OLD.anchor
       OR NEW.cron_spec IS DISTINCT FROM OLD.cron_spec OR NEW.run_at IS DISTINCT FROM OLD.run_at
       OR NEW.starts_at IS DISTINCT FROM OLD.starts_at OR NEW.ends_at IS DISTINCT FROM OLD.ends_at
       OR NEW.max_runs IS DISTINCT FROM OLD.max_runs
       OR (NEW.max_runs IS NOT NULL AND NEW.timezone IS DISTINCT FROM OLD.timezone) THEN
        NEW.cron_spec := CASE
            WHEN NEW.run_at IS NOT NULL THEN dispatch.once_spec(NEW.run_at)
            ELSE dispatch.bounded_spec(CASE WHEN NEW.every IS NOT NULL THEN dispatch.every_spec(NEW.every, NEW.anchor)
                                            ELSE dispatch.cron_parse(NEW.cron_expression) END,
                                       NEW.starts_at, NEW.ends_at, NEW.max_runs, NEW.timezone) END;
    END IF;
    PERFORM dispatch._check_policies(NEW);
    IF NEW.calendar_id IS NOT NULL
       AND (TG_OP = 'INSERT' OR NEW.calendar_id IS DISTINCT FROM OLD.calendar_id
            OR NEW.project_id IS DISTINCT FROM OLD.project_id
            OR (NEW.deleted_at IS NULL AND OLD.deleted_at IS NOT NULL)) THEN
        PERFORM dispatch._check_calendar(NEW.project_id, NEW.calendar_id);
    END IF;
    IF TG_OP = 'INSERT' OR NEW.traceparent IS DISTINCT FROM OLD.traceparent THEN
        PERFORM dispatch._check_traceparent(NEW.traceparent, 'traceparent');
    END IF;
    -- One jitter rule for both kinds of slots: a slot never fires after the next one is due.
    IF NEW.jitter > interval '0'
       AND (TG_OP = 'INSERT' OR NEW.jitter IS DISTINCT FROM OLD.jitter OR NEW.cron_spec IS DISTINCT FROM OLD.cron_spec)
       AND NEW.jitter > dispatch._slot_spacing(NEW.cron_spec) THEN
        RAISE EXCEPTION 'jitter (%) must not exceed the shortest time between two slots (%)',
                        NEW.jitter, dispatch._slot_spacing(NEW.cron_spec)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Each slot fires at a fixed offset in [0, jitter) after it: a longer jitter would fire a slot after the next one is due.';
    END IF;

    live := NEW.enabled AND NEW.deleted_at IS NULL AND NEW.paused_at IS NULL;
    -- stopped_on: where a stopping schedule stood, for the gap recorded when it goes on again
    -- (dispatch._schedule_record_stop_gap); a new rule starts its slots afresh.
    IF TG_OP = 'INSERT' OR live OR NEW.cron_spec IS DISTINCT FROM OLD.cron_spec
       OR NEW.timezone IS DISTINCT FROM OLD.timezone THEN
        NEW.stopped_on := NULL;
    ELSIF OLD.next_run_at IS NOT NULL THEN
        NEW.stopped_on := OLD.next_run_at;
    END IF;
    IF NOT live THEN
        NEW.next_run_at := NULL;
        NEW.backoff_reason := NULL;
    ELSIF TG_OP = 'INSERT'
          OR NOT (OLD.enabled AND OLD.deleted_at IS NULL AND OLD.paused_at IS NULL)
          OR NEW.cron_spec IS DISTINCT FROM OLD.cron_spec
          OR NEW.timezone IS DISTINCT FROM OLD.timezone THEN
        -- The statement's clock, not the transaction's: a transaction that began before a slot
        -- ran must not put the schedule back onto it. And never on or before the last slot
        -- that finished, whatever the clock says (a slot marked ahead of time by tick(horizon)).
        -- (A one-shot given its instant here may have it between the transaction's start and
        -- the statement's clock.)
        NEW.next_run_at := dispatch.cron_spec_next(
            NEW.cron_spec,
            greatest(CASE WHEN NEW.run_at IS NOT NULL AND (TG_OP = 'INSERT' OR NEW.run_at IS DISTINCT FROM OLD.run_at)
                          THEN least(clock_timestamp(), NEW.run_at - interval '1 microsecond')
                          ELSE clock_timestamp() END,
                     NEW.last_slot,
                     -- a schedule stopped after the tick passed over a period of its calendar
                     -- (its slots recorded as a gap already) goes on after the period
                     CASE WHEN TG_OP = 'UPDATE' AND OLD.calendar_id IS NOT NULL AND OLD.backoff_reason IS NULL
                               AND NEW.cron_spec IS NOT DISTINCT FROM OLD.cron_spec AND NEW.timezone = OLD.timezone
                          THEN OLD.stopped_on - interval '1 microsecond' END),
            dispatch.check_timezone(NEW.timezone));
        NEW.backoff_reason := NULL;
        NEW.ended_at := NULL;
        NEW.ended_reason := NULL;
    END IF;
    IF NEW.next_run_at = 'infinity' THEN
        IF TG_OP = 'INSERT' THEN
            RAISE EXCEPTION 'the schedule has no slot after now: %', dispatch._ended_reason(NEW)
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Give run_at, ends_at or max_runs (from starts_at) that leave it a slot to come.';
        END IF;
        NEW := dispatch._end_schedule(NEW);
    END IF;
    IF TG_OP = 'UPDATE' THEN
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END
$_$;


--
-- Name: _schedule_end_pending(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._schedule_end_pending() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    -- Waits for a claim in progress on one of them: a run claimed before this change commits
    -- stays claimed (and is invoked); every other pending run ends here. (A schedule that stops
    -- names its stop itself; OLD names the stop that a schedule live again leaves.) Not when it
    -- pauses itself in a completion or a tick, which wait on no one (invariant 3): a run held
    -- then is ended by the next claim, as a stopped schedule's.
    PERFORM dispatch._end_stale_runs(
        ARRAY(SELECT r.id FROM dispatch.runs r WHERE r.schedule_id = NEW.id AND r.status = 'pending'),
        wait => NEW.paused_by IS DISTINCT FROM 'pgdispatch', stopped => dispatch._stopped_as(OLD));
    RETURN NULL;
END
$$;


--
-- Name: _schedule_ended(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._schedule_ended() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN dispatch._end_schedule(NEW);
END
$$;


--
-- Name: _schedule_move_runs(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._schedule_move_runs() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    UPDATE dispatch.runs r SET project_id = NEW.project_id
    WHERE r.schedule_id = NEW.id AND r.status IN ('pending', 'running') AND r.project_id <> NEW.project_id;
    RETURN NULL;
END
$$;


--
-- Name: FUNCTION _schedule_move_runs(); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch._schedule_move_runs() IS 'Trigger: a schedule whose project_id changed takes its open runs (pending, running) to the new project.';


--
-- Name: _schedule_notify(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._schedule_notify() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pg_notify('dispatch', 'schedules');
    RETURN NULL;
END
$$;


--
-- Name: _schedule_record_stop_gap(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._schedule_record_stop_gap() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    -- from the slot it stood on when it stopped (those it has a run for excluded: a pending run
    -- ended skipped at the stop), up to the slot it goes on from (or its last, if it ended)
    PERFORM dispatch._record_gaps(
        ARRAY[NEW.id],
        ARRAY[greatest(OLD.stopped_on - interval '1 microsecond',
                       (SELECT max(r.scheduled_for) FROM dispatch.runs r
                        WHERE r.schedule_id = NEW.id AND r.kind = 'scheduled'))],
        ARRAY[coalesce(NEW.next_run_at, 'infinity')],
        CASE WHEN OLD.paused_at IS NOT NULL THEN 'pause' ELSE 'disabled' END);
    RETURN NULL;
END
$$;


--
-- Name: _schedule_soft_delete(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._schedule_soft_delete() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    UPDATE dispatch.schedules SET deleted_at = now() WHERE id = OLD.id AND deleted_at IS NULL;
    IF FOUND THEN
        RAISE NOTICE 'schedule % was soft-deleted (deleted_at set) instead: its runs and audit trail are kept', OLD.id;
    END IF;
    RETURN NULL;  -- the row stays
END
$$;


--
-- Name: _schedule_unbuffer(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._schedule_unbuffer() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    ended dispatch.runs[];
BEGIN
    IF NEW.overlap = 'allow' THEN
        -- at its jittered instant if that is still ahead
        UPDATE dispatch.runs
        SET not_before = CASE WHEN fire_at > scheduled_for AND fire_at > clock_timestamp() THEN fire_at END
        WHERE schedule_id = NEW.id AND status = 'pending' AND not_before = 'infinity' AND kind <> 'backfill';
        IF FOUND THEN
            PERFORM pg_notify('dispatch', 'released');
        END IF;
    ELSE
        WITH k AS (
            UPDATE dispatch.runs r
            SET status = 'skipped', finished_at = now(), not_before = NULL,
                error = format('overlap changed to %s while the run waited behind the one before', NEW.overlap)
            WHERE r.schedule_id = NEW.id AND r.status = 'pending' AND r.not_before = 'infinity'
              AND r.kind <> 'backfill'
            RETURNING r
        )
        SELECT array_agg(k.r) INTO ended FROM k;
        PERFORM dispatch._finish_runs(ended);
    END IF;
    RETURN NULL;
END
$$;


--
-- Name: _settle_runs(dispatch.runs[]); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._settle_runs(finished dispatch.runs[]) RETURNS TABLE(run_id bigint, advanced boolean, follow_up boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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


--
-- Name: _skip_missed(dispatch.schedules, timestamp with time zone, timestamp with time zone, timestamp with time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._skip_missed(s dispatch.schedules, from_slot timestamp with time zone, cut timestamp with time zone, horizon timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    slots timestamptz[];
    last timestamptz;
    skipped dispatch.runs[];
BEGIN
    slots := from_slot || ARRAY(SELECT dispatch._cron_slots(s.cron_spec, from_slot, cut - interval '1 microsecond',
                                                            s.timezone, 100));
    IF cardinality(slots) <= 100 THEN
        WITH k AS (
            INSERT INTO dispatch.runs AS r (schedule_id, project_id, scheduled_for, fire_at, status, finished_at, error)
            SELECT s.id, s.project_id, slot, slot + dispatch.jitter_offset(s.id, slot, s.jitter), 'skipped', now(),
                   dispatch._missed_by(horizon - slot)
            FROM unnest(slots) AS slot
            ON CONFLICT DO NOTHING
            RETURNING r
        )
        SELECT array_agg(k.r) INTO skipped FROM k;
        IF skipped IS NOT NULL THEN
            PERFORM dispatch._audit_runs(skipped);
        END IF;
        last := slots[cardinality(slots)];
    ELSE
        last := coalesce(dispatch._cron_latest(s.cron_spec, from_slot, cut - interval '1 microsecond', s.timezone),
                         from_slot);
        PERFORM dispatch._record_gaps(ARRAY[s.id], ARRAY[from_slot - interval '1 microsecond'],
                                      ARRAY[last + interval '1 microsecond'], 'misfire');
    END IF;
    UPDATE dispatch.schedules
    SET next_run_at = dispatch.cron_spec_next(s.cron_spec, last, s.timezone),
        last_slot = greatest(last_slot, last), last_status = 'skipped', last_run_at = now(),
        last_error = dispatch._missed_by(horizon - last)
    WHERE id = s.id;
    RETURN last;
END
$$;


--
-- Name: _slot_spacing(dispatch.cron_spec); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._slot_spacing(spec dispatch.cron_spec) RETURNS interval
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    WITH m AS (SELECT array_agg(i ORDER BY i) AS v FROM generate_series(0, 59) i
               WHERE (spec).minutes & (1::bigint << i) <> 0),
         h AS (SELECT array_agg(i ORDER BY i) AS v FROM generate_series(0, 23) i
               WHERE (spec).hours & (1 << i) <> 0)
    SELECT CASE WHEN (spec).every_us IS NOT NULL THEN (spec).every_us * interval '1 microsecond'
           ELSE least(interval '1 day',
                      (SELECT min(m.v[k + 1] - m.v[k]) FROM generate_subscripts(m.v, 1) k
                       WHERE k < cardinality(m.v)) * interval '1 minute',
                      ((SELECT min(h.v[k + 1] - h.v[k]) FROM generate_subscripts(h.v, 1) k
                        WHERE k < cardinality(h.v)) * 60 - (m.v[cardinality(m.v)] - m.v[1])) * interval '1 minute',
                      ((24 - h.v[cardinality(h.v)] + h.v[1]) * 60 - (m.v[cardinality(m.v)] - m.v[1]))
                          * interval '1 minute')
           END
    FROM m, h
$$;


--
-- Name: _slots_between(dispatch.cron_spec, timestamp with time zone, timestamp with time zone, text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._slots_between(spec dispatch.cron_spec, lo timestamp with time zone, hi timestamp with time zone, tz text, OUT first_slot timestamp with time zone, OUT last_slot timestamp with time zone, OUT slots integer, OUT at_least boolean) RETURNS record
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    first_slot := dispatch.cron_spec_next(spec, lo, tz);
    IF first_slot IS NULL OR first_slot >= hi THEN
        first_slot := NULL;
        RETURN;
    END IF;
    last_slot := coalesce(dispatch._cron_latest(spec, first_slot, hi - interval '1 microsecond', tz), first_slot);
    IF (spec).every_us IS NOT NULL THEN
        slots := 1 + round(extract(epoch FROM last_slot - first_slot) * 1000000 / (spec).every_us)::integer;
        at_least := false;
    ELSE
        SELECT 1 + count(*) INTO slots FROM dispatch._cron_slots(spec, first_slot, last_slot, tz, 10000);
        at_least := slots > 10000;
        slots := least(slots, 10000);
    END IF;
END
$$;


--
-- Name: _span(interval); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._span(d interval) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT CASE
        WHEN d IS NULL THEN NULL
        WHEN d < interval '0' THEN '-' || dispatch._span(-d)
        WHEN d >= interval '1 day' THEN floor(extract(epoch FROM d) / 86400)::bigint || ' d '
                                        || extract(hour FROM justify_hours(d))::int || ' h'
        WHEN d >= interval '1 hour' THEN extract(hour FROM d)::int || ' h ' || extract(minute FROM d)::int || ' min'
        WHEN d >= interval '1 minute' THEN extract(minute FROM d)::int || ' min ' || floor(extract(second FROM d))::int || ' s'
        WHEN d >= interval '1 second' THEN floor(extract(epoch FROM d))::int || ' s'
        ELSE round(extract(epoch FROM d) * 1000)::int || ' ms'
    END
$$;


--
-- Name: _start_runs(tid[], text, interval, interval); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._start_runs(tids tid[], worker text, lease interval, default_timeout interval) RETURNS TABLE(run_id bigint, schedule_id uuid, project_id text, function_name text, args jsonb, request_id text, scheduled_for timestamp with time zone, attempt integer, lease_until timestamp with time zone, timeout interval, fire_at timestamp with time zone, kind text, traceparent text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_indexscan TO 'off'
    SET enable_seqscan TO 'off'
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


--
-- Name: _stopped_as(dispatch.schedules); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._stopped_as(s dispatch.schedules) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN s.deleted_at IS NOT NULL THEN 'deleted'
                WHEN s.paused_at IS NOT NULL THEN 'paused'
                WHEN NOT s.enabled THEN 'disabled' END
$$;


--
-- Name: FUNCTION _stopped_as(s dispatch.schedules); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch._stopped_as(s dispatch.schedules) IS 'What stopped a schedule (deleted, paused or disabled), or NULL while it is live: the word the run errors name.';


--
-- Name: _take_running(bigint[], integer[]); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._take_running(run_ids bigint[], attempts integer[], OUT ids bigint[], OUT tids tid[]) RETURNS record
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_indexscan TO 'off'
    SET enable_seqscan TO 'off'
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


--
-- Name: _tick_schedule(uuid, timestamp with time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._tick_schedule(schedule_id uuid, horizon timestamp with time zone) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    s dispatch.schedules;
    slot_run dispatch.runs;
    open_runs integer;
    cut timestamptz;
    first_in_grace timestamptz;
    target timestamptz;
    slots timestamptz[];
    skipped dispatch.runs[];
    passed timestamptz;
BEGIN
    SELECT * INTO s FROM dispatch.schedules x WHERE x.id = _tick_schedule.schedule_id;
    IF s.next_run_at IS NULL OR s.next_run_at > horizon THEN
        RETURN 0;
    END IF;
    SELECT * INTO slot_run FROM dispatch.runs r WHERE r.schedule_id = s.id AND r.scheduled_for = s.next_run_at;
    -- backfill runs waiting their turn do not hold the schedule's own slots
    SELECT count(*) INTO open_runs FROM dispatch.runs r
    WHERE r.schedule_id = s.id AND r.status IN ('pending', 'running')
      AND NOT dispatch._waits_its_turn(r);

    -- A slot already finished (a completion that found the schedule locked, a write that put
    -- it back): move past it.
    IF slot_run.id IS NOT NULL AND slot_run.status NOT IN ('pending', 'running') THEN
        PERFORM dispatch._settle_runs(ARRAY[slot_run]);
        RETURN 0;
    END IF;
    -- An expression that cannot be evaluated: one skipped run per back-off instant, never an
    -- invocation (invariant 6).
    IF s.backoff_reason IS NOT NULL THEN
        WITH k AS (
            INSERT INTO dispatch.runs AS r (schedule_id, project_id, scheduled_for, fire_at, status, finished_at, error)
            VALUES (s.id, s.project_id, s.next_run_at, s.next_run_at, 'skipped', now(), left(s.backoff_reason, 500))
            RETURNING r
        )
        SELECT array_agg(k.r) INTO skipped FROM k;
        PERFORM dispatch._finish_runs(skipped);
        RETURN 0;
    END IF;
    -- A run open: skip waits for it. buffer_one lets one slot wait behind it: the first that came
    -- due since the open run's (the others are dropped when the waiting run is let go, see
    -- dispatch._follow_up).
    IF s.overlap <> 'allow' AND (slot_run.id IS NOT NULL OR open_runs > 0) THEN
        IF s.overlap = 'buffer_one'
           AND NOT EXISTS (SELECT 1 FROM dispatch.runs r
                           WHERE r.schedule_id = s.id AND r.status = 'pending' AND r.not_before = 'infinity'
                             AND r.kind <> 'backfill') THEN
            target := CASE WHEN slot_run.id IS NULL THEN s.next_run_at
                           ELSE dispatch.cron_spec_next(s.cron_spec, s.next_run_at, s.timezone) END;
            -- the first slot outside the calendar's periods is the one buffered, once it is due;
            -- those it passes over are a gap (calendar)
            passed := target;
            IF s.calendar_id IS NOT NULL AND target <= horizon THEN
                target := dispatch._calendar_slot(s.cron_spec, s.timezone, s.calendar_id, target);
            END IF;
            IF target <= horizon
               AND (s.calendar_id IS NULL OR NOT dispatch.calendar_excludes(s.calendar_id, target)) THEN
                IF target > passed THEN
                    PERFORM dispatch._record_gaps(ARRAY[s.id], ARRAY[passed - interval '1 microsecond'], ARRAY[target],
                                                  'calendar');
                END IF;
                INSERT INTO dispatch.runs (schedule_id, project_id, scheduled_for, fire_at, not_before)
                VALUES (s.id, s.project_id, target, target + dispatch.jitter_offset(s.id, target, s.jitter), 'infinity')
                ON CONFLICT DO NOTHING;
                UPDATE dispatch.schedules SET next_run_at = target WHERE id = s.id;
                RETURN 1;
            END IF;
        END IF;
        RETURN 0;
    END IF;

    -- The slots missed since next_run_at. Those beyond the grace are recorded, never invoked.
    -- The grace counts from a slot's fire instant, up to a jitter after it: a slot within
    -- the jitter of the cut is marked, and the claim skips it if its own instant is beyond.
    cut := CASE WHEN s.misfire_grace IS NULL THEN '-infinity' ELSE horizon - s.misfire_grace - s.jitter END;
    first_in_grace := s.next_run_at;
    IF s.next_run_at < cut THEN
        first_in_grace := dispatch.cron_spec_next(s.cron_spec, dispatch._skip_missed(s, s.next_run_at, cut, horizon),
                                                  s.timezone);
    END IF;
    -- A slot in a period of the schedule's calendar does not run: on to its first slot after
    -- the period (a gap, calendar; 'infinity' ends a bounded rule).
    IF s.calendar_id IS NOT NULL AND first_in_grace <= horizon THEN
        target := dispatch._calendar_slot(s.cron_spec, s.timezone, s.calendar_id, first_in_grace);
        IF target > first_in_grace THEN
            PERFORM dispatch._record_gaps(ARRAY[s.id], ARRAY[first_in_grace - interval '1 microsecond'], ARRAY[target],
                                          'calendar');
            first_in_grace := target;
        END IF;
        IF first_in_grace <= horizon AND dispatch.calendar_excludes(s.calendar_id, first_in_grace) THEN
            -- a thousand periods in a row: the next tick goes on from there
            UPDATE dispatch.schedules SET next_run_at = first_in_grace WHERE id = s.id;
            RETURN 0;
        END IF;
    END IF;
    IF first_in_grace > horizon THEN  -- nothing left to run: on to the next slot
        UPDATE dispatch.schedules SET next_run_at = first_in_grace WHERE id = s.id;
        RETURN 0;
    END IF;

    IF s.catchup = 'all' AND s.overlap = 'allow' THEN
        -- every slot in the grace, at once (allow: slots do not wait for one another), up to one
        -- the calendar excludes (the next tick records it)
        slots := first_in_grace || ARRAY(SELECT dispatch._cron_slots(s.cron_spec, first_in_grace, horizon,
                                                                     s.timezone, 999));
        IF s.calendar_id IS NOT NULL THEN
            slots := slots[1:coalesce((SELECT min(k) - 1 FROM unnest(slots) WITH ORDINALITY AS x(slot, k)
                                       WHERE dispatch.calendar_excludes(s.calendar_id, x.slot)),
                                      cardinality(slots))];
        END IF;
    ELSIF s.catchup = 'all' THEN
        slots := ARRAY[first_in_grace];  -- the oldest; the next once it finished (one open run at a time)
    ELSE
        -- latest: only the most recent (outside the calendar); the older ones in the grace are
        -- coalesced into it (a gap: catch-up)
        slots := ARRAY[coalesce(CASE WHEN s.calendar_id IS NULL
                                     THEN dispatch._cron_latest(s.cron_spec, first_in_grace - interval '1 microsecond',
                                                                horizon, s.timezone)
                                     ELSE dispatch._calendar_latest(s.cron_spec, s.timezone, s.calendar_id,
                                                                    first_in_grace - interval '1 microsecond', horizon)
                                END, first_in_grace)];
        PERFORM dispatch._record_gaps(ARRAY[s.id], ARRAY[first_in_grace - interval '1 microsecond'], slots,
                                      'catch-up');
    END IF;
    -- A slot fires at its jitter offset: one whose instant is still ahead waits for it.
    INSERT INTO dispatch.runs (schedule_id, project_id, scheduled_for, fire_at, not_before)
    SELECT s.id, s.project_id, f.slot, f.fire_at, CASE WHEN f.fire_at > horizon THEN f.fire_at END
    FROM (SELECT slot, slot + dispatch.jitter_offset(s.id, slot, s.jitter) AS fire_at FROM unnest(slots) AS slot) f
    ON CONFLICT DO NOTHING;
    target := slots[cardinality(slots)];
    UPDATE dispatch.schedules
    SET next_run_at = CASE WHEN s.overlap = 'allow' THEN dispatch.cron_spec_next(s.cron_spec, target, s.timezone)
                           ELSE target END  -- skip, buffer_one: on the slot until its run finishes
    WHERE id = s.id;
    RETURN cardinality(slots);
END
$$;


--
-- Name: _tick_schedule_guarded(uuid, timestamp with time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._tick_schedule_guarded(schedule_id uuid, horizon timestamp with time zone) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN dispatch._tick_schedule(schedule_id, horizon);
EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'cannot compute the slots of schedule %: %', schedule_id, SQLERRM;
    UPDATE dispatch.schedules s
    SET next_run_at = greatest(s.next_run_at, clock_timestamp()) + interval '1 hour',
        backoff_reason = format('cannot compute the next slot of "%s" in time zone %s%s (see the server log); trying again every hour',
                                s.cron_expression, s.timezone,
                                (SELECT format(' or its calendar %s''s periods in time zone %s', c.name, c.timezone)
                                 FROM dispatch.calendars c WHERE c.id = s.calendar_id))
    WHERE s.id = _tick_schedule_guarded.schedule_id;
    RETURN 0;
END
$$;


--
-- Name: _timezone_names(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._timezone_names() RETURNS SETOF text
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT name FROM pg_catalog.pg_timezone_names
    WHERE name !~ '^(posix|right)/' AND name NOT IN ('localtime', 'posixrules', 'Factory')
$$;


--
-- Name: _tz_transition(timestamp with time zone, timestamp with time zone, text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._tz_transition(lo timestamp with time zone, hi timestamp with time zone, tz text) RETURNS timestamp with time zone
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    a bigint := floor(extract(epoch FROM lo) / 60);
    b bigint := ceil(extract(epoch FROM hi) / 60);
    off0 interval := (lo AT TIME ZONE tz) - (lo AT TIME ZONE 'UTC');
    mid bigint;
    t timestamptz;
BEGIN
    WHILE b - a > 1 LOOP
        mid := (a + b) / 2;
        t := to_timestamp(mid * 60);
        IF (t AT TIME ZONE tz) - (t AT TIME ZONE 'UTC') = off0 THEN
            a := mid;
        ELSE
            b := mid;
        END IF;
    END LOOP;
    RETURN to_timestamp(b * 60);
END
$$;


--
-- Name: _waits_its_turn(dispatch.runs); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._waits_its_turn(r dispatch.runs) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT r.kind OPERATOR(pg_catalog.=) 'backfill' AND r.not_before IS NOT NULL
       AND r.not_before OPERATOR(pg_catalog.=) CAST('infinity' AS pg_catalog.timestamptz)
$$;


--
-- Name: FUNCTION _waits_its_turn(r dispatch.runs); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch._waits_its_turn(r dispatch.runs) IS 'Whether a run is a backfill run waiting its turn (not_before infinity): it holds nothing of its schedule.';


--
-- Name: _wall_instant(timestamp without time zone, text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._wall_instant(wall timestamp without time zone, tz text) RETURNS timestamp with time zone
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    c timestamptz := wall AT TIME ZONE tz;  -- PostgreSQL reads a skipped or repeated time with the standard offset
    k timestamptz;
BEGIN
    IF (c AT TIME ZONE tz) <> wall THEN
        RETURN dispatch._tz_transition(c - interval '24 hours', c + interval '24 hours', tz);
    END IF;
    k := c - interval '24 hours';
    k := (wall - ((k AT TIME ZONE tz) - (k AT TIME ZONE 'UTC'))) AT TIME ZONE 'UTC';
    RETURN CASE WHEN k < c AND (k AT TIME ZONE tz) = wall THEN k ELSE c END;
END
$$;


--
-- Name: FUNCTION _wall_instant(wall timestamp without time zone, tz text); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch._wall_instant(wall timestamp without time zone, tz text) IS 'A wall-clock time in zone tz as an instant, by the fixed-time DST rule of cron expressions: a time that a spring-forward skips is the instant of the jump, one that a fall-back repeats its first occurrence.';


--
-- Name: backfill(uuid, timestamp with time zone, timestamp with time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.backfill(schedule_id uuid, from_ts timestamp with time zone, to_ts timestamp with time zone) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    s dispatch.schedules := dispatch._operable_schedule(backfill.schedule_id, 'backfill');
    upto timestamptz;
    slots timestamptz[];
    marked integer;
BEGIN
    IF from_ts IS NULL OR NOT isfinite(from_ts) THEN
        RAISE EXCEPTION 'cannot backfill: from_ts must be a finite instant, not %', coalesce(from_ts::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF to_ts IS NULL OR NOT isfinite(to_ts) THEN
        RAISE EXCEPTION 'cannot backfill: to_ts must be a finite instant, not %', coalesce(to_ts::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'now() backfills up to the schedule''s next slot.';
    ELSIF from_ts >= to_ts THEN
        RAISE EXCEPTION 'cannot backfill: from_ts (%) must be before to_ts (%)', from_ts, to_ts
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF s.paused_at IS NOT NULL OR NOT s.enabled THEN
        RAISE EXCEPTION 'cannot backfill: schedule % is %', s.id,
                        CASE WHEN s.paused_at IS NOT NULL THEN 'paused' ELSE 'disabled' END
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Its runs would end skipped at the claim; resume or enable it first.';
    END IF;
    -- The past only, and never the schedule's own slots: from next_run_at on they are its own.
    upto := least(to_ts, s.next_run_at, clock_timestamp());
    slots := ARRAY(SELECT dispatch._cron_slots(s.cron_spec, from_ts - interval '1 microsecond',
                                               upto - interval '1 microsecond', s.timezone, 10000));
    -- Each waits its turn (not_before infinity): dispatch._follow_up lets one go at a time,
    -- oldest first, whenever nothing else of the schedule is open.
    INSERT INTO dispatch.runs AS r (schedule_id, project_id, scheduled_for, fire_at, kind, not_before)
    SELECT s.id, s.project_id, slot, slot, 'backfill', 'infinity'
    FROM unnest(slots) AS slot
    WHERE NOT EXISTS (SELECT 1 FROM dispatch.runs x WHERE x.schedule_id = s.id AND x.scheduled_for = slot)
      AND (s.calendar_id IS NULL OR NOT dispatch.calendar_excludes(s.calendar_id, slot))  -- never to run
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS marked = ROW_COUNT;
    IF cardinality(slots) = 10000 THEN
        RAISE NOTICE 'backfill stops at 10,000 slots a call: call it again from %', slots[10000];
    END IF;
    INSERT INTO dispatch.audit_log (actor_id, project_id, action, metadata)
    VALUES (session_user, s.project_id, 'schedule.backfill', jsonb_build_object(
        'scheduleId', s.id, 'functionName', s.function_name, 'from', from_ts, 'to', to_ts,
        'slots', cardinality(slots), 'marked', marked));
    PERFORM dispatch._follow_up(ARRAY[s.id]);
    RETURN marked;
END
$$;


--
-- Name: FUNCTION backfill(schedule_id uuid, from_ts timestamp with time zone, to_ts timestamp with time zone); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.backfill(schedule_id uuid, from_ts timestamp with time zone, to_ts timestamp with time zone) IS 'Mark each slot of the schedule in [from_ts, to_ts) that has no run yet and that its calendar does not exclude as a run of kind backfill (at most 10,000 a call, a NOTICE says where to go on), before the schedule''s next slot and now; returns how many. They are dispatched one at a time, oldest first, whenever nothing else of the schedule is open: its own slots go first and wait for one backfill run at most. Refused: 22023 when from_ts or to_ts is not a finite instant or from_ts is not before to_ts, 55000 for a deleted, paused or disabled schedule, P0002 for an unknown id. Audited as schedule.backfill with the actor (session_user).';


--
-- Name: bounded_spec(dispatch.cron_spec, timestamp with time zone, timestamp with time zone, integer, text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.bounded_spec(spec dispatch.cron_spec, starts_at timestamp with time zone, ends_at timestamp with time zone, max_runs integer, tz text DEFAULT 'UTC'::text) RETURNS dispatch.cron_spec
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    last_slot timestamptz;
BEGIN
    IF max_runs IS NOT NULL AND (max_runs NOT BETWEEN 1 AND 10000 OR starts_at IS NULL) THEN
        RAISE EXCEPTION 'max_runs must be between 1 and 10000 and count from starts_at, not %', max_runs
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'For more slots than that, bound the schedule with ends_at.';
    END IF;
    spec.starts_at := starts_at;
    spec.ends_at := ends_at;
    IF max_runs IS NOT NULL THEN
        last_slot := dispatch.cron_spec_next(spec, starts_at - interval '1 microsecond', tz);
        IF spec.every_us IS NOT NULL AND isfinite(last_slot) THEN
            last_slot := last_slot + ((max_runs - 1) * spec.every_us) * interval '1 microsecond';
        ELSE
            FOR i IN 2..max_runs LOOP
                EXIT WHEN NOT isfinite(last_slot);
                last_slot := dispatch.cron_spec_next(spec, last_slot, tz);
            END LOOP;
        END IF;
        IF isfinite(last_slot) THEN
            spec.ends_at := least(ends_at, last_slot);
        END IF;
    END IF;
    RETURN spec;
END
$$;


--
-- Name: FUNCTION bounded_spec(spec dispatch.cron_spec, starts_at timestamp with time zone, ends_at timestamp with time zone, max_runs integer, tz text); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.bounded_spec(spec dispatch.cron_spec, starts_at timestamp with time zone, ends_at timestamp with time zone, max_runs integer, tz text) IS 'The slot rule spec kept within bounds: no slot before starts_at, none after ends_at, and at most its first max_runs slots at or after starts_at (1 to 10,000; max_runs needs starts_at). dispatch.cron_spec_next then answers ''infinity'' past the last slot. Raises 22023 for a max_runs out of range.';


--
-- Name: breaker_states(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.breaker_states() RETURNS TABLE(project_id text, function_name text, state text, failures integer, opened_at timestamp with time zone, probes integer, next_probe_at timestamp with time zone, probe_out boolean, waiting bigint, last_error text)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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


--
-- Name: FUNCTION breaker_states(); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.breaker_states() IS 'The circuit breakers that are open or counting failures: state, consecutive retryable failures, when it opened, probes sent since, when the next may go, whether one is out, how many runs wait behind it, the last error. What listeners export as pgdispatch_breaker_open{project,function}.';


--
-- Name: calendar_excludes(bigint, timestamp with time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.calendar_excludes(calendar_id bigint, at timestamp with time zone) RETURNS boolean
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM dispatch._calendar_period(calendar_excludes.calendar_id, calendar_excludes.at));
END
$$;


--
-- Name: FUNCTION calendar_excludes(calendar_id bigint, at timestamp with time zone); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.calendar_excludes(calendar_id bigint, at timestamp with time zone) IS 'Whether the instant lies in one of the calendar''s excluded periods (a slot there does not run).';


--
-- Name: calendar_periods(bigint, timestamp with time zone, timestamp with time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.calendar_periods(calendar_id bigint, from_ts timestamp with time zone, to_ts timestamp with time zone) RETURNS TABLE(starts_at timestamp with time zone, ends_at timestamp with time zone, exclusion_id bigint, label text)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN QUERY
    SELECT p.lo, p.hi, e.id, e.label
    FROM dispatch.calendars c
    JOIN dispatch.calendar_exclusions e ON e.calendar_id = c.id
    CROSS JOIN LATERAL (
        SELECT dispatch._wall_instant(e.starts, c.timezone) AS lo, dispatch._wall_instant(e.ends, c.timezone) AS hi
        -- (a day's margin on the wall clock covers any offset change: only the stretches near
        -- the range are placed)
        WHERE e.days IS NULL AND e.ends > (calendar_periods.from_ts AT TIME ZONE c.timezone) - interval '1 day'
          AND e.starts < (calendar_periods.to_ts AT TIME ZONE c.timezone) + interval '1 day'
      UNION ALL
        -- each day of the week's rule, from the local day before from_ts (a period that began
        -- then may still run) to the local day of to_ts
        SELECT dispatch._wall_instant(x.d + e.from_time, c.timezone), dispatch._wall_instant(x.d + e.until_time, c.timezone)
        FROM generate_series(date_trunc('day', calendar_periods.from_ts AT TIME ZONE c.timezone) - interval '1 day',
                             calendar_periods.to_ts AT TIME ZONE c.timezone, interval '1 day') AS x(d)
        WHERE e.days IS NOT NULL AND extract(isodow FROM x.d)::smallint = ANY (e.days)
    ) p
    WHERE c.id = calendar_periods.calendar_id AND p.hi > calendar_periods.from_ts AND p.lo < calendar_periods.to_ts
    ORDER BY p.lo, p.hi, e.id;
END
$$;


--
-- Name: FUNCTION calendar_periods(calendar_id bigint, from_ts timestamp with time zone, to_ts timestamp with time zone); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.calendar_periods(calendar_id bigint, from_ts timestamp with time zone, to_ts timestamp with time zone) IS 'The excluded periods of a calendar that overlap [from_ts, to_ts), as instants [starts_at, ends_at) with the exclusion they come from, earliest first: one row for a period, one for each day of a weekly exclusion. Wall-clock boundaries that daylight saving time skips or repeats are placed by the fixed-time rule of cron expressions.';


--
-- Name: check_deadline(timestamp with time zone, timestamp with time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.check_deadline(now timestamp with time zone, not_after timestamp with time zone) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF check_deadline.now > check_deadline.not_after THEN
        RAISE EXCEPTION 'arrived after its deadline (%)', check_deadline.not_after USING ERRCODE = 'query_canceled';
    END IF;
END
$$;


--
-- Name: FUNCTION check_deadline(now timestamp with time zone, not_after timestamp with time zone); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.check_deadline(now timestamp with time zone, not_after timestamp with time zone) IS 'Raise query_canceled ("arrived after its deadline") when now is after not_after. A listener calls it with clock_timestamp() ahead of each statement, in the same transaction, so that a call that reaches the server after the listener gave up on it does nothing.';


--
-- Name: check_timezone(text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.check_timezone(tz text) RETURNS text
    LANGUAGE plpgsql STABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    near text;
BEGIN
    IF tz IS NULL THEN
        RAISE EXCEPTION 'timezone must not be null' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM dispatch.timezones WHERE name = tz)
       OR (length(tz) <= 64 AND tz IN (SELECT dispatch._timezone_names())) THEN
        RETURN tz;
    END IF;
    -- The name meant, when it differs only in case (europe/berlin) or lacks its region (Berlin).
    IF length(tz) <= 64 THEN
        SELECT n INTO near FROM dispatch._timezone_names() n
        WHERE lower(n) = lower(tz) OR lower(n) LIKE '%/' || lower(replace(tz, ' ', '_'))
        ORDER BY lower(n) = lower(tz) DESC, n LIMIT 1;
    END IF;
    RAISE EXCEPTION USING
        ERRCODE = 'invalid_parameter_value',
        MESSAGE = format('timezone "%s" is not a time zone name from the tz database%s',
                         CASE WHEN length(tz) > 80 THEN left(tz, 80) || '...' ELSE tz END,
                         CASE WHEN near IS NOT NULL THEN format('; did you mean %s?', near) ELSE '' END),
        HINT = 'Use an IANA name such as Europe/Berlin or UTC (see pg_timezone_names); abbreviations such as CEST and offsets such as +05 are refused.';
END
$$;


--
-- Name: FUNCTION check_timezone(tz text); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.check_timezone(tz text) IS 'Return tz when it is a name from the tz database (pg_timezone_names); raise SQLSTATE 22023 otherwise.';


--
-- Name: claim_event_deliveries(text, integer, interval); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.claim_event_deliveries(worker text, max_deliveries integer, lease interval) RETURNS TABLE(delivery_id bigint, url text, payload text, attempt integer)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF lease IS NULL OR lease <= interval '0' OR lease > interval '1 hour' THEN
        RAISE EXCEPTION 'lease must be more than 0 and at most 1 hour, not %', coalesce(lease::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    UPDATE dispatch.event_deliveries d
    SET attempts = d.attempts + 1, worker = claim_event_deliveries.worker,
        next_attempt_at = now() + claim_event_deliveries.lease
    FROM (SELECT x.id FROM dispatch.event_deliveries x
          WHERE x.delivered_at IS NULL AND x.gave_up_at IS NULL AND x.next_attempt_at <= now()
          ORDER BY x.next_attempt_at
          LIMIT greatest(claim_event_deliveries.max_deliveries, 0)
          FOR UPDATE SKIP LOCKED) due
    WHERE d.id = due.id
    RETURNING d.id, d.url, d.payload::text, d.attempts;
END
$$;


--
-- Name: FUNCTION claim_event_deliveries(worker text, max_deliveries integer, lease interval); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.claim_event_deliveries(worker text, max_deliveries integer, lease interval) IS 'For listeners: up to max_deliveries event deliveries whose next attempt has come (SKIP LOCKED), each with its attempt number; each is not handed out again until lease has passed.';


--
-- Name: claim_runs(text, integer, interval, interval); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.claim_runs(worker text, max_runs integer, lease interval DEFAULT '00:01:00'::interval, default_timeout interval DEFAULT NULL::interval) RETURNS TABLE(run_id bigint, schedule_id uuid, project_id text, function_name text, args jsonb, request_id text, scheduled_for timestamp with time zone, attempt integer, lease_until timestamp with time zone, timeout interval, fire_at timestamp with time zone, kind text, traceparent text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    SET enable_sort TO 'off'
    SET jit TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
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


--
-- Name: FUNCTION claim_runs(worker text, max_runs integer, lease interval, default_timeout interval); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.claim_runs(worker text, max_runs integer, lease interval, default_timeout interval) IS 'Move up to max_runs pending runs of live schedules to running for worker and return what is needed to invoke them (fire_at: the instant the run fires at, its slot plus the schedule''s jitter offset; kind: scheduled, manual or backfill, last so that callers reading by position are unaffected): runs whose not_before is over first (retries, slots that waited for their jittered instant), then runs in slot order (FOR UPDATE SKIP LOCKED: concurrent callers never get the same run, nothing waits). attempt is the fencing token to pass to complete_runs or release_runs: each claim of a run gets a higher one, a claim handed back included. timeout is the invocation timeout to apply: the schedule''s, else default_timeout (the caller''s). lease_until is now + lease, plus the schedule''s timeout minus default_timeout when the schedule has its own: lease must be longer than default_timeout (at most 1 day; 22023 otherwise): give default_timeout plus a margin. Runs that must not start end instead: a retry past the next slot or beyond max_attempts (error), a first attempt past misfire_grace, a run of a stopped schedule (skipped).';


--
-- Name: complete_run(bigint, text, integer, text, text, integer, integer, boolean, integer, boolean, boolean, boolean, timestamp with time zone); Type: PROCEDURE; Schema: dispatch; Owner: -
--

CREATE PROCEDURE dispatch.complete_run(IN run_id bigint, IN worker text, IN attempt integer, IN status text, IN error text DEFAULT NULL::text, IN http_status integer DEFAULT NULL::integer, IN duration_ms integer DEFAULT NULL::integer, IN retryable boolean DEFAULT false, IN retry_after_ms integer DEFAULT NULL::integer, INOUT recorded boolean DEFAULT NULL::boolean, INOUT advanced boolean DEFAULT NULL::boolean, INOUT busy boolean DEFAULT NULL::boolean, INOUT retry_at timestamp with time zone DEFAULT NULL::timestamp with time zone)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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


--
-- Name: PROCEDURE complete_run(IN run_id bigint, IN worker text, IN attempt integer, IN status text, IN error text, IN http_status integer, IN duration_ms integer, IN retryable boolean, IN retry_after_ms integer, INOUT recorded boolean, INOUT advanced boolean, INOUT busy boolean, INOUT retry_at timestamp with time zone); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON PROCEDURE dispatch.complete_run(IN run_id bigint, IN worker text, IN attempt integer, IN status text, IN error text, IN http_status integer, IN duration_ms integer, IN retryable boolean, IN retry_after_ms integer, INOUT recorded boolean, INOUT advanced boolean, INOUT busy boolean, INOUT retry_at timestamp with time zone) IS 'dispatch.complete_runs for one run: record the outcome of a run still running with this attempt (or, retryable with attempts left, schedule its retry), advance its schedule, write the audit row, in one transaction. Returns recorded, advanced, busy (another transaction holds the run or its schedule: call again) and retry_at.';


--
-- Name: complete_runs(text, bigint[], integer[], text[], text[], integer[], integer[], boolean[], integer[]); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.complete_runs(worker text, run_ids bigint[], attempts integer[], statuses text[], errors text[], http_statuses integer[], durations_ms integer[], retryable boolean[] DEFAULT NULL::boolean[], retry_after_ms integer[] DEFAULT NULL::integer[]) RETURNS TABLE(run_id bigint, recorded boolean, advanced boolean, busy boolean, retry_at timestamp with time zone)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
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


--
-- Name: FUNCTION complete_runs(worker text, run_ids bigint[], attempts integer[], statuses text[], errors text[], http_statuses integer[], durations_ms integer[], retryable boolean[], retry_after_ms integer[]); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.complete_runs(worker text, run_ids bigint[], attempts integer[], statuses text[], errors text[], http_statuses integer[], durations_ms integer[], retryable boolean[], retry_after_ms integer[]) IS 'Record the outcomes (ok or error; errors cut to 500 characters) of runs still running with the attempt given (the fence claim_runs returned; worker is informational), advance each schedule still on its run''s slot, and write one audit row per run (with every attempt in its metadata), in one transaction. An error marked retryable, with attempts left (max_attempts), goes back to pending until its back-off is over (retry_backoff doubled per attempt, full jitter, or retry_after_ms; capped by retry_backoff_max), unless that is after the schedule''s next slot. The arrays are parallel (errors, http_statuses, durations_ms, retryable and retry_after_ms may hold NULLs or be NULL). Returns, for each input run: recorded; advanced (its schedule moved on); busy (not recorded because another transaction holds the run or its schedule: call again, within 5 s: a busy run whose own row is free has its lease renewed to at least 5 s from now); retry_at (when it will be retried). Never waits on a row another transaction holds.';


--
-- Name: cron_is_valid(text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.cron_is_valid(expr text) RETURNS boolean
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM dispatch.cron_parse(expr);
    RETURN expr IS NOT NULL;
EXCEPTION WHEN OTHERS THEN
    RETURN false;
END
$$;


--
-- Name: FUNCTION cron_is_valid(expr text); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.cron_is_valid(expr text) IS 'True when the expression parses and can fire; never raises.';


--
-- Name: cron_login_problem(text, text, text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.cron_login_problem(dbname text, role text, host text DEFAULT NULL::text) RETURNS text
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
    node text := coalesce(host, (SELECT h.setting FROM pg_catalog.pg_settings h WHERE h.name = 'cron.host'), 'localhost');
    ssl boolean := current_setting('ssl', true) = 'on';
    fix constant text := 'set cron.use_background_workers = on in postgresql.conf and restart PostgreSQL '
                         '(pg_cron then runs jobs in background workers, with no login), or let it log in '
                         '(a trust or peer line in pg_hba.conf for what it connects to, or a ~/.pgpass entry '
                         'for the operating-system user that runs PostgreSQL), then run the install again';
    addresses inet[];
    peer inet;
    rule record;
    what text;
BEGIN
    IF (SELECT w.setting FROM pg_catalog.pg_settings w WHERE w.name = 'cron.use_background_workers') = 'on' THEN
        RETURN NULL;
    END IF;
    IF NOT has_table_privilege('pg_catalog.pg_hba_file_rules', 'SELECT') THEN
        RETURN format('cannot tell whether pg_cron can log in to %s as %s: reading pg_hba.conf takes a superuser; '
                      'if its dispatch-tick runs fail with "connection failed", %s', node, role, fix);
    END IF;
    IF node LIKE '/%' THEN
        addresses := ARRAY[NULL::inet];  -- a socket directory: the "local" lines
    ELSIF node = 'localhost' THEN
        addresses := ARRAY['127.0.0.1'::inet, '::1'::inet];
    ELSIF node ~ '^[0-9a-fA-F.:]+$' THEN
        addresses := ARRAY[node::inet];
    ELSE
        RETURN format('cannot tell whether pg_cron can log in to %s as %s (a host name: pg_hba.conf matches '
                      'addresses); if its dispatch-tick runs fail with "connection failed", %s', node, role, fix);
    END IF;
    FOREACH peer IN ARRAY addresses LOOP
        SELECT h.line_number, h.type, h.database, h.user_name, h.address, h.auth_method, h.options INTO rule
        FROM pg_catalog.pg_hba_file_rules h
        WHERE h.error IS NULL
          AND CASE WHEN peer IS NULL THEN h.type = 'local'
                   ELSE h.type IN ('host', 'hostnogssenc', CASE WHEN ssl THEN 'hostssl' ELSE 'hostnossl' END)
                        AND (h.address IN ('all', 'samehost', 'samenet')
                             OR (h.address ~ '^[0-9a-fA-F.:]+$' AND h.netmask IS NOT NULL
                                 AND family(h.address::inet) = family(peer)
                                 AND (h.address::inet & h.netmask::inet) = (peer & h.netmask::inet)))
              END
          AND ('all' = ANY (h.database) OR dbname = ANY (h.database)
               OR ('sameuser' = ANY (h.database) AND dbname = role)
               OR ('samerole' = ANY (h.database) AND EXISTS (SELECT 1 FROM pg_catalog.pg_roles g
                                                             WHERE g.rolname = dbname
                                                               AND pg_has_role(role, g.oid, 'MEMBER'))))
          AND ('all' = ANY (h.user_name) OR role = ANY (h.user_name)
               OR EXISTS (SELECT 1 FROM unnest(h.user_name) u JOIN pg_catalog.pg_roles g
                            ON u LIKE '+%' AND g.rolname = substr(u, 2)
                          WHERE pg_has_role(role, g.oid, 'MEMBER')))
        ORDER BY h.line_number
        LIMIT 1;
        what := format('pg_cron logs in to %s%s as %s for database %s', node,
                       CASE WHEN peer IS NOT NULL AND node = 'localhost' THEN format(' (%s)', host(peer)) ELSE '' END,
                       role, dbname);
        IF rule.line_number IS NULL THEN
            RETURN format('%s, and no line of pg_hba.conf lets it in: %s', what, fix);
        ELSIF rule.auth_method = 'trust' THEN
            CONTINUE;
        ELSIF rule.auth_method IN ('peer', 'ident') AND role = 'postgres' AND rule.options IS NULL THEN
            CONTINUE;  -- the operating-system user that runs PostgreSQL is (almost always) postgres
        END IF;
        RETURN format('%s, and pg_hba.conf line %s (%s %s %s%s %s) %s: %s', what, rule.line_number,
                      rule.type, array_to_string(rule.database, ','), array_to_string(rule.user_name, ','),
                      coalesce(' ' || rule.address, ''), rule.auth_method,
                      CASE WHEN rule.auth_method IN ('md5', 'scram-sha-256', 'password')
                           THEN 'asks for a password it does not have'
                           WHEN rule.auth_method = 'reject' THEN 'turns it away'
                           WHEN rule.auth_method IN ('peer', 'ident')
                           THEN format('lets in only the operating-system user of the same name as %s', role)
                           ELSE format('needs %s credentials it does not have', rule.auth_method) END,
                      fix);
    END LOOP;
    RETURN NULL;
END
$_$;


--
-- Name: FUNCTION cron_login_problem(dbname text, role text, host text); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.cron_login_problem(dbname text, role text, host text) IS 'Why pg_cron cannot run a job of this role in this database, read from pg_hba.conf (the first matching line, as the server reads it) for the job''s host (default cron.host), with what to change; NULL when nothing is in the way (cron.use_background_workers is on, or a trust or peer line lets it in). Says so when the caller cannot read pg_hba.conf.';


--
-- Name: cron_next(text, timestamp with time zone, text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.cron_next(expr text, after timestamp with time zone, tz text DEFAULT 'UTC'::text) RETURNS timestamp with time zone
    LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN dispatch.cron_spec_next(dispatch.cron_parse(expr), after, dispatch.check_timezone(tz));
END
$$;


--
-- Name: FUNCTION cron_next(expr text, after timestamp with time zone, tz text); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.cron_next(expr text, after timestamp with time zone, tz text) IS 'The earliest minute-aligned instant strictly after "after" whose wall-clock time in tz matches the cron expression. Fixed-time expressions follow Debian cron across DST (a skipped time fires at the jump, a repeated one once); expressions whose minute or hour starts with * follow real time.';


--
-- Name: cron_parse(text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.cron_parse(expr text) RETURNS dispatch.cron_spec
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
    names  constant text[] := '{minute,hour,day-of-month,month,day-of-week}';
    mins   constant integer[] := '{0,0,1,1,0}';
    maxs   constant integer[] := '{59,23,31,12,7}';
    src    text := btrim(expr, E' \t\n\r');
    fields text[];
    spec   dispatch.cron_spec;
    f      integer;
    fname  text;
    item   text;
    parts  text[];
    range  text[];
    a      integer;
    b      integer;
    n      integer;
    step   integer;
    bits   bigint;
    top    integer;
    m      integer;
    w      integer;
    feasible boolean;
BEGIN
    IF src = '' THEN
        PERFORM dispatch._cron_error(expr, 'is empty');
    END IF;
    IF left(src, 1) = '@' THEN
        src := CASE lower(src)
                   WHEN '@yearly'   THEN '0 0 1 1 *'
                   WHEN '@annually' THEN '0 0 1 1 *'
                   WHEN '@monthly'  THEN '0 0 1 * *'
                   WHEN '@weekly'   THEN '0 0 * * 0'
                   WHEN '@daily'    THEN '0 0 * * *'
                   WHEN '@midnight' THEN '0 0 * * *'
                   WHEN '@hourly'   THEN '0 * * * *'
               END;
        IF src IS NULL THEN
            PERFORM dispatch._cron_error(expr, format('unknown macro %s', btrim(expr)),
                'Macros: @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly.');
        END IF;
    END IF;
    fields := regexp_split_to_array(src, '[ \t]+');
    IF cardinality(fields) <> 5 THEN
        PERFORM dispatch._cron_error(expr,
            format('expected 5 fields (minute hour day-of-month month day-of-week), got %s', cardinality(fields)));
    END IF;

    spec := ROW(0, 0, 0, 0, 0, 0, 0, false,
                left(fields[3], 1) = '*', left(fields[5], 1) = '*',
                left(fields[1], 1) = '*' OR left(fields[2], 1) = '*', NULL, NULL);

    FOR f IN 1..5 LOOP
        fname := names[f];
        -- day-of-week accepts 7 for Sunday, but '*' and 'n/s' stop at Saturday.
        top := CASE f WHEN 5 THEN 6 ELSE maxs[f] END;
        bits := 0;
        IF fields[f] = '*' THEN
            bits := (1::bigint << (top + 1)) - (1::bigint << mins[f]);
        ELSE
            FOREACH item IN ARRAY string_to_array(fields[f], ',') LOOP
                IF item = '' THEN
                    PERFORM dispatch._cron_error(expr, format('%s has an empty list item', fname));
                END IF;
                IF f = 3 AND upper(item) = 'L' THEN
                    spec.last_day := true;
                    CONTINUE;
                END IF;
                IF f = 5 AND strpos(item, '#') > 0 THEN
                    parts := string_to_array(item, '#');
                    IF parts[1] = '' THEN
                        PERFORM dispatch._cron_error(expr, format('day-of-week "%s" has no weekday before #', item));
                    END IF;
                    IF cardinality(parts) <> 2 OR parts[2] !~ '^[1-5]$' THEN
                        PERFORM dispatch._cron_error(expr,
                            format('day-of-week "%s": the occurrence after # must be 1-5', item));
                    END IF;
                    a := dispatch._cron_value(expr, fname, parts[1], 0, 7) % 7;
                    spec.nth_weekdays := spec.nth_weekdays | (1::bigint << (7 * (parts[2]::integer - 1) + a));
                    CONTINUE;
                END IF;
                IF f = 5 AND length(item) > 1 AND upper(right(item, 1)) = 'L' THEN
                    a := dispatch._cron_value(expr, fname, left(item, -1), 0, 7) % 7;
                    spec.last_weekdays := spec.last_weekdays | (1 << a);
                    CONTINUE;
                END IF;
                IF item ~ '[^0-9A-Za-z*/-]' OR (f <> 4 AND f <> 5 AND item ~ '[A-Za-z]') THEN
                    PERFORM dispatch._cron_error(expr, format('%s "%s" is not supported', fname, item),
                        CASE f WHEN 3 THEN 'day-of-month takes numbers, ranges a-b, steps */s, lists and L.'
                               WHEN 5 THEN 'day-of-week takes 0-7 or SUN-SAT, ranges, steps, lists, d#n and dL.'
                               ELSE format('%s takes numbers, ranges a-b, steps */s and lists.', fname) END);
                END IF;

                parts := string_to_array(item, '/');
                step := 1;
                IF cardinality(parts) > 2 THEN
                    PERFORM dispatch._cron_error(expr, format('%s "%s" has more than one /', fname, item));
                ELSIF cardinality(parts) = 2 THEN
                    IF parts[2] !~ '^[0-9]{1,4}$' OR parts[2]::integer NOT BETWEEN 1 AND top - mins[f] + 1 THEN
                        PERFORM dispatch._cron_error(expr,
                            format('%s step "%s" must be a number 1-%s', fname, parts[2], top - mins[f] + 1));
                    END IF;
                    step := parts[2]::integer;
                END IF;

                IF parts[1] = '*' THEN
                    a := mins[f];
                    b := top;
                ELSIF strpos(parts[1], '-') > 0 THEN
                    range := string_to_array(parts[1], '-');
                    IF cardinality(range) <> 2 OR range[1] = '' OR range[2] = '' THEN
                        PERFORM dispatch._cron_error(expr, format('%s range "%s" must be a-b', fname, parts[1]));
                    END IF;
                    a := dispatch._cron_value(expr, fname, range[1], mins[f], maxs[f]);
                    b := dispatch._cron_value(expr, fname, range[2], mins[f], maxs[f]);
                    IF f = 5 AND upper(range[2]) = 'SUN' AND a > 0 THEN
                        b := 7;  -- MON-SUN: Sunday as the end of the week
                    END IF;
                    IF a > b THEN
                        PERFORM dispatch._cron_error(expr,
                            format('%s range %s is reversed', fname, parts[1]),
                            'Write a wrapping range as two, e.g. "22-23,0-2".');
                    END IF;
                ELSIF parts[1] = '' THEN
                    PERFORM dispatch._cron_error(expr, format('%s "%s" has nothing before /', fname, item));
                ELSE
                    a := dispatch._cron_value(expr, fname, parts[1], mins[f], maxs[f]);
                    -- "n/s" means n, n+s, ... up to the field's end (Vixie cron).
                    b := CASE WHEN cardinality(parts) = 2 THEN greatest(top, a) ELSE a END;
                END IF;

                IF step = 1 THEN
                    bits := bits | ((1::bigint << (b + 1)) - (1::bigint << a));
                ELSE
                    FOR n IN a..b BY step LOOP
                        bits := bits | (1::bigint << n);
                    END LOOP;
                END IF;
            END LOOP;
        END IF;

        CASE f
            WHEN 1 THEN spec.minutes := bits;
            WHEN 2 THEN spec.hours := bits;
            WHEN 3 THEN spec.days := bits;
            WHEN 4 THEN spec.months := bits;
            ELSE spec.weekdays := ((bits | (bits >> 7)) & 127);  -- 7 is Sunday too
        END CASE;
    END LOOP;

    -- An expression that can never fire is refused. Only day-of-month can make it so: with
    -- the Vixie OR rule any weekday item fires somewhere, so only the AND case needs a look.
    IF spec.days_star OR spec.weekdays_star THEN
        feasible := false;
        FOR m IN 1..12 LOOP
            CONTINUE WHEN spec.months & (1 << m) = 0;
            IF spec.weekdays = 127 OR (spec.weekdays <> 0 AND spec.nth_weekdays = 0 AND spec.last_weekdays = 0) THEN
                -- plain weekdays fall on every date sooner or later: the days alone decide
                feasible := spec.last_day OR spec.days & ((1::bigint << (CASE m WHEN 2 THEN 29 WHEN 4 THEN 30
                            WHEN 6 THEN 30 WHEN 9 THEN 30 WHEN 11 THEN 30 ELSE 31 END + 1)) - 2) <> 0;
            ELSE
                -- d#n and dL pin dates: try every weekday the month can start on, leap Februaries too
                FOR w IN 0..6 LOOP
                    feasible := dispatch._cron_days(spec, CASE m WHEN 2 THEN 2000 + w * 4 ELSE 2000 END, m, w) <> 0
                             OR (m = 2 AND dispatch._cron_days(spec, 2001, m, w) <> 0);
                    EXIT WHEN feasible;
                END LOOP;
            END IF;
            EXIT WHEN feasible;
        END LOOP;
        IF NOT feasible THEN
            PERFORM dispatch._cron_error(expr, 'can never fire: no month it allows has a day it allows');
        END IF;
    END IF;
    RETURN spec;
END
$_$;


--
-- Name: FUNCTION cron_parse(expr text); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.cron_parse(expr text) IS 'Parse a 5-field cron expression (or macro) into a dispatch.cron_spec. Raises SQLSTATE 22023 with a message naming the field and the offending part.';


--
-- Name: cron_spec_next(dispatch.cron_spec, timestamp with time zone, text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.cron_spec_next(spec dispatch.cron_spec, after timestamp with time zone, tz text DEFAULT 'UTC'::text) RETURNS timestamp with time zone
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    w   timestamp;
    m   timestamp;
    i   timestamptz;
    j   timestamptz;
    c   timestamptz;
    k   timestamptz;
    ahead double precision;
BEGIN
    -- A bounded rule: 'infinity' past its last slot (the schedule then ends), and no slot
    -- before its start (a slot on starts_at itself counts).
    IF spec.ends_at IS NOT NULL AND after >= spec.ends_at THEN
        RETURN 'infinity';
    END IF;
    IF spec.starts_at IS NOT NULL AND after < spec.starts_at THEN
        after := spec.starts_at - interval '1 microsecond';
    END IF;
    IF spec.every_us IS NOT NULL THEN
        c := dispatch._every_slot(spec, dispatch._every_index(spec, after) + 1);
    ELSIF spec.real_time THEN
        -- Follows real time: walk instants; a wall-clock time skipped by DST never happens, a
        -- repeated one happens twice. Between offset changes, wall = instant + constant offset.
        i := to_timestamp((floor(extract(epoch FROM after) / 60) + 1) * 60);
        LOOP
            w := i AT TIME ZONE tz;
            m := dispatch._cron_match_from(spec, w);
            ahead := extract(epoch FROM m - w);
            IF ahead <= 14 * 86400 THEN
                j := to_timestamp(extract(epoch FROM i) + ahead);
                IF (j AT TIME ZONE tz) = m THEN
                    c := j;  -- same offset at both ends: no change in between
                    EXIT;
                END IF;
                i := dispatch._tz_transition(i, j, tz);
            ELSE
                j := to_timestamp(extract(epoch FROM i) + 14 * 86400);
                IF (j AT TIME ZONE tz) - w = interval '14 days' THEN
                    i := j;  -- no offset change and no match in these 14 days
                ELSE
                    i := dispatch._tz_transition(i, j, tz);
                END IF;
            END IF;
        END LOOP;
    ELSE
        -- Fixed time (Debian cron): once per matching wall-clock time; a time skipped by a
        -- spring-forward fires at the jump, a time repeated by a fall-back at its first occurrence.
        -- (dispatch._wall_instant says the same for calendars; inline here, where a call costs a
        -- tenth of cron_spec_next, and both are held to the oracles)
        w := date_trunc('minute', after AT TIME ZONE tz) + interval '1 minute';
        LOOP
            m := dispatch._cron_match_from(spec, w);
            c := m AT TIME ZONE tz;  -- PostgreSQL reads a skipped or repeated time with the standard offset
            IF (c AT TIME ZONE tz) <> m THEN
                c := dispatch._tz_transition(c - interval '24 hours', c + interval '24 hours', tz);
            ELSE
                k := c - interval '24 hours';
                k := (m - ((k AT TIME ZONE tz) - (k AT TIME ZONE 'UTC'))) AT TIME ZONE 'UTC';
                IF k < c AND (k AT TIME ZONE tz) = m THEN
                    c := k;  -- the earlier of two occurrences
                END IF;
            END IF;
            EXIT WHEN c > after;
            w := m + interval '1 minute';
        END LOOP;
    END IF;
    RETURN CASE WHEN c > spec.ends_at THEN 'infinity' ELSE c END;
END
$$;


--
-- Name: FUNCTION cron_spec_next(spec dispatch.cron_spec, after timestamp with time zone, tz text); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.cron_spec_next(spec dispatch.cron_spec, after timestamp with time zone, tz text) IS 'dispatch.cron_next for an already parsed expression: the earliest minute-aligned instant strictly after "after" that the spec matches in time zone tz. For an interval spec (dispatch.every_spec), the first anchor + k * every after "after"; tz does not apply. A bounded spec (dispatch.bounded_spec) gives no slot before its start and ''infinity'' past its last slot.';


--
-- Name: every_spec(interval, timestamp with time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.every_spec(every interval, anchor timestamp with time zone) RETURNS dispatch.cron_spec
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    spec dispatch.cron_spec;
BEGIN
    IF every IS NULL OR every < interval '1 second' OR every > interval '366 days' THEN
        RAISE EXCEPTION 'every must be at least 1 second and at most 366 days, not %', coalesce(every::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'For slots less than a second apart, call the function in a loop of its own.';
    END IF;
    IF extract(month FROM every) <> 0 OR extract(year FROM every) <> 0 THEN
        RAISE EXCEPTION 'every must be a fixed length (seconds, minutes, hours, days), not %', every
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Months have no fixed length: for a calendar rule use a cron expression, e.g. ''0 0 1 * *''.';
    END IF;
    IF anchor IS NULL OR NOT isfinite(anchor) THEN
        RAISE EXCEPTION 'anchor must be a finite instant, not %', coalesce(anchor::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    spec.every_us := (extract(epoch FROM every) * 1000000)::bigint;
    spec.anchor := anchor;
    spec.real_time := true;
    RETURN spec;
END
$$;


--
-- Name: FUNCTION every_spec(every interval, anchor timestamp with time zone); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.every_spec(every interval, anchor timestamp with time zone) IS 'The slot rule of an interval schedule (slots at anchor + k * every, real time) as a dispatch.cron_spec, for dispatch.cron_spec_next and the tick. Raises 22023 for an interval under 1 second or over 366 days, or one with months.';


--
-- Name: explain(uuid, timestamp with time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.explain(schedule_id uuid, since timestamp with time zone DEFAULT (now() - '1 day'::interval)) RETURNS TABLE(section text, item text, at timestamp with time zone, run_id bigint, detail text)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    s dispatch.schedules;
    stopped text;
    computable boolean;
    head record;          -- the open run that holds the schedule (overlap skip, buffer_one)
    brk dispatch.breakers;  -- its function's circuit breaker, if it ever failed retryably
    held text;
    cap record;           -- its project's max_concurrency, as the next claim sees it
    capped text;          -- why a due run of that project waits for it
    slot_run dispatch.runs;
    listening boolean;
    who text;
    disabled_at timestamptz;
    cut timestamptz;
    last_missed timestamptz;
    first_in_grace timestamptz;
    target timestamptz;
    target_fire timestamptz;
    coalesced integer;
    first_next timestamptz;
    next_note text := '';
    slot timestamptz;
    k integer;
    gap_first timestamptz;
    gap_last timestamptz;
    gap_slots integer;
    gap_at_least boolean;
    excl record;          -- the calendar's period that holds the slot at hand
    no_period record;
    after_excl timestamptz;  -- the first slot after it that runs
    shown integer;
    passed_from timestamptz;  -- a due period's first slot, when the slot after it is due too
BEGIN
    SELECT * INTO s FROM dispatch.schedules x WHERE x.id = explain.schedule_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'schedule % does not exist', explain.schedule_id
            USING ERRCODE = 'no_data_found',
                  HINT = 'SELECT id, project_id, function_name FROM dispatch.schedules lists them.';
    END IF;
    IF explain.since IS NULL THEN
        RAISE EXCEPTION 'since must be an instant, not NULL'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Leave it out for the last day: dispatch.explain(id).';
    END IF;
    stopped := dispatch._stopped_as(s);
    SELECT NULL::text AS calendar, NULL::timestamptz AS starts_at, NULL::timestamptz AS ends_at, NULL::text AS label
    INTO no_period;
    excl := no_period;
    computable := dispatch._explain_next(s.cron_spec, now(), s.timezone) IS NOT NULL;
    SELECT * INTO slot_run FROM dispatch.runs r
    WHERE r.schedule_id = s.id AND r.scheduled_for = s.next_run_at;
    listening := EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a
                         WHERE a.datname = current_database() AND a.application_name LIKE 'pgdispatch%');

    -- The run that holds a schedule under overlap skip or buffer_one: the running one, else the
    -- first that may go (a backfill run waiting its turn holds nothing; a buffered one waits).
    SELECT * INTO brk FROM dispatch.breakers b WHERE b.project_id = s.project_id AND b.function_name = s.function_name;
    held := format('held by the circuit breaker of %s/%s, open since %s after %s retryable failures (%s): it goes when the breaker closes (an answer, or dispatch.reset_breaker), or as its probe, one at a time (the next at %s)',
                   s.project_id, s.function_name, dispatch._instant(brk.opened_at), brk.failures,
                   coalesce(brk.last_error, 'no error text'), dispatch._instant(brk.next_probe_at));
    -- A due run of a capped project that the next claim leaves: the project is at its cap, its
    -- room goes to runs before it in the claim's order, or a transaction holds its row.
    SELECT * INTO cap FROM dispatch._explain_cap(s.project_id);
    capped := CASE
        WHEN cap.max_concurrency IS NULL THEN NULL
        WHEN cap.holder IS NOT NULL THEN
            format('project %s has max_concurrency %s (%s running), and its row in dispatch.projects is held by %s in an open transaction: every claim skips the project until that transaction ends',
                   s.project_id, cap.max_concurrency, cap.running,
                   coalesce((SELECT CASE WHEN a.pid = pg_backend_pid() THEN format('this session (pid %s)', a.pid)
                                         ELSE format('pid %s (%s)', a.pid,
                                                     concat_ws(', ', nullif(a.application_name, ''), 'role ' || a.usename,
                                                               a.state, 'its transaction began at ' || dispatch._instant(a.xact_start)))
                                    END
                             FROM pg_catalog.pg_stat_activity a WHERE a.pid = cap.holder),
                            format('pid %s', cap.holder)))
        WHEN cap.max_concurrency <= cap.running THEN
            format('project %s is at its max_concurrency: %s of %s running; it goes when one of them ends (an outcome, a hand-back, an expired lease)',
                   s.project_id, cap.running, cap.max_concurrency)
        ELSE
            format('project %s (max_concurrency %s, %s running) has room for %s more, which the next claim gives to %s of %s due before this one',
                   s.project_id, cap.max_concurrency, cap.running, cap.max_concurrency - cap.running,
                   CASE WHEN cap.max_concurrency - cap.running = 1 THEN 'a run'
                        ELSE (cap.max_concurrency - cap.running) || ' runs' END,
                   s.project_id)
        END;
    SELECT * INTO head FROM dispatch._explain_open(s) o
    WHERE o.verdict <> 'waits_turn'
    ORDER BY o.verdict = 'buffered', o.status = 'running' DESC, o.scheduled_for, o.id LIMIT 1;
    -- (a running run first: under skip at most one run is open anyway, beside backfill runs waiting
    -- their turn; under buffer_one the buffered one waits behind it)

    -- 1. state
    section := 'state';
    run_id := NULL;
    IF stopped = 'deleted' THEN
        item := 'deleted';
        at := s.deleted_at;
        SELECT a.actor_id INTO who FROM dispatch.audit_log a
        WHERE a.project_id = s.project_id AND a.at = s.deleted_at AND a.action = 'schedule.delete'
          AND a.metadata->>'scheduleId' = s.id::text
        LIMIT 1;
        detail := format('deleted%s at %s (a soft delete): nothing fires again; its runs and audit rows are kept',
                         coalesce(' by ' || who, ''), dispatch._instant(s.deleted_at));
    ELSIF stopped = 'paused' THEN
        item := 'paused';
        at := s.paused_at;
        detail := format('paused by %s at %s%s: nothing fires until dispatch.resume(), which goes on from the first slot after then (the slots of the pause are not caught up; backfill runs them)',
                         s.paused_by, dispatch._instant(s.paused_at),
                         coalesce(' because "' || s.paused_reason || '"', ', no reason given'));
    ELSIF stopped = 'disabled' THEN
        item := 'disabled';
        -- who disabled it: the latest audit row that set enabled false (at or before updated_at)
        SELECT a.actor_id, a.at INTO who, disabled_at
        FROM dispatch.audit_log a
        WHERE a.project_id = s.project_id AND a.at <= s.updated_at
          AND a.action IN ('schedule.update', 'schedule.create')
          AND a.metadata->>'scheduleId' = s.id::text
          AND (a.action = 'schedule.create' OR a.metadata->'changed'->>'enabled' = 'false')
        ORDER BY a.at DESC, a.id DESC LIMIT 1;
        at := disabled_at;
        detail := format('disabled%s: nothing fires until enabled = true, which goes on from the first slot after then',
                         coalesce(' by ' || who || ' at ' || dispatch._instant(disabled_at), ''));
    ELSIF s.backoff_reason IS NOT NULL THEN
        item := 'backed_off';
        at := s.next_run_at;
        detail := format('backed off: %s; at %s it records a skipped run and tries again (it is never invoked at such an instant)',
                         s.backoff_reason, dispatch._instant(s.next_run_at));
    ELSIF head.id IS NOT NULL AND s.overlap <> 'allow' THEN
        run_id := head.id;
        item := CASE head.verdict WHEN 'running' THEN 'busy' ELSE head.verdict END;
        at := CASE head.verdict
                  WHEN 'running' THEN head.claimed_at
                  WHEN 'expired' THEN head.lease_until
                  WHEN 'jitter_wait' THEN head.not_before
                  WHEN 'breaker' THEN brk.next_probe_at
                  WHEN 'retry_wait' THEN head.not_before
                  ELSE coalesce(nullif(head.not_before, 'infinity'), head.fire_at, head.scheduled_for) END;
        detail := CASE head.verdict
            WHEN 'running' THEN format('busy: run %s (%s, slot %s) is running on %s since %s, attempt %s of %s',
                                       head.id, head.kind, dispatch._instant(head.scheduled_for), head.worker,
                                       dispatch._instant(head.claimed_at), head.attempt - head.released, s.max_attempts)
            WHEN 'expired' THEN format('run %s (%s, slot %s) was claimed by %s at %s, and its lease ran out at %s (did that listener die?): the next tick %s',
                                       head.id, head.kind, dispatch._instant(head.scheduled_for), head.worker,
                                       dispatch._instant(head.claimed_at), dispatch._instant(head.lease_until),
                                       CASE WHEN head.attempt - head.released < s.max_attempts
                                            THEN format('hands it out again (attempt %s of %s, the same request id)',
                                                        head.attempt - head.released + 1, s.max_attempts)
                                            ELSE format('ends it lost (attempt %s was the last)', s.max_attempts) END)
            WHEN 'pending' THEN format('run %s (%s, slot %s) is due: the next claim takes it%s',
                                       head.id, head.kind, dispatch._instant(head.scheduled_for),
                                       CASE WHEN listening THEN '' ELSE ' (no listener is connected: see dispatch.listeners)' END)
            WHEN 'jitter_wait' THEN format('waiting for its jitter offset: run %s (slot %s) fires at %s (+%s)',
                                           head.id, dispatch._instant(head.scheduled_for),
                                           dispatch._instant(head.not_before),
                                           dispatch._span(head.not_before - head.scheduled_for))
            WHEN 'retry_wait' THEN format('waiting for a retry: run %s (slot %s) failed on attempt %s of %s (%s) and is retried at %s',
                                          head.id, dispatch._instant(head.scheduled_for), head.attempt - head.released,
                                          s.max_attempts, coalesce(head.error, 'no error text'),
                                          dispatch._instant(head.not_before))
            WHEN 'breaker' THEN format('run %s (slot %s) is %s', head.id, dispatch._instant(head.scheduled_for), held)
            WHEN 'capped' THEN format('run %s (%s, slot %s) is due, but %s', head.id, head.kind,
                                      dispatch._instant(head.scheduled_for), capped)
            WHEN 'missed' THEN format('run %s (slot %s) cannot start within misfire_grace (%s): the next claim ends it skipped',
                                      head.id, dispatch._instant(head.scheduled_for), s.misfire_grace)
            WHEN 'late' THEN format('run %s (slot %s) waited for a retry that may no longer start (the next slot came, or max_attempts is %s): the next claim ends it error (lost, if its last lease expired)',
                                    head.id, dispatch._instant(head.scheduled_for), s.max_attempts)
            ELSE format('run %s (slot %s) waits behind a run that is no longer open: it goes when the schedule next finishes a run',
                        head.id, dispatch._instant(head.scheduled_for))
            END
            || CASE WHEN s.overlap = 'skip'
                    THEN '; overlap skip: slots that come due meanwhile do not run (a gap, overlap)'
                    ELSE '; overlap buffer_one: the first slot that comes due meanwhile waits behind it, later ones do not run'
               END;
    ELSIF s.ended_at IS NOT NULL THEN
        item := 'ended';
        at := s.ended_at;
        detail := format('ended at %s: %s; nothing fires again unless an edit of its rule or bounds leaves it a slot to come; its runs and audit rows are kept',
                         dispatch._instant(s.ended_at), s.ended_reason)
            || CASE WHEN head.id IS NOT NULL THEN format('; run %s is still open', head.id) ELSE '' END;
    ELSIF s.next_run_at <= now() AND slot_run.id IS NOT NULL AND slot_run.status NOT IN ('pending', 'running') THEN
        item := 'settling';
        at := s.next_run_at;
        run_id := slot_run.id;
        detail := format('its slot %s already has run %s (%s): the next tick moves it on to the slot after',
                         dispatch._instant(s.next_run_at), slot_run.id, slot_run.status);
    ELSIF s.next_run_at <= now() THEN
        -- what dispatch._tick_schedule does with it: slots beyond the grace are recorded, never
        -- invoked; of the others catchup latest marks the latest, all the oldest
        cut := CASE WHEN s.misfire_grace IS NULL THEN '-infinity' ELSE now() - s.misfire_grace - s.jitter END;
        first_in_grace := s.next_run_at;
        IF s.next_run_at < cut THEN
            last_missed := coalesce(dispatch._cron_latest(s.cron_spec, s.next_run_at, cut - interval '1 microsecond',
                                                          s.timezone), s.next_run_at);
            first_in_grace := dispatch.cron_spec_next(s.cron_spec, last_missed, s.timezone);
        END IF;
        -- a period of its calendar: passed over, and the first slot after it is due in turn when
        -- it has come
        IF s.calendar_id IS NOT NULL AND first_in_grace <= now() THEN
            SELECT * INTO excl FROM dispatch._calendar_period(s.calendar_id, first_in_grace);
            IF excl.calendar IS NOT NULL THEN
                after_excl := dispatch._calendar_slot(s.cron_spec, s.timezone, s.calendar_id, first_in_grace);
                IF after_excl <= now() THEN
                    passed_from := first_in_grace;
                    first_in_grace := after_excl;
                END IF;
            END IF;
        END IF;
        target := CASE WHEN s.catchup = 'all' THEN first_in_grace
                       WHEN s.calendar_id IS NOT NULL
                       THEN coalesce(dispatch._calendar_latest(s.cron_spec, s.timezone, s.calendar_id,
                                                               first_in_grace - interval '1 microsecond', now()),
                                     first_in_grace)
                       ELSE coalesce(dispatch._cron_latest(s.cron_spec, first_in_grace - interval '1 microsecond',
                                                           now(), s.timezone), first_in_grace) END;
        IF excl.calendar IS NOT NULL AND passed_from IS NULL THEN
            item := 'excluded';
            at := first_in_grace;
            detail := dispatch._excluded_detail(first_in_grace, excl, after_excl, s.timezone);
        ELSIF first_in_grace > now() THEN
            item := 'missed';
            at := CASE WHEN isfinite(first_in_grace) THEN first_in_grace END;
            detail := format('its slots from %s to %s are beyond misfire_grace (%s): the next tick records them skipped, never invoked, and %s',
                             dispatch._instant(s.next_run_at), dispatch._instant(last_missed), s.misfire_grace,
                             CASE WHEN isfinite(first_in_grace) THEN 'it goes on at ' || dispatch._instant(first_in_grace)
                                  ELSE 'it ends: they are its last' END);
        ELSIF target = slot_run.scheduled_for THEN
            -- overlap allow, set while a run stood on the slot: the tick only moves on
            item := 'settling';
            at := target;
            run_id := slot_run.id;
            detail := format('its slot %s already has run %s (%s): the next tick moves it on to the slot after',
                             dispatch._instant(target), slot_run.id, slot_run.status);
        ELSE
            target_fire := target + dispatch.jitter_offset(s.id, target, s.jitter);
            coalesced := CASE WHEN target > first_in_grace
                              THEN (dispatch._slots_between(s.cron_spec, first_in_grace - interval '1 microsecond',
                                                            target, s.timezone)).slots END;
            item := 'due';
            at := target;
            detail := format('slot %s is due (%s ago) and not marked yet: the next tick marks it', dispatch._instant(target),
                             dispatch._span(now() - target))
                || CASE WHEN s.next_run_at < first_in_grace
                        THEN format('; the slots from %s to %s are beyond misfire_grace (%s) and are recorded skipped',
                                    dispatch._instant(s.next_run_at), dispatch._instant(last_missed), s.misfire_grace)
                        ELSE '' END
                || CASE WHEN passed_from IS NOT NULL
                        THEN format('; the slots from %s, in a period of calendar %s, are passed over (a gap, calendar)',
                                    dispatch._instant(passed_from), excl.calendar)
                        ELSE '' END
                || CASE WHEN coalesced > 0
                        THEN format('; %s earlier slot%s since %s are coalesced into it (catchup latest)', coalesced,
                                    CASE WHEN coalesced = 1 THEN '' ELSE 's' END, dispatch._instant(first_in_grace))
                        ELSE '' END
                || CASE WHEN s.catchup = 'all' AND target < now()
                             AND dispatch.cron_spec_next(s.cron_spec, target, s.timezone) <= now()
                        THEN '; the later ones follow, one at a time (catchup all)' ELSE '' END
                || CASE WHEN target_fire > now() THEN format('; it fires at %s (jitter +%s)',
                                                              dispatch._instant(target_fire),
                                                              dispatch._span(target_fire - target))
                        WHEN s.misfire_grace IS NOT NULL AND now() - target_fire > s.misfire_grace
                        THEN format('; its fire instant %s is beyond misfire_grace (%s): the claim ends it skipped',
                                    dispatch._instant(target_fire), s.misfire_grace)
                        ELSE '' END
                || CASE WHEN listening THEN '' ELSE ' (no listener is connected: pg_cron''s minutely tick marks it)' END;
        END IF;
    ELSE
      IF s.calendar_id IS NOT NULL THEN
          SELECT * INTO excl FROM dispatch._calendar_period(s.calendar_id, s.next_run_at);
      END IF;
      IF excl.calendar IS NOT NULL THEN
        after_excl := dispatch._calendar_slot(s.cron_spec, s.timezone, s.calendar_id, s.next_run_at);
        item := 'excluded';
        at := s.next_run_at;
        detail := dispatch._excluded_detail(s.next_run_at, excl, after_excl, s.timezone);
      ELSE
        item := 'live';
        at := s.next_run_at + dispatch.jitter_offset(s.id, s.next_run_at, s.jitter);
        detail := format('live: its next slot is %s', dispatch._instant(s.next_run_at))
            || CASE WHEN at > s.next_run_at THEN format(', and fires at %s (jitter +%s)', dispatch._instant(at),
                                                       dispatch._span(at - s.next_run_at))
                    ELSE '' END;
      END IF;
      detail := detail
          || CASE WHEN head.id IS NOT NULL THEN format('; run %s is open beside it (overlap allow)', head.id) ELSE '' END;
    END IF;
    RETURN NEXT;

    -- 2. open runs
    RETURN QUERY
    SELECT 'open run', o.verdict, o.scheduled_for, o.id,
           format('%s run, slot %s: ', o.kind, dispatch._instant(o.scheduled_for)) || CASE o.verdict
               WHEN 'running' THEN format('running on %s since %s, attempt %s of %s, lease until %s',
                                          o.worker, dispatch._instant(o.claimed_at), o.attempt - o.released,
                                          s.max_attempts, dispatch._instant(o.lease_until))
               WHEN 'expired' THEN format('claimed by %s at %s, attempt %s of %s; its lease ran out at %s: the next tick %s',
                                          o.worker, dispatch._instant(o.claimed_at), o.attempt - o.released,
                                          s.max_attempts, dispatch._instant(o.lease_until),
                                          CASE WHEN o.attempt - o.released < s.max_attempts AND stopped IS NULL
                                               THEN 'hands it out again' ELSE 'ends it lost' END)
               WHEN 'stale' THEN format('the schedule is %s: the next claim ends it without invoking it', stopped)
               WHEN 'waits_turn' THEN 'waits its turn (backfill runs go one at a time, oldest first, when nothing else of the schedule is open)'
               WHEN 'buffered' THEN 'waits behind the open run (overlap buffer_one)'
               WHEN 'jitter_wait' THEN format('waits for its fire instant %s', dispatch._instant(o.not_before))
               WHEN 'retry_wait' THEN format('attempt %s of %s failed (%s); retried at %s', o.attempt - o.released,
                                             s.max_attempts, coalesce(o.error, 'no error text'),
                                             dispatch._instant(o.not_before))
               WHEN 'missed' THEN format('not started within misfire_grace (%s): the next claim ends it skipped',
                                         s.misfire_grace)
               WHEN 'late' THEN 'its retry may no longer start: the next claim ends it error (lost, if its last lease expired)'
               WHEN 'breaker' THEN held
               WHEN 'capped' THEN format('due since %s, but %s',
                                         dispatch._instant(coalesce(o.not_before, o.fire_at, o.scheduled_for)), capped)
               ELSE format('due since %s: the next claim takes it%s',
                           dispatch._instant(coalesce(o.not_before, o.fire_at, o.scheduled_for)),
                           CASE WHEN o.attempt > o.released THEN format(' (attempt %s of %s)', o.attempt - o.released + 1,
                                                                        s.max_attempts)
                                ELSE '' END)
           END
    FROM dispatch._explain_open(s) o
    ORDER BY o.scheduled_for, o.id;

    -- 3. the next three slots: from where the schedule goes on (a stopped one: were it started now)
    IF stopped IS DISTINCT FROM 'deleted' THEN
        IF s.backoff_reason IS NOT NULL OR NOT computable THEN
            section := 'next';
            item := 'back-off';
            at := s.next_run_at;
            run_id := NULL;
            detail := 'its slots cannot be computed (its time zone is gone from the tz database): none is known';
            IF s.next_run_at IS NOT NULL THEN
                RETURN NEXT;
            END IF;
        ELSE
            IF stopped IS NOT NULL THEN
                first_next := dispatch.cron_spec_next(s.cron_spec, now(), s.timezone);
                next_note := format(' (if %s now)', CASE stopped WHEN 'paused' THEN 'resumed' ELSE 'enabled' END);
            ELSIF item = 'due' THEN
                first_next := target;
            ELSIF item = 'missed' THEN
                first_next := first_in_grace;
            ELSIF item = 'excluded' THEN
                first_next := after_excl;
            ELSIF (slot_run.id IS NOT NULL AND slot_run.status IN ('pending', 'running')) OR s.next_run_at <= now() THEN
                first_next := dispatch.cron_spec_next(s.cron_spec, greatest(s.next_run_at, now()), s.timezone);
                IF head.id IS NOT NULL AND s.overlap = 'skip' THEN
                    next_note := format(' (if run %s has finished by then)', head.id);
                END IF;
            ELSE
                first_next := s.next_run_at;
            END IF;
            slot := first_next;
            k := 0;
            shown := 0;
            -- the three slots that run, and the periods of the calendar before them: six rows at most
            WHILE k < 3 AND shown < 6 LOOP
                section := 'next';
                IF slot IS NULL OR NOT isfinite(slot) THEN
                    -- a bounded rule past its last slot
                    item := 'end';
                    at := NULL;
                    run_id := NULL;
                    detail := CASE WHEN k = 0 THEN 'no slot to come: ' ELSE 'no slot after these: ' END
                              || dispatch._ended_reason(s) || next_note;
                    RETURN NEXT;
                    EXIT;
                END IF;
                excl := no_period;
                IF s.calendar_id IS NOT NULL THEN
                    SELECT * INTO excl FROM dispatch._calendar_period(s.calendar_id, slot);
                END IF;
                shown := shown + 1;
                IF excl.calendar IS NOT NULL THEN
                    item := 'excluded';
                    at := slot;
                    run_id := NULL;
                    after_excl := dispatch._calendar_slot(s.cron_spec, s.timezone, s.calendar_id, slot);
                    detail := dispatch._excluded_detail(slot, excl, after_excl, s.timezone) || next_note;
                    RETURN NEXT;
                    slot := after_excl;
                    CONTINUE;
                END IF;
                k := k + 1;
                item := 'slot';
                at := slot;
                run_id := NULL;
                detail := format('slot %s: fires %s', k,
                                 CASE WHEN s.jitter > interval '0' AND dispatch.jitter_offset(s.id, slot, s.jitter) > interval '0'
                                      THEN format('at %s (jitter +%s)',
                                                  dispatch._instant(slot + dispatch.jitter_offset(s.id, slot, s.jitter)),
                                                  dispatch._span(dispatch.jitter_offset(s.id, slot, s.jitter)))
                                      ELSE 'on the slot' END)
                    || CASE WHEN s.every IS NULL
                            THEN format(', %s %s', to_char(slot AT TIME ZONE s.timezone, 'Dy HH24:MI'), s.timezone)
                            ELSE '' END
                    || next_note;
                RETURN NEXT;
                slot := dispatch.cron_spec_next(s.cron_spec, slot, s.timezone);
            END LOOP;
        END IF;
    END IF;

    -- 4. the last finished runs, the latest slot first (read backwards along runs_slot_key)
    RETURN QUERY
    SELECT 'run', r.status, r.scheduled_for, r.id,
           format('%s run, slot %s, %s at %s', r.kind, dispatch._instant(r.scheduled_for), r.status,
                  dispatch._instant(r.finished_at))
           || CASE WHEN r.attempt - r.released > 1 THEN format(' after %s attempts', r.attempt - r.released) ELSE '' END
           || coalesce(', HTTP ' || r.http_status, '')
           || coalesce(' in ' || dispatch._span(r.duration_ms * interval '1 millisecond'), '')
           || coalesce(': ' || r.error, '')
    FROM dispatch.runs r
    WHERE r.schedule_id = s.id AND r.status NOT IN ('pending', 'running')
    ORDER BY r.scheduled_for DESC
    LIMIT 5;

    -- 5. the slots since `since` that did not run: recorded gaps, skipped runs, and the slots
    -- a stopped schedule has passed over so far (recorded as one gap when it goes on again).
    -- A gap is recorded when it ends, by a tick at most an hour ahead of the clock: one that
    -- holds a slot after `since` was recorded after since - 1 hour (the index on project_id, at).
    IF stopped IN ('paused', 'disabled') AND s.stopped_on IS NOT NULL AND computable THEN
        SELECT b.first_slot, b.last_slot, b.slots, b.at_least INTO gap_first, gap_last, gap_slots, gap_at_least
        FROM dispatch._slots_between(s.cron_spec,
                                     greatest(s.stopped_on - interval '1 microsecond',
                                              (SELECT max(r.scheduled_for) FROM dispatch.runs r
                                               WHERE r.schedule_id = s.id AND r.kind = 'scheduled')),
                                     now(), s.timezone) b;
    END IF;
    RETURN QUERY
    WITH n AS (
        SELECT a.metadata->>'reason' AS item, (a.metadata->>'first')::timestamptz AS at, NULL::bigint AS run_id,
               (a.metadata->>'count')::bigint AS slots,
               format('%s%s slot%s from %s to %s %s (recorded %s)',
                      CASE WHEN (a.metadata->>'countIsAtLeast')::boolean THEN 'at least ' ELSE '' END,
                      a.metadata->>'count', CASE WHEN a.metadata->>'count' = '1' THEN '' ELSE 's' END,
                      dispatch._instant((a.metadata->>'first')::timestamptz),
                      dispatch._instant((a.metadata->>'last')::timestamptz),
                      CASE a.metadata->>'reason'
                          WHEN 'overlap' THEN 'came due while a run was open (overlap)'
                          WHEN 'catch-up' THEN 'were missed while nothing ran, coalesced into the latest (catchup latest)'
                          WHEN 'misfire' THEN 'were beyond misfire_grace (too many for a skipped run each)'
                          WHEN 'pause' THEN 'fell in a pause'
                          WHEN 'disabled' THEN 'fell while it was disabled'
                          WHEN 'calendar' THEN format('fell in a period of calendar %s', a.metadata->>'calendar')
                          ELSE 'did not run' END,
                      dispatch._instant(a.at)) AS detail
        FROM dispatch.audit_log a
        WHERE a.project_id = s.project_id AND a.at >= explain.since - interval '1 hour'
          AND a.action = 'schedule.slots.skipped' AND a.metadata->>'scheduleId' = s.id::text
          AND (a.metadata->>'last')::timestamptz >= explain.since
      UNION ALL
        SELECT CASE WHEN r.error LIKE 'missed by %' THEN 'misfire'
                    WHEN r.error LIKE 'cannot compute %' THEN 'back-off'
                    WHEN r.error LIKE 'schedule % before the run was claimed' THEN 'stopped'
                    ELSE 'skipped' END,
               r.scheduled_for, r.id, 1,
               format('%s run %s skipped: %s', r.kind, r.id, coalesce(r.error, 'no reason recorded'))
        FROM dispatch.runs r
        WHERE r.schedule_id = s.id AND r.status = 'skipped' AND r.scheduled_for >= explain.since
      UNION ALL
        SELECT CASE stopped WHEN 'paused' THEN 'pause' ELSE 'disabled' END, gap_first, NULL, gap_slots,
               format('%s%s slot%s from %s to %s so far, while it is %s (recorded as one gap when it goes on again)',
                      CASE WHEN gap_at_least THEN 'at least ' ELSE '' END, gap_slots,
                      CASE WHEN gap_slots = 1 THEN '' ELSE 's' END,
                      dispatch._instant(gap_first), dispatch._instant(gap_last), stopped)
        WHERE gap_first IS NOT NULL
    ), total AS (
        SELECT coalesce(sum(n.slots), 0) AS slots, count(*) AS rows,
               (SELECT string_agg(format('%s %s', x.slots, x.item), ', ' ORDER BY x.slots DESC, x.item)
                FROM (SELECT m.item, sum(m.slots) AS slots FROM n m GROUP BY m.item) x) AS by_reason
        FROM n
    )
    SELECT x.section, x.item, x.at, x.run_id, x.detail
    FROM (SELECT 0 AS part, 'not run' AS section, 'summary' AS item, explain.since AS at, NULL::bigint AS run_id,
                 CASE WHEN t.slots = 0 THEN format('since %s every slot ran', dispatch._instant(explain.since))
                      ELSE format('since %s, %s slot%s did not run: %s%s', dispatch._instant(explain.since), t.slots,
                                  CASE WHEN t.slots = 1 THEN '' ELSE 's' END, t.by_reason,
                                  CASE WHEN t.rows > 100 THEN format(' (the latest 100 of %s rows follow)', t.rows)
                                       ELSE '' END)
                 END AS detail
          FROM total t
          UNION ALL
          SELECT 1, 'not run', l.item, l.at, l.run_id, l.detail
          FROM (SELECT * FROM n ORDER BY n.at DESC LIMIT 100) l) x
    ORDER BY x.part, x.at, x.run_id NULLS FIRST;
END
$$;


--
-- Name: FUNCTION explain(schedule_id uuid, since timestamp with time zone); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.explain(schedule_id uuid, since timestamp with time zone) IS 'Why a schedule does (or did not) fire, as rows (section, item, at, run_id, detail) a DBA reads at a psql prompt; item is a word to match, detail says it in plain words, at is the instant the row is about. Sections: state (one row, the verdict: live, due, missed, settling, busy, pending, jitter_wait, retry_wait, late, breaker (held by its function''s open circuit breaker), capped (due, but its project''s max_concurrency leaves the next claim no room for it, or an open transaction holds the project''s row), buffered, backed_off, ended (a one-shot or bounded schedule past its last slot, and why), excluded (its slot falls in a period of its calendar: which calendar and period, and the next slot that runs), paused, disabled, deleted; who paused or disabled it, when and why; the open run and its last outcome), open run (each pending or running run and what the next claim does with it), next (the next three slots that run, each with the instant its jitter fires it at; an excluded row for each period of its calendar they pass over; an end row where a bounded rule has no more), run (the last five finished runs, the latest slot first, with their outcomes), not run (a summary, then each slot since "since" that did not run: recorded gaps by reason (overlap, catch-up, misfire, pause, disabled, calendar), skipped runs (misfire, back-off, stopped), and the slots a paused or disabled schedule has passed over so far). P0002 for an unknown id. Read-only; granted to dispatch_reader.';


--
-- Name: finish_event_deliveries(text, bigint[], integer[], text[]); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.finish_event_deliveries(worker text, delivery_ids bigint[], attempts integer[], errors text[]) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    recorded integer;
BEGIN
    -- An outcome counts for the attempt it was claimed with: a late one from an attempt whose
    -- lease passed changes nothing. A failure waits its back-off (doubled each time, at most an
    -- hour, less up to a quarter at random) or, after the last attempt, is given up.
    UPDATE dispatch.event_deliveries d
    SET delivered_at = CASE WHEN o.error IS NULL THEN now() END,
        gave_up_at = CASE WHEN o.error IS NOT NULL AND d.attempts >= st.event_max_attempts THEN now() END,
        last_error = left(o.error, 500),
        next_attempt_at = CASE WHEN o.error IS NULL OR d.attempts >= st.event_max_attempts THEN d.next_attempt_at
                               ELSE now() + least(st.event_retry_backoff * power(2, d.attempts - 1), interval '1 hour')
                                            * (1 - random() / 4) END
    FROM unnest(finish_event_deliveries.delivery_ids, finish_event_deliveries.attempts,
                finish_event_deliveries.errors) AS o(id, attempt, error)
    CROSS JOIN dispatch.settings st
    WHERE d.id = o.id AND d.attempts = o.attempt AND d.delivered_at IS NULL AND d.gave_up_at IS NULL;
    GET DIAGNOSTICS recorded = ROW_COUNT;
    RETURN recorded;
END
$$;


--
-- Name: FUNCTION finish_event_deliveries(worker text, delivery_ids bigint[], attempts integer[], errors text[]); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.finish_event_deliveries(worker text, delivery_ids bigint[], attempts integer[], errors text[]) IS 'For listeners: the outcome of each claimed event delivery (error NULL: delivered), for the attempt it was claimed with; a failure is retried after dispatch.settings.event_retry_backoff, doubled each time, or given up after event_max_attempts. Returns how many it recorded.';


--
-- Name: jitter_offset(uuid, timestamp with time zone, interval); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.jitter_offset(schedule_id uuid, slot timestamp with time zone, jitter interval) RETURNS interval
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE
        WHEN schedule_id IS NULL OR slot IS NULL OR jitter IS NULL THEN NULL
        WHEN CAST(pg_catalog.extract('epoch', jitter) OPERATOR(pg_catalog.*) 1000000 AS bigint) OPERATOR(pg_catalog.<=) 0
        THEN CAST('0' AS pg_catalog.interval)
        ELSE pg_catalog.mod(
                 pg_catalog.mod(
                     pg_catalog.hashtextextended(
                         CAST(schedule_id AS text) OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||)
                         CASE WHEN pg_catalog.isfinite(slot)
                              THEN CAST(pg_catalog.extract('epoch', slot OPERATOR(pg_catalog.-)
                                                           CAST('1970-01-01 00:00:00+00' AS pg_catalog.timestamptz)) AS text)
                              WHEN slot OPERATOR(pg_catalog.>) CAST('1970-01-01 00:00:00+00' AS pg_catalog.timestamptz)
                              THEN 'Infinity'
                              ELSE '-Infinity' END,
                         0),
                     CAST(pg_catalog.extract('epoch', jitter) OPERATOR(pg_catalog.*) 1000000 AS bigint))
                 OPERATOR(pg_catalog.+) CAST(pg_catalog.extract('epoch', jitter) OPERATOR(pg_catalog.*) 1000000 AS bigint),
                 CAST(pg_catalog.extract('epoch', jitter) OPERATOR(pg_catalog.*) 1000000 AS bigint))
             OPERATOR(pg_catalog.*) CAST('1 microsecond' AS pg_catalog.interval)
    END
$$;


--
-- Name: FUNCTION jitter_offset(schedule_id uuid, slot timestamp with time zone, jitter interval); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.jitter_offset(schedule_id uuid, slot timestamp with time zone, jitter interval) IS 'How long after its slot a schedule with this jitter fires: an offset in [0, jitter) fixed by a hash of the schedule id and the slot, so that schedules sharing a slot spread out, the same way on every tick. 0 when jitter is 0.';


--
-- Name: lost_runs_after(bigint); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.lost_runs_after(after_id bigint) RETURNS TABLE(lost bigint, last_id bigint)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT CASE WHEN after_id IS NULL THEN 0 ELSE count(*) FILTER (WHERE a.id > after_id) END,
           coalesce(max(a.id), after_id, 0)
    FROM dispatch.audit_log a
    WHERE a.action = 'schedule.run.lost' AND a.id > coalesce(after_id, 0)
$$;


--
-- Name: FUNCTION lost_runs_after(after_id bigint); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.lost_runs_after(after_id bigint) IS 'How many runs ended lost (audit action schedule.run.lost) after audit row after_id, and the id to pass next time; with NULL, 0 and where to start. What listeners export as pgdispatch_runs_lost_total.';


--
-- Name: next_due_after(timestamp with time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.next_due_after(covered timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    -- least() ignores NULLs
    RETURN least(dispatch.next_slot_after(next_due_after.covered), dispatch.next_start_after(next_due_after.covered));
END
$$;


--
-- Name: FUNCTION next_due_after(covered timestamp with time zone); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.next_due_after(covered timestamp with time zone) IS 'The earlier of dispatch.next_slot_after and dispatch.next_start_after for "covered" (the instant a caller''s last dispatch.tick() marked up to: its now()): the earliest next_run_at of a live schedule, or not_before of a waiting run, after it. In the past when a slot came due since: tick at once.';


--
-- Name: next_due_at(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.next_due_at() RETURNS timestamp with time zone
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$ SELECT dispatch.next_due_after(now()) $$;


--
-- Name: FUNCTION next_due_at(); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.next_due_at() IS 'The earliest future next_run_at of a live schedule or retry: when a listener should next call dispatch.tick().';


--
-- Name: next_event_delivery_at(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.next_event_delivery_at() RETURNS timestamp with time zone
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT d.next_attempt_at FROM dispatch.event_deliveries d
    WHERE d.delivered_at IS NULL AND d.gave_up_at IS NULL
    ORDER BY d.next_attempt_at LIMIT 1
$$;


--
-- Name: FUNCTION next_event_delivery_at(); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.next_event_delivery_at() IS 'For listeners: when the next event delivery is due (NULL: none waits).';


--
-- Name: next_slot_after(timestamp with time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.next_slot_after(covered timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN (SELECT min(s.next_run_at) FROM dispatch.schedules s WHERE s.next_run_at > next_slot_after.covered);
END
$$;


--
-- Name: FUNCTION next_slot_after(covered timestamp with time zone); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.next_slot_after(covered timestamp with time zone) IS 'The earliest next_run_at of a live schedule after "covered" (the now() of the caller''s last dispatch.tick()): when to tick next. In the past when a slot came due since. Schedules whose run is still open stay at their slot, at or before "covered", and are not answered again.';


--
-- Name: next_start_after(timestamp with time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.next_start_after(after timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_sort TO 'off'
    AS $$
BEGIN
    RETURN (SELECT r.not_before FROM dispatch.runs r
            WHERE r.status = 'pending' AND r.not_before > next_start_after.after AND r.not_before < 'infinity'
            ORDER BY r.not_before
            LIMIT 1);
END
$$;


--
-- Name: FUNCTION next_start_after(after timestamp with time zone); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.next_start_after(after timestamp with time zone) IS 'The earliest instant after "after" at which a pending run that waits may start (not_before: a jittered slot''s fire_at, a retry''s back-off): when to claim next. Backfill runs waiting their turn (not_before infinity) are left out.';


--
-- Name: once_spec(timestamp with time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.once_spec(run_at timestamp with time zone) RETURNS dispatch.cron_spec
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$ SELECT dispatch.bounded_spec(dispatch.every_spec(interval '366 days', run_at), run_at, run_at, NULL) $$;


--
-- Name: FUNCTION once_spec(run_at timestamp with time zone); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.once_spec(run_at timestamp with time zone) IS 'The slot rule of a one-shot schedule: its one slot is run_at.';


--
-- Name: pause(uuid, text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.pause(schedule_id uuid, reason text DEFAULT NULL::text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    s dispatch.schedules := dispatch._operable_schedule(pause.schedule_id, 'pause');
BEGIN
    IF length(pause.reason) > 500 THEN
        RAISE EXCEPTION 'reason is % characters; at most 500 are allowed', length(pause.reason)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF s.paused_at IS NOT NULL THEN
        RAISE NOTICE 'schedule % is already paused (since % by %)', s.id, s.paused_at, s.paused_by;
        RETURN;
    END IF;
    UPDATE dispatch.schedules
    SET paused_at = now(), paused_by = session_user, paused_reason = pause.reason
    WHERE id = s.id;
END
$$;


--
-- Name: FUNCTION pause(schedule_id uuid, reason text); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.pause(schedule_id uuid, reason text) IS 'Pause a schedule: it keeps its definition, has no next_run_at and invokes nothing until dispatch.resume(); its pending runs end skipped. Records paused_at, paused_by (session_user) and the reason; audited as schedule.pause. A schedule already paused is left as it is.';


--
-- Name: prune(bigint, bigint); Type: PROCEDURE; Schema: dispatch; Owner: -
--

CREATE PROCEDURE dispatch.prune(INOUT runs_deleted bigint DEFAULT 0, INOUT audit_deleted bigint DEFAULT 0)
    LANGUAGE plpgsql
    AS $$
DECLARE
    page record;
    after_id bigint := 0;
    up_to bigint;
BEGIN
    LOOP
        SELECT * INTO page FROM dispatch._prune_runs(after_id, up_to);
        runs_deleted := runs_deleted OPERATOR(pg_catalog.+) page.deleted;
        COMMIT;
        EXIT WHEN page.last_id IS NULL;
        after_id := page.last_id;
        up_to := page.up_to;
    END LOOP;
    after_id := 0;
    up_to := NULL;
    LOOP
        SELECT * INTO page FROM dispatch._prune_audit(after_id, up_to);
        audit_deleted := audit_deleted OPERATOR(pg_catalog.+) page.deleted;
        COMMIT;
        EXIT WHEN page.last_id IS NULL;
        after_id := page.last_id;
        up_to := page.up_to;
    END LOOP;
    PERFORM dispatch._prune_event_deliveries();
    COMMIT;
END
$$;


--
-- Name: PROCEDURE prune(INOUT runs_deleted bigint, INOUT audit_deleted bigint); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON PROCEDURE dispatch.prune(INOUT runs_deleted bigint, INOUT audit_deleted bigint) IS 'Delete finished runs and audit rows older than dispatch.settings'' retention (and event deliveries done before the audit retention), one page of prune_batch_size rows (in id order) per transaction; pending and running runs are kept. Run every 10 minutes by the pg_cron job dispatch-prune. Returns how many rows it deleted.';


--
-- Name: refresh_timezones(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.refresh_timezones() RETURNS integer
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    WITH fresh AS (
        INSERT INTO dispatch.timezones (name)
        SELECT dispatch._timezone_names()
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT count(*)::integer FROM fresh
$$;


--
-- Name: FUNCTION refresh_timezones(); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.refresh_timezones() IS 'Copy new names from pg_timezone_names (less localtime, posixrules, Factory and posix/ copies) into dispatch.timezones; returns how many were added.';


--
-- Name: register_cron_job(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.register_cron_job() RETURNS text
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
    -- pg_settings, not current_setting(): a role without pg_read_all_settings sees no row there
    -- rather than an error; it still sees in which database pg_cron's scheduler runs.
    cron_db text := coalesce((SELECT s.setting FROM pg_catalog.pg_settings s WHERE s.name = 'cron.database_name'),
                             (SELECT a.datname FROM pg_catalog.pg_stat_activity a
                              WHERE a.application_name = 'pg_cron scheduler' LIMIT 1));
    cron_host text := coalesce((SELECT h.setting FROM pg_catalog.pg_settings h WHERE h.name = 'cron.host'), 'localhost');
    msg text;
    problem text;
    cron_here boolean;
    elsewhere text;
BEGIN
    IF cron_db = current_database()
       AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron')
       AND (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        CREATE EXTENSION pg_cron;
    END IF;

    cron_here := EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron');
    IF cron_here THEN
        -- pg_cron names a job once per role, and cron.schedule keeps the database of a job of the
        -- same name: jobs of this role that run in another database (sql/pg_cron.sql) stay there.
        EXECUTE $sql$SELECT string_agg(DISTINCT database, ', ') FROM cron.job
                     WHERE jobname IN ('dispatch-tick', 'dispatch-prune') AND username = current_user
                       AND database <> current_database()$sql$ INTO elsewhere;
    END IF;
    IF elsewhere IS NOT NULL THEN
        msg := format('pg_cron jobs dispatch-tick and dispatch-prune NOT registered in database %s: role %s '
                      'already runs jobs of these names in database %s, and pg_cron names a job once per role. '
                      'To move them here, first SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname IN '
                      '(''dispatch-tick'', ''dispatch-prune'') AND username = current_user, then install again; '
                      'to tick both databases, install as another role', current_database(), current_user, elsewhere);
        RAISE WARNING '%', msg;
    ELSIF cron_here THEN
        -- cron.schedule updates a job of the same name, so this is idempotent.
        EXECUTE $sql$SELECT cron.schedule('dispatch-tick', '* * * * *', 'SELECT dispatch.tick()')$sql$;
        EXECUTE $sql$SELECT cron.schedule('dispatch-prune', '7,17,27,37,47,57 * * * *', 'CALL dispatch.prune()')$sql$;
        msg := format('pg_cron jobs dispatch-tick (SELECT dispatch.tick() every minute) and dispatch-prune '
                      '(CALL dispatch.prune() every 10 minutes) registered in database %s', current_database());
        -- A job keeps the host it was scheduled with; cron.schedule does not update it. After a
        -- fix of cron.host, running the install again moves the jobs to it.
        BEGIN
            EXECUTE $sql$UPDATE cron.job SET nodename = $1, nodeport = $2
                         WHERE jobname IN ('dispatch-tick', 'dispatch-prune') AND username = current_user
                           AND (nodename, nodeport) IS DISTINCT FROM ($1, $2)$sql$
                USING cron_host, current_setting('port')::integer;
        EXCEPTION WHEN insufficient_privilege THEN
            msg := msg || format(' (as %s it could not move them to cron.host %s: a superuser may run the install '
                                 'again to do so)', current_user, cron_host);
        END;
        problem := dispatch.cron_login_problem(current_database(), current_user,
                                               (SELECT j.nodename FROM cron.job j WHERE j.jobname = 'dispatch-tick'
                                                  AND j.username = current_user));
    ELSIF cron_db = current_database() THEN
        msg := format('pg_cron is loaded for this database (%s) but the extension is not created: '
                      'as a superuser run CREATE EXTENSION pg_cron, then install again', cron_db);
    ELSIF cron_db IS NOT NULL THEN
        msg := format('pg_cron lives in database %s: register the jobs there with '
                      'psql -d %s -v dispatch_db=%s -f sql/pg_cron.sql', cron_db, cron_db, current_database());
        problem := dispatch.cron_login_problem(current_database(), current_user);
    ELSE
        msg := format('pg_cron is not loaded (shared_preload_libraries): nothing calls dispatch.tick() every '
                      'minute nor prunes old runs. Listeners still tick on their own timers; to add the safety '
                      'net install pg_cron (on Debian and Ubuntu: postgresql-%s-cron), add pg_cron to '
                      'shared_preload_libraries, restart, and install again (or CALL dispatch.prune() from '
                      'another scheduler).', current_setting('server_version_num')::integer / 10000);
    END IF;
    IF problem LIKE 'cannot tell%' THEN
        msg := msg || '. Note: ' || problem;  -- not a problem found, one this role cannot rule out
    ELSIF problem IS NOT NULL THEN
        msg := msg || '. BUT ' || problem;
        RAISE WARNING '%', problem;
    END IF;
    RAISE NOTICE '%', msg;
    RETURN msg;
END
$_$;


--
-- Name: FUNCTION register_cron_job(); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.register_cron_job() IS 'Register (or update) the pg_cron jobs dispatch-tick and dispatch-prune when pg_cron is installed in this database, moving existing ones to the current cron.host; otherwise say what to do. When jobs of these names of the current role run in another database (pg_cron names a job once per role), registers nothing and says so (WARNING). Says (WARNING) what stands in the way when pg_cron cannot log in to run them (dispatch.cron_login_problem). Returns what it did.';


--
-- Name: release_runs(text, bigint[], integer[]); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.release_runs(worker text, run_ids bigint[], attempts integer[]) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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


--
-- Name: FUNCTION release_runs(worker text, run_ids bigint[], attempts integer[]); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.release_runs(worker text, run_ids bigint[], attempts integer[]) IS 'Hand runs that were claimed but never invoked back to pending (counted in released: the claim uses up no attempt of max_attempts, and the next claim gets a higher attempt, a fencing token no earlier claim had); only runs still running with the attempt given (worker is informational). A run whose schedule has stopped ends skipped instead. Returns how many were handed back. Used by a listener that shuts down.';


--
-- Name: reset_breaker(text, text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.reset_breaker(project_id text, function_name text) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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


--
-- Name: FUNCTION reset_breaker(project_id text, function_name text); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.reset_breaker(project_id text, function_name text) IS 'Close the circuit breaker of a function (project_id, function_name) and clear its count of failures: its waiting runs go at once. Audited as breaker.close (reason reset) when it was open, else breaker.reset, with the actor (session_user). Returns the state it was in (open or closed); P0002 when the function has no breaker. It holds the breaker''s row until the transaction ends, and completions of that function wait for it: run it on its own.';


--
-- Name: resume(uuid); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.resume(schedule_id uuid) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    s dispatch.schedules := dispatch._operable_schedule(resume.schedule_id, 'resume');
BEGIN
    IF s.paused_at IS NULL THEN
        RAISE NOTICE 'schedule % is not paused', s.id;
        RETURN;
    END IF;
    UPDATE dispatch.schedules
    SET paused_at = NULL, paused_by = NULL, paused_reason = NULL
    WHERE id = s.id;
END
$$;


--
-- Name: FUNCTION resume(schedule_id uuid); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.resume(schedule_id uuid) IS 'Resume a paused schedule from the first slot after now (the slots of the pause are not caught up); audited as schedule.resume. A schedule that is not paused is left as it is.';


--
-- Name: run_now(uuid, text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.run_now(schedule_id uuid, traceparent text DEFAULT NULL::text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    s dispatch.schedules := dispatch._operable_schedule(run_now.schedule_id, 'run now');
    open_run dispatch.runs;
    run dispatch.runs;
BEGIN
    -- it decides from the runs it sees once it holds the schedule (the tick's marking may have
    -- committed a run just before)
    PERFORM dispatch._require_read_committed('dispatch.run_now');
    PERFORM dispatch._check_traceparent(run_now.traceparent, 'traceparent');
    -- A stopped schedule's runs are ended at the claim, never invoked: refuse rather than
    -- hand back a run id that can only end skipped.
    IF s.paused_at IS NOT NULL THEN
        RAISE EXCEPTION 'cannot run now: schedule % is paused (since % by %)', s.id, s.paused_at, s.paused_by
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'dispatch.resume() it first.';
    END IF;
    IF NOT s.enabled THEN
        RAISE EXCEPTION 'cannot run now: schedule % is disabled', s.id
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Enable it first.';
    END IF;
    SELECT * INTO open_run FROM dispatch.runs r
    WHERE r.schedule_id = s.id AND r.status IN ('pending', 'running')
      AND NOT dispatch._waits_its_turn(r)
    ORDER BY r.id LIMIT 1;
    IF s.overlap = 'skip' AND open_run.id IS NOT NULL THEN
        RAISE EXCEPTION 'cannot run now: schedule % has run % open (%, slot %) and its overlap is skip',
                        s.id, open_run.id, open_run.status, open_run.scheduled_for
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Wait for that run to finish, or set overlap to buffer_one or allow.';
    END IF;
    -- buffer_one keeps one run in flight: the manual run waits behind the open one, in the
    -- place of the slot that would have.
    IF s.overlap = 'buffer_one' AND open_run.id IS NOT NULL
       AND EXISTS (SELECT 1 FROM dispatch.runs r
                   WHERE r.schedule_id = s.id AND r.status = 'pending' AND r.not_before = 'infinity'
                     AND r.kind <> 'backfill') THEN
        RAISE EXCEPTION 'cannot run now: schedule % has run % open and a run waiting behind it (overlap buffer_one)',
                        s.id, open_run.id
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Wait for the open run to finish, or set overlap to allow.';
    END IF;

    -- Due at the instant of the call, with its own request id; the schedule's slots stay as
    -- they are (dispatch._advance_schedules leaves them to scheduled runs).
    INSERT INTO dispatch.runs AS r (schedule_id, project_id, scheduled_for, fire_at, kind, not_before, traceparent)
    SELECT s.id, s.project_id, due.at, due.at, 'manual',
           CASE WHEN s.overlap = 'buffer_one' AND open_run.id IS NOT NULL THEN timestamptz 'infinity' END,
           run_now.traceparent
    FROM (SELECT clock_timestamp() AS at) due  -- one instant: a later fire_at would read as jitter
    RETURNING r.* INTO run;
    INSERT INTO dispatch.audit_log (actor_id, project_id, action, metadata)
    VALUES (session_user, s.project_id, 'schedule.run_now', jsonb_build_object(
        'scheduleId', s.id, 'functionName', s.function_name, 'runId', run.id, 'requestId', run.request_id));
    PERFORM pg_notify('dispatch', json_build_object('marked', 1)::text);
    RETURN run.id;
END
$$;


--
-- Name: FUNCTION run_now(schedule_id uuid, traceparent text); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.run_now(schedule_id uuid, traceparent text) IS 'Invoke a schedule''s function now, outside its slots: inserts a pending run of kind manual, due at the instant of the call, with its own request_id, and NOTIFYs the listeners (dispatched within a second). next_run_at does not move; a slot that comes due while the manual run is open waits for it (overlap skip) and is marked as soon as it ends. Under overlap buffer_one with a run open, it waits behind that run (refused if a run already waits there). Refused (55000) for a deleted, paused or disabled schedule, and while a run is open under overlap skip; P0002 for an unknown id. Audited as schedule.run_now with the actor (session_user). Returns the run id. traceparent: a W3C traceparent the run''s invocations continue (22023 when it is not one).';


--
-- Name: run_trace(bigint); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.run_trace(run_id bigint) RETURNS TABLE(attempt integer, trace_id text, span_id text, parent_span_id text, traceparent text)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT a, substr(t.tp, 4, 32), substr(t.tp, 37, 16), substr(r.traceparent, 37, 16), t.tp
    FROM dispatch.runs r
    CROSS JOIN generate_series(1, r.attempt) a
    CROSS JOIN LATERAL (SELECT dispatch.traceparent(r.request_id, a, r.traceparent) AS tp) t
    WHERE r.id = run_trace.run_id
    ORDER BY a
$$;


--
-- Name: FUNCTION run_trace(run_id bigint); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.run_trace(run_id bigint) IS 'The trace of a run: one row per attempt that was claimed (attempt is the fencing token), with its trace id (the same for all), its span id, the span it is a child of (when the run continues a given traceparent) and the traceparent header it was sent with. Read-only; granted to dispatch_reader.';


--
-- Name: schema_version(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.schema_version() RETURNS integer
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$ SELECT max(version) FROM dispatch.migrations $$;


--
-- Name: FUNCTION schema_version(); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.schema_version() IS 'The highest migration applied to this database (dispatch.migrations): listeners refuse to start on a schema older than they need.';


--
-- Name: skipped_slots_after(bigint); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.skipped_slots_after(after_id bigint) RETURNS TABLE(reason text, slots bigint, gaps bigint, last_id bigint)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    WITH since AS (
        SELECT a.id, a.metadata
        FROM dispatch.audit_log a
        WHERE a.action = 'schedule.slots.skipped' AND a.id > coalesce(after_id, 0)
    ), last AS (
        SELECT coalesce(max(s.id), after_id, 0) AS id FROM since s
    )
    SELECT r.reason, coalesce(sum((s.metadata->>'count')::bigint), 0), count(s.id), (SELECT l.id FROM last l)
    FROM unnest(ARRAY['overlap', 'catch-up', 'misfire', 'pause', 'disabled', 'calendar']) AS r(reason)
    LEFT JOIN since s ON s.metadata->>'reason' = r.reason AND after_id IS NOT NULL
    GROUP BY r.reason
$$;


--
-- Name: FUNCTION skipped_slots_after(after_id bigint); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.skipped_slots_after(after_id bigint) IS 'The slots in gaps recorded (audit action schedule.slots.skipped) after audit row after_id, by reason (overlap, catch-up, misfire, pause, disabled, calendar): how many slots, how many gaps, and the id to pass next time; with NULL, zeros and where to start. What listeners export as pgdispatch_slots_skipped_total{reason}.';


--
-- Name: tick(timestamp with time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.tick(now timestamp with time zone DEFAULT now()) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    owner boolean;
BEGIN
    IF tick.now IS NULL OR NOT isfinite(tick.now) THEN
        RAISE EXCEPTION 'now must be a finite instant, not %', coalesce(tick.now::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Call dispatch.tick() without an argument: it marks what is due now.';
    END IF;
    -- Marking ahead of the clock fires schedules early: for tests and backfills by an
    -- administrator, never for a listener (invariant 5). A slot marked ahead is a finished slot
    -- that the schedule never goes back to (invariant 2), so each slot up to the horizon is
    -- gone: an administrator may reach an hour ahead, only the schema's owner (tests) further.
    IF tick.now > clock_timestamp() THEN
        owner := pg_has_role(session_user, (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'dispatch'),
                             'MEMBER');
        IF NOT owner AND NOT pg_has_role(session_user, 'dispatch_admin', 'MEMBER') THEN
            RAISE EXCEPTION 'dispatch.tick(%) marks ahead of the database''s clock, which only dispatch_admin may do', tick.now
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'Call dispatch.tick() without an argument: it marks what is due now.';
        ELSIF NOT owner AND tick.now > clock_timestamp() + interval '1 hour' THEN
            RAISE EXCEPTION 'dispatch.tick(%) marks more than an hour ahead of the database''s clock', tick.now
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = 'Each schedule would run its latest slot up to then now, and none before it again: a schedule marked a year ahead stops for a year.',
                      HINT = 'dispatch.run_now() runs a schedule now; dispatch.backfill() runs past slots.';
        END IF;
    END IF;
    RETURN (dispatch._mark_due(tick.now, NULL)).marked;
END
$$;


--
-- Name: FUNCTION tick(now timestamp with time zone); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.tick(now timestamp with time zone) IS 'Expire leases by the real clock, then mark every live schedule due at or before "now" as a pending run (idempotent per slot), following its run policies: slots missed beyond misfire_grace end skipped, catchup latest or all, overlap skip, buffer_one or allow. Also moves a schedule found on a finished slot past it and records a skipped run for each back-off instant reached. NOTIFY dispatch when there is work. Returns how many runs it marked. Never waits on a row another transaction holds. A "now" ahead of the clock needs dispatch_admin, and at most an hour ahead (the schema owner any); a non-finite one is refused (22023). Run every minute by the pg_cron job dispatch-tick and by listeners when a slot comes due.';


--
-- Name: tick_chunk(integer); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.tick_chunk(max_runs integer, OUT marked integer, OUT taken integer) RETURNS record
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF max_runs IS NULL OR max_runs < 1 THEN
        RAISE EXCEPTION 'dispatch.tick_chunk(%): max_runs must be 1 or more', max_runs
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT m.marked, m.taken INTO marked, taken FROM dispatch._mark_due(now(), max_runs) m;
END
$$;


--
-- Name: FUNCTION tick_chunk(max_runs integer, OUT marked integer, OUT taken integer); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.tick_chunk(max_runs integer, OUT marked integer, OUT taken integer) IS 'Mark at most max_runs due slots now, of the schedules no run policy has to decide (on time, no run open, overlap skip or buffer_one), and NOTIFY dispatch when it marked any. Returns how many runs it marked and how many due schedules it took: taken = max_runs means more may be due; fewer, that every other due schedule is held by another tick or left to dispatch.tick() (a tick that committed while this one ran can have marked some of those it took: marked < taken). Listeners call it with growing sizes when a slot comes due, so that 100,000 schedules due at one instant are claimed from the first chunk on rather than after one long statement; then dispatch.tick() for the rest (policies, lease expiry). Never waits on a row another transaction holds.';


--
-- Name: traceparent(text, integer, text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.traceparent(request_id text, attempt integer, parent text DEFAULT NULL::text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
    SELECT '00-'
           || coalesce(substr(parent, 4, 32),
                       CASE WHEN request_id ~ '^sched_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                            THEN replace(substr(request_id, 7), '-', '')
                            ELSE left(encode(sha256(convert_to(request_id, 'UTF8')), 'hex'), 32) END)
           || '-' || left(encode(sha256(convert_to(request_id || '/' || attempt, 'UTF8')), 'hex'), 16)
           || '-' || coalesce(right(parent, 2), '01')
$_$;


--
-- Name: FUNCTION traceparent(request_id text, attempt integer, parent text); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.traceparent(request_id text, attempt integer, parent text) IS 'The W3C traceparent header of attempt `attempt` of the run with this request id: trace id the request id''s UUID (or parent''s trace id), span id the first 16 hex digits of sha256(''<request id>/<attempt>''), flags parent''s or 01 (sampled).';


--
-- Name: audit_log; Type: TABLE; Schema: dispatch; Owner: -
--

CREATE TABLE dispatch.audit_log (
    id bigint NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    actor_id text,
    project_id text,
    action text NOT NULL,
    ip_hash text,
    user_agent text,
    metadata jsonb DEFAULT '{}'::jsonb NOT NULL
)
WITH (vacuum_truncate='false');


--
-- Name: TABLE audit_log; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON TABLE dispatch.audit_log IS 'One row per schedule change (schedule.create/update/delete) and per finished run (schedule.run.ok/error/skipped/lost).';


--
-- Name: COLUMN audit_log.actor_id; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.audit_log.actor_id IS 'The login (session_user) that changed a schedule; NULL for runs (no user session).';


--
-- Name: COLUMN audit_log.metadata; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.audit_log.metadata IS 'For runs: scheduleId, requestId, functionName, runId, scheduledFor, attempt, and error when there is one.';


--
-- Name: audit_log_id_seq; Type: SEQUENCE; Schema: dispatch; Owner: -
--

ALTER TABLE dispatch.audit_log ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME dispatch.audit_log_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: calendar_exclusions; Type: TABLE; Schema: dispatch; Owner: -
--

CREATE TABLE dispatch.calendar_exclusions (
    id bigint NOT NULL,
    calendar_id bigint NOT NULL,
    label text,
    starts timestamp without time zone,
    ends timestamp without time zone,
    days smallint[],
    from_time time without time zone,
    until_time time without time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT calendar_exclusions_days_check CHECK ((((cardinality(days) >= 1) AND (cardinality(days) <= 7)) AND (days <@ '{1,2,3,4,5,6,7}'::smallint[]) AND (array_position(days, NULL::smallint) IS NULL))),
    CONSTRAINT calendar_exclusions_ends_check CHECK (((ends > starts) AND isfinite(starts) AND isfinite(ends))),
    CONSTRAINT calendar_exclusions_label_check CHECK ((length(label) <= 200)),
    CONSTRAINT calendar_exclusions_shape_check CHECK ((((starts IS NOT NULL) AND (ends IS NOT NULL) AND (days IS NULL) AND (from_time IS NULL) AND (until_time IS NULL)) OR ((starts IS NULL) AND (ends IS NULL) AND (days IS NOT NULL) AND (from_time IS NOT NULL) AND (until_time IS NOT NULL)))),
    CONSTRAINT calendar_exclusions_until_time_check CHECK ((until_time > from_time))
);


--
-- Name: TABLE calendar_exclusions; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON TABLE dispatch.calendar_exclusions IS 'The periods of a calendar, in its zone''s wall-clock time: either one period [starts, ends), or every week on days (ISO: 1 Monday to 7 Sunday) from from_time until until_time (24:00 for the end of the day). A boundary that daylight saving time skips or repeats is placed by the fixed-time rule of cron expressions.';


--
-- Name: COLUMN calendar_exclusions.starts; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.calendar_exclusions.starts IS 'A period''s first excluded wall-clock time (a date alone: its midnight).';


--
-- Name: COLUMN calendar_exclusions.ends; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.calendar_exclusions.ends IS 'The wall-clock time the period ends at, not excluded itself (a whole day D: D + 1 at midnight).';


--
-- Name: COLUMN calendar_exclusions.days; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.calendar_exclusions.days IS 'A weekly exclusion''s days, ISO numbers: 1 Monday to 7 Sunday.';


--
-- Name: COLUMN calendar_exclusions.from_time; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.calendar_exclusions.from_time IS 'A weekly exclusion''s first excluded wall-clock time on each of its days (default 00:00).';


--
-- Name: COLUMN calendar_exclusions.until_time; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.calendar_exclusions.until_time IS 'A weekly exclusion''s end on each of its days, not excluded itself (default 24:00, the end of the day).';


--
-- Name: calendar_exclusions_id_seq; Type: SEQUENCE; Schema: dispatch; Owner: -
--

ALTER TABLE dispatch.calendar_exclusions ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME dispatch.calendar_exclusions_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: calendars; Type: TABLE; Schema: dispatch; Owner: -
--

CREATE TABLE dispatch.calendars (
    id bigint NOT NULL,
    project_id text,
    name text NOT NULL,
    timezone text DEFAULT 'UTC'::text NOT NULL,
    description text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT calendars_description_check CHECK ((length(description) <= 1000)),
    CONSTRAINT calendars_name_check CHECK ((name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$'::text))
);


--
-- Name: TABLE calendars; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON TABLE dispatch.calendars IS 'Named exclusion calendars: the periods (dispatch.calendar_exclusions) in which the slots of the schedules that refer to one (schedules.calendar_id) do not run. Written by dispatch_admin.';


--
-- Name: COLUMN calendars.project_id; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.calendars.project_id IS 'The project whose schedules may use it; NULL: shared by every project.';


--
-- Name: COLUMN calendars.name; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.calendars.name IS 'Unique within its project (or among the shared calendars): letters, digits, _ . -';


--
-- Name: COLUMN calendars.timezone; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.calendars.timezone IS 'The zone in which its exclusions'' wall-clock times are read (a name from pg_timezone_names), whatever the schedules'' own zones.';


--
-- Name: calendars_id_seq; Type: SEQUENCE; Schema: dispatch; Owner: -
--

ALTER TABLE dispatch.calendars ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME dispatch.calendars_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: event_deliveries; Type: TABLE; Schema: dispatch; Owner: -
--

CREATE TABLE dispatch.event_deliveries (
    id bigint NOT NULL,
    project_id text NOT NULL,
    url text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    next_attempt_at timestamp with time zone DEFAULT now() NOT NULL,
    worker text,
    delivered_at timestamp with time zone,
    gave_up_at timestamp with time zone,
    last_error text,
    CONSTRAINT event_deliveries_last_error_length_check CHECK ((length(last_error) <= 500))
);


--
-- Name: TABLE event_deliveries; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON TABLE dispatch.event_deliveries IS 'Events waiting to be POSTed to their project''s events_url, and those delivered or given up (until the audit retention passes). A listener claims those whose next_attempt_at has come; a claim moves next_attempt_at past its lease, so an attempt whose listener died is tried again then.';


--
-- Name: event_deliveries_id_seq; Type: SEQUENCE; Schema: dispatch; Owner: -
--

ALTER TABLE dispatch.event_deliveries ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME dispatch.event_deliveries_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: listeners; Type: VIEW; Schema: dispatch; Owner: -
--

CREATE VIEW dispatch.listeners AS
 SELECT a.pid,
    a.application_name,
    NULLIF(substr(a.application_name, (length('pgdispatch '::text) + 1)), ''::text) AS worker,
    a.client_addr,
    a.backend_start,
    a.state,
    a.state_change,
        CASE
            WHEN (a.state <> 'disabled'::text) THEN (a.query ~~ 'LISTEN%'::text)
            ELSE NULL::boolean
        END AS listening
   FROM pg_stat_activity a
  WHERE ((a.datname = current_database()) AND (a.application_name ~~ 'pgdispatch%'::text));


--
-- Name: VIEW listeners; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON VIEW dispatch.listeners IS 'Listener connections to this database, found by application_name ''pgdispatch <worker id>''; listening marks each one''s LISTEN session (its last statement was LISTEN), NULL when this role may not see the session''s statement (another role''s session, without pg_read_all_stats; or track_activities off).';


--
-- Name: migrations; Type: TABLE; Schema: dispatch; Owner: -
--

CREATE TABLE dispatch.migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: TABLE migrations; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON TABLE dispatch.migrations IS 'Applied migrations (sql/migrations/NNNN_name.sql). Each is recorded in the transaction that applies it, first, so that a concurrent or repeated install fails before changing anything.';


--
-- Name: projects; Type: TABLE; Schema: dispatch; Owner: -
--

CREATE TABLE dispatch.projects (
    project_id text NOT NULL,
    max_concurrency integer,
    weight integer DEFAULT 1 NOT NULL,
    events_url text,
    CONSTRAINT projects_events_url_check CHECK (((events_url ~ '^https?://[^[:space:][:cntrl:]]+$'::text) AND (length(events_url) <= 2000))),
    CONSTRAINT projects_max_concurrency_check CHECK ((max_concurrency > 0)),
    CONSTRAINT projects_weight_check CHECK ((weight > 0))
);


--
-- Name: TABLE projects; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON TABLE dispatch.projects IS 'Per-project dispatch settings, optional: a project without a row runs uncapped with weight 1. Written by dispatch_admin.';


--
-- Name: COLUMN projects.project_id; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.projects.project_id IS 'The project (dispatch.schedules.project_id) these settings are for.';


--
-- Name: COLUMN projects.max_concurrency; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.projects.max_concurrency IS 'At most this many of the project''s runs are running at once, across all listeners (dispatch.claim_runs); NULL: no cap.';


--
-- Name: COLUMN projects.weight; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.projects.weight IS 'The project''s share when several projects have due runs: a claim takes about weight runs of it for each run of a weight-1 project.';


--
-- Name: COLUMN projects.events_url; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.projects.events_url IS 'Where the listeners POST each event of the channel dispatch_events about this project (run.failed, schedule.paused, breaker.opened, breaker.closed), signed like an invocation; NULL: none.';


--
-- Name: recent_failures; Type: VIEW; Schema: dispatch; Owner: -
--

CREATE VIEW dispatch.recent_failures AS
 SELECT r.finished_at,
    s.project_id,
    s.function_name,
    r.schedule_id,
    r.id AS run_id,
    r.scheduled_for,
    r.status,
    r.attempt,
    r.http_status,
    r.error,
    r.request_id
   FROM (dispatch.runs r
     JOIN dispatch.schedules s ON ((s.id = r.schedule_id)))
  WHERE ((r.status = ANY (ARRAY['error'::text, 'lost'::text])) AND (r.finished_at > (now() - '24:00:00'::interval)))
  ORDER BY r.finished_at DESC;


--
-- Name: VIEW recent_failures; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON VIEW dispatch.recent_failures IS 'Runs that ended error or lost in the last 24 hours, newest first.';


--
-- Name: runs_id_seq; Type: SEQUENCE; Schema: dispatch; Owner: -
--

ALTER TABLE dispatch.runs ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME dispatch.runs_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: schedule_status; Type: VIEW; Schema: dispatch; Owner: -
--

CREATE VIEW dispatch.schedule_status AS
 SELECT s.id,
    s.project_id,
    s.function_name,
    s.cron_expression,
    s.timezone,
    (s.enabled AND (s.deleted_at IS NULL) AND (s.paused_at IS NULL) AND (s.ended_at IS NULL)) AS live,
    s.next_run_at,
    s.last_run_at,
    s.last_status,
    s.last_error,
    open.status AS current_run_status,
    COALESCE(fails.n, (0)::bigint) AS consecutive_failures,
        CASE
            WHEN (s.next_run_at < now()) THEN (now() - s.next_run_at)
            ELSE NULL::interval
        END AS overdue_by,
    s.paused_at,
    s.paused_by,
    s.paused_reason,
    s.backoff_reason,
    s.max_attempts,
    s.retry_backoff,
    s.retry_backoff_max,
    s.timeout,
    s.misfire_grace,
    s.catchup,
    s.overlap,
    COALESCE(open.runs, (0)::bigint) AS open_runs,
    open.attempt AS current_attempt,
    open.next_retry_at,
    s.every,
    s.anchor,
    s.jitter,
    (s.next_run_at + dispatch.jitter_offset(s.id, s.next_run_at, s.jitter)) AS next_fire_at,
    s.run_at,
    s.starts_at,
    s.ends_at,
    s.max_runs,
    s.ended_at,
    s.ended_reason,
    s.pause_after_failures,
    s.traceparent
   FROM ((dispatch.schedules s
     LEFT JOIN LATERAL ( SELECT count(*) AS runs,
            (array_agg(r.status ORDER BY r.scheduled_for, r.id))[1] AS status,
            (array_agg(r.attempt ORDER BY r.scheduled_for, r.id))[1] AS attempt,
            min(r.not_before) FILTER (WHERE ((r.status = 'pending'::text) AND (r.not_before < 'infinity'::timestamp with time zone))) AS next_retry_at
           FROM dispatch.runs r
          WHERE ((r.schedule_id = s.id) AND (r.status = ANY (ARRAY['pending'::text, 'running'::text])))
         HAVING (count(*) > 0)) open ON (true))
     LEFT JOIN LATERAL ( SELECT count(*) AS n
           FROM dispatch.runs r
          WHERE ((r.schedule_id = s.id) AND (r.status = ANY (ARRAY['error'::text, 'lost'::text])) AND (r.scheduled_for > COALESCE(( SELECT max(ok.scheduled_for) AS max
                   FROM dispatch.runs ok
                  WHERE ((ok.schedule_id = s.id) AND (ok.status = 'ok'::text))), '-infinity'::timestamp with time zone)))) fails ON (true))
  WHERE (s.deleted_at IS NULL);


--
-- Name: VIEW schedule_status; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON VIEW dispatch.schedule_status IS 'One row per schedule that is not deleted: next and last run, the oldest open run''s status and attempts so far (current_run_status, current_attempt; open_runs counts them all), when a failed attempt is retried (next_retry_at), failures since the last ok run, how long it is overdue (next_run_at in the past: due, and late if more than a minute or so), who paused it and why, why it is backing off (its next slot cannot be computed), its run policies, its interval (every, anchor) when it has no cron_expression, its jitter, the instant its next slot fires at (next_fire_at: next_run_at plus the jitter offset), its bounds (run_at for a one-shot; starts_at, ends_at, max_runs), when and why it ended (ended_at, ended_reason: its last slot is past; live is then false), after how many failed runs in a row it pauses itself (pause_after_failures), and the traceparent its runs continue.';


--
-- Name: settings; Type: TABLE; Schema: dispatch; Owner: -
--

CREATE TABLE dispatch.settings (
    singleton boolean DEFAULT true NOT NULL,
    runs_retention interval DEFAULT '14 days'::interval NOT NULL,
    audit_retention interval DEFAULT '90 days'::interval NOT NULL,
    prune_batch_size integer DEFAULT 5000 NOT NULL,
    breaker_threshold integer DEFAULT 5 NOT NULL,
    breaker_window interval DEFAULT '00:05:00'::interval NOT NULL,
    breaker_probe_spacing interval DEFAULT '00:00:01'::interval NOT NULL,
    breaker_probe_spacing_max interval DEFAULT '00:00:10'::interval NOT NULL,
    event_retry_backoff interval DEFAULT '00:00:05'::interval NOT NULL,
    event_max_attempts integer DEFAULT 10 NOT NULL,
    CONSTRAINT settings_audit_retention_check CHECK ((audit_retention >= '01:00:00'::interval)),
    CONSTRAINT settings_breaker_probe_spacing_check CHECK (((breaker_probe_spacing >= '00:00:00.01'::interval) AND (breaker_probe_spacing <= breaker_probe_spacing_max) AND (breaker_probe_spacing_max <= '01:00:00'::interval))),
    CONSTRAINT settings_breaker_threshold_check CHECK (((breaker_threshold >= 0) AND (breaker_threshold <= 10000))),
    CONSTRAINT settings_breaker_window_check CHECK ((breaker_window > '00:00:00'::interval)),
    CONSTRAINT settings_event_max_attempts_check CHECK (((event_max_attempts >= 1) AND (event_max_attempts <= 100))),
    CONSTRAINT settings_event_retry_backoff_check CHECK (((event_retry_backoff >= '00:00:00.01'::interval) AND (event_retry_backoff <= '01:00:00'::interval))),
    CONSTRAINT settings_prune_batch_size_check CHECK (((prune_batch_size >= 100) AND (prune_batch_size <= 1000000))),
    CONSTRAINT settings_runs_retention_check CHECK ((runs_retention >= '01:00:00'::interval)),
    CONSTRAINT settings_singleton_check CHECK (singleton)
);


--
-- Name: TABLE settings; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON TABLE dispatch.settings IS 'One row of settings, changed with one statement, e.g. UPDATE dispatch.settings SET runs_retention = ''30 days''.';


--
-- Name: COLUMN settings.runs_retention; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.settings.runs_retention IS 'Finished runs older than this (by finished_at) are pruned.';


--
-- Name: COLUMN settings.audit_retention; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.settings.audit_retention IS 'Audit rows older than this (by at) are pruned.';


--
-- Name: COLUMN settings.prune_batch_size; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.settings.prune_batch_size IS 'Rows deleted per transaction by dispatch.prune.';


--
-- Name: COLUMN settings.breaker_threshold; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.settings.breaker_threshold IS 'Consecutive retryable failures of one function (project_id, function_name) within breaker_window that open its breaker. 0: breakers never open.';


--
-- Name: COLUMN settings.breaker_window; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.settings.breaker_window IS 'The failures that open a breaker all fall within this long of the first of them; a streak older than this starts again.';


--
-- Name: COLUMN settings.breaker_probe_spacing; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.settings.breaker_probe_spacing IS 'The time between two probes of an open breaker: the first goes this long after it opened; doubled after each probe, up to breaker_probe_spacing_max; each wait less up to a quarter, at random.';


--
-- Name: COLUMN settings.breaker_probe_spacing_max; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.settings.breaker_probe_spacing_max IS 'The most time between two probes of an open breaker, and so how long its waiting runs wait at most after the function answers again.';


--
-- Name: COLUMN settings.event_retry_backoff; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.settings.event_retry_backoff IS 'The wait before an event delivery''s first retry; doubled for each further one, up to an hour.';


--
-- Name: COLUMN settings.event_max_attempts; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.settings.event_max_attempts IS 'Attempts of one event delivery before it is given up (gave_up_at).';


--
-- Name: timezones; Type: TABLE; Schema: dispatch; Owner: -
--

CREATE TABLE dispatch.timezones (
    name text NOT NULL
);


--
-- Name: TABLE timezones; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON TABLE dispatch.timezones IS 'Cache of pg_timezone_names.name, the only zone names schedules accept. Refresh with dispatch.refresh_timezones() after a tzdata upgrade.';


--
-- Name: audit_log audit_log_pkey; Type: CONSTRAINT; Schema: dispatch; Owner: -
--

ALTER TABLE ONLY dispatch.audit_log
    ADD CONSTRAINT audit_log_pkey PRIMARY KEY (id);


--
-- Name: breakers breakers_pkey; Type: CONSTRAINT; Schema: dispatch; Owner: -
--

ALTER TABLE ONLY dispatch.breakers
    ADD CONSTRAINT breakers_pkey PRIMARY KEY (project_id, function_name);


--
-- Name: calendar_exclusions calendar_exclusions_pkey; Type: CONSTRAINT; Schema: dispatch; Owner: -
--

ALTER TABLE ONLY dispatch.calendar_exclusions
    ADD CONSTRAINT calendar_exclusions_pkey PRIMARY KEY (id);


--
-- Name: calendars calendars_pkey; Type: CONSTRAINT; Schema: dispatch; Owner: -
--

ALTER TABLE ONLY dispatch.calendars
    ADD CONSTRAINT calendars_pkey PRIMARY KEY (id);


--
-- Name: calendars calendars_project_name_key; Type: CONSTRAINT; Schema: dispatch; Owner: -
--

ALTER TABLE ONLY dispatch.calendars
    ADD CONSTRAINT calendars_project_name_key UNIQUE NULLS NOT DISTINCT (project_id, name);


--
-- Name: event_deliveries event_deliveries_pkey; Type: CONSTRAINT; Schema: dispatch; Owner: -
--

ALTER TABLE ONLY dispatch.event_deliveries
    ADD CONSTRAINT event_deliveries_pkey PRIMARY KEY (id);


--
-- Name: migrations migrations_name_key; Type: CONSTRAINT; Schema: dispatch; Owner: -
--

ALTER TABLE ONLY dispatch.migrations
    ADD CONSTRAINT migrations_name_key UNIQUE (name);


--
-- Name: migrations migrations_pkey; Type: CONSTRAINT; Schema: dispatch; Owner: -
--

ALTER TABLE ONLY dispatch.migrations
    ADD CONSTRAINT migrations_pkey PRIMARY KEY (version);


--
-- Name: projects projects_pkey; Type: CONSTRAINT; Schema: dispatch; Owner: -
--

ALTER TABLE ONLY dispatch.projects
    ADD CONSTRAINT projects_pkey PRIMARY KEY (project_id);


--
-- Name: runs runs_pkey; Type: CONSTRAINT; Schema: dispatch; Owner: -
--

ALTER TABLE ONLY dispatch.runs
    ADD CONSTRAINT runs_pkey PRIMARY KEY (id);


--
-- Name: runs runs_slot_key; Type: CONSTRAINT; Schema: dispatch; Owner: -
--

ALTER TABLE ONLY dispatch.runs
    ADD CONSTRAINT runs_slot_key UNIQUE (schedule_id, scheduled_for);


--
-- Name: schedules schedules_pkey; Type: CONSTRAINT; Schema: dispatch; Owner: -
--

ALTER TABLE ONLY dispatch.schedules
    ADD CONSTRAINT schedules_pkey PRIMARY KEY (id);


--
-- Name: settings settings_pkey; Type: CONSTRAINT; Schema: dispatch; Owner: -
--

ALTER TABLE ONLY dispatch.settings
    ADD CONSTRAINT settings_pkey PRIMARY KEY (singleton);


--
-- Name: timezones timezones_pkey; Type: CONSTRAINT; Schema: dispatch; Owner: -
--

ALTER TABLE ONLY dispatch.timezones
    ADD CONSTRAINT timezones_pkey PRIMARY KEY (name);


--
-- Name: audit_log_at_brin_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX audit_log_at_brin_idx ON dispatch.audit_log USING brin (at);


--
-- Name: audit_log_lost_runs_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX audit_log_lost_runs_idx ON dispatch.audit_log USING btree (id) WHERE (action = 'schedule.run.lost'::text);


--
-- Name: audit_log_project_id_at_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX audit_log_project_id_at_idx ON dispatch.audit_log USING btree (project_id, at);


--
-- Name: audit_log_skipped_slots_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX audit_log_skipped_slots_idx ON dispatch.audit_log USING btree (id) WHERE (action = 'schedule.slots.skipped'::text);


--
-- Name: breakers_counting_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX breakers_counting_idx ON dispatch.breakers USING btree (project_id, function_name) WHERE ((state = 'open'::text) OR (failures > 0));


--
-- Name: breakers_open_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX breakers_open_idx ON dispatch.breakers USING btree (project_id, function_name) WHERE (state = 'open'::text);


--
-- Name: calendar_exclusions_calendar_id_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX calendar_exclusions_calendar_id_idx ON dispatch.calendar_exclusions USING btree (calendar_id);


--
-- Name: event_deliveries_created_at_brin_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX event_deliveries_created_at_brin_idx ON dispatch.event_deliveries USING brin (created_at);


--
-- Name: event_deliveries_due_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX event_deliveries_due_idx ON dispatch.event_deliveries USING btree (next_attempt_at) WHERE ((delivered_at IS NULL) AND (gave_up_at IS NULL));


--
-- Name: runs_created_at_brin_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX runs_created_at_brin_idx ON dispatch.runs USING brin (created_at);


--
-- Name: runs_held_by_breaker_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX runs_held_by_breaker_idx ON dispatch.runs USING btree (schedule_id) WHERE (held_by_breaker AND (status = 'pending'::text));


--
-- Name: runs_not_before_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX runs_not_before_idx ON dispatch.runs USING btree (not_before, id) WHERE ((status = 'pending'::text) AND (not_before IS NOT NULL));


--
-- Name: runs_open_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX runs_open_idx ON dispatch.runs USING btree (schedule_id) WHERE (status = ANY (ARRAY['pending'::text, 'running'::text]));


--
-- Name: runs_project_not_before_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX runs_project_not_before_idx ON dispatch.runs USING btree (project_id, not_before, id) WHERE ((status = 'pending'::text) AND (not_before IS NOT NULL));


--
-- Name: runs_project_pending_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX runs_project_pending_idx ON dispatch.runs USING btree (project_id, scheduled_for, id) WHERE ((status = 'pending'::text) AND (not_before IS NULL));


--
-- Name: runs_running_lease_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX runs_running_lease_idx ON dispatch.runs USING btree (lease_until) WHERE (status = 'running'::text);


--
-- Name: schedules_calendar_id_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX schedules_calendar_id_idx ON dispatch.schedules USING btree (calendar_id, next_run_at) WHERE (calendar_id IS NOT NULL);


--
-- Name: schedules_next_run_at_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX schedules_next_run_at_idx ON dispatch.schedules USING btree (next_run_at) WHERE (next_run_at IS NOT NULL);


--
-- Name: schedules_project_next_run_at_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX schedules_project_next_run_at_idx ON dispatch.schedules USING btree (project_id, next_run_at);


--
-- Name: schedules _050_soft_delete; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _050_soft_delete BEFORE DELETE ON dispatch.schedules FOR EACH ROW EXECUTE FUNCTION dispatch._schedule_soft_delete();


--
-- Name: calendars _100_detach_deleted; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _100_detach_deleted BEFORE DELETE ON dispatch.calendars FOR EACH ROW EXECUTE FUNCTION dispatch._calendar_before_delete();


--
-- Name: runs _100_fire_at; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _100_fire_at BEFORE INSERT ON dispatch.runs FOR EACH ROW WHEN ((new.fire_at IS NULL)) EXECUTE FUNCTION dispatch._run_fire_at();


--
-- Name: calendar_exclusions _100_validate; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _100_validate BEFORE INSERT OR UPDATE ON dispatch.calendar_exclusions FOR EACH ROW EXECUTE FUNCTION dispatch._calendar_exclusion_before_write();


--
-- Name: calendars _100_validate; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _100_validate BEFORE INSERT OR UPDATE ON dispatch.calendars FOR EACH ROW EXECUTE FUNCTION dispatch._calendar_before_write();


--
-- Name: schedules _100_validate_insert; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _100_validate_insert BEFORE INSERT ON dispatch.schedules FOR EACH ROW EXECUTE FUNCTION dispatch._schedule_before_write();


--
-- Name: schedules _100_validate_update; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _100_validate_update BEFORE UPDATE OF project_id, function_name, cron_expression, timezone, args, enabled, deleted_at, paused_at, cron_spec, max_attempts, retry_backoff, retry_backoff_max, timeout, misfire_grace, catchup, overlap, every, anchor, jitter, run_at, starts_at, ends_at, max_runs, pause_after_failures, traceparent, calendar_id ON dispatch.schedules FOR EACH ROW EXECUTE FUNCTION dispatch._schedule_before_write();


--
-- Name: schedules _150_ended; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _150_ended BEFORE UPDATE OF next_run_at ON dispatch.schedules FOR EACH ROW WHEN ((new.next_run_at = 'infinity'::timestamp with time zone)) EXECUTE FUNCTION dispatch._schedule_ended();


--
-- Name: schedules _200_end_pending; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _200_end_pending AFTER UPDATE OF enabled, deleted_at, paused_at ON dispatch.schedules FOR EACH ROW WHEN ((old.enabled AND (old.deleted_at IS NULL) AND (old.paused_at IS NULL) AND (NOT (new.enabled AND (new.deleted_at IS NULL) AND (new.paused_at IS NULL))))) EXECUTE FUNCTION dispatch._schedule_end_pending();


--
-- Name: schedules _205_end_left_pending; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _205_end_left_pending AFTER UPDATE OF enabled, paused_at ON dispatch.schedules FOR EACH ROW WHEN ((((NOT old.enabled) OR (old.paused_at IS NOT NULL)) AND new.enabled AND (new.paused_at IS NULL) AND (new.deleted_at IS NULL))) EXECUTE FUNCTION dispatch._schedule_end_pending();


--
-- Name: schedules _210_unbuffer; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _210_unbuffer AFTER UPDATE OF overlap ON dispatch.schedules FOR EACH ROW WHEN (((old.overlap = 'buffer_one'::text) AND (new.overlap <> 'buffer_one'::text))) EXECUTE FUNCTION dispatch._schedule_unbuffer();


--
-- Name: schedules _220_record_stop_gap; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _220_record_stop_gap AFTER UPDATE OF enabled, paused_at ON dispatch.schedules FOR EACH ROW WHEN (((old.next_run_at IS NULL) AND ((new.next_run_at IS NOT NULL) OR (new.ended_at IS NOT NULL)) AND (old.stopped_on IS NOT NULL) AND (NOT (old.cron_spec IS DISTINCT FROM new.cron_spec)) AND (old.timezone = new.timezone))) EXECUTE FUNCTION dispatch._schedule_record_stop_gap();


--
-- Name: schedules _700_move_runs; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _700_move_runs AFTER UPDATE OF project_id ON dispatch.schedules FOR EACH ROW WHEN ((old.project_id IS DISTINCT FROM new.project_id)) EXECUTE FUNCTION dispatch._schedule_move_runs();


--
-- Name: schedules _800_audit_insert; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _800_audit_insert AFTER INSERT ON dispatch.schedules FOR EACH ROW EXECUTE FUNCTION dispatch._schedule_audit();


--
-- Name: schedules _800_audit_update; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _800_audit_update AFTER UPDATE OF project_id, function_name, cron_expression, timezone, args, enabled, deleted_at, paused_at, max_attempts, retry_backoff, retry_backoff_max, timeout, misfire_grace, catchup, overlap, every, anchor, jitter, run_at, starts_at, ends_at, max_runs, pause_after_failures, traceparent, calendar_id ON dispatch.schedules FOR EACH ROW WHEN (((old.project_id IS DISTINCT FROM new.project_id) OR (old.function_name IS DISTINCT FROM new.function_name) OR (old.cron_expression IS DISTINCT FROM new.cron_expression) OR (old.timezone IS DISTINCT FROM new.timezone) OR (old.args IS DISTINCT FROM new.args) OR (old.enabled IS DISTINCT FROM new.enabled) OR (old.deleted_at IS DISTINCT FROM new.deleted_at) OR (old.paused_at IS DISTINCT FROM new.paused_at) OR (old.max_attempts IS DISTINCT FROM new.max_attempts) OR (old.retry_backoff IS DISTINCT FROM new.retry_backoff) OR (old.retry_backoff_max IS DISTINCT FROM new.retry_backoff_max) OR (old.timeout IS DISTINCT FROM new.timeout) OR (old.misfire_grace IS DISTINCT FROM new.misfire_grace) OR (old.catchup IS DISTINCT FROM new.catchup) OR (old.overlap IS DISTINCT FROM new.overlap) OR (old.every IS DISTINCT FROM new.every) OR (old.anchor IS DISTINCT FROM new.anchor) OR (old.jitter IS DISTINCT FROM new.jitter) OR (old.run_at IS DISTINCT FROM new.run_at) OR (old.starts_at IS DISTINCT FROM new.starts_at) OR (old.ends_at IS DISTINCT FROM new.ends_at) OR (old.max_runs IS DISTINCT FROM new.max_runs) OR (old.pause_after_failures IS DISTINCT FROM new.pause_after_failures) OR (old.traceparent IS DISTINCT FROM new.traceparent) OR (old.calendar_id IS DISTINCT FROM new.calendar_id))) EXECUTE FUNCTION dispatch._schedule_audit();


--
-- Name: schedules _810_audit_ended; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _810_audit_ended AFTER UPDATE ON dispatch.schedules FOR EACH ROW WHEN (((new.ended_at IS NOT NULL) AND (new.ended_at IS DISTINCT FROM old.ended_at))) EXECUTE FUNCTION dispatch._schedule_audit_ended();


--
-- Name: schedules _900_notify; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _900_notify AFTER INSERT OR UPDATE OF enabled, deleted_at, paused_at, cron_expression, timezone, every, anchor, run_at, starts_at, ends_at, max_runs ON dispatch.schedules FOR EACH STATEMENT EXECUTE FUNCTION dispatch._schedule_notify();


--
-- Name: calendar_exclusions calendar_exclusions_calendar_id_fkey; Type: FK CONSTRAINT; Schema: dispatch; Owner: -
--

ALTER TABLE ONLY dispatch.calendar_exclusions
    ADD CONSTRAINT calendar_exclusions_calendar_id_fkey FOREIGN KEY (calendar_id) REFERENCES dispatch.calendars(id) ON DELETE CASCADE;


--
-- Name: runs runs_schedule_id_fkey; Type: FK CONSTRAINT; Schema: dispatch; Owner: -
--

ALTER TABLE ONLY dispatch.runs
    ADD CONSTRAINT runs_schedule_id_fkey FOREIGN KEY (schedule_id) REFERENCES dispatch.schedules(id) ON DELETE CASCADE;


--
-- Name: schedules schedules_calendar_id_fkey; Type: FK CONSTRAINT; Schema: dispatch; Owner: -
--

ALTER TABLE ONLY dispatch.schedules
    ADD CONSTRAINT schedules_calendar_id_fkey FOREIGN KEY (calendar_id) REFERENCES dispatch.calendars(id);


--
-- Name: SCHEMA dispatch; Type: ACL; Schema: -; Owner: -
--

GRANT USAGE ON SCHEMA dispatch TO dispatch_listener;
GRANT USAGE ON SCHEMA dispatch TO dispatch_reader;
GRANT USAGE ON SCHEMA dispatch TO dispatch_admin;


--
-- Name: TABLE runs; Type: ACL; Schema: dispatch; Owner: -
--

GRANT SELECT ON TABLE dispatch.runs TO dispatch_reader;


--
-- Name: FUNCTION _advance_schedules(finished dispatch.runs[], guarded boolean); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._advance_schedules(finished dispatch.runs[], guarded boolean) FROM PUBLIC;


--
-- Name: FUNCTION _audit_runs(finished dispatch.runs[]); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._audit_runs(finished dispatch.runs[]) FROM PUBLIC;


--
-- Name: FUNCTION _breaker_outcomes(run_ids bigint[], all_ids bigint[], statuses text[], retryable boolean[], errors text[]); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._breaker_outcomes(run_ids bigint[], all_ids bigint[], statuses text[], retryable boolean[], errors text[]) FROM PUBLIC;


--
-- Name: FUNCTION _calendar_before_delete(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._calendar_before_delete() FROM PUBLIC;


--
-- Name: FUNCTION _calendar_before_write(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._calendar_before_write() FROM PUBLIC;


--
-- Name: FUNCTION _calendar_blocked(horizon timestamp with time zone, OUT calendar_ids bigint[], OUT slots timestamp with time zone[]); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._calendar_blocked(horizon timestamp with time zone, OUT calendar_ids bigint[], OUT slots timestamp with time zone[]) FROM PUBLIC;


--
-- Name: FUNCTION _calendar_exclusion_before_write(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._calendar_exclusion_before_write() FROM PUBLIC;


--
-- Name: FUNCTION _calendar_latest(spec dispatch.cron_spec, tz text, calendar_id bigint, lo timestamp with time zone, hi timestamp with time zone); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._calendar_latest(spec dispatch.cron_spec, tz text, calendar_id bigint, lo timestamp with time zone, hi timestamp with time zone) FROM PUBLIC;


--
-- Name: FUNCTION _calendar_lets_bulk(calendar_id bigint, slot timestamp with time zone, every_us bigint, catchup text, horizon timestamp with time zone, blocked_calendars bigint[], blocked_slots timestamp with time zone[]); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._calendar_lets_bulk(calendar_id bigint, slot timestamp with time zone, every_us bigint, catchup text, horizon timestamp with time zone, blocked_calendars bigint[], blocked_slots timestamp with time zone[]) FROM PUBLIC;


--
-- Name: FUNCTION _calendar_period(calendar_id bigint, at timestamp with time zone, OUT calendar text, OUT starts_at timestamp with time zone, OUT ends_at timestamp with time zone, OUT label text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._calendar_period(calendar_id bigint, at timestamp with time zone, OUT calendar text, OUT starts_at timestamp with time zone, OUT ends_at timestamp with time zone, OUT label text) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._calendar_period(calendar_id bigint, at timestamp with time zone, OUT calendar text, OUT starts_at timestamp with time zone, OUT ends_at timestamp with time zone, OUT label text) TO dispatch_reader;


--
-- Name: FUNCTION _calendar_slot(spec dispatch.cron_spec, tz text, calendar_id bigint, slot timestamp with time zone); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._calendar_slot(spec dispatch.cron_spec, tz text, calendar_id bigint, slot timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._calendar_slot(spec dispatch.cron_spec, tz text, calendar_id bigint, slot timestamp with time zone) TO dispatch_reader;


--
-- Name: TABLE schedules; Type: ACL; Schema: dispatch; Owner: -
--

GRANT SELECT ON TABLE dispatch.schedules TO dispatch_reader;
GRANT DELETE ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.id; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(id) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.project_id; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(project_id),UPDATE(project_id) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.function_name; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(function_name),UPDATE(function_name) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.cron_expression; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(cron_expression),UPDATE(cron_expression) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.timezone; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(timezone),UPDATE(timezone) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.args; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(args),UPDATE(args) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.enabled; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(enabled),UPDATE(enabled) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.deleted_at; Type: ACL; Schema: dispatch; Owner: -
--

GRANT UPDATE(deleted_at) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.max_attempts; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(max_attempts),UPDATE(max_attempts) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.retry_backoff; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(retry_backoff),UPDATE(retry_backoff) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.retry_backoff_max; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(retry_backoff_max),UPDATE(retry_backoff_max) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.timeout; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(timeout),UPDATE(timeout) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.misfire_grace; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(misfire_grace),UPDATE(misfire_grace) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.catchup; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(catchup),UPDATE(catchup) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.overlap; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(overlap),UPDATE(overlap) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.every; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(every),UPDATE(every) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.anchor; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(anchor),UPDATE(anchor) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.jitter; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(jitter),UPDATE(jitter) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.run_at; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(run_at),UPDATE(run_at) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.starts_at; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(starts_at),UPDATE(starts_at) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.ends_at; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(ends_at),UPDATE(ends_at) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.max_runs; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(max_runs),UPDATE(max_runs) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.pause_after_failures; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(pause_after_failures),UPDATE(pause_after_failures) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.traceparent; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(traceparent),UPDATE(traceparent) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: COLUMN schedules.calendar_id; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(calendar_id),UPDATE(calendar_id) ON TABLE dispatch.schedules TO dispatch_admin;


--
-- Name: FUNCTION _check_bounds(s dispatch.schedules, was dispatch.schedules); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._check_bounds(s dispatch.schedules, was dispatch.schedules) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._check_bounds(s dispatch.schedules, was dispatch.schedules) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch._check_bounds(s dispatch.schedules, was dispatch.schedules) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch._check_bounds(s dispatch.schedules, was dispatch.schedules) TO dispatch_admin;


--
-- Name: FUNCTION _check_calendar(project_id text, calendar_id bigint); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._check_calendar(project_id text, calendar_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._check_calendar(project_id text, calendar_id bigint) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch._check_calendar(project_id text, calendar_id bigint) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch._check_calendar(project_id text, calendar_id bigint) TO dispatch_admin;


--
-- Name: FUNCTION _check_policies(s dispatch.schedules); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._check_policies(s dispatch.schedules) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._check_policies(s dispatch.schedules) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch._check_policies(s dispatch.schedules) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch._check_policies(s dispatch.schedules) TO dispatch_admin;


--
-- Name: FUNCTION _check_traceparent(value text, field text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._check_traceparent(value text, field text) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._check_traceparent(value text, field text) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch._check_traceparent(value text, field text) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch._check_traceparent(value text, field text) TO dispatch_admin;


--
-- Name: FUNCTION _claim_shares(n integer, weights integer[], allow integer[]); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._claim_shares(n integer, weights integer[], allow integer[]) FROM PUBLIC;


--
-- Name: FUNCTION _claim_verdict(r dispatch.runs, s dispatch.schedules); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._claim_verdict(r dispatch.runs, s dispatch.schedules) FROM PUBLIC;


--
-- Name: FUNCTION _claimable_between(after text, upto text, n integer, waiting text[], whole boolean); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._claimable_between(after text, upto text, n integer, waiting text[], whole boolean) FROM PUBLIC;


--
-- Name: FUNCTION _claimable_front(OUT waiting text[], OUT whole boolean); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._claimable_front(OUT waiting text[], OUT whole boolean) FROM PUBLIC;


--
-- Name: FUNCTION _claimable_projects(after text, n integer); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._claimable_projects(after text, n integer) FROM PUBLIC;


--
-- Name: TABLE breakers; Type: ACL; Schema: dispatch; Owner: -
--

GRANT SELECT ON TABLE dispatch.breakers TO dispatch_reader;


--
-- Name: FUNCTION _close_breaker(project_id text, function_name text, actor text, reason text, run_ids bigint[]); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._close_breaker(project_id text, function_name text, actor text, reason text, run_ids bigint[]) FROM PUBLIC;


--
-- Name: FUNCTION _cron_days(spec dispatch.cron_spec, y integer, mo integer, first_dow integer); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._cron_days(spec dispatch.cron_spec, y integer, mo integer, first_dow integer) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._cron_days(spec dispatch.cron_spec, y integer, mo integer, first_dow integer) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch._cron_days(spec dispatch.cron_spec, y integer, mo integer, first_dow integer) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch._cron_days(spec dispatch.cron_spec, y integer, mo integer, first_dow integer) TO dispatch_admin;


--
-- Name: FUNCTION _cron_error(expr text, detail text, hint text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._cron_error(expr text, detail text, hint text) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._cron_error(expr text, detail text, hint text) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch._cron_error(expr text, detail text, hint text) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch._cron_error(expr text, detail text, hint text) TO dispatch_admin;


--
-- Name: FUNCTION _cron_latest(spec dispatch.cron_spec, lo timestamp with time zone, hi timestamp with time zone, tz text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._cron_latest(spec dispatch.cron_spec, lo timestamp with time zone, hi timestamp with time zone, tz text) FROM PUBLIC;


--
-- Name: FUNCTION _cron_match_from(spec dispatch.cron_spec, t timestamp without time zone); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._cron_match_from(spec dispatch.cron_spec, t timestamp without time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._cron_match_from(spec dispatch.cron_spec, t timestamp without time zone) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch._cron_match_from(spec dispatch.cron_spec, t timestamp without time zone) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch._cron_match_from(spec dispatch.cron_spec, t timestamp without time zone) TO dispatch_admin;


--
-- Name: FUNCTION _cron_slots(spec dispatch.cron_spec, lo timestamp with time zone, hi timestamp with time zone, tz text, max_n integer); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._cron_slots(spec dispatch.cron_spec, lo timestamp with time zone, hi timestamp with time zone, tz text, max_n integer) FROM PUBLIC;


--
-- Name: FUNCTION _cron_value(expr text, field text, tok text, lo integer, hi integer); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._cron_value(expr text, field text, tok text, lo integer, hi integer) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._cron_value(expr text, field text, tok text, lo integer, hi integer) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch._cron_value(expr text, field text, tok text, lo integer, hi integer) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch._cron_value(expr text, field text, tok text, lo integer, hi integer) TO dispatch_admin;


--
-- Name: FUNCTION _due_heads(horizon timestamp with time zone, max_runs integer, blocked_calendars bigint[], blocked_slots timestamp with time zone[]); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._due_heads(horizon timestamp with time zone, max_runs integer, blocked_calendars bigint[], blocked_slots timestamp with time zone[]) FROM PUBLIC;


--
-- Name: FUNCTION _end_late_retries(run_ids bigint[]); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._end_late_retries(run_ids bigint[]) FROM PUBLIC;


--
-- Name: FUNCTION _end_schedule(s dispatch.schedules); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._end_schedule(s dispatch.schedules) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._end_schedule(s dispatch.schedules) TO dispatch_admin;


--
-- Name: FUNCTION _end_stale_runs(run_ids bigint[], wait boolean, stopped text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._end_stale_runs(run_ids bigint[], wait boolean, stopped text) FROM PUBLIC;


--
-- Name: FUNCTION _ended_reason(s dispatch.schedules); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._ended_reason(s dispatch.schedules) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._ended_reason(s dispatch.schedules) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch._ended_reason(s dispatch.schedules) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch._ended_reason(s dispatch.schedules) TO dispatch_admin;


--
-- Name: FUNCTION _event(event text, project_id text, body jsonb, detail jsonb); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._event(event text, project_id text, body jsonb, detail jsonb) FROM PUBLIC;


--
-- Name: FUNCTION _every_index(spec dispatch.cron_spec, at timestamp with time zone); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._every_index(spec dispatch.cron_spec, at timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._every_index(spec dispatch.cron_spec, at timestamp with time zone) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch._every_index(spec dispatch.cron_spec, at timestamp with time zone) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch._every_index(spec dispatch.cron_spec, at timestamp with time zone) TO dispatch_admin;


--
-- Name: FUNCTION _every_slot(spec dispatch.cron_spec, k numeric); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._every_slot(spec dispatch.cron_spec, k numeric) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._every_slot(spec dispatch.cron_spec, k numeric) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch._every_slot(spec dispatch.cron_spec, k numeric) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch._every_slot(spec dispatch.cron_spec, k numeric) TO dispatch_admin;


--
-- Name: FUNCTION _excluded_detail(slot timestamp with time zone, period record, after timestamp with time zone, tz text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._excluded_detail(slot timestamp with time zone, period record, after timestamp with time zone, tz text) FROM PUBLIC;


--
-- Name: FUNCTION _expire_leases(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._expire_leases() FROM PUBLIC;


--
-- Name: FUNCTION _explain_cap(project text, OUT max_concurrency integer, OUT running integer, OUT holder integer, OUT takes bigint[]); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._explain_cap(project text, OUT max_concurrency integer, OUT running integer, OUT holder integer, OUT takes bigint[]) FROM PUBLIC;


--
-- Name: FUNCTION _explain_next(spec dispatch.cron_spec, after timestamp with time zone, tz text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._explain_next(spec dispatch.cron_spec, after timestamp with time zone, tz text) FROM PUBLIC;


--
-- Name: FUNCTION _explain_open(s dispatch.schedules); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._explain_open(s dispatch.schedules) FROM PUBLIC;


--
-- Name: FUNCTION _finish_runs(finished dispatch.runs[]); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._finish_runs(finished dispatch.runs[]) FROM PUBLIC;


--
-- Name: FUNCTION _follow_up(schedule_ids uuid[]); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._follow_up(schedule_ids uuid[]) FROM PUBLIC;


--
-- Name: FUNCTION _hold_for_breakers(run_ids bigint[]); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._hold_for_breakers(run_ids bigint[]) FROM PUBLIC;


--
-- Name: FUNCTION _holds_table(pid integer, tbl regclass); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._holds_table(pid integer, tbl regclass) FROM PUBLIC;


--
-- Name: FUNCTION _instant(t timestamp with time zone); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._instant(t timestamp with time zone) FROM PUBLIC;


--
-- Name: FUNCTION _mark_due(horizon timestamp with time zone, max_runs integer, OUT marked integer, OUT taken integer); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._mark_due(horizon timestamp with time zone, max_runs integer, OUT marked integer, OUT taken integer) FROM PUBLIC;


--
-- Name: FUNCTION _missed(r dispatch.runs, s dispatch.schedules); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._missed(r dispatch.runs, s dispatch.schedules) FROM PUBLIC;


--
-- Name: FUNCTION _missed_by(late interval); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._missed_by(late interval) FROM PUBLIC;


--
-- Name: FUNCTION _next_bit(mask bigint, k integer); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._next_bit(mask bigint, k integer) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._next_bit(mask bigint, k integer) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch._next_bit(mask bigint, k integer) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch._next_bit(mask bigint, k integer) TO dispatch_admin;


--
-- Name: FUNCTION _next_slot(spec dispatch.cron_spec, after timestamp with time zone, tz text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._next_slot(spec dispatch.cron_spec, after timestamp with time zone, tz text) FROM PUBLIC;


--
-- Name: FUNCTION _operable_schedule(schedule_id uuid, verb text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._operable_schedule(schedule_id uuid, verb text) FROM PUBLIC;


--
-- Name: FUNCTION _probe_delay(probes integer); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._probe_delay(probes integer) FROM PUBLIC;


--
-- Name: FUNCTION _probe_spacing(probes integer); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._probe_spacing(probes integer) FROM PUBLIC;


--
-- Name: FUNCTION _project_holder(project text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._project_holder(project text) FROM PUBLIC;


--
-- Name: FUNCTION _prune_audit(after_id bigint, INOUT up_to bigint, OUT last_id bigint, OUT deleted bigint); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._prune_audit(after_id bigint, INOUT up_to bigint, OUT last_id bigint, OUT deleted bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._prune_audit(after_id bigint, INOUT up_to bigint, OUT last_id bigint, OUT deleted bigint) TO dispatch_admin;


--
-- Name: FUNCTION _prune_event_deliveries(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._prune_event_deliveries() FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._prune_event_deliveries() TO dispatch_admin;


--
-- Name: FUNCTION _prune_runs(after_id bigint, INOUT up_to bigint, OUT last_id bigint, OUT deleted bigint); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._prune_runs(after_id bigint, INOUT up_to bigint, OUT last_id bigint, OUT deleted bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._prune_runs(after_id bigint, INOUT up_to bigint, OUT last_id bigint, OUT deleted bigint) TO dispatch_admin;


--
-- Name: FUNCTION _record_gaps(schedule_ids uuid[], los timestamp with time zone[], his timestamp with time zone[], reason text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._record_gaps(schedule_ids uuid[], los timestamp with time zone[], his timestamp with time zone[], reason text) FROM PUBLIC;


--
-- Name: FUNCTION _refuse(problem text, hint text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._refuse(problem text, hint text) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._refuse(problem text, hint text) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch._refuse(problem text, hint text) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch._refuse(problem text, hint text) TO dispatch_admin;


--
-- Name: FUNCTION _release_held(project_id text, function_name text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._release_held(project_id text, function_name text) FROM PUBLIC;


--
-- Name: FUNCTION _require_read_committed(what text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._require_read_committed(what text) FROM PUBLIC;


--
-- Name: FUNCTION _retry_delay(s dispatch.schedules, attempt integer, retry_after_ms integer); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._retry_delay(s dispatch.schedules, attempt integer, retry_after_ms integer) FROM PUBLIC;


--
-- Name: FUNCTION _row_holder(locker xid, tbl regclass); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._row_holder(locker xid, tbl regclass) FROM PUBLIC;


--
-- Name: FUNCTION _run_fire_at(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._run_fire_at() FROM PUBLIC;


--
-- Name: FUNCTION _running_counts(projects text[], OUT project_ids text[], OUT counts integer[]); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._running_counts(projects text[], OUT project_ids text[], OUT counts integer[]) FROM PUBLIC;


--
-- Name: FUNCTION _runs_failed(finished dispatch.runs[]); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._runs_failed(finished dispatch.runs[]) FROM PUBLIC;


--
-- Name: FUNCTION _schedule_audit(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._schedule_audit() FROM PUBLIC;


--
-- Name: FUNCTION _schedule_audit_ended(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._schedule_audit_ended() FROM PUBLIC;


--
-- Name: FUNCTION _schedule_before_write(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._schedule_before_write() FROM PUBLIC;


--
-- Name: FUNCTION _schedule_end_pending(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._schedule_end_pending() FROM PUBLIC;


--
-- Name: FUNCTION _schedule_ended(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._schedule_ended() FROM PUBLIC;


--
-- Name: FUNCTION _schedule_move_runs(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._schedule_move_runs() FROM PUBLIC;


--
-- Name: FUNCTION _schedule_notify(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._schedule_notify() FROM PUBLIC;


--
-- Name: FUNCTION _schedule_record_stop_gap(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._schedule_record_stop_gap() FROM PUBLIC;


--
-- Name: FUNCTION _schedule_soft_delete(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._schedule_soft_delete() FROM PUBLIC;


--
-- Name: FUNCTION _schedule_unbuffer(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._schedule_unbuffer() FROM PUBLIC;


--
-- Name: FUNCTION _settle_runs(finished dispatch.runs[]); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._settle_runs(finished dispatch.runs[]) FROM PUBLIC;


--
-- Name: FUNCTION _skip_missed(s dispatch.schedules, from_slot timestamp with time zone, cut timestamp with time zone, horizon timestamp with time zone); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._skip_missed(s dispatch.schedules, from_slot timestamp with time zone, cut timestamp with time zone, horizon timestamp with time zone) FROM PUBLIC;


--
-- Name: FUNCTION _slot_spacing(spec dispatch.cron_spec); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._slot_spacing(spec dispatch.cron_spec) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._slot_spacing(spec dispatch.cron_spec) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch._slot_spacing(spec dispatch.cron_spec) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch._slot_spacing(spec dispatch.cron_spec) TO dispatch_admin;


--
-- Name: FUNCTION _slots_between(spec dispatch.cron_spec, lo timestamp with time zone, hi timestamp with time zone, tz text, OUT first_slot timestamp with time zone, OUT last_slot timestamp with time zone, OUT slots integer, OUT at_least boolean); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._slots_between(spec dispatch.cron_spec, lo timestamp with time zone, hi timestamp with time zone, tz text, OUT first_slot timestamp with time zone, OUT last_slot timestamp with time zone, OUT slots integer, OUT at_least boolean) FROM PUBLIC;


--
-- Name: FUNCTION _span(d interval); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._span(d interval) FROM PUBLIC;


--
-- Name: FUNCTION _start_runs(tids tid[], worker text, lease interval, default_timeout interval); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._start_runs(tids tid[], worker text, lease interval, default_timeout interval) FROM PUBLIC;


--
-- Name: FUNCTION _stopped_as(s dispatch.schedules); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._stopped_as(s dispatch.schedules) FROM PUBLIC;


--
-- Name: FUNCTION _take_running(run_ids bigint[], attempts integer[], OUT ids bigint[], OUT tids tid[]); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._take_running(run_ids bigint[], attempts integer[], OUT ids bigint[], OUT tids tid[]) FROM PUBLIC;


--
-- Name: FUNCTION _tick_schedule(schedule_id uuid, horizon timestamp with time zone); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._tick_schedule(schedule_id uuid, horizon timestamp with time zone) FROM PUBLIC;


--
-- Name: FUNCTION _tick_schedule_guarded(schedule_id uuid, horizon timestamp with time zone); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._tick_schedule_guarded(schedule_id uuid, horizon timestamp with time zone) FROM PUBLIC;


--
-- Name: FUNCTION _timezone_names(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._timezone_names() FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._timezone_names() TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch._timezone_names() TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch._timezone_names() TO dispatch_admin;


--
-- Name: FUNCTION _tz_transition(lo timestamp with time zone, hi timestamp with time zone, tz text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._tz_transition(lo timestamp with time zone, hi timestamp with time zone, tz text) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._tz_transition(lo timestamp with time zone, hi timestamp with time zone, tz text) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch._tz_transition(lo timestamp with time zone, hi timestamp with time zone, tz text) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch._tz_transition(lo timestamp with time zone, hi timestamp with time zone, tz text) TO dispatch_admin;


--
-- Name: FUNCTION _waits_its_turn(r dispatch.runs); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._waits_its_turn(r dispatch.runs) FROM PUBLIC;


--
-- Name: FUNCTION _wall_instant(wall timestamp without time zone, tz text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._wall_instant(wall timestamp without time zone, tz text) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._wall_instant(wall timestamp without time zone, tz text) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch._wall_instant(wall timestamp without time zone, tz text) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch._wall_instant(wall timestamp without time zone, tz text) TO dispatch_admin;


--
-- Name: FUNCTION backfill(schedule_id uuid, from_ts timestamp with time zone, to_ts timestamp with time zone); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.backfill(schedule_id uuid, from_ts timestamp with time zone, to_ts timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.backfill(schedule_id uuid, from_ts timestamp with time zone, to_ts timestamp with time zone) TO dispatch_admin;


--
-- Name: FUNCTION bounded_spec(spec dispatch.cron_spec, starts_at timestamp with time zone, ends_at timestamp with time zone, max_runs integer, tz text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.bounded_spec(spec dispatch.cron_spec, starts_at timestamp with time zone, ends_at timestamp with time zone, max_runs integer, tz text) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.bounded_spec(spec dispatch.cron_spec, starts_at timestamp with time zone, ends_at timestamp with time zone, max_runs integer, tz text) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch.bounded_spec(spec dispatch.cron_spec, starts_at timestamp with time zone, ends_at timestamp with time zone, max_runs integer, tz text) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch.bounded_spec(spec dispatch.cron_spec, starts_at timestamp with time zone, ends_at timestamp with time zone, max_runs integer, tz text) TO dispatch_admin;


--
-- Name: FUNCTION breaker_states(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.breaker_states() FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.breaker_states() TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch.breaker_states() TO dispatch_reader;


--
-- Name: FUNCTION calendar_excludes(calendar_id bigint, at timestamp with time zone); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.calendar_excludes(calendar_id bigint, at timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.calendar_excludes(calendar_id bigint, at timestamp with time zone) TO dispatch_reader;


--
-- Name: FUNCTION calendar_periods(calendar_id bigint, from_ts timestamp with time zone, to_ts timestamp with time zone); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.calendar_periods(calendar_id bigint, from_ts timestamp with time zone, to_ts timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.calendar_periods(calendar_id bigint, from_ts timestamp with time zone, to_ts timestamp with time zone) TO dispatch_reader;


--
-- Name: FUNCTION check_deadline(now timestamp with time zone, not_after timestamp with time zone); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.check_deadline(now timestamp with time zone, not_after timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.check_deadline(now timestamp with time zone, not_after timestamp with time zone) TO dispatch_listener;


--
-- Name: FUNCTION check_timezone(tz text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.check_timezone(tz text) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.check_timezone(tz text) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch.check_timezone(tz text) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch.check_timezone(tz text) TO dispatch_admin;


--
-- Name: FUNCTION claim_event_deliveries(worker text, max_deliveries integer, lease interval); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.claim_event_deliveries(worker text, max_deliveries integer, lease interval) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.claim_event_deliveries(worker text, max_deliveries integer, lease interval) TO dispatch_listener;


--
-- Name: FUNCTION claim_runs(worker text, max_runs integer, lease interval, default_timeout interval); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.claim_runs(worker text, max_runs integer, lease interval, default_timeout interval) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.claim_runs(worker text, max_runs integer, lease interval, default_timeout interval) TO dispatch_listener;


--
-- Name: PROCEDURE complete_run(IN run_id bigint, IN worker text, IN attempt integer, IN status text, IN error text, IN http_status integer, IN duration_ms integer, IN retryable boolean, IN retry_after_ms integer, INOUT recorded boolean, INOUT advanced boolean, INOUT busy boolean, INOUT retry_at timestamp with time zone); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON PROCEDURE dispatch.complete_run(IN run_id bigint, IN worker text, IN attempt integer, IN status text, IN error text, IN http_status integer, IN duration_ms integer, IN retryable boolean, IN retry_after_ms integer, INOUT recorded boolean, INOUT advanced boolean, INOUT busy boolean, INOUT retry_at timestamp with time zone) FROM PUBLIC;
GRANT ALL ON PROCEDURE dispatch.complete_run(IN run_id bigint, IN worker text, IN attempt integer, IN status text, IN error text, IN http_status integer, IN duration_ms integer, IN retryable boolean, IN retry_after_ms integer, INOUT recorded boolean, INOUT advanced boolean, INOUT busy boolean, INOUT retry_at timestamp with time zone) TO dispatch_listener;


--
-- Name: FUNCTION complete_runs(worker text, run_ids bigint[], attempts integer[], statuses text[], errors text[], http_statuses integer[], durations_ms integer[], retryable boolean[], retry_after_ms integer[]); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.complete_runs(worker text, run_ids bigint[], attempts integer[], statuses text[], errors text[], http_statuses integer[], durations_ms integer[], retryable boolean[], retry_after_ms integer[]) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.complete_runs(worker text, run_ids bigint[], attempts integer[], statuses text[], errors text[], http_statuses integer[], durations_ms integer[], retryable boolean[], retry_after_ms integer[]) TO dispatch_listener;


--
-- Name: FUNCTION cron_is_valid(expr text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.cron_is_valid(expr text) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.cron_is_valid(expr text) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch.cron_is_valid(expr text) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch.cron_is_valid(expr text) TO dispatch_admin;


--
-- Name: FUNCTION cron_login_problem(dbname text, role text, host text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.cron_login_problem(dbname text, role text, host text) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.cron_login_problem(dbname text, role text, host text) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch.cron_login_problem(dbname text, role text, host text) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch.cron_login_problem(dbname text, role text, host text) TO dispatch_admin;


--
-- Name: FUNCTION cron_next(expr text, after timestamp with time zone, tz text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.cron_next(expr text, after timestamp with time zone, tz text) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.cron_next(expr text, after timestamp with time zone, tz text) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch.cron_next(expr text, after timestamp with time zone, tz text) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch.cron_next(expr text, after timestamp with time zone, tz text) TO dispatch_admin;


--
-- Name: FUNCTION cron_parse(expr text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.cron_parse(expr text) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.cron_parse(expr text) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch.cron_parse(expr text) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch.cron_parse(expr text) TO dispatch_admin;


--
-- Name: FUNCTION cron_spec_next(spec dispatch.cron_spec, after timestamp with time zone, tz text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.cron_spec_next(spec dispatch.cron_spec, after timestamp with time zone, tz text) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.cron_spec_next(spec dispatch.cron_spec, after timestamp with time zone, tz text) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch.cron_spec_next(spec dispatch.cron_spec, after timestamp with time zone, tz text) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch.cron_spec_next(spec dispatch.cron_spec, after timestamp with time zone, tz text) TO dispatch_admin;


--
-- Name: FUNCTION every_spec(every interval, anchor timestamp with time zone); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.every_spec(every interval, anchor timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.every_spec(every interval, anchor timestamp with time zone) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch.every_spec(every interval, anchor timestamp with time zone) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch.every_spec(every interval, anchor timestamp with time zone) TO dispatch_admin;


--
-- Name: FUNCTION explain(schedule_id uuid, since timestamp with time zone); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.explain(schedule_id uuid, since timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.explain(schedule_id uuid, since timestamp with time zone) TO dispatch_reader;


--
-- Name: FUNCTION finish_event_deliveries(worker text, delivery_ids bigint[], attempts integer[], errors text[]); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.finish_event_deliveries(worker text, delivery_ids bigint[], attempts integer[], errors text[]) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.finish_event_deliveries(worker text, delivery_ids bigint[], attempts integer[], errors text[]) TO dispatch_listener;


--
-- Name: FUNCTION jitter_offset(schedule_id uuid, slot timestamp with time zone, jitter interval); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.jitter_offset(schedule_id uuid, slot timestamp with time zone, jitter interval) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.jitter_offset(schedule_id uuid, slot timestamp with time zone, jitter interval) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch.jitter_offset(schedule_id uuid, slot timestamp with time zone, jitter interval) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch.jitter_offset(schedule_id uuid, slot timestamp with time zone, jitter interval) TO dispatch_admin;


--
-- Name: FUNCTION lost_runs_after(after_id bigint); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.lost_runs_after(after_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.lost_runs_after(after_id bigint) TO dispatch_listener;


--
-- Name: FUNCTION next_due_after(covered timestamp with time zone); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.next_due_after(covered timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.next_due_after(covered timestamp with time zone) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch.next_due_after(covered timestamp with time zone) TO dispatch_admin;


--
-- Name: FUNCTION next_due_at(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.next_due_at() FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.next_due_at() TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch.next_due_at() TO dispatch_admin;


--
-- Name: FUNCTION next_event_delivery_at(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.next_event_delivery_at() FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.next_event_delivery_at() TO dispatch_listener;


--
-- Name: FUNCTION next_slot_after(covered timestamp with time zone); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.next_slot_after(covered timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.next_slot_after(covered timestamp with time zone) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch.next_slot_after(covered timestamp with time zone) TO dispatch_admin;


--
-- Name: FUNCTION next_start_after(after timestamp with time zone); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.next_start_after(after timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.next_start_after(after timestamp with time zone) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch.next_start_after(after timestamp with time zone) TO dispatch_admin;


--
-- Name: FUNCTION once_spec(run_at timestamp with time zone); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.once_spec(run_at timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.once_spec(run_at timestamp with time zone) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch.once_spec(run_at timestamp with time zone) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch.once_spec(run_at timestamp with time zone) TO dispatch_admin;


--
-- Name: FUNCTION pause(schedule_id uuid, reason text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.pause(schedule_id uuid, reason text) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.pause(schedule_id uuid, reason text) TO dispatch_admin;


--
-- Name: PROCEDURE prune(INOUT runs_deleted bigint, INOUT audit_deleted bigint); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON PROCEDURE dispatch.prune(INOUT runs_deleted bigint, INOUT audit_deleted bigint) FROM PUBLIC;
GRANT ALL ON PROCEDURE dispatch.prune(INOUT runs_deleted bigint, INOUT audit_deleted bigint) TO dispatch_admin;


--
-- Name: FUNCTION refresh_timezones(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.refresh_timezones() FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.refresh_timezones() TO dispatch_admin;


--
-- Name: FUNCTION register_cron_job(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.register_cron_job() FROM PUBLIC;


--
-- Name: FUNCTION release_runs(worker text, run_ids bigint[], attempts integer[]); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.release_runs(worker text, run_ids bigint[], attempts integer[]) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.release_runs(worker text, run_ids bigint[], attempts integer[]) TO dispatch_listener;


--
-- Name: FUNCTION reset_breaker(project_id text, function_name text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.reset_breaker(project_id text, function_name text) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.reset_breaker(project_id text, function_name text) TO dispatch_admin;


--
-- Name: FUNCTION resume(schedule_id uuid); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.resume(schedule_id uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.resume(schedule_id uuid) TO dispatch_admin;


--
-- Name: FUNCTION run_now(schedule_id uuid, traceparent text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.run_now(schedule_id uuid, traceparent text) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.run_now(schedule_id uuid, traceparent text) TO dispatch_admin;


--
-- Name: FUNCTION run_trace(run_id bigint); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.run_trace(run_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.run_trace(run_id bigint) TO dispatch_reader;


--
-- Name: FUNCTION schema_version(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.schema_version() FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.schema_version() TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch.schema_version() TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch.schema_version() TO dispatch_admin;


--
-- Name: FUNCTION skipped_slots_after(after_id bigint); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.skipped_slots_after(after_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.skipped_slots_after(after_id bigint) TO dispatch_listener;


--
-- Name: FUNCTION tick(now timestamp with time zone); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.tick(now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.tick(now timestamp with time zone) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch.tick(now timestamp with time zone) TO dispatch_admin;


--
-- Name: FUNCTION tick_chunk(max_runs integer, OUT marked integer, OUT taken integer); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.tick_chunk(max_runs integer, OUT marked integer, OUT taken integer) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.tick_chunk(max_runs integer, OUT marked integer, OUT taken integer) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch.tick_chunk(max_runs integer, OUT marked integer, OUT taken integer) TO dispatch_admin;


--
-- Name: FUNCTION traceparent(request_id text, attempt integer, parent text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.traceparent(request_id text, attempt integer, parent text) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.traceparent(request_id text, attempt integer, parent text) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch.traceparent(request_id text, attempt integer, parent text) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch.traceparent(request_id text, attempt integer, parent text) TO dispatch_admin;


--
-- Name: TABLE audit_log; Type: ACL; Schema: dispatch; Owner: -
--

GRANT SELECT ON TABLE dispatch.audit_log TO dispatch_reader;


--
-- Name: TABLE calendar_exclusions; Type: ACL; Schema: dispatch; Owner: -
--

GRANT SELECT ON TABLE dispatch.calendar_exclusions TO dispatch_reader;
GRANT DELETE ON TABLE dispatch.calendar_exclusions TO dispatch_admin;


--
-- Name: COLUMN calendar_exclusions.calendar_id; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(calendar_id) ON TABLE dispatch.calendar_exclusions TO dispatch_admin;


--
-- Name: COLUMN calendar_exclusions.label; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(label),UPDATE(label) ON TABLE dispatch.calendar_exclusions TO dispatch_admin;


--
-- Name: COLUMN calendar_exclusions.starts; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(starts),UPDATE(starts) ON TABLE dispatch.calendar_exclusions TO dispatch_admin;


--
-- Name: COLUMN calendar_exclusions.ends; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(ends),UPDATE(ends) ON TABLE dispatch.calendar_exclusions TO dispatch_admin;


--
-- Name: COLUMN calendar_exclusions.days; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(days),UPDATE(days) ON TABLE dispatch.calendar_exclusions TO dispatch_admin;


--
-- Name: COLUMN calendar_exclusions.from_time; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(from_time),UPDATE(from_time) ON TABLE dispatch.calendar_exclusions TO dispatch_admin;


--
-- Name: COLUMN calendar_exclusions.until_time; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(until_time),UPDATE(until_time) ON TABLE dispatch.calendar_exclusions TO dispatch_admin;


--
-- Name: TABLE calendars; Type: ACL; Schema: dispatch; Owner: -
--

GRANT SELECT ON TABLE dispatch.calendars TO dispatch_reader;
GRANT DELETE ON TABLE dispatch.calendars TO dispatch_admin;


--
-- Name: COLUMN calendars.project_id; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(project_id),UPDATE(project_id) ON TABLE dispatch.calendars TO dispatch_admin;


--
-- Name: COLUMN calendars.name; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(name),UPDATE(name) ON TABLE dispatch.calendars TO dispatch_admin;


--
-- Name: COLUMN calendars.timezone; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(timezone),UPDATE(timezone) ON TABLE dispatch.calendars TO dispatch_admin;


--
-- Name: COLUMN calendars.description; Type: ACL; Schema: dispatch; Owner: -
--

GRANT INSERT(description),UPDATE(description) ON TABLE dispatch.calendars TO dispatch_admin;


--
-- Name: TABLE event_deliveries; Type: ACL; Schema: dispatch; Owner: -
--

GRANT SELECT ON TABLE dispatch.event_deliveries TO dispatch_reader;


--
-- Name: TABLE listeners; Type: ACL; Schema: dispatch; Owner: -
--

GRANT SELECT ON TABLE dispatch.listeners TO dispatch_reader;


--
-- Name: TABLE migrations; Type: ACL; Schema: dispatch; Owner: -
--

GRANT SELECT ON TABLE dispatch.migrations TO dispatch_reader;


--
-- Name: TABLE projects; Type: ACL; Schema: dispatch; Owner: -
--

GRANT SELECT ON TABLE dispatch.projects TO dispatch_reader;
GRANT INSERT,DELETE,UPDATE ON TABLE dispatch.projects TO dispatch_admin;


--
-- Name: TABLE recent_failures; Type: ACL; Schema: dispatch; Owner: -
--

GRANT SELECT ON TABLE dispatch.recent_failures TO dispatch_reader;


--
-- Name: TABLE schedule_status; Type: ACL; Schema: dispatch; Owner: -
--

GRANT SELECT ON TABLE dispatch.schedule_status TO dispatch_reader;


--
-- Name: TABLE settings; Type: ACL; Schema: dispatch; Owner: -
--

GRANT SELECT ON TABLE dispatch.settings TO dispatch_reader;
GRANT UPDATE ON TABLE dispatch.settings TO dispatch_admin;


--
-- Name: TABLE timezones; Type: ACL; Schema: dispatch; Owner: -
--

GRANT SELECT ON TABLE dispatch.timezones TO dispatch_reader;


--
-- PostgreSQL database dump complete
--

