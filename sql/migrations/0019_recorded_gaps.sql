-- Recorded gaps (invariant 8): the slots no run stands for, one audit row
-- schedule.slots.skipped per gap (sql/code/37_gaps.sql).
--
-- Listeners count them by reason (dispatch.skipped_slots_after), reading only the rows added
-- since they last looked, like lost runs (0015): the hot path's audit inserts do not pay for it.
CREATE INDEX audit_log_skipped_slots_idx ON dispatch.audit_log (id) WHERE action = 'schedule.slots.skipped';

-- A stopped schedule has no next_run_at: where it stood is kept here, so that when it goes on
-- again the slots it passed over since are recorded once, from there (and a stop and start with
-- no slot between records nothing).
ALTER TABLE dispatch.schedules ADD COLUMN stopped_on timestamptz;
COMMENT ON COLUMN dispatch.schedules.stopped_on IS
    'Derived: the slot a paused or disabled schedule was on when it stopped (NULL while live, and after an edit of its rule). The gap recorded when it goes on again starts there.';
