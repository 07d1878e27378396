-- When a listener's clock should wake next, and what for.

-- Asked relative to the instant the caller's last tick marked up to rather than to now: a
-- listener that re-plans just after a slot's instant, before its timer fired, is told that slot
-- (in the past: tick at once) instead of the one after it.
--
-- It wakes for two things: a schedule's slot, when it ticks (marks runs), and the instant a run
-- marked earlier may start (a jittered slot's fire_at, a retry's back-off), when a claim is
-- enough: jitter spreads a minute's runs over thousands of instants, and a tick reads every
-- schedule still on its slot.
CREATE OR REPLACE FUNCTION dispatch.next_slot_after(covered timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE  -- for its cached plan: a SQL function with a SET clause is planned at each call
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT min(s.next_run_at) FROM dispatch.schedules s WHERE s.next_run_at > next_slot_after.covered);
END
$$;
COMMENT ON FUNCTION dispatch.next_slot_after(timestamptz) IS
    'The earliest next_run_at of a live schedule after "covered" (the now() of the caller''s last dispatch.tick()): when to tick next. In the past when a slot came due since. Schedules whose run is still open stay at their slot, at or before "covered", and are not answered again.';

CREATE OR REPLACE FUNCTION dispatch.next_start_after(after timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- The first entry of runs_not_before_idx after "after", whatever the statistics say: planned as
-- min(), it read every run waiting past "after" (the jittered runs of a minute).
SET enable_sort = off
AS $$
BEGIN
    RETURN (SELECT r.not_before FROM dispatch.runs r
            WHERE r.status = 'pending' AND r.not_before > next_start_after.after AND r.not_before < 'infinity'
            ORDER BY r.not_before
            LIMIT 1);
END
$$;
COMMENT ON FUNCTION dispatch.next_start_after(timestamptz) IS
    'The earliest instant after "after" at which a pending run that waits may start (not_before: a jittered slot''s fire_at, a retry''s back-off): when to claim next. Backfill runs waiting their turn (not_before infinity) are left out.';

CREATE OR REPLACE FUNCTION dispatch.next_due_after(covered timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- least() ignores NULLs
    RETURN least(dispatch.next_slot_after(next_due_after.covered), dispatch.next_start_after(next_due_after.covered));
END
$$;
COMMENT ON FUNCTION dispatch.next_due_after(timestamptz) IS
    'The earlier of dispatch.next_slot_after and dispatch.next_start_after for "covered" (the instant a caller''s last dispatch.tick() marked up to: its now()): the earliest next_run_at of a live schedule, or not_before of a waiting run, after it. In the past when a slot came due since: tick at once.';

CREATE OR REPLACE FUNCTION dispatch.next_due_at()
RETURNS timestamptz
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT dispatch.next_due_after(now()) $$;
COMMENT ON FUNCTION dispatch.next_due_at() IS
    'The earliest future next_run_at of a live schedule or retry: when a listener should next call dispatch.tick().';
