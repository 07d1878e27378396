"""A fast local sink in its own process: nginx answering every POST with 200 and a small JSON
body (400 for the function "broken"), logging each request's X-Request-Id and arrival time (ms)
for the latency figures.

nginx (apt nginx-light) costs a few tens of microseconds of CPU a request, so on a shared
2-core machine the sink takes little from what it measures."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["NginxSink"]

CONFIG = """\
daemon off;
master_process on;
worker_processes 1;
{user}
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 8192; multi_accept on; }}
http {{
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    log_format arrivals '$http_x_request_id $msec';
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    server {{
        listen 127.0.0.1:{port} backlog=4096 reuseport;
        access_log {dir}/arrivals.log arrivals buffer=256k flush=100ms;
        client_body_buffer_size 64k;
        location / {{
            default_type application/json;
            return 200 '{{"ok":true}}';
        }}
        # the function "broken" refuses every call (a final error: bench.event_webhooks)
        location ~ ^/projects/[^/]+/functions/broken$ {{
            default_type application/json;
            return 400 '{{"code":"bad_input","message":"refused"}}';
        }}
    }}
}}
"""


def _nginx() -> str:
    for candidate in (shutil.which("nginx"), "/usr/sbin/nginx"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise SystemExit("bench: nginx is not installed (apt-get install nginx-light; scripts/bench does it)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NginxSink:
    """nginx on a free loopback port in a temporary directory; a context manager."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pgdispatch-sink-"))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.template = self.url + "/projects/{project_id}/functions/{function_name}"
        self._log = self.dir / "arrivals.log"
        self._read = 0
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> NginxSink:
        user = "user root root;" if os.geteuid() == 0 else ""
        config = self.dir / "nginx.conf"
        config.write_text(CONFIG.format(dir=self.dir, port=self.port, user=user))
        self._process = subprocess.Popen([_nginx(), "-c", str(config), "-e", str(self.dir / "error.log")],
                                         stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    error = (self.dir / "error.log").read_text()
                    raise SystemExit(f"bench: nginx did not start: {error}") from None
                time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def pids(self) -> list[int]:
        """The master and its worker, for CPU accounting."""
        assert self._process is not None
        master = self._process.pid
        children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
        return [master, *map(int, children)]

    def arrivals(self, expected: int, within: float = 30.0) -> dict[str, float]:
        """request id -> arrival (epoch seconds) of the requests logged since the last call;
        waits (the log is flushed every 100 ms) until `expected` of them are there."""
        deadline = time.monotonic() + within
        while True:
            with self._log.open("rb") as log:
                log.seek(self._read)
                data = log.read()
            complete = data[: data.rfind(b"\n") + 1]
            if complete.count(b"\n") >= expected or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self._read += len(complete)
        found: dict[str, float] = {}
        for line in complete.decode().splitlines():
            request_id, _, at = line.rpartition(" ")
            found[request_id] = float(at)
        return found
