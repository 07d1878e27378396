-- Harness-only objects in the chaos database (never part of sql/): what the run is, what the
-- sink saw, which faults were injected, and every claim (a trigger on dispatch.runs).

CREATE SCHEMA chaos;

CREATE TABLE chaos.params (
    base      timestamptz NOT NULL,   -- every schedule's first slot
    last_slot timestamptz NOT NULL,   -- base + minutes: the last slot the driver marks
    minutes   integer NOT NULL,
    lease_s   float8 NOT NULL
);

CREATE TABLE chaos.requests (
    key         text PRIMARY KEY,
    worker      text NOT NULL,
    request_id  text NOT NULL,
    schedule_id uuid,
    slot        timestamptz,
    run_id      bigint,
    attempt     integer,
    decision    text NOT NULL,
    arrived     float8 NOT NULL,   -- Unix seconds
    answered    float8             -- NULL: never answered in full (sink killed, or reset)
);
CREATE INDEX ON chaos.requests (request_id, attempt);

CREATE TABLE chaos.faults (
    kind   text NOT NULL,
    target text NOT NULL,
    at     float8 NOT NULL,
    until  float8
);

CREATE TABLE chaos.listeners (
    worker  text PRIMARY KEY,
    started float8 NOT NULL   -- Unix seconds
);

-- A project above its max_concurrency, as the driver's samples saw it (one statement's snapshot:
-- only committed claims and outcomes): never expected.
CREATE TABLE chaos.cap_excess (
    at         timestamptz NOT NULL,
    project_id text NOT NULL,
    running    bigint NOT NULL,
    cap        integer NOT NULL
);

CREATE TABLE chaos.claims (
    run_id  bigint NOT NULL,
    worker  text NOT NULL,
    attempt integer NOT NULL,
    at      timestamptz NOT NULL
);

CREATE FUNCTION chaos.record_claims()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO chaos.claims (run_id, worker, attempt, at)
    SELECT n.id, n.worker, n.attempt, n.claimed_at
    FROM new_runs n JOIN old_runs o ON o.id = n.id
    WHERE n.status = 'running' AND o.status <> 'running';
    RETURN NULL;
END
$$;

CREATE TRIGGER chaos_record_claims AFTER UPDATE ON dispatch.runs
    REFERENCING OLD TABLE AS old_runs NEW TABLE AS new_runs
    FOR EACH STATEMENT EXECUTE FUNCTION chaos.record_claims();
