"""`pgdispatch schedules …` and `pgdispatch runs list`: the dispatch tables from a terminal.

Every write is a plain INSERT/UPDATE on dispatch.schedules, so the same trigger checks it as a
psql user's (and the audit log names the database role). Fire times are computed in SQL with
dispatch.cron_next, in the schedule's zone, so they are exactly the dispatcher's.
"""

from __future__ import annotations

import argparse
import json
import uuid
from datetime import timedelta
from typing import Any

import psycopg

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
       CASE WHEN s.deleted_at IS NOT NULL THEN 'deleted' WHEN s.enabled THEN 'enabled' ELSE 'disabled' END
           AS state,
       s.next_run_at, s.last_run_at, s.last_status, s.last_error, s.max_attempts,
       coalesce(st.consecutive_failures, 0) AS consecutive_failures, st.current_run_status,
       st.overdue_by, s.created_at, s.updated_at, s.deleted_at
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
                ("duration_ms", "ms"), ("http_status", "http"), ("error", "error")]


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
              ("next_run_at", "next run"), ("last_run_at", "last run"), ("last_status", "last status"),
              ("last_error", "last error"), ("consecutive_failures", "failures in a row"),
              ("current_run_status", "run in flight"), ("overdue_by", "overdue by"),
              ("max_attempts", "max attempts"), ("created_at", "created"), ("updated_at", "updated"),
              ("deleted_at", "deleted")]
    for key, label in fields:
        if key in ("deleted_at", "overdue_by", "current_run_status") and schedule[key] is None:
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
    with connect(args) as conn:
        try:
            row = conn.execute(
                "INSERT INTO dispatch.schedules"
                " (project_id, function_name, cron_expression, timezone, args, enabled, max_attempts)"
                " VALUES (%s, %s, %s, %s, %s::jsonb, %s, coalesce(%s, 3)) RETURNING id",
                (args.project, args.function, args.cron, args.timezone, json.dumps(parsed), not args.disabled,
                 args.max_attempts),
            ).fetchone()
        except psycopg.errors.DataError as exc:  # invalid cron, zone or name (the trigger's 22023)
            raise _database_error(exc) from None
        except psycopg.errors.IntegrityError as exc:  # CHECK constraints: project, args, attempts
            raise _database_error(exc) from None
        assert row is not None
        details = _details(conn, _load(conn, str(row["id"])))
    if args.json:
        print_json(details)
    else:
        print(f"added schedule {details['schedule']['id']}")
        _print_details(details)
    return 0


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
        "schedules", help="add, list, show, enable, disable or delete schedules",
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
    add.add_argument("--max-attempts", type=_positive, default=None,
                     help="invocations of a run whose listener died before it is lost (default 3)")
    add.add_argument("--disabled", action="store_true", help="add it paused")
    add_connection_arguments(add)
    add.set_defaults(handler=_add)

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
