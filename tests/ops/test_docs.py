"""The docs' own check: every example marked runnable runs, every relative link leads somewhere,
and the README stays short.

A fenced block whose info string is `sql runnable` or `sh runnable` is run, in document order,
against a database of its own per file with sql/install.sql applied: SQL blocks by psql (as
postgres, stopping at the first error), shell blocks by bash -e with `pgdispatch` on PATH and
PGDISPATCH_DATABASE_URL pointing at that database."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.conftest import CLUSTER_DIR, PSQL, ROOT

DOCS = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md",
               *(ROOT / "docs").rglob("*.md")])
BLOCK = re.compile(r"^```(sql|sh) runnable\n(.*?)^```", re.MULTILINE | re.DOTALL)
FENCED = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def runnable(path: Path) -> list[tuple[str, str]]:
    return [(kind, code) for kind, code in BLOCK.findall(path.read_text())]


@pytest.fixture
def scratch(admin_url: str) -> Iterator[str]:
    """A database with the dispatch schema, dropped afterwards: its URL."""
    name = f"docs_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    # a plain URL: the system's psql may be older than the libpq psycopg brings (and its options)
    url = f"postgresql://postgres@127.0.0.1:{os.environ['PGDISPATCH_TEST_PORT']}/{name}"
    subprocess.run([PSQL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f",
                    str(ROOT / "sql" / "install.sql")], check=True, capture_output=True)
    yield url
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_there_are_runnable_examples() -> None:
    assert sum(len(runnable(path)) for path in DOCS if path.exists()) >= 10


@pytest.mark.parametrize("path", [p for p in DOCS if p.exists() and runnable(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_runnable_examples_run(path: Path, scratch: str, tmp_path: Path) -> None:
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PGDISPATCH_DATABASE_URL": scratch,
           "HOME": str(tmp_path)}
    for number, (kind, code) in enumerate(runnable(path), 1):
        if kind == "sql":  # statement by statement, as psql -f runs a file
            command = [PSQL, "-X", "-v", "ON_ERROR_STOP=1", "-d", scratch, "-f", "-"]
        else:
            command = ["bash", "-e", "-o", "pipefail", "-s"]
        done = subprocess.run(command, input=code, capture_output=True, text=True, env=env, cwd=ROOT,
                              timeout=120)
        assert done.returncode == 0, f"{path.name}, runnable block {number} ({kind}):\n{code}\n{done.stderr}"


@pytest.mark.parametrize("path", [p for p in DOCS if p.exists()], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_somewhere(path: Path) -> None:
    for target, _ in LINK.findall(path.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue  # http:, https:, mailto:
        assert (path.parent / target).exists(), f"{path.name} links to {target}, which does not exist"


def test_the_readme_says_how_to_run_its_cli_example(scratch: str, tmp_path: Path) -> None:
    """The README's command-line example, copied with the plain `sh` block right before it (if
    any) into a shell that has neither the venv on its PATH nor PGDISPATCH_DATABASE_URL, as a
    reader's terminal: it runs. The demo's cluster and database are this test's."""
    blocks = FENCED.findall((ROOT / "README.md").read_text())
    at = next(i for i, (_, code) in enumerate(blocks) if code.startswith("pgdispatch schedules add"))
    kind, setup = blocks[at - 1]
    setup = setup if kind == "sh" else ""
    setup = setup.replace(".pgdata/demo", str(CLUSTER_DIR))
    setup = setup.replace("pgdispatch_demo", scratch.rsplit("/", 1)[1])
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-s"], input=setup + blocks[at][1],
                          capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert "weekly-digest" in done.stdout


def test_the_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_bytes()) <= 10_000


def test_the_changelog_starts_with_this_version() -> None:
    """The newest entry of CHANGELOG.md is the version `pgdispatch --version` prints, and every
    example of that line in the docs is what the command prints."""
    printed = subprocess.run([str(Path(sys.executable).parent / "pgdispatch"), "--version"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    version = re.fullmatch(r"pgdispatch (\S+) \(schema version \d+.*\)", printed)
    assert version is not None, printed
    entries = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert entries and entries[0] == version[1], entries
    for path in DOCS:
        for example in re.findall(r"pgdispatch \d+\.\d+\S* \(schema version [^)]*\)", path.read_text()):
            assert example == printed, f"{path.name} shows {example!r}, pgdispatch --version {printed!r}"
