-- When a listener's clock should tick next.

-- Asked relative to the instant the caller's last tick marked up to rather than to now: a
-- listener that re-plans just after a slot's instant, before its timer fired, is told that slot
-- (in the past: tick at once) instead of the one after it.
CREATE OR REPLACE FUNCTION dispatch.next_due_after(covered timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- least() ignores NULLs: the earlier of the next slot and the next retry
    RETURN least((SELECT min(s.next_run_at) FROM dispatch.schedules s WHERE s.next_run_at > next_due_after.covered),
                 (SELECT min(r.not_before) FROM dispatch.runs r
                  WHERE r.status = 'pending' AND r.not_before > next_due_after.covered AND r.not_before < 'infinity'));
END
$$;
COMMENT ON FUNCTION dispatch.next_due_after(timestamptz) IS
    'The earliest next_run_at of a live schedule, or not_before of a retry, after "covered" (the instant a caller''s last dispatch.tick() marked up to: its now()). In the past when a slot came due since: tick at once. Schedules whose run is still open stay at their slot, at or before "covered", and are not answered again.';

CREATE OR REPLACE FUNCTION dispatch.next_due_at()
RETURNS timestamptz
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT dispatch.next_due_after(now()) $$;
COMMENT ON FUNCTION dispatch.next_due_at() IS
    'The earliest future next_run_at of a live schedule or retry: when a listener should next call dispatch.tick().';
