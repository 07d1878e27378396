-- The schema and the bookkeeping of migrations; idempotent, run before every install.
CREATE SCHEMA IF NOT EXISTS dispatch;
COMMENT ON SCHEMA dispatch IS 'pgdispatch: cron schedules dispatched over HTTP (https://github.com/pgdispatch/pgdispatch)';

CREATE TABLE IF NOT EXISTS dispatch.migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL UNIQUE,
    applied_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE dispatch.migrations IS
    'Applied migrations (sql/migrations/NNNN_name.sql). Each is recorded in the transaction that applies it, first, so that a concurrent or repeated install fails before changing anything.';
