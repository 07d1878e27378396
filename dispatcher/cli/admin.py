"""`pgdispatch schedules …` and `pgdispatch runs list`: the dispatch tables from a terminal.

Every write is a plain INSERT/UPDATE on dispatch.schedules, so the same trigger checks it as a
psql user's (and the audit log names the database role). Fire times are computed in SQL with
dispatch.cron_next, in the schedule's zone, so they are exactly the dispatcher's.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from dispatcher.cli import calendars, explain, schedule_verbs
from dispatcher.cli.console import (
    CommandError,
    UsageError,
    add_connection_arguments,
    connect,
    format_value,
    print_json,
    print_table,
)
from dispatcher.cli.durations import format_duration, parse_duration
from dispatcher.cli.schedule_rows import SCHEDULE, database_error, load, parse_schedule_id

__all__ = ["add_commands"]

PREVIEW = 5
RUN_STATUSES = ("pending", "running", "ok", "error", "skipped", "lost")

# The next slots of a schedule that run, by its own rule (cron, interval or one instant) and
# its calendar, and the instants they fire at (its jitter), computed in SQL exactly as the
# dispatcher does; from now when it has no next slot; none past a bounded rule's last
# ('infinity').
_FIRE_TIMES = """
WITH RECURSIVE slot(n, at) AS (
    SELECT 1, CASE WHEN s.calendar_id IS NULL THEN x.at
                   ELSE dispatch._calendar_slot(s.cron_spec, s.timezone, s.calendar_id, x.at) END
    FROM dispatch.schedules s
    CROSS JOIN LATERAL (SELECT coalesce(s.next_run_at,
                                        dispatch.cron_spec_next(s.cron_spec, now(), s.timezone)) AS at) x
    WHERE s.id = %(id)s AND s.ended_at IS NULL
  UNION ALL
    SELECT n + 1, CASE WHEN s.calendar_id IS NULL THEN x.at
                       ELSE dispatch._calendar_slot(s.cron_spec, s.timezone, s.calendar_id, x.at) END
    FROM slot JOIN dispatch.schedules s ON s.id = %(id)s
    CROSS JOIN LATERAL (SELECT dispatch.cron_spec_next(s.cron_spec, slot.at, s.timezone) AS at) x
    WHERE n < %(count)s AND isfinite(slot.at)
)
SELECT slot.at, slot.at + dispatch.jitter_offset(s.id, slot.at, s.jitter) AS fire_at,
       slot.at AT TIME ZONE s.timezone AS local_time,
       (slot.at AT TIME ZONE s.timezone) - (slot.at AT TIME ZONE 'UTC') AS utc_offset, s.timezone
FROM slot JOIN dispatch.schedules s ON s.id = %(id)s
WHERE isfinite(slot.at)
ORDER BY slot.n
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
                 ("slots", "slots"), ("timezone", "zone"), ("jitter_text", "jitter"), ("state_text", "state"),
                 ("next_fire_at", "next fire (UTC)"), ("last_status", "last"),
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
    ("--pause-after-failures", "pause_after_failures",
     "pause the schedule after this many runs in a row end error or lost (1-1000; default: never)"),
]
_NULLABLE = {"timeout", "misfire_grace", "pause_after_failures"}


def _offset(value: timedelta) -> str:
    minutes = int(value.total_seconds()) // 60
    sign = "-" if minutes < 0 else "+"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def _fire_times(conn: psycopg.Connection[dict[str, Any]], sid: str,
                count: int = PREVIEW) -> list[dict[str, Any]]:
    """The schedule's next `count` slots, each as UTC and local time, with the instant it fires at."""
    rows = conn.execute(_FIRE_TIMES, {"id": sid, "count": count}).fetchall()
    return [
        {"at": row["at"], "fire_at": row["fire_at"],
         "local": f"{row['local_time']:%Y-%m-%dT%H:%M:%S}{_offset(row['utc_offset'])}",
         "weekday": f"{row['local_time']:%a}", "timezone": row["timezone"]}
        for row in rows
    ]


