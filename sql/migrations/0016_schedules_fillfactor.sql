-- Room on each schedules page for the version that finishing a run writes.
--
-- Every finished run rewrites its schedule (next_run_at, last_*), and the update cannot be HOT
-- (next_run_at is indexed). When the new version finds no room on the old one's page it goes to
-- another page: PostgreSQL then logs a lock record for the old version and the whole new row
-- rather than the bytes that changed. At fillfactor 80 (0009_fillfactor.sql) that happened to
-- about 3 updates in 10. Measured with bench.claim (steady state, pg_waldump by relation):
-- WAL charged to schedules per dispatched run 368 -> 322 bytes, 2,605 -> 2,557 in all. Applies to
-- pages written from now on (VACUUM FULL or pg_repack rewrites the existing ones).
ALTER TABLE dispatch.schedules SET (fillfactor = 60);
