-- Registering the pg_cron jobs dispatch-tick and dispatch-prune. pg_cron lives in one database
-- per cluster (cron.database_name); when that is not this one, sql/pg_cron.sql is run there.

CREATE OR REPLACE FUNCTION dispatch.register_cron_job()
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
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