def _slots(schedule: dict[str, Any]) -> str:
    """How a schedule's slots are given: its cron expression, `every 30s` or `once at …`, and
    its bounds."""
    if schedule["run_at"] is not None:
        return f"once at {format_value(schedule['run_at'])}"
    rule = (str(schedule["cron_expression"]) if schedule["every"] is None
            else f"every {format_duration(schedule['every'])}")
    if schedule["max_runs"] is not None:
        rule += f", {schedule['max_runs']} slots"
    if schedule["ends_at"] is not None:
        rule += f", until {format_value(schedule['ends_at'])}"
    return rule


def _list_row(schedule: dict[str, Any]) -> dict[str, Any]:
    """A schedule as one line of `schedules list`: who paused it and why in its state."""
    state = schedule["state"]
    if state == "paused":
        why = f": {schedule['paused_reason']}" if schedule["paused_reason"] else ""
        state = f"paused by {schedule['paused_by']}{why}"
    return {**schedule, "slots": _slots(schedule), "state_text": state,
            "timezone": None if schedule["cron_expression"] is None else schedule["timezone"],
            "jitter_text": format_duration(schedule["jitter"]) if schedule["jitter"] else None}


def _details(conn: psycopg.Connection[dict[str, Any]], schedule: dict[str, Any]) -> dict[str, Any]:
    preview: list[dict[str, Any]] = []
    if schedule["state"] != "deleted":
        preview = _fire_times(conn, str(schedule["id"]))
    runs = conn.execute(_RUNS, {"schedule": schedule["id"], "statuses": None, "limit": PREVIEW}).fetchall()
    return {"schedule": schedule, "next_fire_times": preview, "recent_runs": runs}


def _print_details(details: dict[str, Any]) -> None:
    schedule = details["schedule"]
    interval = schedule["every"] is not None
    fields = [("id", "id"), ("project_id", "project"), ("function_name", "function"),
              *([("every", "every"), ("anchor", "anchor")] if interval
                else [("run_at", "once at")] if schedule["run_at"] is not None
                else [("cron_expression", "cron"), ("timezone", "time zone")]),
              ("starts_at", "starts at"), ("ends_at", "ends at"), ("max_runs", "max runs"),
              ("jitter", "jitter"), ("args", "args"), ("state", "state"),
              ("ended_at", "ended at"), ("ended_reason", "why it ended"),
              ("paused_at", "paused at"), ("paused_by", "paused by"), ("paused_reason", "pause reason"),
              ("next_run_at", "next run"), ("next_fire_at", "fires at"), ("last_run_at", "last run"),
              ("last_status", "last status"),
              ("last_error", "last error"), ("consecutive_failures", "failures in a row"),
              ("current_run_status", "run in flight"), ("current_attempt", "attempts so far"),
              ("open_runs", "open runs"), ("next_retry_at", "next retry"), ("overdue_by", "overdue by"),
              ("max_attempts", "max attempts"), ("retry_backoff", "retry back-off"),
              ("retry_backoff_max", "back-off at most"), ("timeout", "timeout"),
              ("misfire_grace", "misfire grace"),
              ("catchup", "catch-up"), ("overlap", "overlap"),
              ("pause_after_failures", "pause after"), ("traceparent", "traceparent"),
              ("calendar", "calendar"),
              ("created_at", "created"),
              ("updated_at", "updated"), ("deleted_at", "deleted")]
    optional = ("deleted_at", "overdue_by", "current_run_status", "current_attempt", "next_retry_at",
                "paused_at", "paused_by", "paused_reason", "next_fire_at", "starts_at", "ends_at", "max_runs",
                "ended_at", "ended_reason", "traceparent", "calendar")
    for key, label in fields:
        if key in optional and schedule[key] is None:
            continue
        if key == "next_fire_at" and schedule[key] == schedule["next_run_at"]:
            continue
        if key in ("every", "jitter"):
            print(f"{label + ':':<19}{format_duration(schedule[key])}")
            continue
        if key == "open_runs" and schedule[key] < 2:
            continue
        if key == "pause_after_failures" and schedule[key] is not None:
            print(f"{label + ':':<19}{schedule[key]} failed runs in a row")
            continue
        if key in _NULLABLE and schedule[key] is None:
            print(f"{label + ':':<19}" + {"timeout": "the listener's", "pause_after_failures": "never"}.get(
                key, "no limit"))
            continue
        print(f"{label + ':':<19}{format_value(schedule[key])}")
    if details["next_fire_times"]:
        note = "" if schedule["state"] == "enabled" else " (if it were enabled now)"
        where = "" if schedule["cron_expression"] is None else f" in {schedule['timezone']}"
        print(f"\nnext {len(details['next_fire_times'])} slots{where}{note}:")
        for fire in details["next_fire_times"]:
            local = ("" if schedule["cron_expression"] is None
                     else f"{fire['weekday']} {fire['local'].replace('T', ' ')}   ")
            jittered = f"   fires {format_value(fire['fire_at'])}" if fire["fire_at"] != fire["at"] else ""
            print(f"  {local}{format_value(fire['at'])}{jittered}")
    print("\nrecent runs:")
    print_table(details["recent_runs"], _RUN_COLUMNS)


