"""The load generators' HTTP/1.1 client: keep-alive connections (one per closed-loop client; a pool for the
open loop's overlapping requests), each response parsed by httptools (the C parser uvicorn uses).

Why not aiohttp, which this replaced: its per-request machinery cost the load generator about 90 µs of CPU
per request on a 2-core VM and 250-300 µs on the H100 host under load (docs/bench-gpu: 2.3 cores at 8,757
requests/s), so 20,000 requests/s would have needed five or more cores beside the server's, more than the
closed loop may take. A request here is one write and one parse: a third of aiohttp's CPU against TorchServe,
a sixth to an eighth where the client is the limit, side by side (docs/benchmarks.md, "The load generator").
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools


class ConnectionClosed(ConnectionError):
    """The connection closed before the response was complete (the server closed it, or the watchdog did)."""


def header_lines(headers: Mapping[str, str]) -> bytes:
    """Headers as request lines ("Name: value\\r\\n" each); Content-Length is the client's own to write."""
    return "".join(
        f"{name}: {value}\r\n" for name, value in headers.items() if name.lower() != "content-length"
    ).encode("latin-1")


@dataclass(frozen=True)
class Endpoint:
    """Where to POST, and the head every request to it starts with: the request line, Host and the
    headers every request carries."""

    host: str
    port: int
    head: bytes

    @classmethod
    def of(cls, url: str, headers: Mapping[str, str]) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"the load generator speaks plain http to a host: {url}")
        port = parts.port or 80
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        line = f"POST {target or '/'} HTTP/1.1\r\nHost: {parts.hostname}:{port}\r\n".encode("latin-1")
        return cls(parts.hostname, port, line + header_lines(headers))


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection, one request at a time (a closed-loop client never has two in flight)."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiting: asyncio.Future | None = None
        self._body: list[bytes] = []
        self.open = False

    @classmethod
    async def to(cls, endpoint: Endpoint) -> Connection:
        _, connection = await asyncio.get_running_loop().create_connection(cls, endpoint.host, endpoint.port)
        return connection

    def post(self, endpoint: Endpoint, body: bytes, headers: bytes = b"") -> asyncio.Future:
        """Send one request, with `headers` (header_lines) besides the endpoint's; the future gets (status, body),
        or ConnectionClosed."""
        if not self.open or self._transport is None:
            raise ConnectionClosed("the connection is closed")
        self._waiting = asyncio.get_running_loop().create_future()
        self._transport.write(endpoint.head + headers + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        return self._waiting

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # ---- asyncio.Protocol and httptools' callbacks -----------------------------------------------------

    def connection_made(self, transport) -> None:
        self._transport = transport
        self.open = True

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            # httptools turns whatever a callback raised into HttpParserCallbackError, the original as its context.
            # A signal's handler runs between any two bytecodes, these callbacks' among them: a SIGTERM's exit
            # (tooling/termination.py) or Ctrl-C raised there must still end the run, not pass for a bad response
            # (a benchmark stopped by its time limit ran on to its end so).
            if isinstance(error.__context__, (SystemExit, KeyboardInterrupt)):
                raise error.__context__ from None
            self._fail(ConnectionClosed(f"unreadable response: {error}"))
            self.close()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        body, self._body = b"".join(self._body), []
        if not self._parser.should_keep_alive():  # the server said Connection: close
            self.open = False
        waiting, self._waiting = self._waiting, None
        if waiting is not None and not waiting.done():
            waiting.set_result((self._parser.get_status_code(), body))

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self._fail(ConnectionClosed(str(exc) if exc else "closed by the server"))

    def _fail(self, error: Exception) -> None:
        waiting, self._waiting = self._waiting, None
        if waiting is not None and not waiting.done():
            waiting.set_exception(error)


class Pool:
    """Connections to one endpoint for requests that overlap (the open loop): an idle one is reused, else a new
    one is opened. A connection whose request was abandoned (its client's timeout) is closed rather than
    reused: its answer may still arrive."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._idle: list[Connection] = []

    async def post(self, body: bytes, headers: bytes = b"") -> tuple[int, bytes]:
        connection = None
        while self._idle and connection is None:
            candidate = self._idle.pop()
            connection = candidate if candidate.open else None
        if connection is None:
            connection = await Connection.to(self.endpoint)
        try:
            answer = await connection.post(self.endpoint, body, headers)
        except BaseException:  # a timeout's cancellation included
            connection.close()
            raise
        if connection.open:
            self._idle.append(connection)
        return answer

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()
