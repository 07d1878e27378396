-- dispatch.explain: "why didn't it fire?" for one schedule, in rows a DBA reads at a psql prompt.
--
--   SELECT * FROM dispatch.explain('4f1c…');
--   SELECT * FROM dispatch.explain('4f1c…', since => now() - interval '7 days');
--
-- Every row is (section, item, at, run_id, detail): `item` is a word a program can match,
-- `detail` says the same in plain words, `at` is the instant the row is about.
--
--   state     one row: what the schedule does next, and why (the verdict, below)
--   open run  each pending or running run: what the next claim does with it
--   next      the next three slots that run, each with the instant it fires at (its jitter),
--             and the periods of the schedule's calendar that come before them
--   run       the last five finished runs, the latest slot first, with their outcomes
--   not run   the slots since `since` that did not run, with the reason: the recorded gaps
--             (audit schedule.slots.skipped) and the skipped runs, oldest first
--
-- The verdicts follow what dispatch.tick and dispatch.claim_runs decide, and are tested against
-- them (tests/test_stateful.py runs the next tick and claim after explain, then rolls back):
--
--   state:    deleted | paused | disabled | backed_off  -- stopped, or its zone is gone
--             busy | expired | pending | jitter_wait | retry_wait | missed | late | breaker |
--             capped | buffered
--                                                       -- a run is open (overlap skip,
--                                                       -- buffer_one): the open run's word
--             due        a slot is due and not marked: the next tick marks it (at: that slot)
--             excluded   its slot falls in a period of its calendar: the tick passes over the
--                        period's slots (a gap, calendar) to the first after it
--             missed     every due slot is beyond misfire_grace: the tick records them skipped
--             settling   its due slot already has a run: the tick moves it on
--             live       nothing to do before its next slot fires (at: that instant)
--   open run: running | expired (its lease ran out: the next tick hands it out again or ends it
--             lost) | pending (the next claim takes it) | jitter_wait | retry_wait (not
--             before `at`) | buffered (behind the open run) | waits_turn (a backfill run) |
--             missed (the claim ends it skipped) | late (the claim ends it error) |
--             stale (its schedule stopped: the claim ends it) | breaker (its function's circuit
--             breaker is open: held, unless the claim lets it go as the breaker's one probe) |
--             capped (due, but its project's max_concurrency leaves the next claim no room for
--             it, or an open transaction holds the project's row: the claim leaves it)

-- "2 h 13 min", "12 s": how long, for people.
CREATE OR REPLACE FUNCTION dispatch._span(d interval)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
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

-- An instant to the second, in the session's time zone.
CREATE OR REPLACE FUNCTION dispatch._instant(t timestamptz)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN isfinite(t) THEN date_trunc('second', t)::text ELSE t::text END
$$;

-- The next slot of a rule after an instant, or NULL when it cannot be computed (a zone gone from
-- the tz database), without the WARNING that dispatch._next_slot writes for the server log.
CREATE OR REPLACE FUNCTION dispatch._explain_next(spec dispatch.cron_spec, after timestamptz, tz text)
RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN dispatch.cron_spec_next(spec, after, tz);
EXCEPTION WHEN OTHERS THEN
    RETURN NULL;
END
$$;

-- "slot 2026-12-25 09:00:00+00 falls in calendar holidays (Christmas, 2026-12-25 00:00 to
-- 2026-12-26 00:00 Europe/Berlin): it does not run; the next slot that runs is ..."
CREATE OR REPLACE FUNCTION dispatch._excluded_detail(slot timestamptz, period record, after timestamptz, tz text)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
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

-- Whether a backend holds more than a read's lock on a table (a row lock, an update).
DROP FUNCTION IF EXISTS dispatch._holds_projects(integer);
CREATE OR REPLACE FUNCTION dispatch._holds_table(pid integer, tbl regclass)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks t
                   WHERE t.pid = _holds_table.pid AND t.locktype = 'relation'
                     AND t.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())
                     AND t.relation = _holds_table.tbl AND t.granted AND t.mode <> 'AccessShareLock')
