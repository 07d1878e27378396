"""What the operator commands share: the database connection, human tables and `--json`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import IO, Any
from uuid import UUID

import psycopg
from psycopg import pq, waiting
from psycopg.abc import RV, PQGen
from psycopg.rows import dict_row

from dispatcher.config import resolve_database_url

__all__ = [
    "APPLICATION_NAME",
    "CommandError",
    "InterruptibleConnection",
    "UsageError",
    "add_connection_arguments",
    "connect",
    "format_value",
    "print_json",
    "print_table",
    "to_json",
]

# Not "pgdispatch …": dispatch.listeners finds listeners by that prefix.
APPLICATION_NAME = "cli (pgdispatch)"
CONNECT_TIMEOUT_S = 10
# Ctrl-C during a statement: its cancel request is given this long, the statement's end nothing.
CANCEL_TIMEOUT_S = 0.5


class CommandError(Exception):
    """A command could not do what it was asked; the message says why (exit status 1)."""


class UsageError(CommandError):
    """What the command was given cannot be done by anyone: an unknown id, a value the database
    refuses, a reversed range (exit status 2, like argparse's own usage errors)."""


class InterruptibleConnection(psycopg.Connection[Any]):
    """psycopg's connection, except for what Ctrl-C does during a statement.

    psycopg then sends a cancel request and waits for the statement to end, up to 5 s each: on a
    path that died, 10 s before the command exits. Here the cancel request gets CANCEL_TIMEOUT_S
    and the connection is closed at once: the user asked to stop, not to wait for the server."""

    def wait(self, gen: PQGen[RV], interval: float = 0.1, timeout: float | None = None) -> RV:
        try:
            return waiting.wait(gen, self.pgconn.socket, interval=interval, timeout=timeout)
        except (KeyboardInterrupt, SystemExit):
            if self.pgconn.transaction_status == pq.TransactionStatus.ACTIVE:
                try:
                    # Only libpq 17's cancel can be bounded; an older one's could hang on a dead path.
                    if psycopg.capabilities.has_cancel_safe():
                        self.cancel_safe(timeout=CANCEL_TIMEOUT_S)
                except psycopg.Error:
                    pass  # not cancelled: the statement runs to its end (or its timeout)
                finally:
                    self.pgconn.finish()  # its state is unknown: never used again
            raise


def add_connection_arguments(parser: argparse.ArgumentParser, *, json_output: bool = True) -> None:
    """--database-url (as `pgdispatch listen` reads it) and --json."""
    parser.add_argument(
        "--database-url", metavar="URL", default=None,
        help="libpq URL or key=value string [env PGDISPATCH_DATABASE_URL, else the systemd "
             "credential database-url in $CREDENTIALS_DIRECTORY]",
    )
    if json_output:
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


@contextmanager
def connect(args: argparse.Namespace) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    """An autocommit session, rows as dicts, timestamps in UTC. Raises ConfigError (bad or
    missing URL) or CommandError (the database cannot be reached)."""
    url = resolve_database_url(args.database_url)
    try:
        conn = InterruptibleConnection.connect(url, autocommit=True, row_factory=dict_row,
                                               application_name=APPLICATION_NAME,
                                               connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.OperationalError as exc:
        raise CommandError(f"cannot connect to the database: {' '.join(str(exc).split())}") from None
    with conn:
        conn.execute("SET TimeZone = 'UTC'")
        yield conn


def format_value(value: Any) -> str:
    """How a value shows in a table cell."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        if value.utcoffset() == timedelta(0):
            return value.strftime("%Y-%m-%d %H:%M:%SZ")
        return value.isoformat(sep=" ", timespec="seconds")
    if isinstance(value, timedelta):
        seconds = int(value.total_seconds())
        sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
        days, rest = divmod(seconds, 86400)
        text = f"{rest // 3600:d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
        return f"{sign}{days}d {text}" if days else f"{sign}{text}"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return " ".join(str(value).split())


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]], *,
                out: IO[str] | None = None, empty: str = "(none)", max_width: int = 60) -> None:
    """Rows as an aligned text table; `columns` are (key, heading) pairs."""
    stream = out or sys.stdout
    if not rows:
        print(empty, file=stream)
        return
    cells = []
    for row in rows:
        line = []
        for key, _ in columns:
            text = format_value(row.get(key))
            line.append(text if len(text) <= max_width else text[: max_width - 1] + "…")
        cells.append(line)
    widths = [max(len(heading), *(len(line[i]) for line in cells)) for i, (_, heading) in enumerate(columns)]
    print("  ".join(heading.upper().ljust(width) for (_, heading), width in zip(columns, widths, strict=True))
          .rstrip(), file=stream)
    for line in cells:
        print("  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip(),
              file=stream)


def to_json(value: Any) -> Any:
    """Database values as JSON: timestamps in ISO 8601, intervals in seconds, UUIDs as text."""
    if isinstance(value, Mapping):
        return {str(key): to_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(item) for item in value]
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, Decimal):
        return float(value)
    return value


def print_json(value: Any, *, out: IO[str] | None = None) -> None:
    print(json.dumps(to_json(value), indent=2, ensure_ascii=False), file=out or sys.stdout)
