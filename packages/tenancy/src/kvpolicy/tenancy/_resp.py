"""The gateway's asyncio Redis client for its two hot scripts: one pipelined connection,
replies parsed by a small RESP2 reader.

Each proxied request runs one Lua script in Redis to be admitted and one to be released.
Through redis-py's asyncio client each call took the gateway about half a millisecond of
CPU (its connection pool, command packing and response parser are general), more than the
rest of the request; this client packs and reads what the scripts need and nothing else
(see ``benchmarks/bench_gateway.py``). Concurrent calls share one connection, their
replies read back in order (Redis answers a connection's commands in the order sent).

It raises redis-py's exceptions, so that :class:`~kvpolicy.tenancy.RedisLeaseGate` handles
its failures as it does redis-py's: ``ConnectionError`` when no connection can be made
(the message says ``connecting to``: nothing was sent) or the connection is lost (the
command may have run), ``TimeoutError`` when Redis is silent for longer than the timeout
(the commands waiting then: Redis answers in order, so the timeout counts from its last
answer, not from when a command queued; a late answer is read and dropped, so that the
next commands keep their places), ``ResponseError`` for an error reply.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import urllib.parse
from collections.abc import Sequence
from typing import Any

__all__ = ["LeanRedis"]

_CRLF = b"\r\n"


def _encode(value: Any) -> bytes:
    if type(value) is bytes:
        return value
    if type(value) is str:
        return value.encode()
    if isinstance(value, bool):
        raise TypeError(f"a Redis argument must not be a bool: {value!r}")
    if isinstance(value, int):
        return str(value).encode()
    if isinstance(value, float):
        return repr(value).encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"a Redis argument must be bytes, str, int or float: {value!r}")


def _bulk(value: Any) -> bytes:
    """``value`` as a RESP bulk string."""
    data = _encode(value)
    return b"$%d\r\n%b\r\n" % (len(data), data)


def pack(args: Sequence[Any]) -> bytes:
    """One command in RESP: an array of bulk strings."""
    return b"*%d\r\n" % len(args) + b"".join(map(_bulk, args))


_IMMUTABLE = frozenset((bytes, str, int, float))


class _Packer:
    """Packs one script's calls, reusing the encoding of every argument that is the same
    object as the one at its place in the previous call.

    A gate's scripts take 20-40 arguments, most of them the same objects call after call
    (keys, the pool's settings, an entitlement's limits): encoding each anew took half the
    CPU of a call. An object of an immutable type (bytes, str, int, float) always encodes
    the same, so reusing its encoding is exact.
    """

    __slots__ = ("args", "bulks")

    def __init__(self) -> None:
        self.args: Sequence[Any] = ()
        self.bulks: list[bytes | None] = []

    def pack(self, args: Sequence[Any]) -> bytes:
        """``pack(args)``."""
        prev, prev_bulks = self.args, self.bulks
        known = len(prev)
        out: list[bytes] = []
        kept: list[bytes | None] = []
        for i, arg in enumerate(args):
            bulk = prev_bulks[i] if i < known and arg is prev[i] else None
            if bulk is None:
                bulk = _bulk(arg)
                kept.append(bulk if type(arg) in _IMMUTABLE else None)
            else:
                kept.append(bulk)
            out.append(bulk)
        self.args, self.bulks = args, kept
        return b"*%d\r\n" % len(args) + b"".join(out)


class _IncompleteError(Exception):
    """The buffer ends inside a reply: wait for more bytes."""


def _reply(buf: bytes | bytearray, pos: int) -> tuple[Any, int]:
    """The RESP2 reply at ``buf[pos:]`` and the position after it (redis-py's types: bytes,
    int, a list, ``None``; an error reply as an exception object, not raised)."""
    end = buf.find(_CRLF, pos)
    if end < 0:
        raise _IncompleteError
    kind, line = buf[pos : pos + 1], bytes(buf[pos + 1 : end])
    pos = end + 2
    if kind == b":":
        return int(line), pos
    if kind == b"$":
        n = int(line)
        if n < 0:
            return None, pos
        if len(buf) < pos + n + 2:
            raise _IncompleteError
        return bytes(buf[pos : pos + n]), pos + n + 2
    if kind == b"*":
        n = int(line)
        if n < 0:
            return None, pos
        items = []
        for _ in range(n):
            item, pos = _reply(buf, pos)
            items.append(item)
        return items, pos
    if kind == b"+":
        return line, pos
    if kind == b"-":
        return _error(line.decode("utf-8", "replace")), pos
    raise ValueError(f"not a RESP2 reply: {bytes(buf[pos - len(line) - 3 : end])!r}")


def _error(text: str) -> Exception:
    from redis import exceptions

    if text.startswith("NOSCRIPT"):
        return exceptions.NoScriptError(text)
    return exceptions.ResponseError(text)


class _Connection(asyncio.Protocol):
    """One connection: commands written as they come, replies matched to them in order.

    Redis answers a connection's commands one after the other, so a command queued behind
    many others waits for them: the timeout is Redis's silence, not a command's age. While
    commands wait, one timer runs, restarted by every answer; when it expires every command
    waiting fails with ``TimeoutError`` and keeps its place (a late answer is read and
    dropped, so that the commands sent later keep theirs)."""

    def __init__(self, where: str, timeout_s: float) -> None:
        self.where = where
        self.timeout_s = timeout_s
        self.transport: asyncio.Transport | None = None
        self.waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.buffer = bytearray()
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def send(self, data: bytes) -> asyncio.Future[Any]:
        """Write one command; the future of its answer."""
        assert self.transport is not None
        waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        self.waiting.append(waiter)
        if self.timer is None:
            self._arm()
        return waiter

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.timeout_s, self._expire)

    def _expire(self) -> None:
        from redis import exceptions

        self.timer = None
        for waiter in self.waiting:
            if not waiter.done():
                waiter.set_exception(exceptions.TimeoutError(f"Timeout reading from {self.where}"))

    def data_received(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        pos = 0
        try:
            while pos < len(buf):
                reply, pos = _reply(buf, pos)
                if not self.waiting:
                    raise ValueError("a reply to no command")
                waiter = self.waiting.popleft()
                if not waiter.done():  # else it timed out or was cancelled: dropped
                    if isinstance(reply, Exception):
                        waiter.set_exception(reply)
                    else:
                        waiter.set_result(reply)
        except _IncompleteError:
            pass
        except ValueError as err:
            self.close(f"garbled answer from {self.where}: {err}")
            return
        del buf[:pos]
        if pos and self.timer is not None:  # Redis answered: its silence starts again
            self.timer.cancel()
            self.timer = None
        if self.timer is None and not self.idle:
            self._arm()

    @property
    def idle(self) -> bool:
        """No command waits for its answer (timed-out ones aside)."""
        return all(w.done() for w in self.waiting)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.fail(f"Connection to {self.where} lost" + (f": {exc}" if exc else "."))

    def fail(self, why: str) -> None:
        from redis import exceptions

        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        while self.waiting:
            waiter = self.waiting.popleft()
            if not waiter.done():
                waiter.set_exception(exceptions.ConnectionError(why))

    def close(self, why: str) -> None:
        """Close now; every command waiting fails (it may have run)."""
        if self.transport is not None:
            self.transport.abort()
            self.transport = None
        self.fail(why)

    @property
    def usable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()


class LeanRedis:
    """The asyncio client (see the module docstring) of the Redis at ``url``
    (``redis://[[user]:password@]host[:port][/db]``), each call failing after ``timeout_s``
    of silence; used from one event loop at a time (a call from another reconnects).

    Raises:
        ValueError: ``url`` is not a ``redis://`` URL with a host (a TLS or Unix socket URL
            needs redis-py's client).
    """

    def __init__(self, url: str, timeout_s: float) -> None:
        """See the class docstring."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "redis" or not parts.hostname:
            raise ValueError(f"'url' must be redis://host[:port][/db]: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or 6379
        self.db = int(parts.path.strip("/") or 0)
        self._auth = (
            [b"AUTH", *([parts.username] if parts.username else []), parts.password]
            if parts.password
            else None
        )
        self.timeout_s = float(timeout_s)
        self._where = f"{self.host}:{self.port}"
        self._conn: _Connection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Future[_Connection] | None = None
        self._retired: list[_Connection] = []  # closed once their commands are answered
        self.connection_pool = self  # what RedisLeaseGate closes after a failure

    def register_script(self, script: str) -> LeanScript:
        """A callable that runs ``script`` by its SHA-1 (loading it when Redis lacks it)."""
        return LeanScript(self, script)

    async def execute(self, *args: Any) -> Any:
        """Send one command; its reply.

        Raises:
            redis.exceptions.ConnectionError, TimeoutError, ResponseError: see the module
                docstring.
        """
        data = pack(args)
        conn = self._conn
        if conn is None or not conn.usable or self._loop is not asyncio.get_running_loop():
            conn = await self._connect()
        return await self._send(conn, data)

    async def execute_packed(self, data: bytes) -> Any:
        """:meth:`execute` of one command already packed (:func:`pack`)."""
        conn = self._conn
        if conn is None or not conn.usable or self._loop is not asyncio.get_running_loop():
            conn = await self._connect()
        return await self._send(conn, data)

    async def _send(self, conn: _Connection, data: bytes) -> Any:
        return await conn.send(data)

    async def _connect(self) -> _Connection:
        """The connection, made by the first caller that needs one (others wait for it)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop: the old connection is unusable
            self._drop()
            self._loop, self._connecting = loop, None
        if self._connecting is None or self._connecting.done():
            self._connecting = loop.create_future()
            pending = self._connecting
            try:
                conn = await self._open(loop)
            except BaseException as err:
                pending.set_exception(err if isinstance(err, Exception) else _gone(self._where))
                pending.exception()  # retrieved: other waiters may be none
                raise
            self._conn = conn
            pending.set_result(conn)
            return conn
        return await asyncio.shield(self._connecting)

    async def _open(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        from redis import exceptions

        where = self._where
        try:
            async with asyncio.timeout(self.timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(where, self.timeout_s), self.host, self.port
                )
                for command in (self._auth, [b"SELECT", self.db] if self.db else None):
                    if command is not None:
                        await self._send(conn, pack(command))
        except TimeoutError as err:
            raise exceptions.TimeoutError(f"Timeout connecting to {where}") from err
        except OSError as err:
            raise exceptions.ConnectionError(f"Error connecting to {where}: {err}") from err
        except exceptions.RedisError as err:  # AUTH or SELECT refused, or the link lost
            raise exceptions.ConnectionError(f"Error connecting to {where}: {err}") from err
        return conn

    def _drop(self) -> None:
        conns = [*self._retired, *([self._conn] if self._conn is not None else [])]
        self._conn, self._retired = None, []
        for conn in conns:
            try:
                conn.close(f"Connection to {self._where} closed.")
            except RuntimeError:  # its event loop is closed, and its transport with it
                conn.transport = None

    async def disconnect(self, inuse_connections: bool = True) -> None:
        """The next call reconnects. The connection is closed now (commands waiting fail),
        or with ``inuse_connections=False`` (as redis-py's pool does after a failure) once
        the commands waiting on it have their answers or have timed out."""
        conn = self._conn
        if inuse_connections or conn is None or conn.idle:
            self._drop()
            return
        self._conn = None
        self._retired = [c for c in self._retired if c.usable] + [conn]
        assert self._loop is not None
        self._loop.call_later(self.timeout_s, self._close_retired, conn)

    def _close_retired(self, conn: _Connection) -> None:
        if conn in self._retired:
            self._retired.remove(conn)
            conn.close(f"Connection to {self._where} closed.")

    async def aclose(self) -> None:
        """Close the connection (the next call reconnects)."""
        self._drop()


def _gone(where: str) -> Exception:
    from redis import exceptions

    return exceptions.ConnectionError(f"Error connecting to {where}: cancelled")


class LeanScript:
    """A Lua script of :class:`LeanRedis`, called as redis-py's ``Script`` is."""

    def __init__(self, client: LeanRedis, script: str) -> None:
        """``script``'s text; its SHA-1 computed here."""
        self.client = client
        self.script = script.encode()
        self.sha = hashlib.sha1(self.script).hexdigest().encode()  # Redis's script id
        self._packer = _Packer()

    async def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        """Run it with ``keys`` and ``args`` (EVALSHA; SCRIPT LOAD first when needed)."""
        from redis import exceptions

        client = self.client
        data = self._packer.pack([b"EVALSHA", self.sha, len(keys), *keys, *args])
        try:
            return await client.execute_packed(data)
        except exceptions.NoScriptError:  # a fresh or flushed Redis: nothing ran
            await client.execute(b"SCRIPT", b"LOAD", self.script)
            return await client.execute_packed(data)
