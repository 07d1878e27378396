"""`pgdispatch install|schedules|runs` and `--help`, run as the real command against the test cluster."""

from __future__ import annotations

import asyncio
import itertools
import re
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
import psycopg.conninfo
import pytest

from tests.conftest import HAS_PG_CRON
from tests.listener.proxy import Proxy

from .conftest import PGDISPATCH, Result, run_cli

COMMANDS = [
    [], ["install"], ["doctor"], ["listen"], ["demo"], ["demo-function"], ["schedules"], ["schedules", "add"],
    ["schedules", "list"], ["schedules", "show"], ["schedules", "enable"], ["schedules", "disable"],
    ["schedules", "delete"], ["schedules", "update"], ["schedules", "pause"], ["schedules", "resume"],
    ["schedules", "run"], ["schedules", "backfill"], ["schedules", "explain"], ["runs"], ["runs", "list"],
    ["breakers", "list"], ["breakers", "reset"], ["calendars"], ["calendars", "add"],
    ["calendars", "exclude"], ["calendars", "show"], ["calendars", "list"], ["calendars", "unexclude"],
    ["calendars", "delete"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "pgdispatch")
def test_help_everywhere(command: list[str]) -> None:
    done = run_cli(*command, "--help")
    assert done.code == 0, done.err
    assert done.out.startswith("usage: pgdispatch")


def test_version_names_the_package_and_the_schema() -> None:
    """`pgdispatch --version`: the package's version and the schema version its install brings,
    which doctor expects and a listener accepts (docs/upgrading.md)."""
    from dispatcher import __version__
    from dispatcher.database import SCHEMA_VERSION
    from dispatcher.migrations import migrations

    schema = migrations()[-1].version
    assert schema >= SCHEMA_VERSION  # a listener never needs a migration the package lacks
    done = run_cli("--version")
    assert done.code == 0, done.err
    expected = f"pgdispatch {__version__} (schema version {schema}"
    if schema > SCHEMA_VERSION:
        expected += f"; listen accepts {SCHEMA_VERSION} or later"
    assert done.out == expected + ")\n"


def test_listen_help_says_what_the_package_installs() -> None:
    """uvloop is a dependency of the package (pyproject.toml), not an extra to install."""
    done = run_cli("listen", "--help")
    assert done.code == 0
    text = " ".join(done.out.split())
    assert "pgdispatch[uvloop]" not in text
    assert "--event-loop LOOP auto (uvloop, which pip install brings with the package" in text


def test_install_prints_what_it_did(empty_database: str) -> None:
    first = run_cli("install", "--json", url=empty_database)
    assert first.code == 0, first.err
    done = first.json["done"]
    assert done[0] == "applied migration 0001_cron_engine"
    # the test cluster's pg_cron lives in database postgres; on a major without pg_cron, it says so
    said = "pg_cron lives in database postgres" if HAS_PG_CRON else "pg_cron is not loaded"
    assert done[-1].startswith(said)
    again = run_cli("install", url=empty_database)
    assert again.code == 0
    assert "applied migration" not in again.out  # nothing left to apply
    assert again.out.strip() == done[-1]


@pytest.mark.parametrize("command", [["install"], ["doctor"], ["schedules", "list"], ["runs", "list"]])
def test_database_url_is_required(command: list[str]) -> None:
    done = run_cli(*command)
    assert done.code == 2
    name = " ".join(command)
    assert done.err == f"pgdispatch {name}: --database-url / PGDISPATCH_DATABASE_URL is required\n"


def test_flag_wins_and_credentials_directory_is_read(dsn: str, tmp_path: Path) -> None:
    folder = tmp_path
    (folder / "database-url").write_text(dsn + "\n")
    from_credential = run_cli("schedules", "list", env={"CREDENTIALS_DIRECTORY": str(folder)})
    assert from_credential.code == 0, from_credential.err
    # The variable wins over the credential, the flag over both.
    bad = "postgresql://postgres@127.0.0.1:1/nowhere"
    assert run_cli("schedules", "list", url=bad, env={"CREDENTIALS_DIRECTORY": str(folder)}).code == 1
    assert run_cli("schedules", "list", "--database-url", dsn, url=bad).code == 0
    unreachable = run_cli("runs", "list", url=bad)
    assert unreachable.code == 1
    assert unreachable.err.startswith("pgdispatch runs list: cannot connect to the database:")


def test_a_bad_url_is_refused_without_echoing_its_password() -> None:
    done = run_cli("schedules", "list", url="postgresql://u:hostile-password-42@[::1/db")
    assert done.code == 2
    assert done.err.startswith(
        "pgdispatch schedules list: --database-url / PGDISPATCH_DATABASE_URL is not a libpq")
    assert "hostile-password-42" not in done.err


def _add(cli: Callable[..., Result], *args: str) -> dict[str, object]:
    done = cli("schedules", "add", "--project", "acme", *args, "--json")
    assert done.code == 0, done.err
    result: dict[str, object] = done.json
    return result


def test_schedules_lifecycle(cli: Callable[..., Result], db: psycopg.Connection) -> None:
    added = _add(cli, "--function", "nightly-report", "--cron", "30 2 * * *", "--timezone", "Europe/Berlin",
                 "--args", '{"format": "pdf"}')
    schedule = added["schedule"]
    assert isinstance(schedule, dict)
    sid = schedule["id"]
    assert schedule["state"] == "enabled" and schedule["args"] == {"format": "pdf"}

    # The preview: 5 fire times from next_run_at, each 02:30 Berlin time, the same as cron_next's.
    preview = added["next_fire_times"]
    assert isinstance(preview, list) and len(preview) == 5
    assert preview[0]["at"] == schedule["next_run_at"]
    for fire in preview:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT02:30:00\+0[12]:00", fire["local"]), fire
        assert fire["timezone"] == "Europe/Berlin"
    at = [datetime.fromisoformat(fire["at"]) for fire in preview]
    expected = [at[0]]
    for _ in range(4):
        row = db.execute("SELECT dispatch.cron_next('30 2 * * *', %s, 'Europe/Berlin')",
                         (expected[-1],)).fetchone()
        assert row is not None
        expected.append(row[0])
    assert at == expected

    table = cli("schedules", "list")
    assert table.code == 0
    header, line = table.out.splitlines()
    assert header.split()[:7] == ["ID", "PROJECT", "FUNCTION", "SLOTS", "ZONE", "JITTER", "STATE"]
    assert re.match(rf"{sid}  acme     nightly-report  30 2 \* \* \*  Europe/Berlin  -  +enabled  ", line), \
        line

    shown = cli("schedules", "show", sid)
    assert shown.code == 0
    assert "next 5 slots in Europe/Berlin:" in shown.out
    fire_line = r"^  \w{3} \d{4}-\d\d-\d\d 02:30:00\+0[12]:00   \d{4}-\d\d-\d\d 0[01]:30:00Z$"
    assert re.search(fire_line, shown.out, re.MULTILINE)

    disabled = cli("schedules", "disable", sid, "--json").json
    assert (disabled["state"], disabled["next_run_at"]) == ("disabled", None)
    assert "(if it were enabled now)" in cli("schedules", "show", sid).out
    enabled = cli("schedules", "enable", sid)
    assert enabled.code == 0
    assert enabled.out.startswith(f"schedule {sid} acme/nightly-report enabled; next run 20")
    deleted = cli("schedules", "delete", sid)
    assert deleted.out.strip() == f"schedule {sid} acme/nightly-report deleted"
    assert cli("schedules", "list", "--json").json == []
    assert [row["state"] for row in cli("schedules", "list", "--deleted", "--json").json] == ["deleted"]
    again = cli("schedules", "enable", sid)
    assert again.code == 1 and again.err.startswith(f"pgdispatch schedules enable: schedule {sid} is deleted")

    # Soft delete: the row stays, and every change was audited under the database role.
    row = db.execute("SELECT deleted_at IS NOT NULL,"
                     " (SELECT array_agg(action ORDER BY id) FROM dispatch.audit_log)"
                     " FROM dispatch.schedules WHERE id = %s", (sid,)).fetchone()
    assert row == (True, ["schedule.create", "schedule.update", "schedule.update", "schedule.delete"])


def test_schedules_refused_with_the_databases_message(cli: Callable[..., Result]) -> None:
    bad_cron = cli("schedules", "add", "--project", "acme", "--function", "f", "--cron", "61 * * * *")
    assert bad_cron.code == 2
    assert bad_cron.err.startswith(
        'pgdispatch schedules add: cron_expression "61 * * * *": minute 61 is outside')
    bad_zone = cli("schedules", "add", "--project", "acme", "--function", "f", "--cron", "* * * * *",
                   "--timezone", "PST")
    assert bad_zone.code == 2 and "is not a time zone name" in bad_zone.err
    bad_args = cli("schedules", "add", "--project", "acme", "--function", "f", "--cron", "* * * * *",
                   "--args", "[1]")
    assert bad_args.code == 2 and "--args must be a JSON object" in bad_args.err
    assert cli("schedules", "show", "not-a-uuid").code == 2
    missing = cli("schedules", "show", "00000000-0000-0000-0000-000000000000")
    assert missing.err == "pgdispatch schedules show: no schedule 00000000-0000-0000-0000-000000000000\n"
    assert cli("schedules", "list", "--json").json == []


def test_runs_list(cli: Callable[..., Result], db: psycopg.Connection) -> None:
    ok_id = _add(cli, "--function", "fine", "--cron", "* * * * *")["schedule"]["id"]  # type: ignore[index]
    bad_id = _add(cli, "--function", "broken", "--cron", "* * * * *")["schedule"]["id"]  # type: ignore[index]
    db.execute("SELECT dispatch.tick(now() + interval '1 minute')")
    claimed = db.execute(
        "SELECT run_id, schedule_id, attempt FROM dispatch.claim_runs('w', 10, '1 min')").fetchall()
    for run_id, schedule_id, attempt in claimed:
        failed = str(schedule_id) == bad_id
        db.execute("CALL dispatch.complete_run(%s, 'w', %s, %s, %s, %s, 12)",
                   (run_id, attempt, "error" if failed else "ok", "boom: it broke" if failed else None,
                    500 if failed else 200))

    everything = cli("runs", "list", "--json").json
    assert sorted((run["function_name"], run["status"]) for run in everything) == [("broken", "error"),
                                                                                   ("fine", "ok")]
    failed = cli("runs", "list", "--failed", "--json").json
    assert [(run["schedule_id"], run["error"], run["http_status"]) for run in failed] == [
        (bad_id, "boom: it broke", 500)]
    assert [run["schedule_id"] for run in cli("runs", "list", "--schedule", ok_id, "--json").json] == [ok_id]
    assert cli("runs", "list", "--schedule", ok_id, "--failed", "--json").json == []
    table = cli("runs", "list", "--failed")
    assert table.out.splitlines()[0].split() == [
        "RUN", "PROJECT", "FUNCTION", "SLOT", "(UTC)", "STATUS", "TRY", "RETRY", "AT", "MS", "HTTP", "ERROR"]
    assert re.search(r" error +1 +- +12 +500 +boom: it broke$", table.out.splitlines()[1]), table.out
    # The failing schedule shows in schedules list --failing and in show's recent runs.
    failing = cli("schedules", "list", "--failing", "--json").json
    assert [(row["id"], row["consecutive_failures"]) for row in failing] == [(bad_id, 1)]
    assert "boom: it broke" in cli("schedules", "show", bad_id).out


def test_schedules_add_and_update_take_the_run_policies(
    cli: Callable[..., Result], db: psycopg.Connection
) -> None:
    added = _add(cli, "--function", "export", "--cron", "*/15 * * * *", "--max-attempts", "5",
                 "--retry-backoff", "30 seconds", "--timeout", "2 min", "--misfire-grace", "1 hour",
                 "--catchup", "all", "--overlap", "buffer_one", "--pause-after-failures", "4")["schedule"]
    assert isinstance(added, dict)
    sid = added["id"]
    policies = ("max_attempts", "retry_backoff", "retry_backoff_max", "timeout", "misfire_grace", "catchup",
                "overlap", "pause_after_failures")
    assert [added[k] for k in policies] == [5, 30.0, 300.0, 120.0, 3600.0, "all", "buffer_one", 4]

    updated = cli("schedules", "update", sid, "--catchup", "latest", "--misfire-grace", "none",
                  "--overlap", "allow", "--pause-after-failures", "none", "--json")
    assert updated.code == 0, updated.err
    schedule = updated.json["schedule"]
    assert (schedule["catchup"], schedule["misfire_grace"], schedule["overlap"],
            schedule["pause_after_failures"]) == ("latest", None, "allow", None)
    changed = db.execute("SELECT metadata->'changed' FROM dispatch.audit_log WHERE action = 'schedule.update'"
                         ).fetchone()
    assert changed == ({"catchup": "latest", "misfire_grace": None, "overlap": "allow",
                        "pause_after_failures": None},)

    refused = {
        ("--timeout", "2 hours"): "timeout must be more than 0 and at most 1 hour, not 02:00:00",
        ("--catchup", "all"): "catchup = 'all' needs a misfire_grace",
        ("--retry-backoff", "1 hour"):
            "retry_backoff (01:00:00) must not exceed retry_backoff_max (00:05:00)",
        ("--misfire-grace", "soon"): 'invalid input syntax for type interval: "soon"',
        ("--pause-after-failures", "0"): "pause_after_failures must be between 1 and 1000, not 0",
    }
    for flags, message in refused.items():
        done = cli("schedules", "update", sid, *flags)
        assert done.code == 2 and done.err.startswith(f"pgdispatch schedules update: {message}"), done.err
    nothing = cli("schedules", "update", sid)
    assert nothing.code == 2 and "nothing to change" in nothing.err

    shown = cli("schedules", "show", sid).out
    for line in ("max attempts:      5", "retry back-off:    0:00:30", "timeout:           0:02:00",
                 "misfire grace:     no limit", "catch-up:          latest", "overlap:           allow",
                 "pause after:       never"):
        assert line in shown, shown


def test_pause_resume_and_run_now(cli: Callable[..., Result], db: psycopg.Connection) -> None:
    sid = _add(cli, "--function", "report", "--cron", "0 0 1 1 *")["schedule"]["id"]

    paused = cli("schedules", "pause", sid, "--reason", "vendor API down")
    assert paused.code == 0, paused.err
    assert paused.out == f"schedule {sid} acme/report paused by postgres (vendor API down)\n"
    shown = cli("schedules", "show", sid).out
    assert "state:             paused" in shown and "pause reason:      vendor API down" in shown
    refused = cli("schedules", "run", sid)
    assert refused.code == 1
    assert refused.err.startswith(f"pgdispatch schedules run: cannot run now: schedule {sid} is paused")
    resumed = cli("schedules", "resume", sid, "--json")
    assert (resumed.json["state"], resumed.json["paused_reason"]) == ("enabled", None)

    bad = cli("schedules", "run", sid, "--traceparent", "00-abc-01")
    assert bad.code == 2 and "traceparent '00-abc-01' is not a W3C traceparent" in bad.err
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    started = cli("schedules", "run", sid, "--traceparent", parent)
    run_id, traceparent = db.execute(
        "SELECT id, traceparent FROM dispatch.runs WHERE kind = 'manual'").fetchone()  # type: ignore[misc]
    assert started.out == f"run {run_id} of schedule {sid}: pending\n" and traceparent == parent
    busy = cli("schedules", "run", sid)
    assert busy.code == 1 and f"has run {run_id} open" in busy.err

    [(first, attempt)] = db.execute("SELECT run_id, attempt FROM dispatch.claim_runs('w', 1)").fetchall()
    db.execute("CALL dispatch.complete_run(%s, 'w', %s, 'ok', NULL, 200, 12)", (first, attempt))

    # --wait: the outcome, whoever records it, and exit 1 unless ok
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(cli, "schedules", "run", sid, "--wait", "--json")
        claimed = []
        deadline = time.monotonic() + 10
        while not claimed and time.monotonic() < deadline:
            claimed = db.execute("SELECT run_id, attempt FROM dispatch.claim_runs('w', 1)").fetchall()
        [(second, attempt)] = claimed
        db.execute("CALL dispatch.complete_run(%s, 'w', %s, 'error', 'HTTP 400', 400, 12)", (second, attempt))
        outcome = waiting.result()
    assert outcome.code == 1
    assert (outcome.json["id"], outcome.json["status"], outcome.json["http_status"]) == (second, "error", 400)
    actions = [a for (a,) in db.execute("SELECT action FROM dispatch.audit_log"
                                        " WHERE action NOT LIKE 'schedule.run.%' ORDER BY id")]
    assert actions == ["schedule.create", "schedule.pause", "schedule.resume", "schedule.run_now",
                       "schedule.run_now"]


def test_breakers_list_and_reset(cli: Callable[..., Result], db: psycopg.Connection) -> None:
    """The SQL of docs/policies.md's breaker section, from a terminal: an open breaker listed with
    the runs waiting behind it, reset (audited with the role), then nothing to list."""
    db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
               " SELECT 'acme', 'flaky', '0 0 1 1 *' FROM generate_series(1, 5)")
    db.execute("SELECT dispatch.tick(now() + interval '1 year')")
    for run_id, attempt in db.execute("SELECT run_id, attempt FROM dispatch.claim_runs('w', 10)").fetchall():
        db.execute("CALL dispatch.complete_run(%s, 'w', %s, 'error', 'HTTP 503: down', 503, 9, true)",
                   (run_id, attempt))
    db.execute("UPDATE dispatch.runs SET not_before = now() WHERE status = 'pending'")
    assert db.execute("SELECT count(*) FROM dispatch.claim_runs('w', 10)").fetchone() == (0,)

    listed = cli("breakers", "list", "--open", "--json")
    assert listed.code == 0, listed.err
    [row] = listed.json
    assert (row["project_id"], row["function_name"], row["state"], row["failures"], row["waiting"]) == (
        "acme", "flaky", "open", 5, 5)

    reset = cli("breakers", "reset", "--project", "acme", "--function", "flaky")
    assert reset.code == 0, reset.err
    assert reset.out == "breaker of acme/flaky closed: its waiting runs go now\n"
    assert db.execute("SELECT count(*) FROM dispatch.claim_runs('w', 10)").fetchone() == (5,)
    assert db.execute("SELECT actor_id, metadata->>'reason' FROM dispatch.audit_log"
                      " WHERE action = 'breaker.close'").fetchall() == [("postgres", "reset")]
    unknown = cli("breakers", "reset", "--project", "acme", "--function", "nope")
    assert unknown.code == 2 and "function nope of project acme has no breaker" in unknown.err
    assert cli("breakers", "list").out == "no breaker is open or counting failures\n"


