-- What a listener or an operator command checks at start: the schema it talks to is the one it
-- was written for (a listener refuses a database whose migrations stop short of what it needs).

CREATE OR REPLACE FUNCTION dispatch.schema_version()
RETURNS integer
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT max(version) FROM dispatch.migrations $$;
COMMENT ON FUNCTION dispatch.schema_version() IS
    'The highest migration applied to this database (dispatch.migrations): listeners refuse to start on a schema older than they need.';
