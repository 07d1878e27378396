-- A circuit breaker per (project_id, function_name) (sql/code/39_breakers.sql).
--
-- After breaker_threshold consecutive retryable failures of a function within breaker_window,
-- its breaker opens: its runs wait, pending with not_before, without using up attempts, while
-- one probe run at a time goes out, spaced from breaker_probe_spacing doubling up to
-- breaker_probe_spacing_max; the first answer that is not a retryable failure closes it.

ALTER TABLE dispatch.settings
    ADD COLUMN breaker_threshold integer NOT NULL DEFAULT 5,
    ADD COLUMN breaker_window interval NOT NULL DEFAULT interval '5 minutes',
    ADD COLUMN breaker_probe_spacing interval NOT NULL DEFAULT interval '1 second',
    ADD COLUMN breaker_probe_spacing_max interval NOT NULL DEFAULT interval '10 seconds',
    ADD CONSTRAINT settings_breaker_threshold_check CHECK (breaker_threshold BETWEEN 0 AND 10000),
    ADD CONSTRAINT settings_breaker_window_check CHECK (breaker_window > interval '0'),
    ADD CONSTRAINT settings_breaker_probe_spacing_check
        CHECK (breaker_probe_spacing >= interval '10 milliseconds' AND breaker_probe_spacing <= breaker_probe_spacing_max
               AND breaker_probe_spacing_max <= interval '1 hour');
COMMENT ON COLUMN dispatch.settings.breaker_threshold IS
    'Consecutive retryable failures of one function (project_id, function_name) within breaker_window that open its breaker. 0: breakers never open.';
COMMENT ON COLUMN dispatch.settings.breaker_window IS
    'The failures that open a breaker all fall within this long of the first of them; a streak older than this starts again.';
COMMENT ON COLUMN dispatch.settings.breaker_probe_spacing IS
    'The time between two probes of an open breaker: the first goes this long after it opened; doubled after each probe, up to breaker_probe_spacing_max; each wait less up to a quarter, at random.';
COMMENT ON COLUMN dispatch.settings.breaker_probe_spacing_max IS
    'The most time between two probes of an open breaker, and so how long its waiting runs wait at most after the function answers again.';

CREATE TABLE dispatch.breakers (
    project_id    text NOT NULL,
    function_name text NOT NULL,
    state         text NOT NULL DEFAULT 'closed',
    failures      integer NOT NULL DEFAULT 0,
    failing_since timestamptz,
    last_error    text,
    opened_at     timestamptz,
    probes        integer NOT NULL DEFAULT 0,
    next_probe_at timestamptz,
    probe_run_id  bigint,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, function_name),
    CONSTRAINT breakers_state_check CHECK (state IN ('closed', 'open')),
    CONSTRAINT breakers_open_check CHECK ((state = 'open') = (opened_at IS NOT NULL AND next_probe_at IS NOT NULL)),
    CONSTRAINT breakers_failures_check CHECK (failures >= 0 AND probes >= 0)
);
COMMENT ON TABLE dispatch.breakers IS
    'The circuit breaker of each function that failed retryably (one row per project_id, function_name; written only by the system and dispatch.reset_breaker). While open, its runs wait (pending with not_before, attempts kept) and one probe run at a time is invoked.';
-- A row stays once a function has failed: the claims and completions that ask whether any
-- breaker is open, or counting, read only those.
CREATE INDEX breakers_open_idx ON dispatch.breakers (project_id, function_name) WHERE state = 'open';
CREATE INDEX breakers_counting_idx ON dispatch.breakers (project_id, function_name)
    WHERE state = 'open' OR failures > 0;
COMMENT ON COLUMN dispatch.breakers.state IS
    'closed: runs go as usual (set by a successful answer, dispatch.reset_breaker); open: runs wait, one probe at a time (set by complete_runs at breaker_threshold failures).';
COMMENT ON COLUMN dispatch.breakers.failures IS
    'Consecutive retryable failures since failing_since (reset by any other outcome).';
COMMENT ON COLUMN dispatch.breakers.probes IS 'Probe runs handed out since the breaker opened.';
COMMENT ON COLUMN dispatch.breakers.next_probe_at IS
    'While open: the earliest instant the next probe may go out.';
COMMENT ON COLUMN dispatch.breakers.probe_run_id IS
    'The run last handed out as a probe: in flight while that run is running.';

-- A run waiting behind an open breaker (its not_before set by the claim that held it back), so
-- that closing the breaker lets exactly those go at once, and a retry keeps its own back-off.
ALTER TABLE dispatch.runs ADD COLUMN held_by_breaker boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN dispatch.runs.held_by_breaker IS
    'Pending because its function''s breaker is open (set by claim_runs, cleared when it is claimed or the breaker closes).';
CREATE INDEX runs_held_by_breaker_idx ON dispatch.runs (schedule_id) WHERE held_by_breaker AND status = 'pending';
