"""The chaos suite's quick profile (chaos/run.py): its own cluster in .pgdata/chaos-quick
(chaos-quick-NN on another major), real listeners killed and cut off, PostgreSQL restarted, a
misbehaving sink; every invariant must hold. Deselect with -m 'not chaos'."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from chaos.run import PROFILES, print_result, run_chaos
from tests.conftest import PGDATA_SUFFIX, ROOT


@pytest.mark.chaos
@pytest.mark.alone
def test_quick_profile_holds_every_invariant() -> None:
    seed = int(os.environ.get("PGDISPATCH_CHAOS_SEED", "0")) or None
    folder = Path(os.environ.get("PGDISPATCH_CHAOS_DIR", ROOT / ".pgdata" / f"chaos-quick{PGDATA_SUFFIX}"))
    result = run_chaos(PROFILES["quick"], folder=folder, seed=seed or 20240601)
    report = io.StringIO()
    print_result(result, report)
    print(report.getvalue())
    figures = result.figures
    assert figures["slots marked"] == figures["slots expected"], report.getvalue()
    assert figures["slots lost (unfinished, or finished with no invocation)"] == "0", report.getvalue()
    stuck = "schedules left stuck (next_run_at not one minute past the last slot, or a run open)"
    assert figures[stuck] == "0", report.getvalue()
    assert figures["run audit rows"] == figures["finished runs"], report.getvalue()
    # the flapping function's breakers opened and closed again; none is left open
    opened, closed = figures["breakers opened / closed"].split(" / ")
    assert int(opened) >= 1 and opened == closed, report.getvalue()
    assert figures["breakers left open"] == "0", report.getvalue()
    assert figures["slots invoked under more than one request id"] == "0", report.getvalue()
    assert int(figures["listener kills (kill -9)"]) >= 3
    assert figures["PostgreSQL restarts (fast / immediate)"] == "1 / 1"
    assert result.ok, report.getvalue()
