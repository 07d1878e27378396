"""The listener's calls into the dispatch schema, over a psycopg_pool connection pool.

Every connection, pooled or not, detects a silently dead path (no FIN, no RST: a NAT entry that
expired, a load balancer that failed over) by itself: TCP keepalives and tcp_user_timeout are on
by default, and a URL may set its own values (`with_liveness`). Every call is also bounded
(`asyncio.timeout`): a call that gets no answer fails as DatabaseUnavailable, its connection is
discarded, and the caller retries on a new one.

Every client deadline is a server deadline too (invariant 9): a call the listener gives up on
must not go on waiting for a lock on the server and commit a claim, a completion or a tick
later. Each call is one message of the simple protocol, one implicit transaction: its
`statement_timeout` (and `lock_timeout`) set for that transaction to what is left of the call's bound,
less SERVER_MARGIN_S, then the statement, committed by the server as it ends (_bounded): per
transaction, so that it holds through a transaction pooler, and bounding the statement as a
whole, not each lock wait. A call cancelled at its
deadline also sends the server a cancel request, fire and forget, before its connection is
closed. And a call that reaches the server only after its deadline (a path that stalled, then
delivered) is refused there: it carries that deadline on the server's clock (_NOT_AFTER), placed
with the offset of the server's clock from time.monotonic(), so that a step of the listener's
wall clock changes nothing. A step of the server's clock (or a pause of the listener's host,
which time.monotonic() does not count) makes that offset wrong: a refusal as late that comes
back before the listener's own deadline contradicts it, and the offset is read again at once
and the call sent again (Database._rows).

Errors come in two kinds. DatabaseUnavailable: the database is down, unreachable or slow to
answer; wait and retry. DatabaseMisconfigured: it answered, and the answer will not change by
waiting (a wrong password, no such database or role, a role that may not log in, no pg_hba.conf
entry, the dispatch schema missing or too old for this listener): say so once and stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import psycopg
import psycopg.conninfo
from psycopg import errors, generators, pq, waiting
from psycopg.abc import RV, PQGen
from psycopg.pq.abc import PGcancelConn
from psycopg.rows import AsyncRowFactory, Row, dict_row, tuple_row
from psycopg.types.string import TextLoader
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from dispatcher import tracing
from dispatcher.runs import Outcome, Run

__all__ = [
    "SCHEMA_VERSION",
    "Database",
    "DatabaseMisconfigured",
    "DatabaseUnavailable",
    "LiveConnection",
    "Recorded",
    "Wake",
    "check_schema",
    "connect",
    "with_liveness",
]

logger = logging.getLogger(__name__)

# The schema this listener is written for: dispatch.migrations must reach this version.
SCHEMA_VERSION = 25
# Liveness defaults for every connection (libpq parameters; a URL that sets one wins): an idle
# connection whose peer vanished is probed after 5 s and given up after 3 more probes 2 s apart,
# data unacknowledged for 10 s fails the connection, and a connect attempt gives up after 5 s.
LIVENESS = {
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "10000",
    "connect_timeout": "5",
}
# How long a call may take before the database counts as unavailable. A tick may mark a whole
# hour's stampede (100,000 slots take about 2 s), the rest are small batches.
CALL_TIMEOUT_S = 5.0
TICK_TIMEOUT_S = 30.0
# While calls fail for want of a connection, the database is probed directly this often; once
# it answers, the pool is started over (see Database.heal).
HEAL_PROBE_S = 1.0
# A pooled connection idle for a while is checked before use (one round trip), within this.
CHECK_TIMEOUT_S = 2.0
# How long a call waits for a pooled connection before the database counts as unavailable.
CONNECTION_WAIT_S = 5.0
# A pooled connection is checked (an empty query, one round trip) before use only when it has
# been idle for longer than this: a busy listener would otherwise pay a round trip per call. A
# connection that broke meanwhile fails its call, which the callers already retry.
CHECK_AFTER_IDLE_S = 1.0
# The server gives a statement up this much before the listener would: its error, not a silent
# cancel, is what the listener sees, and nothing commits after the listener stopped waiting.
SERVER_MARGIN_S = 0.25
# A statement_timeout counts from the statement's arrival, and a call held up on its way (a path
# that stalled, then delivered) would run in full after the listener gave up on it. So each call
# also carries its deadline on the database's clock, and the server refuses it when it arrives
# later. The offset between the two clocks is read this often, from a round trip short enough
# (CLOCK_READ_MAX_RTT_S) to place the server's reading within half of it. The listener's side is
# time.monotonic(), not time.time(): its wall clock may step (NTP, a VM resumed), never the former.
CLOCK_READ_EVERY_S = 60.0
CLOCK_READ_MAX_RTT_S = 0.2
# An offset that moved by more than this since the last reading is said (clock_offset_changed).
CLOCK_MOVED_S = 1.0
# A busy answer of dispatch.complete_runs renews the run's lease to at least this long after the
# server's clock_timestamp() at the call's start (its busy_lease; only when the run's own row is
# free, and a held row cannot expire meanwhile). That start comes after the listener sent the
# call, so the call's send time on time.monotonic() plus this is a deadline on the early side,
# as the claim's is: no offset between the clocks is needed, only that both count real time.
BUSY_LEASE_S = 5.0
# A cancel request sent when a call is given up is not waited for longer than this.
CANCEL_TIMEOUT_S = 2.0
# Sent before each call's statement, in the same message: its transaction is READ COMMITTED whatever
# the database's or role's default_transaction_isolation (dispatch.tick refuses an older snapshot
# than its locks), and bounded on the server. All of it is the transaction's own, so a transaction
# pooler (PgBouncer) may hand the next call another server session. The bounds are set with
# set_config(..., true), SET LOCAL's equal, in a SELECT: pg_stat_statements folds a SELECT's
# constants into one entry, but keeps a SET or DO of its own for each text, a new one every call.
_BOUND = ("SET TRANSACTION ISOLATION LEVEL READ COMMITTED;"
          " SELECT pg_catalog.set_config('statement_timeout', '{bound}', true),"
          " pg_catalog.set_config('lock_timeout', '{bound}', true); ")
# Then, once the clocks' offset is known: a call that arrives after its deadline does nothing
# (dispatch.check_deadline). An install older than that function gets a DO block instead, which
# PostgreSQL compiles at every call; its deadline travels in a setting of the transaction, so
# that the block's text never changes.
_LATE = "arrived after its deadline"
_NOT_AFTER = "SELECT dispatch.check_deadline(clock_timestamp(), '{at}'); "
_NOT_AFTER_BLOCK = ("SELECT pg_catalog.set_config('pgdispatch.not_after', '{at}', true);"
                    " DO $$DECLARE deadline text := pg_catalog.current_setting('pgdispatch.not_after');"
                    " BEGIN IF clock_timestamp() > deadline::timestamptz THEN"
                    " RAISE EXCEPTION '" + _LATE + " (%)', deadline USING ERRCODE = 'query_canceled';"
                    " END IF; END$$; ")
# The offset is read from the same clock_timestamp() as _NOT_AFTER's, as the session's search_path
# finds it (tests/listener/test_deadlines.py steps the server's clock that way), and with it
# whether the install has dispatch.check_deadline.
_SERVER_CLOCK = ("SELECT clock_timestamp() AS now,"
                 " to_regprocedure('dispatch.check_deadline(timestamptz,timestamptz)') IS NOT NULL AS checks")
# Every column, read by position: kind (the twelfth) is there only once the install that added it
# has run, and a listener must keep working on the install before.
_CLAIM = "SELECT * FROM dispatch.claim_runs(%s, %s, %s, %s)"
# What a server (or libpq) says when waiting will not help: the configuration is wrong.
# Connection failures carry no SQLSTATE, so the message is all there is; an unrecognised
# failure counts as transient, and the listener waits for the database as before.
_MISCONFIGURED = (
    "password authentication failed",  # 28P01
    "authentication failed for user",  # 28000: peer, ident, ldap, cert ...
    "no pg_hba.conf entry",  # 28000
    "pg_hba.conf rejects connection",  # 28000
    "is not permitted to log in",  # 28000: a NOLOGIN role, such as the group dispatch_listener
    "does not exist",  # database "x" / role "x"
    "no password supplied",
    "permission denied for database",
    "must be superuser or replication role",
)


_cancelling: set[asyncio.Task[None]] = set()  # cancel requests under way (fire and forget)


async def _send_cancel(cancel: PGcancelConn) -> None:
    try:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CANCEL_TIMEOUT_S):
                await waiting.wait_conn_async(generators.cancel(cancel), interval=0.1)
    finally:
        cancel.finish()


def _cancel_in_background(pgconn: pq.abc.PGconn) -> None:
    """Ask the server to cancel what `pgconn` is running, without waiting for the answer: on a
    path that died the request goes nowhere, and the statement's own timeout ends it."""
    if not psycopg.capabilities.has_cancel_safe():
        return  # libpq < 17 can only cancel blocking; statement_timeout still ends the statement
    try:
        cancel = pgconn.cancel_conn()
        cancel.start()
    except psycopg.Error:
        return
    task = asyncio.get_running_loop().create_task(_send_cancel(cancel), name="pgdispatch-cancel")
    _cancelling.add(task)
    task.add_done_callback(_cancelling.discard)


