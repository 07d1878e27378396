"""The `pgdispatch` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

import psycopg

from dispatcher import __version__
from dispatcher.config import OPTIONS, ConfigError, load_settings
from dispatcher.migrations import install

__all__ = ["main"]

logger = logging.getLogger("dispatcher")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pgdispatch", description=__doc__)
    parser.add_argument("--version", action="version", version=f"pgdispatch {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    install_cmd = commands.add_parser(
        "install", help="apply sql/ to a database (the same migrations as psql -f sql/install.sql)"
    )
    install_cmd.add_argument(
        "--database-url",
        default=os.environ.get("PGDISPATCH_DATABASE_URL"),
        help="libpq connection string (env PGDISPATCH_DATABASE_URL)",
    )

    listen_cmd = commands.add_parser(
        "listen",
        help="dispatch due runs over HTTP until SIGTERM/SIGINT",
        description="Claim due runs and POST each to its function. Every option also reads the "
        "environment variable named after it; the flag wins. Exit status: 0 after a clean "
        "shutdown, 2 for a configuration error.",
    )
    for option in OPTIONS:
        listen_cmd.add_argument(option.flag, dest=option.name, metavar=option.metavar,
                                help=f"{option.help} [env {option.env}]")

    demo_cmd = commands.add_parser(
        "demo",
        help="start a private PostgreSQL, a demo function and a listener, and show dispatches",
        description="Start a private PostgreSQL with pg_cron in DIR, install the schema, register "
        "the pg_cron job, serve a demo function on loopback that prints each call, add a few "
        "schedules and run the listener in the foreground. Ctrl-C stops all of it.",
    )
    demo_cmd.add_argument("--dir", type=Path, default=Path(".pgdata/demo"),
                          help="folder of the private cluster (default .pgdata/demo)")
    return parser


def _install(database_url: str | None) -> int:
    if not database_url:
        print("pgdispatch: --database-url (or PGDISPATCH_DATABASE_URL) is required", file=sys.stderr)
        return 2
    try:
        for line in install(database_url):
            print(line)
    except psycopg.Error as exc:
        print(f"pgdispatch install: {exc}", file=sys.stderr)
        return 1
    return 0


def _listen(args: argparse.Namespace) -> int:
    from dispatcher.listener import run_listener
    from dispatcher.logs import configure_logging

    try:
        settings = load_settings({option.name: getattr(args, option.name) for option in OPTIONS})
    except ConfigError as exc:
        print(f"pgdispatch listen: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    try:
        asyncio.run(run_listener(settings))
    except Exception:
        logger.exception("listener failed", extra={"event": "listener_crashed"})
        return 1
    return 0


def _demo(args: argparse.Namespace) -> int:
    from dispatcher.demo import DemoError, run_demo

    try:
        return run_demo(args.dir)
    except DemoError as exc:
        print(f"pgdispatch demo: {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "install":
        return _install(args.database_url)
    if args.command == "listen":
        return _listen(args)
    if args.command == "demo":
        return _demo(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
