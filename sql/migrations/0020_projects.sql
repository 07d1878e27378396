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

-- The two claim queues per project. Claims read pending runs only through these now, so the
-- global slot queue goes: the hot path keeps as many indexes as before (a run with no
-- not_before is in one pending index, not two). The global not_before queue stays (the tick
-- asks whether any retry is due, next_due_after when the first one is). The running runs of a
-- project (max_concurrency) are counted through runs_running_lease_idx: they are at most what
-- the listeners' concurrency allows, not worth an index that every claim writes to.
CREATE INDEX runs_project_pending_idx ON dispatch.runs (project_id, scheduled_for, id)
    WHERE status = 'pending' AND not_before IS NULL;
CREATE INDEX runs_project_not_before_idx ON dispatch.runs (project_id, not_before, id)
    WHERE status = 'pending' AND not_before IS NOT NULL;
DROP INDEX dispatch.runs_pending_idx;

-- The due schedules per project: each chunk of the tick marks every project's first due
-- schedules before anyone's thousandth. It serves what the index on project_id alone did (the
-- CLI's and a DBA's queries by project), which it replaces: a schedule's write keeps its
-- number of index entries.
CREATE INDEX schedules_project_next_run_at_idx ON dispatch.schedules (project_id, next_run_at);
DROP INDEX dispatch.schedules_project_id_idx;
