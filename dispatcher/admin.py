"""`pgdispatch schedules …` and `pgdispatch runs list`: the dispatch tables from a terminal.

Every write is a plain INSERT/UPDATE on dispatch.schedules, so the same trigger checks it as a
psql user's (and the audit log names the database role). Fire times are computed in SQL with
dispatch.cron_next, in the schedule's zone, so they are exactly the dispatcher's.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from dispatcher.console import (
    CommandError,
    add_connection_arguments,
    connect,
    format_value,
    print_json,
    print_table,
)

__all__ = ["add_commands", "fire_times"]

PREVIEW = 5
RUN_STATUSES = ("pending", "running", "ok", "error", "skipped", "lost")

_SCHEDULE = """
SELECT s.id, s.project_id, s.function_name, s.cron_expression, s.timezone, s.args,
       CASE WHEN s.deleted_at IS NOT NULL THEN 'deleted' WHEN s.paused_at IS NOT NULL THEN 'paused'
            WHEN s.enabled THEN 'enabled' ELSE 'disabled' END
           AS state,
       s.next_run_at, s.last_run_at, s.last_status, s.last_error, s.max_attempts, s.retry_backoff,
       s.retry_backoff_max, s.timeout, s.misfire_grace, s.catchup, s.overlap,
       coalesce(st.consecutive_failures, 0) AS consecutive_failures, st.current_run_status,
       st.current_attempt, coalesce(st.open_runs, 0) AS open_runs, st.next_retry_at,
       st.overdue_by, s.paused_at, s.paused_by, s.paused_reason, s.created_at, s.updated_at, s.deleted_at
FROM dispatch.schedules s
LEFT JOIN dispatch.schedule_status st ON st.id = s.id
"""

_FIRE_TIMES = """
WITH RECURSIVE fire(n, at) AS (
    SELECT 1, coalesce(%(first)s, dispatch.cron_next(%(expr)s, now(), %(tz)s))
  UNION ALL
    SELECT n + 1, dispatch.cron_next(%(expr)s, at, %(tz)s) FROM fire WHERE n < %(count)s
)
SELECT at, at AT TIME ZONE %(tz)s AS local_time,
       (at AT TIME ZONE %(tz)s) - (at AT TIME ZONE 'UTC') AS utc_offset
FROM fire ORDER BY n
"""

_RUNS = """
SELECT r.id, r.schedule_id, s.project_id, s.function_name, r.scheduled_for, r.status, r.attempt,
       CASE WHEN r.not_before = 'infinity' THEN 'after the open run' ELSE r.not_before::text END
           AS waits_until,
       r.worker, r.claimed_at, r.finished_at, r.duration_ms, r.http_status, r.error, r.request_id
FROM dispatch.runs r
JOIN dispatch.schedules s ON s.id = r.schedule_id
WHERE (%(schedule)s::uuid IS NULL OR r.schedule_id = %(schedule)s::uuid)
  AND (%(statuses)s::text[] IS NULL OR r.status = ANY (%(statuses)s::text[]))
