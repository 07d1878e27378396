"""DBOS Transact's side of bench.peers, run by the Python of its own virtual environment
(.pgdata/peers-venv-dbos, `pip install dbos==<version>`), never imported by the bench itself.

    DATABASE_URL=... SINK_URL=http://127.0.0.1:PORT TENANTS=1000 python dbos_app.py

A DBOS application with DBOS's defaults (the system database at DATABASE_URL, created and
migrated by DBOS), one workflow, and TENANTS schedules created with DBOS.create_schedule: rows
in its system database's workflow_schedules table, read back by DBOS's scheduler, which runs a
thread for each and enqueues the workflow on DBOS's internal queue at each slot. Every schedule
is '* * * * *' and its workflow's one step POSTs to the sink. Prints "bench-peers: ready" once
the schedules are created; runs until SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.request
from datetime import datetime
from typing import Any

from dbos import DBOS, DBOSConfig

SINK = os.environ["SINK_URL"]


@DBOS.step()
def post(tenant: int, slot: str) -> int:
    """The tenant's function, called over HTTP (urllib: DBOS brings no HTTP client of its own)."""
    request = urllib.request.Request(  # noqa: S310 (the sink's http:// URL)
        f"{SINK}/dbos/{tenant}", method="POST",
        data=json.dumps({"args": {"tenant": tenant}, "scheduled_for": slot}).encode(),
        headers={"Content-Type": "application/json", "X-Request-Id": f"d{tenant}@{slot}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
        response.read()
        return int(response.status)


@DBOS.workflow()
def tenant_due(scheduled_at: datetime, context: Any) -> None:
    post(context["tenant"], scheduled_at.strftime("%Y-%m-%dT%H:%M:%S"))


def main() -> None:
    config: DBOSConfig = {"name": "bench-peers", "system_database_url": os.environ["DATABASE_URL"]}
    DBOS(config=config)
    DBOS.launch()
    existing = {s["schedule_name"] for s in DBOS.list_schedules()}
    for tenant in range(1, int(os.environ["TENANTS"]) + 1):
        if f"tenant-{tenant}" not in existing:
            DBOS.create_schedule(schedule_name=f"tenant-{tenant}", workflow_fn=tenant_due,
                                 schedule="* * * * *", context={"tenant": tenant})
    print("bench-peers: ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    DBOS.destroy()


if __name__ == "__main__":
    main()
