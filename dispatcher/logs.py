"""JSON logs: one object per line with a stable `event` name and the record's fields.

Modules log with `logging.getLogger(__name__)` and pass the event and its fields in `extra`::

    logger.info("claimed %d runs", n, extra={"event": "runs_claimed", "count": n})

`configure_logging` installs the formatter once, at the entry point.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import IO, Any

__all__ = ["JsonFormatter", "configure_logging"]

# Attributes every LogRecord has; anything else on a record came from `extra`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName"
}


class JsonFormatter(logging.Formatter):
    """Format a record as one JSON object: ts, level, logger, event, message, then its fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": getattr(record, "event", "log"),
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key != "event":
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure_logging(level: str = "info", stream: IO[str] | None = None) -> None:
    """Send every log record, as JSON lines, to `stream` (default stderr). Call once."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Third-party chatter stays at warning unless debug is asked for.
    for name in ("psycopg", "aiohttp"):
        logging.getLogger(name).setLevel(logging.NOTSET if root.level <= logging.DEBUG else logging.WARNING)