def test_backfill(cli: Callable[..., Result], db: psycopg.Connection) -> None:
    sid = _add(cli, "--function", "hourly", "--cron", "0 * * * *")["schedule"]["id"]
    end = db.execute("SELECT date_trunc('hour', now())").fetchone()[0]  # type: ignore[index]
    start = end - timedelta(hours=3)
    done = cli("schedules", "backfill", sid, "--from", start.isoformat(), "--to", end.isoformat())
    assert done.code == 0, done.err
    assert done.out.startswith(f"schedule {sid}: 3 slots from ")
    assert [row for (row,) in db.execute("SELECT scheduled_for FROM dispatch.runs WHERE kind = 'backfill'"
                                         " ORDER BY 1")] == [start + timedelta(hours=k) for k in range(3)]
    again = cli("schedules", "backfill", sid, "--from", start.isoformat(), "--to", end.isoformat(), "--json")
    assert again.json["marked"] == 0
    reversed_range = cli("schedules", "backfill", sid, "--from", end.isoformat(), "--to", start.isoformat())
    assert reversed_range.code == 2
    assert "from_ts (" in reversed_range.err and "must be before to_ts" in reversed_range.err
    garbage = cli("schedules", "backfill", sid, "--from", "yesterday-ish", "--to", end.isoformat())
    assert garbage.code == 2 and "yesterday-ish" in garbage.err


