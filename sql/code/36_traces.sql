-- Trace context: the W3C traceparent each invocation carries (docs/functions.md, "Trace
-- context"). Derived, so that nothing is written for it on the hot path and anyone can compute
-- it again: the trace id is the run's request id (its UUID's 32 hex digits), the same on every
-- attempt; the span id of an attempt is the first 16 hex digits of sha256('<request id>/<attempt>').
-- A run that continues a given traceparent takes its trace id and flags instead.

CREATE OR REPLACE FUNCTION dispatch._check_traceparent(value text, field text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF value IS NOT NULL AND (value !~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
                              OR substr(value, 4, 32) = repeat('0', 32) OR substr(value, 37, 16) = repeat('0', 16)) THEN
        RAISE EXCEPTION '% % is not a W3C traceparent', field, quote_literal(left(value, 80))
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Version 00, lowercase: 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>, neither id all zeros, e.g. 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01.';
    END IF;
    RETURN value;
END
$$;

CREATE OR REPLACE FUNCTION dispatch.traceparent(request_id text, attempt integer, parent text DEFAULT NULL)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT '00-'
           || coalesce(substr(parent, 4, 32),
                       CASE WHEN request_id ~ '^sched_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                            THEN replace(substr(request_id, 7), '-', '')
                            ELSE left(encode(sha256(convert_to(request_id, 'UTF8')), 'hex'), 32) END)
           || '-' || left(encode(sha256(convert_to(request_id || '/' || attempt, 'UTF8')), 'hex'), 16)
           || '-' || coalesce(right(parent, 2), '01')
$$;
COMMENT ON FUNCTION dispatch.traceparent(text, integer, text) IS
    'The W3C traceparent header of attempt `attempt` of the run with this request id: trace id the request id''s UUID (or parent''s trace id), span id the first 16 hex digits of sha256(''<request id>/<attempt>''), flags parent''s or 01 (sampled).';

CREATE OR REPLACE FUNCTION dispatch.run_trace(run_id bigint)
RETURNS TABLE (attempt integer, trace_id text, span_id text, parent_span_id text, traceparent text)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT a, substr(t.tp, 4, 32), substr(t.tp, 37, 16), substr(r.traceparent, 37, 16), t.tp
    FROM dispatch.runs r
    CROSS JOIN generate_series(1, r.attempt) a
    CROSS JOIN LATERAL (SELECT dispatch.traceparent(r.request_id, a, r.traceparent) AS tp) t
    WHERE r.id = run_trace.run_id
    ORDER BY a
$$;
COMMENT ON FUNCTION dispatch.run_trace(bigint) IS
    'The trace of a run: one row per attempt that was claimed (attempt is the fencing token), with its trace id (the same for all), its span id, the span it is a child of (when the run continues a given traceparent) and the traceparent header it was sent with. Read-only; granted to dispatch_reader.';
