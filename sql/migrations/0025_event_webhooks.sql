-- Event webhooks (docs/policies.md, "Events"): each event of dispatch_events about a project
-- with an events_url is also POSTed there by a listener, signed like an invocation and retried
-- with back-off. The deliveries wait in dispatch.event_deliveries, so that none is lost while no
-- listener is connected, and each is handed to one listener at a time (SKIP LOCKED, a lease).

ALTER TABLE dispatch.projects
    ADD COLUMN events_url text,
    ADD CONSTRAINT projects_events_url_check
        CHECK (events_url ~ '^https?://[^[:space:][:cntrl:]]+$' AND length(events_url) <= 2000);
COMMENT ON COLUMN dispatch.projects.events_url IS
    'Where the listeners POST each event of the channel dispatch_events about this project (run.failed, schedule.paused, breaker.opened, breaker.closed), signed like an invocation; NULL: none.';

ALTER TABLE dispatch.settings
    ADD COLUMN event_retry_backoff interval NOT NULL DEFAULT interval '5 seconds',
    ADD COLUMN event_max_attempts integer NOT NULL DEFAULT 10,
    ADD CONSTRAINT settings_event_retry_backoff_check
        CHECK (event_retry_backoff >= interval '10 milliseconds' AND event_retry_backoff <= interval '1 hour'),
    ADD CONSTRAINT settings_event_max_attempts_check CHECK (event_max_attempts BETWEEN 1 AND 100);
COMMENT ON COLUMN dispatch.settings.event_retry_backoff IS
    'The wait before an event delivery''s first retry; doubled for each further one, up to an hour.';
COMMENT ON COLUMN dispatch.settings.event_max_attempts IS
    'Attempts of one event delivery before it is given up (gave_up_at).';

CREATE TABLE dispatch.event_deliveries (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project_id      text NOT NULL,
    url             text NOT NULL,
    payload         jsonb NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    worker          text,
    delivered_at    timestamptz,
    gave_up_at      timestamptz,
    last_error      text,
    CONSTRAINT event_deliveries_last_error_length_check CHECK (length(last_error) <= 500)
);
COMMENT ON TABLE dispatch.event_deliveries IS
    'Events waiting to be POSTed to their project''s events_url, and those delivered or given up (until the audit retention passes). A listener claims those whose next_attempt_at has come; a claim moves next_attempt_at past its lease, so an attempt whose listener died is tried again then.';
-- the deliveries to go, by when
CREATE INDEX event_deliveries_due_idx ON dispatch.event_deliveries (next_attempt_at)
    WHERE delivered_at IS NULL AND gave_up_at IS NULL;
CREATE INDEX event_deliveries_created_at_brin_idx ON dispatch.event_deliveries USING brin (created_at);
