"""`pgdispatch demo-function`: the compose stack's function endpoint, as a real process."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time

import aiohttp

from dispatcher.signing import SIGNATURE_HEADER, sign

from .conftest import PGDISPATCH, run_cli

SECRET = b"demo-function-test-secret"


async def test_serves_verifies_and_stops_on_sigterm() -> None:
    proc = await asyncio.create_subprocess_exec(
        str(PGDISPATCH), "demo-function", "--port", "0",
        env={"PATH": os.environ["PATH"], "PGDISPATCH_SIGNING_SECRET": SECRET.decode()},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        first = (await asyncio.wait_for(proc.stdout.readline(), 15)).decode()
        match = re.match(r"demo function on http://127\.0\.0\.1:(\d+)/projects/\{project_id\}/functions/"
                         r"\{function_name\} \(POST; GET /healthz\)$", first.strip())
        assert match, first
        base = f"http://127.0.0.1:{match.group(1)}"
        invoker = {"kind": "schedule", "runId": 7, "attempt": 1}
        body = json.dumps({"args": {"x": 1}, "invoker": invoker}).encode()
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/healthz") as response:
                assert response.status == 200
            signed = {SIGNATURE_HEADER: sign(SECRET, body, int(time.time())), "X-Request-Id": "sched_1",
                      "Content-Type": "application/json"}
            async with session.post(f"{base}/projects/demo/functions/send-report", data=body,
                                    headers=signed) as response:
                assert (response.status, await response.json()) == (200, {"ok": True})
            async with session.post(f"{base}/projects/demo/functions/always-fails", data=body,
                                    headers=signed) as response:
                assert response.status == 500
            async with session.post(f"{base}/projects/demo/functions/send-report", data=body) as response:
                assert response.status == 401  # unsigned
        printed = (await asyncio.wait_for(proc.stdout.readline(), 5)).decode()
        assert "demo/send-report run 7 attempt 1" in printed and "signature ok" in printed
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_refuses_to_start_without_a_secret() -> None:
    done = run_cli("demo-function", "--port", "0")
    assert done.code == 2
    assert done.err.startswith(
        "pgdispatch demo-function: --signing-secret-file / PGDISPATCH_SIGNING_SECRET is required")