class LiveConnection(psycopg.AsyncConnection[Any]):
    """psycopg's connection, except for what a cancelled call does.

    psycopg answers a call cancelled while the server works on it by sending a cancel request
    and then waiting up to 5 s more for the query to end, to keep the connection usable. Here a
    cancelled call is a deadline that passed, most likely on a path that died silently: a cancel
    request is sent without waiting for it, and the connection is closed at once (the pool then
    replaces it), so that a dead path costs each call its deadline and nothing more."""

    async def wait(self, gen: PQGen[RV], interval: float = 0.1,
                   timeout: float | None = None) -> RV:  # noqa: ASYNC109 (psycopg's signature)
        try:
            return await waiting.wait_async(gen, self.pgconn.socket, interval=interval, timeout=timeout)
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            if self.pgconn.transaction_status == pq.TransactionStatus.ACTIVE:
                _cancel_in_background(self.pgconn)
                self.pgconn.finish()  # its state is unknown: it is never used again
            raise


def with_liveness(conninfo: str) -> str:
    """conninfo with the LIVENESS defaults for the parameters it does not set itself."""
    given = psycopg.conninfo.conninfo_to_dict(conninfo)
    return psycopg.conninfo.make_conninfo(conninfo, **{k: v for k, v in LIVENESS.items() if k not in given})


