"""The `pgdispatch` command: install, doctor, schedules, runs, projects,
calendars, listen, demo, demo-function.

Each command lives in a module of its own and registers its parser here; every command that
talks to the database reads --database-url / PGDISPATCH_DATABASE_URL as `listen` does.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import NoReturn

import psycopg

from dispatcher import __version__
from dispatcher.cli import admin, breakers, calendars, demo_function, doctor, projects
from dispatcher.cli.console import CommandError, UsageError, add_connection_arguments, print_json
from dispatcher.config import OPTIONS, ConfigError, load_settings, resolve_database_url
from dispatcher.database import SCHEMA_VERSION
from dispatcher.migrations import install, migrations

__all__ = ["main"]

logger = logging.getLogger("dispatcher")


class _Parser(argparse.ArgumentParser):
    """A usage error in one line, with where to read more (argparse prints the whole usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _version_line() -> str:
    """What `pgdispatch --version` prints: the package and the schema version its install brings
    (and doctor expects), with the oldest a listener accepts when that is an older one."""
    schema = max(migration.version for migration in migrations())
    line = f"pgdispatch {__version__} (schema version {schema}"
    if schema > SCHEMA_VERSION:
        line += f"; listen accepts {SCHEMA_VERSION} or later"
    return line + ")"


def _parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = _Parser(
        prog="pgdispatch",
        description="Cron schedules that live in PostgreSQL: `listen` calls each due run's function over "
                    "HTTP; the other commands install the schema, check a deployment and manage schedules "
                    "and runs. Every command that talks to the database takes --database-url or reads "
                    "PGDISPATCH_DATABASE_URL.",
        epilog="Run `pgdispatch COMMAND --help` for a command's options. Exit status: 0 done, 1 failed, "
               "2 a usage error or input the database refuses. Documentation: docs/ in the source tree.")
    parser.add_argument("--version", action="version", version=_version_line(),
                        help="print the package version and the schema version it installs, and exit")
    commands = parser.add_subparsers(dest="command", required=True)

    install_cmd = commands.add_parser(
        "install", help="apply sql/ to a database (the same migrations as psql -f sql/install.sql)",
        description="Apply the migrations in sql/ that the database does not have yet (the same files "
        "and bookkeeping as psql -f sql/install.sql), register the pg_cron jobs where pg_cron lives "
        "in this database (else say what to run), and print what was done. Safe to run again.",
    )
    add_connection_arguments(install_cmd)
    install_cmd.set_defaults(handler=_install)
    doctor.add_commands(commands)
    admin.add_commands(commands)
    breakers.add_commands(commands)
    projects.add_commands(commands)
    calendars.add_commands(commands)

    listen_cmd = commands.add_parser(
        "listen",
        help="dispatch due runs over HTTP until SIGTERM/SIGINT",
        description="Claim due runs and POST each to its function. Every option also reads the "
        "environment variable named after it; the flag wins. Exit status: 0 after a clean "
        "shutdown; 2 for a configuration error, including one only the database reveals at start "
        "(authentication, no such database or role, the dispatch schema missing or too old); 1 when "
        "the listener cannot go on (a task of its own failed). A database that is down or "
        "unreachable is waited for.",
    )
    for option in OPTIONS:
        listen_cmd.add_argument(option.flag, dest=option.name, metavar=option.metavar,
                                action="append" if option.name == "signing_secret" else "store",
                                help=f"{option.help} [env {option.env}]")
    listen_cmd.set_defaults(handler=_listen)

    demo_cmd = commands.add_parser(
        "demo",
        help="start a private PostgreSQL, a demo function and a listener, and show dispatches",
        description="Start a private PostgreSQL with pg_cron in DIR, install the schema, register "
        "the pg_cron jobs, serve a demo function on loopback that prints each call, add a few "
        "schedules (one every 10 s: the first call comes within seconds) and run the listener in the "
        "foreground. Ctrl-C stops all of it. The next start keeps the database, its port and the "
        "schedules added to it; a second demo in the same DIR is refused.",
    )
    demo_cmd.add_argument("--dir", type=Path, default=Path(".pgdata/demo"),
                          help="folder of the private cluster (default .pgdata/demo)")
    demo_cmd.set_defaults(handler=_demo)
    demo_function.add_commands(commands)
    return parser


def _install(args: argparse.Namespace) -> int:
    database_url = resolve_database_url(args.database_url)
    try:
        done = install(database_url)
    except psycopg.OperationalError as exc:
        raise CommandError(f"cannot connect to the database: {' '.join(str(exc).split())}") from None
    if args.json:
        print_json({"done": done})
    else:
        for line in done:
            print(line)
    return 0


def _listen(args: argparse.Namespace) -> int:
    from dispatcher.database import DatabaseMisconfigured
    from dispatcher.event_loop import loop_factory
    from dispatcher.listener import run_listener
    from dispatcher.logs import configure_logging
    from dispatcher.supervisor import TaskFailed

    try:
        settings = load_settings({option.name: getattr(args, option.name) for option in OPTIONS})
    except ConfigError as exc:
        print(f"pgdispatch listen: {exc}", file=sys.stderr)
        return 2
    try:
        factory = loop_factory(settings.event_loop)
    except ConfigError as exc:
        print(f"pgdispatch listen: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, log_format=settings.log_format)
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(run_listener(settings))
    except (DatabaseMisconfigured, ConfigError) as exc:  # at start: said once, never retried
        logger.error("cannot start: %s", exc, extra={"event": "configuration_error", "reason": str(exc)})
        return 2
    except TaskFailed as exc:  # logged with its traceback when it happened; systemd restarts us
        logger.error("stopped because %s", exc, extra={"event": "listener_failed", "task": exc.task})
        return 1
    except Exception:
        logger.exception("listener failed", extra={"event": "listener_crashed"})
        return 1
    return 0


def _demo(args: argparse.Namespace) -> int:
    from dispatcher.cli.demo import DemoError, run_demo

    try:
        return run_demo(args.dir)
    except DemoError as exc:
        print(f"pgdispatch demo: {exc}", file=sys.stderr)
        return 1


_interrupted = False


def _interrupt(signum: int, frame: object) -> None:
    """SIGINT: KeyboardInterrupt, and remembered (libpq may report the interrupted wait first)."""
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status: 0 done, 1 failed, 2 configuration or usage error."""
    if threading.current_thread() is threading.main_thread():
        # Ctrl-C is KeyboardInterrupt (exit 130) even when the parent left SIGINT ignored, as a
        # non-interactive shell does for a command started with `&`: Python keeps it ignored.
        signal.signal(signal.SIGINT, _interrupt)
    args = _parser().parse_args(argv)
    name = " ".join(part for part in (args.command, getattr(args, "action", None)) if part)
    try:
        status: int = args.handler(args)
    except (ConfigError, UsageError) as exc:
        print(f"pgdispatch {name}: {exc}", file=sys.stderr)
        return 2
    except CommandError as exc:
        print(f"pgdispatch {name}: {exc}", file=sys.stderr)
        return 1
    except psycopg.Error as exc:
        if _interrupted:  # a wait inside libpq that Ctrl-C cut short fails as a connection error
            print(file=sys.stderr)
            return 130
        print(f"pgdispatch {name}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # | head: the reader is gone, and so is anything more to say
        # Python flushes stdout again at exit and would complain about the same pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:  # Ctrl-C: the user knows
        print(file=sys.stderr)
        return 130
    return status


if __name__ == "__main__":
    sys.exit(main())