# -- commands --------------------------------------------------------------------------------

def _json_args(text: str) -> str:
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--args is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise UsageError("--args must be a JSON object, such as '{\"to\": \"ops@example.com\"}'")
    return json.dumps(parsed)


def _instant(conn: psycopg.Connection[dict[str, Any]], flag: str, text: str, zone: str) -> datetime | None:
    """An ISO 8601 timestamp given to `flag`; one without an offset is a wall-clock time in
    `zone`, read by PostgreSQL (its DST rule). "none" is NULL."""
    if text.strip().lower() == "none":
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"{flag} {text!r} is not an ISO 8601 timestamp, such as 2027-01-31T09:00") from None
    if parsed.tzinfo is not None:
        return parsed
    try:
        row = conn.execute("SELECT %s::timestamp AT TIME ZONE dispatch.check_timezone(%s) AS at",
                           (parsed, zone)).fetchone()
    except psycopg.errors.DataError as exc:
        raise database_error(exc) from None
    assert row is not None
    result: datetime = row["at"]
    return result


def _slot_values(conn: psycopg.Connection[dict[str, Any]], args: argparse.Namespace,
                 zone: str, project: str) -> dict[str, Any]:
    """--cron, --every or --at (the others cleared), --anchor, --jitter, --starts-at, --ends-at,
    --max-runs, --traceparent, --calendar (a name, of the project or shared): those given, by
    column."""
    values: dict[str, Any] = {}
    if args.cron is not None:
        values |= {"cron_expression": args.cron, "every": None, "run_at": None}
    if args.every is not None:
        values |= {"every": args.every, "cron_expression": None, "run_at": None}
    if args.at is not None:
        values |= {"run_at": _instant(conn, "--at", args.at, zone), "cron_expression": None, "every": None,
                   "starts_at": None, "ends_at": None, "max_runs": None}
    if args.anchor is not None:
        values["anchor"] = args.anchor
    if args.jitter is not None:
        values["jitter"] = args.jitter
    for flag, column in (("--starts-at", "starts_at"), ("--ends-at", "ends_at")):
        if getattr(args, column) is not None:
            values[column] = _instant(conn, flag, getattr(args, column), zone)
    if args.max_runs is not None:
        values["max_runs"] = args.max_runs or None
    if args.traceparent is not None:
        values["traceparent"] = None if args.traceparent.strip().lower() == "none" else args.traceparent
    if args.calendar is not None:
        values["calendar_id"] = (None if args.calendar.strip().lower() == "none"
                                 else calendars.resolve(conn, args.calendar, project, or_shared=True)["id"])
    return values


