"""`pgdispatch schedules pause|resume|run|backfill`: the operator functions of DESIGN.md
(dispatch.pause, dispatch.resume, dispatch.run_now, dispatch.backfill) from a terminal.

Each calls the SQL function, so what it refuses, audits and notifies is exactly what a psql user
would see; a refusal for bad input (unknown id, reversed range) exits 2, one for the schedule's
state (paused, busy) exits 1.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import psycopg

from dispatcher.cli.console import CommandError, add_connection_arguments, connect, format_value, print_json
from dispatcher.cli.schedule_rows import database_error, load, parse_schedule_id

__all__ = ["add_commands"]


def _pause_or_resume(args: argparse.Namespace) -> int:
    schedule_id = parse_schedule_id(args.id)
    with connect(args) as conn:
        load(conn, schedule_id)
        try:
            if args.action == "pause":
                conn.execute("SELECT dispatch.pause(%s, %s)", (schedule_id, args.reason))
            else:
                conn.execute("SELECT dispatch.resume(%s)", (schedule_id,))
        except psycopg.Error as exc:
            raise database_error(exc) from None
        schedule = load(conn, schedule_id)
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
    schedule_id = parse_schedule_id(args.id)
    with connect(args) as conn:
        load(conn, schedule_id)
        try:
            row = conn.execute("SELECT dispatch.run_now(%s, %s) AS id",
                               (schedule_id, args.traceparent)).fetchone()
            assert row is not None
            run_id = row["id"]
        except psycopg.Error as exc:
            raise database_error(exc) from None
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
        attempts = f"{run['attempt']} attempt" + ("" if run["attempt"] == 1 else "s")
        print(f"run {run_id}: {run['status']} after {attempts}{http}{error}")
    return 0 if run["status"] == "ok" else 1


def _backfill(args: argparse.Namespace) -> int:
    schedule_id = parse_schedule_id(args.id)
    with connect(args) as conn:
        load(conn, schedule_id)
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        try:
            row = conn.execute("SELECT dispatch.backfill(%s, %s::timestamptz, %s::timestamptz) AS marked,"
                               " %s::timestamptz AS from_ts, %s::timestamptz AS to_ts",
                               (schedule_id, args.from_ts, args.to_ts, args.from_ts, args.to_ts)).fetchone()
        except psycopg.Error as exc:
            raise database_error(exc) from None
    assert row is not None
    if args.json:
        print_json({"schedule_id": schedule_id, **row, "notices": notices})
    else:
        slots = f"{row['marked']} slot" + ("" if row["marked"] == 1 else "s")
        print(f"schedule {schedule_id}: {slots} from {format_value(row['from_ts'])}"
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


def add_commands(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register pause, resume, run and backfill under `schedules`."""
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
    run.add_argument("--traceparent", metavar="HEADER",
                     help="a W3C traceparent the run continues (its trace id; its spans are children of it)")
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
