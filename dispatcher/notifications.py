"""The LISTEN session: one autocommit connection outside the pool, doing LISTEN dispatch (and
dispatch_events, for the event delivery).

A notification is only a wake-up (the listener re-reads the tables, and sweeps on a timer), so
what matters is noticing when the session is gone. An idle session on a path that died silently
raises nothing, so every PROBE_INTERVAL_S without a notification the session is probed under a
deadline; a failed probe, like any other failure, replaces the session. After every
(re)connection `on_connected` runs: a NOTIFY sent while the session was away is gone, so the
caller sweeps.

The first connection also checks the schema. A configuration error (wrong password, no such
database or role, the schema missing or too old) is raised as DatabaseMisconfigured, at start
as later; everything else is retried with capped exponential backoff and jitter.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg

from dispatcher.backoff import Backoff
from dispatcher.database import CALL_TIMEOUT_S, DatabaseUnavailable, check_schema, connect

__all__ = ["CHANNEL", "EVENTS_CHANNEL", "PROBE_INTERVAL_S", "PROBE_TIMEOUT_S", "Notifications"]

logger = logging.getLogger(__name__)

CHANNEL = "dispatch"
EVENTS_CHANNEL = "dispatch_events"  # failures and breakers: wakes the event delivery
# With no notification for this long, probe the session; a probe gets this long to answer.
PROBE_INTERVAL_S = 5.0
PROBE_TIMEOUT_S = 3.0
# Reconnecting: soon after a restart (about 1 to 5 s), and then at least every 2 s.
RECONNECT_BACKOFF = {"initial_s": 0.25, "factor": 1.5, "max_s": 2.0}


class Notifications:
    """Keeps a LISTEN session up and hands each notification's payload to `on_notify`."""

    def __init__(self, conninfo: str, *, application_name: str, on_notify: Callable[[str], None],
                 on_connected: Callable[[], None], on_reconnected: Callable[[], None] = lambda: None,
                 on_event: Callable[[], None] = lambda: None,
                 probe_interval_s: float = PROBE_INTERVAL_S) -> None:
        self._conninfo = conninfo
        self._application_name = application_name
        self._on_notify = on_notify
        self._on_connected = on_connected
        self._on_reconnected = on_reconnected
        self._on_event = on_event
        self._probe_interval_s = probe_interval_s
        self.listening = False
        self.schema_checked = False
        self.ever_listened = False  # the database accepted this listener at least once

    async def run(self) -> None:
        """Listen until cancelled; raises DatabaseMisconfigured when waiting will not help."""
        backoff = Backoff(**RECONNECT_BACKOFF)
        lost = False
        while True:
            try:
                await self._session(backoff, lost)
            except (DatabaseUnavailable, psycopg.OperationalError, psycopg.InterfaceError) as exc:
                reason = " ".join(str(exc).split()) or type(exc).__name__
                if self.listening or not lost:
                    logger.warning("lost the LISTEN connection: %s", reason,
                                   extra={"event": "database_connection_lost", "reason": reason})
                self.listening = False
                lost = True
                delay = backoff.next_delay()
                logger.warning("reconnecting in %.1f s", delay,
                               extra={"event": "database_reconnecting", "attempt": backoff.failures,
                                      "retry_in_s": round(delay, 3), "reason": reason})
                await asyncio.sleep(delay)

    async def _session(self, backoff: Backoff, lost: bool) -> None:
        conn = await connect(self._conninfo, application_name=self._application_name)
        try:
            if not self.schema_checked:
                await check_schema(conn)
                self.schema_checked = True
            async with asyncio.timeout(CALL_TIMEOUT_S):
                await conn.execute(f"LISTEN {EVENTS_CHANNEL}")
                await conn.execute(f"LISTEN {CHANNEL}")
            if lost:
                self._on_reconnected()
                logger.info("database connection is back",
                            extra={"event": "database_reconnected", "attempts": backoff.failures})
            backoff.reset()
            logger.info("listening on channel %s", CHANNEL, extra={"event": "listening", "channel": CHANNEL})
            self.listening = self.ever_listened = True
            self._on_connected()
            while True:
                async for notify in conn.notifies(timeout=self._probe_interval_s):
                    if notify.channel == EVENTS_CHANNEL:
                        self._on_event()
                    else:
                        self._on_notify(notify.payload)
                # Quiet for a while: is anyone still there? The probe is LISTEN again (a no-op):
                # others know this session as listening by its last statement (dispatch.listeners).
                async with asyncio.timeout(PROBE_TIMEOUT_S):
                    await conn.execute(f"LISTEN {CHANNEL}")
        except TimeoutError:
            raise DatabaseUnavailable(f"no answer on the LISTEN session within {PROBE_TIMEOUT_S:g} s"
                                      ) from None
        finally:
            self.listening = False
            await conn.close()  # no round trip: a session on a dead path closes at once too
