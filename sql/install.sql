-- pgdispatch: the psql entry point. On an empty database, and again at any time:
--
--   psql -v ON_ERROR_STOP=1 -d "$DB" -f sql/install.sql
--
-- One transaction: the migrations in sql/migrations/ that dispatch.migrations does not list yet
-- (tables, types, indexes, data; each applied once), then every file in sql/code/ (functions,
-- triggers, views, grants; re-applied in full, so each has exactly one definition). Then it
-- registers the pg_cron jobs where pg_cron lives in this database, or says what to do.
\set ON_ERROR_STOP 1
\set QUIET 1
SET client_min_messages = warning;

BEGIN;
-- One install at a time: a second one waits here, then finds the migrations applied.
SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('pgdispatch install')) AS locked \gset
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
\set version 11
\set name 0011_invariants
\ir apply_migration.psql
\set version 12
\set name 0012_run_policies
\ir apply_migration.psql
\set version 13
\set name 0013_run_kinds
\ir apply_migration.psql
\set version 14
\set name 0014_interval_schedules
\ir apply_migration.psql
\set version 15
\set name 0015_lost_runs_index
\ir apply_migration.psql
\set version 16
\set name 0016_schedules_fillfactor
\ir apply_migration.psql
\set version 17
\set name 0017_project_id_check
\ir apply_migration.psql
\set version 18
\set name 0018_run_releases
\ir apply_migration.psql
\set version 19
\set name 0019_recorded_gaps
\ir apply_migration.psql
\set version 20
\set name 0020_projects
\ir apply_migration.psql
\set version 21
\set name 0021_breakers
\ir apply_migration.psql
\set version 22
\set name 0022_bounded_schedules
\ir apply_migration.psql
\set version 23
\set name 0023_failure_handling
\ir apply_migration.psql
\set version 24
\set name 0024_trace_context
\ir apply_migration.psql
\set version 25
\set name 0025_event_webhooks
\ir apply_migration.psql
\set version 26
\set name 0026_calendars
\ir apply_migration.psql
\set version 27
\set name 0027_history_keeps_its_space
\ir apply_migration.psql
\ir code/10_cron_engine.sql
\ir code/15_schema_version.sql
\ir code/20_timezones.sql
\ir code/30_schedules.sql
\ir code/31_calendars.sql
\ir code/35_runs.sql
\ir code/36_traces.sql
\ir code/37_gaps.sql
\ir code/38_events.sql
\ir code/39_breakers.sql
\ir code/40_finish.sql
\ir code/41_tick.sql
\ir code/42_claim.sql
\ir code/43_complete.sql
\ir code/44_release.sql
\ir code/45_next_due.sql
\ir code/50_retention.sql
\ir code/60_pg_cron.sql
\ir code/70_views.sql
\ir code/75_metrics.sql
\ir code/80_operator.sql
\ir code/85_explain.sql
\ir code/90_grants.sql
COMMIT;

SELECT dispatch.register_cron_job() AS cron_status \gset
\echo :cron_status