def test_explain(cli: Callable[..., Result], db: psycopg.Connection) -> None:
    sid = _add(cli, "--function", "report", "--cron", "0 0 1 1 *")["schedule"]["id"]  # type: ignore[index]
    db.execute("SELECT dispatch.pause(%s, 'vendor API down')", (sid,))
    text = cli("schedules", "explain", sid)
    assert text.code == 0, text.err
    lines = text.out.splitlines()
    assert lines[0] == f"schedule {sid} acme/report: paused"
    assert lines[1].startswith("  paused by postgres at ") and 'because "vendor API down"' in lines[1]
    for heading in ("next slots:", "last runs:", "did not run:"):
        assert heading in lines
    assert "open runs:" not in lines  # none
    assert lines[lines.index("next slots:") + 1].split() == ["WHAT", "AT", "(UTC)", "RUN", "DETAIL"]

    # --json: what dispatch.explain returns, section by section
    as_json = cli("schedules", "explain", sid, "--json", "--since", "2026-01-01T00:00Z").json
    rows = db.execute("SELECT section, item, at, detail FROM dispatch.explain(%s, '2026-01-01T00:00Z')",
                      (sid,)).fetchall()
    keys = {"state": "state", "open run": "open_runs", "next": "next", "run": "runs", "not run": "not_run"}
    from_json = [(section, row["item"], datetime.fromisoformat(row["at"]), row["detail"])
                 for section, key in keys.items()
                 for row in ([as_json[key]] if key == "state" else as_json[key])]
    assert from_json == rows
    assert (as_json["schedule_id"], as_json["state"]["item"], len(as_json["next"])) == (sid, "paused", 3)

    unknown = "00000000-0000-0000-0000-000000000000"
    missing = cli("schedules", "explain", unknown)
    assert (missing.code, missing.out) == (2, "")
    assert missing.err == f"pgdispatch schedules explain: no schedule {unknown}\n"


