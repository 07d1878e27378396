"""bench.soak --quick: a one-minute smoke test of the soak harness (its own cluster in
.pgdata/soak-quick, two listeners, one killed -9, the chaos sink): it samples, kills, checks
every retained slot, and writes its rows. It judges none of the hour's figures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import PGDATA_SUFFIX, ROOT


@pytest.mark.pg_cron
def test_the_quick_soak_samples_and_checks() -> None:
    folder = ROOT / ".pgdata" / f"soak-quick{PGDATA_SUFFIX}"
    done = subprocess.run([sys.executable, "-m", "bench.soak", "--quick", "--dir", str(folder)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    checks = [line for line in done.stdout.splitlines() if line.startswith("checks:")]
    assert checks and checks[0].endswith("OK"), done.stdout
    result = json.loads((folder / "soak.json").read_text())
    assert result["failures"] == []
    rows = result["rows"]
    assert len(rows) >= 4
    assert sum(row["runs"] for row in rows) > 0, rows
    assert all(row["lost_unexplained"] == 0 for row in rows)
    assert any("kill -9" in what for _, what in result["events"]), result["events"]
    assert all({"runs", "audit_log", "schedules"} <= row["sizes_mb"].keys() for row in rows)
