-- Time zone names (dispatch.timezones caches pg_timezone_names) and the functions that read an
-- expression in a zone: dispatch.cron_next, dispatch.cron_is_valid.

CREATE OR REPLACE FUNCTION dispatch._timezone_names()
RETURNS SETOF text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT name FROM pg_catalog.pg_timezone_names
    WHERE name !~ '^(posix|right)/' AND name NOT IN ('localtime', 'posixrules', 'Factory')
$$;
CREATE OR REPLACE FUNCTION dispatch.refresh_timezones()
RETURNS integer
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH fresh AS (
        INSERT INTO dispatch.timezones (name)
        SELECT dispatch._timezone_names()
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT count(*)::integer FROM fresh
$$;
COMMENT ON FUNCTION dispatch.refresh_timezones() IS
    'Copy new names from pg_timezone_names (less localtime, posixrules, Factory and posix/ copies) into dispatch.timezones; returns how many were added.';

CREATE OR REPLACE FUNCTION dispatch.check_timezone(tz text)
RETURNS text
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    near text;
BEGIN
    IF tz IS NULL THEN
        RAISE EXCEPTION 'timezone must not be null' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM dispatch.timezones WHERE name = tz)
       OR (length(tz) <= 64 AND tz IN (SELECT dispatch._timezone_names())) THEN
        RETURN tz;
    END IF;
    -- The name meant, when it differs only in case (europe/berlin) or lacks its region (Berlin).
    IF length(tz) <= 64 THEN
        SELECT n INTO near FROM dispatch._timezone_names() n
        WHERE lower(n) = lower(tz) OR lower(n) LIKE '%/' || lower(replace(tz, ' ', '_'))
        ORDER BY lower(n) = lower(tz) DESC, n LIMIT 1;
    END IF;
    RAISE EXCEPTION USING
        ERRCODE = 'invalid_parameter_value',
        MESSAGE = format('timezone "%s" is not a time zone name from the tz database%s',
                         CASE WHEN length(tz) > 80 THEN left(tz, 80) || '...' ELSE tz END,
                         CASE WHEN near IS NOT NULL THEN format('; did you mean %s?', near) ELSE '' END),
        HINT = 'Use an IANA name such as Europe/Berlin or UTC (see pg_timezone_names); abbreviations such as CEST and offsets such as +05 are refused.';
END
$$;
COMMENT ON FUNCTION dispatch.check_timezone(text) IS
    'Return tz when it is a name from the tz database (pg_timezone_names); raise SQLSTATE 22023 otherwise.';

CREATE OR REPLACE FUNCTION dispatch.cron_next(expr text, after timestamptz, tz text DEFAULT 'UTC')
RETURNS timestamptz
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN dispatch.cron_spec_next(dispatch.cron_parse(expr), after, dispatch.check_timezone(tz));
END
$$;
COMMENT ON FUNCTION dispatch.cron_next(text, timestamptz, text) IS
    'The earliest minute-aligned instant strictly after "after" whose wall-clock time in tz matches the cron expression. Fixed-time expressions follow Debian cron across DST (a skipped time fires at the jump, a repeated one once); expressions whose minute or hour starts with * follow real time.';

CREATE OR REPLACE FUNCTION dispatch.cron_is_valid(expr text)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM dispatch.cron_parse(expr);
    RETURN expr IS NOT NULL;
EXCEPTION WHEN OTHERS THEN
    RETURN false;
END
$$;
COMMENT ON FUNCTION dispatch.cron_is_valid(text) IS
    'True when the expression parses and can fire; never raises.';
