"""The `pgdispatch` command."""

from __future__ import annotations

import argparse
import os
import sys

import psycopg

from dispatcher import __version__
from dispatcher.migrations import install

__all__ = ["main"]


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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "install":
        if not args.database_url:
            print("pgdispatch: --database-url (or PGDISPATCH_DATABASE_URL) is required", file=sys.stderr)
            return 2
        try:
            for line in install(args.database_url):
                print(line)
        except psycopg.Error as exc:
            print(f"pgdispatch install: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
