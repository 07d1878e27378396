"""The real `pgdispatch listen` process as operators run it: under a (fake) systemd service
manager listening on a unix datagram socket, and scraped by Prometheus over HTTP."""

from __future__ import annotations

import asyncio
import signal
import socket

import aiohttp
import psycopg
import psycopg.conninfo
from aiohttp import web

from tests.listener.kit import Call, ListenerProcess, Sink, add_schedules, until
from tests.listener.proxy import Proxy
from tests.ops.conftest import metric_samples

NOWHERE = "http://127.0.0.1:9/projects/{project_id}/functions/{function_name}"


async def test_listener_process_notifies_systemd(abstract_socket: tuple[str, socket.socket],
                                                 db: psycopg.Connection, dsn: str) -> None:
    """READY=1 once LISTEN is active, STATUS lines, WATCHDOG=1 pings, STOPPING=1 on SIGTERM."""
    address, server = abstract_socket
    loop = asyncio.get_running_loop()
    messages: list[str] = []

    async def receive() -> None:
        while True:
            messages.append((await loop.sock_recv(server, 4096)).decode())

    receiver = asyncio.create_task(receive())
    proc = await ListenerProcess.start(
        "--database-url", dsn, "--invoke-url", NOWHERE,
        "--worker-id", "sd-test", "--sweep-interval", "60",
        env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "1000000"})  # a ping every 0.5 s
    try:
        await until(lambda: any("READY=1" in m for m in messages), within=15, what="READY=1")
        ready = next(m for m in messages if "READY=1" in m)
        # LISTEN is active by then: the listener's session shows in dispatch.listeners.
        row = db.execute("SELECT bool_or(listening) FROM dispatch.listeners WHERE worker = %s",
                         ("sd-test",)).fetchone()
        assert row == (True,)
        assert "STATUS=listening as sd-test: 0 in flight, 0 ok, 0 error since start" in ready.split("\n")
        assert f"MAINPID={proc.proc.pid}" in ready.split("\n")
        before = len(messages)
        await until(lambda: messages[before:].count("WATCHDOG=1") >= 3, within=10, what="3 watchdog pings")

        proc.signal(signal.SIGTERM)
        assert await proc.wait() == 0
        await asyncio.sleep(0.05)
    finally:
        await proc.kill()
        receiver.cancel()
    stopping = [m for m in messages if "STOPPING=1" in m]
    assert stopping and stopping[0].startswith("STOPPING=1\nSTATUS=stopping")
    assert messages.index(stopping[0]) > messages.index(ready)
    assert messages[0] == "STATUS=starting: connecting to the database"
    assert messages[-1] == "STOPPING=1\nSTATUS=stopped"


async def test_the_start_timeout_is_extended_while_the_database_is_waited_for(
    abstract_socket: tuple[str, socket.socket], db: psycopg.Connection, dsn: str,
) -> None:
    """Issue 21 item 9: READY=1 waits for the database, and the unit's TimeoutStartSec=60 made
    systemd restart a listener every minute through a long outage at boot. While it waits, the
    listener asks for more time (EXTEND_TIMEOUT_USEC), then says READY=1 once the database is back."""
    address, server = abstract_socket
    loop = asyncio.get_running_loop()
    messages: list[str] = []

    async def receive() -> None:
        while True:
            messages.append((await loop.sock_recv(server, 4096)).decode())

    port = int(psycopg.conninfo.conninfo_to_dict(dsn)["port"] or 5432)
    proxy = Proxy(port)
    await proxy.start()
    await proxy.refuse()  # the database is not there at boot
    receiver = asyncio.create_task(receive())
    proc = await ListenerProcess.start(
        "--database-url", proxy.url(dsn), "--invoke-url", NOWHERE,
        "--worker-id", "sd-boot", "--sweep-interval", "60", env={"NOTIFY_SOCKET": address})
    try:
        await until(lambda: any("EXTEND_TIMEOUT_USEC=" in m for m in messages), within=10,
                    what="EXTEND_TIMEOUT_USEC")
        extend = next(m for m in messages if "EXTEND_TIMEOUT_USEC=" in m).split("\n")
        assert "EXTEND_TIMEOUT_USEC=30000000" in extend
        assert any(line.startswith("STATUS=starting: waiting for the database") for line in extend)
        assert not any("READY=1" in m for m in messages)
        await proxy.accept_again()
        await until(lambda: any("READY=1" in m for m in messages), within=15, what="READY=1")
        proc.signal(signal.SIGTERM)
        assert await proc.wait() == 0
    finally:
        await proc.kill()
        receiver.cancel()
        await proxy.close()


