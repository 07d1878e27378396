-- The cron engine's one piece of schema: a parsed expression, stored on each schedule. The
-- engine itself (dispatch.cron_parse, dispatch.cron_spec_next, ...) is in sql/code/.

CREATE TYPE dispatch.cron_spec AS (
    minutes        bigint,   -- bit m set: minute m (0-59) matches
    hours          integer,  -- bit h: hour h (0-23)
    days           bigint,   -- bit d: day-of-month d (1-31)
    months         integer,  -- bit m: month m (1-12)
    weekdays       integer,  -- bit d: day-of-week d (0 = Sunday .. 6)
    nth_weekdays   bigint,   -- bit 7*(n-1)+d: the n-th weekday d of the month (d#n)
    last_weekdays  integer,  -- bit d: the last weekday d of the month (dL)
    last_day       boolean,  -- L in day-of-month
    days_star      boolean,  -- day-of-month field starts with '*'
    weekdays_star  boolean,  -- day-of-week field starts with '*'
    real_time      boolean   -- minute or hour field starts with '*': follows real time across DST
);
COMMENT ON TYPE dispatch.cron_spec IS
    'A parsed cron expression (dispatch.cron_parse). Stored on each schedule so that evaluation never re-parses.';
