"""docs/functions.md, run: its Python and Node verification snippets against requests the
listener signed (one secret, and two during a rotation), a Node function that uses its snippet
called by a real listener, and every body checked against docs/invocation.schema.json."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import psycopg
import pytest

from dispatcher.invoke import build_request
from dispatcher.runs import Run
from dispatcher.signing import SIGNATURE_HEADER, verify_signature

from .kit import YEARLY, Running, Sink, scalar, until

DOCS = Path(__file__).resolve().parents[2] / "docs"
StartListener = Callable[..., Awaitable[Running]]
NEW, OLD, OTHER = b"4f9c0d5e8a1b", b"e3b0c44298fc", b"not-the-secret"


def snippet(language: str) -> str:
    """The fenced block of docs/functions.md whose info string is `<language> verify`."""
    [code] = re.findall(rf"^```{language} verify\n(.*?)^```", (DOCS / "functions.md").read_text(),
                        re.MULTILINE | re.DOTALL)
    return str(code)


def signed(*secrets: bytes, now: float = 1_790_000_000) -> tuple[bytes, str]:
    """A body and its signature header, made by the listener's own code."""
    run = Run(run_id=42, schedule_id="7f0c7d5e-4a55-4c39-9c4e-0d8f3a7e5b11", project_id="acme",
              function_name="report", args_json='{"to": "ops", "naïve": "✓"}', request_id="sched_x",
              scheduled_for=datetime(2026, 12, 1, 1, 30, tzinfo=UTC), attempt=1,
              lease_until=datetime(2026, 12, 1, 1, 31, tzinfo=UTC), lease_deadline=0.0)
    request = build_request(run, url_template="http://f/{project_id}/{function_name}", secret=secrets[0],
                            second_secret=secrets[1] if len(secrets) > 1 else None, now=now)
    return request.body, request.headers[SIGNATURE_HEADER]


def cases() -> list[tuple[bytes, bytes, str, float, bool]]:
    """(secret, body, header, now, expected) for both snippets."""
    body, one = signed(NEW)
    _, two = signed(NEW, OLD)
    assert one.count("v1=") == 1 and two.count("v1=") == 2
    now = 1_790_000_010
    return [
        (NEW, body, one, now, True),
        (OLD, body, one, now, False),
        (NEW, body, two, now, True),  # a rotation: either secret verifies
        (OLD, body, two, now, True),
        (OTHER, body, two, now, False),
        (NEW, body + b" ", one, now, False),  # the body changed
        (NEW, body.replace(b'"attempt":1', b'"attempt":2'), one, now, False),
        (NEW, body, one, now + 301, False),  # too old: a replay
        (NEW, body, one, now - 320, False),  # from the future
        (NEW, body, "", now, False),
        (NEW, body, "t=1790000000", now, False),
        (NEW, body, "v1=" + one.split("v1=")[1], now, False),
        (NEW, body, one.replace("t=", "t=x"), now, False),
    ]


def test_the_python_snippet_verifies_what_the_listener_signs() -> None:
    namespace: dict[str, Any] = {}
    exec(compile(snippet("python"), "docs/functions.md", "exec"), namespace)  # noqa: S102
    verify = namespace["verify_signature"]
    for secret, body, header, now, expected in cases():
        assert verify(secret, body, header, now=now) is expected, (secret, header)


def test_the_demo_functions_verifier_agrees() -> None:
    """dispatcher.signing.verify_signature, which `pgdispatch demo-function` runs."""
    for secret, body, header, now, expected in cases():
        assert verify_signature(secret, body, header, now=now) is expected, (secret, header)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_node_snippet_verifies_what_the_listener_signs(tmp_path: Path) -> None:
    (tmp_path / "verify.js").write_text(snippet("js"))
    (tmp_path / "check.js").write_text("""
const { verifySignature } = require("./verify.js");
const cases = JSON.parse(require("node:fs").readFileSync(0, "utf8"));
console.log(JSON.stringify(cases.map(([secret, body, header, now]) =>
  verifySignature(Buffer.from(secret, "base64"), Buffer.from(body, "base64"), header, 300, now))));
""")
    all_cases = cases()
    given = [[base64.b64encode(secret).decode(), base64.b64encode(body).decode(), header, now]
             for secret, body, header, now, _ in all_cases]
    done = subprocess.run(["node", str(tmp_path / "check.js")], input=json.dumps(given), capture_output=True,
                          text=True, check=True)
    assert json.loads(done.stdout) == [expected for *_, expected in all_cases]


