"""The gateway's HTTP/1.1 client for its one backend: keep-alive connections on asyncio
protocols, responses parsed by ``httptools`` (the C parser uvicorn serves with).

A gateway proxies every request to the same host, so it needs little of a general client:
no cookies, redirects, proxies or TLS (the backend is a neighbour on the same network), only
a pool of persistent connections, streamed bodies and timeouts. Written for that, one
proxied request costs the gateway about half the CPU that aiohttp's client took, which
decides the gateway's added latency under load (see ``benchmarks/bench_gateway.py``).
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.parse
from collections.abc import Callable

import httptools

__all__ = [
    "Upstream",
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamNoAnswerError",
    "UpstreamReply",
    "UpstreamTimeoutError",
]


class UpstreamError(Exception):
    """The backend could not be reached, or broke off or garbled its answer."""


class UpstreamTimeoutError(UpstreamError):
    """The backend did not connect, or was silent for longer than the read timeout."""


class UpstreamConnectError(UpstreamError):
    """No connection could be made: nothing of the request reached the backend (a gateway
    with several backends may send it to another)."""


class UpstreamConnectTimeoutError(UpstreamTimeoutError, UpstreamConnectError):
    """No connection was made within the connect timeout (nothing was sent)."""


class UpstreamNoAnswerError(UpstreamError):
    """The backend closed the connection before a byte of its answer came (it died, or
    dropped the request): the client has seen nothing of it."""


class UpstreamReply(asyncio.Protocol):
    """One connection to the backend, and the answer it is reading (one at a time).

    :meth:`Upstream.request` returns it once the answer's status line and headers are in;
    read its body with :meth:`read` (all of it) or :meth:`chunk` (as it comes), then
    :meth:`release` it (always: it goes back to the pool, or is closed).
    """

    status: int
    """HTTP status of the answer."""
    content_type: bytes
    """Its ``Content-Type`` (``b""`` when absent)."""

    def __init__(self, owner: Upstream) -> None:
        """A connection of ``owner``'s pool (made by :meth:`Upstream.request`)."""
        self._owner = owner
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.content_type = b""
        self._chunks: list[bytes] = []
        self._headers_done = False
        self._done = False
        self._keep = False
        self._error: UpstreamError | None = None
        self._received = False
        self._buffered = 0
        self._paused = False

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self._received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as err:
            self.fail(UpstreamError(f"malformed answer from the backend: {err}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if not self._done:
            why = f": {exc}" if exc else ""
            cls = UpstreamError if self._received else UpstreamNoAnswerError
            self.fail(cls(f"the backend closed the connection{why}"))

    # -- httptools callbacks -----------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) == 12 and name.lower() == b"content-type":
            self.content_type = value

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self._headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self._transport is not None:
            self._paused = True  # the reader is behind: let TCP hold the rest
            self._transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self._done = True
        self._keep = self._parser.should_keep_alive()
        self._wake()

    # -- the answer ----------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def fail(self, error: UpstreamError) -> None:
        """Break off the answer with ``error`` (the connection is closed, never reused)."""
        if self._error is None:
            self._error = error
        self._keep = False
        if self._transport is not None:
            self._transport.abort()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    async def _wait(self, ready: Callable[[], bool], timeout: float) -> None:
        while not ready():
            if self._error is not None:
                raise self._error
            waiter = self._loop.create_future()
            self._waiter = waiter
            handle = self._loop.call_later(timeout, _expire, waiter, timeout)
            try:
                await waiter
            finally:
                handle.cancel()
                self._waiter = None

    async def read(self) -> bytes:
        """The whole body.

        Raises:
            UpstreamError: the backend broke off; UpstreamTimeoutError: it was silent too long.
        """
        parts = []
        while part := await self.chunk():
            parts.append(part)
        return b"".join(parts)

    async def chunk(self) -> bytes:
        """The body bytes received since the last call, waiting for some; ``b""`` at its end.

        Raises:
            UpstreamError: the backend broke off; UpstreamTimeoutError: it was silent too long.
        """
        if not self._chunks and not self._done:
            await self._wait(self._has_body, self._owner.read_timeout_s)
        if not self._chunks:
            return b""
        out = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        if self._paused:
            self._paused = False
            if self._transport is not None:
                self._transport.resume_reading()
        return out

    def _has_body(self) -> bool:
        return bool(self._chunks) or self._done

    def _has_head(self) -> bool:
        return self._headers_done

    @property
    def complete(self) -> bool:
        """Whether the whole body has been returned by :meth:`chunk` (the next call gives
        ``b""``)."""
        return self._done and not self._chunks

    def release(self) -> None:
        """Hand the connection back: kept for the next request when the answer was read
        whole and the backend keeps it alive, closed otherwise."""
        if self._done and self._keep and self._error is None and self._transport is not None:
            self._reset()
            self._idle_since = self._loop.time()
            self._owner._idle.append(self)
        else:
            self._keep = False
            if self._transport is not None:
                self._transport.close()
                self._transport = None

    async def _send(self, head: bytes, body: bytes, timeout: float) -> None:
        assert self._transport is not None
        self._transport.write(head + body if len(body) < 65_536 else head)
        if len(body) >= 65_536:
            self._transport.write(body)
        if not self._headers_done:
            await self._wait(self._has_head, timeout)


_HIGH_WATER = 1 << 20  # bytes of an answer buffered before reading from the backend pauses


def _expire(waiter: asyncio.Future[None], timeout: float) -> None:
    if not waiter.done():
        waiter.set_exception(UpstreamTimeoutError(f"the backend was silent for {timeout:g} s"))


class Upstream:
    """Persistent connections to one backend (``http://host:port``, any path prefix kept).

    Args:
        base_url: the backend's base URL; request paths are appended to its path.
        connect_timeout_s: the longest wait for a new connection.
        read_timeout_s: the longest silence while waiting for the answer's headers or for
            the next bytes of its body (long streams may run for as long as they keep
            sending).
        idle_timeout_s: an idle kept-alive connection older than this is closed rather than
            reused: shorter than the backend's own keep-alive timeout (uvicorn's and
            vLLM's: 5 s), so that the backend does not close it as a request is sent.

    Raises:
        ValueError: ``base_url`` is not an ``http://`` URL with a host, or a timeout is not
            positive (each named).
    """

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 600.0,
        idle_timeout_s: float = 4.0,
    ) -> None:
        """See the class docstring."""
        url = urllib.parse.urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"'backend' must be an http(s):// URL with a host: {base_url!r}")
        for name, value in (
            ("connect_timeout_s", connect_timeout_s),
            ("read_timeout_s", read_timeout_s),
            ("idle_timeout_s", idle_timeout_s),
        ):
            if not value > 0:
                raise ValueError(f"'{name}' must be > 0: {value!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if url.scheme == "https" else None
        self.prefix = url.path.rstrip("/")
        self.connect_timeout_s = float(connect_timeout_s)
        self.read_timeout_s = float(read_timeout_s)
        self.idle_timeout_s = float(idle_timeout_s)
        self._host_header = f"Host: {url.netloc}\r\n".encode()
        self._idle: list[UpstreamReply] = []

    async def _connect(self) -> UpstreamReply:
        loop = asyncio.get_running_loop()
        try:
            _, reply = await asyncio.wait_for(
                loop.create_connection(
                    lambda: UpstreamReply(self), self.host, self.port, ssl=self._ssl
                ),
                self.connect_timeout_s,
            )
        except TimeoutError as err:
            msg = f"no connection to {self.host}:{self.port} in {self.connect_timeout_s:g} s"
            raise UpstreamConnectTimeoutError(msg) from err
        except OSError as err:
            raise UpstreamConnectError(f"cannot connect to {self.host}:{self.port}: {err}") from err
        return reply

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        content_type: bytes = b"application/json",
        headers: bytes = b"",
    ) -> UpstreamReply:
        """Send one request; the reply once its status and headers have arrived.

        ``headers`` are more header lines, each ``b"Name: value\r\n"``.

        A request is never sent twice: a kept-alive connection that fails after the request
        was written may have been read by the backend, so only a ``GET`` or ``HEAD`` is
        retried on a new connection; anything else fails with :class:`UpstreamError`.
        Idle connections that the backend closed, or older than ``idle_timeout_s``, are
        never written to.

        Raises:
            UpstreamError: the backend is unreachable or broke off; UpstreamTimeoutError: it did
                not connect or answer in time.
        """
        head = b"".join(
            (
                f"{method} {self.prefix}{path} HTTP/1.1\r\n".encode(),
                self._host_header,
                headers,
                b"Content-Type: " + content_type + b"\r\n" if body else b"",
                f"Content-Length: {len(body)}\r\n\r\n".encode(),
            )
        )
        stale = asyncio.get_running_loop().time() - self.idle_timeout_s
        while self._idle:
            reply = self._idle.pop()
            if reply._transport is None or reply._transport.is_closing():
                continue
            if reply._idle_since < stale:
                reply.fail(UpstreamError("idle too long"))
                reply.release()
                continue
            try:
                await reply._send(head, body, self.read_timeout_s)
                return reply
            except UpstreamTimeoutError:
                reply.release()
                raise
            except UpstreamError:
                reply.release()
                if reply._received or method not in ("GET", "HEAD"):
                    raise
                # Nothing to repeat by mistake: try a fresh connection.
            except BaseException:  # cancelled: close it, the backend sees the request go
                reply.fail(UpstreamError("request abandoned"))
                reply.release()
                raise
        reply = await self._connect()
        try:
            await reply._send(head, body, self.read_timeout_s)
        except BaseException:
            reply.fail(UpstreamError("request abandoned"))
            reply.release()
            raise
        return reply

    def close(self) -> None:
        """Close the idle connections (those in use close when released)."""
        while self._idle:
            reply = self._idle.pop()
            reply.fail(UpstreamError("client closed"))
            reply.release()
