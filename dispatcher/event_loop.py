"""Which event loop runs the listener: uvloop when it is installed (a dependency of the package
where uvloop supports the platform: CPython, not on Windows), asyncio's own otherwise, or the one
--event-loop names.

The listener is correct on either loop. On the dispatch benchmark uvloop's is the faster
(docs/benchmarks.md has the figures).
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable

from dispatcher.config import ConfigError

__all__ = ["loop_factory", "running_loop_name"]


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory for asyncio.Runner: uvloop's for "uvloop", and for "auto" when it is installed;
    None (asyncio's default) otherwise. ConfigError when "uvloop" is asked for and missing."""
    if choice == "asyncio":
        return None
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        if choice == "uvloop":
            raise ConfigError("--event-loop / PGDISPATCH_EVENT_LOOP is uvloop, which is not installed: "
                              "pip install uvloop (where it supports the platform), or use auto or "
                              "asyncio") from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def running_loop_name() -> str:
    """"uvloop" or "asyncio": what the running loop is (for the listener_started event)."""
    return type(asyncio.get_running_loop()).__module__.split(".")[0]