NODE_FUNCTION = """
const http = require("node:http");
const { verifySignature } = require("./verify.js");
const secrets = { report: process.env.SECRET, "wrong-secret": "not-the-secret" };
http.createServer((request, response) => {
  const chunks = [];
  request.on("data", (chunk) => chunks.push(chunk));
  request.on("end", () => {
    const fn = decodeURIComponent(request.url.split("/").pop());
    const ok = verifySignature(Buffer.from(secrets[fn], "utf8"), Buffer.concat(chunks),
                               request.headers["x-dispatch-signature"]);
    response.writeHead(ok ? 200 : 401, { "Content-Type": "application/json" });
    const failed = { ok: false, error: { code: "signature", message: "does not verify" } };
    response.end(JSON.stringify(ok ? { ok: true } : failed));
  });
}).listen(0, "127.0.0.1", function () { console.log(this.address().port); });
"""


@pytest.fixture
async def node_function(tmp_path: Path) -> AsyncIterator[str]:
    """A function written in Node with the snippet, verifying with OLD: its invoke URL template."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    (tmp_path / "verify.js").write_text(snippet("js"))
    (tmp_path / "server.js").write_text(NODE_FUNCTION)
    proc = await asyncio.create_subprocess_exec("node", str(tmp_path / "server.js"), cwd=tmp_path,
                                                env={"SECRET": OLD.decode()}, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    port = int(await asyncio.wait_for(proc.stdout.readline(), 10))
    yield f"http://127.0.0.1:{port}/projects/{{project_id}}/functions/{{function_name}}"
    proc.terminate()
    await proc.wait()


async def test_a_node_function_verifies_a_real_listener_during_a_rotation(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], node_function: str,
    start_listener: StartListener,
) -> None:
    ids = {name: db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
                            " VALUES ('acme', %s, %s) RETURNING id", (name, YEARLY)).fetchone()[0]  # type: ignore[index]
           for name in ("report", "wrong-secret")}
    # signing with the new secret and the old one; the function knows only the old one
    await start_listener(invoke_url=node_function, signing_secret=NEW, second_signing_secret=OLD)
    for sid in ids.values():
        db.execute("SELECT dispatch.run_now(%s)", (sid,))
    finished = "SELECT count(*) = 2 FROM dispatch.runs WHERE status IN ('ok', 'error')"
    await until(lambda: scalar(adb, finished), within=10, what="both runs finished")
    outcomes = db.execute("SELECT s.function_name, r.status, r.http_status, r.error FROM dispatch.runs r"
                          " JOIN dispatch.schedules s ON s.id = r.schedule_id ORDER BY 1").fetchall()
    assert outcomes == [("report", "ok", 200, None),
                        ("wrong-secret", "error", 401, "signature: does not verify")]


async def test_every_body_matches_the_published_schema(
    db: psycopg.Connection, adb: psycopg.AsyncConnection[Any], sink: Sink, start_listener: StartListener
) -> None:
    schema = json.loads((DOCS / "invocation.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    await start_listener()
    sid = db.execute("INSERT INTO dispatch.schedules (project_id, function_name, every, jitter, args)"
                     " VALUES ('acme', 'fn', '1 second', '0.5 seconds', %s) RETURNING id",
                     (json.dumps({"nested": {"list": [1, 2.5, None, "ü"]}, "empty": {}}),)).fetchone()[0]  # type: ignore[index]
    db.execute("SELECT dispatch.run_now(%s)", (sid,))
    await until(lambda: len(sink.calls) >= 4, within=10, what="a manual run and three slots")
    for call in sink.calls:
        validator.validate(call.json)
    jittered = {c.json["invoker"]["fireAt"] != c.json["invoker"]["scheduledFor"] for c in sink.calls}
    assert jittered == {False, True}  # the manual run fires at its instant, the slots later
