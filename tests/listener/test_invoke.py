"""Requests and outcome classification against a real HTTP server on 127.0.0.1 (no database)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web

import dispatcher.signing
from dispatcher import __version__
from dispatcher.invoke import MAX_BODY_BYTES, Invoker, build_request, new_session
from dispatcher.runs import Outcome, Run
from dispatcher.signing import sign

from .kit import Call, Sink

SECRET = b"s3cret-for-tests"


def make_run(**overrides: Any) -> Run:
    values: dict[str, Any] = {
        "run_id": 42, "schedule_id": "7f0c7d5e-4a55-4c39-9c4e-0d8f3a7e5b11", "project_id": "acme",
        "function_name": "send-report", "args_json": '{"to": "ops", "n": 1}', "request_id": "sched_abc",
        "scheduled_for": datetime(2025, 3, 30, 1, 0, tzinfo=UTC), "attempt": 2,
        "fire_at": datetime(2025, 3, 30, 1, 4, 7, 250000, tzinfo=UTC),
        "lease_until": datetime(2025, 3, 30, 1, 1, tzinfo=UTC), "lease_deadline": time.monotonic() + 60,
    }
    return Run(**{**values, **overrides})


def test_request_shape() -> None:
    request = build_request(make_run(), url_template="https://fn.example/p/{project_id}/f/{function_name}",
                            secret=SECRET, now=1_700_000_000)
    assert str(request.url) == "https://fn.example/p/acme/f/send-report"
    assert json.loads(request.body) == {
        "args": {"to": "ops", "n": 1},
        "invoker": {"kind": "schedule", "scheduleId": "7f0c7d5e-4a55-4c39-9c4e-0d8f3a7e5b11", "runId": 42,
                    "scheduledFor": "2025-03-30T01:00:00.000Z", "fireAt": "2025-03-30T01:04:07.250Z",
                    "attempt": 2},
    }
    assert request.headers == {
        "Content-Type": "application/json",
        "User-Agent": f"pgdispatch/{__version__}",
        "Accept-Encoding": "identity",
        "X-Request-Id": "sched_abc",
        "Idempotency-Key": "sched_abc",
        "X-Dispatch-Signature": sign(SECRET, request.body, 1_700_000_000),
    }
    unsigned = build_request(make_run(), url_template="http://h/{function_name}", secret=None)
    assert "X-Dispatch-Signature" not in unsigned.headers


@pytest.mark.parametrize(
    ("project_id", "function_name", "path"),
    [
        ("a/../b", "f", "/p/a%2F..%2Fb/f/f"),
        ("acme", "..", "/p/acme/f/.."),  # one segment still: no slash can appear
        ("ü ?#%", "x.y-z_1", "/p/%C3%BC%20%3F%23%25/f/x.y-z_1"),
    ],
)
def test_names_are_one_percent_encoded_path_segment_each(project_id: str, function_name: str,
                                                         path: str) -> None:
    request = build_request(make_run(project_id=project_id, function_name=function_name),
                            url_template="http://h/p/{project_id}/f/{function_name}", secret=None)
    assert str(request.url) == f"http://h{path}"


@pytest.mark.parametrize("key_length", [0, 1, 63, 64, 65, 200])
def test_the_signature_is_hmac_sha256_whatever_the_secret_s_length(key_length: int) -> None:
    """sign() keeps each secret's padded key hashed once; the digest is still the standard
    HMAC's, for keys shorter than SHA-256's block, exactly one block, and longer (hashed first)."""
    secret = bytes((7 * i + key_length) % 256 for i in range(key_length))
    other = b"the-rotation's-other-secret"
    body = b'{"args":{},"invoker":{"kind":"schedule"}}'
    expected = [hmac.new(key, b"1700000000." + body, hashlib.sha256).hexdigest() for key in (secret, other)]
    assert sign(secret, body, 1_700_000_000) == f"t=1700000000,v1={expected[0]}"
    assert sign(secret, body, 1_700_000_000, other) == f"t=1700000000,v1={expected[0]},v1={expected[1]}"
    # the same secret again, from its cached keyed hashes, and another body: nothing carried over
    assert sign(secret, body + b" ", 1_700_000_001) == "t=1700000001,v1=" + hmac.new(
        secret, b"1700000001." + body + b" ", hashlib.sha256).hexdigest()


async def test_signature_received_over_http_verifies(sink: Sink) -> None:
    async with new_session(concurrency=4) as session:
        invoker = Invoker(session, url_template=sink.template, timeout_s=5, secret=SECRET)
        outcome = await invoker.invoke(make_run())
    assert outcome.status == "ok"
    (call,) = sink.calls
    header = call.headers["X-Dispatch-Signature"]
    assert dispatcher.signing.verify_signature(SECRET, call.body, header)
    assert not dispatcher.signing.verify_signature(SECRET, call.body + b" ", header)


def _json(status: int, payload: Any) -> Callable[[web.Request, Call], Any]:
    async def handler(request: web.Request, call: Call) -> web.StreamResponse:
        return web.json_response(payload, status=status)
    return handler


def _text(status: int, text: str, content_type: str = "text/plain") -> Callable[[web.Request, Call], Any]:
    async def handler(request: web.Request, call: Call) -> web.StreamResponse:
        return web.Response(status=status, text=text, content_type=content_type)
    return handler


async def _hang(request: web.Request, call: Call) -> web.StreamResponse:
    await asyncio.sleep(30)
    return web.Response()


async def _redirect(request: web.Request, call: Call) -> web.StreamResponse:
    return web.Response(status=302, headers={"Location": "/projects/acme/functions/elsewhere"})


async def _huge(request: web.Request, call: Call) -> web.StreamResponse:
    return web.Response(status=500, body=b"x" * (MAX_BODY_BYTES * 4))


HTML_404 = "<!doctype html>\n<html>\n  <head><title>404</title></head>\n  <body>Not found</body>\n</html>"

CASES: list[tuple[str, Callable[[web.Request, Call], Any], tuple[str, str | None, int | None]]] = [
    ("200", _json(200, {"ok": True, "sent": 3}), ("ok", None, 200)),
    ("204", _text(204, ""), ("ok", None, 204)),
    ("200-ok-false", _json(200, {"ok": False, "code": "nothing_to_do", "message": "no recipients"}),
     ("error", "nothing_to_do: no recipients", 200)),
    ("500-json", _json(500, {"ok": False, "code": "db_down", "message": "cannot reach the store"}),
     ("error", "db_down: cannot reach the store", 500)),
    ("404-html", _text(404, HTML_404, "text/html"),
     ("error", "HTTP 404: <!doctype html> <html> <head><title>404</title></head> <body>Not found</body>"
      " </html>", 404)),
    ("503-empty", _text(503, ""), ("error", "HTTP 503 with an empty body", 503)),
    ("200-invalid-json", _text(200, '{"ok": false,', "application/json"), ("ok", None, 200)),
    ("302", _redirect, ("error", "HTTP 302 with an empty body", 302)),
    ("500-huge", _huge, ("error", "HTTP 500: " + "x" * 200, 500)),
    ("hang", _hang, ("error", "timeout: no complete response within 0.5 s", None)),
]


@pytest.mark.parametrize(("function_name", "handler", "expected"), CASES, ids=[case[0] for case in CASES])
async def test_outcome_classification(sink: Sink, function_name: str, handler: Any,
                                      expected: tuple[str, str | None, int | None]) -> None:
    sink.handlers[function_name] = handler
    async with new_session(concurrency=4) as session:
        invoker = Invoker(session, url_template=sink.template, timeout_s=0.5, secret=None)
        outcome = await invoker.invoke(make_run(function_name=function_name))
    assert (outcome.status, outcome.error, outcome.http_status) == expected
    assert len(sink.calls) == 1  # no redirect followed, no retry
    assert outcome.duration_ms >= 0


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_connection_refused() -> None:
    port = _closed_port()
    async with new_session(concurrency=4) as session:
        invoker = Invoker(session, url_template=f"http://127.0.0.1:{port}/{{function_name}}", timeout_s=5,
                          secret=None)
        outcome = await invoker.invoke(make_run())
    assert outcome.status == "error" and outcome.http_status is None
    assert outcome.error == f"connection failed: 127.0.0.1:{port}: Connection refused (os error 111)"


@pytest.fixture
async def resetting_server() -> AsyncIterator[str]:
    """Answers 200 with a Content-Length of 1000, sends 7 bytes of it, then resets the connection."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
        writer.write(b'{"ok":')
        await writer.drain()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
        writer.transport.abort()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/{{function_name}}"
    server.close()
    await server.wait_closed()


