-- What a listener or an operator command checks: at start, that the schema it talks to is the
-- one it was written for (a listener refuses a database whose migrations stop short of what it
-- needs); at each of a listener's calls, its deadline.

CREATE OR REPLACE FUNCTION dispatch.schema_version()
RETURNS integer
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT max(version) FROM dispatch.migrations $$;
COMMENT ON FUNCTION dispatch.schema_version() IS
    'The highest migration applied to this database (dispatch.migrations): listeners refuse to start on a schema older than they need.';

-- Every call a listener makes carries its deadline on the server's clock, and the server does
-- nothing with a call that arrives after it (invariant 9: a call held up on its way past the
-- listener's bound would otherwise still run and commit). The listener sends this ahead of the
-- call's statement, in its transaction, with its own clock_timestamp(): the clock that the
-- listener read to place the deadline.
CREATE OR REPLACE FUNCTION dispatch.check_deadline(now timestamptz, not_after timestamptz)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF check_deadline.now > check_deadline.not_after THEN
        RAISE EXCEPTION 'arrived after its deadline (%)', check_deadline.not_after USING ERRCODE = 'query_canceled';
    END IF;
END
$$;
COMMENT ON FUNCTION dispatch.check_deadline(timestamptz, timestamptz) IS
    'Raise query_canceled ("arrived after its deadline") when now is after not_after. A listener calls it with clock_timestamp() ahead of each statement, in the same transaction, so that a call that reaches the server after the listener gave up on it does nothing.';
