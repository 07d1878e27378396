"""docs/alerts.yaml: valid Prometheus rules (promtool check rules), each fired and kept quiet by
tests/ops/alerts_test.yaml (promtool test rules), over metric names the listener really exports."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from dispatcher.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
PROMTOOL = ROOT / ".venv" / "bin" / "promtool"  # scripts/bootstrap puts it there
RULES = ROOT / "docs" / "alerts.yaml"


def test_the_rules_are_valid() -> None:
    done = subprocess.run([str(PROMTOOL), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 6 rules found" in done.stdout


def test_each_rule_fires_and_stays_quiet_as_tested() -> None:
    done = subprocess.run([str(PROMTOOL), "test", "rules", "alerts_test.yaml"], capture_output=True,
                          text=True, cwd=Path(__file__).parent)
    assert done.returncode == 0, done.stdout + done.stderr
    tested = yaml.safe_load((Path(__file__).parent / "alerts_test.yaml").read_text())
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    for rule in rules:
        cases = [case for test in tested["tests"] for case in test["alert_rule_test"]
                 if case["alertname"] == rule["alert"]]
        assert any(case["exp_alerts"] for case in cases), f"{rule['alert']} is never seen firing"
        assert any(not case["exp_alerts"] for case in cases), f"{rule['alert']} is never seen quiet"


def test_the_rules_use_metrics_the_listener_exports() -> None:
    lines = Metrics().exposition().decode().splitlines()
    exported = {line.split("{")[0].split(" ")[0] for line in lines if line and not line.startswith("#")}
    # and the labelled ones that have no series until something happens (pgdispatch_breaker_open)
    exported |= {line.split(" ")[2] for line in lines if line.startswith("# TYPE ")}
    used = set(re.findall(r"\bpgdispatch_\w+", RULES.read_text())) - {"pgdispatch_"}
    assert used and used <= exported, used - exported
