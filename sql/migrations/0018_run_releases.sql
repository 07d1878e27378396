-- A claim handed back is counted, never given back.
--
-- release_runs used to return a claim's attempt (attempt - 1), so the next claim was handed the
-- same fencing token: a late or repeated release from the first holder then released the second
-- one's claim, and a late outcome of the first landed on the third (invariant 7). attempt now
-- only grows, one per claim; released counts the claims handed back before an invocation, so
-- attempt - released is how many invocations went out (or may have), which is what
-- max_attempts, misfire_grace and lost-or-skipped are about.
ALTER TABLE dispatch.runs
    ADD COLUMN released integer NOT NULL DEFAULT 0,
    ADD CONSTRAINT runs_released_check CHECK (released BETWEEN 0 AND attempt);
COMMENT ON COLUMN dispatch.runs.released IS
    'Claims of this run that dispatch.release_runs handed back before invoking it. attempt counts every claim (the fencing token only grows); attempt - released is the number of invocations that went out.';
