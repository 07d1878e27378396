"""Apply sql/ to a database: the same files, bookkeeping and order as sql/install.sql.

One transaction: the migrations (sql/migrations/NNNN_name.sql: tables, types, indexes, data)
that dispatch.migrations does not list yet, each recorded first, then every file of sql/code/
(functions, triggers, views, grants), re-applied in full by every install."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import psycopg

__all__ = ["SQL_DIR", "Migration", "code_files", "install", "migrations"]

SQL_DIR = Path(__file__).resolve().parent / "sql"
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
_CODE_NAME = re.compile(r"^\d{2}_[a-z0-9_]+\.sql$")
# Serialises installs: a second one waits, then finds the migrations applied.
_INSTALL_LOCK = "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('pgdispatch install'))"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path


def migrations() -> list[Migration]:
    """The migration files in version order."""
    found = []
    for path in sorted((SQL_DIR / "migrations").iterdir()):
        match = _NAME.match(path.name)
        if match:
            found.append(Migration(int(match.group(1)), path.stem, path))
    return found


def code_files() -> list[Path]:
    """The files of sql/code/ in the order they are applied."""
    return [path for path in sorted((SQL_DIR / "code").iterdir()) if _CODE_NAME.match(path.name)]


def _run_script(conn: psycopg.Connection[tuple[object, ...]], path: Path) -> None:
    text = path.read_text()
    # A migration that is only a comment (its code moved to sql/code/) is an empty query, which
    # psycopg refuses to send.
    if any(line.strip() and not line.lstrip().startswith("--") for line in text.splitlines()):
        conn.execute(text.encode())


def install(conninfo: str) -> list[str]:
    """Apply the pending migrations and the code, register the pg_cron jobs; say what was done."""
    done: list[str] = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        with conn.transaction():
            conn.execute(_INSTALL_LOCK)
            _run_script(conn, SQL_DIR / "bootstrap.sql")
            for migration in migrations():
                applied = conn.execute(
                    "SELECT 1 FROM dispatch.migrations WHERE version = %s", (migration.version,)
                ).fetchone()
                if applied:
                    continue
                conn.execute(
                    "INSERT INTO dispatch.migrations (version, name) VALUES (%s, %s)",
                    (migration.version, migration.name),
                )
                _run_script(conn, migration.path)
                done.append(f"applied migration {migration.name}")
            for path in code_files():
                _run_script(conn, path)
        row = conn.execute("SELECT dispatch.register_cron_job()").fetchone()
        assert row is not None
        done.append(row[0])
    return done
