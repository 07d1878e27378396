"""One HTTP POST per run, and the outcome it is recorded as.

Outcome classification (what dispatch.complete_run records):

==============================================  ======  =========================================  =========
response                                        status  error                                      retryable
==============================================  ======  =========================================  =========
2xx (any body, including none or invalid JSON)  ok      —                                          —
2xx with a JSON object whose "ok" is false      error   ``code: message`` from the body            no
5xx, 408, 429                                   error   ``code: message`` or ``HTTP <status>: …``  yes
other status, JSON body with code / message     error   ``code: message``                          no
other status (3xx included: no redirects)       error   ``HTTP <status>: <first 200 chars>``       no
no complete response within the timeout         error   ``timeout: no complete response within N s``  yes
connection refused, DNS, TLS                    error   ``connection failed: <host>:<port>: …``    yes
connection reset or closed mid-response         error   ``connection lost: <reason>``              yes
a response that is not HTTP                     error   ``invalid response: <reason>``             no
==============================================  ======  =========================================  =========

A 2xx whose body is not JSON is ``ok``: the status is the function's answer, and only a
well-formed JSON object can say otherwise. At most 64 KiB of a body is read, counted after
decompression: the listener asks for no compression (``Accept-Encoding: identity``) and inflates
a gzip or deflate answer itself, only up to that cap, so a compression bomb costs 64 KiB; a body
in another encoding is not read (its excerpt is the raw bytes). A retryable answer
may carry ``Retry-After`` (seconds or an HTTP date): the retry waits that long, capped by the
schedule's ``retry_backoff_max``. Whether a retryable failure is retried is the database's call
(attempts left, the next slot): see dispatch.complete_runs.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import json
import re
import time
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, urlsplit

from pyreqwest import exceptions as http_errors
from pyreqwest.client import Client, ClientBuilder
from pyreqwest.response import Response

from dispatcher import __version__
from dispatcher.runs import Outcome, Run
from dispatcher.signing import SIGNATURE_HEADER, sign

__all__ = [
    "MAX_BODY_BYTES",
    "Invoker",
    "Request",
    "build_request",
    "classify_response",
    "new_session",
    "parse_retry_after",
    "retryable_status",
    "storable_text",
]

MAX_BODY_BYTES = 64 * 1024
# Deflate never makes a body much larger than it was (stored blocks add 5 bytes in 64 KiB):
# more compressed bytes than this, and the answer is no longer one that inflates under the cap.
MAX_COMPRESSED_BYTES = 2 * MAX_BODY_BYTES
EXCERPT_CHARS = 200
USER_AGENT = f"pgdispatch/{__version__}"
_SPACES = re.compile(r"\s+")
_SURROGATE = re.compile("[\ud800-\udfff]")  # only lone ones survive decoding: a pair is one character


@dataclass(frozen=True, slots=True)
class Request:
    url: str
    body: bytes
    headers: dict[str, str]


# Runs due together share their slot, and a listener calls a few functions many times: both
# are formatted once rather than once per request.
@functools.lru_cache(maxsize=1024)
def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@functools.lru_cache(maxsize=4096)
def _url(url_template: str, project_id: str, function_name: str) -> str:
    # Each name one percent-encoded segment. A segment "." or ".." would be resolved away when
    # the URL is parsed, in whatever encoding: the write path refuses both (30_schedules.sql).
    return url_template.format(project_id=quote(project_id, safe=""),
                               function_name=quote(function_name, safe=""))


def build_request(run: Run, *, url_template: str, secret: bytes | None, now: float | None = None,
                  second_secret: bytes | None = None) -> Request:
    """The POST for `run`: URL from the template, JSON body, idempotency and signature headers
    (signed with `secret`, and `second_secret` too during a key rotation)."""
    # Written out rather than encoded from a dict: the args are JSON from the database already,
    # and every other value is a number or a string of characters that need no escaping
    # (a uuid, ISO 8601 instants).
    body = (
        f'{{"args":{run.args_json},"invoker":{{"kind":"schedule","scheduleId":"{run.schedule_id}",'
        f'"runId":{run.run_id:d},"scheduledFor":"{_iso(run.scheduled_for)}",'
        f'"fireAt":"{_iso(run.fire_at or run.scheduled_for)}","attempt":{run.attempt:d}}}}}'
    ).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "Accept-Encoding": "identity",
        "X-Request-Id": run.request_id,
        "Idempotency-Key": run.request_id,
    }
    if run.traceparent is not None:
        headers["traceparent"] = run.traceparent
    if secret is not None:
        more = () if second_secret is None else (second_secret,)
        headers[SIGNATURE_HEADER] = sign(secret, body, int(time.time() if now is None else now), *more)
    return Request(_url(url_template, run.project_id, run.function_name), body, headers)


def _excerpt(body: bytes) -> str:
    return _SPACES.sub(" ", body.decode("utf-8", errors="replace")).strip()[:EXCERPT_CHARS]


def _json_error(body: bytes) -> str | None:
    """`code: message` when the body is a JSON object that carries them, else None."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("error"), dict) and "code" not in data and "message" not in data:
        data = data["error"]
    parts = [str(data[key]) for key in ("code", "message") if data.get(key) not in (None, "")]
    return ": ".join(parts) or None


