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

-- pg_cron names a job once per role: with jobs of these names already running in another
-- database, cron.schedule_in_database would keep them there (it updates the schedule and the
-- command, not the database) and this database would get no tick. Refuse, and say what to do.
SELECT pg_catalog.format('DO $d$ BEGIN RAISE EXCEPTION ''%%'', %L USING HINT = %L; END $d$',
           pg_catalog.format('sql/pg_cron.sql: role %s already runs pg_cron jobs dispatch-tick and dispatch-prune '
                             'in database %s; pg_cron names a job once per role, so they cannot also run in %s',
                             current_user, j.elsewhere, :'dispatch_db'),
           pg_catalog.format('To move them to %s, first SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname '
                             'IN (''dispatch-tick'', ''dispatch-prune'') AND username = current_user; to tick both '
                             'databases, run this as another role (psql -U ROLE), one that pg_cron can log in as '
                             'and that is a member of dispatch_listener in %s.', :'dispatch_db', :'dispatch_db'))
FROM (SELECT pg_catalog.string_agg(DISTINCT database, ', ') AS elsewhere FROM cron.job
      WHERE jobname IN ('dispatch-tick', 'dispatch-prune') AND username = current_user
        AND database <> :'dispatch_db') j
WHERE j.elsewhere IS NOT NULL
\gexec

SELECT cron.schedule_in_database('dispatch-tick', '* * * * *', 'SELECT dispatch.tick()', :'dispatch_db') AS tick_job,
       cron.schedule_in_database('dispatch-prune', '7,17,27,37,47,57 * * * *', 'CALL dispatch.prune()', :'dispatch_db') AS prune_job
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
