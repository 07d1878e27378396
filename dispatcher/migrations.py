"""Apply sql/ to a database: the same files, bookkeeping and order as sql/install.sql."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import psycopg

__all__ = ["SQL_DIR", "Migration", "install", "migrations"]

SQL_DIR = Path(__file__).resolve().parent / "sql"
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


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


def install(conninfo: str) -> list[str]:
    """Apply the pending migrations and register the pg_cron job; return what was done."""
    done: list[str] = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute((SQL_DIR / "bootstrap.sql").read_text())
        for migration in migrations():
            with conn.transaction():
                applied = conn.execute(
                    "SELECT 1 FROM dispatch.migrations WHERE version = %s", (migration.version,)
                ).fetchone()
                if applied:
                    continue
                conn.execute(
                    "INSERT INTO dispatch.migrations (version, name) VALUES (%s, %s)",
                    (migration.version, migration.name),
                )
                conn.execute(migration.path.read_text())
            done.append(f"applied migration {migration.name}")
        row = conn.execute("SELECT dispatch.register_cron_job()").fetchone()
        assert row is not None
        done.append(row[0])
    return done
