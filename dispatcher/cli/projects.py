"""`pgdispatch projects list|set|reset`: the per-project dispatch settings (dispatch.projects).

A plain INSERT … ON CONFLICT / DELETE on dispatch.projects, what a dispatch_admin does in psql;
`list` shows every project that has schedules or a row, with its running and pending runs.
"""

from __future__ import annotations

import argparse
from typing import Any

import psycopg

from dispatcher.cli.console import UsageError, add_connection_arguments, connect, print_json, print_table
from dispatcher.cli.schedule_rows import database_error

__all__ = ["add_commands"]

_LIST = """
WITH known AS (
    SELECT project_id FROM dispatch.projects
    UNION
    SELECT DISTINCT project_id FROM dispatch.schedules WHERE deleted_at IS NULL
)
SELECT k.project_id, p.max_concurrency, coalesce(p.weight, 1) AS weight, p.events_url,
       (SELECT count(*) FROM dispatch.runs r WHERE r.project_id = k.project_id AND r.status = 'running')
           AS running,
       (SELECT count(*) FROM dispatch.runs r WHERE r.project_id = k.project_id AND r.status = 'pending')
           AS pending,
       (SELECT count(*) FROM dispatch.schedules s WHERE s.project_id = k.project_id AND s.deleted_at IS NULL)
           AS schedules
FROM known k
LEFT JOIN dispatch.projects p ON p.project_id = k.project_id
WHERE %(project)s::text IS NULL OR k.project_id = %(project)s::text
ORDER BY k.project_id
"""

_COLUMNS = [("project_id", "project"), ("max_concurrency", "max concurrency"), ("weight", "weight"),
            ("running", "running"), ("pending", "pending"), ("schedules", "schedules")]


def _list(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        rows = conn.execute(_LIST, {"project": args.project}).fetchall()
    if args.json:
        print_json(rows)
    else:
        print_table(rows, _COLUMNS, empty="no projects")
    return 0


def _limit(text: str) -> int | None:
    if text == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number or none, not {text!r}") from None


def _set(args: argparse.Namespace) -> int:
    if args.max_concurrency is False and args.weight is None and args.events_url is None:
        raise UsageError("nothing to set: give --max-concurrency, --weight or --events-url")
    values: dict[str, Any] = {"project": args.project}
    columns = []
    if args.max_concurrency is not False:
        columns.append("max_concurrency")
        values["max_concurrency"] = args.max_concurrency
    if args.weight is not None:
        columns.append("weight")
        values["weight"] = args.weight
    if args.events_url is not None:
        columns.append("events_url")
        values["events_url"] = None if args.events_url == "none" else args.events_url
    names = ", ".join(columns)
    placeholders = ", ".join(f"%({c})s" for c in columns)
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns)
    with connect(args) as conn:
        try:
            conn.execute(f"INSERT INTO dispatch.projects (project_id, {names})"
                         f" VALUES (%(project)s, {placeholders})"
                         f" ON CONFLICT (project_id) DO UPDATE SET {updates}", values)
        except psycopg.Error as exc:
            raise database_error(exc) from None
        rows = conn.execute(_LIST, {"project": args.project}).fetchall()
    if args.json:
        print_json(rows[0])
    else:
        print_table(rows, _COLUMNS)
    return 0


def _reset(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        try:
            deleted = conn.execute("DELETE FROM dispatch.projects WHERE project_id = %s",
                                   (args.project,)).rowcount
        except psycopg.Error as exc:
            raise database_error(exc) from None
    if args.json:
        print_json({"project_id": args.project, "reset": deleted > 0})
    else:
        print(f"project {args.project}: {'back to the defaults' if deleted else 'had the defaults already'}"
              " (no cap, weight 1)")
    return 0


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `projects` with the top-level parser."""
    projects = commands.add_parser(
        "projects", help="list projects, set or reset their max concurrency, weight and events URL",
        description="Per-project dispatch settings (dispatch.projects): max_concurrency caps a project's "
                    "running runs across all listeners; weight is its share when several projects have "
                    "runs due; events_url receives its failure and breaker events. A project without "
                    "settings has no cap, weight 1 and no events URL. Writes need "
                    "dispatch_admin.")
    actions = projects.add_subparsers(dest="action", required=True, metavar="ACTION")

    listing = actions.add_parser("list", help="projects with their settings and running and pending runs",
                                 description="Every project with schedules or settings, its settings, and "
                                             "its running and pending runs.")
    listing.add_argument("--project", help="only this project")
    add_connection_arguments(listing)
    listing.set_defaults(handler=_list)

    setting = actions.add_parser("set", help="set a project's max concurrency and/or weight",
                                 description="Set what is given, keep the rest.")
    setting.add_argument("project", help="project id")
    setting.add_argument("--max-concurrency", type=_limit, default=False, metavar="N",
                         help="at most N of its runs running at once (none: no cap)")
    setting.add_argument("--weight", type=int, metavar="N",
                         help="its share when several projects have runs due")
    setting.add_argument("--events-url", metavar="URL",
                         help="where listeners POST its failure and breaker events, signed (none: nowhere)")
    add_connection_arguments(setting)
    setting.set_defaults(handler=_set)

    reset = actions.add_parser("reset", help="back to the defaults (no cap, weight 1)",
                               description="Delete the project's settings: no cap, weight 1.")
    reset.add_argument("project", help="project id")
    add_connection_arguments(reset)
    reset.set_defaults(handler=_reset)