def _add(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        values: dict[str, Any] = {"project_id": args.project, "function_name": args.function,
                                  "timezone": args.timezone, "args": _json_args(args.args),
                                  "enabled": not args.disabled,
                                  **_slot_values(conn, args, args.timezone, args.project),
                                  **_policy_values(args)}
        query = sql.SQL("INSERT INTO dispatch.schedules ({}) VALUES ({}) RETURNING id").format(
            sql.SQL(", ").join(map(sql.Identifier, values)), sql.SQL(", ").join(map(sql.Placeholder, values)))
        try:
            row = conn.execute(query, values).fetchone()
        except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
            # the trigger's 22023 (cron, zone, name, policies), a CHECK, an interval PostgreSQL cannot read
            raise database_error(exc) from None
        assert row is not None
        details = _details(conn, load(conn, str(row["id"])))
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
    schedule_id = parse_schedule_id(args.id)
    with connect(args) as conn:
        schedule = load(conn, schedule_id)
        values: dict[str, Any] = _slot_values(conn, args, args.timezone or schedule["timezone"],
                                              schedule["project_id"])
        if args.timezone is not None:
            values["timezone"] = args.timezone
        if args.args is not None:
            values["args"] = _json_args(args.args)
        values |= _policy_values(args)
        if not values:
            raise UsageError("nothing to change: give --cron, --every, --at, --anchor, --jitter, --starts-at,"
                             " --ends-at, --max-runs, --calendar, --timezone, --args or a policy flag")
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
            raise database_error(exc) from None
        details = _details(conn, load(conn, schedule_id))
    if args.json:
        print_json(details)
    else:
        print(f"updated schedule {schedule_id}")
        _print_details(details)
    return 0


def _add_slot_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    group = parser.add_argument_group("slots (one of --cron, --every and --at)")
    kind = group.add_mutually_exclusive_group(required=required)
    kind.add_argument("--cron", help="5-field cron expression or macro, e.g. '30 2 * * *'")
    kind.add_argument("--every", type=parse_duration, metavar="DURATION",
                      help="an interval schedule instead: slots this far apart in real time, at least 1s "
                           "(e.g. 30s, 5m, 1h30m)")
    kind.add_argument("--at", metavar="TIMESTAMP",
                      help="a one-shot instead: one slot at this instant (ISO 8601; without an offset, in "
                           "--timezone), then the schedule ends")
    none = "; none to clear" if not required else ""
    group.add_argument("--starts-at", dest="starts_at", metavar="TIMESTAMP",
                       help="no slot before this instant (without an offset, in --timezone)" + none)
    group.add_argument("--ends-at", dest="ends_at", metavar="TIMESTAMP",
                       help="no slot after this instant; the schedule ends after its last" + none)
    group.add_argument("--max-runs", dest="max_runs", type=_positive if required else _count, metavar="N",
                       help="at most N slots (1-10000), from --starts-at or now; each runs or is a recorded "
                            "gap" + ("; 0 to clear" if not required else ""))
    group.add_argument("--anchor", metavar="TIMESTAMP",
                       help="with --every: the instant slots are counted from (default: when it was added)")
    group.add_argument("--traceparent", metavar="HEADER",
                       help="a W3C traceparent its runs continue (their trace id; their spans its children)"
                            + none)
    group.add_argument("--calendar", metavar="NAME",
                       help="an exclusion calendar (pgdispatch calendars): its slots in the calendar's "
                            "periods do not run" + none)
    group.add_argument("--jitter", type=parse_duration, metavar="DURATION",
                       help="fire each slot at a fixed offset in [0, DURATION) after it, the same for every "
                            "tick, to spread schedules that share a slot (e.g. 5m; default 0s)")


def _add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("run policies")
    for flag, column, text in _POLICIES:
        if column == "max_attempts":
            group.add_argument(flag, dest=column, type=_positive, default=None, help=text)
        elif column == "pause_after_failures":
            group.add_argument(flag, dest=column, metavar="N", default=None,
                               help=text + ("; none to clear" if column in _NULLABLE else ""))
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
    query = (SCHEDULE + " WHERE " + " AND ".join(where)
             + " ORDER BY s.project_id, s.function_name, s.created_at, s.id LIMIT %(limit)s")
    with connect(args) as conn:
        rows = conn.execute(query, {"deleted": args.deleted, "project": args.project,
                                    "function": args.function, "limit": args.limit}).fetchall()
    if args.json:
        print_json(rows)
    else:
        print_table([_list_row(row) for row in rows], _LIST_COLUMNS, empty="no schedules")
    return 0


def _show(args: argparse.Namespace) -> int:
    schedule_id = parse_schedule_id(args.id)
    with connect(args) as conn:
        details = _details(conn, load(conn, schedule_id))
    if args.json:
        print_json(details)
    else:
        _print_details(details)
    return 0


def _change(args: argparse.Namespace) -> int:
    schedule_id = parse_schedule_id(args.id)
    assignment = {"enable": "enabled = true", "disable": "enabled = false",
                  "delete": "deleted_at = now()"}[args.action]
    with connect(args) as conn:
        schedule = load(conn, schedule_id)
        if schedule["state"] == "deleted":
            deleted_at = format_value(schedule["deleted_at"])
            raise CommandError(f"schedule {schedule_id} is deleted (at {deleted_at})")
        # An update that changes nothing would still count as an edit (audit row, updated_at).
        if (args.action, schedule["state"]) not in (("enable", "enabled"), ("disable", "disabled")):
            conn.execute(f"UPDATE dispatch.schedules SET {assignment} WHERE id = %s", (schedule_id,))
        schedule = load(conn, schedule_id)
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
    schedule_id = parse_schedule_id(args.schedule) if args.schedule else None
    with connect(args) as conn:
        params = {"schedule": schedule_id, "statuses": statuses, "limit": args.limit}
        rows = conn.execute(_RUNS, params).fetchall()
    if args.json:
        print_json(rows)
    else:
        print_table(rows, _RUN_COLUMNS, empty="no runs", max_width=80)
    return 0


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _count(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `schedules` and `runs` with the top-level parser."""
    schedules = commands.add_parser(
        "schedules",
        help="add, update, list, show, explain, pause, resume, run, backfill, enable, disable or delete "
             "schedules",
        description="Manage rows of dispatch.schedules. Writes go through the same trigger as SQL "
                    "(validation, audit row, NOTIFY); a dispatch_admin role may run them.")
    actions = schedules.add_subparsers(dest="action", required=True, metavar="ACTION")

    add = actions.add_parser("add", help="add a schedule and show its next fire times",
                             description="Add a schedule; prints it with its next 5 fire times.")
    add.add_argument("--project", required=True, help="project id (1-200 characters, no whitespace or /)")
    add.add_argument("--function", required=True, help="function name, as in the invoke URL")
    _add_slot_arguments(add, required=True)
    add.add_argument("--timezone", default="UTC", help="IANA time zone of the expression (default UTC)")
    add.add_argument("--args", default="{}", help="JSON object sent as the request's args (default {})")
    add.add_argument("--disabled", action="store_true", help="add it disabled (enabled = false)")
    _add_policy_arguments(add)
    add_connection_arguments(add)
    add.set_defaults(handler=_add)

    update = actions.add_parser("update", help="change a schedule's expression, zone, args or run policies",
                                description="Change what is given, nothing else; prints the schedule.")
    update.add_argument("id", help="schedule id")
    _add_slot_arguments(update, required=False)
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

    for action, text in (("enable", "set enabled: its next slot is computed from now"),
                         ("disable", "clear enabled (pause records who and why): a pending run ends skipped"),
                         ("delete", "soft-delete a schedule (sets deleted_at; its runs are kept)")):
        parser = actions.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        parser.add_argument("id", help="schedule id")
        add_connection_arguments(parser)
        parser.set_defaults(handler=_change)

    schedule_verbs.add_commands(actions)
    explain.add_commands(actions)

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