def classify_response(status: int, body: bytes, *, truncated: bool = False) -> tuple[str, str | None]:
    """(status, error) for an HTTP answer; see the module's table."""
    if 200 <= status < 300:
        # Only a JSON object holding the literal false can say otherwise: most answers skip parsing.
        if body[:1] == b"{" and not truncated and b"false" in body:
            try:
                data = json.loads(body)
            except ValueError:
                return "ok", None
            if isinstance(data, dict) and data.get("ok") is False:
                return "error", _json_error(body) or f"HTTP {status}: the function answered ok: false"
        return "ok", None
    error = None if truncated else _json_error(body)
    if error is None:
        excerpt = _excerpt(body)
        error = f"HTTP {status}: {excerpt}" if excerpt else f"HTTP {status} with an empty body"
    return "error", error


def retryable_status(status: int) -> bool:
    """An HTTP status that says "not now" rather than "no": another attempt may succeed."""
    return status >= 500 or status in (408, 429)


def parse_retry_after(value: str | None, *, now: float | None = None) -> int | None:
    """Milliseconds to wait from a Retry-After header (delay-seconds or an HTTP-date), or None
    when there is none or it cannot be read."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(int(value), 86_400) * 1000
    try:
        at = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    seconds = at.timestamp() - (time.time() if now is None else now)
    return max(0, min(round(seconds * 1000), 86_400_000))


def new_session(*, concurrency: int) -> Client:
    """The one HTTP client of a listener: keep-alive connections, as many requests in flight as
    invocations. No redirects, no proxy from the environment, and no decompression of its own
    (_read_capped inflates, capped)."""
    return (ClientBuilder()
            .max_connections(concurrency)
            .gzip(False).brotli(False).zstd(False).deflate(False)
            .follow_redirects(False)
            .no_proxy()
            .error_for_status(False)
            .user_agent(USER_AGENT)
            .build())


class Invoker:
    """POSTs runs with a shared session and turns whatever happens into an Outcome; never raises
    (except CancelledError)."""

    def __init__(
        self, session: Client, *, url_template: str, timeout_s: float, secret: bytes | None,
        second_secret: bytes | None = None,
    ) -> None:
        self._session = session
        self._url_template = url_template
        self._timeout_s = timeout_s
        self._secret = secret
        self._second_secret = second_secret

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def _timeout(seconds: float) -> timedelta:
        return timedelta(seconds=seconds)

    async def invoke(self, run: Run) -> Outcome:
        started = time.monotonic()
        outcome = await self._call(run, run.timeout_s or self._timeout_s)
        duration_ms = round((time.monotonic() - started) * 1000)
        error = outcome.error
        if error is not None:
            error = storable_text(error)
            if len(error) > 500:
                error = error[:497] + "..."
        return Outcome(status=outcome.status, error=error, http_status=outcome.http_status,
                       duration_ms=duration_ms, retryable=outcome.retryable,
                       retry_after_ms=outcome.retry_after_ms)

    async def _call(self, run: Run, timeout_s: float) -> Outcome:
        http_status: int | None = None
        try:
            request = build_request(run, url_template=self._url_template, secret=self._secret,
                                    second_secret=self._second_secret)
            # the timeout covers the whole exchange, the body's last byte included
            async with (self._session.post(request.url).headers(request.headers).body_bytes(request.body)
                        .timeout(self._timeout(timeout_s)).build_streamed()) as response:
                http_status = response.status
                body, truncated = await _read_capped(response)
            status, error = classify_response(http_status, body, truncated=truncated)
            if status == "ok":
                return Outcome(status="ok", http_status=http_status)
            if not retryable_status(http_status):
                return Outcome(status="error", error=error, http_status=http_status)
            return Outcome(status="error", error=error, http_status=http_status, retryable=True,
                           retry_after_ms=parse_retry_after(response.get_header("Retry-After")))
        except TimeoutError:
            return _failed(f"timeout: no complete response within {timeout_s:g} s", http_status,
                           retryable=True)
        except http_errors.ConnectError as exc:
            return _failed(f"connection failed: {_host(request.url)}: {_reason(exc)}", None, retryable=True)
        except (http_errors.BodyDecodeError, http_errors.NetworkError) as exc:
            return _failed(f"connection lost: {_reason(exc)}", http_status, retryable=True)
        except http_errors.DecodeError as exc:
            return _failed(f"invalid response: {_reason(exc)}", http_status)
        except (http_errors.PyreqwestError, ValueError, OSError) as exc:
            return _failed(f"request failed: {_reason(exc)}", http_status)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a function must never crash the listener
            return _failed(f"request failed: {_describe(exc)}", http_status)


def storable_text(text: str) -> str:
    """`text` as PostgreSQL text can hold it. A function's answer is not to be trusted to be text:
    a JSON string may carry a lone surrogate (``"\\ud800"`` is valid JSON, and json.loads keeps
    it), which cannot be encoded as UTF-8, and psycopg refuses the whole statement (a batch of
    outcomes) for it. NUL, which PostgreSQL text cannot hold, is dropped; a lone surrogate
    becomes U+FFFD."""
    return _SURROGATE.sub("\ufffd", text.replace("\x00", ""))


def _failed(error: str, http_status: int | None, *, retryable: bool = False) -> Outcome:
    return Outcome(status="error", error=error, http_status=http_status, retryable=retryable)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _host(url: str) -> str:
    """Where a request went: host and port, never a user name or password in the URL."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