def test_explain_since_infinity_answers_as_psql_does(
    cli: Callable[..., Result], db: psycopg.Connection,
) -> None:
    """Issue 33 item 8: --since infinity exited 1 with psycopg's "timestamp too large (after year
    10K)", an error of the command's own, where psql answers. The infinities are shown as psql
    shows them; a finite instant no datetime holds is refused as bad input, naming the option."""
    sid = _add(cli, "--function", "report", "--cron", "0 0 1 1 *")["schedule"]["id"]  # type: ignore[index]
    for since in ("infinity", "-infinity"):
        [(at, detail)] = db.execute("SELECT at::text, detail FROM dispatch.explain(%s, %s)"
                                    " WHERE section = 'not run'", (sid, since)).fetchall()
        assert at == since
        text = cli("schedules", "explain", sid, f"--since={since}")
        assert text.code == 0, text.err
        lines = text.out.splitlines()
        assert lines[lines.index("did not run:") + 2].split(maxsplit=3) == ["summary", since, "-", detail]
        as_json = cli("schedules", "explain", sid, "--json", f"--since={since}")
        assert as_json.code == 0, as_json.err
        assert [(row["at"], row["detail"]) for row in as_json.json["not_run"]] == [(since, detail)]
    for since in ("10000-01-01", "0001-12-31 BC"):
        refused = cli("schedules", "explain", sid, "--since", since)
        assert (refused.code, refused.out) == (2, "")
        assert refused.err.startswith("pgdispatch schedules explain: --since: "), refused.err
        assert "outside the years 1 to 9999" in refused.err
    garbage = cli("schedules", "explain", sid, "--since", "yesterday-ish")
    assert garbage.code == 2 and garbage.err.startswith("pgdispatch schedules explain: --since: ")
    assert "yesterday-ish" in garbage.err


