-- The schema and the bookkeeping of migrations; idempotent, run before every install.
--
-- Everything after this runs with a search_path that no other role can write to, so that no
-- unqualified name in a migration can be captured by someone else's function or operator.
SET search_path = pg_catalog, pg_temp;

-- CREATE SCHEMA IF NOT EXISTS would also accept a dispatch schema that someone else created
-- beforehand (and could have filled with traps): refuse that instead.
DO $$
DECLARE
    owner_name name;
BEGIN
    SELECT pg_catalog.pg_get_userbyid(nspowner) INTO owner_name
    FROM pg_catalog.pg_namespace WHERE nspname = 'dispatch';
    IF NOT FOUND THEN
        CREATE SCHEMA dispatch;
        COMMENT ON SCHEMA dispatch IS 'pgdispatch: cron schedules dispatched over HTTP';
        CREATE TABLE dispatch.migrations (
            version    integer PRIMARY KEY,
            name       text NOT NULL UNIQUE,
            applied_at timestamptz NOT NULL DEFAULT pg_catalog.now()
        );
        COMMENT ON TABLE dispatch.migrations IS
            'Applied migrations (sql/migrations/NNNN_name.sql). Each is recorded in the transaction that applies it, first, so that a concurrent or repeated install fails before changing anything.';
    ELSIF owner_name OPERATOR(pg_catalog.<>) CURRENT_USER
          AND NOT pg_catalog.pg_has_role(CURRENT_USER, owner_name, 'MEMBER') THEN
        RAISE EXCEPTION 'schema dispatch exists and belongs to %, not to %', owner_name, CURRENT_USER
            USING HINT = 'Install as the role that owns it (or a member of it), or drop it if it is not pgdispatch''s.';
    END IF;
END
$$;
