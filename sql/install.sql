-- pgdispatch: the psql entry point. On an empty database, and again at any time:
--
--   psql -v ON_ERROR_STOP=1 -d "$DB" -f sql/install.sql
--
-- Applies each migration in sql/migrations/ that dispatch.migrations does not list yet, then
-- registers the pg_cron job where pg_cron lives in this database (else says what to do).
\set ON_ERROR_STOP 1
\set QUIET 1
SET client_min_messages = warning;

\ir bootstrap.sql

\set version 1
\set name 0001_cron_engine
\ir apply_migration.psql
\set version 2
\set name 0002_schedules
\ir apply_migration.psql
\set version 3
\set name 0003_runs
\ir apply_migration.psql
\set version 4
\set name 0004_pg_cron
\ir apply_migration.psql
\set version 5
\set name 0005_retention
\ir apply_migration.psql
\set version 6
\set name 0006_views
\ir apply_migration.psql
\set version 7
\set name 0007_roles
\ir apply_migration.psql
\set version 8
\set name 0008_batch_next_slots
\ir apply_migration.psql
\set version 9
\set name 0009_fillfactor
\ir apply_migration.psql
\set version 10
\set name 0010_next_due_after
\ir apply_migration.psql

SELECT dispatch.register_cron_job() AS cron_status \gset
\echo :cron_status
