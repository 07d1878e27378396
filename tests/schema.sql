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
	real_time boolean
);


--
-- Name: TYPE cron_spec; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON TYPE dispatch.cron_spec IS 'A parsed cron expression (dispatch.cron_parse). Stored on each schedule so that evaluation never re-parses.';


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
        x := dispatch._next_bit(dispatch._cron_days(spec, y, mo), d);
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
    CONSTRAINT runs_attempt_check CHECK ((attempt >= 0)),
    CONSTRAINT runs_error_length_check CHECK ((length(error) <= 500)),
    CONSTRAINT runs_finished_at_check CHECK (((status = ANY (ARRAY['pending'::text, 'running'::text])) = (finished_at IS NULL))),
    CONSTRAINT runs_running_has_lease_check CHECK (((status <> 'running'::text) OR ((worker IS NOT NULL) AND (lease_until > claimed_at)))),
    CONSTRAINT runs_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'running'::text, 'ok'::text, 'error'::text, 'skipped'::text, 'lost'::text])))
)
WITH (autovacuum_vacuum_scale_factor='0.01', autovacuum_vacuum_insert_scale_factor='0.01', autovacuum_analyze_scale_factor='0.02', fillfactor='50');


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

COMMENT ON COLUMN dispatch.runs.status IS 'pending: marked by dispatch.tick, or handed back (release_runs, expired lease). running: claimed by dispatch.claim_runs. ok/error: recorded by dispatch.complete_run. skipped: its schedule was disabled or deleted before it was invoked. lost: its lease expired on the last attempt.';


--
-- Name: COLUMN runs.request_id; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.runs.request_id IS 'sched_<uuid>, sent as X-Request-Id and Idempotency-Key; stable across the attempts of this run.';


--
-- Name: COLUMN runs.attempt; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.runs.attempt IS 'Claims so far; a claim increments it, release_runs gives one back.';


--
-- Name: COLUMN runs.worker; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.runs.worker IS 'Listener that holds (or last held) the run; only it may complete the run.';


--
-- Name: COLUMN runs.lease_until; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.runs.lease_until IS 'A running run whose lease passes is retried or lost by dispatch.tick.';


--
-- Name: COLUMN runs.error; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.runs.error IS 'Why the run failed, was skipped or lost; at most 500 characters.';


