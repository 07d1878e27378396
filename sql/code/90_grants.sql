-- Least privilege: three NOLOGIN group roles that a DBA grants to login roles, e.g.
--   CREATE ROLE dispatcher_host_1 LOGIN PASSWORD '…' IN ROLE dispatch_listener;
-- Roles belong to the cluster, so an install in a second database finds them already there.
-- Everything that writes dispatch tables on a role's behalf is a SECURITY DEFINER function
-- (owned by the installing role) with a pinned search_path; nothing else reaches the tables.
--
-- Applied last by every install, after every function was (re)created: what is granted is
-- exactly what this file says, whatever an earlier version or a DBA granted before.

DO $$
DECLARE
    r text;
    what text;
BEGIN
    FOR r, what IN SELECT v.r, v.what FROM (VALUES
        ('dispatch_listener', 'pgdispatch listeners: tick, claim, complete and release runs through dispatch functions; no direct table writes.'),
        ('dispatch_reader', 'pgdispatch read-only: SELECT on dispatch tables and views.'),
        ('dispatch_admin', 'pgdispatch administrators: write schedule definitions and dispatch.settings, pause and resume, prune; read everything.')
    ) AS v(r, what) LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) r) THEN
            EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', r);
        END IF;
        -- From PostgreSQL 16 on, CREATEROLE comments on a role only with ADMIN OPTION on it, which
        -- the role that created it has: another installer leaves a comment that is already right.
        IF pg_catalog.shobj_description((SELECT oid FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) r),
                                        'pg_authid') IS DISTINCT FROM what THEN
            BEGIN
                EXECUTE pg_catalog.format('COMMENT ON ROLE %I IS %L', r, what);
            EXCEPTION WHEN insufficient_privilege THEN
                RAISE NOTICE 'the comment on role % is left as it was: % has no ADMIN OPTION on it (PostgreSQL 16 '
                             'and later ask for it); an install by a superuser or by the role that created it '
                             'updates it', r, current_user;
            END;
        END IF;
    END LOOP;
END
$$;

REVOKE ALL ON SCHEMA dispatch FROM PUBLIC, dispatch_listener, dispatch_reader, dispatch_admin;
REVOKE ALL ON ALL TABLES IN SCHEMA dispatch FROM PUBLIC, dispatch_listener, dispatch_reader, dispatch_admin;
REVOKE ALL ON ALL ROUTINES IN SCHEMA dispatch FROM PUBLIC, dispatch_listener, dispatch_reader, dispatch_admin;
GRANT USAGE ON SCHEMA dispatch TO dispatch_listener, dispatch_reader, dispatch_admin;

-- The cron engine is pure computation: anyone with the schema may use it (the write trigger
-- runs it as whoever writes a schedule).
GRANT EXECUTE ON FUNCTION
    dispatch.cron_parse(text),
    dispatch.cron_spec_next(dispatch.cron_spec, timestamptz, text),
    dispatch.cron_next(text, timestamptz, text),
    dispatch.cron_is_valid(text),
    dispatch.check_timezone(text),
    dispatch._refuse(text, text),
    dispatch._check_policies(dispatch.schedules),
    dispatch._check_bounds(dispatch.schedules, dispatch.schedules),
    dispatch._check_traceparent(text, text),
    dispatch._check_calendar(text, bigint),
    dispatch._wall_instant(timestamp, text),
    dispatch.traceparent(text, integer, text),
    dispatch._ended_reason(dispatch.schedules),
    dispatch._slot_spacing(dispatch.cron_spec),
    dispatch._cron_error(text, text, text),
    dispatch._cron_value(text, text, text, integer, integer),
    dispatch._next_bit(bigint, integer),
    dispatch._cron_days(dispatch.cron_spec, integer, integer, integer),
    dispatch._cron_match_from(dispatch.cron_spec, timestamp),
    dispatch._tz_transition(timestamptz, timestamptz, text),
    dispatch._timezone_names(),
    dispatch.every_spec(interval, timestamptz),
    dispatch.bounded_spec(dispatch.cron_spec, timestamptz, timestamptz, integer, text),
    dispatch.once_spec(timestamptz),
    dispatch._every_slot(dispatch.cron_spec, numeric),
    dispatch._every_index(dispatch.cron_spec, timestamptz),
    dispatch.jitter_offset(uuid, timestamptz, interval),
    dispatch.cron_login_problem(text, text, text),
    dispatch.schema_version()
TO dispatch_listener, dispatch_reader, dispatch_admin;

GRANT EXECUTE ON FUNCTION
    dispatch.check_deadline(timestamptz, timestamptz),
    dispatch.tick(timestamptz),
    dispatch.tick_chunk(integer),
    dispatch.claim_runs(text, integer, interval, interval),
    dispatch.complete_runs(text, bigint[], integer[], text[], text[], integer[], integer[], boolean[], integer[]),
    dispatch.release_runs(text, bigint[], integer[]),
    dispatch.next_due_at(),
    dispatch.next_due_after(timestamptz),
    dispatch.next_slot_after(timestamptz),
    dispatch.next_start_after(timestamptz),
    dispatch.lost_runs_after(bigint),
    dispatch.skipped_slots_after(bigint),
    dispatch.breaker_states()
