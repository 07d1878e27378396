-- What the invariants of DESIGN.md need from the schema: pausing, the last finished slot, the
-- back-off state of an expression that cannot be evaluated, and a liveness constraint that
-- holds both ways. Also drops the code objects that sql/code/ no longer defines.

-- 1. Code that no longer exists (0003's _runs_finished was dead since 0008) or whose signature
--    changed (complete_run, complete_runs and release_runs are fenced by attempt now).
DROP TRIGGER IF EXISTS _200_skip_pending ON dispatch.schedules;
DROP FUNCTION IF EXISTS dispatch._schedule_skip_pending();
DROP FUNCTION IF EXISTS dispatch._runs_finished(dispatch.runs[]);
DROP FUNCTION IF EXISTS dispatch._finish_batch(dispatch.runs[], boolean);
DROP FUNCTION IF EXISTS dispatch.expire_leases();
DROP FUNCTION IF EXISTS dispatch.complete_runs(text, bigint[], text[], text[], integer[], integer[]);
DROP PROCEDURE IF EXISTS dispatch.complete_run(bigint, text, text, text, integer, integer, boolean, boolean);
DROP FUNCTION IF EXISTS dispatch.release_runs(text, bigint[]);
DROP FUNCTION IF EXISTS dispatch._prune_runs();
DROP FUNCTION IF EXISTS dispatch._prune_audit();

-- 2. New columns.
ALTER TABLE dispatch.schedules
    ADD COLUMN paused_at      timestamptz,
    ADD COLUMN paused_by      text,
    ADD COLUMN paused_reason  text,
    ADD COLUMN last_slot      timestamptz,
    ADD COLUMN backoff_reason text;

COMMENT ON COLUMN dispatch.schedules.paused_at IS
    'Set by dispatch.pause(): the schedule keeps its definition and has no next_run_at until dispatch.resume().';
COMMENT ON COLUMN dispatch.schedules.paused_by IS 'The login (session_user) that paused it.';
COMMENT ON COLUMN dispatch.schedules.paused_reason IS 'Why it was paused, as given to dispatch.pause(); at most 500 characters.';
COMMENT ON COLUMN dispatch.schedules.last_slot IS
    'The latest slot whose run has finished (ok, error, skipped or lost). next_run_at is always later (invariant 2).';
COMMENT ON COLUMN dispatch.schedules.backoff_reason IS
    'Set while the next slot cannot be computed (its zone is gone from the tz database): next_run_at is then a back-off instant, one hour on, at which dispatch.tick records a skipped run and tries again. Never invoked at such an instant (invariant 6).';
COMMENT ON COLUMN dispatch.schedules.next_run_at IS
    'Next slot to fire; NULL exactly when the schedule is stopped (disabled, paused or deleted). Stays on a slot while its run is open; finishing the run advances it past the slot. Written only by the system.';
COMMENT ON COLUMN dispatch.schedules.max_attempts IS 'Claims a run may take before an expired lease makes it lost.';

COMMENT ON COLUMN dispatch.runs.status IS
    'pending: marked by dispatch.tick, or handed back (release_runs, expired lease). '
    'running: claimed by dispatch.claim_runs (attempt incremented). '
    'ok/error: recorded by dispatch.complete_runs for the attempt that holds the run. '
    'skipped: never invoked: its schedule stopped before a first claim, or a back-off period of an expression that cannot be evaluated. '
    'lost: outcome unknown: its lease expired on the last attempt or after its schedule stopped, or it was handed back after an attempt that may have run.';
COMMENT ON COLUMN dispatch.runs.attempt IS
    'Claims so far; dispatch.claim_runs increments it and returns it as the fencing token that complete_runs and release_runs must present. release_runs gives one back.';
COMMENT ON COLUMN dispatch.runs.worker IS
    'Listener that holds (or last held) the run. Informational: the fence is the attempt.';

-- 3. Data (install runs this with search_path = pg_catalog, pg_temp): the last finished slot of each schedule, and the live schedules that an earlier
--    version could leave without a future (next_run_at NULL, or on a finished slot) given
--    one. Only an upgraded database has such rows; it also still has the engine functions of
--    its migrations 0001-0003, which the dynamic statement below calls.
UPDATE dispatch.schedules s
SET last_slot = f.slot
FROM (SELECT r.schedule_id, max(r.scheduled_for) AS slot
      FROM dispatch.runs r
      WHERE r.status IN ('ok', 'error', 'skipped', 'lost')
      GROUP BY r.schedule_id) f
WHERE f.schedule_id = s.id;

DO $$
DECLARE
    s record;
    next_at timestamptz;
BEGIN
    FOR s IN SELECT id, cron_expression, cron_spec, timezone, last_slot
             FROM dispatch.schedules
             WHERE enabled AND deleted_at IS NULL
               AND (next_run_at IS NULL OR next_run_at <= last_slot)
    LOOP
        BEGIN
            EXECUTE 'SELECT dispatch.cron_spec_next($1, $2, $3)' INTO next_at
                USING s.cron_spec, greatest(s.last_slot, clock_timestamp()), s.timezone;
            UPDATE dispatch.schedules SET next_run_at = next_at WHERE id = s.id;
        EXCEPTION WHEN OTHERS THEN
            UPDATE dispatch.schedules
            SET next_run_at = greatest(s.last_slot, clock_timestamp()) + interval '1 hour',
                backoff_reason = format('cannot compute the next slot of "%s" in time zone %s: %s',
                                     s.cron_expression, s.timezone, SQLERRM)
            WHERE id = s.id;
        END;
    END LOOP;
END
$$;

-- 4. Constraints: live <=> a next slot, always after the last finished one.
ALTER TABLE dispatch.schedules
    DROP CONSTRAINT schedules_next_run_at_live_check,
    ADD CONSTRAINT schedules_next_run_at_live_check
        CHECK ((next_run_at IS NOT NULL) = (enabled AND deleted_at IS NULL AND paused_at IS NULL)),
    ADD CONSTRAINT schedules_next_run_at_after_last_slot_check
        CHECK (next_run_at > last_slot),
    ADD CONSTRAINT schedules_paused_check
        CHECK (paused_at IS NOT NULL OR (paused_by IS NULL AND paused_reason IS NULL)),
    ADD CONSTRAINT schedules_paused_reason_length_check
        CHECK (length(paused_reason) <= 500),
    ADD CONSTRAINT schedules_backoff_check
        CHECK (backoff_reason IS NULL OR next_run_at IS NOT NULL);
