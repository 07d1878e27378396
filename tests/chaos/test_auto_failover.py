"""The failover drills under a real HA manager: a pg_auto_failover formation built here
(chaos/formation.py: a monitor, a primary and a standby, pg_cron on both), two real listeners
given both hosts with target_session_attrs=read-write, 3,100 slots to the chaos suite's counting
sink, the primary's host (its keeper and its PostgreSQL) killed -9 mid-round, the standby
promoted by the monitor on its own, the old primary brought back as a standby. Once with
synchronous replication, once with asynchronous.

Run only when selected (tests/conftest.py): ``scripts/test -m failover``, about 4 minutes.
Installs pg_auto_failover with apt first when it is missing (scripts/bootstrap --failover). The
formation lives in .pgdata/failover/<profile> (PGDISPATCH_FAILOVER_DIR moves it)."""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import pytest

from chaos.run import PROFILES, Result, print_result, run_chaos

ROOT = Path(__file__).resolve().parents[2]
# With the monitor's health checks tuned (chaos.formation.MONITOR_TUNED) the new primary takes
# writes about 16 s after the kill (5 s to give up on the primary, 10 s of demote timeout); the
# listeners' first outcome follows within a second or two.
KILL_TO_FIRST_OUTCOME_GOAL_S = 30.0


@pytest.fixture(scope="module")
def pg_auto_failover() -> None:
    """pg_autoctl and the monitor's extension, installed with apt when missing (only the drills
    need them, so the default bootstrap leaves them out)."""
    subprocess.run([str(ROOT / "scripts" / "bootstrap"), "--failover"], check=True)


def _drill(profile: str) -> tuple[Result, str]:
    folder = Path(os.environ.get("PGDISPATCH_FAILOVER_DIR", ROOT / ".pgdata" / "failover")) / profile
    seed = int(os.environ.get("PGDISPATCH_CHAOS_SEED", "7"))
    result = run_chaos(PROFILES[profile], folder=folder, seed=seed)
    report = io.StringIO()
    print_result(result, report)
    print(f"profile {profile}\n{report.getvalue()}")
    return result, report.getvalue()


def _common(result: Result, report: str) -> None:
    figures = result.figures
    assert figures["failovers"] == "1", report
    assert figures["slots marked"] == figures["slots expected"], report
    assert figures["slots lost (unfinished, or finished with no invocation)"] == "0", report
    assert figures["slots invoked under more than one request id"] == "0", report
    assert figures["run audit rows"] == figures["finished runs"], report
    first = float(figures["seconds from the kill to the first outcome on the new primary, per failover"])
    assert first < KILL_TO_FIRST_OUTCOME_GOAL_S, report
    assert figures["seconds from the kill to the old primary streaming as a standby, per failover"], report
    minutes, exactly_once = figures[
        "pg_cron: minutes judged on the new primary / with exactly one successful dispatch-tick"].split(" / ")
    assert minutes == exactly_once, report
    assert figures["pg_cron: dispatch-tick started on the new primary (its log) / on the standby since it "
                   "rejoined"].endswith(" / 0"), report
    assert result.ok, report


@pytest.mark.failover
@pytest.mark.pg_cron  # pg_cron on both nodes; Debian's packages of pg_auto_failover
def test_synchronous_standby_promoted_by_the_monitor_loses_nothing(pg_auto_failover: None) -> None:
    result, report = _drill("autofailover")
    _common(result, report)
    # Synchronous replication: every claim and outcome committed before the kill is on the new
    # primary, and the listeners' kept outcomes land there within their lease: no call repeats.
    assert result.figures["same attempt invoked twice"] == "0", report


@pytest.mark.failover
@pytest.mark.pg_cron  # pg_cron on both nodes; Debian's packages of pg_auto_failover
def test_asynchronous_standby_reruns_only_under_the_same_request_id(pg_auto_failover: None) -> None:
    result, report = _drill("autofailover-async")
    # What was committed on the old primary and not sent is gone: those runs are invoked again,
    # under their one request id (at least once); counted in the figures, never a second id.
    _common(result, report)
