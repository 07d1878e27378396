"""dispatcher.metrics on its own: what each hook records, served over HTTP (the running listener
is scraped in test_listener_process.py)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import aiohttp

from dispatcher.metrics import Metrics, MetricsServer
from tests.ops.conftest import metric_samples


async def test_hooks_and_endpoint() -> None:
    metrics = Metrics()
    in_flight = [0]
    metrics.track_in_flight(lambda: in_flight[0])
    server = MetricsServer(metrics, host="127.0.0.1", port=0)
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            async def scrape(path: str = "/metrics") -> dict[str, float]:
                async with session.get(f"http://127.0.0.1:{server.port}{path}") as response:
                    assert response.status == 200
                    return metric_samples(await response.text())

            empty = await scrape()
            assert empty['pgdispatch_runs_total{status="ok"}'] == 0
            assert empty['pgdispatch_runs_total{status="error"}'] == 0
            assert math.isnan(empty["pgdispatch_last_tick_age_seconds"])

            metrics.sent(datetime.now(UTC) - timedelta(seconds=1.5))
            metrics.finished("ok", 0.2)
            metrics.finished("error", 31.0)
            metrics.claimed(7)
            metrics.claimed(0)
            metrics.reconnected()
            metrics.ticked()
            in_flight[0] = 3
            seen = await scrape("/")
    finally:
        await server.close()
    assert seen['pgdispatch_dispatch_latency_seconds_bucket{le="1.0"}'] == 0
    assert seen['pgdispatch_dispatch_latency_seconds_bucket{le="2.5"}'] == 1
    assert seen['pgdispatch_runs_total{status="ok"}'] == seen['pgdispatch_runs_total{status="error"}'] == 1
    assert seen["pgdispatch_invocation_duration_seconds_sum"] == 31.2
    assert seen['pgdispatch_invocation_duration_seconds_bucket{le="30.0"}'] == 1
    assert (seen["pgdispatch_claim_batch_size_count"], seen["pgdispatch_claim_batch_size_sum"]) == (2, 7)
    assert seen["pgdispatch_database_reconnects_total"] == 1
    assert 0 <= seen["pgdispatch_last_tick_age_seconds"] < 1
    assert seen["pgdispatch_in_flight"] == 3


def test_listeners_in_one_process_do_not_share_metrics() -> None:
    first, second = Metrics(), Metrics()
    first.finished("ok", 0.1)
    assert metric_samples(second.exposition().decode())['pgdispatch_runs_total{status="ok"}'] == 0
