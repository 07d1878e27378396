-- dispatch.tick: lease expiry, then every live schedule that is due.
--
-- A due schedule with overlap skip or buffer_one, no open run, no slot beyond its
-- misfire_grace and none in its calendar's periods is marked by one statement for all of them:
-- the common case, the stampede at the top of the hour, and the tick that comes back after an
-- outage. Every other due schedule goes through dispatch._tick_schedule, where the run policies
-- decide: slots missed beyond the grace, a slot the calendar excludes, overlap buffer_one behind
-- an open run and allow, a back-off instant, a schedule behind a finished slot.
--
-- Nothing here waits on another transaction (invariant 3): rows are locked with SKIP LOCKED, so
-- two ticks share the work instead of queueing behind each other, and a row that a user's open
-- transaction holds is left for a later tick. A run is only ever inserted for a schedule whose
-- row this transaction holds and that has no open run, so the unique indexes on runs never
-- make an insert wait on someone else's either.

-- What decides from what it sees of runs under a lock it took (the tick's marking, run_now) needs
-- a snapshot newer than the lock: READ COMMITTED's, one per statement. Under REPEATABLE READ or
-- SERIALIZABLE the transaction's first snapshot stays, and a run committed by whoever held the
-- schedule before goes unseen: two ticks marked two open runs under overlap skip that way.
CREATE OR REPLACE FUNCTION dispatch._require_read_committed(what text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
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

CREATE OR REPLACE FUNCTION dispatch._expire_leases()
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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

-- "missed by 2 h 13 min"
CREATE OR REPLACE FUNCTION dispatch._missed_by(late interval)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'missed by ' || CASE
        WHEN late >= interval '1 day' THEN extract(day FROM late)::int || ' d ' || extract(hour FROM late)::int || ' h'
        WHEN late >= interval '1 hour' THEN extract(hour FROM late)::int || ' h ' || extract(minute FROM late)::int || ' min'
        WHEN late >= interval '1 minute' THEN extract(minute FROM late)::int || ' min ' || floor(extract(second FROM late))::int || ' s'
        ELSE round(extract(epoch FROM late))::int || ' s'
    END
$$;

-- Slots [from_slot, cut) of a schedule whose misfire_grace they are beyond: never invoked. Up
-- to 100 each get a skipped run with an audit row; more (a long outage of a frequent schedule)
-- are one recorded gap instead (misfire), so that an outage does not write millions of rows in
-- one tick. Returns the latest of them.
CREATE OR REPLACE FUNCTION dispatch._skip_missed(s dispatch.schedules, from_slot timestamptz, cut timestamptz,
                                                 horizon timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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

-- A due schedule that the bulk marking of tick() leaves to the run policies, its row held by the
-- caller (locked SKIP LOCKED). Returns how many runs it marked.
CREATE OR REPLACE FUNCTION dispatch._tick_schedule(schedule_id uuid, horizon timestamptz)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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

-- dispatch._tick_schedule for one schedule whose slots may not be computable (its zone vanished
-- from the tz database after an upgrade, say): it backs off instead of failing the whole tick,
-- as a finishing run would (dispatch._advance_schedules). One subtransaction a call: only the
-- schedules the bulk marking leaves to the policies come here.
CREATE OR REPLACE FUNCTION dispatch._tick_schedule_guarded(schedule_id uuid, horizon timestamptz)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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

-- A chunk's heads: when more is due than the chunk takes, each project's first due schedules
-- that no run policy has to decide, locked (SKIP LOCKED), so that a project's burst of 50,000 does
-- not hold another project's one due schedule until the last chunk. At most half the chunk, split
-- evenly between the projects with due schedules (at least one each, for at most half the chunk's
-- worth of projects, first by project_id); NULL when one project alone is due (nobody to be fair
-- to) or the chunk takes everything due. The projects are found by a loose index scan of
-- schedules_project_next_run_at_idx, one project a step, due or not, until it has enough: its cost
-- follows the number of projects, not of schedules. The caller decides under the lock, as for the rest of
-- the chunk; a head that turns out not to be plain is left to the run policies like any other.
DROP FUNCTION IF EXISTS dispatch._due_heads(timestamptz, integer);
CREATE OR REPLACE FUNCTION dispatch._due_heads(horizon timestamptz, max_runs integer,
                                               blocked_calendars bigint[], blocked_slots timestamptz[])
RETURNS uuid[]
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- project order comes from the per-project indexes, never from a sort of what is due (see below)
SET enable_sort = off
-- (what a disabled sort adds to a plan's cost would otherwise have it compiled: 0.3 s a claim)
SET jit = off
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
COMMENT ON FUNCTION dispatch._due_heads(timestamptz, integer, bigint[], timestamptz[]) IS
    'For a chunk of the tick (dispatch.tick_chunk) behind which more is due: each project''s first due schedules of the plain kind (no run policy to decide), locked SKIP LOCKED, at most half of max_runs in all, split between the projects with due schedules; NULL when the chunk takes all that is due or only one project is due. The caller marks them first.';

-- The marking both public functions share: up to max_runs (NULL: all) due slots; `taken`
-- counts the due schedules it locked. With a limit,
-- only the schedules no run policy has to decide (the bulk kind: the stampede at the top of the
-- hour), so that each call commits a chunk the listeners can claim at once; a final unlimited
-- call does the rest, lease expiry and policies included.
CREATE OR REPLACE FUNCTION dispatch._mark_due(horizon timestamptz, max_runs integer,
                                              OUT marked integer, OUT taken integer)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- What is due changes faster than statistics follow (right after a stampede they still say most
-- schedules are due and most runs open): the marking is an index scan of the due schedules
-- driving index probes of runs whatever the estimates say, never both tables scanned and hashed.
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
-- A statement over many due schedules is estimated above jit_above_cost, and compiling it takes
-- longer than running it.
SET jit = off
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

CREATE OR REPLACE FUNCTION dispatch.tick(now timestamptz DEFAULT now())
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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
COMMENT ON FUNCTION dispatch.tick(timestamptz) IS
    'Expire leases by the real clock, then mark every live schedule due at or before "now" as a pending run (idempotent per slot), following its run policies: slots missed beyond misfire_grace end skipped, catchup latest or all, overlap skip, buffer_one or allow. Also moves a schedule found on a finished slot past it and records a skipped run for each back-off instant reached. NOTIFY dispatch when there is work. Returns how many runs it marked. Never waits on a row another transaction holds. A "now" ahead of the clock needs dispatch_admin, and at most an hour ahead (the schema owner any); a non-finite one is refused (22023). Run every minute by the pg_cron job dispatch-tick and by listeners when a slot comes due.';

CREATE OR REPLACE FUNCTION dispatch.tick_chunk(max_runs integer, OUT marked integer, OUT taken integer)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF max_runs IS NULL OR max_runs < 1 THEN
        RAISE EXCEPTION 'dispatch.tick_chunk(%): max_runs must be 1 or more', max_runs
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT m.marked, m.taken INTO marked, taken FROM dispatch._mark_due(now(), max_runs) m;
END
$$;
COMMENT ON FUNCTION dispatch.tick_chunk(integer) IS
    'Mark at most max_runs due slots now, of the schedules no run policy has to decide (on time, no run open, overlap skip or buffer_one), and NOTIFY dispatch when it marked any. Returns how many runs it marked and how many due schedules it took: taken = max_runs means more may be due; fewer, that every other due schedule is held by another tick or left to dispatch.tick() (a tick that committed while this one ran can have marked some of those it took: marked < taken). Listeners call it with growing sizes when a slot comes due, so that 100,000 schedules due at one instant are claimed from the first chunk on rather than after one long statement; then dispatch.tick() for the rest (policies, lease expiry). Never waits on a row another transaction holds.';
