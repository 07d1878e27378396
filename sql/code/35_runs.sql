-- The write path of dispatch.runs: every run carries the instant it fires at. The dispatcher's
-- own inserts set it (a scheduled slot plus its jitter offset); a run inserted any other way,
-- by hand in psql say, fires at its slot.

CREATE OR REPLACE FUNCTION dispatch._run_fire_at()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    NEW.fire_at := NEW.scheduled_for;
    RETURN NEW;
END
$$;

-- WHEN: the dispatcher's inserts, which set fire_at, never call the function.
CREATE OR REPLACE TRIGGER _100_fire_at BEFORE INSERT ON dispatch.runs
    FOR EACH ROW WHEN (NEW.fire_at IS NULL) EXECUTE FUNCTION dispatch._run_fire_at();
