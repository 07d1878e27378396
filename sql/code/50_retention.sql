-- Bounded history: finished runs and audit rows older than their retention (dispatch.settings)
-- are deleted in small transactions by dispatch.prune, run by the pg_cron job dispatch-prune.
-- Pending and running runs are never touched.
--
-- Each batch is one page of the table in id order, starting after the last id the previous
-- batch saw, so that the rows earlier batches deleted (dead until vacuum) are never scanned
-- again: the whole prune reads the old part of the table once. Where that part ends (the
-- highest id of a row older than the retention) is found once, on the first call, through the
-- BRIN index; last_id comes back NULL when the page reached it.

CREATE OR REPLACE FUNCTION dispatch._prune_runs(after_id bigint, INOUT up_to bigint, OUT last_id bigint,
                                                OUT deleted bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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

CREATE OR REPLACE FUNCTION dispatch._prune_audit(after_id bigint, INOUT up_to bigint, OUT last_id bigint,
                                                 OUT deleted bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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

-- The deleting is done by the two functions above, one page a call; this procedure only
-- commits between pages (small transactions: no long lock, no bloat wave). PostgreSQL forbids
-- transaction control in a procedure with a SET clause or SECURITY DEFINER, so this one has
-- neither and qualifies its few operators instead.
-- Event deliveries done (delivered or given up) before the audit retention: one statement, as
-- there are few (one per failure of a project with an events_url).
CREATE OR REPLACE FUNCTION dispatch._prune_event_deliveries()
RETURNS bigint
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM dispatch.event_deliveries d
        WHERE coalesce(d.delivered_at, d.gave_up_at) < now() - (SELECT audit_retention FROM dispatch.settings)
        RETURNING 1
    )
    SELECT count(*) FROM gone
$$;
COMMENT ON FUNCTION dispatch._prune_event_deliveries() IS
    'Delete the event deliveries delivered or given up longer ago than the audit retention; returns how many.';

CREATE OR REPLACE PROCEDURE dispatch.prune(INOUT runs_deleted bigint DEFAULT 0, INOUT audit_deleted bigint DEFAULT 0)
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
COMMENT ON PROCEDURE dispatch.prune(bigint, bigint) IS
    'Delete finished runs and audit rows older than dispatch.settings'' retention (and event deliveries done before the audit retention), one page of prune_batch_size rows (in id order) per transaction; pending and running runs are kept. Run every 10 minutes by the pg_cron job dispatch-prune. Returns how many rows it deleted.';