ORDER BY r.id DESC
LIMIT %(limit)s
"""

_LIST_COLUMNS = [("id", "id"), ("project_id", "project"), ("function_name", "function"),
                 ("cron_expression", "cron"), ("timezone", "zone"), ("state", "state"),
                 ("next_run_at", "next run (UTC)"), ("last_status", "last"),
                 ("consecutive_failures", "failures")]
_RUN_COLUMNS = [("id", "run"), ("project_id", "project"), ("function_name", "function"),
                ("scheduled_for", "slot (UTC)"), ("status", "status"), ("attempt", "try"),
                ("waits_until", "retry at"), ("duration_ms", "ms"), ("http_status", "http"),
                ("error", "error")]
# The run policies (DESIGN.md, "Scheduling policies"): flag, column, help. Intervals are read by
# PostgreSQL ("90 seconds", "5 min", "1 hour"); "none" clears the nullable ones.
_POLICIES = [
    ("--max-attempts", "max_attempts",
     "attempts of one run, failed ones and lost leases alike (1-10; default 3)"),
    ("--retry-backoff", "retry_backoff",
     "back-off before the first retry, doubled for each (default 10 seconds)"),
    ("--retry-backoff-max", "retry_backoff_max",
     "the longest back-off, Retry-After included (default 5 minutes)"),
    ("--timeout", "timeout", "invocation timeout of its runs, at most 1 hour (default: the listener's)"),
    ("--misfire-grace", "misfire_grace",
     "a slot that cannot start within this long is skipped, not invoked (default: no limit)"),
    ("--catchup", "catchup", "after downtime: latest (the last missed slot) or all (every one within the "
                             "misfire grace, oldest first)"),
    ("--overlap", "overlap", "while a run is open: skip the slots that come due, buffer_one (one waits) "
                             "or allow (each runs at its time)"),
]
_NULLABLE = {"timeout", "misfire_grace"}


def _offset(value: timedelta) -> str:
    minutes = int(value.total_seconds()) // 60
    sign = "-" if minutes < 0 else "+"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def fire_times(conn: psycopg.Connection[dict[str, Any]], expr: str, tz: str, *,
               first: Any = None, count: int = PREVIEW) -> list[dict[str, Any]]:
    """The next `count` fire times (from `first`, else from now), each as UTC and local time."""
    rows = conn.execute(_FIRE_TIMES, {"first": first, "expr": expr, "tz": tz, "count": count}).fetchall()
    return [
        {"at": row["at"], "local": f"{row['local_time']:%Y-%m-%dT%H:%M:%S}{_offset(row['utc_offset'])}",
         "weekday": f"{row['local_time']:%a}", "timezone": tz}
        for row in rows
    ]


def _schedule_id(text: str) -> str:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise CommandError(f"{text!r} is not a schedule id (a UUID, as `pgdispatch schedules list` shows)") \
            from None


def _database_error(exc: psycopg.Error) -> CommandError:
    diag = exc.diag
    message = diag.message_primary or " ".join(str(exc).split())
    for extra in (diag.message_detail, diag.message_hint):
        if extra:
            message += f" ({extra})"
    return CommandError(message)


def _load(conn: psycopg.Connection[dict[str, Any]], schedule_id: str) -> dict[str, Any]:
    row = conn.execute(_SCHEDULE + " WHERE s.id = %s", (schedule_id,)).fetchone()
    if row is None:
        raise CommandError(f"no schedule {schedule_id}")
    return row


def _details(conn: psycopg.Connection[dict[str, Any]], schedule: dict[str, Any]) -> dict[str, Any]:
    preview: list[dict[str, Any]] = []
    if schedule["state"] != "deleted":
        preview = fire_times(conn, schedule["cron_expression"], schedule["timezone"],
                             first=schedule["next_run_at"])
    runs = conn.execute(_RUNS, {"schedule": schedule["id"], "statuses": None, "limit": PREVIEW}).fetchall()
    return {"schedule": schedule, "next_fire_times": preview, "recent_runs": runs}


def _print_details(details: dict[str, Any]) -> None:
    schedule = details["schedule"]
    fields = [("id", "id"), ("project_id", "project"), ("function_name", "function"),
              ("cron_expression", "cron"), ("timezone", "time zone"), ("args", "args"), ("state", "state"),
              ("paused_at", "paused at"), ("paused_by", "paused by"), ("paused_reason", "pause reason"),
              ("next_run_at", "next run"), ("last_run_at", "last run"), ("last_status", "last status"),
              ("last_error", "last error"), ("consecutive_failures", "failures in a row"),
              ("current_run_status", "run in flight"), ("current_attempt", "attempts so far"),
              ("open_runs", "open runs"), ("next_retry_at", "next retry"), ("overdue_by", "overdue by"),
              ("max_attempts", "max attempts"), ("retry_backoff", "retry back-off"),
              ("retry_backoff_max", "back-off at most"), ("timeout", "timeout"),
              ("misfire_grace", "misfire grace"),
              ("catchup", "catch-up"), ("overlap", "overlap"), ("created_at", "created"),
              ("updated_at", "updated"), ("deleted_at", "deleted")]
    optional = ("deleted_at", "overdue_by", "current_run_status", "current_attempt", "next_retry_at",
                "paused_at", "paused_by", "paused_reason")
    for key, label in fields:
        if key in optional and schedule[key] is None:
            continue
        if key == "open_runs" and schedule[key] < 2:
            continue
        if key in _NULLABLE and schedule[key] is None:
            print(f"{label + ':':<19}" + ("the listener's" if key == "timeout" else "no limit"))
            continue
        print(f"{label + ':':<19}{format_value(schedule[key])}")
    if details["next_fire_times"]:
        note = "" if schedule["state"] == "enabled" else " (if it were enabled now)"
        print(f"\nnext {len(details['next_fire_times'])} fire times in {schedule['timezone']}{note}:")
        for fire in details["next_fire_times"]:
            print(f"  {fire['weekday']} {fire['local'].replace('T', ' ')}   {format_value(fire['at'])}")
    print("\nrecent runs:")
    print_table(details["recent_runs"], _RUN_COLUMNS)


# -- commands --------------------------------------------------------------------------------

def _add(args: argparse.Namespace) -> int:
    try:
        parsed = json.loads(args.args)
    except ValueError as exc:
        raise CommandError(f"--args is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise CommandError("--args must be a JSON object, such as '{\"to\": \"ops@example.com\"}'")
    values: dict[str, Any] = {"project_id": args.project, "function_name": args.function,
                              "cron_expression": args.cron, "timezone": args.timezone,
                              "args": json.dumps(parsed), "enabled": not args.disabled,
                              **_policy_values(args)}
    query = sql.SQL("INSERT INTO dispatch.schedules ({}) VALUES ({}) RETURNING id").format(
        sql.SQL(", ").join(map(sql.Identifier, values)), sql.SQL(", ").join(map(sql.Placeholder, values)))
    with connect(args) as conn:
        try:
            row = conn.execute(query, values).fetchone()
        except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
            # the trigger's 22023 (cron, zone, name, policies), a CHECK, an interval PostgreSQL cannot read
            raise _database_error(exc) from None
        assert row is not None
        details = _details(conn, _load(conn, str(row["id"])))
    if args.json:
        print_json(details)
    else:
        print(f"added schedule {details['schedule']['id']}")
        _print_details(details)
    return 0


def _policy_values(args: argparse.Namespace) -> dict[str, Any]:
    """The policy flags given, by column; "none" is NULL for the columns that may be NULL."""
    values: dict[str, Any] = {}
    for _, column, _ in _POLICIES:
        value = getattr(args, column)
        if value is None:
            continue
        if column in _NULLABLE and value.strip().lower() == "none":
            value = None
        values[column] = value
    return values


def _update(args: argparse.Namespace) -> int:
    schedule_id = _schedule_id(args.id)
    values: dict[str, Any] = {column: getattr(args, column) for column in ("cron_expression", "timezone")
                              if getattr(args, column) is not None}
    if args.args is not None:
        try:
            parsed = json.loads(args.args)
        except ValueError as exc:
            raise CommandError(f"--args is not JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise CommandError("--args must be a JSON object")
        values["args"] = json.dumps(parsed)
    values |= _policy_values(args)
    if not values:
        raise CommandError("nothing to change: give --cron, --timezone, --args or a policy flag")
    with connect(args) as conn:
        schedule = _load(conn, schedule_id)
        if schedule["state"] == "deleted":
            deleted_at = format_value(schedule["deleted_at"])
            raise CommandError(f"schedule {schedule_id} is deleted (at {deleted_at})")
        query = sql.SQL("UPDATE dispatch.schedules SET {} WHERE id = {}").format(
            sql.SQL(", ").join(sql.SQL("{} = {}").format(sql.Identifier(column), sql.Placeholder(column))
                               for column in values),
            sql.Placeholder("id"))
        try:
            conn.execute(query, {**values, "id": schedule_id})
        except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
            raise _database_error(exc) from None
        details = _details(conn, _load(conn, schedule_id))
    if args.json:
        print_json(details)
    else:
        print(f"updated schedule {schedule_id}")
        _print_details(details)
    return 0


def _add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("run policies")
    for flag, column, text in _POLICIES:
        if column == "max_attempts":
            group.add_argument(flag, dest=column, type=_positive, default=None, help=text)
        elif column in ("catchup", "overlap"):
            choices = ("latest", "all") if column == "catchup" else ("skip", "buffer_one", "allow")
            group.add_argument(flag, dest=column, choices=choices, default=None, help=text)
        else:
            group.add_argument(flag, dest=column, metavar="INTERVAL", default=None,
                               help=text + ("; none to clear" if column in _NULLABLE else ""))


def _list(args: argparse.Namespace) -> int:
    where = ["(%(deleted)s OR s.deleted_at IS NULL)",
             "(%(project)s::text IS NULL OR s.project_id = %(project)s::text)",
             "(%(function)s::text IS NULL OR s.function_name = %(function)s::text)"]
    if args.failing:
        where.append("st.consecutive_failures > 0")
    query = (_SCHEDULE + " WHERE " + " AND ".join(where)
             + " ORDER BY s.project_id, s.function_name, s.created_at, s.id LIMIT %(limit)s")
    with connect(args) as conn:
        rows = conn.execute(query, {"deleted": args.deleted, "project": args.project,
                                    "function": args.function, "limit": args.limit}).fetchall()
    if args.json:
        print_json(rows)
    else:
        print_table(rows, _LIST_COLUMNS, empty="no schedules")
    return 0


def _show(args: argparse.Namespace) -> int:
    schedule_id = _schedule_id(args.id)
    with connect(args) as conn:
        details = _details(conn, _load(conn, schedule_id))
    if args.json:
        print_json(details)
    else:
        _print_details(details)
    return 0


def _change(args: argparse.Namespace) -> int:
    schedule_id = _schedule_id(args.id)
    assignment = {"enable": "enabled = true", "disable": "enabled = false",
                  "delete": "deleted_at = now()"}[args.action]
    with connect(args) as conn:
        schedule = _load(conn, schedule_id)
        if schedule["state"] == "deleted":
            deleted_at = format_value(schedule["deleted_at"])
            raise CommandError(f"schedule {schedule_id} is deleted (at {deleted_at})")
        # An update that changes nothing would still count as an edit (audit row, updated_at).
        if (args.action, schedule["state"]) not in (("enable", "enabled"), ("disable", "disabled")):
            conn.execute(f"UPDATE dispatch.schedules SET {assignment} WHERE id = %s", (schedule_id,))
        schedule = _load(conn, schedule_id)
    if args.json:
        print_json(schedule)
    else:
        what = {"enable": "enabled", "disable": "disabled", "delete": "deleted"}[args.action]
        when = f"; next run {format_value(schedule['next_run_at'])}" if schedule["next_run_at"] else ""
        print(f"schedule {schedule_id} {schedule['project_id']}/{schedule['function_name']} {what}{when}")
    return 0


def _pause_or_resume(args: argparse.Namespace) -> int:
    schedule_id = _schedule_id(args.id)
    with connect(args) as conn:
        _load(conn, schedule_id)
        try:
            if args.action == "pause":
                conn.execute("SELECT dispatch.pause(%s, %s)", (schedule_id, args.reason))
            else:
                conn.execute("SELECT dispatch.resume(%s)", (schedule_id,))
        except psycopg.Error as exc:
            raise _database_error(exc) from None
        schedule = _load(conn, schedule_id)
    if args.json:
        print_json(schedule)
    elif args.action == "pause":
        why = f" ({schedule['paused_reason']})" if schedule["paused_reason"] else ""
        print(f"schedule {schedule_id} {schedule['project_id']}/{schedule['function_name']} paused"
              f" by {schedule['paused_by']}{why}")
    else:
        print(f"schedule {schedule_id} {schedule['project_id']}/{schedule['function_name']} resumed;"
              f" next run {format_value(schedule['next_run_at'])}")
    return 0


_FINISHED = ("ok", "error", "skipped", "lost")


def _run_now(args: argparse.Namespace) -> int:
    schedule_id = _schedule_id(args.id)
    with connect(args) as conn:
        _load(conn, schedule_id)
        try:
            run_id = conn.execute("SELECT dispatch.run_now(%s) AS id", (schedule_id,)).fetchone()["id"]  # type: ignore[index]
        except psycopg.Error as exc:
            raise _database_error(exc) from None
        run = _run_row(conn, run_id)
        if not args.wait:
            if args.json:
                print_json(run)
            else:
                print(f"run {run_id} of schedule {schedule_id}: {run['status']}")
            return 0
        if not args.json:
            print(f"run {run_id} of schedule {schedule_id}: waiting for its outcome", flush=True)
        deadline = time.monotonic() + args.wait_timeout
        while run["status"] not in _FINISHED:
            if time.monotonic() > deadline:
                raise CommandError(f"run {run_id} is still {run['status']} after {args.wait_timeout:g} s"
                                   " (is a listener running?)")
            time.sleep(0.1)
            run = _run_row(conn, run_id)
    if args.json:
        print_json(run)
    else:
        error = f": {run['error']}" if run["error"] else ""
        http = f", HTTP {run['http_status']}" if run["http_status"] is not None else ""
        print(f"run {run_id}: {run['status']} after {run['attempt']} attempt(s){http}{error}")
    return 0 if run["status"] == "ok" else 1


def _backfill(args: argparse.Namespace) -> int:
    schedule_id = _schedule_id(args.id)
    with connect(args) as conn:
        _load(conn, schedule_id)
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        try:
            row = conn.execute("SELECT dispatch.backfill(%s, %s::timestamptz, %s::timestamptz) AS marked,"
                               " %s::timestamptz AS from_ts, %s::timestamptz AS to_ts",
                               (schedule_id, args.from_ts, args.to_ts, args.from_ts, args.to_ts)).fetchone()
        except psycopg.Error as exc:
            raise _database_error(exc) from None
    assert row is not None
    if args.json:
        print_json({"schedule_id": schedule_id, **row, "notices": notices})
    else:
        print(f"schedule {schedule_id}: {row['marked']} slots from {format_value(row['from_ts'])}"
              f" to {format_value(row['to_ts'])} marked for backfill; they run one at a time, oldest first")
        for notice in notices:
            print(notice)
    return 0


def _run_row(conn: psycopg.Connection[dict[str, Any]], run_id: int) -> dict[str, Any]:
    row = conn.execute("SELECT id, schedule_id, kind, status, attempt, request_id, scheduled_for,"
                       " finished_at, http_status, duration_ms, error FROM dispatch.runs WHERE id = %s",
                       (run_id,)).fetchone()
    assert row is not None
    return row


def _runs(args: argparse.Namespace) -> int:
    statuses: list[str] | None = None
    if args.failed:
        statuses = ["error", "lost"]
    if args.status:
        statuses = sorted(set(args.status) & set(statuses)) if statuses else args.status
    schedule_id = _schedule_id(args.schedule) if args.schedule else None
    with connect(args) as conn:
        params = {"schedule": schedule_id, "statuses": statuses, "limit": args.limit}
        rows = conn.execute(_RUNS, params).fetchall()
    if args.json:
        print_json(rows)
    else:
        print_table(rows, _RUN_COLUMNS, empty="no runs", max_width=80)
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `schedules` and `runs` with the top-level parser."""
    schedules = commands.add_parser(
        "schedules", help="add, update, list, show, pause, resume, run, backfill, enable, disable or delete "
                                       "schedules",
        description="Manage rows of dispatch.schedules. Writes go through the same trigger as SQL "
                    "(validation, audit row, NOTIFY); a dispatch_admin role may run them.")
    actions = schedules.add_subparsers(dest="action", required=True, metavar="ACTION")

    add = actions.add_parser("add", help="add a schedule and show its next fire times",
                             description="Add a schedule; prints it with its next 5 fire times.")
    add.add_argument("--project", required=True, help="project id (1-200 characters, no whitespace or /)")
    add.add_argument("--function", required=True, help="function name, as in the invoke URL")
    add.add_argument("--cron", required=True, help="5-field cron expression or macro, e.g. '30 2 * * *'")
    add.add_argument("--timezone", default="UTC", help="IANA time zone of the expression (default UTC)")
    add.add_argument("--args", default="{}", help="JSON object sent as the request's args (default {})")
    add.add_argument("--disabled", action="store_true", help="add it paused")
    _add_policy_arguments(add)
    add_connection_arguments(add)
    add.set_defaults(handler=_add)

    update = actions.add_parser("update", help="change a schedule's expression, zone, args or run policies",
                                description="Change what is given, nothing else; prints the schedule.")
    update.add_argument("id", help="schedule id")
    update.add_argument("--cron", dest="cron_expression", help="5-field cron expression or macro")
    update.add_argument("--timezone", help="IANA time zone of the expression")
    update.add_argument("--args", help="JSON object sent as the request's args")
    _add_policy_arguments(update)
    add_connection_arguments(update)
    update.set_defaults(handler=_update)

    listing = actions.add_parser("list", help="list schedules (not deleted)",
                                 description="List schedules with their state, next run and failures.")
    listing.add_argument("--project", help="only this project")
    listing.add_argument("--function", help="only this function name")
    listing.add_argument("--failing", action="store_true", help="only schedules whose last runs failed")
    listing.add_argument("--deleted", action="store_true", help="include soft-deleted schedules")
    listing.add_argument("--limit", type=_positive, default=100, help="at most this many (default 100)")
    add_connection_arguments(listing)
    listing.set_defaults(handler=_list)

    show = actions.add_parser("show", help="one schedule, its next 5 fire times and its recent runs")
    show.add_argument("id", help="schedule id")
    add_connection_arguments(show)
    show.set_defaults(handler=_show)

    for action, text in (("enable", "resume a schedule: its next slot is computed from now"),
                         ("disable", "pause a schedule: a pending run of it ends skipped"),
                         ("delete", "soft-delete a schedule (sets deleted_at; its runs are kept)")):
        parser = actions.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        parser.add_argument("id", help="schedule id")
        add_connection_arguments(parser)
        parser.set_defaults(handler=_change)

    pause = actions.add_parser("pause", help="pause a schedule, with a reason (dispatch.pause)",
                               description="Pause a schedule: nothing fires until it is resumed; the reason "
                                           "and your role are recorded.")
    pause.add_argument("id", help="schedule id")
    pause.add_argument("--reason", help="why (at most 500 characters), shown by schedules show")
    add_connection_arguments(pause)
    pause.set_defaults(handler=_pause_or_resume)
    resume = actions.add_parser("resume", help="resume a paused schedule (dispatch.resume)",
                                description="Resume a paused schedule from its first slot after now; the "
                                            "slots of the pause are not caught up.")
    resume.add_argument("id", help="schedule id")
    add_connection_arguments(resume)
    resume.set_defaults(handler=_pause_or_resume)
    run = actions.add_parser("run", help="invoke a schedule's function now (dispatch.run_now)",
                             description="Invoke a schedule's function now, outside its slots (a manual run "
                                         "with its own request id); prints the run id. With --wait, waits "
                                         "for its outcome and exits 1 unless it is ok.")
    run.add_argument("id", help="schedule id")
    run.add_argument("--wait", action="store_true", help="wait for the run's outcome and print it")
    run.add_argument("--wait-timeout", type=float, default=300, metavar="SECONDS",
                     help="give up waiting after this long (default 300)")
    add_connection_arguments(run)
    run.set_defaults(handler=_run_now)

    backfill = actions.add_parser("backfill", help="run past slots in a range (dispatch.backfill)",
                                  description="Mark each slot of the schedule in [--from, --to) that has no "
                                              "run yet; they run one at a time, oldest first, its own slots "
                                              "going first. At most 10,000 a call.")
    backfill.add_argument("id", help="schedule id")
    backfill.add_argument("--from", dest="from_ts", required=True, metavar="TIMESTAMP",
                          help="first instant, e.g. 2026-11-30T00:00Z (included)")
    backfill.add_argument("--to", dest="to_ts", required=True, metavar="TIMESTAMP",
                          help="last instant (excluded); never past now or the schedule's next slot")
    add_connection_arguments(backfill)
    backfill.set_defaults(handler=_backfill)

    runs = commands.add_parser("runs", help="recent runs",
                               description="Runs from dispatch.runs, newest first.")
    runs_actions = runs.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = runs_actions.add_parser("list", help="recent runs, newest first",
                                      description="Recent runs, newest first.")
    listing.add_argument("--failed", action="store_true", help="only runs that ended error or lost")
    listing.add_argument("--schedule", metavar="ID", help="only runs of this schedule")
    listing.add_argument("--status", action="append", choices=RUN_STATUSES,
                         help="only runs in this status (repeatable)")
    listing.add_argument("--limit", type=_positive, default=20, help="at most this many (default 20)")
    add_connection_arguments(listing)
    listing.set_defaults(handler=_runs)
