"""Event webhooks: POST each event waiting in dispatch.event_deliveries to its project's
events_url, signed like an invocation, and record the outcome (the database retries a failure
with back-off and gives up after its last attempt).

Apart from dispatch: its own HTTP session and connection limit, its own short timeout, one
batch at a time. A receiver that fails, hangs or answers slowly delays only other events.
Woken by a notification on dispatch_events; otherwise it looks again when the next delivery is
due, and at least every IDLE_S.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import aiohttp

from dispatcher.backoff import Backoff
from dispatcher.database import Database, DatabaseUnavailable
from dispatcher.invoke import USER_AGENT
from dispatcher.metrics import Metrics
from dispatcher.signing import SIGNATURE_HEADER, sign

__all__ = ["EventDelivery"]

logger = logging.getLogger(__name__)

BATCH = 16  # deliveries claimed at once
CONNECTIONS = 4  # at most this many POSTs at once
TIMEOUT_S = 10.0  # a POST's whole time
LEASE_S = TIMEOUT_S + 20.0  # a claimed delivery goes to no other listener for this long
IDLE_S = 30.0  # the longest wait between two looks at the queue
_ERROR_CHARS = 200


class EventDelivery:
    """Delivers the events of dispatch.event_deliveries, for as long as the listener runs."""

    def __init__(self, db: Database, metrics: Metrics, *, secret: bytes | None = None,
                 second_secret: bytes | None = None) -> None:
        self._db = db
        self._metrics = metrics
        self._secrets = tuple(key for key in (secret, second_secret) if key is not None) if secret else ()
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """An event was sent: there may be a delivery to make."""
        self._wake.set()

    async def run(self) -> None:
        backoff = Backoff(max_s=IDLE_S)
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        connector = aiohttp.TCPConnector(limit=CONNECTIONS)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            while True:
                self._wake.clear()
                try:
                    delivered = await self._batch(http)
                    wait_s = 0.0 if delivered else await self._db.next_event_delivery_in()
                    backoff.reset()
                except DatabaseUnavailable as exc:
                    wait_s = backoff.next_delay()
                    logger.warning("event deliveries: %s; trying again in %.1f s", exc, wait_s,
                                   extra={"event": "event_delivery_claim_failed", "reason": str(exc),
                                          "retry_in_s": round(wait_s, 3)})
                if wait_s is None or wait_s > IDLE_S:
                    wait_s = IDLE_S
                if wait_s > 0:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wait_s):
                            await self._wake.wait()

    async def _batch(self, http: aiohttp.ClientSession) -> int:
        """Claim what is due, POST it, record the outcomes; how many were claimed."""
        claimed = await self._db.claim_event_deliveries(BATCH, LEASE_S)
        if not claimed:
            return 0
        errors = await asyncio.gather(*(self._post(http, d["url"], d["payload"]) for d in claimed))
        await self._db.finish_event_deliveries(
            [(d["delivery_id"], d["attempt"], error) for d, error in zip(claimed, errors, strict=True)])
        for d, error in zip(claimed, errors, strict=True):
            outcome = "delivered" if error is None else "failed"
            self._metrics.event_delivered(outcome)
            fields = {"delivery_id": d["delivery_id"], "attempt": d["attempt"], "url": d["url"],
                      "error": error}
            if error is None:
                logger.debug("event delivery %s delivered", d["delivery_id"],
                             extra={"event": "event_delivered", **fields})
            else:
                logger.warning("event delivery %s failed (attempt %s): %s", d["delivery_id"], d["attempt"],
                               error, extra={"event": "event_delivery_failed", **fields})
        return len(claimed)

    async def _post(self, http: aiohttp.ClientSession, url: str, payload: str) -> str | None:
        """POST one event; None when the receiver answered 2xx, else why not."""
        body = payload.encode()
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
        if self._secrets:
            headers[SIGNATURE_HEADER] = sign(self._secrets[0], body, int(time.time()), *self._secrets[1:])
        try:
            async with http.post(url, data=body, headers=headers, allow_redirects=False) as response:
                if 200 <= response.status < 300:
                    return None
                excerpt = (await response.content.read(_ERROR_CHARS)).decode("utf-8", errors="replace")
                return f"HTTP {response.status}: {' '.join(excerpt.split())}"[:500]
        except TimeoutError:
            return f"timed out after {TIMEOUT_S:g} s"
        except aiohttp.ClientError as exc:
            return f"{type(exc).__name__}: {exc}"[:500]