$$;

-- Which backend holds a row of tbl whose xmax is `locker`, so that a claim's SKIP LOCKED passes
-- it by: its pid, or NULL. Read, not probed: a row lock of explain's own, even rolled back at
-- once, would give a reader's transaction an xid, fail in a read-only one, and make a claim at
-- that instant skip the row. The row's xmax (or a member of its MultiXactId) holds it while it
-- is in progress and holds more than a read's lock on the table; a FOR KEY SHARE lock, which
-- claims pass, counts too (pgdispatch takes none).
CREATE OR REPLACE FUNCTION dispatch._row_holder(locker xid, tbl regclass)
RETURNS integer
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
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

-- Which backend holds a project's row in dispatch.projects, so that dispatch.claim_runs' FOR NO
-- KEY UPDATE SKIP LOCKED leaves the project out: its pid, or NULL.
CREATE OR REPLACE FUNCTION dispatch._project_holder(project text)
RETURNS integer
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT dispatch._row_holder(p.xmax, 'dispatch.projects') FROM dispatch.projects p WHERE p.project_id = project
$$;

-- A capped project as the next claim sees it (docs/projects.md): its cap, its running runs, who
-- holds its row (then the claim leaves it out), and the runs the claim takes of it: its first
-- due runs in the claim's order, as many as the cap leaves room for. Runs the claim ends instead
-- of starting take room too (they count against its allowance). All NULL without a cap.
CREATE OR REPLACE FUNCTION dispatch._explain_cap(project text, OUT max_concurrency integer, OUT running integer,
                                                 OUT holder integer, OUT takes bigint[])
RETURNS record
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
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

-- Each open run of a schedule and what the next claim does with it: dispatch.claim_runs' own
-- tests, in its order (its project's cap, a stopped schedule, the misfire grace, then a retry's
-- limits, which it applies only to runs with a not_before). A due run of a capped project
-- beyond what the cap leaves room for is not looked at by the claim at all: capped.
CREATE OR REPLACE FUNCTION dispatch._explain_open(s dispatch.schedules)
RETURNS TABLE (id bigint, kind text, status text, scheduled_for timestamptz, fire_at timestamptz,
               not_before timestamptz, attempt integer, released integer, worker text, claimed_at timestamptz,
               lease_until timestamptz, error text, verdict text)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
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

CREATE OR REPLACE FUNCTION dispatch.explain(schedule_id uuid, since timestamptz DEFAULT now() - interval '1 day')
RETURNS TABLE (section text, item text, at timestamptz, run_id bigint, detail text)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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
COMMENT ON FUNCTION dispatch.explain(uuid, timestamptz) IS
    'Why a schedule does (or did not) fire, as rows (section, item, at, run_id, detail) a DBA reads at a psql prompt; item is a word to match, detail says it in plain words, at is the instant the row is about. Sections: state (one row, the verdict: live, due, missed, settling, busy, pending, jitter_wait, retry_wait, late, breaker (held by its function''s open circuit breaker), capped (due, but its project''s max_concurrency leaves the next claim no room for it, or an open transaction holds the project''s row), buffered, backed_off, ended (a one-shot or bounded schedule past its last slot, and why), excluded (its slot falls in a period of its calendar: which calendar and period, and the next slot that runs), paused, disabled, deleted; who paused or disabled it, when and why; the open run and its last outcome), open run (each pending or running run and what the next claim does with it), next (the next three slots that run, each with the instant its jitter fires it at; an excluded row for each period of its calendar they pass over; an end row where a bounded rule has no more), run (the last five finished runs, the latest slot first, with their outcomes), not run (a summary, then each slot since "since" that did not run: recorded gaps by reason (overlap, catch-up, misfire, pause, disabled, calendar), skipped runs (misfire, back-off, stopped), and the slots a paused or disabled schedule has passed over so far). P0002 for an unknown id. Read-only; granted to dispatch_reader.';
