-- Room on each page for the next versions of its rows.
--
-- Every run row is written three times (marked, claimed, finished) and every finished run
-- rewrites its schedule. None of these updates can be HOT (each changes a column an index
-- covers or filters on), but when the new version lands on the old one's page PostgreSQL logs
-- only the bytes that changed instead of the whole row. Measured with bench.claim
-- (pg_waldump): WAL per dispatched run 2,763 -> 2,450 bytes, table growth per run 1,230 ->
-- 1,004 bytes. Applies to pages written from now on.
ALTER TABLE dispatch.runs SET (fillfactor = 50);
ALTER TABLE dispatch.schedules SET (fillfactor = 80);
