"""The gateway over loopback, driven by the real ``openai`` client, in front of a small
OpenAI-shaped upstream server started here."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")
pytest.importorskip("httptools")

from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request as HttpRequest  # noqa: E402
from starlette.responses import JSONResponse, Response, StreamingResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from kvpolicy.kvmodel import Request  # noqa: E402
from kvpolicy.tenancy import (  # noqa: E402
    RedisLeaseGate,
    Resources,
    TokenEntitlement,
    TokenPool,
    TokenPoolGate,
)
from kvpolicy.tenancy.gateway import (  # noqa: E402
    Admission,
    LocalGate,
    Ticket,
    TokenPoolMiddleware,
    create_app,
)

KEYS = {"key-a": "a", "key-s": "s", "key-x": "unbound"}


def _upstream() -> Starlette:
    """Echo-ish OpenAI server: ``slow`` sleeps 3 s; ``broken`` answers 500; streams send
    ``max_tokens`` chunks 2 ms apart."""

    async def models(_: HttpRequest) -> Response:
        data = [{"id": m, "object": "model", "owned_by": "t"} for m in ("m", "slow", "broken")]
        return JSONResponse({"object": "list", "data": data})

    async def complete(request: HttpRequest) -> Response:
        doc = await request.json()
        n = int(doc.get("max_tokens", 4))
        if doc["model"] == "broken":
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        if doc["model"] == "slow":
            await asyncio.sleep(3)
        chat = "messages" in doc
        if doc.get("stream"):

            async def events() -> AsyncIterator[bytes]:
                for i in range(n):
                    delta = {"delta": {"content": "x"}} if chat else {"text": "x"}
                    chunk = {"id": "c", "object": "chunk", "created": 0, "model": doc["model"]}
                    chunk["choices"] = [{"index": 0, **delta, "finish_reason": None}]
                    yield f"data: {json.dumps(chunk)}\n\n".encode()
                    await asyncio.sleep(0.002 if i < 3 else 0.05)
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": "x" * n}
        else:
            choice["text"] = "x" * n
        kind = "chat.completion" if chat else "text_completion"
        body = {"id": "c", "object": kind, "created": 0, "model": doc["model"]}
        return JSONResponse({**body, "choices": [choice], "usage": usage})

    return Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/v1/chat/completions", complete, methods=["POST"]),
            Route("/v1/completions", complete, methods=["POST"]),
        ]
    )


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
        self.server.force_exit = True
        self.thread.join(10)


def _pool() -> TokenPool:
    return TokenPool(
        "p",
        Resources(10_000, 10**9, 16),
        [
            TokenEntitlement("a", "elastic", Resources(1000, 10**8, 2), max_output_tokens=64),
            TokenEntitlement("s", "spot", Resources(1000, 10**8, 4), max_output_tokens=64),
        ],
    )


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with _Server(_upstream()) as url:
        yield url


@pytest.fixture
def gateway(upstream: str) -> Iterator[tuple[str, Admission]]:
    adm = Admission(LocalGate(TokenPoolGate(_pool(), 1)), KEYS, models=("m", "slow", "broken"))
    with _Server(create_app(adm, upstream, timeout_s=0.5)) as url:
        yield url, adm


def _client(url: str, key: str = "key-a") -> Any:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def _drained(adm: Admission) -> None:
    deadline = time.monotonic() + 5
    while adm.gate.usage()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert adm.gate.usage() == {"in_flight": 0, "kv_bytes": 0, "tokens": 0}


class TestGateway:
    def test_chat_and_completion_round_trip(self, gateway: tuple[str, Admission]) -> None:
        url, adm = gateway
        client = _client(url)
        chat = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
        assert chat.choices[0].message.content == "xxxxx"
        text = client.completions.create(model="m", prompt="hello", max_tokens=3)
        assert text.choices[0].text == "xxx"
        assert [m.id for m in client.models.list()] == ["m", "slow", "broken"]
        _drained(adm)
        metrics = httpx.get(url + "/metrics").text
        assert 'kvpolicy_admitted_total{entitlement="a"} 2.0' in metrics
        assert httpx.get(url + "/healthz").json()["status"] == "ok"

    def test_streaming_counts_tokens(self, gateway: tuple[str, Admission]) -> None:
        url, adm = gateway
        stream = _client(url).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=6, stream=True
        )
        parts = [c.choices[0].delta.content for c in stream]
        assert "".join(p or "" for p in parts) == "x" * 6
        _drained(adm)
        assert 'kvpolicy_tokens_total{entitlement="a"} 7.0' in httpx.get(url + "/metrics").text

    def test_bad_input(self, gateway: tuple[str, Admission]) -> None:
        url, adm = gateway
        msgs = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.AuthenticationError):
            _client(url, "nope").chat.completions.create(model="m", messages=msgs)
        with pytest.raises(openai.PermissionDeniedError):
            _client(url, "key-x").chat.completions.create(model="m", messages=msgs)
        with pytest.raises(openai.NotFoundError):
            _client(url).chat.completions.create(model="other", messages=msgs)
        with pytest.raises(openai.BadRequestError, match="can ever fund"):
            _client(url).chat.completions.create(model="m", messages=msgs, max_tokens=10**6)
        auth = {"authorization": "Bearer key-a", "content-type": "application/json"}
        bad = httpx.post(url + "/v1/chat/completions", content=b"{nope", headers=auth)
        assert bad.status_code == 400
        assert bad.json()["error"]["code"] == "bad-json"
        big = httpx.post(url + "/v1/completions", content=b"x" * (2 << 20), headers=auth)
        assert big.status_code == 413
        body = {"model": "m", "messages": msgs}
        assert httpx.post(url + "/v1/chat/completions", json=body).status_code == 401  # no key
        for bad_max in (-1, 0, 1.5, "8", None, True):
            sent = httpx.post(
                url + "/v1/chat/completions", json={**body, "max_tokens": bad_max}, headers=auth
            )
            assert sent.status_code == 400, bad_max
            assert sent.json()["error"]["code"] == "max_tokens"
            assert "'max_tokens' must be a positive integer" in sent.json()["error"]["message"]
        nan = httpx.post(
            url + "/v1/chat/completions",
            content=b'{"model": "m", "messages": [], "max_tokens": NaN}',
            headers=auth,
        )
        assert nan.status_code == 400
        _drained(adm)

    def test_429_with_retry_after(self, gateway: tuple[str, Admission]) -> None:
        """``a`` may hold 2; a third request while two streams run is denied."""
        url, adm = gateway
        client = _client(url)
        msgs = [{"role": "user", "content": "hi"}]
        streams = [
            client.chat.completions.create(model="m", messages=msgs, max_tokens=20, stream=True)
            for _ in range(2)
        ]
        with pytest.raises(openai.RateLimitError) as info:
            client.chat.completions.create(model="m", messages=msgs)
        assert int(info.value.response.headers["retry-after"]) >= 1
        assert info.value.body["code"] == "concurrency"  # type: ignore[index]
        for s in streams:
            s.close()
        _drained(adm)
        assert 'reason="concurrency"' in httpx.get(url + "/metrics").text

    def test_disconnect_backend_error_and_timeout_release(
        self, gateway: tuple[str, Admission]
    ) -> None:
        url, adm = gateway
        client = _client(url)
        msgs = [{"role": "user", "content": "hi"}]
        stream = client.chat.completions.create(
            model="m", messages=msgs, max_tokens=50, stream=True
        )
        next(iter(stream))
        stream.close()  # client goes away mid-stream
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="broken", messages=msgs)
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="slow", messages=msgs)
        assert info.value.status_code == 504
        _drained(adm)


class TestMiddleware:
    def test_middleware_in_front_of_an_app(self, redis_proc: Any) -> None:
        """The middleware guards the upstream app itself, here over Redis leases."""
        gate = RedisLeaseGate.from_url(_pool(), 1, redis_proc.url, namespace="mw")
        adm = Admission(gate, KEYS)
        app = TokenPoolMiddleware(_upstream(), adm)
        with _Server(app) as url:
            client = _client(url)
            text = client.completions.create(model="m", prompt="hello", max_tokens=3)
            assert text.choices[0].text == "xxx"
            stream = client.completions.create(model="m", prompt="a", max_tokens=4, stream=True)
            assert "".join(c.choices[0].text for c in stream) == "xxxx"
            with pytest.raises(openai.AuthenticationError):
                _client(url, "nope").completions.create(model="m", prompt="a")
            assert next(m.id for m in client.models.list()) == "m"
        assert gate.usage() == {"in_flight": 0, "kv_bytes": 0, "tokens": 0}
        # Debt and priority come back from Redis with each release (eqs. 1-2).
        metrics = adm.metrics().body.decode()
        weight = gate.priority("a")
        assert f'kvpolicy_priority{{entitlement="a"}} {weight}' in metrics
        assert 'kvpolicy_debt{entitlement="a"} 0.0' in metrics


class TestReplicaGateways:
    def test_two_gateways_share_one_limit_over_redis(self, upstream: str, redis_proc: Any) -> None:
        """``a`` may hold 2 in all: one stream through each gateway fills it, a third request
        to either is denied, and every counter returns to 0."""
        gates = [
            RedisLeaseGate.from_url(_pool(), 1, redis_proc.url, namespace="two") for _ in range(2)
        ]
        apps = [create_app(Admission(g, KEYS), upstream, renew_interval_s=0.2) for g in gates]
        with _Server(apps[0]) as url0, _Server(apps[1]) as url1:
            msgs = [{"role": "user", "content": "hi"}]
            streams = [
                _client(u).chat.completions.create(
                    model="m", messages=msgs, max_tokens=20, stream=True
                )
                for u in (url0, url1)
            ]
            for u in (url0, url1):
                with pytest.raises(openai.RateLimitError):
                    _client(u).chat.completions.create(model="m", messages=msgs)
            assert gates[0].usage("a")["in_flight"] == 2
            for s in streams:
                s.close()
            deadline = time.monotonic() + 5
            while gates[0].usage()["in_flight"] and time.monotonic() < deadline:
                time.sleep(0.01)
        assert gates[1].usage() == {"in_flight": 0, "kv_bytes": 0, "tokens": 0}


class TestObserve:
    def test_counts_text_events_or_the_reported_usage(self) -> None:
        """Role-only and finish events carry no token; a usage block is taken as is."""
        adm = Admission(LocalGate(TokenPoolGate(_pool(), 1)), KEYS)
        ticket = Ticket(Request("t", 3, 8, tenant="a"), b"{}", True, 8)

        def event(doc: dict[str, Any]) -> bytes:
            return b"data: " + json.dumps(doc).encode() + b"\n\n"

        role = event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
        text = event({"choices": [{"index": 0, "delta": {"content": " tok"}}]})
        done = event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        adm.observe(ticket, role + text + text)
        adm.observe(ticket, text + done + b"data: [DONE]\n\n")
        assert ticket.output_tokens == 3
        adm.observe(ticket, b"data: {not json\n\n")  # unreadable: counted as one token
        assert ticket.output_tokens == 4
        usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
        adm.observe(ticket, event(usage))
        assert ticket.output_tokens == 2
        body = Ticket(Request("b", 3, 8, tenant="a"), b"{}", False, 8)
        adm.observe(
            body, json.dumps({"choices": [{"text": "abc"}], "usage": usage["usage"]}).encode()
        )
        assert body.output_tokens == 2