def test_interval_and_jitter(cli: Callable[..., Result], db: psycopg.Connection) -> None:
    added = _add(cli, "--function", "poll", "--every", "30s", "--jitter", "5s")
    schedule = added["schedule"]
    assert isinstance(schedule, dict)
    sid = schedule["id"]
    assert (schedule["cron_expression"], schedule["every"], schedule["jitter"]) == (None, 30.0, 5.0)
    assert schedule["anchor"] == schedule["created_at"]
    # the preview: slots 30 s apart, each firing at its own offset, exactly as the database has them
    preview = added["next_fire_times"]
    assert isinstance(preview, list)
    slots = [datetime.fromisoformat(fire["at"]) for fire in preview]
    assert [b - a for a, b in itertools.pairwise(slots)] == [timedelta(seconds=30)] * 4
    for fire in preview:
        offset = db.execute("SELECT dispatch.jitter_offset(%s, %s, '5 seconds')",
                            (sid, fire["at"])).fetchone()
        assert offset is not None
        assert datetime.fromisoformat(fire["fire_at"]) == datetime.fromisoformat(fire["at"]) + offset[0]
    assert schedule["next_fire_at"] == preview[0]["fire_at"]

    line = cli("schedules", "list").out.splitlines()[1]
    assert re.match(rf"{sid}  acme     poll      every 30s  -  +5s  +enabled  ", line), line
    shown = cli("schedules", "show", sid).out
    for expected in ("every:             30s", "jitter:            5s", "next 5 slots:", "   fires 20"):
        assert expected in shown, shown
    assert "time zone:" not in shown

    # human-readable durations, and switching kinds either way
    hourly = cli("schedules", "update", sid, "--every", "1h30m", "--anchor", "2026-01-01T00:00Z", "--json")
    assert (hourly.json["schedule"]["every"], hourly.json["schedule"]["anchor"]) == (
        5400.0, "2026-01-01T00:00:00+00:00")
    to_cron = cli("schedules", "update", sid, "--cron", "*/5 * * * *", "--json").json["schedule"]
    assert (to_cron["cron_expression"], to_cron["every"], to_cron["anchor"]) == ("*/5 * * * *", None, None)
    paused = cli("schedules", "pause", sid, "--reason", "quota")
    assert paused.code == 0
    state = cli("schedules", "list").out.splitlines()[1]
    assert "paused by postgres: quota" in state and "*/5 * * * *" in state


