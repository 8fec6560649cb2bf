"""End to end on loopback: the real ``openai`` client -> kvpolicy-tenancy's token-pool
gateway -> the simulated backend (``kvpolicy sim backend``), no GPU anywhere."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kvpolicy.kvmodel import get_gpu, get_model
from kvpolicy.sim import EngineConfig, TimingModel

openai = pytest.importorskip("openai", reason="the end-to-end tests need the openai client")
uvicorn = pytest.importorskip("uvicorn", reason="the backend needs uvicorn (extra 'backend')")
pytest.importorskip("prometheus_client", reason="the gateway needs kvpolicy-tenancy[gateway]")
httpx = pytest.importorskip("httpx", reason="the gateway needs httpx")

from kvpolicy.sim.backend import LiveEngine, create_app  # noqa: E402
from kvpolicy.tenancy import Resources, TokenEntitlement, TokenPool, TokenPoolGate  # noqa: E402
from kvpolicy.tenancy.gateway import Admission, LocalGate  # noqa: E402
from kvpolicy.tenancy.gateway import create_app as gateway_app  # noqa: E402

MODEL = "Llama-3-8B"
KEYS = {"key-chat": "chat", "key-spot": "spot"}


class _Server:
    def __init__(self, app: Any) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[str, Admission, LiveEngine]]:
    """A simulated Llama-3-8B on an L40S (4x real time) behind a gateway with two tenants:
    ``chat`` may hold 4 requests, ``spot`` 1."""
    tm = TimingModel(get_model(MODEL), get_gpu("L40S"))
    engine = LiveEngine(tm, EngineConfig(max_batch=64), speed=4.0)
    pool = TokenPool(
        "l40s",
        Resources(20_000, 10**10, 64),
        [
            TokenEntitlement("chat", "guaranteed", Resources(10_000, 10**9, 4)),
            TokenEntitlement("spot", "spot", Resources(2_000, 10**9, 1)),
        ],
    )
    adm = Admission(LocalGate(TokenPoolGate(pool, tm.model)), KEYS, models=(MODEL,))
    with _Server(create_app(engine, MODEL)) as backend, _Server(gateway_app(adm, backend)) as gw:
        yield gw, adm, engine


def _client(url: str, key: str) -> Any:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def _drained(adm: Admission, engine: LiveEngine) -> None:
    for _ in range(200):
        if engine.in_flight == 0 and all(
            adm.gate.usage(t)["in_flight"] == 0 for t in ("chat", "spot")
        ):
            return
        time.sleep(0.05)
    raise AssertionError("requests still in flight")


class TestGatewayOverSimulatedBackend:
    def test_stream_through_the_gateway(self, stack: tuple[str, Admission, LiveEngine]) -> None:
        """A streamed chat completion passes the gateway and arrives token by token at the
        simulated server's pace; everything is released afterwards."""
        url, adm, engine = stack
        stream = _client(url, "key-chat").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=24,
            stream=True,
        )  # fmt: skip
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == " tok" * 24
        _drained(adm, engine)

    def test_entitlement_limit_is_a_429(self, stack: tuple[str, Admission, LiveEngine]) -> None:
        """``spot`` may hold one request: a second while the first streams gets 429 with a
        Retry-After, and the server never sees it."""
        url, adm, engine = stack
        client = _client(url, "key-spot")
        msgs = [{"role": "user", "content": "x" * 100}]
        first = client.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=400, stream=True
        )
        next(iter(first))
        with pytest.raises(openai.RateLimitError) as info:
            client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8)
        assert float(info.value.response.headers["retry-after"]) > 0
        assert engine.in_flight == 1
        first.close()
        _drained(adm, engine)

    def test_context_error_passes_through(self, stack: tuple[str, Admission, LiveEngine]) -> None:
        """A request the server can never hold is the server's 400, released at the gate."""
        url, adm, engine = stack
        with pytest.raises(openai.BadRequestError):
            _client(url, "key-chat").chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "z" * 40_000}], max_tokens=8
            )
        _drained(adm, engine)