async def test_reset_mid_response(resetting_server: str) -> None:
    async with new_session(concurrency=4) as session:
        invoker = Invoker(session, url_template=resetting_server, timeout_s=5, secret=None)
        outcome = await invoker.invoke(make_run())
    # the status line arrived, but the reset may reach the client before it hands the head over
    assert outcome.status == "error" and outcome.http_status in (200, None), outcome
    assert outcome.error is not None and outcome.error.startswith("connection lost: "), outcome


async def test_many_slow_invocations_stay_in_flight_together(sink: Sink) -> None:
    """300 slow invocations are all in flight at once: each answers only when all have arrived."""
    all_arrived = asyncio.Event()

    async def slow(request: web.Request, call: Call) -> web.StreamResponse:
        if len(sink.calls) == 300:
            all_arrived.set()
        await asyncio.wait_for(all_arrived.wait(), 8)
        return web.json_response({"ok": True})

    sink.handlers["slow"] = slow
    started = time.monotonic()
    async with new_session(concurrency=300) as session:
        invoker = Invoker(session, url_template=sink.template, timeout_s=10, secret=None)
        outcomes: list[Outcome] = await asyncio.gather(
            *(invoker.invoke(make_run(run_id=i, function_name="slow")) for i in range(300))
        )
    assert {outcome.status for outcome in outcomes} == {"ok"}
    assert time.monotonic() - started < 8
