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

CREATE PROCEDURE dispatch.prune(INOUT runs_deleted bigint DEFAULT 0, INOUT audit_deleted bigint DEFAULT 0)
LANGUAGE plpgsql
AS $$
DECLARE
    cfg dispatch.settings;
    n bigint;
BEGIN
    SELECT * INTO STRICT cfg FROM dispatch.settings;
    LOOP
        -- finished_at >= created_at, so the BRIN bound only narrows the scan
        DELETE FROM dispatch.runs
        WHERE id IN (SELECT id FROM dispatch.runs
                     WHERE created_at < now() - cfg.runs_retention
                       AND finished_at < now() - cfg.runs_retention
                     LIMIT cfg.prune_batch_size);
        GET DIAGNOSTICS n = ROW_COUNT;
        runs_deleted := runs_deleted + n;
        COMMIT;  -- small transactions: no long lock or bloat wave
        EXIT WHEN n < cfg.prune_batch_size;
    END LOOP;
    LOOP
        DELETE FROM dispatch.audit_log
        WHERE id IN (SELECT id FROM dispatch.audit_log
                     WHERE at < now() - cfg.audit_retention
                     LIMIT cfg.prune_batch_size);
        GET DIAGNOSTICS n = ROW_COUNT;
        audit_deleted := audit_deleted + n;
        COMMIT;
        EXIT WHEN n < cfg.prune_batch_size;
    END LOOP;
END
$$;
COMMENT ON PROCEDURE dispatch.prune(bigint, bigint) IS
    'Delete finished runs and audit rows older than dispatch.settings'' retention, prune_batch_size rows per transaction; pending and running runs are kept. Run every 10 minutes by the pg_cron job dispatch-prune. Returns how many rows it deleted.';

CREATE OR REPLACE FUNCTION dispatch.register_cron_job()
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    cron_db text := current_setting('cron.database_name', true);
    msg text;
BEGIN
    IF cron_db = current_database()
       AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron')
       AND (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        CREATE EXTENSION pg_cron;
    END IF;

    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron') THEN
        -- cron.schedule updates a job of the same name, so this is idempotent.
        EXECUTE $sql$SELECT cron.schedule('dispatch-tick', '* * * * *', 'SELECT dispatch.tick()')$sql$;
        EXECUTE $sql$SELECT cron.schedule('dispatch-prune', '*/10 * * * *', 'CALL dispatch.prune()')$sql$;
        msg := format('pg_cron jobs dispatch-tick (SELECT dispatch.tick() every minute) and dispatch-prune '
                      '(CALL dispatch.prune() every 10 minutes) registered in database %s', current_database());
    ELSIF cron_db = current_database() THEN
        msg := format('pg_cron is loaded for this database (%s) but the extension is not created: '
                      'as a superuser run CREATE EXTENSION pg_cron, then install again', cron_db);
    ELSIF cron_db IS NOT NULL THEN
        msg := format('pg_cron lives in database %s: register the jobs there with '
                      'psql -d %s -v dispatch_db=%s -f sql/pg_cron.sql', cron_db, cron_db, current_database());
    ELSE
        msg := 'pg_cron is not loaded (shared_preload_libraries): nothing calls dispatch.tick() every minute '
               'nor prunes old runs. Listeners still tick on their own timers; to add the safety net install '
               'postgresql-15-cron, add pg_cron to shared_preload_libraries, restart, and install again '
               '(or CALL dispatch.prune() from another scheduler).';
    END IF;
    RAISE NOTICE '%', msg;
    RETURN msg;
END
$$;
COMMENT ON FUNCTION dispatch.register_cron_job() IS
    'Register (or update) the pg_cron jobs dispatch-tick and dispatch-prune when pg_cron is installed in this database; otherwise say what to do. Returns what it did.';