--
-- Name: _finish_batch(dispatch.runs[], boolean); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._finish_batch(finished dispatch.runs[], guarded boolean) RETURNS TABLE(run_id bigint, advanced boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN QUERY
    WITH done AS (
        SELECT * FROM unnest(_finish_batch.finished)
    ), locked AS MATERIALIZED (
        -- lock the schedules in id order (no deadlock with another batch or a bulk edit)
        SELECT s.id, s.project_id, s.function_name, s.next_run_at, s.cron_spec, s.timezone
        FROM dispatch.schedules s
        WHERE s.id IN (SELECT d.schedule_id FROM done d)
        ORDER BY s.id
        FOR NO KEY UPDATE
    ), waiting AS MATERIALIZED (
        -- a schedule still waiting on its run's slot (a user edit mid-flight wins) advances to
        -- the first slot after max(slot, now)
        SELECT d.schedule_id, l.cron_spec, l.timezone, greatest(d.scheduled_for, now()) AS after
        FROM done d
        JOIN locked l ON l.id = d.schedule_id
        WHERE l.next_run_at = d.scheduled_for
    ), slots AS MATERIALIZED (
        -- runs finishing together mostly share their expression, zone and start: compute each
        -- once (MATERIALIZED, or PostgreSQL would inline the call back into every row)
        SELECT u.cron_spec, u.timezone, u.after,
               CASE WHEN _finish_batch.guarded
                    THEN dispatch._next_slot(u.cron_spec, u.after, u.timezone)
                    ELSE dispatch.cron_spec_next(u.cron_spec, u.after, u.timezone)
               END AS next_at
        FROM (SELECT DISTINCT w.cron_spec, w.timezone, w.after FROM waiting w) u
    ), nexts AS MATERIALIZED (
        SELECT d.id, d.schedule_id, d.status, d.error, d.request_id, d.scheduled_for, d.attempt,
               coalesce(d.claimed_at, d.finished_at) AS ran_at, l.project_id, l.function_name,
               w.schedule_id IS NOT NULL AS waiting, s.next_at
        FROM done d
        JOIN locked l ON l.id = d.schedule_id
        LEFT JOIN waiting w ON w.schedule_id = d.schedule_id
        LEFT JOIN slots s ON s.cron_spec = w.cron_spec AND s.timezone = w.timezone AND s.after = w.after
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
    SELECT n.id, n.waiting FROM nexts n;
END
$$;


--
-- Name: _next_bit(bigint, integer); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._next_bit(mask bigint, k integer) RETURNS integer
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
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
-- Name: _prune_audit(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._prune_audit() RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n bigint;
BEGIN
    DELETE FROM dispatch.audit_log
    WHERE id IN (SELECT a.id FROM dispatch.audit_log a, dispatch.settings cfg
                 WHERE a.at < now() - cfg.audit_retention
                 LIMIT (SELECT prune_batch_size FROM dispatch.settings));
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;


--
-- Name: _prune_runs(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._prune_runs() RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n bigint;
BEGIN
    -- finished_at >= created_at, so the BRIN bound only narrows the scan
    DELETE FROM dispatch.runs
    WHERE id IN (SELECT r.id FROM dispatch.runs r, dispatch.settings cfg
                 WHERE r.created_at < now() - cfg.runs_retention
                   AND r.finished_at < now() - cfg.runs_retention
                 LIMIT (SELECT prune_batch_size FROM dispatch.settings));
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;


--
-- Name: _runs_finished(dispatch.runs[]); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._runs_finished(finished dispatch.runs[]) RETURNS TABLE(run_id bigint, advanced boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    ids bigint[];
    advances boolean[];
BEGIN
    -- Collected into arrays inside the block, returned after it: rows a failed attempt had
    -- already returned would otherwise stay in the result.
    BEGIN
        SELECT array_agg(f.run_id), array_agg(f.advanced) INTO ids, advances
        FROM dispatch._finish_batch(_runs_finished.finished, false) f;
    EXCEPTION WHEN OTHERS THEN
        SELECT array_agg(f.run_id), array_agg(f.advanced) INTO ids, advances
        FROM dispatch._finish_batch(_runs_finished.finished, true) f;
    END;
    RETURN QUERY SELECT * FROM unnest(ids, advances);
END
$$;


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
    ELSE
        action := 'schedule.update';
        SELECT jsonb_object_agg(n.key, n.value) INTO changed
        FROM jsonb_each(to_jsonb(NEW)) n
        JOIN jsonb_each(to_jsonb(OLD)) o USING (key)
        WHERE n.key IN ('project_id', 'function_name', 'cron_expression', 'timezone', 'args', 'enabled', 'deleted_at')
          AND n.value IS DISTINCT FROM o.value;
    END IF;
    INSERT INTO dispatch.audit_log (actor_id, project_id, action, metadata)
    VALUES (session_user, NEW.project_id, action,
            jsonb_strip_nulls(jsonb_build_object(
                'scheduleId', NEW.id,
                'functionName', NEW.function_name,
                'cronExpression', NEW.cron_expression,
                'timezone', NEW.timezone,
                'changed', changed)));
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
BEGIN
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
    NEW.cron_spec := dispatch.cron_parse(NEW.cron_expression);
    IF NEW.cron_spec IS NULL THEN
        RAISE EXCEPTION 'cron_expression must not be null' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM dispatch.check_timezone(NEW.timezone);

    IF NOT NEW.enabled OR NEW.deleted_at IS NOT NULL THEN
        NEW.next_run_at := NULL;
    ELSIF TG_OP = 'INSERT'
          OR NOT OLD.enabled OR OLD.deleted_at IS NOT NULL
          OR NEW.cron_expression IS DISTINCT FROM OLD.cron_expression
          OR NEW.timezone IS DISTINCT FROM OLD.timezone THEN
        NEW.next_run_at := dispatch.cron_spec_next(NEW.cron_spec, now(), NEW.timezone);
    END IF;
    IF TG_OP = 'UPDATE' THEN
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END
$_$;


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
-- Name: _schedule_skip_pending(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch._schedule_skip_pending() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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
-- Name: check_timezone(text); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.check_timezone(tz text) RETURNS text
    LANGUAGE plpgsql STABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF tz IS NULL THEN
        RAISE EXCEPTION 'timezone must not be null' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM dispatch.timezones WHERE name = tz)
       OR (length(tz) <= 64 AND tz IN (SELECT dispatch._timezone_names())) THEN
        RETURN tz;
    END IF;
    RAISE EXCEPTION USING
        ERRCODE = 'invalid_parameter_value',
        MESSAGE = format('timezone "%s" is not a time zone name from the tz database',
                         CASE WHEN length(tz) > 80 THEN left(tz, 80) || '...' ELSE tz END),
        HINT = 'Use an IANA name such as Europe/Berlin or UTC (see pg_timezone_names); abbreviations such as CEST and offsets such as +05 are refused.';
END
$$;


--
-- Name: FUNCTION check_timezone(tz text); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.check_timezone(tz text) IS 'Return tz when it is a name from the tz database (pg_timezone_names); raise SQLSTATE 22023 otherwise.';


--
-- Name: claim_runs(text, integer, interval); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.claim_runs(worker text, max_runs integer, lease interval DEFAULT '00:01:00'::interval) RETURNS TABLE(run_id bigint, schedule_id uuid, project_id text, function_name text, args jsonb, request_id text, scheduled_for timestamp with time zone, attempt integer, lease_until timestamp with time zone)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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


--
-- Name: FUNCTION claim_runs(worker text, max_runs integer, lease interval); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.claim_runs(worker text, max_runs integer, lease interval) IS 'Move up to max_runs pending runs, oldest slot first, to running for worker with a lease (FOR UPDATE SKIP LOCKED: concurrent callers never get the same run) and return what is needed to invoke them. The lease must outlast the invocation timeout.';


--
-- Name: complete_run(bigint, text, text, text, integer, integer, boolean, boolean); Type: PROCEDURE; Schema: dispatch; Owner: -
--

CREATE PROCEDURE dispatch.complete_run(IN run_id bigint, IN worker text, IN status text, IN error text DEFAULT NULL::text, IN http_status integer DEFAULT NULL::integer, IN duration_ms integer DEFAULT NULL::integer, INOUT recorded boolean DEFAULT NULL::boolean, INOUT advanced boolean DEFAULT NULL::boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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


--
-- Name: PROCEDURE complete_run(IN run_id bigint, IN worker text, IN status text, IN error text, IN http_status integer, IN duration_ms integer, INOUT recorded boolean, INOUT advanced boolean); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON PROCEDURE dispatch.complete_run(IN run_id bigint, IN worker text, IN status text, IN error text, IN http_status integer, IN duration_ms integer, INOUT recorded boolean, INOUT advanced boolean) IS 'Record the outcome (ok or error; error cut to 500 characters) of a run that worker still holds, advance its schedule to the first slot after max(scheduled_for, now()) if next_run_at still equals scheduled_for, and write the audit row, in one transaction. Returns recorded (false when the worker no longer holds the run) and advanced.';


--
-- Name: complete_runs(text, bigint[], text[], text[], integer[], integer[]); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.complete_runs(worker text, run_ids bigint[], statuses text[], errors text[], http_statuses integer[], durations_ms integer[]) RETURNS TABLE(run_id bigint, recorded boolean, advanced boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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


--
-- Name: FUNCTION complete_runs(worker text, run_ids bigint[], statuses text[], errors text[], http_statuses integer[], durations_ms integer[]); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.complete_runs(worker text, run_ids bigint[], statuses text[], errors text[], http_statuses integer[], durations_ms integer[]) IS 'dispatch.complete_run for many runs of one worker in one statement: record each outcome the worker still holds, advance each schedule still waiting on its slot, write the audit rows. The arrays are parallel (errors, http_statuses and durations_ms may hold NULLs). Returns run_id, recorded, advanced for each input run.';


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
                left(fields[1], 1) = '*' OR left(fields[2], 1) = '*');

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
    IF spec.real_time THEN
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
                    RETURN j;  -- same offset at both ends: no change in between
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
    END IF;

    -- Fixed time (Debian cron): once per matching wall-clock time; a time skipped by a
    -- spring-forward fires at the jump, a time repeated by a fall-back at its first occurrence.
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
        IF c > after THEN
            RETURN c;
        END IF;
        w := m + interval '1 minute';
    END LOOP;
END
$$;


--
-- Name: FUNCTION cron_spec_next(spec dispatch.cron_spec, after timestamp with time zone, tz text); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.cron_spec_next(spec dispatch.cron_spec, after timestamp with time zone, tz text) IS 'dispatch.cron_next for an already parsed expression: the earliest minute-aligned instant strictly after "after" that the spec matches in time zone tz.';


--
-- Name: expire_leases(); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.expire_leases() RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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


--
-- Name: FUNCTION expire_leases(); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.expire_leases() IS 'Hand running runs whose lease passed back to pending (same request_id), or end them lost after the schedule''s max_attempts (skipped if the schedule was disabled meanwhile). Returns how many went back to pending. Called by dispatch.tick.';


--
-- Name: next_due_after(timestamp with time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.next_due_after(covered timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN (SELECT min(next_run_at) FROM dispatch.schedules WHERE next_run_at > next_due_after.covered);
END
$$;


--
-- Name: FUNCTION next_due_after(covered timestamp with time zone); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.next_due_after(covered timestamp with time zone) IS 'The earliest next_run_at of a live schedule after "covered" (the instant a caller''s last dispatch.tick() marked up to: its now()). In the past when a slot came due since: tick at once. Schedules whose run is still open stay at their slot, at or before "covered", and are not answered again.';


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

COMMENT ON FUNCTION dispatch.next_due_at() IS 'The earliest future next_run_at of a live schedule: when a listener should next call dispatch.tick().';


--
-- Name: prune(bigint, bigint); Type: PROCEDURE; Schema: dispatch; Owner: -
--

CREATE PROCEDURE dispatch.prune(INOUT runs_deleted bigint DEFAULT 0, INOUT audit_deleted bigint DEFAULT 0)
    LANGUAGE plpgsql
    AS $$
DECLARE
    n bigint;
BEGIN
    LOOP
        n := dispatch._prune_runs();
        runs_deleted := runs_deleted OPERATOR(pg_catalog.+) n;
        COMMIT;
        EXIT WHEN n OPERATOR(pg_catalog.=) 0;
    END LOOP;
    LOOP
        n := dispatch._prune_audit();
        audit_deleted := audit_deleted OPERATOR(pg_catalog.+) n;
        COMMIT;
        EXIT WHEN n OPERATOR(pg_catalog.=) 0;
    END LOOP;
END
$$;


--
-- Name: PROCEDURE prune(INOUT runs_deleted bigint, INOUT audit_deleted bigint); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON PROCEDURE dispatch.prune(INOUT runs_deleted bigint, INOUT audit_deleted bigint) IS 'Delete finished runs and audit rows older than dispatch.settings'' retention, prune_batch_size rows per transaction; pending and running runs are kept. Run every 10 minutes by the pg_cron job dispatch-prune. Returns how many rows it deleted.';


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
    cron_db text := current_setting('cron.database_name', true);
    msg text;
BEGIN
    IF cron_db = current_database()
       AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron')
       AND (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        CREATE EXTENSION pg_cron;
    END IF;

    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron') THEN
        -- cron.schedule updates a job of the same name, so this is idempotent.
        EXECUTE $sql$SELECT cron.schedule('dispatch-tick', '* * * * *', 'SELECT dispatch.tick()')$sql$;
        EXECUTE $sql$SELECT cron.schedule('dispatch-prune', '*/10 * * * *', 'CALL dispatch.prune()')$sql$;
        msg := format('pg_cron jobs dispatch-tick (SELECT dispatch.tick() every minute) and dispatch-prune '
                      '(CALL dispatch.prune() every 10 minutes) registered in database %s', current_database());
    ELSIF cron_db = current_database() THEN
        msg := format('pg_cron is loaded for this database (%s) but the extension is not created: '
                      'as a superuser run CREATE EXTENSION pg_cron, then install again', cron_db);
    ELSIF cron_db IS NOT NULL THEN
        msg := format('pg_cron lives in database %s: register the jobs there with '
                      'psql -d %s -v dispatch_db=%s -f sql/pg_cron.sql', cron_db, cron_db, current_database());
    ELSE
        msg := 'pg_cron is not loaded (shared_preload_libraries): nothing calls dispatch.tick() every minute '
               'nor prunes old runs. Listeners still tick on their own timers; to add the safety net install '
               'postgresql-15-cron, add pg_cron to shared_preload_libraries, restart, and install again '
               '(or CALL dispatch.prune() from another scheduler).';
    END IF;
    RAISE NOTICE '%', msg;
    RETURN msg;
END
$_$;


--
-- Name: FUNCTION register_cron_job(); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.register_cron_job() IS 'Register (or update) the pg_cron jobs dispatch-tick and dispatch-prune when pg_cron is installed in this database; otherwise say what to do. Returns what it did.';


--
-- Name: release_runs(text, bigint[]); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.release_runs(worker text, run_ids bigint[]) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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


--
-- Name: FUNCTION release_runs(worker text, run_ids bigint[]); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.release_runs(worker text, run_ids bigint[]) IS 'Hand runs that worker claimed but never invoked back to pending, giving back the attempt; returns how many. Used by a listener that shuts down.';


--
-- Name: tick(timestamp with time zone); Type: FUNCTION; Schema: dispatch; Owner: -
--

CREATE FUNCTION dispatch.tick(now timestamp with time zone DEFAULT now()) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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


--
-- Name: FUNCTION tick(now timestamp with time zone); Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON FUNCTION dispatch.tick(now timestamp with time zone) IS 'Mark every live schedule due at or before "now" as a pending run (idempotent per slot), expire leases by the real clock, NOTIFY dispatch when there is work. Returns how many runs it marked. Run every minute by the pg_cron job dispatch-tick and by listeners when a slot comes due.';


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
);


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
    (a.query ~~ 'LISTEN%'::text) AS listening
   FROM pg_stat_activity a
  WHERE ((a.datname = current_database()) AND (a.application_name ~~ 'pgdispatch%'::text));


--
-- Name: VIEW listeners; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON VIEW dispatch.listeners IS 'Listener connections to this database, found by application_name ''pgdispatch <worker id>''; listening marks each one''s LISTEN session.';


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
-- Name: schedules; Type: TABLE; Schema: dispatch; Owner: -
--

CREATE TABLE dispatch.schedules (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    project_id text NOT NULL,
    function_name text NOT NULL,
    cron_expression text NOT NULL,
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
    CONSTRAINT schedules_args_check CHECK ((jsonb_typeof(args) = 'object'::text)),
    CONSTRAINT schedules_last_status_check CHECK ((last_status = ANY (ARRAY['ok'::text, 'error'::text, 'skipped'::text, 'lost'::text]))),
    CONSTRAINT schedules_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 10))),
    CONSTRAINT schedules_next_run_at_live_check CHECK (((next_run_at IS NULL) OR (enabled AND (deleted_at IS NULL)))),
    CONSTRAINT schedules_project_id_check CHECK (((project_id ~ '^[^[:space:][:cntrl:]/]{1,200}$'::text) AND (project_id !~ '^[.]{1,2}$'::text)))
)
WITH (fillfactor='80');


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

COMMENT ON COLUMN dispatch.schedules.next_run_at IS 'Next slot to fire; NULL when disabled or deleted. Stays on a slot while its run is pending or running; dispatch.complete_run advances it.';


--
-- Name: COLUMN schedules.last_status; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.last_status IS 'Status of the latest finished run: ok, error, skipped or lost.';


--
-- Name: COLUMN schedules.max_attempts; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.max_attempts IS 'Claims a run may take before an expired lease makes it lost.';


--
-- Name: COLUMN schedules.cron_spec; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.cron_spec IS 'cron_expression parsed by the write trigger (dispatch.cron_parse).';


--
-- Name: COLUMN schedules.updated_at; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON COLUMN dispatch.schedules.updated_at IS 'Last change to the definition (not to next_run_at or last_*).';


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
    (s.enabled AND (s.deleted_at IS NULL)) AS live,
    s.next_run_at,
    s.last_run_at,
    s.last_status,
    s.last_error,
    open.status AS current_run_status,
    COALESCE(fails.n, (0)::bigint) AS consecutive_failures,
        CASE
            WHEN (s.next_run_at < now()) THEN (now() - s.next_run_at)
            ELSE NULL::interval
        END AS overdue_by
   FROM ((dispatch.schedules s
     LEFT JOIN LATERAL ( SELECT r.status
           FROM dispatch.runs r
          WHERE ((r.schedule_id = s.id) AND (r.status = ANY (ARRAY['pending'::text, 'running'::text])))) open ON (true))
     LEFT JOIN LATERAL ( SELECT count(*) AS n
           FROM dispatch.runs r
          WHERE ((r.schedule_id = s.id) AND (r.status = ANY (ARRAY['error'::text, 'lost'::text])) AND (r.scheduled_for > COALESCE(( SELECT max(ok.scheduled_for) AS max
                   FROM dispatch.runs ok
                  WHERE ((ok.schedule_id = s.id) AND (ok.status = 'ok'::text))), '-infinity'::timestamp with time zone)))) fails ON (true))
  WHERE (s.deleted_at IS NULL);


--
-- Name: VIEW schedule_status; Type: COMMENT; Schema: dispatch; Owner: -
--

COMMENT ON VIEW dispatch.schedule_status IS 'One row per schedule that is not deleted: next and last run, the run in flight if any, failures since the last ok run, and how long it is overdue (next_run_at in the past: due, and late if more than a minute or so).';


--
-- Name: settings; Type: TABLE; Schema: dispatch; Owner: -
--

CREATE TABLE dispatch.settings (
    singleton boolean DEFAULT true NOT NULL,
    runs_retention interval DEFAULT '14 days'::interval NOT NULL,
    audit_retention interval DEFAULT '90 days'::interval NOT NULL,
    prune_batch_size integer DEFAULT 5000 NOT NULL,
    CONSTRAINT settings_audit_retention_check CHECK ((audit_retention >= '01:00:00'::interval)),
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
-- Name: audit_log_project_id_at_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX audit_log_project_id_at_idx ON dispatch.audit_log USING btree (project_id, at);


--
-- Name: runs_created_at_brin_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX runs_created_at_brin_idx ON dispatch.runs USING brin (created_at);


--
-- Name: runs_one_open_per_schedule_key; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE UNIQUE INDEX runs_one_open_per_schedule_key ON dispatch.runs USING btree (schedule_id) WHERE (status = ANY (ARRAY['pending'::text, 'running'::text]));


--
-- Name: runs_pending_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX runs_pending_idx ON dispatch.runs USING btree (scheduled_for, id) WHERE (status = 'pending'::text);


--
-- Name: runs_running_lease_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX runs_running_lease_idx ON dispatch.runs USING btree (lease_until) WHERE (status = 'running'::text);


--
-- Name: schedules_next_run_at_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX schedules_next_run_at_idx ON dispatch.schedules USING btree (next_run_at) WHERE (next_run_at IS NOT NULL);


--
-- Name: schedules_project_id_idx; Type: INDEX; Schema: dispatch; Owner: -
--

CREATE INDEX schedules_project_id_idx ON dispatch.schedules USING btree (project_id);


--
-- Name: schedules _100_validate_insert; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _100_validate_insert BEFORE INSERT ON dispatch.schedules FOR EACH ROW EXECUTE FUNCTION dispatch._schedule_before_write();


--
-- Name: schedules _100_validate_update; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _100_validate_update BEFORE UPDATE OF project_id, function_name, cron_expression, timezone, args, enabled, deleted_at ON dispatch.schedules FOR EACH ROW EXECUTE FUNCTION dispatch._schedule_before_write();


--
-- Name: schedules _200_skip_pending; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _200_skip_pending AFTER UPDATE OF enabled, deleted_at ON dispatch.schedules FOR EACH ROW WHEN (((new.next_run_at IS NULL) AND (old.next_run_at IS NOT NULL))) EXECUTE FUNCTION dispatch._schedule_skip_pending();


--
-- Name: schedules _800_audit_insert; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _800_audit_insert AFTER INSERT ON dispatch.schedules FOR EACH ROW EXECUTE FUNCTION dispatch._schedule_audit();


--
-- Name: schedules _800_audit_update; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _800_audit_update AFTER UPDATE ON dispatch.schedules FOR EACH ROW WHEN (((old.project_id IS DISTINCT FROM new.project_id) OR (old.function_name IS DISTINCT FROM new.function_name) OR (old.cron_expression IS DISTINCT FROM new.cron_expression) OR (old.timezone IS DISTINCT FROM new.timezone) OR (old.args IS DISTINCT FROM new.args) OR (old.enabled IS DISTINCT FROM new.enabled) OR (old.deleted_at IS DISTINCT FROM new.deleted_at))) EXECUTE FUNCTION dispatch._schedule_audit();


--
-- Name: schedules _900_notify; Type: TRIGGER; Schema: dispatch; Owner: -
--

CREATE TRIGGER _900_notify AFTER INSERT OR UPDATE OF enabled, deleted_at, cron_expression, timezone ON dispatch.schedules FOR EACH STATEMENT EXECUTE FUNCTION dispatch._schedule_notify();


--
-- Name: runs runs_schedule_id_fkey; Type: FK CONSTRAINT; Schema: dispatch; Owner: -
--

ALTER TABLE ONLY dispatch.runs
    ADD CONSTRAINT runs_schedule_id_fkey FOREIGN KEY (schedule_id) REFERENCES dispatch.schedules(id) ON DELETE CASCADE;


--
-- Name: SCHEMA dispatch; Type: ACL; Schema: -; Owner: -
--

GRANT USAGE ON SCHEMA dispatch TO dispatch_listener;
GRANT USAGE ON SCHEMA dispatch TO dispatch_reader;
GRANT USAGE ON SCHEMA dispatch TO dispatch_admin;


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
-- Name: FUNCTION _cron_match_from(spec dispatch.cron_spec, t timestamp without time zone); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._cron_match_from(spec dispatch.cron_spec, t timestamp without time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._cron_match_from(spec dispatch.cron_spec, t timestamp without time zone) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch._cron_match_from(spec dispatch.cron_spec, t timestamp without time zone) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch._cron_match_from(spec dispatch.cron_spec, t timestamp without time zone) TO dispatch_admin;


--
-- Name: FUNCTION _cron_value(expr text, field text, tok text, lo integer, hi integer); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._cron_value(expr text, field text, tok text, lo integer, hi integer) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._cron_value(expr text, field text, tok text, lo integer, hi integer) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch._cron_value(expr text, field text, tok text, lo integer, hi integer) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch._cron_value(expr text, field text, tok text, lo integer, hi integer) TO dispatch_admin;


--
-- Name: TABLE runs; Type: ACL; Schema: dispatch; Owner: -
--

GRANT SELECT ON TABLE dispatch.runs TO dispatch_reader;


--
-- Name: FUNCTION _finish_batch(finished dispatch.runs[], guarded boolean); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._finish_batch(finished dispatch.runs[], guarded boolean) FROM PUBLIC;


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
-- Name: FUNCTION _prune_audit(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._prune_audit() FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._prune_audit() TO dispatch_admin;


--
-- Name: FUNCTION _prune_runs(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._prune_runs() FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch._prune_runs() TO dispatch_admin;


--
-- Name: FUNCTION _runs_finished(finished dispatch.runs[]); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._runs_finished(finished dispatch.runs[]) FROM PUBLIC;


--
-- Name: FUNCTION _schedule_audit(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._schedule_audit() FROM PUBLIC;


--
-- Name: FUNCTION _schedule_before_write(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._schedule_before_write() FROM PUBLIC;


--
-- Name: FUNCTION _schedule_notify(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._schedule_notify() FROM PUBLIC;


--
-- Name: FUNCTION _schedule_skip_pending(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch._schedule_skip_pending() FROM PUBLIC;


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
-- Name: FUNCTION check_timezone(tz text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.check_timezone(tz text) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.check_timezone(tz text) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch.check_timezone(tz text) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch.check_timezone(tz text) TO dispatch_admin;


--
-- Name: FUNCTION claim_runs(worker text, max_runs integer, lease interval); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.claim_runs(worker text, max_runs integer, lease interval) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.claim_runs(worker text, max_runs integer, lease interval) TO dispatch_listener;


--
-- Name: PROCEDURE complete_run(IN run_id bigint, IN worker text, IN status text, IN error text, IN http_status integer, IN duration_ms integer, INOUT recorded boolean, INOUT advanced boolean); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON PROCEDURE dispatch.complete_run(IN run_id bigint, IN worker text, IN status text, IN error text, IN http_status integer, IN duration_ms integer, INOUT recorded boolean, INOUT advanced boolean) FROM PUBLIC;
GRANT ALL ON PROCEDURE dispatch.complete_run(IN run_id bigint, IN worker text, IN status text, IN error text, IN http_status integer, IN duration_ms integer, INOUT recorded boolean, INOUT advanced boolean) TO dispatch_listener;


--
-- Name: FUNCTION complete_runs(worker text, run_ids bigint[], statuses text[], errors text[], http_statuses integer[], durations_ms integer[]); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.complete_runs(worker text, run_ids bigint[], statuses text[], errors text[], http_statuses integer[], durations_ms integer[]) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.complete_runs(worker text, run_ids bigint[], statuses text[], errors text[], http_statuses integer[], durations_ms integer[]) TO dispatch_listener;


--
-- Name: FUNCTION cron_is_valid(expr text); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.cron_is_valid(expr text) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.cron_is_valid(expr text) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch.cron_is_valid(expr text) TO dispatch_reader;
GRANT ALL ON FUNCTION dispatch.cron_is_valid(expr text) TO dispatch_admin;


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
-- Name: FUNCTION expire_leases(); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.expire_leases() FROM PUBLIC;


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
-- Name: FUNCTION release_runs(worker text, run_ids bigint[]); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.release_runs(worker text, run_ids bigint[]) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.release_runs(worker text, run_ids bigint[]) TO dispatch_listener;


--
-- Name: FUNCTION tick(now timestamp with time zone); Type: ACL; Schema: dispatch; Owner: -
--

REVOKE ALL ON FUNCTION dispatch.tick(now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION dispatch.tick(now timestamp with time zone) TO dispatch_listener;
GRANT ALL ON FUNCTION dispatch.tick(now timestamp with time zone) TO dispatch_admin;


--
-- Name: TABLE audit_log; Type: ACL; Schema: dispatch; Owner: -
--

GRANT SELECT ON TABLE dispatch.audit_log TO dispatch_reader;


--
-- Name: TABLE listeners; Type: ACL; Schema: dispatch; Owner: -
--

GRANT SELECT ON TABLE dispatch.listeners TO dispatch_reader;


--
-- Name: TABLE migrations; Type: ACL; Schema: dispatch; Owner: -
--

GRANT SELECT ON TABLE dispatch.migrations TO dispatch_reader;


--
-- Name: TABLE schedules; Type: ACL; Schema: dispatch; Owner: -
--

GRANT SELECT ON TABLE dispatch.schedules TO dispatch_reader;
GRANT INSERT,DELETE,UPDATE ON TABLE dispatch.schedules TO dispatch_admin;


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

