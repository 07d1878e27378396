"""`pgdispatch schedules explain ID`: why a schedule does or did not fire (dispatch.explain).

It prints what the SQL function returns, section by section, so a psql user and a terminal user
read the same verdict: the state, the open runs, the next three slots with their jitter, the
last runs, and the slots since --since that did not run, with the reason.
"""

from __future__ import annotations

import argparse
from typing import Any

import psycopg
from psycopg.types.datetime import TimestamptzLoader

from dispatcher.cli.console import UsageError, add_connection_arguments, connect, print_json, print_table
from dispatcher.cli.schedule_rows import database_error, load, parse_schedule_id

__all__ = ["add_commands"]

# dispatch.explain's sections, as the keys of --json and the headings of the text
_SECTIONS = [("state", "state"), ("open run", "open runs"), ("next", "next slots"), ("run", "last runs"),
             ("not run", "did not run")]
_COLUMNS = [("item", "what"), ("at", "at (UTC)"), ("run_id", "run"), ("detail", "detail")]
# Details are sentences: the table does not cut them short.
_DETAIL_WIDTH = 1000
# What a datetime can hold (psql shows the rest): a --since outside it is refused rather than
# failing once dispatch.explain's answer, which repeats it, is read.
_SHOWN = "'0001-01-01 00:00Z' <= t AND t < '10000-01-01 00:00Z'"


class _InfinityLoader(TimestamptzLoader):
    """timestamptz as datetime, except the infinities, kept as the words psql prints: dispatch.explain
    repeats a --since of infinity or -infinity, which no datetime holds."""

    def load(self, data: psycopg.abc.Buffer) -> Any:
        if bytes(data) in (b"infinity", b"-infinity"):
            return bytes(data).decode()
        return super().load(data)


def _since(conn: psycopg.Connection[dict[str, Any]], since: str | None) -> None:
    """Refuse a --since that is no timestamp, or one this command cannot show (see _SHOWN)."""
    if since is None:
        return
    try:
        row = conn.execute(f"SELECT t::text, NOT isfinite(t) OR ({_SHOWN}) AS shown"
                           " FROM (SELECT %s::timestamptz AS t) AS given", (since,)).fetchone()
    except psycopg.Error as exc:
        error = database_error(exc)
        raise (UsageError(f"--since: {error}") if isinstance(error, UsageError) else error) from None
    assert row is not None
    if not row["shown"]:
        raise UsageError(f"--since: {row['t']} is outside the years 1 to 9999 that this command shows"
                         " (psql shows it: SELECT * FROM dispatch.explain(id, since))")


def _explain(args: argparse.Namespace) -> int:
    schedule_id = parse_schedule_id(args.id)
    with connect(args) as conn:
        schedule = load(conn, schedule_id)
        _since(conn, args.since)
        conn.adapters.register_loader("timestamptz", _InfinityLoader)
        try:
            rows = conn.execute(
                "SELECT section, item, at, run_id, detail FROM dispatch.explain(%s, coalesce(%s::timestamptz,"
                " now() - interval '1 day'))", (schedule_id, args.since)).fetchall()
        except psycopg.Error as exc:
            raise database_error(exc) from None
    by_section: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in _SECTIONS}
    for row in rows:
        by_section[row.pop("section")].append(row)
    if args.json:
        [state] = by_section["state"]
        print_json({"schedule_id": schedule_id, "project_id": schedule["project_id"],
                    "function_name": schedule["function_name"], "state": state,
                    "open_runs": by_section["open run"], "next": by_section["next"],
                    "runs": by_section["run"], "not_run": by_section["not run"]})
        return 0
    [state] = by_section["state"]
    print(f"schedule {schedule_id} {schedule['project_id']}/{schedule['function_name']}: {state['item']}")
    print(f"  {state['detail']}")
    for name, heading in _SECTIONS[1:]:
        if name == "open run" and not by_section[name]:
            continue
        print(f"\n{heading}:")
        print_table(by_section[name], _COLUMNS, empty="(none)", max_width=_DETAIL_WIDTH)
    return 0


def add_commands(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register explain under `schedules`."""
    explain = actions.add_parser(
        "explain", help="why a schedule does or did not fire (dispatch.explain)",
        description="Why a schedule does or did not fire, as dispatch.explain says it: its state (live, "
                    "due, busy with a run, waiting for its jitter, a retry or its project's max_concurrency, "
                    "paused by whom and why, disabled, deleted, backed off), its open runs and what the next "
                    "claim does with them, the next three slots with their jitter, the last five runs, and "
                    "each slot since --since that did not run, with the reason. Read-only: a dispatch_reader "
                    "role may run it.")
    explain.add_argument("id", help="schedule id")
    explain.add_argument("--since", metavar="TIMESTAMP",
                         help="list the slots that did not run from this instant on (default: a day ago)")
    add_connection_arguments(explain)
    explain.set_defaults(handler=_explain)
