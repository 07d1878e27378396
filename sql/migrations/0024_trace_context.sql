-- Trace context (docs/functions.md, "Trace context"): every invocation carries a W3C
-- traceparent header, one trace id per run and one span id per attempt, both derived from the
-- run's request id (dispatch.traceparent); a traceparent given on a schedule or to
-- dispatch.run_now is continued: its trace id, with the invocation's span as its child.

ALTER TABLE dispatch.schedules
    ADD COLUMN traceparent text,
    ADD CONSTRAINT schedules_traceparent_check CHECK (traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$');
COMMENT ON COLUMN dispatch.schedules.traceparent IS
    'A W3C traceparent that the schedule''s runs continue: their trace id is its trace id, and each attempt''s span a child of its span. NULL: each run is a trace of its own.';

-- Set by dispatch.run_now, or from the schedule's when the run is first claimed: what the run
-- continues, the same on every attempt.
ALTER TABLE dispatch.runs ADD COLUMN traceparent text;
COMMENT ON COLUMN dispatch.runs.traceparent IS
    'The W3C traceparent the run continues (given to dispatch.run_now, or the schedule''s when it was first claimed); NULL: a trace of its own. Each attempt''s own: dispatch.run_trace(id).';

-- run_now takes the traceparent to continue
DROP FUNCTION IF EXISTS dispatch.run_now(uuid);
