"""`pgdispatch calendars list|add|exclude|show|unexclude|delete`: exclusion calendars
(dispatch.calendars, dispatch.calendar_exclusions) from a terminal.

Each write is the INSERT or DELETE a dispatch_admin runs in psql, checked by the same triggers;
`show` lists the periods to come with dispatch.calendar_periods, as the tick computes them.
A calendar is named by its scope: with --project that project's own, without a shared one;
a schedule's --calendar names its project's own by that name, else the shared one.
"""

from __future__ import annotations

import argparse
import re
from datetime import date, datetime, time, timedelta
from typing import Any

import psycopg

from dispatcher.cli.console import (
    UsageError,
    add_connection_arguments,
    connect,
    print_json,
    print_table,
)
from dispatcher.cli.schedule_rows import database_error

__all__ = ["add_commands", "resolve"]

_DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
# time 24:00 is PostgreSQL's end of the day, which Python's time cannot hold: read as text
_EXCLUSION = ("id, calendar_id, label, starts, ends, days, from_time::text AS from_time,"
              " until_time::text AS until_time")

_LIST = """
SELECT c.id, c.project_id, c.name, c.timezone, c.description,
       (SELECT count(*) FROM dispatch.calendar_exclusions e WHERE e.calendar_id = c.id) AS exclusions,
       (SELECT count(*) FROM dispatch.schedules s WHERE s.calendar_id = c.id AND s.deleted_at IS NULL)
           AS schedules
FROM dispatch.calendars c
WHERE %(project)s::text IS NULL OR c.project_id = %(project)s::text OR c.project_id IS NULL
ORDER BY c.project_id NULLS FIRST, c.name
"""
_COLUMNS = [("id", "id"), ("project_id", "project"), ("name", "name"), ("timezone", "zone"),
            ("exclusions", "exclusions"), ("schedules", "schedules"), ("description", "description")]
_EXCLUSION_COLUMNS = [("id", "id"), ("rule", "excludes"), ("label", "label")]
_PERIOD_COLUMNS = [("starts_at", "from (UTC)"), ("ends_at", "to (UTC)"), ("local", "local time"),
                   ("label", "label")]


def resolve(conn: psycopg.Connection[dict[str, Any]], name: str, project: str | None, *,
            or_shared: bool = False) -> dict[str, Any]:
    """The calendar `name` of `project` (None: the shared one); with `or_shared`, as a schedule
    of the project means it: its project's own, else the shared one."""
    row = conn.execute(
        "SELECT * FROM dispatch.calendars WHERE name = %(name)s"
        " AND (project_id IS NOT DISTINCT FROM %(project)s OR (%(or_shared)s AND project_id IS NULL))"
        " ORDER BY project_id NULLS LAST LIMIT 1",
        {"name": name, "project": project, "or_shared": or_shared}).fetchone()
    if row is None:
        whose = (f"of project {project}" + (" or shared" if or_shared else "")) if project else "shared"
        raise UsageError(f"no calendar {name!r} {whose} (pgdispatch calendars list shows them)")
    return row


def _days(text: str) -> list[int]:
    """"sat,sun", "mon-fri", "6,7": ISO day numbers."""
    days: set[int] = set()
    for part in text.lower().replace(" ", "").split(","):
        ends = [_day(end) for end in part.split("-", 1)]
        if len(ends) == 2 and ends[0] > ends[1]:
            raise argparse.ArgumentTypeError(f"{part!r}: a range goes from Monday to Sunday, e.g. mon-fri")
        days.update(range(ends[0], ends[-1] + 1))
    return sorted(days)


def _day(text: str) -> int:
    if text.isdigit() and 1 <= int(text) <= 7:
        return int(text)
    for number, name in enumerate(_DAYS, 1):
        if len(text) >= 3 and name.startswith(text):
            return number
    raise argparse.ArgumentTypeError(f"{text!r} is not a day of the week (mon … sun, or 1 … 7)")


def _between(text: str) -> tuple[str, str]:
    """"22:00-24:00": the wall-clock times of a weekly exclusion (24:00, the end of the day)."""
    match = re.fullmatch(r"\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*", text)
    if match is None or any(int(h) > 24 or int(m) > 59 or (int(h) == 24 and int(m) > 0)
                            for h, m in (match.groups()[:2], match.groups()[2:])):
        raise argparse.ArgumentTypeError(f"{text!r} is not HH:MM-HH:MM, e.g. 22:00-24:00")
    h1, m1, h2, m2 = match.groups()
    return f"{int(h1):02d}:{m1}", f"{int(h2):02d}:{m2}"


def _date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date, such as 2027-12-25") from None


