"""pgdispatch: a cron-schedule dispatcher that lives in PostgreSQL.

The SQL in sql/ is the source of truth; this package is the listener that calls functions and
the command that operates it. The runtime (what `pgdispatch listen` runs) is flat:

listener      the listener: starts the parts below, waits for the database, shuts down on a signal
clock         ticks dispatch.tick() when a slot comes due, and sweeps every interval
notifications the LISTEN session: wakes the claimer, re-plans the clock, notices a dead connection
dispatching   claims runs (dispatch.claim_runs) within the budget and invokes each
budget        how many runs may be claimed now: free invocation slots, prefetch
invoke        the HTTP request of a run (body, headers, signature) and what its answer means
signing       X-Dispatch-Signature: sign, verify
tracing       the traceparent header of an attempt, as dispatch.traceparent computes it
completion    hands outcomes to dispatch.complete_runs in batches, retries a failed hand-over
event_delivery POSTs the events of dispatch.event_deliveries to the projects' events_url
database      the connection pool, bounded calls, the schema version check
runs          a claimed run and its outcome
config        settings from flags, environment and systemd credentials
logs          one event per line, JSON or text
event_loop    uvloop when installed, else asyncio's (--event-loop)
metrics       Prometheus metrics and their HTTP server
systemd       sd_notify: READY, STATUS, WATCHDOG, STOPPING
supervisor    the listener's tasks: one that dies stops the listener (exit 1)
backoff       exponential back-off with jitter
migrations    applies sql/ (migrations once, code every time), as sql/install.sql does

The operator commands (`pgdispatch install`, `doctor`, `schedules`, `runs`, `demo`) live in
dispatcher/cli/, whose docstring maps them.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("pgdispatch")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"

__all__ = ["__version__"]