def _int_array(values: Sequence[int | None]) -> str:
    """A PostgreSQL array literal, sent as one text parameter: psycopg's list adaptation checks
    every element in Python and cost more client CPU than the statement itself."""
    return "{" + ",".join("NULL" if value is None else str(int(value)) for value in values) + "}"


def _bool_array(values: Sequence[bool]) -> str:
    return "{" + ",".join("t" if value else "f" for value in values) + "}"


def _text_array(values: Sequence[str | None]) -> str:
    """See _int_array; every element is quoted, backslashes and double quotes escaped."""
    return "{" + ",".join(
        "NULL" if value is None else '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        for value in values
    ) + "}"


async def _configure(conn: LiveConnection) -> None:
    """Claimed runs keep jsonb and uuid as the server's text: the args are spliced into the request
    body as they are (parsing and re-encoding them cost more than the rest of building it), and a
    schedule id is only ever sent on as text."""
    for type_name in ("jsonb", "uuid"):
        conn.adapters.register_loader(type_name, TextLoader)


def _server_left_s(deadline: float) -> float:
    """How long the server may take over a statement that must end by `deadline` (time.monotonic())."""
    left_s = deadline - time.monotonic()
    return left_s - min(SERVER_MARGIN_S, left_s / 4)


def _preamble(left_s: float, not_after: datetime | None, *, checks: bool = True) -> str:
    """What precedes a call's statement in its message: _BOUND for `left_s`, then, unless
    `not_after` is None, _NOT_AFTER (or, when the install has no dispatch.check_deadline,
    _NOT_AFTER_BLOCK)."""
    message = _BOUND.format(bound=f"{max(1, int(left_s * 1000))}ms")
    if not_after is None:
        return message
    return message + (_NOT_AFTER if checks else _NOT_AFTER_BLOCK).format(at=not_after.isoformat())


async def _bounded(conn: LiveConnection, query: str, params: tuple[Any, ...],
                   row_factory: AsyncRowFactory[Row], deadline: float,
                   server_clock_offset_s: float | None = None, *, checks: bool = True) -> list[Row]:
    """`query`, which the server ends by `deadline`, in one message of the simple protocol: the
    settings of _BOUND, then the statement, in one implicit transaction that the server commits as
    soon as the statement ends. Not BEGIN ... COMMIT: the locks the statement took would be held
    until the listener's COMMIT went out, which waits for the event loop (a busy loop, a stopped
    process), and a user's write to the schedule would wait on the listener. With the offset of
    the server's clock from time.monotonic(), the server also refuses the call if it arrives
    after its deadline (_NOT_AFTER)."""
    now = time.monotonic()
    left_s = _server_left_s(deadline)
    at = None
    if server_clock_offset_s is not None:
        at = datetime.fromtimestamp(now + left_s + server_clock_offset_s, UTC)
    cursor = psycopg.AsyncClientCursor(conn, row_factory=row_factory)
    await cursor.execute(_preamble(left_s, at, checks=checks) + cursor.mogrify(query, params))
    while cursor.nextset():  # the settings' results, then the statement's
        pass
    return await cursor.fetchall()


