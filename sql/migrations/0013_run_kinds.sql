-- Runs that are not one of the schedule's own slots (DESIGN.md, dispatch.runs.kind): a run an
-- operator asked for now (dispatch.run_now), and later backfills. They never move the
-- schedule's slots: last_slot and next_run_at follow scheduled runs only.
ALTER TABLE dispatch.runs
    ADD COLUMN kind text NOT NULL DEFAULT 'scheduled',
    ADD CONSTRAINT runs_kind_check CHECK (kind IN ('scheduled', 'manual', 'backfill'));

COMMENT ON COLUMN dispatch.runs.kind IS
    'scheduled: one of the schedule''s slots, marked by tick; manual: asked for by dispatch.run_now, due at the instant of the call; backfill: a past slot marked by dispatch.backfill.';
