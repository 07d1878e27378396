"""Durations as people write them on a command line: `30s`, `5m`, `1h30m`, `1.5h`, `250ms`,
`2 seconds`, `10 minutes`, `1 day`, or PostgreSQL's `00:05:00`.

The database stores intervals; this only turns the text into a timedelta (so that a typo is
refused by argparse with exit status 2 before anything connects) and back into the short form.
"""

from __future__ import annotations

import argparse
import re
from datetime import timedelta

__all__ = ["format_duration", "parse_duration"]

_UNITS = {
    "ms": 0.001, "msec": 0.001, "millisecond": 0.001, "milliseconds": 0.001,
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
    "w": 604800, "week": 604800, "weeks": 604800,
}
_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*")
_CLOCK = re.compile(r"^(\d+):([0-5]\d):([0-5]\d(?:\.\d+)?)$")


def parse_duration(text: str) -> timedelta:
    """`text` as a timedelta; argparse.ArgumentTypeError (a usage error) when it is not one."""
    value = text.strip().lower()
    clock = _CLOCK.match(value)
    if clock:
        hours, minutes, seconds = clock.groups()
        return timedelta(hours=int(hours), minutes=int(minutes), seconds=float(seconds))
    if value == "0":
        return timedelta(0)
    total = 0.0
    position = 0
    while position < len(value):
        part = _PART.match(value, position)
        if part is None or part.group(2) not in _UNITS:
            break
        total += float(part.group(1)) * _UNITS[part.group(2)]
        position = part.end()
    if position == 0 or position < len(value):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: write it like 30s, 5m, 1h30m, 250ms or '2 minutes'")
    return timedelta(seconds=total)


def format_duration(value: timedelta) -> str:
    """The short form: 30s, 5m, 1h30m, 1d, 1.5s; 0s for nothing."""
    micros = round(value.total_seconds() * 1_000_000)
    if micros == 0:
        return "0s"
    sign, micros = ("-", -micros) if micros < 0 else ("", micros)
    seconds, fraction = divmod(micros, 1_000_000)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    if seconds or fraction:
        parts.append(f"{seconds}.{fraction:06d}".rstrip("0").rstrip(".") + "s")
    return sign + "".join(parts)
