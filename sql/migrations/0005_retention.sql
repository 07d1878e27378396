-- Bounded history: the settings that dispatch.prune (sql/code/) reads, and the index it uses.

CREATE TABLE dispatch.settings (
    singleton        boolean PRIMARY KEY DEFAULT true,
    runs_retention   interval NOT NULL DEFAULT interval '14 days',
    audit_retention  interval NOT NULL DEFAULT interval '90 days',
    prune_batch_size integer NOT NULL DEFAULT 5000,
    CONSTRAINT settings_singleton_check CHECK (singleton),
    CONSTRAINT settings_runs_retention_check CHECK (runs_retention >= interval '1 hour'),
    CONSTRAINT settings_audit_retention_check CHECK (audit_retention >= interval '1 hour'),
    CONSTRAINT settings_prune_batch_size_check CHECK (prune_batch_size BETWEEN 100 AND 1000000)
);
COMMENT ON TABLE dispatch.settings IS
    'One row of settings, changed with one statement, e.g. UPDATE dispatch.settings SET runs_retention = ''30 days''.';
COMMENT ON COLUMN dispatch.settings.runs_retention IS 'Finished runs older than this (by finished_at) are pruned.';
COMMENT ON COLUMN dispatch.settings.audit_retention IS 'Audit rows older than this (by at) are pruned.';
COMMENT ON COLUMN dispatch.settings.prune_batch_size IS 'Rows deleted per transaction by dispatch.prune.';
INSERT INTO dispatch.settings DEFAULT VALUES;

-- Runs are inserted in time order, so a BRIN index finds the old ones for almost no upkeep.
CREATE INDEX runs_created_at_brin_idx ON dispatch.runs USING brin (created_at);