def test_one_shot_and_bounded_schedules(cli: Callable[..., Result], db: psycopg.Connection) -> None:
    # a one-shot given as a wall-clock time in its zone: PostgreSQL reads it there
    once = _add(cli, "--function", "launch", "--at", "2099-03-01T09:00", "--timezone", "Europe/Berlin")
    schedule = once["schedule"]
    assert isinstance(schedule, dict)
    assert schedule["run_at"] == "2099-03-01T08:00:00+00:00" and schedule["next_run_at"] == schedule["run_at"]
    assert [fire["at"] for fire in once["next_fire_times"]] == [schedule["run_at"]]  # type: ignore[union-attr]
    sid = schedule["id"]
    assert "once at 2099-03-01" in cli("schedules", "list").out
    shown = cli("schedules", "show", sid).out
    assert "once at:" in shown and "next 1 slots in Europe/Berlin" not in shown

    # bounds on a repeating rule, in the schedule's zone unless given an offset
    bounded = _add(cli, "--function", "trial", "--cron", "0 9 * * *", "--timezone", "Asia/Kolkata",
                   "--starts-at", "2099-01-01", "--ends-at", "2099-01-03T09:00Z",
                   "--max-runs", "5")["schedule"]
    assert isinstance(bounded, dict)
    assert (bounded["starts_at"], bounded["ends_at"], bounded["max_runs"]) == (
        "2098-12-31T18:30:00+00:00", "2099-01-03T09:00:00+00:00", 5)
    line = next(x for x in cli("schedules", "list").out.splitlines() if x.startswith(bounded["id"]))
    assert "0 9 * * *, 5 slots, until 2099-01-03" in line, line
    preview = cli("schedules", "show", bounded["id"], "--json").json["next_fire_times"]
    assert [fire["at"][:10] for fire in preview] == ["2099-01-01", "2099-01-02", "2099-01-03"]  # then it ends

    # ended by an edit: its end at a moment past
    ended = cli("schedules", "update", bounded["id"], "--starts-at", "none", "--max-runs", "0",
                "--ends-at", "2020-01-01T00:00Z", "--json").json["schedule"]
    assert ended["state"] == "ended" and ended["next_run_at"] is None
    assert ended["ended_reason"].startswith("its slots up to ends_at 2020-01-01")
    listed = cli("schedules", "list").out.splitlines()
    assert "ended" in next(x for x in listed if x.startswith(bounded["id"]))
    # and back: the end cleared
    back = cli("schedules", "update", bounded["id"], "--ends-at", "none", "--json").json["schedule"]
    assert back["state"] == "enabled" and back["ended_at"] is None and back["next_run_at"] is not None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["add", "--project", "acme", "--function", "f", "--every", "0s"],
         "every must be at least 1 second"),
        (["add", "--project", "acme", "--function", "f", "--every", "30s", "--cron", "* * * * *"],
         "argument --cron: not allowed with argument --every"),
        (["add", "--project", "acme", "--function", "f", "--every", "soonish"],
         "argument --every: 'soonish' is not a duration"),
        (["add", "--project", "acme", "--function", "f", "--every", "10s", "--jitter", "1m"],
         "jitter (00:01:00) must not exceed the shortest time between two slots (00:00:10)"),
        (["add", "--project", "acme", "--function", "f"],
         "one of the arguments --cron --every --at is required"),
        (["add", "--project", "acme", "--function", "f", "--at", "2020-01-01T00:00Z"],
         "run_at 2020-01-01 00:00:00+00 is in the past (run_at = now() fires it at once.)"),
        (["add", "--project", "acme", "--function", "f", "--at", "next tuesday"],
         "--at 'next tuesday' is not an ISO 8601 timestamp"),
        (["add", "--project", "acme", "--function", "f", "--at", "2099-01-01T09:00", "--timezone",
          "Mars/Base"], "Mars/Base"),
        (["add", "--project", "acme", "--function", "f", "--cron", "* * * * *", "--max-runs", "0"],
         "argument --max-runs: must be at least 1"),
        (["update", "{unknown}", "--every", "1m"], "no schedule {unknown}"),
        (["show", "{unknown}"], "no schedule {unknown}"),
        (["pause", "{unknown}"], "no schedule {unknown}"),
        (["resume", "{unknown}"], "no schedule {unknown}"),
        (["run", "{unknown}"], "no schedule {unknown}"),
        (["backfill", "{unknown}", "--from", "2026-01-01", "--to", "2026-01-02"], "no schedule {unknown}"),
        (["backfill", "{sid}", "--from", "2026-01-02", "--to", "2026-01-01"], "must be before to_ts"),
        (["run", "not-an-id"], "'not-an-id' is not a schedule id"),
        (["enable", "not-an-id"], "'not-an-id' is not a schedule id"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    cli: Callable[..., Result], args: list[str], message: str
) -> None:
    sid = _add(cli, "--function", "existing", "--cron", "0 * * * *")["schedule"]["id"]  # type: ignore[index]
    unknown = "00000000-0000-0000-0000-000000000000"
    args = [arg.format(unknown=unknown, sid=sid) for arg in args]
    done = cli("schedules", *args)
    assert done.code == 2, (done.code, done.err)
    assert message.format(unknown=unknown) in done.err
    assert done.err.count("\n") == 1, done.err
    assert done.out == ""