TO dispatch_listener;
GRANT EXECUTE ON FUNCTION dispatch.breaker_states() TO dispatch_reader;
GRANT EXECUTE ON PROCEDURE
    dispatch.complete_run(bigint, text, integer, text, text, integer, integer, boolean, integer, boolean, boolean,
                          boolean, timestamptz)
TO dispatch_listener;

GRANT SELECT ON ALL TABLES IN SCHEMA dispatch TO dispatch_reader;
-- "Why didn't it fire?" is a read-only question (dispatch_admin has it through dispatch_reader).
GRANT EXECUTE ON FUNCTION dispatch.explain(uuid, timestamptz) TO dispatch_reader;
GRANT EXECUTE ON FUNCTION
    dispatch.calendar_periods(bigint, timestamptz, timestamptz),
    dispatch.calendar_excludes(bigint, timestamptz),
    dispatch._calendar_period(bigint, timestamptz),
    dispatch._calendar_slot(dispatch.cron_spec, text, bigint, timestamptz)
TO dispatch_reader;
GRANT EXECUTE ON FUNCTION dispatch.run_trace(bigint) TO dispatch_reader;
GRANT EXECUTE ON FUNCTION
    dispatch.claim_event_deliveries(text, integer, interval),
    dispatch.finish_event_deliveries(text, bigint[], integer[], text[]),
    dispatch.next_event_delivery_at()
TO dispatch_listener;

-- An administrator writes the definition of a schedule, never what the system derives from it
-- (cron_spec, next_run_at, last_*, backoff_reason) nor the pause columns, which
-- dispatch.pause() and dispatch.resume() set with the actor (invariant 5). A DELETE becomes the
-- soft delete (invariant 4).
-- Granted once: from PostgreSQL 16 on, granting a role takes ADMIN OPTION on it, which only
-- the role that created it has (or a superuser), not every later installer with CREATEROLE.
DO $$
BEGIN
    IF NOT pg_catalog.pg_has_role('dispatch_admin', 'dispatch_reader', 'MEMBER') THEN
        GRANT dispatch_reader TO dispatch_admin;
    END IF;
END
$$;
GRANT INSERT (id, project_id, function_name, cron_expression, timezone, args, enabled, max_attempts, retry_backoff,
              retry_backoff_max, timeout, misfire_grace, catchup, overlap, every, anchor, jitter, run_at, starts_at,
              ends_at, max_runs, pause_after_failures, traceparent, calendar_id)
    ON dispatch.schedules TO dispatch_admin;
GRANT UPDATE (project_id, function_name, cron_expression, timezone, args, enabled, deleted_at, max_attempts,
              retry_backoff, retry_backoff_max, timeout, misfire_grace, catchup, overlap, every, anchor, jitter,
              run_at, starts_at, ends_at, max_runs, pause_after_failures, traceparent, calendar_id)
    ON dispatch.schedules TO dispatch_admin;
-- (the write trigger runs as the writer: an edit that leaves no slot ends the schedule)
GRANT EXECUTE ON FUNCTION dispatch._end_schedule(dispatch.schedules) TO dispatch_admin;
GRANT DELETE ON dispatch.schedules TO dispatch_admin;
GRANT UPDATE ON dispatch.settings TO dispatch_admin;
-- Per-project dispatch settings (max_concurrency, weight): rows an administrator writes.
GRANT INSERT, UPDATE, DELETE ON dispatch.projects TO dispatch_admin;
-- Calendars: written by an administrator (their triggers run as the writer), read by everyone
-- who reads schedules.
GRANT INSERT (project_id, name, timezone, description), UPDATE (project_id, name, timezone, description), DELETE
    ON dispatch.calendars TO dispatch_admin;
GRANT INSERT (calendar_id, label, starts, ends, days, from_time, until_time),
      UPDATE (label, starts, ends, days, from_time, until_time), DELETE
    ON dispatch.calendar_exclusions TO dispatch_admin;
GRANT EXECUTE ON FUNCTION
    dispatch.refresh_timezones(),
    dispatch._prune_runs(bigint, bigint),
    dispatch._prune_audit(bigint, bigint),
    dispatch._prune_event_deliveries(),
    dispatch.tick(timestamptz),
    dispatch.tick_chunk(integer),
    dispatch.next_due_at(),
    dispatch.next_due_after(timestamptz),
    dispatch.next_slot_after(timestamptz),
    dispatch.next_start_after(timestamptz),
    dispatch.pause(uuid, text),
    dispatch.resume(uuid),
    dispatch.run_now(uuid, text),
    dispatch.backfill(uuid, timestamptz, timestamptz),
    dispatch.reset_breaker(text, text)
TO dispatch_admin;
GRANT EXECUTE ON PROCEDURE dispatch.prune(bigint, bigint) TO dispatch_admin;