class Recorded(NamedTuple):
    """What dispatch.complete_runs answered for one outcome."""

    recorded: bool  # written: the run was still running with the attempt this listener claimed
    advanced: bool  # its schedule moved on to its next slot
    busy: bool  # not written because another transaction holds the run or its schedule: retry
    retry_at: datetime | None = None  # not finished: the run is retried then (the database's clock)
    # busy: the lease holds at least until then (time.monotonic(); see BUSY_LEASE_S)
    lease_deadline: float | None = None


class Wake(NamedTuple):
    """When a listener's clock should wake next (dispatch.next_slot_after, next_start_after)."""

    tick_in_s: float | None  # until the next slot: tick then (negative: one came due since)
    start_in_s: float | None  # until a waiting run may start: claim then
    start_at: datetime | None  # that instant, by the database's clock


def _refused_in_time(exc: errors.QueryCanceled, deadline: float) -> bool:
    """Whether `exc` is the server's refusal of a call as arriving after its deadline (_NOT_AFTER)
    that came back while that deadline, by time.monotonic(), had not passed (less what the
    clocks' offset may be off by): the server read its clock after the call was sent and before
    the refusal came back, so the offset the deadline was placed with is wrong."""
    return ((exc.diag.message_primary or "").startswith(_LATE)
            and time.monotonic() < deadline - SERVER_MARGIN_S - CLOCK_READ_MAX_RTT_S)


def _recorded(row: dict[str, Any], sent: float) -> Recorded:
    busy = bool(row["busy"])
    return Recorded(bool(row["recorded"]), bool(row["advanced"]), busy, row["retry_at"],
                    sent + BUSY_LEASE_S if busy else None)


class DatabaseUnavailable(Exception):
    """The database cannot be reached or did not answer in time; the call may be retried later."""


class DatabaseMisconfigured(Exception):
    """The database answered, and waiting will not change the answer: the message says what to fix."""


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def classify(exc: psycopg.Error) -> DatabaseUnavailable | DatabaseMisconfigured:
    """The domain error for a psycopg error met connecting or calling."""
    message = _one_line(exc)
    if isinstance(exc, psycopg.OperationalError) and any(part in message for part in _MISCONFIGURED):
        if "is not permitted to log in" in message:
            message += " (the URL must name a login role granted dispatch_listener: docs/install.md, Roles)"
        return DatabaseMisconfigured(message)
    if (exc.sqlstate or "").startswith("28"):  # invalid authorization, when an error carries its SQLSTATE
        return DatabaseMisconfigured(message)
    if isinstance(exc, errors.InsufficientPrivilege):
        return DatabaseMisconfigured(f"{message} (grant the login role dispatch_listener)")
    return DatabaseUnavailable(message)


async def connect(conninfo: str, *, application_name: str, timeout_s: float = CALL_TIMEOUT_S
                  ) -> psycopg.AsyncConnection[Any]:
    """A direct autocommit session (outside the pool), with the liveness defaults."""
    try:
        async with asyncio.timeout(timeout_s):
            return await LiveConnection.connect(
                with_liveness(conninfo), autocommit=True, application_name=application_name)
    except TimeoutError:
        raise DatabaseUnavailable(f"no connection within {timeout_s:g} s") from None
    except psycopg.Error as exc:
        raise classify(exc) from exc


async def check_schema(conn: psycopg.AsyncConnection[Any], *, timeout_s: float = CALL_TIMEOUT_S) -> int:
    """The database's schema version; DatabaseMisconfigured when it is missing or too old."""
    try:
        async with asyncio.timeout(timeout_s):
            cursor = await conn.execute("SELECT dispatch.schema_version()")
            row = await cursor.fetchone()
    except TimeoutError:
        raise DatabaseUnavailable(f"no answer within {timeout_s:g} s") from None
    except (errors.InvalidSchemaName, errors.UndefinedFunction) as exc:
        raise DatabaseMisconfigured(
            f"database {conn.info.dbname} has no dispatch schema of version {SCHEMA_VERSION} or later"
            f" ({_one_line(exc)}): install it with psql -f sql/install.sql or pgdispatch install") from exc
    except psycopg.Error as exc:
        raise classify(exc) from exc
    version = int(row[0]) if row and row[0] is not None else 0
    if version < SCHEMA_VERSION:
        raise DatabaseMisconfigured(
            f"database {conn.info.dbname} has dispatch schema version {version}; this listener needs "
            f"{SCHEMA_VERSION}: upgrade it with psql -f sql/install.sql or pgdispatch install")
    return version


