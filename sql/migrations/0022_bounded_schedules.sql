-- One-shot and bounded schedules (docs/schedules.md, "Once, and within bounds"): a schedule
-- fires once at run_at, or on its rule only within [starts_at, ends_at] and for at most
-- max_runs slots; when its last slot is past it ends (ended_at, ended_reason) and keeps its
-- history.

-- The bounds travel in the slot rule, so that every place that computes slots (tick,
-- completion, gaps, backfill, explain) keeps within them.
ALTER TYPE dispatch.cron_spec
    ADD ATTRIBUTE starts_at timestamptz,  -- no slot before this instant
    ADD ATTRIBUTE ends_at   timestamptz;  -- no slot after this one: ends_at, or the max_runs-th slot

ALTER TABLE dispatch.schedules
    ADD COLUMN run_at       timestamptz,
    ADD COLUMN starts_at    timestamptz,
    ADD COLUMN ends_at      timestamptz,
    ADD COLUMN max_runs     integer,
    ADD COLUMN ended_at     timestamptz,
    ADD COLUMN ended_reason text,
    DROP CONSTRAINT schedules_slot_rule_check,
    ADD CONSTRAINT schedules_slot_rule_check CHECK (num_nonnulls(cron_expression, every, run_at) = 1),
    ADD CONSTRAINT schedules_bounds_check
        CHECK (ends_at >= starts_at AND max_runs BETWEEN 1 AND 10000
               AND (run_at IS NULL OR num_nonnulls(starts_at, ends_at, max_runs) = 0)),
    -- live <=> a next slot, as before, for a schedule that has not ended
    DROP CONSTRAINT schedules_next_run_at_live_check,
    ADD CONSTRAINT schedules_next_run_at_live_check
        CHECK ((next_run_at IS NOT NULL) = (enabled AND deleted_at IS NULL AND paused_at IS NULL AND ended_at IS NULL)),
    ADD CONSTRAINT schedules_ended_check CHECK ((ended_at IS NULL) = (ended_reason IS NULL));

COMMENT ON COLUMN dispatch.schedules.run_at IS
    'A one-shot schedule (instead of cron_expression or every): its one slot is this instant; then it ends.';
COMMENT ON COLUMN dispatch.schedules.starts_at IS
    'No slot before this instant (NULL: from the creation). max_runs counts slots from here.';
COMMENT ON COLUMN dispatch.schedules.ends_at IS
    'No slot after this instant (NULL: no end); when the last slot is past the schedule ends.';
COMMENT ON COLUMN dispatch.schedules.max_runs IS
    'At most this many slots, the first ones at or after starts_at (set to the creation time when left NULL), 1 to 10,000; each becomes a run or lies in a recorded gap.';
COMMENT ON COLUMN dispatch.schedules.ended_at IS
    'When the schedule passed its last slot (run_at, ends_at or max_runs) and ended: it has no next_run_at; an edit that gives it slots again clears this.';
COMMENT ON COLUMN dispatch.schedules.ended_reason IS
    'Why the schedule ended: which bound its last slot came from.';
