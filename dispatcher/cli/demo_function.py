"""`pgdispatch demo-function`: the demo's function endpoint on its own, for a compose stack.

The same app as `pgdispatch demo` serves (dispatcher/cli/demo.py): it prints each call, checks its
signature (401 when it does not verify) and fails on purpose for the function `always-fails`.
GET /healthz answers 200 for health checks.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from aiohttp import web

from dispatcher.cli.demo import _function_app
from dispatcher.config import ConfigError, resolve_signing_secret

__all__ = ["add_commands", "serve"]


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def serve(host: str, port: int, secret: bytes) -> None:
    """Serve the demo function until SIGTERM/SIGINT."""
    app = _function_app(secret)
    app.router.add_get("/healthz", _healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0]
        print(f"demo function on http://{host}:{bound[1]}/projects/{{project_id}}/functions/{{function_name}}"
              " (POST; GET /healthz)", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    finally:
        await runner.cleanup()


def _run(args: argparse.Namespace) -> int:
    secret = resolve_signing_secret(args.signing_secret_file)
    if secret is None:
        raise ConfigError("--signing-secret-file / PGDISPATCH_SIGNING_SECRET is required: the demo function "
                          "answers 401 to calls it cannot verify")
    asyncio.run(serve(args.host, args.port, secret))
    return 0


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "demo-function", help="serve the demo's function endpoint (prints and verifies each call)",
        description="Serve the demo function: POST /projects/{project_id}/functions/{function_name} "
                    "prints each call and checks its signature; the function always-fails answers "
                    "500 on purpose; GET /healthz answers 200. Runs until SIGTERM/SIGINT.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    parser.add_argument("--signing-secret-file", metavar="PATH",
                        help="file holding the secret the listener signs with "
                             "[env PGDISPATCH_SIGNING_SECRET, else the systemd credential signing-secret]")
    parser.set_defaults(handler=_run)