class Database:
    """Claims, completions, releases and ticks. Every call is one statement in autocommit mode,
    bounded in time; a connection-level failure surfaces as DatabaseUnavailable (or
    DatabaseMisconfigured when waiting will not help)."""

    def __init__(self, conninfo: str, *, application_name: str, worker_id: str, pool_size: int,
                 call_timeout_s: float = CALL_TIMEOUT_S,
                 on_success: Callable[[], None] = lambda: None) -> None:
        self._conninfo = conninfo
        self._application_name = application_name
        self._worker_id = worker_id
        self._call_timeout_s = call_timeout_s
        self._on_success = on_success
        self._pool_size = pool_size
        self._last_used: weakref.WeakKeyDictionary[LiveConnection, float] = weakref.WeakKeyDictionary()
        self._failing = False  # a call failed for want of the database since the last one that did not
        self._failing_now = asyncio.Event()  # set while _failing: wakes heal()
        self._closing: set[asyncio.Task[None]] = set()
        self._server_clock_offset_s: float | None = None  # the server's clock less time.monotonic()
        self._clock_read_at = float("-inf")  # time.monotonic() of the last reading
        self._last_offset_s: float | None = None  # the last trusted reading, kept when one is dropped
        self._checks_deadlines = False  # the install has dispatch.check_deadline (read with the offset)
        self.pool = self._new_pool()

    def _new_pool(self) -> AsyncConnectionPool[LiveConnection]:
        return AsyncConnectionPool(
            with_liveness(self._conninfo),
            connection_class=LiveConnection,
            kwargs={"autocommit": True, "application_name": self._application_name},
            configure=_configure,
            min_size=self._pool_size,
            max_size=self._pool_size,
            open=False,
            name="pgdispatch",
            reconnect_timeout=float("inf"),  # never give up: the listener waits for the database
        )

    async def reopen_if_failing(self) -> bool:
        """After an outage (the LISTEN session is back): if calls were failing, start over with a
        new pool, whose connections are made at once, and close the old one in the background.
        psycopg_pool's own reconnection backs off to 4 s, 8 s, ... between attempts, which would
        keep a listener idle for seconds after the database came back. True if it did."""
        if not self._failing:
            return False
        self._set_failing(False)
        old, self.pool = self.pool, self._new_pool()
        await self.pool.open(wait=False)
        closing = asyncio.create_task(old.close(timeout=CONNECTION_WAIT_S), name="pgdispatch-pool-close")
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)
        return True

    def _set_failing(self, failing: bool) -> None:
        self._failing = failing
        if failing:
            self._failing_now.set()
        else:
            self._failing_now.clear()

    async def heal(self) -> None:
        """While calls fail for want of the database, probe it with a direct connection every
        HEAL_PROBE_S and start over with a new pool (reopen_if_failing) as soon as it answers.

        psycopg_pool retries a lost connection after 1, 2, 4, 8, ... s with no cap: after a
        33 s outage its next attempt came 24 s after the path was back. The LISTEN session's
        reconnect starts a new pool too, but LISTEN may take another path (direct, while the
        pool goes through PgBouncer) that never went down. This bounds the pool's recovery at
        about a probe interval plus a connect, whatever the outage's length. Runs as long as
        the listener does."""
        while True:
            await self._failing_now.wait()
            await asyncio.sleep(HEAL_PROBE_S)
            if not self._failing:
                continue
            try:
                conn = await connect(self._conninfo, application_name=self._application_name,
                                     timeout_s=self._call_timeout_s)
            except (DatabaseUnavailable, DatabaseMisconfigured):
                continue  # still down (a configuration error is the calls' to report)
            await conn.close()
            if await self.reopen_if_failing():
                logger.info("the database answers again: starting the connection pool over",
                            extra={"event": "database_pool_reopened"})

    async def _found_broken(self, conn: LiveConnection) -> bool:
        """Check a connection idle for a while (see CHECK_AFTER_IDLE_S); one that fails is closed,
        and the pool replaces it once it is given back.

        Not the pool's `check`: psycopg_pool (3.3) backs off 1 s, 2 s, 4 s ... between a failed
        check and the next connection it tries. A blip that reset every pooled connection (a
        pooler restarted, a failover) then cost the next call its whole bound (5 s) although new
        connections were made in milliseconds, and an outcome it carried was kept, or abandoned,
        for want of a database that was there."""
        if time.monotonic() - self._last_used.get(conn, float("-inf")) <= CHECK_AFTER_IDLE_S:
            return False
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                await conn.execute("")
        except (psycopg.Error, TimeoutError):
            await conn.close()
            return True
        return False

    async def verify(self) -> int:
        """Connect once outside the pool and check the schema; the schema version."""
        conn = await connect(self._conninfo, application_name=self._application_name,
                             timeout_s=self._call_timeout_s)
        try:
            return await check_schema(conn, timeout_s=self._call_timeout_s)
        finally:
            await conn.close()

    async def open(self) -> None:
        """Start the pool without waiting for it: calls wait for connections as they come up."""
        await self.pool.open(wait=False)

    async def close(self) -> None:
        await self.pool.close()
        await asyncio.gather(*self._closing, return_exceptions=True)

    async def _fetch(self, query: str, params: tuple[Any, ...] = (), *, timeout_s: float | None = None
                     ) -> list[dict[str, Any]]:
        return await self._rows(query, params, dict_row, timeout_s=timeout_s)

    async def _read_server_clock(self, conn: LiveConnection, deadline: float) -> None:
        """The offset of the server's clock from time.monotonic(), from a round trip short
        enough to trust (a slow one leaves the offset as it was). Its own statement carries
        no deadline on the server's clock: that would be placed with the offset being replaced."""
        sent = time.monotonic()
        rows = await _bounded(conn, _SERVER_CLOCK, (), dict_row, deadline)
        received = time.monotonic()
        self._clock_read_at = received
        self._checks_deadlines = rows[0]["checks"]
        if received - sent > CLOCK_READ_MAX_RTT_S:
            return
        offset_s = rows[0]["now"].timestamp() - (sent + received) / 2
        before_s = self._last_offset_s
        self._server_clock_offset_s = self._last_offset_s = offset_s
        if before_s is not None and abs(offset_s - before_s) > CLOCK_MOVED_S:
            logger.info("the server's clock moved by %+.3f s against the listener's monotonic clock",
                        offset_s - before_s,
                        extra={"event": "clock_offset_changed", "moved_s": round(offset_s - before_s, 3)})

    async def _rows(self, query: str, params: tuple[Any, ...], row_factory: AsyncRowFactory[Row], *,
                    timeout_s: float | None = None) -> list[Row]:
        limit = timeout_s or self._call_timeout_s
        deadline = time.monotonic() + limit
        pool = self.pool
        read_again = False  # the clocks' offset was found wrong during this call, and read again
        try:
            # The bound covers waiting for a connection, checking it, reading the clocks' offset
            # when it is due, and the statement: a call on a path that died silently is cancelled
            # (psycopg then closes that connection).
            async with asyncio.timeout(limit):
                while True:
                    async with pool.connection(
                            timeout=min(CONNECTION_WAIT_S, deadline - time.monotonic())) as conn:
                        if await self._found_broken(conn):
                            continue  # the next one at once: a blip breaks them all together
                        if time.monotonic() - self._clock_read_at > CLOCK_READ_EVERY_S:
                            await self._read_server_clock(conn, deadline)
                        try:
                            rows = await _bounded(conn, query, params, row_factory, deadline,
                                                  self._server_clock_offset_s, checks=self._checks_deadlines)
                        except errors.QueryCanceled as exc:
                            if read_again or not _refused_in_time(exc, deadline):
                                raise
                            # Refused before the statement ran (nothing of it committed), so it
                            # is sent again, once, with the offset read afresh; a stale offset is
                            # dropped even if no new reading can be trusted.
                            read_again = True
                            self._server_clock_offset_s = None
                            self._clock_read_at = float("-inf")
                            logger.warning(
                                "the server refused a call as late although it was sent in time: its"
                                " clock moved against the listener's; reading their offset again",
                                extra={"event": "clock_offset_stale", "reason": _one_line(exc)})
                            continue
                        except errors.ReadOnlySqlTransaction:
                            # A session on a node that no longer takes writes (a demoted primary
                            # behind a VIP or a pooler): closed, so that the pool's next one may
                            # reach the primary rather than this session being used forever.
                            await conn.close()
                            raise
                        self._last_used[conn] = time.monotonic()
                        break
        except TimeoutError:
            self._set_failing(True)
            raise DatabaseUnavailable(f"no answer from the database within {limit:g} s") from None
        except PoolClosed as exc:
            # A pool that heal() replaced closes with calls still waiting on it: not a new failure.
            self._set_failing(self._failing or pool is self.pool)
            raise DatabaseUnavailable(_one_line(exc)) from exc
        except PoolTimeout as exc:
            self._set_failing(True)
            raise DatabaseUnavailable(_one_line(exc)) from exc
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            # An error the server sent (a statement or lock timeout: its path works) is no
            # reason to start the pool over; a connection-level one (no SQLSTATE) is.
            self._set_failing(getattr(exc, "sqlstate", None) is None)
            raise classify(exc) from exc
        except errors.ReadOnlySqlTransaction as exc:
            # 25006: the database is there but takes no writes now (a failover under way, a
            # default_transaction_read_only): like a database that is down, wait and retry, and
            # keep what is in hand. Not a reason to start the pool over: its connection is closed.
            raise DatabaseUnavailable(
                f"the database takes no writes: {exc.diag.message_primary or _one_line(exc)}") from exc
        if self._failing:
            self._set_failing(False)
        self._on_success()
        return rows

    async def claim(self, max_runs: int, lease_s: float, timeout_s: float) -> list[Run]:
        """Claim up to max_runs pending runs for this worker. A run is leased for lease_s, or, when
        its schedule has its own invocation timeout, for lease_s plus the difference between
        that and timeout_s (this listener's)."""
        # The lease counts from the server's clock at claim time; counting it from just before
        # the request makes the local deadline err on the early side.
        started = time.monotonic()
        rows = await self._rows(_CLAIM, (self._worker_id, max_runs, timedelta(seconds=lease_s),
                                         timedelta(seconds=timeout_s)), tuple_row)
        runs = []
        for row in rows:
            (run_id, schedule_id, project_id, function_name, args_json, request_id, scheduled_for, attempt,
             lease_until, timeout, fire_at) = row[:11]
            run_timeout_s = timeout.total_seconds() if timeout is not None else timeout_s
            continues = row[12] if len(row) > 12 else None
            runs.append(Run(run_id=run_id, schedule_id=schedule_id, project_id=project_id,
                            function_name=function_name, args_json=args_json, request_id=request_id,
                            scheduled_for=scheduled_for, attempt=attempt, lease_until=lease_until,
                            lease_deadline=started + lease_s + run_timeout_s - timeout_s,
                            timeout_s=run_timeout_s, fire_at=fire_at,
                            kind=row[11] if len(row) > 11 else None,
                            traceparent=tracing.traceparent(request_id, attempt, continues),
                            continues=continues))
        return runs

    async def complete(self, run: Run, outcome: Outcome) -> Recorded:
        """Record an outcome. Not recorded when the run is no longer running with the attempt
        this listener claimed (its lease expired and the run was retried or lost, or an earlier
        call whose answer was lost recorded it already)."""
        return (await self.complete_many([(run, outcome)]))[0]

    async def complete_many(self, items: Sequence[tuple[Run, Outcome]]) -> list[Recorded]:
        """complete() for several runs with dispatch.complete_runs: one statement, one round trip,
        one transaction. One run too: not `CALL dispatch.complete_run`, whose arguments
        pg_stat_statements keeps (before PostgreSQL 17), one entry a call."""
        outcomes = [outcome for _, outcome in items]
        sent = time.monotonic()
        rows = await self._fetch(
            "SELECT run_id, recorded, advanced, busy, retry_at FROM dispatch.complete_runs("
            "%s, %s::bigint[], %s::integer[], %s::text[], %s::text[], %s::integer[], %s::integer[],"
            " %s::boolean[], %s::integer[])",
            (
                self._worker_id,
                _int_array([run.run_id for run, _ in items]),
                _int_array([run.attempt for run, _ in items]),
                _text_array([o.status for o in outcomes]),
                _text_array([o.error for o in outcomes]),
                _int_array([o.http_status for o in outcomes]),
                _int_array([o.duration_ms for o in outcomes]),
                # NULL when nothing may be retried: the common case skips the retry statement
                _bool_array([o.retryable for o in outcomes]) if any(o.retryable for o in outcomes) else None,
                (_int_array([o.retry_after_ms for o in outcomes])
                 if any(o.retry_after_ms is not None for o in outcomes) else None),
            ),
        )
        by_id = {row["run_id"]: _recorded(row, sent) for row in rows}
        return [by_id[run.run_id] for run, _ in items]

    async def release(self, runs: Sequence[Run]) -> int:
        """Hand claimed runs that were never invoked back to pending."""
        rows = await self._fetch(
            "SELECT dispatch.release_runs(%s, %s::bigint[], %s::integer[]) AS n",
            (self._worker_id, _int_array([run.run_id for run in runs]),
             _int_array([run.attempt for run in runs])),
        )
        return int(rows[0]["n"])

    async def tick(self) -> tuple[int, datetime]:
        """Mark due runs (and expire leases); returns how many runs were marked and the instant
        the tick marked up to (its now(): every slot at or before it is marked or still open)."""
        rows = await self._fetch("SELECT dispatch.tick() AS marked, now() AS covered",
                                 timeout_s=TICK_TIMEOUT_S)
        return int(rows[0]["marked"]), rows[0]["covered"]

    async def tick_chunk(self, max_runs: int) -> tuple[int, int]:
        """Mark at most max_runs of the due slots no run policy has to decide: how many runs it
        marked, and how many due schedules it took (max_runs: there may be more)."""
        rows = await self._fetch("SELECT marked, taken FROM dispatch.tick_chunk(%s)", (max_runs,),
                                 timeout_s=TICK_TIMEOUT_S)
        return int(rows[0]["marked"]), int(rows[0]["taken"])

    async def skipped_slots_after(self, after_id: int | None) -> tuple[dict[str, int], int]:
        """Slots in the gaps recorded after audit row `after_id`, by reason (None: zeros, and where
        to start), and the id to pass next time."""
        rows = await self._fetch("SELECT reason, slots, last_id FROM dispatch.skipped_slots_after(%s)",
                                 (after_id,))
        return {row["reason"]: int(row["slots"]) for row in rows}, int(rows[0]["last_id"])

    async def claim_event_deliveries(self, max_deliveries: int, lease_s: float) -> list[dict[str, Any]]:
        """Event deliveries due now (dispatch.claim_event_deliveries): delivery_id, url, payload
        (JSON text), attempt; not handed out again for lease_s."""
        return await self._fetch(
            "SELECT delivery_id, url, payload, attempt FROM dispatch.claim_event_deliveries(%s, %s, %s)",
            (self._worker_id, max_deliveries, timedelta(seconds=lease_s)))

    async def finish_event_deliveries(self, outcomes: Sequence[tuple[int, int, str | None]]) -> int:
        """Each claimed delivery's outcome, (delivery id, attempt, error or None when delivered)."""
        rows = await self._fetch(
            "SELECT dispatch.finish_event_deliveries(%s, %s::bigint[], %s::integer[], %s::text[]) AS n",
            (self._worker_id, _int_array([o[0] for o in outcomes]), _int_array([o[1] for o in outcomes]),
             _text_array([o[2] for o in outcomes])))
        return int(rows[0]["n"])

    async def next_event_delivery_in(self) -> float | None:
        """Seconds until the next event delivery is due, by the database's clock (None: none)."""
        rows = await self._fetch(
            "SELECT extract(epoch FROM dispatch.next_event_delivery_at() - clock_timestamp())::float8 AS s")
        value = rows[0]["s"]
        return None if value is None else float(value)

    async def open_breakers(self) -> set[tuple[str, str]]:
        """The functions (project_id, function_name) whose circuit breaker is open."""
        rows = await self._fetch("SELECT project_id, function_name FROM dispatch.breaker_states()"
                                 " WHERE state = 'open'")
        return {(row["project_id"], row["function_name"]) for row in rows}

    async def lost_runs_after(self, after_id: int | None) -> tuple[int, int]:
        """Runs that ended lost after audit row `after_id` (None: 0, and where to start), and the id
        to pass next time."""
        rows = await self._fetch("SELECT lost, last_id FROM dispatch.lost_runs_after(%s)", (after_id,))
        return int(rows[0]["lost"]), int(rows[0]["last_id"])

    async def next_wake(self, covered: datetime | None, started: datetime | None) -> Wake:
        """When the clock should wake next, by the database's clock: the earliest next_run_at after
        `covered` (see tick; now when None), and the earliest instant after `started` at which a
        waiting run may start (a jittered slot, a retry's back-off)."""
        rows = await self._fetch(
            "SELECT extract(epoch FROM dispatch.next_slot_after(coalesce(%s, now())) - clock_timestamp())"
            "::float8 AS tick_s, w.at AS start_at,"
            " extract(epoch FROM w.at - clock_timestamp())::float8 AS start_s"
            " FROM (SELECT dispatch.next_start_after(coalesce(%s, now())) AS at) w",
            (covered, started),
        )
        row = rows[0]
        return Wake(tick_in_s=row["tick_s"], start_in_s=row["start_s"], start_at=row["start_at"])