async def _scrape(port: int) -> dict[str, float]:
    """Every sample of /metrics by name and labels, e.g. 'pgdispatch_runs_total{status="ok"}'."""
    url = f"http://127.0.0.1:{port}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        return metric_samples(await response.text())


async def _lost(port: int) -> bool:
    return (await _scrape(port))["pgdispatch_runs_lost_total"] == 1


async def test_metrics_scraped_from_a_running_listener(db: psycopg.Connection, dsn: str, sink: Sink) -> None:
    async def fails(request: web.Request, call: Call) -> web.StreamResponse:
        return web.json_response({"ok": False, "code": "nope", "message": "failed on purpose"}, status=500)

    sink.handlers["broken"] = fails
    add_schedules(db, 3, function_name="fine")
    add_schedules(db, 1, function_name="broken")
    db.execute("UPDATE dispatch.schedules SET max_attempts = 1 WHERE function_name = %s", ("broken",))
    proc = await ListenerProcess.start(
        "--database-url", dsn, "--invoke-url", sink.template, "--worker-id", "metrics",
        "--sweep-interval", "1", env={"PGDISPATCH_METRICS_PORT": "127.0.0.1:0"})
    try:
        serving = await proc.wait_event("metrics_serving")
        port = serving["port"]
        assert serving["host"] == "127.0.0.1" and port > 0
        await proc.wait_event("listening")
        before = await _scrape(port)
        assert before['pgdispatch_runs_total{status="ok"}'] == 0
        assert before["pgdispatch_in_flight"] == 0

        # Due 3 seconds ago (a DBA's "run now"): the listener's sweep marks and claims them.
        db.execute("UPDATE dispatch.schedules SET next_run_at = now() - interval '3 seconds'")
        await until(lambda: db.execute("SELECT count(*) FROM dispatch.runs WHERE status IN ('ok', 'error')"
                                       ).fetchone() == (4,), what="four runs recorded")
        after = await _scrape(port)
        assert after['pgdispatch_runs_total{status="ok"}'] == 3
        assert after['pgdispatch_runs_total{status="error"}'] == 1
        assert after["pgdispatch_invocation_duration_seconds_count"] == 4
        assert after["pgdispatch_dispatch_latency_seconds_count"] == 4
        # From the slot, 3 s ago, to the request: more than 2.5 s, less than 10 s.
        assert after['pgdispatch_dispatch_latency_seconds_bucket{le="2.5"}'] == 0
        assert after['pgdispatch_dispatch_latency_seconds_bucket{le="10.0"}'] == 4
        assert after["pgdispatch_claim_batch_size_sum"] == 4
        assert after["pgdispatch_claim_batch_size_count"] >= 1
        assert after["pgdispatch_in_flight"] == 0
        assert 0 <= after["pgdispatch_last_tick_age_seconds"] < 5
        assert after["pgdispatch_last_tick_timestamp_seconds"] > 1.7e9
        assert after["pgdispatch_database_reconnects_total"] == 0

        # The LISTEN session is killed: the listener reconnects and counts it.
        db.execute("SELECT pg_terminate_backend(pid) FROM dispatch.listeners"
                   " WHERE worker = 'metrics' AND listening")
        await proc.wait_event("database_reconnected", within=15)
        assert (await _scrape(port))["pgdispatch_database_reconnects_total"] == 1

        # A run whose listener vanished on its last attempt: the tick ends it lost, and the next
        # sweep counts it.
        assert (await _scrape(port))["pgdispatch_runs_lost_total"] == 0
        db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression,"
                   " max_attempts) VALUES ('acme', 'vanishing', '0 0 1 1 *', 1)")
        db.execute("INSERT INTO dispatch.runs (schedule_id, project_id, scheduled_for, status, worker,"
                   " attempt, claimed_at, lease_until)"
                   " SELECT id, project_id, now() - interval '1 hour', 'running', 'ghost', 1,"
                   " now() - interval '2 minutes', now() - interval '1 minute'"
                   " FROM dispatch.schedules WHERE function_name = 'vanishing'")
        await until(lambda: _lost(port), within=10, what="the lost run counted")

        proc.signal(signal.SIGTERM)
        assert await proc.wait() == 0
    finally:
        await proc.kill()
