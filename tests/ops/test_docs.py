"""The docs' own check: every example marked runnable runs, every relative link leads somewhere
(a section's to one of its page's headings), the README stays short, the pages carry no
history, and docs/quickstart.md, followed step by step with a real listener and function, gets
its first call and a clean `pgdispatch doctor`.

A fenced block whose info string is `sql runnable` or `sh runnable` is run, in document order,
against a database of its own per file with sql/install.sql applied: SQL blocks by psql (as
postgres, stopping at the first error), shell blocks by bash -e with `pgdispatch` on PATH and
PGDISPATCH_DATABASE_URL pointing at that database."""

from __future__ import annotations

import fcntl
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.conftest import CLUSTER_DIR, HAS_PG_CRON, PSQL, ROOT

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


def _anchors(path: Path) -> set[str]:
    """The anchors of a page's headings, as GitHub makes them (a repeated one gets -1, -2, …)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", FENCED_BLOCK.sub("", path.read_text()), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return found


@pytest.mark.parametrize("path", [p for p in DOCS if p.exists()], ids=lambda p: str(p.relative_to(ROOT)))
def test_anchors_lead_to_a_heading(path: Path) -> None:
    """A link to page.md#section (or #section on the same page) names a heading of that page."""
    for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", path.read_text()):
        if re.match(r"^[a-z]+:", target) or not (target or path.name).endswith(".md"):
            continue
        page = path.parent / target if target else path
        assert anchor in _anchors(page), f"{path.name} links to {target}#{anchor}: no such heading"


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


# What a page for users does not carry (the history is in git): a commit hash anywhere, and in
# the prose an issue or pull request reference or a development round.
COMMIT = re.compile(r"(?<![\w-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")
HISTORY = re.compile(r"(?<![\w&/])#\d+\b|\b(?:issue|pull request|PR)s? #?\d+|\bround \d", re.IGNORECASE)
FENCED_BLOCK = re.compile(r"^```[^\n]*\n.*?^```", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")


@pytest.mark.parametrize("path", [p for p in DOCS if p.exists() and p.name != "CONTRIBUTING.md"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_carry_no_history(path: Path) -> None:
    """No commit hashes, issue numbers or "round N" in README.md, CHANGELOG.md or docs/."""
    text = path.read_text()
    prose = CODE_SPAN.sub("``", FENCED_BLOCK.sub("", text))
    found = [match[0] for match in COMMIT.finditer(text)] + [match[0] for match in HISTORY.finditer(prose)]
    assert found == [], f"{path.name}: {found}"


def test_the_readme_is_short() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= 10_000
    # Its figures are one paragraph of four lines at most; the manual has the rest.
    figures = [paragraph for paragraph in text.split("\n\n") if "runs/s" in paragraph]
    assert len(figures) == 1 and len(figures[0].strip().splitlines()) <= 4, figures
    assert "(docs/benchmarks.md)" in figures[0]


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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _started(command: str, env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(["bash", "-e", "-c", command], env=env, cwd=cwd, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for(what: str, predicate: object, within: float) -> None:
    deadline = time.monotonic() + within
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"no {what} within {within:g} s"
        time.sleep(0.1)


def test_the_quickstart_gets_its_first_call(scratch: str, tmp_path: Path) -> None:
    """docs/quickstart.md's commands, in order, as a reader runs them: the test database stands
    for `db.internal/app`, a free port for 8080, a role of its own for listener_1. The
    function prints the call, `schedules run --wait` sees it ok, and `pgdispatch doctor`
    passes with the listener named."""
    blocks = [(kind, code) for kind, code in FENCED.findall((ROOT / "docs" / "quickstart.md").read_text())
              if kind in ("sh", "sql")]
    port, dbname = re.fullmatch(r"postgresql://postgres@127\.0\.0\.1:(\d+)/(\w+)", scratch).groups()  # type: ignore[union-attr]
    role, function_port = f"qs_{uuid.uuid4().hex[:8]}", str(_free_port())
    where = f"127.0.0.1:{port}/{dbname}"

    def ours(code: str) -> str:
        return (code.replace("postgresql://postgres@db.internal/app", scratch)
                .replace("@db.internal/app", f"@{where}").replace("listener_1", role)
                .replace("8080", function_port))

    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PGDISPATCH_DATABASE_URL": scratch,
           "HOME": str(tmp_path), "PGHOST": "127.0.0.1", "PGPORT": port, "PGUSER": "postgres"}

    def run(code: str, cwd: Path = tmp_path) -> str:
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], capture_output=True, text=True,
                              env=env, cwd=cwd, timeout=120)
        assert done.returncode == 0, f"{code}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    started: list[subprocess.Popen[bytes]] = []
    schedule_id = ""
    function_log, listener_log = tmp_path / "function.log", tmp_path / "listener.log"
    # pg_cron's jobs are a role's across the cluster: registering them waits for the other
    # modules that do (tests/conftest.py).
    with (CLUSTER_DIR / "cluster-wide.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            for kind, code in blocks:
                code = ours(code)
                if "export PGDISPATCH_DATABASE_URL" in code:
                    continue  # the reader's set-up: the test's environment says the same
                if kind == "sql":
                    run(f"{PSQL} -X -v ON_ERROR_STOP=1 -d '{scratch}' <<'SQL'\n{code}SQL\n")
                elif code.startswith("pgdispatch install"):
                    printed = run(code)
                    register = re.search(r"register the jobs there with (psql .*)$", printed, re.MULTILINE)
                    if register:  # "run it", from the checkout
                        run(register[1], cwd=ROOT)
                elif "pgdispatch demo-function" in code:
                    setup, command = code.split("pgdispatch demo-function", 1)
                    run(setup)
                    started.append(_started("exec pgdispatch demo-function" + command, env, tmp_path,
                                            function_log))
                    _wait_for("function", lambda: "demo function on" in function_log.read_text(), 30)
                elif code.startswith("pgdispatch listen"):
                    started.append(_started("exec " + code, env, tmp_path, listener_log))
                    _wait_for("LISTEN", lambda: '"event": "listening"' in listener_log.read_text(), 30)
                elif code.startswith("pgdispatch schedules add"):
                    schedule_id = re.findall(r"^added schedule (\S+)$", run(code), re.MULTILINE)[0]
                elif code.startswith("pgdispatch schedules run"):
                    out = run(re.sub(r"\bID\b", schedule_id, code))
                    assert re.search(r"^run \d+: ok after 1 attempt, HTTP 200$", out, re.MULTILINE), out
                    assert "quickstart/hello run" in function_log.read_text()
                    assert "signature ok" in function_log.read_text()
                elif code.startswith("pgdispatch doctor"):
                    done = subprocess.run(["bash", "-c", code], capture_output=True, text=True, env=env,
                                          cwd=tmp_path, timeout=120)
                    assert done.returncode == 0, done.stdout + done.stderr
                    assert re.search(r"^ok +listeners +1 listening", done.stdout, re.MULTILINE), done.stdout
                else:
                    run(code)
            assert schedule_id and "pgdispatch doctor" in "".join(code for _, code in blocks)
        finally:
            for process in started:
                os.killpg(process.pid, signal.SIGTERM)
            for process in started:
                process.wait(timeout=30)
            with psycopg.connect(scratch.rsplit("/", 1)[0] + "/postgres", autocommit=True) as admin:
                if HAS_PG_CRON:  # the jobs the install registered (none on a major without pg_cron)
                    admin.execute("SELECT cron.unschedule(jobid) FROM cron.job WHERE database = %s",
                                  (dbname,))
                admin.execute(f'DROP ROLE IF EXISTS "{role}"')
