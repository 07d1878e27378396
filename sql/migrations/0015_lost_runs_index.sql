-- Lost runs are rare and worth an alert: listeners count them (dispatch.lost_runs_after) by
-- reading only the audit rows of lost runs added since they last looked. This index holds
-- nothing else, so the hot path's audit inserts do not pay for it.
CREATE INDEX audit_log_lost_runs_idx ON dispatch.audit_log (id) WHERE action = 'schedule.run.lost';
