"""Hostile input end to end: big and deep args, names built to escape the URL template, endpoints
that misbehave, and secrets that must not leak (logs, error messages, ps)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import psycopg
import psycopg.conninfo
import pytest
from aiohttp import web

from .kit import PGDISPATCH, Call, ListenerProcess, Running, Sink, mark_all_due, scalar, until

SECRET = "hostile-signing-secret-0123456789"  # noqa: S105
PASSWORD = "hostile-db-password-9876543210"  # noqa: S105
MB = 1024 * 1024


@dataclass
class Seen:
    raw_path: str
    body: bytes


@dataclass
class RawSink:
    """A catch-all endpoint recording the raw (undecoded) path of every request."""

    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    answer: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None

    @property
    def template(self) -> str:
        return self.url + "/projects/{project_id}/functions/{function_name}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(Seen(request.raw_path, await request.read()))
        if self.answer is not None:
            return await self.answer(request)
        return web.json_response({"ok": True})


@pytest.fixture
async def raw_sink() -> AsyncIterator[RawSink]:
    sink = RawSink()
    app = web.Application(client_max_size=64 * MB)
    app.router.add_route("*", "/{tail:.*}", sink.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    sink.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield sink
    await runner.cleanup()


async def _dispatch_all(db: psycopg.Connection, adb: psycopg.AsyncConnection[Any],
                        start_listener: Callable[..., Awaitable[Running]], **settings: Any) -> list[Any]:
    """Mark every schedule due, run a listener until each run is finished, return the runs."""
    running = await start_listener(**settings)
    marked = mark_all_due(db)

    async def finished() -> bool:
        done = await scalar(adb, "SELECT count(*) = %s FROM dispatch.runs WHERE finished_at IS NOT NULL",
                            (marked,))
        return bool(done) or running.task.done()

    await until(finished, within=30, what="every run finished")
    if running.task.done():
        pytest.fail(f"the listener stopped before finishing the runs: {running.task.exception()!r}")
    return db.execute("SELECT s.project_id, s.function_name, r.status, r.error, r.http_status"
                      " FROM dispatch.runs r JOIN dispatch.schedules s ON s.id = r.schedule_id"
                      " ORDER BY s.created_at, s.id").fetchall()


def _insert(db: psycopg.Connection, project_id: str, function_name: str, args: str = "{}") -> None:
    db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, args)"
               " VALUES (%s, %s, '0 0 1 1 *', %s::jsonb)", (project_id, function_name, args))


# -- args ----------------------------------------------------------------------------------------

# aiohttp warns (ResourceWarning, ignored outside tests) that a body over 1 MiB given as bytes is
# written in one go; the suite turns warnings into errors, the listener's process does not.
@pytest.mark.filterwarnings("ignore:Sending a large body directly:ResourceWarning")
async def test_args_of_1_mb_are_dispatched_intact(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], raw_sink: RawSink,
    start_listener: Callable[..., Awaitable[Running]],
) -> None:
    args = {"blob": "é€😀x" * (MB // 8), "list": list(range(20_000)), "nested": {"k": ["v"] * 1000}}
    text = json.dumps(args, ensure_ascii=False)
    assert len(text.encode()) > MB
    _insert(db, "acme", "big", text)
    rows = await _dispatch_all(db, adb, start_listener, invoke_url=raw_sink.template)
    assert [row[2] for row in rows] == ["ok"], rows
    (seen,) = raw_sink.seen
    assert json.loads(seen.body)["args"] == args


@pytest.mark.parametrize("depth", [100, 900, 5000])
async def test_deeply_nested_args_are_dispatched_intact_or_refused_on_write(
    db: psycopg.Connection, dsn: str, raw_sink: RawSink, depth: int,
) -> None:
    text = '{"a": ' + "[" * depth + "1" + "]" * depth + "}"
    refused: str | None = None
    try:
        _insert(db, "acme", "deep", text)
    except psycopg.Error as exc:
        refused = str(exc.sqlstate)
    if refused is not None:
        # Refused on write: acceptable only as a clear data error.
        assert refused[:2] in ("22", "23", "54"), refused
        return
    # Accepted: then it must be dispatched intact, and the listener (the real process) must live on.
    _insert(db, "acme", "after")
    proc = await ListenerProcess.start("--database-url", dsn, "--invoke-url", raw_sink.template,
                                       "--worker-id", "deep", "--sweep-interval", "60")
    try:
        await proc.wait_event("listening")
        mark_all_due(db)
        await until(lambda: proc.proc.returncode is not None or db.execute(
            "SELECT count(*) = 2 FROM dispatch.runs WHERE finished_at IS NOT NULL").fetchone() == (True,),
            within=30, what="both runs finished")
    finally:
        code = proc.proc.returncode
        await proc.kill()
    failed = [entry.get("message") for entry in proc.logs if entry.get("level") == "error"]
    assert code is None, f"a schedule with args nested {depth} deep stopped the listener ({code}): {failed}"
    rows = db.execute("SELECT status FROM dispatch.runs ORDER BY id").fetchall()
    assert rows == [("ok",), ("ok",)], rows
    bodies = {seen.raw_path.rsplit("/", 1)[-1]: seen.body for seen in raw_sink.seen}
    assert bodies["deep"].decode().replace(" ", "").startswith('{"args":{"a":' + "[" * depth + "1")


# -- names against the URL template ----------------------------------------------------------------

PROJECT_IDS = ["..", ".", "%2F", "%2e%2e", "a?b=c", "a#frag", "ü", "日本", "%", "..%2F..", "a;b",
               "@evil.example", ":80", "a\\b", "~user", "a+b", "😀", "%00", "a..", "...", "a/b", "a b", "\tx",
               "x\x7f", "", "/"]
FUNCTION_NAMES = ["fn", "a..b", "a.", "1-_.", "..", ".", "%2F", "a/b", "a?b", "a#b", "ü", "a b", "", "-a",
                  "a" * 129, "x%2e%2e"]


def test_write_path_refuses_names_that_cannot_be_one_segment(db: psycopg.Connection) -> None:
    refused: dict[str, str] = {}
    for project_id in PROJECT_IDS:
        try:
            _insert(db, project_id, "fn")
        except psycopg.Error as exc:
            refused[f"project {project_id!r}"] = str(exc.sqlstate)
    for function_name in FUNCTION_NAMES:
        try:
            _insert(db, "acme", function_name)
        except psycopg.Error as exc:
            refused[f"function {function_name!r}"] = str(exc.sqlstate)
    assert {key: value for key, value in refused.items() if value[:2] not in ("22", "23")} == {}
    for must_refuse in ["project 'a/b'", "project 'a b'", "project '\\tx'", "project 'x\\x7f'", "project ''",
                        "project '/'", "function '..'", "function '.'", "function '%2F'", "function 'a/b'",
                        "function 'a?b'", "function 'ü'", "function ''", "function '-a'"]:
        assert must_refuse in refused, must_refuse


async def test_accepted_names_land_on_the_template_path_as_one_encoded_segment(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], raw_sink: RawSink,
    start_listener: Callable[..., Awaitable[Running]],
) -> None:
    accepted: list[tuple[str, str]] = []
    pairs = [(p, "fn") for p in PROJECT_IDS] + [("acme", f) for f in FUNCTION_NAMES]
    for project_id, function_name in pairs:
        try:
            _insert(db, project_id, function_name)
        except psycopg.Error:
            continue
        accepted.append((project_id, function_name))
    rows = await _dispatch_all(db, adb, start_listener, invoke_url=raw_sink.template)
    assert len(rows) == len(accepted)
    landed = []
    for seen in raw_sink.seen:
        parts = seen.raw_path.split("/")
        body = json.loads(seen.body)
        landed.append((parts, body["invoker"]["scheduleId"]))
    wrong = []
    expected = {(p, f) for p, f in accepted}
    got = set()
    for parts, _ in landed:
        if len(parts) != 5 or parts[:2] != ["", "projects"] or parts[3] != "functions":
            wrong.append("/".join(parts))
            continue
        got.add((unquote(parts[2]), unquote(parts[4])))
    assert wrong == [], f"requests that left the template's path: {wrong}"
    assert got == expected


# -- endpoints that misbehave --------------------------------------------------------------------

@contextlib.asynccontextmanager
async def _tcp_server(handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
                      ) -> AsyncIterator[str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/projects/{{project_id}}/functions/{{function_name}}"
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2)


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    await reader.readexactly(length)


@pytest.mark.parametrize(("reply", "error_start"), [
    (b"garbage garbage garbage\r\n\r\n", "invalid response"),
    (b"\x00\xff\xfe" * 1000, "invalid response"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "connection lost"),  # body cut short
    (b"HTTP/1.1 99999 Nope\r\n\r\n", "invalid response"),
    # a head beyond what the client buffers (hyper: about 400 KB)
    (b"HTTP/1.1 200 OK\r\n" + b"X-Junk: " + b"j" * 1_000_000 + b"\r\n\r\n", "invalid response"),
    (None, "timeout"),  # never sends headers
])
async def test_endpoints_that_answer_garbage_or_nothing_are_recorded_as_errors(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any],
    start_listener: Callable[..., Awaitable[Running]], reply: bytes | None, error_start: str,
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await _read_request(reader)
            if reply is None:
                await reader.read()  # until the listener gives up and closes
            else:
                writer.write(reply)
                await writer.drain()
        writer.close()

    _insert(db, "acme", "fn")
    # One attempt: this test is about how each answer is recorded. With the default three, the
    # jittered back-offs (up to 10 s, then 20 s) plus three 1 s timeouts could outlast the wait.
    db.execute("UPDATE dispatch.schedules SET max_attempts = 1")
    async with _tcp_server(handler) as template:
        rows = await _dispatch_all(db, adb, start_listener, invoke_url=template, timeout_s=1.0)
    ((_, _, status, error, _),) = rows
    assert status == "error"
    assert error.startswith(error_start), error
    assert len(error) <= 500


async def _finished_with_the_listener_up(db: psycopg.Connection, adb: psycopg.AsyncConnection[Any],
                                         running: Running) -> list[tuple[Any, ...]]:
    """Once every run finished, with the listener still running: (function, status, error) of
    each, by function, then run."""
    async def finished() -> bool:
        return bool(await scalar(adb, "SELECT bool_and(finished_at IS NOT NULL) FROM dispatch.runs"))

    await until(lambda: running.task.done() or finished(), what="every run finished")
    assert not running.task.done(), f"the listener stopped: {running.task.exception()!r}"
    return db.execute("SELECT s.function_name, r.status, r.error FROM dispatch.runs r"
                      " JOIN dispatch.schedules s ON s.id = r.schedule_id ORDER BY 1, r.id").fetchall()


async def test_error_text_that_is_not_utf8_is_recorded_with_the_rest_of_its_batch(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink,
    start_listener: Callable[..., Awaitable[Running]], caplog: pytest.LogCaptureFixture,
) -> None:
    # "\ud800" is valid JSON for a lone surrogate, which no UTF-8 can carry: psycopg refused the
    # batch holding it, the completion writer died, and the listener stopped, abandoning every
    # outcome it held; each retry of the run stopped it again.
    caplog.set_level(logging.INFO, logger="dispatcher")
    go = asyncio.Event()
    answers = {
        "lone-high": (422, b'{"code":"E","message":"bad \\ud800"}'),
        "lone-low-ok-false": (200, b'{"ok": false, "message": "\\udfff end"}'),
    }

    async def answer(request: web.Request, call: Call) -> web.StreamResponse:
        await go.wait()
        status, body = answers.get(call.function_name, (200, b'{"ok": true}'))
        return web.Response(status=status, body=body, content_type="application/json")

    for name in (*answers, "fine"):
        sink.handlers[name] = answer
        _insert(db, "acme", name)
    for _ in range(3):
        _insert(db, "acme", "fine")
    running = await start_listener(concurrency=10)
    mark_all_due(db)
    await until(lambda: len(sink.calls) == 6, what="every call in flight")
    go.set()  # answered together: written in one batch, or few

    rows = await _finished_with_the_listener_up(db, adb, running)
    assert rows == [*[("fine", "ok", None)] * 4, ("lone-high", "error", "E: bad \ufffd"),
                    ("lone-low-ok-false", "error", "\ufffd end")]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert len(sink.calls) == 6  # nothing invoked twice


async def test_error_text_the_connection_cannot_encode_is_recorded_escaped_and_said(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], dsn: str, sink: Sink,
    start_listener: Callable[..., Awaitable[Running]], caplog: pytest.LogCaptureFixture,
) -> None:
    # Whatever text a function sends must not stop the completion writer, even where the listener
    # cannot store it as sent: here a client_encoding (from the URL; PGCLIENTENCODING does the
    # same) without the euro sign, which psycopg then refuses to encode.
    caplog.set_level(logging.INFO, logger="dispatcher")
    go = asyncio.Event()

    async def answer(request: web.Request, call: Call) -> web.StreamResponse:
        await go.wait()
        if call.function_name == "euro":
            return web.json_response({"code": "E", "message": "costs 5 \u20ac"}, status=422)
        return web.json_response({"ok": True})

    for name in ("euro", "fine", "fine"):
        sink.handlers[name] = answer
        _insert(db, "acme", name)
    latin1 = psycopg.conninfo.make_conninfo(dsn, client_encoding="LATIN1")
    running = await start_listener(database_url=latin1, concurrency=10)
    mark_all_due(db)
    await until(lambda: len(sink.calls) == 3, what="every call in flight")
    go.set()

    rows = await _finished_with_the_listener_up(db, adb, running)
    assert rows == [("euro", "error", "E: costs 5 \\u20ac"), ("fine", "ok", None), ("fine", "ok", None)]
    errors = [(r.levelno, getattr(r, "event", None)) for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [(logging.ERROR, "completion_text_escaped")]
    assert len(sink.calls) == 3  # nothing invoked twice


async def test_redirects_are_not_followed(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], raw_sink: RawSink,
    start_listener: Callable[..., Awaitable[Running]],
) -> None:
    async def redirect(request: web.Request) -> web.StreamResponse:
        if request.raw_path.startswith("/projects/"):
            raise web.HTTPFound("/elsewhere")
        return web.json_response({"ok": True})

    raw_sink.answer = redirect
    _insert(db, "acme", "fn")
    rows = await _dispatch_all(db, adb, start_listener, invoke_url=raw_sink.template)
    ((_, _, status, error, http_status),) = rows
    assert (status, http_status) == ("error", 302)
    assert error.startswith("HTTP 302")
    assert [seen.raw_path for seen in raw_sink.seen] == ["/projects/acme/functions/fn"]


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def _rss_while_five_runs_finish(db: psycopg.Connection, proc: ListenerProcess,
                                     within: float) -> tuple[int, int]:
    """The listener's RSS once it listens, and its peak while the five due runs finish (kB)."""
    await proc.wait_event("listening")
    baseline = peak = _rss_kb(proc.proc.pid)
    mark_all_due(db)

    async def finished() -> bool:
        nonlocal peak
        peak = max(peak, _rss_kb(proc.proc.pid))
        row = db.execute(
            "SELECT count(*) FILTER (WHERE finished_at IS NOT NULL) FROM dispatch.runs").fetchone()
        return row == (5,)

    await until(finished, within=within, interval=0.02, what="five runs finished")
    return baseline, peak


