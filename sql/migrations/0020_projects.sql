-- Fairness between tenants (sql/code/42_claim.sql, 41_tick.sql): claims and the tick's chunks
-- take due work project by project, and a project may cap how many of its runs run at once.

-- Optional: a project without a row has the defaults (no cap, weight 1).
CREATE TABLE dispatch.projects (
    project_id      text PRIMARY KEY,
    max_concurrency integer CHECK (max_concurrency > 0),
    weight          integer NOT NULL DEFAULT 1 CHECK (weight > 0)
);
COMMENT ON TABLE dispatch.projects IS
    'Per-project dispatch settings, optional: a project without a row runs uncapped with weight 1. Written by dispatch_admin.';
COMMENT ON COLUMN dispatch.projects.project_id IS 'The project (dispatch.schedules.project_id) these settings are for.';
COMMENT ON COLUMN dispatch.projects.max_concurrency IS
    'At most this many of the project''s runs are running at once, across all listeners (dispatch.claim_runs); NULL: no cap.';
COMMENT ON COLUMN dispatch.projects.weight IS
    'The project''s share when several projects have due runs: a claim takes about weight runs of it for each run of a weight-1 project.';

-- Each run carries its schedule's project, so that claims find the projects with due runs by
-- walking an index (a loose index scan) rather than the queue. Set by every statement that
-- inserts a run, from the schedule row it already has (no trigger: the tick's insert is hot).
ALTER TABLE dispatch.runs ADD COLUMN project_id text;
UPDATE dispatch.runs r SET project_id = s.project_id FROM dispatch.schedules s WHERE s.id = r.schedule_id;
ALTER TABLE dispatch.runs ALTER COLUMN project_id SET NOT NULL;
COMMENT ON COLUMN dispatch.runs.project_id IS
    'The schedule''s project_id when the run was marked; an open run (pending, running) follows a change of the schedule''s project_id.';

-- The two claim queues per project, and the running runs per project (max_concurrency).
CREATE INDEX runs_project_pending_idx ON dispatch.runs (project_id, scheduled_for, id)
    WHERE status = 'pending' AND not_before IS NULL;
CREATE INDEX runs_project_not_before_idx ON dispatch.runs (project_id, not_before, id)
    WHERE status = 'pending' AND not_before IS NOT NULL;
CREATE INDEX runs_project_running_idx ON dispatch.runs (project_id) WHERE status = 'running';

-- The due schedules per project: each chunk of the tick marks every project's first due
-- schedules before anyone's thousandth.
-- (project_id IS NOT NULL, always true, keeps it out of the plans of queries on next_run_at
-- alone, which schedules_next_run_at_idx serves: the planner uses a partial index only for a
-- query whose conditions imply its predicate, and a condition on project_id is what does.)
CREATE INDEX schedules_project_next_run_at_idx ON dispatch.schedules (project_id, next_run_at)
    WHERE next_run_at IS NOT NULL AND project_id IS NOT NULL;
