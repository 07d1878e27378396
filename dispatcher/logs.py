"""Logs: one event per line with a stable `event` name and the record's fields, as JSON (for a log
shipper, the default off a terminal) or as text (for a person at a terminal).

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

__all__ = ["JsonFormatter", "TextFormatter", "configure_logging"]

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
        entry.update(_fields(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {key: value for key, value in vars(record).items() if key not in _STANDARD and key != "event"}


class TextFormatter(logging.Formatter):
    """Format a record as one line for a person: time, level, event, message, then key=value."""

    def format(self, record: logging.LogRecord) -> str:
        at = datetime.fromtimestamp(record.created).isoformat(sep=" ", timespec="milliseconds")
        fields = " ".join(f"{key}={json.dumps(value, default=str, ensure_ascii=False)}"
                          for key, value in _fields(record).items())
        line = (f"{at} {record.levelname.lower():<7} {getattr(record, 'event', 'log')}: {record.getMessage()}"
                + (f"  {fields}" if fields else ""))
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(level: str = "info", stream: IO[str] | None = None, *, log_format: str = "") -> None:
    """Send every log record to `stream` (default stderr), as text or JSON lines ("": text when the
    stream is a terminal, else JSON). Call once."""
    out = stream or sys.stderr
    if not log_format:
        log_format = "text" if out.isatty() else "json"
    handler = logging.StreamHandler(out)
    handler.setFormatter(TextFormatter() if log_format == "text" else JsonFormatter())
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Third-party chatter stays at warning unless debug is asked for.
    for name in ("psycopg", "aiohttp"):
        logging.getLogger(name).setLevel(logging.NOTSET if root.level <= logging.DEBUG else logging.WARNING)
