-- Retention empties the old end of runs and audit_log every prune and the next minutes' rows fill
-- it again. Vacuum's truncation of that end hands the space back only for the table to grow into
-- it anew, and each time takes an ACCESS EXCLUSIVE lock on the table, which a hot standby replays
-- (cancelling the queries that read it there). Keep the space; `VACUUM (TRUNCATE)` returns it on
-- demand.
ALTER TABLE dispatch.runs SET (vacuum_truncate = false);
ALTER TABLE dispatch.audit_log SET (vacuum_truncate = false);