def test_the_cli_speaks_plainly(cli: Callable[..., Result], db: psycopg.Connection, dsn: str) -> None:
    """For users, not developers: help, type errors, refusals naming the field, a zone's right
    spelling, quiet on a closed pipe (and on Ctrl-C: test_ctrl_c_ends_the_wait_within_a_second)."""
    top = run_cli("--help")
    assert top.code == 0 and "Cron schedules that live in PostgreSQL" in top.out
    assert "module" not in top.out  # no developer docstring
    typo = cli("schedules", "add", "--project", "acme", "--function", "f", "--cron", "* * * * *",
               "--max-attempts", "abc")
    assert (typo.code, typo.err) == (2, "pgdispatch schedules add: argument --max-attempts: must be a whole"
                                        " number, not 'abc' (see pgdispatch schedules add --help)\n")
    spaced = cli("schedules", "add", "--project", "ac me", "--function", "f", "--cron", "* * * * *")
    assert spaced.code == 2 and spaced.err.count("\n") == 1
    assert spaced.err.startswith('pgdispatch schedules add: project_id "ac me" is not a project id (1 to 200')
    zone = cli("schedules", "add", "--project", "acme", "--function", "f", "--cron", "* * * * *",
               "--timezone", "europe/berlin")
    assert zone.code == 2 and "did you mean Europe/Berlin?" in zone.err

    # a reader that goes away (| head): no "Exception ignored ... BrokenPipeError"
    db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
               " SELECT 'acme', 'f' || i, '* * * * *' FROM generate_series(1, 600) i")
    piped = subprocess.run(["bash", "-c", f"'{PGDISPATCH}' schedules list --limit 600 | head -1"],
                           capture_output=True, text=True, env={"PGDISPATCH_DATABASE_URL": dsn}, check=True)
    assert piped.stdout.startswith("ID") and piped.stderr == ""


# Ctrl-C ends `schedules run --wait` within this long, whatever it interrupts.
INTERRUPTED_WITHIN_S = 1.0


def _wait_for_a_run(dsn: str, sid: str, *, sigint: Callable[..., object] | int) -> subprocess.Popen[str]:
    """`pgdispatch schedules run SID --wait`, started with SIGINT's disposition `sigint`: SIG_DFL,
    as a terminal's foreground job has it, or SIG_IGN, as a non-interactive shell leaves it to a
    command started with `&` (and so to the tests, when the suite was started that way)."""
    return subprocess.Popen([str(PGDISPATCH), "schedules", "run", sid, "--wait"], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={"PGDISPATCH_DATABASE_URL": dsn},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))


def _interrupted(waiting: subprocess.Popen[str], within_s: float = INTERRUPTED_WITHIN_S) -> tuple[int, str]:
    """SIGINT, then the exit status and stderr; fails when the command outlives within_s."""
    waiting.send_signal(signal.SIGINT)
    try:
        _, err = waiting.communicate(timeout=within_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {within_s} s after SIGINT")
    finally:
        if waiting.poll() is None:  # never left for the next test to find, whatever failed here
            waiting.kill()
            waiting.communicate()
    return waiting.returncode, err


def _schedule(db: psycopg.Connection) -> str:
    row = db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
                     " VALUES ('acme', 'f', '0 0 1 1 *') RETURNING id").fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.parametrize("after_s", [0.0, 0.05, 0.2], ids=lambda s: f"{s:g}s after start")
def test_ctrl_c_right_after_start(db: psycopg.Connection, dsn: str, after_s: float) -> None:
    """Before the interpreter's handler (killed by SIGINT), during the imports or while connecting
    (KeyboardInterrupt): the command ends either way. The bound allows for an interpreter still
    loading its modules on a busy machine (a signal is handled between bytecodes, not inside an
    extension module's initialisation); the wait itself is held to a second below."""
    waiting = _wait_for_a_run(dsn, _schedule(db), sigint=signal.SIG_DFL)
    time.sleep(after_s)
    code, err = _interrupted(waiting, within_s=5.0)
    # while the interpreter itself starts (its standard streams, its site module: before any of
    # pgdispatch runs), CPython ends with a fatal error named after that step, and status 1
    starting = code == 1 and "Fatal Python error: init_" in err
    assert code in (130, -signal.SIGINT) or starting, err


@pytest.mark.parametrize("sigint", [signal.SIG_DFL, signal.SIG_IGN], ids=["default", "ignored by its parent"])
def test_ctrl_c_ends_the_wait_within_a_second(db: psycopg.Connection, dsn: str, sigint: int) -> None:
    """While waiting for a run no listener takes, at several moments of its polling (a query, a
    sleep): exit 130, no traceback. SIGINT ignored by whoever started the command was inherited,
    and the wait went on to its --wait-timeout (300 s)."""
    for delay_s in (0.0, 0.03, 0.07, 0.15):
        waiting = _wait_for_a_run(dsn, _schedule(db), sigint=sigint)
        assert waiting.stdout is not None
        assert waiting.stdout.readline().endswith("waiting for its outcome\n")
        time.sleep(delay_s)
        code, err = _interrupted(waiting)
        assert (code, err) == (130, "\n"), (delay_s, err)


