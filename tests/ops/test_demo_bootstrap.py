"""`scripts/demo` installs what the demo needs (the package and its runtime dependencies), not the
test suite's toolchain: run in a copy of the checkout, with a venv of its own."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

from tests.conftest import ROOT


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9_.-]+", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def test_the_demo_installs_the_package_and_its_runtime_dependencies_only(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, checkout / name)
    for name in ("dispatcher", "scripts"):
        shutil.copytree(ROOT / name, checkout / name, ignore=shutil.ignore_patterns("__pycache__"))

    # the default major: under scripts/test --pg NN, PGDISPATCH_PG_MAJOR would have this copy fetch
    # NN again, into a folder the postgres user cannot reach (pytest's tmp_path)
    env = {name: value for name, value in os.environ.items() if name != "PGDISPATCH_PG_MAJOR"}
    done = subprocess.run([str(checkout / "scripts" / "demo"), "--help"], capture_output=True, text=True,
                          timeout=600, check=False, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: pgdispatch demo")

    venv = checkout / ".venv"
    listed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
                            capture_output=True, text=True, check=True).stdout
    installed = {_name(package["name"]) for package in json.loads(listed)}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {_name(requirement) for requirement in project["dependencies"]}
    test_extras = {_name(requirement) for requirement in project["optional-dependencies"]["test"]}
    assert runtime <= installed | {"uvloop"}, runtime - installed  # uvloop: not on every platform
    assert "pgdispatch" in installed
    assert not test_extras & installed, test_extras & installed
    assert not (venv / "bin" / "promtool").exists()
    # and what the demo runs imports with that alone
    subprocess.run([str(venv / "bin" / "python"), "-c", "import dispatcher.cli.demo, dispatcher.cli.main"],
                   check=True)
