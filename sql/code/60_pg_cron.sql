-- Registering the pg_cron jobs dispatch-tick and dispatch-prune. pg_cron lives in one database
-- per cluster (cron.database_name); when that is not this one, sql/pg_cron.sql is run there.

-- How pg_cron will log in to run a job, and what stands in its way. Without background workers
-- pg_cron's scheduler opens a libpq connection per job run to the job's nodename (cron.host when
-- the job was scheduled: localhost by default) as the job's role, with no password: on a cluster
-- whose pg_hba.conf asks local TCP connections for one (Debian's default), every run fails with
-- "connection failed" while the install reports success. This reads pg_hba.conf as the server
-- does (first matching line wins) and says what to change; NULL when nothing is in the way.
-- SECURITY INVOKER: pg_hba_file_rules is for superusers, and a role that cannot read it is told
-- so rather than raising an error into the server log.
CREATE OR REPLACE FUNCTION dispatch.cron_login_problem(dbname text, role text, host text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    node text := coalesce(host, (SELECT h.setting FROM pg_catalog.pg_settings h WHERE h.name = 'cron.host'), 'localhost');
    ssl boolean := current_setting('ssl', true) = 'on';
    fix constant text := 'set cron.use_background_workers = on in postgresql.conf and restart PostgreSQL '
                         '(pg_cron then runs jobs in background workers, with no login), or let it log in '
                         '(a trust or peer line in pg_hba.conf for what it connects to, or a ~/.pgpass entry '
                         'for the operating-system user that runs PostgreSQL), then run the install again';
    addresses inet[];
    peer inet;
    rule record;
    what text;
BEGIN
    IF (SELECT w.setting FROM pg_catalog.pg_settings w WHERE w.name = 'cron.use_background_workers') = 'on' THEN
        RETURN NULL;
    END IF;
    IF NOT has_table_privilege('pg_catalog.pg_hba_file_rules', 'SELECT') THEN
        RETURN format('cannot tell whether pg_cron can log in to %s as %s: reading pg_hba.conf takes a superuser; '
                      'if its dispatch-tick runs fail with "connection failed", %s', node, role, fix);
    END IF;
    IF node LIKE '/%' THEN
        addresses := ARRAY[NULL::inet];  -- a socket directory: the "local" lines
    ELSIF node = 'localhost' THEN
        addresses := ARRAY['127.0.0.1'::inet, '::1'::inet];
    ELSIF node ~ '^[0-9a-fA-F.:]+$' THEN
        addresses := ARRAY[node::inet];
    ELSE
        RETURN format('cannot tell whether pg_cron can log in to %s as %s (a host name: pg_hba.conf matches '
                      'addresses); if its dispatch-tick runs fail with "connection failed", %s', node, role, fix);
    END IF;
    FOREACH peer IN ARRAY addresses LOOP
        SELECT h.line_number, h.type, h.database, h.user_name, h.address, h.auth_method, h.options INTO rule
        FROM pg_catalog.pg_hba_file_rules h
        WHERE h.error IS NULL
          AND CASE WHEN peer IS NULL THEN h.type = 'local'
                   ELSE h.type IN ('host', 'hostnogssenc', CASE WHEN ssl THEN 'hostssl' ELSE 'hostnossl' END)
                        AND (h.address IN ('all', 'samehost', 'samenet')
                             OR (h.address ~ '^[0-9a-fA-F.:]+$' AND h.netmask IS NOT NULL
                                 AND family(h.address::inet) = family(peer)
                                 AND (h.address::inet & h.netmask::inet) = (peer & h.netmask::inet)))
              END
          AND ('all' = ANY (h.database) OR dbname = ANY (h.database)
               OR ('sameuser' = ANY (h.database) AND dbname = role)
               OR ('samerole' = ANY (h.database) AND EXISTS (SELECT 1 FROM pg_catalog.pg_roles g
                                                             WHERE g.rolname = dbname
                                                               AND pg_has_role(role, g.oid, 'MEMBER'))))
          AND ('all' = ANY (h.user_name) OR role = ANY (h.user_name)
               OR EXISTS (SELECT 1 FROM unnest(h.user_name) u JOIN pg_catalog.pg_roles g
                            ON u LIKE '+%' AND g.rolname = substr(u, 2)
                          WHERE pg_has_role(role, g.oid, 'MEMBER')))
        ORDER BY h.line_number
        LIMIT 1;
        what := format('pg_cron logs in to %s%s as %s for database %s', node,
                       CASE WHEN peer IS NOT NULL AND node = 'localhost' THEN format(' (%s)', host(peer)) ELSE '' END,
                       role, dbname);
        IF rule.line_number IS NULL THEN
            RETURN format('%s, and no line of pg_hba.conf lets it in: %s', what, fix);
        ELSIF rule.auth_method = 'trust' THEN
            CONTINUE;
        ELSIF rule.auth_method IN ('peer', 'ident') AND role = 'postgres' AND rule.options IS NULL THEN
            CONTINUE;  -- the operating-system user that runs PostgreSQL is (almost always) postgres
        END IF;
        RETURN format('%s, and pg_hba.conf line %s (%s %s %s%s %s) %s: %s', what, rule.line_number,
                      rule.type, array_to_string(rule.database, ','), array_to_string(rule.user_name, ','),
                      coalesce(' ' || rule.address, ''), rule.auth_method,
                      CASE WHEN rule.auth_method IN ('md5', 'scram-sha-256', 'password')
                           THEN 'asks for a password it does not have'
                           WHEN rule.auth_method = 'reject' THEN 'turns it away'
                           WHEN rule.auth_method IN ('peer', 'ident')
                           THEN format('lets in only the operating-system user of the same name as %s', role)
                           ELSE format('needs %s credentials it does not have', rule.auth_method) END,
                      fix);
    END LOOP;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION dispatch.cron_login_problem(text, text, text) IS
    'Why pg_cron cannot run a job of this role in this database, read from pg_hba.conf (the first matching line, as the server reads it) for the job''s host (default cron.host), with what to change; NULL when nothing is in the way (cron.use_background_workers is on, or a trust or peer line lets it in). Says so when the caller cannot read pg_hba.conf.';

CREATE OR REPLACE FUNCTION dispatch.register_cron_job()
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- pg_settings, not current_setting(): a role without pg_read_all_settings sees no row there
    -- rather than an error; it still sees in which database pg_cron's scheduler runs.
    cron_db text := coalesce((SELECT s.setting FROM pg_catalog.pg_settings s WHERE s.name = 'cron.database_name'),
                             (SELECT a.datname FROM pg_catalog.pg_stat_activity a
                              WHERE a.application_name = 'pg_cron scheduler' LIMIT 1));
    cron_host text := coalesce((SELECT h.setting FROM pg_catalog.pg_settings h WHERE h.name = 'cron.host'), 'localhost');
    msg text;
    problem text;
    cron_here boolean;
    elsewhere text;
BEGIN
    IF cron_db = current_database()
       AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron')
       AND (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        CREATE EXTENSION pg_cron;
    END IF;

    cron_here := EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron');
    IF cron_here THEN
        -- pg_cron names a job once per role, and cron.schedule keeps the database of a job of the
        -- same name: jobs of this role that run in another database (sql/pg_cron.sql) stay there.
        EXECUTE $sql$SELECT string_agg(DISTINCT database, ', ') FROM cron.job
                     WHERE jobname IN ('dispatch-tick', 'dispatch-prune') AND username = current_user
                       AND database <> current_database()$sql$ INTO elsewhere;
    END IF;
    IF elsewhere IS NOT NULL THEN
        msg := format('pg_cron jobs dispatch-tick and dispatch-prune NOT registered in database %s: role %s '
                      'already runs jobs of these names in database %s, and pg_cron names a job once per role. '
                      'To move them here, first SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname IN '
                      '(''dispatch-tick'', ''dispatch-prune'') AND username = current_user, then install again; '
                      'to tick both databases, install as another role', current_database(), current_user, elsewhere);
        RAISE WARNING '%', msg;
    ELSIF cron_here THEN
        -- cron.schedule updates a job of the same name, so this is idempotent.
        EXECUTE $sql$SELECT cron.schedule('dispatch-tick', '* * * * *', 'SELECT dispatch.tick()')$sql$;
        EXECUTE $sql$SELECT cron.schedule('dispatch-prune', '7,17,27,37,47,57 * * * *', 'CALL dispatch.prune()')$sql$;
        msg := format('pg_cron jobs dispatch-tick (SELECT dispatch.tick() every minute) and dispatch-prune '
                      '(CALL dispatch.prune() every 10 minutes) registered in database %s', current_database());
        -- A job keeps the host it was scheduled with; cron.schedule does not update it. After a
        -- fix of cron.host, running the install again moves the jobs to it.
        BEGIN
            EXECUTE $sql$UPDATE cron.job SET nodename = $1, nodeport = $2
                         WHERE jobname IN ('dispatch-tick', 'dispatch-prune') AND username = current_user
                           AND (nodename, nodeport) IS DISTINCT FROM ($1, $2)$sql$
                USING cron_host, current_setting('port')::integer;
        EXCEPTION WHEN insufficient_privilege THEN
            msg := msg || format(' (as %s it could not move them to cron.host %s: a superuser may run the install '
                                 'again to do so)', current_user, cron_host);
        END;
        problem := dispatch.cron_login_problem(current_database(), current_user,
                                               (SELECT j.nodename FROM cron.job j WHERE j.jobname = 'dispatch-tick'
                                                  AND j.username = current_user));
    ELSIF cron_db = current_database() THEN
        msg := format('pg_cron is loaded for this database (%s) but the extension is not created: '
                      'as a superuser run CREATE EXTENSION pg_cron, then install again', cron_db);
    ELSIF cron_db IS NOT NULL THEN
        msg := format('pg_cron lives in database %s: register the jobs there with '
                      'psql -d %s -v dispatch_db=%s -f sql/pg_cron.sql', cron_db, cron_db, current_database());
        problem := dispatch.cron_login_problem(current_database(), current_user);
    ELSE
        msg := format('pg_cron is not loaded (shared_preload_libraries): nothing calls dispatch.tick() every '
                      'minute nor prunes old runs. Listeners still tick on their own timers; to add the safety '
                      'net install pg_cron (on Debian and Ubuntu: postgresql-%s-cron), add pg_cron to '
                      'shared_preload_libraries, restart, and install again (or CALL dispatch.prune() from '
                      'another scheduler).', current_setting('server_version_num')::integer / 10000);
    END IF;
    IF problem LIKE 'cannot tell%' THEN
        msg := msg || '. Note: ' || problem;  -- not a problem found, one this role cannot rule out
    ELSIF problem IS NOT NULL THEN
        msg := msg || '. BUT ' || problem;
        RAISE WARNING '%', problem;
    END IF;
    RAISE NOTICE '%', msg;
    RETURN msg;
END
$$;
COMMENT ON FUNCTION dispatch.register_cron_job() IS
    'Register (or update) the pg_cron jobs dispatch-tick and dispatch-prune when pg_cron is installed in this database, moving existing ones to the current cron.host; otherwise say what to do. When jobs of these names of the current role run in another database (pg_cron names a job once per role), registers nothing and says so (WARNING). Says (WARNING) what stands in the way when pg_cron cannot log in to run them (dispatch.cron_login_problem). Returns what it did.';
