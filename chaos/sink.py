"""The chaos suite's function endpoint: a counting HTTP sink in its own process.

    python -m chaos.sink --port P --control-port C --record FILE

Serves ``POST /w/{worker}/projects/{project_id}/functions/{function_name}`` (each listener gets
its own template, so the sink knows which listener called). Every request is recorded *before*
it is answered, one line appended to FILE with one ``os.write`` (so a SIGKILL of the sink loses
nothing that arrived), and a second line once the answer has been sent in full:

    A <key> <worker> <request id> <schedule id> <slot> <run id> <attempt> <decision> <arrived>
    D <key> <answered>

(tab-separated; times are Unix seconds). The decision says how the sink answered:

- ``ok``: 200 ``{"ok": true}``;  ``slow``: the same after 0.1-0.6 s;
- ``fail``: 500 with a JSON ``code``/``message``;
- ``hang``: nothing for ``--hang`` seconds (past the listener's timeout), then 200;
- ``reset``: the connection is reset (TCP RST) without an answer.

Which decision a request gets is drawn at random with the probabilities set on the control port:
``POST /mode`` with a JSON object ``{"fail": p, "hang": p, "reset": p, "slow": p}`` (the rest is
``ok``); requests to the function ``flaky`` fail besides with the probability ``--flaky`` (0.2),
so that schedules with retries meet failures all the time; the function ``flapping`` is down
(every request ``fail``) for ``--flap-down`` seconds (3), then up for ``--flap-up`` seconds (9),
and so on, by the wall clock (its circuit breakers open and close). ``GET /inflight`` returns
``{worker: requests being answered}``. "Down for a while" is
done by the harness killing this process and starting it again on the same port.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import socket
import struct
import time
from typing import Any

from aiohttp import web

__all__ = ["main"]

DECISIONS = ("fail", "hang", "reset", "slow")


class Sink:
    def __init__(self, record_path: str, hang_s: float, flaky: float, flap: tuple[float, float]) -> None:
        self._fd = os.open(record_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._keys = itertools.count()
        self._prefix = f"{os.getpid()}-"
        self._hang_s = hang_s
        self._flaky = flaky
        self._flap_down_s, self._flap_up_s = flap
        self.mode: dict[str, float] = dict.fromkeys(DECISIONS, 0.0)
        self.inflight: dict[str, int] = {}

    def _write(self, *fields: object) -> None:
        os.write(self._fd, ("\t".join(str(f) for f in fields) + "\n").encode())

    def _decide(self, function_name: str) -> str:
        if function_name == "flaky" and random.random() < self._flaky:
            return "fail"
        flap = self._flap_down_s + self._flap_up_s
        if function_name == "flapping" and time.time() % flap < self._flap_down_s:
            return "fail"
        draw = random.random()
        for decision in DECISIONS:
            draw -= self.mode.get(decision, 0.0)
            if draw < 0:
                return decision
        return "ok"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        worker = request.match_info["worker"]
        try:
            invoker = json.loads(body)["invoker"]
        except (ValueError, KeyError, TypeError):
            invoker = {}
        key = f"{self._prefix}{next(self._keys)}"
        decision = self._decide(request.match_info["function_name"])
        self._write("A", key, worker, request.headers.get("X-Request-Id", ""), invoker.get("scheduleId", ""),
                    invoker.get("scheduledFor", ""), invoker.get("runId", ""), invoker.get("attempt", ""),
                    decision, f"{time.time():.6f}")
        self.inflight[worker] = self.inflight.get(worker, 0) + 1
        try:
            return await self._answer(request, decision, key)
        finally:
            self.inflight[worker] -= 1

    async def _answer(self, request: web.Request, decision: str, key: str) -> web.StreamResponse:
        if decision == "reset":
            transport = request.transport
            if transport is not None:
                sock = transport.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                transport.abort()
            self._write("D", key, f"{time.time():.6f}")
            raise web.HTTPInternalServerError  # nobody reads it: the connection is gone
        if decision == "hang":
            await asyncio.sleep(self._hang_s)
        elif decision == "slow":
            await asyncio.sleep(random.uniform(0.1, 0.6))
        if decision == "fail":
            response = web.json_response({"code": "chaos_failure", "message": "the sink failed on purpose"},
                                         status=500)
        else:
            response = web.json_response({"ok": True})
        await response.prepare(request)
        await response.write_eof()
        self._write("D", key, f"{time.time():.6f}")
        return response

    async def set_mode(self, request: web.Request) -> web.Response:
        mode: dict[str, Any] = await request.json()
        self.mode = {decision: float(mode.get(decision, 0.0)) for decision in DECISIONS}
        return web.json_response(self.mode)

    async def get_inflight(self, request: web.Request) -> web.Response:
        return web.json_response({worker: n for worker, n in self.inflight.items() if n})


async def serve(port: int, control_port: int, record: str, hang_s: float, flaky: float,
                flap: tuple[float, float]) -> None:
    sink = Sink(record, hang_s, flaky, flap)
    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_post("/w/{worker}/projects/{project_id}/functions/{function_name}", sink.handle)
    control = web.Application()
    control.router.add_post("/mode", sink.set_mode)
    control.router.add_get("/inflight", sink.get_inflight)
    runners = [web.AppRunner(app, access_log=None, handle_signals=True),
               web.AppRunner(control, access_log=None)]
    for runner in runners:
        await runner.setup()
    await web.TCPSite(runners[0], "127.0.0.1", port, backlog=2048, reuse_address=True).start()
    await web.TCPSite(runners[1], "127.0.0.1", control_port, reuse_address=True).start()
    print("ready", flush=True)  # the harness waits for this line
    try:
        await asyncio.Event().wait()
    finally:
        for runner in runners:
            await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(prog="chaos.sink")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--control-port", type=int, required=True)
    parser.add_argument("--record", required=True)
    parser.add_argument("--hang", type=float, default=5.0)
    parser.add_argument("--flaky", type=float, default=0.2)
    parser.add_argument("--flap-down", type=float, default=3.0)
    parser.add_argument("--flap-up", type=float, default=9.0)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port, args.control_port, args.record, args.hang, args.flaky,
                          (args.flap_down, args.flap_up)))


if __name__ == "__main__":
    main()
