-- The write path of dispatch.schedules: every INSERT, UPDATE and DELETE, psql's included, goes
-- through these triggers. Their names sort in firing order.
--
--   _050_soft_delete      BEFORE DELETE: a hard delete becomes the soft delete (invariant 4)
--   _100_validate_*       BEFORE INSERT/UPDATE: validate the definition, derive cron_spec and
--                         next_run_at (invariant 2)
--   _150_ended            BEFORE UPDATE of next_run_at to 'infinity' (past a bounded rule's last
--                         slot): the schedule ends
--   _200_end_pending      AFTER UPDATE that stops the schedule: its pending runs end
--   _210_unbuffer         AFTER UPDATE of overlap away from buffer_one: the buffered run
--   _800_audit_*          AFTER: one audit row per definition change
--   _810_audit_ended      AFTER: one audit row when a schedule ends
--   _900_notify           AFTER, per statement: listeners re-plan their clocks

-- A write refused: SQLSTATE 22023 with the problem (which names the field) and a hint; nothing
-- when problem is NULL.
CREATE OR REPLACE FUNCTION dispatch._refuse(problem text, hint text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF problem IS NOT NULL AND hint IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = problem, HINT = hint;
    ELSIF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = problem;
    END IF;
END
$$;
COMMENT ON FUNCTION dispatch._refuse(text, text) IS
    'Raise 22023 with problem as the message and hint as the hint, when problem is not NULL.';

-- A schedule's calendar is its project's own or a shared one.
CREATE OR REPLACE FUNCTION dispatch._check_calendar(project_id text, calendar_id bigint)
RETURNS void
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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

-- The run policies, checked with a message that names the field (the CHECK constraints of
-- 0012_run_policies.sql stay as the last line of defence, with only their names to offer).
CREATE OR REPLACE FUNCTION dispatch._check_policies(s dispatch.schedules)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
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

-- The bounds of a schedule (run_at, starts_at, ends_at, max_runs), checked with a message that
-- names the field; `was` is the row before an UPDATE (NULL on INSERT).
CREATE OR REPLACE FUNCTION dispatch._check_bounds(s dispatch.schedules, was dispatch.schedules)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
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

-- Which bound a schedule's last slot came from: what ended_reason says.
CREATE OR REPLACE FUNCTION dispatch._ended_reason(s dispatch.schedules)
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
        WHEN s.run_at IS NOT NULL THEN format('a one-shot: its slot (run_at %s) is past', s.run_at)
        WHEN s.max_runs IS NOT NULL AND (s.cron_spec).ends_at IS DISTINCT FROM s.ends_at
            THEN format('its %s slots from %s (max_runs, starts_at) are past', s.max_runs, s.starts_at)
        ELSE format('its slots up to ends_at %s are past', s.ends_at) END
$$;

-- A schedule whose rule has no slot left ends: no next slot, when and why (its audit row:
-- dispatch._schedule_audit_ended). Ended already, it keeps when it ended.
CREATE OR REPLACE FUNCTION dispatch._end_schedule(s dispatch.schedules)
RETURNS dispatch.schedules
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    s.next_run_at := NULL;
    s.backoff_reason := NULL;
    s.ended_at := coalesce(s.ended_at, now());
    s.ended_reason := dispatch._ended_reason(s);
    RETURN s;
END
$$;
COMMENT ON FUNCTION dispatch._end_schedule(dispatch.schedules) IS
    'The schedule row s as ended: no next_run_at, ended_at (kept if set) and ended_reason.';

-- One audit row schedule.ended when a schedule ends: with the editor as the actor when an edit
-- of its definition ended it (the write trigger moved updated_at), NULL when the system did on
-- its last slot.
CREATE OR REPLACE FUNCTION dispatch._schedule_audit_ended()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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

CREATE OR REPLACE TRIGGER _810_audit_ended AFTER UPDATE ON dispatch.schedules
    FOR EACH ROW WHEN (NEW.ended_at IS NOT NULL AND NEW.ended_at IS DISTINCT FROM OLD.ended_at)
    EXECUTE FUNCTION dispatch._schedule_audit_ended();

-- The system's own writes of next_run_at (tick, completion) put 'infinity' there past a bounded
-- rule's last slot (dispatch.cron_spec_next): the schedule ends then.
CREATE OR REPLACE FUNCTION dispatch._schedule_ended()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN dispatch._end_schedule(NEW);
END
$$;

CREATE OR REPLACE TRIGGER _150_ended BEFORE UPDATE OF next_run_at ON dispatch.schedules
    FOR EACH ROW WHEN (NEW.next_run_at = 'infinity')
    EXECUTE FUNCTION dispatch._schedule_ended();

-- The shortest time between two consecutive slots of a rule, by the wall clock: the interval of
-- an interval schedule; for a cron expression, from its minute and hour sets (two minutes of an
-- hour, the last minute of one matching hour and the first of the next, across midnight), at
-- most a day. What a jitter may not exceed, so that no slot fires after the next one is due. For
-- an expression whose matching days are never consecutive it can be shorter than the real one:
-- the jitter it allows is then smaller than it could be, never larger.
CREATE OR REPLACE FUNCTION dispatch._slot_spacing(spec dispatch.cron_spec)
RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
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

CREATE OR REPLACE FUNCTION dispatch._schedule_before_write()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
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
$$;

-- Only definition changes go through validation and audit; the dispatcher's own updates
-- (next_run_at, last_*) do not. cron_spec is listed so that a direct write to it is re-derived.
CREATE OR REPLACE TRIGGER _100_validate_insert BEFORE INSERT ON dispatch.schedules
    FOR EACH ROW EXECUTE FUNCTION dispatch._schedule_before_write();
CREATE OR REPLACE TRIGGER _100_validate_update
    BEFORE UPDATE OF project_id, function_name, cron_expression, timezone, args, enabled, deleted_at,
                     paused_at, cron_spec, max_attempts, retry_backoff, retry_backoff_max, timeout,
                     misfire_grace, catchup, overlap, every, anchor, jitter, run_at, starts_at, ends_at,
                     max_runs, pause_after_failures, traceparent, calendar_id
    ON dispatch.schedules
    FOR EACH ROW EXECUTE FUNCTION dispatch._schedule_before_write();

-- A hard DELETE would cascade away the schedule's runs, an open one included, with no audit
-- row. It becomes the soft delete instead: the UPDATE below goes through the triggers like any
-- other (pending runs end, audit row with the actor). SECURITY DEFINER so that a role allowed
-- to delete need not also be allowed to write deleted_at.
CREATE OR REPLACE FUNCTION dispatch._schedule_soft_delete()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE dispatch.schedules SET deleted_at = now() WHERE id = OLD.id AND deleted_at IS NULL;
    IF FOUND THEN
        RAISE NOTICE 'schedule % was soft-deleted (deleted_at set) instead: its runs and audit trail are kept', OLD.id;
    END IF;
    RETURN NULL;  -- the row stays
END
$$;

CREATE OR REPLACE TRIGGER _050_soft_delete BEFORE DELETE ON dispatch.schedules
    FOR EACH ROW EXECUTE FUNCTION dispatch._schedule_soft_delete();

-- A schedule that stops (disabled, paused or deleted) invokes nothing it had pending. One that
-- is live again (resumed, enabled) ends what it still has pending as its stop would have: a
-- claim handed back (release_runs, which waits on no one) while the stop was committing came
-- back to pending behind the stop's back, and must not go out now as a slot of before the stop.
CREATE OR REPLACE FUNCTION dispatch._schedule_end_pending()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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

-- (an ended schedule may still have runs pending: its last slot's under overlap allow, a
-- buffered one, manual and backfill runs)
CREATE OR REPLACE TRIGGER _200_end_pending AFTER UPDATE OF enabled, deleted_at, paused_at ON dispatch.schedules
    FOR EACH ROW
    WHEN (OLD.enabled AND OLD.deleted_at IS NULL AND OLD.paused_at IS NULL
          AND NOT (NEW.enabled AND NEW.deleted_at IS NULL AND NEW.paused_at IS NULL))
    EXECUTE FUNCTION dispatch._schedule_end_pending();

CREATE OR REPLACE TRIGGER _205_end_left_pending AFTER UPDATE OF enabled, paused_at ON dispatch.schedules
    FOR EACH ROW
    WHEN ((NOT OLD.enabled OR OLD.paused_at IS NOT NULL) AND NEW.enabled AND NEW.paused_at IS NULL
          AND NEW.deleted_at IS NULL)
    EXECUTE FUNCTION dispatch._schedule_end_pending();

-- A schedule that leaves overlap buffer_one while a run waits behind the open one: under allow
-- the waiting run starts now; under skip it ends skipped, since it would overlap.
CREATE OR REPLACE FUNCTION dispatch._schedule_unbuffer()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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

CREATE OR REPLACE TRIGGER _210_unbuffer AFTER UPDATE OF overlap ON dispatch.schedules
    FOR EACH ROW
    WHEN (OLD.overlap = 'buffer_one' AND NEW.overlap <> 'buffer_one')
    EXECUTE FUNCTION dispatch._schedule_unbuffer();

CREATE OR REPLACE FUNCTION dispatch._schedule_audit()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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

-- A schedule moved to another project takes its open runs along: they are claimed, counted
-- against max_concurrency and weighed as the new project's from the commit on. Finished runs
-- keep the project they ran for. (Waits for a claim in progress on one of them, like a stop.)
CREATE OR REPLACE FUNCTION dispatch._schedule_move_runs()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE dispatch.runs r SET project_id = NEW.project_id
    WHERE r.schedule_id = NEW.id AND r.status IN ('pending', 'running') AND r.project_id <> NEW.project_id;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION dispatch._schedule_move_runs() IS
    'Trigger: a schedule whose project_id changed takes its open runs (pending, running) to the new project.';

CREATE OR REPLACE TRIGGER _700_move_runs
    AFTER UPDATE OF project_id ON dispatch.schedules
    FOR EACH ROW WHEN (OLD.project_id IS DISTINCT FROM NEW.project_id)
    EXECUTE FUNCTION dispatch._schedule_move_runs();

CREATE OR REPLACE TRIGGER _800_audit_insert AFTER INSERT ON dispatch.schedules
    FOR EACH ROW EXECUTE FUNCTION dispatch._schedule_audit();
-- UPDATE OF: the dispatcher's own updates (next_run_at, last_*) do not fire it at all, so its
-- WHEN (which compares args, up to 4 MiB) is evaluated only when a definition was written.
CREATE OR REPLACE TRIGGER _800_audit_update
    AFTER UPDATE OF project_id, function_name, cron_expression, timezone, args, enabled, deleted_at,
                    paused_at, max_attempts, retry_backoff, retry_backoff_max, timeout, misfire_grace,
                    catchup, overlap, every, anchor, jitter, run_at, starts_at, ends_at, max_runs,
                    pause_after_failures, traceparent, calendar_id
    ON dispatch.schedules
    FOR EACH ROW
    WHEN (OLD.project_id IS DISTINCT FROM NEW.project_id
          OR OLD.function_name IS DISTINCT FROM NEW.function_name
          OR OLD.cron_expression IS DISTINCT FROM NEW.cron_expression
          OR OLD.timezone IS DISTINCT FROM NEW.timezone
          OR OLD.args IS DISTINCT FROM NEW.args
          OR OLD.enabled IS DISTINCT FROM NEW.enabled
          OR OLD.deleted_at IS DISTINCT FROM NEW.deleted_at
          OR OLD.paused_at IS DISTINCT FROM NEW.paused_at
          OR OLD.max_attempts IS DISTINCT FROM NEW.max_attempts
          OR OLD.retry_backoff IS DISTINCT FROM NEW.retry_backoff
          OR OLD.retry_backoff_max IS DISTINCT FROM NEW.retry_backoff_max
          OR OLD.timeout IS DISTINCT FROM NEW.timeout
          OR OLD.misfire_grace IS DISTINCT FROM NEW.misfire_grace
          OR OLD.catchup IS DISTINCT FROM NEW.catchup
          OR OLD.overlap IS DISTINCT FROM NEW.overlap
          OR OLD.every IS DISTINCT FROM NEW.every
          OR OLD.anchor IS DISTINCT FROM NEW.anchor
          OR OLD.jitter IS DISTINCT FROM NEW.jitter
          OR OLD.run_at IS DISTINCT FROM NEW.run_at
          OR OLD.starts_at IS DISTINCT FROM NEW.starts_at
          OR OLD.ends_at IS DISTINCT FROM NEW.ends_at
          OR OLD.max_runs IS DISTINCT FROM NEW.max_runs
          OR OLD.pause_after_failures IS DISTINCT FROM NEW.pause_after_failures
          OR OLD.traceparent IS DISTINCT FROM NEW.traceparent
          OR OLD.calendar_id IS DISTINCT FROM NEW.calendar_id)
    EXECUTE FUNCTION dispatch._schedule_audit();

-- Listeners keep a timer on the earliest next_run_at: a definition change may move it.
-- (Finishing a run moves it too, but the listener that finished it knows that already.)
CREATE OR REPLACE FUNCTION dispatch._schedule_notify()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_notify('dispatch', 'schedules');
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER _900_notify
    AFTER INSERT OR UPDATE OF enabled, deleted_at, paused_at, cron_expression, timezone, every, anchor, run_at,
                              starts_at, ends_at, max_runs
    ON dispatch.schedules
    FOR EACH STATEMENT EXECUTE FUNCTION dispatch._schedule_notify();
