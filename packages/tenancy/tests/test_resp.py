"""The gateway's asyncio Redis client, against a real redis-server."""

from __future__ import annotations

import asyncio
import socket

import pytest

from kvpolicy.tenancy._resp import LeanRedis, _Packer, _reply, pack

redis = pytest.importorskip("redis", reason="redis-py (the 'redis' extra) is not installed")

_ECHO = "return {ARGV[1], tonumber(ARGV[2]) + 1, KEYS[1], false}"
_BUSY = (  # keeps Redis busy for 0.6 s
    "local t = redis.call('TIME') local t0 = t[1] * 1e6 + t[2] "
    "repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] - t0 > 6e5 return 1"
)


class TestWire:
    def test_pack_and_replies(self) -> None:
        """Commands are arrays of bulk strings; replies come back as redis-py gives them."""
        assert (
            pack([b"SET", "k", 3, 0.5]) == b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n3\r\n$3\r\n0.5\r\n"
        )
        buf = b"*4\r\n:1\r\n$2\r\nab\r\n$-1\r\n*1\r\n+OK\r\n-ERR no\r\n"
        got, pos = _reply(buf, 0)
        assert got == [1, b"ab", None, [b"OK"]]
        err, end = _reply(buf, pos)
        assert isinstance(err, redis.exceptions.ResponseError)
        assert end == len(buf)
        with pytest.raises(TypeError, match="bool"):
            pack([True])

    def test_packer_reuses_only_what_cannot_change(self) -> None:
        """A script's packer gives what ``pack`` gives, call after call: the same objects
        reuse their encoding, new ones are encoded, and a mutable argument changed in place
        is encoded anew (its encoding never kept)."""
        packer = _Packer()
        common = ["ns", 3, 0.25, b"raw"]
        buf = bytearray(b"ab")
        calls = [
            [*common, "r1", buf],
            [*common, "r2", buf],  # the bytearray is the same object, its bytes changed
            [*common[:2], 0.5, b"raw", "r3"],  # a value changed, one argument fewer
            [*common, "r3", 7, "extra"],
        ]
        for i, args in enumerate(calls):
            if i == 1:
                buf[:] = b"xyz"
            assert packer.pack(args) == pack(args)
        assert packer.bulks[:2] == [b"$2\r\nns\r\n", b"$1\r\n3\r\n"]
        with pytest.raises(TypeError, match="bool"):
            packer.pack([*common, True])
        assert packer.pack(calls[0]) == pack(calls[0])


class TestLeanRedis:
    def test_scripts_pipelined_and_reloaded(self, redis_proc: object) -> None:
        """Concurrent calls share a connection and each gets its own answer; a flushed
        script cache is refilled; an error reply raises ResponseError."""
        url = redis_proc.url  # type: ignore[attr-defined]

        async def run() -> None:
            client = LeanRedis(url, 1.0)
            echo = client.register_script(_ECHO)
            got = await asyncio.gather(*(echo(keys=["k"], args=[f"a{i}", i]) for i in range(50)))
            assert got == [[f"a{i}".encode(), i + 1, b"k", None] for i in range(50)]
            await client.execute(b"SCRIPT", b"FLUSH")
            assert await echo(keys=["k"], args=["x", 1]) == [b"x", 2, b"k", None]
            with pytest.raises(redis.exceptions.ResponseError):
                await client.execute(b"NOSUCHCOMMAND")
            assert await client.execute(b"PING") == b"PONG"  # the connection survives
            await client.aclose()

        asyncio.run(run())

    def test_failures_are_redis_py_errors(self, redis_proc: object) -> None:
        """No server: ConnectionError naming the connect (nothing ran); a server that goes
        silent: TimeoutError, and the next call reconnects; a restart: the call after it
        succeeds; a second event loop reconnects."""
        url = redis_proc.url  # type: ignore[attr-defined]
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            closed = f"redis://127.0.0.1:{sock.getsockname()[1]}/0"

        async def run() -> None:
            with pytest.raises(redis.exceptions.ConnectionError, match="connecting to"):
                await LeanRedis(closed, 0.5).execute(b"PING")
            client = LeanRedis(url, 0.3)
            assert await client.execute(b"PING") == b"PONG"
            busy = asyncio.ensure_future(client.execute(b"EVAL", _BUSY, 0))
            await asyncio.sleep(0.05)
            echo = asyncio.ensure_future(client.execute(b"ECHO", b"late"))
            with pytest.raises(redis.exceptions.TimeoutError):
                await busy
            with pytest.raises(redis.exceptions.TimeoutError):
                await echo
            await asyncio.sleep(0.5)  # the late answers come and are dropped, in order
            assert await client.execute(b"ECHO", b"next") == b"next"
            await client.disconnect(inuse_connections=False)
            assert await client.execute(b"PING") == b"PONG"  # on a new connection
            redis_proc.stop()  # type: ignore[attr-defined]
            with pytest.raises(redis.exceptions.ConnectionError):
                await client.execute(b"PING")
            redis_proc.start()  # type: ignore[attr-defined]
            assert await client.execute(b"PING") == b"PONG"
            await client.aclose()

        asyncio.run(run())
        db1 = url.rsplit("/", 1)[0] + "/1"
        client = LeanRedis(db1, 1.0)

        async def set_x() -> None:
            assert await client.execute(b"SET", b"x", b"1") == b"OK"
            await client.aclose()

        for _ in range(2):  # one event loop, then another
            asyncio.run(set_x())
        for where, want in ((db1, b"1"), (url, None)):
            probe = redis.Redis.from_url(where)
            assert probe.get("x") == want
            probe.close()
        with pytest.raises(ValueError, match="redis://"):
            LeanRedis("rediss://127.0.0.1", 1.0)
