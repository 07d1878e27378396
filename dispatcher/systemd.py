"""systemd's notify protocol (sd_notify(3)) without libsystemd: one datagram per message to the
unix socket $NOTIFY_SOCKET names (a path, or `@name` for the abstract namespace).

The listener says READY=1 once LISTEN is active, STATUS=… as things change, WATCHDOG=1 every half
of $WATCHDOG_USEC while its event loop is healthy, and STOPPING=1 when it shuts down. While it
waits for the database at start, it extends the start timeout (EXTEND_TIMEOUT_USEC=…) again and
again, so that systemd's TimeoutStartSec bounds a listener that hangs, not a database outage. Outside
systemd (no $NOTIFY_SOCKET) every call does nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping

__all__ = ["Notifier"]

logger = logging.getLogger(__name__)

# The watchdog ping is skipped when the event loop woke this much later than asked (in shares of
# the ping interval): a loop that lags that much is not healthy, and systemd should notice.
MAX_LAG_SHARE = 0.5


class Notifier:
    """Sends notify messages to systemd when it asked for them."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self._address: str | bytes | None = None
        if address.startswith("@"):
            self._address = b"\0" + address[1:].encode()
        elif address.startswith("/"):
            self._address = address
        self._socket: socket.socket | None = None
        self._failed = False
        self.watchdog_interval_s: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_interval_s = int(usec) / 1_000_000 / 2

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, *fields: str) -> bool:
        """Send `fields` (e.g. "READY=1", "STATUS=…") as one message; True if it was sent."""
        if self._address is None:
            return False
        message = "\n".join(field.replace("\n", " ") for field in fields).encode()
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._socket.setblocking(False)
            self._socket.sendto(message, self._address)
        except OSError as exc:
            if not self._failed:  # say it once, not every watchdog interval
                self._failed = True
                logger.warning("cannot notify systemd: %s", exc,
                               extra={"event": "systemd_notify_failed", "reason": str(exc)})
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.notify("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def status(self, status: str) -> bool:
        return self.notify(f"STATUS={status}")

    def extend_timeout(self, seconds: float, status: str) -> bool:
        """Ask for `seconds` more of the current timeout (the start timeout, before READY=1)."""
        return self.notify(f"EXTEND_TIMEOUT_USEC={round(seconds * 1_000_000)}", f"STATUS={status}")

    def stopping(self, status: str = "stopping") -> bool:
        return self.notify("STOPPING=1", f"STATUS={status}")

    async def watchdog(self, healthy: Callable[[], bool] = lambda: True) -> None:
        """Ping every half of WATCHDOG_USEC while the loop keeps time and `healthy()` holds.
        Returns at once when systemd asked for no watchdog; cancel it to stop."""
        interval = self.watchdog_interval_s
        if interval is None or not self.enabled:
            return
        lag_limit = interval * MAX_LAG_SHARE
        while True:
            asked = time.monotonic()
            await asyncio.sleep(interval)
            lag = time.monotonic() - asked - interval
            if lag > lag_limit:
                logger.warning("event loop %.2f s late: watchdog ping skipped", lag,
                               extra={"event": "watchdog_skipped", "lag_s": round(lag, 3)})
            elif healthy():
                self.notify("WATCHDOG=1")

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
