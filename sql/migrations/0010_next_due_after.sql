-- When a listener's clock should tick next, asked relative to the instant its last tick marked
-- up to rather than to now.
--
-- dispatch.next_due_at() answers "the earliest next_run_at after now". A listener that re-plans
-- (on a NOTIFY, after recording outcomes) just after a slot's instant but before its timer
-- fired was told the *following* slot, and the one that had just come due waited for the
-- sweep: 55 s of 50,000 runs standing still in bench.dispatch. Asked "after the instant my last
-- tick covered", a slot that came due in between is answered, in the past: tick at once.
CREATE FUNCTION dispatch.next_due_after(covered timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT min(next_run_at) FROM dispatch.schedules WHERE next_run_at > next_due_after.covered);
END
$$;
COMMENT ON FUNCTION dispatch.next_due_after(timestamptz) IS
    'The earliest next_run_at of a live schedule after "covered" (the instant a caller''s last dispatch.tick() marked up to: its now()). In the past when a slot came due since: tick at once. Schedules whose run is still open stay at their slot, at or before "covered", and are not answered again.';

-- One implementation: next_due_at() is next_due_after(now()).
CREATE OR REPLACE FUNCTION dispatch.next_due_at()
RETURNS timestamptz
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT dispatch.next_due_after(now()) $$;

REVOKE ALL ON FUNCTION dispatch.next_due_after(timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dispatch.next_due_after(timestamptz) TO dispatch_listener, dispatch_admin;
