"""`pgdispatch breakers list|reset`: the circuit breakers of functions (dispatch.breaker_states,
dispatch.reset_breaker) from a terminal.

Each is the SQL a psql user would run: list reads dispatch.breaker_states() (a dispatch_reader
may), reset calls dispatch.reset_breaker() (a dispatch_admin), which audits it with the role.
"""

from __future__ import annotations

import argparse

import psycopg

from dispatcher.cli.console import add_connection_arguments, connect, print_json, print_table
from dispatcher.cli.schedule_rows import database_error

__all__ = ["add_commands"]

_COLUMNS = [("project_id", "project"), ("function_name", "function"), ("state", "state"),
            ("failures", "failures"), ("opened_at", "opened (UTC)"), ("probes", "probes"),
            ("next_probe_at", "next probe (UTC)"), ("waiting", "waiting"), ("last_error", "last error")]


def _list(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        rows = conn.execute(
            "SELECT * FROM dispatch.breaker_states()"
            " WHERE (%(project)s::text IS NULL OR project_id = %(project)s::text)"
            "   AND (%(open)s IS FALSE OR state = 'open')",
            {"project": args.project, "open": args.open}).fetchall()
    if args.json:
        print_json(rows)
    else:
        print_table(rows, _COLUMNS, empty="no breaker is open or counting failures")
    return 0


def _reset(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        try:
            row = conn.execute("SELECT dispatch.reset_breaker(%s, %s) AS was",
                               (args.project, args.function)).fetchone()
        except psycopg.Error as exc:
            raise database_error(exc) from None
    was = row["was"] if row else None
    if args.json:
        print_json({"project_id": args.project, "function_name": args.function, "was": was})
    elif was == "open":
        print(f"breaker of {args.project}/{args.function} closed: its waiting runs go now")
    else:
        print(f"breaker of {args.project}/{args.function} was closed: its count of failures is cleared")
    return 0


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    breakers = commands.add_parser(
        "breakers", help="the circuit breakers of functions: list, reset",
        description="The circuit breaker of each function (project, function name): open after "
                    "consecutive retryable failures, its runs wait while one probe at a time goes "
                    "(docs/policies.md).")
    actions = breakers.add_subparsers(dest="action", required=True, metavar="ACTION")

    listing = actions.add_parser("list", help="breakers that are open or counting failures",
                                 description="Breakers that are open or counting failures, with the runs "
                                             "waiting behind each (dispatch.breaker_states()).")
    listing.add_argument("--project", help="only this project")
    listing.add_argument("--open", action="store_true", help="only open breakers")
    add_connection_arguments(listing)
    listing.set_defaults(handler=_list)

    reset = actions.add_parser("reset", help="close a breaker: its waiting runs go now",
                               description="Close a function's breaker and clear its count of failures "
                                           "(dispatch.reset_breaker(), audited with your role): the runs "
                                           "waiting behind it go at once. Exit 2 if it has none.")
    reset.add_argument("--project", required=True, help="project id")
    reset.add_argument("--function", required=True, help="function name")
    add_connection_arguments(reset)
    reset.set_defaults(handler=_reset)
