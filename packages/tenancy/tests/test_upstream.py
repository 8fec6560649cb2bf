"""The gateway's upstream client against real loopback servers: keep-alive, streamed and
chunked bodies, a stale kept-alive connection, timeouts, garbled and broken answers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import pytest

pytest.importorskip("httptools")

from kvpolicy.tenancy._upstream import (
    Upstream,
    UpstreamError,
    UpstreamTimeoutError,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class _Server:
    """A loopback server running ``handler`` per connection; :meth:`stop` waits for every
    handler to end and closes its connection, so nothing outlives the test's loop."""

    def __init__(self, server: asyncio.Server, tasks: set[asyncio.Task[None]]) -> None:
        self.server = server
        self.tasks = tasks

    def close(self) -> None:
        self.server.close()

    async def wait_closed(self) -> None:
        await self.server.wait_closed()
        if self.tasks:
            _, pending = await asyncio.wait(self.tasks, timeout=2)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)


async def _serve(handler: Handler) -> tuple[_Server, str]:
    tasks: set[asyncio.Task[None]] = set()

    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)  # type: ignore[arg-type]
        try:
            await handler(reader, writer)
        finally:
            writer.transport.abort()

    server = await asyncio.start_server(run, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return _Server(server, tasks), f"http://127.0.0.1:{port}"


async def _read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, await reader.readexactly(length)


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


def _answer(body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + extra
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def test_keep_alive_reuses_one_connection() -> None:
    connections = 0

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            try:
                head, body = await _read_request(reader)
            except asyncio.IncompleteReadError:
                break
            assert head.startswith(b"POST /base/v1/completions HTTP/1.1\r\n")
            writer.write(_answer(b'{"echo": ' + body + b"}"))
            await writer.drain()
        await _close(writer)

    async def main() -> list[bytes]:
        server, url = await _serve(echo)
        client = Upstream(url + "/base/")
        out = []
        for i in range(5):
            reply = await client.request("POST", "/v1/completions", str(i).encode())
            assert (reply.status, reply.content_type) == (200, b"application/json")
            out.append(await reply.read())
            reply.release()
        client.close()
        server.close()
        await server.wait_closed()
        return out

    assert asyncio.run(main()) == [b'{"echo": %d}' % i for i in range(5)]
    assert connections == 1


def test_chunked_stream_arrives_in_pieces() -> None:
    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
        writer.write(b"Transfer-Encoding: chunked\r\n\r\n")
        for i in range(3):
            data = f"data: {i}\n\n".encode()
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()  # until the client closes
        await _close(writer)

    async def main() -> list[bytes]:
        server, url = await _serve(stream)
        client = Upstream(url)
        reply = await client.request("POST", "/v1/completions", b"{}")
        assert reply.content_type == b"text/event-stream"
        parts = []
        while part := await reply.chunk():
            parts.append(part)
        reply.release()
        assert len(client._idle) == 1  # read whole: kept for the next request
        client.close()
        server.close()
        await server.wait_closed()
        return parts

    parts = asyncio.run(main())
    assert b"".join(parts) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
    assert len(parts) >= 2  # delivered as they came, not at the end


def test_a_stale_kept_alive_connection_is_retried_once() -> None:
    """The backend closes each connection after one answer (without saying so): the next
    request finds the idle connection dead and goes out on a fresh one."""
    served = 0

    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        await _read_request(reader)
        served += 1
        writer.write(_answer(b"{}"))
        await writer.drain()
        await _close(writer)

    async def main() -> None:
        server, url = await _serve(once)
        client = Upstream(url)
        for _ in range(3):
            reply = await client.request("POST", "/v1/completions", b"{}")
            assert await reply.read() == b"{}"
            reply.release()
            await asyncio.sleep(0.05)  # the close reaches the client
        client.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())
    assert served == 3


@pytest.mark.parametrize(("method", "sent"), [("POST", 2), ("GET", 3)])
def test_a_request_the_backend_may_have_read_is_never_sent_twice(method: str, sent: int) -> None:
    """The backend answers the first request of a kept-alive connection, then reads the
    second and closes without answering: a POST fails (the backend may have run it: it
    got it once), a GET is repeated on a fresh connection."""
    got = 0

    async def flaky(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal got
        await _read_request(reader)
        got += 1
        if got == 1:
            writer.write(_answer(b"{}"))
            await writer.drain()
            await _read_request(reader)
            got += 1
            await _close(writer)
            return
        writer.write(_answer(b"{}"))
        await writer.drain()
        await _close(writer)

    async def main() -> str:
        server, url = await _serve(flaky)
        client = Upstream(url)
        reply = await client.request(method, "/v1/completions", b"{}")
        await reply.read()
        reply.release()
        try:
            reply = await client.request(method, "/v1/completions", b"{}")
            await reply.read()
            reply.release()
            outcome = "ok"
        except UpstreamError as err:
            outcome = str(err)
        client.close()
        server.close()
        await server.wait_closed()
        return outcome

    outcome = asyncio.run(main())
    assert got == sent
    assert (outcome == "ok") == (method == "GET")


def test_an_idle_connection_past_its_age_is_not_reused() -> None:
    """A connection idle longer than ``idle_timeout_s`` is closed, not written to."""
    conns = 0

    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal conns
        conns += 1
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                await _read_request(reader)
                writer.write(_answer(b"{}"))
                await writer.drain()

    async def main() -> None:
        server, url = await _serve(count)
        client = Upstream(url, idle_timeout_s=0.05)
        for pause in (0.0, 0.1):
            await asyncio.sleep(pause)
            reply = await client.request("POST", "/v1/completions", b"{}")
            assert await reply.read() == b"{}"
            reply.release()
        client.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())
    assert conns == 2


@pytest.mark.parametrize(
    ("answer", "error", "match"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", UpstreamError, "closed"),
        (b"NOT HTTP AT ALL\r\n\r\n", UpstreamError, "malformed"),
        (None, UpstreamTimeoutError, "silent for 0.2 s"),
    ],
)
def test_broken_garbled_and_silent_backends(
    answer: bytes | None, error: type[Exception], match: str
) -> None:
    async def bad(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        if answer is None:
            await asyncio.sleep(1)
        else:
            writer.write(answer)
            await writer.drain()
        await _close(writer)

    async def main() -> None:
        server, url = await _serve(bad)
        client = Upstream(url, read_timeout_s=0.2)

        async def fetch() -> bytes:
            reply = await client.request("POST", "/v1/completions", b"{}")
            try:
                return await reply.read()
            finally:
                reply.release()

        with pytest.raises(error, match=match):
            await fetch()
        assert client._idle == []  # a broken connection is never reused
        server.close()
        await server.wait_closed()

    asyncio.run(main())


def test_unreachable_backend_and_bad_arguments() -> None:
    async def main() -> None:
        server, url = await _serve(lambda r, w: asyncio.sleep(0))
        server.close()
        await server.wait_closed()  # nothing listens there any more
        with pytest.raises(UpstreamError, match="cannot connect"):
            await Upstream(url).request("GET", "/v1/models")

    asyncio.run(main())
    with pytest.raises(ValueError, match=r"'backend' must be an http\(s\):// URL"):
        Upstream("ftp://example.invalid")
    with pytest.raises(ValueError, match="'read_timeout_s' must be > 0: 0"):
        Upstream("http://127.0.0.1:1", read_timeout_s=0)