def _wall(text: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a wall-clock time, such as 2027-12-24T18:00") \
            from None
    if parsed.tzinfo is not None:
        raise argparse.ArgumentTypeError(f"{text!r}: give a wall-clock time without an offset; the "
                                         "calendar's zone places it")
    return parsed


def _scope(cal: dict[str, Any]) -> str:
    return f"project {cal['project_id']}" if cal["project_id"] else "shared"


def _rule(row: dict[str, Any]) -> str:
    if row["days"] is None:
        return f"{row['starts']:%Y-%m-%d %H:%M} to {row['ends']:%Y-%m-%d %H:%M}"
    days = ", ".join(_DAYS[d - 1][:3].capitalize() for d in row["days"])
    hours = (row["from_time"][:5], row["until_time"][:5])
    return f"every {days}" + ("" if hours == ("00:00", "24:00") else f" {hours[0]}-{hours[1]}")


def _list(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        rows = conn.execute(_LIST, {"project": args.project}).fetchall()
    if args.json:
        print_json(rows)
    else:
        print_table(rows, _COLUMNS, empty="no calendars")
    return 0


def _add(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        try:
            row = conn.execute(
                "INSERT INTO dispatch.calendars (project_id, name, timezone, description)"
                " VALUES (%s, %s, %s, %s) RETURNING *",
                (args.project, args.name, args.timezone, args.description)).fetchone()
        except psycopg.Error as exc:
            raise database_error(exc) from None
    if args.json:
        print_json(row)
    else:
        assert row is not None
        print(f"added calendar {row['name']} ({_scope(row)}, {row['timezone']}); give it periods with "
              f"pgdispatch calendars exclude {row['name']}")
    return 0


def _exclude(args: argparse.Namespace) -> int:
    given = [flag for flag, value in (("--date", args.date), ("--from/--to", args.start or args.end),
                                      ("--weekly", args.weekly)) if value]
    if len(given) != 1:
        raise UsageError("give one of --date [--until], --from and --to, or --weekly [--between]"
                         + (f", not {' and '.join(given)}" if given else ""))
    if args.until is not None and args.date is None:
        raise UsageError("--until goes with --date")
    if args.between is not None and args.weekly is None:
        raise UsageError("--between goes with --weekly")
    columns: dict[str, Any] = {"label": args.label}
    if args.date is not None:
        last = args.until or args.date
        if last < args.date:
            raise UsageError(f"--until {last} is before --date {args.date}")
        columns |= {"starts": datetime.combine(args.date, time(0)),
                    "ends": datetime.combine(last + timedelta(days=1), time(0))}
    elif args.weekly is not None:
        start, end = args.between or ("00:00", "24:00")
        columns |= {"days": args.weekly, "from_time": start, "until_time": end}
    else:
        if args.start is None or args.end is None:
            raise UsageError("--from and --to go together")
        columns |= {"starts": args.start, "ends": args.end}
    with connect(args) as conn:
        cal = resolve(conn, args.name, args.project)
        names = ", ".join(["calendar_id", *columns])
        placeholders = ", ".join(["%s"] * (len(columns) + 1))
        try:
            row = conn.execute(f"INSERT INTO dispatch.calendar_exclusions ({names}) VALUES ({placeholders})"
                               f" RETURNING {_EXCLUSION}", [cal["id"], *columns.values()]).fetchone()
        except psycopg.Error as exc:
            raise database_error(exc) from None
    assert row is not None
    if args.json:
        print_json(row)
    else:
        print(f"calendar {cal['name']}: exclusion {row['id']}, {_rule(row)} ({cal['timezone']})")
    return 0


def _show(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        cal = resolve(conn, args.name, args.project)
        exclusions = conn.execute(f"SELECT {_EXCLUSION} FROM dispatch.calendar_exclusions"
                                  " WHERE calendar_id = %s ORDER BY id", (cal["id"],)).fetchall()
        periods = conn.execute(
            "SELECT p.starts_at, p.ends_at, p.label, p.exclusion_id,"
            " to_char(p.starts_at AT TIME ZONE c.timezone, 'Dy YYYY-MM-DD HH24:MI') || ' to '"
            "   || to_char(p.ends_at AT TIME ZONE c.timezone, 'Dy YYYY-MM-DD HH24:MI') AS local"
            " FROM dispatch.calendar_periods(%s, now(), now() + %s * interval '1 day') p"
            " JOIN dispatch.calendars c ON c.id = %s",
            (cal["id"], args.days, cal["id"])).fetchall()
        schedules = conn.execute(
            "SELECT id, project_id, function_name FROM dispatch.schedules"
            " WHERE calendar_id = %s AND deleted_at IS NULL ORDER BY project_id, function_name",
            (cal["id"],)).fetchall()
    if args.json:
        print_json({"calendar": cal, "exclusions": exclusions, "periods": periods, "schedules": schedules})
        return 0
    print(f"calendar {cal['name']} ({_scope(cal)}), wall-clock times in {cal['timezone']}")
    if cal["description"]:
        print(cal["description"])
    print("\nexclusions:")
    print_table([{**e, "rule": _rule(e)} for e in exclusions], _EXCLUSION_COLUMNS, empty="none")
    print(f"\nperiods in the next {args.days} days:")
    print_table(periods, _PERIOD_COLUMNS, empty="none")
    print(f"\nschedules using it: {len(schedules)}")
    for s in schedules[:20]:
        print(f"  {s['id']}  {s['project_id']}/{s['function_name']}")
    return 0


def _unexclude(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        try:
            row = conn.execute(f"DELETE FROM dispatch.calendar_exclusions WHERE id = %s"
                               f" RETURNING {_EXCLUSION}", (args.id,)).fetchone()
        except psycopg.Error as exc:
            raise database_error(exc) from None
    if row is None:
        raise UsageError(f"no calendar exclusion {args.id} (pgdispatch calendars show NAME lists them)")
    if args.json:
        print_json(row)
    else:
        print(f"removed exclusion {row['id']}: {_rule(row)}")
    return 0


def _delete(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        cal = resolve(conn, args.name, args.project)
        try:
            conn.execute("DELETE FROM dispatch.calendars WHERE id = %s", (cal["id"],))
        except psycopg.errors.ForeignKeyViolation:
            raise UsageError(f"calendar {cal['name']} is in use: point its schedules elsewhere first"
                             f" (pgdispatch calendars show {cal['name']} lists them)") from None
        except psycopg.Error as exc:
            raise database_error(exc) from None
    if args.json:
        print_json({"deleted": cal})
    else:
        print(f"deleted calendar {cal['name']} and its exclusions")
    return 0


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `calendars` with the top-level parser."""
    calendars = commands.add_parser(
        "calendars", help="exclusion calendars: periods in which their schedules' slots do not run",
        description="Exclusion calendars (dispatch.calendars): a schedule's slots inside one of its "
                    "calendar's periods do not run and are recorded as a gap (reason calendar). A calendar "
                    "belongs to a project or is shared (no --project). Writes need dispatch_admin.")
    actions = calendars.add_subparsers(dest="action", required=True, metavar="ACTION")

    def named(action: str, text: str) -> argparse.ArgumentParser:
        parser = actions.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        parser.add_argument("name", help="calendar name")
        parser.add_argument("--project", help="the project's own calendar (default: the shared one)")
        return parser

    listing = actions.add_parser("list", help="the calendars, with how many exclusions and schedules",
                                 description="Every calendar (with --project: that project's and the shared "
                                             "ones).")
    listing.add_argument("--project", help="only this project's and the shared ones")
    add_connection_arguments(listing)
    listing.set_defaults(handler=_list)

    add = named("add", "add a calendar")
    add.add_argument("--timezone", default="UTC", help="zone of its wall-clock times (default UTC)")
    add.add_argument("--description", help="what it is for")
    add_connection_arguments(add)
    add.set_defaults(handler=_add)

    exclude = named("exclude", "add a period to a calendar: dates, a wall-clock range, or a weekly rule")
    shape = exclude.add_argument_group("the period (one of --date, --from/--to, --weekly)")
    shape.add_argument("--date", type=_date, help="a whole day, e.g. 2027-12-25")
    shape.add_argument("--until", type=_date, metavar="DATE", help="with --date: through this day too")
    shape.add_argument("--from", dest="start", type=_wall, metavar="TIMESTAMP",
                       help="a wall-clock range's start, e.g. 2027-12-24T18:00")
    shape.add_argument("--to", dest="end", type=_wall, metavar="TIMESTAMP",
                       help="a wall-clock range's end (not excluded itself)")
    shape.add_argument("--weekly", type=_days, metavar="DAYS",
                       help="every week on these days, e.g. sat,sun or mon-fri")
    shape.add_argument("--between", type=_between, metavar="HH:MM-HH:MM",
                       help="with --weekly: only these hours, e.g. 22:00-24:00 (default the whole day)")
    exclude.add_argument("--label", help="what the period is, e.g. 'Christmas'")
    add_connection_arguments(exclude)
    exclude.set_defaults(handler=_exclude)

    show = named("show", "a calendar's exclusions, its periods to come and the schedules using it")
    show.add_argument("--days", type=int, default=30, help="periods this many days ahead (default 30)")
    add_connection_arguments(show)
    show.set_defaults(handler=_show)

    unexclude = actions.add_parser("unexclude", help="remove one exclusion (by the id `show` lists)",
                                   description="Remove one exclusion; slots not passed over yet run again.")
    unexclude.add_argument("id", type=int, help="exclusion id")
    add_connection_arguments(unexclude)
    unexclude.set_defaults(handler=_unexclude)

    delete = named("delete", "delete a calendar no schedule uses, with its exclusions")
    add_connection_arguments(delete)
    delete.set_defaults(handler=_delete)
