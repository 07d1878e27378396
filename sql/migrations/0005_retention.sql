-- Bounded history: finished runs and audit rows older than their retention are pruned in
-- small batches by the pg_cron job dispatch-prune. Pending and running runs are never touched.

CREATE TABLE dispatch.settings (
    singleton        boolean PRIMARY KEY DEFAULT true,
    runs_retention   interval NOT NULL DEFAULT interval '14 days',
    audit_retention  interval NOT NULL DEFAULT interval '90 days',
    prune_batch_size integer NOT NULL DEFAULT 5000,
    CONSTRAINT settings_singleton_check CHECK (singleton),
    CONSTRAINT settings_runs_retention_check CHECK (runs_retention >= interval '1 hour'),
    CONSTRAINT settings_audit_retention_check CHECK (audit_retention >= interval '1 hour'),
    CONSTRAINT settings_prune_batch_size_check CHECK (prune_batch_size BETWEEN 100 AND 1000000)
);
COMMENT ON TABLE dispatch.settings IS
    'One row of settings, changed with one statement, e.g. UPDATE dispatch.settings SET runs_retention = ''30 days''.';
COMMENT ON COLUMN dispatch.settings.runs_retention IS 'Finished runs older than this (by finished_at) are pruned.';
COMMENT ON COLUMN dispatch.settings.audit_retention IS 'Audit rows older than this (by at) are pruned.';
COMMENT ON COLUMN dispatch.settings.prune_batch_size IS 'Rows deleted per transaction by dispatch.prune.';
INSERT INTO dispatch.settings DEFAULT VALUES;

-- Runs are inserted in time order, so a BRIN index finds the old ones for almost no upkeep.
CREATE INDEX runs_created_at_brin_idx ON dispatch.runs USING brin (created_at);

CREATE FUNCTION dispatch._prune_runs()
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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

CREATE FUNCTION dispatch._prune_audit()
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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

-- The deleting is done by the two functions above, one batch a call; this procedure only
-- commits between batches (small transactions: no long lock, no bloat wave). PostgreSQL
-- forbids transaction control in a procedure with a SET clause or SECURITY DEFINER, so this one
-- has neither and qualifies its few operators instead.
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
COMMENT ON PROCEDURE dispatch.prune(bigint, bigint) IS
    'Delete finished runs and audit rows older than dispatch.settings'' retention, prune_batch_size rows per transaction; pending and running runs are kept. Run every 10 minutes by the pg_cron job dispatch-prune. Returns how many rows it deleted.';
