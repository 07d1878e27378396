-- What listeners export about the database as a whole (metrics), read cheaply at every sweep.

-- Runs that ended lost since the audit row after_id (NULL: none counted, only where to start):
-- how many, and the id to pass next time. A partial index of lost runs' audit rows answers it.
CREATE OR REPLACE FUNCTION dispatch.lost_runs_after(after_id bigint)
RETURNS TABLE (lost bigint, last_id bigint)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN after_id IS NULL THEN 0 ELSE count(*) FILTER (WHERE a.id > after_id) END,
           coalesce(max(a.id), after_id, 0)
    FROM dispatch.audit_log a
    WHERE a.action = 'schedule.run.lost' AND a.id > coalesce(after_id, 0)
$$;
COMMENT ON FUNCTION dispatch.lost_runs_after(bigint) IS
    'How many runs ended lost (audit action schedule.run.lost) after audit row after_id, and the id to pass next time; with NULL, 0 and where to start. What listeners export as pgdispatch_runs_lost_total.';
