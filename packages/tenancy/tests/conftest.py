"""Fixtures of the kvpolicy-tenancy tests: seeded randomness and small real objects."""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest

from kvpolicy.kvmodel import Request
from kvpolicy.tenancy import (
    InMemoryStateStore,
    Resources,
    StateStore,
    TokenEntitlement,
    TokenPool,
)


@pytest.fixture(autouse=True)
def _seed() -> None:
    random.seed(0)


@pytest.fixture
def make_request() -> Callable[..., Request]:
    """Factory of requests with sequential ids."""
    counter = iter(range(1_000_000))

    def make(
        tenant: str = "a", prompt_len: int = 64, decode_len: int = 64, arrival_time: float = 0.0
    ) -> Request:
        return Request(
            request_id=f"r{next(counter)}",
            prompt_len=prompt_len,
            decode_len=decode_len,
            arrival_time=arrival_time,
            tenant=tenant,
        )

    return make


@pytest.fixture
def small_pool() -> TokenPool:
    """16 slots, 240 tokens/s, 1 MB of KV: guaranteed ``g`` (4 slots), elastic ``e`` (4, burst
    8) and spot ``s`` (8); requests are charged ``prompt_len + 64`` tokens."""
    return TokenPool(
        "small",
        Resources(240, 1_000_000, 16),
        [
            TokenEntitlement(
                "g", "guaranteed", Resources(60, 250_000, 4), slo_target_s=1.0, max_output_tokens=64
            ),
            TokenEntitlement(
                "e",
                "elastic",
                Resources(60, 250_000, 4),
                Resources(120, 500_000, 8),
                slo_target_s=2.0,
                max_output_tokens=64,
            ),
            TokenEntitlement(
                "s", "spot", Resources(120, 500_000, 8), slo_target_s=3.0, max_output_tokens=64
            ),
        ],
    )


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real ``redis-server`` on a free loopback port, for the session."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install -y redis-server)")
    pytest.importorskip("redis", reason="redis-py (the 'redis' extra) is not installed")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10.0
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail(f"redis-server did not start on port {port}")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def store_factory() -> Callable[[], StateStore]:
    """Factory of empty state stores (several gates over one store share its counters)."""
    return InMemoryStateStore


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisProcess:
    """One ``redis-server`` without persistence: a restart loses every key."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server is not installed")
        self.binary = binary
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        cmd = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        self.proc = subprocess.Popen(
            [*cmd, "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10.0
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def redis_proc() -> Iterator[RedisProcess]:
    """A fresh ``redis-server`` of this test only, which the test may stop and restart."""
    pytest.importorskip("redis", reason="redis-py (the 'redis' extra) is not installed")
    try:
        server = RedisProcess()
    except FileNotFoundError:
        pytest.skip("redis-server is not installed (apt-get install -y redis-server)")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def closing() -> Iterator[contextlib.ExitStack]:
    """Closes what a test hands it (clients, gates) when the test ends, pass or fail: an
    unclosed socket found by the garbage collector during a later test fails that test."""
    with contextlib.ExitStack() as stack:
        yield stack
