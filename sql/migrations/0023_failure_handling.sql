-- Failure handling a tenant sees (docs/policies.md, "When a schedule keeps failing"): a
-- schedule may pause itself after N runs in a row end error or lost, and every run failure,
-- self-pause and breaker transition is a JSON event on the channel dispatch_events.

ALTER TABLE dispatch.schedules
    ADD COLUMN pause_after_failures integer,
    ADD CONSTRAINT schedules_pause_after_failures_check CHECK (pause_after_failures BETWEEN 1 AND 1000);

COMMENT ON COLUMN dispatch.schedules.pause_after_failures IS
    'After this many runs in a row end error or lost (counted since the schedule was last written, a resume included), the schedule pauses itself, paused_by pgdispatch, with a reason naming the runs. NULL: never.';
