-- Register the dispatch-tick and dispatch-prune jobs when pg_cron lives in another database
-- than dispatch. Run it in pg_cron's database (cron.database_name), naming the dispatch one:
--
--   psql -v ON_ERROR_STOP=1 -d postgres -v dispatch_db=app -f sql/pg_cron.sql
--
-- Safe to run again: cron.schedule_in_database updates a job of the same name.
\set ON_ERROR_STOP 1
\if :{?dispatch_db}
\else
DO $$ BEGIN RAISE EXCEPTION 'sql/pg_cron.sql: name the dispatch database with -v dispatch_db=NAME'; END $$;
\endif

SELECT cron.schedule_in_database('dispatch-tick', '* * * * *', 'SELECT dispatch.tick()', :'dispatch_db') AS tick_job,
       cron.schedule_in_database('dispatch-prune', '*/10 * * * *', 'CALL dispatch.prune()', :'dispatch_db') AS prune_job
\gset
-- A job keeps the host it was scheduled with (cron.schedule_in_database does not update it):
-- after a fix of cron.host, running this again moves the jobs to it.
WITH moved AS (
    UPDATE cron.job SET nodename = coalesce(current_setting('cron.host', true), 'localhost'),
                        nodeport = current_setting('port')::integer
    WHERE jobname IN ('dispatch-tick', 'dispatch-prune') AND database = :'dispatch_db' AND username = current_user
      AND (nodename, nodeport) IS DISTINCT FROM (coalesce(current_setting('cron.host', true), 'localhost'),
                                                 current_setting('port')::integer)
    RETURNING 1
)
SELECT count(*) AS moved FROM moved
\gset
SELECT format('pg_cron jobs dispatch-tick (id %s) and dispatch-prune (id %s) registered in database %s for database %s',
              :tick_job, :prune_job, current_database(), :'dispatch_db') AS done
\gset
\echo :done
