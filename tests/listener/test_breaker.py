"""The circuit breaker end to end (issue 23 §3, issue 26 item 4): two real listeners, a loopback
function that goes down and comes back, a healthy function of the same project beside it.

While it is down, at most one probe at a time reaches it, each at least a spacing after the one
before; when it is back, the runs that waited go within the longest spacing; each slot is one
run under one request id, invoked by its probes and its one attempt before the breaker opened,
nothing lost; the healthy function stays on time throughout; pgdispatch_breaker_open says so.

The default suite runs it with the spacing scaled down (0.2 s doubling to 1 s, down for 2.5 s).
PGDISPATCH_BREAKER_MINUTE=1 runs it with the documented defaults (1 s doubling to 10 s) and the
function down for a minute, and prints the figures docs/policies.md quotes (about 75 s)."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from aiohttp import web

from .kit import YEARLY, Call, Running, Sink, scalar, until

StartListener = Callable[..., Awaitable[Running]]
MINUTE = os.environ.get("PGDISPATCH_BREAKER_MINUTE") == "1"
SPACING_S, SPACING_MAX_S, DOWN_FOR_S = (1.0, 10.0, 60.0) if MINUTE else (0.2, 1.0, 2.5)
SCHEDULES = 10
# A probe's claim after its instant: the listener's clock wakes on the waiting run's not_before,
# ticks, claims.
SLACK_S = 0.5


async def test_a_function_down_then_back(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener
) -> None:
    if not MINUTE:
        db.execute("UPDATE dispatch.settings SET breaker_probe_spacing = %s, breaker_probe_spacing_max = %s",
                   (f"{SPACING_S} seconds", f"{SPACING_MAX_S} seconds"))
    db.execute(
        "INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, max_attempts,"
        " retry_backoff, retry_backoff_max)"
        " SELECT 'acme', 'down', %s, 10, '100 milliseconds', '200 milliseconds' FROM generate_series(1, %s)",
        (YEARLY, SCHEDULES))
    db.execute("INSERT INTO dispatch.schedules (project_id, function_name, every)"
               " VALUES ('acme', 'healthy', '1 second')")

    down = True
    down_calls: list[tuple[float, bool, float]] = []  # (arrival: wall clock, answered, arrival: monotonic)

    async def flapping(_request: web.Request, call: Call) -> web.StreamResponse:
        down_calls.append((call.arrived_wall, not down, call.arrived_mono))
        if down:
            return web.json_response({"code": "unavailable"}, status=503)
        return web.json_response({"ok": True})

    sink.handlers["down"] = flapping
    running = await start_listener(sweep_interval_s=0.5)
    await start_listener(sweep_interval_s=0.5)  # two listeners claim: still one probe at a time
    # the down function's slots are due now (its schedules are yearly: no retry meets a next slot)
    db.execute("UPDATE dispatch.schedules SET next_run_at = date_trunc('minute', now())"
               " WHERE function_name = 'down'")
    db.execute("SELECT dispatch.tick()")

    opened = "SELECT count(*) FROM dispatch.breakers WHERE function_name = 'down' AND state = 'open'"
    await until(lambda: scalar(adb, opened), within=5, what="the breaker opened")
    metric = running.listener.metrics.registry.get_sample_value
    await until(lambda: metric("pgdispatch_breaker_open", {"project": "acme", "function": "down"}) == 1,
                within=5, what="pgdispatch_breaker_open 1")
    # down for DOWN_FOR_S from its first call
    went_down = down_calls[0][2]
    await until(lambda: time.monotonic() - went_down >= DOWN_FOR_S or len(down_calls) > SCHEDULES * 20,
                within=DOWN_FOR_S + 5, interval=0.05, what="the end of the outage")
    down = False
    back = time.monotonic()
    done = "SELECT count(*) FROM dispatch.runs r JOIN dispatch.schedules s ON s.id = r.schedule_id" \
           " WHERE s.function_name = 'down' AND r.status = 'ok'"

    async def all_ok() -> bool:
        return bool(await scalar(adb, done) == SCHEDULES)

    await until(all_ok, within=SPACING_MAX_S + 5, what="the waiting runs went")
    recovered_s = time.monotonic() - back
    await until(lambda: metric("pgdispatch_breaker_open", {"project": "acme", "function": "down"}) == 0,
                within=5, what="pgdispatch_breaker_open 0")

    cur = await adb.execute("SELECT extract(epoch FROM at)::float8 FROM dispatch.audit_log"
                            " WHERE action = 'breaker.open'")
    [(opened_at,)] = await cur.fetchall()
    before_open = len([t for t, *_ in down_calls if t <= opened_at])
    # While it was down: the calls before it opened (the runs' first attempts, all out at once,
    # and at times the retry of one whose back-off ended before the fifth failure was recorded),
    # then probes one at a time, each a spacing (less up to a quarter, the jitter) at least after
    # the one before was answered (so after it arrived), doubling; at most a wake-up and a claim
    # later. The first probe comes a spacing after the opening at the earliest: a call before that
    # is a retry claimed before the breaker opened (its transaction's now() is opened_at), which
    # reached the function a moment after.
    probes = [t for t, answered, _ in down_calls if t > opened_at + 0.75 * SPACING_S and not answered]
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    expected = [min(SPACING_S * 2 ** (n + 1), SPACING_MAX_S) for n in range(len(gaps))]
    assert all(g >= 0.75 * e for g, e in zip(gaps, expected, strict=True)), (gaps, expected)
    assert all(g <= e + SLACK_S + 0.5 for g, e in zip(gaps, expected, strict=True)), (gaps, expected)
    # once back, the next probe within the longest spacing, and the rest right after it
    assert recovered_s <= SPACING_MAX_S + SLACK_S + 1.0, recovered_s

    # each slot one run under one request id, finished ok; invoked once before the breaker opened
    # (all ten were out together) and as probes, never while they waited
    cur = await adb.execute(
        "SELECT count(*), count(DISTINCT r.request_id), sum(r.attempt - r.released),"
        " count(*) FILTER (WHERE r.status = 'ok') FROM dispatch.runs r"
        " JOIN dispatch.schedules s ON s.id = r.schedule_id WHERE s.function_name = 'down'")
    runs, request_ids, invocations, ok = await cur.fetchone() or ()
    assert (runs, request_ids, ok) == (SCHEDULES, SCHEDULES, SCHEDULES)
    assert invocations == len(down_calls)
    healthy_calls = [c for c in sink.calls if c.function_name == "healthy"]
    assert len(sink.by_request_id()) == SCHEDULES + len(healthy_calls)  # no healthy slot called twice

    # the healthy function of the same project stayed on time throughout
    cur = await adb.execute(
        "SELECT count(*), max(extract(epoch FROM r.claimed_at - r.fire_at)) FROM dispatch.runs r"
        " JOIN dispatch.schedules s ON s.id = r.schedule_id WHERE s.function_name = 'healthy'"
        " AND r.status = 'ok'")
    healthy_runs, worst_s = await cur.fetchone() or ()
    assert healthy_runs >= int(DOWN_FOR_S) - 1 and worst_s < 1.0, (healthy_runs, worst_s)

    audit = await adb.execute("SELECT action FROM dispatch.audit_log WHERE action LIKE 'breaker.%%'"
                              " ORDER BY id")
    assert [a for a, in await audit.fetchall()] == ["breaker.open", "breaker.close"]
    failed = [t for t, answered, _ in down_calls if not answered]
    print(f"\ndown for {DOWN_FOR_S:.0f} s, spacing {SPACING_S:g} s doubling to {SPACING_MAX_S:g} s:"
          f" {len(failed)} calls reached it while it was down ({before_open} before the breaker opened,"
          f" {len(probes)} probes, gaps {[round(g, 2) for g in gaps]}); its {SCHEDULES} waiting runs all went"
          f" {recovered_s:.1f} s after it came back; the healthy function's worst delay {worst_s:.3f} s over"
          f" {healthy_runs} runs")
