-- Run policies (DESIGN.md, "Scheduling policies"): retries with back-off, a per-schedule
-- timeout, misfire grace and catch-up, overlap. The defaults keep what schedules did before,
-- except that max_attempts now also counts failed attempts.

-- Signatures that change: claim_runs returns each run's timeout, complete_runs takes whether
-- each failure may be retried and how long the function asked to wait.
DROP FUNCTION IF EXISTS dispatch.claim_runs(text, integer, interval);
DROP FUNCTION IF EXISTS dispatch.complete_runs(text, bigint[], integer[], text[], text[], integer[], integer[]);
DROP PROCEDURE IF EXISTS dispatch.complete_run(bigint, text, integer, text, text, integer, integer, boolean, boolean, boolean);

ALTER TABLE dispatch.schedules
    ADD COLUMN retry_backoff     interval NOT NULL DEFAULT interval '10 seconds',
    ADD COLUMN retry_backoff_max interval NOT NULL DEFAULT interval '5 minutes',
    ADD COLUMN timeout           interval,
    ADD COLUMN misfire_grace     interval,
    ADD COLUMN catchup           text NOT NULL DEFAULT 'latest',
    ADD COLUMN overlap           text NOT NULL DEFAULT 'skip',
    ADD CONSTRAINT schedules_retry_backoff_check
        CHECK (retry_backoff > interval '0' AND retry_backoff <= retry_backoff_max),
    ADD CONSTRAINT schedules_retry_backoff_max_check CHECK (retry_backoff_max <= interval '1 day'),
    ADD CONSTRAINT schedules_timeout_check CHECK (timeout > interval '0' AND timeout <= interval '1 hour'),
    ADD CONSTRAINT schedules_misfire_grace_check CHECK (misfire_grace > interval '0'),
    ADD CONSTRAINT schedules_catchup_check
        CHECK (catchup IN ('latest', 'all') AND (catchup = 'latest' OR misfire_grace IS NOT NULL)),
    ADD CONSTRAINT schedules_overlap_check CHECK (overlap IN ('skip', 'buffer_one', 'allow'));

COMMENT ON COLUMN dispatch.schedules.max_attempts IS
    'Invocation attempts of one run, failed attempts and lost leases alike. A retryable failure (connection, timeout, HTTP 5xx, 408, 429) is retried while attempts are left.';
COMMENT ON COLUMN dispatch.schedules.retry_backoff IS
    'Back-off before the first retry; doubled for each retry, with full jitter (a random share of it), capped at retry_backoff_max.';
COMMENT ON COLUMN dispatch.schedules.retry_backoff_max IS 'The longest back-off between two attempts, Retry-After included.';
COMMENT ON COLUMN dispatch.schedules.timeout IS
    'Invocation timeout of this schedule''s runs (NULL: the listener''s --timeout); the lease follows it.';
COMMENT ON COLUMN dispatch.schedules.misfire_grace IS
    'A slot that cannot start within this long after its instant is not invoked: it ends skipped ("missed by ..."). NULL: no limit.';
COMMENT ON COLUMN dispatch.schedules.catchup IS
    'After downtime: latest runs only the most recent missed slot; all runs every missed slot within misfire_grace, oldest first.';
COMMENT ON COLUMN dispatch.schedules.overlap IS
    'While a run is open: skip the slots that come due; buffer_one lets one wait and run right after; allow runs each slot at its time.';

ALTER TABLE dispatch.runs
    ADD COLUMN not_before       timestamptz,
    ADD COLUMN earlier_attempts jsonb,
    ADD CONSTRAINT runs_not_before_check CHECK (not_before IS NULL OR status = 'pending');

COMMENT ON COLUMN dispatch.runs.not_before IS
    'A pending run is not claimed before this: a retry''s back-off, or infinity while it waits behind the run ahead of it (overlap buffer_one).';
COMMENT ON COLUMN dispatch.runs.earlier_attempts IS
    'The attempts before the last, for the audit row: attempt, status (error or lost), error, http_status, duration_ms, at. NULL while there was only one.';

-- Claiming reads two queues: runs ready now in slot order, and retries in the order they come
-- due. A backlog of retries waiting for their back-off is never scanned by the first.
DROP INDEX dispatch.runs_pending_idx;
CREATE INDEX runs_pending_idx ON dispatch.runs (scheduled_for, id) WHERE status = 'pending' AND not_before IS NULL;
CREATE INDEX runs_not_before_idx ON dispatch.runs (not_before, id) WHERE status = 'pending' AND not_before IS NOT NULL;

-- overlap allow and buffer_one may keep more than one run open per schedule; the rule of one
-- open run for skip is kept by tick, which marks a schedule's runs only while it holds its row.
DROP INDEX dispatch.runs_one_open_per_schedule_key;
CREATE INDEX runs_open_idx ON dispatch.runs (schedule_id) WHERE status IN ('pending', 'running');
