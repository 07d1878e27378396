-- Calendars (docs/schedules.md, "Calendars"): named sets of periods in which a schedule's slots
-- do not run. A slot inside one becomes part of a recorded gap (reason calendar) and the
-- schedule goes on at its first slot after the period.

CREATE TABLE dispatch.calendars (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project_id  text,
    name        text NOT NULL,
    timezone    text NOT NULL DEFAULT 'UTC',
    description text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT calendars_name_check CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$'),
    CONSTRAINT calendars_description_check CHECK (length(description) <= 1000),
    CONSTRAINT calendars_project_name_key UNIQUE NULLS NOT DISTINCT (project_id, name)
);
COMMENT ON TABLE dispatch.calendars IS
    'Named exclusion calendars: the periods (dispatch.calendar_exclusions) in which the slots of the schedules that refer to one (schedules.calendar_id) do not run. Written by dispatch_admin.';
COMMENT ON COLUMN dispatch.calendars.project_id IS
    'The project whose schedules may use it; NULL: shared by every project.';
COMMENT ON COLUMN dispatch.calendars.name IS
    'Unique within its project (or among the shared calendars): letters, digits, _ . -';
COMMENT ON COLUMN dispatch.calendars.timezone IS
    'The zone in which its exclusions'' wall-clock times are read (a name from pg_timezone_names), whatever the schedules'' own zones.';

CREATE TABLE dispatch.calendar_exclusions (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    calendar_id bigint NOT NULL REFERENCES dispatch.calendars (id) ON DELETE CASCADE,
    label       text,
    starts      timestamp,
    ends        timestamp,
    days        smallint[],
    from_time   time,
    until_time  time,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT calendar_exclusions_shape_check
        CHECK ((starts IS NOT NULL AND ends IS NOT NULL AND days IS NULL AND from_time IS NULL AND until_time IS NULL)
               OR (starts IS NULL AND ends IS NULL AND days IS NOT NULL AND from_time IS NOT NULL
                   AND until_time IS NOT NULL)),
    CONSTRAINT calendar_exclusions_ends_check CHECK (ends > starts AND isfinite(starts) AND isfinite(ends)),
    CONSTRAINT calendar_exclusions_days_check
        CHECK (cardinality(days) BETWEEN 1 AND 7 AND days <@ '{1,2,3,4,5,6,7}' AND array_position(days, NULL) IS NULL),
    CONSTRAINT calendar_exclusions_until_time_check CHECK (until_time > from_time),
    CONSTRAINT calendar_exclusions_label_check CHECK (length(label) <= 200)
);
COMMENT ON TABLE dispatch.calendar_exclusions IS
    'The periods of a calendar, in its zone''s wall-clock time: either one period [starts, ends), or every week on days (ISO: 1 Monday to 7 Sunday) from from_time until until_time (24:00 for the end of the day). A boundary that daylight saving time skips or repeats is placed by the fixed-time rule of cron expressions.';
COMMENT ON COLUMN dispatch.calendar_exclusions.starts IS 'A period''s first excluded wall-clock time (a date alone: its midnight).';
COMMENT ON COLUMN dispatch.calendar_exclusions.ends IS 'The wall-clock time the period ends at, not excluded itself (a whole day D: D + 1 at midnight).';
COMMENT ON COLUMN dispatch.calendar_exclusions.days IS 'A weekly exclusion''s days, ISO numbers: 1 Monday to 7 Sunday.';
COMMENT ON COLUMN dispatch.calendar_exclusions.from_time IS 'A weekly exclusion''s first excluded wall-clock time on each of its days (default 00:00).';
COMMENT ON COLUMN dispatch.calendar_exclusions.until_time IS 'A weekly exclusion''s end on each of its days, not excluded itself (default 24:00, the end of the day).';
CREATE INDEX calendar_exclusions_calendar_id_idx ON dispatch.calendar_exclusions (calendar_id);

ALTER TABLE dispatch.schedules
    ADD COLUMN calendar_id bigint REFERENCES dispatch.calendars (id);
COMMENT ON COLUMN dispatch.schedules.calendar_id IS
    'An exclusion calendar (dispatch.calendars, the project''s own or a shared one): its slots inside the calendar''s periods do not run and are recorded as a gap (reason calendar). NULL: none.';
-- The due (calendar, slot) pairs the tick checks against the periods, once for all the schedules
-- that share one; and what a calendar's DELETE checks.
CREATE INDEX schedules_calendar_id_idx ON dispatch.schedules (calendar_id, next_run_at) WHERE calendar_id IS NOT NULL;
