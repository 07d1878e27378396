-- Interval schedules and jitter (DESIGN.md, "Scheduling policies"): a schedule has either a cron
-- expression or an interval (every, from an anchor), and may spread its slots' fire instants
-- over a jitter window. Runs carry the instant they fire at (fire_at).

-- The slot rule stays one derived value per schedule, so that every place that computes slots
-- (tick, completion, retries, backfill) does so for both kinds: an interval schedule's
-- cron_spec has no cron fields, only every_us and anchor.
ALTER TYPE dispatch.cron_spec
    ADD ATTRIBUTE every_us bigint,       -- an interval schedule: slots every this many microseconds
    ADD ATTRIBUTE anchor   timestamptz;  -- ... at anchor + k * every, k any integer
COMMENT ON TYPE dispatch.cron_spec IS
    'A schedule''s slot rule, derived by its write trigger: a parsed cron expression (dispatch.cron_parse), or an interval (every_us, anchor; the cron fields NULL). Stored on each schedule so that evaluation never re-parses.';

-- claim_runs returns fire_at too
DROP FUNCTION IF EXISTS dispatch.claim_runs(text, integer, interval, interval);

ALTER TABLE dispatch.schedules
    ALTER COLUMN cron_expression DROP NOT NULL,
    ADD COLUMN every  interval,
    ADD COLUMN anchor timestamptz,
    ADD COLUMN jitter interval NOT NULL DEFAULT interval '0',
    ADD CONSTRAINT schedules_slot_rule_check CHECK ((cron_expression IS NULL) <> (every IS NULL)),
    ADD CONSTRAINT schedules_every_check
        CHECK (every >= interval '1 second' AND every <= interval '366 days'
               AND extract(month FROM every) = 0 AND extract(year FROM every) = 0),
    ADD CONSTRAINT schedules_anchor_check CHECK ((anchor IS NULL) = (every IS NULL)),
    ADD CONSTRAINT schedules_jitter_check
        CHECK (jitter >= interval '0' AND jitter <= interval '1 day' AND (every IS NULL OR jitter <= every));

COMMENT ON COLUMN dispatch.schedules.cron_expression IS
    'The cron expression whose matching instants are the slots (NULL for an interval schedule: see every).';
COMMENT ON COLUMN dispatch.schedules.cron_spec IS
    'The slot rule, derived by the write trigger: cron_expression parsed (dispatch.cron_parse), or every and anchor.';
COMMENT ON COLUMN dispatch.schedules.every IS
    'An interval schedule (instead of cron_expression): slots at anchor + k * every, at least 1 second apart, in real time (a day is 24 hours; DST does not apply, and timezone is not used).';
COMMENT ON COLUMN dispatch.schedules.anchor IS
    'The instant an interval schedule''s slots are counted from (default: created_at); NULL for a cron schedule.';
COMMENT ON COLUMN dispatch.schedules.jitter IS
    'Each slot fires at scheduled_for + an offset in [0, jitter), fixed by a hash of the schedule id and the slot (dispatch.jitter_offset): spreads schedules that share a slot. 0: on the slot.';

-- The instant a run is invoked from: its slot plus the schedule's jitter offset for a
-- scheduled run, the slot itself for a manual or backfill one. Runs that finished before this
-- migration keep NULL (they fired at scheduled_for); open ones get their slot.
ALTER TABLE dispatch.runs ADD COLUMN fire_at timestamptz;
UPDATE dispatch.runs SET fire_at = scheduled_for WHERE status IN ('pending', 'running');
ALTER TABLE dispatch.runs
    ADD CONSTRAINT runs_fire_at_check CHECK (fire_at IS NOT NULL OR status NOT IN ('pending', 'running'));
COMMENT ON COLUMN dispatch.runs.fire_at IS
    'When the run is invoked: scheduled_for plus the schedule''s jitter offset (a run marked before its fire instant waits in not_before until then). NULL only on runs that finished before schema version 14.';