async def test_ctrl_c_ends_a_query_the_server_never_answers(db: psycopg.Connection, dsn: str) -> None:
    """A statement in flight on a path that died: psycopg would ask the server to cancel it and
    wait for its end, 5 s at most each; the user who pressed Ctrl-C waits for neither."""
    port = int(psycopg.conninfo.conninfo_to_dict(dsn)["port"] or 5432)
    proxy = Proxy(port)
    await proxy.start()
    try:
        waiting = _wait_for_a_run(proxy.url(dsn), _schedule(db), sigint=signal.SIG_DFL)
        assert waiting.stdout is not None
        line = await asyncio.to_thread(waiting.stdout.readline)
        assert line.endswith("waiting for its outcome\n")
        assert proxy.blackhole() == 1
        await asyncio.sleep(0.5)  # its next poll (every 0.1 s) gets no answer
        code, err = await asyncio.to_thread(_interrupted, waiting)
        assert (code, err) == (130, "\n")
    finally:
        await proxy.close()


def test_projects_set_the_events_url(cli: Callable[..., Result]) -> None:
    done = cli("projects", "set", "acme", "--events-url", "https://hooks.example/pgdispatch", "--json")
    assert done.code == 0, done.err
    assert done.json["events_url"] == "https://hooks.example/pgdispatch"
    refused = cli("projects", "set", "acme", "--events-url", "ftp://hooks.example")
    assert refused.code == 2 and "projects_events_url_check" in refused.err
    cleared = cli("projects", "set", "acme", "--events-url", "none", "--json")
    assert cleared.json["events_url"] is None


def test_calendars(cli: Callable[..., Result], db: psycopg.Connection) -> None:
    """A calendar from the command line as from psql: its periods, a schedule that uses it (its
    next slots skip the periods), and the same refusals."""
    assert cli("calendars", "add", "holidays", "--timezone", "Europe/Berlin").code == 0
    assert cli("calendars", "add", "holidays", "--project", "acme").code == 0  # the project's own
    day = cli("calendars", "exclude", "holidays", "--date", "2031-12-24", "--until", "2031-12-26",
              "--label", "Christmas", "--json")
    assert day.code == 0, day.err
    assert (day.json["starts"], day.json["ends"]) == ("2031-12-24T00:00:00", "2031-12-27T00:00:00")
    weekly = cli("calendars", "exclude", "holidays", "--weekly", "sat-sun", "--between", "00:00-24:00",
                 "--json")
    assert (weekly.json["days"], weekly.json["from_time"], weekly.json["until_time"]) == (
        [6, 7], "00:00:00", "24:00:00")
    shown = cli("calendars", "show", "holidays", "--days", "14", "--json")
    assert shown.code == 0, shown.err
    assert {p["label"] for p in shown.json["periods"]} == {None}  # the weekends to come
    added = cli("schedules", "add", "--project", "acme", "--function", "weekdays", "--cron", "0 9 * * *",
                "--calendar", "holidays", "--json")
    assert added.code == 0, added.err
    # the project's own calendar, by that name, which has no periods: every day
    days = {datetime.fromisoformat(f["at"]).weekday() for f in added.json["next_fire_times"]}
    assert len(days) == 5
    shared = db.execute("SELECT id FROM dispatch.calendars WHERE project_id IS NULL").fetchone()
    assert shared is not None
    db.execute("UPDATE dispatch.schedules SET calendar_id = %s", shared)
    shown = cli("schedules", "show", added.json["schedule"]["id"], "--json")
    weekdays = {datetime.fromisoformat(f["at"]).isoweekday() for f in shown.json["next_fire_times"]}
    assert weekdays <= {1, 2, 3, 4, 5}
    assert shown.json["schedule"]["calendar"] == "holidays"
    refused = cli("calendars", "exclude", "holidays", "--from", "2031-01-02T10:00", "--to",
                  "2031-01-02T09:00")
    assert refused.code == 2 and "ends (2031-01-02 09:00:00) must be after starts" in refused.err
    in_use = cli("calendars", "delete", "holidays")
    assert in_use.code == 2 and "is in use" in in_use.err
    unknown = cli("schedules", "update", added.json["schedule"]["id"], "--calendar", "nope")
    assert unknown.code == 2 and "no calendar 'nope' of project acme or shared" in unknown.err
    cleared = cli("schedules", "update", added.json["schedule"]["id"], "--calendar", "none", "--json")
    assert cleared.json["schedule"]["calendar_id"] is None
    for flags, said in ((["--date", "2031-12-24", "--weekly", "sat"], "not --date and --weekly"),
                        (["--between", "01:00-02:00", "--date", "2031-12-24"],
                         "--between goes with --weekly"),
                        (["--from", "2031-12-24T10:00"], "--from and --to go together")):
        conflicting = cli("calendars", "exclude", "holidays", *flags)
        assert conflicting.code == 2 and said in conflicting.err, conflicting.err
    own = cli("calendars", "exclude", "holidays", "--project", "acme", "--date", "2031-01-01", "--json")
    assert own.code == 0 and own.json["calendar_id"] != day.json["calendar_id"]  # acme's, not the shared one
    assert cli("calendars", "exclude", "holidays", "--project", "other", "--date", "2031-01-01").code == 2
    assert cli("calendars", "unexclude", str(weekly.json["id"])).code == 0
    assert cli("calendars", "delete", "holidays").code == 0
    assert [c["name"] for c in cli("calendars", "list", "--json").json] == ["holidays"]  # acme's