@pytest.mark.parametrize("with_length", [True, False])
async def test_a_100_mb_body_is_not_read_and_memory_stays_bounded(
    db: psycopg.Connection, dsn: str, raw_sink: RawSink, with_length: bool,
) -> None:
    sent = [0]
    total = 100 * MB
    chunk = b"x" * MB

    async def gigantic(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        if with_length:
            response.content_length = total
        await response.prepare(request)
        with contextlib.suppress(ConnectionError, RuntimeError):
            while sent[0] < total:
                await response.write(chunk)
                sent[0] += len(chunk)
            await response.write_eof()
        return response

    raw_sink.answer = gigantic
    for i in range(5):
        _insert(db, "acme", f"fn{i}")
    proc = await ListenerProcess.start("--database-url", dsn, "--invoke-url", raw_sink.template,
                                       "--worker-id", "rss", "--timeout", "20", "--sweep-interval", "60")
    try:
        baseline, peak = await _rss_while_five_runs_finish(db, proc, within=60)
    finally:
        await proc.kill()
    rows = db.execute("SELECT status, http_status FROM dispatch.runs").fetchall()
    # A 2xx is ok whatever its body; what matters is that the body was not read or kept.
    assert rows == [("ok", 200)] * 5
    assert (peak - baseline) < 40 * 1024, f"RSS grew from {baseline} kB to {peak} kB"
    assert sent[0] < 5 * 20 * MB, f"the sink got to send {sent[0] / MB:.0f} MB"


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_compression_bomb_is_not_inflated_past_the_cap(
    db: psycopg.Connection, dsn: str, raw_sink: RawSink, encoding: str,
) -> None:
    """Issue 21 item 6: a 61 KB gzip answer (Content-Length says 61 KB) became a 60 MiB body,
    because the cap trusted Content-Length and aiohttp decompressed everything behind it."""
    inflated = 60 * MB
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    bomb = compressor.compress(b"x" * inflated) + compressor.flush()
    assert len(bomb) < 100 * 1024
    accepted: list[str] = []

    async def bombing(request: web.Request) -> web.StreamResponse:
        accepted.append(request.headers.get("Accept-Encoding", ""))
        return web.Response(status=500, body=bomb, headers={"Content-Encoding": encoding})

    raw_sink.answer = bombing
    for i in range(5):
        _insert(db, "acme", f"fn{i}")
    db.execute("UPDATE dispatch.schedules SET max_attempts = 1")
    proc = await ListenerProcess.start("--database-url", dsn, "--invoke-url", raw_sink.template,
                                       "--worker-id", "bomb", "--sweep-interval", "60")
    try:
        baseline, peak = await _rss_while_five_runs_finish(db, proc, within=30)
    finally:
        await proc.kill()
    rows = db.execute("SELECT status, http_status, error FROM dispatch.runs").fetchall()
    # The excerpt is of the inflated body: decompressed, but only up to the cap.
    assert rows == [("error", 500, "HTTP 500: " + "x" * 200)] * 5
    assert (peak - baseline) < 40 * 1024, f"RSS grew from {baseline} kB to {peak} kB"
    assert accepted == ["identity"] * 5  # nothing compressed is asked for


@pytest.mark.parametrize("after", ["junk after the stream", "a stream of empty blocks"])
async def test_a_compressed_answer_is_capped_in_the_bytes_it_sends_too(
    db: psycopg.Connection, dsn: str, raw_sink: RawSink, after: str,
) -> None:
    """The cap counts inflated bytes, but compressed ones must stop somewhere as well: zlib keeps
    whatever follows a gzip stream's end (50 MB of it were read and held), and a deflate stream
    of empty blocks inflates to nothing however long it runs (read to its end, or until the call
    timed out and an answered run was tried again)."""
    total = 50 * MB
    sent: list[int] = []  # by each answer

    async def answering(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Encoding": "gzip"})
        await response.prepare(request)
        compressor = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        if after == "junk after the stream":
            first, chunk = compressor.compress(b'{"ok": true}') + compressor.flush(), b"\0" * 65536
        else:
            # after a full flush the stream is on a byte: empty stored blocks follow, none final
            first = compressor.compress(b'{"ok": true}') + compressor.flush(zlib.Z_FULL_FLUSH)
            chunk = b"\x00\x00\x00\xff\xff" * 13_000
        sent.append(0)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await response.write(first)
            while sent[-1] < total:
                await response.write(chunk)
                sent[-1] += len(chunk)
            await response.write_eof()
        return response

    raw_sink.answer = answering
    for i in range(5):
        _insert(db, "acme", f"fn{i}")
    db.execute("UPDATE dispatch.schedules SET max_attempts = 1")
    proc = await ListenerProcess.start("--database-url", dsn, "--invoke-url", raw_sink.template,
                                       "--worker-id", "trailing", "--timeout", "20", "--sweep-interval", "60")
    try:
        baseline, peak = await _rss_while_five_runs_finish(db, proc, within=60)
    finally:
        await proc.kill()
    assert db.execute("SELECT status, http_status FROM dispatch.runs").fetchall() == [("ok", 200)] * 5
    assert (peak - baseline) < 40 * 1024, f"RSS grew from {baseline} kB to {peak} kB"
    assert len(sent) == 5 and max(sent) < 10 * MB, f"the sink got to send {[n // MB for n in sent]} MB"


# -- secrets ---------------------------------------------------------------------------------------

async def test_secret_and_password_never_appear_in_logs_errors_or_ps(
    db: psycopg.Connection, dsn: str, raw_sink: RawSink,
) -> None:
    async def fail(request: web.Request) -> web.StreamResponse:
        return web.json_response({"code": "boom", "message": "failed on purpose"}, status=500)

    raw_sink.answer = fail
    url = psycopg.conninfo.make_conninfo(dsn, password=PASSWORD)
    _insert(db, "acme", "fn")
    db.execute("UPDATE dispatch.schedules SET max_attempts = 1")  # the 500 is recorded, not retried
    proc = await ListenerProcess.start(
        "--invoke-url", raw_sink.template, "--worker-id", "secrets", "--sweep-interval", "60",
        "--log-level", "debug",
        env={"PGDISPATCH_DATABASE_URL": url, "PGDISPATCH_SIGNING_SECRET": SECRET},
    )
    try:
        await proc.wait_event("listening")
        cmdline = Path(f"/proc/{proc.proc.pid}/cmdline").read_bytes().decode()  # noqa: ASYNC240
        ps = await asyncio.create_subprocess_exec("ps", "-ww", "-o", "args=", "-p", str(proc.proc.pid),
                                                  stdout=asyncio.subprocess.PIPE)
        ps_out = (await ps.communicate())[0].decode()
        mark_all_due(db)
        await until(lambda: db.execute("SELECT count(*) FROM dispatch.runs WHERE finished_at IS NOT NULL"
                                       ).fetchone() == (1,), what="the run finished")
        # Cut its sessions: reconnect messages are logged too.
        db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                   " WHERE application_name = 'pgdispatch secrets'")
        await proc.wait_event("database_reconnected", within=15)
    finally:
        await proc.kill()
    recorded = json.dumps(db.execute("SELECT to_jsonb(r) FROM dispatch.runs r").fetchall())
    recorded += json.dumps(db.execute("SELECT to_jsonb(a) FROM dispatch.audit_log a").fetchall())
    recorded += json.dumps(db.execute("SELECT to_jsonb(a) FROM pg_stat_activity a").fetchall(), default=str)
    logs = "".join(proc.raw)
    assert "boom: failed on purpose" in recorded  # the error was recorded
    for secret in (SECRET, PASSWORD):
        assert secret not in cmdline
        assert secret not in ps_out
        assert secret not in logs
        assert secret not in recorded


@pytest.mark.parametrize("url", [
    f"postgresql://u:{PASSWORD}@[::1/db",  # malformed: libpq's message quotes the URL
    f"postgresql://u:{PASSWORD}@127.0.0.1:1/db?bogus=1",
    f"host=127.0.0.1 password={PASSWORD} port",
])
async def test_configuration_errors_do_not_echo_the_password(url: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        str(PGDISPATCH), "listen", "--invoke-url", "http://127.0.0.1:9/{function_name}",
        env={**os.environ, "PGDISPATCH_DATABASE_URL": url},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2, err
    assert PASSWORD not in (out + err).decode(), err.decode()


async def test_an_unreachable_database_is_reported_without_the_password() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there once the socket is closed
    proc = await ListenerProcess.start(
        "--invoke-url", "http://127.0.0.1:9/{function_name}", "--worker-id", "down",
        env={"PGDISPATCH_DATABASE_URL": f"postgresql://u:{PASSWORD}@127.0.0.1:{port}/db",
             "PGDISPATCH_SIGNING_SECRET": SECRET},
    )
    try:
        await proc.wait_event("database_reconnecting", within=15)
        await asyncio.sleep(1.5)
    finally:
        await proc.kill()
    logs = "".join(proc.raw)
    assert logs
    assert PASSWORD not in logs and SECRET not in logs
