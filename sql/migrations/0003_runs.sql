-- Runs: one row per fired slot of a schedule. Its state transitions (tick, claim_runs,
-- complete_runs, release_runs, lease expiry) are functions in sql/code/.

CREATE TABLE dispatch.runs (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    schedule_id   uuid NOT NULL REFERENCES dispatch.schedules (id) ON DELETE CASCADE,
    scheduled_for timestamptz NOT NULL,
    status        text NOT NULL DEFAULT 'pending',
    request_id    text NOT NULL DEFAULT 'sched_' || gen_random_uuid(),
    attempt       integer NOT NULL DEFAULT 0,
    worker        text,
    claimed_at    timestamptz,
    lease_until   timestamptz,
    finished_at   timestamptz,
    error         text,
    http_status   integer,
    duration_ms   integer,
    created_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT runs_slot_key UNIQUE (schedule_id, scheduled_for),
    CONSTRAINT runs_status_check
        CHECK (status IN ('pending', 'running', 'ok', 'error', 'skipped', 'lost')),
    CONSTRAINT runs_running_has_lease_check
        CHECK (status <> 'running' OR (worker IS NOT NULL AND lease_until > claimed_at)),
    CONSTRAINT runs_finished_at_check
        CHECK ((status IN ('pending', 'running')) = (finished_at IS NULL)),
    CONSTRAINT runs_error_length_check
        CHECK (length(error) <= 500),
    CONSTRAINT runs_attempt_check
        CHECK (attempt >= 0)
);
COMMENT ON TABLE dispatch.runs IS 'One row per fired slot of a schedule.';
COMMENT ON COLUMN dispatch.runs.scheduled_for IS 'The slot: the schedule''s next_run_at when dispatch.tick marked it.';
COMMENT ON COLUMN dispatch.runs.status IS
    'pending: marked by dispatch.tick, or handed back (release_runs, expired lease). '
    'running: claimed by dispatch.claim_runs. ok/error: recorded by dispatch.complete_run. '
    'skipped: its schedule was disabled or deleted before it was invoked. '
    'lost: its lease expired on the last attempt.';
COMMENT ON COLUMN dispatch.runs.request_id IS
    'sched_<uuid>, sent as X-Request-Id and Idempotency-Key; stable across the attempts of this run.';
COMMENT ON COLUMN dispatch.runs.attempt IS 'Claims so far; a claim increments it, release_runs gives one back.';
COMMENT ON COLUMN dispatch.runs.worker IS 'Listener that holds (or last held) the run; only it may complete the run.';
COMMENT ON COLUMN dispatch.runs.lease_until IS 'A running run whose lease passes is retried or lost by dispatch.tick.';
COMMENT ON COLUMN dispatch.runs.error IS 'Why the run failed, was skipped or lost; at most 500 characters.';

-- A queue table: every run leaves the pending and running indexes within seconds, and the
-- dead entries it leaves slow down the next claims until vacuum removes them. Vacuum it after
-- 1 % of its rows changed rather than the default 20 %.
ALTER TABLE dispatch.runs SET (autovacuum_vacuum_scale_factor = 0.01,
                               autovacuum_vacuum_insert_scale_factor = 0.01,
                               autovacuum_analyze_scale_factor = 0.02);

-- Claiming reads pending runs in slot order; expiry reads running runs by lease. Both stay
-- small however much history the table holds.
CREATE INDEX runs_pending_idx ON dispatch.runs (scheduled_for, id) WHERE status = 'pending';
CREATE INDEX runs_running_lease_idx ON dispatch.runs (lease_until) WHERE status = 'running';
-- No overlap: a schedule has at most one run in flight.
CREATE UNIQUE INDEX runs_one_open_per_schedule_key ON dispatch.runs (schedule_id)
    WHERE status IN ('pending', 'running');
