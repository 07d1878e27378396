"""pgdispatch: a cron-schedule dispatcher that lives in PostgreSQL."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("pgdispatch")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"

__all__ = ["__version__"]
