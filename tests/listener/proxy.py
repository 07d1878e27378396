"""A TCP proxy between a listener and PostgreSQL that fails the way networks do (the idea of
psycopg's tests/fix_proxy.py): it can black-hole the connections it holds (nothing comes through,
nothing is closed: no FIN, no RST, as when a NAT entry expires or a load balancer fails over),
stall them until resumed, or reset them (RST). Connections made after a fault are forwarded
again, as a new path through a NAT or a load balancer would be, unless it refuses them: then
nothing listens on its port (connect() gets ECONNREFUSED, as from a pooler or a host that is
down) until it accepts again, on the same port."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import psycopg.conninfo
import pytest

__all__ = ["Proxy", "proxies"]


@dataclass(eq=False)
class _Link:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    mode: str = "forward"  # forward, blackhole, stall
    resumed: asyncio.Event = field(default_factory=asyncio.Event)
    pumping: int = 2  # the directions still open


class Proxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.accepted = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def refuse(self) -> int:
        """Stop listening (new connections are refused) and reset every connection held now; how
        many there were."""
        server, self._server = self._server, None
        assert server is not None
        server.close()
        held = self.reset()
        await server.wait_closed()
        return held

    async def accept_again(self) -> None:
        """Listen again, on the same port."""
        await self.start()

    def url(self, dsn: str) -> str:
        """`dsn` with this proxy as its host and port."""
        return psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", hostaddr="127.0.0.1",
                                              port=str(self.port))

    @property
    def connections(self) -> int:
        return len(self._links)

    async def _accept(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            server_reader, server = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client.close()
            return
        link = _Link(client, server)
        self._links.add(link)
        for source, target in ((client_reader, server), (server_reader, client)):
            task = asyncio.create_task(self._pump(link, source, target))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, link: _Link, source: asyncio.StreamReader, target: asyncio.StreamWriter) -> None:
        ended = False
        try:
            while data := await source.read(65536):
                if link.mode == "stall":
                    await link.resumed.wait()
                if link.mode == "blackhole":
                    continue  # swallowed: the peer's kernel acknowledged it, nobody answers
                target.write(data)
                await target.drain()
            ended = True
        except (ConnectionError, OSError):
            pass
        finally:
            link.pumping -= 1
            if link.mode != "blackhole":
                with contextlib.suppress(Exception):
                    # A peer that closed its end sent a FIN after its data, as TCP does: the
                    # other side may still answer until it closes its own.
                    if ended and link.pumping and target.can_write_eof():
                        target.write_eof()
                    else:
                        link.client.close()
                        link.server.close()
                self._links.discard(link)

    def blackhole(self) -> int:
        """Stop every connection held now, silently; how many there were."""
        for link in self._links:
            link.mode = "blackhole"
            link.resumed.set()
        return len(self._links)

    def stall(self) -> int:
        for link in self._links:
            link.mode = "stall"
            link.resumed.clear()
        return len(self._links)

    def resume(self) -> None:
        for link in self._links:
            if link.mode == "stall":
                link.mode = "forward"
                link.resumed.set()

    def reset(self) -> int:
        """Abort every connection held now with RST; how many there were."""
        links, self._links = self._links, set()
        for link in links:
            for writer in (link.client, link.server):
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
        return len(links)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.reset()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@pytest.fixture
async def proxies(dsn: str) -> AsyncIterator[list[Proxy]]:
    """Two proxies to the test cluster (one for the pool, one for LISTEN, when a test wants
    them apart); closed after the test."""
    port = int(psycopg.conninfo.conninfo_to_dict(dsn)["port"] or 5432)
    made = [Proxy(port), Proxy(port)]
    for proxy in made:
        await proxy.start()
    yield made
    for proxy in made:
        await proxy.close()