def _reason(exc: BaseException) -> str:
    """The innermost cause the HTTP client gives ("Connection refused (os error 111)", "invalid
    HTTP version parsed"), else the exception itself."""
    if isinstance(exc, http_errors.DetailedPyreqwestError):
        causes = exc.details.get("causes") or []
        if causes and causes[-1].get("message"):
            return causes[-1]["message"]
    return _describe(exc)


async def _read_capped(response: Response) -> tuple[bytes, bool]:
    """At most MAX_BODY_BYTES of the body (decompressed), and whether there was more."""
    encoding = (response.get_header("Content-Encoding") or "").strip().lower()
    if encoding in ("", "identity"):
        length = response.get_header("Content-Length")
        if length is not None and length.isdigit() and int(length) <= MAX_BODY_BYTES:
            return bytes(await response.body_reader.bytes()), False  # the common case: small, known length
        return await _read_raw(response, MAX_BODY_BYTES)
    if encoding in ("gzip", "x-gzip", "deflate"):
        return await _inflate_capped(response)
    raw, _ = await _read_raw(response, MAX_BODY_BYTES)
    return raw, True  # an encoding this listener does not read: never parsed as the answer


async def _read_raw(response: Response, limit: int) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    reader = response.body_reader
    while (chunk := await reader.read_chunk()) is not None:
        chunks.append(bytes(chunk))
        size += len(chunk)
        if size > limit:
            return b"".join(chunks)[:limit], True
    return b"".join(chunks), False


async def _inflate_capped(response: Response) -> tuple[bytes, bool]:
    """A gzip or zlib-wrapped deflate body, inflated up to MAX_BODY_BYTES + 1 bytes and no further
    (zlib's max_length keeps the rest of the input unread). The compressed bytes are capped too,
    and nothing is read after the compressed stream ends: zlib keeps whatever follows it
    (unused_data), and a stream of empty blocks inflates to nothing however long it runs."""
    inflater = zlib.decompressobj(32 + zlib.MAX_WBITS)  # 32: a gzip or a zlib header, either
    out = bytearray()
    read = 0
    reader = response.body_reader
    try:
        while (chunk := await reader.read_chunk()) is not None:
            read += len(chunk)
            data = bytes(chunk)
            while data and len(out) <= MAX_BODY_BYTES and not inflater.eof:
                out += inflater.decompress(data, MAX_BODY_BYTES + 1 - len(out))
                data = inflater.unconsumed_tail
            if len(out) > MAX_BODY_BYTES:
                return bytes(out[:MAX_BODY_BYTES]), True
            if inflater.eof:
                return bytes(out), False  # the answer is whole; what may follow it is not read
            if read > MAX_COMPRESSED_BYTES:
                return bytes(out), True
    except zlib.error:
        return bytes(out), True  # not what it claims to be: what inflated is an excerpt, no more
    return bytes(out), False
